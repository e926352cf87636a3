"""Converters of position-dependent ops: Trilu, ArgMax/ArgMin, TopK, CumSum/CumProd, GatherElements, GatherND,
Pad, Mod.

None of these has an IR op of its own; each is a decomposition into existing ones. rlx
shapes are static, so everything that depends only on shapes (a triangle mask, the
positions along an axis, the flat offsets of a gather, a pad's index table) is a small
numpy constant built here, and the run-time work is a few ``where``, ``gather``,
``reduce_max`` or elementwise ops. Integer results are exact: they never go through
floats. ``Mod`` sits here because it is the same kind of exact-integer decomposition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..ir.dtypes import DTYPES, INT_DTYPES
from ..ir.symbolic import Dim, Sym, dim_lt
from ._context import NeedsHost, NodeContext, converter
from ._shapes import Emitter, Operand, frozen
from ._symdims import NotSymbolic, make_dims

__all__: list[str] = []

_FLOATS = ("float16", "float32", "float64")
_INDEX_INTS = ("int32", "int64")  # what ONNX's index inputs (Gather, Scatter, ...) may be
_INTS = tuple(d for d in DTYPES if d in INT_DTYPES)  # every integer dtype, as ONNX's numeric ops take


def _axis(c: NodeContext, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise c.fail(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def _along(values: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """1-D ``values`` shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    return frozen(values.reshape((values.size,) + (1,) * (rank - 1 - axis)))


def _exceeds(a: Dim, b: Dim) -> bool:
    """Whether ``a > b`` for every size; ``NotSymbolic`` when that depends on the sizes."""
    found = dim_lt(b, a)
    if found is None:
        raise NotSymbolic(f"whether {a} > {b} depends on the sizes")
    return found


def _scaled(f: Emitter, x: Operand, stride: Dim) -> Operand:
    """``x * stride`` (int64), the stride a size when it depends on them."""
    if isinstance(stride, int) and stride == 1:
        return x
    return f.op("mul", x, make_dims(stride, "int64") if isinstance(stride, Sym) else f.const(stride, "int64"))


def _static_offsets(shape: Sequence[int], strides: Sequence[int], axes: Iterable[int], rank: int) -> np.ndarray:
    """The flat offset of each coordinate of ``shape`` along ``axes`` (``index * stride``)."""
    offsets = np.zeros(tuple(shape), dtype=np.int64)
    for d in axes:
        offsets += _along(np.arange(shape[d], dtype=np.int64) * strides[d], d, rank)
    return offsets


def _plus_offsets(f: Emitter, flat: Operand, shape: Sequence[Dim], strides: Sequence[Dim], axes: Iterable[int],
                  rank: int) -> Operand:
    """``flat`` plus the flat offset of each coordinate along ``axes``: one constant when
    the sizes are known, else one run-time ``arange * stride`` per axis longer than 1."""
    axes = [d for d in axes if not (isinstance(shape[d], int) and shape[d] == 1)]  # (a size-1 axis adds 0)
    if not axes:
        return flat
    if not any(isinstance(shape[d], Sym) or isinstance(strides[d], Sym) for d in axes):
        f.check_size(shape, "int64", "a flat index's offsets")
        return f.op("add", flat, frozen(_static_offsets(shape, strides, axes, rank)))
    for d in axes:
        along = (shape[d],) + (1,) * (rank - 1 - d)
        term = f.op("reshape", _scaled(f, f.arange(shape[d]), strides[d]), shape=along)
        flat = f.op("add", flat, term)
    return flat


def _scalar_input(c: NodeContext, i: int, what: str) -> int:
    """An import-time integer input holding one value (CumSum's axis)."""
    values = c.ints(i, what)
    if values is None:
        raise c.fail(f"input {what} is required")
    if len(values) != 1:
        raise c.fail(f"input {what} must hold one value, got {len(values)}")
    return values[0]


