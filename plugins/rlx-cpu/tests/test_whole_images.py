"""Convolutions over a batch of small images in one call (``rlx_conv_gemm``'s and
``rlx_conv_nhwc``'s ``images``): each thread computes whole images, the batch's last
images short of a round on every thread; the same answers as one call per image and the
float64 reference, with the epilogue's operands read at each image's own outputs and the
kernels' scratch one a thread."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_cpu import CpuBackend, conv_nhwc, implicit_gemm, native, native_nn

IMAGES_ARG = 21  # rlx_conv_gemm's ``images``: after x, apk, toff, bias, y, xs and 15 sizes


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def compile_cpu(g: Graph) -> rlx.CompiledGraph:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


@pytest.fixture
def lib(native_lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> native.Native:
    """rlx's GEMM and implicit GEMM on every convolution, on two threads or more."""
    if native_lib.threads() < 2 or not native_lib.openmp:
        pytest.skip(f"one native thread here ({native_lib.threads()} cores, OpenMP {native_lib.openmp}): "
                    "no thread to give an image")
    monkeypatch.setenv("RLX_CPU_LAYOUT", "nchw")
    monkeypatch.setenv("RLX_CPU_GEMM", "native")
    monkeypatch.setenv("RLX_CPU_CONV", "implicit")
    monkeypatch.setattr(native_nn, "DIRECT_CONV_TAPS", 0)
    monkeypatch.setattr(conv_nhwc, "MAX_PIXELS", 0)  # the implicit GEMM, unless a test says otherwise
    monkeypatch.setattr(conv_nhwc, "WIDE_WIDTH", 0)
    monkeypatch.setattr(conv_nhwc, "FEW_OUTPUTS", 0)
    return native_lib


