"""rlx's channels-inner kernels: the direct convolution ``rlx_conv_nhwc`` and the pool
``rlx_pool_nhwc`` (``native.c``), for NCHW convolutions over small output planes
(``conv_nhwc_steps``) and inside the channels-last chains ``layout.py`` plans without
oneDNN (``chain_conv_steps``, ``pool_steps``; ``layout.NativeChains`` says why).

Small planes. Why: rlx's implicit GEMM (``implicit_gemm.conv_gemm_steps``) puts 32 consecutive outputs in
a tile's vectors. A 7x7 plane is 49 outputs: a tile of 32 and one of 17 computed 32 wide
(64 columns for 49), on top of the shifted copy of the input it reads them from. The
channels-inner kernel puts 64 output channels in the vectors and 7 outputs of a row in
the tile, so a 7-wide row is one tile with nothing wasted; the image is transposed to
channels-last (one copy) and the outputs back, inside the call. Kernel against kernel on
the 2-core Zen 5, batch 4-8, with its transposes (``BENCHMARKS.md``, session 41):
ResNet's 3x3 512 -> 512 over 7x7 0.75x the implicit GEMM's time (ORT's MLAS: 1.00x the
kernel's), 256 -> 512 stride 2 into 7x7 0.84x, DenseNet's 128 -> 32 over 7x7 0.41x,
96 and 160 channels 0.79-0.82x. Over 8x8 and 9x9 planes (two whole 32-output tiles,
or 96 columns for 81) and for 1x1 convolutions (no copy to save) the implicit GEMM was
as fast or faster, so it is taken only where a row is one tile: outputs at most
``MAX_WIDTH`` wide and at most ``MAX_PIXELS`` of them; or two whole tiles, 14x14 planes
(``WIDE_WIDTH``, session 42: 0.89-0.92x the implicit GEMM's time; DenseNet-121 at batch 8
1.235x -> 1.213x ORT's time, GoogLeNet 1.19x -> 1.18x, in new processes in turn). And
over any plane where few output channels come from many inputs (``FEW_OUTPUTS``,
``FEW_RATIO``: DenseNet's 128 -> 32 growth convolutions, session 43; 0.52-0.75x the
implicit GEMM's time over 28x28 and 56x56 with a co-tenant filling L3, whole DenseNets
0.83-0.99x).
Built for AVX-512's 32 vector registers (28 sums in flight): not taken elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .ccall import bound_call
from .implicit_gemm import image_calls, whole_images
from .native import library
from .native_nn import (
    _conv_numpy,
    _depthwise_numpy,
    _fits,
    _packed,
    _then,
    _threads,
    lanes_filters,
    pool_kind,
)
from .regions import SPLIT_NS, Epilogue
from .steps import Dyn, aligned_empty

__all__ = ["FEW_OUTPUTS", "FEW_RATIO", "MAX_PIXELS", "MAX_WIDTH", "WIDE_PIXELS", "WIDE_WIDTH", "chain_conv_steps",
           "conv_nhwc_steps", "depthwise_steps", "pool_steps", "takes", "takes_depthwise"]

#: Output rows at most this wide (one tile of the kernel: RLX_CONV_NHWC_R).
MAX_WIDTH = 7
#: Output planes of at most this many outputs.
MAX_PIXELS = 49
#: Rows of exactly two tiles also take it, in planes of at most ``WIDE_PIXELS`` outputs:
#: 3x3 convolutions over 14x14 ran 0.89-0.92x the implicit GEMM's time (2-core Zen 5,
#: batch 1 and 8, 112-256 channels in, session 42), where 8- and 9-wide rows (a tile and
#: a sliver) had measured no better and 28x28 planes 0.91-0.99x.
WIDE_WIDTH, WIDE_PIXELS = 14, 196
#: Convolutions of at most ``FEW_OUTPUTS`` output channels from at least ``FEW_RATIO``
#: times as many input channels take it over any plane: DenseNet's growth convolutions
#: (3x3, 128 -> 32), where the implicit GEMM copies kw times an input far larger than its
#: output (5 MB an image over 56x56) for 32 rows of products.
FEW_OUTPUTS, FEW_RATIO = 32, 4
#: Depthwise convolutions join the chains (``depthwise_steps``): off. The kernel beats
#: rlx's NCHW depthwise ones (MnasNet's, per node at two threads on the 2-core Zen 5:
#: 0.55-0.75x their time, 48 x 112 x 112 at stride 2 0.208 -> 0.115 ms), but an inverted
#: residual held NHWC puts its pointwise convolutions on the channels-inner kernel, which
#: at two threads took about twice the NCHW GEMM's time for few channels over wide planes
#: (24 <-> 72 over 56x56, 32 -> 16 over 112x112): MnasNet, MobileNetV2/V3 and
#: EfficientNet-B0 0.90-1.42x their NCHW time in one process (BENCHMARKS.md, session 44).
DEPTHWISE = False
#: Input channels a tap must have for its loop to outweigh setting the tile's pointers.
MIN_CHANNELS = 16
#: NCHW in and out (bits 0 and 1 of the kernel's ``layout``).
_NCHW = 3


def conv_nhwc_steps(x: Any, w: np.ndarray, bias: Any, out: Any, pads: tuple[int, int], stride: tuple[int, int],
                    dilation: tuple[int, int], ctx: Any, epilogue: Epilogue | None = None) -> list[Any] | None:
    """An ungrouped float32 NCHW convolution with a small output plane as calls of the
    channels-inner kernel (one for the batch, or one an image: ``implicit_gemm.image_calls``),
    ``epilogue`` applied as its outputs are final;
    None where it does not apply (no AVX-512 library, a wider plane, few input
    channels, a 1x1 window, weights the graph computes, another layout or dtype)."""
    kh, kw = w.shape[2:]
    oh, ow = out.shape[2:]
    small = ow <= MAX_WIDTH and oh * ow <= MAX_PIXELS
    few = w.shape[0] <= FEW_OUTPUTS and w.shape[1] >= FEW_RATIO * w.shape[0]
    if not (small or few or (ow == WIDE_WIDTH and oh * ow <= WIDE_PIXELS)) or kh * kw == 1:
        return None
    return _steps(x, w, bias, out, pads, stride, dilation, ctx, epilogue, _NCHW)


def chain_conv_steps(x: Any, w: np.ndarray, bias: Any, out: Any, pads: tuple[int, int], stride: tuple[int, int],
                     dilation: tuple[int, int], ctx: Any, epilogue: Epilogue | None, x_nchw: bool, out_nchw: bool
                     ) -> list[Any] | None:
    """A convolution at or inside a channels-last chain (``layout.py``): ``x`` and ``out``
    each NHWC, or NCHW where the chain begins or ends there (transposed inside the call);
    ``epilogue`` over ``out`` in its layout. None where the kernel does not apply."""
    return _steps(x, w, bias, out, pads, stride, dilation, ctx, epilogue, int(x_nchw) | 2 * int(out_nchw))


def takes(c: int, groups: int) -> bool:
    """Whether a convolution of ``c`` input channels in ``groups`` groups is one the kernel
    runs well here (``layout.py`` plans chains around these)."""
    lib = library()
    return lib is not None and bool(lib.gemm_avx512) and groups == 1 and c >= MIN_CHANNELS


def takes_depthwise(c: int, groups: int, outputs: int) -> bool:
    """Whether a convolution of ``c`` input channels in ``groups`` groups into ``outputs``
    channels is a depthwise one ``depthwise_steps`` runs in a chain here (one filter a
    channel; any window, stride or dilation)."""
    lib = library()
    return DEPTHWISE and lib is not None and bool(lib.gemm_avx512) and groups == c == outputs


def depthwise_steps(x: Any, w: np.ndarray, bias: Any, out: Any, pads: tuple[int, int], stride: tuple[int, int],
                    dilation: tuple[int, int], ctx: Any, epilogue: Epilogue | None) -> list[Any] | None:
    """A depthwise convolution (``w`` (C, 1, kh, kw)) from NHWC ``x`` (N, H, W, C) into NHWC
    ``out`` inside a channels-last chain: ``rlx_depthwise_nhwc`` (the lanes kernel's
    pixels over bands of rows gathered channel block by block, no transpose: MobileNets'
    inverted residuals stay NHWC from expansion to projection), ``epilogue`` over each
    band of rows as it is done; filters and bias packed once (``ctx.derived``). None
    without the library, for weights the graph computes, or another dtype."""
    lib = library()
    if lib is None or not _fits(x, w, bias, out) or isinstance(w, Dyn) or isinstance(bias, Dyn) or out.size == 0:
        return None
    if getattr(ctx, "derived", None) is None or not isinstance(w, np.ndarray):
        return None
    n, h, wd, c = x.shape
    oh, ow = out.shape[1:3]
    kh, kw = w.shape[2:]
    (sh, sw), (dh, dw) = stride, dilation
    threads = _threads(lib, out.size * kh * kw, 0.3)
    scratch = ctx.scratch((threads * int(lib.depthwise_nhwc_scratch(c, kh, kw, sh, sw, dh, dw, oh, ow)),),
                          np.float32)
    wpk, steps = lanes_filters(lib, ctx, w, bias)
    planes = _depthwise_numpy((n * c, c, h, wd, kh, kw, sh, sw, dh, dw, *pads, oh, ow))

    def run_numpy(xv: np.ndarray, yv: np.ndarray) -> None:
        res = np.empty((n, c, oh, ow), np.float32)
        planes(np.ascontiguousarray(xv.transpose(0, 3, 1, 2)), w, bias, res)
        np.copyto(yv, res.transpose(0, 2, 3, 1))

    epi = 0 if epilogue is None else epilogue.address(threads)
    args = [0, wpk.ctypes.data, 0, scratch.ctypes.data, n, c, h, wd, kh, kw, sh, sw, dh, dw, *pads, oh, ow, threads,
            epi]
    keep = tuple(k for k in (w, bias, epilogue, scratch, wpk) if k is not None)
    return [*steps, bound_call(lib.depthwise_nhwc, args, (x, out), (0, 2), _then(run_numpy, epilogue), keep)]


def _steps(x: Any, w: np.ndarray, bias: Any, out: Any, pads: tuple[int, int], stride: tuple[int, int],
           dilation: tuple[int, int], ctx: Any, epilogue: Epilogue | None, layout: int) -> list[Any] | None:
    lib = library()
    if lib is None or not lib.gemm_avx512 or not _fits(x, w, bias, out) or isinstance(w, Dyn) or out.size == 0:
        return None
    if getattr(ctx, "derived", None) is None or not isinstance(w, np.ndarray):
        return None
    o, c, kh, kw = w.shape
    h, wd = x.shape[2:] if layout & 1 else x.shape[1:3]
    oh, ow = out.shape[2:] if layout & 2 else out.shape[1:3]
    if c < MIN_CHANNELS:
        return None
    size = int(lib.conv_nhwc_pack_size(o, c, kh, kw))

    def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            dest = aligned_empty(size, np.float32)
        lib.conv_nhwc_pack(src.ctypes.data, o, c, kh, kw, dest.ctypes.data)
        return dest

    wpk, steps = _packed(ctx, w, ("rlx_conv_nhwc_pack", o, c, kh, kw), size, make, lib.conv_nhwc_pack,
                         [0, o, c, kh, kw, 0])
    threads, whole = whole_images(lib, o * c * kh * kw * oh * ow, int(x.shape[0]))
    scratch = ctx.scratch((int(lib.conv_nhwc_scratch(c, h, wd, o, oh, ow, layout)) * (threads if whole else 1),),
                          np.float32)
    epi = 0 if epilogue is None else epilogue.address(threads)
    keep = (wpk,) if epilogue is None else (wpk, epilogue)
    (sh, sw), (dh, dw) = stride, dilation
    args = [0, wpk.ctypes.data, 0, 0, 0, c, h, wd, o, kh, kw, sh, sw, dh, dw, *pads, oh, ow, layout, 0, threads, epi]
    run = _in_layout(_conv_numpy(w, pads, stride, (oh, ow), dilation), layout, (o, oh, ow))
    return steps + image_calls(lib.conv_nhwc, args, (0, 2, 3, 4), x, bias, out, scratch, run, epilogue, keep, whole)


def _in_layout(run: Callable[..., None], layout: int, out_chw: tuple[int, int, int]) -> Callable[..., None]:
    """``native_nn._conv_numpy``'s NCHW image function taking its image and output in the
    kernel's ``layout`` (channels last where a bit is clear)."""
    if layout == _NCHW:
        return run

    def moved(x: np.ndarray, bias: np.ndarray | None, y: np.ndarray) -> None:
        res = y if layout & 2 else np.empty(out_chw, np.float32)
        run(x if layout & 1 else x.transpose(2, 0, 1), bias, res)
        if not layout & 2:
            np.copyto(y, res.transpose(1, 2, 0))

    return moved


