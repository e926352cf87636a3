"""The graph edit API passes use (``rlx_core.ir``): add_node, copy_node, origin, copy,
replace_value, attachments, symbol_origins."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import rlx_core.ir.graph as graph_module
from rlx_core.errors import GraphError
from rlx_core.ir import Graph
from rlx_core.ir.ops import OpKind


def _mlp() -> Graph:
    g = Graph("mlp")
    x = g.input("x", (4, 8))
    w = g.param("w", np.ones((8, 3), np.float32))
    g.set_outputs([g.relu(g.matmul(x, w))])
    return g


def _copy_all(src: Graph, out: Graph) -> dict[int, int]:
    mapped: dict[int, int] = {}
    for node in src.nodes:
        if node.op is OpKind.INPUT:
            mapped[node.id] = out.input(node.name, node.shape, node.dtype).id
        elif node.op is OpKind.PARAM:
            mapped[node.id] = out.param(node.name, src.value(node.id)).id
        else:
            mapped[node.id] = out.copy_node(src, node, [mapped[i] for i in node.inputs]).id
    return mapped


def test_copy_node_keeps_the_type_without_inferring_it_again(monkeypatch):
    src = _mlp()
    calls = []
    real = graph_module.infer_any
    monkeypatch.setattr(graph_module, "infer_any", lambda *a: calls.append(a[0]) or real(*a))
    out = Graph("copy")
    mapped = _copy_all(src, out)
    assert calls == []  # same input types: the nodes are taken as they are
    for node in src.nodes:
        new = out.node(mapped[node.id])
        assert (new.op, new.shape, new.dtype, dict(new.attrs)) == (node.op, node.shape, node.dtype, dict(node.attrs))


def test_copy_node_infers_again_when_an_input_changed():
    src = _mlp()
    out = Graph("wider")
    x = out.input("x", (6, 8))  # another batch: matmul's and relu's shapes follow
    w = out.param("w", src.value(src.params[0]))
    mm = out.copy_node(src, src.node(2), [x.id, w.id])
    assert mm.shape == (6, 3)
    bad = Graph("bad")
    y = bad.input("x", (4, 5))
    v = bad.param("w", src.value(src.params[0]))
    with pytest.raises(GraphError, match="matmul"):
        bad.copy_node(src, src.node(2), [y.id, v.id])
    with pytest.raises(GraphError, match="no node 7"):
        bad.copy_node(src, src.node(2), [7, v.id])


def test_copy_node_of_a_symbolic_graph_records_its_constraints():
    src = Graph("sym")
    a, b = src.input("a", ("n", 3)), src.input("b", ("m", 3))
    src.set_outputs([src.add(a, b)])
    out = Graph("copy")
    ia, ib = out.input("a", ("n", 3)), out.input("b", ("m", 3))
    out.copy_node(src, src.node(2), [ia.id, ib.id])
    assert len(out.constraints) == len(src.constraints) >= 1


def test_origin_marks_the_nodes_added_inside_and_nests():
    g = Graph("o")
    x = g.input("x", (2,))
    with g.origin(0):
        y = g.neg(x)
        with g.origin(None):
            z = g.exp(y)
        w = g.abs(z)
    v = g.relu(w)
    assert [g.node(i).origin for i in (y.id, z.id, w.id, v.id)] == [0, z.id, 0, v.id]


def test_copy_is_independent_and_replace_value_swaps_a_param():
    g = _mlp()
    c = g.copy()
    assert [n.id for n in c.nodes] == [n.id for n in g.nodes] and c.outputs == g.outputs
    assert c.value(1) is g.value(1)  # arrays shared, not copied
    new = np.full((8, 3), 2, np.float32)
    old = c.freeze().replace_value(1, new)  # a frozen compiled copy swaps weights too
    assert old is g.value(1) and np.array_equal(c.value(1), new) and np.array_equal(g.value(1), np.ones((8, 3)))
    c2 = g.copy()
    c2.relu(c2.node(3).id)  # adding to the copy leaves the original alone
    assert len(g) == 4 and len(c2) == 5


@pytest.mark.parametrize(("target", "value", "match"), [
    (0, np.ones((4, 8), np.float32), "is a input, not a param"),
    (1, np.ones((8, 4), np.float32), r"float32\[8, 3\], got float32\[8, 4\]"),
    (1, np.ones((8, 3), np.float64), "got float64"),
])
def test_replace_value_refuses_what_does_not_fit(target, value, match):
    with pytest.raises(GraphError, match=match):
        _mlp().replace_value(target, value)


def test_attachments_die_with_their_owner():
    g = _mlp()

    class Owner:
        pass

    owner = Owner()
    g.attachments[owner] = "state"
    assert g.attachments[owner] == "state"
    del owner
    gc.collect()
    assert len(g.attachments) == 0


def test_symbol_origins_name_the_node_that_introduced_a_symbol():
    g = Graph("s")
    x = g.input("x", ("n", 4))
    r = g.reshape(x, ("k", 2))
    assert dict(g.symbol_origins) == {"k": r.id}
