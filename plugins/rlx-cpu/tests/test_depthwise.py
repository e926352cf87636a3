"""Depthwise convolution (groups = channels = filters) natively — the row kernel (a plane
at a time, vectorized along rows) and the lanes kernel (16 channels in the vector lanes) —
and its numpy fallback, against the reference: paddings, strides, dilations, bias, batch,
channel counts that leave the last block of lanes partly empty."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_cpu import CpuBackend, native_nn

CASES = {  # name -> (x shape, kernel, bias?, conv2d kwargs)
    "3x3 padding 1, bias (MobileNet)": ((1, 8, 9, 11), 3, True, {"padding": 1}),
    "5x5 stride 2, asymmetric padding": ((2, 5, 10, 7), 5, False, {"stride": 2, "padding": (2, 1, 2, 2)}),
    "3x3 stride 2 dilation 2, no padding": ((1, 4, 12, 12), 3, True, {"stride": 2, "dilation": 2}),
    "1x1": ((1, 3, 6, 6), 1, True, {}),
    "7x7 over 14x14, 20 channels (ConvNeXt's: the lanes kernel's general loop)": ((1, 20, 14, 14), 7, True,
                                                                                 {"padding": 3}),
    "padding only on the right and top": ((1, 6, 7, 9), 3, True, {"padding": (0, 2, 1, 0)}),
    "padding wider than the kernel": ((1, 2, 5, 5), 3, False, {"padding": 3}),
    "5x5 over 40x40, 48 channels (every core, one padded plane each)": ((2, 48, 40, 40), 5, True, {"padding": 2}),
    "5x5 over 7x7, 37 channels (a last block of 5 lanes)": ((1, 37, 7, 7), 5, True, {"padding": 2}),
    "3x3 stride 2 over 14x14, batch 3, 20 channels": ((3, 20, 14, 14), 3, False, {"stride": 2, "padding": 1}),
    "3x3 over a 33-wide plane (the row kernel's own case)": ((1, 3, 8, 33), 3, True, {"padding": 1}),
    "3x3 stride 2 over 112x112 (the stride-2 row kernel's own case)": ((1, 4, 112, 112), 3, True,
                                                                       {"stride": 2, "padding": 1}),
    "3x3 stride 2, odd width, right padding only": ((2, 3, 9, 61), 3, False, {"stride": 2, "padding": (0, 0, 1, 1)}),
    "3x3 stride 2, even padded width": ((1, 2, 8, 64), 3, True, {"stride": 2, "padding": (1, 1, 0, 1)}),
    "16 lanes, a last row and column never read (no transposed interleave)": ((1, 16, 10, 9), 3, False,
                                                                              {"stride": 2}),
    "32 lanes over 9x9 (81 pixels: 5 transposed groups and one pixel)": ((1, 32, 9, 9), 3, True, {"padding": 1}),
    "5x5 over 13x13, 17 channels (groups of 7 pixels, one past the row)": ((1, 17, 13, 13), 5, True, {"padding": 2}),
    "3x3 over 10x10 (groups of 5 pixels)": ((1, 16, 10, 10), 3, True, {"padding": 1}),
    "5x5 stride 2 over 12x12 (6 a row: groups of 6)": ((1, 16, 12, 12), 5, True, {"stride": 2, "padding": 2}),
    "3x3 stride 2 over 14x14, 7 a row (groups of 7)": ((2, 24, 14, 14), 3, True, {"stride": 2, "padding": 1}),
    "3x3 stride 2 over 90x90, 20 channels (16 lanes and 4)": ((1, 20, 90, 90), 3, True, {"stride": 2, "padding": 1}),
    "3x3 dilation 2 over 60x60 (the general loop)": ((1, 16, 60, 60), 3, False, {"dilation": 2, "padding": 2}),
    "5x5 over 64x61, asymmetric padding (rows past x at the bottom)": ((1, 16, 64, 61), 5, True,
                                                                          {"padding": (0, 2, 4, 2)}),
}


def _graph(xs: tuple[int, ...], k: int, bias: bool, kwargs: dict[str, Any]) -> Graph:
    rng = np.random.default_rng(0)
    c = xs[1]
    g = Graph("depthwise")
    w = g.param("w", rng.standard_normal((c, 1, k, k), dtype=np.float32))
    b = g.param("b", rng.standard_normal(c, dtype=np.float32)) if bias else None
    g.set_outputs([g.conv2d(g.input("x", xs), w, b, groups=c, **kwargs)])
    return g


@pytest.mark.parametrize("kernel", ["rows", "lanes", "chosen"])
@pytest.mark.parametrize("name", list(CASES))
def test_depthwise_runs_natively_and_matches_the_reference(native_lib, monkeypatch, name, kernel):
    lib = native_lib
    calls: dict[str, list[Any]] = {"rows": [], "lanes": [], "im2col": []}
    for attr, key in (("depthwise", "rows"), ("depthwise_lanes", "lanes"), ("im2col", "im2col")):
        real = getattr(lib, attr)
        monkeypatch.setattr(lib, attr, lambda *a, real=real, key=key: (calls[key].append(a), real(*a))[1])
    if kernel != "chosen":
        monkeypatch.setattr(native_nn, "_rows_vectorize", lambda *a: kernel == "rows")
    g = _graph(*CASES[name])
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    cg = rlx.compile(g, device="cpu", registry=reg)
    x = np.random.default_rng(1).standard_normal(CASES[name][0], dtype=np.float32)
    (got,) = cg.run({"x": x})
    assert (calls["rows"] or calls["lanes"]) and not calls["im2col"], "no depthwise kernel ran"
    if kernel != "chosen":
        assert calls[kernel] and not calls["lanes" if kernel == "rows" else "rows"], f"the {kernel} kernel did not run"
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)
    new_w = np.random.default_rng(2).standard_normal(g.value(g.params[0]).shape, dtype=np.float32)
    cg.set_param("w", new_w)  # the row kernel reads the weights in place; the lanes kernel's are packed again
    (got,) = cg.run({"x": x})
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x}, params={"w": new_w})[0], rtol=1e-5, atol=1e-5)
    if CASES[name][2]:  # the bias too (packed with the lanes kernel's filters)
        new_b = np.random.default_rng(3).standard_normal(CASES[name][0][1], dtype=np.float32)
        cg.set_param("b", new_b)
        (got,) = cg.run({"x": x})
        want = reference.evaluate(g, {"x": x}, params={"w": new_w, "b": new_b})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_narrow_planes_and_most_strides_take_the_lanes_kernel_wide_rows_the_row_kernels():
    """The choice the two kernels' measurements made (BENCHMARKS.md, depthwise)."""
    assert native_nn._rows_vectorize(3, 3, (1, 1), (1, 1), 112)
    assert not native_nn._rows_vectorize(5, 5, (1, 1), (1, 1), 112)  # 5x5: the lanes' eight sums in flight
    assert not native_nn._rows_vectorize(5, 5, (1, 1), (1, 1), 14)  # MobileNet's 14x14 and 7x7 planes
    assert native_nn._rows_vectorize(3, 3, (2, 2), (1, 1), 56)  # stride 2 over rows split into even/odd columns
    assert not native_nn._rows_vectorize(3, 3, (2, 2), (1, 1), 28)
    assert not native_nn._rows_vectorize(5, 5, (2, 2), (1, 1), 56)
    assert not native_nn._rows_vectorize(3, 3, (3, 3), (1, 1), 112)
    assert not native_nn._rows_vectorize(3, 3, (1, 1), (2, 2), 112)
    assert not native_nn._rows_vectorize(7, 7, (1, 1), (1, 1), 112)


@pytest.mark.parametrize("name", list(CASES))
def test_numpy_fallback_matches_the_reference(name):
    xs, k, bias, kwargs = CASES[name]
    g = _graph(xs, k, bias, kwargs)
    node = g.node(g.outputs[0])
    a = node.attrs
    n, c, h, w = xs
    oh, ow = node.shape[2:]
    geometry = (n * c, c, h, w, k, k, *a["stride"], *a["dilation"], a["padding"][0], a["padding"][1], oh, ow)
    x = np.random.default_rng(3).standard_normal(xs, dtype=np.float32)
    out = np.empty(node.shape, np.float32)
    weights = g.value(g.params[0])
    native_nn._depthwise_numpy(geometry)(x, weights, g.value(g.params[1]) if bias else None, out)
    np.testing.assert_allclose(out, reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)
