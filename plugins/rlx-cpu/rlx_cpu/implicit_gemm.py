"""rlx's implicit GEMM (``native.c``'s ``rlx_conv_gemm``): ungrouped float32 convolutions
as the product of packed weights with columns read from a shifted copy of the input, no
im2col (``docs/pipeline.md``, "Convolutions"); which of its two tile forms a shape takes
(``conv_gemm_panel``); and how a convolution kernel's calls cover a batch
(``image_calls``, ``whole_images``: one call for the batch, each thread computing whole
images, where the images are small; else one an image split across the threads), which
the channels-inner kernel (``conv_nhwc.py``) shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import conv_choice, gemm
from .ccall import bound_call
from .native import library
from .native_nn import _conv_numpy, _fits, _packed, _then
from .regions import Epilogue
from .steps import Dyn, Step, aligned_empty

__all__ = ["WHOLE_IMAGE_MACS", "conv_gemm_panel", "conv_gemm_steps", "image_calls", "whole_images"]

#: A transposed output costs the channels-in-vectors form about as much as this many
#: multiply-adds (a scalar move, 1-2 cycles of a core doing 32 a cycle): for few taps a
#: tile that form loses (16x3x3 into 64 over 55x55, 2-core Zen 5: half as long again as the
#: other form; measured: BENCHMARKS.md, section 'Figures behind design choices (moved from
#: docstrings, issue 32)').
_TRANSPOSE_MACS = 48
#: ...and it must do this much less work to be taken: its strips and tiles use the caches
#: less well (squeezenet's 512 -> 1000 1x1 over 13x13, 3% less work that way, ran a quarter
#: slower; resnet18's 512 x 3x3 over 7x7, 23% less, a quarter faster on one core; measured:
#: BENCHMARKS.md, section 'Figures behind design choices (moved from docstrings, issue 32)').
_CHANNELS_IN_VECTORS_MARGIN = 0.9


#: An implicit GEMM of at most this many multiply-adds an image, at batch > 1, is one call
#: in which each thread computes whole images (``rlx_conv_gemm``'s ``images``), not a call
#: per image split across the threads: below it, a call's fork-join, the split's padding
#: and the wait for the slower thread cost a tenth of an image's time or more (1x1
#: convolutions over 7x7 and 14x14; measured: BENCHMARKS.md, section "Whole images per
#: thread in the implicit GEMM (issue 35, session 47)").
WHOLE_IMAGE_MACS = 1 << 28


def conv_gemm_panel(o: int, n: int, k: int) -> int:
    """The row panel of ``rlx_conv_gemm`` for ``o`` output channels of ``k`` taps over
    ``n`` outputs, whichever does the least work, padding counted: 8 or 12 channels
    against 32 outputs in vectors, or 32 channels in vectors against 12 outputs (no output
    padded: for small planes, where 32-output tiles round 7 x 7 up from 49 to 64 and
    14 x 14 from 196 to 208, a last tile of at most 16 outputs being 16 wide), plus the
    transposition that form ends with. Off AVX-512 only 8 or 12: the channels-in-vectors
    tile keeps 24 sums of 16 floats, twice the registers AVX2 has; and 12 unless it pads a
    quarter more channels than 8: the 8-channel tile's sub-tiles keep 8 sums, too few to
    hide the multiply-add's latency (64 -> 64, 128 -> 128 and 256 -> 256 3x3s over 56x56,
    28x28, 14x14 ran 1.2-1.3x faster in 12-channel panels on the 2-core Zen 3)."""
    pad8, pad12 = -(-o // 8) * 8, -(-o // 12) * 12
    lib = library()
    if lib is None or not lib.gemm_avx512:
        return 8 if pad12 > 1.25 * pad8 else 12
    cols = n // 32 * 32 + (0 if n % 32 == 0 else 16 if n % 32 <= 16 else 32)  # a partial tile of <= 16: 16 wide
    outputs_in_vectors = min(pad8, pad12) * cols * k
    channels_in_vectors = -(-o // 32) * 32 * n * k + o * n * _TRANSPOSE_MACS
    if channels_in_vectors < _CHANNELS_IN_VECTORS_MARGIN * outputs_in_vectors:
        return 32
    return 8 if pad8 < pad12 else 12


def conv_gemm_steps(x: Any, w: np.ndarray, bias: Any, out: Any, pads: tuple[int, int], stride: tuple[int, int],
                    dilation: tuple[int, int], ctx: Any, epilogue: Epilogue | None = None
                    ) -> list[Step] | None:
    """An ungrouped float32 convolution as implicit-GEMM calls (``native.c``'s
    ``rlx_conv_gemm``: the product of the packed weights with columns read from a copy of
    the input shifted per tap column, no im2col), one for the batch where its images are
    small (``whole_images``: each thread computes whole images), else one an image
    split across the threads, then ``epilogue`` over each channel's outputs as a chunk
    of them is finished; None when it does not apply: rlx's GEMM does not take this
    process's products (``gemm.use_native``) or
    im2col measured faster here (``conv_choice``), the weights are a caller's array, a
    plain 1x1 convolution that rlx_gemm runs as well, or another layout or dtype. Weights
    computed by the graph are packed each run (a step before the product)."""
    lib = library()
    if lib is None or not _fits(x, w, bias, out) or isinstance(w, Dyn) or out.size == 0:
        return None
    if not (gemm.use_native() and conv_choice.use_implicit()):
        return None
    c, h, wd = x.shape[1:]
    o, _, kh, kw = w.shape
    oh, ow = out.shape[2:]
    (sh, sw), (dh, dw) = stride, dilation
    k = c * kh * kw
    toff = np.empty(k, np.int32)
    if lib.conv_gemm_offsets(toff.ctypes.data, c, kh, kw, sh, sw, dh, dw, oh, ow) != 0:
        return None
    if getattr(ctx, "derived", None) is None:
        return None
    mr = conv_gemm_panel(o, oh * ow, k)
    if (kh == kw == sh == sw == 1 and pads == (0, 0) and (oh, ow) == (h, wd)
            and ((mr != 32 and oh * ow < 32) or oh * ow == 1)):
        # A plain 1x1 convolution reads x itself, no copy (a partial 32-output tile is
        # moved back over the last 32 outputs): 0.73-0.98x rlx_gemm's time, which packs x
        # per call (efficientnet's and resnet's 1x1 layers over 112x112 and 56x56, 2-core
        # Zen 5). Planes of fewer outputs than a tile go to rlx_gemm's product (rlx_gemv's
        # on a 1x1 plane).
        return None
    size = max(int(lib.conv_gemm_pack_size(o, k, mr)), 1)

    def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            dest = aligned_empty(size, np.float32)
        lib.conv_gemm_pack(src.ctypes.data, o, k, mr, dest.ctypes.data)
        return dest

    # weights computed each run (a squeeze-excitation gate folded into them: rlx_core's
    # conv_scale pass) are packed again each run, a pass over o k floats
    apk, steps = _packed(ctx, w, ("rlx_conv_gemm_pack", o, k, mr), size, make, lib.conv_gemm_pack, [0, o, k, mr, 0])
    threads, whole = whole_images(lib, o * k * oh * ow, int(x.shape[0]))
    xs = ctx.scratch((lib.conv_gemm_scratch(c, kh, kw, sh, sw, dh, dw, oh, ow) * (threads if whole else 1),),
                     np.float32)
    epi = 0 if epilogue is None else epilogue.address(threads)
    keep = (apk, toff) if epilogue is None else (apk, toff, epilogue)
    args = [0, apk.ctypes.data, toff.ctypes.data, 0, 0, 0, c, h, wd, o, kh, kw, sh, sw, dh, dw, *pads, oh, ow, mr,
            0, threads, epi]
    return steps + image_calls(lib.conv_gemm, args, (0, 3, 4, 5), x, bias, out, xs,
                               _conv_numpy(w, pads, stride, (oh, ow), dilation), epilogue, keep, whole)


def whole_images(lib: Any, per_image: int, images: int) -> tuple[int, bool]:
    """The threads of a convolution kernel's calls over ``images`` images of ``per_image``
    multiply-adds, and whether one call covers the batch, each thread computing whole
    images (a kernel's ``images`` argument; the caller's scratch then one a thread): not
    for images of more than ``WHOLE_IMAGE_MACS``, nor fewer images than threads the
    batch's work is worth; else a call an image, on the threads that image is worth."""
    whole = lib.threads_for(images * per_image, gemm.SPLIT_MACS, gemm.THREAD_MACS)
    if 2 <= whole <= images and per_image <= WHOLE_IMAGE_MACS:
        return whole, True
    return lib.threads_for(per_image, gemm.SPLIT_MACS, gemm.THREAD_MACS), False


