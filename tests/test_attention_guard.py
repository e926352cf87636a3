"""torch's SDPA export: ``where(isnan(p), 0, p)`` after the softmax, ``sqrt(scale)`` on q
and on kT. Fused into ``attention(nan_to_zero=True)`` for a backend that lists the
``attention.nan_to_zero`` extension, left alone (or decomposed) for any other, and
``set_param`` of a scalar param the fusion folded compiles again."""

from __future__ import annotations

import numpy as np
import pytest
from support import registry_with

import rlx_core as rlx
from rlx_core import reference
from rlx_core.errors import GraphError
from rlx_core.ir.dtypes import CONTRACT_DTYPES
from rlx_core.ir.ops import OpKind
from rlx_core.passes.attention import fuse_attention
from rlx_core.passes.legalize import DtypeGate, legalize
from rlx_cpu import CpuBackend

RNG = np.random.default_rng(5)
B, H, L, D = 2, 3, 6, 8
C = np.float32(1 / np.sqrt(np.sqrt(D)))  # SDPA's sqrt(1 / sqrt(D)) on each side
GUARD = frozenset({"attention.nan_to_zero"})


def claim_all(node: object) -> bool:
    return True


def sdpa(params: bool = False, batch: int | str = B) -> rlx.Graph:
    """The chain as rlx imports torch's SDPA export: each scale a constant (the classic
    exporter) or a param (the dynamo exporter's initializers), the guard's 0 likewise."""
    g = rlx.Graph("sdpa")
    qkv = [g.input(n, (batch, L, H * D)) for n in "qkv"]
    q, k, v = (g.reshape(t, (batch, L, H, D)) for t in qkv)
    q, v, kt = g.transpose(q, (0, 2, 1, 3)), g.transpose(v, (0, 2, 1, 3)), g.transpose(k, (0, 2, 3, 1))
    c = g.param("c", np.array(C)) if params else g.constant(C)
    zero = g.param("zero", np.array(0, np.float32)) if params else g.constant(np.array([0], np.float32))
    s = g.add(g.matmul(g.mul(q, c), g.mul(kt, c)), g.input("mask", (batch, 1, 1, L)))
    p = g.softmax(s, axis=-1)
    isnan = g.where(g.equal(p, p), g.constant(np.array(False)), g.constant(np.array(True)))
    g.set_outputs([g.matmul(g.where(isnan, zero, p), v)])
    return g


def feeds(batch: int = B) -> dict[str, np.ndarray]:
    f = {n: RNG.standard_normal((batch, L, H * D)).astype(np.float32) for n in "qkv"}
    mask = np.zeros((batch, 1, 1, L), np.float32)
    mask[0, ..., 4:] = -np.inf  # padding
    mask[1] = -np.inf  # a sequence of padding only: every row masked everywhere
    f["mask"] = mask
    return f


def attention_nodes(g: rlx.Graph) -> list:
    return [n for n in g.nodes if n.op is OpKind.ATTENTION]


def test_the_guarded_chain_becomes_attention_for_a_backend_that_lists_the_extension() -> None:
    g = sdpa()
    h, notes, folded = fuse_attention(g, claim_all, GUARD)
    (att,) = attention_nodes(h)
    assert att.attrs == {"scale": pytest.approx(float(C) * float(C), rel=1e-7), "nan_to_zero": True}
    assert folded == frozenset() and "nan_to_zero" in notes[0]
    assert not any(n.op in (OpKind.SOFTMAX, OpKind.WHERE, OpKind.MUL) for n in h.nodes)
    f = feeds()
    want, got = reference.evaluate(g, f)[0], reference.evaluate(h, f)[0]
    assert not np.isnan(want).any() and np.all(want[1] == 0)  # the guard's zeros
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_without_the_extension_the_chain_is_left_alone() -> None:
    g = sdpa()
    h, notes, folded = fuse_attention(g, claim_all)  # claims everything, lists nothing
    assert h is g and not notes and not folded


