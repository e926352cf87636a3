"""Elementwise math numpy lacks (erf, gelu), evaluated in cache-sized chunks.

numpy has no ``erf``. For float32 and float16 results, ``erf`` is a rational
approximation ``x * P(x^2) / Q(x^2)`` on ``|x| <= 4`` (erf(4) rounds to 1 in float32),
fitted for this module against ``math.erf`` and evaluated in float64: its relative error
is below 3e-9, so the float32 result is within half an ulp of the correctly rounded
value plus that. float64 results use ``math.erf`` itself, element by element.

Long ufunc chains over big arrays are bound by memory traffic, so these run over the
flattened arrays in chunks of ``CHUNK`` elements whose temporaries stay in cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["CHUNK", "run_chunked", "erf_program", "gelu_program", "scratch_count"]

CHUNK = 8192

# erf(x) / x = P(x^2) / Q(x^2) on |x| <= 4, coefficients in increasing powers of x^2.
_ERF_P = (1.1283791680791524, 0.18527999832703257, 0.05435400339420621, 0.0038564779868635398,
          0.0003808589606777261, 4.715109374321501e-06, -1.336023425473942e-08)  # fmt: skip
_ERF_Q = (1.0, 0.49753352092051145, 0.11401401340926814, 0.015479842987998064, 0.0013106910328008678,
          6.340348258047637e-05)  # fmt: skip


def _c(value: float) -> np.ndarray:
    """A read-only float64 0-d constant (a 0-d array is cheaper for a ufunc than a float)."""
    a = np.array(value, np.float64)
    a.flags.writeable = False
    return a


_P = tuple(_c(v) for v in _ERF_P)
_Q = tuple(_c(v) for v in _ERF_Q)
_FOUR, _MINUS_FOUR, _ONE, _HALF = _c(4.0), _c(-4.0), _c(1.0), _c(0.5)
_RSQRT2 = _c(1.0 / math.sqrt(2.0))
# gelu(tanh) constants per compute dtype: (0.044715, 1, sqrt(2/pi), 0.5).
_GELU_TANH = {
    np.dtype(dt): tuple(_c(v).astype(dt) for v in (0.044715, 1.0, math.sqrt(2.0 / math.pi), 0.5))
    for dt in (np.float32, np.float64)
}


def run_chunked(program: Callable[..., None], x: np.ndarray, out: np.ndarray, tmps: Sequence[np.ndarray]) -> None:
    """``program(x_chunk, out_chunk, *tmp_chunks)`` over flat ``x`` and ``out``.

    Each temporary holds ``min(out.size, CHUNK)`` elements; ``program`` must read all of
    its ``x`` chunk before it writes its ``out`` chunk (so ``out`` may be ``x``).
    """
    n = out.size
    if n <= CHUNK:
        program(x, out, *tmps)
        return
    for i in range(0, n, CHUNK):
        m = min(CHUNK, n - i)
        program(x[i : i + m], out[i : i + m], *(t[:m] for t in tmps))


def _erf_core(t: np.ndarray, u: np.ndarray, p: np.ndarray, q: np.ndarray) -> None:
    """``p = erf(t)`` for float64 ``t`` (clamped in place); ``u`` and ``q`` are scratch."""
    np.maximum(t, _MINUS_FOUR, out=t)
    np.minimum(t, _FOUR, out=t)
    np.multiply(t, t, u)
    np.multiply(u, _P[6], p)
    for c in _P[5:0:-1]:
        np.add(p, c, p)
        np.multiply(p, u, p)
    np.add(p, _P[0], p)
    np.multiply(u, _Q[5], q)
    for c in _Q[4:0:-1]:
        np.add(q, c, q)
        np.multiply(q, u, q)
    np.add(q, _Q[0], q)
    np.divide(p, q, p)
    np.multiply(p, t, p)


def _erf_exact(t: np.ndarray, p: np.ndarray) -> None:
    """``p = erf(t)`` with ``math.erf`` (float64 results)."""
    p[...] = np.fromiter(map(math.erf, t.tolist()), np.float64, t.size)


def _erf_rational(x: np.ndarray, out: np.ndarray, t: np.ndarray, u: np.ndarray, p: np.ndarray,
                  q: np.ndarray) -> None:  # fmt: skip
    np.copyto(t, x)
    _erf_core(t, u, p, q)
    np.copyto(out, p, casting="same_kind")


def _erf_float64(x: np.ndarray, out: np.ndarray) -> None:
    _erf_exact(x, out)


def _gelu_erf_rational(x: np.ndarray, out: np.ndarray, t: np.ndarray, u: np.ndarray, p: np.ndarray,
                       q: np.ndarray) -> None:  # fmt: skip
    np.multiply(x, _RSQRT2, t, dtype=np.float64)
    _erf_core(t, u, p, q)
    np.add(p, _ONE, p)
    # The clamped rational erf(-inf) is -1 + tiny, not -1: the reference's -inf * 0 = NaN
    # would come out -inf. Put the exact 1 + erf(-inf) = 0 back where x is -inf.
    np.copyto(p, 0.0, where=np.isneginf(x))
    np.multiply(p, x, p)
    np.multiply(p, _HALF, out, casting="same_kind")


def _gelu_erf_float64(x: np.ndarray, out: np.ndarray, t: np.ndarray, p: np.ndarray) -> None:
    np.multiply(x, _RSQRT2, t)
    _erf_exact(t, p)
    np.add(p, _ONE, p)
    np.multiply(p, x, p)
    np.multiply(p, _HALF, out)


def _gelu_tanh(x: np.ndarray, out: np.ndarray, t: np.ndarray) -> None:
    # 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), with t in the compute dtype.
    k, one, c, half = _GELU_TANH[t.dtype]
    np.multiply(x, x, t, dtype=t.dtype)
    np.multiply(t, k, t)
    np.add(t, one, t)
    np.multiply(t, x, t)
    np.multiply(t, c, t)
    np.tanh(t, t)
    np.add(t, one, t)
    np.multiply(t, x, t)
    np.multiply(t, half, out, casting="same_kind")


def erf_program(dtype: np.dtype) -> tuple[Callable[..., None], tuple[np.dtype, ...]]:
    """The chunk program computing erf into ``dtype`` and the dtypes of its temporaries."""
    if dtype == np.float64:
        return _erf_float64, ()
    return _erf_rational, (np.dtype(np.float64),) * 4


def gelu_program(dtype: np.dtype, approximate: str) -> tuple[Callable[..., None], tuple[np.dtype, ...]]:
    """The chunk program computing gelu into ``dtype`` and the dtypes of its temporaries."""
    if approximate == "tanh":
        compute = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
        return _gelu_tanh, (compute,)
    if dtype == np.float64:
        return _gelu_erf_float64, (np.dtype(np.float64),) * 2
    return _gelu_erf_rational, (np.dtype(np.float64),) * 4


def scratch_count(n: int) -> int:
    """Elements in each temporary of a chunked program over ``n`` elements."""
    return min(n, CHUNK)
