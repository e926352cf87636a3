"""Convolutions whose taps mostly read padding, one product per tap over the outputs it reaches.

Why: an atrous convolution whose dilation is a large part of the feature map (DeepLabV3's
pyramid: a 3x3 window at dilation 12 over a 14x14 map, 960 -> 256 channels) reads its
outer taps only on a border of the outputs: the row of taps above the centre meets the
image at output rows 12 and 13 only. The implicit GEMM and im2col sum every tap at every
output, nine times the center tap's work over a copy that is mostly zeros, where the
multiply-adds that meet the image are 18% of those: 2.1 ms against ONNX Runtime's 0.50
(2-core Zen 5, without the extras; oneDNN, with them, skips those taps too). Taps wholly
outside the image are removed before this by the core (``rlx_core.passes.optimize``,
a slice of the weights); this handles the ones that meet it in part.

Here each tap (ki, kj) is a product of its weights ``w[:, :, ki, kj]`` (o, c) with the
inputs under the outputs it reaches, a rectangle of rows r0..r1 and columns c0..c1,
added into that rectangle of the output (the bias, or zeros, first). The centre tap is
a plain 1x1 convolution over the whole map (its columns the input itself); a tap that
reaches part of the rows or columns copies its window first. Taken where the windows
meeting the image are at most ``DENSE_SHARE`` of the dense work.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from rlx_core.plugin import tap_reach

from .gemm import matmul_step
from .kernels import BuildContext
from .steps import Step

#: The share of the dense work (every tap at every output) the taps meeting the image
#: may have at most for this to be taken: the products over a border's few outputs run
#: well below the GEMM's speed, and each tap is a few steps of its own.
DENSE_SHARE = 0.5


def tap_rectangles(x_hw: tuple[int, int], out_hw: tuple[int, int], kernel: tuple[int, int],
                   stride: tuple[int, int], dilation: tuple[int, int], pads: tuple[int, int]
                   ) -> list[tuple[int, int, int, int, int, int]]:
    """``(ki, kj, r0, r1, c0, c1)`` for every tap that meets the image, with the output
    rectangle it reaches."""
    rows = [tap_reach(x_hw[0], out_hw[0], ki, stride[0], dilation[0], pads[0]) for ki in range(kernel[0])]
    cols = [tap_reach(x_hw[1], out_hw[1], kj, stride[1], dilation[1], pads[1]) for kj in range(kernel[1])]
    return [(ki, kj, r0, r1, c0, c1) for ki, (r0, r1) in enumerate(rows) for kj, (c0, c1) in enumerate(cols)
            if r1 > r0 and c1 > c0]


def sparse_tap_steps(x: Any, w: Any, bias: Any, out: Any, pads: tuple[int, int], stride: tuple[int, int],
                     dilation: tuple[int, int], ctx: BuildContext) -> list[Step] | None:
    """``out = conv(x, w) + bias`` as one product per tap over the outputs it reaches
    (module docstring), or None where the taps meeting the image are more than
    ``DENSE_SHARE`` of the dense work, or the operands are not float32 arrays fixed at
    compile time (a caller's input: the dense kernels take it)."""
    if not all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in (x, w, out)):
        return None
    if bias is not None and not (isinstance(bias, np.ndarray) and bias.dtype == np.float32):
        return None
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh, ow = out.shape[2:]
    if cg != c or not out.flags.c_contiguous:
        return None
    taps = tap_rectangles((h, wd), (oh, ow), (kh, kw), stride, dilation, pads)
    reached = sum((r1 - r0) * (c1 - c0) for _, _, r0, r1, c0, c1 in taps)
    if reached > DENSE_SHARE * kh * kw * oh * ow:
        return None
    (sh, sw), (dh, dw), (pt, pl) = stride, dilation, pads
    steps: list[Step] = []
    weights: dict[tuple[int, int], np.ndarray] = {}
    for i in range(n):
        y = out[i]
        if bias is None:
            steps.append(Step(y.fill, (0.0,)))
        else:
            steps.append(Step(np.copyto, (y, bias.reshape(o, 1, 1))))
        for ki, kj, r0, r1, c0, c1 in taps:
            rows, cols = r1 - r0, c1 - c0
            y0, x0 = r0 * sh + ki * dh - pt, c0 * sw + kj * dw - pl  # the first input the window reads
            window = x[i, :, y0 : y0 + (rows - 1) * sh + 1 : sh, x0 : x0 + (cols - 1) * sw + 1 : sw]
            if cols == wd and sh == sw == 1:  # whole rows: the input itself, a channel's rows one run
                columns = as_strided(window, (c, rows * cols), (window.strides[0], window.strides[2]))
            else:
                columns = ctx.scratch((c, rows * cols), np.float32)
                steps.append(Step(np.copyto, (columns.reshape(c, rows, cols), window)))
            product = ctx.scratch((o, rows * cols), np.float32)
            steps += _tap_weights(w, ki, kj, ctx, weights)
            steps.append(matmul_step(weights[(ki, kj)], columns, product, ctx))
            target = y[:, r0:r1, c0:c1]
            steps.append(Step(np.add, (target, product.reshape(o, rows, cols), target)))
    return steps


def _tap_weights(w: np.ndarray, ki: int, kj: int, ctx: BuildContext,
                 made: dict[tuple[int, int], np.ndarray]) -> list[Step]:
    """Put tap (ki, kj)'s weights, ``w[:, :, ki, kj]`` as a contiguous (o, c) matrix, in
    ``made`` (once per tap): kept by the executable and refilled by ``set_param``
    (``ctx.derived``), else copied each run by the step returned."""
    if (ki, kj) in made:
        return []
    tap = w[:, :, ki, kj]

    def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            dest = np.empty(src.shape[:2], np.float32)
        np.copyto(dest, src[:, :, ki, kj])
        return dest

    derived = getattr(ctx, "derived", None)
    kept = derived(w, ("sparse_tap", ki, kj), make) if derived is not None else None
    if kept is not None:
        made[(ki, kj)] = kept
        return []
    made[(ki, kj)] = ctx.scratch(tap.shape, np.float32)
    return [Step(np.copyto, (made[(ki, kj)], tap))]
