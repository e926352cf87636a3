"""Channels-last chains (``rlx_cpu.layout``): which values a plan holds NHWC, and the
same answers as the reference whatever mix of layouts a graph ends up with."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir import Graph
from rlx_cpu import layout, native, onednn, onednn_steps
from rlx_cpu.steps import held16

pytestmark = pytest.mark.skipif(onednn.find_library() is None,
                                reason="oneDNN is not installed (pip install 'rlx-cpu[onednn]')")


def rand(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def conv(g: Graph, x: Any, cin: int, cout: int, seed: int, k: int = 3, **kw: Any) -> Any:
    kw.setdefault("padding", k // 2)
    groups = kw.get("groups", 1)
    w = g.param(f"w{seed}", rand((cout, cin // groups, k, k), seed, 0.3))
    return g.conv2d(x, w, g.param(f"b{seed}", rand((cout,), seed + 100, 0.1)), **kw)


def compiled(g: Graph) -> Any:
    return rlx.compile(g, device="cpu")


def held_cl(cg: Any) -> set[str]:
    """The names of the values the compiled graph's plan holds NHWC."""
    exe = cg._exe
    return {exe._nodes[i].name for i in exe._cl}


def check(g: Graph, feeds: dict[str, np.ndarray], cg: Any = None) -> Any:
    cg = cg or compiled(g)
    for got, want in zip(cg.run(feeds), reference.evaluate(g, feeds)):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    return cg


def block_graph() -> Graph:
    """An inverted residual block and a squeeze-excitation, as MobileNets have them."""
    g = Graph("block")
    x = g.input("x", (2, 8, 12, 12))
    h = g.minimum(g.relu(conv(g, x, 8, 24, 1, k=1)), 6.0, name="expand")  # ReLU6
    h = g.relu(conv(g, h, 24, 24, 2, groups=24), name="depthwise")
    s = g.global_avg_pool2d(h, name="pool")
    s = g.sigmoid(conv(g, g.relu(conv(g, s, 24, 6, 3, k=1)), 6, 24, 4, k=1), name="scale")
    h = g.mul(h, s, name="excited")
    h = g.add(conv(g, h, 24, 8, 5, k=1), x, name="residual")
    y = g.relu(conv(g, h, 8, 8, 6), name="last")
    g.set_outputs([y])
    return g


def test_a_block_is_held_nhwc_inside_and_answers_like_the_reference() -> None:
    g = block_graph()
    cg = check(g, {"x": rand((2, 8, 12, 12), 9)})
    inside = held_cl(cg)
    assert inside, "nothing was held channels-last"
    # The graph's output and the 1x1-plane squeeze-excitation stay NCHW.
    assert all(cg._exe._nodes[i].shape[2] * cg._exe._nodes[i].shape[3] > 1 for i in cg._exe._cl)
    assert cg._exe._outputs[0] not in cg._exe._cl


def test_nchw_turns_it_off_and_gives_the_same_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    feeds = {"x": rand((2, 8, 12, 12), 9)}
    on = compiled(block_graph()).run(feeds)[0]
    monkeypatch.setenv("RLX_CPU_LAYOUT", "nchw")
    cg = compiled(block_graph())
    assert not held_cl(cg)
    np.testing.assert_allclose(cg.run(feeds)[0], on, rtol=1e-5, atol=1e-5)


def test_a_value_with_a_reader_that_wants_nchw_stays_nchw() -> None:
    g = Graph("mixed")
    x = g.input("x", (1, 4, 9, 9))
    a = g.relu(conv(g, x, 4, 4, 1), name="a")
    b = g.relu(conv(g, a, 4, 4, 2), name="b")
    flat = g.reshape(a, (1, 4 * 81), name="flat")  # a view: reads NCHW
    plus = g.add(b, x, name="plus")  # a full-size operand held NCHW: not NHWC
    g.set_outputs([flat, plus])
    cg = check(g, {"x": rand((1, 4, 9, 9), 3)})
    assert "a" not in held_cl(cg) and "plus" not in held_cl(cg)


