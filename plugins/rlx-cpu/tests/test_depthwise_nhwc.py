"""The channels-last depthwise kernel (``native.c``'s ``rlx_depthwise_nhwc``, the step
``conv_nhwc.depthwise_steps`` builds inside native chains) and the pinning of OpenMP's
workers around the caller's CPU (``rlx_team_check``)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_cpu import conv_nhwc, native

F32 = np.float32
LIB = native.library()
needs_native = pytest.mark.skipif(LIB is None, reason="rlx-cpu's native library is not built here")


def _reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: tuple[int, int],
               dilation: tuple[int, int], pads: tuple[int, int], oh: int, ow: int) -> np.ndarray:
    """float64 depthwise convolution of NHWC ``x`` (zero padding ``pads`` top and left)."""
    n, h, wd, c = x.shape
    kh, kw = w.shape[2:]
    y = np.zeros((n, oh, ow, c)) + (0.0 if b is None else b.astype(np.float64))
    for i in range(kh):
        for j in range(kw):
            for oy in range(oh):
                iy = oy * stride[0] + i * dilation[0] - pads[0]
                if not 0 <= iy < h:
                    continue
                for ox in range(ow):
                    ix = ox * stride[1] + j * dilation[1] - pads[1]
                    if 0 <= ix < wd:
                        y[:, oy, ox] += x[:, iy, ix].astype(np.float64) * w[:, 0, i, j]
    return y


def _run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: tuple[int, int], dilation: tuple[int, int],
         pads: tuple[int, int], oh: int, ow: int, threads: int) -> np.ndarray:
    assert LIB is not None
    n, h, wd, c = x.shape
    kh, kw = w.shape[2:]
    wpk = np.zeros(LIB.depthwise_lanes_pack_size(c, kh * kw), F32)
    LIB.depthwise_lanes_pack(w.ctypes.data, 0 if b is None else b.ctypes.data, c, kh * kw, wpk.ctypes.data)
    per = LIB.depthwise_nhwc_scratch(c, kh, kw, *stride, *dilation, oh, ow)
    scratch = np.full(threads * per, np.nan, F32)  # the kernel's zeros are its own
    y = np.full((n, oh, ow, c), np.nan, F32)
    LIB.depthwise_nhwc(x.ctypes.data, wpk.ctypes.data, y.ctypes.data, scratch.ctypes.data, n, c, h, wd, kh, kw,
                       *stride, *dilation, *pads, oh, ow, threads, None)
    return y


@needs_native
@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 3), c=st.sampled_from([1, 5, 8, 16, 24, 37, 130, 144]), h=st.integers(1, 12),
       w=st.integers(1, 19), kh=st.sampled_from([1, 3, 5, 7]), kw=st.sampled_from([1, 3, 5]),
       stride=st.sampled_from([(1, 1), (2, 2), (1, 2), (3, 3)]), dilation=st.sampled_from([(1, 1), (2, 2), (1, 2)]),
       pad=st.integers(0, 3), threads=st.integers(1, 2), bias=st.booleans())
def test_the_kernel_matches_the_reference(n: int, c: int, h: int, w: int, kh: int, kw: int, stride: tuple[int, int],
                                          dilation: tuple[int, int], pad: int, threads: int, bias: bool) -> None:
    """Any channels (whole blocks of 16, the 8-lane tail of 24 or 72, odd tails, a group of
    eight blocks and one more at 144), windows (the unrolled 3x3 and 5x5 at stride 1 and
    2, and the general loop for the rest), strides, dilations, padding, bands split over one
    thread or two."""
    pads = (min(pad, (kh - 1) * dilation[0]), min(pad, (kw - 1) * dilation[1]))
    oh = (h + 2 * pads[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * pads[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if oh < 1 or ow < 1:
        return
    rng = np.random.default_rng(c * 100 + h * 10 + w)
    x = rng.standard_normal((n, h, w, c)).astype(F32)
    wt = rng.standard_normal((c, 1, kh, kw)).astype(F32)
    b = rng.standard_normal(c).astype(F32) if bias else None
    got = _run(x, wt, b, stride, dilation, pads, oh, ow, threads)
    np.testing.assert_allclose(got, _reference(x, wt, b, stride, dilation, pads, oh, ow), rtol=1e-4, atol=1e-4)


@needs_native
def test_nan_and_inf_stay_in_their_channels_and_windows() -> None:
    """A NaN reaches only the outputs whose windows read it, in its own channel (the
    partial block's zero lanes and the padding never mix into a neighbour)."""
    x = np.ones((1, 9, 9, 24), F32)
    x[0, 4, 4, 17] = np.nan
    x[0, 0, 0, 3] = np.inf
    wt = np.ones((24, 1, 3, 3), F32)
    y = _run(x, wt, None, (1, 1), (1, 1), (1, 1), 9, 9, 2)
    nan = np.argwhere(np.isnan(y))
    assert {tuple(p[1:3]) for p in nan} == {(i, j) for i in (3, 4, 5) for j in (3, 4, 5)}
    assert set(nan[:, 3]) == {17}
    assert np.isinf(y[0, :2, :2, 3]).all()
    others = np.delete(y, [3, 17], axis=3)
    assert np.isfinite(others).all()


@needs_native
def test_the_step_runs_numpy_where_the_kernel_cannot_take_an_array() -> None:
    """``depthwise_steps`` with a run-time input the kernel cannot take as it is (a
    strided view): its numpy form, with the epilogue's place kept."""
    from rlx_cpu.steps import Dyn, bind

    class Ctx:
        def __init__(self) -> None:
            self.kept: dict = {}

        def scratch(self, shape: tuple[int, ...], dtype: object) -> np.ndarray:
            return np.zeros(shape, dtype)

        def derived(self, w: np.ndarray, key: object, make: object, also: object = ()) -> np.ndarray:
            return make(w, None)  # type: ignore[operator]

    rng = np.random.default_rng(3)
    wt = rng.standard_normal((24, 1, 3, 3)).astype(F32)
    b = rng.standard_normal(24).astype(F32)
    out = np.zeros((2, 5, 5, 24), F32)
    steps = conv_nhwc.depthwise_steps(Dyn(0, (2, 10, 10, 24), F32), wt, b, out, (1, 1), (2, 2), (1, 1), Ctx(), None)
    assert steps is not None  # (the step does not ask for AVX-512: the plan does, takes_depthwise)
    big = rng.standard_normal((2, 10, 10, 48)).astype(F32)
    x = big[:, :, :, ::2]  # not contiguous
    slots = [x]
    for s in steps:
        bind(s, slots)()
    want = _reference(np.ascontiguousarray(x), wt, b, (2, 2), (1, 1), (1, 1), 5, 5)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@needs_native
@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs Linux and two CPUs")
def test_the_workers_are_pinned_again_when_the_caller_moves_onto_their_cpu() -> None:
    """``rlx_team_check``: nothing to do while the caller stays where it was; once it is
    made to run on the CPU a worker holds, the workers move (1), and the next check
    finds nothing to do (0). Kernels give the same answers on either side."""
    assert LIB is not None
    if not LIB.openmp or not LIB.bind_team(len(os.sched_getaffinity(0))):
        pytest.skip("no OpenMP team to pin here (RLX_CPU_BIND=0, or no OpenMP)")
    allowed = os.sched_getaffinity(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 14, 14, 64)).astype(F32)
    wt = rng.standard_normal((64, 1, 3, 3)).astype(F32)
    before = _run(x, wt, None, (1, 1), (1, 1), (1, 1), 14, 14, 2)
    try:
        LIB.team_check()
        assert LIB.team_check() == 0  # the caller has not moved
        moved = 0
        for cpu in sorted(allowed):  # one of these is a worker's CPU
            os.sched_setaffinity(0, {cpu})
            moved += LIB.team_check()
            assert LIB.team_check() == 0
        assert moved >= 1
        np.testing.assert_array_equal(_run(x, wt, None, (1, 1), (1, 1), (1, 1), 14, 14, 2), before)
    finally:
        os.sched_setaffinity(0, allowed)
