"""Softmax, layer normalization, convolution windows and pools of float32 data on the
native kernels (``native.c``).

numpy runs a softmax as five passes (max, subtract, exp, sum, divide) and a layer norm
as about ten, each a call of about a microsecond; for a classifier's 64 x 10 softmax the
calls are the whole cost, several times ONNX Runtime's (measured: BENCHMARKS.md, section
'Figures behind design choices (moved from docstrings, issue 32)'). The native kernels do
one row at a time in cache: softmax's max, then exp and sum in one pass, then the
scaling; layer norm's mean, variance, and the normalized, scaled and shifted row. Rows
are split over the cores when there are enough of them. A convolution's im2col copy is
one pass that writes the zero padding in place (numpy: a padded copy, then a strided
copy); a pool whose windows all lie inside the image is one pass per output row. Each
builder returns None when the native library is not here or the operands do not fit (the
caller keeps its numpy steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import conv_choice, gemm
from .ccall import bound_call
from .native import library
from .regions import SPLIT_NS, Epilogue
from .steps import Dyn, Step, aligned_empty, laid_out

__all__ = ["softmax_step", "softmax_bf16_step", "layer_norm_step", "im2col_step", "pool_step",
           "pool_kind", "pool_padded_step", "pool_to_nhwc_step", "window_counts", "conv_direct_steps",
           "depthwise_step", "lanes_filters", "DIRECT_CONV_TAPS"]

SOFTMAX_NS, LAYER_NORM_NS = 0.8, 0.4  # single-thread ns per element, for the threads decision


def _fits(*arrays: Any) -> bool:
    return all(x is None or (x.dtype == np.float32 and laid_out(x)) for x in arrays)


def _overlaps_elsewhere(x: Any, out: Any) -> bool:
    """True when plan arrays ``x`` and ``out`` share memory other than as the same array
    (a kernel writing ``out`` would overwrite ``x`` before reading it)."""
    return (not isinstance(x, Dyn) and not isinstance(out, Dyn) and np.may_share_memory(x, out)
            and x.ctypes.data != out.ctypes.data)


def _then(run: Callable[..., None], epilogue: Epilogue | None, start: int = 0, stop: int | None = None
          ) -> Callable[..., None]:
    """A kernel's numpy fallback ``run``, followed by the epilogue the kernel would have
    applied (over output elements [start, stop))."""
    if epilogue is None:
        return run

    def both(*args: Any) -> None:
        run(*args)
        epilogue.run(start, stop)

    return both


def _threads(lib: Any, elements: int, ns: float) -> int:
    return int(lib.threads_for(elements * ns, SPLIT_NS))


def _softmax_numpy(scale: float, nan_zero: bool) -> Any:
    def run(x: np.ndarray, out: np.ndarray) -> None:
        t = x * np.float32(scale) if scale != 1.0 else x
        e = np.exp(t - t.max(axis=-1, keepdims=True))
        np.divide(e, e.sum(axis=-1, keepdims=True), out=out)
        if nan_zero:
            np.copyto(out, np.float32(0), where=np.isnan(out))

    return run


def softmax_step(x: Any, out: Any, scale: float = 1.0, nan_zero: bool = False) -> Step | None:
    """``out = softmax(x * scale)`` along the last axis (``out`` may be ``x``); with
    ``nan_zero`` a row whose softmax is NaN (masked everywhere) is written as zeros."""
    lib = library()
    if lib is None or tuple(x.shape) != tuple(out.shape) or not _fits(x, out) or out.ndim == 0:
        return None
    length = out.shape[-1]
    rows = math.prod(out.shape[:-1])
    if length == 0 or rows == 0 or _overlaps_elsewhere(x, out):
        return None
    args = [0, 0, rows, length, length, float(scale), int(nan_zero), _threads(lib, rows * length, SOFTMAX_NS)]
    return bound_call(lib.softmax, args, (x, out), (0, 1), _softmax_numpy(scale, nan_zero))


#: ``rlx_softmax``'s flag for a result rounded to bf16 (native.c).
_SOFTMAX_BF16 = 2


def _softmax_bf16_numpy(scale: float, nan_zero: bool) -> Any:
    softmax = _softmax_numpy(scale, nan_zero)

    def run(x: np.ndarray, out16: np.ndarray) -> None:
        softmax(x, x)
        u = x.view(np.uint32)
        rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
        out16[...] = np.where(np.isnan(x), ((u >> 16) | np.uint32(0x40)).astype(np.uint16), rounded)

    return run


def softmax_bf16_step(x: np.ndarray, out16: np.ndarray, scale: float = 1.0, nan_zero: bool = False) -> Step | None:
    """``out16 = bf16(softmax(x * scale))`` along the last axis, ``x`` (contiguous float32
    scores the caller owns) holding the exps meanwhile: bf16 attention's weights rounded
    in the softmax's last pass instead of a pass of their own (``onednn_attention``)."""
    lib = library()
    if (lib is None or not isinstance(x, np.ndarray) or not isinstance(out16, np.ndarray) or x.dtype != np.float32
            or out16.dtype != np.uint16 or x.shape != out16.shape or x.ndim == 0 or not x.flags.c_contiguous
            or not out16.flags.c_contiguous or np.may_share_memory(x, out16)):
        return None
    length = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    if length == 0 or rows == 0:
        return None
    args = [0, 0, rows, length, length, float(scale), _SOFTMAX_BF16 | int(nan_zero),
            _threads(lib, rows * length, SOFTMAX_NS)]
    return bound_call(lib.softmax, args, (x, out16), (0, 1), _softmax_bf16_numpy(scale, nan_zero))


