"""The compile pipeline, pass by pass: legalize, optimize, gemm, fuse, plan, and the report."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support import ALL_OPS, ToyBackend, registry_with

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir.ops import INTERNAL_OPS, OpKind
from rlx_core.passes import plan_memory, run_pipeline
from rlx_core.passes.fuse import fuse_conv, fuse_elementwise, fuse_gemm
from rlx_core.passes.internal_ops import make_instruction
from rlx_core.passes.optimize import conv_scale, conv_taps, cse, dce, fold_constants, simplify, sink_relu

RNG = np.random.default_rng(3)
FUSING = ALL_OPS | {"gemm", "fused_elementwise"}


def ops_of(g: rlx.Graph) -> list[str]:
    return [n.op.value for n in g.nodes if n.op.value not in ("input", "param", "constant")]


def same(a: rlx.Graph, b: rlx.Graph, feeds: dict[str, np.ndarray]) -> None:
    for x, y in zip(reference.evaluate(a, feeds), reference.evaluate(b, feeds)):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def claim_all(node) -> bool:
    return True


# ----------------------------------------------------------------------------- optimize
def test_fold_constants_folds_constants_but_never_params_or_outputs():
    g = rlx.Graph()
    x = g.input("x", (3,))
    p = g.param("p", np.ones(3, np.float32))
    c = g.exp(g.constant(np.arange(3, dtype=np.float32)))
    from_param = g.exp(p)
    out = g.add(g.add(x, c), from_param)
    g.set_outputs([out, g.neg(g.constant(np.float32(2)))])
    h, notes = fold_constants(g)
    assert ops_of(h).count("exp") == 1 and "folded exp" in notes[0]  # exp(param) stays
    assert ops_of(h).count("neg") == 1  # an output is never turned into a constant
    same(g, h, {"x": RNG.standard_normal(3).astype(np.float32)})
    assert [h.node(i).name for i in h.params] == ["p"]


def test_fold_leaves_integer_division_by_zero_for_run_time():
    g = rlx.Graph()
    x = g.input("x", (2,), "int32")
    g.set_outputs([g.add(x, g.div(g.constant(np.array([1, 2], np.int32)), g.constant(np.array([0, 1], np.int32))))])
    h, notes = fold_constants(g)
    assert "div" in ops_of(h) and not notes


def test_simplify_removes_exact_identities_only():
    g = rlx.Graph()
    x = g.input("x", (2, 3))
    i = g.input("i", (2, 3), "int32")
    a = g.mul(x, 1.0)  # removed
    b = g.add(a, 0.0)  # +0.0 is not neutral for floats (-0.0 + 0.0 == +0.0): kept
    c = g.add(b, g.constant(np.float32(-0.0)))  # removed
    d = g.mul(c, g.constant(np.ones((4, 2, 3), np.float32)))  # broadcasts: kept
    e = g.add(i, 0)  # removed (ints)
    f = g.cast(g.neg(g.neg(e)), "int32")  # neg(neg) removed; the no-op cast stays: an output, of an input now
    named = g.mul(x, 1.0, name="keep")  # a named node is never replaced
    g.set_outputs([d, f, named])
    h, notes = simplify(g)
    h = dce(h)[0]
    assert ops_of(h) == ["add", "mul", "cast", "mul"]
    assert len(notes) == 4
    feeds = {"x": np.array([[-0.0, 1, 2], [3, 4, 5]], np.float32), "i": np.arange(6, dtype=np.int32).reshape(2, 3)}
    same(g, h, feeds)
    assert np.signbit(reference.evaluate(h, feeds)[0][0, 0, 0]) == np.signbit(reference.evaluate(g, feeds)[0][0, 0, 0])


def test_simplify_turns_small_float_powers_into_products():
    g = rlx.Graph()
    x = g.input("x", (2, 4))
    h16 = g.input("h", (2, 4), "float16")
    sq = g.pow(x, 2.0)  # -> x * x
    cube = g.pow(x, g.constant(np.full((1, 4), 3.0, np.float32)))  # a constant of one value: -> (x * x) * x
    odd = g.pow(x, 2.5)  # kept
    wide = g.pow(x, g.constant(np.full((3, 2, 4), 2.0, np.float32)))  # broadcasts x: kept
    half = g.pow(h16, 2.0)  # float16 rounds at every op: one rounding, kept
    g.set_outputs([sq, cube, odd, wide, half])
    h, notes = simplify(g)
    h = dce(h)[0]
    assert ops_of(h).count("pow") == 3 and ops_of(h).count("mul") == 3, ops_of(h)
    assert len(notes) == 2 and all("pow" in n for n in notes)
    specials = np.array([[-0.0, 0.0, np.inf, -np.inf], [np.nan, -3.5, 1e20, 7.0]], np.float32)
    got, want = reference.evaluate(h, {"x": specials, "h": specials.astype(np.float16)}), reference.evaluate(
        g, {"x": specials, "h": specials.astype(np.float16)})
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(a, b)  # exact in float64, signed zeros and infinities included
        assert np.array_equal(np.signbit(a), np.signbit(b))


def test_simplify_folds_reshape_and_transpose_chains():
    g = rlx.Graph()
    x = g.input("x", (2, 3, 4))
    r = g.reshape(g.reshape(x, (6, 4)), (4, 6))
    t = g.transpose(g.transpose(x, (1, 0, 2)), (2, 1, 0))  # composes to (2, 0, 1)
    back = g.transpose(g.transpose(x, (1, 2, 0)), (2, 0, 1))  # cancels
    g.set_outputs([r, t, g.exp(back)])
    h = dce(simplify(g)[0])[0]
    assert ops_of(h) == ["reshape", "transpose", "exp"]
    assert h.node(h.outputs[1]).attrs["perm"] == (2, 0, 1)
    same(g, h, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)})


def test_cse_merges_identical_nodes_and_constants_and_dce_drops_dead_ones():
    g = rlx.Graph()
    x = g.input("x", (3,))
    unused = g.input("unused", (2,))
    g.param("w", np.zeros(2, np.float32))
    a, b = g.exp(x), g.exp(x)
    s = g.add(g.mul(a, 2.0), g.mul(b, 2.0))
    g.tanh(unused)  # dead
    g.set_outputs([s])
    h, notes = cse(g)
    assert ops_of(h).count("exp") == 1 and ops_of(h).count("mul") == 1 and notes
    h2, notes2 = dce(h)
    assert "tanh" not in ops_of(h2) and "dropped 1 node" in notes2[0]
    assert [h2.node(i).name for i in h2.inputs] == ["x", "unused"] and len(h2.params) == 1
    same(g, h2, {"x": RNG.standard_normal(3).astype(np.float32), "unused": np.zeros(2, np.float32)})


def test_cse_merges_named_nodes_and_keeps_outputs() -> None:
    """An ONNX import names every node after its output, and the exporters repeat a
    layer's mask arithmetic in each layer: named copies merge too (a name is not read by
    anything after import); a graph output stays a node of its own name."""
    g = rlx.Graph()
    x = g.input("x", (4,))
    m1, m2 = g.where(g.greater(x, 0.0, name="gt1"), x, 0.0, name="mask1"), g.where(
        g.greater(x, 0.0, name="gt2"), x, 0.0, name="mask2")
    s = g.add(g.exp(m1, name="e1"), g.exp(m2, name="e2"), name="sum")
    g.set_outputs([s, g.exp(m2, name="e3")])
    h, notes = cse(g)
    assert ops_of(h).count("where") == 1 and ops_of(h).count("greater") == 1 and notes
    assert ops_of(h).count("exp") == 2  # e1 and e2 merged; e3, an output, computed under its name
    assert h.output_names() == g.output_names() == ["sum", "e3"]
    same(g, h, {"x": RNG.standard_normal(4).astype(np.float32)})


def _gated_conv(shape=(1, 6, 8, 8), scale_shape=(1, 6, 1, 1), out=4, k=1, groups=1, gate_first=False, **conv):
    """conv2d(x * sigmoid(s), w, b): a squeeze-excitation gate before a convolution."""
    g = rlx.Graph()
    x = g.input("x", shape)
    s = g.sigmoid(g.input("s", scale_shape))
    w = g.param("w", RNG.standard_normal((out, shape[1] // groups, k, k)).astype(np.float32))
    b = g.param("b", RNG.standard_normal(out).astype(np.float32))
    gated = g.mul(s, x) if gate_first else g.mul(x, s)
    return g, gated, g.conv2d(gated, w, b, groups=groups, **conv)


def _gate_feeds(g: rlx.Graph) -> dict[str, np.ndarray]:
    return {g.node(i).name: RNG.standard_normal(g.node(i).shape).astype(g.node(i).dtype) for i in g.inputs}


@pytest.mark.parametrize("form", ["x * s", "s * x", "s of shape (C, 1, 1)", "3x3 stride 2 padding 1"])
def test_conv_scale_scales_the_weights_instead_of_the_activations(form: str):
    """conv2d(x * s, w) = conv2d(x, w * s) for s one factor per input channel: the product
    over x goes, a product over the weights (and a reshape of s when it has 3 dims)
    comes; equal to the reference within rounding, the note naming both nodes."""
    kwargs = {"gate_first": form == "s * x"}
    if form == "s of shape (C, 1, 1)":
        kwargs["scale_shape"] = (6, 1, 1)
    if form.startswith("3x3"):
        kwargs.update(shape=(1, 6, 16, 16), k=3, stride=2, padding=1)  # 2 * 4 * 9 < 256 outputs a channel
    g, _, y = _gated_conv(**kwargs)
    g.set_outputs([g.relu(y)])
    h, notes = conv_scale(g)
    convs = [n for n in h.nodes if n.op is OpKind.CONV2D]
    assert len(convs) == 1 and h.node(convs[0].inputs[0]).op is OpKind.INPUT  # reads x itself
    scaled = h.node(convs[0].inputs[1])
    assert scaled.op is OpKind.MUL and scaled.shape == g.node(g.node(y.id).inputs[1]).shape
    assert ops_of(h).count("reshape") == (form == "s of shape (C, 1, 1)")
    assert len(notes) == 1 and "scaled the weights of conv2d" in notes[0]
    feeds = _gate_feeds(g)
    np.testing.assert_allclose(reference.evaluate(h, feeds)[0], reference.evaluate(g, feeds)[0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("case", ["the product read elsewhere", "the product an output", "grouped",
                                  "one factor per image and channel", "a full-shape operand",
                                  "weights no cheaper to scale"])
def test_conv_scale_leaves_what_it_cannot_or_need_not_fold(case: str):
    kwargs: dict = {}
    if case == "grouped":
        kwargs.update(groups=2, out=6)
    elif case == "one factor per image and channel":
        kwargs.update(shape=(2, 6, 8, 8), scale_shape=(2, 6, 1, 1))
    elif case == "a full-shape operand":
        kwargs.update(scale_shape=(1, 6, 8, 8))
    elif case == "weights no cheaper to scale":
        kwargs.update(shape=(1, 6, 3, 3), out=8, k=1)  # 2 * 8 >= 9 outputs a channel
    g, gated, y = _gated_conv(**kwargs)
    if case == "the product read elsewhere":
        g.set_outputs([y, g.exp(gated)])
    elif case == "the product an output":
        g.set_outputs([y, gated])
    else:
        g.set_outputs([y])
    h, notes = conv_scale(g)
    assert not notes and ops_of(h) == ops_of(g)


def test_conv_scale_runs_in_the_pipeline_and_can_be_disabled():
    g, _, y = _gated_conv()
    g.set_outputs([y])
    assert "mul" in ops_of(run_pipeline(g, claim_all).graph) and any(
        "scaled the weights" in n for st in run_pipeline(g, claim_all).stages for n in st.notes)
    off = run_pipeline(g, claim_all, rlx.CompileOptions(disable=("conv_scale",)))
    assert not any("scaled the weights" in n for st in off.stages for n in st.notes)


def _dilated(shape: tuple[int, ...], k: tuple[int, int], stride: int, dilation: int, padding, *, bias: bool = True
             ) -> tuple[rlx.Graph, rlx.Value]:
    g = rlx.Graph("atrous")
    x = g.input("x", shape)
    w = g.param("w", RNG.standard_normal((5, shape[1], *k)).astype(np.float32))
    b = g.param("b", RNG.standard_normal(5).astype(np.float32)) if bias else None
    y = g.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation)
    g.set_outputs([g.relu(y)])
    return g, y


@pytest.mark.parametrize(("shape", "k", "stride", "dilation", "padding", "kept", "new_padding"), [
    ((2, 3, 14, 14), (3, 3), 1, 24, 24, (1, 1), (0, 0, 0, 0)),   # DeepLabV3's atrous pyramid at 14x14
    ((1, 3, 14, 14), (3, 3), 1, 14, 14, (1, 1), (0, 0, 0, 0)),   # a dilation of the map's size
    ((1, 2, 5, 5), (5, 5), 1, 3, 6, (3, 3), (3, 3, 3, 3)),       # the outer ring only
    ((1, 2, 3, 8), (3, 3), 1, 4, 4, (1, 3), (0, 4, 0, 4)),       # rows only
    ((1, 2, 1, 1), (3, 3), 1, 1, 1, (1, 1), (0, 0, 0, 0)),       # a 3x3 over a 1x1 map
    ((1, 2, 9, 9), (3, 3), 2, 9, 9, (1, 1), (0, 0, 0, 0)),       # strided
])
def test_conv_taps_crops_a_kernel_to_the_taps_that_meet_the_image(shape, k, stride, dilation, padding, kept,
                                                                    new_padding):
    """The taps that read only padding at every output go: the weights are sliced to the
    rest, the padding moved so that every output stays where it was; the dropped terms
    were products with zeros, so the float64 reference gives the same numbers."""
    g, y = _dilated(shape, k, stride, dilation, padding)
    h, notes = conv_taps(g)
    (conv,) = [n for n in h.nodes if n.op is OpKind.CONV2D]
    weights = h.node(conv.inputs[1])
    assert weights.op is OpKind.SLICE and weights.shape[2:] == kept and conv.attrs["padding"] == new_padding
    assert conv.shape == g.node(y.id).shape
    assert len(notes) == 1 and f"to its {kept[0]}x{kept[1]} taps that meet the image" in notes[0]
    feeds = _gate_feeds(g)
    np.testing.assert_array_equal(reference.evaluate(h, feeds)[0], reference.evaluate(g, feeds)[0])


@pytest.mark.parametrize("case", ["every tap meets the image", "a plain 3x3", "symbolic spatial dims"])
def test_conv_taps_leaves_convolutions_whose_taps_all_count(case: str):
    if case == "every tap meets the image":
        g, _ = _dilated((1, 3, 14, 14), (3, 3), 1, 12, 12)   # the pyramid's d=12 at 14x14: 2 rows of 14 each side
    elif case == "a plain 3x3":
        g, _ = _dilated((1, 3, 8, 8), (3, 3), 1, 1, 1)
    else:
        g = rlx.Graph("symbolic")
        x = g.input("x", (1, 2, "h", "w"))
        w = g.param("w", RNG.standard_normal((3, 2, 3, 3)).astype(np.float32))
        g.set_outputs([g.conv2d(x, w, padding=24, dilation=24)])
    h, notes = conv_taps(g)
    assert h is g and notes == []


def test_conv_taps_follows_set_param_of_the_full_kernel():
    """The cropped kernel is a slice of the param: replacing the param's 3x3 weights
    changes the result as the uncropped convolution's would."""
    g, _ = _dilated((1, 3, 6, 6), (3, 3), 1, 6, 6)
    cg = rlx.compile(g, device="cpu")
    assert "taps that meet the image" in str(cg.report())
    feeds = _gate_feeds(g)
    new = RNG.standard_normal((5, 3, 3, 3)).astype(np.float32)
    cg.set_param("w", new)
    want = reference.evaluate(g, feeds, params={"w": new})[0]
    np.testing.assert_allclose(cg.run(feeds)[0], want, rtol=1e-5, atol=1e-5)


