"""Step builders for the elementwise, reduction, shape and indexing ops.

A builder ``build(node, ins, out, ctx) -> list[Step]`` runs when a plan is bound: ``ins``
are the operand arrays (or ``Dyn`` placeholders for run-time inputs), ``out`` is the
preallocated output array, and ``ctx.scratch(shape, dtype)`` hands out temporaries that
are valid during this node's steps only. Builders do all the thinking (dtypes, views,
constants); the steps they return are plain numpy calls writing into ``out=``.

float16 values are computed through float32 temporaries wherever more than one rounding
would otherwise happen (chains, sums, products); single ufuncs run in float16 directly,
which numpy evaluates in float32 and rounds once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from rlx_core.errors import InputError
from rlx_core.ir import Node
from rlx_core.ir.ops import NUMPY_NAMES, OpKind, slice_index

from .blas import mkl, vml_step
from .gathers import gather_step
from .gemm import gemv_step, matmul_step
from .mathfn import erf_program, gelu_program, run_chunked, scratch_count
from .onednn_matmul import dense_steps
from .steps import Step
from .transposes import transpose_step

__all__ = ["BuildContext", "Builder", "KERNELS", "compute_dtype", "const", "inplace_positions", "softmax_steps",
           "ufunc_step"]


class BuildContext(Protocol):
    """What a kernel builder may ask of the plan being built."""

    def scratch(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A temporary, dead outside this node's steps."""
        ...

    def derived(self, source: Any, key: Any, make: Callable[[np.ndarray, np.ndarray | None], np.ndarray],
                also: Sequence[Any] = ()) -> np.ndarray | None:
        """``make(source, None)``, kept by the executable and shared by its plans, and
        recomputed as ``make(source, previous)`` whenever ``set_param`` changes ``source``
        or an array of ``also`` that ``make`` reads as well (e.g. weights packed for MKL, a
        bias appended to them); None when one of them is not a resident array (its
        contents change from run to run) or the context keeps nothing."""
        ...


Builder = Callable[[Node, list[Any], np.ndarray, BuildContext], list[Step]]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a float result is accumulated in: float16 goes through float32."""
    return F32 if dtype == np.float16 else np.dtype(dtype)


def const(value: Any, dtype: Any) -> np.ndarray:
    """A read-only 0-d constant: ufuncs take a 0-d array faster than a Python scalar."""
    a = np.array(value, dtype=dtype)
    a.flags.writeable = False
    return a


# ----------------------------------------------------------------------------- elementwise
_BINARY_UFUNCS = {
    OpKind.ADD: np.add, OpKind.SUB: np.subtract, OpKind.MUL: np.multiply, OpKind.POW: np.power,
    OpKind.MAXIMUM: np.maximum, OpKind.MINIMUM: np.minimum, OpKind.BITWISE_AND: np.bitwise_and,
    OpKind.BITWISE_OR: np.bitwise_or, OpKind.BITWISE_XOR: np.bitwise_xor,
}
_UNARY_UFUNCS = {
    OpKind.NEG: np.negative, OpKind.ABS: np.absolute, OpKind.EXP: np.exp, OpKind.LOG: np.log,
    OpKind.SQRT: np.sqrt, OpKind.TANH: np.tanh, OpKind.FLOOR: np.floor, OpKind.CEIL: np.ceil,
    OpKind.ROUND: np.rint, OpKind.BITWISE_NOT: np.invert, OpKind.SIN: np.sin, OpKind.COS: np.cos,
    **{op: getattr(np, name) for op, name in NUMPY_NAMES.items()},
}
# ops whose steps read each input element before writing the output element at the same
# position, and never read an input after writing the output: out may be that input.
_INPLACE_UNARY = frozenset(_UNARY_UFUNCS) | {OpKind.RELU, OpKind.RSQRT, OpKind.SIGMOID, OpKind.GELU, OpKind.ERF}
_INPLACE_BINARY = (frozenset(_BINARY_UFUNCS) | {OpKind.DIV, OpKind.FMOD}) - {OpKind.POW}  # pow re-reads its base


def ufunc_step(ufunc: np.ufunc, *operands: Any) -> Step:
    """``ufunc(*inputs, out)`` with the output positional (the fastest call), except where
    numpy deprecates that (maximum and minimum, numpy >= 2.4 warns)."""
    *ins, out = operands
    if ufunc is np.maximum or ufunc is np.minimum:
        return Step(ufunc, tuple(ins), {"out": out})
    return Step(ufunc, tuple(operands))


def inplace_positions(node: Node) -> tuple[int, ...]:
    """Input positions whose buffer ``node``'s output may overwrite (same shape and dtype)."""
    if node.op in _INPLACE_UNARY:
        return (0,)
    if node.op is OpKind.FUSED_ELEMENTWISE:  # each block is read before its output is written (fused.py)
        return tuple(range(len(node.inputs)))
    if node.op in _INPLACE_BINARY:
        # integer div reads its divisor again after it has written the quotient
        return (0, 1) if node.op is not OpKind.DIV or node.dtype.startswith("float") else (0,)
    return ()