def _layer_norm_numpy(eps: float) -> Any:
    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, out: np.ndarray) -> None:
        n = scale.size
        x2 = x.reshape(-1, n)
        d = x2 - x2.mean(axis=1, keepdims=True)
        var = (d * d).mean(axis=1, keepdims=True)
        y = d / np.sqrt(var + np.float32(eps)) * scale.reshape(n)
        if bias is not None:
            y = y + bias.reshape(n)
        out.reshape(-1, n)[...] = y

    return run


def layer_norm_step(x: Any, scale: Any, bias: Any, out: Any, axis: int, eps: float) -> Step | None:
    """``out = layer_norm(x) * scale + bias`` over the axes from ``axis`` on, where
    ``scale`` and ``bias`` (or None) have exactly those axes' shape."""
    lib = library()
    inner = tuple(out.shape[axis:])
    if (lib is None or tuple(x.shape) != tuple(out.shape) or not _fits(x, scale, bias, out)
            or tuple(scale.shape) != inner or (bias is not None and tuple(bias.shape) != inner)):
        return None
    length, rows = math.prod(inner), math.prod(out.shape[:axis])
    if length == 0 or rows == 0 or _overlaps_elsewhere(x, out):
        return None
    args = [0, 0, None, 0, rows, length, length, float(eps), _threads(lib, rows * length, LAYER_NORM_NS)]
    if bias is None:
        return bound_call(lib.layer_norm, args, (x, scale, out), (0, 1, 3),
                          lambda x, s, o: _layer_norm_numpy(eps)(x, s, None, o))
    return bound_call(lib.layer_norm, args, (x, scale, bias, out), (0, 1, 2, 3), _layer_norm_numpy(eps))


def _windows_numpy(geometry: tuple[int, ...]) -> Any:
    count, _, cols_stride, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow = geometry

    def run(x: np.ndarray, cols: np.ndarray) -> None:
        imgs = x.reshape(count, c, h, w)
        padded = np.zeros((count, c, h + pt + (oh - 1) * sh + dh * (kh - 1) + 1, w + pl + (ow - 1) * sw
                           + dw * (kw - 1) + 1), np.float32)
        padded[:, :, pt : pt + h, pl : pl + w] = imgs
        rows = cols.reshape(-1)[: count * cols_stride].reshape(count, cols_stride)[:, : c * kh * kw * oh * ow]
        for ch in range(c):
            for ki in range(kh):
                for kj in range(kw):
                    r = (ch * kh + ki) * kw + kj
                    ys = slice(ki * dh, ki * dh + (oh - 1) * sh + 1, sh)
                    win = padded[:, ch, ys, kj * dw : kj * dw + (ow - 1) * sw + 1 : sw]
                    rows[:, r * oh * ow : (r + 1) * oh * ow] = win.reshape(count, oh * ow)

    return run


