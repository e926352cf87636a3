"""The op set: ``OpKind``, which ops are sources and composites, and the type rules.

Each op has one inference function that validates its inputs and attributes, puts the
attributes in canonical form (tuples, non-negative axes, resolved defaults), and returns
the output shape and dtype. The builder (``ir.Graph``) and the JSON loader both go
through it, so a graph file is checked exactly like a graph built in Python, and
backends read attributes that are already normalized (see ``docs/ops.md``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..errors import GraphError
from . import shape_rules
from .dtypes import FLOAT_DTYPES, STORAGE_OPS, is_int, is_storage, normalize_dtype
from .symbolic import Dim, Sym

__all__ = [
    "OpKind",
    "SOURCE_OPS",
    "COMPOSITE_OPS",
    "INTERNAL_OPS",
    "OP_EXTENSIONS",
    "PRIMITIVE_OPS",
    "ELEMENTWISE_OPS",
    "MORE_TRIG_OPS",
    "NUMPY_NAMES",
    "infer",
    "broadcast_shapes",
    "slice_index",
]


class OpKind(str, enum.Enum):
    """Every op of the IR. A ``str`` enum: ``OpKind.MATMUL == "matmul"``."""

    INPUT = "input"
    PARAM = "param"
    CONSTANT = "constant"
    MATMUL = "matmul"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    ERF = "erf"
    TANH = "tanh"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    SIGMOID = "sigmoid"
    RELU = "relu"
    GELU = "gelu"
    SOFTMAX = "softmax"
    LAYER_NORM = "layer_norm"
    REDUCE_SUM = "reduce_sum"
    REDUCE_MEAN = "reduce_mean"
    REDUCE_MAX = "reduce_max"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    CONCAT = "concat"
    SLICE = "slice"
    GATHER = "gather"
    CAST = "cast"
    WHERE = "where"
    EQUAL = "equal"
    LESS = "less"
    GREATER = "greater"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    FMOD = "fmod"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    BITWISE_NOT = "bitwise_not"
    BIT_SHIFT_LEFT = "bit_shift_left"
    BIT_SHIFT_RIGHT = "bit_shift_right"
    CONV2D = "conv2d"
    MAX_POOL2D = "max_pool2d"
    AVG_POOL2D = "avg_pool2d"
    GLOBAL_AVG_POOL2D = "global_avg_pool2d"
    ATTENTION = "attention"
    # Internal ops: made by the compile pipeline for backends that claim them (see
    # rlx_core/ir/internal_types.py); no builder method, but valid in JSON and the reference.
    GEMM = "gemm"
    FUSED_ELEMENTWISE = "fused_elementwise"
    FUSED_CONV = "fused_conv"

    def __str__(self) -> str:  # "matmul", not "OpKind.MATMUL", in messages
        return self.value


SOURCE_OPS: frozenset[OpKind] = frozenset({OpKind.INPUT, OpKind.PARAM, OpKind.CONSTANT})
COMPOSITE_OPS: frozenset[OpKind] = frozenset(
    {
        OpKind.SIGMOID,
        OpKind.GELU,
        OpKind.SOFTMAX,
        OpKind.LAYER_NORM,
        OpKind.ATTENTION,
        OpKind.RSQRT,
        OpKind.REDUCE_MEAN,
        OpKind.GLOBAL_AVG_POOL2D,
    }
)
#: Optional attributes of ops beyond the contract's, as ``"op.attr"``: a node carries one
#: only for a backend that lists it in ``Backend.op_extensions`` (legalization rewrites
#: it for any other), so a plugin written before it never meets it.
#:
#: - ``attention.nan_to_zero``: softmax probabilities that are NaN count as 0, so a row
#:   of scores masked everywhere (all ``-inf``) gives zeros, not NaN. torch's SDPA export
#:   (both exporters: every transformers model exported with ``attn_implementation=
#:   "sdpa"``) guards its softmax so, with ``where(isnan(p), 0, p)``.
OP_EXTENSIONS: frozenset[str] = frozenset({"attention.nan_to_zero"})

#: Ops the compile pipeline makes (gemm = matmul + bias + activation, fused_elementwise = a
#: region of elementwise ops, fused_conv = conv2d + an elementwise epilogue); legalization
#: expands them for a backend that does not claim them.
INTERNAL_OPS: frozenset[OpKind] = frozenset({OpKind.GEMM, OpKind.FUSED_ELEMENTWISE, OpKind.FUSED_CONV})
PRIMITIVE_OPS: frozenset[OpKind] = frozenset(OpKind) - COMPOSITE_OPS - SOURCE_OPS - INTERNAL_OPS

#: Bitwise ops and shifts: integer operands only, two's complement bits (see docs/ops.md).
BITWISE_OPS = (OpKind.BITWISE_AND, OpKind.BITWISE_OR, OpKind.BITWISE_XOR, OpKind.BITWISE_NOT,
               OpKind.BIT_SHIFT_LEFT, OpKind.BIT_SHIFT_RIGHT)
BINARY_OPS = (
    OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.DIV, OpKind.POW, OpKind.MAXIMUM, OpKind.MINIMUM, OpKind.FMOD,
    OpKind.BITWISE_AND, OpKind.BITWISE_OR, OpKind.BITWISE_XOR, OpKind.BIT_SHIFT_LEFT, OpKind.BIT_SHIFT_RIGHT,
)
UNARY_OPS = (
    OpKind.NEG, OpKind.ABS, OpKind.EXP, OpKind.LOG, OpKind.SQRT, OpKind.RSQRT, OpKind.ERF,
    OpKind.TANH, OpKind.SIGMOID, OpKind.RELU, OpKind.GELU, OpKind.FLOOR, OpKind.CEIL, OpKind.ROUND,
    OpKind.BITWISE_NOT, OpKind.SIN, OpKind.COS,
)
#: The trigonometric and hyperbolic functions beyond sin, cos and tanh (ONNX's Tan, Asin...
#: Atanh): float-only, each the C and numpy function of its name (numpy spells the inverses
#: ``arcsin``...). Backends map them with one table.
MORE_TRIG_OPS = (OpKind.TAN, OpKind.ASIN, OpKind.ACOS, OpKind.ATAN, OpKind.SINH, OpKind.COSH, OpKind.ASINH,
                 OpKind.ACOSH, OpKind.ATANH)
UNARY_OPS = UNARY_OPS + MORE_TRIG_OPS
#: numpy's name of each of ``MORE_TRIG_OPS`` (also jax.numpy's).
NUMPY_NAMES: dict[OpKind, str] = {op: ("arc" + op.value[1:] if op.value.startswith("a") else op.value)
                                  for op in MORE_TRIG_OPS}
#: Elementwise comparisons: numpy broadcasting, a bool result (IEEE: NaN compares unequal).
COMPARE_OPS = (OpKind.EQUAL, OpKind.LESS, OpKind.GREATER)
ELEMENTWISE_OPS: frozenset[OpKind] = frozenset(BINARY_OPS + UNARY_OPS + COMPARE_OPS + (OpKind.CAST, OpKind.WHERE))
_FLOAT_ONLY = frozenset(
    {OpKind.POW, OpKind.EXP, OpKind.LOG, OpKind.SQRT, OpKind.RSQRT, OpKind.ERF, OpKind.TANH,
     OpKind.SIGMOID, OpKind.GELU, OpKind.FLOOR, OpKind.CEIL, OpKind.ROUND, OpKind.SIN, OpKind.COS, *MORE_TRIG_OPS}
)
_INT_ONLY = frozenset(BITWISE_OPS)

Shape = tuple[Dim, ...]  # ints, or symbolic dims (see symbolic.py and shape_rules.py)


class TensorLike(Protocol):
    shape: Shape
    dtype: str


Attrs = dict[str, Any]
InferFn = Callable[[OpKind, Sequence[TensorLike], Attrs], tuple[Attrs, Shape, str]]


def _fail(op: OpKind, msg: str) -> GraphError:
    return GraphError(f"{op}: {msg}")


def _fmt(ins: Sequence[TensorLike]) -> str:
    return " and ".join(f"{t.shape} {t.dtype}" for t in ins)


def broadcast_shapes(op: OpKind, *shapes: Shape) -> Shape:
    """numpy broadcasting of ``shapes``; ``GraphError`` naming ``op`` and every shape."""
    if shape_rules.has_sym(*shapes):
        return shape_rules.broadcast_dims(op, shapes)
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(-ndim, 0):
        dims = {s[i] for s in shapes if len(s) >= -i} - {1}
        if len(dims) > 1:
            raise _fail(op, f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _axis(op: OpKind, axis: Any, ndim: int, what: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise _fail(op, f"{what} must be an int, got {axis!r}")
    if not -ndim <= axis < max(ndim, 1) or ndim == 0:
        raise _fail(op, f"{what} {axis} is out of range for rank {ndim}")
    return axis % ndim


def _ints(op: OpKind, value: Any, what: str) -> tuple[int, ...]:
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return (int(value),)
    try:
        out = tuple(value)
    except TypeError:
        raise _fail(op, f"{what} must be a sequence of ints, got {value!r}") from None
    for v in out:
        if isinstance(v, bool) or (not isinstance(v, int) and not hasattr(v, "__index__")):
            raise _fail(op, f"{what} must be a sequence of ints, got {value!r}")
    return tuple(int(v) for v in out)


def _pair(op: OpKind, value: Any, what: str, minimum: int) -> tuple[int, int]:
    v = _ints(op, value, what)
    if len(v) == 1:
        v = (v[0], v[0])
    if len(v) != 2 or min(v) < minimum:
        raise _fail(op, f"{what} must be an int or a pair of ints >= {minimum}, got {value!r}")
    return v  # type: ignore[return-value]


def _padding(op: OpKind, value: Any) -> tuple[int, int, int, int]:
    v = _ints(op, value, "padding")
    if len(v) == 1:
        v = v * 4
    elif len(v) == 2:
        v = (v[0], v[1], v[0], v[1])
    if len(v) != 4 or min(v) < 0:
        raise _fail(op, f"padding must be an int, (ph, pw) or (top, left, bottom, right) >= 0, got {value!r}")
    return v  # type: ignore[return-value]


def _need(op: OpKind, ins: Sequence[TensorLike], lo: int, hi: int | None = None) -> None:
    hi = lo if hi is None else hi
    if not lo <= len(ins) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise _fail(op, f"takes {want} inputs, got {len(ins)}")


def _same_dtype(op: OpKind, ins: Sequence[TensorLike]) -> str:
    dtypes = {t.dtype for t in ins}
    if len(dtypes) != 1:
        raise _fail(op, f"inputs have different dtypes: {_fmt(ins)} (cast one explicitly)")
    return ins[0].dtype


def _check_kind(op: OpKind, dtype: str, ins: Sequence[TensorLike]) -> None:
    if op in _FLOAT_ONLY or op in (OpKind.SOFTMAX, OpKind.LAYER_NORM, OpKind.REDUCE_MEAN, OpKind.CONV2D,
                                   OpKind.MAX_POOL2D, OpKind.AVG_POOL2D, OpKind.GLOBAL_AVG_POOL2D,
                                   OpKind.ATTENTION):
        if dtype not in FLOAT_DTYPES:
            raise _fail(op, f"needs a float dtype, got {_fmt(ins)}")
    elif op in _INT_ONLY:
        if not is_int(dtype):
            raise _fail(op, f"needs an integer dtype, got {_fmt(ins)}")
    elif dtype == "bool":
        raise _fail(op, f"does not take bool, got {_fmt(ins)}")


def _no_attrs(op: OpKind, attrs: Attrs, allowed: Sequence[str] = ()) -> None:
    extra = set(attrs) - set(allowed)
    if extra:
        raise _fail(op, f"unknown attribute(s) {sorted(extra)}; allowed: {sorted(allowed) or 'none'}")


def _infer_binary(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 2)
    _no_attrs(op, attrs)
    dtype = _same_dtype(op, ins)
    _check_kind(op, dtype, ins)
    return {}, broadcast_shapes(op, ins[0].shape, ins[1].shape), dtype


def _infer_unary(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 1)
    out: Attrs = {}
    if op is OpKind.GELU:
        _no_attrs(op, attrs, ("approximate",))
        approx = attrs.get("approximate", "none")
        if approx not in ("none", "tanh"):
            raise _fail(op, f"approximate must be 'none' or 'tanh', got {approx!r}")
        out["approximate"] = approx
    else:
        _no_attrs(op, attrs)
    _check_kind(op, ins[0].dtype, ins)
    return out, ins[0].shape, ins[0].dtype


def _infer_compare(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 2)
    _no_attrs(op, attrs)
    dtype = _same_dtype(op, ins)
    if dtype == "bool" and op is not OpKind.EQUAL:  # ordering bools is not a numeric question
        raise _fail(op, f"does not take bool, got {_fmt(ins)}")
    return {}, broadcast_shapes(op, ins[0].shape, ins[1].shape), "bool"


def _infer_matmul(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 2)
    _no_attrs(op, attrs)
    dtype = _same_dtype(op, ins)
    _check_kind(op, dtype, ins)
    a, b = ins[0].shape, ins[1].shape
    if not a or not b:
        raise _fail(op, f"inputs must have rank >= 1, got shapes {a} and {b}")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if not shape_rules.same_dim(op, a2[-1], b2[-2], f"the inner dimensions of {a} and {b}"):
        raise _fail(op, f"inner dimensions differ: shapes {a} and {b} ({a2[-1]} != {b2[-2]})")
    try:
        batch = broadcast_shapes(op, a2[:-2], b2[:-2])
    except GraphError:
        raise _fail(op, f"batch dimensions of shapes {a} and {b} do not broadcast") from None
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return {}, out, dtype


def _infer_softmax(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 1)
    _no_attrs(op, attrs, ("axis",))
    _check_kind(op, ins[0].dtype, ins)
    return {"axis": _axis(op, attrs.get("axis", -1), len(ins[0].shape))}, ins[0].shape, ins[0].dtype


def _infer_layer_norm(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 2, 3)
    _no_attrs(op, attrs, ("axis", "eps"))
    dtype = _same_dtype(op, ins)
    _check_kind(op, dtype, ins)
    x = ins[0].shape
    axis = _axis(op, attrs.get("axis", -1), len(x))
    eps = attrs.get("eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise _fail(op, f"eps must be a number >= 0, got {eps!r}")
    norm = x[axis:]
    for what, t in zip(("scale", "bias"), ins[1:]):
        if broadcast_shapes(op, norm, t.shape) != norm:
            raise _fail(op, f"{what} shape {t.shape} does not broadcast to the normalized shape {norm}")
    return {"axis": axis, "eps": float(eps)}, x, dtype


def _infer_reduce(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 1)
    _no_attrs(op, attrs, ("axes", "keepdims"))
    x = ins[0].shape
    _check_kind(op, ins[0].dtype, ins)
    raw = attrs.get("axes")
    axes = tuple(range(len(x))) if raw is None else tuple(_axis(op, a, len(x), "axes") for a in _ints(op, raw, "axes"))
    if len(set(axes)) != len(axes):
        raise _fail(op, f"axes {raw!r} repeat an axis")
    axes = tuple(sorted(axes))
    keep = attrs.get("keepdims", False)
    if not isinstance(keep, bool):
        raise _fail(op, f"keepdims must be a bool, got {keep!r}")
    if op is OpKind.REDUCE_MAX and any(x[a] == 0 for a in axes):
        raise _fail(op, f"cannot reduce an empty axis of shape {x}")
    shape = tuple(1 if i in axes else d for i, d in enumerate(x)) if keep else tuple(
        d for i, d in enumerate(x) if i not in axes
    )
    return {"axes": axes, "keepdims": keep}, shape, ins[0].dtype


def _infer_reshape(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 1)
    _no_attrs(op, attrs, ("shape",))
    x = ins[0].shape
    raw = attrs.get("shape", ())
    if shape_rules.has_sym(x) or shape_rules.has_sym_target(raw):
        shape = shape_rules.reshape_dims(op, x, raw)
        return {"shape": shape}, shape, ins[0].dtype
    want = list(_ints(op, raw, "shape"))
    size = math.prod(x)
    if want.count(-1) > 1 or any(d < -1 for d in want):
        raise _fail(op, f"shape {tuple(want)} may hold at most one -1 and no other negative")
    if -1 in want:
        known = math.prod(d for d in want if d != -1)
        if known == 0 or size % known:
            raise _fail(op, f"cannot reshape {x} ({size} elements) to {tuple(want)}")
        want[want.index(-1)] = size // known
    if math.prod(want) != size:
        raise _fail(op, f"cannot reshape {x} ({size} elements) to {tuple(want)}")
    return {"shape": tuple(want)}, tuple(want), ins[0].dtype


def _infer_transpose(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 1)
    _no_attrs(op, attrs, ("perm",))
    x = ins[0].shape
    raw = attrs.get("perm")
    perm = tuple(reversed(range(len(x)))) if raw is None else _ints(op, raw, "perm")
    if sorted(perm) != list(range(len(x))):
        raise _fail(op, f"perm {tuple(perm)} is not a permutation of the {len(x)} axes of {x}")
    return {"perm": perm}, tuple(x[p] for p in perm), ins[0].dtype


def _infer_concat(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    if not ins:
        raise _fail(op, "needs at least one input")
    _no_attrs(op, attrs, ("axis",))
    dtype = _same_dtype(op, ins)
    first = ins[0].shape
    axis = _axis(op, attrs.get("axis", 0), len(first))
    for t in ins[1:]:
        if len(t.shape) != len(first) or not all(
            shape_rules.same_dim(op, a, b, f"concatenating {first} and {t.shape} on axis {axis}")
            for i, (a, b) in enumerate(zip(t.shape, first)) if i != axis
        ):
            raise _fail(op, f"shapes {first} and {t.shape} differ outside axis {axis}")
    shape = (*first[:axis], sum(t.shape[axis] for t in ins), *first[axis + 1:])
    return {"axis": axis}, shape, dtype


def _infer_slice(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 1)
    _no_attrs(op, attrs, ("starts", "ends", "axes", "steps"))
    x = ins[0].shape
    starts = _bounds(op, attrs.get("starts", ()), "starts")
    ends = _bounds(op, attrs.get("ends", ()), "ends")
    raw_axes = attrs.get("axes")
    axes = tuple(range(len(starts))) if raw_axes is None else _ints(op, raw_axes, "axes")
    raw_steps = attrs.get("steps")
    steps = (1,) * len(starts) if raw_steps is None else _ints(op, raw_steps, "steps")
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise _fail(op, f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    axes = tuple(_axis(op, a, len(x), "axes") for a in axes)
    if len(set(axes)) != len(axes):
        raise _fail(op, f"axes {axes} repeat an axis")
    if 0 in steps:
        raise _fail(op, "steps must not be 0")
    shape = list(x)
    n_starts, n_ends = [], []
    for a, s, e, st in zip(axes, starts, ends, steps):
        if isinstance(x[a], Sym) or isinstance(s, Sym) or isinstance(e, Sym):  # bounds stay as given;
            # specializing canonicalizes them
            n_starts.append(s)
            n_ends.append(e)
            shape[a] = shape_rules.slice_length(x[a], s, e, st)
            continue
        s, e = _canonical_bounds(x[a], s, e, st)
        n_starts.append(s)
        n_ends.append(e)
        shape[a] = len(range(*slice(s, e, st).indices(x[a])))
    attrs_out = {"starts": tuple(n_starts), "ends": tuple(n_ends), "axes": axes, "steps": steps}
    return attrs_out, tuple(shape), ins[0].dtype


def _bounds(op: OpKind, value: Any, what: str) -> tuple[Dim, ...]:
    """Slice bounds: ints, or symbolic dims (``x[:, :seq]`` of a table in a symbolic graph)."""
    if isinstance(value, (tuple, list)) and any(isinstance(v, Sym) for v in value):
        return tuple(v if isinstance(v, Sym) else _ints(op, (v,), what)[0] for v in value)
    return _ints(op, value, what)


def _canonical_bounds(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX/numpy slice bounds (negative counts from the end, out of range clamps) in the
    canonical form stored on a ``slice`` node: a fixed point of this function, so that
    re-inferring a normalized node (JSON load, graph rewrites) changes nothing.

    The picked indices are ``range(*slice(start, end, step).indices(dim))`` and the Python
    index ``x[start:end:step]`` is exactly right: ``start`` lies in ``[0, dim)``, an empty
    slice is ``0:0``, and a negative step that runs through index 0 ends at ``-dim - 1``
    (Python's "before the first element"; a plain -1 would mean the last one).
    """
    s, e, _ = slice(start, end, step).indices(dim)
    if not range(s, e, step):
        return 0, 0
    if e < 0:  # negative step down to index 0 inclusive
        e = -dim - 1
    return s, e


