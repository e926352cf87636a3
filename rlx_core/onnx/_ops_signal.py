"""Converters of a few signal and legacy image ops: the window functions (HannWindow,
HammingWindow, BlackmanWindow: constants, their size known at import), LRN (local
response normalization across channels, as AlexNet and GoogLeNet exports carry it) and
Upsample (opsets 7-9, before Resize replaced it).
"""

from __future__ import annotations

import math

import numpy as np

from ._context import NodeContext, converter, onnx_dtype
from ._shapes import Operand, frozen

__all__: list[str] = []

#: Each window's cosine terms: w[n] = sum_k a_k cos(2 pi k n / N) with alternating signs,
#: as ONNX's reference computes them (Hamming's alpha is 25/46, not 0.54).
_WINDOWS: dict[str, tuple[float, ...]] = {
    "HannWindow": (0.5, -0.5),
    "HammingWindow": (25.0 / 46.0, -(1.0 - 25.0 / 46.0)),
    "BlackmanWindow": (0.42, -0.5, 0.08),
}


@converter(*_WINDOWS)
def _window(c: NodeContext) -> list[Operand | None]:
    """A constant: ``size`` points of the window, periodic (``N = size``, the default) or
    symmetric (``N = size - 1``), computed in float64 and cast to ``output_datatype``."""
    size = c.ints(0, "size")
    if size is None or len(size) != 1 or size[0] < 0:
        raise c.fail(f"size must be one int >= 0, got {size}")
    n = size[0]
    dtype = onnx_dtype(int(c.attr("output_datatype", 1)), "output_datatype")
    period = n if int(c.attr("periodic", 1)) else n - 1
    positions = np.arange(n, dtype=np.float64)
    window = np.zeros(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # a symmetric window of one point: N = 0
        for k, a in enumerate(_WINDOWS[c.op_type]):
            window += a * np.cos(2.0 * math.pi * k * positions / period)
    return [frozen(window.astype(dtype))]


@converter("LRN")
def _lrn(c: NodeContext) -> list[Operand | None]:
    """``x / (bias + alpha / size * s) ** beta`` where ``s`` sums the squares of the
    ``size`` channels around each one (floor((size-1)/2) before, ceil((size-1)/2) after,
    clipped at the edges): one ``matmul`` of the squares, channels last, by a constant
    band of ones."""
    f, x = c.f, c.input(0)
    shape, dtype = f.shape(x), f.dtype(x)
    if len(shape) < 3 or dtype not in ("float16", "float32", "float64"):
        raise c.fail(f"needs a float input (N, C, ...), got {dtype}{list(shape)}")
    if not c.has_attr("size") or int(c.attr("size")) < 1:
        raise c.fail("needs a 'size' attribute >= 1")
    size = int(c.attr("size"))
    alpha, beta, bias = float(c.attr("alpha", 1e-4)), float(c.attr("beta", 0.75)), float(c.attr("bias", 1.0))
    channels = shape[1]
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    i = np.arange(channels)
    band = ((i[:, None] >= i[None, :] - lo) & (i[:, None] <= i[None, :] + hi)).astype(dtype)  # [from, to]
    last = (0, *range(2, len(shape)), 1)
    back = (0, len(shape) - 1, *range(1, len(shape) - 1))
    squares = f.op("transpose", f.op("mul", x, x), perm=last)
    summed = f.op("transpose", f.op("matmul", squares, frozen(band)), perm=back)
    scale = f.op("add", f.const(bias, dtype), f.op("mul", summed, f.const(alpha / size, dtype)))
    return [f.op("div", x, f.op("pow", scale, f.const(beta, dtype)), name=c.out())]


@converter("Upsample")
def _upsample(c: NodeContext) -> list[Operand | None]:
    """``mode`` nearest (the default): output index ``i`` of each axis reads input
    ``floor(i / scale)`` (Upsample's asymmetric coordinates), one ``gather`` per scaled
    axis. ``scales`` is an attribute (opset 7) or an input (opset 9). Linear is refused
    by name (Resize, which replaced Upsample at opset 10, reads it)."""
    f, x = c.f, c.input(0)
    shape = f.shape(x)
    mode = c.attr("mode", "nearest")
    if mode != "nearest":
        raise c.fail(f"mode {mode!r} is not supported (only 'nearest'); export with opset 10 or later for Resize")
    scales = c.attr("scales") if c.num_inputs < 2 else c.static(1, "scales")
    if scales is None or len(np.ravel(scales)) != len(shape):
        raise c.fail(f"needs one scale per axis of the input {shape}, got {scales}")
    scales = [float(s) for s in np.ravel(scales)]
    if any(not s >= 1.0 for s in scales):
        raise c.fail(f"scales must be >= 1, got {scales}")
    out = [math.floor(d * s) for d, s in zip(shape, scales)]
    f.check_size(tuple(out), f.dtype(x), "Upsample's result")
    moved = [a for a in range(len(shape)) if out[a] != shape[a]]
    y = x
    for a in moved:
        table = np.minimum(np.floor(np.arange(out[a]) / scales[a]).astype(np.int64), shape[a] - 1)
        y = f.op("gather", y, frozen(table), axis=a, name=c.out() if a == moved[-1] else "")
    return [y]