def test_a_residual_held_nhwc_reaches_an_nchw_epilogue_and_back() -> None:
    g = Graph("residual")
    x = g.input("x", (1, 6, 10, 10))
    a = g.relu(conv(g, x, 6, 6, 1), name="a")
    b = conv(g, a, 6, 6, 2)
    out = g.relu(g.add(b, a), name="out")  # an output: its epilogue runs NCHW, reading a held NHWC
    g.set_outputs([out, g.relu(conv(g, a, 6, 6, 3))])
    cg = check(g, {"x": rand((1, 6, 10, 10), 4)})
    assert held_cl(cg) == {"a"}


def test_params_set_later_reach_the_reordered_weights() -> None:
    g = block_graph()
    feeds = {"x": rand((2, 8, 12, 12), 9)}
    cg = compiled(g)
    w2 = rand((24, 1, 3, 3), 42, 0.3)
    cg.set_param("w2", w2)
    np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds, {"w2": w2})[0], rtol=2e-4, atol=2e-4)


def test_where_onednn_declines_a_convolution_the_nchw_kernels_run_between_transposes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    declined: list[bool] = []

    def decline(*args: Any, **kwargs: Any) -> None:
        declined.append(True)
        return None

    monkeypatch.setattr(onednn_steps, "conv_steps", decline)
    g = block_graph()
    cg = check(g, {"x": rand((2, 8, 12, 12), 9)})
    assert declined and held_cl(cg)


def test_strided_caller_arrays_and_batch_one() -> None:
    g = Graph("first")
    x = g.input("x", (1, 3, 16, 16))
    h = g.relu(conv(g, x, 3, 8, 1, stride=2))
    g.set_outputs([g.relu(conv(g, h, 8, 8, 2))])
    feeds = {"x": np.asfortranarray(rand((1, 3, 16, 16), 5))}
    check(g, feeds)


@pytest.mark.parametrize("shape", [(2, 5, 7, 7), (1, 16, 3, 3)])
def test_the_plan_is_a_fixed_point(shape: tuple[int, ...]) -> None:
    """Every value held NHWC has only readers that read NHWC, and is no output."""
    g = Graph("chain")
    x = g.input("x", shape)
    h = x
    for k in range(3):
        h = g.add(g.relu(conv(g, h, shape[1], shape[1], k + 1)), h)
    g.set_outputs([g.sigmoid(h)])
    cg = check(g, {"x": rand(shape, 6)})
    exe = cg._exe
    for i in exe._cl:
        readers = [n for n in exe._nodes if i in n.inputs]
        assert readers and i not in exe._outputs
        for r in readers:
            assert r.op.value in ("conv2d", "fused_conv", "global_avg_pool2d") or r.id in exe._cl
    assert layout.cl_shape((1, 2, 3, 4)) == (1, 3, 4, 2)


def test_epilogues_become_onednn_post_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """ReLU, ReLU6 and a residual add held NHWC run as post-ops of the convolution: no
    pass of their own (spied on the post-ops each convolution was built with)."""
    built: list[tuple[Any, ...]] = []
    real = onednn_steps.conv_steps

    def spy(*args: Any, **kwargs: Any) -> Any:
        steps = real(*args, **kwargs)
        if steps is not None:
            built.append(tuple(op[0] if op[0] == "add" else op[1:] for op in kwargs.get("post", ())))
        return steps

    monkeypatch.setattr(onednn_steps, "conv_steps", spy)
    g = Graph("posts")
    x = g.input("x", (1, 8, 10, 10))
    a = g.minimum(g.relu(conv(g, x, 8, 8, 1)), 6.0)
    b = g.relu(g.add(conv(g, a, 8, 8, 2), a))
    g.set_outputs([g.sigmoid(conv(g, b, 8, 8, 3))])
    check(g, {"x": rand((1, 8, 10, 10), 7)})
    relu, clip = onednn.ELTWISE["relu"], onednn.ELTWISE["clip"]
    big = float(np.finfo(np.float32).max)
    assert built[0] == ((relu, 0.0, 0.0), (clip, -big, 6.0))
    assert built[1] == ("add", (relu, 0.0, 0.0))


