"""Converters of elementwise, comparison, softmax and reduction ops.

One small function per op type (or per family of op types that map alike); shape and
tensor ops live in ``_ops_tensor``, networks' layers (Gemm, Conv, norms) in ``_ops_nn``,
pools in ``_ops_pool``. See ``_context`` for what a converter receives and returns.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir.dtypes import is_int
from ._context import NodeContext, converter
from ._shapes import Emitter, Operand, frozen

__all__: list[str] = []

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
_UNARY = {"Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Erf": "erf", "Tanh": "tanh",
          "Sigmoid": "sigmoid", "Relu": "relu", "Floor": "floor", "Ceil": "ceil", "Round": "round",
          "BitwiseNot": "bitwise_not", "Sin": "sin", "Cos": "cos",
          **{n.capitalize(): n for n in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")}}
_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}
_COMPARE = {
    "Equal": np.equal,
    "Less": np.less,
    "Greater": np.greater,
    "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
}
_FLOATS = ("float16", "float32", "float64")


@converter(*_BINARY)
def _binary(c: NodeContext) -> list[Operand | None]:
    return [c.f.op(_BINARY[c.op_type], c.input(0), c.input(1), name=c.out())]


@converter(*_UNARY)
def _unary(c: NodeContext) -> list[Operand | None]:
    return [c.f.op(_UNARY[c.op_type], c.input(0), name=c.out())]


@converter(*_BITWISE)
def _bitwise(c: NodeContext) -> list[Operand | None]:
    return [c.f.op(_BITWISE[c.op_type], c.input(0), c.input(1), name=c.out())]


@converter("BitShift")
def _bit_shift(c: NodeContext) -> list[Operand | None]:
    """``direction`` LEFT or RIGHT (required). BitShift-28's rules for signed values and
    out-of-range shifts are the IR ops' own (docs/ops.md)."""
    direction = c.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise c.fail(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    kind = "bit_shift_left" if direction == "LEFT" else "bit_shift_right"
    return [c.f.op(kind, c.input(0), c.input(1), name=c.out())]


@converter("Reciprocal")
def _reciprocal(c: NodeContext) -> list[Operand | None]:
    x = c.input(0)
    return [c.f.op("div", c.f.const(1, c.f.dtype(x)), x, name=c.out())]


@converter("Pow")
def _pow(c: NodeContext) -> list[Operand | None]:
    """``x ** y``; a constant exponent of 1, 2 or 0.5 becomes x, x*x or sqrt(x) (exact and
    cheaper), an exponent of another dtype is cast to the base's, an integer base goes
    through float64."""
    f, x, y = c.f, c.input(0), c.input(1)
    dtype = f.dtype(x)
    if f.dtype(y) != dtype:
        y = f.op("cast", y, dtype=dtype)
    exponent = f.array(y)
    if exponent is not None and exponent.size == 1 and exponent.ndim <= len(f.shape(x)):
        e = float(exponent.reshape(()))
        if e == 1.0:
            return [x]
        if e == 2.0:
            return [f.op("mul", x, x, name=c.out())]
        if e == 0.5 and dtype in _FLOATS:
            return [f.op("sqrt", x, name=c.out())]
    if dtype not in _FLOATS:
        wide = f.op("pow", f.op("cast", x, dtype="float64"), f.op("cast", y, dtype="float64"))
        return [f.op("cast", wide, dtype=dtype, name=c.out())]
    return [f.op("pow", x, y, name=c.out())]


@converter("LeakyRelu")
def _leaky_relu(c: NodeContext) -> list[Operand | None]:
    """``max(x, alpha*x)`` for 0 <= alpha <= 1 (two kernels), ``min`` for alpha > 1."""
    f, x = c.f, c.input(0)
    alpha = float(c.attr("alpha", 0.01))
    if alpha >= 0.0:
        scaled = f.op("mul", x, f.const(alpha, f.dtype(x)))
        return [f.op("maximum" if alpha <= 1.0 else "minimum", x, scaled, name=c.out())]
    zero = f.const(0, f.dtype(x))
    neg = f.op("mul", f.op("minimum", x, zero), f.const(alpha, f.dtype(x)))
    return [f.op("add", f.op("maximum", x, zero), neg, name=c.out())]


def _hard_sigmoid(f: Emitter, x: Operand, alpha: float, beta: float, name: str = "") -> Operand:
    dtype = f.dtype(x)
    y = f.op("add", f.op("mul", x, f.const(alpha, dtype)), f.const(beta, dtype))
    return f.op("maximum", f.op("minimum", y, f.const(1, dtype)), f.const(0, dtype), name=name)


@converter("HardSigmoid")
def _hard_sigmoid_op(c: NodeContext) -> list[Operand | None]:
    alpha, beta = float(c.attr("alpha", 0.2)), float(c.attr("beta", 0.5))
    return [_hard_sigmoid(c.f, c.input(0), alpha, beta, c.out())]


@converter("HardSwish")
def _hard_swish(c: NodeContext) -> list[Operand | None]:
    x = c.input(0)
    return [c.f.op("mul", x, _hard_sigmoid(c.f, x, 1.0 / 6.0, 0.5), name=c.out())]


@converter("Gelu")
def _gelu(c: NodeContext) -> list[Operand | None]:
    approximate = c.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise c.fail(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return [c.f.op("gelu", c.input(0), approximate=approximate, name=c.out())]


@converter("Clip")
def _clip(c: NodeContext) -> list[Operand | None]:
    """``min(max(x, lo), hi)``; bounds from inputs (opset >= 11) or attributes."""
    f, x = c.f, c.input(0)
    dtype = f.dtype(x)
    lo, hi = c.optional(1), c.optional(2)
    if lo is None and c.has_attr("min"):
        lo = f.const(c.attr("min"), dtype)
    if hi is None and c.has_attr("max"):
        hi = f.const(c.attr("max"), dtype)
    if lo is not None:
        x = f.op("maximum", x, lo, name="" if hi is not None else c.out())
    if hi is not None:
        x = f.op("minimum", x, hi, name=c.out())
    return [x]


@converter("Max", "Min", "Sum", "Mean")
def _variadic(c: NodeContext) -> list[Operand | None]:
    f, xs = c.f, c.inputs()
    if not xs:
        raise c.fail("needs at least one input")
    kind = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[c.op_type]
    acc = xs[0]
    for i, x in enumerate(xs[1:], start=2):
        last = i == len(xs) and c.op_type != "Mean"
        acc = f.op(kind, acc, x, name=c.out() if last else "")
    if c.op_type == "Mean" and len(xs) > 1:
        acc = f.op("div", acc, f.const(len(xs), f.dtype(acc)), name=c.out())
    return [acc]


@converter("Where")
def _where(c: NodeContext) -> list[Operand | None]:
    return [c.f.op("where", c.input(0), c.input(1), c.input(2), name=c.out())]


@converter(*_COMPARE)
def _compare(c: NodeContext) -> list[Operand | None]:
    """Folded when both operands are known at import; at run time Equal, Less and Greater
    are IR ops, and the others are exact ``where`` combinations of them (NaN included:
    ``a <= b`` is ``where(a < b, True, a == b)``, false when either is NaN)."""
    f, a, b = c.f, c.input(0), c.input(1)
    fn = _COMPARE[c.op_type]
    if f.dtype(a) != f.dtype(b):
        raise c.fail(f"operands have different dtypes {f.dtype(a)} and {f.dtype(b)}")
    logical = c.op_type in ("And", "Or", "Xor")
    if logical and f.dtype(a) != "bool":
        raise c.fail(f"needs bool operands, got {f.dtype(a)}")
    if not logical and f.dtype(a) == "bool" and c.op_type != "Equal":
        raise c.fail("cannot order bool operands (rlx compares bools only for equality)")
    xa, xb = f.array(a), f.array(b)
    if xa is not None and xb is not None:
        f.check_size(np.broadcast_shapes(xa.shape, xb.shape), "bool", f"the folded result of {c.op_type}")
        return [frozen(fn(xa, xb))]
    true, false, name = f.const(True, "bool"), f.const(False, "bool"), c.out()
    op = c.op_type
    if op in ("Equal", "Less", "Greater"):
        return [f.op(op.lower(), a, b, name=name)]
    if op == "LessOrEqual":
        return [f.op("where", f.op("less", a, b), true, f.op("equal", a, b), name=name)]
    if op == "GreaterOrEqual":
        return [f.op("where", f.op("greater", a, b), true, f.op("equal", a, b), name=name)]
    if op == "And":
        return [f.op("where", a, b, false, name=name)]
    if op == "Or":
        return [f.op("where", a, true, b, name=name)]
    return [f.op("where", a, f.op("where", b, false, true), b, name=name)]  # Xor


@converter("Not")
def _not(c: NodeContext) -> list[Operand | None]:
    """``where(x, False, True)``: exact, and no IR op of its own."""
    f, x = c.f, c.input(0)
    if f.dtype(x) != "bool":
        raise c.fail(f"needs a bool operand, got {f.dtype(x)}")
    arr = f.array(x)
    if arr is not None:
        return [frozen(np.logical_not(arr))]
    return [f.op("where", x, f.const(False, "bool"), f.const(True, "bool"), name=c.out())]


@converter("IsNaN", "IsInf")
def _is_special(c: NodeContext) -> list[Operand | None]:
    """Exact comparisons: NaN is the one value unequal to itself (``where(x == x, False,
    True)``), and an infinity equals only itself. Exporters emit these around masked
    attention (``torch.where(isnan(...))``)."""
    f, x = c.f, c.input(0)
    dtype = f.dtype(x)
    if dtype not in ("float16", "float32", "float64"):
        raise c.fail(f"needs a float operand, got {dtype}")
    arr = f.array(x)
    neg, pos = bool(c.attr("detect_negative", 1)), bool(c.attr("detect_positive", 1))
    if arr is not None:
        if c.op_type == "IsNaN":
            return [frozen(np.isnan(arr))]
        return [frozen((np.isneginf(arr) & neg) | (np.isposinf(arr) & pos))]
    true, false, name = f.const(True, "bool"), f.const(False, "bool"), c.out()
    if c.op_type == "IsNaN":
        return [f.op("where", f.op("equal", x, x), false, true, name=name)]
    if not (neg or pos):  # detects nothing: all False
        return [f.op("where", f.op("equal", x, x), false, false, name=name)]
    hits = [f.op("equal", x, f.const(sign * np.inf, dtype)) for sign, on in ((-1.0, neg), (1.0, pos)) if on]
    if len(hits) == 1:
        return [f.op("where", hits[0], true, false, name=name)]
    return [f.op("where", hits[0], true, hits[1], name=name)]


# ---------------------------------------------------------------- softmax
def _log_softmax(f: Emitter, x: Operand, axis: int, name: str) -> Operand:
    """``x - max - log(sum(exp(x - max)))``: stable where ``log(softmax(x))`` underflows."""
    shifted = f.op("sub", x, f.op("reduce_max", x, axes=(axis,), keepdims=True))
    total = f.op("reduce_sum", f.op("exp", shifted), axes=(axis,), keepdims=True)
    return f.op("sub", shifted, f.op("log", total), name=name)


@converter("Softmax", "LogSoftmax")
def _softmax(c: NodeContext) -> list[Operand | None]:
    """Opset >= 13: along ``axis`` (default -1). Before: the input is seen as 2-D, split
    at ``axis`` (default 1), and normalized along the flattened trailing part."""
    f, x = c.f, c.input(0)
    shape = f.shape(x)
    log = c.op_type == "LogSoftmax"
    if c.opset >= 13:
        axis = int(c.attr("axis", -1))
        if log:
            return [_log_softmax(f, x, axis % max(len(shape), 1), c.out())]
        return [f.op("softmax", x, axis=axis, name=c.out())]
    axis = int(c.attr("axis", 1))
    rank = len(shape)
    if not -rank <= axis < max(rank, 1):
        raise c.fail(f"axis {axis} is out of range for rank {rank}")
    if axis < 0:
        axis += rank
    flat = f.op("reshape", x, shape=(math.prod(shape[:axis]), math.prod(shape[axis:])))
    y = _log_softmax(f, flat, 1, "") if log else f.op("softmax", flat, axis=1)
    return [f.op("reshape", y, shape=shape, name=c.out())]


# ---------------------------------------------------------------- reductions
def reduce_axes(c: NodeContext, rank: int) -> tuple[int, ...] | None:
    """The axes of a ReduceX node: attribute (older opsets) or input 1; ``None`` = all."""
    axes = c.attr_ints("axes") if c.has_attr("axes") else c.ints(1, "axes")
    if not axes:
        return None
    out = []
    for a in axes:
        if not -rank <= a < max(rank, 1):
            raise c.fail(f"axis {a} is out of range for rank {rank}")
        out.append(a % rank)
    return tuple(out)


def _empty_extreme(f: Emitter, x: Operand, axes: tuple[int, ...], keep: bool, largest: bool) -> np.ndarray:
    """ReduceMax/ReduceMin over an empty set: ONNX's identity of the reduction, whatever
    ``x`` holds (it holds nothing there): -inf / +inf for floats, the dtype's minimum /
    maximum for integers, False / True for bool. A constant of the reduced shape."""
    shape, dtype = f.shape(x), f.dtype(x)
    out = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keep else tuple(
        d for i, d in enumerate(shape) if i not in axes
    )
    if dtype == "bool":
        fill: Any = not largest
    elif is_int(dtype):
        fill = np.iinfo(dtype).min if largest else np.iinfo(dtype).max
    else:
        fill = -np.inf if largest else np.inf
    f.check_size(out, dtype, "the result of a reduction over an empty set")
    return frozen(np.full(out, fill, dtype=np.dtype(dtype)))


def _bool_extreme(f: Emitter, x: Operand, axes: tuple[int, ...], keep: bool, largest: bool, name: str) -> Operand:
    """ReduceMax of bool is "any", ReduceMin "all": the IR's reduce_max over 0/1 int32
    (``x`` for any, ``not x`` for all, whose max says whether some element is False)."""
    one, zero = f.const(1, "int32"), f.const(0, "int32")
    bits = f.op("where", x, one, zero) if largest else f.op("where", x, zero, one)
    found = f.op("reduce_max", bits, axes=axes, keepdims=keep)
    return f.op("equal", found, one if largest else zero, name=name)


@converter("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2")
def _reduce(c: NodeContext) -> list[Operand | None]:
    f, x = c.f, c.input(0)
    rank = len(f.shape(x))
    axes = reduce_axes(c, rank)
    keep = bool(c.attr("keepdims", 1))
    name, op = c.out(), c.op_type
    if axes is None:
        if c.attr("noop_with_empty_axes", 0):  # no reduction, but the elementwise part still applies
            if op == "ReduceSumSquare":
                return [f.op("mul", x, x, name=name)]
            if op == "ReduceL2":
                return [f.op("abs", x, name=name)]
            return [x]
        axes = tuple(range(rank))
    if op in ("ReduceMax", "ReduceMin"):
        if any(f.shape(x)[a] == 0 for a in axes):
            return [_empty_extreme(f, x, axes, keep, op == "ReduceMax")]
        if f.dtype(x) == "bool":
            return [_bool_extreme(f, x, axes, keep, op == "ReduceMax", name)]
    if op == "ReduceMin":
        flipped = f.op("reduce_max", f.flip(x), axes=axes, keepdims=keep)  # no overflow at INT_MIN
        return [f.flip(flipped, name=name)]
    if op in ("ReduceSumSquare", "ReduceL2"):
        total = f.op("reduce_sum", f.op("mul", x, x), axes=axes, keepdims=keep, name=name if op != "ReduceL2" else "")
        return [f.op("sqrt", total, name=name) if op == "ReduceL2" else total]
    kind = {"ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max"}[op]
    return [f.op(kind, x, axes=axes, keepdims=keep, name=name)]
