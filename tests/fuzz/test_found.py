"""Minimal reproductions of bugs the fuzzer found in code outside tests/, each marked
``xfail(strict=True)`` until fixed (then the marker must go: strict makes a fixed bug
fail loudly). While one is open, ``_graphs.KNOWN_BUGS`` keeps the generator from
drawing that pattern, so the fuzzer keeps looking for new bugs instead of re-finding it.
"""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx


@pytest.mark.parametrize(("a", "b"), [((2, 0), (0, 3)), ((2, 3), (3, 0))])
def test_matmul_with_an_empty_dimension_compiles(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    g = rlx.Graph("empty_gemm")
    g.set_outputs([g.matmul(g.input("a", a), g.input("b", b))])
    out = rlx.compile(g, device="cpu", policy=rlx.DevicePolicy()).run(
        {"a": np.ones(a, np.float32), "b": np.ones(b, np.float32)})[0]
    np.testing.assert_array_equal(out, np.zeros((a[0], b[1]), np.float32))
