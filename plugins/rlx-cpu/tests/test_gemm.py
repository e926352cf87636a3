"""rlx's own float32 GEMM (``rlx_gemm`` in native.c, ``rlx_cpu.gemm``): every shape,
layout and batch it takes gives numpy's float64 answer (edges of the 12x32 tiles and of
the k blocks included), packed resident operands follow set_param, a caller's array it
cannot address goes through numpy, and ``RLX_CPU_GEMM`` picks the code that runs.

Skips (with the reason) where the native kernels were not built.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import numpy as np
import pytest

from rlx_core import reference
from rlx_core.ir import Graph
from rlx_core.plugin import CompileOptions
from rlx_cpu import CpuBackend, blas, ccall, conv_choice, gemm, native
from rlx_cpu.steps import Dyn, Step, bind

F32 = np.float32
SIZES = (1, 3, 13, 31, 33, 100, 257)


@pytest.fixture
def lib(native_lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> native.Native:
    """The native library, with every float32 product forced onto its GEMM (and every
    ungrouped convolution onto the implicit one)."""
    monkeypatch.setenv("RLX_CPU_GEMM", "native")
    monkeypatch.setenv("RLX_CPU_CONV", "implicit")
    return native_lib


def rand(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def check(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    k = a.shape[-1]
    np.testing.assert_allclose(got, want, rtol=0, atol=4 * k * np.finfo(F32).eps * (np.abs(want).max() + 1))


def gemm_call(step: Step) -> tuple[Callable[..., None], tuple[object, ...]] | None:
    """(function, bound arguments) of a ``ccall`` step, None for any other step."""
    return ccall.target(step)


def uses_gemm(step: Step, lib: native.Native) -> bool:
    call = gemm_call(step)
    return call is not None and call[0] is lib.gemm


def product(a: np.ndarray, b: np.ndarray, lib: native.Native) -> np.ndarray:
    out = np.empty((*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]), F32)
    step = gemm.native_step(a, b, out)
    assert step is not None and uses_gemm(step, lib)
    bind(step, [])()
    return out


# ----------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("m", SIZES)
def test_odd_shapes_match_float64(lib: native.Native, m: int) -> None:
    for n, k in itertools.product(SIZES, SIZES):
        a, b = rand((m, k), 1), rand((k, n), 2)
        check(product(a, b, lib), a, b)


def test_k_past_one_block_and_the_threads_split_both_ways(lib: native.Native) -> None:
    """k over 256 (C accumulated over k blocks), a split along rows (few columns) and along
    columns, on one thread and on every core."""
    for m, k, n in ((40, 600, 20), (300, 520, 49), (24, 1030, 700)):
        a, b = rand((m, k), 3), rand((k, n), 4)
        check(product(a, b, lib), a, b)
        with native.thread_cap(1):
            check(product(a, b, lib), a, b)


@pytest.mark.parametrize("m, k, n", [(1030, 3072, 200), (1024, 600, 777), (4100, 300, 150), (13, 1024, 40)])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_dense_layers_product_with_its_weights_packed(lib: native.Native, m: int, k: int, n: int,
                                                        threads: int) -> None:
    """A dense layer's product as the plan binds it: A (the activations) read in place,
    rows ``lda`` apart (3072 and 1024 terms: rows a multiple of 4 KiB apart), B packed once
    (``rlx_gemm_pack_b``), a bias per row of C: whole 12-row tiles (four row pointers) and
    a last partial one, partial column panels, many k blocks, and C's columns in blocks
    that keep a stripe of 1030 rows in L2 (fewer columns a block than the GEMM's own),
    and 4100 rows in chunks of rows, on one thread and split over two."""
    a, b, bias = rand((m, k), 11), rand((k, n), 12), rand((m,), 13)
    packed = np.zeros(lib.gemm_pack_b_size(n, k), F32)
    lib.gemm_pack_b(b.ctypes.data, n, 1, k, n, packed.ctypes.data)
    c = np.full((m, n), np.nan, F32)
    lib.gemm(m, n, k, a.ctypes.data, k, 1, 0, packed.ctypes.data, 0, 0, 0, c.ctypes.data, n, 0, 1, 2, threads,
             bias.ctypes.data, None)  # flags 2: B packed
    want = np.matmul(a.astype(np.float64), b.astype(np.float64)) + bias[:, None]
    np.testing.assert_allclose(c, want, rtol=0, atol=4 * k * np.finfo(F32).eps * (np.abs(want).max() + 1))


@pytest.mark.parametrize("ta, tb", [(False, True), (True, False), (True, True)])
def test_transposed_operands(lib: native.Native, ta: bool, tb: bool) -> None:
    m, k, n = 37, 70, 45
    a = rand((k, m), 5).T if ta else rand((m, k), 5)
    b = rand((n, k), 6).T if tb else rand((k, n), 6)
    check(product(a, b, lib), a, b)


def test_a_submatrix_with_a_leading_dimension(lib: native.Native) -> None:
    a, b = rand((50, 90), 7)[3:40, 5:70], rand((80, 60), 8)[10:75, 2:33]
    check(product(a, b, lib), a, b)


@pytest.mark.parametrize("sa, sb", [((5, 33, 40), (40, 31)), ((33, 40), (5, 40, 31)), ((5, 33, 40), (5, 40, 31)),
                                    ((2, 3, 13, 100), (2, 3, 100, 257)), ((6, 13, 31), (1, 31, 33))])
def test_batches_with_broadcast(lib: native.Native, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    a, b = rand(sa, 9), rand(sb, 10)
    check(product(a, b, lib), a, b)


def test_layouts_without_one_stride_are_not_taken(lib: native.Native) -> None:
    a, b = rand((64, 800))[:, ::2], rand((400, 16))
    assert gemm.native_step(a, b, np.empty((64, 16), F32)) is None
    a64 = rand((8, 8)).astype(np.float64)
    assert gemm.native_step(a64, a64, np.empty((8, 8))) is None


def test_a_callers_array_it_cannot_address_goes_through_numpy(lib: native.Native) -> None:
    w = rand((78, 40), 1)
    out = np.empty((30, 40), F32)
    step = gemm.native_step(Dyn(0, (30, 78), np.dtype(F32)), w, out)
    assert step is not None and isinstance(step.fn, (ccall._RunTimeCall, ccall._PackedRunTimeCall))
    x = rand((30, 78), 2)
    for arr in (x, np.asfortranarray(x), np.repeat(x, 2, axis=0)[::2]):
        out.fill(np.nan)
        bind(step, [arr])()
        check(out, x, w)


# ----------------------------------------------------------------------------- packed residents
PARAMS = {"cw": ((16, 20, 3, 3), 1), "cb": ((16,), 2), "gw": ((16, 8, 3, 3), 5), "gb": ((16,), 6),
          "w": ((324, 40), 3), "wt": ((40, 40), 4)}


def mlp_and_conv_graph(seed: int = 0) -> Graph:
    """A 3x3 convolution with bias (20 channels: the implicit GEMM, not the direct
    kernel), a grouped dilated one (im2col and the GEMM), then a dense layer and a
    transposed one, every weight a param."""
    v = {name: rand(shape, s + seed) for name, (shape, s) in PARAMS.items()}
    g = Graph("gemm-packed")
    x = g.input("x", (1, 20, 9, 9), "float32")
    c = g.conv2d(x, g.param("cw", v["cw"]), g.param("cb", v["cb"]), padding=1)
    c = g.conv2d(g.relu(c), g.param("gw", v["gw"]), g.param("gb", v["gb"]), padding=2, dilation=2, groups=2)
    y = g.matmul(g.reshape(g.relu(c), (4, 324)), g.param("w", v["w"]))
    g.set_outputs([g.add(y, g.matmul(y, g.transpose(g.param("wt", v["wt"]), (1, 0))))])
    return g


def test_packed_residents_follow_set_param(lib: native.Native) -> None:
    """Weights packed once for the GEMM (a dense layer's B, in either layout, and the
    implicit GEMM's weights) and a grouped convolution's weights with their bias column
    are refilled by set_param in place."""
    g = mlp_and_conv_graph()
    exe = CpuBackend().compile(g.freeze(), CompileOptions(device="cpu"))
    packs = [key[-1][0] for key in exe._derived_arrays if isinstance(key[-1], tuple)]
    assert sorted(packs) == ["conv_bias_column", "rlx_conv_gemm_pack", "rlx_gemm_pack_b", "rlx_gemm_pack_b"], packs
    x = rand((1, 20, 9, 9), 5)
    # outputs up to ~1e4: float32 sums in another order differ by ~1e-3 where they cancel
    np.testing.assert_allclose(exe.run({"x": x})[0], reference.evaluate(g, {"x": x})[0], rtol=1e-4, atol=1e-2)
    for name, (shape, s) in PARAMS.items():
        exe.set_param(name, rand(shape, s + 100))
    want = reference.evaluate(mlp_and_conv_graph(100), {"x": x})[0]
    np.testing.assert_allclose(exe.run({"x": x})[0], want, rtol=1e-4, atol=1e-2)


# ----------------------------------------------------------------------------- the choice
def test_convolutions_take_the_implicit_gemm_only_where_it_measured_as_fast(
        native_lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """RLX_CPU_CONV forces the way; ``auto`` times the implicit GEMM against im2col + the
    GEMM once, on answers that agree, and a convolution then runs the way measured."""
    monkeypatch.setenv("RLX_CPU_GEMM", "native")
    spy = []
    real = native_lib.conv_gemm
    monkeypatch.setattr(native_lib, "conv_gemm", lambda *a: (spy.append(a), real(*a))[1])
    g = Graph("conv")
    g.set_outputs([g.conv2d(g.input("x", (1, 8, 12, 12), "float32"), g.param("w", rand((16, 8, 3, 3), 1)),
                            padding=1)])
    for forced, implicit in (("implicit", True), ("im2col", False)):
        monkeypatch.setenv("RLX_CPU_CONV", forced)
        assert conv_choice.use_implicit() is implicit and conv_choice.describe().endswith(f"(RLX_CPU_CONV={forced})")
        spy.clear()
        CpuBackend().compile(g.freeze(), CompileOptions(device="cpu")).run({"x": rand((1, 8, 12, 12), 2)})
        assert bool(spy) is implicit
    monkeypatch.setenv("RLX_CPU_CONV", "auto")
    conv_choice.reset()
    try:
        assert conv_choice.describe().startswith("auto: the implicit GEMM is timed")
        chosen = conv_choice.use_implicit()
        assert re.fullmatch(r"(implicit GEMM|im2col) \(timed \d+\.\d\dx im2col's speed at 64 -> 64 3x3 over 28x28, "
                            r"\d+ threads\); few-tap ones: .*", conv_choice.describe())
        assert conv_choice.describe().startswith("implicit GEMM" if chosen else "im2col")
        spy.clear()
        CpuBackend().compile(g.freeze(), CompileOptions(device="cpu")).run({"x": rand((1, 8, 12, 12), 2)})
        assert bool(spy) is chosen
    finally:
        conv_choice.reset()


def test_forced_modes_choose_the_step(native_lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = rand((16, 24), 1), rand((24, 8), 2)
    out = np.empty((16, 8), F32)
    monkeypatch.setenv("RLX_CPU_GEMM", "native")
    assert gemm.use_native() and uses_gemm(gemm.matmul_step(a, b, out), native_lib)
    assert gemm.describe().startswith("rlx GEMM for float32 products (RLX_CPU_GEMM=native")
    for x, y in ((a[:1], b), (a, b[:, :1])):  # matrix-vector products stay with the BLAS's gemv
        assert not uses_gemm(gemm.matmul_step(x, y, np.empty((x.shape[0], y.shape[1]), F32)), native_lib)
    monkeypatch.setenv("RLX_CPU_GEMM", "blas")
    step = gemm.matmul_step(a, b, out)
    assert not gemm.use_native() and not uses_gemm(step, native_lib)
    assert gemm.describe() == "BLAS for float32 products (RLX_CPU_GEMM=blas)"
    bind(step, [])()
    check(out, a, b)


def test_auto_measures_once_and_says_so(native_lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CPU_GEMM", "auto")
    calls: list[int] = []

    def fake(lib: native.Native) -> gemm.Decision:
        calls.append(1)
        return gemm.Decision(False, "timed 0.90x/0.80x the BLAS")

    monkeypatch.setattr(gemm, "_measure", fake)
    gemm.reset()
    try:
        assert gemm.describe().startswith("auto: ")
        assert not gemm.use_native() and not gemm.use_native() and calls == [1]
        assert gemm.describe() == "BLAS for float32 products (timed 0.90x/0.80x the BLAS)"
        monkeypatch.setattr(native_lib, "gemm_avx512", False)  # AVX2's sub-tiles are timed the same way
        assert not gemm.use_native() and calls == [1]
    finally:
        gemm.reset()


def _measure_with(monkeypatch: pytest.MonkeyPatch, native_lib: native.Native, times: list[float], cores: int,
                  pools: list[str]) -> gemm.Decision:
    """``gemm._measure`` with ``best_of`` answering ``times`` in order, on ``cores`` cores
    with these separate BLAS pools, and no real product run."""
    answers = iter(times)
    monkeypatch.setattr(gemm, "best_of", lambda run, repeats: next(answers))
    monkeypatch.setattr(gemm, "_SETTLE_S", 0.0)
    monkeypatch.setattr(native_lib, "gemm", lambda *args: None)
    monkeypatch.setattr(native_lib, "openmp", True)
    monkeypatch.setattr(gemm, "_cores", lambda: cores)
    monkeypatch.setattr(gemm.thread_policy, "blas_pools", lambda: list(pools))
    monkeypatch.setattr(gemm.np, "allclose", lambda *a, **k: True)
    return gemm._measure(native_lib)


@pytest.mark.parametrize(("pools", "blas_speed", "native"), [
    ([], 1.0, True),  # BLAS sharing OpenMP's team (or none): a tie goes to the GEMM (its fused epilogue)
    ([], 0.95, True),
    ([], 0.85, False),  # the BLAS faster by more than MARGIN: it keeps the products
    ([], 1.2, True),
    (["openblas (pthreads threads, 16)"], 1.0, True),  # a tie: the BLAS would cap the native kernels
    (["openblas (pthreads threads, 16)"], 0.8, True),  # 1.25x: not enough to cost the native kernels' threads
    (["openblas (pthreads threads, 16)"], 0.6, False),  # the BLAS clearly faster (1.67x): it keeps the products
])
def test_a_blas_with_its_own_pool_wins_products_only_when_clearly_faster(
        native_lib: native.Native, monkeypatch: pytest.MonkeyPatch, pools: list[str], blas_speed: float,
        native: bool) -> None:
    """``blas_speed``: the BLAS's time over the GEMM's on every probe shape. Choosing the BLAS
    while it keeps a pool of its own runs every graph's native kernels on one thread
    (``threads.native_thread_cap``): a 16-core Xeon timed the two GEMMs at 0.86-1.26x and
    ran resnet18 in 17-22 ms on the BLAS against 8 on the GEMM."""
    shapes = len(gemm.PROBE_SHAPES)
    # the GEMM, the BLAS; both again unless clear; then one thread each (the BLAS, the GEMM) unless clear
    # and where the GEMM won with no pool in the way, the deep probe: the GEMM, the BLAS
    times = ([1.0] * shapes + [blas_speed] * shapes) * 2 + [blas_speed, 1.0] * shapes + [1.0, blas_speed]
    found = _measure_with(monkeypatch, native_lib, times, 16, pools)
    assert found.native is native, found.why
    assert ("own pool (openblas" in found.why) is bool(pools)
    assert (found.deep is not None) is (native and not pools), found


@pytest.mark.parametrize(("deep_speed", "deep"), [(1.0, True), (0.95, True), (0.8, False)])
def test_deep_products_have_a_decision_of_their_own(native_lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                    deep_speed: float, deep: bool) -> None:
    """The GEMM won the probe shapes; the BLAS 1.25x faster on the deep probe keeps the
    products of more than DEEP_K terms, and only those."""
    shapes = len(gemm.PROBE_SHAPES)
    times = [1.0] * shapes + [2.0] * shapes + [1.0, deep_speed]  # the GEMM clearly won: no second round
    found = _measure_with(monkeypatch, native_lib, times, 16, [])
    assert found.native and found.deep is deep, found
    assert found.for_depth(None) and found.for_depth(gemm.DEEP_K) and found.for_depth(gemm.DEEP_K + 1) is deep
    assert (f"over {gemm.DEEP_K} terms a sum the GEMM (timed" in found.why) is deep, found.why


def test_a_gemm_slowed_by_a_spinning_blas_pool_is_timed_again(native_lib: native.Native,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's numpy products leave OpenBLAS's workers spinning: a GEMM timed then
    ran at 0.01x on a 16-core Xeon. Both are timed again once they settle, and each one's
    better time counts."""
    shapes = len(gemm.PROBE_SHAPES)
    times = [100.0] * shapes + [1.0] * shapes + [1.0] * shapes + [1.0] * shapes + [1.0, 1.0] * shapes
    found = _measure_with(monkeypatch, native_lib, times, 16, ["openblas (pthreads threads, 16)"])
    assert found.native and "1.00x/1.00x" in found.why, found.why


def test_a_gemm_timed_slow_on_every_core_is_timed_on_one_thread_too(
        native_lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process busy on a core: every multi-threaded timing waits on it (the GEMM
    at 0.02x MKL's speed on the 2-core host, where it is 2x faster), so where the GEMM did
    not clearly win both are timed on one thread, and its better ratio counts."""
    shapes = len(gemm.PROBE_SHAPES)
    # wide: the GEMM 2 s, the BLAS 1 s, twice; one thread each: the BLAS 2 s, the GEMM 1 s
    times = [2.0] * shapes + [1.0] * shapes + [2.0] * shapes + [1.0] * shapes + [2.0, 1.0] * shapes + [1.0, 1.0]
    found = _measure_with(monkeypatch, native_lib, times, 2, [])
    assert found.native and "one thread each: 2.00x/2.00x" in found.why, found.why


@pytest.mark.slow
def test_the_measurement_agrees_with_the_blas(native_lib: native.Native) -> None:
    """The real timing runs and returns a reasoned decision (which one depends on the host)."""
    found = gemm._measure(native_lib)
    assert "timed " in found.why and ("oneMKL" in found.why or "numpy" in found.why), found.why
    assert blas is not None


# ----------------------------------------------------------------------------- gemv
GEMV_SHAPES = [(1, 1024, 1000), (1, 33, 17), (1, 1, 5), (7, 300, 1), (1000, 1024, 1), (1, 5000, 3), (1, 1, 1)]


@pytest.mark.parametrize(("m", "k", "n"), GEMV_SHAPES)
@pytest.mark.parametrize(("ta", "tb"), list(itertools.product([False, True], repeat=2)))
def test_gemv_every_layout_with_a_unit_stride(lib: native.Native, m: int, k: int, n: int, ta: bool,
                                              tb: bool) -> None:
    """One row of A or one column of B: the dot form (the matrix contiguous along k) and
    the axpy form (contiguous along the outputs), over and under the threads' split."""
    a = rand((k, m), 1).T if ta else rand((m, k), 1)
    b = rand((n, k), 2).T if tb else rand((k, n), 2)
    out = np.empty((m, n), F32)
    step = gemm.gemv_step(a, b, out)
    vector_strided = (m == 1 and ta and k > 1 and m != k) or (m != 1 and n == 1 and tb and k > 1)
    if step is None:
        assert vector_strided, "a layout with a contiguous vector was not taken"
        return
    call = gemm_call(step)
    assert call is not None and call[0] is lib.gemv
    bind(step, [])()
    check(out, a, b)


@pytest.mark.parametrize(("m", "k", "n"), [(1, 300, 40), (40, 300, 1), (1000, 1024, 1), (1, 17, 5)])
@pytest.mark.parametrize("ta", [False, True])
def test_gemv_adds_one_bias_per_output(lib: native.Native, m: int, k: int, n: int, ta: bool) -> None:
    """Both forms, over and under the threads' split: the bias goes in as each output is
    stored (a 1x1 convolution's bias on a 1x1 plane, with no pass of its own)."""
    a = rand((k, m), 1).T if ta else rand((m, k), 1)
    b = rand((k, n), 2)
    bias = rand((max(m, n),), 3)
    out = np.empty((m, n), F32)
    step = gemm.gemv_step(a, b, out, bias=bias)
    if step is None:
        assert m == 1 and ta and k > 1, "a layout with a contiguous vector was not taken"
        return
    bind(step, [])()
    want = np.matmul(a.astype(np.float64), b.astype(np.float64)) + bias.reshape(m, n)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    assert gemm.gemv_step(a, b, out, bias=bias[:-1]) is None  # not one per output: declined
    assert gemm.gemv_step(a, b, out, bias=bias.astype(np.float64)) is None


def test_a_convolution_on_a_1x1_plane_adds_its_bias_in_the_product(
        lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """A squeeze-excitation block's 1x1 convolutions: the product is one rlx_gemv call that
    adds the bias, so no numpy add follows it."""
    monkeypatch.setenv("RLX_CPU_GEMM", "native")
    calls: list[tuple[object, ...]] = []
    real = lib.gemv
    monkeypatch.setattr(lib, "gemv", lambda *args: (calls.append(args), real(*args))[1])
    adds: list[object] = []
    real_add = np.add
    monkeypatch.setattr(np, "add", lambda *a, **k: (adds.append(a), real_add(*a, **k))[1])
    g = Graph("se")
    x = g.input("x", (1, 64, 1, 1), "float32")
    g.set_outputs([g.conv2d(x, g.param("w", rand((16, 64, 1, 1), 1)), g.param("b", rand((16,), 2)))])
    exe = CpuBackend().compile(g.freeze(), CompileOptions(device="cpu"))
    xs = rand((1, 64, 1, 1), 3)
    adds.clear()
    (got,) = exe.run({"x": xs})
    assert calls and calls[-1][-2], "rlx_gemv did not take the bias"  # (..., bias, epilogue)
    assert not adds, "the bias was added in a pass of its own"
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": xs})[0], rtol=1e-5, atol=1e-5)


def test_gemv_declines_batches_and_other_dtypes(lib: native.Native) -> None:
    assert gemm.gemv_step(rand((2, 1, 8)), rand((2, 8, 4)), np.empty((2, 1, 4), F32)) is None
    a64 = rand((1, 8)).astype(np.float64)
    assert gemm.gemv_step(a64, rand((8, 4)).astype(np.float64), np.empty((1, 4))) is None


def test_a_matrix_vector_product_is_rlx_gemv_where_the_gemm_runs(
        lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """With or without MKL, a one-row product goes to rlx_gemv (on OpenMP's team: numpy's
    OpenBLAS would spin a pool of its own); RLX_CPU_GEMM=blas gives it to the BLAS."""
    a, b, out = rand((1, 64)), rand((64, 40)), np.empty((1, 40), F32)
    for mkl in (blas.mkl, lambda: None):
        monkeypatch.setattr(blas, "mkl", mkl)
        call = gemm_call(gemm.matmul_step(a, b, out))
        assert call is not None and call[0] is lib.gemv
        bind(gemm.matmul_step(a, b, out), [])()
        check(out, a, b)
    monkeypatch.setenv("RLX_CPU_GEMM", "blas")
    call = gemm_call(gemm.matmul_step(a, b, out))
    assert call is None or call[0] is not lib.gemv


def test_a_1x1_convolutions_bias_is_added_by_the_gemm_and_follows_set_param(lib: native.Native) -> None:
    """No pass of its own: the GEMM adds it as it stores C (one step, the bias's address
    bound), for every image of the batch; set_param on the bias is seen by the next run.
    (A 5x5 plane: fewer outputs than the implicit GEMM's tile, which takes larger ones.)"""
    g = Graph("conv1x1")
    w = g.param("w", rand((40, 24, 1, 1), 1))
    b = g.param("b", rand((40,), 2))
    g.set_outputs([g.conv2d(g.input("x", (2, 24, 5, 5)), w, b)])
    exe = CpuBackend().compile(g.freeze(), CompileOptions(device="cpu"))
    plan = exe._bind_plan()
    assert plan.stats.steps == 1
    x = rand((2, 24, 5, 5), 3)
    (got,) = exe.run({"x": x})
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)
    new_b = rand((40,), 4)
    exe.set_param("b", new_b)
    (got,) = exe.run({"x": x})
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x}, params={"b": new_b})[0], rtol=1e-5, atol=1e-5)


def test_few_tap_convolutions_take_the_direct_kernel_only_where_it_measured_as_fast(
        native_lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """``use_direct``: RLX_CPU_CONV=direct forces the direct kernel, im2col turns it off,
    ``auto`` times it against im2col + the BLAS once (on answers that agree) and a first
    layer then runs the way measured."""
    monkeypatch.setenv("RLX_CPU_GEMM", "blas")  # no implicit GEMM: a few-tap layer is direct or im2col
    spy = []
    real = native_lib.conv_direct
    monkeypatch.setattr(native_lib, "conv_direct", lambda *a: (spy.append(a), real(*a))[1])
    g = Graph("first")
    g.set_outputs([g.conv2d(g.input("x", (1, 3, 32, 32), "float32"), g.param("w", rand((16, 3, 3, 3), 1)),
                            padding=1)])
    x = rand((1, 3, 32, 32), 2)
    want = reference.evaluate(g, {"x": x})[0]
    for forced, direct in (("direct", True), ("im2col", False)):
        monkeypatch.setenv("RLX_CPU_CONV", forced)
        assert conv_choice.use_direct() is direct
        spy.clear()
        got = CpuBackend().compile(g.freeze(), CompileOptions(device="cpu")).run({"x": x})[0]
        assert bool(spy) is direct
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    monkeypatch.setenv("RLX_CPU_CONV", "auto")
    conv_choice.reset()
    try:
        before = conv_choice.describe()
        assert before.endswith("few-tap ones: the direct kernel is timed against im2col at the first one")
        chosen = conv_choice.use_direct()  # timed on every host (AVX2 has its own register blocking)
        assert re.search(r"few-tap ones: (the direct kernel|im2col) \(timed \d+\.\d\dx im2col's speed at 16 -> "
                         r"32 over 56x56, \d+\.\d\dx im2col's speed at 3 -> 32 over 224x224\)$",
                         conv_choice.describe())
        spy.clear()
        CpuBackend().compile(g.freeze(), CompileOptions(device="cpu")).run({"x": x})
        assert bool(spy) is chosen
    finally:
        conv_choice.reset()


def test_a_product_with_one_shared_b_runs_as_one_product_of_stacked_rows() -> None:
    """``(..., m, k) @ (k, n)`` is one ``(rows, k)`` product when A and C are contiguous
    (views, no copy), and stays batched otherwise; results match the reference either
    way, a caller's strided input included."""
    a, b, out = rand((2, 3, 5, 8), 1), rand((8, 4), 2), np.empty((2, 3, 5, 4), np.float32)
    a2, b2, out2 = gemm.stacked_rows(a, b, out)
    assert a2.shape == (30, 8) and b2 is b and out2.shape == (30, 4) and np.shares_memory(out2, out)
    assert gemm.stacked_rows(a, rand((1, 8, 4), 3), out)[1].shape == (8, 4)
    strided = rand((2, 5, 3, 8), 4).transpose(0, 2, 1, 3)
    assert gemm.stacked_rows(strided, b, out)[0] is strided
    assert gemm.stacked_rows(a, rand((2, 3, 8, 4), 5), out)[0] is a  # a batch of Bs: one product each
    dyn = Dyn(0, (2, 3, 5, 8), np.dtype(np.float32))
    assert gemm.stacked_rows(dyn, b, out)[0].shape == (30, 8)
    assert gemm.stacked_rows(dyn.transpose((0, 2, 1, 3)), b, np.empty((2, 5, 3, 4), np.float32))[0].shape[0] == 2
    g = Graph("stacked")
    y = g.matmul(g.input("x", (2, 3, 5, 8), "float32"), g.param("w", b))
    g.set_outputs([y])
    exe = CpuBackend().compile(g.freeze(), CompileOptions(device="cpu"))
    for x in (a, rand((2, 5, 3, 8), 6).transpose(0, 2, 1, 3)):
        np.testing.assert_allclose(exe.run({"x": x})[0], reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_the_probe_says_the_same_before_and_after_this_process_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's kernel entries are part of the calibration's identity: what one process
    measured (the GEMM, the convolutions' ways, oneDNN) never changes them, or a model
    calibrated there would not count as calibrated after its first convolution."""
    monkeypatch.setenv("RLX_CPU_GEMM", "blas")  # a first layer: the direct kernel is timed against im2col
    conv_choice.reset()
    before = CpuBackend().probe().versions
    g = Graph("first")
    g.set_outputs([g.conv2d(g.input("x", (1, 3, 16, 16), "float32"), g.param("w", rand((8, 3, 3, 3), 1)),
                            padding=1)])
    try:
        CpuBackend().compile(g.freeze(), CompileOptions(device="cpu")).run({"x": rand((1, 3, 16, 16), 2)})
        if native.library() is not None:
            assert conv_choice.describe() != conv_choice.describe(measured=False)  # something was measured
        assert CpuBackend().probe().versions == before
    finally:
        conv_choice.reset()
