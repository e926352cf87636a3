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


@pytest.mark.parametrize("device", rlx.available_devices())
@pytest.mark.parametrize(("a", "b"), [((0, 3), (3, 4)), ((2, 0), (0, 4)), ((2, 3), (3, 0))])
def test_empty_matmuls_on_every_device(device: str, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    """Found on opencl: a matmul with an empty output (an attention over a sliced-away
    query) divided by zero while generating its kernel."""
    g = rlx.Graph("empty_mm")
    g.set_outputs([g.matmul(g.input("a", a), g.input("b", b))])
    out = rlx.compile(g, device=device, policy=rlx.DevicePolicy()).run(
        {"a": np.ones(a, np.float32), "b": np.ones(b, np.float32)})[0]
    np.testing.assert_array_equal(out, np.zeros((a[0], b[1]), np.float32))


@pytest.mark.parametrize("device", rlx.available_devices())
def test_attention_over_an_empty_query_on_every_device(device: str) -> None:
    g = rlx.Graph("empty_attention")
    q = g.slice(g.input("q", (1, 1)), [0], [0], axes=[0])
    g.set_outputs([g.attention(q, g.input("k", (1, 1)), g.input("v", (1, 1)), scale=1.0)])
    ones = np.ones((1, 1), np.float32)
    out = rlx.compile(g, device=device, policy=rlx.DevicePolicy()).run({"q": ones, "k": ones, "v": ones})[0]
    assert out.shape == (0, 1)


@pytest.mark.parametrize("device", rlx.available_devices())
def test_softmax_over_an_empty_axis_when_decomposed(device: str) -> None:
    """Found by the unfused fuzz path: softmax's decomposition took a max over no values."""
    from support import PRIMITIVES, ToyBackend, registry_with

    g = rlx.Graph("empty_softmax")
    g.set_outputs([g.softmax(g.input("x", (3, 0)), axis=-1)])
    x = np.ones((3, 0), np.float32)
    reg = registry_with(ToyBackend("prims", ops=PRIMITIVES))
    assert rlx.compile(g, device="prims", policy=rlx.DevicePolicy(), registry=reg).run({"x": x})[0].shape == (3, 0)
    assert rlx.compile(g, device=device, policy=rlx.DevicePolicy()).run({"x": x})[0].shape == (3, 0)


@pytest.mark.skipif("opencl" not in rlx.available_devices(), reason="needs the opencl device")
def test_opencl_float64_pow_beside_nan_lanes() -> None:
    """Found by the NaN fuzz: PoCL's double8 pow returned other lanes' results; float64
    regions with pow now run scalar."""
    g = rlx.Graph("pow64")
    x = g.input("x", (8,), "float64")
    g.set_outputs([g.pow(x, g.param("p", np.float64(1.8079801160083866)))])
    xv = np.array([np.nan, 1.64356747, np.nan, 0.34103728, 0.95796572, np.nan, 0.40881783, -np.inf])
    out = rlx.compile(g, device="opencl", policy=rlx.DevicePolicy()).run({"x": xv})[0]
    np.testing.assert_allclose(out, rlx.reference.evaluate(g, {"x": xv})[0], rtol=1e-12, equal_nan=True)
