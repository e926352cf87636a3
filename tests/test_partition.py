"""One graph across several devices (rlx_core/placement/partition.py, docs/partition.md): a graph no
single backend runs is split and matches the reference; a split predicted slower than
one device is not taken; strict mode and explicit devices never split silently."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ALL_OPS, ToyBackend, mlp, registry_with
from test_passes_random import graphs

import rlx_core as rlx
from rlx_core import reference
from rlx_core.placement.partition import SPLIT_MARGIN, PartitionedGraph, plan_partition, segment_graph
from rlx_core.placement.ranking import Placement
from rlx_core.testing._compare import mismatch

REST = ALL_OPS - {"matmul"}


def _x(batch: int = 4) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((batch, 8)).astype(np.float32)}


def _check(cg: rlx.CompiledGraph, g: rlx.Graph, inputs: dict[str, np.ndarray]) -> None:
    want = reference.evaluate(g, inputs)
    got = cg.run(inputs)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def halves() -> rlx.Registry:
    """One backend runs products only, the other everything but products."""
    return registry_with(ToyBackend("mm", ops={"matmul"}), ToyBackend("rest", ops=REST))


def test_a_graph_neither_backend_runs_alone_runs_split_and_matches_the_reference() -> None:
    g = mlp()
    reg = halves()
    with warnings.catch_warnings():
        warnings.simplefilter("error", rlx.FallbackWarning)
        cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=reg)
    assert isinstance(cg, rlx.CompiledGraph) and isinstance(cg, PartitionedGraph)
    assert cg.device == "mm+rest"
    assert [(s.device, [g.node(n).op.value for n in s.nodes]) for s in cg.segments] == [
        ("mm", ["matmul"]), ("rest", ["add", "relu", "softmax"])]
    _check(cg, g, _x())
    report = cg.report()
    assert report.partition is not None and report.partition.needed
    text = str(report)
    assert "segment 0 on mm: 1 node," in text and "only mm runs matmul at node 3" in text
    assert "segment 1 on rest: 3 nodes" in text and "receives 96 B" in text
    assert report.to_dict()["partition"]["segments"][1]["device"] == "rest"
    assert reg.get("mm").compiles == 1 and reg.get("rest").compiles == 1


def test_set_param_updates_every_segment_that_reads_it() -> None:
    g = rlx.Graph("two_uses")
    x = g.input("x", (4, 8))
    w = g.param("w", np.full((8, 8), 0.1, np.float32))
    h = g.matmul(x, w, name="h")  # on mm
    y = g.tanh(g.add(h, g.reduce_sum(w, axes=0)), name="y")  # on rest: reads w too
    z = g.matmul(y, w, name="z")  # on mm again
    g.set_outputs([z, w])
    cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=halves())
    assert [s.device for s in cg.segments] == ["mm", "rest", "mm"]
    _check(cg, g, _x())
    new_w = np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32)
    cg.set_param("w", new_w)
    g2 = rlx.Graph("two_uses")
    x2 = g2.input("x", (4, 8))
    w2 = g2.param("w", new_w)
    y2 = g2.tanh(g2.add(g2.matmul(x2, w2), g2.reduce_sum(w2, axes=0)))
    g2.set_outputs([g2.matmul(y2, w2), w2])
    _check(cg, g2, _x())
    with pytest.raises(rlx.InputError, match="'w'"):
        cg.set_param("w", np.zeros((3, 3), np.float32))
    _check(cg, g2, _x())  # a refused value changed nothing


def test_values_alive_across_several_segments_reach_their_consumers() -> None:
    """A DAG: ``a`` is made in segment 0 and read in segment 2; an intermediate is an output."""
    g = rlx.Graph("dag")
    x = g.input("x", (4, 8))
    w = g.param("w", np.eye(8, dtype=np.float32))
    a = g.relu(x, name="a")  # rest
    b = g.matmul(a, w, name="b")  # mm
    c = g.add(g.exp(b), a, name="c")  # rest, reads a from segment 0
    g.set_outputs([c, a, x])
    cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=halves())
    assert [s.device for s in cg.segments] == ["rest", "mm", "rest"]
    assert a.id in cg.segments[2].inputs and a.id in cg.segments[0].outputs
    _check(cg, g, _x())


def _pricey_product_registry(split_pays: bool) -> rlx.Registry:
    """``full`` runs everything, slowly; ``quick`` runs all but products, fast or not."""
    quick = ToyBackend("quick", ops=REST, gflops=20_000.0 if split_pays else 20.0)
    return registry_with(ToyBackend("full", gflops=0.05), quick)


def chain(n: int = 12) -> rlx.Graph:
    g = rlx.Graph("chain")
    x = g.input("x", (64, 64))
    h = g.matmul(x, g.param("w", np.eye(64, dtype=np.float32)))
    for _ in range(n):
        h = g.tanh(g.add(h, 1.0))
    g.set_outputs([h])
    return g


def test_a_split_predicted_clearly_faster_is_taken() -> None:
    g, reg = chain(), _pricey_product_registry(split_pays=True)
    placement = Placement(g, rlx.DevicePolicy(), reg)
    plan = plan_partition(g, placement, placement.candidates())
    assert not isinstance(plan, str)
    assert plan.single_device == "full" and plan.est_seconds <= SPLIT_MARGIN * plan.single_seconds and plan.taken
    cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=reg)
    assert cg.device == "full+quick" and "predicted faster than full alone" in cg.report().reason
    _check(cg, g, {"x": np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)})


def test_a_split_predicted_slower_than_one_device_is_not_taken() -> None:
    g, reg = chain(), registry_with(ToyBackend("full"), ToyBackend("quick", ops=REST))
    placement = Placement(g, rlx.DevicePolicy(), reg)
    plan = plan_partition(g, placement, placement.candidates())
    assert isinstance(plan, str) or not plan.taken
    cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=reg)
    assert not isinstance(cg, PartitionedGraph) and cg.device == "full"
    assert rlx.compile(chain(), policy=rlx.DevicePolicy(), registry=_pricey_product_registry(True),
                       partition=False).device == "full"


def test_strict_policy_and_explicit_devices_never_split_silently() -> None:
    g = mlp()
    with pytest.raises(rlx.DeviceError, match=r"no device can run graph 'mlp': .*mm: .*rest: matmul"):
        rlx.compile(g, policy=rlx.DevicePolicy(strict=True), registry=halves())
    cg = rlx.compile(g, policy=rlx.DevicePolicy(strict=True), registry=halves(), partition=True)
    assert cg.device == "mm+rest"
    with pytest.raises(rlx.DeviceError, match=r"device 'rest' .*cannot run graph 'mlp': matmul"):
        rlx.compile(g, device="rest", policy=rlx.DevicePolicy(), registry=halves())
    with pytest.raises(rlx.DeviceError, match="no device can run graph 'mlp'"):
        rlx.compile(g, policy=rlx.DevicePolicy(), registry=halves(), partition=False)


def test_no_split_covers_a_node_no_device_runs() -> None:
    reg = registry_with(ToyBackend("mm", ops={"matmul"}), ToyBackend("rest", ops=REST - {"relu"}))
    with pytest.raises(rlx.DeviceError, match=r"no split either: no device runs relu at node 5"):
        rlx.compile(mlp(), policy=rlx.DevicePolicy(), registry=reg)


def test_a_device_that_fails_to_compile_its_segment_is_dropped_loudly() -> None:
    flaky = ToyBackend("flaky", ops=REST, gflops=10_000, fail_compile=True)
    reg = registry_with(ToyBackend("mm", ops={"matmul"}), flaky, ToyBackend("rest", ops=REST))
    with pytest.warns(rlx.FallbackWarning, match="device flaky failed to compile its segment"):
        cg = rlx.compile(mlp(), policy=rlx.DevicePolicy(), registry=reg)
    assert cg.device == "mm+rest" and any("flaky" in n for n in cg.report().notes)
    _check(cg, mlp(), _x())


def test_denied_devices_take_no_segment() -> None:
    reg = registry_with(ToyBackend("mm", ops={"matmul"}), ToyBackend("rest", ops=REST), ToyBackend("rest2", ops=REST,
                        gflops=10_000))
    cg = rlx.compile(mlp(), policy=rlx.DevicePolicy(deny=("rest2",)), registry=reg)
    assert cg.device == "mm+rest"


def test_segment_graph_names_its_boundary_inputs_and_copies_params() -> None:
    g = mlp()
    nodes = [n.id for n in g.nodes if n.op.value in ("add", "relu", "softmax")]
    matmul = next(n.id for n in g.nodes if n.op.value == "matmul")
    sub, feeds = segment_graph(g, nodes, [g.outputs[0]], "tail")
    assert feeds == {matmul: f"rlx_segment_value_{matmul}"}
    assert [sub.node(i).name for i in sub.params] == ["b"]
    assert [sub.node(i).name for i in sub.inputs] == [f"rlx_segment_value_{matmul}"]


@settings(max_examples=25, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=graphs(), seed=st.integers(0, 2**16))
def test_random_graphs_split_over_random_claims_match_the_reference(case, seed):
    """Two devices whose claims partition the op set at random: whatever the split, the
    outputs are the float64 reference's, before and after set_param."""
    g, feeds = case
    ops = sorted(ALL_OPS)
    rng = np.random.default_rng(seed)
    mine = frozenset(op for op in ops if rng.random() < 0.5)
    reg = registry_with(ToyBackend("left", ops=mine), ToyBackend("right", ops=ALL_OPS - mine))
    cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=reg)
    dtypes = [g.node(i).dtype for i in g.outputs]
    got = cg.run(feeds)
    for i, (a, r, dt) in enumerate(zip(got, reference.evaluate(g, feeds), dtypes)):
        assert mismatch(dt, a, r, terms=6) is None, (i, cg.device)
    params = {"p": (np.asarray(g.value(g.input_node("p").id)) * 0.5).astype(np.float32)}
    cg.set_param("p", params["p"])
    for i, (a, r, dt) in enumerate(zip(cg.run(feeds), reference.evaluate(g, feeds, params=params), dtypes)):
        assert mismatch(dt, a, r, terms=6) is None, (i, cg.device, "after set_param")


