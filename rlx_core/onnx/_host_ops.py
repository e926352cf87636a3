"""The ONNX ops whose output size depends on the data, run on the host (numpy).

``NonZero``, ``Unique`` and ``NonMaxSuppression`` make outputs that no shape rule can size
before they run; ``RoiAlign`` (the two-stage detectors' pooling of each proposal) has no rlx
op; ``Det`` needs a pivoting factorization (LU), which no rlx op is, and runs numpy's, the
one ONNX's reference runs; ``TopK`` runs here where rlx's ops cannot express it (a K too
large to unroll). rlx runs them between compiled stages (``rlx_core.ir.staged``): the
stage before computes what they read, they run here on the host, and the stage after is
built for the sizes they made. Each is written to the ONNX specification and checked
against ONNX's own node tests and onnxruntime: ties, empty outputs, and the optional
inputs left out.

``HOST_OPS[op](node, opset)`` reads the node's attributes once (a ``ModelError`` for one it
cannot take) and returns the function that runs it: arrays in (``None`` for an optional
input left out), one array per output.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
from onnx import GraphProto, NodeProto, helper

from ..errors import ModelError

__all__ = ["HOST_OPS", "HOST_RUNS", "HostRun", "held_in"]

#: Runs one node: its inputs (``None`` where an optional one is left out) to its outputs.
HostRun = Callable[[Sequence["np.ndarray | None"]], list[np.ndarray]]


def _attrs(node: NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _nonzero(node: NodeProto, opset: int) -> HostRun:
    def run(args: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        x = _required(args, 0, "X")
        if x.ndim == 0:  # ONNX: [rank, count] with rank 0
            return [np.zeros((0, int(bool(x))), np.int64)]
        return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]

    return run


def _unique(node: NodeProto, opset: int) -> HostRun:
    attrs = _attrs(node)
    axis = attrs.get("axis")
    keep_sorted = int(attrs.get("sorted", 1))  # type: ignore[call-overload]

    def run(args: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        x = _required(args, 0, "X")
        if axis is None:
            flat, along = x.reshape(-1), 0
        else:
            along = int(axis)  # type: ignore[call-overload]
            if not -x.ndim <= along < x.ndim:
                raise ValueError(f"axis {along} is out of range for an input of rank {x.ndim}")
            flat, along = x, along % x.ndim
        y, first, inverse, counts = np.unique(flat, return_index=True, return_inverse=True, return_counts=True,
                                              axis=None if axis is None else along)
        inverse = inverse.reshape(-1)
        if not keep_sorted:  # in order of first occurrence
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            y, first, counts, inverse = np.take(y, order, axis=along), first[order], counts[order], rank[inverse]
        return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]

    return run


def _non_max_suppression(node: NodeProto, opset: int) -> HostRun:
    center = int(_attrs(node).get("center_point_box", 0))  # type: ignore[call-overload]
    if center not in (0, 1):
        raise ModelError(f"center_point_box must be 0 or 1, got {center}")

    def run(args: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        boxes, scores = _required(args, 0, "boxes"), _required(args, 1, "scores")
        if boxes.ndim != 3 or boxes.shape[2] != 4:
            raise ValueError(f"boxes must be [batches, boxes, 4], got {list(boxes.shape)}")
        if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
            raise ValueError(f"scores must be [batches, classes, boxes] = [{boxes.shape[0]}, classes, "
                             f"{boxes.shape[1]}], got {list(scores.shape)}")
        most = _scalar(args, 2, 0)
        iou = _scalar(args, 3, 0.0)
        least = _scalar(args, 4, None)
        found: list[tuple[int, int, int]] = []
        if most > 0:
            lo, hi = _corners(boxes, center)
            for b in range(boxes.shape[0]):
                for c in range(scores.shape[1]):
                    kept = _select(lo[b], hi[b], scores[b, c], int(most), iou, least)
                    found.extend((b, c, int(i)) for i in kept)
        return [np.array(found, dtype=np.int64).reshape(-1, 3)]

    return run


def _corners(boxes: np.ndarray, center: int) -> tuple[np.ndarray, np.ndarray]:
    """Each box's (y, x) minimum and maximum corners, in the boxes' dtype."""
    if center:
        half = np.stack([boxes[..., 3], boxes[..., 2]], -1) / boxes.dtype.type(2)
        mid = np.stack([boxes[..., 1], boxes[..., 0]], -1)
        return mid - half, mid + half
    first, second = boxes[..., 0:2], boxes[..., 2:4]
    return np.minimum(first, second), np.maximum(first, second)


#: Boxes of one group (a set whose x extents chain together) past which the greedy pass
#: compares each kept box with a window of candidates instead of a square matrix of IoUs.
_MATRIX_GROUP = 2048


def _select(lo: np.ndarray, hi: np.ndarray, scores: np.ndarray, most: int, iou: float,
            least: float | None) -> list[int]:
    """One class's kept boxes, best first: candidates above ``least`` in order of score
    (ties: the lower index first), each kept unless its IoU with a kept one is above
    ``iou``; at most ``most``.

    Boxes whose x extents do not chain together never suppress each other, so the
    candidates are split into such groups (torchvision's batched NMS offsets every class
    into one call: a group per class) and each is settled on its own, a small group by
    a fixed point over its matrix of suppressions (no Python step per box), a large one
    greedily against a window of candidates."""
    candidates = np.arange(scores.size) if least is None else np.nonzero(scores > scores.dtype.type(least))[0]
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    lo, hi = lo[order], hi[order]
    count = order.size
    if count == 0 or most <= 0:
        return []
    area = np.prod(hi - lo, axis=-1)
    limit = lo.dtype.type(iou)
    by_left = np.argsort(lo[:, 1], kind="stable")
    lefts = lo[by_left, 1]
    if np.isnan(lo).any() or np.isnan(hi).any():  # no ordering to group by: one group
        group = np.zeros(count, np.int64)
    else:
        reach = np.maximum.accumulate(hi[by_left, 1])
        group = np.empty(count, np.int64)
        group[by_left] = np.concatenate([[0], np.cumsum(lefts[1:] >= reach[:-1])])
    keep = np.ones(count, bool)
    sizes = np.bincount(group)
    for g in np.flatnonzero(sizes > 1):
        members = np.flatnonzero(group == g)  # ascending: in order of score
        if members.size <= _MATRIX_GROUP:
            keep[members] = _settle(lo[members], hi[members], area[members], limit)
        else:
            keep[members] = _greedy(lo[members], hi[members], area[members], limit)
    return [int(i) for i in order[np.flatnonzero(keep)[:most]]]


def _suppresses(lo_a: np.ndarray, hi_a: np.ndarray, area_a: np.ndarray, lo_b: np.ndarray, hi_b: np.ndarray,
                area_b: np.ndarray, limit: np.floating) -> np.ndarray:
    """Whether box a (rows) suppresses box b (columns), as the spec computes IoU: no
    overlap, a degenerate box or a zero union never suppress; else IoU above ``limit``."""
    low_y, high_y = np.maximum(lo_a[:, None, 0], lo_b[None, :, 0]), np.minimum(hi_a[:, None, 0], hi_b[None, :, 0])
    low_x, high_x = np.maximum(lo_a[:, None, 1], lo_b[None, :, 1]), np.minimum(hi_a[:, None, 1], hi_b[None, :, 1])
    overlap = (high_y > low_y) & (high_x > low_x)
    inter = (high_y - low_y) * (high_x - low_x)
    union = area_a[:, None] + area_b[None] - inter
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (overlap & (inter > 0) & (area_a[:, None] > 0) & (area_b[None] > 0) & (union > 0)
                & (inter / union > limit))


def _settle(lo: np.ndarray, hi: np.ndarray, area: np.ndarray, limit: np.floating) -> np.ndarray:
    """Which boxes (in order of score) greedy NMS keeps: box i is kept unless a kept box
    before it suppresses it. Iterated from "all kept" to its fixed point: after t rounds
    the first t boxes are settled, and the equations have one solution, so the first
    round that changes nothing has found it (rounds: the longest chain of suppressions)."""
    n = lo.shape[0]
    sup = np.triu(_suppresses(lo, hi, area, lo, hi, area, limit), 1)
    keep = np.ones(n, bool)
    for _ in range(n):
        new = ~np.any(sup & keep[:, None], axis=0)
        if np.array_equal(new, keep):
            break
        keep = new
    return keep


def _greedy(lo: np.ndarray, hi: np.ndarray, area: np.ndarray, limit: np.floating) -> np.ndarray:
    """``_settle`` for a large group: box by box in order of score, each kept box compared
    with the candidates after it still in play whose left edge lies within the widest box
    of its own (a window of the candidates sorted by left edge)."""
    n = lo.shape[0]
    by_left = np.argsort(lo[:, 1], kind="stable")
    lefts = lo[by_left, 1]
    widest = np.max(hi[:, 1] - lo[:, 1])
    alive = np.ones(n, bool)
    i = 0
    while i < n:
        start, stop = np.searchsorted(lefts, lo[i, 1] - widest, "right"), np.searchsorted(lefts, hi[i, 1], "left")
        window = by_left[start:stop]
        later = window[(window > i) & alive[window]]
        if later.size:
            gone = _suppresses(lo[i:i + 1], hi[i:i + 1], area[i:i + 1], lo[later], hi[later], area[later], limit)[0]
            alive[later[gone]] = False
        i += 1
        while i < n and not alive[i]:
            i += 1
    return alive


def _topk(node: NodeProto, opset: int) -> HostRun:
    """TopK where the ops cannot express it (a K too large to unroll): sorted, ties to
    the lower index, as the spec asks; a NaN counts as the largest."""
    attrs = _attrs(node)
    axis, largest = int(attrs.get("axis", -1)), int(attrs.get("largest", 1))  # type: ignore[call-overload]

    def run(args: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        x, k = _required(args, 0, "X"), _scalar(args, 1, None)
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"axis {axis} is out of range for an input of rank {x.ndim}")
        along = axis % x.ndim
        n = x.shape[along]
        if k is None or not 0 <= int(k) <= n:
            raise ValueError(f"K = {k} must be in 0..{n} (the length of axis {along})")
        if largest:  # descending, ties to the lower index: a stable ascending sort of the reversed axis, reversed
            order = n - 1 - np.flip(np.argsort(np.flip(x, along), axis=along, kind="stable"), along)
        else:
            order = np.argsort(x, axis=along, kind="stable")
        index = np.take(order, np.arange(int(k)), axis=along)
        return [np.take_along_axis(x, index, along), index.astype(np.int64)]

    return run


def _det(node: NodeProto, opset: int) -> HostRun:
    """Det: the determinant of each matrix in the last two axes, by numpy's LU (partial
    pivoting) in float64, as ONNX's reference computes it (``numpy.linalg`` works in
    float64 for float32 too), cast back to the input's dtype; float16 and bfloat16, which
    ``numpy.linalg`` refuses, the same way."""

    def run(args: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        x = _required(args, 0, "X")
        if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
            raise TypeError(f"X must hold floats, got {x.dtype}")
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise ValueError(f"X must be [*, M, M], got {list(x.shape)}")
        return [np.asarray(np.linalg.det(x.astype(np.float64))).astype(x.dtype)]

    return run


def _roi_align(node: NodeProto, opset: int) -> HostRun:
    """RoiAlign, average or max: each region's bins sampled on a grid (``sampling_ratio``,
    or adaptive), each sample bilinear. Average pooling is separable, so a region's output
    is ``A @ X @ B.T`` per channel, ``A`` and ``B`` the sampling weights along y and x
    (samples outside the map weigh nothing), over the window of the map its samples touch
    (a region of a detector reads a few cells of an 80x80 map); max pooling gathers every
    sample."""
    attrs = _attrs(node)
    mode = _text(attrs.get("mode", b"avg"))
    default = "half_pixel" if opset >= 16 else "output_half_pixel"
    transform = _text(attrs.get("coordinate_transformation_mode", default))
    out_h, out_w = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))  # type: ignore[call-overload]
    ratio = int(attrs.get("sampling_ratio", 0))  # type: ignore[call-overload]
    scale = float(attrs.get("spatial_scale", 1.0))  # type: ignore[arg-type]
    if mode not in ("avg", "max") or transform not in ("half_pixel", "output_half_pixel"):
        raise ModelError(f"mode {mode!r} / coordinate_transformation_mode {transform!r} is not one of avg/max, "
                         "half_pixel/output_half_pixel")
    if out_h < 1 or out_w < 1 or ratio < 0:
        raise ModelError(f"output {out_h}x{out_w} and sampling_ratio {ratio} must be positive (ratio 0: adaptive)")
    offset = 0.5 if transform == "half_pixel" else 0.0

    def run(args: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        x, rois, index = _required(args, 0, "X"), _required(args, 1, "rois"), _required(args, 2, "batch_indices")
        if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or index.shape != (rois.shape[0],):
            raise ValueError(f"X must be [N, C, H, W], rois [R, 4] and batch_indices [R], got {list(x.shape)}, "
                             f"{list(rois.shape)}, {list(index.shape)}")
        if index.size and (index.min() < 0 or index.max() >= x.shape[0]):
            raise ValueError(f"batch_indices must be in 0..{x.shape[0] - 1}")
        _, channels, height, width = x.shape
        r = rois.astype(np.float64) * scale - offset
        size = r[:, 2:] - r[:, :2]  # (width, height)
        if transform != "half_pixel":
            size = np.maximum(size, 1.0)
        grids = np.full((len(r), 2), ratio) if ratio else np.ceil(size[:, ::-1] / (out_h, out_w)).astype(int)
        out = np.empty((len(r), channels, out_h, out_w), x.dtype)
        for k in range(len(r)):  # per region: its grid may differ (adaptive), and it reads a small window
            gh, gw = int(grids[k, 0]), int(grids[k, 1])
            fmap = x[index[k]]
            if mode == "max":
                out[k] = _roi_max(fmap, r[k], size[k], out_h, out_w, gh, gw)
                continue
            rows = _axis_weights(r[k, 1], size[k, 1] / out_h, out_h, gh, height)
            cols = _axis_weights(r[k, 0], size[k, 0] / out_w, out_w, gw, width)
            (y0, y1), (x0, x1) = _span(rows), _span(cols)
            window = fmap[:, y0:y1, x0:x1].astype(np.float64)  # [C, h, w]: what the samples touch
            pooled = np.matmul(np.matmul(rows[:, y0:y1], window), cols[:, x0:x1].T)  # [C, out_h, out_w]
            out[k] = pooled / max(gh * gw, 1)
        return [out]

    return run


def _span(weights: np.ndarray) -> tuple[int, int]:
    """The positions with any weight, as a slice's bounds (empty: 0, 0)."""
    used = np.flatnonzero(np.any(weights != 0, axis=0))
    return (int(used[0]), int(used[-1]) + 1) if used.size else (0, 0)