def im2col_step(x: Any, cols: np.ndarray, groups: int, kernel: tuple[int, int], stride: tuple[int, int],
                dilation: tuple[int, int], pads: tuple[int, int], out_hw: tuple[int, int]) -> Step | None:
    """Fill the first ``C/groups * kh * kw`` rows of each (image, group) block of ``cols``
    (shape ``(n, groups, rows, oh * ow)``, rows >= that) with the windows of ``x`` (N, C, H, W)."""
    lib = library()
    if lib is None or not _fits(x, cols) or isinstance(cols, Dyn):
        return None
    n, c, h, w = x.shape
    cg = c // groups
    (kh, kw), (sh, sw), (dh, dw), (pt, pl), (oh, ow) = kernel, stride, dilation, pads, out_hw
    count = n * groups
    geometry = (count, cg * h * w, cols.shape[2] * cols.shape[3], cg, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
    threads = _threads(lib, count * cg * kh * kw * oh * ow, 0.25)
    return bound_call(lib.im2col, [0, 0, *geometry, threads], (x, cols), (0, 1), _windows_numpy(geometry))


def _pool_numpy(geometry: tuple[int, ...]) -> Any:
    planes, h, w, kh, kw, sh, sw, dh, dw, oh, ow, is_max = geometry

    def run(x: np.ndarray, out: np.ndarray) -> None:
        xs = x.reshape(planes, h, w)
        taps = [xs[:, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
                for i in range(kh) for j in range(kw)]
        acc = taps[0].copy()
        for t in taps[1:]:
            if is_max:
                np.maximum(acc, t, out=acc)
            else:
                np.add(acc, t, out=acc)
        out.reshape(planes, oh, ow)[...] = acc if is_max else acc * np.float32(1.0 / (kh * kw))

    return run


def pool_step(x: Any, out: Any, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
              is_max: bool) -> Step | None:
    """Max or average pool of ``x`` (N, C, H, W) into ``out`` whose windows all lie inside
    the image (no padding, no ceil_mode window past the edge)."""
    lib = library()
    if lib is None or not _fits(x, out) or out.size == 0:
        return None
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    if (oh - 1) * sh + dh * (kh - 1) + 1 > h or (ow - 1) * sw + dw * (kw - 1) + 1 > w:
        return None
    geometry = (n * c, h, w, kh, kw, sh, sw, dh, dw, oh, ow, int(is_max))
    threads = _threads(lib, out.size * kh * kw, 0.3)
    return bound_call(lib.pool2d, [0, 0, *geometry, threads], (x, out), (0, 1), _pool_numpy(geometry))


def _padded_pool_numpy(geometry: tuple[int, ...]) -> Any:
    """``rlx_pool2d_padded`` in numpy: the pool over a copy padded with -inf (max) or 0
    (average), each average divided by its window's count."""
    planes, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind = geometry
    hp, wp = max(h + pt, (oh - 1) * sh + kh), max(w + pl, (ow - 1) * sw + kw)
    inner = _pool_numpy((planes, hp, wp, kh, kw, sh, sw, 1, 1, oh, ow, int(kind == 0)))
    if kind:
        inside = kind == 1
        counts = np.outer(window_counts(h, oh, kh, sh, pt, pb, inside), window_counts(w, ow, kw, sw, pl, pr, inside))
        factor = (kh * kw / counts).astype(np.float32)

    def run(x: np.ndarray, out: np.ndarray) -> None:
        xp = np.full((planes, hp, wp), 0.0 if kind else -np.inf, np.float32)
        xp[:, pt : pt + h, pl : pl + w] = x.reshape(planes, h, w)
        inner(xp, out)
        if kind:
            np.multiply(out.reshape(planes, oh, ow), factor, out=out.reshape(planes, oh, ow))

    return run


def pool_to_nhwc_step(x: Any, out: Any, kernel: tuple[int, int], stride: tuple[int, int],
                      pads: tuple[int, int, int, int], kind: int) -> Step | None:
    """``pool_padded_step``'s pool reading ``x`` (N, C, H, W) and writing ``out`` (N, OH,
    OW, C): a channels-last chain that starts at a pool of an NCHW value (ResNet's stem
    pool) without pooling into scratch and transposing that. None where the kernel does not
    apply (windows wider than 8, strides past 2)."""
    lib = library()
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = kernel, stride, pads
    if lib is None or not _fits(x, out) or out.size == 0 or kw > 8 or sw not in (1, 2):
        return None
    n, c, h, w = x.shape
    oh, ow = out.shape[1:3]
    threads = _threads(lib, out.size * kh * kw, 0.3)
    geometry = (n, c, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind)
    return bound_call(lib.pool_to_nhwc, [0, 0, *geometry, threads], (x, out), (0, 1), pool_to_nhwc_numpy(geometry))


def pool_to_nhwc_numpy(geometry: tuple[int, ...]) -> Any:
    """``rlx_pool_to_nhwc`` in numpy (``geometry``: its arguments from n to kind): the
    padded pool's numpy form, transposed."""
    n, c, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind = geometry
    inner = _padded_pool_numpy((n * c, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind))

    def run(x: np.ndarray, out: np.ndarray) -> None:
        res = np.empty((n, c, oh, ow), np.float32)
        inner(x, res)
        np.copyto(out, res.transpose(0, 2, 3, 1))

    return run


def window_counts(size: int, out: int, k: int, s: int, p0: int, p1: int, include_pad: bool) -> np.ndarray:
    """Per output position along one axis: window positions inside the input, or inside
    the declared padding too when ``include_pad``; ceil_mode's extra positions never count."""
    lo, hi = (-p0, size + p1) if include_pad else (0, size)
    starts = np.arange(out) * s - p0
    return np.array([sum(lo <= p < hi for p in range(st, st + k)) for st in starts], dtype=np.float64)


def pool_kind(is_max: bool, include_pad: bool) -> int:
    """The ``kind`` argument of the native pools (``rlx_pool2d_padded``, ``rlx_pool_to_nhwc``,
    ``rlx_pool_nhwc``): 0 max, 1 average counting the declared padding, 2 average over the
    image's positions only."""
    return 0 if is_max else 1 if include_pad else 2


def pool_padded_step(x: Any, out: Any, kernel: tuple[int, int], stride: tuple[int, int],
                     pads: tuple[int, int, int, int], kind: int) -> Step | None:
    """Max (``kind`` 0) or average (1: counting the padding, 2: counting the image's
    positions only) pool of ``x`` (N, C, H, W) into ``out`` whose windows may reach past
    the image (``pads``: top, left, bottom, right; ceil_mode's windows past those follow
    from ``out``'s shape), as if padded with -inf or 0, without the padded copy. None where
    the kernel does not apply (dilation is the caller's to rule out; windows wider than 8,
    strides past 2)."""
    lib = library()
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = kernel, stride, pads
    if lib is None or not _fits(x, out) or out.size == 0 or kw > 8 or sw not in (1, 2):
        return None
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    geometry = (n * c, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind)
    threads = _threads(lib, out.size * kh * kw, 0.3)
    return bound_call(lib.pool2d_padded, [0, 0, *geometry, threads], (x, out), (0, 1), _padded_pool_numpy(geometry))


def _depthwise_numpy(geometry: tuple[int, ...]) -> Any:
    planes, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow = geometry

    def run(x: np.ndarray, wt: np.ndarray, bias: np.ndarray | None, y: np.ndarray) -> None:
        n = planes // c
        need_h, need_w = (oh - 1) * sh + dh * (kh - 1) + 1, (ow - 1) * sw + dw * (kw - 1) + 1
        xp = np.zeros((n, c, max(h + pt, need_h), max(w + pl, need_w)), np.float32)
        xp[:, :, pt : pt + h, pl : pl + w] = x.reshape(n, c, h, w)
        acc = np.zeros((n, c, oh, ow), np.float32) if bias is None else np.repeat(
            np.repeat(bias.reshape(1, c, 1, 1), oh, 2), ow, 3).repeat(n, 0)
        f = wt.reshape(c, kh, kw)
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, :, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
                acc += tap * f[:, i, j].reshape(1, c, 1, 1)
        y.reshape(n, c, oh, ow)[...] = acc

    return run


def _packed(ctx: Any, w: np.ndarray, key: tuple[Any, ...], size: int,
            make: Callable[[np.ndarray, np.ndarray | None], np.ndarray], pack: Callable[..., None], args: list[Any],
            also: tuple[np.ndarray, ...] = ()) -> tuple[np.ndarray, list[Step]]:
    """Weights ``w`` as ``make`` packs them, and the steps a plan must run first to have
    them: kept by the executable where it can (``ctx.derived``: packed once, again by
    set_param of ``w`` or of an array of ``also``), with no steps; else (a node folded
    once, weights the graph computes each run) a scratch array of ``size`` floats and one
    step packing it each run, ``pack(*args)`` with ``w``'s address at ``args[0]`` and the
    array's at ``args[-1]``."""
    derived = getattr(ctx, "derived", None)
    kept = None if derived is None else derived(w, key, make, also=also)
    if kept is not None:
        return kept, []
    dest = ctx.scratch((size,), np.float32)
    return dest, [bound_call(pack, args, (w, dest), (0, len(args) - 1), make, also)]


#: Output rows at least this wide keep the row kernel (``rlx_depthwise_conv``) for a 3x3
#: stride-1 window: it vectorizes along the row with the filter in registers. Narrower
#: rows, strides and other windows put channels in the vector lanes instead
#: (``rlx_depthwise_lanes``). See BENCHMARKS.md ("Depthwise convolution"). 5x5 windows
#: always take the lanes kernel since its pixel groups keep eight sums in flight
#: (2-core Zen 5, one core, kernel against kernel: lanes 0.67-0.73x the row kernel's time
#: over 56x56, 0.92x over 112x112; 3x3 over 56x56 and 112x112 stays 1.06-1.45x in favour
#: of rows).
DEPTHWISE_ROW_MIN_WIDTH = 32


#: The same for 3x3 windows at stride 2, whose rows the kernel splits into even and odd
#: columns (one core, lanes against rows: 16x112x112 and 96x112x112, 56 outputs a row,
#: 1.06x and 1.13x; 72x56x56, 28 a row, 0.83x; 240x28x28, 14 a row, 0.34x).
DEPTHWISE_ROW_MIN_WIDTH_S2 = 40


def _rows_vectorize(kh: int, kw: int, stride: tuple[int, int], dilation: tuple[int, int], ow: int) -> bool:
    """Whether the row kernel suits this window: no dilation, 3x3, and either unit stride
    and rows of at least ``DEPTHWISE_ROW_MIN_WIDTH`` outputs, or stride 2 and rows of at
    least ``DEPTHWISE_ROW_MIN_WIDTH_S2``."""
    if dilation != (1, 1) or (kh, kw) != (3, 3):
        return False
    if stride == (2, 2):
        return ow >= DEPTHWISE_ROW_MIN_WIDTH_S2
    return stride == (1, 1) and ow >= DEPTHWISE_ROW_MIN_WIDTH


def lanes_filters(lib: Any, ctx: Any, w: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, list[Step]]:
    """A depthwise convolution's filters ``w`` (C, 1, kh, kw) and ``bias`` packed for the
    lanes kernels (``rlx_depthwise_lanes_pack``), and the steps a plan runs first to have
    them (none where ``ctx.derived`` keeps them: ``_packed``)."""
    c, taps = w.shape[0], w.shape[2] * w.shape[3]
    size = int(lib.depthwise_lanes_pack_size(c, taps))
    bias_at = 0 if bias is None else bias.ctypes.data

    def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            dest = aligned_empty(size, np.float32)
        lib.depthwise_lanes_pack(src.ctypes.data, bias_at, c, taps, dest.ctypes.data)
        return dest

    return _packed(ctx, w, ("rlx_depthwise_lanes_pack", c, taps), size, make, lib.depthwise_lanes_pack,
                   [0, bias_at, c, taps, 0], () if bias is None else (bias,))


def depthwise_step(x: Any, w: np.ndarray, bias: np.ndarray | None, out: Any, stride: tuple[int, int],
                   dilation: tuple[int, int], pads: tuple[int, int], ctx: Any,
                   epilogue: Epilogue | None = None) -> list[Step] | None:
    """A depthwise convolution (``groups`` = channels, one filter each: ``w`` (C, 1, kh, kw))
    of ``x`` (N, C, H, W) into ``out`` (N, C, oh, ow) with zero padding ``pads`` (top, left;
    the bottom and right follow from the shapes) in one pass, instead of im2col and C
    one-row products, then ``epilogue`` over each plane (or block of planes) as it is
    done; ``ctx.scratch(shape, dtype)`` gives the padded planes' memory (one per thread),
    ``ctx.derived`` keeps the lanes kernel's packed filters (packed each run where it
    keeps nothing). float32, contiguous arrays only (else None)."""
    lib = library()
    if lib is None or not _fits(x, w, bias, out) or isinstance(w, Dyn) or isinstance(bias, Dyn) or out.size == 0:
        return None
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    oh, ow = out.shape[2:]
    geometry = (n * c, c, h, wd, kh, kw, *stride, *dilation, *pads, oh, ow)
    threads = _threads(lib, out.size * kh * kw, 0.3)
    (sh, sw), (dh, dw) = stride, dilation
    run_numpy = _then(_depthwise_numpy(geometry), epilogue)
    epi = 0 if epilogue is None else epilogue.address(threads)
    kept = (w, bias, epilogue)
    if not _rows_vectorize(kh, kw, stride, dilation, ow):
        per_thread = lib.depthwise_lanes_scratch(kh, kw, sh, sw, dh, dw, oh, ow)
        lanes = ctx.scratch((threads * per_thread,), np.float32)
        wpk, steps = lanes_filters(lib, ctx, w, bias)
        args = [0, wpk.ctypes.data, 0, lanes.ctypes.data, n, c, h, wd, kh, kw, sh, sw, dh, dw, *pads, oh, ow, threads,
                epi]
        steps.append(bound_call(lib.depthwise_lanes, args, (x, out), (0, 2), lambda xv, yv: run_numpy(xv, w, bias, yv),
                                tuple(k for k in (*kept, lanes, wpk) if k is not None)))
        return steps
    padded = ctx.scratch((threads * ((oh - 1) * sh + (kh - 1) * dh + 1) * ((ow - 1) * sw + (kw - 1) * dw + 1),),
                         np.float32)
    args = [0, w.ctypes.data, 0 if bias is None else bias.ctypes.data, 0, padded.ctypes.data, *geometry, threads, epi]
    return [bound_call(lib.depthwise, args, (x, out), (0, 3), lambda xv, yv: run_numpy(xv, w, bias, yv),
                       tuple(k for k in (*kept, padded) if k is not None))]


#: Convolutions with at most this many taps per output (c * kh * kw) run as a direct
#: convolution rather than im2col + sgemm. In the suite CNN's plan (2-core AVX-512 host)
#: the direct kernel took under three quarters of the time of im2col plus its 16x27x4096
#: sgemm for 3x3x3 taps into 16 channels over 64x64, and under half of theirs for 16x3x3
#: taps into 32 channels over 32x32 (measured: BENCHMARKS.md, section 'Figures behind
#: design choices (moved from docstrings, issue 32)').
#: With hundreds of input channels the direct kernel re-reads its input rows for every 8
#: output channels, where a blocked sgemm keeps them in cache: those stay with im2col.
DIRECT_CONV_TAPS = 160
#: Multiply-adds from which the direct convolution uses every core (on this 2-core host
#: the 1.8M of the case above ran no faster on two threads).
_DIRECT_CONV_THREADED_MACS = 1 << 22


def _conv_numpy(w: np.ndarray, pads: tuple[int, int], stride: tuple[int, int], out_hw: tuple[int, int],
                dilation: tuple[int, int] = (1, 1)) -> Any:
    def run(x: np.ndarray, bias: np.ndarray | None, y: np.ndarray) -> None:
        o, c, kh, kw = w.shape
        (pt, pl), (sh, sw), (oh, ow), (dh, dw) = pads, stride, out_hw, dilation
        hp, wp = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
        xp = np.zeros((c, hp, wp), np.float32)
        h, wd = x.shape[-2:]
        xp[:, pt : pt + h, pl : pl + wd] = x.reshape(c, h, wd)[:, : hp - pt, : wp - pl]
        acc = np.zeros((o, oh * ow), np.float32) if bias is None else np.repeat(bias.reshape(o, 1), oh * ow, 1)
        for ki in range(kh):
            for kj in range(kw):
                r, q = ki * dh, kj * dw
                taps = xp[:, r : r + (oh - 1) * sh + 1 : sh, q : q + (ow - 1) * sw + 1 : sw]
                acc += w[:, :, ki, kj] @ taps.reshape(c, oh * ow)
        y.reshape(o, oh * ow)[...] = acc

    return run


def conv_direct_steps(x: Any, w: np.ndarray, bias: Any, out: Any, pads: tuple[int, int], stride: tuple[int, int],
                      ctx: Any) -> list[Step] | None:
    """An undilated, ungrouped float32 convolution with few taps, at any stride, as one
    native call per image (``native.c``'s ``rlx_conv_direct``); None when it does not
    apply: no library, weights that are not a resident (they are packed once, and again
    by set_param), another layout or dtype, or more than ``DIRECT_CONV_TAPS`` taps."""
    lib = library()
    if lib is None or not _fits(x, w, bias, out) or isinstance(w, Dyn) or out.size == 0:
        return None
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = out.shape[2:]
    sh, sw = stride
    derived = getattr(ctx, "derived", None)
    if c * kh * kw > DIRECT_CONV_TAPS or kw > 16 or derived is None or not conv_choice.use_direct():
        return None
    blocks = -(-o // 8)

    def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            dest = aligned_empty(blocks * c * kh * kw * 8, np.float32)
        lib.conv_pack(src.ctypes.data, dest.ctypes.data, o, c, kh, kw)
        return dest

    wpk = derived(w, ("conv_direct_pack", o, c, kh, kw), make)
    if wpk is None:
        return None
    xp = ctx.scratch((lib.conv_direct_scratch(c, kh, kw, sh, sw, oh, ow),), np.float32)
    threads = lib.threads_for(o * c * kh * kw * oh * ow, _DIRECT_CONV_THREADED_MACS, gemm.THREAD_MACS)
    fallback = _conv_numpy(w, pads, stride, (oh, ow))
    steps = []
    for i in range(n):
        xi, yi = x[i], out[i]
        args = [0, wpk.ctypes.data, 0, 0, 0, c, h, wd, o, kh, kw, sh, sw, pads[0], pads[1], oh, ow, threads]
        if bias is None:
            steps.append(bound_call(lib.conv_direct, args, (xi, yi, xp), (0, 3, 4),
                                    lambda x_, y_, _xp, f=fallback: f(x_, None, y_), keep=(wpk,)))
        else:
            steps.append(bound_call(lib.conv_direct, args, (xi, bias, yi, xp), (0, 2, 3, 4),
                                    lambda x_, b_, y_, _xp, f=fallback: f(x_, b_, y_), keep=(wpk,)))
    return steps
