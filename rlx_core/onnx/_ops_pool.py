"""Converters of pools: MaxPool, AveragePool, LpPool (1-D to 3-D) and the global pools.

2-D pools are ``max_pool2d``/``avg_pool2d`` (a 1-D one as 2-D over (N, C, 1, L)); 3-D ones
pool each depth plane in 2-D and combine the depth windows from strided slices. What those
ops do not take is rewritten exactly: LpPool and a dilated AveragePool (or one padded
wider than half its window) as a depthwise convolution by a window of ones, a MaxPool
padded wider than half its window with the padding written as ``-inf``, and MaxPool's
Indices output as a running maximum over the window's taps (strided slices) that carries
each tap's constant table of flat indices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._context import NodeContext, converter
from ._ops_nn import _as_2d, _back_to_1d, _one_d, _pads, _pads_3d, _pair_attr, _spatial, conv3d
from ._shapes import Emitter, Operand, frozen

__all__: list[str] = []


def _pool_window(c: NodeContext, x: Operand) -> dict[str, object]:
    spatial = _spatial(c, x)
    kernel = c.attr_ints("kernel_shape")
    if _one_d(c) and kernel is not None and len(kernel) == 1:
        kernel = (1, kernel[0])
    if kernel is None or len(kernel) != 2:
        raise c.fail(f"kernel_shape must have {1 if _one_d(c) else 2} entries, got {kernel}")
    strides, dilations = _pair_attr(c, "strides", 1), _pair_attr(c, "dilations", 1)
    pads = _pads(c, spatial, kernel, strides, dilations)
    return {"kernel": kernel, "stride": strides, "padding": pads, "dilation": dilations, "ceil_mode": _ceil_mode(c)}


def _ceil_mode(c: NodeContext) -> bool:
    """``ceil_mode``, unless a SAME ``auto_pad`` chose the pads (they already fit exactly)."""
    return bool(c.attr("ceil_mode", 0)) and not (c.attr("auto_pad", "NOTSET") or "NOTSET").startswith("SAME")


def _window_3d(c: NodeContext, size: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...],
                                                              tuple[int, ...]]:
    """A 3-D pool's kernel, strides, dilations (3 entries each, checked) and pads
    (d0, h0, w0, d1, h1, w1) over an input of spatial ``size``."""
    kernel = c.attr_ints("kernel_shape")
    strides, dilations = c.attr_ints("strides", (1, 1, 1)), c.attr_ints("dilations", (1, 1, 1))
    assert strides is not None and dilations is not None
    if kernel is None or len(kernel) != 3 or len(strides) != 3 or len(dilations) != 3:
        raise c.fail(f"kernel_shape, strides and dilations must have 3 entries, got {kernel}, {strides}, {dilations}")
    return tuple(kernel), tuple(strides), tuple(dilations), _pads_3d(c, size, kernel, strides, dilations)


#: The integer dtypes ONNX's MaxPool takes: pooled through float32, which holds each exactly.
_POOL_INTS = ("int8", "uint8")


def _pool3d(c: NodeContext, x: Operand, kind: str) -> Operand:
    """A 3-D MaxPool or AveragePool: the 2-D pool over each depth plane (depth moved into
    the batch), then the depth windows combined from strided slices: their maximum, or
    their sum divided by how many planes each window holds (the padding planes too with
    ``count_include_pad``: they are zeros, as the 2-D pool counts its pads). ``ceil_mode``'s
    extra windows read planes past the end padding, which count as nothing (``-inf`` for a
    maximum, and no plane of the divisor), as the 2-D pool does with its own."""
    f = c.f
    n, ch, d, h, w = f.shape(x)
    dtype = f.dtype(x)
    if dtype not in ("float16", "float32", "float64"):
        raise c.fail(f"a 3-D {c.op_type} needs a float input, got {dtype}")
    kernel, strides, dilations, pads = _window_3d(c, (d, h, w))
    pd0, ph0, pw0, pd1, ph1, pw1 = pads
    ceil = _ceil_mode(c)
    if kind == "avg" and (tuple(dilations) != (1, 1, 1) or _wide(kernel[1:], dilations[1:], (ph0, pw0, ph1, pw1))):
        return _dilated_avg(c, x, kernel, strides, dilations, (pd0, ph0, pw0), (pd1, ph1, pw1), ceil,
                            bool(c.attr("count_include_pad", 0)), c.out())
    past = _ceil_extra(d, kernel[0], strides[0], pd0, pd1, dilations[0]) if ceil else 0  # planes after the pads
    planes = f.op("reshape", f.op("transpose", x, perm=(0, 2, 1, 3, 4)), shape=(n * d, ch, h, w))
    window = {"kernel": tuple(kernel[1:]), "stride": tuple(strides[1:]), "padding": (ph0, pw0, ph1, pw1),
              "ceil_mode": ceil}
    if kind == "max":
        p2 = f.op("max_pool2d", planes, dilation=tuple(dilations[1:]), **window)
    else:
        p2 = f.op("avg_pool2d", planes, count_include_pad=bool(c.attr("count_include_pad", 0)), **window)
    oh, ow = f.shape(p2)[2:]
    p2 = f.op("reshape", p2, shape=(n, d, ch, oh, ow))
    fill = -np.inf if kind == "max" else 0.0
    parts = [frozen(np.full((n, p, ch, oh, ow), fill, dtype)) for p in (pd0,) if p] + [p2] + \
            [frozen(np.full((n, p, ch, oh, ow), fill, dtype)) for p in (pd1 + past,) if p]
    padded = f.op("concat", *parts, axis=1) if len(parts) > 1 else p2
    sd, dd, kd = strides[0], dilations[0], kernel[0]
    od = (d + pd0 + pd1 + past - dd * (kd - 1) - 1) // sd + 1
    if od < 1:
        raise c.fail(f"the kernel depth {kd} does not fit the padded depth {d + pd0 + pd1}")
    total: Operand | None = None
    for k in range(kd):
        tap = f.op("slice", padded, starts=[k * dd], ends=[k * dd + (od - 1) * sd + 1], axes=[1], steps=[sd])
        total = tap if total is None else f.op("maximum" if kind == "max" else "add", total, tap)
    assert total is not None
    if kind == "avg":
        lo, hi = (-pd0, d + pd1) if c.attr("count_include_pad", 0) else (0, d)
        counts = np.array([sum(lo <= j * sd + k - pd0 < hi for k in range(kd)) for j in range(od)])
        total = f.op("div", total, frozen(counts.astype(dtype).reshape(1, od, 1, 1, 1)))
    return f.op("transpose", total, perm=(0, 2, 1, 3, 4), name=c.out())


@converter("MaxPool")
def _max_pool(c: NodeContext) -> list[Operand | None]:
    """The IR's max_pool2d is float-only; int8/uint8 (ONNX MaxPool-12) are pooled in float32,
    exactly (every window holds one input element at least, so no -inf pad is ever picked),
    then cast back."""
    f, x = c.f, c.input(0)
    if c.used(1):
        return _max_pool_indices(c, x)
    if len(f.shape(x)) == 5:
        return [_pool3d(c, x, "max"), None]
    window = _pool_window(c, x)
    one_d = _one_d(c)
    dtype = f.dtype(x)
    through = dtype in _POOL_INTS
    xin = f.op("cast", _as_2d(c, x), dtype="float32") if through else _as_2d(c, x)
    xin = _wide_max_pads(c, xin, window)
    y = f.op("max_pool2d", xin, name="" if one_d or through else c.out(), **window)
    if through:
        y = f.op("cast", y, dtype=dtype, name="" if one_d else c.out())
    return [_back_to_1d(c, y, one_d), None]


#: The most window taps MaxPool's Indices output is unrolled over (four ops each).
_MAX_INDEX_TAPS = 1024


def _max_pool_indices(c: NodeContext, x: Operand) -> list[Operand | None]:
    """MaxPool with its Indices output (1-D to 3-D): the window's taps unrolled. Each tap
    is a strided slice of ``x`` padded with zeros (never read: a constant mask keeps a
    padding tap from being taken); the running maximum takes a tap where it is greater
    (``where(v > m)``: a tie keeps the earlier tap in the scan order, a NaN is never taken
    after the first tap and kept when it is the first, as onnx's reference does), and the
    running index takes the tap's constant table of flat positions in the plane (row-major,
    or column-major with ``storage_order=1``); the plane's offset ``(n*C + c) * plane`` is
    added last. A window that holds only padding has no index and is refused."""
    f = c.f
    shape = f.shape(x)
    if len(shape) == 5:
        kernel, strides, dilations, pads = _window_3d(c, shape[2:])
        begins, ends, size, ceil = pads[:3], pads[3:], tuple(shape[2:]), _ceil_mode(c)
        xin = x
    else:
        window = _pool_window(c, x)
        kernel, strides, dilations = window["kernel"], window["stride"], window["dilation"]
        top, left, bottom, right = window["padding"]
        begins, ends, ceil = (top, left), (bottom, right), bool(window["ceil_mode"])
        xin = _as_2d(c, x)
        size = tuple(f.shape(xin)[2:])
    order = int(c.attr("storage_order", 0))
    if order not in (0, 1):
        raise c.fail(f"storage_order must be 0 or 1, got {order}")
    if math.prod(kernel) > _MAX_INDEX_TAPS:
        raise c.fail(f"the Indices output of a kernel {tuple(kernel)} ({math.prod(kernel)} taps) is not supported "
                     f"(at most {_MAX_INDEX_TAPS})")
    outs, valid = [], []  # per axis: the output size, and which (output, tap) pairs land in x
    for n, k, s, b, e, d in zip(size, kernel, strides, begins, ends, dilations):
        past = _ceil_extra(n, k, s, b, e, d) if ceil else 0
        o = (n + b + e + past - d * (k - 1) - 1) // s + 1
        if o < 1:
            raise c.fail(f"the kernel {tuple(kernel)} does not fit the padded input {size}")
        pos = np.arange(o)[:, None] * s - b + np.arange(k)[None, :] * d
        if not ((pos >= 0) & (pos < n)).any(axis=1).all():
            raise c.fail(f"pads {(*begins, *ends)} leave windows of the kernel {tuple(kernel)} that hold only "
                         "padding (they have no index)")
        outs.append(o)
        valid.append((pos >= 0) & (pos < n))
    xin = _zero_pad(c, xin, begins, [max(0, (o - 1) * s - b + (k - 1) * d + 1 - n)
                                     for n, k, s, b, d, o in zip(size, kernel, strides, begins, dilations, outs)])
    lead = tuple(f.shape(xin)[:2])
    # each axis's step in the flat plane: row-major, or column-major with storage_order=1
    steps = [math.prod(size[:i]) if order else math.prod(size[i + 1:]) for i in range(len(size))]
    seen = np.zeros(outs, dtype=bool)
    best: Operand | None = None
    index: Operand | None = None
    for taps in np.ndindex(*kernel):
        tap = f.op("slice", xin, starts=[j * d for j, d in zip(taps, dilations)],
                   ends=[j * d + (o - 1) * s + 1 for j, d, o, s in zip(taps, dilations, outs, strides)],
                   axes=list(range(2, 2 + len(size))), steps=list(strides))
        ok = np.ones((), dtype=bool)
        where_at = np.zeros((), dtype=np.int64)
        for axis, j in enumerate(taps):
            coord = np.arange(outs[axis]) * strides[axis] - begins[axis] + j * dilations[axis]
            ok = np.logical_and.outer(ok, valid[axis][:, j])
            where_at = np.add.outer(where_at, np.clip(coord, 0, None) * steps[axis])
        first = ok & ~seen
        seen |= ok
        table = frozen(where_at.astype(np.int64))
        if best is None:
            best, index = tap, table
            continue
        greater = f.op("greater", tap, best)
        fixed = first | ~ok
        take = greater if not fixed.any() else f.op("where", frozen(fixed), frozen(first), greater)
        best = f.op("where", take, tap, best)
        index = f.op("where", take, table, index)
    assert best is not None and index is not None
    plane = math.prod(size)
    offsets = (np.arange(lead[0] * lead[1], dtype=np.int64) * plane).reshape(*lead, *(1,) * len(size))
    y_shape = shape[:2] + tuple(outs[-1:] if len(shape) == 3 else outs)
    y = f.op("reshape", best, shape=y_shape, name=c.out(0))
    index = f.op("reshape", f.op("add", index, frozen(offsets)), shape=y_shape, name=c.out(1))
    return [y, index]


def _zero_pad(c: NodeContext, x: Operand, befores: Sequence[int], afters: Sequence[int]) -> Operand:
    """``x`` (N, C, ...) with zeros added before and after each spatial axis."""
    f = c.f
    for axis, before, after in zip(range(2, 2 + len(befores)), befores, afters):
        shape, dtype = f.shape(x), f.dtype(x)
        blocks = {p: frozen(np.zeros((*shape[:axis], p, *shape[axis + 1:]), dtype)) for p in (before, after)}
        parts = [blocks[before]] * bool(before) + [x] + [blocks[after]] * bool(after)
        x = f.op("concat", *parts, axis=axis) if len(parts) > 1 else x
    return x


def _wide_max_pads(c: NodeContext, x: Operand, window: dict[str, Any]) -> Operand:
    """A MaxPool padded by more than half its window (ONNX allows it; ``max_pool2d`` does
    not): ``x`` with its padding made of ``-inf`` rows and columns, which a maximum never
    picks, and ``window`` changed to pad nothing. Refused where a window would hold only
    padding (its maximum is no element of ``x``) or with ``ceil_mode`` (whose windows are
    counted from the padding given)."""
    f = c.f
    top, left, bottom, right = window["padding"]
    spans = [(k - 1) * d + 1 for k, d in zip(window["kernel"], window["dilation"])]
    if not _wide(window["kernel"], window["dilation"], window["padding"]):
        return x
    if window["ceil_mode"]:
        raise c.fail(f"pads {window['padding']} wider than half the window {tuple(spans)} are not supported with "
                     "ceil_mode")
    if max(top, bottom) >= spans[0] or max(left, right) >= spans[1]:
        raise c.fail(f"pads {window['padding']} leave windows of the {tuple(spans)} window that hold only padding")
    for axis, before, after in ((2, top, bottom), (3, left, right)):
        shape, dtype = f.shape(x), f.dtype(x)
        blocks = {p: frozen(np.full((*shape[:axis], p, *shape[axis + 1:]), -np.inf, dtype)) for p in (before, after)}
        parts = [blocks[before]] * bool(before) + [x] + [blocks[after]] * bool(after)
        x = f.op("concat", *parts, axis=axis) if len(parts) > 1 else x
    window["padding"] = (0, 0, 0, 0)
    return x


def _wide(kernel: Sequence[int], dilation: Sequence[int], padding: Sequence[int]) -> bool:
    """Whether 2-D ``padding`` (top, left, bottom, right) is wider than half the (dilated)
    window somewhere, which ``max_pool2d``/``avg_pool2d`` refuse."""
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
    top, left, bottom, right = padding
    return 2 * max(top, bottom) > spans[0] or 2 * max(left, right) > spans[1]


@converter("AveragePool")
def _avg_pool(c: NodeContext) -> list[Operand | None]:
    x = c.input(0)
    if len(c.f.shape(x)) == 5:
        return [_pool3d(c, x, "avg")]
    window = _pool_window(c, x)
    cip = bool(c.attr("count_include_pad", 0))
    one_d = _one_d(c)
    name = "" if one_d else c.out()
    dilation = window.pop("dilation")
    if dilation != (1, 1) or _wide(window["kernel"], dilation, window["padding"]):
        top, left, bottom, right = window["padding"]
        y = _dilated_avg(c, _as_2d(c, x), window["kernel"], window["stride"], dilation, (top, left), (bottom, right),
                         bool(window["ceil_mode"]), cip, name)
        return [_back_to_1d(c, y, one_d)]
    y = c.f.op("avg_pool2d", _as_2d(c, x), count_include_pad=cip, name=name, **window)
    return [_back_to_1d(c, y, one_d)]


def _dilated_avg(c: NodeContext, x: Operand, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                 begins: Sequence[int], ends: Sequence[int], ceil: bool, cip: bool, name: str) -> Operand:
    """An AveragePool with dilations (ONNX 19; ``avg_pool2d`` has none) or padded wider than
    half its window (``avg_pool2d`` refuses it), 2-D or 3-D: the
    windows' sums as a depthwise convolution of ``x`` by a window of ones (``conv2d``, or
    the 3-D convolution ``Conv`` runs), divided per output position by how many of its taps
    land in the input (and in the padding, with ``count_include_pad``): a constant.
    ``ceil_mode``'s extra windows read zeros past the padding, which count as nothing."""
    f = c.f
    channels, *size = f.shape(x)[1:]
    dtype = f.dtype(x)
    past = [_ceil_extra(n, k, s, b, e, d) if ceil else 0
            for n, k, s, b, e, d in zip(size, kernel, strides, begins, ends, dilations)]
    ones = frozen(np.ones((channels, 1, *kernel), dtype=np.dtype(dtype)))
    reach = (*begins, *(e + p for e, p in zip(ends, past)))  # the zeros a window may read
    if len(size) == 2:
        total = f.op("conv2d", x, ones, stride=tuple(strides), padding=reach, dilation=tuple(dilations),
                     groups=channels)
    else:
        total = conv3d(c, x, ones, None, tuple(strides), tuple(dilations), reach, channels, "")
    counts = np.ones((), np.int64)
    for n, k, s, b, e, d, o in zip(size, kernel, strides, begins, ends, dilations, f.shape(total)[2:]):
        lo, hi = (-b, n + e) if cip else (0, n)
        along = np.array([sum(lo <= j * s - b + t * d < hi for t in range(k)) for j in range(o)])
        counts = np.multiply.outer(counts, along)
    if not counts.all():
        raise c.fail(f"pads {(*begins, *ends)} leave windows of the kernel {tuple(kernel)} that hold only padding")
    return f.op("div", total, frozen(counts.astype(dtype)[None, None]), name=name)