class _SkipsConvScale(ToyBackend):
    def __init__(self, skipped: frozenset[str]) -> None:
        super().__init__("skipper")
        self.skipped = skipped

    def skipped_passes(self) -> frozenset[str]:
        return self.skipped


def test_a_backend_may_skip_a_pass_for_its_compiles():
    """``Backend.skipped_passes`` joins the user's ``disable`` in the pipeline made for that
    backend (and only for it); a name the pipeline does not know is the plugin's error."""
    from rlx_core.compiler.lowering import pipeline_for

    g, _, y = _gated_conv()
    g.set_outputs([y])
    g.freeze()
    def notes(result) -> list[str]:
        return [n for st in result.stages for n in st.notes]

    reg = registry_with(_SkipsConvScale(frozenset({"conv_scale"})), ToyBackend("plain"))
    assert not any("scaled the weights" in n for n in notes(pipeline_for(g, "skipper", reg)))
    assert any("scaled the weights" in n for n in notes(pipeline_for(g, "plain", reg)))
    both = pipeline_for(g, "skipper", reg, rlx.CompileOptions(disable=("conv_scale", "cse")))
    assert not any("scaled the weights" in n for n in notes(both))
    bad = registry_with(_SkipsConvScale(frozenset({"conv_sclae"})))
    with pytest.raises(rlx.PluginError, match=r"'skipper': skipped_passes\(\) named unknown pass\(es\) "
                                              r"\['conv_sclae'\]"):
        pipeline_for(g, "skipper", bad)
    for wrong in (None, "conv_scale", {1}):
        with pytest.raises(rlx.PluginError, match=r"'skipper': skipped_passes\(\) must return a set of pass names"):
            pipeline_for(g, "skipper", registry_with(_SkipsConvScale(wrong)))


