"""The graph builder: inferred shapes and dtypes against numpy, every misuse a precise
``GraphError``, JSON round trips, malformed graph files, and ``summary``."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_core import Graph, GraphError, ModelError, OpKind
from rlx_core.ir.ops import SOURCE_OPS
from rlx_core.reference import evaluate
from rlx_core.testing._cases import GENERATED_OPS, op_cases


def inp(g: Graph, shape, dtype="float32", name=None):
    return g.input(name or f"in{len(g)}", shape, dtype)


# ----------------------------------------------------------------------------- inference vs numpy
BROADCAST = [((2, 3), (3,)), ((4, 1, 5), (3, 1)), ((), (2, 2)), ((1,), (7,)), ((2, 1), (1, 2))]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
@pytest.mark.parametrize("a, b", BROADCAST)
def test_binary_shapes_broadcast_like_numpy(op, a, b):
    g = Graph()
    out = getattr(g, op)(inp(g, a), inp(g, b))
    assert out.shape == np.broadcast_shapes(a, b) and out.dtype == "float32"


MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 6)),
                 ((7, 1, 3, 4), (1, 2, 4, 2)), ((2, 3, 4), (4,))]


@pytest.mark.parametrize("a, b", MATMUL_SHAPES)
@pytest.mark.parametrize("dtype", ["float16", "int32", "int64"])
def test_matmul_shapes_match_numpy(a, b, dtype):
    g = Graph()
    out = g.matmul(inp(g, a, dtype), inp(g, b, dtype))
    assert out.shape == np.matmul(np.zeros(a), np.zeros(b)).shape and out.dtype == dtype


@pytest.mark.parametrize("op", ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu"])
def test_unary_shapes(op):
    g = Graph()
    out = getattr(g, op)(inp(g, (2, 0, 3), "float64"))
    assert out.shape == (2, 0, 3) and out.dtype == "float64"


@pytest.mark.parametrize("axes", [None, 0, -1, (0, 2), (), [1]])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max"])
def test_reduce_shapes_match_numpy(op, axes, keepdims):
    g = Graph()
    out = getattr(g, op)(inp(g, (2, 3, 4)), axes=axes, keepdims=keepdims)
    np_axes = tuple(axes) if isinstance(axes, (list, tuple)) else axes
    assert out.shape == np.sum(np.zeros((2, 3, 4)), axis=np_axes, keepdims=keepdims).shape
    wanted = range(3) if axes is None else np.atleast_1d(axes)
    assert g.node(out).attrs["axes"] == tuple(sorted(a % 3 for a in wanted))


def test_shape_op_shapes_match_numpy():
    x = np.zeros((2, 3, 4))
    g = Graph()
    v = inp(g, x.shape)
    assert g.reshape(v, (4, -1)).shape == x.reshape(4, -1).shape
    assert g.reshape(g.reduce_sum(v, keepdims=True), ()).shape == ()
    assert g.transpose(v).shape == x.T.shape
    assert g.transpose(v, (1, 2, 0)).shape == x.transpose(1, 2, 0).shape
    assert g.concat([v, inp(g, (2, 5, 4))], axis=-2).shape == (2, 8, 4)
    assert g.slice(v, [1, -1], [100, 0], axes=[2, 0], steps=[2, -1]).shape == x[::-1, :, 1::2][:1].shape
    assert g.gather(v, inp(g, (5, 6), "int64"), axis=1).shape == np.take(x, np.zeros((5, 6), int), axis=1).shape
    assert g.cast(v, np.int32).dtype == "int32"
    assert g.where(inp(g, (3, 1), "bool"), v, inp(g, (4,))).shape == np.broadcast_shapes((3, 1), x.shape, (4,))
    assert g.softmax(v, axis=1).shape == x.shape and g.layer_norm(v, inp(g, (4,)), axis=-1).shape == x.shape


@pytest.mark.parametrize("stride, padding, dilation, groups", [
    (1, 0, 1, 1), (2, 1, 1, 1), ((2, 3), (1, 2), (2, 1), 3), (1, (0, 1, 2, 3), 1, 1),
])
def test_conv2d_shape_formula(stride, padding, dilation, groups):
    g = Graph()
    out = g.conv2d(inp(g, (2, 6, 11, 13)), g.param("w", np.zeros((9, 6 // groups, 3, 2), np.float32)),
                   stride=stride, padding=padding, dilation=dilation, groups=groups)
    a = g.node(out).attrs
    (sh, sw), (t, l_, b, r), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    assert out.shape == (2, 9, (11 + t + b - dh * 2 - 1) // sh + 1, (13 + l_ + r - dw * 1 - 1) // sw + 1)
    assert len(a["padding"]) == 4 and a["groups"] == groups


@pytest.mark.parametrize("size, k, s, p, ceil, want", [
    (5, 2, 2, 0, False, 2), (5, 2, 2, 0, True, 3), (4, 3, 2, 1, True, 3), (6, 3, 3, 1, True, 3), (5, 3, 2, 1, True, 3),
    (7, 3, 2, 1, False, 4), (1, 1, 1, 0, True, 1),
])
def test_pool_shapes_follow_pytorch(size, k, s, p, ceil, want):
    g = Graph()
    x = inp(g, (1, 2, size, size))
    assert g.max_pool2d(x, k, s, p, ceil_mode=ceil).shape == (1, 2, want, want)
    assert g.avg_pool2d(x, k, s, p, ceil_mode=ceil).shape == (1, 2, want, want)
    assert g.global_avg_pool2d(x).shape == (1, 2, 1, 1)
    assert g.node(g.max_pool2d(x, k)).attrs["stride"] == (k, k)  # stride defaults to the kernel


def test_attention_shape_and_default_scale():
    g = Graph()
    out = g.attention(inp(g, (2, 1, 5, 8)), inp(g, (3, 7, 8)), inp(g, (1, 7, 4)), inp(g, (5, 7), "bool"))
    assert out.shape == (2, 3, 5, 4)
    assert g.node(out).attrs["scale"] == pytest.approx(8**-0.5)


@settings(max_examples=80, derandomize=True, database=None, suppress_health_check=list(HealthCheck), deadline=None)
@given(case=st.sampled_from(sorted(GENERATED_OPS)).flatmap(op_cases))
def test_inferred_shape_and_dtype_match_the_numpy_reference(case):
    graph, node = case.build()
    (out,) = evaluate(graph, case.run_inputs())
    assert out.shape == node.shape
    assert out.dtype == (np.float64 if node.dtype.startswith("float") else np.dtype(node.dtype))


# ----------------------------------------------------------------------------- misuse
def raises(match: str):
    return pytest.raises(GraphError, match=match)


def test_broadcast_mismatch_names_op_and_shapes():
    g = Graph()
    with raises(r"^add: shapes \(2, 3\) and \(4,\) do not broadcast"):
        g.add(inp(g, (2, 3)), inp(g, (4,)))
    with raises(r"where: shapes .*\(2,\).*\(3,\)"):
        g.where(inp(g, (2,), "bool"), inp(g, (3,)), inp(g, (3,)))


def test_matmul_inner_dimension():
    g = Graph()
    with raises(r"matmul: inner dimensions differ: shapes \(2, 3\) and \(4, 5\) \(3 != 4\)"):
        g.matmul(inp(g, (2, 3)), inp(g, (4, 5)))
    with raises(r"matmul: batch dimensions of shapes \(2, 1, 3\) and \(3, 3, 1\)"):
        g.matmul(inp(g, (2, 1, 3)), inp(g, (3, 3, 1)))
    with raises(r"matmul: inputs must have rank >= 1"):
        g.matmul(inp(g, ()), inp(g, (3,)))


def test_bad_axes():
    g = Graph()
    x = inp(g, (2, 3))
    with raises(r"softmax: axis 2 is out of range for rank 2"):
        g.softmax(x, axis=2)
    with raises(r"reduce_sum: axes -3 is out of range for rank 2"):
        g.reduce_sum(x, axes=-3)
    with raises(r"reduce_max: axes \(0, -2\) repeat an axis"):
        g.reduce_max(x, axes=(0, -2))
    with raises(r"concat: axis 5 is out of range"):
        g.concat([x, x], axis=5)
    with raises(r"gather: axis must be an int, got 1.5"):
        g.gather(x, inp(g, (1,), "int32"), axis=1.5)
    with raises(r"layer_norm: axis -3 is out of range"):
        g.layer_norm(x, inp(g, (3,)), axis=-3)


def test_dtype_errors():
    g = Graph()
    with raises(r"input 'x': unsupported dtype 'complex64'; supported: float32, float16"):
        g.input("x", (2,), "complex64")
    x, i = inp(g, (2,)), inp(g, (2,), "int32")
    with raises(r"cast: unsupported dtype 'float8_e8m0fnu'"):  # a scale format no model computes with
        g.cast(x, "float8_e8m0fnu")
    with raises(r"add: computes nothing in bfloat16, a storage dtype"):  # bfloat16: cast and moved only
        g.add(g.cast(x, "bfloat16"), g.cast(x, "bfloat16"))
    assert g.cast(x, "int8").dtype == "int8"  # an extended integer: opt-in per backend, but a valid graph
    with raises(r"add: inputs have different dtypes: \(2,\) float32 and \(2,\) int32"):
        g.add(x, i)
    with raises(r"exp: needs a float dtype, got \(2,\) int32"):
        g.exp(i)
    with raises(r"neg: does not take bool"):
        g.neg(inp(g, (2,), "bool"))
    with raises(r"where: condition must be bool, got float32"):
        g.where(x, x, x)
    with raises(r"gather: indices must be int32 or int64, got float32"):
        g.gather(x, x)
    with raises(r"param 'p': unsupported dtype"):
        g.param("p", np.zeros(2, np.complex64))


def test_concat_reshape_transpose_errors():
    g = Graph()
    x = inp(g, (2, 3))
    with raises(r"concat: shapes \(2, 3\) and \(2, 4\) differ outside axis 0"):
        g.concat([x, inp(g, (2, 4))], axis=0)
    with raises(r"concat: needs at least one input"):
        g.concat([])
    with raises(r"reshape: cannot reshape \(2, 3\) \(6 elements\) to \(4,\)"):
        g.reshape(x, (4,))
    with raises(r"reshape: cannot reshape \(2, 3\) \(6 elements\) to \(4, -1\)"):
        g.reshape(x, (4, -1))
    with raises(r"reshape: shape \(-1, -1\) may hold at most one -1"):
        g.reshape(x, (-1, -1))
    with raises(r"transpose: perm \(0, 0\) is not a permutation of the 2 axes of \(2, 3\)"):
        g.transpose(x, (0, 0))
    with raises(r"slice: steps must not be 0"):
        g.slice(x, [0], [1], steps=[0])
    with raises(r"slice: starts \(0,\), ends \(1, 2\)"):
        g.slice(x, [0], [1, 2])


def test_conv_and_pool_errors():
    g = Graph()
    x = inp(g, (1, 3, 5, 5))
    with raises(r"conv2d: channels do not match: x \(1, 3, 5, 5\), w \(4, 2, 3, 3\), groups 1"):
        g.conv2d(x, inp(g, (4, 2, 3, 3)))
    with raises(r"conv2d: channels do not match: x \(1, 3, 5, 5\), w \(4, 1, 3, 3\), groups 2"):
        g.conv2d(x, inp(g, (4, 1, 3, 3)), groups=2)
    with raises(r"conv2d: bias must have shape \(4,\), got \(3,\)"):
        g.conv2d(x, inp(g, (4, 3, 3, 3)), inp(g, (3,)))
    with raises(r"conv2d: window 7 .* larger than the padded input 5"):
        g.conv2d(x, inp(g, (4, 3, 7, 1)))
    with raises(r"conv2d: needs x \(N, C, H, W\)"):
        g.conv2d(inp(g, (3, 5, 5)), inp(g, (4, 3, 3, 3)))
    with raises(r"max_pool2d: padding \(2, 2, 2, 2\) must be at most half the window"):
        g.max_pool2d(x, 2, padding=2)
    with raises(r"avg_pool2d: stride must be an int or a pair of ints >= 1"):
        g.avg_pool2d(x, 2, stride=(1, 2, 3))
    with raises(r"attention: mask shape \(3,\) does not broadcast to the scores shape \(2, 4\)"):
        g.attention(inp(g, (2, 8)), inp(g, (4, 8)), inp(g, (4, 8)), inp(g, (3,)))


def test_builder_name_is_added_to_the_message():
    g = Graph()
    with raises(r"add: shapes .* do not broadcast \(building 'logits'\)"):
        g.add(inp(g, (2,)), inp(g, (3,)), name="logits")


def test_frozen_graph_refuses_building():
    g = Graph("net")
    x = inp(g, (2,))
    g.set_outputs([g.relu(x)])
    g.freeze()
    for build in (lambda: g.relu(x), lambda: g.input("y", (1,)), lambda: g.constant(1.0),
                  lambda: g.param("p", np.zeros(1)), lambda: g.set_outputs([x])):
        with raises(r"graph 'net' is frozen"):
            build()
    assert g.frozen


def test_values_from_another_graph_and_bad_handles():
    g1, g2 = Graph("one"), Graph("two")
    x1 = inp(g1, (2,))
    with raises(r"add: value 0 belongs to graph 'one', not 'two'"):
        g2.add(x1, inp(g2, (2,)))
    with raises(r"set_outputs: value 0 belongs to graph 'one'"):
        g2.set_outputs([x1])
    with raises(r"graph 'two' has no node 99"):
        g2.relu(99)
    with raises(r"expected a Value, node id, array or scalar, got str"):
        g2.relu("x")
    with raises(r"set_outputs: a graph needs at least one output"):
        g2.set_outputs([])


def test_duplicate_and_empty_names():
    g = Graph()
    g.input("x", (1,))
    with raises(r"input: name 'x' is already used by node 0 'x'"):
        g.input("x", (2,))
    with raises(r"param: name 'x' is already used"):
        g.param("x", np.zeros(1))
    with raises(r"input: name must be a non-empty string"):
        g.input("", (1,))
    with raises(r"input 'y': shape must hold ints >= 0"):
        g.input("y", (2, -1))


# ----------------------------------------------------------------------------- sources, scalars, reading
def test_params_are_read_only_copies_and_scalars_adopt_the_dtype():
    g = Graph()
    w = np.ones(3, np.float16)
    p = g.param("w", w)
    w[0] = 5
    assert g.value(p)[0] == 1 and not g.value(p).flags.writeable
    x = inp(g, (3,), "float16")
    c = g.node(g.add(x, 2)).inputs[1]
    assert g.node(c).dtype == "float16" and g.node(c).op is OpKind.CONSTANT
    assert g.constant(1.5).dtype == "float32" and g.constant(3).dtype == "int64"
    with raises(r"is a input, which holds no value"):
        g.value(x)
    with raises(r"has no input or param 'nope'; it has 'w', 'in1'"):
        g.input_node("nope")
    assert g.input_node("w").id == p.id and g.inputs == (x.id,) and g.params == (p.id,)


def test_nodes_record_their_origin_and_names():
    g = Graph()
    x = inp(g, (2,))
    y = g.relu(x, name="act")
    assert all(n.origin == n.id for n in g.nodes)
    assert g.node(y).describe() == "node 1 'act'" and g.node(x).describe() == "node 0 'in0'"
    g.set_outputs([y, x])
    assert g.output_names() == ["act", "in0"]


# ----------------------------------------------------------------------------- JSON
def every_op_graph() -> Graph:
    """One graph that uses every op of the IR, every dtype, params and constants."""
    g = Graph("zoo")
    x = g.input("x", (2, 3, 4, 4), "float32")
    w = g.param("w", np.arange(3 * 3 * 2 * 2, dtype=np.float32).reshape(3, 3, 2, 2) / 50)
    i = g.input("i", (2,), "int64")
    c = g.conv2d(x, w, g.param("b", np.ones(3, np.float32)), stride=1, padding=(0, 1, 1, 0), dilation=1)
    p = g.max_pool2d(c, 2, 1, ceil_mode=True)
    a = g.avg_pool2d(p, 2, 1, padding=1, count_include_pad=True)
    gp = g.global_avg_pool2d(a)
    flat = g.reshape(a, (2, -1))
    m = g.matmul(flat, g.transpose(flat))
    e = g.div(g.exp(g.neg(g.abs(m))), g.add(g.sqrt(g.pow(g.maximum(m, 0.5), 2.0)), 1.0))
    f = g.sub(g.mul(g.log(g.add(e, 1.0)), g.rsqrt(g.add(e, 1.0))), g.minimum(e, g.erf(e)))
    h = g.gelu(g.tanh(g.sigmoid(g.relu(g.add(g.sin(f), g.cos(f))))), approximate="tanh")
    unit = g.mul(g.tanh(h), 0.5)  # in (-1, 1): every inverse function's domain
    h = g.add(h, g.add(g.add(g.add(g.tan(unit), g.asin(unit)), g.add(g.acos(unit), g.atan(unit))),
                       g.add(g.add(g.sinh(unit), g.cosh(unit)),
                             g.add(g.add(g.asinh(unit), g.acosh(g.add(g.abs(unit), 1.0))), g.atanh(unit)))))
    s = g.softmax(h, axis=0)
    ln = g.layer_norm(s, g.constant(np.ones(2, np.float32)), g.param("beta", np.zeros(2, np.float32)), eps=1e-3)
    r = g.reduce_sum(g.reduce_mean(g.reduce_max(ln, axes=0, keepdims=True), axes=(1,)), keepdims=True)
    ints = g.cast(g.gather(g.slice(g.concat([flat, flat], axis=1), [0, -1], [2, -200], axes=[0, 1], steps=[1, -3]),
                           i, axis=0), "int32")
    cond = g.cast(ints, "bool")
    cond = g.where(g.less(ints, 5), g.equal(cond, cond), g.greater(ints, 2))
    wh = g.where(cond, g.cast(ints, "float16"), g.constant(np.float16(-1)))
    q = g.reshape(flat, (2, 6, 8))
    att = g.attention(q, q, q, mask=g.constant(np.tril(np.ones((6, 6), bool))), scale=0.3, name="attn")
    # the pipeline's internal ops have no builder method, but graph files and the reference know them
    g.add_node("gemm", [flat.id, g.transpose(flat).id, g.constant(np.ones(2, np.float32)).id], {"activation": "relu"})
    g.add_node("fused_elementwise", [m.id, e.id], {"program": [["exp", [0], []], ["mul", [2, 1], []]]})
    g.add_node("fused_conv", [x.id, w.id, c.id], {"padding": (0, 1, 1, 0), "bias": False,
                                                   "program": [["add", [0, 1], []], ["relu", [2], []]]})
    rounded = g.fmod(g.round(g.ceil(g.floor(g.mul(f, 3.0)))), 1.5)
    bits = g.bitwise_xor(g.bitwise_or(g.bitwise_and(ints, 7), 8), g.bitwise_not(ints))
    bits = g.bit_shift_right(g.bit_shift_left(bits, 3), 1)
    g.set_outputs([r, wh, att, gp, g.cast(cond, "float64"), ints, rounded, bits])
    return g


def test_every_op_graph_uses_every_op():
    assert {n.op for n in every_op_graph().nodes} == set(OpKind)


def test_json_round_trip_of_every_op():
    g = every_op_graph()
    text = g.to_json()
    h = Graph.from_json(text)
    assert h.to_json() == text and h.name == "zoo"
    assert len(h) == len(g) and h.outputs == g.outputs and h.inputs == g.inputs and h.params == g.params
    for a, b in zip(g.nodes, h.nodes):
        assert (a.op, a.inputs, dict(a.attrs), a.shape, a.dtype, a.name) == (b.op, b.inputs, dict(b.attrs), b.shape,
                                                                             b.dtype, b.name)
        if a.op in (OpKind.PARAM, OpKind.CONSTANT):
            assert g.value(a.id).dtype == h.value(b.id).dtype
            np.testing.assert_array_equal(g.value(a.id), h.value(b.id))
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32),
             "i": np.array([1, -2])}
    for want, got in zip(evaluate(g, feeds), evaluate(h, feeds)):
        np.testing.assert_array_equal(want, got)
    assert Graph.from_json(text.encode()).to_json() == text


def test_save_and_load(tmp_path):
    g = every_op_graph()
    g.save(tmp_path / "sub" / "zoo.json")
    assert Graph.load(tmp_path / "sub" / "zoo.json").to_json() == g.to_json()
    with pytest.raises(ModelError, match=r"cannot read graph file .*missing\.json"):
        Graph.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ModelError, match=r"bad\.json: graph JSON: not valid JSON"):
        Graph.load(tmp_path / "bad.json")


@settings(max_examples=60, derandomize=True, database=None, suppress_health_check=list(HealthCheck), deadline=None)
@given(case=st.sampled_from(sorted(GENERATED_OPS)).flatmap(op_cases))
def test_json_round_trip_of_generated_cases(case):
    g, _ = case.build()
    h = Graph.from_json(g.to_json())
    assert h.to_json() == g.to_json()
    assert [(n.op, dict(n.attrs), n.shape, n.dtype) for n in h.nodes] == [
        (n.op, dict(n.attrs), n.shape, n.dtype) for n in g.nodes]


def _doc() -> dict:
    g = Graph("small")
    x = g.input("x", (2, 3), "float32")
    g.set_outputs([g.matmul(x, g.param("w", np.ones((3, 4), np.float32)), name="y")])
    return json.loads(g.to_json())


def _load(doc) -> None:
    Graph.from_json(json.dumps(doc) if isinstance(doc, dict) else doc)


def _mutated(path: str, value) -> dict:
    doc = _doc()
    *keys, last = path.split(".")
    target = doc
    for k in keys:
        target = target[int(k)] if isinstance(target, list) else target[k]
    target[int(last) if isinstance(target, list) else last] = value
    return doc


@pytest.mark.parametrize("doc, match", [
    ("not json", r"not valid JSON"),
    ('{"format": "onnx"}', r"not an rlx graph"),
    (_mutated("version", 99), r"format version 99 is newer than this rlx-core reads \(1\); upgrade rlx-core"),
    (_mutated("version", 0), r"unknown format version 0"),
    (_mutated("version", "1"), r"field 'version' has the wrong type \(str\)"),
    (_mutated("nodes.2.op", "frobnicate"), r"node 2 has unknown op 'frobnicate'"),
    (_mutated("nodes.2.inputs", [0, 5]), r"node 2 \(matmul\) refers to inputs \[0, 5\] not defined before it"),
    (_mutated("nodes.1.id", 7), r"node 1 has id 7; ids must be 0, 1, 2, ... in order"),
    (_mutated("nodes.1.value.data", "!!!"), r"node 1 data is not valid base64"),
    (_mutated("nodes.1.value.data", base64.b64encode(b"1234").decode()), r"node 1 holds 4 bytes, .* needs 48"),
    (_mutated("nodes.1.value.dtype", "complex128"), r"node 1 has unsupported dtype 'complex128'"),
    (_mutated("nodes.1.value.shape", [4, 3]), r"node 2 \(matmul\): matmul: inner dimensions differ"),
    (_mutated("nodes.0.shape", [2, -3]), r"node 0 \(input\): input 'x': shape must hold ints >= 0"),
    (_mutated("nodes.0.dtype", "float8"), r"node 0 \(input\): input 'x': unsupported dtype 'float8'"),
    (_mutated("nodes.2.attrs", {"transpose_a": True}), r"node 2 \(matmul\): matmul: unknown attribute"),
    (_mutated("outputs", []), r"outputs \[\] must be a non-empty list of node ids"),
    (_mutated("outputs", [3]), r"outputs \[3\] must be"),
    (_mutated("nodes", {}), r"field 'nodes' has the wrong type \(dict\)"),
])
def test_malformed_json_raises_model_error_naming_the_fault(doc, match):
    with pytest.raises(ModelError, match=r"graph JSON: .*" + match):
        _load(doc)


def test_truncated_json_raises_model_error():
    text = Graph.to_json(every_op_graph())
    for cut in (1, len(text) // 3, len(text) - 1):
        with pytest.raises(ModelError, match="not valid JSON"):
            Graph.from_json(text[:cut])


# ----------------------------------------------------------------------------- summary
def test_summary_mentions_each_node():
    g = every_op_graph()
    text = g.summary()
    lines = text.splitlines()
    assert lines[0].startswith("Graph 'zoo': ") and f"{len(g)} nodes" in lines[0]
    assert len(lines) == len(g) + 1
    for node, line in zip(g.nodes, lines[1:]):
        assert re.match(rf"\s+%{node.id}\s+= {node.op.value}\(", line), line
        assert f"{node.dtype}{list(node.shape)}" in line
        assert (f"'{node.name}'" in line) if node.name else True
        assert ("-> output" in line) == (node.id in g.outputs)
    assert "scale=0.3" in text and "'attn'" in text
    assert not any(n.op in SOURCE_OPS and n.inputs for n in g.nodes)
