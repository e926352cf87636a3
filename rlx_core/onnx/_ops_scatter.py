"""Converters of ops that write by index: ScatterElements, ScatterND, OneHot.

rlx has no scatter op: a scatter whose indices are known at import (exporters write
KV-cache positions and static updates as constants) is a ``where`` over the data with a
constant mask, the written values read by one ``gather`` from the flattened updates by a
constant "which update lands here" table. Duplicate indices with a ``reduction`` are
applied in rounds, one per occurrence, in the updates' order (as ONNX's reference does);
without a reduction the last update wins. Indices known only at run time are refused by
name. OneHot is an ``equal`` of the (wrapped) indices against ``arange(depth)``.
"""

from __future__ import annotations

import math

import numpy as np

from ._context import NodeContext, converter
from ._shapes import Emitter, Operand, frozen

__all__: list[str] = []

_COMBINE = {"add": "add", "mul": "mul", "max": "maximum", "min": "minimum"}


def _rounds(targets: np.ndarray, size: int) -> list[np.ndarray]:
    """For each occurrence round r, the update landing on each of ``size`` positions in
    that round (-1: none); ``targets[u]`` is where update ``u`` lands."""
    rounds: list[np.ndarray] = []
    seen = np.zeros(size, dtype=np.int64)
    for u, t in enumerate(targets.tolist()):
        r = int(seen[t])
        seen[t] += 1
        if r == len(rounds):
            rounds.append(np.full(size, -1, dtype=np.int64))
        rounds[r][t] = u
    return rounds


def _scatter(c: NodeContext, f: Emitter, data: Operand, updates: Operand, targets: np.ndarray,
             rows: tuple[int, ...], reduction: str) -> Operand:
    """``data`` seen as ``rows`` (leading positions, each a slice of the rest) with update
    ``u`` (a slice of ``updates`` seen the same way) written at ``targets[u]``. No update
    (a detector's pyramid level that got no region) leaves ``data`` as it is."""
    if targets.size == 0:
        return data
    dshape = f.shape(data)
    tail = tuple(dshape[len(rows):])
    n_rows, n_updates = math.prod(rows), targets.size
    flat = f.op("reshape", data, shape=(n_rows, *tail))
    upd = f.op("reshape", updates, shape=(n_updates, *tail))
    mask_shape = (n_rows,) + (1,) * len(tail)
    if reduction == "none":
        last = np.full(n_rows, -1, dtype=np.int64)
        last[targets] = np.arange(n_updates, dtype=np.int64)  # a duplicate: the last one wins
        plan = [last]
    else:
        plan = _rounds(targets, n_rows)
    out = flat
    for src in plan:
        hit = src >= 0
        picked = f.op("gather", upd, frozen(np.where(hit, src, 0)), axis=0)
        if reduction != "none":
            picked = f.op(_COMBINE[reduction], out, picked)
        out = f.op("where", frozen(hit.reshape(mask_shape)), picked, out)
    return f.op("reshape", out, shape=dshape, name=c.out())


def _reduction(c: NodeContext, data_dtype: str) -> str:
    reduction = c.attr("reduction", "none")
    if reduction not in ("none", *_COMBINE):
        raise c.fail(f"reduction {reduction!r} is not one of none, add, mul, max, min")
    if reduction != "none" and data_dtype == "bool":
        raise c.fail(f"reduction {reduction!r} of bool data is not supported")
    return reduction