# ---------------------------------------------------------------- Trilu
@converter("Trilu")
def _trilu(c: NodeContext) -> list[Operand | None]:
    """``where(drop, 0, x)``: element (i, j) of each (N, M) matrix is kept when
    ``j - i >= k`` (upper) or ``j - i <= k`` (lower), any ``k`` being valid. ``drop``
    compares the constant ``j - i`` table with ``k``: a constant mask when ``k`` is known
    at import (nothing at all when it keeps everything), one comparison when it is not."""
    f, x = c.f, c.input(0)
    shape, dtype = f.shape(x), f.dtype(x)
    if len(shape) < 2:
        raise c.fail(f"needs a tensor of rank >= 2, got shape {shape}")
    k = c.optional(1)
    if k is None:
        k = f.const(0, "int64")
    if f.dtype(k) != "int64" or math.prod(f.shape(k)) != 1:
        raise c.fail(f"k must be one int64 value, got {f.shape(k)} {f.dtype(k)}")
    k = f.op("reshape", k, shape=())
    rows, cols = shape[-2:]
    offset = frozen(np.arange(cols, dtype=np.int64)[None, :] - np.arange(rows, dtype=np.int64)[:, None])
    drop = f.op("less" if c.attr("upper", 1) else "greater", offset, k)
    known = f.array(drop)
    if known is not None and not known.any():
        return [x]
    zero = f.const(False if dtype == "bool" else 0, dtype)
    return [f.op("where", drop, zero, x, name=c.out())]


# ---------------------------------------------------------------- ArgMax, ArgMin
def _numeric_tensor(c: NodeContext, x: Operand) -> tuple[tuple[int, ...], str]:
    """``x``'s shape and dtype, or a refusal naming the node when it is not a numeric
    tensor of rank >= 1 (what ArgMax/ArgMin and CumSum run along an axis of)."""
    shape, dtype = c.f.shape(x), c.f.dtype(x)
    if dtype not in _FLOATS + _INTS:
        raise c.fail(f"needs a numeric input, got {dtype}")
    if not shape:
        raise c.fail("needs a tensor of rank >= 1, got a scalar")
    return shape, dtype


@converter("ArgMax", "ArgMin")
def _arg_extreme(c: NodeContext) -> list[Operand | None]:
    """The first (or, with ``select_last_index``, last) position of the extreme along
    ``axis``, as int64: ``hit = (v == reduce_max(v))`` marks the extremes, and a
    ``reduce_max`` over ``where(hit, position, -1)`` picks the last one, or over reversed
    positions the first. ArgMin maximizes ``Emitter.flip(x)`` (``-x``, or the integers'
    complement: no overflow at the minimum). A NaN counts as the extreme, as in numpy, PyTorch and the
    ONNX reference (onnxruntime's answer then depends on where the NaN is)."""
    f, x = c.f, c.input(0)
    shape, dtype = _numeric_tensor(c, x)
    axis = _axis(c, int(c.attr("axis", 0)), len(shape))
    n = shape[axis]
    if n == 0:
        raise c.fail(f"axis {axis} of shape {shape} is empty: it has no {c.op_type[3:].lower()}imum")
    keep = bool(c.attr("keepdims", 1))
    last = bool(c.attr("select_last_index", 0))
    if last and c.opset < 12:
        raise c.fail(f"select_last_index is an attribute of {c.op_type}-12; the model's opset is {c.opset}")
    v = x
    if c.op_type == "ArgMin":
        v = f.flip(x)
    _, hit = _extreme(f, v, axis, dtype in _FLOATS)
    if last:
        positions = _along(np.arange(n, dtype=np.int64), axis, len(shape))
        picked = f.op("where", hit, positions, f.const(-1, "int64"))
        return [f.op("reduce_max", picked, axes=(axis,), keepdims=keep, name=c.out())]
    return [_first(f, hit, axis, len(shape), n, keep, name=c.out())]