def _conv_relu_pool(g: rlx.Graph, x, extra_reader: bool = False):
    w = g.param("w", RNG.standard_normal((4, 2, 3, 3)).astype(np.float32))
    r = g.relu(g.conv2d(x, w, padding=1))
    pooled = g.max_pool2d(r, kernel=2, name="pooled")
    return (pooled, r) if extra_reader else (pooled,)


def test_sink_relu_moves_relu_after_a_max_pool_and_keeps_results():
    g = rlx.Graph()
    x = g.input("x", (1, 2, 8, 8))
    (pooled,) = _conv_relu_pool(g, x)
    g.set_outputs([g.exp(pooled)])
    h, notes = sink_relu(g)
    assert ops_of(h) == ["conv2d", "max_pool2d", "relu", "exp"]
    assert "moved relu" in notes[0] and "256 -> 64 elements" in notes[0]
    assert [n.name for n in h.nodes if n.op is OpKind.RELU] == ["pooled"]  # the pool's value keeps its name
    feeds = {"x": RNG.standard_normal((1, 2, 8, 8)).astype(np.float32)}
    feeds["x"][0, 0, :2, :2] = [[np.nan, -1.0], [-np.inf, -2.0]]  # NaN and -inf windows agree too
    for a, b in zip(reference.evaluate(g, feeds), reference.evaluate(h, feeds)):
        np.testing.assert_array_equal(a, b)