def slice_index(ndim: int, attrs: Mapping[str, Any]) -> tuple[slice, ...]:
    """Python index for a normalized ``slice`` node: ``x[slice_index(x.ndim, node.attrs)]``.

    Normalized bounds are plain Python slice bounds (see ``_canonical_bounds``), so this
    is only a convenience; ``range(*slice(start, end, step).indices(dim))`` lists the
    indices for backends that gather instead.
    """
    index = [slice(None)] * ndim
    for a, s, e, st in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]):
        index[a] = slice(s, e, st)
    return tuple(index)


def _infer_gather(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 2)
    _no_attrs(op, attrs, ("axis",))
    x, idx = ins
    if idx.dtype not in ("int32", "int64"):
        raise _fail(op, f"indices must be int32 or int64, got {idx.dtype}")
    axis = _axis(op, attrs.get("axis", 0), len(x.shape))
    return {"axis": axis}, x.shape[:axis] + idx.shape + x.shape[axis + 1 :], x.dtype


def _infer_cast(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 1)
    _no_attrs(op, attrs, ("dtype",))
    if "dtype" not in attrs:
        raise _fail(op, "needs a dtype")
    dtype = normalize_dtype(attrs["dtype"], what=str(op))
    return {"dtype": dtype}, ins[0].shape, dtype


