"""Converters of ONNX Runtime's QOperator-format ops (QLinearMatMul, QLinearConv): the
quantized models ``quantize_static(..., quant_format=QOperator)`` writes, where each op
reads int8/uint8 tensors with their scales and zero points and writes one requantized.

rlx has no integer product op, so each is the exact decomposition MatMulInteger and
ConvInteger use: the operands shifted by their zero points, multiplied in float64 (or
convolved exactly in float32 where the sums allow: ``_ops_nn.integer_conv``), where every
sum of products of 8-bit differences (and an int32 bias) is exact; then requantized as
ONNX's reference does, so that the outputs agree
bit for bit: the factor ``a_scale * b_scale / y_scale`` computed in the scales' own dtype
(float32, or float16 from opset 21), each rounding where the reference rounds; the
accumulator times that factor, plus the output zero point, in float64 (numpy promotes an
int32 by a float32 or float16 to float64); rounded half to even and saturated to the
output type's range, then cast.

Scales and zero points are read per tensor (one value each), except the per-column form
of QLinearMatMul's ``b`` and the per-output-channel form of QLinearConv's ``w`` (1-D, one
value per column or output channel). The float8 types of opset 21 and bfloat16 scales
are refused by name, as is any other layout of a scale or zero point.
"""

from __future__ import annotations

import numpy as np

from ._context import NodeContext, converter
from ._ops_nn import integer_conv
from ._ops_quant import zero_shifted
from ._shapes import Operand

__all__: list[str] = []

#: The dtypes a scale may have: numpy computes the reference's factor in each of them.
_SCALES = ("float16", "float32", "float64")


def _one_value(c: NodeContext, v: Operand, what: str) -> Operand:
    """A per-tensor scale or zero point as a scalar; refused unless it holds one value."""
    f = c.f
    shape = f.shape(v)
    if int(np.prod(shape, dtype=np.int64)) != 1:
        raise c.fail(f"{what} must hold one value (per tensor), got shape {shape}")
    return f.op("reshape", v, shape=()) if shape else v


def _per_tensor_or_along(c: NodeContext, v: Operand, n: int, what: str, along: str) -> Operand:
    """A scale or zero point holding one value, or a 1-D one with ``n`` values (one per
    column or output channel), returned as a scalar or as that 1-D tensor."""
    shape = c.f.shape(v)
    if len(shape) == 1 and shape[0] == n and n != 1:
        return v
    if int(np.prod(shape, dtype=np.int64)) != 1:
        raise c.fail(f"{what} must hold one value or one per {along} ({n}), got shape {shape}")
    return _one_value(c, v, what)


def _factor(c: NodeContext, a_scale: Operand, b_scale: Operand, y_scale: Operand) -> Operand:
    """``a_scale * b_scale / y_scale`` in the scales' dtype, as the reference computes it."""
    f = c.f
    dtypes = {f.dtype(s) for s in (a_scale, b_scale, y_scale)}
    if len(dtypes) != 1 or not dtypes <= set(_SCALES):
        raise c.fail(f"the scales must share one dtype of {', '.join(_SCALES)}, got {', '.join(sorted(dtypes))}")
    return f.op("div", f.op("mul", a_scale, b_scale), y_scale)


def _requantized(c: NodeContext, acc: Operand, factor: Operand, zero: Operand | None, out_dtype: str) -> Operand:
    """``saturate(round(acc * factor + zero))`` cast to ``out_dtype``: the product and the sum
    in float64, rounded half to even (rounding and clipping to integer bounds commute)."""
    f = c.f
    y = f.op("mul", acc, f.op("cast", factor, dtype="float64"))
    if zero is not None:
        y = f.op("add", y, f.op("cast", zero, dtype="float64"))
    info = np.iinfo(out_dtype)
    y = f.op("minimum", f.op("maximum", f.op("round", y), f.const(info.min, "float64")), f.const(info.max, "float64"))
    return f.op("cast", y, dtype=out_dtype, name=c.out())