def _extreme(f: Emitter, v: Operand, axis: int, floats: bool) -> tuple[Operand, Operand]:
    """The maximum of ``v`` along ``axis`` (kept) and where it is; a NaN is the extreme:
    when there is one, the NaNs are marked (the maximum is NaN then)."""
    m = f.op("reduce_max", v, axes=(axis,), keepdims=True)
    hit = f.op("equal", v, m)
    if floats:
        hit = f.op("where", f.op("equal", v, v), hit, f.const(True, "bool"))
    return m, hit


def _first(f: Emitter, hit: Operand, axis: int, rank: int, n: int, keepdims: bool, name: str = "") -> Operand:
    """The first position along ``axis`` where ``hit`` holds, as int64: a ``reduce_max``
    over the reversed positions of the hits."""
    reversed_positions = _along(n - 1 - np.arange(n, dtype=np.int64), axis, rank)
    picked = f.op("where", hit, reversed_positions, f.const(-1, "int64"))
    flipped = f.op("reduce_max", picked, axes=(axis,), keepdims=keepdims)
    return f.op("sub", f.const(n - 1, "int64"), flipped, name=name)


# ---------------------------------------------------------------- CumSum
def _shifted(f: Emitter, y: Operand, d: int, axis: int, rank: int, n: int, reverse: bool, fill: int = 0) -> Operand:
    """``y`` moved ``d`` places along ``axis`` (towards the end, or the start if
    ``reverse``), ``fill`` coming in: a gather by a constant index table and a ``where``
    with a constant mask, both of length ``n`` (no constant as large as ``y``)."""
    positions = np.arange(n, dtype=np.int64)
    source = positions + d if reverse else positions - d
    inside = (source >= 0) & (source < n)
    moved = f.op("gather", y, frozen(np.clip(source, 0, n - 1)), axis=axis)
    dtype = f.dtype(y)
    return f.op("where", _along(inside, axis, rank), moved, f.const(fill, dtype))


@converter("CumSum", "CumProd")
def _cumulative(c: NodeContext) -> list[Operand | None]:
    """Running sums (products for CumProd, opset 26) along ``axis`` (an import-time
    input), ``exclusive`` and ``reverse``, as a log-step (Hillis-Steele) scan,
    ``y = y (+|*) shift(y, 2**s)``: ceil(log2 n) steps of gather, where and add (mul).
    Exact for integers (wrapping like ONNX Runtime) on every backend, and for floats
    each output combines only its own inputs, so an infinity or NaN stays where it
    belongs; a matmul with a 0/1 triangle would not (0 * inf is NaN).
    """
    f, x = c.f, c.input(0)
    shape, _ = _numeric_tensor(c, x)
    rank = len(shape)
    axis = _axis(c, _scalar_input(c, 1, "axis"), rank)
    exclusive, reverse = bool(c.attr("exclusive", 0)), bool(c.attr("reverse", 0))
    combine, identity = ("add", 0) if c.op_type == "CumSum" else ("mul", 1)
    n = shape[axis]
    if n == 0:
        return [x]
    y = _shifted(f, x, 1, axis, rank, n, reverse, identity) if exclusive else x
    d = 1
    while d < n:
        last = 2 * d >= n
        y = f.op(combine, y, _shifted(f, y, d, axis, rank, n, reverse, identity), name=c.out() if last else "")
        d *= 2
    return [y]


