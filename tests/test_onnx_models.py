"""Whole models as exporters write them (an MLP, a CNN, a transformer block), each against onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, rand, vi

import rlx_core
from rlx_core import onnx as rlx_onnx


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize(("alpha", "beta", "bias"), [(1.0, 1.0, "n"), (0.5, 2.0, "mn"), (1.5, 0.0, "1n"),
                                                      (1.0, 1.0, None), (2.0, -1.0, "m1")])
def test_gemm_mlp(trans_a: int, trans_b: int, alpha: float, beta: float, bias: str | None) -> None:
    rng = np.random.default_rng(trans_a * 2 + trans_b)
    m, k, n = 3, 6, 4
    w1 = rand(rng, *((n, k) if trans_b else (k, n)))
    bias_shape = {"n": (n,), "mn": (m, n), "1n": (1, n), "m1": (m, 1)}.get(bias or "", ())
    inits = [init("w1", w1), init("w2", rand(rng, n, 5)), init("b2", rand(rng, 5))]
    gemm_inputs = ["x", "w1"]
    if bias is not None:
        inits.append(init("b1", rand(rng, *bias_shape)))
        gemm_inputs.append("b1")
    nodes = [
        helper.make_node("Gemm", gemm_inputs, ["h"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    x_shape = (k, m) if trans_a else (m, k)
    model = make_model(nodes, [vi("x", "float32", x_shape)], [vi("probs", "float32", None)], inits)
    graph = check_against_ort(model, {"x": rand(rng, *x_shape)})
    params = {graph.node(i).name for i in graph.params}
    # initializers become params, named as in the file (a bias scaled by beta=0 is not read)
    assert params == {t.name for t in inits} - ({"b1"} if beta == 0.0 else set())


def test_mlp_params_are_replaceable_and_batch_dim_binds() -> None:
    rng = np.random.default_rng(1)
    w = rand(rng, 8, 4)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Tanh", ["y"], ["out"])]
    model = make_model(nodes, [vi("x", "float32", ["batch", 8])], [vi("out", "float32", ["batch", 4])],
                       [init("w", w)])
    g = rlx_onnx.load(model, dims={"batch": 3})
    assert g.node(g.inputs[0]).shape == (3, 8)
    assert g.output_names() == ["out"]
    cg = rlx_core.compile(g, device="cpu")
    x = rand(rng, 3, 8)
    np.testing.assert_allclose(cg.run({"x": x})[0], np.tanh(x @ w), rtol=1e-5, atol=1e-6)
    cg.set_param("w", 2 * w)
    np.testing.assert_allclose(cg.run({"x": x})[0], np.tanh(x @ (2 * w)), rtol=1e-5, atol=1e-6)
    # the same dim bound by "<input>:<axis>"
    assert rlx_onnx.load(model, dims={"x:0": 5}).node(0).shape == (5, 8)


def test_small_cnn() -> None:
    rng = np.random.default_rng(2)
    c1, c2, classes = 4, 6, 3
    inits = [
        init("w1", rand(rng, c1, 3, 3, 3)), init("b1", rand(rng, c1)),
        init("bn_s", rand(rng, c1, lo=0.5, hi=1.5)), init("bn_b", rand(rng, c1)),
        init("bn_m", rand(rng, c1)), init("bn_v", rand(rng, c1, lo=0.5, hi=2.0)),
        init("w2", rand(rng, c2, c1 // 2, 3, 3)),
        init("fc_w", rand(rng, classes, c2)), init("fc_b", rand(rng, classes)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[2, 1, 2, 1], dilations=[2, 1], group=2),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("AveragePool", ["r2"], ["p2"], kernel_shape=[3, 3], strides=[1, 2], pads=[1, 1, 1, 1],
                         count_include_pad=0),
        helper.make_node("GlobalAveragePool", ["p2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
    ]
    model = make_model(nodes, [vi("x", "float32", ["N", 3, 12, 10])], [vi("logits", "float32", None)], inits)
    x = rand(rng, 2, 3, 12, 10)
    check_against_ort(model, {"x": x}, dims={"N": 2}, rtol=1e-4, atol=1e-5)


def _shape_of(nodes: list, src: str, index: int, out: str) -> None:
    """``Shape -> Gather(index) -> Unsqueeze``: one dim of ``src`` as a 1-element int64 tensor."""
    nodes += [
        helper.make_node("Shape", [src], [f"{out}_shape"]),
        helper.make_node("Constant", [], [f"{out}_idx"], value=helper.make_tensor("", 7, [], [index])),
        helper.make_node("Gather", [f"{out}_shape", f"{out}_idx"], [f"{out}_scalar"], axis=0),
        helper.make_node("Unsqueeze", [f"{out}_scalar", "axes0"], [out]),
    ]


def _transformer_block(d: int = 16, heads: int = 4, ffn: int = 32, seed: int = 3) -> tuple:
    """A post-attention-mask encoder block the way torch.onnx (TorchScript) writes it at opset 17."""
    rng = np.random.default_rng(seed)
    dh = d // heads
    inits = [init("axes0", np.array([0], np.int64)), init("ln1_g", rand(rng, d, lo=0.5, hi=1.5)),
             init("ln1_b", rand(rng, d)), init("ln2_g", rand(rng, d, lo=0.5, hi=1.5)), init("ln2_b", rand(rng, d)),
             init("heads", np.array([heads], np.int64)), init("dh", np.array([dh], np.int64)),
             init("dmodel", np.array([d], np.int64)), init("scale", np.array(math.sqrt(dh), np.float32)),
             init("zero", np.array(0, np.int64)), init("neg", np.array(-1e4, np.float32)),
             init("sqrt2", np.array(math.sqrt(2.0), np.float32)), init("one", np.array(1.0, np.float32)),
             init("half", np.array(0.5, np.float32))]
    for w, shape in {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, ffn), "w2": (ffn, d)}.items():
        inits += [init(w, rand(rng, *shape, lo=-0.4, hi=0.4)), init(f"{w}_b", rand(rng, shape[1], lo=-0.1, hi=0.1))]
    nodes: list = [helper.make_node("LayerNormalization", ["x", "ln1_g", "ln1_b"], ["ln1"], axis=-1, epsilon=1e-5)]
    _shape_of(nodes, "ln1", 0, "B")
    _shape_of(nodes, "ln1", 1, "S")
    nodes.append(helper.make_node("Concat", ["B", "S", "heads", "dh"], ["split_shape"], axis=0))
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [
            helper.make_node("MatMul", ["ln1", f"w{name}"], [f"{name}_mm"]),
            helper.make_node("Add", [f"{name}_mm", f"w{name}_b"], [f"{name}_lin"]),
            helper.make_node("Reshape", [f"{name}_lin", "split_shape"], [f"{name}_4d"]),
            helper.make_node("Transpose", [f"{name}_4d"], [f"{name}_t"], perm=perm),
        ]
    nodes += [
        helper.make_node("MatMul", ["q_t", "k_t"], ["scores_raw"]),
        helper.make_node("Div", ["scores_raw", "scale"], ["scores"]),
        helper.make_node("Equal", ["mask", "zero"], ["masked"]),
        helper.make_node("Unsqueeze", ["masked", "axes12"], ["masked4"]),
        helper.make_node("Where", ["masked4", "neg", "scores"], ["scores_m"]),
        helper.make_node("Softmax", ["scores_m"], ["probs"], axis=-1),
        helper.make_node("Dropout", ["probs"], ["probs_d"]),
        helper.make_node("MatMul", ["probs_d", "v_t"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["B", "S", "dmodel"], ["merge_shape"], axis=0),
        helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["ctx_3d"]),
        helper.make_node("MatMul", ["ctx_3d", "wo"], ["o_mm"]),
        helper.make_node("Add", ["o_mm", "wo_b"], ["o"]),
        helper.make_node("Add", ["x", "o"], ["res1"]),
        helper.make_node("LayerNormalization", ["res1", "ln2_g", "ln2_b"], ["ln2"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln2", "w1"], ["f1_mm"]),
        helper.make_node("Add", ["f1_mm", "w1_b"], ["f1"]),
        # gelu as TorchScript writes it: x * 0.5 * (1 + erf(x / sqrt(2)))
        helper.make_node("Div", ["f1", "sqrt2"], ["g_div"]),
        helper.make_node("Erf", ["g_div"], ["g_erf"]),
        helper.make_node("Add", ["g_erf", "one"], ["g_add"]),
        helper.make_node("Mul", ["f1", "g_add"], ["g_mul"]),
        helper.make_node("Mul", ["g_mul", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["f2_mm"]),
        helper.make_node("Add", ["f2_mm", "w2_b"], ["f2"]),
        helper.make_node("Add", ["res1", "f2"], ["y"]),
    ]
    inits.append(init("axes12", np.array([1, 2], np.int64)))
    inputs = [vi("x", "float32", ["batch", "seq", d]), vi("mask", "int64", ["batch", "seq"])]
    return make_model(nodes, inputs, [vi("y", "float32", ["batch", "seq", d])], inits, opset=17), rng


def test_transformer_block_torchscript_style() -> None:
    model, rng = _transformer_block()
    batch, seq = 2, 5
    mask = np.ones((batch, seq), np.int64)
    mask[1, 3:] = 0  # padding in the second sequence
    feeds = {"x": rand(rng, batch, seq, 16), "mask": mask}
    graph = check_against_ort(model, feeds, dims={"batch": batch, "seq": seq}, rtol=1e-4, atol=1e-5)
    ops = {n.op.value for n in graph.nodes}
    # The Shape -> Gather -> Unsqueeze -> Concat chains are folded into static reshapes.
    assert "gather" not in ops and "concat" not in ops, ops
    assert {"reshape", "equal", "where", "layer_norm", "softmax"} <= ops


def test_transformer_block_runs_on_the_reference_too() -> None:
    """The imported graph means the same under the float64 reference interpreter."""
    model, rng = _transformer_block(seed=4)
    g = rlx_onnx.load(model, dims={"batch": 1, "seq": 3})
    feeds = {"x": rand(rng, 1, 3, 16), "mask": np.array([[1, 1, 0]], np.int64)}
    want = rlx_core.reference.evaluate(g, feeds)[0]
    got = rlx_core.compile(g, device="cpu").run(feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