def test_scalar_params_are_folded_and_named() -> None:
    h, _notes, folded = fuse_attention(sdpa(params=True), claim_all, GUARD)
    assert len(attention_nodes(h)) == 1 and folded == {"c", "zero"}
    # a guard whose fill is not 0 is not nan_to_zero
    g = sdpa(params=True)
    g.replace_value(next(i for i in g.params if g.node(i).name == "zero"), np.array(2, np.float32))
    assert not attention_nodes(fuse_attention(g, claim_all, GUARD)[0])


def test_cpu_runs_the_fused_chain_and_recompiles_when_a_folded_param_changes() -> None:
    g = sdpa(params=True)
    reg = registry_with(CpuBackend())
    cg = rlx.compile(g, device="cpu", registry=reg)
    assert "nan_to_zero" in str(cg.report()) and cg.absorbed_params == {"c", "zero"}
    f = feeds()
    np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-5, atol=1e-6)
    new = {"zero": np.array(5, np.float32), "c": np.array(0.5, np.float32)}
    for name, value in new.items():
        cg.set_param(name, value)
    want = reference.evaluate(g, f, params=new)[0]
    assert np.abs(want[1]).max() > 1  # 5 * the column sums of v: no longer zeros
    np.testing.assert_allclose(cg.run(f)[0], want, rtol=1e-5, atol=1e-5)
    assert "compiled again" in str(cg.report())


def test_a_symbolic_graph_recompiles_its_classes_when_a_folded_param_changes() -> None:
    """Classes compiled on their own, from the graph lowered once, and the executable for
    every size: each holds the old 0 until set_param, the new value after it."""
    g = sdpa(params=True, batch="batch")
    cg = rlx.compile(g, device="cpu", registry=registry_with(CpuBackend()))
    sizes = [feeds(b) for b in (2, 3, 4, 5, 6, 7)]
    for f in sizes:
        np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-5, atol=1e-6)
    cg.set_param("zero", np.array(3, np.float32))
    for f in [*sizes, feeds(9)]:
        want = reference.evaluate(g, f, params={"zero": np.array(3, np.float32)})[0]
        np.testing.assert_allclose(cg.run(f)[0], want, rtol=1e-5, atol=1e-5)


def test_legalization_decomposes_the_extension_for_a_backend_that_does_not_list_it() -> None:
    g = rlx.Graph("guarded")
    q, k, v = (g.input(n, (2, 4, 3)) for n in "qkv")
    m = g.input("m", (4, 4), "bool")
    g.set_outputs([g.attention(q, k, v, m, nan_to_zero=True)])
    f = {n: RNG.standard_normal((2, 4, 3)).astype(np.float32) for n in "qkv"}
    f["m"] = np.tril(np.ones((4, 4), bool))
    f["m"][2] = False  # a query that sees no key
    want = reference.evaluate(g, f)[0]
    assert np.all(want[:, 2] == 0) and not np.isnan(want).any()
    plain = legalize(g, claim_all, gate=DtypeGate("plain", frozenset(CONTRACT_DTYPES)))  # lists nothing
    assert not attention_nodes(plain.graph) and plain.supported
    np.testing.assert_allclose(reference.evaluate(plain.graph, f)[0], want, rtol=1e-6, atol=1e-7)
    listed = legalize(g, claim_all, gate=DtypeGate("guarded", frozenset(CONTRACT_DTYPES), GUARD))
    assert attention_nodes(listed.graph)[0].attrs["nan_to_zero"] is True


def test_nan_to_zero_is_a_bool_and_absent_when_off() -> None:
    g = rlx.Graph("a")
    q = g.input("q", (2, 3))
    assert "nan_to_zero" not in g.node(g.attention(q, q, q)).attrs
    with pytest.raises(GraphError, match="nan_to_zero must be a bool"):
        g.add_node(OpKind.ATTENTION, [q.id, q.id, q.id], {"nan_to_zero": 1})
