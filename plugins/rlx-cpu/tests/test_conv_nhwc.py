"""The channels-inner convolution kernel (``native.c``'s ``rlx_conv_nhwc``) and the step
that takes it for small output planes (``rlx_cpu.conv_nhwc``): the same answer as the
reference in every layout, shape and epilogue."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_cpu import CpuBackend, conv_nhwc, native

F32 = np.float32
needs_native = pytest.mark.skipif(native.library() is None, reason="rlx-cpu's native library is not built here")


def _conv_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int, dilation: int, pad: int,
              oh: int, ow: int) -> np.ndarray:
    """float64 convolution of one NCHW image (c, h, w), zero padding ``pad`` top/left."""
    _c, h, wd = x.shape
    o, _, kh, kw = w.shape
    y = np.zeros((o, oh, ow)) if b is None else np.repeat(b.astype(np.float64), oh * ow).reshape(o, oh, ow)
    for ki in range(kh):
        for kj in range(kw):
            for oy in range(oh):
                iy = oy * stride + ki * dilation - pad
                if not 0 <= iy < h:
                    continue
                for ox in range(ow):
                    ix = ox * stride + kj * dilation - pad
                    if 0 <= ix < wd:
                        y[:, oy, ox] += w[:, :, ki, kj].astype(np.float64) @ x[:, iy, ix].astype(np.float64)
    return y


@needs_native
@settings(max_examples=60, deadline=None)
@given(c=st.sampled_from([1, 3, 16, 37, 130]), o=st.sampled_from([1, 16, 20, 24, 47, 64, 100, 130]),
       h=st.integers(1, 10), w=st.integers(1, 17), k=st.integers(1, 4), stride=st.integers(1, 2),
       dilation=st.integers(1, 2), pad=st.integers(0, 2), layout=st.integers(0, 3), threads=st.integers(1, 2),
       bias=st.booleans())
def test_the_kernel_matches_the_reference(c: int, o: int, h: int, w: int, k: int, stride: int, dilation: int,
                                          pad: int, layout: int, threads: int, bias: bool) -> None:
    """Any channels (partial vectors with tails of 1, 2, 4, 8 and 15 lanes, and blocks of 64
    out; k blocks past 113 in at 3x3), windows, strides, dilations and padding, x and y each
    NCHW or NHWC, one thread or two."""
    oh, ow = (h + 2 * pad - dilation * (k - 1) - 1) // stride + 1, (w + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    if oh < 1 or ow < 1:
        return
    lib = native.library()
    rng = np.random.default_rng(c * 1000 + o)
    x = rng.standard_normal((c, h, w)).astype(F32)
    wt = rng.standard_normal((o, c, k, k)).astype(F32)
    b = rng.standard_normal(o).astype(F32) if bias else None
    wpk = np.zeros(lib.conv_nhwc_pack_size(o, c, k, k), F32)
    lib.conv_nhwc_pack(wt.ctypes.data, o, c, k, k, wpk.ctypes.data)
    xin = x if layout & 1 else np.ascontiguousarray(x.transpose(1, 2, 0))
    y = np.full((o, oh, ow) if layout & 2 else (oh, ow, o), np.nan, F32)
    scratch = np.full(lib.conv_nhwc_scratch(c, h, w, o, oh, ow, layout), np.nan, F32)  # the zeros are its own
    lib.conv_nhwc(xin.ctypes.data, wpk.ctypes.data, 0 if b is None else b.ctypes.data, y.ctypes.data,
                  scratch.ctypes.data, c, h, w, o, k, k, stride, stride, dilation, dilation, pad, pad, oh, ow, layout,
                  1, threads, None)
    got = y if layout & 2 else y.transpose(2, 0, 1)
    want = _conv_ref(x, wt, b, stride, dilation, pad, oh, ow)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(c * k * k))


class _Epi(ctypes.Structure):
    """``rlx_epilogue`` with only a clamp (the kernel clamps in its tiles, no program)."""
    _fields_ = [("meta", ctypes.c_void_p), ("ptrs", ctypes.c_void_p), ("vml", ctypes.c_void_p),
                ("work", ctypes.c_void_p), ("per", ctypes.c_int64), ("clamp", ctypes.c_int64),
                ("lo", ctypes.c_float), ("hi", ctypes.c_float)]


@needs_native
@pytest.mark.parametrize("layout", [0, 3])
def test_a_clamp_is_applied_after_the_last_k_block_and_keeps_nan(layout: int) -> None:
    """ReLU6 over 130 input channels (two k blocks at 3x3: a clamp after the first would
    change the sum), with a NaN in the image (NaN stays NaN, as numpy's)."""
    lib = native.library()
    rng = np.random.default_rng(5)
    c, o, h = 130, 40, 7
    x = rng.standard_normal((c, h, h)).astype(F32)
    x[3, 2, 2] = np.nan
    wt = (rng.standard_normal((o, c, 3, 3)) / 4).astype(F32)
    wpk = np.zeros(lib.conv_nhwc_pack_size(o, c, 3, 3), F32)
    lib.conv_nhwc_pack(wt.ctypes.data, o, c, 3, 3, wpk.ctypes.data)
    xin = x if layout & 1 else np.ascontiguousarray(x.transpose(1, 2, 0))
    y = np.zeros((o, h, h) if layout & 2 else (h, h, o), F32)
    scratch = np.zeros(lib.conv_nhwc_scratch(c, h, h, o, h, h, layout), F32)
    epi = _Epi(None, None, None, None, 0, 1, 0.0, 6.0)
    lib.conv_nhwc(xin.ctypes.data, wpk.ctypes.data, 0, y.ctypes.data, scratch.ctypes.data, c, h, h, o, 3, 3, 1, 1,
                  1, 1, 1, 1, h, h, layout, 1, 2, ctypes.addressof(epi))
    got = y if layout & 2 else y.transpose(2, 0, 1)
    want = _conv_ref(x, wt, None, 1, 1, 1, h, h)
    with np.errstate(invalid="ignore"):
        want = np.where(np.isnan(want), np.nan, np.clip(want, 0.0, 6.0))
    assert np.isnan(got).sum() == np.isnan(want).sum() > 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def _compile(g: Graph) -> rlx.CompiledGraph:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


def _block(batch: int, size: int, residual: bool, bias: bool, stride: int = 1) -> Graph:
    """ResNet's last stage in small: relu(x) into a 3x3 convolution over a 7x7 plane, then
    a residual add and ReLU (an epilogue program) or a ReLU alone (a clamp)."""
    rng = np.random.default_rng(0)
    g = Graph("stage4")
    x = g.relu(g.input("x", (batch, 24, size, size)))
    w = g.param("w", (rng.standard_normal((24, 24, 3, 3)) / 8).astype(F32))
    b = g.param("b", rng.standard_normal(24).astype(F32)) if bias else None
    y = g.conv2d(x, w, b, stride=stride, padding=1)
    g.set_outputs([g.relu(g.add(y, x) if residual else y)])
    return g


@pytest.mark.parametrize(("batch", "residual", "bias", "stride", "size"), [
    (2, True, True, 1, 7),
    (1, False, True, 1, 7),
    (3, True, False, 1, 5),
    (2, False, False, 2, 13),
    (2, True, True, 1, 14),  # rows of two whole tiles (WIDE_WIDTH)
    (1, False, True, 2, 28),  # into 14x14
])
def test_small_planes_take_the_kernel_and_match_the_reference(monkeypatch: pytest.MonkeyPatch, batch: int,
                                                             residual: bool, bias: bool, stride: int,
                                                             size: int) -> None:
    taken: list[Any] = []
    real = conv_nhwc.conv_nhwc_steps
    monkeypatch.setattr("rlx_cpu.nn_kernels.conv_nhwc_steps", lambda *a: (taken.append(real(*a)), taken[-1])[1])
    g = _block(batch, size, residual, bias, stride)
    cg = _compile(g)
    lib = native.library()
    if lib is not None and lib.gemm_avx512:
        assert taken and taken[0] is not None
    x = np.random.default_rng(1).standard_normal((batch, 24, size, size)).astype(F32)
    np.testing.assert_allclose(cg.run({"x": x})[0], reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)
    new = {"w": (np.random.default_rng(2).standard_normal((24, 24, 3, 3)) / 8).astype(F32)}
    if bias:
        new["b"] = np.random.default_rng(3).standard_normal(24).astype(F32)
    for name, value in new.items():
        cg.set_param(name, value)
    np.testing.assert_allclose(cg.run({"x": x})[0], reference.evaluate(g, {"x": x}, params=new)[0], rtol=1e-5,
                               atol=1e-5)


def test_wider_planes_and_pointwise_convolutions_keep_the_implicit_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[Any] = []
    real = conv_nhwc.conv_nhwc_steps
    monkeypatch.setattr("rlx_cpu.nn_kernels.conv_nhwc_steps", lambda *a: (taken.append(real(*a)), taken[-1])[1])
    rng = np.random.default_rng(0)
    g = Graph("wide")
    x = g.input("x", (1, 24, 8, 8))  # (a tile and a sliver a row; 12 and 15 wide alike)
    y = g.conv2d(x, g.param("w", rng.standard_normal((24, 24, 3, 3)).astype(F32)), None, padding=1)
    g.set_outputs([g.conv2d(g.relu(y), g.param("p", rng.standard_normal((24, 24, 1, 1)).astype(F32)), None)])
    cg = _compile(g)
    assert all(t is None for t in taken)
    xv = rng.standard_normal((1, 24, 8, 8)).astype(F32)
    np.testing.assert_allclose(cg.run({"x": xv})[0], reference.evaluate(g, {"x": xv})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("c", "o", "size", "taken_here"), [
    (128, 32, 17, True),   # DenseNet's growth convolution over a plane wider than two tiles
    (64, 16, 9, True),
    (96, 32, 17, False),   # fewer than 4 inputs an output: the implicit GEMM
    (128, 48, 17, False),  # more than 32 outputs
])
def test_few_outputs_from_many_inputs_take_the_kernel_over_any_plane(monkeypatch: pytest.MonkeyPatch, c: int, o: int,
                                                                     size: int, taken_here: bool) -> None:
    """A 3x3 convolution of at most ``FEW_OUTPUTS`` channels from ``FEW_RATIO`` times as
    many runs on the channels-inner kernel whatever its plane (the implicit GEMM would copy
    kw times its larger input for few rows of products); others keep the plane rules.
    Both as the reference, with a fused ReLU and after ``set_param``."""
    taken: list[Any] = []
    real = conv_nhwc.conv_nhwc_steps
    monkeypatch.setattr("rlx_cpu.nn_kernels.conv_nhwc_steps", lambda *a: (taken.append(real(*a)), taken[-1])[1])
    rng = np.random.default_rng(c + o)
    g = Graph("growth")
    x = g.relu(g.input("x", (2, c, size, size)))
    w = g.param("w", (rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c)).astype(F32))
    g.set_outputs([g.relu(g.conv2d(x, w, g.param("b", rng.standard_normal(o).astype(F32)), padding=1))])
    cg = _compile(g)
    lib = native.library()
    if lib is not None and lib.gemm_avx512:
        assert bool(taken and taken[0] is not None) == taken_here
    xv = rng.standard_normal((2, c, size, size)).astype(F32)
    np.testing.assert_allclose(cg.run({"x": xv})[0], reference.evaluate(g, {"x": xv})[0], rtol=1e-4, atol=1e-4)
    new = {"w": (rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c)).astype(F32)}
    cg.set_param("w", new["w"])
    np.testing.assert_allclose(cg.run({"x": xv})[0], reference.evaluate(g, {"x": xv}, params=new)[0], rtol=1e-4,
                               atol=1e-4)
