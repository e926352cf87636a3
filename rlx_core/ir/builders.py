"""The builder methods of ``Graph``, one per op: the typed front door graphs are built through.

Each method names its operands and attributes as the op's documentation does and hands
them to ``Graph._add``, which resolves operands (values, node ids, arrays, scalars),
infers and checks the node's shape and dtype, and adds it. Kept apart from ``graph.py``
so that the graph's state and edit API read on their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .ops import OpKind

if TYPE_CHECKING:
    from .graph import Value, ValueLike

__all__ = ["OpBuilders"]


class OpBuilders:
    """Mixed into ``Graph``: every op's builder method."""

    def _add(self, op: OpKind, values: Sequence[ValueLike], name: str = "", **attrs: Any) -> Value:
        raise NotImplementedError  # Graph's: resolve, infer, check, add

    def matmul(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.MATMUL, (a, b), name)

    def add(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.ADD, (a, b), name)

    def sub(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.SUB, (a, b), name)

    def mul(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.MUL, (a, b), name)

    def div(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        """Division; integers truncate toward zero (C and ONNX semantics)."""
        return self._add(OpKind.DIV, (a, b), name)

    def pow(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.POW, (a, b), name)

    def maximum(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.MAXIMUM, (a, b), name)

    def minimum(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.MINIMUM, (a, b), name)

    def neg(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.NEG, (x,), name)

    def abs(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.ABS, (x,), name)

    def exp(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.EXP, (x,), name)

    def log(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.LOG, (x,), name)

    def sqrt(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.SQRT, (x,), name)

    def rsqrt(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.RSQRT, (x,), name)

    def erf(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.ERF, (x,), name)

    def tanh(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.TANH, (x,), name)

    def sin(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.SIN, (x,), name)

    def cos(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.COS, (x,), name)

    def tan(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.TAN, (x,), name)

    def asin(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.ASIN, (x,), name)

    def acos(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.ACOS, (x,), name)

    def atan(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.ATAN, (x,), name)

    def sinh(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.SINH, (x,), name)

    def cosh(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.COSH, (x,), name)

    def asinh(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.ASINH, (x,), name)

    def acosh(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.ACOSH, (x,), name)

    def atanh(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.ATANH, (x,), name)

    def sigmoid(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.SIGMOID, (x,), name)

    def relu(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.RELU, (x,), name)

    def gelu(self, x: ValueLike, approximate: str = "none", *, name: str = "") -> Value:
        return self._add(OpKind.GELU, (x,), name, approximate=approximate)

    def softmax(self, x: ValueLike, axis: int = -1, *, name: str = "") -> Value:
        return self._add(OpKind.SOFTMAX, (x,), name, axis=axis)

    def layer_norm(self, x: ValueLike, scale: ValueLike, bias: ValueLike | None = None, axis: int = -1,
                   eps: float = 1e-5, *, name: str = "") -> Value:
        """Normalize over axes ``axis..end``; ``scale``/``bias`` broadcast to those axes."""
        ins = (x, scale) if bias is None else (x, scale, bias)
        return self._add(OpKind.LAYER_NORM, ins, name, axis=axis, eps=eps)

    def reduce_sum(self, x: ValueLike, axes: Iterable[int] | int | None = None, keepdims: bool = False,
                   *, name: str = "") -> Value:
        return self._add(OpKind.REDUCE_SUM, (x,), name, axes=axes, keepdims=keepdims)

    def reduce_mean(self, x: ValueLike, axes: Iterable[int] | int | None = None, keepdims: bool = False,
                    *, name: str = "") -> Value:
        return self._add(OpKind.REDUCE_MEAN, (x,), name, axes=axes, keepdims=keepdims)

    def reduce_max(self, x: ValueLike, axes: Iterable[int] | int | None = None, keepdims: bool = False,
                   *, name: str = "") -> Value:
        return self._add(OpKind.REDUCE_MAX, (x,), name, axes=axes, keepdims=keepdims)

    def reshape(self, x: ValueLike, shape: Iterable[int], *, name: str = "") -> Value:
        return self._add(OpKind.RESHAPE, (x,), name, shape=shape)

    def transpose(self, x: ValueLike, perm: Iterable[int] | None = None, *, name: str = "") -> Value:
        return self._add(OpKind.TRANSPOSE, (x,), name, perm=perm)

    def concat(self, values: Sequence[ValueLike], axis: int = 0, *, name: str = "") -> Value:
        return self._add(OpKind.CONCAT, tuple(values), name, axis=axis)

    def slice(self, x: ValueLike, starts: Iterable[int], ends: Iterable[int], axes: Iterable[int] | None = None,
              steps: Iterable[int] | None = None, *, name: str = "") -> Value:
        """ONNX ``Slice``: out-of-range bounds are clamped, negative ones count from the end."""
        return self._add(OpKind.SLICE, (x,), name, starts=starts, ends=ends, axes=axes, steps=steps)

    def gather(self, x: ValueLike, indices: ValueLike, axis: int = 0, *, name: str = "") -> Value:
        """``numpy.take(x, indices, axis)``; negative indices count from the end."""
        return self._add(OpKind.GATHER, (x, indices), name, axis=axis)

    def cast(self, x: ValueLike, dtype: Any, *, name: str = "") -> Value:
        return self._add(OpKind.CAST, (x,), name, dtype=dtype)

    def where(self, cond: ValueLike, x: ValueLike, y: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.WHERE, (cond, x, y), name)

    def equal(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        """``a == b`` elementwise, a bool result (NaN equals nothing, ``-0.0 == 0.0``)."""
        return self._add(OpKind.EQUAL, (a, b), name)

    def less(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        """``a < b`` elementwise, a bool result (false where either is NaN)."""
        return self._add(OpKind.LESS, (a, b), name)

    def greater(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        """``a > b`` elementwise, a bool result (false where either is NaN)."""
        return self._add(OpKind.GREATER, (a, b), name)

    def floor(self, x: ValueLike, *, name: str = "") -> Value:
        """The largest integer value not above ``x`` (floats; NaN, infinities and -0.0 stay)."""
        return self._add(OpKind.FLOOR, (x,), name)

    def ceil(self, x: ValueLike, *, name: str = "") -> Value:
        """The smallest integer value not below ``x`` (floats)."""
        return self._add(OpKind.CEIL, (x,), name)

    def round(self, x: ValueLike, *, name: str = "") -> Value:
        """The nearest integer value, halves to even (``round(2.5) == 2``), as ONNX Round (floats)."""
        return self._add(OpKind.ROUND, (x,), name)

    def fmod(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        """C's ``fmod``: the remainder with the sign of ``a`` (floats and ints; an int by zero
        is an ``InputError`` at run time, as in ``div``)."""
        return self._add(OpKind.FMOD, (a, b), name)

    def bitwise_and(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        """``a & b`` on integers."""
        return self._add(OpKind.BITWISE_AND, (a, b), name)

    def bitwise_or(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        """``a | b`` on integers."""
        return self._add(OpKind.BITWISE_OR, (a, b), name)

    def bitwise_xor(self, a: ValueLike, b: ValueLike, *, name: str = "") -> Value:
        """``a ^ b`` on integers."""
        return self._add(OpKind.BITWISE_XOR, (a, b), name)

    def bitwise_not(self, x: ValueLike, *, name: str = "") -> Value:
        """``~x`` on integers (two's complement: ``~x == -1 - x`` for signed ones)."""
        return self._add(OpKind.BITWISE_NOT, (x,), name)

    def bit_shift_left(self, x: ValueLike, shift: ValueLike, *, name: str = "") -> Value:
        """``x << shift`` on integers, wrapping; a shift < 0 or >= the bit width gives 0."""
        return self._add(OpKind.BIT_SHIFT_LEFT, (x, shift), name)

    def bit_shift_right(self, x: ValueLike, shift: ValueLike, *, name: str = "") -> Value:
        """``x >> shift`` on integers, arithmetic (sign-filling) for signed ones; a shift < 0
        or >= the bit width gives -1 for a negative ``x`` and 0 otherwise."""
        return self._add(OpKind.BIT_SHIFT_RIGHT, (x, shift), name)

    def conv2d(self, x: ValueLike, w: ValueLike, b: ValueLike | None = None, stride: Any = 1, padding: Any = 0,
               dilation: Any = 1, groups: int = 1, *, name: str = "") -> Value:
        """NCHW convolution (cross-correlation) with OIHW weights, as in ONNX and PyTorch."""
        ins = (x, w) if b is None else (x, w, b)
        return self._add(OpKind.CONV2D, ins, name, stride=stride, padding=padding, dilation=dilation, groups=groups)

    def max_pool2d(self, x: ValueLike, kernel: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                   ceil_mode: bool = False, *, name: str = "") -> Value:
        return self._add(OpKind.MAX_POOL2D, (x,), name, kernel=kernel, stride=stride, padding=padding,
                         dilation=dilation, ceil_mode=ceil_mode)

    def avg_pool2d(self, x: ValueLike, kernel: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                   count_include_pad: bool = False, *, name: str = "") -> Value:
        return self._add(OpKind.AVG_POOL2D, (x,), name, kernel=kernel, stride=stride, padding=padding,
                         ceil_mode=ceil_mode, count_include_pad=count_include_pad)

    def global_avg_pool2d(self, x: ValueLike, *, name: str = "") -> Value:
        return self._add(OpKind.GLOBAL_AVG_POOL2D, (x,), name)

    def attention(self, q: ValueLike, k: ValueLike, v: ValueLike, mask: ValueLike | None = None,
                  scale: float | None = None, *, nan_to_zero: bool = False, name: str = "") -> Value:
        """softmax(q @ kᵀ · scale + mask) @ v; a bool mask keeps True and masks False.
        ``nan_to_zero``: NaN probabilities count as 0, so a row masked everywhere gives
        zeros (an extension: ``rlx_core.ir.ops.OP_EXTENSIONS``)."""
        ins = (q, k, v) if mask is None else (q, k, v, mask)
        if nan_to_zero:
            return self._add(OpKind.ATTENTION, ins, name, scale=scale, nan_to_zero=True)
        return self._add(OpKind.ATTENTION, ins, name, scale=scale)
