"""Convolutions on oneDNN (the ``onednn`` extra): the same answers as the reference for
every convolution it takes, the weights following ``set_param``, and the choice made
where it measured faster (or forced, or off)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir import Graph
from rlx_cpu import onednn, onednn_matmul, onednn_steps

pytestmark = pytest.mark.skipif(onednn.find_library() is None,
                                reason="oneDNN is not installed (pip install 'rlx-cpu[onednn]')")


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _spied(monkeypatch: pytest.MonkeyPatch, kind: type[onednn_steps._Call]) -> list[tuple[Any, ...]]:
    """RLX_CPU_ONEDNN=on, and the (input, output) shapes of each ``kind`` call plans run."""
    monkeypatch.setenv("RLX_CPU_ONEDNN", "on")
    calls: list[tuple[Any, ...]] = []
    real = kind.__call__

    def spy(self: onednn_steps._Call, x: np.ndarray, y: np.ndarray) -> None:
        calls.append((x.shape, y.shape))
        real(self, x, y)

    monkeypatch.setattr(kind, "__call__", spy)
    return calls


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """RLX_CPU_ONEDNN=on, and the oneDNN convolutions that plans then run."""
    return _spied(monkeypatch, onednn_steps._ConvCall)


#: name -> (x shape, w shape, bias?, conv2d keyword arguments)
CONVS: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool, dict[str, Any]]] = {
    "3x3 same, bias": ((1, 8, 12, 12), (16, 8, 3, 3), True, {"padding": 1}),
    "7x7 stride 2 first layer": ((2, 3, 33, 31), (8, 3, 7, 7), True, {"stride": 2, "padding": 3}),
    "asymmetric padding, no bias": ((1, 5, 9, 10), (6, 5, 3, 2), False, {"padding": (1, 0, 2, 1)}),
    "dilation 2, stride (2, 1)": ((1, 4, 15, 13), (4, 4, 3, 3), True, {"stride": (2, 1), "padding": 2, "dilation": 2}),
    "groups 2": ((1, 8, 10, 10), (12, 4, 3, 3), True, {"padding": 1, "groups": 2}),
    "groups 4 (ResNeXt-style)": ((2, 16, 7, 7), (16, 4, 3, 3), False, {"padding": 1, "groups": 4}),
    "1x1": ((1, 32, 7, 7), (24, 32, 1, 1), True, {}),
    "1x1 stride 2": ((1, 8, 9, 9), (4, 8, 1, 1), False, {"stride": 2}),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_each_convolution_matches_the_reference(forced: list[tuple[Any, ...]], name: str) -> None:
    xs, ws, with_bias, kw = CONVS[name]
    g = Graph("conv")
    x = g.input("x", xs)
    b = g.param("b", rand((ws[0],), 3)) if with_bias else None
    g.set_outputs([g.relu(g.conv2d(x, g.param("w", rand(ws, 2)), b, **kw))])  # relu: fused_conv's epilogue
    cg = rlx.compile(g, device="cpu")
    feeds = {"x": rand(xs, 1)}
    np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds)[0], rtol=1e-4, atol=1e-4)
    assert forced, "oneDNN did not run"
    strided = {"x": np.asfortranarray(feeds["x"])}  # a caller's array it cannot read in place: a copy
    np.testing.assert_allclose(cg.run(strided)[0], reference.evaluate(g, feeds)[0], rtol=1e-4, atol=1e-4)
    w2 = rand(ws, 7)
    cg.set_param("w", w2)  # the weights reordered for oneDNN follow
    np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds, {"w": w2})[0], rtol=1e-4, atol=1e-4)


def test_a_chain_and_a_residual_add_run_on_it(forced: list[tuple[Any, ...]]) -> None:
    g = Graph("block")
    x = g.input("x", (2, 16, 14, 14))
    h = g.relu(g.conv2d(x, g.param("w1", rand((16, 16, 3, 3), 1)), g.param("b1", rand((16,), 2)), padding=1))
    h = g.conv2d(h, g.param("w2", rand((16, 16, 3, 3), 3)), padding=1)
    g.set_outputs([g.relu(g.add(h, x))])
    feeds = {"x": rand((2, 16, 14, 14), 4)}
    got = rlx.compile(g, device="cpu").run(feeds)[0]
    np.testing.assert_allclose(got, reference.evaluate(g, feeds)[0], rtol=1e-4, atol=1e-4)
    assert len(forced) == 2


def test_depthwise_runs_on_it_and_run_time_weights_stay_on_rlx(forced: list[tuple[Any, ...]]) -> None:
    g = Graph("depthwise")
    x = g.input("x", (1, 8, 10, 10))
    dw = g.conv2d(x, g.param("dw", rand((8, 1, 3, 3), 1)), padding=1, groups=8)
    dw2 = g.conv2d(x, g.param("dw2", rand((8, 1, 5, 5), 4)), stride=2, padding=2, groups=8)
    per_run = g.conv2d(x, g.relu(g.input("w", (4, 8, 1, 1))))
    g.set_outputs([dw, dw2, per_run])
    feeds = {"x": rand((1, 8, 10, 10), 2), "w": rand((4, 8, 1, 1), 3)}
    for got, want in zip(rlx.compile(g, device="cpu").run(feeds), reference.evaluate(g, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(forced) == 2  # the two depthwise ones; the weights computed per run stay on rlx


def test_off_never_loads_it_and_auto_says_what_it_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CPU_ONEDNN", "off")
    assert onednn.library() is None and onednn.use() is None
    assert onednn.describe() == "off (RLX_CPU_ONEDNN=off)"
    monkeypatch.setenv("RLX_CPU_ONEDNN", "auto")
    onednn.reset()
    try:
        assert onednn.describe().endswith("spatial: timed against rlx's at the first one; pointwise: rlx (a 1x1 "
                                          "convolution is one GEMM in NCHW; oneDNN's adds reorders to NHWC and "
                                          "back); depthwise: timed against rlx's at the first one; grouped: timed "
                                          "against rlx's at the first one; grouped-small: timed against rlx's at the "
                                          "first one; matmul: timed against rlx's at the first one")
        chosen = {kind: onednn.use(kind) is not None for kind in onednn.KINDS}
        text = onednn.describe()
        assert re.match(r"oneDNN 3\.\d+\.\d+ for convolutions and dense layers' products; spatial: (oneDNN|rlx) "
                        r"\(timed \d+\.\d\dx rlx's speed at "
                        r"64 -> 64 3x3 over 28x28\); pointwise: rlx \(a 1x1 convolution is one GEMM in NCHW[^)]*\); "
                        r"depthwise: (oneDNN|rlx) \(timed \d+\.\d\dx rlx's speed at 96 -> 96 3x3 depthwise \(96 "
                        r"groups\) over 56x56\); grouped: (oneDNN|rlx) \(timed \d+\.\d\dx rlx's speed at 128 -> 128 "
                        r"3x3 grouped \(32 groups\) over 28x28\); grouped-small: (oneDNN|rlx) \(timed \d+\.\d\dx "
                        r"rlx's speed at 208 -> 208 3x3 grouped-small \(26 groups\) over 14x14\); matmul: "
                        r"(oneDNN|rlx) \(timed \d+\.\d\dx rlx's speed at a 128 x 768 x 768 dense layer\)$", text), text
        assert onednn.use("pointwise") is None  # never timed: rlx's GEMM in auto
        assert text.count("oneDNN (timed") == sum(chosen.values())
        assert onednn.kind_of((1, 1), (1, 1)) == "pointwise" and onednn.kind_of((1, 1), (2, 2)) == "spatial"
        assert onednn.kind_of((3, 3), (1, 1), 8, 8, 8) == "depthwise" and onednn.kind_of((3, 3), (1, 1), 2, 8, 8) == \
            "grouped"
        assert onednn.kind_of((3, 3), (1, 1), 2, 8, 8, 14 * 14) == "grouped-small"
        assert onednn.kind_of((3, 3), (1, 1), 2, 64, 64, 14 * 14) == "grouped"  # 32 channels a group
        assert onednn.kind_of((3, 3), (1, 1), 2, 8, 8, 28 * 28) == "grouped"
    finally:
        onednn.reset()


def test_not_installed_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onednn, "find_library", lambda: None)
    monkeypatch.setenv("RLX_CPU_ONEDNN", "auto")
    assert onednn.describe().startswith("not installed (pip install 'rlx-cpu[onednn]'")


class _Ctx:
    """A plan's build context, kept simple: scratch arrays held here, weights derived once."""

    def __init__(self) -> None:
        self.kept: list[np.ndarray] = []

    def scratch(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        self.kept.append(np.zeros(shape, dtype))
        return self.kept[-1]

    def derived(self, source: np.ndarray, key: Any, make: Any, also: Any = ()) -> np.ndarray:
        return make(source, None)


def test_a_narrow_plan_runs_it_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound under a thread cap (the tuner's narrow plans), a convolution sets the calling
    thread's OpenMP team to the cap for its call and puts it back; without one it leaves
    OpenMP alone."""
    from rlx_cpu import native

    monkeypatch.setenv("RLX_CPU_ONEDNN", "on")
    lib = onednn.library()
    assert lib is not None
    x, w = rand((1, 4, 6, 6), 1), rand((5, 4, 3, 3), 2)
    want = reference.evaluate(_one_conv(), {"x": x})[0]
    for cap in (1, None):
        y = np.empty((1, 5, 6, 6), np.float32)
        with native.thread_cap(cap):
            (step,) = onednn_steps.conv_steps(lib, x, w, None, y, (1, 1, 1, 1), (1, 1), (1, 1), 1, _Ctx())
        call = step.fn
        assert (call.openmp is not None) is (cap is not None)
        if call.openmp is not None:
            before = call.openmp.get()
            seen: list[int] = []
            real_set = call.openmp.set
            monkeypatch.setattr(call.openmp, "set", lambda n, s=seen, r=real_set: (s.append(n), r(n))[1])
        call(x, y)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        if cap is not None:
            assert seen == [1, before] and call.openmp.get() == before


def _one_conv() -> Graph:
    g = Graph("one")
    g.set_outputs([g.conv2d(g.input("x", (1, 4, 6, 6)), g.param("w", rand((5, 4, 3, 3), 2)), padding=1)])
    return g


@pytest.fixture
def products(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """RLX_CPU_ONEDNN=on, and the oneDNN products that plans then run."""
    return _spied(monkeypatch, onednn_steps._MatmulCall)


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh", "sigmoid", "tanh"])
def test_a_dense_layer_with_each_activation_matches_the_reference(products: list[tuple[Any, ...]],
                                                                   activation: str) -> None:
    """x (batch, tokens, k) @ W + b, then the activation: one oneDNN product over the
    stacked rows, the bias and activation as it stores; set_param of W and of b followed."""
    g = Graph("dense")
    x = g.input("x", (2, 5, 24))
    h = g.add(g.matmul(x, g.param("w", rand((24, 40), 1))), g.param("b", rand((40,), 2)))
    if activation == "gelu_tanh":
        h = g.gelu(h, approximate="tanh")
    elif activation != "none":
        h = getattr(g, activation)(h)
    g.set_outputs([h])
    cg = rlx.compile(g, device="cpu")
    feeds = {"x": rand((2, 5, 24), 3)}
    np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds)[0], rtol=1e-4, atol=1e-4)
    assert products == [((10, 24), (10, 40))]
    strided = {"x": np.asfortranarray(feeds["x"])}  # a caller's array it cannot read in place: a copy
    np.testing.assert_allclose(cg.run(strided)[0], reference.evaluate(g, feeds)[0], rtol=1e-4, atol=1e-4)
    new = {"w": rand((24, 40), 7), "b": rand((40,), 8)}
    for name, value in new.items():
        cg.set_param(name, value)
    np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds, new)[0], rtol=1e-4, atol=1e-4)


def test_a_transposed_weight_is_read_as_it_lies_and_run_time_weights_stay_on_rlx(
        products: list[tuple[Any, ...]]) -> None:
    """ONNX Gemm's transB: W (n, k) seen transposed; a product of two computed values
    (attention's scores) and a matrix-vector product are not oneDNN's."""
    g = Graph("gemm")
    x = g.input("x", (6, 16))
    wt = g.param("wt", rand((12, 16), 1))
    y = g.matmul(x, g.transpose(wt, (1, 0)))
    scores = g.matmul(x, g.transpose(x, (1, 0)))
    gemv = g.matmul(x, g.param("v", rand((16, 1), 2)))
    g.set_outputs([y, scores, gemv])
    cg = rlx.compile(g, device="cpu")
    feeds = {"x": rand((6, 16), 3)}
    for got, want in zip(cg.run(feeds), reference.evaluate(g, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert products == [((6, 16), (6, 12))]
    w2 = rand((12, 16), 9)
    cg.set_param("wt", w2)
    np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds, {"wt": w2})[0], rtol=1e-4, atol=1e-4)


def test_matmul_steps_declines_what_it_cannot_take() -> None:
    lib = onednn.library() if onednn.wanted() != "off" else None
    if lib is None:
        pytest.skip("oneDNN is off here")
    a, b, out = rand((4, 8), 1), rand((8, 6), 2), np.empty((4, 6), np.float32)
    ctx = _Ctx()
    assert onednn_matmul.matmul_steps(lib, a, b, None, out, ctx, "softplus") is None  # not a post-op it maps
    assert onednn_matmul.matmul_steps(lib, a, b, rand((4, 5), 3), out, ctx) is None  # neither a bias nor a residual
    assert onednn_matmul.matmul_steps(lib, a, b, out, out, ctx) is None  # a residual in the output's own memory
    assert onednn_matmul.matmul_steps(lib, a, b.astype(np.float64), None, out, ctx) is None
    wide = rand((4, 16), 5)
    assert onednn_matmul.matmul_steps(lib, wide[:, ::2], b, None, out, ctx) is None  # a strided plan view
    (step,) = onednn_matmul.matmul_steps(lib, a, b, rand((6,), 4), out, ctx, "relu")
    step.fn(a, out)
    np.testing.assert_allclose(out, np.maximum(a @ b + rand((6,), 4), 0), rtol=1e-5, atol=1e-5)


def test_a_residual_of_the_outputs_shape_is_added_before_the_activation() -> None:
    """A GEMM whose third operand is a whole (m, n) value (a projection added to what it
    came from): oneDNN's binary add post-op, then the activation."""
    lib = onednn.library() if onednn.wanted() != "off" else None
    if lib is None:
        pytest.skip("oneDNN is off here")
    a, b, c, out = rand((5, 8), 1), rand((8, 6), 2), rand((5, 6), 3), np.empty((5, 6), np.float32)
    (step,) = onednn_matmul.matmul_steps(lib, a, b, c, out, _Ctx(), "relu")
    step.fn(a, out)
    np.testing.assert_allclose(out, np.maximum(a @ b + c, 0), rtol=1e-5, atol=1e-5)


def test_a_transposed_activation_is_not_read_as_rows(products: list[tuple[Any, ...]]) -> None:
    """relu(x).T @ W: the product's A is a transposed view of a plan buffer, which oneDNN's
    row-major source would misread; the answer must be the reference's either way."""
    g = Graph("transposed-a")
    x = g.input("x", (16, 6))
    g.set_outputs([g.matmul(g.transpose(g.relu(x), (1, 0)), g.param("w", rand((16, 12), 1)))])
    feeds = {"x": rand((16, 6), 2)}
    np.testing.assert_allclose(rlx.compile(g, device="cpu").run(feeds)[0], reference.evaluate(g, feeds)[0],
                               rtol=1e-4, atol=1e-4)


def _weights_held(cg: Any, key: str) -> list[int]:
    """ids of the arrays a compiled copy holds as oneDNN-reordered weights of ``key``."""
    return [id(entry[2]) for k, entry in cg._exe._derived_arrays.items() if k[-1][0] == key]


def test_shape_classes_share_reordered_weights_and_set_param_reaches_them(products: list[tuple[Any, ...]],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A symbolic dense layer compiled for three batch sizes (each class compiled on its
    own: ``RLX_CPU_ANY_SIZE=0``): one reordered weight held by all three (oneDNN chose one
    layout), and set_param's new weight seen by each."""
    monkeypatch.setenv("RLX_CPU_ANY_SIZE", "0")
    g = Graph("dense")
    x = g.input("x", ("batch", 64), "float32")
    g.set_outputs([g.relu(g.add(g.matmul(x, g.param("w", rand((64, 48), 1))), g.param("b", rand((48,), 2))))])
    cg = rlx.compile(g, device="cpu")
    feeds = [{"x": rand((n, 64), 10 + n)} for n in (4, 32, 77)]
    held = [_weights_held(cg.for_inputs(f), "onednn_matmul_weights") for f in feeds]
    assert held[0] and held[0] == held[1] == held[2], held
    w2 = rand((64, 48), 3)
    cg.set_param("w", w2)
    for f in feeds:
        want = np.maximum(f["x"].astype(np.float64) @ w2 + rand((48,), 2), 0)
        np.testing.assert_allclose(cg.run(f)[0], want, rtol=1e-4, atol=1e-4)
    assert products, "the products ran on oneDNN"


def test_shape_classes_of_a_convolution_share_its_reordered_weights(forced: list[tuple[Any, ...]]) -> None:
    g = Graph("conv")
    x = g.input("x", ("batch", 8, 10, 10), "float32")
    g.set_outputs([g.conv2d(x, g.param("w", rand((16, 8, 3, 3), 4)), padding=1)])
    cg = rlx.compile(g, device="cpu")
    feeds = [{"x": rand((n, 8, 10, 10), 20 + n)} for n in (1, 3)]
    held = [_weights_held(cg.for_inputs(f), "onednn_conv_weights") for f in feeds]
    assert held[0] and held[0] == held[1], held
    for f in feeds:
        np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-4, atol=1e-4)


def test_layout_names_equal_descriptors_alike_and_others_apart() -> None:
    lib = onednn.library()
    assert lib is not None
    a, b, c = (lib.md((8, 4), onednn._AB), lib.md((8, 4), onednn._AB),
               lib.md_strided((8, 4), (1, 8)))
    try:
        assert lib.layout(a, (8, 4)) == lib.layout(b, (8, 4))
        assert lib.layout(c, (8, 4)) != lib.layout(a, (8, 4))
    finally:
        lib.destroy(descs=(a, b, c))


def test_a_narrow_plans_convolutions_are_created_for_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN fixes a primitive's threads when its descriptor is made: the thread tuner's
    narrow plan makes its convolutions with the calling thread's OpenMP count at one (it ran
    them on every core before, so narrow was no cure for a busy neighbour), and the wide
    plan with the count it had."""
    from rlx_cpu.openmp import threads as openmp_threads

    omp = openmp_threads()
    if omp is None or omp.get() < 2:
        pytest.skip("one OpenMP thread here: wide and narrow are the same")
    monkeypatch.setenv("RLX_CPU_ONEDNN", "on")
    made: list[int] = []
    real = onednn.Dnnl.conv_pd
    monkeypatch.setattr(onednn.Dnnl, "conv_pd", lambda self, *a, **k: made.append(omp.get()) or real(self, *a, **k))
    g = Graph("convs")
    x = g.input("x", (1, 16, 20, 20))
    g.set_outputs([g.relu(g.conv2d(x, g.param("w", rand((16, 16, 3, 3), 1)), padding=1))])
    exe = rlx.compile(g, device="cpu")._exe
    wide_threads = omp.get()
    made.clear()
    plan = exe._bind_plan()
    assert made and set(made) == {wide_threads}
    made.clear()
    twin = exe._bind_plan(narrow=True, over=plan)
    assert made and set(made) == {1} and omp.get() == wide_threads  # and the count put back
    feeds = {"x": rand((1, 16, 20, 20), 2)}
    np.testing.assert_allclose(twin.run(feeds)[0], reference.evaluate(g, feeds)[0], rtol=1e-4, atol=1e-4)
