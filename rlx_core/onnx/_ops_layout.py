"""Converters of ops that only move values or make them from shapes: SpaceToDepth,
DepthToSpace (a reshape, a transpose, a reshape), Tile, Compress and ReverseSequence (a
``gather`` by a table known at import), all exact for every dtype, and EyeLike (a
constant: rlx shapes are static, so the identity matrix is known at import).
"""

from __future__ import annotations

import numpy as np

from ._context import NodeContext, converter, onnx_dtype
from ._shapes import Operand, frozen

__all__: list[str] = []


def _blocks(c: NodeContext, x: Operand) -> tuple[tuple[int, int, int, int], int]:
    """``x``'s (N, C, H, W) and the ``blocksize`` attribute, checked."""
    shape = c.f.shape(x)
    if len(shape) != 4:
        raise c.fail(f"needs an input (N, C, H, W), got shape {shape}")
    if not c.has_attr("blocksize"):
        raise c.fail("needs a 'blocksize' attribute")
    b = int(c.attr("blocksize"))
    if b < 1:
        raise c.fail(f"blocksize must be >= 1, got {b}")
    return (shape[0], shape[1], shape[2], shape[3]), b


@converter("SpaceToDepth")
def _space_to_depth(c: NodeContext) -> list[Operand | None]:
    """Each b x b block of H, W becomes b * b channels: (N, C, H/b, b, W/b, b) to
    (N, b, b, C, H/b, W/b) for ``mode`` DCR (the default, and the only form before
    SpaceToDepth-28), to (N, C, b, b, H/b, W/b) for CRD."""
    f, x = c.f, c.input(0)
    (n, ch, h, w), b = _blocks(c, x)
    if h % b or w % b:
        raise c.fail(f"H and W of the input {(n, ch, h, w)} must be multiples of blocksize {b}")
    mode = c.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise c.fail(f"mode must be 'DCR' or 'CRD', got {mode!r}")
    y = f.op("reshape", x, shape=(n, ch, h // b, b, w // b, b))
    y = f.op("transpose", y, perm=(0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4))
    return [f.op("reshape", y, shape=(n, ch * b * b, h // b, w // b), name=c.out())]


@converter("DepthToSpace")
def _depth_to_space(c: NodeContext) -> list[Operand | None]:
    """The inverse: channels become b x b blocks. ``mode`` DCR (default) reads the
    channels as (b, b, C / b²), CRD as (C / b², b, b)."""
    f, x = c.f, c.input(0)
    (n, ch, h, w), b = _blocks(c, x)
    if ch % (b * b):
        raise c.fail(f"the {ch} channels must be a multiple of blocksize² = {b * b}")
    mode = c.attr("mode", "DCR")
    depth = ch // (b * b)
    if mode == "DCR":
        y = f.op("transpose", f.op("reshape", x, shape=(n, b, b, depth, h, w)), perm=(0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        y = f.op("transpose", f.op("reshape", x, shape=(n, depth, b, b, h, w)), perm=(0, 1, 4, 2, 5, 3))
    else:
        raise c.fail(f"mode must be 'DCR' or 'CRD', got {mode!r}")
    return [f.op("reshape", y, shape=(n, depth, h * b, w * b), name=c.out())]


@converter("EyeLike")
def _eye_like(c: NodeContext) -> list[Operand | None]:
    """Ones on diagonal ``k`` of a 2-D tensor of the input's shape, in ``dtype`` (default:
    the input's). The input's values are never read, so the result is a constant."""
    f, x = c.f, c.input(0)
    shape = f.shape(x)
    if len(shape) != 2:
        raise c.fail(f"needs a 2-D input, got shape {shape}")
    dtype = onnx_dtype(int(c.attr("dtype")), "its 'dtype'") if c.has_attr("dtype") else f.dtype(x)
    f.check_size(shape, dtype, "EyeLike's result")
    return [frozen(np.eye(shape[0], shape[1], k=int(c.attr("k", 0)), dtype=np.dtype(dtype)))]


@converter("Tile")
def _tile(c: NodeContext) -> list[Operand | None]:
    """``repeats`` known at import: per repeated axis, one ``gather`` by the constant
    table ``tile(arange(d), r)`` (exact, every dtype; a repeat of 0 empties the axis)."""
    f, y = c.f, c.input(0)
    shape = f.shape(y)
    repeats = c.ints(1, "repeats")
    if repeats is None or len(repeats) != len(shape) or any(r < 0 for r in repeats):
        raise c.fail(f"repeats must hold one count >= 0 per axis of the input {shape}, got {repeats}")
    f.check_size(tuple(d * r for d, r in zip(shape, repeats)), f.dtype(y), "Tile's result")
    moved = [a for a, r in enumerate(repeats) if r != 1]
    if not moved:
        return [y]
    for a in moved:
        table = frozen(np.tile(np.arange(shape[a], dtype=np.int64), repeats[a]))
        y = f.op("gather", y, table, axis=a, name=c.out() if a == moved[-1] else "")
    return [y]


@converter("Compress")
def _compress(c: NodeContext) -> list[Operand | None]:
    """The slices along ``axis`` (or the elements of the flattened input, without one)
    where ``condition`` (known at import) is true: one ``gather`` by their positions."""
    f, x = c.f, c.input(0)
    shape = f.shape(x)
    cond = c.static(1, "condition")
    if cond is None:
        raise c.fail("input 1 (condition) is required")
    if cond.ndim != 1:
        raise c.fail(f"condition must be 1-D, got shape {cond.shape}")
    if c.has_attr("axis"):
        axis = int(c.attr("axis"))
        if not -len(shape) <= axis < max(len(shape), 1) or not shape:
            raise c.fail(f"axis {axis} is out of range for rank {len(shape)}")
        axis %= len(shape)
    else:
        x, axis = f.op("reshape", x, shape=(int(np.prod(shape)),)), 0
    length = f.shape(x)[axis]
    if cond.shape[0] > length:
        raise c.fail(f"condition has {cond.shape[0]} entries, more than the {length} along axis {axis}")
    picked = frozen(np.flatnonzero(cond.astype(bool)).astype(np.int64))
    return [f.op("gather", x, picked, axis=axis, name=c.out())]


@converter("ReverseSequence")
def _reverse_sequence(c: NodeContext) -> list[Operand | None]:
    """Each batch entry's first ``sequence_lens[b]`` time steps reversed, the rest kept: one
    ``gather`` over the (batch x time) rows by a table of row indices. The lengths are read
    at import; fed at run time, the graph is built for each set of them (as for any input
    read as a shape)."""
    f, x = c.f, c.input(0)
    lens = c.ints(1, "sequence_lens")
    assert lens is not None
    shape = f.shape(x)
    batch_axis, time_axis = int(c.attr("batch_axis", 1)), int(c.attr("time_axis", 0))
    if len(shape) < 2 or {batch_axis, time_axis} != {0, 1}:
        raise c.fail(f"batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1, one each, on an input of "
                     f"rank 2 or more; got shape {shape}")
    batch, steps = shape[batch_axis], shape[time_axis]
    if len(lens) != batch or any(not 0 <= n <= steps for n in lens):
        raise c.fail(f"sequence_lens {list(lens)} must give {batch} lengths of 0 to {steps}")
    swap = (1, 0, *range(2, len(shape)))
    rows = f.op("reshape", x if batch_axis == 0 else f.op("transpose", x, perm=swap), shape=(batch * steps, *shape[2:]))
    table = np.array([[b * steps + (n - 1 - t if t < n else t) for t in range(steps)] for b, n in enumerate(lens)],
                     np.int64).reshape(batch, steps)
    y = f.op("gather", rows, frozen(table), axis=0, name=c.out() if batch_axis == 0 else "")
    return [y if batch_axis == 0 else f.op("transpose", y, perm=swap, name=c.out())]
