"""Legalization: decompositions mean the same as the composites they replace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_core import Graph, reference
from rlx_core.ir.ops import COMPOSITE_OPS, PRIMITIVE_OPS
from rlx_core.passes import legalize

PRIMS = frozenset(op.value for op in PRIMITIVE_OPS)


def only_primitives(node):
    return node.op.value in PRIMS


def _check_same(g: Graph, inputs: dict, rtol: float = 1e-6) -> None:
    # Decomposition constants (sqrt(2/pi), 1/n) are stored in the graph dtype (float32).

    result = legalize(g, only_primitives)
    assert result.blocker is None
    assert all(n.op not in COMPOSITE_OPS for n in result.graph.nodes)
    want = reference.evaluate(g, inputs)
    got = reference.evaluate(result.graph, inputs)
    for w, o in zip(want, got):
        np.testing.assert_allclose(o, w, rtol=rtol, atol=1e-7)


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(shape=shapes, data=st.data())
def test_elementwise_and_normalization_composites(shape, data):
    rng = np.random.default_rng(0)
    g = Graph("composites")
    x = g.input("x", shape)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = len(shape) - (axis % len(shape))
    scale = g.param("scale", rng.standard_normal(shape[-k:]).astype(np.float32))
    outs = [
        g.sigmoid(x), g.gelu(x), g.gelu(x, approximate="tanh"), g.rsqrt(g.add(g.abs(x), 0.5)),
        g.softmax(x, axis=axis), g.layer_norm(x, scale, scale, axis=axis),
        g.reduce_mean(x, axes=data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)), keepdims=True),
    ]
    g.set_outputs(outs)
    _check_same(g, {"x": rng.standard_normal(shape).astype(np.float32)})


@pytest.mark.parametrize("mask", [None, "bool", "float"])
def test_attention_and_pool(mask):
    rng = np.random.default_rng(3)
    g = Graph("attn")
    q, k, v = g.input("q", (2, 3, 4)), g.input("k", (2, 5, 4)), g.input("v", (2, 5, 6))
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in [("q", (2, 3, 4)), ("k", (2, 5, 4)),
                                                                        ("v", (2, 5, 6))]}
    m = None
    if mask == "bool":
        m = g.input("m", (3, 5), "bool")
        inputs["m"] = rng.random((3, 5)) < 0.7
        inputs["m"][:, 0] = True
    elif mask == "float":
        m = g.input("m", (2, 1, 5))
        inputs["m"] = rng.standard_normal((2, 1, 5)).astype(np.float32)
    img = g.input("img", (1, 2, 3, 3))
    inputs["img"] = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    g.set_outputs([g.attention(q, k, v, m), g.global_avg_pool2d(img)])
    _check_same(g, inputs)


def test_blocker_names_primitive_and_user_node():
    g = Graph("b")
    x = g.input("x", (2, 3))
    g.set_outputs([g.softmax(g.relu(x), name="probs")])
    result = legalize(g, lambda n: n.op.value in PRIMS - {"reduce_max"})
    assert result.blocker == "reduce_max, from softmax at node 2 'probs'"
    result = legalize(g, lambda n: True if n.op.value != "relu" else "relu needs a newer driver")
    assert result.blocker == "relu at node 1: relu needs a newer driver"


def test_claims_that_raise_are_refusals_not_crashes():
    g = Graph("c")
    x = g.input("x", (2,))
    g.set_outputs([g.exp(x)])

    def boom(node):
        raise KeyError("oops")

    result = legalize(g, boom)
    assert "claims() raised KeyError" in result.blocker


def test_origin_points_at_user_node():
    g = Graph("o")
    x = g.input("x", (2, 3))
    s = g.softmax(x, name="s")
    g.set_outputs([s])
    result = legalize(g, only_primitives)
    decomposed = [n for n in result.graph.nodes if n.op.value in ("reduce_max", "exp", "div")]
    assert decomposed and all(n.origin == s.id for n in decomposed)