def _output_zero(c: NodeContext, index: int, x: Operand) -> tuple[Operand | None, str]:
    """The output zero point (one value) and the output dtype: the zero point's, else the
    quantized input's (the reference's rule when it is left out)."""
    f = c.f
    zero = c.optional(index)
    if zero is None:
        return None, f.dtype(x)
    if f.dtype(zero) not in ("int8", "uint8"):
        raise c.fail(f"y_zero_point must be int8 or uint8, got {f.dtype(zero)}")
    return _one_value(c, zero, "y_zero_point"), f.dtype(zero)


@converter("QLinearMatMul")
def _qlinear_matmul(c: NodeContext) -> list[Operand | None]:
    """``requantize((a - a_zero) @ (b - b_zero), a_scale * b_scale / y_scale, y_zero)``:
    ``a``'s and ``y``'s scale and zero point per tensor, ``b``'s per tensor or per column
    (1-D, one per column of ``b``: ONNX Runtime's per-channel weights)."""
    f, a, b = c.f, c.input(0, "a"), c.input(3, "b")
    if len(f.shape(a)) < 2 or len(f.shape(b)) < 2:
        raise c.fail(f"a and b must have rank >= 2, got shapes {f.shape(a)} and {f.shape(b)}")
    columns = f.shape(b)[-1]
    a_zero, b_zero = c.optional(2), c.optional(5)
    a64 = zero_shifted(c, a, None if a_zero is None else _one_value(c, a_zero, "a_zero_point"), "a", -1, "float64")
    if b_zero is not None:
        b_zero = _per_tensor_or_along(c, b_zero, columns, "b_zero_point", "column of b")
    b64 = zero_shifted(c, b, b_zero, "b", -1, "float64")
    factor = _factor(c, _one_value(c, c.input(1, "a_scale"), "a_scale"),
                     _per_tensor_or_along(c, c.input(4, "b_scale"), columns, "b_scale", "column of b"),
                     _one_value(c, c.input(6, "y_scale"), "y_scale"))
    zero, out_dtype = _output_zero(c, 7, a)
    return [_requantized(c, f.op("matmul", a64, b64), factor, zero, out_dtype)]


@converter("QLinearConv")
def _qlinear_conv(c: NodeContext) -> list[Operand | None]:
    """``requantize(conv(x - x_zero, w - w_zero) + B, x_scale * w_scale / y_scale, y_zero)``
    with Conv's attributes (1-D, 2-D or 3-D, pads, strides, dilations, group): ``w``'s
    scale and zero point per tensor or per output channel, the others per tensor; ``B``
    int32, added to the exact accumulator. The zero-shifted input is padded with zeros:
    the spec's padding by the zero point, once shifted."""
    f, x, w = c.f, c.input(0, "x"), c.input(3, "w")
    if len(f.shape(x)) not in (3, 4, 5) or len(f.shape(w)) != len(f.shape(x)):
        raise c.fail(f"x and w must be 3-D, 4-D or 5-D of one rank, got shapes {f.shape(x)} and {f.shape(w)}")
    channels = f.shape(w)[0]
    x_zero, w_zero = c.optional(2), c.optional(5)
    if x_zero is not None:
        x_zero = _one_value(c, x_zero, "x_zero_point")
    if w_zero is not None:
        w_zero = _per_tensor_or_along(c, w_zero, channels, "w_zero_point", "output channel")
    acc = integer_conv(c, x, x_zero, w, w_zero)
    bias = c.optional(8)
    if bias is not None:
        if f.dtype(bias) != "int32" or f.shape(bias) != (channels,):
            raise c.fail(f"B must be int32 of shape ({channels},), got {f.dtype(bias)}{list(f.shape(bias))}")
        spread = (channels,) + (1,) * (len(f.shape(x)) - 2)
        acc = f.op("add", acc, f.op("reshape", f.op("cast", bias, dtype="float64"), shape=spread))
    factor = _factor(c, _one_value(c, c.input(1, "x_scale"), "x_scale"),
                     _per_tensor_or_along(c, c.input(4, "w_scale"), channels, "w_scale", "output channel"),
                     _one_value(c, c.input(6, "y_scale"), "y_scale"))
    if f.shape(factor):  # per output channel: along axis 1 of the output
        factor = f.op("reshape", factor, shape=(channels,) + (1,) * (len(f.shape(x)) - 2))
    zero, out_dtype = _output_zero(c, 7, x)
    return [_requantized(c, acc, factor, zero, out_dtype)]
