"""The cpu backend's native kernels (``rlx_cpu/native.c``, the library built with the
package): the float32 math of the region interpreter measured in ulps against float64,
IEEE's edges op by op, fused regions over every kind of broadcast and layout, the row
kernels (softmax, layer_norm, attention), im2col and the pools, ``set_param``, threads
and ``fork``. How the library is built, loaded or refused: ``test_native_build.py``.

Tests that need the library take the ``lib`` fixture, which skips them (with
``native.reason()``) where the package was installed without it (no C compiler).
``RLX_CPU_BLAS=numpy`` keeps oneMKL out of a region, so that exp, log, tanh and erf are
native.c's own; the same tests run again with MKL's vector math where the ``mkl`` wheel
is installed.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_core.ir.internal_types import Instruction
from rlx_core.ir.ops import OpKind
from rlx_core.passes.internal_ops import program_types
from rlx_core.run.session import CompiledGraph
from rlx_cpu import CpuBackend, blas, ccall, conv_nhwc, fused, grouped_conv, implicit_gemm, native, native_nn, regions
from rlx_cpu import threads as thread_policy
from rlx_cpu.steps import HELD16, Dyn, bind, held16

F32 = np.float32
FLT_MAX = float(np.finfo(F32).max)
TINY = 2.0**-149  # the smallest float32 subnormal: the unit of the last place below 2^-126


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def _empty_rlx_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling reads the calibrated cost model from ``RLX_CACHE_DIR``: an empty one here,
    so no test sees (or warns about) the user's cache."""
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-cache"))


@pytest.fixture
def lib(native_lib: native.Native) -> native.Native:
    return native_lib


def spy_on(monkeypatch: pytest.MonkeyPatch, lib: native.Native, name: str) -> list[tuple[Any, ...]]:
    """The calls of the library's entry point ``name`` (softmax, layer_norm, im2col, pool2d)
    made by plans compiled after this."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(lib, name)

    def spy(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(lib, name, spy)
    return calls


def run_packed_and_plain(g: Graph, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, set[int]]:
    """``g``'s output with rlx's kernels called through rlx_packed, then called with their
    arguments one by one, and the packed kernels that ran."""
    saved = dict(ccall._PACKED)
    kernels: set[int] = set()

    def spy(real: Callable[[int], int]) -> Callable[[int], int]:
        def packed_call(ptr: int) -> int:
            kernels.add(int(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int64)), (1,))[0]))
            return real(ptr)
        return packed_call

    try:
        for key, (fn, real, kernel) in saved.items():
            ccall._PACKED[key] = (fn, spy(real), kernel)
        (packed,) = compile_cpu(g).run(feeds)
        ccall._PACKED.clear()
        (plain,) = compile_cpu(g).run(feeds)
    finally:
        ccall._PACKED.clear()
        ccall._PACKED.update(saved)
    return packed, plain, kernels


def test_every_packed_kernel_gives_what_its_own_entry_point_gives(lib: native.Native,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """rlx_packed dispatches each kernel with its arguments in the right order: every
    kernel a plan calls through it (a model using them all where rlx's GEMM runs the
    products, and a first layer where it does not: the direct convolution) computes the
    same bytes as the same plan with each kernel called with its arguments one by one."""
    g = Graph("all-kernels")
    x = g.input("x", (1, 3, 128, 128))
    c1 = g.conv2d(x, g.param("w1", rand((16, 3, 3, 3), 1)), g.param("b1", rand((16,), 2)), stride=2, padding=1)
    dw = g.conv2d(g.relu(c1), g.param("dw", rand((16, 1, 3, 3), 3)), padding=1, groups=16)  # rows
    dl = g.conv2d(dw, g.param("dl", rand((16, 1, 5, 5), 4)), stride=2, padding=2, groups=16)  # lanes
    c2 = g.conv2d(dl, g.param("w2", rand((24, 16, 5, 5), 5)), padding=2)  # implicit GEMM
    c2 = g.conv2d(c2, g.param("w4", rand((24, 12, 3, 3), 10)), padding=1, groups=2)  # the grouped kernel
    c2 = g.conv2d(c2, g.param("w5", rand((24, 12, 3, 3), 11)), padding=2, dilation=2, groups=2)  # im2col + rlx's GEMM
    p1 = g.max_pool2d(c2, 3, stride=2, padding=1)  # clipped windows
    p2 = g.max_pool2d(c2, 2, stride=2)  # plain pool
    gap = g.global_avg_pool2d(g.add(p1, p2))  # gemv
    t = g.reshape(gap, (1, 24))
    y = g.layer_norm(g.matmul(t, g.param("w3", rand((24, 32), 6))), g.param("s", rand((32,), 7)),
                     g.param("bb", rand((32,), 8)))
    g.set_outputs([g.softmax(g.mul(y, y))])
    feeds = {"x": rand((1, 3, 128, 128), 9)}
    monkeypatch.setenv("RLX_CPU_GEMM", "native")  # whatever this host's BLAS would win
    monkeypatch.setenv("RLX_CPU_CONV", "implicit")  # and whatever im2col would
    packed, plain, kernels = run_packed_and_plain(g, feeds)
    every = set(range(1, 14))
    assert kernels == every - {10}, f"kernels not run packed: {every - {10} - kernels}"
    assert np.array_equal(packed, plain)
    np.testing.assert_allclose(packed, reference.evaluate(g, feeds)[0], rtol=1e-4, atol=1e-6)
    monkeypatch.setenv("RLX_CPU_GEMM", "blas")  # no implicit GEMM: the first layer goes direct (when chosen)
    monkeypatch.setenv("RLX_CPU_CONV", "direct")
    first = Graph("first-layer")
    first.set_outputs([first.conv2d(first.input("x", (1, 3, 128, 128)), first.param("w1", rand((16, 3, 3, 3), 1)),
                                    first.param("b1", rand((16,), 2)), stride=2, padding=1)])
    packed, plain, kernels = run_packed_and_plain(first, feeds)
    assert 10 in kernels and np.array_equal(packed, plain)
    np.testing.assert_allclose(packed, reference.evaluate(first, feeds)[0], rtol=1e-5, atol=1e-5)
    assert lib.packed(np.array([99], np.int64).ctypes.data) == -1  # an unknown kernel does nothing


def use_math(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """``own``: native.c's functions in every region; ``mkl``: oneMKL's vector math for
    exp, log, tanh and erf (skips without MKL)."""
    if mode == "own":
        monkeypatch.setenv("RLX_CPU_BLAS", "numpy")
        return
    monkeypatch.delenv("RLX_CPU_BLAS", raising=False)
    if blas.mkl() is None:
        pytest.skip(f"oneMKL is not loadable here (libmkl_rt: {blas.find_library()}); `pip install mkl`")
    monkeypatch.setattr(regions, "_vml_wins", lambda lib, op, entry: True)  # MKL's math whatever it measures
    monkeypatch.setattr(regions, "_VML_TABLES", {})


def test_mkl_math_runs_only_where_it_measured_faster(lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each function is MKL's only where it beat native.c's in this process; none: no table."""
    use_math(monkeypatch, "mkl")
    monkeypatch.setattr(regions, "_vml_wins", lambda lib_, op, entry: op == "tanh")
    table = regions._vml_table(lib)
    assert table is not None and {op for op, code in regions.OPCODES.items() if table[code]} == {"tanh"}
    monkeypatch.setattr(regions, "_VML_TABLES", {})
    monkeypatch.setattr(regions, "_vml_wins", lambda lib_, op, entry: False)
    assert regions._vml_table(lib) is None


