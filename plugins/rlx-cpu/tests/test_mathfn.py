"""Accuracy and edge cases of the cpu backend's erf and gelu (``rlx_cpu.mathfn``).

The float32 erf is ``tanh(x * P(x^2))``; its documented accuracy is 4 ulp against
``math.erf``, with the edges exact. These tests hold it to that on a dense grid, across
chunk boundaries and in place, so a refit of the coefficients cannot silently lose bits.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from rlx_cpu import mathfn


def _run(program_and_dtypes, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    program, dtypes = program_and_dtypes
    out = np.empty_like(x) if out is None else out
    tmps = [np.empty(mathfn.scratch_count(x.size), d) for d in dtypes]
    mathfn.run_chunked(program, x.reshape(-1), out.reshape(-1), tmps)
    return out


def _gelu64(v: float) -> float:
    if math.isnan(v) or v == -math.inf:
        return math.nan  # -inf * 0, as the reference computes it
    if v == math.inf:
        return math.inf
    return v * 0.5 * (1.0 + math.erf(v / math.sqrt(2.0)))


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


@pytest.fixture(scope="module")
def grid() -> np.ndarray:
    # Dense over the whole curved part, both signs, tiny values too; more elements than
    # one chunk so the chunk loop runs.
    dense = np.linspace(-4.5, 4.5, 90001)
    tiny = np.geomspace(1e-30, 1e-2, 2000)
    x = np.concatenate([dense, tiny, -tiny]).astype(np.float32)
    assert x.size > mathfn.CHUNK
    return x


def test_float32_erf_within_4_ulp(grid: np.ndarray) -> None:
    got = _run(mathfn.erf_program(np.dtype(np.float32)), grid)
    want = np.array([math.erf(float(v)) for v in grid])
    ulps = _ulps(got, want)
    assert ulps.max() <= 4.0, f"erf off by {ulps.max():.2f} ulp at x={grid[ulps.argmax()]!r}"


def test_float32_erf_edges_are_exact() -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5.0, -5.0, 1e30, -3e38, 1e-45], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # overflow on the way to the limit is by design, silent
        got = _run(mathfn.erf_program(np.dtype(np.float32)), x)
    np.testing.assert_array_equal(got[:4], [0.0, -0.0, 1.0, -1.0])
    assert np.signbit(got[1]) and np.isnan(got[4])
    np.testing.assert_array_equal(got[5:9], [1.0, -1.0, 1.0, -1.0])
    assert got[9] == np.float32(1e-45)  # 1.128 * the smallest subnormal rounds to it


def test_float32_gelu_matches_within_tolerance(grid: np.ndarray) -> None:
    got = _run(mathfn.gelu_program(np.dtype(np.float32), "none"), grid)
    want = np.array([_gelu64(float(v)) for v in grid])
    err = np.abs(got.astype(np.float64) - want)
    bound = 1.5e-7 + 2e-7 * np.abs(want)
    assert np.all(err <= bound), f"error {err.max():.3g} at x={grid[np.argmax(err - bound)]!r}"
    near = grid >= -2.0  # the documented relative bound; the far negative tail has only the absolute one
    rel = err[near] / np.maximum(np.abs(want[near]), 1e-30)
    assert np.all((rel <= 2e-6) | (np.abs(want[near]) < 1e-30)), f"relative error {rel.max():.3g}"


def test_float32_gelu_edges() -> None:
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -30.0, 30.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _run(mathfn.gelu_program(np.dtype(np.float32), "none"), x)
    assert got[0] == np.inf and np.isnan(got[1]) and np.isnan(got[2])
    assert got[3] == 0.0 and got[4] == 0.0 and got[5] == 30.0


def test_in_place_and_float16(grid: np.ndarray) -> None:
    want = _run(mathfn.erf_program(np.dtype(np.float32)), grid)
    x = grid.copy()
    _run(mathfn.erf_program(np.dtype(np.float32)), x, out=x)  # out is x
    np.testing.assert_array_equal(x, want)
    h = grid.astype(np.float16)
    got16 = _run(mathfn.erf_program(np.dtype(np.float16)), h)
    ref16 = np.array([math.erf(float(v)) for v in h])
    assert np.abs(got16.astype(np.float64) - ref16).max() <= 2.0**-11  # half an ulp of 1 in float16


def test_float64_erf_is_math_erf() -> None:
    x = np.linspace(-5, 5, 1001)
    got = _run(mathfn.erf_program(np.dtype(np.float64)), x)
    np.testing.assert_array_equal(got, [math.erf(v) for v in x])