def test_sink_relu_leaves_a_relu_that_is_read_elsewhere_or_an_output():
    for as_output in (False, True):
        g = rlx.Graph()
        x = g.input("x", (1, 2, 8, 8))
        pooled, r = _conv_relu_pool(g, x, extra_reader=True)
        g.set_outputs([pooled, r] if as_output else [pooled, g.exp(r)])
        h, notes = sink_relu(g)
        assert not notes and ops_of(h) == ops_of(g)
    opts = rlx.CompileOptions(disable=("sink_relu",))
    g = rlx.Graph()
    (pooled,) = _conv_relu_pool(g, g.input("x", (1, 2, 8, 8)))
    g.set_outputs([pooled])
    assert run_pipeline(g, claim_all, opts).graph.nodes[-1].op is OpKind.MAX_POOL2D
    assert run_pipeline(g, claim_all).graph.nodes[-1].op is OpKind.RELU


# ----------------------------------------------------------------------------- gemm and regions
def dense(act: str = "relu", extra_use: bool = False) -> rlx.Graph:
    g = rlx.Graph("dense")
    x = g.input("x", (4, 5))
    mm = g.matmul(x, g.param("w", RNG.standard_normal((5, 3)).astype(np.float32)))
    y = g.add(mm, g.param("b", RNG.standard_normal(3).astype(np.float32)))
    y = getattr(g, act)(y) if act != "none" else y
    g.set_outputs([y, mm] if extra_use else [y])
    return g


