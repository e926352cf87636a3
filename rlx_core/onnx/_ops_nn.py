"""Converters of network layers: MatMul, Gemm, Conv (1-D to 3-D), BatchNormalization,
LayerNormalization, RMSNormalization, InstanceNormalization, GroupNormalization; the
spatial helpers the pools (``_ops_pool``) and ConvTranspose share."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..ir.symbolic import dim_eq
from ._context import NodeContext, converter
from ._ops_quant import zero_shifted
from ._shapes import Operand, frozen
from ._symdims import NotSymbolic

__all__: list[str] = []


@converter("MatMul")
def _matmul(c: NodeContext) -> list[Operand | None]:
    return [c.f.op("matmul", c.input(0), c.input(1), name=c.out())]


@converter("Gemm")
def _gemm(c: NodeContext) -> list[Operand | None]:
    """``alpha * A' @ B' + beta * C`` with ``C`` optional and broadcast to (M, N)."""
    f, a, b, bias = c.f, c.input(0, "A"), c.input(1, "B"), c.optional(2)
    if len(f.shape(a)) != 2 or len(f.shape(b)) != 2:
        raise c.fail(f"A and B must be 2-D, got shapes {f.shape(a)} and {f.shape(b)}")
    alpha, beta = float(c.attr("alpha", 1.0)), float(c.attr("beta", 1.0))
    if c.attr("transA", 0):
        a = f.op("transpose", a, perm=(1, 0))
    if c.attr("transB", 0):
        b = f.op("transpose", b, perm=(1, 0))
    dtype = f.dtype(a)
    with_bias = bias is not None and beta != 0.0
    y = f.op("matmul", a, b, name="" if with_bias or alpha != 1.0 else c.out())
    if alpha != 1.0:
        y = f.op("mul", y, f.const(alpha, dtype), name="" if with_bias else c.out())
    if with_bias:
        assert bias is not None
        if beta != 1.0:
            bias = f.op("mul", bias, f.const(beta, dtype))
        y = f.op("add", y, bias, name=c.out())
    return [y]


# ---------------------------------------------------------------- convolution and pools
def _one_d(c: NodeContext) -> bool:
    """A 1-D convolution or pool (input (N, C, L)): run as 2-D over (N, C, 1, L)."""
    return len(c.f.shape(c.input(0))) == 3


def _spatial(c: NodeContext, x: Operand) -> tuple[int, int]:
    shape = c.f.shape(x)
    if len(shape) == 3:
        return 1, shape[2]
    if len(shape) != 4:
        raise c.fail(f"only 1-D, 2-D and 3-D {c.op_type} are supported (N, C, L) / (N, C, H, W) / (N, C, D, H, W); "
                     f"the input has shape {shape} ({len(shape) - 2}-D)")
    return shape[2], shape[3]


def _pair_attr(c: NodeContext, name: str, default: int) -> tuple[int, int]:
    """A per-axis attribute as (H, W); a 1-D op's single value is W, with H the default
    (stride and dilation 1, output padding 0)."""
    one_d = _one_d(c)
    value = c.attr_ints(name, (default,) if one_d else (default, default))
    assert value is not None
    if len(value) != (1 if one_d else 2):
        raise c.fail(f"{name} must have {1 if one_d else 2} entries for a {1 if one_d else 2}-D {c.op_type}, "
                     f"got {value}")
    return (default, value[0]) if one_d else (value[0], value[1])


def _as_2d(c: NodeContext, x: Operand) -> Operand:
    """``x`` (N, C, L) as (N, C, 1, L) for a 1-D op; a 2-D op's input as it is."""
    shape = c.f.shape(x)
    return c.f.op("reshape", x, shape=(shape[0], shape[1], 1, shape[2])) if len(shape) == 3 else x


def _back_to_1d(c: NodeContext, y: Operand, one_d: bool, name: str | None = None) -> Operand:
    """A 1-D op's (N, C, 1, L') result as (N, C, L'), under ``name`` (default: the node's
    output name)."""
    if not one_d:
        return y
    shape = c.f.shape(y)
    return c.f.op("reshape", y, shape=(shape[0], shape[1], shape[3]), name=c.out() if name is None else name)


