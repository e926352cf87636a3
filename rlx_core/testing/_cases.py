"""Hypothesis strategies that draw one test case per op: operands, dtypes and attributes.

Shapes, dtypes and attributes are drawn by hypothesis (so a failure shrinks to a small
example); array values come from a numpy generator seeded by a drawn integer, which is
far faster than drawing every element and still reproducible. Value ranges keep each op
well conditioned (log and sqrt see positive numbers, divisors stay away from zero, ints
stay far from overflow), so a mismatch means a wrong backend, not a fragile comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ..ir.ops import OpKind
from . import _fused_cases
from ._case_base import (
    INTS,
    Dtypes,
    OpCase,
    Operand,
    _axis,
    _binary_operands,
    _broadcastable,
    _nonzero,
    _rng,
    _shape,
    _values,
    op_dtypes,
)
from ._cases_exact import EXACT_FACTORIES

_UNARY_RANGE = {
    OpKind.LOG: (0.1, 4.0), OpKind.SQRT: (0.1, 4.0), OpKind.RSQRT: (0.1, 4.0), OpKind.EXP: (-4.0, 4.0),
    OpKind.ERF: (-3.0, 3.0), OpKind.TANH: (-4.0, 4.0), OpKind.SIGMOID: (-6.0, 6.0), OpKind.GELU: (-4.0, 4.0),
    OpKind.SIN: (-8.0, 8.0), OpKind.COS: (-8.0, 8.0), OpKind.TAN: (-1.4, 1.4), OpKind.ASIN: (-0.95, 0.95),
    OpKind.ACOS: (-0.95, 0.95), OpKind.ATAN: (-8.0, 8.0), OpKind.SINH: (-4.0, 4.0), OpKind.COSH: (-4.0, 4.0),
    OpKind.ASINH: (-8.0, 8.0), OpKind.ACOSH: (1.1, 8.0), OpKind.ATANH: (-0.95, 0.95),
}


def _unary(op: OpKind, seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw)
        lo, hi = _UNARY_RANGE.get(op, (-2.0, 2.0))
        x = _values(_rng(draw, seed), shape, dtype, lo, hi)
        attrs = {"approximate": draw(st.sampled_from(["none", "tanh"]))} if op is OpKind.GELU else {}
        return OpCase(op, (Operand("x", x),), attrs)

    return case()


def _binary(op: OpKind, seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype, a_shape, b_shape, rng = _binary_operands(draw, seed, dtypes)
        if op is OpKind.POW:
            a, b = _values(rng, a_shape, dtype, 0.25, 2.5), _values(rng, b_shape, dtype, -2.0, 2.0)
        elif op is OpKind.DIV:
            a, b = _values(rng, a_shape, dtype, ilo=-50, ihi=50), _nonzero(rng, b_shape, dtype)
        else:
            a, b = _values(rng, a_shape, dtype), _values(rng, b_shape, dtype)
        return OpCase(op, (Operand("a", a), Operand("b", b, param=draw(st.booleans()))))

    return case()


def _compare(op: OpKind, seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    """Operands drawn from a few values, so that ties (where the ops differ) are common."""

    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype, a_shape, b_shape, rng = _binary_operands(draw, seed, dtypes)
        pool = _values(rng, (4,), dtype)
        a, b = (rng.choice(pool, size=s).astype(dtype).reshape(s) for s in (a_shape, b_shape))
        return OpCase(op, (Operand("a", a), Operand("b", b, param=draw(st.booleans()))))

    return case()


def _matmul(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        m, k, n = (draw(st.integers(1, 8)) for _ in range(3))
        batch = _shape(draw, 0, 2, 3)
        a_shape = (k,) if draw(st.integers(0, 5)) == 0 else (*_broadcastable(draw, batch), m, k)
        b_shape = (k,) if draw(st.integers(0, 5)) == 0 else (*_broadcastable(draw, batch), k, n)
        rng = _rng(draw, seed)
        a = _values(rng, a_shape, dtype, ilo=-10, ihi=10)
        b = _values(rng, b_shape, dtype, ilo=-10, ihi=10)
        return OpCase(OpKind.MATMUL, (Operand("a", a), Operand("b", b, param=draw(st.booleans()))), terms=k)

    return case()


def _softmax(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw, 1, 4)
        axis = _axis(draw, len(shape))
        x = _values(_rng(draw, seed), shape, dtype, -4.0, 4.0)
        return OpCase(OpKind.SOFTMAX, (Operand("x", x),), {"axis": axis}, terms=shape[axis])

    return case()


def _layer_norm(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw, 1, 4)
        axis = _axis(draw, len(shape))
        norm = shape[axis:]
        rng = _rng(draw, seed)
        operands = [Operand("x", _values(rng, shape, dtype)),
                    Operand("scale", _values(rng, _broadcastable(draw, norm), dtype, 0.5, 2.0), param=True)]
        if draw(st.booleans()):
            operands.append(Operand("bias", _values(rng, _broadcastable(draw, norm), dtype), param=draw(st.booleans())))
        attrs = {"axis": axis, "eps": draw(st.sampled_from([1e-5, 1e-3, 0.5]))}
        return OpCase(OpKind.LAYER_NORM, tuple(operands), attrs, terms=math.prod(norm))

    return case()


def _reduce(op: OpKind, seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw, 0, 4)
        r = len(shape)
        if draw(st.booleans()):
            axes = None
            reduced = shape
        else:
            chosen = draw(st.lists(st.integers(0, max(r - 1, 0)), unique=True, max_size=r)) if r else []
            axes = [a - r if draw(st.booleans()) else a for a in chosen]
            reduced = tuple(shape[a] for a in chosen)
        x = _values(_rng(draw, seed), shape, dtype)
        attrs = {"axes": axes, "keepdims": draw(st.booleans())}
        return OpCase(op, (Operand("x", x),), attrs, terms=math.prod(reduced))

    return case()


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def _reshape(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw, 0, 4)
        factors = _prime_factors(math.prod(shape))
        bins = draw(st.integers(0 if not factors else 1, 4))
        target = [1] * bins
        for f in draw(st.permutations(factors)):
            target[draw(st.integers(0, bins - 1))] *= f
        if target and draw(st.booleans()):
            target[draw(st.integers(0, len(target) - 1))] = -1
        x = _values(_rng(draw, seed), shape, dtype)
        return OpCase(OpKind.RESHAPE, (Operand("x", x),), {"shape": tuple(target)})

    return case()


def _transpose(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw, 0, 4)
        perm = None if draw(st.integers(0, 4)) == 0 else tuple(draw(st.permutations(range(len(shape)))))
        x = _values(_rng(draw, seed), shape, dtype)
        return OpCase(OpKind.TRANSPOSE, (Operand("x", x),), {"perm": perm})

    return case()


def _concat(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw, 1, 4)
        axis = _axis(draw, len(shape))
        rng = _rng(draw, seed)
        operands = []
        for i in range(draw(st.integers(1, 4))):
            s = list(shape)
            s[axis] = draw(st.integers(1, 4))
            operands.append(Operand(f"x{i}", _values(rng, tuple(s), dtype)))
        return OpCase(OpKind.CONCAT, tuple(operands), {"axis": axis})

    return case()


def _slice(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw, 1, 4, max_side=7)
        r = len(shape)
        axes = draw(st.permutations(range(r)))[: draw(st.integers(1, r))]
        starts, ends, steps = [], [], []
        for a in axes:
            n = shape[a]
            bound = st.one_of(st.integers(-n - 2, n + 2), st.sampled_from([2**31 - 1, -(2**31)]))
            s, e, step = draw(bound), draw(bound), draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
            starts.append(s)
            ends.append(e)
            steps.append(step)
        attrs: dict[str, Any] = {"starts": starts, "ends": ends}
        plain = list(axes) == list(range(len(axes)))
        attrs["axes"] = None if plain and draw(st.booleans()) else [a - r if draw(st.booleans()) else a for a in axes]
        attrs["steps"] = None if set(steps) == {1} and draw(st.booleans()) else steps
        x = _values(_rng(draw, seed), shape, dtype)
        return OpCase(OpKind.SLICE, (Operand("x", x),), attrs)

    return case()


def _gather(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw, 1, 3)
        axis = _axis(draw, len(shape))
        n = shape[axis]
        rng = _rng(draw, seed)
        idx_shape = _shape(draw, 0, 2, 4)
        idx = np.asarray(rng.integers(-n, n, size=idx_shape)).astype(draw(st.sampled_from(INTS)))
        return OpCase(OpKind.GATHER, (Operand("x", _values(rng, shape, dtype)), Operand("indices", idx)),
                      {"axis": axis})

    return case()


def _cast(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        src, dst = draw(st.sampled_from(dtypes)), draw(st.sampled_from(dtypes))  # cast takes every dtype
        shape = _shape(draw)
        rng = _rng(draw, seed)
        lo, hi = -100.0, 100.0
        if np.dtype(dst).kind == "u":  # a float out of an int dtype's range casts to no defined value
            lo = 0.0
        x = _values(rng, shape, src, lo, hi, ilo=-100, ihi=100)
        if src != "bool":
            x = np.where(rng.random(shape) < 0.2, 0, x).astype(src)  # exact zeros matter for casts to bool
        return OpCase(OpKind.CAST, (Operand("x", x),), {"dtype": dst})

    return case()


def _where(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        base = _shape(draw)
        rng = _rng(draw, seed)
        shapes = [_broadcastable(draw, base) if draw(st.booleans()) else base for _ in range(3)]
        cond = _values(rng, shapes[0], "bool")
        x, y = _values(rng, shapes[1], dtype), _values(rng, shapes[2], dtype)
        return OpCase(OpKind.WHERE, (Operand("cond", cond), Operand("x", x), Operand("y", y)))

    return case()


def _spatial(draw: Callable, window: int, pad: int) -> int:
    """An input size that leaves room for at least one window."""
    return draw(st.integers(max(1, window - pad), window - pad + 5 if window > pad else 6))


def _conv2d(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        groups, cg, og = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
        kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        padding = tuple(draw(st.integers(0, 2)) for _ in range(4))
        h = _spatial(draw, dilation[0] * (kh - 1) + 1, padding[0] + padding[2])
        w = _spatial(draw, dilation[1] * (kw - 1) + 1, padding[1] + padding[3])
        rng = _rng(draw, seed)
        operands = [Operand("x", _values(rng, (draw(st.integers(1, 2)), groups * cg, h, w), dtype)),
                    Operand("w", _values(rng, (groups * og, cg, kh, kw), dtype), param=True)]
        if draw(st.booleans()):
            operands.append(Operand("b", _values(rng, (groups * og,), dtype), param=draw(st.booleans())))
        attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
        return OpCase(OpKind.CONV2D, tuple(operands), attrs, terms=cg * kh * kw)

    return case()


def _pool(op: OpKind, seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        dilation = (1, 1)
        attrs: dict[str, Any] = {"kernel": kernel}
        if op is OpKind.MAX_POOL2D:
            dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
            attrs["dilation"] = dilation
        window = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
        pads = [draw(st.integers(0, window[i % 2] // 2)) for i in range(4)]  # at most half the window
        attrs["stride"] = None if draw(st.integers(0, 3)) == 0 else (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        attrs["padding"] = tuple(pads)
        attrs["ceil_mode"] = draw(st.booleans())
        if op is OpKind.AVG_POOL2D:
            attrs["count_include_pad"] = draw(st.booleans())
        h = _spatial(draw, window[0], pads[0] + pads[2])
        w = _spatial(draw, window[1], pads[1] + pads[3])
        x = _values(_rng(draw, seed), (draw(st.integers(1, 2)), draw(st.integers(1, 3)), h, w), dtype)
        return OpCase(op, (Operand("x", x),), attrs, terms=kernel[0] * kernel[1])

    return case()


def _global_avg_pool2d(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw, 4, 4, 6)
        x = _values(_rng(draw, seed), shape, dtype)
        return OpCase(OpKind.GLOBAL_AVG_POOL2D, (Operand("x", x),), terms=shape[2] * shape[3])

    return case()


def _attention(seed: int, dtypes: Dtypes, guarded: bool = False) -> st.SearchStrategy[OpCase]:
    """``guarded``: the backend lists ``attention.nan_to_zero``, so cases may carry it, with
    a query row (or every row) masked everywhere: its output must be zeros."""
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        batch = _shape(draw, 0, 2, 3)
        lq, lk, d, dv = (draw(st.integers(1, 6)) for _ in range(4))
        qb, kb, vb = (_broadcastable(draw, batch) for _ in range(3))
        rng = _rng(draw, seed)
        operands = [Operand("q", _values(rng, (*qb, lq, d), dtype)), Operand("k", _values(rng, (*kb, lk, d), dtype)),
                    Operand("v", _values(rng, (*vb, lk, dv), dtype))]
        mask_kind = draw(st.sampled_from(["none", "bool", "float"]))
        nan_to_zero = guarded and draw(st.booleans())
        if mask_kind != "none":
            scores = (*tuple(np.broadcast_shapes(qb, kb, vb)), lq, lk)
            mshape = _broadcastable(draw, scores)
            if mask_kind == "bool":
                mask = _values(rng, mshape, "bool").reshape(mshape or (1,))
                mask[..., 0] = True  # every query keeps at least one key
                mask = mask.reshape(mshape)
            else:
                mask = _values(rng, mshape, dtype, -3.0, 0.0)
            if nan_to_zero:  # the first query row masked everywhere (every row, where the mask has no query axis)
                row = mask.reshape(mshape or (1,))
                (row[..., 0, :] if row.ndim >= 2 else row)[...] = False if mask_kind == "bool" else -np.inf
                mask = row.reshape(mshape)
            operands.append(Operand("mask", mask))
        scale = None if draw(st.booleans()) else draw(st.sampled_from([0.125, 0.5, 1.0]))
        attrs: dict[str, Any] = {"scale": scale, "nan_to_zero": True} if nan_to_zero else {"scale": scale}
        return OpCase(OpKind.ATTENTION, tuple(operands), attrs, terms=d + lk)

    return case()


_FACTORIES: dict[OpKind, Callable[[int, Dtypes], st.SearchStrategy[OpCase]]] = {
    OpKind.MATMUL: _matmul,
    OpKind.SOFTMAX: _softmax,
    OpKind.LAYER_NORM: _layer_norm,
    OpKind.RESHAPE: _reshape,
    OpKind.TRANSPOSE: _transpose,
    OpKind.CONCAT: _concat,
    OpKind.SLICE: _slice,
    OpKind.GATHER: _gather,
    OpKind.CAST: _cast,
    OpKind.WHERE: _where,
    OpKind.CONV2D: _conv2d,
    OpKind.GLOBAL_AVG_POOL2D: _global_avg_pool2d,
    OpKind.ATTENTION: _attention,
    **{op: (lambda seed, dtypes, op=op: _reduce(op, seed, dtypes))
       for op in (OpKind.REDUCE_SUM, OpKind.REDUCE_MEAN, OpKind.REDUCE_MAX)},
    **{op: (lambda seed, dtypes, op=op: _pool(op, seed, dtypes)) for op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D)},
    **{op: (lambda seed, dtypes, op=op: _binary(op, seed, dtypes))
       for op in (OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.DIV, OpKind.POW, OpKind.MAXIMUM, OpKind.MINIMUM)},
    **{op: (lambda seed, dtypes, op=op: _unary(op, seed, dtypes))
       for op in (OpKind.NEG, OpKind.ABS, OpKind.RELU, *_UNARY_RANGE)},
    **{op: (lambda seed, dtypes, op=op: _compare(op, seed, dtypes))
       for op in (OpKind.EQUAL, OpKind.LESS, OpKind.GREATER)},
    OpKind.GEMM: _fused_cases.gemm_cases,
    OpKind.FUSED_ELEMENTWISE: _fused_cases.fused_cases,
    OpKind.FUSED_CONV: _fused_cases.fused_conv_cases(_conv2d),
    **EXACT_FACTORIES,
}


#: Every op the kit can generate cases for.
GENERATED_OPS: frozenset[OpKind] = frozenset(_FACTORIES)


def op_cases(op: OpKind, seed: int = 0, dtypes: Collection[str] | None = None,
             extensions: Collection[str] = ()) -> st.SearchStrategy[OpCase]:
    """The strategy drawing test cases for ``op``; ``seed`` varies the array values.

    ``dtypes`` is what the backend under test reads (``Backend.dtypes``): cases draw the
    dtypes of ``ALL_OP_DTYPES`` among those (``None``: the contract's six). ``ValueError``
    when the op takes none of them. ``extensions`` are the op extensions it lists
    (``Backend.op_extensions``): cases of ``op`` carry those too.
    """
    kind = OpKind(op)
    choices = op_dtypes(kind, dtypes)
    if not choices:
        raise ValueError(f"{kind} takes none of the dtypes {sorted(dtypes or ())}")
    if kind is OpKind.ATTENTION and "attention.nan_to_zero" in extensions:
        return _attention(seed, choices, guarded=True)
    return _FACTORIES[kind](seed, choices)
