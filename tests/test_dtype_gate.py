"""The extended integer dtypes are opt-in per backend: the core refuses them, by name,
for a backend that does not declare them (``Backend.dtypes``), before its ``claims``
hears of them — in placement, explicit compiles, the partitioner and the pipeline alike.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import ALL_OPS, ToyBackend, registry_with

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir.dtypes import CONTRACT_DTYPES, DTYPES, EXTENDED_DTYPES, STORAGE_DTYPES
from rlx_core.passes.legalize import DtypeGate, legalize
from rlx_core.passes.pipeline import run_pipeline


class RecordingToy(ToyBackend):
    """A third-party-style backend that overrides ``claims`` and records every node it is
    asked about, with the dtypes of its value (inputs are recorded by their own nodes)."""

    def __init__(self, name: str, *, ops: frozenset[str] = ALL_OPS, dtypes: frozenset[str] | None = None,
                 gflops: float = 20.0) -> None:
        super().__init__(name, ops=ops, gflops=gflops)
        if dtypes is not None:
            self.dtypes = dtypes  # type: ignore[misc]
        self.asked: list[rlx.ir.Node] = []
        self.compiled: list[rlx.Graph] = []

    def claims(self, node: rlx.ir.Node) -> bool | str:
        self.asked.append(node)
        return node.op in self.ops

    def compile(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable:
        self.compiled.append(graph)
        return super().compile(graph, options)


def _seen_dtypes(backend: RecordingToy) -> set[str]:
    seen = {n.dtype for n in backend.asked}
    for g in backend.compiled:
        seen |= {n.dtype for n in g.nodes}
    return seen


def uint8_graph() -> rlx.Graph:
    """An image-like uint8 input, cast to float32 and normalized: what ONNX vision models do."""
    g = rlx.Graph("u8")
    x = g.input("pixels", (2, 6), "uint8")
    w = g.param("w", np.linspace(-1, 1, 18, dtype=np.float32).reshape(6, 3))
    g.set_outputs([g.relu(g.matmul(g.mul(g.cast(x, "float32"), 1 / 255), w), name="out")])
    return g


PIXELS = {"pixels": np.arange(12, dtype=np.uint8).reshape(2, 6) * 21}


def test_the_default_is_the_contract_six_and_cpu_declares_them_all() -> None:
    assert rlx.Backend.dtypes == CONTRACT_DTYPES == {"float32", "float16", "float64", "int32", "int64", "bool"}
    assert rlx.get_backend("cpu").dtypes == frozenset(DTYPES)
    assert set(DTYPES) == CONTRACT_DTYPES | set(EXTENDED_DTYPES) | set(STORAGE_DTYPES) and len(DTYPES) == 22


def test_placement_blocks_a_backend_without_the_dtype_and_names_it() -> None:
    six, wide = RecordingToy("six", gflops=1000.0), RecordingToy("wide", dtypes=frozenset(DTYPES))
    reg = registry_with(six, wide)
    g = uint8_graph()
    rows = {r.device: r for r in rlx.device_report(g, rlx.DevicePolicy(), registry=reg)}
    assert rows["six"].blocker == (
        "input at node 0 'pixels': dtype uint8, which six does not read "
        "(it reads float32, float16, float64, int32, int64, bool)"
    )
    assert rows["wide"].viable and rows["wide"].blocker is None
    assert rlx.devices_for(g, rlx.DevicePolicy(), registry=reg) == ["wide"]
    with pytest.raises(rlx.DeviceError, match=r"device 'six'.*input at node 0 'pixels': dtype uint8, which six"):
        rlx.compile(g, device="six", policy=rlx.DevicePolicy(), registry=reg)
    cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=reg, partition=False)
    assert cg.device == "wide"
    np.testing.assert_allclose(cg.run(PIXELS)[0], reference.evaluate(g, PIXELS)[0], rtol=1e-6)
    assert not set(EXTENDED_DTYPES) & _seen_dtypes(six), "a backend of the six was asked about a uint8 node"
    assert "uint8" in _seen_dtypes(wide)


def test_a_node_reading_a_foreign_dtype_is_refused_even_when_its_own_dtype_is_read() -> None:
    g = rlx.Graph("cmp")
    a, b = g.input("a", (3,), "int16"), g.input("b", (3,), "int16")
    g.set_outputs([g.equal(a, b)])  # a bool result from int16 operands
    gate = DtypeGate("six", CONTRACT_DTYPES)
    node = g.node(g.outputs[0])
    assert gate.refusal(g, node) == ("its input node 0 'a' has dtype int16, which six does not read "
                                     "(it reads float32, float16, float64, int32, int64, bool)")
    assert gate.refusal(g, g.node(0)) is not None
    assert DtypeGate("wide", frozenset(DTYPES)).refusal(g, node) is None


def test_claims_never_hears_of_the_dtype_with_or_without_legalization() -> None:
    six = RecordingToy("six")
    g = uint8_graph().freeze()
    for options in (rlx.CompileOptions(), rlx.CompileOptions(legalize=False)):
        result = run_pipeline(g, six.claims, options, gate=DtypeGate.of(six))
        assert result.blocker is not None and "dtype uint8, which six does not read" in result.blocker
    legal = legalize(g, six.claims, gate=DtypeGate.of(six))
    refused = {n.describe(): why for n, why in legal.unclaimed}
    assert set(refused) == {"node 0 'pixels'", "node 2"}  # the input, and the cast that reads it
    assert six.asked and not set(EXTENDED_DTYPES) & _seen_dtypes(six)
    assert all(n.op != "cast" for n in six.asked)  # the cast reads uint8: refused before claims


def test_the_partitioner_runs_the_foreign_dtype_where_it_is_read_and_the_rest_elsewhere() -> None:
    """``wide`` reads uint8 but runs only casts; ``six`` runs everything else: a split."""
    six = RecordingToy("six")
    wide = RecordingToy("wide", ops=frozenset({"cast"}), dtypes=frozenset(DTYPES))
    reg = registry_with(six, wide)
    g = uint8_graph()
    cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=reg)
    np.testing.assert_allclose(cg.run(PIXELS)[0], reference.evaluate(g, PIXELS)[0], rtol=1e-6)
    assert six.compiled and wide.compiled
    assert not set(EXTENDED_DTYPES) & _seen_dtypes(six)


def test_registry_refuses_a_backend_declaring_an_unknown_dtype() -> None:
    bad = RecordingToy("bf", dtypes=frozenset({"float32", "complex64"}))
    with pytest.raises(rlx.PluginError, match=r"backend 'bf' declares dtypes .*complex64.*expected a frozenset of"):
        registry_with(bad)


def test_a_graph_of_the_six_reaches_claims_exactly_as_before() -> None:
    """The gate answers nothing for contract dtypes: claims sees every node it always saw."""
    g = rlx.Graph("plain")
    x = g.input("x", (2, 3))
    g.set_outputs([g.softmax(g.add(x, 1.0))])
    gated, plain = RecordingToy("a"), RecordingToy("b")
    one = legalize(g, gated.claims, gate=DtypeGate.of(gated))
    two = legalize(g, plain.claims)
    assert [n.id for n in gated.asked] == [n.id for n in plain.asked]
    assert one.graph.to_json() == two.graph.to_json() and one.blocker is two.blocker is None