class DeviceToy(ToyBackend):
    """A toy whose executables hand outputs over through ``run_dlpack`` (counted) and,
    when ``takes_device``, accept device arrays as inputs (like cuda)."""

    def __init__(self, name: str, ops: frozenset[str], takes_device: bool) -> None:
        super().__init__(name, ops=ops)
        self.takes_device = takes_device
        self.dlpack_runs = 0

    def compile(self, graph, options):  # type: ignore[no-untyped-def]
        exe = super().compile(graph, options)
        owner = self

        class Run(type(exe)):  # type: ignore[misc]
            accepts_device_inputs = owner.takes_device

            def run_dlpack(self, inputs):  # type: ignore[no-untyped-def]
                owner.dlpack_runs += 1
                return self.run(inputs)

        return Run(exe.graph, self)


def test_values_stay_on_the_device_when_every_reader_takes_device_arrays() -> None:
    g = rlx.Graph("handover")
    x = g.input("x", (4, 8))
    a = g.relu(x, name="a")  # rest: read only by the product's segment
    g.set_outputs([g.matmul(a, g.param("w", np.eye(8, dtype=np.float32)), name="b")])  # dev: a graph output
    rest, dev = DeviceToy("rest", REST, takes_device=False), DeviceToy("dev", frozenset({"matmul"}), takes_device=True)
    cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=registry_with(rest, dev))
    assert [s.device for s in cg.segments] == ["rest", "dev"]
    _check(cg, g, _x())
    assert rest.dlpack_runs == 1 and dev.dlpack_runs == 0  # the graph's output comes back as numpy
    rest2, host = DeviceToy("rest", REST, takes_device=False), DeviceToy("dev", frozenset({"matmul"}),
                                                                          takes_device=False)
    _check(rlx.compile(g, policy=rlx.DevicePolicy(), registry=registry_with(rest2, host)), g, _x())
    assert rest2.dlpack_runs == 0  # a reader that takes numpy only: host arrays
