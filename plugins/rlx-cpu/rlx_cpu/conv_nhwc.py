"""Ungrouped convolutions over small output planes on the direct channels-inner kernel
(``native.c``'s ``rlx_conv_nhwc``).

Why: rlx's implicit GEMM (``native_nn.conv_gemm_steps``) puts 32 consecutive outputs in
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
``MAX_WIDTH`` wide and at most ``MAX_PIXELS`` of them. Built for AVX-512's 32 vector
registers (28 sums in flight): not taken elsewhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import gemm
from .ccall import bound_call
from .native import library
from .native_nn import _conv_numpy, _fits, _packed, _then
from .regions import Epilogue
from .steps import Dyn, aligned_empty

__all__ = ["MAX_PIXELS", "MAX_WIDTH", "conv_nhwc_steps"]

#: Output rows at most this wide (one tile of the kernel: RLX_CONV_NHWC_R).
MAX_WIDTH = 7
#: Output planes of at most this many outputs.
MAX_PIXELS = 49
#: Input channels a tap must have for its loop to outweigh setting the tile's pointers.
MIN_CHANNELS = 16
#: NCHW in and out (bits 0 and 1 of the kernel's ``layout``).
_NCHW = 3


def conv_nhwc_steps(x: Any, w: np.ndarray, bias: Any, out: Any, pads: tuple[int, int], stride: tuple[int, int],
                    dilation: tuple[int, int], ctx: Any, epilogue: Epilogue | None = None) -> list[Any] | None:
    """An ungrouped float32 NCHW convolution with a small output plane as one call per
    image of the channels-inner kernel, ``epilogue`` applied as its outputs are final;
    None where it does not apply (no AVX-512 library, a wider plane, few input
    channels, a 1x1 window, weights the graph computes, another layout or dtype)."""
    lib = library()
    if lib is None or not lib.gemm_avx512 or not _fits(x, w, bias, out) or isinstance(w, Dyn) or out.size == 0:
        return None
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = out.shape[2:]
    if ow > MAX_WIDTH or oh * ow > MAX_PIXELS or c < MIN_CHANNELS or kh * kw == 1:
        return None
    if getattr(ctx, "derived", None) is None or not isinstance(w, np.ndarray):
        return None
    size = int(lib.conv_nhwc_pack_size(o, c, kh, kw))

    def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            dest = aligned_empty(size, np.float32)
        lib.conv_nhwc_pack(src.ctypes.data, o, c, kh, kw, dest.ctypes.data)
        return dest

    wpk, steps = _packed(ctx, w, ("rlx_conv_nhwc_pack", o, c, kh, kw), size, make, lib.conv_nhwc_pack,
                         [0, o, c, kh, kw, 0])
    scratch = ctx.scratch((int(lib.conv_nhwc_scratch(c, h, wd, o, oh, ow, _NCHW)),), np.float32)
    threads = lib.threads_for(o * c * kh * kw * oh * ow, gemm.SPLIT_MACS, gemm.THREAD_MACS)
    epi = 0 if epilogue is None else epilogue.address(threads)
    keep = (wpk,) if epilogue is None else (wpk, epilogue)
    (sh, sw), (dh, dw), per_image = stride, dilation, o * oh * ow
    for i in range(n):
        fallback = _then(_conv_numpy(w, pads, stride, (oh, ow), dilation), epilogue, i * per_image, (i + 1) * per_image)
        args = [0, wpk.ctypes.data, 0, 0, 0, c, h, wd, o, kh, kw, sh, sw, dh, dw, *pads, oh, ow, _NCHW, threads, epi]
        if bias is None:
            steps.append(bound_call(lib.conv_nhwc, args, (x[i], out[i], scratch), (0, 3, 4),
                                    lambda x_, y_, _s, f=fallback: f(x_, None, y_), keep=keep))
        else:
            steps.append(bound_call(lib.conv_nhwc, args, (x[i], bias, out[i], scratch), (0, 2, 3, 4),
                                    lambda x_, b_, y_, _s, f=fallback: f(x_, b_, y_), keep=keep))
    return steps
