"""How the cpu kernels compute: conv2d as im2col plus one (batched) matmul, exact
integer and bool arithmetic, float16 through float32 accumulation. Values are held to
the float64 reference (``rlx_core.reference``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir import Graph
from rlx_core.ir.ops import OpKind
from rlx_core.plugin import CompileOptions
from rlx_cpu import CpuBackend, native
from rlx_cpu.nn_kernels import NN_KERNELS


def run_cpu(graph: Graph, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    exe = CpuBackend().compile(graph.freeze(), CompileOptions(device="cpu"))
    return exe.run(inputs)


class _Temporaries:
    """A build context handing out private temporaries (what a plan's arena does)."""

    def scratch(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.empty(shape, dtype)


# (x shape, w shape, stride, padding, dilation, groups)
CONV_CASES = [
    ((2, 3, 7, 7), (4, 3, 3, 3), 1, 0, 1, 1),
    ((1, 3, 8, 9), (6, 3, 3, 3), 2, 1, 1, 1),
    ((1, 4, 9, 9), (4, 2, 3, 3), 1, (1, 2, 0, 1), 2, 2),  # asymmetric padding, dilation, groups
    ((2, 6, 6, 6), (6, 1, 3, 3), (2, 1), 1, 1, 6),  # depthwise
    ((1, 4, 5, 5), (8, 4, 1, 1), 1, 0, 1, 1),  # pointwise: no im2col at all
    ((1, 2, 10, 8), (3, 2, 2, 3), (3, 2), (2, 1), (2, 1), 1),
]


def conv_graph(xs: tuple[int, ...], ws: tuple[int, ...], stride: Any, padding: Any, dilation: Any, groups: int,
               dtype: str = "float32", bias: bool = True) -> Graph:
    rng = np.random.default_rng(sum(xs) + sum(ws))
    g = Graph("conv")
    x = g.input("x", xs, dtype)
    w = g.param("w", rng.standard_normal(ws).astype(dtype))
    b = g.param("b", rng.standard_normal(ws[0]).astype(dtype)) if bias else None
    g.set_outputs([g.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)])
    return g


def _calls_mkl(fn: Any) -> bool:
    """A step that is one product on MKL or rlx's GEMM (``ccall`` of an sgemm entry point
    or ``rlx_gemm``), whether its addresses are fixed or read per run; other ``ccall``
    steps (native im2col) are not."""
    from rlx_cpu import blas, ccall
    from rlx_cpu.steps import Step

    found = ccall.target(Step(fn))
    if found is None:
        return False
    target = found[0]
    lib, own = blas.mkl(), native.library()
    return (lib is not None and target in (lib.sgemm, lib.compute, lib.sgemm_batch_strided)) or (
        own is not None and target is own.gemm)


@pytest.mark.parametrize(("xs", "ws", "stride", "padding", "dilation", "groups"), CONV_CASES)
def test_conv2d_is_one_product_or_one_depthwise_pass(xs: tuple[int, ...], ws: tuple[int, ...], stride: Any,
                                                         padding: Any, dilation: Any, groups: int) -> None:
    graph = conv_graph(xs, ws, stride, padding, dilation, groups)
    node = graph.node(graph.outputs[0])
    # The kernel's steps, built on concrete arrays: a copy into the column matrix (none
    # for a 1x1 stride-1 conv), then exactly one batched matmul over every group (a
    # depthwise conv: one native pass instead, when the native kernels are built).
    ins = [np.ones(xs, np.float32), np.ones(ws, np.float32), np.ones(ws[0], np.float32)]
    steps = NN_KERNELS[OpKind.CONV2D](node, ins, np.empty(node.shape, np.float32), _Temporaries())
    if groups == xs[1] == ws[0] and native.library() is not None:  # depthwise: one native pass, no product
        # (the lanes kernel's filters packed by a step before it: this context keeps nothing)
        assert len(steps) in (1, 2) and np.matmul not in [s.fn for s in steps]
    else:
        products = [s for s in steps if s.fn is np.matmul or _calls_mkl(s.fn)]
        assert len(products) == 1, [getattr(s.fn, "__name__", s.fn) for s in steps]
    assert not any(s.fn is np.einsum or s.fn is np.tensordot for s in steps)

    x = np.random.default_rng(1).standard_normal(xs).astype(np.float32)
    (got,) = run_cpu(graph, {"x": x})
    (ref,) = reference.evaluate(graph, {"x": x})
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_conv2d_float16_accumulates_in_float32() -> None:
    graph = conv_graph((1, 8, 6, 6), (4, 8, 3, 3), 1, 1, 1, 1, dtype="float16", bias=False)
    x = np.random.default_rng(2).standard_normal((1, 8, 6, 6)).astype(np.float16)
    (got,) = run_cpu(graph, {"x": x})
    (ref,) = reference.evaluate(graph, {"x": x})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2, atol=2e-2)