def _samples(start: float, bin_size: float, bins: int, grid: int, length: int) -> tuple[np.ndarray, ...]:
    """Each bin's ``grid`` sample positions along one axis, as the spec places them:
    ([bins, grid] each) the lower and upper neighbour, the upper one's weight, and whether
    the sample lies on the map at all (one past an edge reads the edge)."""
    at = start + np.arange(bins)[:, None] * bin_size + (np.arange(grid)[None] + 0.5) * bin_size / grid
    inside = (at >= -1.0) & (at <= length)
    at = np.maximum(at, 0.0)
    edge = at.astype(np.int64) >= length - 1
    low = np.minimum(at.astype(np.int64), length - 1)
    high = np.where(edge, low, low + 1)
    frac = np.where(edge, 0.0, at - low)
    return low, high, frac, inside


def _axis_weights(start: float, bin_size: float, bins: int, grid: int, length: int) -> np.ndarray:
    """[bins, length]: how much each position along one axis weighs in each bin, summed
    over the bin's ``grid`` samples (the spec's bilinear weights, 0 outside the map)."""
    weights = np.zeros((bins, length))
    if grid < 1:
        return weights
    low, high, frac, inside = _samples(start, bin_size, bins, grid, length)
    rows = np.broadcast_to(np.arange(bins)[:, None], low.shape)
    np.add.at(weights, (rows[inside], low[inside]), (1.0 - frac)[inside])
    np.add.at(weights, (rows[inside], high[inside]), frac[inside])
    return weights