def _ceil_extra(size: int, k: int, s: int, p0: int, p1: int, d: int) -> int:
    """Padding past ``p1`` that ceil_mode's last window reads (PyTorch's and ONNX's rule:
    a window must start inside the input or the begin padding)."""
    span = size + p0 + p1 - d * (k - 1) - 1
    n = -(-span // s) + 1
    if (n - 1) * s >= size + p0:
        n -= 1
    return max(0, (n - 1) * s + d * (k - 1) + 1 - (size + p0 + p1))


@converter("LpPool")
def _lp_pool(c: NodeContext) -> list[Operand | None]:
    """``(sum of |x|^p over the window)^(1/p)``, padding counting as 0: a depthwise
    ``conv2d`` of ``|x|^p`` with a window of ones (stride, dilation and any padding, as
    Conv has them; ceil_mode's extra windows as more zero padding), then the root. p = 1
    and 2 use ``abs``/``mul``/``sqrt``, other p ``pow``. A 3-D one (no ceil_mode) runs the
    window of ones as the 3-D convolution ``Conv`` does."""
    f, x = c.f, c.input(0)
    dtype = f.dtype(x)
    if dtype not in ("float16", "float32", "float64"):
        raise c.fail(f"needs a float input, got {dtype}")
    p = int(c.attr("p", 2))
    if p < 1:
        raise c.fail(f"p must be >= 1, got {p}")
    if len(f.shape(x)) == 5:
        return [_lp_pool3d(c, x, p)]
    window = _pool_window(c, x)
    kernel, stride, dilation = window["kernel"], window["stride"], window["dilation"]
    top, left, bottom, right = window["padding"]
    if window["ceil_mode"]:
        h, w = _spatial(c, x)
        bottom += _ceil_extra(h, kernel[0], stride[0], top, bottom, dilation[0])
        right += _ceil_extra(w, kernel[1], stride[1], left, right, dilation[1])
    one_d = _one_d(c)
    x2 = _as_2d(c, x)
    channels = f.shape(x2)[1]
    ones = frozen(np.ones((channels, 1, *kernel), dtype=np.dtype(dtype)))
    total = f.op("conv2d", _lp_powered(f, x2, p), ones, stride=stride, padding=(top, left, bottom, right),
                 dilation=dilation, groups=channels)
    return [_back_to_1d(c, _lp_root(f, total, p, "" if one_d else c.out()), one_d)]


def _lp_pool3d(c: NodeContext, x: Operand, p: int) -> Operand:
    f = c.f
    channels, *size = f.shape(x)[1:]
    kernel, strides, dilations, pads = _window_3d(c, size)
    if c.attr("ceil_mode", 0):
        raise c.fail("ceil_mode is not supported for a 3-D LpPool")
    ones = frozen(np.ones((channels, 1, *kernel), dtype=np.dtype(f.dtype(x))))
    total = conv3d(c, _lp_powered(f, x, p), ones, None, strides, dilations, pads, channels, "")
    return _lp_root(f, total, p, c.out())


def _lp_powered(f: Emitter, x: Operand, p: int) -> Operand:
    """``|x|^p``: ``abs`` for p = 1, ``x * x`` for 2, ``pow`` else."""
    if p == 1:
        return f.op("abs", x)
    if p == 2:
        return f.op("mul", x, x)
    return f.op("pow", f.op("abs", x), f.const(p, f.dtype(x)))


def _lp_root(f: Emitter, total: Operand, p: int, name: str) -> Operand:
    """``total^(1/p)`` named ``name``: itself for p = 1, ``sqrt`` for 2, ``pow`` else."""
    if p == 1:
        return f.op("reshape", total, shape=f.shape(total), name=name)
    if p == 2:
        return f.op("sqrt", total, name=name)
    return f.op("pow", total, f.const(1.0 / p, f.dtype(total)), name=name)


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(c: NodeContext) -> list[Operand | None]:
    f, x = c.f, c.input(0)
    rank = len(f.shape(x))
    if rank < 3:
        raise c.fail(f"needs an input (N, C, ...), got shape {f.shape(x)}")
    if c.op_type == "GlobalAveragePool" and rank == 4:
        return [f.op("global_avg_pool2d", x, name=c.out())]
    kind = "reduce_mean" if c.op_type == "GlobalAveragePool" else "reduce_max"
    return [f.op(kind, x, axes=tuple(range(2, rank)), keepdims=True, name=c.out())]


# ---------------------------------------------------------------- normalization