@pytest.mark.parametrize("act", ["relu", "gelu", "sigmoid", "tanh", "none"])
def test_gemm_epilogue_fuses_matmul_bias_activation(act):
    g = dense(act)
    h, notes = fuse_gemm(g, claim_all)
    assert ops_of(h) == ["gemm"] and "into gemm" in notes[0]
    assert h.node(h.outputs[0]).attrs["activation"] == act
    same(g, h, {"x": RNG.standard_normal((4, 5)).astype(np.float32)})


def test_gemm_needs_single_use_and_a_claim():
    assert "gemm" not in ops_of(fuse_gemm(dense(extra_use=True), claim_all)[0])
    h, notes = fuse_gemm(dense(), lambda n: "no gemm with relu here" if n.op is OpKind.GEMM else True)
    assert "gemm" not in ops_of(h) and "no gemm with relu here" in notes[0]


def chain(n_ops: int = 6) -> rlx.Graph:
    g = rlx.Graph("chain")
    x = g.input("x", (4, 6))
    b = g.input("b", (6,))
    h = g.add(x, b)
    side = g.exp(b)  # smaller than the region: enters as an input
    for k in range(n_ops - 1):
        h = g.tanh(g.mul(h, side)) if k % 2 else g.sub(h, float(k))
    g.set_outputs([h])
    return g


def test_elementwise_chain_becomes_one_region_with_broadcast_inputs():
    g = chain()
    h, notes = fuse_elementwise(g, claim_all, max_ops=32, max_inputs=8)
    assert sorted(ops_of(h)) == ["exp", "fused_elementwise"] and "fused" in notes[0]
    node = h.node(h.outputs[0])
    assert len(node.attrs["program"]) == 8
    same(g, h, {"x": RNG.standard_normal((4, 6)).astype(np.float32), "b": RNG.standard_normal(6).astype(np.float32)})


def test_scalar_constants_do_not_count_against_the_input_limit():
    """An exporter's chain of 15 ops on 15 distinct scalar constants is one region (one
    memory pass), not one per 8 inputs; tensor inputs still split regions."""
    g = rlx.Graph()
    x = g.input("x", (4, 6))
    y = x
    for k in range(15):
        y = g.mul(y, 1.0 + k / 16) if k % 2 else g.add(y, float(k))
    g.set_outputs([y])
    h, _ = fuse_elementwise(g, claim_all, max_ops=32, max_inputs=4)  # 16 inputs: 1 tensor, 15 scalars
    assert ops_of(h) == ["fused_elementwise"]
    same(g, h, {"x": RNG.standard_normal((4, 6)).astype(np.float32)})
    t = rlx.Graph()
    x = t.input("x", (4, 6))
    y = x
    for k in range(5):  # x and five tensor inputs: over a limit of 4
        y = t.add(y, t.input(f"b{k}", (4, 6)))
    t.set_outputs([y])
    h, _ = fuse_elementwise(t, claim_all, max_ops=32, max_inputs=4)
    assert ops_of(h).count("fused_elementwise") >= 2


