"""Atrous convolutions whose outer taps reach only a border of the outputs: one product
per tap over what it reaches (``rlx_cpu.sparse_taps``), the same answer as the dense
kernels."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_cpu import CpuBackend, sparse_taps

F32 = np.float32


def _brute(x_hw: tuple[int, int], out_hw: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
           dilation: tuple[int, int], pads: tuple[int, int]) -> set[tuple[int, int, int, int]]:
    """(ki, kj, oy, ox) for every tap read inside the image, counted one by one."""
    return {(ki, kj, oy, ox) for ki in range(kernel[0]) for kj in range(kernel[1])
            for oy in range(out_hw[0]) for ox in range(out_hw[1])
            if 0 <= oy * stride[0] + ki * dilation[0] - pads[0] < x_hw[0]
            and 0 <= ox * stride[1] + kj * dilation[1] - pads[1] < x_hw[1]}


@settings(max_examples=200, deadline=None)
@given(h=st.integers(1, 20), w=st.integers(1, 20), k=st.integers(1, 5), s=st.integers(1, 3), d=st.integers(1, 14),
       p=st.integers(0, 30))
def test_the_rectangles_are_exactly_the_taps_that_meet_the_image(h: int, w: int, k: int, s: int, d: int,
                                                                  p: int) -> None:
    oh, ow = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    if oh < 1 or ow < 1:
        return
    rects = sparse_taps.tap_rectangles((h, w), (oh, ow), (k, k), (s, s), (d, d), (p, p))
    got = {(ki, kj, oy, ox) for ki, kj, r0, r1, c0, c1 in rects for oy in range(r0, r1) for ox in range(c0, c1)}
    assert got == _brute((h, w), (oh, ow), (k, k), (s, s), (d, d), (p, p))


def _compile(g: Graph) -> rlx.CompiledGraph:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


def _aspp(batch: int, size: int, dilation: int, stride: int = 1, bias: bool = True) -> Graph:
    """relu(x) (an input the plan holds, as inside a network) into a 3x3 atrous
    convolution and a ReLU after it (the fused epilogue)."""
    rng = np.random.default_rng(0)
    g = Graph(f"aspp-{dilation}")
    x = g.relu(g.input("x", (batch, 12, size, size)))
    w = g.param("w", (rng.standard_normal((10, 12, 3, 3)) / 6).astype(F32))
    b = g.param("b", rng.standard_normal(10).astype(F32)) if bias else None
    g.set_outputs([g.relu(g.conv2d(x, w, b, stride=stride, padding=dilation, dilation=dilation))])
    return g


@pytest.mark.parametrize(("batch", "size", "dilation", "stride", "bias"), [
    (1, 14, 12, 1, True),   # DeepLabV3's pyramid at 224x224: rows 12-13 and 0-1 for the outer taps
    (2, 14, 8, 1, False),   # two images, no bias
    (1, 17, 9, 2, True),    # stride 2: the windows copied
    (1, 9, 5, 1, True),
])
def test_a_sparse_atrous_convolution_matches_the_reference(monkeypatch: pytest.MonkeyPatch, batch: int, size: int,
                                                          dilation: int, stride: int, bias: bool) -> None:
    taken: list[Any] = []
    real = sparse_taps.sparse_tap_steps
    monkeypatch.setattr("rlx_cpu.nn_kernels.sparse_tap_steps", lambda *a: (taken.append(real(*a)), taken[-1])[1])
    g = _aspp(batch, size, dilation, stride, bias)
    cg = _compile(g)
    assert taken and taken[0] is not None
    x = np.random.default_rng(1).standard_normal((batch, 12, size, size)).astype(F32)
    np.testing.assert_allclose(cg.run({"x": x})[0], reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)
    new = {"w": np.random.default_rng(2).standard_normal((10, 12, 3, 3)).astype(F32) / 6}
    if bias:
        new["b"] = np.random.default_rng(3).standard_normal(10).astype(F32)
    for name, value in new.items():
        cg.set_param(name, value)
    want = reference.evaluate(g, {"x": x}, params=new)[0]
    np.testing.assert_allclose(cg.run({"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_a_dense_enough_atrous_convolution_keeps_the_dense_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dilation 2 over 28x28: the taps meet the image at 86% of the outputs, the dense
    kernels' case."""
    taken: list[Any] = []
    real = sparse_taps.sparse_tap_steps
    monkeypatch.setattr("rlx_cpu.nn_kernels.sparse_tap_steps", lambda *a: (taken.append(real(*a)), taken[-1])[1])
    g = _aspp(1, 28, 2)
    cg = _compile(g)
    assert taken == [None]
    x = np.random.default_rng(1).standard_normal((1, 12, 28, 28)).astype(F32)
    np.testing.assert_allclose(cg.run({"x": x})[0], reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)