def _pads(c: NodeContext, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
          dilations: Sequence[int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from ``pads`` (begins then ends, as rlx) or ``auto_pad``."""
    auto = c.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto == "NOTSET":
        if _one_d(c):  # (begin, end) of L: no padding along the H of 1 added for it
            pads = c.attr_ints("pads", (0, 0))
            assert pads is not None
            if len(pads) != 2:
                raise c.fail(f"pads must have 2 entries for a 1-D {c.op_type}, got {pads}")
            return 0, pads[0], 0, pads[1]
        pads = c.attr_ints("pads", (0, 0, 0, 0))
        assert pads is not None
        if len(pads) != 4:
            raise c.fail(f"pads must have 4 entries for a 2-D {c.op_type}, got {pads}")
        return pads[0], pads[1], pads[2], pads[3]
    if auto == "VALID":
        return 0, 0, 0, 0
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise c.fail(f"unknown auto_pad {auto!r}")
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins[0], begins[1], ends[0], ends[1]


@converter("Conv")
def _conv(c: NodeContext) -> list[Operand | None]:
    return [_conv_of(c, c.input(0, "X"), c.input(1, "W"), c.optional(2), c.out())]


@converter("ConvInteger")
def _conv_integer(c: NodeContext) -> list[Operand | None]:
    """``conv(x - x_zero, w - w_zero)`` in int32 (w's zero point one value or one per output
    channel), exact (``integer_conv``), then cast. The zero-shifted input is padded with
    zeros: the spec's padding by the zero point, once shifted."""
    f, x, w = c.f, c.input(0, "x"), c.input(1, "w")
    return [f.op("cast", integer_conv(c, x, c.optional(2), w, c.optional(3)), dtype="int32", name=c.out())]


#: Sums of products of 8-bit differences (each below 2**16 in magnitude) that float32
#: holds exactly, in any order: every partial sum stays below 2**24.
F32_EXACT_TERMS = (1 << 24) // (255 * 255)
#: The same with the input split into sixteens and units (``x = 16 h + l``, |h| <= 16,
#: 0 <= l <= 15: each product below 16 * 255), two float32 convolutions.
F32_SPLIT_TERMS = (1 << 24) // (16 * 255)


def integer_conv(c: NodeContext, x: Operand, x_zero: Operand | None, w: Operand, w_zero: Operand | None) -> Operand:
    """``conv(x - x_zero, w - w_zero)`` of int8/uint8 operands, exact, as float64 (w's zero
    point one value or one per output channel). Why not plainly in float64: rlx's fast
    convolutions (oneDNN, the implicit GEMM, the grouped and depthwise kernels) are
    float32; float64 ran ORT's ``quantize_dynamic`` models 3-10x ORT's time. A sum of
    ``terms`` products is exact in float32 up to ``F32_EXACT_TERMS`` of them, and up to
    ``F32_SPLIT_TERMS`` with the input split in two (``16 conv(h) + conv(l)``, each
    exact, added in float64); past that, float64."""
    f = c.f
    w_shape = f.shape(w)
    terms = w_shape[1] * int(np.prod(w_shape[2:], dtype=np.int64)) if len(w_shape) >= 3 else None
    if not isinstance(terms, int) or terms > F32_SPLIT_TERMS:
        xs, ws = zero_shifted(c, x, x_zero, "x", 1, "float64"), zero_shifted(c, w, w_zero, "w", 0, "float64")
        return _conv_of(c, xs, ws, None, "")
    xs, ws = zero_shifted(c, x, x_zero, "x", 1, "float32"), zero_shifted(c, w, w_zero, "w", 0, "float32")
    if terms <= F32_EXACT_TERMS:
        return f.op("cast", _conv_of(c, xs, ws, None, ""), dtype="float64")
    high = f.op("floor", f.op("mul", xs, f.const(1.0 / 16.0, "float32")))  # exact: a power of two
    low = f.op("sub", xs, f.op("mul", high, f.const(16.0, "float32")))
    sixteens = f.op("cast", _conv_of(c, high, ws, None, ""), dtype="float64")
    units = f.op("cast", _conv_of(c, low, ws, None, ""), dtype="float64")
    return f.op("add", f.op("mul", sixteens, f.const(16.0, "float64")), units)


def _conv_of(c: NodeContext, x: Operand, w: Operand, b: Operand | None, name: str) -> Operand:
    """``Conv``'s attributes applied to ``x``, ``w`` and ``b`` (1-D, 2-D or 3-D)."""
    f = c.f
    if len(f.shape(x)) == 5:
        return _conv3d(c, x, w, b, name)
    spatial = _spatial(c, x)
    one_d = _one_d(c)
    declared = c.attr_ints("kernel_shape")
    if declared is not None and tuple(declared) != tuple(f.shape(w)[2:]):
        raise c.fail(f"kernel_shape {declared} does not match the weight's shape {f.shape(w)}")
    if one_d:
        if len(f.shape(w)) != 3:
            raise c.fail(f"W must be (M, C / group, k) for a 1-D Conv, got shape {f.shape(w)}")
        w = _as_2d(c, w)
    kernel = f.shape(w)[2:]
    strides, dilations = _pair_attr(c, "strides", 1), _pair_attr(c, "dilations", 1)
    pads = _pads(c, spatial, kernel, strides, dilations)
    operands = (_as_2d(c, x), w) if b is None else (_as_2d(c, x), w, b)
    y = f.op("conv2d", *operands, stride=strides, padding=pads, dilation=dilations, groups=int(c.attr("group", 1)),
             name="" if one_d else name)
    return _back_to_1d(c, y, one_d, name)


def _pads_3d(c: NodeContext, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
             dilations: Sequence[int]) -> tuple[int, ...]:
    """(d0, h0, w0, d1, h1, w1) from ``pads`` or ``auto_pad``, for a 3-D Conv or pool."""
    auto = c.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto == "NOTSET":
        pads = c.attr_ints("pads", (0,) * 6)
        assert pads is not None
        if len(pads) != 6:
            raise c.fail(f"pads must have 6 entries for a 3-D {c.op_type}, got {pads}")
        return tuple(pads)
    if auto == "VALID":
        return (0,) * 6
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise c.fail(f"unknown auto_pad {auto!r}")
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return (*begins, *ends)


def _conv3d(c: NodeContext, x: Operand, w: Operand, b: Operand | None, name: str | None = None) -> Operand:
    """A 3-D convolution as one ``conv2d`` per kernel depth, summed: the depth axis moves
    into the batch, each depth tap ``k`` reads the (strided) depth slices it covers, and
    the 2-D convolutions of the taps add up (a 3x3x3 kernel is three ``conv2d``)."""
    d, h, wd = c.f.shape(x)[2:]
    ws = c.f.shape(w)
    if len(ws) != 5:
        raise c.fail(f"W must be (M, C / group, kd, kh, kw) for a 3-D Conv, got shape {ws}")
    kd, kh, kw = ws[2:]
    declared = c.attr_ints("kernel_shape")
    if declared is not None and tuple(declared) != (kd, kh, kw):
        raise c.fail(f"kernel_shape {declared} does not match the weight's shape {ws}")
    strides, dilations = c.attr_ints("strides", (1, 1, 1)), c.attr_ints("dilations", (1, 1, 1))
    assert strides is not None and dilations is not None
    if len(strides) != 3 or len(dilations) != 3:
        raise c.fail(f"strides and dilations must have 3 entries for a 3-D Conv, got {strides} and {dilations}")
    pads = _pads_3d(c, (d, h, wd), (kd, kh, kw), strides, dilations)
    return conv3d(c, x, w, b, tuple(strides), tuple(dilations), pads, int(c.attr("group", 1)),
                  c.out() if name is None else name)


def conv3d(c: NodeContext, x: Operand, w: Operand, b: Operand | None, strides: tuple[int, ...],
           dilations: tuple[int, ...], pads: tuple[int, ...], group: int, name: str) -> Operand:
    """``_conv3d``'s rewrite on given attributes (``pads`` as (d0, h0, w0, d1, h1, w1)),
    named ``name``: also the stride-1 convolution a 3-D ConvTranspose becomes."""
    f = c.f
    n, ci, d, h, wd = f.shape(x)
    o, cg, kd, kh, kw = f.shape(w)
    pd0, ph0, pw0, pd1, ph1, pw1 = pads
    dtype = f.dtype(x)
    if pd0 or pd1:  # zeros along depth (the 2-D convolutions pad height and width themselves)
        parts = [frozen(np.zeros((n, ci, p, h, wd), dtype)) for p in (pd0,) if p] + [x] + \
                [frozen(np.zeros((n, ci, p, h, wd), dtype)) for p in (pd1,) if p]
        x = f.op("concat", *parts, axis=2)
    depth = d + pd0 + pd1
    od = (depth - dilations[0] * (kd - 1) - 1) // strides[0] + 1
    if od < 1:
        raise c.fail(f"the kernel depth {kd} (dilation {dilations[0]}) does not fit the padded depth {depth}")
    total: Operand | None = None
    for k in range(kd):
        start = k * dilations[0]
        taps = f.op("slice", x, starts=[start], ends=[start + (od - 1) * strides[0] + 1], axes=[2],
                    steps=[strides[0]])
        planes = f.op("reshape", f.op("transpose", taps, perm=(0, 2, 1, 3, 4)), shape=(n * od, ci, h, wd))
        wk = f.op("reshape", f.op("slice", w, starts=[k], ends=[k + 1], axes=[2]), shape=(o, cg, kh, kw))
        operands = (planes, wk) if b is None or total is not None else (planes, wk, b)
        y = f.op("conv2d", *operands, stride=tuple(strides[1:]), padding=(ph0, pw0, ph1, pw1),
                 dilation=tuple(dilations[1:]), groups=group)
        total = y if total is None else f.op("add", total, y)
    assert total is not None
    oh, ow = f.shape(total)[2:]
    back = f.op("reshape", total, shape=(n, od, o, oh, ow))
    return f.op("transpose", back, perm=(0, 2, 1, 3, 4), name=name)


@converter("BatchNormalization")
def _batch_norm(c: NodeContext) -> list[Operand | None]:
    """Inference: ``x * s + t`` per channel, with ``s = scale / sqrt(var + eps)`` and
    ``t = bias - mean * s`` computed at import (in float64) when the statistics are known.
    ``training_mode`` 1 (opset 14+): see ``_batch_norm_training``."""
    f, x = c.f, c.input(0, "X")
    stats = [c.input(i, what) for i, what in enumerate(("scale", "B", "input_mean", "input_var"), start=1)]
    shape, dtype = f.shape(x), f.dtype(x)
    if len(shape) < 2:
        raise c.fail(f"needs an input (N, C, ...), got shape {shape}")
    channels = (shape[1],) + (1,) * (len(shape) - 2)
    if c.opset >= 14 and c.attr("training_mode", 0):
        return _batch_norm_training(c, x, stats, channels)
    if c.attr("training_mode", 0) or any(c.used(i) for i in range(1, c.num_outputs)):
        raise c.fail("the statistics outputs without training_mode=1 (BatchNormalization 9's training outputs, "
                     "or running statistics in inference mode) are not supported")
    eps = float(c.attr("epsilon", 1e-5))
    arrays = [f.array(s) for s in stats]
    if all(a is not None for a in arrays):
        scale, bias, mean, var = (np.asarray(a, dtype=np.float64) for a in arrays)  # type: ignore[arg-type]
        s = scale / np.sqrt(var + eps)
        t = bias - mean * s
        s_arr, t_arr = (frozen(v.astype(dtype).reshape(channels)) for v in (s, t))
        return [f.op("add", f.op("mul", x, s_arr), t_arr, name=c.out())]
    scale, bias, mean, var = stats
    s = f.op("mul", scale, f.op("rsqrt", f.op("add", var, f.const(eps, dtype))))
    t = f.op("sub", bias, f.op("mul", mean, s))
    s, t = (f.op("reshape", v, shape=channels) for v in (s, t))
    return [f.op("add", f.op("mul", x, s), t, name=c.out())]


def _batch_norm_training(c: NodeContext, x: Operand, stats: list[Operand], channels: tuple[int, ...]
                         ) -> list[Operand | None]:
    """``training_mode`` 1: Y normalized by the batch's own statistics, the mean and the
    population variance over every axis but the channels', ``scale * (x - mean) /
    sqrt(var + eps) + B``; ``running_mean = input_mean * momentum + mean * (1 - momentum)``
    and ``running_var`` alike, as ONNX's reference computes them. float16 is computed in
    float32 and cast back; X, scale, B and the statistics must share one float dtype."""
    f = c.f
    dtype = f.dtype(x)
    dtypes = [f.dtype(v) for v in (x, *stats)]
    if dtype not in ("float16", "float32", "float64") or any(d != dtype for d in dtypes):
        raise c.fail(f"training mode needs X, scale, B, input_mean and input_var of one float dtype, got {dtypes}")
    same = [len(f.shape(v)) == 1 and dim_eq(f.shape(v)[0], channels[0]) for v in stats]
    if None in same:
        raise NotSymbolic(f"whether the statistics {[f.shape(v) for v in stats]} hold one value per channel "
                          f"{channels[:1]} depends on the sizes")
    if not all(same):
        raise c.fail(f"scale, B, input_mean and input_var must each hold one value per channel {channels[:1]}, got "
                     f"{[f.shape(v) for v in stats]}")
    rank = len(f.shape(x))
    eps, momentum = float(c.attr("epsilon", 1e-5)), float(c.attr("momentum", 0.9))
    work = "float32" if dtype == "float16" else dtype
    xw, scale, bias, run_mean, run_var = (v if work == dtype else f.op("cast", v, dtype=work) for v in (x, *stats))
    axes = (0, *range(2, rank))
    mean = f.op("reduce_mean", xw, axes=axes, keepdims=True)
    d = f.op("sub", xw, mean)
    var = f.op("reduce_mean", f.op("mul", d, d), axes=axes, keepdims=True)
    factor = f.op("div", f.op("reshape", scale, shape=channels),
                  f.op("sqrt", f.op("add", var, f.const(eps, work))))
    y = f.op("add", f.op("mul", d, factor), f.op("reshape", bias, shape=channels))
    outs: list[Operand | None] = [y if work == dtype else f.op("cast", y, dtype=dtype)]
    for i, (running, batch) in enumerate(((run_mean, mean), (run_var, var)), start=1):
        if not c.used(i):
            outs.append(None)
            continue
        batch = f.op("reshape", batch, shape=channels[:1])
        updated = f.op("add", f.op("mul", running, f.const(momentum, work)),
                       f.op("mul", batch, f.const(1.0 - momentum, work)))
        outs.append(updated if work == dtype else f.op("cast", updated, dtype=dtype))
    return outs


@converter("LayerNormalization")
def _layer_norm(c: NodeContext) -> list[Operand | None]:
    f, x, scale, bias = c.f, c.input(0, "X"), c.input(1, "Scale"), c.optional(2)
    shape, dtype = f.shape(x), f.dtype(x)
    axis = int(c.attr("axis", -1))
    if not -len(shape) <= axis < len(shape):
        raise c.fail(f"axis {axis} is out of range for rank {len(shape)}")
    axis %= len(shape)
    eps = float(c.attr("epsilon", 1e-5))
    operands = (x, scale) if bias is None else (x, scale, bias)
    outs: list[Operand | None] = [f.op("layer_norm", *operands, axis=axis, eps=eps, name=c.out())]
    if c.used(1) or c.used(2):  # the saved statistics, rarely read at inference
        axes = tuple(range(axis, len(shape)))
        mean = f.op("reduce_mean", x, axes=axes, keepdims=True)
        d = f.op("sub", x, mean)
        var = f.op("reduce_mean", f.op("mul", d, d), axes=axes, keepdims=True)
        inv = f.op("rsqrt", f.op("add", var, f.const(eps, dtype)))
        stash = "float32" if int(c.attr("stash_type", 1)) == 1 else dtype
        outs += [v if stash == dtype else f.op("cast", v, dtype=stash) for v in (mean, inv)]
    return outs


@converter("RMSNormalization")
def _rms_norm(c: NodeContext) -> list[Operand | None]:
    """``x / sqrt(mean(x², axes axis..) + eps) * scale`` (opset 23), as the spec writes it,
    with ``rsqrt`` for the division. ``stash_type`` 1 (the default) computes a float16 or
    float64 input in float32 and casts the normalized value back, as the spec says."""
    f, x, scale = c.f, c.input(0, "X"), c.input(1, "scale")
    shape, dtype = f.shape(x), f.dtype(x)
    if dtype not in ("float16", "float32", "float64"):
        raise c.fail(f"needs a float input, got {dtype}")
    axis = int(c.attr("axis", -1))
    if not -len(shape) <= axis < len(shape):
        raise c.fail(f"axis {axis} is out of range for rank {len(shape)}")
    axes = tuple(range(axis % len(shape), len(shape)))
    stash = int(c.attr("stash_type", 1))
    if stash != 1:
        raise c.fail(f"stash_type {stash} is not supported (1: float32)")
    work = x if dtype == "float32" else f.op("cast", x, dtype="float32")
    mean = f.op("reduce_mean", f.op("mul", work, work), axes=axes, keepdims=True)
    inv = f.op("rsqrt", f.op("add", mean, f.const(float(c.attr("epsilon", 1e-5)), "float32")))
    normed = f.op("mul", work, inv)
    if dtype != "float32":
        normed = f.op("cast", normed, dtype=dtype)
    return [f.op("mul", normed, scale, name=c.out())]


def _standardized(c: NodeContext, x: Operand, rows: tuple[int, ...], stash: bool) -> Operand:
    """``x`` viewed as ``rows`` (its last axis the values normalized together), each row
    made mean 0 and variance 1 (``epsilon`` added), back in ``x``'s shape: the IR's
    ``layer_norm`` with unit scale. ``stash``: a float16 input is computed in float32."""
    f = c.f
    shape, dtype = f.shape(x), f.dtype(x)
    if dtype not in ("float16", "float32", "float64"):
        raise c.fail(f"needs a float input, got {dtype}")
    work_dtype = "float32" if stash and dtype == "float16" else dtype
    work = x if work_dtype == dtype else f.op("cast", x, dtype=work_dtype)
    ones, zeros = f.full((rows[-1],), 1, work_dtype), f.full((rows[-1],), 0, work_dtype)
    normed = f.op("layer_norm", f.op("reshape", work, shape=rows), ones, zeros,
                  axis=len(rows) - 1, eps=float(c.attr("epsilon", 1e-5)))
    normed = f.op("reshape", normed, shape=shape)
    return normed if work_dtype == dtype else f.op("cast", normed, dtype=dtype)


def _per_channel(c: NodeContext, y: Operand, scale: Operand, bias: Operand, channels: int, rank: int) -> Operand:
    """``y * scale + bias`` with ``scale`` and ``bias`` (C,) applied along axis 1."""
    f = c.f
    at = (channels,) + (1,) * (rank - 2)
    s, b = (f.op("reshape", v, shape=at) for v in (scale, bias))
    return f.op("add", f.op("mul", y, s), b, name=c.out())


@converter("InstanceNormalization")
def _instance_norm(c: NodeContext) -> list[Operand | None]:
    """Each (image, channel) plane normalized over its spatial axes, then ``scale`` and
    ``B`` per channel: ``layer_norm`` over the plane as one row."""
    f, x = c.f, c.input(0, "input")
    shape = f.shape(x)
    if len(shape) < 3:
        raise c.fail(f"needs an input (N, C, D1, ...), got shape {shape}")
    plane = math.prod(shape[2:])
    y = _standardized(c, x, (shape[0], shape[1], plane), stash=False)
    return [_per_channel(c, y, c.input(1, "scale"), c.input(2, "B"), shape[1], len(shape))]


@converter("GroupNormalization")
def _group_norm(c: NodeContext) -> list[Operand | None]:
    """The channels in ``num_groups`` groups, each group of each image normalized over its
    channels and spatial axes together. Version 21 applies ``scale`` and ``bias`` per
    channel (C,) and computes in float32 (``stash_type`` 1); version 18 per group
    (num_groups,), as its spec said (each group's value repeated over its channels)."""
    f, x, scale, bias = c.f, c.input(0, "X"), c.input(1, "scale"), c.input(2, "bias")
    shape = f.shape(x)
    if len(shape) < 3:
        raise c.fail(f"needs an input (N, C, D1, ...), got shape {shape}")
    n, channels = shape[0], shape[1]
    groups = int(c.attr("num_groups", 0))
    if groups < 1 or channels % groups:
        raise c.fail(f"num_groups {groups} does not divide the {channels} channels")
    stash = int(c.attr("stash_type", 1))
    if stash != 1:
        raise c.fail(f"stash_type {stash} is not supported (1: float32)")
    per = channels // groups
    y = _standardized(c, x, (n, groups, per * math.prod(shape[2:])), stash=c.opset >= 21)
    if c.opset < 21:  # version 18: one scale and bias per group, repeated over its channels
        spread = frozen(np.ones((1, per), dtype=f.dtype(scale)))
        scale, bias = (f.op("mul", f.op("reshape", v, shape=(groups, 1)), spread) for v in (scale, bias))
    return [_per_channel(c, y, scale, bias, channels, len(shape))]