def test_regions_respect_limits_and_shared_values():
    g = chain(9)
    h, _ = fuse_elementwise(g, claim_all, max_ops=4, max_inputs=8)
    assert all(len(n.attrs["program"]) <= 4 for n in h.nodes if n.op is OpKind.FUSED_ELEMENTWISE)
    assert ops_of(h).count("fused_elementwise") >= 3
    g2 = rlx.Graph()
    x = g2.input("x", (3,))
    e = g2.exp(x)
    g2.set_outputs([g2.add(g2.tanh(e), 1.0), g2.mul(e, 2.0)])  # e feeds two regions: it cannot hide in one
    h2, _ = fuse_elementwise(g2, claim_all, max_ops=32, max_inputs=8)
    assert "exp" in ops_of(h2) or ops_of(h2).count("fused_elementwise") == 2
    same(g2, h2, {"x": RNG.standard_normal(3).astype(np.float32)})


# ----------------------------------------------------------------------------- pipeline and backends
def test_backend_without_fused_ops_gets_a_plain_graph():
    g = dense("gelu")
    toy = ToyBackend("toy", ops=ALL_OPS)
    cg = rlx.compile(g, "toy", registry=registry_with(toy))
    legal = cg._legal
    assert not {n.op for n in legal.nodes} & INTERNAL_OPS
    assert any("does not claim gemm" in line for line in cg.report().pipeline)


def test_backend_claiming_fused_ops_receives_them_and_runs_them():
    g = chain()
    toy = ToyBackend("toyfuse", ops=FUSING)
    cg = rlx.compile(g, "toyfuse", registry=registry_with(toy))
    assert {n.op for n in cg._legal.nodes} & INTERNAL_OPS and cg.report().fused
    feeds = {"x": RNG.standard_normal((4, 6)).astype(np.float32), "b": RNG.standard_normal(6).astype(np.float32)}
    np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-6)


def test_internal_ops_from_a_file_are_expanded_for_backends_that_lack_them():
    g = rlx.Graph("file")
    x = g.input("x", (2, 3))
    prog = [make_instruction("exp", [0], {}), make_instruction("mul", [1, 1], {})]
    fused = g.add_node("fused_elementwise", [x.id], {"program": prog})
    gm = g.add_node("gemm", [fused.id, g.param("w", np.ones((3, 2), np.float32)).id], {"activation": "gelu_tanh"})
    g.set_outputs([gm])
    h = rlx.Graph.from_json(g.to_json())
    assert h.to_json() == g.to_json()
    toy = ToyBackend("toy", ops=ALL_OPS - {"gelu"})
    result = run_pipeline(h, toy.claims)
    assert not {n.op for n in result.graph.nodes} & (INTERNAL_OPS | {OpKind.GELU})
    assert any("gemm" in d for d in result.legalized.decomposed)
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32)}
    same(g, result.graph, feeds)


@pytest.mark.parametrize(
    "attrs, match",
    [({"program": []}, "non-empty"), ({"program": [["softmax", [0], []]]}, "not an elementwise op"),
     ({"program": [["exp", [5], []]]}, "refers to 5"), ({"program": [["cast", [0], []]]}, "needs a dtype"),
     ({}, "needs a program")],
)
def test_bad_fused_programs_are_graph_errors(attrs, match):
    g = rlx.Graph()
    x = g.input("x", (2,))
    with pytest.raises(rlx.GraphError, match=match):
        g.add_node("fused_elementwise", [x.id], attrs)


def test_bad_gemm_nodes_are_graph_errors():
    g = rlx.Graph()
    a, b = g.input("a", (2, 3)), g.input("b", (3, 4))
    with pytest.raises(rlx.GraphError, match="activation must be one of"):
        g.add_node("gemm", [a.id, b.id], {"activation": "swish"})
    with pytest.raises(rlx.GraphError, match="do not broadcast"):
        g.add_node("gemm", [a.id, b.id, g.input("bias", (3, 4)).id], {})


def test_options_switch_stages_and_passes_and_are_checked():
    g = chain()
    toy = ToyBackend("toyfuse", ops=FUSING)
    off = run_pipeline(g, toy.claims, rlx.CompileOptions(fuse=False, plan=False))
    assert "fused_elementwise" not in ops_of(off.graph) and off.memory_plan is None
    assert not off.stage("fuse").enabled and "fuse: off" in off.describe()
    on = run_pipeline(g, toy.claims, rlx.CompileOptions(disable=("cse",)))
    assert "fused_elementwise" in ops_of(on.graph) and on.memory_plan is not None
    with pytest.raises(rlx.ConfigError, match=r"unknown pass\(es\) \['fusion'\]"):
        rlx.CompileOptions(disable=("fusion",))
    with pytest.raises(rlx.ConfigError, match="max_fused_ops must be an int >= 1"):
        rlx.CompileOptions(max_fused_ops=0)
    nolegal = run_pipeline(dense("gelu"), ToyBackend("t", ops=ALL_OPS - {"gelu"}).claims,
                           rlx.CompileOptions(legalize=False))
    assert nolegal.blocker is not None and "legalization is off" in nolegal.blocker


