"""The ONNX ops whose output size depends on the data, run on the host (numpy).

``NonZero``, ``Unique`` and ``NonMaxSuppression`` make outputs that no shape rule can size
before they run; ``TopK`` runs here where rlx's ops cannot express it (a K too large to
unroll). rlx runs them between compiled stages (``rlx_core.ir.staged``): the
stage before computes what they read, they run here on the host, and the stage after is
built for the sizes they made. Each is written to the ONNX specification and checked
against ONNX's own node tests and onnxruntime: ties, empty outputs, and the optional
inputs left out.

``HOST_OPS[op](node)`` reads the node's attributes once (a ``ModelError`` for one it
cannot take) and returns the function that runs it: arrays in (``None`` for an optional
input left out), one array per output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from onnx import NodeProto, helper

from ..errors import ModelError

__all__ = ["HOST_OPS", "HOST_RUNS", "HostRun"]

#: Runs one node: its inputs (``None`` where an optional one is left out) to its outputs.
HostRun = Callable[[Sequence["np.ndarray | None"]], list[np.ndarray]]


def _attrs(node: NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _nonzero(node: NodeProto) -> HostRun:
    def run(args: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        x = _required(args, 0, "X")
        if x.ndim == 0:  # ONNX: [rank, count] with rank 0
            return [np.zeros((0, int(bool(x))), np.int64)]
        return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]

    return run


def _unique(node: NodeProto) -> HostRun:
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


def _non_max_suppression(node: NodeProto) -> HostRun:
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


def _select(lo: np.ndarray, hi: np.ndarray, scores: np.ndarray, most: int, iou: float,
            least: float | None) -> list[int]:
    """One class's kept boxes, best first: candidates above ``least`` in order of score
    (ties: the lower index first), each kept unless its IoU with a kept one is above
    ``iou``; at most ``most``.

    Each kept box is compared only with the candidates whose x extent can meet its own
    (a window of the candidates sorted by their left edge, no wider than the widest box),
    still in play and after it: torchvision's batched NMS puts every class's boxes in one
    call, offset so that classes never meet, so a square matrix of IoUs (or a comparison
    with every candidate) would be mostly wasted."""
    candidates = np.arange(scores.size) if least is None else np.nonzero(scores > scores.dtype.type(least))[0]
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    lo, hi = lo[order], hi[order]
    area = np.prod(hi - lo, axis=-1)
    limit = lo.dtype.type(iou)
    count = order.size
    alive = np.ones(count, bool)
    by_left = np.argsort(lo[:, 1], kind="stable")
    lefts = lo[by_left, 1]
    widest = np.max(hi[:, 1] - lo[:, 1]) if count else 0.0
    windowed = bool(np.isfinite(widest)) and not np.isnan(lefts).any()
    kept: list[int] = []
    i = 0
    while i < count and len(kept) < most:
        kept.append(int(order[i]))
        if windowed:
            start, stop = np.searchsorted(lefts, lo[i, 1] - widest, "right"), np.searchsorted(lefts, hi[i, 1], "left")
            window = by_left[start:stop]
            later = window[(window > i) & alive[window]]
        else:
            later = i + 1 + np.flatnonzero(alive[i + 1:])
        if later.size:
            inter_lo, inter_hi = np.maximum(lo[i], lo[later]), np.minimum(hi[i], hi[later])
            overlap = np.all(inter_hi > inter_lo, axis=-1)
            inter = np.prod(inter_hi - inter_lo, axis=-1)
            union = area[i] + area[later] - inter
            with np.errstate(divide="ignore", invalid="ignore"):
                gone = overlap & (inter > 0) & (area[i] > 0) & (area[later] > 0) & (union > 0) & (inter / union > limit)
            alive[later[gone]] = False
        i += 1
        while i < count and not alive[i]:
            i += 1
    return kept


def _topk(node: NodeProto) -> HostRun:
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
HOST_OPS: dict[str, Callable[[NodeProto], HostRun]] = {
    "NonZero": _nonzero,
    "Unique": _unique,
    "NonMaxSuppression": _non_max_suppression,
}
#: Every op the host runs: those above, and those run there only where rlx's ops cannot
#: express a node (its converter raises ``NeedsHost``).
HOST_RUNS: dict[str, Callable[[NodeProto], HostRun]] = {**HOST_OPS, "TopK": _topk}
