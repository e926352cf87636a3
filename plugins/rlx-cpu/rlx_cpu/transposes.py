"""Transposes that move the last axis, as batched matrix transposes on the native kernels.

A permutation that moves the innermost axis makes numpy's copy read or write one
element at a time across strides: 2-3 GB/s here, where the data is a few MB (segformer
moves every stage's activations between (N, C, H*W) and (N, H*W, C) and back, a third of
its run on one core). Once size-1 axes are dropped and axes that stay neighbours in the
same order are merged, such a permutation is most often ``(1, 0)`` or ``(0, 2, 1)``: a
batch of matrix transposes, which ``rlx_transpose`` runs in 8 x 8 register tiles (3-5x
numpy's speed). Other permutations (those that keep the last axis move whole rows, which
numpy copies well) keep numpy's copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ccall import bound_call
from .native import library
from .regions import SPLIT_NS
from .steps import Step, laid_out

__all__ = ["matrix_form", "transpose_step"]

TRANSPOSE_NS = 0.25  # single-thread ns per element, for the threads decision


def matrix_form(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, int, int] | None:
    """``(batch, rows, cols)`` where transposing ``shape`` by ``perm`` is ``batch`` matrix
    transposes of ``rows`` x ``cols`` (contiguous in and out), else None."""
    kept = [a for a in perm if shape[a] != 1]
    runs: list[list[int]] = []  # output order; each a run of source axes kept in order
    for a in kept:
        if runs and a == runs[-1][-1] + 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    sizes = [int(np.prod([shape[a] for a in run])) for run in runs]
    order = sorted(range(len(runs)), key=lambda k: runs[k][0])  # the runs in source order
    if order == [1, 0]:
        return 1, sizes[1], sizes[0]
    if order == [0, 2, 1]:
        return sizes[0], sizes[2], sizes[1]
    return None


def transpose_step(x: Any, perm: tuple[int, ...], out: Any) -> Step | None:
    """``out = x.transpose(perm)`` as batched matrix transposes of 4-byte elements on the
    native kernels; None where the library is not here or the permutation, layout or
    dtype is another (the caller keeps numpy's copy)."""
    lib = library()
    if (lib is None or x.dtype != out.dtype or x.dtype.itemsize != 4 or out.size == 0
            or not (laid_out(x) and laid_out(out))):
        return None
    form = matrix_form(tuple(x.shape), tuple(perm))
    if form is None:
        return None
    batch, rows, cols = form
    threads = int(lib.threads_for(out.size * TRANSPOSE_NS, SPLIT_NS))

    def fallback(x: np.ndarray, out: np.ndarray) -> None:
        np.copyto(out, x.transpose(perm))

    return bound_call(lib.transpose, [0, 0, batch, rows, cols, threads], (x, out), (0, 1), fallback)