# ----------------------------------------------------------------------------- ints and bools
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_ops_are_exact(dtype: str) -> None:
    g = Graph(f"ints_{dtype}")
    a = g.input("a", (2, 6), dtype)
    b = g.input("b", (6,), dtype)
    idx = g.input("idx", (3,), "int64")
    q = g.div(a, b)  # truncates toward zero, like C and ONNX
    mixed = g.maximum(g.abs(g.sub(g.mul(a, b), q)), g.neg(a))
    total = g.reduce_sum(mixed, axes=1, keepdims=True)
    cat = g.concat([g.slice(a, (0,), (4,), axes=(1,)), g.gather(a, idx, axis=1)], axis=1)
    g.set_outputs([q, mixed, total, g.reduce_max(cat, axes=(0,)), g.transpose(cat)])
    feeds = {
        "a": np.array([[7, -7, 9, -9, 100, 0], [1, 2, 3, -4, -5, 6]], dtype),
        "b": np.array([2, 2, -4, -4, 7, -3], dtype),
        "idx": np.array([5, 0, 3], np.int64),
    }
    outs = run_cpu(g, feeds)
    refs = reference.evaluate(g, feeds)
    for got, ref in zip(outs, refs):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(outs[0][0], [3, -3, -2, 2, 14, 0])


def test_bool_where_cast_and_comparisons_via_cast() -> None:
    g = Graph("bools")
    x = g.input("x", (8,), "float32")
    mask = g.input("mask", (8,), "bool")
    as_int = g.cast(mask, "int32")
    back = g.cast(g.sub(as_int, 1), "bool")  # nonzero -> True
    picked = g.where(mask, x, g.neg(x))
    g.set_outputs([back, picked, g.cast(x, "bool"), g.cast(x, "int64"), g.reduce_sum(as_int)])
    feeds = {"x": np.array([-2.7, -1.0, -0.5, 0.0, 0.5, 1.0, 2.7, 3.5], np.float32),
             "mask": np.array([1, 0, 1, 1, 0, 0, 1, 0], bool)}
    outs = run_cpu(g, feeds)
    refs = reference.evaluate(g, feeds)
    assert [o.dtype for o in outs] == [np.bool_, np.float32, np.bool_, np.int64, np.int32]
    for got, ref in zip(outs, refs):
        np.testing.assert_array_equal(got, ref.astype(got.dtype))
    np.testing.assert_array_equal(outs[3], [-2, -1, 0, 0, 0, 1, 2, 3])  # float -> int truncates


def test_integer_matmul_does_not_round_through_floats() -> None:
    g = Graph("imatmul")
    a = g.input("a", (2, 3), "int64")
    w = g.param("w", np.array([[2**40, 1], [3, -(2**41)], [-5, 7]], np.int64))
    g.set_outputs([g.matmul(a, w)])
    av = np.array([[1, 2, 3], [-4, 5, 2**20]], np.int64)
    (got,) = run_cpu(g, {"a": av})
    np.testing.assert_array_equal(got, av @ np.array([[2**40, 1], [3, -(2**41)], [-5, 7]], np.int64))


# ----------------------------------------------------------------------------- float16
def test_float16_block_matches_the_reference() -> None:
    """A transformer-ish block in float16: sums, norms and softmax accumulate in float32,
    so the error stays within float16's own rounding."""
    rng = np.random.default_rng(5)
    g = Graph("f16")
    x = g.input("x", (2, 5, 16), "float16")
    w = g.param("w", (rng.standard_normal((16, 16)) / 4).astype(np.float16))
    scale = g.param("scale", np.ones(16, np.float16))
    h = g.layer_norm(g.matmul(x, w), scale, axis=-1)
    att = g.attention(h, h, h)
    y = g.gelu(g.add(att, g.sigmoid(h)), approximate="tanh")
    g.set_outputs([g.softmax(y, axis=-1), g.reduce_mean(g.rsqrt(g.add(g.mul(y, y), 1.0)), axes=(1,)),
                   g.erf(y), g.cast(y, "float32")])
    xv = rng.standard_normal((2, 5, 16)).astype(np.float16)
    outs = run_cpu(g, {"x": xv})
    refs = reference.evaluate(g, {"x": xv})
    for got, ref, nid in zip(outs, refs, g.outputs):
        assert got.dtype == np.dtype(g.node(nid).dtype)
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2, atol=1e-2)