def _binary(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    return [ufunc_step(_BINARY_UFUNCS[node.op], ins[0], ins[1], out)]


def _ieee_pow_fix(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """numpy's float power is not IEEE for (-inf) ** y, y non-integer, in every code path
    (0-d arrays give NaN, vectors +inf); the reference says +inf (y > 0) or +0 (y < 0)."""
    odd = np.isneginf(a)
    if odd.any():
        odd = odd & (np.floor(b) != b) & ~np.isnan(b)
        np.copyto(out, np.where(b > 0, np.inf, 0.0).astype(out.dtype), where=np.broadcast_to(odd, out.shape))


def _pow(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    steps = [ufunc_step(np.power, ins[0], ins[1], out)]
    if out.dtype.kind == "f":
        steps.append(Step(_ieee_pow_fix, (ins[0], ins[1], out)))
    return steps


def _int_div(a: np.ndarray, b: np.ndarray, out: np.ndarray, rem: np.ndarray, what: str) -> None:
    if not b.all():
        raise InputError(f"{what} (div): integer division by zero")
    # a - fmod(a, b) is an exact multiple of b, so floor division of it truncates exactly.
    np.fmod(a, b, rem)
    np.subtract(a, rem, out)
    with np.errstate(over="ignore"):  # MIN / -1 wraps to MIN, as the reference says, without a warning
        np.floor_divide(out, b, out)


def _div(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    a, b = ins
    if out.dtype.kind == "f":
        return [Step(np.divide, (a, b, out))]
    return [Step(_int_div, (a, b, out, ctx.scratch(out.shape, out.dtype), node.describe()))]


def _int_fmod(a: np.ndarray, b: np.ndarray, out: np.ndarray, what: str) -> None:
    # The divisor is checked in full before anything is written, so out may be b's buffer.
    if not b.all():
        raise InputError(f"{what} (fmod): integer fmod by zero")
    np.fmod(a, b, out)


def _float_fmod(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    # NaN for an infinite dividend or a zero divisor is the IEEE answer, not a mistake to warn of
    with np.errstate(invalid="ignore"):
        np.fmod(a, b, out)


def _fmod(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    a, b = ins
    if out.dtype.kind == "f":  # exact in every float dtype: float16 needs no wider temporary
        return [Step(_float_fmod, (a, b, out))]
    return [Step(_int_fmod, (a, b, out, node.describe()))]


def _shift_run(x: np.ndarray, y: np.ndarray, out: np.ndarray, bad: np.ndarray, amount: np.ndarray,
               left: bool) -> None:
    """``x << y`` or ``x >> y`` with the reference's rule for shifts outside ``[0, bits)``
    (C leaves them undefined): such a shift is done as a shift by 0, then overwritten with
    the sign fill (0, or -1 for a right shift of a negative value)."""
    bits = out.dtype.itemsize * 8
    np.greater_equal(y.view(np.dtype(f"u{y.dtype.itemsize}")), bits, out=bad)  # negative y too, as unsigned
    np.copyto(amount, y)
    np.copyto(amount, 0, where=bad)
    (np.left_shift if left else np.right_shift)(x, amount, out)
    if left or out.dtype.kind == "u":
        np.copyto(out, 0, where=bad)
    else:
        np.right_shift(x, bits - 1, amount)  # the sign fill: -1 or 0
        np.copyto(out, amount, where=bad)


def _bit_shift(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    bad, amount = ctx.scratch(out.shape, np.bool_), ctx.scratch(out.shape, out.dtype)
    return [Step(_shift_run, (ins[0], ins[1], out, bad, amount, node.op is OpKind.BIT_SHIFT_LEFT))]


_COMPARE_UFUNCS = {OpKind.EQUAL: np.equal, OpKind.LESS: np.less, OpKind.GREATER: np.greater}


def _compare(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    # not in inplace_positions: the bool output has another dtype than the operands (but equal's).
    return [ufunc_step(_COMPARE_UFUNCS[node.op], ins[0], ins[1], out)]


def _unary(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    return [Step(_UNARY_UFUNCS[node.op], (ins[0], out))]


def _relu(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    return [ufunc_step(np.maximum, ins[0], const(0, out.dtype), out)]


def _through(out: np.ndarray, ctx: BuildContext) -> tuple[np.ndarray, dict[str, Any]]:
    """Where a short float chain computes (``out``, or a float32 temporary for float16),
    and the ufunc keywords that make its first step compute in that dtype."""
    cd = compute_dtype(out.dtype)
    if cd == out.dtype:
        return out, {}
    return ctx.scratch(out.shape, cd), {"dtype": cd}


def _rsqrt(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    t, first = _through(out, ctx)
    return [Step(np.sqrt, (ins[0], t), first), Step(np.divide, (const(1, t.dtype), t, out))]


def _exp_overflowing(t: np.ndarray) -> None:
    """``exp`` in place, where overflowing to inf is the intended result (no warning)."""
    with np.errstate(over="ignore"):
        np.exp(t, t)


def _sigmoid(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    # 1 / (1 + exp(-x)): where exp(-x) overflows the result is 1 / inf = 0, as the
    # reference's (a cap on -x would leave a 1e-38 that log() turns into -88, not -inf).
    t, first = _through(out, ctx)
    return [
        Step(np.negative, (ins[0], t), first),
        Step(_exp_overflowing, (t,)),
        Step(np.add, (t, const(1, t.dtype), t)),
        Step(np.divide, (const(1, t.dtype), t, out)),
    ]


def _chunked(program: Callable[..., None], tmp_dtypes: tuple[np.dtype, ...], x: Any, out: np.ndarray,
             ctx: BuildContext) -> list[Step]:
    n = scratch_count(out.size)
    tmps = tuple(ctx.scratch((n,), dt) for dt in tmp_dtypes)
    return [Step(run_chunked, (program, x.reshape(-1), out.reshape(-1), tmps))]


def _erf(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    steps = _chunked(*erf_program(out.dtype), ins[0], out, ctx)
    if out.dtype == F32:  # MKL's vmsErf when it is here: ~1 ulp and 7x faster than the numpy program
        program, tmps = steps[0].args[0], steps[0].args[3]
        fast = vml_step("Erf", ins[0], out, lambda x, o: run_chunked(program, x.reshape(-1), o.reshape(-1), tmps))
        if fast is not None:
            return [fast]
    return steps


_SQRT_HALF = const(math.sqrt(0.5), F32)
_HALF = const(0.5, F32)


def _gelu(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    steps = _chunked(*gelu_program(out.dtype, node.attrs["approximate"]), ins[0], out, ctx)
    if out.dtype == F32 and node.attrs["approximate"] == "none" and mkl() is not None:
        # x * Phi(x) with MKL's vmsCdfNorm for Phi (x = -inf gives -inf * 0 = NaN, as the
        # reference). A caller's array MKL cannot take gets Phi as 0.5 + 0.5 erf(x / sqrt 2).
        x, phi = ins[0], ctx.scratch(out.shape, F32)
        erf, erf_tmps = erf_program(F32)
        tmps = tuple(ctx.scratch((scratch_count(out.size),), dt) for dt in erf_tmps)

        def numpy_phi(x: np.ndarray, p: np.ndarray) -> None:
            np.multiply(x, _SQRT_HALF, out=p)
            run_chunked(erf, p.reshape(-1), p.reshape(-1), tmps)
            np.multiply(p, _HALF, out=p)
            np.add(p, _HALF, out=p)

        fast = vml_step("CdfNorm", x, phi, numpy_phi)
        if fast is not None:
            return [fast, Step(np.multiply, (x, phi, out))]
    return steps


def _cast(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    return [Step(np.copyto, (out, ins[0]), {"casting": "unsafe"})]


def _where(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    cond, x, y = ins
    return [Step(np.copyto, (out, y)), Step(np.copyto, (out, x), {"where": cond})]


# ----------------------------------------------------------------------------- reductions
def _reduce_sum(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    x, axes, keep = ins[0], node.attrs["axes"], node.attrs["keepdims"]
    cd = compute_dtype(out.dtype)
    if cd == out.dtype:
        return [Step(np.add.reduce, (x, axes, out.dtype, out, keep))]  # int32 sums stay int32
    acc = ctx.scratch(out.shape, cd)
    return [Step(np.add.reduce, (x, axes, cd, acc, keep)), Step(np.copyto, (out, acc), {"casting": "same_kind"})]


def mean_rows_step(x: Any, axes: Sequence[int], out: Any) -> Step | None:
    """The float32 mean of ``x`` over its trailing ``axes`` as one matrix-vector product
    of its rows with 1/n (rlx_gemv), or None (other axes, dtypes, one value a row): numpy's
    reduce and divide took 10-13 µs on a squeeze-excitation block's 576x7x7, a fixed cost
    per row for rows this short (global_avg_pool2d, and the ReduceMean over (2, 3) that
    torch's dynamo exporter writes for it: 3.5x faster)."""
    if sorted(axes) != list(range(x.ndim - len(axes), x.ndim)) or x.dtype != np.float32 or out.dtype != np.float32:
        return None
    inner = math.prod(x.shape[a] for a in axes)
    rows = x.size // inner if inner else 0
    if inner <= 1 or rows == 0:
        return None
    weights = np.full((inner, 1), 1.0 / inner, np.float32)
    weights.flags.writeable = False
    return gemv_step(x.reshape(rows, inner), weights, out.reshape(rows, 1))


def _reduce_mean(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    x, axes, keep = ins[0], node.attrs["axes"], node.attrs["keepdims"]
    rows = mean_rows_step(x, axes, out)
    if rows is not None:
        return [rows]
    cd = compute_dtype(out.dtype)
    acc = out if cd == out.dtype else ctx.scratch(out.shape, cd)
    count = const(math.prod(x.shape[a] for a in axes), cd)
    return [Step(np.add.reduce, (x, axes, cd, acc, keep)), Step(np.divide, (acc, count, out))]


def _reduce_max(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    return [Step(np.maximum.reduce, (ins[0], node.attrs["axes"], None, out, node.attrs["keepdims"]))]


# ----------------------------------------------------------------------------- data movement
def _transpose(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    native = transpose_step(ins[0], node.attrs["perm"], out)  # a batch of matrix transposes
    return [native or Step(np.copyto, (out, ins[0].transpose(node.attrs["perm"])))]


def _slice(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    x = ins[0]
    return [Step(np.copyto, (out, x[slice_index(x.ndim, node.attrs)]))]


def _concat(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    axis, start, steps = node.attrs["axis"], 0, []
    for x in ins:
        n = x.shape[axis]
        index = (slice(None),) * axis + (slice(start, start + n),)
        block = out[index]
        if not (isinstance(x, np.ndarray) and x.ctypes.data == block.ctypes.data and x.shape == block.shape
                and x.flags.c_contiguous and block.flags.c_contiguous):
            steps.append(Step(np.copyto, (block, x)))  # else computed there already (the executor's concat blocks)
        start += n
    return steps


def _take(x: np.ndarray, idx: np.ndarray, axis: int, out: np.ndarray, what: str) -> None:
    try:
        x.take(idx, axis, out, "raise")
    except IndexError:
        n = x.shape[axis]
        bad = idx[(idx < -n) | (idx >= n)]
        first = int(bad.flat[0]) if bad.size else "?"
        raise InputError(f"{what} (gather): index {first} is out of range for axis {axis} of size {n}") from None


def _gather(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    native = gather_step(ins[0], ins[1], node.attrs["axis"], out, ctx)  # constant indices
    return [native or Step(_take, (ins[0], ins[1], node.attrs["axis"], out, node.describe()))]


# ----------------------------------------------------------------------------- matmul
def _matmul(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    # (a float16 product arrives as its float32 twin: binding._FLOAT32_TWINS; numpy has no float16 GEMM)
    a, b = ins
    return dense_steps(a, b, None, "none", out, ctx) or [matmul_step(a, b, out, ctx)]


KERNELS: dict[OpKind, Builder] = {
    **{op: _binary for op in _BINARY_UFUNCS},
    OpKind.POW: _pow,
    **{op: _unary for op in _UNARY_UFUNCS},
    **{op: _compare for op in _COMPARE_UFUNCS},
    OpKind.DIV: _div,
    OpKind.FMOD: _fmod,
    OpKind.BIT_SHIFT_LEFT: _bit_shift,
    OpKind.BIT_SHIFT_RIGHT: _bit_shift,
    OpKind.RELU: _relu,
    OpKind.RSQRT: _rsqrt,
    OpKind.SIGMOID: _sigmoid,
    OpKind.ERF: _erf,
    OpKind.GELU: _gelu,
    OpKind.CAST: _cast,
    OpKind.WHERE: _where,
    OpKind.REDUCE_SUM: _reduce_sum,
    OpKind.REDUCE_MEAN: _reduce_mean,
    OpKind.REDUCE_MAX: _reduce_max,
    OpKind.TRANSPOSE: _transpose,
    OpKind.SLICE: _slice,
    OpKind.CONCAT: _concat,
    OpKind.GATHER: _gather,
    OpKind.MATMUL: _matmul,
}


def softmax_steps(x: Any, axis: int, work: np.ndarray, out: np.ndarray, ctx: BuildContext) -> list[Step]:
    """``out = softmax(x)`` along ``axis``, computed in ``work`` (``out``, or a float32
    temporary; ``x`` may be ``work`` itself)."""
    red = list(work.shape)
    red[axis] = 1
    stat = ctx.scratch(tuple(red), work.dtype)
    return [
        Step(np.maximum.reduce, (x, axis, None, stat, True)),
        Step(np.subtract, (x, stat, work)),
        Step(np.exp, (work, work)),
        Step(np.add.reduce, (work, axis, None, stat, True)),
        Step(np.divide, (work, stat, out)),
    ]