def image_calls(fn: Any, args: list[Any], at: tuple[int, int, int, int], x: Any, bias: Any, out: Any,
                scratch: np.ndarray, run: Callable[..., None], epilogue: Epilogue | None,
                keep: tuple[Any, ...], batch: bool = False) -> list[Step]:
    """Calls of a convolution kernel ``fn(*args)`` over the images of ``x`` into ``out``,
    with the images', the bias's (or NULL), the outputs' and ``scratch``'s addresses at
    positions ``at`` of ``args`` and the count of images in the slot before the threads':
    one for the batch when ``batch`` (``whole_images``), else one an image; ``run(x,
    bias, y)`` an image (then the epilogue over those outputs) where the kernel cannot
    take an array as it is."""
    args = list(args)
    images = int(x.shape[0])
    if batch:
        args[-3] = images

        def each_image(x_: np.ndarray, b_: np.ndarray | None, y_: np.ndarray) -> None:
            for i in range(images):
                run(x_[i], b_, y_[i])

        fallback = _then(each_image, epilogue)
        if bias is None:
            return [bound_call(fn, args, (x, out, scratch), (at[0], at[2], at[3]),
                               lambda x_, y_, _s: fallback(x_, None, y_), keep=keep)]
        return [bound_call(fn, args, (x, bias, out, scratch), at,
                           lambda x_, b_, y_, _s: fallback(x_, b_, y_), keep=keep)]
    args[-3] = 1
    steps: list[Step] = []
    per_image = int(np.prod(out.shape[1:]))
    for i in range(images):
        fallback = _then(run, epilogue, i * per_image, (i + 1) * per_image)
        if bias is None:
            steps.append(bound_call(fn, args, (x[i], out[i], scratch), (at[0], at[2], at[3]),
                                    lambda x_, y_, _s, f=fallback: f(x_, None, y_), keep=keep))
        else:
            steps.append(bound_call(fn, args, (x[i], bias, out[i], scratch), at,
                                    lambda x_, b_, y_, _s, f=fallback: f(x_, b_, y_), keep=keep))
    return steps
