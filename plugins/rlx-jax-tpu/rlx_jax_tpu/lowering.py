"""How each rlx op becomes JAX: one short rule per op, traced into one ``jax.jit`` function.

Each rule receives the node (attributes already normalized by ``rlx_core.ir.ops``) and its
operands as traced arrays, and returns the node's value; ``rlx_core.reference`` is the
meaning every rule must reproduce. Choices that matter for that:

- matmul, conv2d and attention run at ``Precision.HIGHEST``, so TPUs and recent GPUs do
  not round float32 products to bfloat16/TF32;
- float16 composites (softmax, layer_norm, gelu, reductions, pools, attention, and the
  transcendental functions) compute in float32 and round once at the end, as the float64
  reference effectively does;
- integer ``div`` truncates toward zero (``lax.div``); ``gather`` takes negative indices;
  ``slice`` takes exactly the normalized ``range(start, end, step)`` of each axis; pools
  pad exactly as the reference does (ceil_mode's extra windows included), and an average
  pool's divisor is computed at compile time by the reference's own rule.

Rules that can meet bad run-time values (integer division by zero, an out-of-range gather
index) also report a ``RuntimeCheck``, evaluated inside the same XLA computation and
raised on the host as the reference raises it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from rlx_core.errors import InputError
from rlx_core.ir import Node
from rlx_core.ir.ops import NUMPY_NAMES, OpKind

__all__ = ["LOWERINGS", "RuntimeCheck", "runtime_checks", "runtime_error"]

HIGHEST = lax.Precision.HIGHEST
Rule = Callable[[Node, Sequence[jax.Array]], jax.Array]


def _wide(x: jax.Array) -> jax.Array:
    """float16 computes in float32 (rounded once, when the result is cast back)."""
    return x.astype(jnp.float32) if x.dtype == jnp.float16 else x


def _is_float(x: jax.Array) -> bool:
    return bool(jnp.issubdtype(x.dtype, jnp.floating))


# ----------------------------------------------------------------------------- elementwise
def _binary(fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Rule:
    return lambda node, xs: fn(xs[0], xs[1])


def _unary(fn: Callable[[jax.Array], jax.Array], wide: bool = False) -> Rule:
    if wide:
        return lambda node, xs: fn(_wide(xs[0]))
    return lambda node, xs: fn(xs[0])


def _div(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    a, b = xs
    if _is_float(a):
        return a / b
    a, b = jnp.broadcast_arrays(a, b)
    return lax.div(a, b)  # XLA integer division truncates toward zero, like C and the reference


def _fmod(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    """C's fmod (the sign of the dividend): ``lax.rem`` is exactly that, for floats and
    integers (an integer divisor of zero is caught by ``runtime_checks``)."""
    a, b = jnp.broadcast_arrays(*xs)
    return lax.rem(a, b)


def _bit_shift(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    """The IR's shifts (ONNX BitShift-28): a shift by less than 0 or at least the bit
    width leaves the sign fill (-1 for a right shift of a negative value, else 0); XLA's
    shifts are undefined there, so those lanes are chosen apart."""
    x, y = jnp.broadcast_arrays(*xs)
    bits = jnp.iinfo(x.dtype).bits
    valid = (y >= 0) & (y < bits)
    amount = jnp.where(valid, y, 0).astype(x.dtype)
    zero = jnp.zeros((), x.dtype)
    if node.op is OpKind.BIT_SHIFT_LEFT:
        return jnp.where(valid, lax.shift_left(x, amount), zero)
    signed = jnp.issubdtype(x.dtype, jnp.signedinteger)
    shifted = lax.shift_right_arithmetic(x, amount) if signed else lax.shift_right_logical(x, amount)
    fill = jnp.where(x < 0, jnp.asarray(-1, x.dtype), zero) if signed else zero
    return jnp.where(valid, shifted, fill)


def _pow(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    return jnp.power(_wide(xs[0]), _wide(xs[1]))


def _relu(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    x = xs[0]
    return jnp.maximum(x, jnp.zeros((), x.dtype))


def _gelu(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    return jax.nn.gelu(_wide(xs[0]), approximate=node.attrs["approximate"] == "tanh")


#: The 4- and 2-bit integers and their widths. rlx's reference casts to them as numpy
#: does, through ml_dtypes, and ml_dtypes' own rule for a float out of range has changed
#: between releases: 0.6 goes through int32 and keeps the low bits (8.0 -> int4 -8), 0.7
#: truncates and gives 0 out of range (8.0 -> 0; NaN and inf 0 in both). XLA's convert
#: saturates, and jax's conversion of int32 to these types moved with ml_dtypes too (six
#: ONNX node tests of Cast and CastLike came out wrong on jax with 0.7.0). So the value is
#: made here, in int32, by the installed ml_dtypes' rule (``_float_rule``), and the
#: conversion only ever sees values in range. Integers keep their low bits in both.
_NARROW_INTS = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2}


@functools.cache
def _float_rule() -> str:
    """``"zero"`` where the installed ml_dtypes casts a float out of range to 0, else
    ``"wrap"`` (its low bits, through int32)."""
    import ml_dtypes

    with np.errstate(all="ignore"):
        return "zero" if int(np.array([8.0], np.float32).astype(ml_dtypes.int4)[0]) == 0 else "wrap"


def _cast(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    x, target = xs[0], node.attrs["dtype"]
    bits = _NARROW_INTS.get(target)
    if bits is None or x.dtype == jnp.bool_ or str(x.dtype) in _NARROW_INTS:
        return x.astype(target)
    signed = not target.startswith("u")
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    if _is_float(x):
        t = jnp.trunc(x.astype(jnp.float32))
        if _float_rule() == "zero":
            return jnp.where(jnp.isfinite(t) & (t >= lo) & (t <= hi), t, 0.0).astype(jnp.int32).astype(target)
        # x86's float -> int32 gives INT_MIN (low bits 0) out of range and for NaN
        x = jnp.where(jnp.isfinite(t) & (jnp.abs(t) < 2.0**31), t, 0.0)
    x = x.astype(jnp.int32) & (2**bits - 1)  # the low bits, as numpy keeps them
    if signed:
        x = jnp.where(x > hi, x - 2**bits, x)  # two's complement
    return x.astype(target)


def _where(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    return jnp.where(xs[0], xs[1], xs[2])


# ----------------------------------------------------------------------------- linear algebra
def _matmul(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    a, b = xs
    if a.dtype == jnp.float16:
        return jnp.matmul(a, b, precision=HIGHEST, preferred_element_type=jnp.float32)
    return jnp.matmul(a, b, precision=HIGHEST)


def _softmax(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    return jax.nn.softmax(_wide(xs[0]), axis=node.attrs["axis"])


def _layer_norm(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    x = _wide(xs[0])
    axes = tuple(range(node.attrs["axis"], x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = jnp.mean(centered * centered, axis=axes, keepdims=True)  # biased, as the reference
    y = centered * lax.rsqrt(var + node.attrs["eps"]) * _wide(xs[1])
    return y + _wide(xs[2]) if len(xs) == 3 else y


def _attention(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    """q @ kᵀ contracts both operands' last axis in one ``dot_general``: with an explicit
    ``swapaxes(k)`` XLA's cpu pipeline materialized a transposed copy of k before the dot
    (~40 µs of 1.9 ms in the suite's encoder layer), which a hand-written einsum never has."""
    q, k, v = (_wide(t) for t in xs[:3])
    s = jnp.einsum("...qd,...kd->...qk", q, k, precision=HIGHEST) * node.attrs["scale"]
    if len(xs) == 4:
        mask = xs[3]
        s = jnp.where(mask, s, -jnp.inf) if mask.dtype == jnp.bool_ else s + _wide(mask)
    p = jax.nn.softmax(s, axis=-1)
    if node.attrs.get("nan_to_zero"):  # rows masked everywhere give zeros (rlx_core.ir.ops.OP_EXTENSIONS)
        p = jnp.where(jnp.isnan(p), 0, p)
    return jnp.matmul(p, v, precision=HIGHEST)


# ----------------------------------------------------------------------------- reductions
def _reduce_sum(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    x, a = xs[0], node.attrs
    if x.dtype == jnp.float16:
        return jnp.sum(_wide(x), axis=a["axes"], keepdims=a["keepdims"])
    return jnp.sum(x, axis=a["axes"], keepdims=a["keepdims"], dtype=x.dtype)  # int32 sums stay int32


def _reduce_mean(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    return jnp.mean(_wide(xs[0]), axis=node.attrs["axes"], keepdims=node.attrs["keepdims"])


def _reduce_max(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    return jnp.max(xs[0], axis=node.attrs["axes"], keepdims=node.attrs["keepdims"])


# ----------------------------------------------------------------------------- shapes
def _slice(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    """Normalized bounds are Python slice bounds (``rlx_core.ir.ops``); each axis takes
    exactly the indices they list, reversed first for a negative step."""
    x, a = xs[0], node.attrs
    for axis, start, end, step in zip(a["axes"], a["starts"], a["ends"], a["steps"]):
        picked = range(*slice(start, end, step).indices(x.shape[axis]))
        if not picked:
            x = lax.slice_in_dim(x, 0, 0, axis=axis)
            continue
        first = picked[0]
        if step < 0:
            x = lax.rev(x, (axis,))
            first, step = x.shape[axis] - 1 - first, -step
        x = lax.slice_in_dim(x, first, first + (len(picked) - 1) * step + 1, step, axis)
    return x


def _gather(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    x, idx = xs
    axis = node.attrs["axis"]
    n = x.shape[axis]
    idx = jnp.where(idx < 0, idx + n, idx)
    # Out-of-range indices are reported by the gather's RuntimeCheck; clip keeps XLA in bounds.
    return jnp.take(x, idx, axis=axis, mode="clip")


# ----------------------------------------------------------------------------- convolution, pools
def _grouped_conv2d(node: Node, x: jax.Array, w: jax.Array) -> jax.Array:
    """A grouped convolution that never mixes groups: XLA's ``feature_group_count`` lets a
    NaN or inf in one group reach the others (it multiplies them by zero weights), so the
    taps are gathered by strided slices and each group contracts with its own weights."""
    a = node.attrs
    top, left, bottom, right = a["padding"]
    (sh, sw), (dh, dw), groups = a["stride"], a["dilation"], a["groups"]
    n, c = x.shape[:2]
    o, cg, kh, kw = w.shape
    oh, ow = node.shape[2:]
    xp = jnp.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    taps = [lax.slice(xp, (0, 0, i * dh, j * dw), (n, c, i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1),
                      (1, 1, sh, sw)) for i in range(kh) for j in range(kw)]
    cols = jnp.stack(taps, axis=2).reshape(n, groups, cg, kh * kw, oh, ow)
    wg = w.reshape(groups, o // groups, cg, kh * kw)
    out = jnp.einsum("ngckhw,gock->ngohw", cols, wg, precision=HIGHEST,
                     preferred_element_type=jnp.float32 if x.dtype == jnp.float16 else None)
    return out.reshape(n, o, oh, ow)


def _conv2d(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    x, w = xs[0], xs[1]
    a = node.attrs
    if a["groups"] > 1:
        out = _grouped_conv2d(node, x, w)
        if len(xs) == 3:
            out = out + _wide(xs[2]).reshape(1, -1, 1, 1)
        return out
    top, left, bottom, right = a["padding"]
    out = lax.conv_general_dilated(
        x, w, window_strides=a["stride"], padding=((top, bottom), (left, right)), rhs_dilation=a["dilation"],
        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=a["groups"], precision=HIGHEST,
        preferred_element_type=jnp.float32 if x.dtype == jnp.float16 else None,
    )
    if len(xs) == 3:
        out = out + _wide(xs[2]).reshape(1, -1, 1, 1)
    return out


def _window_padding(node: Node, x_hw: tuple[int, int], dilation: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """(top, bottom) and (left, right) pads: the declared ones, plus on the bottom/right
    what ceil_mode's extra windows need (``reference._pad_to_windows``)."""
    top, left, bottom, right = node.attrs["padding"]
    (kh, kw), (sh, sw) = node.attrs["kernel"], node.attrs["stride"]
    oh, ow = node.shape[2:]
    need_h = (oh - 1) * sh + dilation[0] * (kh - 1) + 1
    need_w = (ow - 1) * sw + dilation[1] * (kw - 1) + 1
    bottom += max(0, need_h - (x_hw[0] + top + bottom))
    right += max(0, need_w - (x_hw[1] + left + right))
    return (0, 0), (0, 0), (top, bottom), (left, right)


def _max_pool2d(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    x, a = xs[0], node.attrs
    dilation = a["dilation"]
    pads = _window_padding(node, x.shape[2:], dilation)
    out = lax.reduce_window(x, jnp.array(-jnp.inf, x.dtype), lax.max, (1, 1, *a["kernel"]), (1, 1, *a["stride"]),
                            pads, window_dilation=(1, 1, *dilation))
    return out[:, :, : node.shape[2], : node.shape[3]]


def avg_pool_divisor(node: Node, x_hw: tuple[int, int]) -> np.ndarray:
    """The (oh, ow) divisor of ``avg_pool2d``, by the reference's rule: positions inside the
    input (or, with count_include_pad, inside the declared padding too); positions that
    only ceil_mode added never count."""
    a = node.attrs
    (kh, kw), (sh, sw) = a["kernel"], a["stride"]
    top, left, bottom, right = a["padding"]
    _, _, (_, pb), (_, pr) = _window_padding(node, x_hw, (1, 1))
    h, w = x_hw
    inside = np.zeros((top + h + pb, left + w + pr))
    if a["count_include_pad"]:
        inside[: top + h + bottom, : left + w + right] = 1.0
    else:
        inside[top : top + h, left : left + w] = 1.0
    oh, ow = node.shape[2:]
    count = np.zeros((oh, ow))
    for i in range(kh):
        for j in range(kw):
            count += inside[i : i + (oh - 1) * sh + 1 : sh, j : j + (ow - 1) * sw + 1 : sw]
    return count


def _avg_pool2d(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    x, a = _wide(xs[0]), node.attrs
    pads = _window_padding(node, x.shape[2:], (1, 1))
    total = lax.reduce_window(x, jnp.array(0, x.dtype), lax.add, (1, 1, *a["kernel"]), (1, 1, *a["stride"]), pads)
    total = total[:, :, : node.shape[2], : node.shape[3]]
    return total / jnp.asarray(avg_pool_divisor(node, x.shape[2:]), x.dtype)


def _global_avg_pool2d(node: Node, xs: Sequence[jax.Array]) -> jax.Array:
    return jnp.mean(_wide(xs[0]), axis=(2, 3), keepdims=True)


LOWERINGS: dict[OpKind, Rule] = {
    OpKind.MATMUL: _matmul,
    OpKind.ADD: _binary(jnp.add),
    OpKind.SUB: _binary(jnp.subtract),
    OpKind.MUL: _binary(jnp.multiply),
    OpKind.DIV: _div,
    OpKind.FMOD: _fmod,
    OpKind.FLOOR: _unary(jnp.floor),
    OpKind.CEIL: _unary(jnp.ceil),
    OpKind.ROUND: _unary(jnp.round),  # half to even, as the IR's round
    OpKind.BITWISE_AND: _binary(jnp.bitwise_and),
    OpKind.BITWISE_OR: _binary(jnp.bitwise_or),
    OpKind.BITWISE_XOR: _binary(jnp.bitwise_xor),
    OpKind.BITWISE_NOT: _unary(jnp.invert),
    OpKind.BIT_SHIFT_LEFT: _bit_shift,
    OpKind.BIT_SHIFT_RIGHT: _bit_shift,
    OpKind.POW: _pow,
    OpKind.MAXIMUM: _binary(jnp.maximum),
    OpKind.MINIMUM: _binary(jnp.minimum),
    OpKind.NEG: _unary(jnp.negative),
    OpKind.ABS: _unary(jnp.abs),
    OpKind.EXP: _unary(jnp.exp, wide=True),
    OpKind.LOG: _unary(jnp.log, wide=True),
    OpKind.SQRT: _unary(jnp.sqrt, wide=True),
    OpKind.RSQRT: _unary(lax.rsqrt, wide=True),
    OpKind.ERF: _unary(lax.erf, wide=True),
    OpKind.TANH: _unary(jnp.tanh, wide=True),
    OpKind.SIN: _unary(jnp.sin, wide=True),
    OpKind.COS: _unary(jnp.cos, wide=True),
    **{op: _unary(getattr(jnp, name), wide=True) for op, name in NUMPY_NAMES.items()},
    OpKind.SIGMOID: _unary(jax.nn.sigmoid, wide=True),
    OpKind.RELU: _relu,
    OpKind.GELU: _gelu,
    OpKind.SOFTMAX: _softmax,
    OpKind.LAYER_NORM: _layer_norm,
    OpKind.REDUCE_SUM: _reduce_sum,
    OpKind.REDUCE_MEAN: _reduce_mean,
    OpKind.REDUCE_MAX: _reduce_max,
    OpKind.RESHAPE: lambda node, xs: jnp.reshape(xs[0], node.attrs["shape"]),
    OpKind.TRANSPOSE: lambda node, xs: jnp.transpose(xs[0], node.attrs["perm"]),
    OpKind.CONCAT: lambda node, xs: jnp.concatenate(list(xs), axis=node.attrs["axis"]),
    OpKind.SLICE: _slice,
    OpKind.GATHER: _gather,
    OpKind.CAST: _cast,
    OpKind.WHERE: _where,
    OpKind.EQUAL: _binary(jnp.equal),
    OpKind.LESS: _binary(jnp.less),
    OpKind.GREATER: _binary(jnp.greater),
    OpKind.CONV2D: _conv2d,
    OpKind.MAX_POOL2D: _max_pool2d,
    OpKind.AVG_POOL2D: _avg_pool2d,
    OpKind.GLOBAL_AVG_POOL2D: _global_avg_pool2d,
    OpKind.ATTENTION: _attention,
}


# ----------------------------------------------------------------------------- run-time checks
@dataclass(frozen=True)
class RuntimeCheck:
    """A condition on run-time values that the reference refuses with ``InputError``.

    ``flag`` (traced) is true when the values are bad; ``detail`` (traced) is what the
    message quotes (the first bad index of a gather).
    """

    node: Node
    flag: jax.Array
    detail: jax.Array

    def error(self, detail: Any, axis_size: int | None = None) -> InputError:
        return runtime_error(self.node, detail, axis_size)


def runtime_error(node: Node, detail: Any, axis_size: int | None = None) -> InputError:
    """The ``InputError`` the reference raises when ``node``'s run-time check fails;
    ``detail`` is the check's reported value (the first bad gather index)."""
    if node.op is OpKind.DIV:
        return InputError(f"{node.describe()} (div): integer division by zero")
    if node.op is OpKind.FMOD:
        return InputError(f"{node.describe()} (fmod): integer fmod by zero")
    axis = node.attrs["axis"]
    return InputError(f"{node.describe()} (gather): index {int(detail)} is out of range for axis {axis} "
                      f"of size {axis_size}")


def runtime_checks(node: Node, xs: Sequence[jax.Array], static: Sequence[np.ndarray | None]) -> list[RuntimeCheck]:
    """The checks ``node`` needs on these operands; ``static[i]`` is operand i's value when
    it is a constant (a constant that is fine needs no check)."""
    if node.op in (OpKind.DIV, OpKind.FMOD) and not _is_float(xs[1]):
        if static[1] is not None and np.all(static[1] != 0):
            return []
        bad = xs[1] == 0
        return [RuntimeCheck(node, jnp.any(bad), jnp.zeros((), jnp.int32))]
    if node.op is OpKind.GATHER:
        n = xs[0].shape[node.attrs["axis"]]
        if static[1] is not None and np.all((static[1] >= -n) & (static[1] < n)):
            return []
        idx = xs[1]
        bad = (idx < -n) | (idx >= n)
        flat = jnp.ravel(idx)
        first = flat[jnp.argmax(jnp.ravel(bad))] if flat.size else jnp.zeros((), idx.dtype)
        return [RuntimeCheck(node, jnp.any(bad), first)]
    return []