# ---------------------------------------------------------------- GatherElements
@converter("GatherElements")
def _gather_elements(c: NodeContext) -> list[Operand | None]:
    """``out[i..] = data[i.. with index[i..] on axis]`` as one ``gather`` from the
    flattened data: flat = wrap(index) * stride(axis) + the constant offset of every
    other coordinate. At run time the index is wrapped (and range-checked, as ONNX
    Runtime does) by a gather from ``arange(n)``; indices known at import fold."""
    f, data, index = c.f, c.input(0, "data"), c.input(1, "indices")
    dshape, ishape = f.shape(data), f.shape(index)
    if f.dtype(index) not in _INDEX_INTS:
        raise c.fail(f"indices must be int32 or int64, got {f.dtype(index)}")
    rank = len(dshape)
    if rank == 0 or len(ishape) != rank:
        raise c.fail(f"data and indices must have the same rank >= 1, got shapes {dshape} and {ishape}")
    axis = _axis(c, int(c.attr("axis", 0)), rank)
    wider = [d for d in range(rank) if d != axis and _exceeds(ishape[d], dshape[d])]
    if wider:
        raise c.fail(f"indices of shape {ishape} exceed data of shape {dshape} on axis {wider[0]}")
    strides = [math.prod(dshape[d + 1 :]) for d in range(rank)]
    others = [d for d in range(rank) if d != axis]
    n = dshape[axis]
    known = f.array(index)
    if known is not None:
        bad = (known < -n) | (known >= n)
        if np.any(bad):
            raise c.fail(f"index {int(known[bad].flat[0])} is out of range for axis {axis} of size {n}")
        f.check_size(ishape, "int64", "GatherElements' flat index")
        offsets = _static_offsets(ishape, strides, others, rank)
        flat: Operand = frozen(offsets + np.where(known < 0, known + n, known).astype(np.int64) * strides[axis])
    else:
        flat = _scaled(f, f.op("gather", f.arange(n), index, axis=0), strides[axis])
        flat = _plus_offsets(f, flat, ishape, strides, others, rank)
    column = f.op("reshape", data, shape=(math.prod(dshape),))
    return [f.op("gather", column, flat, axis=0, name=c.out())]


# ---------------------------------------------------------------- GatherND
@converter("GatherND")
def _gather_nd(c: NodeContext) -> list[Operand | None]:
    """``out[i..] = data[batch.., index[i.., :]..]`` as one ``gather`` from data
    flattened over its first ``batch_dims + k`` axes: the flat row is each index
    component (wrapped and range-checked by a gather from ``arange``, or folded when the
    indices are known at import) times its stride, plus the batch coordinates' constant
    offsets. The dynamo exporter emits it for transformers' attention masks."""
    f, data, index = c.f, c.input(0, "data"), c.input(1, "indices")
    dshape, ishape = f.shape(data), f.shape(index)
    if f.dtype(index) != "int64":
        raise c.fail(f"indices must be int64, got {f.dtype(index)}")
    b = int(c.attr("batch_dims", 0))
    if not ishape or not dshape:
        raise c.fail(f"data and indices need rank >= 1, got shapes {dshape} and {ishape}")
    k = ishape[-1]
    if b < 0 or b >= min(len(dshape), len(ishape)) or tuple(ishape[:b]) != tuple(dshape[:b]):
        raise c.fail(f"batch_dims {b} does not fit data {dshape} and indices {ishape}")
    if not 1 <= k <= len(dshape) - b:
        raise c.fail(f"indices' last dimension {k} must be in 1..{len(dshape) - b} for data of shape {dshape}")
    lead = dshape[: b + k]
    strides = [math.prod(lead[d + 1 :]) for d in range(b + k)]
    out_rank = len(ishape) - 1
    known = f.array(index)
    if known is not None:
        f.check_size(ishape[:-1], "int64", "GatherND's flat index")
        flat_np = _static_offsets(ishape[:-1], strides, range(b), out_rank)
        for j in range(k):
            n, col = dshape[b + j], known[..., j]
            bad = (col < -n) | (col >= n)
            if np.any(bad):
                raise c.fail(f"index {int(col[bad].flat[0])} is out of range for axis {b + j} of size {n}")
            flat_np += np.where(col < 0, col + n, col).astype(np.int64) * strides[b + j]
        flat: Operand = frozen(flat_np)
    else:
        flat = None
        for j in range(k):
            col = f.op("gather", index, f.const(j, "int64"), axis=len(ishape) - 1)
            pos = _scaled(f, f.op("gather", f.arange(dshape[b + j]), col, axis=0), strides[b + j])
            flat = pos if flat is None else f.op("add", flat, pos)
        flat = _plus_offsets(f, flat, ishape[:-1], strides, range(b), out_rank)
    rows = f.op("reshape", data, shape=(math.prod(lead), *dshape[b + k :]))
    return [f.op("gather", rows, flat, axis=0, name=c.out())]