def test_fusion_report_env_prints_the_report(monkeypatch, capsys):
    reg = registry_with(ToyBackend("toyfuse", ops=FUSING))
    monkeypatch.setenv("RLX_FUSION_REPORT", "1")
    rlx.compile(chain(), "toyfuse", registry=reg)
    err = capsys.readouterr().err
    assert "RLX_FUSION_REPORT=1" in err and "fused" in err and "fuse: " in err and "legalize: " in err
    monkeypatch.setenv("RLX_FUSION_REPORT", "yes")
    with pytest.raises(rlx.ConfigError, match="RLX_FUSION_REPORT must be 0 or 1, got 'yes'"):
        rlx.compile(chain(), "toyfuse", registry=reg)


def test_cost_prices_the_graph_as_the_device_runs_it():
    g = chain(12)
    model = rlx.CostModel(device="t", memory_bw_gbps=1.0, dispatch_overhead_ns=1000.0)
    plain = run_pipeline(g, ToyBackend("t", ops=ALL_OPS).claims).graph
    fused = run_pipeline(g, ToyBackend("t", ops=FUSING).claims).graph
    assert rlx.estimate_graph_cost(fused, model) < rlx.estimate_graph_cost(plain, model) / 3
    reg = registry_with(ToyBackend("plain", ops=ALL_OPS, gflops=20), ToyBackend("fusing", ops=FUSING, gflops=20))
    rows = {r.device: r for r in rlx.device_report(g, rlx.DevicePolicy(), registry=reg)}
    assert rows["fusing"].est_seconds < rows["plain"].est_seconds


# ----------------------------------------------------------------------------- plan
def test_memory_plan_never_shares_a_buffer_between_live_values():
    g = chain(8)
    graph = run_pipeline(g, ToyBackend("t", ops=ALL_OPS).claims, rlx.CompileOptions(plan=False)).graph
    plan = plan_memory(graph)
    assert plan.inplace and plan.total_bytes < plan.naive_bytes
    by_buffer: dict[int, list[int]] = {}
    for v, b in plan.buffer_of.items():
        by_buffer.setdefault(b, []).append(v)
    for values in by_buffer.values():
        spans = sorted(plan.intervals[v] for v in values)
        for (s0, e0), (s1, _) in itertools.pairwise(spans):
            assert e0 <= s1, f"values live over {s0}..{e0} and from {s1} share a buffer"
    assert "buffers" in plan.describe()


def test_the_pass_names_options_may_disable_are_the_pipelines() -> None:
    """``CompileOptions`` checks ``disable`` against its own list (the contract module does
    not import the passes): it must name exactly the passes the pipeline runs."""
    from rlx_core.passes.pipeline import PASS_NAMES as RUN
    from rlx_core.plugin import PASS_NAMES as CHECKED

    assert CHECKED == RUN


# ----------------------------------------------------------------------------- convolution epilogues
def _conv(g: rlx.Graph, x, o: int, name: str, bias: bool = True):
    c = x.shape[1]
    w = g.param(f"w{name}", (RNG.standard_normal((o, c, 3, 3)) * 0.3).astype(np.float32))
    b = g.param(f"b{name}", RNG.standard_normal(o).astype(np.float32)) if bias else None
    return g.conv2d(x, w, b, padding=1)


def residual_block(extra_reader: bool = False) -> rlx.Graph:
    """conv -> silu -> conv; then relu(add(conv, x)): two epilogues, one with a residual."""
    g = rlx.Graph("block")
    x = g.input("x", (2, 4, 6, 6))
    a = _conv(g, x, 4, "1")
    act = g.mul(a, g.sigmoid(a))
    b = _conv(g, act, 4, "2", bias=False)
    y = g.relu(g.add(b, x))
    g.set_outputs([y, b] if extra_reader else [y])
    return g


def _fused(g: rlx.Graph) -> rlx.Graph:
    return fuse_conv(fuse_elementwise(g, claim_all, max_ops=32, max_inputs=8)[0], claim_all)[0]


