"""Converters of ONNX's linear quantization, the QDQ form quantized models are exported in:
DequantizeLinear and QuantizeLinear, per tensor or per axis, as exact decompositions.

``DequantizeLinear``: ``y = (x - zero_point) * scale`` computed in the output dtype
(``output_dtype``, else the scale's), as the spec says from version 23 on and as every
earlier version computes in the scale's dtype. ``QuantizeLinear``: ``y =
saturate(round(x / scale) + zero_point)``, the division in the scale's dtype, ties to even
(the IR's ``round``), the sum and the saturation (clipping to the output dtype's range,
ONNX's rule for integers) in float32 or float64 where every such integer is exact.
The 4- and 2-bit integers quantize the same way; the float8 and float4 formats
(storage dtypes) are not rounded to integers: ``x / scale + zero_point`` is cast, clipped
first to the format's largest finite value for float8 unless ``saturate=0``. Blocked
quantization (``block_size``) and the ``precision`` attribute are refused by name.
"""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import FLOAT_DTYPES
from ._context import NodeContext, converter, onnx_dtype
from ._ops_indexing import _axis
from ._ops_tensor import FLOAT8_DTYPES, saturated
from ._shapes import Operand

__all__: list[str] = []

#: The integer dtypes QuantizeLinear may produce and DequantizeLinear read (and int32,
#: read only: a bias quantized by its scale).
_QUANTIZED = ("int8", "uint8", "int16", "uint16")
#: Storage formats quantized to and read: integers rounded and clipped like the above,
#: floats (float8, float4) cast.
_LOW_INTS = ("int4", "uint4", "int2", "uint2")
_LOW_FLOATS = (*sorted(FLOAT8_DTYPES), "float4_e2m1fn")


def _along_axis(c: NodeContext, v: Operand, x_shape: tuple[int, ...], what: str) -> Operand:
    """A scale or zero point shaped to broadcast against ``x``: as it is when it holds one
    value; a 1-D one along ``axis`` (per-axis quantization) reshaped to lie on that axis."""
    f = c.f
    shape = f.shape(v)
    if int(c.attr("block_size", 0) or 0):
        raise c.fail("blocked quantization (block_size) is not supported")
    if int(np.prod(shape, dtype=np.int64)) == 1:
        return f.op("reshape", v, shape=()) if shape else v
    if len(shape) != 1:
        raise c.fail(f"{what} must hold one value or one per element of the axis, got shape {shape}")
    axis = _axis(c, int(c.attr("axis", 1)), len(x_shape))
    if shape[0] != x_shape[axis]:
        raise c.fail(f"{what} has {shape[0]} values, the input's axis {axis} has {x_shape[axis]}")
    return f.op("reshape", v, shape=tuple(x_shape[axis] if k == axis else 1 for k in range(len(x_shape))))


@converter("DequantizeLinear")
def _dequantize_linear(c: NodeContext) -> list[Operand | None]:
    f, x, scale, zero = c.f, c.input(0), c.input(1), c.optional(2)
    x_dtype, s_dtype = f.dtype(x), f.dtype(scale)
    if x_dtype not in (*_QUANTIZED, "int32", *_LOW_INTS, *_LOW_FLOATS):
        raise c.fail(f"reads {', '.join((*_QUANTIZED, 'int32', *_LOW_INTS, *_LOW_FLOATS))} values, got {x_dtype}")
    out = onnx_dtype(int(c.attr("output_dtype")), "output_dtype") if int(c.attr("output_dtype", 0) or 0) else s_dtype
    if s_dtype not in FLOAT_DTYPES or out not in FLOAT_DTYPES:
        raise c.fail(f"the scale and the output must be floats, got {s_dtype} and {out}")
    if zero is not None and f.dtype(zero) != x_dtype:
        raise c.fail(f"the zero point's dtype {f.dtype(zero)} is not the input's {x_dtype}")
    shape = f.shape(x)
    y = f.op("cast", x, dtype=out)
    if zero is not None:
        y = f.op("sub", y, f.op("cast", _along_axis(c, zero, shape, "the zero point"), dtype=out))
    s = _along_axis(c, scale, shape, "the scale")
    return [f.op("mul", y, s if s_dtype == out else f.op("cast", s, dtype=out), name=c.out())]


@converter("QuantizeLinear")
def _quantize_linear(c: NodeContext) -> list[Operand | None]:
    f, x, scale, zero = c.f, c.input(0), c.input(1), c.optional(2)
    x_dtype, s_dtype = f.dtype(x), f.dtype(scale)
    if x_dtype not in FLOAT_DTYPES or s_dtype not in FLOAT_DTYPES:
        raise c.fail(f"quantizes float values by a float scale, got {x_dtype} and {s_dtype}")
    if int(c.attr("precision", 0) or 0):
        raise c.fail("the precision attribute is not supported (the division runs in the scale's dtype)")
    if zero is not None:
        out_dtype = f.dtype(zero)
    elif int(c.attr("output_dtype", 0) or 0):
        out_dtype = onnx_dtype(int(c.attr("output_dtype")), "output_dtype")
    else:
        out_dtype = "uint8"
    if out_dtype not in (*_QUANTIZED, *_LOW_INTS, *_LOW_FLOATS):
        raise c.fail(f"quantizes to {', '.join((*_QUANTIZED, *_LOW_INTS, *_LOW_FLOATS))}, not {out_dtype}")
    shape = f.shape(x)
    s = _along_axis(c, scale, shape, "the scale")
    q = f.op("div", x if x_dtype == s_dtype else f.op("cast", x, dtype=s_dtype), s)
    whole = out_dtype not in _LOW_FLOATS
    if whole:
        q = f.op("round", q)
    wide = "float64" if s_dtype == "float64" else "float32"  # every int16/uint16 value is exact there
    if s_dtype != wide:
        q = f.op("cast", q, dtype=wide)
    if zero is not None:
        q = f.op("add", q, f.op("cast", _along_axis(c, zero, shape, "the zero point"), dtype=wide))
    if whole:
        import ml_dtypes  # its iinfo knows the 4- and 2-bit integers too

        info = ml_dtypes.iinfo(out_dtype)
        q = f.op("minimum", f.op("maximum", q, f.const(info.min, wide)), f.const(info.max, wide))
    elif out_dtype in FLOAT8_DTYPES and int(c.attr("saturate", 1)):
        q = saturated(f, q, out_dtype)
    return [f.op("cast", q, dtype=out_dtype, name=c.out())]