def test_float16_long_sum_does_not_overflow_or_drift() -> None:
    """4096 halves summed: a float16 accumulator would stall at 2048 + rounding."""
    g = Graph("f16sum")
    x = g.input("x", (4096,), "float16")
    g.set_outputs([g.reduce_sum(x), g.reduce_mean(x)])
    xv = np.full(4096, 1.0, np.float16)
    total, mean = run_cpu(g, {"x": xv})
    assert total == np.float16(4096) and mean == np.float16(1)


@pytest.mark.parametrize(("shape", "dtype"), [((64, 10), "float32"), ((3, 16, 5), "float16"), ((20, 32), "float64"),
                                              ((16, 1), "float32"), ((4, 33), "float32")])
def test_softmax_of_short_rows_in_a_transposed_copy(shape: tuple[int, ...], dtype: str) -> None:
    """Short rows (<= SHORT_ROW) are normalized as columns of a transposed copy; longer or
    fewer rows the plain way. Both agree with the reference, infinities and NaN included."""
    g = Graph("sm")
    x = g.input("x", shape, dtype)
    g.set_outputs([g.softmax(x, axis=-1)])
    v = np.random.default_rng(5).standard_normal(shape).astype(dtype) * 4
    v.reshape(-1, shape[-1])[0, 0] = np.inf
    v.reshape(-1, shape[-1])[1, -1] = np.nan
    v.reshape(-1, shape[-1])[2, :] = -np.inf
    with np.errstate(invalid="ignore"):
        got = run_cpu(g, {"x": v})[0]
        want = reference.evaluate(g, {"x": v})[0]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3 if dtype == "float16" else 1e-5, atol=1e-6)