@converter("ScatterElements", "Scatter")
def _scatter_elements(c: NodeContext) -> list[Operand | None]:
    """``out[p with p[axis] = indices[p]] = updates[p]`` for every position ``p`` of the
    updates (``Scatter``, versions 9 and 11, is its deprecated name, without ``reduction``)."""
    f, data, updates = c.f, c.input(0, "data"), c.input(2, "updates")
    dshape, ushape = f.shape(data), f.shape(updates)
    indices = c.static(1, "indices")
    assert indices is not None
    if indices.dtype.kind not in "iu" or tuple(indices.shape) != tuple(ushape) or len(ushape) != len(dshape):
        raise c.fail(f"indices must be integers shaped like the updates {tuple(ushape)} with the data's rank "
                     f"{len(dshape)}, got {indices.dtype}{tuple(indices.shape)}")
    if f.dtype(updates) != f.dtype(data):
        raise c.fail(f"updates have dtype {f.dtype(updates)}, the data {f.dtype(data)}")
    if c.op_type == "Scatter" and c.has_attr("reduction"):
        raise c.fail("Scatter (9, 11) has no reduction attribute; ScatterElements 16 and later do")
    rank = len(dshape)
    axis = int(c.attr("axis", 0))
    if not -rank <= axis < rank:
        raise c.fail(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    if any(u > d for i, (u, d) in enumerate(zip(ushape, dshape)) if i != axis):
        raise c.fail(f"updates {tuple(ushape)} exceed the data {tuple(dshape)} off the scatter axis")
    n = dshape[axis]
    bad = (indices < -n) | (indices >= n)
    if np.any(bad):
        raise c.fail(f"index {int(indices[bad].flat[0])} is out of range for axis {axis} of size {n}")
    coords = list(np.indices(ushape, dtype=np.int64))
    coords[axis] = np.where(indices < 0, indices + n, indices).astype(np.int64)
    targets = np.ravel_multi_index(tuple(coords), dshape).reshape(-1) if dshape else np.zeros(0, np.int64)
    return [_scatter(c, f, data, updates, targets, tuple(dshape), _reduction(c, f.dtype(data)))]


@converter("ScatterND")
def _scatter_nd(c: NodeContext) -> list[Operand | None]:
    """``out[indices[i]] = updates[i]`` where each ``indices[i]`` (its last axis, ``k``
    long) picks a slice ``data.shape[k:]`` of the data."""
    f, data, updates = c.f, c.input(0, "data"), c.input(2, "updates")
    dshape, ushape = f.shape(data), f.shape(updates)
    indices = c.static(1, "indices")
    assert indices is not None
    if indices.dtype.kind not in "iu" or indices.ndim < 1:
        raise c.fail(f"indices must be integers of rank >= 1, got {indices.dtype}{tuple(indices.shape)}")
    k = indices.shape[-1]
    if not 1 <= k <= len(dshape) or tuple(ushape) != tuple(indices.shape[:-1]) + tuple(dshape[k:]):
        raise c.fail(f"updates must have shape {tuple(indices.shape[:-1]) + tuple(dshape[k:])} for indices "
                     f"{tuple(indices.shape)} and data {tuple(dshape)}, got {tuple(ushape)}")
    if f.dtype(updates) != f.dtype(data):
        raise c.fail(f"updates have dtype {f.dtype(updates)}, the data {f.dtype(data)}")
    lead = np.array(dshape[:k], dtype=np.int64)
    tuples = indices.reshape(-1, k).astype(np.int64)
    bad = (tuples < -lead) | (tuples >= lead)
    if np.any(bad):
        first = tuples[np.nonzero(bad)[0][0]].tolist()
        raise c.fail(f"index {first} is out of range for data of shape {tuple(dshape)}")
    tuples = np.where(tuples < 0, tuples + lead, tuples)
    targets = np.ravel_multi_index(tuple(tuples.T), tuple(dshape[:k])) if tuples.size else np.zeros(0, np.int64)
    return [_scatter(c, f, data, updates, targets, tuple(dshape[:k]), _reduction(c, f.dtype(data)))]


@converter("OneHot")
def _one_hot(c: NodeContext) -> list[Operand | None]:
    """``values[1]`` where the (int64-cast, negative-wrapped) index equals the position
    along the new ``axis``, ``values[0]`` elsewhere; out-of-range indices: all off."""
    f, indices, values = c.f, c.input(0, "indices"), c.input(2, "values")
    depth_arr = c.static(1, "depth")
    assert depth_arr is not None
    if depth_arr.size != 1:
        raise c.fail(f"depth must hold one value, got {depth_arr.size}")
    depth = int(depth_arr.reshape(-1)[0])
    if depth < 1:
        raise c.fail(f"depth must be >= 1, got {depth}")
    if tuple(f.shape(values)) != (2,):
        raise c.fail(f"values must be [off, on], got shape {tuple(f.shape(values))}")
    ishape = f.shape(indices)
    rank = len(ishape) + 1
    axis = int(c.attr("axis", -1))
    if not -rank <= axis < rank:
        raise c.fail(f"axis {axis} is out of range for the output's rank {rank}")
    axis %= rank
    f.check_size((*ishape[:axis], depth, *ishape[axis:]), f.dtype(values), "OneHot's output")
    idx = indices
    if f.dtype(idx) != "int64":  # the spec casts (floats truncate toward zero)
        idx = f.op("cast", idx, dtype="int64")
    idx = f.op("where", f.op("less", idx, f.const(0, "int64")), f.op("add", idx, f.const(depth, "int64")), idx)
    idx = f.op("reshape", idx, shape=(*ishape[:axis], 1, *ishape[axis:]))
    positions = frozen(np.arange(depth, dtype=np.int64).reshape((depth,) + (1,) * (rank - 1 - axis)))
    hot = f.op("equal", idx, positions)
    off = f.op("gather", values, f.const(0, "int64"), axis=0)
    on = f.op("gather", values, f.const(1, "int64"), axis=0)
    return [f.op("where", hot, on, off, name=c.out())]
