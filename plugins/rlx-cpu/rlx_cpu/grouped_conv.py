"""Grouped convolutions with few channels a group (ResNeXt's 4 to 32, RegNet's 8 to 48) on
the native kernels (``native.c``): ``rlx_group_conv``, sums of 4 or 8 output channels x
16 outputs of a row in registers, or, for groups of 16, 32, ... output channels where the
AVX-512 clones run, ``rlx_group_conv_lanes``, 16 output channels of a pixel to a vector.
Either instead of im2col and one product per group with an M of 4 to 48 against a
GEMM's 12-row panels. The builder returns None where neither applies (the caller keeps
im2col)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .ccall import bound_call
from .native import library
from .native_nn import _fits, _packed, _then, _threads
from .regions import Epilogue
from .steps import Dyn, Step, aligned_empty

__all__ = ["group_conv_step", "GROUP_CONV_MIN_WIDTH", "GROUP_CONV_MAX_CG", "GROUP_CONV_LANES"]


#: Output rows at least this wide take the grouped kernel (``rlx_group_conv``): every
#: width, since a row narrower than its vector of 8 outputs (7x7 planes) is computed over a
#: padded copy that wide (RegNetX-800MF's 7x7 groups of 16: 22 GFLOP/s through im2col and
#: a product per group, 59-110 now; BENCHMARKS.md, "Grouped convolutions: every row width,
#: 16-float vectors").
GROUP_CONV_MIN_WIDTH = 1
#: Input channels a group at most for the grouped kernel: it reads each input vector once
#: per 4 or 8 output channels, where a product per group with more channels than this keeps a
#: GEMM's panels busy (ResNeXt's and RegNet's groups hold 4 to 48).
GROUP_CONV_MAX_CG = 64
#: Groups of a multiple of this many output channels run with the channels in the vector
#: lanes (``rlx_group_conv_lanes``) where the AVX-512 clones run: 16 channels a vector, a
#: pixel's input broadcast, so no row is padded to a vector and no stride-2 row split. On
#: the 2-core Zen 5 (BENCHMARKS.md, "Grouped convolutions with the channels in the lanes"),
#: kernel against the row kernel: 7x7 planes and 14x14 at stride 2 2-2.4x as fast, 28x28 at
#: stride 2 1.4x, 14x14 to 56x56 at stride 1 1.05-1.15x on a quiet host (0.90-0.95x while
#: another tenant filled the L3). Off AVX-512 its 12 sums of 16
#: floats would take 24 of AVX2's 16 registers.
GROUP_CONV_LANES = 16


def _group_conv_numpy(geometry: tuple[int, ...]) -> Any:
    n, groups, cg, og, h, w, kh, kw, sh, sw, pt, pl, oh, ow = geometry

    def run(x: np.ndarray, wt: np.ndarray, bias: np.ndarray | None, y: np.ndarray) -> None:
        need_h, need_w = (oh - 1) * sh + kh, (ow - 1) * sw + kw
        xp = np.zeros((n, groups, cg, max(h + pt, need_h), max(w + pl, need_w)), np.float32)
        xp[..., pt : pt + h, pl : pl + w] = x.reshape(n, groups, cg, h, w)
        acc = np.zeros((n, groups, og, oh, ow), np.float32)
        if bias is not None:
            acc += bias.reshape(1, groups, og, 1, 1)
        f = wt.reshape(groups, og, cg, kh, kw)
        for i in range(kh):
            for j in range(kw):
                tap = xp[..., i : i + (oh - 1) * sh + 1 : sh, j : j + (ow - 1) * sw + 1 : sw]
                acc += np.einsum("ngchw,goc->ngohw", tap, f[..., i, j])
        y.reshape(n, groups, og, oh, ow)[...] = acc

    return run


def group_conv_step(x: Any, w: np.ndarray, bias: np.ndarray | None, out: Any, stride: tuple[int, int],
                    dilation: tuple[int, int], pads: tuple[int, int], groups: int, ctx: Any,
                    epilogue: Epilogue | None = None) -> list[Step] | None:
    """A grouped convolution with few channels a group (``w`` (groups * og, cg, kh, kw),
    groups > 1, not one filter per channel) of ``x`` (N, C, H, W) into ``out`` with zero
    padding ``pads`` (top, left) as one ``rlx_group_conv`` call: per group, a padded copy
    of its input planes and sums for 4 or 8 output channels x 16 outputs of a row in
    registers, then ``epilogue`` over the group's outputs; groups of 16, 32, ... channels
    on AVX-512 as one ``rlx_group_conv_lanes`` call (``GROUP_CONV_LANES``), its weights
    packed once (``ctx.derived``), at any column stride. None where it does not apply:
    dilation, a column stride other than 1 or 2 (but in the lanes), rows narrower than
    ``GROUP_CONV_MIN_WIDTH``, more than ``GROUP_CONV_MAX_CG`` channels a group, not
    float32 contiguous arrays."""
    lib = library()
    if lib is None or not _fits(x, w, bias, out) or isinstance(w, Dyn) or isinstance(bias, Dyn) or out.size == 0:
        return None
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh, ow = out.shape[2:]
    (sh, sw), og = stride, o // groups
    lanes = og % GROUP_CONV_LANES == 0 and lib.gemm_avx512
    if dilation != (1, 1) or (sw not in (1, 2) and not lanes) or ow < GROUP_CONV_MIN_WIDTH or cg > GROUP_CONV_MAX_CG:
        return None
    geometry = (n, groups, cg, og, h, wd, kh, kw, sh, sw, *pads, oh, ow)
    threads = _threads(lib, out.size * cg * kh * kw, 0.15)
    run_numpy = _then(_group_conv_numpy(geometry), epilogue)
    if lanes:  # the output channels in the lanes (rlx_group_conv_lanes): every plane size and column stride

        def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
            if dest is None:
                dest = aligned_empty(src.size, np.float32)
            lib.group_conv_lanes_pack(src.ctypes.data, groups, og, cg, kh * kw, dest.ctypes.data)
            return dest

        wpk, steps = _packed(ctx, w, ("rlx_group_conv_lanes_pack", groups, og, cg, kh * kw), w.size, make,
                             lib.group_conv_lanes_pack, [0, groups, og, cg, kh * kw, 0])
        kernel, per_thread = lib.group_conv_lanes, lib.group_conv_lanes_scratch(cg, kh, kw, sh, sw, oh, ow)
    else:  # the row kernel (rlx_group_conv) on the weights as they are
        wpk, steps = w, []
        kernel, per_thread = lib.group_conv, lib.group_conv_scratch(cg, kh, kw, sh, sw, oh, ow)
    scratch = ctx.scratch((threads * int(per_thread),), np.float32)
    args = [0, wpk.ctypes.data, 0 if bias is None else bias.ctypes.data, 0, scratch.ctypes.data, *geometry, threads,
            0 if epilogue is None else epilogue.address(threads)]
    kept = tuple(k for k in (w, wpk, bias, epilogue, scratch) if k is not None)
    steps.append(bound_call(kernel, args, (x, out), (0, 3), lambda xv, yv: run_numpy(xv, w, bias, yv), kept))
    return steps