@pytest.mark.parametrize("gemm", ["blas", "native"])
@pytest.mark.parametrize("folded_bias", [False, True])
def test_conv2d_bias_column_follows_set_param(folded_bias: bool, gemm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bias of an im2col convolution follows set_param of the weights, the bias, or a
    param the bias is folded from (batch-norm folding makes such biases): on a BLAS the
    weights with the bias appended are kept by the executable and refilled; on rlx's
    GEMM the bias is added as C is stored, read from its (refolded) array every run."""
    monkeypatch.setenv("RLX_CPU_GEMM", gemm)
    rng = np.random.default_rng(5)
    g = Graph("conv_bias")
    x = g.input("x", (1, 32, 9, 9))
    w = g.param("w", rng.standard_normal((16, 32, 3, 3)).astype(np.float32))
    b = g.param("b", rng.standard_normal(16).astype(np.float32))
    bias = g.mul(b, 2.0) if folded_bias else b
    g.set_outputs([g.conv2d(x, w, bias, padding=1)])
    cg = rlx.compile(g, device="cpu")
    kept = [k[-1] for k in cg._exe._derived_arrays]  # the executable keeps the array, not each run
    if gemm == "blas" or native.library() is None:
        assert ("conv_bias_column",) in kept, kept  # 288 taps: im2col and a product
    else:
        assert ("conv_bias_column",) not in kept, kept
    xv = rng.standard_normal((1, 32, 9, 9)).astype(np.float32)
    params: dict[str, np.ndarray] = {}
    for name, shape in (("w", (16, 32, 3, 3)), ("b", (16,)), ("w", (16, 32, 3, 3))):
        params[name] = rng.standard_normal(shape).astype(np.float32)
        cg.set_param(name, params[name])
        (got,) = cg.run({"x": xv})
        np.testing.assert_allclose(got, reference.evaluate(g, {"x": xv}, params=params)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axes, keepdims", [((2, 3), True), ((3, 2), False), ((-1,), True), ((1, 2, 3), False)])
def test_a_mean_over_trailing_axes_is_one_matrix_vector_product(axes: tuple[int, ...], keepdims: bool) -> None:
    """reduce_mean over an array's last axes (dynamo's spelling of a global average pool)
    is rlx_gemv's product of its rows with 1/n, as global_avg_pool2d is, on a graph input
    and on a computed value alike; other axes keep numpy's reduce."""
    from rlx_cpu import ccall
    from rlx_cpu.kernels import mean_rows_step

    lib = native.library()
    if lib is None:
        pytest.skip(f"native kernels unavailable: {native.reason()}")
    g = Graph("means")
    x = g.input("x", (2, 5, 7, 6), "float32")
    g.set_outputs([g.reduce_mean(x, axes, keepdims=keepdims), g.reduce_mean(g.exp(x), axes, keepdims=keepdims),
                   g.reduce_mean(x, (1,), keepdims=keepdims)])
    feeds = {"x": np.random.default_rng(4).standard_normal((2, 5, 7, 6)).astype(np.float32)}
    for got, want in zip(run_cpu(g, feeds), reference.evaluate(g, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    xv = feeds["x"]
    out = np.empty(np.mean(xv, axis=axes, keepdims=keepdims).shape, np.float32)
    step = mean_rows_step(xv, tuple(a % 4 for a in axes), out)
    assert step is not None and ccall.target(step)[0] is lib.gemv
    assert mean_rows_step(xv, (1,), np.empty((2, 7, 6), np.float32)) is None


@pytest.mark.parametrize(("shape", "dtype"), [((7,), np.float32), ((3, 5, 2), np.float64), ((0, 4), np.float32),
                                              (1, np.int8), ((1 << 20,), np.float32)])
def test_aligned_empty_starts_on_a_cache_line(shape: Any, dtype: Any) -> None:
    from rlx_cpu.steps import CACHE_LINE, aligned_empty

    for _ in range(8):  # numpy's own allocations land on any multiple of 16
        a = aligned_empty(shape, dtype)
        assert (a.ctypes.data % CACHE_LINE == 0 or a.size == 0) and a.dtype == dtype and a.flags.c_contiguous
        assert a.shape == ((shape,) if isinstance(shape, int) else shape)
        a[...] = 1  # writable, and all of it


def test_plan_buffers_and_packed_weights_start_on_a_cache_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every buffer the plan hands the kernels (intermediates, scratch) and every packed
    weight starts on a cache line: split vector loads made a model's speed depend on luck."""
    from rlx_cpu import plan_arena
    from rlx_cpu.steps import CACHE_LINE

    taken: list[np.ndarray] = []
    for arena in (plan_arena.PlannedArena, plan_arena.FreeListArena):
        real = arena.take
        monkeypatch.setattr(arena, "take", lambda self, n, real=real: (taken.append(real(self, n)), taken[-1])[1])
    g = Graph("aligned")
    x = g.input("x", (2, 8, 12, 12), "float32")
    w = g.param("w", np.ones((16, 8, 3, 3), np.float32))
    y = g.relu(g.conv2d(g.relu(x), w, padding=1))
    g.set_outputs([g.matmul(g.reshape(y, (2, 16 * 144)), g.param("d", np.ones((16 * 144, 10), np.float32)))])
    exe = CpuBackend().compile(g.freeze(), CompileOptions(device="cpu"))
    exe.run({"x": np.ones((2, 8, 12, 12), np.float32)})
    packed = [entry[2] for entry in exe._derived_arrays.values()]
    assert taken and all(a.ctypes.data % CACHE_LINE == 0 for a in taken + packed)


@pytest.mark.parametrize("native_kernels", ["1", "0"])
def test_ieee_results_of_casts_and_reductions_raise_no_runtime_warning(monkeypatch: pytest.MonkeyPatch,
                                                                     native_kernels: str) -> None:
    """A Cast of NaN or an out-of-range float to an integer, and a max over NaN, are what
    the graph asks for: numpy's RuntimeWarnings from inside rlx's steps ("invalid value
    encountered in cast", "... in reduce") would reach the user about values the user's
    inputs hold; the answers are numpy's."""
    import warnings

    monkeypatch.setenv("RLX_CPU_NATIVE", native_kernels)
    monkeypatch.setattr(native, "_STATE", {})
    g = Graph("ieee")
    f = g.input("f", (3, 4), "float32")
    d = g.input("d", (3, 4), "float64")
    g.set_outputs([g.cast(f, "int32"), g.reduce_max(f, axes=(1,)), g.cast(d, "float32"), g.cast(d, "int16")])
    fv = np.array([[np.nan, 1.0, np.inf, -3e10]] * 3, np.float32)
    dv = np.array([[1e300, -1e300, np.nan, 2.5]] * 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = run_cpu(g, {"f": fv, "d": dv})
    with np.errstate(all="ignore"):
        want = [fv.astype(np.int32), np.max(fv, axis=1), dv.astype(np.float32), dv.astype(np.int16)]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
