"""The ``Resize`` converter (opsets 11-19): nearest, linear and cubic, every coordinate
transformation, axes, aspect-ratio policies and antialiasing.

Resizing is separable: each resized axis maps every output position to a few input
positions with fixed weights, and all of that depends on shapes only, which rlx knows
at import. So each axis becomes, at import, a table of input indices (out, taps) and of
weights (out, taps), computed here in float64; at run time it is one ``gather`` per tap
and a weighted sum (nearest: one ``gather``, its weights being one-hot). Axes are
resized one after another in the order ONNX's reference does. Indices outside the input
read its edge (the spec's edge padding); ``tf_crop_and_resize`` positions outside the
input take ``extrapolation_value``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..ir.dtypes import FLOAT_DTYPES
from ._context import NodeContext, converter
from ._ops_indexing import _along
from ._shapes import Emitter, Operand, frozen

__all__: list[str] = []

_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                     "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
Coeffs = Callable[[float, float], np.ndarray]


# ---------------------------------------------------------------- the 1-D kernels
def _nearest(mode: str) -> Coeffs:
    """Weights of the two pixels around a position ``ratio`` past the left one: one-hot."""

    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        right = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False,
                 "ceil": True}[mode]
        return np.array([0.0, 1.0]) if right else np.array([1.0, 0.0])

    return coeffs


def _linear(antialias: bool) -> Coeffs:
    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([1.0 - ratio, ratio])
        s = min(scale, 1.0)  # antialiasing widens the kernel when downsampling only
        start = math.floor(-1.0 / s) + 1
        taps = (np.arange(start, 2 - start) - ratio) * s
        w = np.clip(1.0 - np.abs(taps), 0.0, 1.0)
        return w / w.sum()

    return coeffs


def _cubic_weight(x: float, a: float) -> float:
    x = abs(x)
    if x <= 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    if x < 2.0:
        return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return 0.0


def _cubic(a: float, antialias: bool) -> Coeffs:
    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([_cubic_weight(d, a) for d in (ratio + 1.0, ratio, 1.0 - ratio, 2.0 - ratio)])
        s = min(scale, 1.0)
        start = math.floor(-2.0 / s) + 1
        w = np.array([_cubic_weight(s * (i - ratio), a) for i in range(start, 2 - start)])
        return w / w.sum()

    return coeffs


# ---------------------------------------------------------------- one axis
def _positions(mode: str, n_in: int, n_out: int, scale: float, roi: tuple[float, float] | None) -> np.ndarray:
    """Where each output position samples the input, in input coordinates (float64)."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in  # the output's length before rounding
    if mode == "align_corners":
        return np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        assert roi is not None
        start, end = roi
        span = (end - start) * (n_in - 1)
        x = np.full(n_out, span / 2) if width == 1 else y * span / (width - 1)
        return x + start * (n_in - 1)
    if mode == "pytorch_half_pixel":
        return np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5
    return (y + 0.5) / scale - 0.5  # half_pixel