def _roi_max(fmap: np.ndarray, roi: np.ndarray, size: np.ndarray, out_h: int, out_w: int, gh: int,
             gw: int) -> np.ndarray:
    """One region's max pooling: the largest of every sample's four weighted corners
    (as the spec writes it), per bin."""
    channels, height, width = fmap.shape
    out = np.zeros((channels, out_h, out_w), fmap.dtype)
    if gh < 1 or gw < 1:
        return out
    yl, yh, fy, iny = (a.reshape(-1) for a in _samples(roi[1], size[1] / out_h, out_h, gh, height))
    xl, xh, fx, inx = (a.reshape(-1) for a in _samples(roi[0], size[0] / out_w, out_w, gw, width))
    ok = (iny[:, None] & inx[None]).astype(fmap.dtype)
    corners = [((1 - fy)[:, None] * (1 - fx)[None], yl, xl), ((1 - fy)[:, None] * fx[None], yl, xh),
               (fy[:, None] * (1 - fx)[None], yh, xl), (fy[:, None] * fx[None], yh, xh)]
    vals = np.max(np.stack([w.astype(fmap.dtype) * ok * fmap[:, ys][:, :, xs] for w, ys, xs in corners]), axis=0)
    return vals.reshape(channels, out_h, gh, out_w, gw).max(axis=(2, 4))


