"""Grouped convolutions with few channels a group, merged into wider groups for AMX.

Why: under ``precision="bf16"`` oneDNN 3.2 runs a grouped convolution of 16 or more
channels a group on AMX's tiles, but one of 8 (RegNetY's group width, ResNeXt's second
stage) only on AVX-512, where bf16 operands are slower than float32, so such a
convolution stayed float32 (``onednn_steps._jit_impl``). Two neighbouring groups of 8
are one group of 16 whose weights are block-diagonal: every output of the merged group
sums the same products as before, plus products with weights that are exactly zero.
The channels keep their order, so input and output are the same memory. Twice the
multiply-adds on AMX ran in 0.49-0.60x the time of the group of 8 (256 channels over
28x28 and 48 over 56x56, batch 8, AMX Xeon; BENCHMARKS.md, "Grouped convolutions merged
for AMX (issue 35, session 34)"); four or more times the work (4 a group merged by 4,
RegNet's 13 or 55 groups of 8 merged by their odd factors) ran 0.96-1.27x, so only a
factor of two is taken.
"""

from __future__ import annotations

import numpy as np

__all__ = ["WIDE_GROUP", "MAX_FACTOR", "factor", "merged_weights"]

#: Channels a group from which oneDNN runs a grouped convolution on AMX (oneDNN 3.2).
WIDE_GROUP = 16
#: The most groups merged into one: each merge multiplies the convolution's work.
MAX_FACTOR = 2


def factor(groups: int, per_group: int) -> int:
    """How many neighbouring groups to merge into one so that the merged group is wide
    enough for AMX (``WIDE_GROUP``), at most ``MAX_FACTOR`` and dividing ``groups``; 1
    where none does (already wide, depthwise, or no factor fits)."""
    if groups <= 1 or per_group <= 1 or per_group >= WIDE_GROUP:
        return 1
    for k in range(2, MAX_FACTOR + 1):
        if groups % k == 0 and per_group * k >= WIDE_GROUP:
            return k
    return 1


def merged_weights(w: np.ndarray, groups: int, k: int, dest: np.ndarray | None = None) -> np.ndarray:
    """The weights ``(o, cg, kh, kw)`` of a convolution of ``groups`` groups as those of
    ``groups // k`` groups ``(o, k * cg, kh, kw)``: group ``g`` of the result holds the
    original groups ``g k .. g k + k - 1`` on its diagonal blocks and zeros elsewhere.
    Written into ``dest`` where given (``set_param`` refills it in place)."""
    o, cg = w.shape[:2]
    if groups % k or o % groups:
        raise ValueError(f"cannot merge {groups} groups of {o} outputs by {k}")
    og, rest = o // groups, tuple(w.shape[2:])
    out = np.zeros((o, k * cg, *rest), np.float32) if dest is None else dest
    if dest is not None:
        out.fill(0.0)
    blocks = out.reshape(groups // k, k, og, k, cg, *rest)
    source = np.asarray(w, dtype=np.float32).reshape(groups // k, k, og, cg, *rest)
    for a in range(k):
        blocks[:, a, :, a] = source[:, a]
    return out
