"""Converters of the spectral ops (DFT, STFT, MelWeightMatrix).

The IR has no FFT and no complex dtype, and rlx shapes are static, so a DFT of length
``N`` over one axis is what it is by definition: a matrix product. The signal, its axis
and its (real, imag) pair moved last and flattened, is multiplied by one constant
``(M*C, K*C')`` matrix of cosines and sines (``M`` the axis length, ``C``/``C'`` 1 for
real and 2 for complex, ``K`` the output bins), built in float64 here and cast to the
compute dtype. ``dft_length`` (zero-padding or truncation), ``onesided`` (the first
``N//2+1`` bins), ``inverse`` (``+sin`` and the ``1/N``) and IRFFT (the Hermitian
weights) are all folded into that matrix, so every backend runs a DFT as one ``matmul``
between reshapes, with no per-backend kernel. That costs ``O(N^2)`` against an FFT's
``O(N log N)``, which is cheap for the frame sizes audio front ends use (256-2048).
float16 and bfloat16 signals are transformed in float32 (a sum of ``N`` float16
products loses most of its digits) and cast back; float64 stays float64.

STFT frames the signal with one constant ``gather`` index table (``frame_step`` and
``frame_length`` known at import), multiplies the window in and applies the same
matrix. MelWeightMatrix is a constant, computed as ONNX's reference computes it.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.symbolic import Sym
from ._context import NodeContext, converter, onnx_dtype
from ._shapes import Emitter, Operand, frozen

__all__: list[str] = []

_FLOATS = ("float16", "float32", "float64", "bfloat16")


def _scalar(c: NodeContext, i: int, what: str) -> int | None:
    """An import-time integer input holding one value, ``None`` when left out."""
    values = c.ints(i, what)
    if values is None:
        return None
    if len(values) != 1 or not isinstance(values[0], int):
        raise c.fail(f"input {what} must be one int known at import, got {values}")
    return values[0]


def _angles(rows: int, cols: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of ``2 pi r c / n`` for ``r < rows``, ``c < cols``: the product is taken
    modulo ``n`` first, so large indices lose no precision to the angle."""
    theta = 2.0 * math.pi * (np.outer(np.arange(rows), np.arange(cols)) % n) / n
    return np.cos(theta), np.sin(theta)


def _dft_matrix(m: int, complex_in: bool, n: int, bins: int, inverse: bool) -> np.ndarray:
    """The ``(m*C, bins*2)`` matrix of a complex-output DFT of length ``n`` over ``m``
    input points: rows past ``n`` are zero (truncation), points past ``m`` are absent
    (zero-padding). Forward ``e^{-i theta}``; inverse ``e^{+i theta} / n``."""
    cos, sin = _angles(min(m, n), bins, n)
    sign = 1.0 if inverse else -1.0
    w = np.zeros((m, 2 if complex_in else 1, bins, 2))
    w[: len(cos), 0, :, 0], w[: len(cos), 0, :, 1] = cos, sign * sin  # real part of x
    if complex_in:  # (a + ib)(cos + i sign sin): the imaginary part of x
        w[: len(cos), 1, :, 0], w[: len(cos), 1, :, 1] = -sign * sin, cos
    return (w / n if inverse else w).reshape(m * w.shape[1], bins * 2)