def _infer_where(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 3)
    _no_attrs(op, attrs)
    if ins[0].dtype != "bool":
        raise _fail(op, f"condition must be bool, got {ins[0].dtype}")
    dtype = _same_dtype(op, ins[1:])
    return {}, broadcast_shapes(op, *(t.shape for t in ins)), dtype


def _window_out(op: OpKind, size: Dim, k: int, s: int, p0: int, p1: int, d: int, ceil: bool) -> Dim:
    if isinstance(size, Sym):
        return shape_rules.window_out(op, size, k, s, p0, p1, d, ceil)
    span = size + p0 + p1 - d * (k - 1) - 1
    if span < 0:
        raise _fail(op, f"window {k} (dilation {d}) is larger than the padded input {size + p0 + p1}")
    n = (-(-span // s) if ceil else span // s) + 1
    if ceil and (n - 1) * s >= size + p0:  # the last window must start inside input or left pad
        n -= 1
    return n


def _infer_conv2d(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 2, 3)
    _no_attrs(op, attrs, ("stride", "padding", "dilation", "groups"))
    dtype = _same_dtype(op, ins)
    _check_kind(op, dtype, ins)
    x, w = ins[0].shape, ins[1].shape
    if len(x) != 4 or len(w) != 4:
        raise _fail(op, f"needs x (N, C, H, W) and w (O, C/groups, kH, kW), got shapes {x} and {w}")
    stride = _pair(op, attrs.get("stride", 1), "stride", 1)
    dilation = _pair(op, attrs.get("dilation", 1), "dilation", 1)
    padding = _padding(op, attrs.get("padding", 0))
    groups = attrs.get("groups", 1)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise _fail(op, f"groups must be an int >= 1, got {groups!r}")
    if shape_rules.has_sym(x[1:2], w):
        raise _fail(op, f"symbolic dims not supported yet in channels or weights: x {x}, w {w}")
    if x[1] % groups or w[0] % groups or w[1] * groups != x[1]:
        raise _fail(op, f"channels do not match: x {x}, w {w}, groups {groups} (need w[1] * groups == x[1])")
    if len(ins) == 3 and ins[2].shape != (w[0],):
        raise _fail(op, f"bias must have shape ({w[0]},), got {ins[2].shape}")
    oh = _window_out(op, x[2], w[2], stride[0], padding[0], padding[2], dilation[0], False)
    ow = _window_out(op, x[3], w[3], stride[1], padding[1], padding[3], dilation[1], False)
    attrs_out = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    return attrs_out, (x[0], w[0], oh, ow), dtype


def _infer_pool(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 1)
    extra = ("count_include_pad",) if op is OpKind.AVG_POOL2D else ("dilation",)
    _no_attrs(op, attrs, ("kernel", "stride", "padding", "ceil_mode", *extra))
    _check_kind(op, ins[0].dtype, ins)
    x = ins[0].shape
    if len(x) != 4:
        raise _fail(op, f"needs x (N, C, H, W), got shape {x}")
    if "kernel" not in attrs:
        raise _fail(op, "needs a kernel size")
    kernel = _pair(op, attrs["kernel"], "kernel", 1)
    stride = _pair(op, attrs.get("stride") or kernel, "stride", 1)
    padding = _padding(op, attrs.get("padding", 0))
    dilation = _pair(op, attrs.get("dilation", 1), "dilation", 1)
    ceil = attrs.get("ceil_mode", False)
    if not isinstance(ceil, bool):
        raise _fail(op, f"ceil_mode must be a bool, got {ceil!r}")
    if max(padding[0], padding[2]) * 2 > (kernel[0] - 1) * dilation[0] + 1 or max(padding[1], padding[3]) * 2 > (
        kernel[1] - 1
    ) * dilation[1] + 1:
        raise _fail(op, f"padding {padding} must be at most half the window {kernel}")
    oh = _window_out(op, x[2], kernel[0], stride[0], padding[0], padding[2], dilation[0], ceil)
    ow = _window_out(op, x[3], kernel[1], stride[1], padding[1], padding[3], dilation[1], ceil)
    out: Attrs = {"kernel": kernel, "stride": stride, "padding": padding, "ceil_mode": ceil}
    if op is OpKind.AVG_POOL2D:
        cip = attrs.get("count_include_pad", False)
        if not isinstance(cip, bool):
            raise _fail(op, f"count_include_pad must be a bool, got {cip!r}")
        out["count_include_pad"] = cip
    else:
        out["dilation"] = dilation
    return out, (x[0], x[1], oh, ow), ins[0].dtype


def _infer_global_pool(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 1)
    _no_attrs(op, attrs)
    _check_kind(op, ins[0].dtype, ins)
    x = ins[0].shape
    if len(x) != 4:
        raise _fail(op, f"needs x (N, C, H, W), got shape {x}")
    return {}, (x[0], x[1], 1, 1), ins[0].dtype


def _infer_attention(op: OpKind, ins: Sequence[TensorLike], attrs: Attrs) -> tuple[Attrs, Shape, str]:
    _need(op, ins, 3, 4)
    _no_attrs(op, attrs, ("scale", "nan_to_zero"))
    nan_to_zero = attrs.get("nan_to_zero", False)
    if not isinstance(nan_to_zero, bool):
        raise _fail(op, f"nan_to_zero must be a bool, got {nan_to_zero!r}")
    guard = {"nan_to_zero": True} if nan_to_zero else {}  # (absent when off: graphs read as they always have)
    q, k, v = (t.shape for t in ins[:3])
    dtype = _same_dtype(op, ins[:3])
    _check_kind(op, dtype, ins)
    if min(len(q), len(k), len(v)) < 2 or not (
        shape_rules.same_dim(op, q[-1], k[-1], f"the head dims of q {q} and k {k}")
        and shape_rules.same_dim(op, k[-2], v[-2], f"the key lengths of k {k} and v {v}")
    ):
        raise _fail(op, f"needs q (..., Lq, D), k (..., Lk, D), v (..., Lk, Dv); got {q}, {k}, {v}")
    batch = broadcast_shapes(op, q[:-2], k[:-2], v[:-2])
    scores = (*batch, q[-2], k[-2])
    if len(ins) == 4:
        m = ins[3]
        if m.dtype not in ("bool", dtype):
            raise _fail(op, f"mask must be bool or {dtype}, got {m.dtype}")
        fits = len(m.shape) <= len(scores) and all(
            (not isinstance(d, Sym) and d == 1) or shape_rules.same_dim(op, d, sd, f"mask {m.shape} on scores {scores}")
            for d, sd in zip(m.shape[::-1], scores[::-1])
        )
        if not fits:
            raise _fail(op, f"mask shape {m.shape} does not broadcast to the scores shape {scores}")
    scale = attrs.get("scale")
    if scale is None and isinstance(q[-1], Sym):  # 1/sqrt(D) once D is known (specializing)
        return {"scale": None, **guard}, (*batch, q[-2], v[-1]), dtype
    if scale is None:  # 1/sqrt(D); an empty head dimension has all-zero scores, any scale will do
        scale = 1.0 / math.sqrt(q[-1]) if q[-1] else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise _fail(op, f"scale must be a number, got {scale!r}")
    return {"scale": float(scale), **guard}, (*batch, q[-2], v[-1]), dtype


_INFER: dict[OpKind, InferFn] = {
    OpKind.MATMUL: _infer_matmul,
    OpKind.SOFTMAX: _infer_softmax,
    OpKind.LAYER_NORM: _infer_layer_norm,
    OpKind.REDUCE_SUM: _infer_reduce,
    OpKind.REDUCE_MEAN: _infer_reduce,
    OpKind.REDUCE_MAX: _infer_reduce,
    OpKind.RESHAPE: _infer_reshape,
    OpKind.TRANSPOSE: _infer_transpose,
    OpKind.CONCAT: _infer_concat,
    OpKind.SLICE: _infer_slice,
    OpKind.GATHER: _infer_gather,
    OpKind.CAST: _infer_cast,
    OpKind.WHERE: _infer_where,
    OpKind.CONV2D: _infer_conv2d,
    OpKind.MAX_POOL2D: _infer_pool,
    OpKind.AVG_POOL2D: _infer_pool,
    OpKind.GLOBAL_AVG_POOL2D: _infer_global_pool,
    OpKind.ATTENTION: _infer_attention,
    **{op: _infer_binary for op in BINARY_OPS},
    **{op: _infer_compare for op in COMPARE_OPS},
    **{op: _infer_unary for op in UNARY_OPS},
}


def infer(op: OpKind, ins: Sequence[TensorLike], attrs: Mapping[str, Any]) -> tuple[Attrs, Shape, str]:
    """Validate ``op`` on ``ins`` and return ``(normalized attrs, shape, dtype)``."""
    fn = _INFER.get(op)
    stored = [t.dtype for t in ins if is_storage(t.dtype)]
    if stored and op.value not in STORAGE_OPS:
        raise _fail(op, f"computes nothing in {stored[0]}, a storage dtype (rlx casts it and moves it: "
                        f"{', '.join(sorted(STORAGE_OPS))}); cast it to float32 first, got {_fmt(ins)}")
    if fn is None and op in INTERNAL_OPS:
        raise GraphError(f"{op}: an internal op, typed by rlx_core.ir.internal_types.infer_internal")
    if fn is None:
        raise GraphError(f"{op}: not a computational op (sources are added with input/param/constant)")
    return fn(op, ins, dict(attrs))