def _grid_sample(node: NodeProto, opset: int) -> HostRun:
    """GridSample (2-D and 3-D): each output point reads the input at the grid's
    normalized coordinates, nearest, (bi/tri)linear or cubic, with zeros, border or
    reflection padding applied to each tap's index per axis, as onnxruntime and torch do
    (the spec's reference first clamps or reflects a coordinate past the border, which
    differs for cubic taps there); coordinates in float32, the taps' weights separable (a
    product of one coefficient per axis)."""
    attrs = _attrs(node)
    mode = attrs.get("mode", b"bilinear" if opset < 20 else b"linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(_text(mode), _text(mode))
    padding = _text(attrs.get("padding_mode", b"zeros"))
    corners = bool(attrs.get("align_corners", 0))
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise ModelError(f"mode {mode!r} / padding_mode {padding!r} is not one of nearest/linear/cubic, "
                         "zeros/border/reflection")

    def run(args: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        x, grid = _required(args, 0, "X"), _required(args, 1, "grid")
        k = x.ndim - 2
        if k < 1 or grid.ndim != k + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != k:
            raise ValueError(f"X [N, C, *spatial] and grid [N, *out, {max(k, 1)}] do not fit: {list(x.shape)}, "
                             f"{list(grid.shape)}")
        dims = x.shape[2:]
        lows = np.array([0.0 if corners else -0.5] * k)
        highs = np.array([d - 1.0 if corners else d - 0.5 for d in dims])
        at = np.empty(grid.shape, np.float32)  # [N, *out, k], in the input's axis order
        for i, d in enumerate(dims):
            g = grid[..., k - 1 - i].astype(np.float32)
            at[..., i] = (g + 1) / np.float32(2) * np.float32(d - 1) if corners else \
                ((g + 1) * np.float32(d) - 1) / np.float32(2)
        if mode == "nearest":
            at = np.rint(at)
        taps: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = []  # per axis: (index, valid, weight)
        for i, d in enumerate(dims):
            v = at[..., i]
            if mode == "nearest":
                offsets, base, weights = [0], v.astype(np.int64), [np.ones_like(v)]
            else:
                base = np.floor(v).astype(np.int64)
                t = v - base.astype(np.float32)
                offsets, weights = ([0, 1], _linear(t)) if mode == "linear" else ([-1, 0, 1, 2], _cubic(t))
            taps.append([(*_pixel_index(base + o, d, lows[i], highs[i], padding), w)
                         for o, w in zip(offsets, weights)])
        n, c = x.shape[:2]
        flat = x.reshape(n, c, -1).astype(np.float64)
        strides = [int(np.prod(dims[i + 1:])) for i in range(k)]
        out = np.zeros((n, c, *grid.shape[1:-1]))
        for combo in itertools.product(*taps):
            index = sum(t[0] * s for t, s in zip(combo, strides))
            valid = np.logical_and.reduce([t[1] for t in combo])
            weight = np.prod([t[2].astype(np.float64) for t in combo], axis=0) * valid
            picked = np.take_along_axis(flat, index.reshape(n, 1, -1), axis=2)
            out += (picked * weight.reshape(n, 1, -1)).reshape(out.shape)
        return [out.astype(x.dtype)]

    return run


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reflect(v: np.ndarray, low: float, high: float) -> np.ndarray:
    """Coordinates reflected by the near border until inside [low, high] (float64)."""
    span = high - low
    below, above = v < low, v > high
    dist = np.where(below, low - v, np.where(above, v - high, 0.0))
    folds = np.floor(dist / span) if span > 0 else np.zeros_like(dist)
    rest = dist - folds * span
    even = folds % 2 == 0
    return np.where(below, np.where(even, low + rest, high - rest),
                    np.where(above, np.where(even, high - rest, low + rest), v))


def _pixel_index(i: np.ndarray, d: int, low: float, high: float, padding: str) -> tuple[np.ndarray, np.ndarray]:
    """A tap's index along one axis as the padding maps it, clipped into range, and
    whether it reads the input (zeros padding: a tap outside reads 0)."""
    if padding == "zeros":
        return np.clip(i, 0, d - 1), (i >= 0) & (i < d)
    if padding == "reflection":
        i = np.trunc(_reflect(i.astype(np.float64), low, high)).astype(np.int64)
    return np.clip(i, 0, d - 1), np.ones(i.shape, bool)


def _linear(t: np.ndarray) -> list[np.ndarray]:
    t = np.abs(t)
    return [1 - t, t]


def _cubic(t: np.ndarray) -> list[np.ndarray]:
    """Keys' cubic convolution coefficients (alpha -0.75) of the four taps around ``t``."""
    a = np.float32(-0.75)
    t = np.abs(t)
    near = [t + 1, t, 1 - t, 2 - t]
    return [((a * u - 5 * a) * u + 8 * a) * u - 4 * a if j in (0, 3) else ((a + 2) * u - (a + 3)) * u * u + 1
            for j, u in enumerate(near)]


def _required(args: Sequence[np.ndarray | None], index: int, name: str) -> np.ndarray:
    arg = args[index] if index < len(args) else None
    if arg is None:
        raise ValueError(f"input {index} ({name}) is required")
    return arg


def _scalar(args: Sequence[np.ndarray | None], index: int, default: float | None) -> float | None:
    """An optional scalar input (a 1-element tensor), or ``default`` when left out or empty."""
    arg = args[index] if index < len(args) else None
    if arg is None or arg.size == 0:
        return default
    if arg.size != 1:
        raise ValueError(f"input {index} must hold one value, got {arg.size}")
    return arg.reshape(-1)[0].item()


#: The ops always run on the host, each from its node to the function that runs it.
HOST_OPS: dict[str, Callable[[NodeProto, int], HostRun]] = {
    "NonZero": _nonzero,
    "Unique": _unique,
    "NonMaxSuppression": _non_max_suppression,
    "RoiAlign": _roi_align,
    "GridSample": _grid_sample,
    "Det": _det,
}
#: Every op the host runs: those above, and those run there only where rlx's ops cannot
#: express a node (its converter raises ``NeedsHost``).
HOST_RUNS: dict[str, Callable[[NodeProto, int], HostRun]] = {**HOST_OPS, "TopK": _topk}


def held_in(graph: GraphProto | None) -> list[str]:
    """The op types of ``graph``'s nodes (a branch, a loop body) that always run on the
    host, sorted: such a subgraph is spliced in or run from the host, never converted."""
    return sorted({n.op_type for n in graph.node if n.op_type in HOST_OPS}) if graph is not None else []