def _irfft_matrix(m: int, n: int) -> np.ndarray:
    """The ``(m*2, n)`` matrix of an inverse DFT of a one-sided spectrum of ``m`` bins to
    ``n`` real points (numpy's ``irfft``): bins past ``n//2`` are ignored, the others
    count twice (their conjugates) except bin 0 and, for even ``n``, bin ``n/2``, whose
    imaginary parts are ignored."""
    used = min(m, n // 2 + 1)
    cos, sin = _angles(used, n, n)
    weight = np.full(used, 2.0)
    weight[0] = 1.0
    if n % 2 == 0 and used > n // 2:
        weight[n // 2] = 1.0
        sin[n // 2] = 0.0
    sin[0] = 0.0
    w = np.zeros((m, 2, n))
    w[:used, 0], w[:used, 1] = weight[:, None] * cos / n, -weight[:, None] * sin / n
    return w.reshape(m * 2, n)


def _transform(f: Emitter, x: Operand, axis: int, matrix: np.ndarray, out_ch: int, dtype: str,
               name: str) -> Operand:
    """``x`` (complex pairs last) with ``axis`` replaced by ``matrix``'s output: the axis
    moved next to the pairs, both flattened, one ``matmul``, then unflattened and moved
    back; computed in float32 (float64 for float64) and cast to ``dtype``."""
    shape = f.shape(x)
    rank = len(shape)
    perm = (*[d for d in range(rank - 1) if d != axis], axis, rank - 1)
    moved = axis != rank - 2
    if moved:
        x = f.op("transpose", x, perm=perm)
    lead = tuple(shape[p] for p in perm[:-2])
    compute = "float64" if dtype == "float64" else "float32"
    if f.dtype(x) != compute:
        x = f.op("cast", x, dtype=compute)
    f.check_size(matrix.shape, compute, "the DFT matrix")
    flat = f.op("reshape", x, shape=(*lead, matrix.shape[0]))
    y = f.op("matmul", flat, frozen(matrix.astype(compute)))
    last = not moved and compute == dtype
    y = f.op("reshape", y, shape=(*lead, matrix.shape[1] // out_ch, out_ch), name=name if last else "")
    if compute != dtype:
        y = f.op("cast", y, dtype=dtype, name="" if moved else name)
    if moved:
        y = f.op("transpose", y, perm=tuple(int(p) for p in np.argsort(perm)), name=name)
    return y


def _signal(c: NodeContext, ranks: tuple[int, ...]) -> tuple[Operand, tuple[int, ...], str]:
    """Input 0, checked: a float tensor whose last axis holds 1 (real) or 2 (complex) values."""
    x = c.input(0, "input")
    shape, dtype = c.f.shape(x), c.f.dtype(x)
    if dtype not in _FLOATS or len(shape) not in ranks or shape[-1] not in (1, 2):
        raise c.fail(f"needs a float signal of rank {' or '.join(map(str, ranks))} whose last axis is 1 (real) "
                     f"or 2 (complex), got {dtype}{list(shape)}")
    return x, shape, dtype


def _dft_axis(c: NodeContext, rank: int) -> int:
    """DFT-17's ``axis`` attribute (default 1) or DFT-20's ``axis`` input (default -2),
    in ONNX's accepted range ``[-r, -2] U [0, r-2]`` (never the complex axis)."""
    if c.opset >= 20:
        if c.has_attr("axis"):
            raise c.fail(f"axis is an input from DFT-20 on, not an attribute (the model's opset is {c.opset})")
        axis = _scalar(c, 2, "axis")
        axis = -2 if axis is None else axis
    else:
        axis = int(c.attr("axis", 1))
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise c.fail(f"axis {axis} is out of range for rank {rank} (the last axis holds the complex pairs)")
    return axis % rank


@converter("DFT")
def _dft(c: NodeContext) -> list[Operand | None]:
    """One ``matmul`` by a constant DFT matrix (see the module docstring): forward,
    inverse, RFFT (``onesided``, real input) and IRFFT (``onesided`` inverse, complex input)."""
    x, shape, dtype = _signal(c, tuple(range(2, 33)))
    axis = _dft_axis(c, len(shape))
    inverse, onesided = bool(int(c.attr("inverse", 0))), bool(int(c.attr("onesided", 0)))
    m, complex_in = shape[axis], shape[-1] == 2
    if isinstance(m, Sym):
        raise c.fail(f"the transformed axis {axis} must have a size known at import, got {m}")
    if onesided and complex_in != inverse:
        raise c.fail("onesided=1 takes a real input when inverse=0 (RFFT) and a complex one when inverse=1 (IRFFT), "
                     f"as the spec says; got a {'complex' if complex_in else 'real'} input with inverse={int(inverse)}")
    n = _scalar(c, 1, "dft_length")
    n = (2 * (m - 1) if inverse and onesided else m) if n is None else n
    if n < 1:
        raise c.fail(f"dft_length must be >= 1, got {n}")
    if inverse and onesided:
        return [_transform(c.f, x, axis, _irfft_matrix(m, n), 1, dtype, c.out())]
    matrix = _dft_matrix(m, complex_in, n, n // 2 + 1 if onesided else n, inverse)
    return [_transform(c.f, x, axis, matrix, 2, dtype, c.out())]


@converter("STFT")
def _stft(c: NodeContext) -> list[Operand | None]:
    """Frames by a constant ``gather`` table (``frames = 1 + (T - L) // frame_step``),
    times the window, then the DFT matrix over each frame: ``(batch, frames, bins, 2)``."""
    f = c.f
    x, shape, dtype = _signal(c, (3,))
    step, length, window = _scalar(c, 1, "frame_step"), _scalar(c, 3, "frame_length"), c.optional(2)
    if step is None or step < 1:
        raise c.fail(f"frame_step must be one int >= 1, got {step}")
    if window is not None and (len(f.shape(window)) != 1 or f.dtype(window) != dtype):
        raise c.fail(f"the window must be 1-D and of the signal's dtype {dtype}, got "
                     f"{f.dtype(window)}{list(f.shape(window))}")
    if length is None:
        length = shape[1] if window is None else f.shape(window)[0]
    if window is not None and f.shape(window)[0] != length:
        raise c.fail(f"the window has {f.shape(window)[0]} points, frame_length is {length}")
    if isinstance(shape[1], Sym) or isinstance(length, Sym) or not 1 <= length <= shape[1]:
        raise c.fail(f"frame_length must be between 1 and the signal length {shape[1]} (both known at import), "
                     f"got {length}")
    complex_in, onesided = shape[-1] == 2, bool(int(c.attr("onesided", 1)))
    if complex_in and onesided:
        raise c.fail("onesided=1 (the default) is not possible with a complex signal, as the spec says")
    frames = 1 + (shape[1] - length) // step
    table = np.arange(frames, dtype=np.int64)[:, None] * step + np.arange(length, dtype=np.int64)
    compute = "float64" if dtype == "float64" else "float32"
    if dtype != compute:
        x = f.op("cast", x, dtype=compute)
        window = None if window is None else f.op("cast", window, dtype=compute)
    framed = f.op("gather", x, frozen(table), axis=1)  # (batch, frames, length, C)
    if window is not None:
        framed = f.op("mul", framed, f.op("reshape", window, shape=(length, 1)))
    matrix = _dft_matrix(length, complex_in, length, length // 2 + 1 if onesided else length, False)
    return [_transform(f, framed, 2, matrix, 2, dtype, c.out())]


@converter("MelWeightMatrix")
def _mel_weight_matrix(c: NodeContext) -> list[Operand | None]:
    """A constant ``(dft_length//2 + 1, num_mel_bins)`` matrix of triangular filters,
    computed with the arithmetic (and dtypes) of ONNX's reference implementation, so
    the integer bin edges it rounds to are the same."""
    mels, dft_length, rate = (c.static(i, w) for i, w in enumerate(("num_mel_bins", "dft_length", "sample_rate")))
    lower, upper = c.static(3, "lower_edge_hertz"), c.static(4, "upper_edge_hertz")
    values = (mels, dft_length, rate, lower, upper)
    if any(v is None or v.size != 1 for v in values):
        raise c.fail("needs five scalar inputs known at import (num_mel_bins, dft_length, sample_rate, "
                     "lower_edge_hertz, upper_edge_hertz)")
    mels, dft_length, rate, lower, upper = (v.reshape(()) for v in values)
    if any(v.dtype.kind not in "iu" for v in (mels, dft_length, rate)) or any(
            v.dtype.name not in _FLOATS for v in (lower, upper)):
        raise c.fail("num_mel_bins, dft_length and sample_rate must be ints, the edges floats")
    if int(mels) < 1 or int(dft_length) < 1 or int(rate) < 1 or not 0.0 <= float(lower) <= float(upper):
        raise c.fail(f"needs num_mel_bins, dft_length, sample_rate >= 1 and 0 <= lower_edge_hertz <= "
                     f"upper_edge_hertz, got {int(mels)}, {int(dft_length)}, {int(rate)}, {lower}, {upper}")
    out_dtype = onnx_dtype(int(c.attr("output_datatype", 1)), "output_datatype")
    spectrogram_bins = int(dft_length) // 2 + 1
    c.f.check_size((spectrogram_bins, int(mels)), "float64", "MelWeightMatrix's result")
    edges = np.arange(0, int(mels) + 2)
    low_mel = 2595 * np.log1p(lower / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper / 700) / np.log(10)
    hertz = 700 * np.expm1((edges * ((high_mel - low_mel) / edges.shape[0]) + low_mel) / 2595 * np.log(10))
    edges = (((dft_length + 1) * hertz) // rate).astype(int)
    rising = edges[2:] > edges[1:-1]
    if max(int(edges[1:-1].max()), int((edges[2:] - 1)[rising].max(initial=0))) >= spectrogram_bins:
        raise c.fail(f"upper_edge_hertz {upper} lies past the last of the {spectrogram_bins} spectrogram bins "
                     f"(sample_rate / 2 = {int(rate) / 2})")
    out = np.zeros((spectrogram_bins, int(mels)))
    for i, (left, center, right) in enumerate(zip(edges, edges[1:], edges[2:])):
        if center == left:
            out[center, i] = 1.0
        else:
            out[left:center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    return [frozen(out.astype(out_dtype))]