def _axis_table(n_in: int, n_out: int, scale: float, kernel: Coeffs, mode: str, roi: tuple[float, float] | None,
                exclude_outside: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Input indices (n_out, taps), their weights (n_out, taps) and, for
    ``tf_crop_and_resize``, which outputs fall outside the input."""
    x = _positions(mode, n_in, n_out, scale, roi)
    left = np.floor(x)
    ratios = np.where(x == left, 1.0, x - left)  # an exact pixel counts as 1 past its left neighbour
    weights = np.stack([kernel(float(r), scale) for r in ratios])
    taps = weights.shape[1]
    # The `taps` pixels nearest to x (ties to the left), as the spec picks them.
    pad = math.ceil(taps / 2)
    shifted = x + pad
    base = np.floor(shifted)
    frac = shifted - base
    if taps % 2 == 0:
        first = base + np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        first = base + np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    index = (first[:, None] + np.arange(taps)[None, :] - pad).astype(np.int64)
    if exclude_outside:
        weights = np.where((index < 0) | (index >= n_in), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    outside = ((x < 0) | (x > n_in - 1)) if mode == "tf_crop_and_resize" else None
    return np.clip(index, 0, n_in - 1), weights, outside


def _resize_axis(f: Emitter, x: Operand, axis: int, table: tuple[np.ndarray, np.ndarray, np.ndarray | None],
                 nearest: bool, fill: float) -> Operand:
    index, weights, outside = table
    rank, dtype = len(f.shape(x)), f.dtype(x)
    if nearest:  # one-hot weights: the chosen pixel
        picked = index[np.arange(index.shape[0]), np.argmax(weights, axis=1)]
        out = f.op("gather", x, frozen(picked.astype(np.int64)), axis=axis)
    else:
        out = None
        for t in range(weights.shape[1]):
            w = weights[:, t]
            if not np.any(w):
                continue
            term = f.op("gather", x, frozen(index[:, t].astype(np.int64)), axis=axis)
            if not np.all(w == 1.0):
                term = f.op("mul", term, _along(w.astype(dtype), axis, rank))
            out = term if out is None else f.op("add", out, term)
        assert out is not None
    if outside is not None and np.any(outside):
        out = f.op("where", _along(outside, axis, rank), f.const(fill, dtype), out)
    return out


# ---------------------------------------------------------------- the converter
def _present(c: NodeContext, i: int, what: str) -> np.ndarray | None:
    """An optional import-time input; an empty tensor counts as left out (exporters write '')."""
    arr = c.static(i, what)
    return None if arr is None or arr.size == 0 else arr


@converter("Resize")
def _resize(c: NodeContext) -> list[Operand | None]:
    """ONNX ``Resize``, one axis at a time (``_resize_axis``): the attributes checked, the
    output size and scale per axis worked out, then each axis that changes resized."""
    f, x = c.f, c.input(0, "X")
    shape, dtype = f.shape(x), f.dtype(x)
    rank = len(shape)
    mode, coord, nearest_mode, antialias = _modes(c, dtype)
    axes = _axes(c, rank)
    factor, out_shape = _target(c, shape, axes)
    rois = _rois(c, coord, axes, rank)
    f.check_size(tuple(out_shape), dtype, "Resize's output")
    kernel = _kernel(c, mode, nearest_mode, antialias)
    work = x if dtype != "float16" else f.op("cast", x, dtype="float32")  # weighted sums in float32
    fill = float(c.attr("extrapolation_value", 0.0))
    for a in axes:
        trivial = rois[a] is None or (math.isclose(rois[a][0], 0.0) and math.isclose(rois[a][1], 1.0))
        if math.isclose(factor[a], 1.0) and out_shape[a] == shape[a] and trivial:
            continue
        if out_shape[a] == 0 or shape[a] == 0:
            raise c.fail(f"axis {a}: cannot resize {shape[a]} to {out_shape[a]} positions")
        exclude = bool(c.attr("exclude_outside", 0))
        table = _axis_table(shape[a], out_shape[a], factor[a], kernel, coord, rois[a], exclude)
        work = _resize_axis(f, work, a, table, mode == "nearest", fill)
    if work is x:
        return [f.op("reshape", x, shape=shape, name=c.out())]  # a resize that changes nothing
    if dtype == "float16":
        return [f.op("cast", work, dtype="float16", name=c.out())]
    return [f.op("reshape", work, shape=tuple(out_shape), name=c.out())]


def _modes(c: NodeContext, dtype: str) -> tuple[str, str, str, bool]:
    """``mode``, ``coordinate_transformation_mode``, ``nearest_mode`` and ``antialias``,
    each checked against what this converter computes (and the opset that has it)."""
    mode = c.attr("mode", "nearest")
    coord = c.attr("coordinate_transformation_mode", "half_pixel")
    nearest_mode = c.attr("nearest_mode", "round_prefer_floor")
    antialias = bool(c.attr("antialias", 0))
    if mode not in ("nearest", "linear", "cubic"):
        raise c.fail(f"mode {mode!r} is not one of nearest, linear, cubic")
    if coord not in _COORDINATE_MODES or (coord == "half_pixel_symmetric" and c.opset < 19):
        raise c.fail(f"coordinate_transformation_mode {coord!r} is not supported at opset {c.opset}")
    if mode == "nearest" and (nearest_mode not in _NEAREST_MODES or antialias):
        raise c.fail(f"nearest_mode {nearest_mode!r} (antialias {int(antialias)}) is not supported")
    if mode != "nearest" and dtype not in FLOAT_DTYPES:
        raise c.fail(f"{mode} interpolation needs a float input, got {dtype}")
    return mode, coord, nearest_mode, antialias


def _axes(c: NodeContext, rank: int) -> list[int]:
    """The ``axes`` resized (all by default), distinct and made non-negative."""
    axes = list(c.attr_ints("axes") or range(rank))
    if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
        raise c.fail(f"axes {axes} are not distinct axes of a rank-{rank} input")
    return [a % rank for a in axes]


def _target(c: NodeContext, shape: tuple[int, ...], axes: list[int]) -> tuple[list[float], list[int]]:
    """The scale and output size of every axis, from exactly one of ``scales`` and
    ``sizes`` (``sizes`` under ``keep_aspect_ratio_policy``)."""
    policy = c.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise c.fail(f"keep_aspect_ratio_policy {policy!r} is not supported")
    scales, sizes = _present(c, 2, "scales"), _present(c, 3, "sizes")
    if (scales is None) == (sizes is None):
        raise c.fail("exactly one of scales and sizes must be given")
    given = scales if scales is not None else sizes
    assert given is not None
    if given.size != len(axes):
        raise c.fail(f"{'scales' if scales is not None else 'sizes'} has {given.size} values for {len(axes)} axes")
    factor = [1.0] * len(shape)
    out_shape = list(shape)
    if sizes is not None:
        for a, n in zip(axes, sizes.reshape(-1).tolist()):
            out_shape[a] = int(n)
            factor[a] = int(n) / shape[a] if shape[a] else 1.0
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(factor[a] for a in axes)
            for a in axes:
                factor[a], out_shape[a] = s, int(s * shape[a] + 0.5)
    else:
        for a, s in zip(axes, given.reshape(-1).tolist()):
            if not s > 0:
                raise c.fail(f"scale {s} must be > 0")
            factor[a], out_shape[a] = float(s), int(float(s) * shape[a])
    if any(n < 0 for n in out_shape):
        raise c.fail(f"output shape {tuple(out_shape)} is negative")
    return factor, out_shape


def _rois(c: NodeContext, coord: str, axes: list[int], rank: int) -> list[tuple[float, float] | None]:
    """Each axis's (start, end) of ``roi``: for ``tf_crop_and_resize`` only."""
    rois: list[tuple[float, float] | None] = [None] * rank
    if coord == "tf_crop_and_resize":
        roi = _present(c, 1, "roi")
        if roi is None or roi.size != 2 * len(axes):
            raise c.fail(f"tf_crop_and_resize needs a roi of {2 * len(axes)} values")
        flat = roi.reshape(-1).astype(np.float64).tolist()
        for i, a in enumerate(axes):
            rois[a] = (flat[i], flat[len(axes) + i])
    return rois


def _kernel(c: NodeContext, mode: str, nearest_mode: str, antialias: bool) -> Coeffs:
    """The interpolation kernel of ``mode`` (its taps and weights per output position)."""
    if mode == "nearest":
        return _nearest(nearest_mode)
    if mode == "linear":
        return _linear(antialias)
    return _cubic(float(c.attr("cubic_coeff_a", -0.75)), antialias)


@converter("AffineGrid")
def _affine_grid(c: NodeContext) -> list[Operand | None]:
    """The sampling grid of affine matrices ``theta`` (N, 2, 3) or (N, 3, 4) over ``size``
    (N, C, H, W) or (N, C, D, H, W): the positions of the output's pixels, evenly spaced
    from -1 to 1 (pixel centers with ``align_corners``, else their outer edges; an axis of
    one pixel at 0, as torch and onnxruntime place it, where ONNX's reference says -1), as
    homogeneous coordinates (x, y[, z], 1) in a constant (points, 3 or 4) made at import,
    then one ``matmul`` by each ``theta`` and the result laid out (N, H, W, 2) or
    (N, D, H, W, 3), as ONNX's reference computes it (a GridSample's ``grid``)."""
    f, theta = c.f, c.input(0, "theta")
    size = c.ints(1, "size")
    assert size is not None
    dtype = f.dtype(theta)
    if dtype not in FLOAT_DTYPES:
        raise c.fail(f"theta must be a float tensor, got {dtype}")
    spatial = tuple(size[2:])
    nd = len(spatial)
    if len(size) not in (4, 5) or any(n < 1 for n in size):
        raise c.fail(f"size must be (N, C, H, W) or (N, C, D, H, W) with sizes of at least 1, got {tuple(size)}")
    if f.shape(theta) != (size[0], nd, nd + 1):
        raise c.fail(f"theta must have shape {(size[0], nd, nd + 1)} for size {tuple(size)}, got {f.shape(theta)}")
    align = bool(c.attr("align_corners", 0))
    c.f.check_size((math.prod(spatial), nd + 1), "float64", "AffineGrid's base grid")
    axes = [(-1.0 + 2.0 * np.arange(n) / (n - 1) if n > 1 else np.zeros(1)) if align else
            (-1.0 + (2.0 * np.arange(n) + 1.0) / n) for n in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")  # each (D,) H, W: the coordinate along its axis
    # (x, y[, z], 1): x runs along the last axis (W), y along H, z along D.
    base = np.stack([*(m.reshape(-1) for m in reversed(mesh)), np.ones(math.prod(spatial))], axis=0)
    points = f.op("matmul", theta, frozen(base.astype(dtype)))  # (N, nd, points)
    laid = f.op("transpose", points, perm=(0, 2, 1))
    return [f.op("reshape", laid, shape=(size[0], *spatial, nd), name=c.out())]