def spy(monkeypatch: pytest.MonkeyPatch, lib: native.Native, name: str = "conv_gemm") -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    real = getattr(lib, name)

    def record(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(lib, name, record)
    return calls


def block(batch: int, kernel: int, channels: int = 40) -> Graph:
    """A convolution into ``channels`` over 9 x 9 planes, its bias, a residual read at each
    output and a ReLU (the epilogue), from an input computed by the graph."""
    g = Graph("block")
    x = g.input("x", (batch, 24, 9, 9))
    skip = g.input("skip", (batch, channels, 9, 9))
    w = g.param("w", rand((channels, 24, kernel, kernel), 1) / (24 * kernel))
    y = g.conv2d(g.relu(x), w, g.param("b", rand((channels,), 2)), padding=kernel // 2)
    g.set_outputs([g.relu(g.add(y, skip))])
    return g


@pytest.mark.parametrize("panel", [8, 12, 32])
@pytest.mark.parametrize(("batch", "kernel"), [(2, 1), (5, 1), (8, 3), (3, 3)])
def test_whole_images_a_thread_compute_what_a_call_an_image_does(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                                 batch: int, kernel: int, panel: int) -> None:
    """One call for the batch (``images`` = the batch), its last image short of a round
    (5 or 3 on two threads) on every thread: the outputs of a call per image, and the
    reference, bit for bit against the former (the same sums in the same order); a 3x3's
    copy of each image in the scratch of the thread computing it."""
    monkeypatch.setattr(implicit_gemm, "conv_gemm_panel", lambda o, n, k: panel)
    calls = spy(monkeypatch, lib)
    g = block(batch, kernel)
    feeds = {"x": rand((batch, 24, 9, 9), 3), "skip": rand((batch, 40, 9, 9), 4)}
    (batched,) = compile_cpu(g).run(feeds)
    assert [c[IMAGES_ARG] for c in calls] == [batch], "not one call for the batch"
    calls.clear()
    monkeypatch.setattr(implicit_gemm, "WHOLE_IMAGE_MACS", 0)  # a call an image
    (each,) = compile_cpu(g).run(feeds)
    assert [c[IMAGES_ARG] for c in calls] == [1] * batch
    np.testing.assert_array_equal(batched, each)
    np.testing.assert_allclose(batched, reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_graph_input_convolved_whole_images_a_thread(lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's array (its address taken each run) straight into the batched call,
    run twice with other values."""
    calls = spy(monkeypatch, lib)
    g = Graph("direct")
    x = g.input("x", (4, 16, 7, 7))
    g.set_outputs([g.conv2d(x, g.param("w", rand((64, 16, 1, 1), 5) / 4), g.param("b", rand((64,), 6)))])
    cg = compile_cpu(g)
    for seed in (7, 8):
        feeds = {"x": rand((4, 16, 7, 7), seed)}
        (got,) = cg.run(feeds)
        np.testing.assert_allclose(got, reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)
    assert calls and all(c[IMAGES_ARG] == 4 for c in calls)


def test_large_images_keep_a_call_an_image_on_every_thread(lib: native.Native,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``WHOLE_IMAGE_MACS`` an image's product, split across the threads, is one call."""
    calls = spy(monkeypatch, lib)
    monkeypatch.setattr(implicit_gemm, "WHOLE_IMAGE_MACS", 40 * 24 * 81 - 1)
    g = block(4, 1)
    feeds = {"x": rand((4, 24, 9, 9), 3), "skip": rand((4, 40, 9, 9), 4)}
    (got,) = compile_cpu(g).run(feeds)
    assert [c[IMAGES_ARG] for c in calls] == [1] * 4
    np.testing.assert_allclose(got, reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("images", "threads"), [(3, 2), (4, 2), (1, 2), (5, 3)])
def test_the_kernel_splits_a_batch_into_rounds_and_a_rest(lib: native.Native, images: int, threads: int) -> None:
    """``rlx_conv_gemm`` called directly: rounds of whole images, then the rest on every
    thread, a 3x3 with padding (the copy's scratch one a thread) against numpy."""
    c, o, hw = 6, 20, 10
    x = rand((images, c, hw, hw), 9)
    w = rand((o, c, 3, 3), 10)
    bias = rand((o,), 11)
    k = c * 9
    toff = np.empty(k, np.int32)
    assert lib.conv_gemm_offsets(toff.ctypes.data, c, 3, 3, 1, 1, 1, 1, hw, hw) == 0
    apk = np.empty(lib.conv_gemm_pack_size(o, k, 12), np.float32)
    lib.conv_gemm_pack(w.ctypes.data, o, k, 12, apk.ctypes.data)
    xs = np.full(lib.conv_gemm_scratch(c, 3, 3, 1, 1, 1, 1, hw, hw) * threads, np.nan, np.float32)
    y = np.full((images, o, hw, hw), np.nan, np.float32)
    lib.conv_gemm(x.ctypes.data, apk.ctypes.data, toff.ctypes.data, bias.ctypes.data, y.ctypes.data, xs.ctypes.data,
                  c, hw, hw, o, 3, 3, 1, 1, 1, 1, 1, 1, hw, hw, 12, images, threads, None)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((images, o, hw, hw)) + bias.reshape(1, o, 1, 1)
    for ki in range(3):
        for kj in range(3):
            want += np.einsum("oc,nchw->nohw", w[:, :, ki, kj], xp[:, :, ki : ki + hw, kj : kj + hw])
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


NHWC_IMAGES_ARG = 20  # rlx_conv_nhwc's ``images``: after x, wpk, bias, y, scratch and 15 sizes


@pytest.mark.parametrize("batch", [4, 5])
def test_the_channels_inner_kernel_takes_whole_images_a_thread(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                               batch: int) -> None:
    """A 3x3 over 7x7 planes (``conv_nhwc_steps``: NCHW in and out, each image moved
    channels-last in the scratch of the thread computing it): one call for the batch,
    the outputs of a call an image bit for bit, and the reference."""
    if not lib.gemm_avx512:
        pytest.skip("the channels-inner kernel is built for AVX-512 and not taken here")
    monkeypatch.setattr(conv_nhwc, "MAX_PIXELS", 49)
    calls = spy(monkeypatch, lib, "conv_nhwc")
    g = Graph("small planes")
    x = g.input("x", (batch, 32, 7, 7))
    skip = g.input("skip", (batch, 48, 7, 7))
    y = g.conv2d(x, g.param("w", rand((48, 32, 3, 3), 1) / 40), g.param("b", rand((48,), 2)), padding=1)
    g.set_outputs([g.relu(g.add(y, skip))])
    feeds = {"x": rand((batch, 32, 7, 7), 3), "skip": rand((batch, 48, 7, 7), 4)}
    (batched,) = compile_cpu(g).run(feeds)
    assert [c[NHWC_IMAGES_ARG] for c in calls] == [batch], "not one call for the batch"
    calls.clear()
    monkeypatch.setattr(implicit_gemm, "WHOLE_IMAGE_MACS", 0)
    (each,) = compile_cpu(g).run(feeds)
    assert [c[NHWC_IMAGES_ARG] for c in calls] == [1] * batch
    np.testing.assert_array_equal(batched, each)
    np.testing.assert_allclose(batched, reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)