def test_mkl_math_is_timed_against_native_c(lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real measurement: both functions run on the same floats, a decision per function."""
    if blas.mkl() is None:
        pytest.skip(f"oneMKL is not loadable here (libmkl_rt: {blas.find_library()}); `pip install mkl`")
    monkeypatch.delenv("RLX_CPU_BLAS", raising=False)
    for op, name in regions.VML_FUNCTIONS.items():
        entry = ctypes.cast(blas.mkl().vml(name), ctypes.c_void_p).value
        assert isinstance(regions._vml_wins(lib, op, entry), bool)


def compile_cpu(g: Graph) -> CompiledGraph:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


def compile_numpy(monkeypatch: pytest.MonkeyPatch, g: Graph) -> CompiledGraph:
    """``g`` compiled with the native kernels switched off: the numpy path."""
    with monkeypatch.context() as m:
        m.setenv("RLX_CPU_NATIVE", "0")
        return compile_cpu(g)


def rand(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(F32)


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """``|got - want|`` in float32 units of the last place at ``want``: 2^(e-23) for
    ``|want|`` in [2^e, 2^(e+1)), and 2^-149 in the subnormal range."""
    want = np.asarray(want, np.float64)
    _, e = np.frexp(np.abs(want))
    unit = np.where(want == 0, TINY, np.maximum(np.ldexp(1.0, e - 24), TINY))
    return np.abs(np.asarray(got, np.float64) - want) / unit


def floats_between(lo: float, hi: float, step: int = 1) -> np.ndarray:
    """Every ``step``-th float32 in [lo, hi], for 0 <= lo < hi (negate for negatives)."""
    a, b = np.array([lo, hi], F32).view(np.int32)
    return np.arange(a, b + 1, step, dtype=np.int32).view(F32)


def both_signs(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x, -x])


def unary_graph(op: str, shape: tuple[int, ...], dtype: str = "float32", **attrs: Any) -> Graph:
    g = Graph(f"native-{op}")
    x = g.input("x", shape, dtype)
    g.set_outputs([getattr(g, op)(x, **attrs)])
    return g


def run_native_unary(op: str, x: np.ndarray, runs: list[regions._Runner], **attrs: Any) -> np.ndarray:
    """``op(x)`` through a compiled one-op graph, checking that the interpreter ran it."""
    cg = compile_cpu(unary_graph(op, x.shape, **attrs))
    runs.clear()
    (got,) = cg.run({"x": x})
    assert runs, f"{op} did not run on the native interpreter"
    return got


def test_the_ulp_helper_counts_float32_units() -> None:
    """The yardstick of the accuracy tests: one step of float32 is one ulp, at 1, across a
    binade boundary (measured in the finer binade below it) and in the subnormals."""
    one = np.float64(1.0)
    assert ulps(np.nextafter(F32(1), F32(2)), one) == 1.0
    assert ulps(np.nextafter(F32(1), F32(0)), one) == 0.5  # the unit is the one at the truth
    assert ulps(F32(1), one - 2.0**-24) == 1.0  # just below 1: the finer unit of [0.5, 1)
    assert ulps(F32(0), 3 * TINY) == 3.0
    assert ulps(F32(2.5), 2.5 + 2.0**-23) == 0.5  # [2, 4): units of 2^-22


# ----------------------------------------------------------------------------- accuracy
def _erf64(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(v) for v in x.tolist()])


def _gelu64(x: np.ndarray) -> np.ndarray:
    # x Phi(x) = x erfc(-x / sqrt 2) / 2: erfc keeps the far negative tail's digits
    return x * 0.5 * np.array([math.erfc(-v / math.sqrt(2.0)) for v in x.tolist()])


def _gelu_tanh64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _exp_grid(rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([
        np.linspace(-103.9, 88.72, 200_001), rng.uniform(-104, 89, 100_000), np.linspace(-1, 1, 20_001),
        floats_between(88.0, 88.75),  # every float32 up to and past overflow (88.7228)
        -floats_between(87.0, 104.0, 7),  # the results in the subnormal range, down to 0
    ]).astype(F32)


def _log_grid(rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([
        np.geomspace(TINY, FLT_MAX, 200_001), rng.uniform(0, 100, 100_000), 1 + np.linspace(-1e-3, 1e-3, 20_001),
        floats_between(0.7, 1.45, 31),  # both sides of 1 and of the sqrt(2) reduction
        floats_between(TINY, 1.2e-38, 1021),  # subnormals
    ]).astype(F32)


def _tanh_grid(rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([
        np.linspace(-10, 10, 200_001), rng.standard_normal(100_000) * 3,
        both_signs(np.geomspace(1e-30, 1, 20_000)), both_signs(floats_between(0.55, 0.7, 3)),  # the 0.625 switch
    ]).astype(F32)


def _erf_grid(rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([
        np.linspace(-5, 5, 200_001), rng.standard_normal(100_000) * 2, both_signs(np.geomspace(1e-30, 1, 20_000)),
    ]).astype(F32)


def _sigmoid_grid(rng: np.random.Generator) -> np.ndarray:
    # From -88.72 up: below it exp(-x) overflows and the result (< 2^-126) flushes to 0, see
    # test_sigmoid_below_the_normal_range_is_within_the_smallest_normal.
    return np.concatenate([
        np.linspace(-88.72, 30, 200_001), rng.uniform(-88, 20, 100_000), both_signs(np.geomspace(1e-30, 1, 20_000)),
        -floats_between(86.0, 88.72, 5),  # results in the subnormal range
    ]).astype(F32)


def _rsqrt_grid(rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([
        np.geomspace(TINY, FLT_MAX, 200_001), rng.uniform(0, 10, 100_000), floats_between(1.0, 4.0, 67),
    ]).astype(F32)


#: name -> (op, attrs, grid, float64 truth, bound in ulp for native.c's math, bound for MKL's
#: or None where MKL never runs the op). Measured maxima (dense and exhaustive sweeps, gcc 12,
#: x86-64): exp 0.97, log 0.79, tanh 1.33, erf 3.95 (mathfn.py documents 4), sigmoid
#: (e^-x's error, then 1 + e and the division rounded; native.c's header claims 2.5),
#: rsqrt 1.49 (1 / sqrtf, two roundings: under 2); MKL's VML_HA at most 1.0.
Truth = Callable[[np.ndarray], np.ndarray]
ACCURACY: dict[str, tuple[str, dict[str, Any], Callable[..., np.ndarray], Truth, float, float | None]] = {
    "exp": ("exp", {}, _exp_grid, np.exp, 1.25, 1.5),
    "log": ("log", {}, _log_grid, np.log, 1.25, 1.5),
    "tanh": ("tanh", {}, _tanh_grid, np.tanh, 2.0, 1.5),
    "erf": ("erf", {}, _erf_grid, _erf64, 4.0, 1.5),
    "sigmoid": ("sigmoid", {}, _sigmoid_grid, lambda x: 1.0 / (1.0 + np.exp(-x)), 2.5, None),
    "rsqrt": ("rsqrt", {}, _rsqrt_grid, lambda x: 1.0 / np.sqrt(x), 2.0, None),
}
ACCURACY_CASES = [pytest.param(name, mode, id=f"{name}-{mode}") for name, case in ACCURACY.items()
                  for mode in ("own", "mkl") if mode == "own" or case[5] is not None]


@pytest.mark.parametrize("name, mode", ACCURACY_CASES)
def test_float32_math_within_its_ulp_bound(lib: native.Native, region_runs: list[regions._Runner],
                                           monkeypatch: pytest.MonkeyPatch, name: str, mode: str) -> None:
    """Each function of the interpreter on dense grids, random values, the ranges where its
    argument reduction switches, and subnormal inputs and results, against float64; a
    refit or a reordered polynomial cannot lose bits unnoticed."""
    op, attrs, grid, truth, own_bound, mkl_bound = ACCURACY[name]
    use_math(monkeypatch, mode)
    x = grid(np.random.default_rng(7))
    got = run_native_unary(op, x, region_runs, **attrs)
    assert (region_runs[-1].vml is None) == (mode == "own"), "the region ran the other math"
    want = truth(x.astype(np.float64))
    finite = np.abs(want) <= FLT_MAX
    assert np.all(got[~finite] == np.copysign(np.inf, want[~finite])), f"{name}: an overflow is not inf"
    err = ulps(got[finite], want[finite])
    worst = int(np.argmax(err))
    bound = own_bound if mode == "own" else mkl_bound
    at, g_at, w_at = x[finite][worst], got[finite][worst], want[finite][worst]
    assert err[worst] <= bound, f"{name} ({mode}): {err[worst]:.3f} ulp at x={at!r} (got {g_at!r}, want {w_at!r})"


def test_sqrt_is_correctly_rounded(lib: native.Native, region_runs: list[regions._Runner]) -> None:
    """sqrtf is IEEE's correctly rounded square root: bit for bit numpy's float32 sqrt."""
    x = np.concatenate([_rsqrt_grid(np.random.default_rng(3)), floats_between(0.0, TINY * 4096)]).astype(F32)
    got = run_native_unary("sqrt", x, region_runs)
    assert np.array_equal(got, np.sqrt(x))


def test_sigmoid_below_the_normal_range_is_within_the_smallest_normal(
    lib: native.Native, region_runs: list[regions._Runner]
) -> None:
    """Below x = -88.72 the true value is a subnormal: native.c's sigmoid (e^-x overflows
    to inf from -89 on, giving 0) is never further than 2^-126 from it, and exactly 0 from
    -104 on."""
    x = -floats_between(88.72, 110.0, 3)
    got = run_native_unary("sigmoid", x, region_runs)
    want = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    assert np.all(np.abs(got - want) < 2.0**-126)
    assert np.all(got[x <= -104] == 0)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_within_mathfn_bound(lib: native.Native, region_runs: list[regions._Runner], approximate: str) -> None:
    """mathfn.py documents gelu within 1.5e-7 + 2e-7 |gelu(x)| (ulps mean nothing in the
    tail, where gelu is nearly 0): the interpreter's gelu is the same function; the tanh
    approximation, against its own formula in float64, holds the same bound."""
    rng = np.random.default_rng(11)
    x = np.concatenate([np.linspace(-12, 12, 200_001), rng.standard_normal(100_000) * 4,
                        both_signs(np.geomspace(1e-30, 1, 10_000)), both_signs(np.geomspace(1, 1e30, 1_000))])
    x = x.astype(F32)
    got = run_native_unary("gelu", x, region_runs, approximate=approximate)
    want = (_gelu64 if approximate == "none" else _gelu_tanh64)(x.astype(np.float64))
    excess = np.abs(got - want) / (1.5e-7 + 2e-7 * np.abs(want))
    worst = int(np.argmax(excess))
    assert excess[worst] <= 1.0, f"gelu({approximate}) at x={x[worst]!r}: got {got[worst]!r}, want {want[worst]!r}"


# ----------------------------------------------------------------------------- IEEE edges
NAN, INF = float("nan"), float("inf")
#: op (attrs) -> (x, exact result): NaN in gives NaN, infinities and saturation are exact.
EDGES: dict[str, tuple[str, dict[str, Any], list[tuple[float, float]]]] = {
    "exp": ("exp", {}, [(NAN, NAN), (INF, INF), (-INF, 0.0), (0.0, 1.0), (-0.0, 1.0), (89.0, INF), (1e30, INF),
                        (-104.0, 0.0), (-1e30, 0.0)]),
    "log": ("log", {}, [(NAN, NAN), (INF, INF), (-INF, NAN), (0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-TINY, NAN),
                        (1.0, 0.0)]),
    "tanh": ("tanh", {}, [(NAN, NAN), (INF, 1.0), (-INF, -1.0), (10.0, 1.0), (-10.0, -1.0), (3e38, 1.0), (0.0, 0.0)]),
    "erf": ("erf", {}, [(NAN, NAN), (INF, 1.0), (-INF, -1.0), (5.0, 1.0), (-5.0, -1.0), (3e38, 1.0), (0.0, 0.0)]),
    "sigmoid": ("sigmoid", {}, [(NAN, NAN), (INF, 1.0), (-INF, 0.0), (0.0, 0.5), (100.0, 1.0), (-200.0, 0.0)]),
    "gelu": ("gelu", {}, [(NAN, NAN), (INF, INF), (-INF, NAN), (0.0, 0.0), (3e38, 3e38), (-3e38, 0.0)]),
    "gelu_tanh": ("gelu", {"approximate": "tanh"}, [(NAN, NAN), (INF, INF), (-INF, NAN), (0.0, 0.0), (20.0, 20.0)]),
    "rsqrt": ("rsqrt", {}, [(NAN, NAN), (INF, 0.0), (0.0, INF), (-0.0, -INF), (-1.0, NAN), (4.0, 0.5)]),
    "sqrt": ("sqrt", {}, [(NAN, NAN), (INF, INF), (-INF, NAN), (-1.0, NAN), (4.0, 2.0), (-0.0, -0.0)]),
    "relu": ("relu", {}, [(NAN, NAN), (INF, INF), (-INF, 0.0), (-1.0, 0.0), (2.0, 2.0)]),
    "neg": ("neg", {}, [(NAN, NAN), (INF, -INF), (0.0, -0.0), (-0.0, 0.0)]),
    "abs": ("abs", {}, [(NAN, NAN), (-INF, INF), (-0.0, 0.0), (-3.0, 3.0)]),
}
EDGE_CASES = [pytest.param(name, mode, id=f"{name}-{mode}") for name in EDGES for mode in ("own", "mkl")
              if mode == "own" or name in regions.VML_FUNCTIONS]
#: Inputs every op sees besides its own edges (compared with the numpy path).
SPECIALS = [NAN, -NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, TINY, -TINY, 1e-38, -1e-38, FLT_MAX, -FLT_MAX, 88.72, 88.73,
            -88.73, -103.0, -104.0, 200.0, -200.0, 0.5, 10.0, -10.0, 1e-20, -1e-20]


def _same_zero_signs(got: np.ndarray, want: np.ndarray) -> bool:
    zero = (want == 0) & ~np.isnan(got)
    return bool(np.array_equal(np.signbit(got[zero]), np.signbit(want[zero])))


@pytest.mark.parametrize("name, mode", EDGE_CASES)
def test_ieee_edges_per_op(lib: native.Native, region_runs: list[regions._Runner], monkeypatch: pytest.MonkeyPatch,
                           name: str, mode: str) -> None:
    """NaN in gives NaN out, +-inf and overflow give the exact limits, tanh and erf saturate
    to exactly +-1; where the numpy path gives an exact edge (inf, 0, +-1, NaN) the native
    one gives the same, and everywhere else it is within a few ulp of it."""
    op, attrs, table = EDGES[name]
    use_math(monkeypatch, mode)
    xs = np.array([x for x, _ in table] + SPECIALS, F32)
    got = run_native_unary(op, xs, region_runs, **attrs)
    expected = np.array([y for _, y in table], F32)
    head = got[: len(table)]
    assert np.array_equal(head, expected, equal_nan=True), f"{name}: {xs[: len(table)]} -> {head}, want {expected}"
    with np.errstate(all="ignore"):  # numpy warns at the edges it gets right
        (numpy_path,) = compile_numpy(monkeypatch, unary_graph(op, xs.shape, **attrs)).run({"x": xs})
    assert np.array_equal(np.isnan(got), np.isnan(numpy_path)), f"{name}: NaN where the numpy path has none"
    # the numpy path's sigmoid is 1 / (1 + inf) = 0 below x = -88.72, where the native one
    # gives the subnormal the true value rounds to (see the test after the next)
    flushed = (numpy_path == 0) & (np.abs(got) < 2.0**-126) & (name == "sigmoid")
    exact = (~np.isfinite(numpy_path) | (numpy_path == 0) | (np.abs(numpy_path) == 1)) & ~flushed
    assert np.array_equal(got[exact], numpy_path[exact], equal_nan=True), f"{name}: {xs[exact]} -> {got[exact]}"
    rest = ~exact & ~flushed
    np.testing.assert_allclose(got[rest], numpy_path[rest], rtol=3e-6, atol=0)


ZERO_SIGN_CASES = [pytest.param(op, attrs, mode, id=f"{op}{'-' + attrs['approximate'] if attrs else ''}-{mode}")
                   for op, attrs in [("tanh", {}), ("erf", {}), ("gelu", {}), ("gelu", {"approximate": "tanh"}),
                                     ("sqrt", {}), ("neg", {}), ("abs", {})]
                   for mode in ("own", "mkl") if mode == "own" or op in regions.VML_FUNCTIONS]


@pytest.mark.parametrize("op, attrs, mode", ZERO_SIGN_CASES)
def test_odd_functions_keep_the_sign_of_zero(lib: native.Native, region_runs: list[regions._Runner],
                                             monkeypatch: pytest.MonkeyPatch, op: str, attrs: dict[str, Any],
                                             mode: str) -> None:
    """f(-0) = -0 for the odd functions (IEEE 754, C's tanhf and erff, numpy, the reference),
    and for sqrt and neg; abs(-0) = +0. A zero's sign survives into 1 / x and log."""
    use_math(monkeypatch, mode)
    x = np.array([-0.0, 0.0, -1e-40, 1e-40], F32)
    got = run_native_unary(op, x, region_runs, **attrs)
    (want,) = reference.evaluate(unary_graph(op, x.shape, **attrs), {"x": x})
    assert _same_zero_signs(got, want), f"{op}({x}) = {got}, want {want}"


@pytest.mark.parametrize("op, ufunc", [("maximum", np.maximum), ("minimum", np.minimum)])
def test_max_and_min_propagate_nan_like_numpy(lib: native.Native, region_runs: list[regions._Runner], op: str,
                                              ufunc: np.ufunc) -> None:
    """NaN in either operand wins, as in numpy.maximum and numpy.minimum (C's fmaxf would
    drop it); the long arrays take the vectorized loop, the short tail the scalar one."""
    pairs = [(NAN, 1.0), (1.0, NAN), (NAN, NAN), (-INF, INF), (INF, -INF), (NAN, -INF), (-INF, NAN), (2.0, -3.0)]
    a = np.array([p[0] for p in pairs] * 9, F32)
    b = np.array([p[1] for p in pairs] * 9, F32)
    g = Graph(op)
    x, y = g.input("a", a.shape), g.input("b", b.shape)
    g.set_outputs([getattr(g, op)(x, y), g.relu(x)])
    cg = compile_cpu(g)
    got, relu = cg.run({"a": a, "b": b})
    assert len(region_runs) == 2
    assert np.array_equal(got, ufunc(a, b), equal_nan=True)
    assert np.array_equal(relu, np.maximum(a, F32(0)), equal_nan=True)


BINARY_SPECIALS = np.array([NAN, -INF, -8.0, -2.5, -1.0, -0.0, 0.0, 0.5, 1.0, 3.0, INF, 1e30, -1e30, 1e-40], F32)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
def test_binary_ops_over_every_pair_of_edges(lib: native.Native, region_runs: list[regions._Runner],
                                             monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    """Every pair of NaN, +-inf, +-0, negatives, huge and subnormal values: +, -, * and /
    are IEEE's (bit for bit the numpy path, zero signs included; x / 0 is +-inf, 0 / 0
    NaN); powf agrees with numpy's pow on every NaN, inf, 0 and 1 (0^-1, (-8)^0.5, 1^NaN,
    NaN^0...) and within an ulp elsewhere; max and min as numpy's."""
    a, b = (v.reshape(-1) for v in np.meshgrid(BINARY_SPECIALS, BINARY_SPECIALS, indexing="ij"))
    g = Graph(f"edges-{op}")
    g.set_outputs([getattr(g, op)(g.input("a", a.shape), g.input("b", b.shape))])
    (got,) = compile_cpu(g).run({"a": a, "b": b})
    assert len(region_runs) == 1
    with np.errstate(all="ignore"):
        (want,) = compile_numpy(monkeypatch, g).run({"a": a, "b": b})
    pairs = list(zip(a, b))
    nan = np.isnan(got) != np.isnan(want)
    assert not nan.any(), f"{op}: NaN differs at {[pairs[i] for i in np.flatnonzero(nan)]}"
    if op == "pow":
        exact = ~np.isfinite(want) | (want == 0) | (np.abs(want) == 1)
        assert np.array_equal(got[exact], want[exact], equal_nan=True)
        assert np.all(ulps(got[~exact], want[~exact]) <= 1)
    else:
        assert np.array_equal(got, want, equal_nan=True), f"{op}: {got} != {want}"
    if op in ("add", "sub", "mul", "div"):
        assert _same_zero_signs(got, want)


def test_comparisons_and_where_in_a_region_follow_ieee(lib: native.Native, region_runs: list[regions._Runner],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN compares false (and unequal to itself), -0 equals +0, where picks by the bool;
    comparisons live in a region as 0/1 floats: bit for bit the numpy path's answer."""
    vals = np.array([NAN, -INF, -1.0, -0.0, 0.0, 1.0, INF], F32)
    a, b = (v.reshape(-1) for v in np.meshgrid(vals, vals, indexing="ij"))
    g = Graph("compare")
    x, y = g.input("a", a.shape), g.input("b", b.shape)
    lt, gt, eq = g.less(x, y), g.greater(x, y), g.equal(x, y)
    code = g.add(g.add(g.cast(lt, "float32"), g.mul(g.cast(gt, "float32"), 2.0)), g.mul(g.cast(eq, "float32"), 4.0))
    g.set_outputs([g.add(g.where(lt, x, y), g.mul(code, 100.0))])
    (got,) = compile_cpu(g).run({"a": a, "b": b})
    assert region_runs and max(r.meta[2] for r in region_runs) >= 8, "compares, casts and where in a region"
    (want,) = compile_numpy(monkeypatch, g).run({"a": a, "b": b})
    assert np.array_equal(got, want, equal_nan=True) and _same_zero_signs(got, want)
    (ref,) = reference.evaluate(g, {"a": a, "b": b})
    assert np.array_equal(got, ref, equal_nan=True)


# ----------------------------------------------------------------------------- regions
A, B, C = 3, 5, 70  # 1050 elements: a full 1024-element block and a short one, rows across the boundary


def caller_layouts(x: np.ndarray) -> list[tuple[str, np.ndarray]]:
    ro = x.copy()
    ro.flags.writeable = False
    unaligned = np.zeros(x.nbytes + 1, np.uint8)[1:].view(F32).reshape(x.shape)  # numpy's memory is 16-aligned
    unaligned[...] = x
    return [("contiguous", x), ("fortran order", np.asfortranarray(x)),
            ("every other element", np.repeat(x, 2, axis=-1)[..., ::2]), ("read-only", ro),
            ("reversed rows", x[::-1].copy()[::-1]), ("unaligned", unaligned)]


def broadcast_graph() -> Graph:
    """x (A, B, C) with a scalar, a row, a column (B, 1), a middle-axis (A, 1, C) param, a
    param built from a transposed array, a second caller input, compares, where and casts,
    a value read three times inside the region, and the region's result read by two nodes."""
    g = Graph("broadcasts")
    x, y = g.input("x", (A, B, C)), g.input("y", (A, B, C))
    s = g.param("s", np.array(0.75, F32))
    row = g.param("row", rand((C,), 1))
    col = g.param("col", rand((B, 1), 2))
    mid = g.param("mid", rand((A, 1, C), 3))
    tr = g.param("tr", np.ascontiguousarray(rand((C, B), 4)).T)  # (B, C), handed over transposed
    t = g.sub(g.mul(g.add(x, row), s), col)
    t2 = g.add(g.mul(t, t), g.div(t, g.add(g.abs(mid), 1.0)))  # t read three times
    picked = g.where(g.greater(t2, y), g.sub(t2, tr), g.maximum(y, mid))
    flag = g.cast(g.cast(g.minimum(x, 0.0), "bool"), "float32")  # x < 0 -> 1, through a bool
    z = g.add(picked, g.mul(flag, g.neg(g.cast(g.less(y, col), "float32"))))
    g.set_outputs([z, g.reduce_sum(z, axes=-1), g.softmax(g.mul(z, 0.1), axis=-1)])
    return g


@pytest.mark.parametrize("layout", [name for name, _ in caller_layouts(rand((A, B, C)))])
def test_a_region_over_every_broadcast_and_caller_layout(
    lib: native.Native, region_runs: list[regions._Runner], monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """Scalar, row, column and middle-axis broadcasts, and caller arrays of any layout
    (copied when not contiguous float32, read where they are otherwise): bit for bit the
    numpy path (only +, -, *, /, max, min, compares and where: no math function), and the
    reference's float64 within float32 rounding."""
    g = broadcast_graph()
    cg = compile_cpu(g)
    x = rand((A, B, C), 10, 2.0)
    y = rand((A, B, C), 11)
    arr = dict(caller_layouts(x))[layout]
    got = cg.run({"x": arr, "y": y})
    assert region_runs and max(r.meta[2] for r in region_runs) >= 12, "the elementwise ops ran as one region"
    want = compile_numpy(monkeypatch, g).run({"x": x, "y": y})
    for k in (0, 1):  # the region and a sum of it: no math function, so the same bits
        assert np.array_equal(got[k], want[k]), f"output {k} differs from the numpy path"
    np.testing.assert_allclose(got[2], want[2], rtol=2e-6, atol=1e-7)  # the softmax: exp differs in the last bit
    for a, r in zip(got, reference.evaluate(g, {"x": x, "y": y})):
        np.testing.assert_allclose(a, r, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(arr, x)  # the caller's array is untouched


def test_a_region_with_math_functions_and_a_bool_caller_input(lib: native.Native,
                                                              region_runs: list[regions._Runner],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A region of transcendental functions (exp, log, tanh, erf, sigmoid, gelu, rsqrt,
    pow) with a bool caller input as where's condition (the interpreter's 0/1 floats):
    within a few ulp of the reference and of the numpy path."""
    monkeypatch.setenv("RLX_CPU_BLAS", "numpy")
    g = Graph("transcendental")
    x, m = g.input("x", (64, 33)), g.input("m", (64, 33), "bool")
    w = g.param("w", rand((33,), 5))
    a = g.add(g.tanh(g.mul(x, w)), g.erf(x))
    b = g.mul(g.sigmoid(x), g.log(g.add(g.exp(g.neg(g.abs(x))), 1.0)))
    c = g.add(g.gelu(a), g.gelu(b, approximate="tanh"))
    d = g.mul(g.rsqrt(g.add(g.mul(x, x), 1.0)), g.pow(g.add(g.abs(w), 0.5), x))
    g.set_outputs([g.where(m, g.add(c, d), g.sqrt(g.add(g.abs(c), 1.0)))])  # no sqrt of a cancellation
    x_in = rand((64, 33), 12)
    m_in = np.random.default_rng(13).random((64, 33)) < 0.5
    (got,) = compile_cpu(g).run({"x": x_in, "m": m_in})
    assert region_runs and sum(r.meta[2] for r in region_runs) >= 20, "the functions ran in regions"
    (want,) = compile_numpy(monkeypatch, g).run({"x": x_in, "m": m_in})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (ref,) = reference.evaluate(g, {"x": x_in, "m": m_in})
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def bool_logic_graph(shape: tuple[Any, ...] = (6, 700)) -> Graph:
    """An exporter's NaN guard after a softmax, ``where(where(x == x, False, True), 0, x)``
    (bool constants chosen between), bools and-ed and or-ed (``where``, as the ONNX import
    writes ``And`` and ``Or``) and compared, and a bool constant array as a condition:
    float32 out, bools only inside."""
    g = Graph("bool-logic")
    x, y = g.input("x", shape), g.input("y", shape)
    nan = g.where(g.equal(x, x), g.constant(np.bool_(False)), g.constant(np.bool_(True)))
    guarded = g.where(nan, g.constant(np.float32(0.0)), x)
    false, true = g.constant(np.bool_(False)), g.constant(np.bool_(True))
    both = g.where(g.greater(x, y), g.less(y, 0.5), false)  # and, as an import writes it
    either = g.where(both, true, g.equal(g.greater(x, 0.0), g.less(y, 0.0)))  # or; bools compared
    stripes = g.constant(np.arange(shape[-1]) % 3 == 0)  # a bool constant broadcast over the rows
    picked = g.where(either, guarded, g.where(stripes, y, g.mul(x, 2.0)))
    g.set_outputs([picked])
    return g


def bool_logic_feeds(shape: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    x, y = rand(shape, seed), rand(shape, seed + 1)
    x.reshape(-1)[::7] = NAN
    return {"x": x, "y": y}


def test_bools_inside_a_float_region_are_its_0_1_floats(lib: native.Native, region_runs: list[regions._Runner],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Bool constants, where between bools, and/or and comparisons of bools run inside
    the region as 0/1 floats (the NaN guard of a softmax took numpy's passes, ~2 ms a
    call on a BERT request): bit for bit the numpy path and the reference."""
    g = bool_logic_graph()
    feeds = bool_logic_feeds((6, 700), 3)
    (got,) = compile_cpu(g).run(feeds)
    assert region_runs and max(r.meta[2] for r in region_runs) >= 11, "the whole program in one region"
    (want,) = compile_numpy(monkeypatch, g).run(feeds)
    (ref,) = reference.evaluate(g, feeds)
    assert np.array_equal(got, want, equal_nan=True) and np.array_equal(got, ref, equal_nan=True)


def test_bools_folded_from_a_param_are_read_where_they_lie(lib: native.Native,
                                                           region_runs: list[regions._Runner]) -> None:
    """A bool array computed from a param is read by the region as bytes where it lies,
    so ``set_param``, which computes it again in place, reaches the region's answer."""
    g = Graph("param-bools")
    x = g.input("x", (4, 300))
    w = g.param("w", rand((300,), 1))
    g.set_outputs([g.where(g.greater(w, 0.0), x, g.neg(x))])
    cg = compile_cpu(g)
    x_in = rand((4, 300), 2)
    w2 = rand((300,), 5)
    (first,) = cg.run({"x": x_in})
    assert region_runs, "the where ran in a region"
    cg.set_param("w", w2)
    (second,) = cg.run({"x": x_in})
    np.testing.assert_array_equal(first, np.where(rand((300,), 1) > 0, x_in, -x_in))
    np.testing.assert_array_equal(second, np.where(w2 > 0, x_in, -x_in))


def test_masks_computed_per_run_are_read_as_bytes(lib: native.Native, region_runs: list[regions._Runner],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The classic exporter's padding mask: bools a plan computes each run (comparisons of
    int64 positions, outside any float region) broadcast as ``(b, 1, 1, s)`` and ``(1, 1,
    s, 1)``, chosen between by ``where`` and made ``-inf``/``0``, with a transposed caller
    bool and one-element bools: one region reading the bytes where they lie (strided,
    broadcast, scalar; it ran on numpy's passes before), bit for bit the numpy path and
    the reference."""
    b, s = 3, 37
    g = Graph("mask")
    keep = g.input("keep", (b, 1, 1, s), "int64")
    pos = g.input("pos", (1, 1, s, 1), "int64")
    flip = g.input("flip", (1, 1, s, s), "bool")
    scores = g.input("scores", (b, 2, s, s))
    padded = g.equal(keep, g.constant(np.int64(0)))  # bool plan buffers (int64 compares: no float region)
    late = g.greater(pos, g.constant(np.int64(20)))
    masked = g.where(padded, g.constant(np.bool_(True)), late)
    masked = g.where(g.transpose(flip, (0, 1, 3, 2)), g.where(masked, g.constant(np.bool_(False)),
                                                               g.constant(np.bool_(True))), masked)
    bias = g.where(masked, g.constant(np.float32(-np.inf)), g.constant(np.float32(0.0)))
    g.set_outputs([g.add(scores, bias)])
    rng = np.random.default_rng(4)
    feeds = {"keep": (rng.random((b, 1, 1, s)) > 0.3).astype(np.int64),
             "pos": np.arange(s, dtype=np.int64).reshape(1, 1, s, 1),
             "flip": rng.random((1, 1, s, s)) > 0.8, "scores": rand((b, 2, s, s), 5)}
    numpy_programs: list[int] = []
    real = fused.program_steps
    with monkeypatch.context() as m:
        m.setattr(fused, "program_steps", lambda *a, **k: (numpy_programs.append(1), real(*a, **k))[1])
        (got,) = compile_cpu(g).run(feeds)
    assert region_runs and max(r.meta[2] for r in region_runs) >= 4 and not numpy_programs, \
        "the four wheres in one region on the interpreter, none on numpy's"
    (want,) = compile_numpy(monkeypatch, g).run(feeds)
    (ref,) = reference.evaluate(g, feeds)
    assert np.array_equal(got, want) and np.array_equal(got, ref)
    assert np.isneginf(got).any() and np.isfinite(got).any()


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_regions_of_other_dtypes(lib: native.Native, region_runs: list[regions._Runner], dtype: str) -> None:
    """The interpreter is float32 only: a float64 region (or op) is numpy's; a float16
    region runs on the interpreter over float32 copies of its operands, rounded to float16
    once (``halves``). Each right to its dtype's precision."""
    g = Graph(f"region-{dtype}")
    x = g.input("x", (16, 40), dtype)
    b = g.param("b", rand((40,), 1).astype(dtype))
    g.set_outputs([g.mul(g.tanh(g.add(x, b)), g.exp(g.neg(g.abs(x)))), g.sigmoid(x)])
    x_in = rand((16, 40), 2).astype(dtype)
    got = compile_cpu(g).run({"x": x_in})
    assert bool(region_runs) == (dtype == "float16")
    tol = 2e-3 if dtype == "float16" else 1e-12
    for a, r in zip(got, reference.evaluate(g, {"x": x_in})):
        assert a.dtype == np.dtype(dtype)
        np.testing.assert_allclose(a, r, rtol=tol, atol=tol)


def test_caller_scalars_and_0d_regions(lib: native.Native, region_runs: list[regions._Runner]) -> None:
    """A 0-d caller input broadcast over a region (a scalar operand read per run), a (1,)
    one, and a region whose result is itself 0-d: right on every run."""
    g = Graph("scalars")
    x, y, s = g.input("x", ()), g.input("y", (3, 1000)), g.input("s", (1,))
    g.set_outputs([g.tanh(g.add(g.mul(x, 2.0), 1.0)), g.mul(g.add(y, x), s), g.exp(x)])
    cg = compile_cpu(g)
    for v in (0.3, -2.0):
        feeds = {"x": np.array(v, F32), "y": rand((3, 1000), 1), "s": np.array([2 * v], F32)}
        region_runs.clear()
        got = cg.run(feeds)
        assert len(region_runs) == 3
        for a, r in zip(got, reference.evaluate(g, feeds)):
            assert a.shape == r.shape
            np.testing.assert_allclose(a, r, rtol=3e-7, atol=1e-7)


class _Typed(NamedTuple):
    shape: tuple[int, ...]
    dtype: str


def region(program: tuple[tuple[str, tuple[int, ...], tuple[Any, ...]], ...], ins: list[Any], out: Any) -> Any:
    types = [_Typed(tuple(x.shape), np.dtype(x.dtype).name) for x in ins]  # as fused.py types them
    _, instructions = program_types(OpKind.FUSED_ELEMENTWISE, types, program)
    return regions.region_steps(instructions, ins, out)


def run_steps(steps: list[Any], slots: list[Any] | None = None) -> None:
    for s in steps:
        bind(s, slots or [])()


STRIDED_OPERANDS = {
    "transposed": lambda: rand((40, 24), 1).T,
    "every other column": lambda: rand((24, 80), 2)[:, ::2],
    "reversed": lambda: rand((24, 40), 3)[::-1, ::-1],
    "column of a wider array": lambda: rand((24, 50), 4)[:, 7:8],
    "broadcast view": lambda: np.broadcast_to(rand((40,), 5), (24, 40)),
    "scalar view": lambda: np.broadcast_to(np.array(1.5, F32), (24, 40)),
}


@pytest.mark.parametrize("what", list(STRIDED_OPERANDS))
def test_strided_operands_are_gathered_in_place(lib: native.Native, what: str) -> None:
    """An operand the plan holds as a strided view (transposed, every other column,
    negative strides, a column or a broadcast) is read through its element strides,
    without a copy: bit for bit numpy's elementwise answer."""
    v = STRIDED_OPERANDS[what]()
    x = rand((24, 40), 9)
    out = np.empty((24, 40), F32)
    steps = region((("mul", (0, 1), ()), ("add", (2, 0), ()), ("maximum", (3, 1), ())), [x, v], out)
    assert steps is not None and isinstance(steps[0].fn, regions._Runner)
    run_steps(steps)
    assert np.array_equal(out, np.maximum(x * v + x, v))


def test_a_region_may_write_over_its_contiguous_input_but_not_a_shifted_one(lib: native.Native) -> None:
    """The executor may hand a region an input's buffer as its output: the same address is
    fine (each element is read before it is written), an overlap at another offset is not
    (the numpy path takes it)."""
    buf = rand((4097,), 3)
    x = buf[:4096].copy()
    program = (("exp", (0,), ()), ("mul", (1, 0), ()))
    same = buf[:4096]
    steps = region(program, [same], same)
    assert steps is not None
    run_steps(steps)
    np.testing.assert_allclose(same, np.exp(x.astype(np.float64)) * x, rtol=3e-7)
    assert region(program, [buf[1:]], buf[:4096]) is None
    assert region(program, [buf[:4096]], buf[1:]) is None


def test_caller_arrays_have_their_address_read_per_run(lib: native.Native) -> None:
    """A region over ``Dyn`` slots (the caller's arrays) reads their addresses on every
    run: two runs over two arrays give two answers, and the output slot is written."""
    ins = [Dyn(0, (8, 300), np.dtype(F32)), rand((300,), 1)]
    out = Dyn(1, (8, 300), np.dtype(F32))
    steps = region((("sub", (0, 1), ()), ("abs", (2,), ())), ins, out)
    assert steps is not None
    slots: list[Any] = [None, None]
    bound = [bind(s, slots) for s in steps]
    xs = [rand((8, 300), seed) for seed in (1, 2)]  # all alive: no address is reused
    outs = [np.empty((8, 300), F32) for _ in xs]
    for x, out_arr in zip(xs, outs):
        slots[:] = [x, out_arr]
        for s in bound:
            s()
    for x, out_arr in zip(xs, outs):
        assert np.array_equal(out_arr, np.abs(x - ins[1]))


_FUZZ_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
                "minimum": np.minimum}
_FUZZ_UNARY = {"neg": np.negative, "abs": np.abs, "relu": lambda a: np.maximum(a, F32(0))}
_FUZZ_COMPARE = {"less": np.less, "greater": np.greater, "equal": np.equal}


def _fuzz_operand(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 operand broadcasting to ``shape`` (leading axes dropped, others 1 at
    random), stored contiguous, transposed, every third element or reversed."""
    lead = int(rng.integers(0, len(shape) + 1))
    x = rng.standard_normal(tuple(d if rng.random() < 0.6 else 1 for d in shape[lead:])).astype(F32)
    kind = int(rng.integers(0, 4))
    if kind == 1 and x.ndim >= 2:
        return np.ascontiguousarray(x.T).T
    if kind == 2 and x.ndim >= 1:
        return np.repeat(x, 3, axis=-1)[..., ::3]
    if kind == 3 and x.ndim >= 1:
        return x[::-1].copy()[::-1]
    return x


def test_random_regions_match_numpy_bit_for_bit(lib: native.Native) -> None:
    """Seeded random programs (arithmetic, max/min, compares into where) over random
    broadcasts, layouts, caller (``Dyn``) inputs and outputs: the interpreter's merged
    axes, gathers and reused registers give numpy's float32 answer to the bit."""
    rng = np.random.default_rng(2024)
    with np.errstate(all="ignore"):
        for case in range(150):
            shape = tuple(int(rng.integers(1, 7)) for _ in range(int(rng.integers(1, 5))))
            if rng.random() < 0.3:
                shape = (*shape[:-1], int(rng.integers(100, 1500)))  # blocks and a tail
            first = rng.standard_normal(shape).astype(F32)
            ins = [first if rng.random() < 0.5 else np.asfortranarray(first)]
            ins += [_fuzz_operand(rng, shape) for _ in range(int(rng.integers(0, 4)))]
            vals: list[np.ndarray] = list(ins)
            program: list[tuple[str, tuple[int, ...], tuple[Any, ...]]] = []
            for _ in range(int(rng.integers(1, 8))):
                floats = [i for i, v in enumerate(vals) if v.dtype == F32]
                r = rng.random()
                if r < 0.5:
                    op, (a, b) = str(rng.choice(list(_FUZZ_BINARY))), rng.choice(floats, 2)
                    program.append((op, (int(a), int(b)), ()))
                    vals.append(_FUZZ_BINARY[op](vals[a], vals[b]))
                elif r < 0.75:
                    op, a = str(rng.choice(list(_FUZZ_UNARY))), rng.choice(floats)
                    program.append((op, (int(a),), ()))
                    vals.append(_FUZZ_UNARY[op](vals[a]))
                else:
                    op, (a, b, c, d) = str(rng.choice(list(_FUZZ_COMPARE))), rng.choice(floats, 4)
                    program.append((op, (int(a), int(b)), ()))
                    vals.append(_FUZZ_COMPARE[op](vals[a], vals[b]))
                    program.append(("where", (len(vals) - 1, int(c), int(d)), ()))
                    vals.append(np.where(vals[-1], vals[c], vals[d]))
            program.append(("add", (len(vals) - 1, 0), ()))  # reaches the full shape
            want = vals[-1] + vals[0]
            slots: list[Any] = []
            plan_ins: list[Any] = []
            for x in ins:
                if rng.random() < 0.4:  # a caller's array: its address is read per run
                    plan_ins.append(Dyn(len(slots), x.shape, x.dtype))
                    slots.append(x)
                else:
                    plan_ins.append(x)
            out = np.empty(shape, F32)
            plan_out: Any = out
            if rng.random() < 0.3:
                plan_out = Dyn(len(slots), shape, np.dtype(F32))
                slots.append(out)
            steps = region(tuple(program), plan_ins, plan_out)
            assert steps is not None, f"case {case}: declined"
            run_steps(steps, slots)
            assert np.array_equal(out, want, equal_nan=True), f"case {case}: {program} over {[x.shape for x in ins]}"


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "tanh", "sigmoid"])
@pytest.mark.parametrize("m, n", [(64, 128), (256, 256)])
def test_gemm_epilogues_run_in_place_on_the_product(lib: native.Native, region_runs: list[regions._Runner],
                                                    m: int, n: int, act: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused gemm's bias and activation run over the product itself: inside rlx's GEMM,
    on each block of C as it is final, where the product is in a plan buffer (64 x 128);
    as a region written in place (its only operand at the output's own address) over the
    fresh array a large output is handed over in (256 x 256), whose address changes per run."""
    from rlx_cpu.executor import HANDOFF_BYTES

    monkeypatch.setenv("RLX_CPU_GEMM", "native")
    g = Graph("gemm")
    x = g.input("x", (m, 48))
    h = g.add(g.matmul(x, g.param("w", rand((48, n), 1))), g.param("b", rand((n,), 2)))
    g.set_outputs([h if act == "none" else getattr(g, act)(h)])
    cg = compile_cpu(g)
    assert any("gemm" in note for note in cg.report().fused)
    x_in = rand((m, 48), 3)
    (got,) = cg.run({"x": x_in})
    if m * n * 4 >= HANDOFF_BYTES:
        assert len(region_runs) == 1 and region_runs[0].meta[2] == (1 if act == "none" else 2)
    else:
        assert not region_runs  # the GEMM's epilogue did it
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x_in})[0], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("lead", [(3,), (2, 5)])
def test_gemm_epilogue_over_stacked_rows_on_every_core(lib: native.Native, region_runs: list[regions._Runner],
                                                       monkeypatch: pytest.MonkeyPatch, lead: tuple[int, ...]) -> None:
    """A dense layer over a batch of sequences (rows stacked into one product) with its
    bias and GELU applied by the GEMM block by block, split over the threads, then a
    second product: the same as the reference, and no region of its own."""
    monkeypatch.setenv("RLX_CPU_GEMM", "native")
    g = Graph("dense")
    x = g.input("x", (*lead, 67, 96))
    h = g.add(g.matmul(x, g.param("w", rand((96, 200), 1))), g.param("b", rand((200,), 2)))
    g.set_outputs([g.matmul(g.gelu(h), g.param("w2", rand((200, 24), 4)))])
    cg = compile_cpu(g)
    assert any("gemm" in note for note in cg.report().fused)
    x_in = rand((*lead, 67, 96), 3)
    (got,) = cg.run({"x": x_in})
    # float32 sums of 96 then 200 terms against float64's
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x_in})[0], rtol=1e-4, atol=1e-4)
    assert not region_runs  # the bias and GELU ran inside the first GEMM


# ----------------------------------------------------------------------------- threads
def big_graph(n: int = 1024) -> Graph:
    g = Graph("big-region")
    x = g.input("x", (n, n))
    b = g.param("b", rand((n,), 1))
    g.set_outputs([g.mul(g.tanh(g.add(x, b)), g.sigmoid(x))])
    return g


def test_a_big_region_runs_on_every_core_and_agrees_with_one_bit_for_bit(
    lib: native.Native, region_runs: list[regions._Runner], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past SPLIT_NS of estimated work a region is split over the cores in whole blocks;
    every block computes the same as on one thread, so the answers are identical."""
    g = big_graph()
    x = rand((1024, 1024), 2, 3.0)
    (got,) = compile_cpu(g).run({"x": x})
    assert len(region_runs) == 1
    if lib.threads() > 1:
        assert region_runs[0].threads > 1, "a 1024x1024 tanh region should use every core"
    monkeypatch.setattr(regions, "SPLIT_NS", math.inf)
    (alone,) = compile_cpu(g).run({"x": x})
    assert region_runs[-1].threads == 1
    assert np.array_equal(got, alone)
    (ref,) = reference.evaluate(g, {"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("mode", ["own", "mkl"])
def test_a_forked_child_runs_a_big_region_without_hanging(
    lib: native.Native, region_runs: list[regions._Runner], monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """libgomp's thread team does not survive fork: the child of a process that ran a
    parallel region keeps to one thread (``Native._after_fork``), finishes, and gets the
    same bits as the parent's threads; with MKL's tanh inside the region too."""
    use_math(monkeypatch, mode)
    cg = compile_cpu(big_graph())
    x = rand((1024, 1024), 4, 3.0)
    (want,) = cg.run({"x": x})  # the parent's team exists now
    assert region_runs and (lib.threads() == 1 or region_runs[-1].threads > 1)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the region ran and agrees
        code = 1
        try:
            (got,) = cg.run({"x": x})
            code = 0 if np.array_equal(got, want) else 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, "the child's region gave another answer"
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung running a native region")


def test_row_and_window_kernels_split_over_threads_agree_with_one(
    lib: native.Native, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big enough, softmax and layer_norm split their rows, im2col its channels and the
    pools their planes over the cores; each row, channel or plane is computed as on one
    thread, so the answers are identical (and the reference's). The thread policy is set
    aside (``test_threads.py`` has its own tests): without oneMKL, numpy's OpenBLAS pool
    would keep this graph's kernels on one thread, as its conv is a product."""
    spies = {name: spy_on(monkeypatch, lib, name) for name in ("softmax", "layer_norm", "im2col", "pool2d")}
    monkeypatch.setattr(native_nn, "DIRECT_CONV_TAPS", 0)  # the conv through im2col here,
    monkeypatch.setenv("RLX_CPU_GEMM", "blas")  # not the implicit GEMM
    monkeypatch.setattr(thread_policy, "_products_pools", lambda: [])
    g = Graph("big-windows")
    x = g.input("x", (2, 16, 64, 64))
    c = g.conv2d(x, g.param("w", rand((16, 16, 3, 3), 1)), g.param("b", rand((16,), 2)), padding=1)
    s = g.softmax(g.reshape(g.max_pool2d(c, 3, stride=1), (2 * 16 * 62, 62)), axis=-1)
    n = g.layer_norm(g.reshape(c, (128, 1024)), g.param("s", rand((1024,), 3)))
    g.set_outputs([s, g.avg_pool2d(c, 2, stride=2), n])
    x_in = rand((2, 16, 64, 64), 4)
    got = compile_cpu(g).run({"x": x_in})
    threads = {name: [call[-1] for call in calls] for name, calls in spies.items()}
    assert all(threads.values()), threads
    if lib.threads() > 1:
        assert all(t > 1 for ts in threads.values() for t in ts), threads
    for a, r in zip(got, reference.evaluate(g, {"x": x_in})):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=2e-5)
    monkeypatch.setattr(native_nn, "SPLIT_NS", math.inf)
    for calls in spies.values():
        calls.clear()
    alone = compile_cpu(g).run({"x": x_in})
    assert all(call[-1] == 1 for calls in spies.values() for call in calls)
    for a, b in zip(got, alone):
        assert np.array_equal(a, b)


def test_python_threads_share_native_plans(lib: native.Native) -> None:
    """Four threads running one compiled graph at once, each region and softmax on its
    own OpenMP team: every run gives its input's answer."""
    g = Graph("threads")
    x = g.input("x", (512, 512))
    b = g.param("b", rand((512,), 1))
    g.set_outputs([g.softmax(g.mul(g.tanh(g.add(x, b)), g.sigmoid(x)), axis=-1)])
    cg = compile_cpu(g)
    xs = [rand((512, 512), 30 + i, 3.0) for i in range(4)]
    wants = [cg.run({"x": x_in})[0] for x_in in xs]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(8):
                (got,) = cg.run({"x": xs[i]})
                assert np.array_equal(got, wants[i])
        except BaseException as exc:  # surfaced below, with the thread's number
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    assert not any(t.is_alive() for t in workers), "a thread hung"
    assert not errors, errors[0]


# ----------------------------------------------------------------------------- row kernels
def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 2e-6, atol: float = 1e-6) -> None:
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN in other places"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("length", [1, 10, 17, 128, 1000])
def test_softmax_rows(lib: native.Native, monkeypatch: pytest.MonkeyPatch, length: int) -> None:
    """Softmax over the last axis in one native call, for rows shorter than the 16 lanes,
    between, and long; with -inf entries (weight 0), a row all -inf and a row with NaN
    (both NaN, as the reference), and big values that would overflow a naive exp."""
    calls = spy_on(monkeypatch, lib, "softmax")
    x = rand((37, length), length, 4.0)
    x[3, 0] = -np.inf
    x[4, :] = -np.inf
    x[5, length // 2] = np.nan
    x[6] += 1e4
    if length > 2:
        x[7, ::2] = -np.inf
    g = Graph("softmax")
    g.set_outputs([g.softmax(g.input("x", x.shape), axis=-1)])
    with np.errstate(invalid="ignore"):
        (got,) = compile_cpu(g).run({"x": x})
        (want,) = reference.evaluate(g, {"x": x})
    assert calls, "softmax did not run natively"
    assert_close(got, want)
    finite = ~np.isnan(want).any(axis=-1)
    np.testing.assert_allclose(got[finite].sum(axis=-1), 1.0, rtol=3e-6)


@pytest.mark.parametrize("length", [10, 300, 1500])
def test_softmax_to_bf16_and_nan_rows_to_zero(lib: native.Native, length: int) -> None:
    """``softmax_bf16_step``: the weights rounded to bf16 in the softmax's last pass (bf16
    attention's), the scores used as work space; with ``nan_zero`` a row masked everywhere
    is zeros, without it NaN. Within one bf16 ulp of the float64 softmax rounded, and equal
    to the numpy fallback's rounding of the same float32 softmax."""
    x = rand((40, length), length, 4.0)
    x[3, :] = -np.inf
    for nan_zero in (True, False):
        scores, out16 = x.copy(), np.empty(x.shape, np.uint16)
        step = native_nn.softmax_bf16_step(scores, out16, 0.5, nan_zero)
        assert step is not None
        step.fn(*step.args, **step.kwargs)
        got = (out16.astype(np.uint32) << 16).view(np.float32)
        with np.errstate(invalid="ignore"):
            e = np.exp(x.astype(np.float64) * 0.5 - (x.astype(np.float64) * 0.5).max(axis=-1, keepdims=True))
            want = e / e.sum(axis=-1, keepdims=True)
        rows = np.arange(40) != 3
        np.testing.assert_allclose(got[rows], want[rows], rtol=2 ** -8, atol=1e-30)
        assert np.all(got[3] == 0) if nan_zero else np.all(np.isnan(got[3]))
        fallback = np.empty(x.shape, np.uint16)
        with np.errstate(invalid="ignore"):
            native_nn._softmax_bf16_numpy(0.5, nan_zero)(x.copy(), fallback)
        ulps = np.abs(fallback[rows].astype(np.int32) - out16[rows].astype(np.int32))
        as_float = (fallback.astype(np.uint32) << 16).view(np.float32)
        assert ulps.max() <= 1 and np.array_equal(as_float[3], got[3], equal_nan=True)  # (a NaN's sign aside)


@pytest.mark.parametrize("length, bias", [(1, True), (1, False), (256, True), (256, False), (50, True)])
def test_layer_norm_rows(lib: native.Native, monkeypatch: pytest.MonkeyPatch, length: int, bias: bool) -> None:
    """Mean and (biased) variance per row, scaled and shifted, in one native call; a row of
    one element normalizes to the bias; a row far from 0 keeps its digits."""
    calls = spy_on(monkeypatch, lib, "layer_norm")
    x = rand((2, 9, length), 20 + length, 3.0)
    x[0, 1] += 1000.0  # a mean 300 standard deviations from 0: the sums run on x - x[0]
    g = Graph("layer-norm")
    scale = g.param("scale", rand((length,), 1))
    b = g.param("bias", rand((length,), 2)) if bias else None
    g.set_outputs([g.layer_norm(g.input("x", x.shape), scale, b, axis=-1, eps=1e-5)])
    (got,) = compile_cpu(g).run({"x": x})
    (want,) = reference.evaluate(g, {"x": x})
    assert calls, "layer_norm did not run natively"
    assert_close(got, want, rtol=1e-5, atol=2e-5)  # the float32 mean of ~1000 alone is off by up to 3e-5 / std


def test_layer_norm_over_two_axes(lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """axis=-2 normalizes over the last two axes together (scale of that shape)."""
    calls = spy_on(monkeypatch, lib, "layer_norm")
    g = Graph("layer-norm-2")
    x = g.input("x", (3, 4, 24))
    g.set_outputs([g.layer_norm(x, g.param("s", rand((4, 24), 1)), g.param("b", rand((4, 24), 2)), axis=-2)])
    x_in = rand((3, 4, 24), 3)
    (got,) = compile_cpu(g).run({"x": x_in})
    assert calls
    assert_close(got, reference.evaluate(g, {"x": x_in})[0], rtol=1e-5, atol=2e-5)


ATTENTION_MASKS = ["none", "bool", "float", "bool with a row all masked", "none, negative scale"]


@pytest.mark.parametrize("mask", ATTENTION_MASKS)
def test_attention(lib: native.Native, monkeypatch: pytest.MonkeyPatch, mask: str) -> None:
    """softmax(q k^T scale + mask) v with the native softmax: no mask (the scale applied
    inside the softmax, a negative one too), a bool mask (False -> -inf; a row all False is
    NaN, as the reference), and an additive float mask."""
    calls = spy_on(monkeypatch, lib, "softmax")
    b, h, lq, lk, d = 2, 3, 7, 19, 16
    g = Graph("attention")
    q, k, v = g.input("q", (b, h, lq, d)), g.input("k", (b, h, lk, d)), g.input("v", (b, h, lk, d))
    feeds = {"q": rand((b, h, lq, d), 1), "k": rand((b, h, lk, d), 2), "v": rand((b, h, lk, d), 3)}
    scale = -0.3 if "negative" in mask else None
    if scale is not None:  # scores of +-300: exp overflows unless the softmax shifts by the largest of x * scale
        feeds["q"] *= 30
    if mask.startswith("bool"):
        m = np.random.default_rng(4).random((lq, lk)) < 0.7
        m[:, 0] = True
        if "all masked" in mask:
            m[2, :] = False
        out = g.attention(q, k, v, g.input("m", (lq, lk), "bool"))
        feeds["m"] = m
    elif mask == "float":
        out = g.attention(q, k, v, g.param("m", rand((lq, lk), 5, 2.0)))
    else:
        out = g.attention(q, k, v, scale=scale)
    g.set_outputs([out])
    with np.errstate(invalid="ignore"):
        (got,) = compile_cpu(g).run(feeds)
        (want,) = reference.evaluate(g, feeds)
    assert calls, "attention's softmax did not run natively"
    if scale is not None:
        assert calls[0][5] == pytest.approx(scale), "the scale goes into the softmax's pass"
    assert_close(got, want, rtol=1e-5, atol=2e-5)  # the float32 mean of ~1000 alone is off by up to 3e-5 / std


# ----------------------------------------------------------------------------- windows
POOLS = {  # name -> (op, kwargs, native?)
    "max 2x2 stride 2": ("max_pool2d", {"kernel": 2, "stride": 2}, True),
    "max 3x3 stride 1": ("max_pool2d", {"kernel": 3, "stride": 1}, True),
    "max 3x3 stride 2 (small planes, taken flat)": ("max_pool2d", {"kernel": 3, "stride": 2}, True),
    "max 3x3 stride 2 dilation 2": ("max_pool2d", {"kernel": 3, "stride": 2, "dilation": 2}, True),
    "max 2x3 stride (1, 2)": ("max_pool2d", {"kernel": (2, 3), "stride": (1, 2)}, True),
    "avg 2x2 stride 2": ("avg_pool2d", {"kernel": 2, "stride": 2}, True),
    "avg 3x3 stride 1": ("avg_pool2d", {"kernel": 3, "stride": 1}, True),
    "avg 3x3 stride 2": ("avg_pool2d", {"kernel": 3, "stride": 2}, True),
    "max 3x3 dilation 2 padding 1 (native, over a -inf border)": ("max_pool2d", {"kernel": 3, "stride": 1,
                                                                              "padding": 1, "dilation": 2}, True),
    "avg 2x2 ceil_mode (native, taps clipped to the image, each sum over its count)": (
        "avg_pool2d", {"kernel": 2, "stride": 2, "ceil_mode": True}, True),
    "avg 3x3 stride 1 padding 1, pads counted (Inception's)": ("avg_pool2d", {"kernel": 3, "stride": 1, "padding": 1,
                                                                              "count_include_pad": True}, True),
    "avg 3x3 stride 2 padding 1, pads not counted": ("avg_pool2d", {"kernel": 3, "stride": 2, "padding": 1,
                                                                    "count_include_pad": False}, True),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pools(lib: native.Native, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Max and average pools whose windows lie inside the image run natively (the 2x2
    stride-2 one in one pass), odd sizes leaving an edge unread; a max propagates NaN and
    keeps -inf; a pool reaching into padding runs natively with its windows clipped to the
    image (a dilated one over a -inf border), an average divided by its window's count. All
    as the reference."""
    op, kwargs, is_native = POOLS[name]
    calls = spy_on(monkeypatch, lib, "pool2d")
    clipped = spy_on(monkeypatch, lib, "pool2d_padded")
    x = rand((2, 3, 13, 11), 6, 2.0)
    if op == "max_pool2d":
        x[0, 0, 4, 4] = np.nan
        x[1, 2, :3, :3] = -np.inf
    g = Graph("pool")
    g.set_outputs([getattr(g, op)(g.input("x", x.shape), **kwargs)])
    (got,) = compile_cpu(g).run({"x": x})
    (want,) = reference.evaluate(g, {"x": x})
    assert bool(calls or clipped) == is_native
    if op == "max_pool2d":
        assert np.isnan(got).any()
        assert np.array_equal(got, want, equal_nan=True)  # a max is exact
    else:
        assert_close(got, want)


@pytest.mark.parametrize("stride", [1, 2])
def test_three_row_max_pool_over_rows_wider_than_a_chunk(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                         stride: int) -> None:
    """The 3x3 max pool's one-pass rows (three rows, then three taps) over rows of 300 to
    600 outputs: every chunk of the row takes the three rows, as the reference."""
    calls = spy_on(monkeypatch, lib, "pool2d")
    g = Graph("wide-pool")
    g.set_outputs([g.max_pool2d(g.input("x", (1, 2, 7, 601)), 3, stride=stride)])
    x = rand((1, 2, 7, 601), 4)
    x[0, 1, 5, 580] = np.nan
    (got,) = compile_cpu(g).run({"x": x})
    assert calls
    np.testing.assert_array_equal(got, reference.evaluate(g, {"x": x})[0])


@pytest.mark.parametrize("hw", [(3, 3), (64, 64), (65, 63), (8, 41), (40, 7)])
def test_three_by_three_stride_two_max_pool_flat_or_by_rows(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                            hw: tuple[int, int]) -> None:
    """squeezenet's pool: planes of up to 4096 floats taken flat (every position's three-row,
    then three-column maxima), larger ones row by row; NaN in a window's last row and
    column, and a window all -inf, come out as the reference's."""
    calls = spy_on(monkeypatch, lib, "pool2d")
    h, w = hw
    x = rand((2, 3, h, w), 5)
    oh, ow = (h - 3) // 2 + 1, (w - 3) // 2 + 1
    x[0, 1, 2 * oh, 2 * ow] = np.nan  # the last window's bottom-right tap
    x[1, 2, :3, :3] = -np.inf
    g = Graph("pool-3x3-s2")
    g.set_outputs([g.max_pool2d(g.input("x", x.shape), 3, stride=2)])
    (got,) = compile_cpu(g).run({"x": x})
    assert calls and np.isnan(got[0, 1, -1, -1]) and got[1, 2, 0, 0] == -np.inf
    np.testing.assert_array_equal(got, reference.evaluate(g, {"x": x})[0])


@pytest.mark.parametrize("hw", [(2, 2), (2, 9), (7, 7), (14, 13), (56, 56), (64, 64), (65, 64), (1, 5)])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_three_by_three_stride_one_max_pool_flat_or_by_rows(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                            hw: tuple[int, int], ceil_mode: bool) -> None:
    """Inception's branch pool (3x3, stride 1, padding 1): planes of up to 4096 floats
    flat (columns of three, then rows of three, the edge columns again with two taps),
    larger ones and single rows row by row; NaN and -inf at the corners and edges come
    out as the reference's."""
    clipped = spy_on(monkeypatch, lib, "pool2d_padded")
    h, w = hw
    x = rand((2, 3, h, w), 7)
    x[0, 1, h - 1, w - 1] = np.nan
    x[1, 2, 0, :] = -np.inf
    x[1, 0, :, 0] = np.nan
    g = Graph("pool-3x3-s1")
    g.set_outputs([g.max_pool2d(g.input("x", x.shape), 3, stride=1, padding=1, ceil_mode=ceil_mode)])
    (got,) = compile_cpu(g).run({"x": x})
    assert clipped and np.isnan(got[0, 1, -1, -1])
    np.testing.assert_array_equal(got, reference.evaluate(g, {"x": x})[0])


@pytest.mark.parametrize("hw", [(3, 3), (8, 8), (35, 35), (17, 9), (70, 66)])
@pytest.mark.parametrize("include_pad", [False, True])
def test_three_by_three_stride_one_average_pool_flat_or_by_rows(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                                hw: tuple[int, int], include_pad: bool) -> None:
    """Inception's average pools (3x3, stride 1, padding 1): the native padded pool, flat
    for planes of up to 4096 floats (columns of three, rows of three, each sum over its
    count: 9, or 4/6/9 without the padding), row by row past that; as the reference."""
    calls = spy_on(monkeypatch, lib, "pool2d_padded")
    h, w = hw
    x = rand((2, 3, h, w), 11, 2.0)
    g = Graph("avg-3x3-s1")
    g.set_outputs([g.avg_pool2d(g.input("x", x.shape), 3, stride=1, padding=1, count_include_pad=include_pad)])
    (got,) = compile_cpu(g).run({"x": x})
    assert calls
    assert_close(got, reference.evaluate(g, {"x": x})[0])


@pytest.mark.parametrize("shape", [(2, 5, 7, 7), (1, 3, 1, 9), (1, 576, 7, 7), (1, 4, 1, 1)])
def test_global_average_pool_is_one_matrix_vector_product(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                          shape: tuple[int, ...]) -> None:
    """Each plane's mean as rlx_gemv against 1/(h w): batches, one-row planes, a NaN kept;
    a 1x1 plane is its own mean (numpy's path, no product)."""
    calls = spy_on(monkeypatch, lib, "gemv")
    g = Graph("gap")
    g.set_outputs([g.global_avg_pool2d(g.input("x", shape))])
    x = rand(shape, 4)
    x[0, 0, 0, 0] = np.nan
    (got,) = compile_cpu(g).run({"x": x})
    assert bool(calls) == (shape[2] * shape[3] > 1)
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert np.isnan(got[0, 0, 0, 0]) and not np.isnan(got.ravel()[1:]).any()


CONVS = {  # name -> (x shape, w shape, bias?, kwargs)
    "3x3": ((2, 4, 12, 11), (6, 4, 3, 3), False, {}),
    "3x3 padding 1, bias": ((2, 4, 12, 11), (6, 4, 3, 3), True, {"padding": 1}),
    "5x5 padding 2 stride 2": ((1, 3, 17, 16), (5, 3, 5, 5), True, {"padding": 2, "stride": 2}),
    "3x3 dilation 2 padding 2": ((2, 2, 14, 15), (4, 2, 3, 3), False, {"padding": 2, "dilation": 2}),
    "groups 2, stride 2, bias": ((2, 4, 10, 10), (6, 2, 3, 3), True, {"groups": 2, "stride": 2, "padding": 1}),
    "asymmetric padding": ((1, 3, 9, 8), (2, 3, 2, 3), True, {"padding": (0, 1, 2, 1)}),
    "1x3 stride (2, 1)": ((1, 2, 7, 20), (3, 2, 1, 3), False, {"stride": (2, 1), "padding": (0, 1)}),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_conv2d_windows(lib: native.Native, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """conv2d's im2col in one native pass writing the zero padding in place: padding 0, 1,
    2 and asymmetric, strides, dilation, groups, with and without a bias (the direct
    convolution, the grouped kernel and the implicit GEMM, which needs rlx's GEMM, are
    held off: see the tests below)."""
    xs, ws, has_bias, kwargs = CONVS[name]
    monkeypatch.setattr(native_nn, "DIRECT_CONV_TAPS", 0)
    monkeypatch.setattr(grouped_conv, "GROUP_CONV_MIN_WIDTH", 1 << 30)  # (groups: im2col, not the grouped kernel)
    monkeypatch.setenv("RLX_CPU_GEMM", "blas")
    calls = spy_on(monkeypatch, lib, "im2col")
    g = Graph("conv")
    w = g.param("w", rand(ws, 1))
    b = g.param("b", rand((ws[0],), 2)) if has_bias else None
    g.set_outputs([g.conv2d(g.input("x", xs), w, b, **kwargs)])
    x = rand(xs, 3)
    (got,) = compile_cpu(g).run({"x": x})
    (want,) = reference.evaluate(g, {"x": x})
    assert calls, "im2col did not run natively"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def check_conv_follows_set_param(case: tuple[Any, ...], name: str, ran: Callable[[], None]) -> None:
    """Compile one convolution (``case``: x shape, w shape, bias?, kwargs), check with
    ``ran()`` which kernels its first run took, compare it with the reference, then again
    after set_param replaced its weights (packed once: they must be repacked)."""
    xs, ws, has_bias, kwargs = case
    g = Graph(name)
    w = g.param("w", rand(ws, 1))
    b = g.param("b", rand((ws[0],), 2)) if has_bias else None
    g.set_outputs([g.conv2d(g.input("x", xs), w, b, **kwargs)])
    x = rand(xs, 3)
    cg = compile_cpu(g)
    (got,) = cg.run({"x": x})
    ran()
    tol = 2e-7 * math.prod(ws[1:])  # float32 sums of c * kh * kw products of N(0, 1) values
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=tol)
    new = {"w": rand(ws, 7), **({"b": rand((ws[0],), 8)} if has_bias else {})}
    for k, v in new.items():
        cg.set_param(k, v)
    (got,) = cg.run({"x": x})
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x}, params=new)[0], rtol=1e-5, atol=tol)


IMPLICIT_CONVS = {  # name -> (x shape, w shape, bias?, kwargs): ungrouped, any window
    **{k: v for k, v in CONVS.items() if "groups" not in v[3]},
    "3x3 padding 1, 40 channels in: two k blocks, 13 out: a partial row panel": ((1, 40, 9, 10), (13, 40, 3, 3),
                                                                                 True, {"padding": 1}),
    "70x70, 30 channels out: three strips of column tiles": ((1, 3, 70, 70), (30, 3, 3, 3), True, {"padding": 1}),
    "3x3 over 13x13 (169 outputs: a last tile 16 wide)": ((1, 24, 13, 13), (20, 24, 3, 3), True, {"padding": 1}),
    "plain 1x1 over 13x13 (a last tile 16 wide, moved back)": ((1, 24, 13, 13), (20, 24, 1, 1), False, {}),
    "64 out of a 5x5 image: threads split the row panels": ((1, 16, 5, 5), (64, 16, 3, 3), False, {"padding": 1}),
    "1x1 stride 2 (a residual's shortcut)": ((2, 8, 14, 14), (16, 8, 1, 1), True, {"stride": 2}),
    "3x3 stride 2 dilation 2, asymmetric padding": ((1, 5, 19, 18), (7, 5, 3, 3), True,
                                                     {"stride": 2, "dilation": 2, "padding": (2, 1, 0, 3)}),
    "3x5 stride (1, 3), padding wider than the kernel needs": ((1, 4, 8, 20), (6, 4, 3, 5), False,
                                                                {"stride": (1, 3), "padding": (3, 4)}),
    "512 channels of 7x7 (resnet18's last stage, narrowed in)": ((1, 40, 7, 7), (512, 40, 3, 3), True,
                                                                  {"padding": 1}),
    "plain 1x1, 70 channels out over 11x9 (the channels-in-vectors form only)": ((2, 300, 11, 9), (70, 300, 1, 1),
                                                                                   True, {}),
    "plain 1x1 over 8x8, no partial tile (x read in place in every form)": ((2, 20, 8, 8), (24, 20, 1, 1), True, {}),
    "plain 1x1 over 6x6, 13 out: the partial tile moved back over the last 32 outputs": ((2, 20, 6, 6),
                                                                                        (13, 20, 1, 1), True, {}),
    "plain 1x1 over 5x5: fewer outputs than a tile": ((2, 20, 5, 5), (24, 20, 1, 1), False, {}),
}


@pytest.mark.parametrize("panel", [8, 12, 32])
@pytest.mark.parametrize("name", list(IMPLICIT_CONVS))
def test_implicit_gemm_convolution(lib: native.Native, monkeypatch: pytest.MonkeyPatch, name: str,
                                   panel: int) -> None:
    """Where rlx's GEMM takes the products, an ungrouped convolution runs as rlx_conv_gemm
    (columns read from a copy of the input shifted per tap column, no im2col) in each of
    its forms (8 or 12 channels x 32 outputs, 32 channels x 12 outputs): partial panels
    and tiles, several k blocks and chunks, threads split either way, any padding,
    stride and dilation, two images, bias or none, equal to the reference; then its
    packed weights follow set_param. A plain 1x1 convolution over fewer outputs than a
    tile takes only the second form (the first is rlx_gemm's product); over more, every
    form, x read in place (a partial tile moved back over the last 32 outputs)."""
    ws, kwargs = IMPLICIT_CONVS[name][1], IMPLICIT_CONVS[name][3]
    monkeypatch.setenv("RLX_CPU_GEMM", "native")
    monkeypatch.setenv("RLX_CPU_CONV", "implicit")  # whatever this host measured
    monkeypatch.setattr(native_nn, "DIRECT_CONV_TAPS", 0)
    monkeypatch.setattr(implicit_gemm, "conv_gemm_panel", lambda o, n, k: panel)
    monkeypatch.setattr(conv_nhwc, "MAX_PIXELS", 0)  # small planes: the implicit GEMM all the same
    implicit, windows = spy_on(monkeypatch, lib, "conv_gemm"), spy_on(monkeypatch, lib, "im2col")
    xs = IMPLICIT_CONVS[name][0]
    plain = ws[2:] == (1, 1) and not kwargs and xs[2] * xs[3] < 32  # under a tile: rlx_gemm's product unless 32

    def ran() -> None:
        assert bool(implicit) == (panel == 32 or not plain) and not windows, "the implicit GEMM did not run"

    check_conv_follows_set_param(IMPLICIT_CONVS[name], "implicit-conv", ran)


@pytest.mark.parametrize("panel", [8, 32])
def test_implicit_gemm_with_weights_computed_each_run(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                     panel: int) -> None:
    """A squeeze-excitation gate folded into the weights (rlx_core's conv_scale): the
    convolution's weights are a value of the graph, different each run; the implicit GEMM
    packs them again each run (conv_gemm_pack before every product) and follows the gate."""
    monkeypatch.setenv("RLX_CPU_GEMM", "native")
    monkeypatch.setenv("RLX_CPU_CONV", "implicit")
    monkeypatch.setattr(implicit_gemm, "conv_gemm_panel", lambda o, n, k: panel)
    implicit, packs = spy_on(monkeypatch, lib, "conv_gemm"), spy_on(monkeypatch, lib, "conv_gemm_pack")
    g = Graph("gated")
    x, gate = g.input("x", (1, 24, 12, 12)), g.input("gate", (1, 24, 1, 1))
    w = g.param("w", rand((20, 24, 1, 1), 1))
    g.set_outputs([g.conv2d(g.mul(x, g.sigmoid(gate)), w, g.param("b", rand((20,), 2)))])
    cg = compile_cpu(g)
    assert any("scaled the weights" in line for line in cg.report().pipeline)
    packs.clear()
    for seed in (3, 4):
        feeds = {"x": rand((1, 24, 12, 12), seed), "gate": rand((1, 24, 1, 1), seed + 10)}
        (got,) = cg.run(feeds)
        np.testing.assert_allclose(got, reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)
    assert implicit and len(packs) == 2, "packed once a run"


DIRECT_CONVS = {  # name -> (x shape, w shape, bias?, kwargs): few taps, any stride
    "3x3x3 padding 1, bias (an image's first layer)": ((1, 3, 64, 64), (16, 3, 3, 3), True, {"padding": 1}),
    "no padding, 5 channels out (a partial block), 13 wide (a partial tile)": ((2, 2, 9, 15), (5, 2, 3, 3), False,
                                                                               {}),
    "asymmetric padding, 2x3, 17 channels out": ((1, 3, 9, 8), (17, 3, 2, 3), True, {"padding": (0, 1, 2, 1)}),
    "1x7 over 40 columns, padding 3 left and right": ((1, 1, 5, 40), (9, 1, 1, 7), True, {"padding": (0, 3, 0, 3)}),
    "padding wider than the kernel needs": ((1, 2, 6, 6), (3, 2, 3, 3), False, {"padding": 3}),
    "16 -> 32 channels, 3x3 over 32x32 (over 4M multiply-adds: every core)": ((1, 16, 32, 32), (32, 16, 3, 3), True,
                                                                                {"padding": 1}),
    "stride 2, 3x3x3 padding 1 over 33x34 (MobileNet's first layer)": ((2, 3, 33, 34), (16, 3, 3, 3), True,
                                                                        {"stride": 2, "padding": 1}),
    "stride 2, 7x7x3 padding 3 (ResNet's first layer), 10 channels out": ((1, 3, 23, 21), (10, 3, 7, 7), False,
                                                                            {"stride": 2, "padding": 3}),
    "stride (3, 2), no padding, a bottom row left over": ((1, 2, 11, 12), (4, 2, 2, 3), True, {"stride": (3, 2)}),
    "stride 4 wider than the kernel (input columns skipped)": ((1, 1, 9, 40), (3, 1, 2, 2), True, {"stride": 4}),
    "stride 2, no padding, odd width (SqueezeNet's first layer)": ((1, 3, 37, 37), (8, 3, 3, 3), True, {"stride": 2}),
    "stride 2, padding wider than the kernel needs, a 5-wide image": ((1, 2, 5, 5), (3, 2, 3, 3), False,
                                                                       {"stride": 2, "padding": 3}),
    "stride 2, right padding only, even width": ((2, 1, 6, 40), (4, 1, 3, 3), True,
                                                  {"stride": 2, "padding": (0, 0, 1, 1)}),
}


@pytest.mark.parametrize("name", list(DIRECT_CONVS))
def test_direct_convolution(lib: native.Native, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A convolution with at most DIRECT_CONV_TAPS taps runs as the direct kernel (no
    im2col): partial channel blocks and column tiles, any padding and stride, bias or
    none, two images, equal to the reference; then its packed weights follow set_param."""
    monkeypatch.setenv("RLX_CPU_GEMM", "blas")  # no implicit GEMM: every channel count goes direct
    monkeypatch.setenv("RLX_CPU_CONV", "direct")  # whatever this host measured
    direct, windows = spy_on(monkeypatch, lib, "conv_direct"), spy_on(monkeypatch, lib, "im2col")

    def ran() -> None:
        assert direct and not windows, "the direct convolution did not run"

    check_conv_follows_set_param(DIRECT_CONVS[name], "direct-conv", ran)


def test_direct_convolution_declines_what_it_does_not_do(lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dilation, groups, more taps than DIRECT_CONV_TAPS and weights computed per run go to
    im2col."""
    direct = spy_on(monkeypatch, lib, "conv_direct")
    g = Graph("not-direct")
    x = g.input("x", (1, 4, 10, 10))
    wgt = g.param("w", rand((4, 4, 3, 3), 1))
    monkeypatch.setattr(native_nn, "DIRECT_CONV_TAPS", 36)  # 4 x 3 x 3 would go direct; 4 x 5 x 5 not
    grouped, wide = g.param("wg", rand((4, 2, 3, 3), 2)), g.param("w5", rand((4, 4, 5, 5), 3))
    per_run = g.relu(g.input("w_run", (2, 4, 1, 1)))  # weights computed every run: nothing to pack
    g.set_outputs([g.conv2d(x, wgt, dilation=2), g.conv2d(x, grouped, groups=2),
                   g.conv2d(x, wide), g.conv2d(x, per_run)])
    feeds = {"x": rand((1, 4, 10, 10), 4), "w_run": rand((2, 4, 1, 1), 5)}
    got = compile_cpu(g).run(feeds)
    assert not direct
    for a, r in zip(got, reference.evaluate(g, feeds)):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)


FALLBACK_OPS = {  # name -> (graph builder over x (2, 4, 9, 10), native entry point)
    "softmax": (lambda g, x: g.softmax(x, axis=-1), "softmax"),
    "layer_norm": (lambda g, x: g.layer_norm(x, g.param("s", rand((10,), 1)), g.param("b", rand((10,), 2))),
                   "layer_norm"),
    "conv2d": (lambda g, x: g.conv2d(x, g.param("w", rand((6, 2, 3, 3), 3)), g.param("b", rand((6,), 4)), stride=2,
                                     padding=(1, 2, 0, 1), dilation=(1, 2), groups=2), "im2col"),
    "implicit-GEMM conv2d": (lambda g, x: g.conv2d(x, g.param("w", rand((6, 4, 3, 3), 3)), g.param("b", rand((6,), 4)),
                                                   stride=2, padding=(1, 2, 0, 1), dilation=(1, 2)), "conv_gemm"),
    "direct conv2d": (lambda g, x: g.conv2d(x, g.param("w", rand((5, 4, 2, 3), 3)), g.param("b", rand((5,), 4)),
                                            padding=(1, 0, 2, 1)), "conv_direct"),
    "strided direct conv2d": (lambda g, x: g.conv2d(x, g.param("w", rand((5, 4, 3, 3), 3)), stride=(2, 3),
                                                    padding=1), "conv_direct"),
    "max_pool2d": (lambda g, x: g.max_pool2d(x, 3, stride=2, dilation=2), "pool2d"),
    "avg_pool2d": (lambda g, x: g.avg_pool2d(x, (3, 2), stride=(1, 2)), "pool2d"),
    "padded max_pool2d": (lambda g, x: g.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True), "pool2d_padded"),
    "padded avg_pool2d": (lambda g, x: g.avg_pool2d(x, (3, 2), stride=(1, 2), padding=(1, 1, 1, 0)),
                          "pool2d_padded"),
    "padded avg_pool2d counting the padding": (
        lambda g, x: g.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=True), "pool2d_padded"),
}


@pytest.mark.parametrize("layout", ["fortran order", "read-only", "every other element"])
@pytest.mark.parametrize("op", list(FALLBACK_OPS))
def test_row_and_window_kernels_take_any_caller_layout(lib: native.Native, monkeypatch: pytest.MonkeyPatch, op: str,
                                                       layout: str) -> None:
    """A caller's array the C side cannot address as it is (strided, read-only) makes that
    run take the numpy twin of the kernel (``native_nn``'s fallbacks): the same answer,
    and the next contiguous run is native again."""
    build, entry = FALLBACK_OPS[op]
    # the implicit GEMM needs rlx's GEMM, and the direct kernel takes 4 channels in without it
    monkeypatch.setenv("RLX_CPU_GEMM", "native" if entry == "conv_gemm" else "blas")
    monkeypatch.setenv("RLX_CPU_CONV", "direct" if entry == "conv_direct" else "implicit")
    calls = spy_on(monkeypatch, lib, entry)
    g = Graph(f"fallback-{op}")
    g.set_outputs([build(g, g.input("x", (2, 4, 9, 10)))])
    cg = compile_cpu(g)
    x = rand((2, 4, 9, 10), 5)
    x[1, 2, 3, 4] = np.nan
    (want,) = reference.evaluate(g, {"x": x})
    (got,) = cg.run({"x": dict(caller_layouts(x))[layout]})
    assert not calls, "the C side was handed an array it cannot take"
    assert_close(got, want, rtol=1e-5, atol=2e-5)  # the float32 mean of ~1000 alone is off by up to 3e-5 / std
    (again,) = cg.run({"x": x})
    assert calls, f"{entry} did not run natively on a contiguous array"
    assert_close(again, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- set_param
def test_native_steps_follow_set_param(lib: native.Native, region_runs: list[regions._Runner],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Native steps hold the addresses of the residents, which set_param overwrites in
    place: a region reading a row and a scalar param, a layer_norm's scale and bias, a
    softmax of a folded (param-only) value and a folded region all follow the new values."""
    ln_calls = spy_on(monkeypatch, lib, "layer_norm")
    sm_calls = spy_on(monkeypatch, lib, "softmax")
    g = Graph("set-param")
    x = g.input("x", (8, 32))
    w, s = g.param("w", rand((32,), 1)), g.param("s", np.array(0.5, F32))
    scale, bias = g.param("scale", rand((32,), 2)), g.param("bias", rand((32,), 3))
    p = g.param("p", rand((4, 32), 4))
    h = g.tanh(g.add(g.mul(x, w), s))
    folded = g.exp(g.mul(p, 0.5))  # computed at compile time and again by set_param
    g.set_outputs([g.layer_norm(h, scale, bias), g.softmax(p), g.add(g.softmax(x), g.reduce_sum(folded, axes=0))])
    cg = compile_cpu(g)
    x_in = rand((8, 32), 5)
    cg.run({"x": x_in})
    assert region_runs and ln_calls and sm_calls
    new = {"w": rand((32,), 11), "s": np.array(-1.25, F32), "scale": rand((32,), 12), "bias": rand((32,), 13),
           "p": rand((4, 32), 14)}
    for name, value in new.items():
        cg.set_param(name, value)
    got = cg.run({"x": x_in})
    want = reference.evaluate(g, {"x": x_in}, params=new)
    for a, r in zip(got, want):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [{"padding": 1}, {"padding": (0, 1, 1, 0), "ceil_mode": True},
                                    {"stride": 3, "ceil_mode": True}, {"dilation": 2, "padding": 2}])
def test_padded_max_pool_runs_natively_over_an_infinite_border(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                               kwargs: dict) -> None:
    """Padding and ceil_mode windows past the edge: each window clipped to the image by the
    native padded pool (strides 1 and 2, no dilation), else the input copied into a -inf
    border, then the native pool (no numpy passes); NaN and -inf inputs keep numpy's
    maximum."""
    calls = spy_on(monkeypatch, lib, "pool2d")
    clipped = spy_on(monkeypatch, lib, "pool2d_padded")
    g = Graph("padded-pool")
    g.set_outputs([g.max_pool2d(g.input("x", (2, 3, 10, 11)), 3, **{"stride": 2, **kwargs})])
    x = rand((2, 3, 10, 11), 9)
    x[0, 1, 4, 4], x[1, 2, 0, 0] = np.nan, -np.inf
    (got,) = compile_cpu(g).run({"x": x})
    in_place = kwargs.get("dilation", 1) == 1 and kwargs.get("stride", 2) <= 2
    assert (bool(clipped), bool(calls)) == (in_place, not in_place)
    np.testing.assert_array_equal(got, reference.evaluate(g, {"x": x})[0])


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kernel", [(1, 1), (2, 2), (3, 3), (2, 5), (5, 3), (3, 8)])
@pytest.mark.parametrize("kind", ["max", "avg counting the padding", "avg"])
def test_padded_pool_clips_every_window_to_the_image(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                     kernel: tuple[int, int], stride: int, kind: str) -> None:
    """Paddings up to half the window (the most the IR allows), on each side, with and without
    ceil_mode, rows wider than one chunk of the kernel (300 outputs): as the reference (a
    max exactly; an average's count is the window's positions inside the image, or inside
    it and its declared padding, never ceil_mode's positions past that)."""
    clipped = spy_on(monkeypatch, lib, "pool2d_padded")
    rng = np.random.default_rng(sum(kernel) * 10 + stride)
    for trial in range(6):
        pads = tuple(int(rng.integers(0, k // 2 + 1)) for k in (kernel[0], kernel[1], kernel[0], kernel[1]))
        h, w = int(rng.integers(kernel[0], 9)), int(rng.integers(kernel[1], 13)) + (600 if trial == 0 else 0)
        g = Graph("clip")
        x_in = g.input("x", (1, 2, h, w))
        if kind == "max":
            y = g.max_pool2d(x_in, kernel, stride=stride, padding=pads, ceil_mode=bool(trial % 2))
        else:
            y = g.avg_pool2d(x_in, kernel, stride=stride, padding=pads, ceil_mode=bool(trial % 2),
                             count_include_pad=kind != "avg")
        g.set_outputs([y])
        x = rand((1, 2, h, w), trial)
        (want,) = reference.evaluate(g, {"x": x})
        if kind == "max":
            x[0, 1, 0, 0] = np.nan
            (want,) = reference.evaluate(g, {"x": x})
        (got,) = compile_cpu(g).run({"x": x})
        if kind == "max":
            np.testing.assert_array_equal(got, want, err_msg=f"pads {pads}, {h}x{w}")
        else:
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=f"pads {pads}, {h}x{w}")
    assert clipped or kernel == (1, 1) or (kind != "max" and not any(pads))


@pytest.mark.parametrize(("o", "want"), [(64, 12), (128, 12), (24, 12), (16, 8), (8, 8), (40, 12), (256, 12)])
def test_implicit_gemm_panel_off_avx512_prefers_12_channels(monkeypatch: pytest.MonkeyPatch, o: int,
                                                            want: int) -> None:
    """Off AVX-512 the implicit GEMM takes 12-channel panels unless they pad a quarter more
    channels than 8-channel ones (the 8-channel sub-tile keeps too few sums to hide the
    multiply-add latency): 64 -> 72 and 40 -> 48 padded are taken, 16 -> 24 is not."""

    class Avx2:
        gemm_avx512 = 0

    monkeypatch.setattr(implicit_gemm, "library", lambda: Avx2())
    assert implicit_gemm.conv_gemm_panel(o, 3136, 576) == want


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, rounded to nearest even, NaN kept NaN (quieted): the
    reference for the interpreter's bf16 output."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def test_a_region_reads_and_writes_values_held_bf16():
    """``held.py``'s values in a region: a bf16 operand widened exactly (its bits << 16),
    a bf16 output rounded to nearest even with NaN kept NaN, infinities and the largest
    finite values carried as a rounding carries them."""
    if native.library() is None:
        pytest.skip(f"no native library: {native.reason()}")
    rng = np.random.default_rng(11)
    shape = (3, 5, 7, 40)
    x = rng.standard_normal(shape).astype(np.float32) * 10
    x.reshape(-1)[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8]
    y = rng.standard_normal(shape).astype(np.float32)
    buf_x, buf_out = np.empty(shape, np.float32), np.empty(shape, np.float32)
    bits_x = _bf16_bits(x)
    held16(buf_x).view(np.uint16)[...] = bits_x
    widened = (bits_x.astype(np.uint32) << 16).view(np.float32)
    program = [Instruction(OpKind.MUL, (0, 1), {}, shape, "float32"),
               Instruction(OpKind.ADD, (2, 0), {}, shape, "float32")]
    steps = regions.region_steps(program, [held16(buf_x), y], held16(buf_out))
    assert steps is not None and held16(buf_out).dtype == HELD16
    for step in steps:
        step.fn(*step.args)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = _bf16_bits(widened * y + widened)
    got = held16(buf_out).view(np.uint16)
    np.testing.assert_array_equal(got, expected)
    # float32 in, bf16 out; and bf16 in, float32 out
    wide_out = np.empty(shape, np.float32)
    steps = [*regions.region_steps(program, [y, y], held16(buf_out)),
             *regions.region_steps(program[:1], [held16(buf_x), y], wide_out)]
    for step in steps:
        step.fn(*step.args)
    np.testing.assert_array_equal(held16(buf_out).view(np.uint16), _bf16_bits(y * y + y))
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(wide_out, widened * y)


def test_a_held_value_never_shares_memory_with_an_output_of_another_format():
    if native.library() is None:
        pytest.skip(f"no native library: {native.reason()}")
    buf = np.zeros((4, 64), np.float32)
    program = [Instruction(OpKind.RELU, (0,), {}, (4, 64), "float32")]
    assert regions.region_steps(program, [held16(buf)], buf) is None  # bf16 read, float32 written over it
    assert regions.region_steps(program, [buf], held16(buf)) is None
    assert regions.region_steps(program, [held16(buf)], held16(buf)) is not None  # in place, both bf16