def test_conv_epilogue_takes_the_region_after_a_conv_and_keeps_results():
    g = residual_block()
    h, notes = fuse_conv(fuse_elementwise(g, claim_all, max_ops=32, max_inputs=8)[0], claim_all)
    assert ops_of(h) == ["fused_conv", "fused_conv"], ops_of(h)
    first, second = (n for n in h.nodes if n.op is OpKind.FUSED_CONV)
    assert first.attrs["bias"] and not second.attrs["bias"] and len(second.inputs) == 3  # x, w, then the residual
    assert [i[0] for i in second.attrs["program"]] == ["add", "relu"] and second.attrs["program"][0][1] == (0, 1)
    assert len(notes) == 2 and "conv2d+bias + sigmoid, mul" in notes[0]
    same(g, h, {"x": RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)})


def test_conv_epilogue_takes_a_single_op_and_the_later_of_two_convs():
    g = rlx.Graph()
    x = g.input("x", (1, 3, 5, 5))
    a, b = _conv(g, x, 2, "a"), _conv(g, x, 2, "b")
    g.set_outputs([g.relu(g.mul(a, b))])  # mul(a, b) then relu: one region reading both convs
    h = _fused(g)
    node = next(n for n in h.nodes if n.op is OpKind.FUSED_CONV)
    assert ops_of(h) == ["conv2d", "fused_conv"] and h.node(node.inputs[3]).op is OpKind.CONV2D
    same(g, h, {"x": RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)})
    single = rlx.Graph()
    x = single.input("x", (1, 3, 5, 5))
    c = _conv(single, x, 2, "c")
    single.set_outputs([single.mul(c, c)])  # one op reading the conv twice
    h = fuse_conv(single, claim_all)[0]
    assert ops_of(h) == ["fused_conv"] and h.node(h.outputs[0]).attrs["program"][0][1] == (0, 0)
    same(single, h, {"x": RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)})


def test_conv_epilogue_needs_the_conv_unshared_and_a_claim():
    assert ops_of(_fused(residual_block(extra_reader=True))).count("fused_conv") == 1  # b is an output too
    g = rlx.Graph()
    x = g.input("x", (1, 3, 5, 5))
    c = _conv(g, x, 2, "c")
    g.set_outputs([g.relu(c), g.tanh(c)])  # two readers: neither may take it
    assert "fused_conv" not in ops_of(_fused(g))
    refuse = (lambda n: "no epilogue here" if n.op is OpKind.FUSED_CONV else True)
    h, notes = fuse_conv(residual_block(), refuse)
    assert "fused_conv" not in ops_of(h) and any("no epilogue here" in n for n in notes)
    h, notes = fuse_conv(residual_block(), lambda n: n.op is not OpKind.FUSED_CONV or "not claimed")
    assert notes == ["convolution epilogues not fused: the backend does not claim fused_conv"]


def test_fused_conv_from_a_file_is_expanded_for_a_backend_without_it_and_run_by_one_with_it():
    g = residual_block()
    h = rlx.Graph.from_json(_fused(g).to_json())
    assert ops_of(h).count("fused_conv") == 2
    feeds = {"x": RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)}
    plain = run_pipeline(h, ToyBackend("toy", ops=ALL_OPS).claims)
    assert not {n.op for n in plain.graph.nodes} & INTERNAL_OPS
    assert sum("fused_conv" in d for d in plain.legalized.decomposed) == 2
    same(h, plain.graph, feeds)
    same(g, h, feeds)
    toy = ToyBackend("toyconv", ops=FUSING | {"fused_conv"})
    cg = rlx.compile(g, "toyconv", registry=registry_with(toy))
    assert sum(n.op is OpKind.FUSED_CONV for n in cg._legal.nodes) == 2
    assert sum("into fused_conv" in line for line in cg.report().fused) == 2
    np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)
    off = rlx.compile(g, "toyconv", registry=registry_with(toy), options=rlx.CompileOptions(disable=("conv",)))
    assert not any(n.op is OpKind.FUSED_CONV for n in off._legal.nodes)


@pytest.mark.parametrize(
    "attrs, match",
    [({"bias": "yes", "program": [["relu", [0], []]]}, "bias must be a bool"),
     ({"program": [["relu", [0], []]], "kernel": 3}, "unknown attribute"),
     ({"bias": True, "program": [["relu", [0], []]]}, "bias must have shape"),
     ({"program": [["add", [0, 1], []]]}, "does not broadcast|broadcast"),
     ({"program": [["relu", [1], []]]}, "not the convolution's"),
     ({"stride": 0, "program": [["relu", [0], []]]}, "stride"),
     ({}, "needs a program")],
)
def test_bad_fused_conv_nodes_are_graph_errors(attrs, match):
    g = rlx.Graph()
    x = g.input("x", (1, 2, 4, 4))
    w = g.param("w", np.ones((3, 2, 3, 3), np.float32))
    e = g.input("e", (5,))
    with pytest.raises(rlx.GraphError, match=match):
        g.add_node("fused_conv", [x.id, w.id, e.id], attrs)