_POOL_NS = 0.3  # single-thread ns a tap, for the threads decision


def pool_steps(x: Any, out: Any, is_max: bool, include_pad: bool, kernel: tuple[int, int],
               stride: tuple[int, int], dilation: tuple[int, int], pads: tuple[int, int, int, int]
               ) -> list[Any] | None:
    """A max or average pool from NHWC ``x`` (N, H, W, C) into NHWC ``out``
    (``rlx_pool_nhwc``: the channels in the vector lanes); None without the library, for
    dilated windows, or another dtype."""
    lib = library()
    if lib is None or not _fits(x, out) or out.size == 0 or tuple(dilation) != (1, 1):
        return None
    n, h, wd, c = x.shape
    oh, ow = out.shape[1:3]
    (kh, kw), (sh, sw) = kernel, stride
    kind = pool_kind(is_max, include_pad)
    geometry = (n, h, wd, c, kh, kw, sh, sw, *pads, oh, ow, kind)
    threads = lib.threads_for(out.size * kh * kw * _POOL_NS, SPLIT_NS)
    return [bound_call(lib.pool_nhwc, [0, 0, *geometry, threads], (x, out), (0, 1), _pool_numpy(geometry))]


def _pool_numpy(geometry: tuple[int, ...]) -> Callable[[np.ndarray, np.ndarray], None]:
    """``rlx_pool_nhwc`` in numpy, for arrays the kernel cannot take as they are."""
    n, h, wd, c, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind = geometry

    def run(x: np.ndarray, out: np.ndarray) -> None:
        hp, wp = max((oh - 1) * sh + kh, h + pt), max((ow - 1) * sw + kw, wd + pl)
        fill = -np.inf if kind == 0 else 0.0
        xp = np.full((n, hp, wp, c), fill, np.float32)
        xp[:, pt:pt + h, pl:pl + wd] = x
        inside = np.zeros((hp, wp), np.float32)
        if kind == 1:
            inside[: h + pt + pb, : wd + pl + pr] = 1.0
        else:
            inside[pt:pt + h, pl:pl + wd] = 1.0
        acc = np.full((n, oh, ow, c), fill, np.float32)
        count = np.zeros((oh, ow), np.float32)
        for ki in range(kh):
            for kj in range(kw):
                taps = xp[:, ki:ki + (oh - 1) * sh + 1:sh, kj:kj + (ow - 1) * sw + 1:sw]
                if kind == 0:
                    np.maximum(acc, taps, out=acc)
                else:
                    acc += taps
                count += inside[ki:ki + (oh - 1) * sh + 1:sh, kj:kj + (ow - 1) * sw + 1:sw]
        np.copyto(out, acc if kind == 0 else acc / count[None, :, :, None])

    return run