# ---------------------------------------------------------------- Pad
_PAD_MODES = ("constant", "reflect", "edge", "wrap")


@converter("Pad")
def _pad(c: NodeContext) -> list[Operand | None]:
    """Pads known at import; per padded axis one ``gather`` by a constant index table
    (``numpy.pad`` of the positions: reflect, edge and wrap read the data there), and in
    constant mode one ``where`` that puts the value outside the data. Negative pads crop
    first (a ``slice``), as ONNX Runtime does; reflect needs, like it, pads no longer than
    the cropped axis minus one."""
    f, x = c.f, c.input(0)
    shape, dtype = f.shape(x), f.dtype(x)
    mode, axes, pads = _pad_arguments(c, len(shape))
    value = c.optional(2) if mode == "constant" else None
    if value is not None:
        if f.dtype(value) != dtype or math.prod(f.shape(value)) != 1:
            raise c.fail(f"constant_value must be one {dtype} value, got {f.shape(value)} {f.dtype(value)}")
        value = f.op("reshape", value, shape=())
    return [_padded(c, x, mode, axes, pads, value)]


@converter("CenterCropPad")
def _center_crop_pad(c: NodeContext) -> list[Operand | None]:
    """Each of ``axes`` (default all) cropped or padded with zeros to ``shape``, centred
    (an odd difference puts the extra element at the end): Pad with those (negative for a
    crop) pads."""
    f, x = c.f, c.input(0)
    shape = f.shape(x)
    target = c.ints(1, "shape")
    if target is None:
        raise c.fail("input shape is required")
    given = c.attr("axes")
    axes = [_axis(c, a, len(shape), "axes") for a in given] if given is not None else list(range(len(shape)))
    if len(target) != len(axes) or any(t < 0 for t in target):
        raise c.fail(f"shape {list(target)} must give one size >= 0 for each of the axes {axes}")
    if len(set(axes)) != len(axes):
        raise c.fail(f"axes {given} repeat an axis")
    before, after = [], []
    for a, t in zip(axes, target):
        d = abs(t - shape[a])  # to add (t larger) or cut: half before, the odd one after
        sign = 1 if t >= shape[a] else -1
        before.append(sign * (d // 2))
        after.append(sign * (d - d // 2))
    return [_padded(c, x, "constant", axes, before + after, None)]


def _padded(c: NodeContext, x: Operand, mode: str, axes: list[int], pads: list[int], value: Operand | None) -> Operand:
    """``x`` padded (negative pads crop) along ``axes`` in ``mode``; constant mode fills
    with ``value`` (a 0-d operand), or zeros without one."""
    f = c.f
    shape, dtype = f.shape(x), f.dtype(x)
    rank = len(shape)
    plan = _pad_plan(c, shape, mode, axes, pads)
    f.check_size(plan.out, dtype, "Pad's result")
    fill = value if value is not None else f.const(False if dtype == "bool" else 0, dtype)
    if plan.empty:
        return f.op("where", frozen(np.zeros(plan.out, dtype=bool)), fill, fill, name=c.out())
    y = x
    masked = mode == "constant" and bool(plan.tables)
    if plan.crops:
        cut = sorted(plan.crops)
        y = f.op("slice", y, starts=[plan.crops[a][0] for a in cut], ends=[plan.crops[a][1] for a in cut], axes=cut,
                 name="" if plan.tables else c.out())
    for axis in sorted(plan.tables):
        final = axis == max(plan.tables) and not masked
        y = f.op("gather", y, frozen(plan.tables[axis]), axis=axis, name=c.out() if final else "")
    if masked:
        mask = np.ones([plan.out[a] if a in plan.inside else 1 for a in range(rank)], dtype=bool)
        for axis, rows in plan.inside.items():
            mask = mask & _along(rows, axis, rank)
        y = f.op("where", frozen(mask), y, fill, name=c.out())
    return y


def _pad_arguments(c: NodeContext, rank: int) -> tuple[str, list[int], list[int]]:
    """``mode`` (checked against the opset), the padded ``axes`` (Pad-18's input, else
    all) and ``pads``, two per axis."""
    mode = c.attr("mode", "constant")
    if mode not in _PAD_MODES or (mode == "wrap" and c.opset < 19):
        known = _PAD_MODES if c.opset >= 19 else _PAD_MODES[:3]
        raise c.fail(f"mode {mode!r} is not one of {', '.join(known)} at opset {c.opset}")
    pads = c.ints(1, "pads")
    if pads is None:
        raise c.fail("input pads is required")
    if c.optional(3) is not None and c.opset < 18:
        raise c.fail(f"input axes is an input of Pad-18; the model's opset is {c.opset}")
    given = c.ints(3, "axes")
    axes = [_axis(c, a, rank, "axes") for a in given] if given is not None else list(range(rank))
    if len(set(axes)) != len(axes):
        raise c.fail(f"axes {given} repeat an axis")
    if len(pads) != 2 * len(axes):
        raise c.fail(f"pads has {len(pads)} values; {len(axes)} axes need {2 * len(axes)}")
    return mode, axes, list(pads)


@dataclass
class _PadPlan:
    """What each axis needs: ``crops`` (only cropped: a slice), ``tables`` (padded, maybe
    cropped too: a gather by these positions), ``inside`` (where the data lands on a
    padded axis, for constant mode's mask); ``empty`` when a constant pad has no data."""

    out: list[int]
    crops: dict[int, tuple[int, int]] = field(default_factory=dict)
    tables: dict[int, np.ndarray] = field(default_factory=dict)
    inside: dict[int, np.ndarray] = field(default_factory=dict)
    empty: bool = False


def _pad_plan(c: NodeContext, shape: tuple[int, ...], mode: str, axes: list[int], pads: list[int]) -> _PadPlan:
    plan = _PadPlan(list(shape))
    for i, axis in enumerate(axes):
        before, after = pads[i], pads[i + len(axes)]
        start, end = max(-before, 0), shape[axis] - max(-after, 0)
        if end < start:
            raise c.fail(f"pads {before}, {after} crop more than axis {axis} of size {shape[axis]}")
        kept, grow = end - start, (max(before, 0), max(after, 0))
        plan.out[axis] = kept + sum(grow)
        if not any(grow):
            if kept != shape[axis]:
                plan.crops[axis] = (start, end)
            continue
        if kept == 0:
            if mode == "constant":  # nothing to gather from: the result is all fill
                plan.empty = True
                continue
            emptied = " after cropping" if kept != shape[axis] else ""
            raise c.fail(f"cannot {mode}-pad axis {axis}: it is empty{emptied}")
        if mode == "reflect" and max(grow) > kept - 1:
            raise c.fail(f"reflect pads {grow} of axis {axis} exceed its size {kept} minus one")
        numpy_mode = "edge" if mode == "constant" else mode  # constant: any in-range index, masked below
        plan.tables[axis] = np.pad(np.arange(start, end, dtype=np.int64), grow, mode=numpy_mode)
        plan.inside[axis] = np.pad(np.ones(kept, dtype=bool), grow)
    return plan


# ---------------------------------------------------------------- Mod
def _float_mod(f: Emitter, a: Operand, b: Operand, floor: bool, name: str) -> Operand:
    """``a - n * b`` with ``n = trunc(a / b)`` (``floor`` for Python's rule), float16
    operands computed in float64, where every step is exact: |a / b| < 2**41, so the
    quotient's integer part survives rounding and the cast to int64, ``n * b`` fits 53
    bits, and the difference is the true remainder. Special cases as C ``fmod`` and
    Mod-28: NaN for infinite ``a``, zero ``b`` or a NaN; ``a`` for infinite ``b`` (Python:
    ``b`` when the signs differ); a zero result has the sign of ``a`` (Python: ``b``)."""
    dtype = f.dtype(a)
    wide = "float64"
    a, b = f.op("cast", a, dtype=wide), f.op("cast", b, dtype=wide)
    zero, nan = f.const(0.0, wide), f.const(np.nan, wide)
    q = f.op("div", a, b)
    finite = f.op("less", f.op("abs", q), f.const(2.0**62, wide))  # false: a inf, b zero, a NaN
    whole = f.op("cast", f.op("cast", f.op("where", finite, q, zero), dtype="int64"), dtype=wide)
    if floor:
        whole = f.op("where", f.op("less", q, whole), f.op("sub", whole, f.const(1.0, wide)), whole)
    r = f.op("sub", a, f.op("mul", whole, b))
    at_infinity = a
    if floor:
        at_infinity = f.op("where", f.op("less", f.op("mul", a, b), zero), b, a)
    r = f.op("where", f.op("equal", f.op("abs", b), f.const(np.inf, wide)), at_infinity, r)
    if floor:
        signed_zero = f.op("where", f.op("less", b, zero), f.const(-0.0, wide), zero)
    else:
        signed_zero = f.op("mul", a, zero)  # a is finite wherever the result is not NaN
    r = f.op("where", f.op("equal", r, zero), signed_zero, r)
    return f.op("cast", f.op("where", finite, r, nan), dtype=dtype, name=name)


def _fmod_floor(f: Emitter, a: Operand, b: Operand, name: str) -> Operand:
    """Python's ``a % b`` from C's ``r = fmod(a, b)``, as CPython and numpy compute it:
    ``r + b`` where ``r`` is nonzero and its sign differs from ``b``'s (exact: ``|r| <
    |b|`` with opposite signs), and a zero result takes the sign of ``b``. That gives
    Mod-28's special values too: NaN stays NaN (``fmod`` makes it for an infinite ``a``
    or a zero ``b``), and a finite ``a`` against an infinite ``b`` of the other sign
    gives ``b``."""
    dtype = f.dtype(a)
    zero = f.const(0, dtype)
    r = f.op("fmod", a, b)
    # r < 0 means b is nonzero and not NaN, so "b not negative" is b > 0; likewise for r > 0
    fix = f.op("where", f.op("less", r, zero), f.op("greater", b, zero),
               f.op("where", f.op("greater", r, zero), f.op("less", b, zero), f.const(False, "bool")))
    r = f.op("where", fix, f.op("add", r, b), r)
    signed_zero = f.op("where", f.op("less", b, zero), f.const(-0.0, dtype), zero)
    return f.op("where", f.op("equal", r, zero), signed_zero, r, name=name)


@converter("Mod")
def _mod(c: NodeContext) -> list[Operand | None]:
    """``fmod=0``: Python's ``%`` (the sign of the divisor), integers only before Mod-28;
    ``fmod=1``: C's ``fmod`` (the sign of the dividend), floats and, as ONNX Runtime
    reads it, integers. Folded with numpy when both operands are known at import (shape
    arithmetic); at run time integers are ``a - (a / b) * b`` with the IR's truncating
    division, plus ``b`` where Python's rule needs it (exact, overflow-free); float16
    goes through float64 exactly (``_float_mod``: ops every backend has); float32 and
    float64 use the IR's ``fmod`` op (``_fmod_floor`` for Python's rule)."""
    f, a, b = c.f, c.input(0), c.input(1)
    dtype = f.dtype(a)
    if f.dtype(b) != dtype:
        raise c.fail(f"operands have different dtypes {dtype} and {f.dtype(b)}")
    if dtype not in _FLOATS + _INTS:
        raise c.fail(f"needs numeric operands, got {dtype}")
    fmod = int(c.attr("fmod", 0))
    if fmod not in (0, 1):
        raise c.fail(f"fmod must be 0 or 1, got {fmod}")
    floating = dtype in _FLOATS
    if floating and not fmod and c.opset < 28:
        raise c.fail(f"fmod=0 needs integer operands before Mod-28 (opset {c.opset}); got {dtype}, "
                     "which needs fmod=1")
    xa, xb = f.array(a), f.array(b)
    if xa is not None and xb is not None:
        if not floating and np.any(xb == 0):
            raise c.fail("integer Mod by zero")
        f.check_size(np.broadcast_shapes(xa.shape, xb.shape), dtype, "the folded result of Mod")
        if floating:  # float64 holds every float16/float32 remainder exactly: one rounding, at the end
            xa, xb = xa.astype(np.float64), xb.astype(np.float64)
        with np.errstate(all="ignore"):
            return [frozen((np.fmod if fmod else np.mod)(xa, xb).astype(dtype))]
    if dtype == "float16":
        return [_float_mod(f, a, b, floor=not fmod, name=c.out())]
    if floating:
        if fmod:
            return [f.op("fmod", a, b, name=c.out())]
        return [_fmod_floor(f, a, b, c.out())]
    r = f.op("sub", a, f.op("mul", f.op("div", a, b), b), name=c.out() if fmod else "")
    if fmod:
        return [r]
    zero = f.const(0, dtype)
    wrong_sign = f.op("where", f.op("less", b, zero), f.op("greater", r, zero), f.op("less", r, zero))
    return [f.op("where", wrong_sign, f.op("add", r, b), r, name=c.out())]


# ---------------------------------------------------------------- TopK
#: TopK is unrolled, k rounds of a few ops each: beyond this many, the graph gets too big.
TOPK_MAX_K = 256


@converter("TopK")
def _topk(c: NodeContext) -> list[Operand | None]:
    """The ``K`` (an import-time input) largest (or smallest) along ``axis``, sorted, with
    their int64 positions, in ``K`` rounds: the extreme of what is left (a NaN counts as
    the extreme, as in ArgMax), its first position among the untaken ones, then that
    position is taken. Ties go to the lower index, as the spec asks; smallest maximizes
    ``Emitter.flip(x)`` (``-x``, or the integers' complement: no overflow)."""
    f, x = c.f, c.input(0)
    shape, dtype = _numeric_tensor(c, x)
    rank = len(shape)
    axis = _axis(c, int(c.attr("axis", -1)), rank)
    k, n = _scalar_input(c, 1, "K"), shape[axis]
    if not 0 <= k <= n:
        raise c.fail(f"K = {k} must be in 0..{n} (the length of axis {axis})")
    if k == 0:  # empty outputs (a detector's class with no candidate left)
        empty = tuple(0 if i == axis else d for i, d in enumerate(shape))
        return [f.const(np.zeros(empty, dtype), dtype), f.const(np.zeros(empty, np.int64), "int64")]
    if k > TOPK_MAX_K:  # run on the host between compiled parts (rlx_core/onnx/_staged.py)
        raise NeedsHost(f"K = {k} is over {TOPK_MAX_K}: rlx's ops unroll TopK, one round per value", c.out(0))
    largest = bool(c.attr("largest", 1))
    floats = dtype in _FLOATS
    v = x if largest else f.flip(x)
    lowest = f.const(-np.inf if floats else np.iinfo(dtype).min, dtype)
    positions = _along(np.arange(n, dtype=np.int64), axis, rank)
    taken: Operand | None = None
    values: list[Operand] = []
    indices: list[Operand] = []
    for i in range(k):
        m, hit = _extreme(f, v, axis, floats)
        if taken is not None:
            hit = f.op("where", taken, f.const(False, "bool"), hit)
        idx = _first(f, hit, axis, rank, n, True)
        values.append(m)
        indices.append(idx)
        if i + 1 < k:
            now = f.op("equal", positions, idx)
            taken = now if taken is None else f.op("where", now, f.const(True, "bool"), taken)
            v = f.op("where", now, lowest, v)
    vals = values[0] if k == 1 else f.op("concat", *values, axis=axis)
    if not largest:
        vals = f.flip(vals)
    idxs = indices[0] if k == 1 else f.op("concat", *indices, axis=axis)
    return [f.op("reshape", vals, shape=f.shape(vals), name=c.out(0)),
            f.op("reshape", idxs, shape=f.shape(idxs), name=c.out(1))]
