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

The integer forms ONNX Runtime's dynamic quantization writes (``quantize_dynamic``):
``DynamicQuantizeLinear`` (uint8 values, scale and zero point from the input's range, as
the spec computes them), ``MatMulInteger`` and, in ``_ops_nn.py``, ``ConvInteger``
(products of zero-point-shifted operands computed exactly in float64, cast to int32).
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


@converter("DynamicQuantizeLinear")
def _dynamic_quantize_linear(c: NodeContext) -> list[Operand | None]:
    """``scale = (max(0, max x) - min(0, min x)) / 255``, ``zero = saturate(round(-min / scale))``,
    ``y = saturate(round(x / scale) + zero)``, all uint8, in float32 (the spec's arithmetic)."""
    f, x = c.f, c.input(0)
    if f.dtype(x) != "float32":
        raise c.fail(f"quantizes float32 values, got {f.dtype(x)}")
    axes = tuple(range(len(f.shape(x))))
    zero = f.const(0.0, "float32")
    least = f.flip(f.op("reduce_max", f.flip(x), axes=axes, keepdims=False)) if axes else x  # min: max of -x
    lo = f.op("minimum", least, zero)
    hi = f.op("maximum", f.op("reduce_max", x, axes=axes, keepdims=False) if axes else x, zero)
    scale = f.op("div", f.op("sub", hi, lo), f.const(255.0, "float32"), name=c.out(1))

    def saturate(v: Operand) -> Operand:
        return f.op("minimum", f.op("maximum", v, zero), f.const(255.0, "float32"))

    zp = saturate(f.op("round", f.op("sub", zero, f.op("div", lo, scale))))
    y = saturate(f.op("add", f.op("round", f.op("div", x, scale)), zp))
    return [f.op("cast", y, dtype="uint8", name=c.out(0)), scale, f.op("cast", zp, dtype="uint8", name=c.out(2))]


def zero_shifted(c: NodeContext, v: Operand, zero: Operand | None, what: str, axis_of_many: int,
                 dtype: str) -> Operand:
    """``v - zero`` in ``dtype`` (an int8/uint8 operand of an integer product, its zero
    point one value or one per element of ``v``'s axis ``axis_of_many``, or already shaped
    to broadcast), exact: every difference of 8-bit integers is."""
    f = c.f
    if f.dtype(v) not in ("int8", "uint8"):
        raise c.fail(f"{what} must be int8 or uint8, got {f.dtype(v)}")
    out = f.op("cast", v, dtype=dtype)
    if zero is None:
        return out
    if f.dtype(zero) != f.dtype(v):
        raise c.fail(f"{what}'s zero point is {f.dtype(zero)}, {what} is {f.dtype(v)}")
    shape, zshape = f.shape(v), f.shape(zero)
    if int(np.prod(zshape, dtype=np.int64)) == 1:
        zero = f.op("reshape", zero, shape=()) if zshape else zero
    elif len(zshape) == 1:
        axis = axis_of_many % len(shape)
        if zshape[0] != shape[axis]:
            raise c.fail(f"{what}'s zero point has {zshape[0]} values, its axis {axis} has {shape[axis]}")
        zero = f.op("reshape", zero, shape=tuple(shape[axis] if k == axis else 1 for k in range(len(shape))))
    elif len(zshape) != len(shape):
        raise c.fail(f"{what}'s zero point of shape {zshape} does not broadcast against {what} {shape}")
    return f.op("sub", out, f.op("cast", zero, dtype=dtype))


@converter("MatMulInteger")
def _matmul_integer(c: NodeContext) -> list[Operand | None]:
    """``(A - a_zero) @ (B - b_zero)`` as int32: A's zero point one value or one per row,
    B's one value or one per column (or shaped to broadcast, as the spec allows). Computed
    in float64, where every sum of products of 8-bit differences is exact (each below
    2**16, so any K below 2**37), then cast: a BLAS's dgemm, where an int32 product would
    be numpy's loop, tens of times slower at a transformer's sizes. Equal to int32
    accumulation unless that overflows (which the spec leaves to the implementation)."""
    f, a, b = c.f, c.input(0, "A"), c.input(1, "B")
    if len(f.shape(a)) < 2 or len(f.shape(b)) < 2:
        raise c.fail(f"A and B must have rank >= 2, got shapes {f.shape(a)} and {f.shape(b)}")
    a64 = zero_shifted(c, a, c.optional(2), "A", -2, "float64")
    b64 = zero_shifted(c, b, c.optional(3), "B", -1, "float64")
    return [f.op("cast", f.op("matmul", a64, b64), dtype="int32", name=c.out())]
