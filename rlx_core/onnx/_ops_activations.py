"""Converters that are decompositions into existing IR ops: activations, the composite
reductions (L1, log-sum, log-sum-exp, product), and LpNormalization,
MeanVarianceNormalization and Hardmax.

None of these ops has an IR op of its own; each is written with ``where``, the
comparisons and the arithmetic ops so that it means exactly what ONNX says (NaN, the
infinities and signed zeros included, checked against onnxruntime and ONNX's reference
implementation), in forms whose intermediates do not overflow where the result is
finite (softplus, log-sum-exp). Float16 inputs are computed in float32 where float16
would round a float32 attribute (Shrink, ThresholdedRelu) or overflow an intermediate
(LpNormalization, MeanVarianceNormalization, ReduceProd). See ``_context`` for what a
converter receives and returns.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import DTYPES, INT_DTYPES, is_unsigned
from ._context import NodeContext, converter
from ._ops import reduce_axes
from ._shapes import Emitter, Operand

__all__: list[str] = []

_FLOATS = ("float16", "float32", "float64")
_NUMBERS = (*_FLOATS, *(d for d in DTYPES if d in INT_DTYPES))  # every integer width, as ONNX allows
#: ONNX's Selu defaults: the float32 values of the constants in the SELU paper.
_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


def _operand(c: NodeContext, dtypes: tuple[str, ...] = _FLOATS) -> Operand:
    """Input 0, refused by name unless its dtype is one of ``dtypes``."""
    x = c.input(0)
    dtype = c.f.dtype(x)
    if dtype not in dtypes:
        raise c.fail(f"needs a {' or '.join(dtypes)} input, got {dtype}")
    return x


def _widened(f: Emitter, x: Operand) -> Operand:
    """``x`` in float32 when it is float16, else ``x`` itself (the cast is exact)."""
    return f.op("cast", x, dtype="float32") if f.dtype(x) == "float16" else x


def _narrowed(f: Emitter, y: Operand, dtype: str, name: str) -> Operand:
    """``y`` cast back to ``dtype`` under ``name``; ``y`` must carry ``name`` already when
    no cast is needed (build it with ``name if f.dtype(y) == dtype else ""``)."""
    return y if f.dtype(y) == dtype else f.op("cast", y, dtype=dtype, name=name)


def log1p(f: Emitter, u: Operand) -> Operand:
    """``log(1 + u)`` accurate for tiny ``u`` without a log1p op: with ``w = 1 + u``
    rounded, ``u * log(w) / (w - 1)`` cancels the rounding of ``w`` (Goldberg, "What
    every computer scientist should know about floating-point arithmetic", thm. 4);
    where ``w`` rounds to 1, ``log1p(u) = u`` to working precision."""
    dtype = f.dtype(u)
    one = f.const(1, dtype)
    w = f.op("add", u, one)
    exact = f.op("equal", w, one)
    step = f.op("where", exact, one, f.op("sub", w, one))  # never 0: no 0/0 in the branch not taken
    return f.op("where", exact, u, f.op("div", f.op("mul", u, f.op("log", w)), step))


def expm1(f: Emitter, u: Operand) -> Operand:
    """``exp(u) - 1`` to a few ulps without an expm1 op: for ``|u| <= 1``, with ``w =
    exp(u)`` rounded, ``(w - 1) * u / log(w)`` cancels the rounding of ``w`` (Kahan's form of
    the ``log1p`` trick above), and where ``w`` rounds to 1, ``expm1(u) = u`` to working
    precision; past 1, ``w - 1`` loses nothing (and stays -1 or inf at the ends)."""
    dtype = f.dtype(u)
    one = f.const(1, dtype)
    w = f.op("exp", u)
    w1 = f.op("sub", w, one)
    exact = f.op("equal", w, one)
    # log of w, or of 2 where w is 1 (never 0: no 0/0 in the branch not taken); the select
    # also keeps XLA from simplifying log(exp(u)) to u, which would undo the correction
    step = f.op("log", f.op("where", exact, f.const(2, dtype), w))
    near = f.op("where", exact, u, f.op("div", f.op("mul", w1, u), step))
    return f.op("where", f.op("greater", f.op("abs", u), one), w1, near)


def softplus(f: Emitter, x: Operand, name: str = "") -> Operand:
    """``log(1 + exp(x))`` as ``max(x, 0) + log1p(exp(-|x|))``: ``exp`` never overflows,
    and for very negative ``x`` the result keeps its relative precision (``exp(x)``)."""
    dtype = f.dtype(x)
    tail = log1p(f, f.op("exp", f.op("neg", f.op("abs", x))))
    return f.op("add", f.op("maximum", x, f.const(0, dtype)), tail, name=name)


# ---------------------------------------------------------------- activations
@converter("Elu")
def _elu(c: NodeContext) -> list[Operand | None]:
    """``alpha * (exp(x) - 1)`` for ``x < 0``, else ``x`` (onnxruntime's form)."""
    f, x = c.f, _operand(c)
    dtype = f.dtype(x)
    alpha = float(c.attr("alpha", 1.0))
    neg = f.op("mul", f.op("sub", f.op("exp", x), f.const(1, dtype)), f.const(alpha, dtype))
    return [f.op("where", f.op("less", x, f.const(0, dtype)), neg, x, name=c.out())]


@converter("Selu")
def _selu(c: NodeContext) -> list[Operand | None]:
    """``gamma * x`` for ``x > 0``, else ``gamma * (alpha * exp(x) - alpha)``."""
    f, x = c.f, _operand(c)
    dtype = f.dtype(x)
    alpha = f.const(float(c.attr("alpha", _SELU_ALPHA)), dtype)
    gamma = f.const(float(c.attr("gamma", _SELU_GAMMA)), dtype)
    neg = f.op("mul", f.op("sub", f.op("mul", f.op("exp", x), alpha), alpha), gamma)
    pos = f.op("mul", x, gamma)
    return [f.op("where", f.op("greater", x, f.const(0, dtype)), pos, neg, name=c.out())]


@converter("Celu")
def _celu(c: NodeContext) -> list[Operand | None]:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``; ``alpha = 0`` divides by zero
    in the definition and is refused. bfloat16, a storage format, is computed in float32
    with an accurate ``expm1`` and rounded to bfloat16 once, as ONNX's reference evaluator
    computes it (its float32 ``alpha`` promotes every step to float32)."""
    f, x = c.f, _operand(c, (*_FLOATS, "bfloat16"))
    alpha = float(c.attr("alpha", 1.0))
    if alpha == 0.0:
        raise c.fail("alpha must not be 0 (Celu divides by it)")
    if f.dtype(x) == "bfloat16":
        xf = f.op("cast", x, dtype="float32")
        a = f.const(alpha, "float32")
        neg = f.op("mul", a, expm1(f, f.op("div", xf, a)))
        y = f.op("add", f.op("relu", xf), f.op("minimum", neg, f.const(0, "float32")))
        return [f.op("cast", y, dtype="bfloat16", name=c.out())]
    dtype = f.dtype(x)
    a = f.const(alpha, dtype)
    neg = f.op("mul", f.op("sub", f.op("exp", f.op("div", x, a)), f.const(1, dtype)), a)
    return [f.op("add", f.op("relu", x), f.op("minimum", neg, f.const(0, dtype)), name=c.out())]


@converter("Softplus")
def _softplus(c: NodeContext) -> list[Operand | None]:
    return [softplus(c.f, _operand(c), c.out())]


@converter("Softsign")
def _softsign(c: NodeContext) -> list[Operand | None]:
    """``x / (1 + |x|)`` (NaN at +-inf, as the formula and onnxruntime say)."""
    f, x = c.f, _operand(c)
    return [f.op("div", x, f.op("add", f.op("abs", x), f.const(1, f.dtype(x))), name=c.out())]


@converter("Mish")
def _mish(c: NodeContext) -> list[Operand | None]:
    """``x * tanh(softplus(x))``, with the overflow-free softplus."""
    f, x = c.f, _operand(c)
    return [f.op("mul", x, f.op("tanh", softplus(f, x)), name=c.out())]


@converter("Swish")
def _swish(c: NodeContext) -> list[Operand | None]:
    """Opset 24: ``x * sigmoid(alpha * x)``."""
    f, x = c.f, _operand(c)
    alpha = float(c.attr("alpha", 1.0))
    scaled = x if alpha == 1.0 else f.op("mul", x, f.const(alpha, f.dtype(x)))
    return [f.op("mul", x, f.op("sigmoid", scaled), name=c.out())]


@converter("SwiGLU")
def _swiglu(c: NodeContext) -> list[Operand | None]:
    """Opset 28: ``Swish_alpha(A) * B``, ``A * sigmoid(alpha * A) * B`` (``A`` the gate,
    ``B`` the value), of one shape and dtype: the spec applies no broadcasting."""
    f, a, b = c.f, _operand(c), c.input(1, "B")
    if f.dtype(b) != f.dtype(a) or f.shape(b) != f.shape(a):
        raise c.fail(f"A and B must have one shape and dtype (no broadcasting), got {f.dtype(a)}{list(f.shape(a))} "
                     f"and {f.dtype(b)}{list(f.shape(b))}")
    unknown = sorted(attr.name for attr in c.node.attribute if attr.name != "alpha")
    if unknown:
        raise c.fail(f"attributes {unknown} are not read (only alpha)")
    alpha = float(c.attr("alpha", 1.0))
    scaled = a if alpha == 1.0 else f.op("mul", a, f.const(alpha, f.dtype(a)))
    return [f.op("mul", f.op("mul", a, f.op("sigmoid", scaled)), b, name=c.out())]


@converter("ThresholdedRelu")
def _thresholded_relu(c: NodeContext) -> list[Operand | None]:
    """``x`` where ``x > alpha``, else 0 (NaN included); float16 is compared in float32 so
    that ``alpha`` (a float32 attribute) is not rounded."""
    f, x = c.f, _operand(c)
    dtype = f.dtype(x)
    wide = _widened(f, x)
    above = f.op("greater", wide, f.const(float(c.attr("alpha", 1.0)), f.dtype(wide)))
    return [f.op("where", above, x, f.const(0, dtype), name=c.out())]


@converter("Shrink")
def _shrink(c: NodeContext) -> list[Operand | None]:
    """``x + bias`` for ``x < -lambd``, ``x - bias`` for ``x > lambd``, else 0. Float16 is
    computed in float32 and ints in float64, then cast back (truncating, as ONNX's
    reference does), so the float32 attributes are never rounded to the input's dtype."""
    f, x = c.f, _operand(c, _NUMBERS)
    dtype = f.dtype(x)
    bias, lambd = float(c.attr("bias", 0.0)), float(c.attr("lambd", 0.5))
    wide = f.op("cast", x, dtype="float64") if dtype in INT_DTYPES else _widened(f, x)
    wd = f.dtype(wide)
    low = f.op("less", wide, f.const(-lambd, wd))
    high = f.op("greater", wide, f.const(lambd, wd))
    inner = f.op("where", high, f.op("sub", wide, f.const(bias, wd)), f.const(0, wd))
    y = f.op("where", low, f.op("add", wide, f.const(bias, wd)), inner, name=c.out() if wd == dtype else "")
    return [_narrowed(f, y, dtype, c.out())]


@converter("PRelu")
def _prelu(c: NodeContext) -> list[Operand | None]:
    """``slope * x`` for ``x < 0``, else ``x``; ``slope`` broadcasts to ``x`` one way only
    (ONNX unidirectional broadcasting: the output has ``x``'s shape)."""
    f, x, slope = c.f, _operand(c, _NUMBERS), c.input(1, "slope")
    dtype = f.dtype(x)
    if f.dtype(slope) != dtype:
        raise c.fail(f"slope has dtype {f.dtype(slope)}, X has {dtype}")
    xs, ss = f.shape(x), f.shape(slope)
    if len(ss) > len(xs) or any(s not in (1, d) for s, d in zip(reversed(ss), reversed(xs))):
        raise c.fail(f"slope of shape {ss} does not broadcast to X's shape {xs} (ONNX unidirectional broadcasting)")
    return [f.op("where", f.op("less", x, f.const(0, dtype)), f.op("mul", x, slope), x, name=c.out())]


@converter("Sign")
def _sign(c: NodeContext) -> list[Operand | None]:
    """1 for ``x > 0``, -1 for ``x < 0``, else ``x`` itself: 0 for zeros, NaN for NaN (as
    numpy and onnxruntime's float32 kernel). Unsigned values are never below 0 (and
    have no -1)."""
    f, x = c.f, _operand(c, _NUMBERS)
    dtype = f.dtype(x)
    zero, one = f.const(0, dtype), f.const(1, dtype)
    rest = x if is_unsigned(dtype) else f.op("where", f.op("less", x, zero), f.const(-1, dtype), x)
    return [f.op("where", f.op("greater", x, zero), one, rest, name=c.out())]


# ---------------------------------------------------------------- reductions
def _reduction(c: NodeContext, dtypes: tuple[str, ...]) -> tuple[Operand, tuple[int, ...] | None, bool]:
    """``(x, axes, keepdims)`` of a ReduceX node; ``axes`` is ``None`` for a no-op
    reduction (``noop_with_empty_axes`` with no axes: the elementwise steps still apply)."""
    x = _operand(c, dtypes)
    rank = len(c.f.shape(x))
    axes = reduce_axes(c, rank)
    if axes is None:
        if c.attr("noop_with_empty_axes", 0):
            return x, None, True
        axes = tuple(range(rank))
    if len(set(axes)) != len(axes):
        raise c.fail(f"axes {axes} repeat an axis")
    return x, axes, bool(c.attr("keepdims", 1))


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keep: bool) -> tuple[int, ...]:
    if keep:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


@converter("ReduceL1")
def _reduce_l1(c: NodeContext) -> list[Operand | None]:
    """``sum(|x|)``; ints stay ints (ONNX admits them; the sum wraps like numpy's)."""
    f, (x, axes, keep) = c.f, _reduction(c, _NUMBERS)
    if axes is None:
        return [f.op("abs", x, name=c.out())]
    return [f.op("reduce_sum", f.op("abs", x), axes=axes, keepdims=keep, name=c.out())]


@converter("ReduceLogSum")
def _reduce_log_sum(c: NodeContext) -> list[Operand | None]:
    """``log(sum(x))``: -inf over an empty set, as ONNX says."""
    f, (x, axes, keep) = c.f, _reduction(c, _FLOATS)
    total = x if axes is None else f.op("reduce_sum", x, axes=axes, keepdims=keep)
    return [f.op("log", total, name=c.out())]


@converter("ReduceLogSumExp")
def _reduce_log_sum_exp(c: NodeContext) -> list[Operand | None]:
    """``m + log(sum(exp(x - m)))`` with ``m`` the max, or 0 where the max is infinite
    (an all -inf slice gives -inf, one with +inf gives +inf, NaN stays NaN); over an empty
    set, where no max exists, ``log(sum(exp(x)))`` = -inf. A no-op reduction is ``x``
    itself (``log(exp(x))`` without its overflow)."""
    f, (x, axes, keep) = c.f, _reduction(c, _FLOATS)
    if axes is None:
        return [x]
    shape, dtype = f.shape(x), f.dtype(x)
    if any(shape[a] == 0 for a in axes):
        total = f.op("reduce_sum", f.op("exp", x), axes=axes, keepdims=keep)
        return [f.op("log", total, name=c.out())]
    top = f.op("reduce_max", x, axes=axes, keepdims=True)
    finite = f.op("equal", f.op("sub", top, top), f.const(0, dtype))
    shift = f.op("where", finite, top, f.const(0, dtype))
    total = f.op("reduce_sum", f.op("exp", f.op("sub", x, shift)), axes=axes, keepdims=keep)
    if not keep:
        shift = f.op("reshape", shift, shape=_reduced_shape(shape, axes, False))
    return [f.op("add", f.op("log", total), shift, name=c.out())]


def _product_along(f: Emitter, x: Operand, axis: int) -> Operand:
    """The product of ``x`` along ``axis`` (kept, size 1), multiplied pairwise: the first
    half by the second, ``ceil(log2(n))`` levels, an odd element carried to the next."""
    n = f.shape(x)[axis]
    while n > 1:
        half = n // 2
        first = f.op("slice", x, starts=(0,), ends=(half,), axes=(axis,))
        second = f.op("slice", x, starts=(half,), ends=(2 * half,), axes=(axis,))
        product = f.op("mul", first, second)
        if n % 2:
            odd = f.op("slice", x, starts=(n - 1,), ends=(n,), axes=(axis,))
            product = f.op("concat", product, odd, axis=axis)
        x, n = product, half + n % 2
    return x


@converter("ReduceProd")
def _reduce_prod(c: NodeContext) -> list[Operand | None]:
    """The product as a tree of ``mul`` over slices (no IR product op): ints are exact
    (wrapping like numpy's), floats differ from a sequential product only by rounding
    order; float16 is multiplied in float32, so that no partial product overflows where
    the whole does not (a zero times an overflowed part would be NaN, not 0). An empty
    set's product is 1."""
    f, (x, axes, keep) = c.f, _reduction(c, _NUMBERS)
    if axes is None:
        return [x]
    shape, dtype = f.shape(x), f.dtype(x)
    if any(shape[a] == 0 for a in axes):  # zeros of the output's shape, plus one
        total = f.op("reduce_sum", x, axes=axes, keepdims=keep)
        return [f.op("add", total, f.const(1, dtype), name=c.out())]
    wide = _widened(f, x)
    for a in axes:
        wide = _product_along(f, wide, a)
    y = f.op("reshape", wide, shape=_reduced_shape(shape, axes, keep), name=c.out() if f.dtype(wide) == dtype else "")
    return [_narrowed(f, y, dtype, c.out())]


# ---------------------------------------------------------------- normalizations
def _axis(c: NodeContext, rank: int, default: int) -> int:
    axis = int(c.attr("axis", default))
    if not -rank <= axis < max(rank, 1) or rank == 0:
        raise c.fail(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


@converter("LpNormalization")
def _lp_normalization(c: NodeContext) -> list[Operand | None]:
    """``x / ||x||_p`` along ``axis`` for p = 1 or 2 (the only ones ONNX defines), 0 where
    the norm is 0 (onnxruntime and ONNX's reference)."""
    f, x = c.f, _operand(c)
    dtype = f.dtype(x)
    axis = _axis(c, len(f.shape(x)), -1)
    p = int(c.attr("p", 2))
    if p not in (1, 2):
        raise c.fail(f"p must be 1 or 2, got {p}")
    wide = _widened(f, x)
    wd = f.dtype(wide)
    if p == 1:
        norm = f.op("reduce_sum", f.op("abs", wide), axes=(axis,), keepdims=True)
    else:
        norm = f.op("sqrt", f.op("reduce_sum", f.op("mul", wide, wide), axes=(axis,), keepdims=True))
    zero = f.const(0, wd)
    y = f.op("where", f.op("equal", norm, zero), zero, f.op("div", wide, norm), name=c.out() if wd == dtype else "")
    return [_narrowed(f, y, dtype, c.out())]


@converter("MeanVarianceNormalization")
def _mean_variance_normalization(c: NodeContext) -> list[Operand | None]:
    """``(x - mean) / (sqrt(var) + 1e-9)`` over ``axes`` (default 0, 2, 3), the epsilon of
    ONNX's function body; the variance is the two-pass ``mean((x - mean)^2)`` (the same
    value as the body's ``E[x^2] - E[x]^2``, without its cancellation)."""
    f, x = c.f, _operand(c)
    dtype, rank = f.dtype(x), len(f.shape(x))
    axes = c.attr_ints("axes", (0, 2, 3)) or tuple(range(rank))
    for a in axes:
        if not -rank <= a < max(rank, 1):
            raise c.fail(f"axis {a} is out of range for rank {rank}")
    norm_axes = tuple(sorted({a % rank for a in axes}))
    if len(norm_axes) != len(axes):
        raise c.fail(f"axes {axes} repeat an axis")
    wide = _widened(f, x)
    wd = f.dtype(wide)
    centered = f.op("sub", wide, f.op("reduce_mean", wide, axes=norm_axes, keepdims=True))
    var = f.op("reduce_mean", f.op("mul", centered, centered), axes=norm_axes, keepdims=True)
    std = f.op("add", f.op("sqrt", var), f.const(1e-9, wd))
    y = f.op("div", centered, std, name=c.out() if wd == dtype else "")
    return [_narrowed(f, y, dtype, c.out())]


def _hardmax(f: Emitter, x: Operand, axis: int, name: str) -> Operand:
    """1 at the first maximum along ``axis``, 0 elsewhere; a NaN counts as the maximum
    (the first NaN wins), as ``numpy.argmax`` in ONNX's reference does.

    Every element gets a score, an int unique along the axis, and the best is kept:
    ``n - i`` for a NaN at index ``i`` (> 0), ``-i`` for a maximum (<= 0), ``-n`` for the
    rest; the max of the scores picks the first NaN if any, else the first maximum."""
    shape, dtype = f.shape(x), f.dtype(x)
    n = shape[axis]
    if n == 0:
        return f.op("mul", x, f.const(0, dtype), name=name)  # an empty result
    itype = "int32" if n < 2**31 - 1 else "int64"
    index = np.arange(n, dtype=itype).reshape((n,) + (1,) * (len(shape) - axis - 1))
    as_max, as_nan, other = f.const(-index, itype), f.const(n - index, itype), f.const(-n, itype)
    number = f.op("equal", x, x)
    top = f.op("reduce_max", f.op("where", number, x, f.const(-np.inf, dtype)), axes=(axis,), keepdims=True)
    score = f.op("where", number, f.op("where", f.op("equal", x, top), as_max, other), as_nan)
    best = f.op("reduce_max", score, axes=(axis,), keepdims=True)
    return f.op("cast", f.op("equal", score, best), dtype=dtype, name=name)


@converter("Hardmax")
def _hardmax_op(c: NodeContext) -> list[Operand | None]:
    """Opset >= 13: along ``axis`` (default -1). Before: the input is seen as 2-D, split
    at ``axis`` (default 1), and the maximum is taken over the flattened trailing part."""
    f, x = c.f, _operand(c)
    shape = f.shape(x)
    if c.opset >= 13:
        return [_hardmax(f, x, _axis(c, len(shape), -1), c.out())]
    axis = _axis(c, len(shape), 1)
    flat = f.op("reshape", x, shape=(math.prod(shape[:axis]), math.prod(shape[axis:])))
    return [f.op("reshape", _hardmax(f, flat, 1, ""), shape=shape, name=c.out())]