def test_post_ops_read_only_chains_of_fixed_scalars_and_residuals() -> None:
    m = 3
    operands = [np.zeros((1, 4, 2, 2), np.float32), np.float32(6.0), np.zeros((1, 4, 2, 2), np.float32)]
    fixed = np.asarray(np.float32(6.0))
    fixed.flags.writeable = False
    operands[1] = fixed
    clip, linear = onednn.ELTWISE["clip"], onednn.ELTWISE["linear"]
    # max(x, 6) then min(., 6): one clip; 6 - x: linear(-1, 6); x + residual
    program = (("maximum", (0, 1), ()), ("minimum", (m, 1), ()), ("sub", (1, m + 1), ()), ("add", (m + 2, 2), ()))
    ops = layout.post_ops(program, operands)
    assert ops is not None and ops[:2] == (("eltwise", clip, 6.0, 6.0), ("eltwise", linear, -1.0, 6.0))
    assert ops[2][0] == "add" and ops[2][1] is operands[2]
    assert layout.post_ops((("mul", (0, 0), ()),), operands) is None  # reads the result twice
    assert layout.post_ops((("exp", (0,), ()),), operands) is None  # not a post-op rlx maps
    settable = [operands[0], np.ones((), np.float32), operands[2]]  # a param's scalar: set_param may change it
    assert layout.post_ops((("mul", (0, 1), ()),), settable) is None
    assert layout.post_ops((("add", (0, 1), ()),), [operands[0], np.zeros((1, 4, 1, 1), np.float32)]) is None


def test_the_probe_says_which_layout_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import CpuBackend

    assert CpuBackend().probe().versions["layout"].startswith("chains of convolutions channels-last")
    monkeypatch.setenv("RLX_CPU_LAYOUT", "nchw")
    assert layout.describe() == "NCHW everywhere (RLX_CPU_LAYOUT=nchw)" and layout.enabled() is None
    monkeypatch.setenv("RLX_CPU_LAYOUT", "auto")
    monkeypatch.setenv("RLX_CPU_ONEDNN", "off")
    if layout.native_chains():  # rlx's own kernels hold the chains (test_native_chains.py)
        assert "channels-inner kernel" in layout.describe() and layout.enabled() is layout.NATIVE
    monkeypatch.setattr(layout, "native_chains", lambda: False)
    assert layout.describe() == "NCHW everywhere (RLX_CPU_ONEDNN=off)" and layout.enabled() is None
    monkeypatch.setenv("RLX_CPU_ONEDNN", "auto")
    monkeypatch.setattr(onednn, "find_library", lambda: None)
    assert "pip install 'rlx-cpu[onednn]'" in layout.describe()


def test_transposes_between_layouts_are_views() -> None:
    """A ConvNeXt block (depthwise convolution, to NHWC, LayerNorm and an MLP over the
    channels, back to NCHW, residual add) and a model fed NHWC: no transpose copies."""
    g = Graph("convnext")
    x = g.input("x", (2, 8, 6, 6))
    h = conv(g, x, 8, 8, 1, k=7, groups=8)
    t = g.transpose(h, (0, 2, 3, 1), name="to_nhwc")
    t = g.layer_norm(t, g.param("ln_w", rand((8,), 2)), g.param("ln_b", rand((8,), 3)))
    t = g.gelu(g.matmul(t, g.param("fc1", rand((8, 32), 4, 0.2))))
    t = g.matmul(t, g.param("fc2", rand((32, 8), 5, 0.2)))
    back = g.transpose(t, (0, 3, 1, 2), name="to_nchw")
    y = g.add(back, h, name="residual")
    y = conv(g, y, 8, 8, 6)
    nhwc_in = g.input("image", (1, 5, 5, 3))
    first = conv(g, g.transpose(nhwc_in, (0, 3, 1, 2), name="image_nchw"), 3, 4, 7)
    g.set_outputs([g.relu(y), g.relu(first)])
    cg = check(g, {"x": rand((2, 8, 6, 6), 8), "image": rand((1, 5, 5, 3), 9)})
    exe = cg._exe
    views = {exe._nodes[i].name for i in exe._cl_views}
    assert {"to_nhwc", "to_nchw", "image_nchw"} <= views
    assert "residual" in held_cl(cg)


