"""Converters of Col2Im and MaxUnpool: ops that write blocks or values back into an image.

rlx has no scatter op, so both are written as gathers from constant tables built at
import, which every backend runs:

- Col2Im (opset 18) is linear: each image position is the sum of the column entries
  whose block offset and block position land on it. Its table lists, per image position,
  those entries (at most the product over axes of how many (offset, block) pairs reach one
  coordinate); absent ones point at an appended zero. One ``gather`` and one
  ``reduce_sum`` make the image, for any rank, strides, pads and dilations; the padding
  is never written, so nothing is cropped.
- MaxUnpool writes X's values at I's flat indices into zeros of the size the pool had
  (as onnx's reference and node tests do: the indices count over that size;
  ``output_shape`` only pads the result at the end of each axis; onnxruntime counts them
  over ``output_shape`` instead, which differs where the two sizes do). Indices known at import (a constant) become one
  constant "which value lands here" table; indices known only at run time (a MaxPool's
  Indices) are compared with every output position (an ``equal`` of the flat indices
  against ``arange``), the last value written to a position winning as in the reference.
  That comparison is (outputs x values) large, so it is capped and refused by name
  beyond the cap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._context import NodeContext, converter
from ._shapes import Operand, frozen

__all__: list[str] = []

#: The most (output position, value) pairs a MaxUnpool with run-time indices compares.
MAX_UNPOOL_PAIRS = 1 << 24


def _axis_attr(c: NodeContext, name: str, rank: int, default: int) -> tuple[int, ...]:
    """A per-axis attribute (``rank`` entries; 2 * ``rank`` for ``pads``), checked."""
    count = 2 * rank if name == "pads" else rank
    value = c.attr_ints(name, (default,) * count)
    assert value is not None
    if len(value) != count:
        raise c.fail(f"{name} must have {count} entries for {rank} spatial axes, got {list(value)}")
    return value


def _col2im_axis(size: int, k: int, s: int, d: int, begin: int, blocks: int) -> list[list[tuple[int, int]]]:
    """For each coordinate of an image axis: the (block offset, block position) pairs
    that land on it, in offset order."""
    reach: list[list[tuple[int, int]]] = [[] for _ in range(size)]
    for o in range(k):
        for b in range(blocks):
            x = b * s - begin + o * d
            if 0 <= x < size:
                reach[x].append((o, b))
    return reach


def _col2im_table(image: Sequence[int], block: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                  begins: Sequence[int], blocks: Sequence[int]) -> np.ndarray:
    """(image positions, entries per position) int64: the column entries (offset-major,
    ``offset * L + block``) summed into each image position, in offset order; ``K * L``
    (a zero) where a position takes fewer. The entries are separable: along each axis the
    (offset, block) pairs reaching a coordinate, combined over the axes."""
    rank, n_blocks = len(image), math.prod(blocks)
    zero = math.prod(block) * n_blocks
    k_steps = [math.prod(block[i + 1:]) for i in range(rank)]
    b_steps = [math.prod(blocks[i + 1:]) for i in range(rank)]
    entry: np.ndarray = np.zeros((), dtype=np.int64)
    valid: np.ndarray = np.ones((), dtype=bool)
    for i, (n, k, s, d, b, nb) in enumerate(zip(image, block, strides, dilations, begins, blocks)):
        reach = _col2im_axis(n, k, s, d, b, nb)
        m = max(1, max(len(r) for r in reach))
        part, ok = np.zeros((n, m), dtype=np.int64), np.zeros((n, m), dtype=bool)
        for x, pairs in enumerate(reach):
            part[x, :len(pairs)] = [o * k_steps[i] * n_blocks + q * b_steps[i] for o, q in pairs]
            ok[x, :len(pairs)] = True
        where = [1] * (2 * rank)
        where[i], where[rank + i] = n, m
        entry = entry + part.reshape(where)
        valid = valid & ok.reshape(where)
    table = np.where(valid, entry, zero).reshape(math.prod(image), -1)
    return np.sort(table, axis=1)


@converter("Col2Im")
def _col2im(c: NodeContext) -> list[Operand | None]:
    """``input`` (N, C * prod(block_shape), L) summed back into (N, C, *image_shape);
    see the module docstring."""
    f, x = c.f, c.input(0, "input")
    image, block = c.ints(1, "image_shape"), c.ints(2, "block_shape")
    if image is None or block is None:
        raise c.fail("image_shape and block_shape are required")
    shape, dtype = f.shape(x), f.dtype(x)
    rank = len(image)
    if rank < 1 or len(block) != rank:
        raise c.fail(f"image_shape {list(image)} and block_shape {list(block)} must have the same number (>= 1) "
                     "of entries")
    if len(shape) != 3:
        raise c.fail(f"input must be (N, C * prod(block_shape), L), got shape {shape}")
    if dtype == "bool":
        raise c.fail("bool input is not supported (its blocks are summed)")
    dilations, strides = _axis_attr(c, "dilations", rank, 1), _axis_attr(c, "strides", rank, 1)
    pads = _axis_attr(c, "pads", rank, 0)
    if min(image) < 1 or min(block) < 1 or min(dilations) < 1 or min(strides) < 1 or min(pads) < 0:
        raise c.fail(f"image_shape {list(image)}, block_shape {list(block)}, dilations, strides must be positive "
                     f"and pads non-negative, got {list(dilations)}, {list(strides)}, {list(pads)}")
    k = math.prod(block)
    if shape[1] % k:
        raise c.fail(f"the input's axis 1 ({shape[1]}) is not a multiple of prod(block_shape) = {k}")
    blocks = [(n + b + e - d * (kk - 1) - 1) // s + 1
              for n, kk, s, d, b, e in zip(image, block, strides, dilations, pads[:rank], pads[rank:])]
    if min(blocks) < 1 or math.prod(blocks) != shape[2]:
        raise c.fail(f"the blocks fit {blocks} times along the padded image, so L must be {math.prod(blocks)}; "
                     f"the input has L = {shape[2]}")
    n, ch = shape[0], shape[1] // k
    f.check_size((math.prod(image), k), "int64", "Col2Im's table")
    table = _col2im_table(image, block, strides, dilations, pads[:rank], blocks)
    f.check_size((n, ch, *table.shape), dtype, "Col2Im's gathered entries")
    cols = f.op("reshape", x, shape=(n, ch, k * shape[2]))
    cols = f.op("concat", cols, frozen(np.zeros((n, ch, 1), dtype)), axis=2)
    if table.shape[1] == 1:
        picked = f.op("gather", cols, frozen(table[:, 0]), axis=2)
    else:
        picked = f.op("reduce_sum", f.op("gather", cols, frozen(table), axis=2), axes=(3,), keepdims=False)
    return [f.op("reshape", picked, shape=(n, ch, *image), name=c.out())]


@converter("MaxUnpool")
def _max_unpool(c: NodeContext) -> list[Operand | None]:
    """X's values at I's flat indices in zeros of the unpooled size; see the module docstring."""
    f, x, ind = c.f, c.input(0, "X"), c.input(1, "I")
    shape, dtype = f.shape(x), f.dtype(x)
    if len(shape) < 3:
        raise c.fail(f"X must be (N, C, ...spatial), got shape {shape}")
    if tuple(f.shape(ind)) != tuple(shape) or np.dtype(f.dtype(ind)).kind not in "iu":
        raise c.fail(f"I must be integers shaped like X {shape}, got {f.dtype(ind)}{f.shape(ind)}")
    rank = len(shape) - 2
    kernel = c.attr_ints("kernel_shape")
    if kernel is None or len(kernel) != rank:
        raise c.fail(f"kernel_shape must have {rank} entries, got {kernel}")
    strides, pads = _axis_attr(c, "strides", rank, 1), _axis_attr(c, "pads", rank, 0)
    size = (*shape[:2], *((n - 1) * s - b - e + k
                          for n, s, k, b, e in zip(shape[2:], strides, kernel, pads[:rank], pads[rank:])))
    if min(size[2:]) < 1:
        raise c.fail(f"kernel_shape {list(kernel)}, strides {list(strides)} and pads {list(pads)} unpool to an "
                     f"empty size {size}")
    wanted = c.ints(2, "output_shape")
    if wanted is not None and (len(wanted) != len(size) or any(w < s for w, s in zip(wanted, size))):
        raise c.fail(f"output_shape {list(wanted)} must have {len(size)} entries, none below the unpooled size "
                     f"{list(size)}")
    total, count = math.prod(size), math.prod(shape)
    f.check_size(size, dtype, "MaxUnpool's output")
    values = f.op("reshape", x, shape=(count,))
    known = f.array(ind)
    if known is not None:
        flat = known.reshape(-1).astype(np.int64)
        if flat.size and (flat.min() < -total or flat.max() >= total):
            raise c.fail(f"an index is out of range for the unpooled size {list(size)} ({total} elements)")
        src = np.full(total, -1, dtype=np.int64)
        np.maximum.at(src, np.where(flat < 0, flat + total, flat), np.arange(count, dtype=np.int64))  # last wins
        picked = f.op("gather", values, frozen(np.maximum(src, 0)), axis=0)
        hit = frozen(src >= 0)
    else:
        if total * count > MAX_UNPOOL_PAIRS:
            raise c.fail(f"run-time indices are compared with every output position: {total} x {count} pairs, more "
                         f"than the {MAX_UNPOOL_PAIRS} supported")
        idx = f.op("reshape", ind if f.dtype(ind) == "int64" else f.op("cast", ind, dtype="int64"), shape=(1, count))
        idx = f.op("where", f.op("less", idx, f.const(0, "int64")), f.op("add", idx, f.const(total, "int64")), idx)
        same = f.op("equal", idx, frozen(np.arange(total, dtype=np.int64).reshape(total, 1)))
        order = frozen(np.arange(count, dtype=np.int64).reshape(1, count))
        src = f.op("reduce_max", f.op("where", same, order, f.const(-1, "int64")), axes=(1,), keepdims=False)
        picked = f.op("gather", values, f.op("maximum", src, f.const(0, "int64")), axis=0)
        hit = f.op("greater", src, f.const(-1, "int64"))
    out = f.op("where", hit, picked, f.const(0, dtype))
    if wanted is None or tuple(wanted) == tuple(size):
        return [f.op("reshape", out, shape=size, name=c.out())]
    out = f.op("reshape", out, shape=size)
    for axis, (w, s) in enumerate(zip(wanted, size)):
        if w > s:
            filler = frozen(np.zeros((*wanted[:axis], w - s, *size[axis + 1:]), dtype))
            out = f.op("concat", out, filler, axis=axis)
    return [f.op("reshape", out, shape=tuple(wanted), name=c.out())]