def test_a_convolution_only_onednn_reference_loops_take_stays_on_rlx(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN's ``ref:any`` ran a first layer 5,000x slower than its jit kernels; where
    only it would run a convolution, rlx's kernels do (between transposes in a chain), and
    a grouped one is held by no chain."""
    lib = onednn.library()
    monkeypatch.setattr(type(lib), "impl", lambda self, pd: "ref:any")
    monkeypatch.setattr(lib, "_conv_impls", {})  # (answers kept from earlier compiles)
    g = block_graph()
    cg = check(g, {"x": rand((2, 8, 12, 12), 9)})
    assert held_cl(cg)
    cg = check(bottleneck_graph(8), {"x": rand((2, 16, 10, 10), 5)})
    assert "grouped" not in held_cl(cg)


def bottleneck_graph(groups: int) -> Graph:
    """ResNeXt's bottleneck: 1x1, a grouped 3x3 (``groups`` of 4 channels), 1x1, residual."""
    g = Graph("bottleneck")
    x = g.input("x", (2, 16, 10, 10))
    h = g.relu(conv(g, x, 16, 4 * groups, 1, k=1), name="reduce")
    h = g.relu(conv(g, h, 4 * groups, 4 * groups, 2, groups=groups), name="grouped")
    h = g.relu(g.add(conv(g, h, 4 * groups, 16, 3, k=1), x), name="expand")
    g.set_outputs([g.relu(conv(g, h, 16, 16, 4), name="last")])
    return g


def test_a_convolution_onednn_runs_as_im2col_and_gemm_ends_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN's ``gemm:jit`` (im2col and a product) is what rlx does in NCHW without the
    reorders: a grouped convolution it would run so (ResNeXt's 4 channels a group on
    AVX2: 8x the time of rlx's grouped kernel) stays NCHW; its neighbours stay chained."""
    lib = onednn.library()
    real = type(lib).conv_impl

    def impl(self: Any, src: Any, weights: Any, dst: Any, stride: Any, dilation: Any, pads: Any, groups: int) -> str:
        found = real(self, src, weights, dst, stride, dilation, pads, groups)
        return "x64:gemm:jit" if groups > 1 else found

    monkeypatch.setattr(type(lib), "conv_impl", impl)
    cg = check(bottleneck_graph(8), {"x": rand((2, 16, 10, 10), 5)})
    held = held_cl(cg)
    assert "grouped" not in held and "expand" in held  # (the graph's output, "last", is never held)


def test_conv_impl_names_onednns_choice_once_a_geometry() -> None:
    lib = onednn.library()
    lib._conv_impls.clear()
    args = ((1, 16, 10, 10), (16, 16, 3, 3), (1, 16, 10, 10), (1, 1), (1, 1), (1, 1, 1, 1), 1)
    first = lib.conv_impl(*args)
    assert first and ":" in first  # e.g. "brgconv:avx2", "jit:avx512_core"
    assert lib.conv_impl(*args) == first and len(lib._conv_impls) == 1
    bad = ((1, 16, 10, 10), (16, 16, 3, 3), (1, 16, 99, 99), (1, 1), (1, 1), (1, 1, 1, 1), 1)
    assert lib.conv_impl(*bad) == ""  # shapes that do not agree: oneDNN declines


@pytest.mark.parametrize("silu", ["post-op", "region"])
def test_silu_and_hard_swish_epilogues_are_one_post_op_each(monkeypatch: pytest.MonkeyPatch, silu: str) -> None:
    """Hard-swish is one post-op; SiLU is one too, or (where a region after the
    convolution timed faster: ``swish``) none, and the native region runs it."""
    monkeypatch.setenv("RLX_CPU_SWISH", silu)
    built: list[tuple[Any, ...]] = []
    real = onednn_steps.conv_steps

    def spy(*args: Any, **kwargs: Any) -> Any:
        steps = real(*args, **kwargs)
        if steps is not None:
            built.append(tuple(op[1:] for op in kwargs.get("post", ())))
        return steps

    monkeypatch.setattr(onednn_steps, "conv_steps", spy)
    g = Graph("gates")
    x = g.input("x", (1, 8, 9, 9))
    a = conv(g, x, 8, 8, 1)
    a = g.mul(a, g.sigmoid(a))  # SiLU, as EfficientNet exports it
    b = conv(g, a, 8, 8, 2)
    b = g.mul(b, g.maximum(g.minimum(g.add(g.mul(b, 1.0 / 6.0), 0.5), 1.0), 0.0))  # hard-swish
    g.set_outputs([g.relu(conv(g, b, 8, 8, 3))])
    check(g, {"x": rand((1, 8, 9, 9), 2)})
    e = onednn.ELTWISE
    assert built[0] == (((e["swish"], 1.0, 0.0),) if silu == "post-op" else ())
    assert len(built[1]) == 1 and built[1][0][0] == e["hardswish"]
    np.testing.assert_allclose(built[1][0][1:], (1.0 / 6.0, 0.5), rtol=1e-6)


POOLS: dict[str, dict[str, Any]] = {
    "max 3x3 stride 2 pad 1": {"max": True, "kernel": 3, "stride": 2, "padding": 1},
    "max ceil mode": {"max": True, "kernel": 3, "stride": 2, "ceil_mode": True},
    "max dilated": {"max": True, "kernel": 2, "stride": 1, "dilation": 2},
    "avg 3x3 stride 1 pad 1, padding counted": {"kernel": 3, "stride": 1, "padding": 1, "count_include_pad": True},
    "avg 3x3 stride 1 pad 1, padding not counted": {"kernel": 3, "stride": 1, "padding": 1},
    "avg ceil mode, padding counted (declined: rlx's kernel)": {"kernel": 2, "stride": 2, "padding": 1,
                                                                "ceil_mode": True, "count_include_pad": True},
    "avg ceil mode, padding not counted": {"kernel": 3, "stride": 2, "ceil_mode": True},
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pools_and_concats_inside_a_chain(name: str) -> None:
    """Inception's and DenseNet's shapes: a pool between convolutions, branches
    concatenated on the channels, all NHWC; odd sizes for ceil mode's extra windows."""
    kw = dict(POOLS[name])
    is_max = kw.pop("max", False)
    g = Graph("inception")
    x = g.input("x", (2, 4, 11, 11))
    h = g.relu(conv(g, x, 4, 8, 1))
    p = (g.max_pool2d if is_max else g.avg_pool2d)(h, name="pool", **kw)
    a = g.relu(conv(g, p, 8, 6, 2, k=1), name="branch_a")
    b = g.relu(conv(g, p, 8, 5, 3), name="branch_b")
    cat = g.concat([a, b, p], axis=1, name="cat")
    g.set_outputs([g.relu(conv(g, cat, 19, 4, 4))])
    cg = check(g, {"x": rand((2, 4, 11, 11), 5)})
    assert {"pool", "cat", "branch_a", "branch_b"} <= held_cl(cg)


def test_a_clamp_bound_held_in_a_param_follows_set_param() -> None:
    """The dynamo exporter stores ReLU6's bounds as initializers (params here): oneDNN's
    post-op holds the number, so set_param drops the plans bound with the old one."""
    g = Graph("relu6")
    x = g.input("x", (1, 4, 8, 8))
    hi = g.param("hi", np.array(6.0, np.float32))
    a = g.minimum(g.maximum(conv(g, x, 4, 4, 1), g.param("lo", np.array(0.0, np.float32))), hi)
    g.set_outputs([g.relu(conv(g, a, 4, 4, 2))])
    feeds = {"x": rand((1, 4, 8, 8), 3, 4.0)}
    cg = check(g, feeds)
    for value in (0.5, 2.0):
        cg.set_param("hi", np.array(value, np.float32))
        want = reference.evaluate(g, feeds, {"hi": np.array(value, np.float32)})[0]
        np.testing.assert_allclose(cg.run(feeds)[0], want, rtol=2e-4, atol=2e-4)
    assert cg._exe._baked == {"lo", "hi"}


@pytest.mark.parametrize("reduce", ["reduce_mean", "reduce_sum", "reduce_max"])
@pytest.mark.parametrize("keepdims", [True, False])
def test_spatial_reductions_read_nhwc(reduce: str, keepdims: bool) -> None:
    """A squeeze-excitation's squeeze as the dynamo exporter writes it (``ReduceMean`` over
    the spatial axes) reads the chain's NHWC value; other axes do not."""
    g = Graph("squeeze")
    x = g.input("x", (2, 6, 7, 5))
    h = g.relu(conv(g, x, 6, 6, 1), name="h")
    s = getattr(g, reduce)(h, axes=(2, -1), keepdims=keepdims, name="squeezed")
    s = s if keepdims else g.reshape(s, (2, 6, 1, 1))
    other = g.reduce_mean(g.relu(conv(g, h, 6, 6, 2), name="k"), axes=(1,), keepdims=True, name="over_channels")
    y = g.mul(conv(g, h, 6, 6, 3), g.sigmoid(s), name="excited")
    g.set_outputs([g.relu(conv(g, y, 6, 6, 4)), other])
    cg = check(g, {"x": rand((2, 6, 7, 5), 5)})
    assert {"h", "excited"} <= held_cl(cg) and "k" not in held_cl(cg)


def test_every_primitive_descriptor_is_freed_once_its_primitive_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each compile of a new size (dynamic shapes) makes a descriptor per convolution,
    pool and concat: held, they grew a server's memory with every size it met."""
    lib = onednn.library()
    made: list[int] = []
    freed: list[int] = []
    cls = type(lib)
    for name in ("conv_pd", "pool_pd", "concat_pd"):
        real = getattr(cls, name)

        def spy(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            pd = _real(self, *args, **kwargs)
            made.append(pd.value)
            return pd

        monkeypatch.setattr(cls, name, spy)
    real_destroy = cls.destroy

    def destroy(self: Any, memories: Any = (), primitives: Any = (), descs: Any = (), pds: Any = ()) -> None:
        freed.extend(pd.value for pd in pds)
        real_destroy(self, memories, primitives, descs, pds)

    monkeypatch.setattr(cls, "destroy", destroy)
    g = Graph("inception")
    x = g.input("x", (1, 4, 11, 11))
    h = g.relu(conv(g, x, 4, 8, 1))
    p = g.max_pool2d(h, kernel=3, stride=2, padding=1)
    cat = g.concat([g.relu(conv(g, p, 8, 6, 2, k=1)), p], axis=1)
    g.set_outputs([g.relu(conv(g, cat, 14, 4, 3))])
    check(g, {"x": rand((1, 4, 11, 11), 5)})
    assert len(made) >= 5 and sorted(made) == sorted(freed)


def test_conv_scale_is_skipped_where_chains_go_channels_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core's conv_scale would make a squeeze-excitation projection's weights change
    per run, keeping it off oneDNN and out of its chain: the backend skips it where it
    plans chains, and keeps it where everything is NCHW."""
    from rlx_cpu.backend import CpuBackend

    if onednn.find_library() is None:
        pytest.skip("oneDNN is not installed (pip install 'rlx-cpu[onednn]')")
    monkeypatch.setenv("RLX_CPU_LAYOUT", "auto")
    assert CpuBackend().skipped_passes() == {"conv_scale"}
    monkeypatch.setenv("RLX_CPU_LAYOUT", "nchw")
    assert CpuBackend().skipped_passes() == frozenset()
    monkeypatch.setenv("RLX_CPU_LAYOUT", "auto")
    monkeypatch.setenv("RLX_CPU_ONEDNN", "off")
    assert CpuBackend().skipped_passes() == frozenset()


@pytest.mark.skipif(native.library() is None, reason=f"native.c's plane reductions: {native.reason()}")
@pytest.mark.parametrize("kind", ["mean", "sum", "max"])
@pytest.mark.parametrize("shape", [(1, 5, 7, 3), (3, 4, 4, 144), (2, 3, 3, 300), (1, 30, 30, 20), (2, 1, 1, 1040)],
                         ids=str)
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_plane_reductions_read_float32_or_bf16_as_it_lies(kind: str, shape: tuple[int, ...], bf16: bool) -> None:
    """native.c's ``rlx_plane_reduce`` over every way it splits its channels (tiles of
    up to 256 in registers, a tail of fewer than 16) and its rows (an image's rows shared
    among threads at batch 1), reading float32 or a value held bf16 (``held.py``): the
    answer numpy gives over the values as they lie, NaN kept."""
    x = rand(shape, 11) + (0.5 if kind == "max" else 0.0)
    x[0, 0, 0, shape[3] - 1] = np.nan
    if bf16:
        held_x = held16(np.empty_like(x))
        held_x.view(np.uint16)[...] = (x.view(np.uint32) >> 16).astype(np.uint16)
        x = (held_x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)  # (what the kernel reads)
    else:
        held_x = x
    out = np.full((shape[0], shape[3]), -7.0, np.float32)
    for s in layout.reduce_planes(kind, held_x, out):
        s.fn(*s.args, **s.kwargs)
    want = {"mean": np.mean, "sum": np.sum, "max": np.max}[kind](x.astype(np.float64), axis=(1, 2))
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6 * shape[1] * shape[2])
    assert np.isnan(out[0, -1]) and not np.isnan(out[0, :-1]).any()
    numpy_out = np.full_like(out, -7.0)  # (numpy's way: a run whose arrays the kernel cannot take)
    layout._numpy_planes(kind, held_x, numpy_out)
    np.testing.assert_allclose(numpy_out, want, rtol=2e-6, atol=2e-6 * shape[1] * shape[2])


@pytest.mark.parametrize("kind", ["mean", "sum", "max"])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_spatial_reduction_of_nhwc_planes_never_wakes_numpys_blas(kind: str, batch: int) -> None:
    """A global pool over an NHWC chain is a row of weights times each image's (h * w, c)
    plane: a product on rlx's GEMM or MKL (OpenMP's team), never numpy's matmul, whose
    OpenBLAS pool then spins against the team (DeepLabV3-ResNet50's pooling branch, 28 x
    28 x 2048: a run at batch 1 took 216 ms against 143 ms)."""
    x = rand((batch, 7, 5, 6), 9)
    out = np.empty((batch, 6), np.float32)
    steps = layout.reduce_planes(kind, x, out)
    assert not any(s.fn is np.matmul for s in steps)
    for s in steps:
        s.fn(*s.args, **s.kwargs)
    want = {"mean": x.mean(axis=(1, 2)), "sum": x.sum(axis=(1, 2)), "max": x.max(axis=(1, 2))}[kind]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
