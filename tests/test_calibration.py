"""The generic calibration measures through a backend's compile and caches per host."""

from __future__ import annotations

import warnings

from support import ToyBackend

import rlx_core as rlx
from rlx_core import calibration
from rlx_core.cache import JsonCache


def test_calibrate_measures_caches_and_cost_model_uses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    toy = ToyBackend("caltoy")
    toy.cost_model = lambda: rlx.Backend.cost_model(toy)  # use the base class's cache lookup
    assert not toy.cost_model().calibrated
    model = toy.calibrate(quick=True)
    assert model.calibrated and model.device == "caltoy" and len(model.sgemm_points) == 2
    assert model.sgemm_gflops > 0 and model.memory_bw_gbps > 0 and model.dispatch_overhead_ns > 0
    again = toy.cost_model()
    assert again.calibrated and again.sgemm_points == model.sgemm_points


def test_foreign_cache_entry_is_ignored_with_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    toy = ToyBackend("caltoy2")
    ident = dict(calibration.calibration_identity(toy), plugin_version="0.0.0-other")
    JsonCache("calibration", schema=calibration.CALIBRATION_SCHEMA).put(
        "caltoy2", ident, rlx.CostModel(device="caltoy2", calibrated=True).to_dict()
    )
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert calibration.cached_cost_model(toy) is None
    assert any(issubclass(w.category, rlx.CacheWarning) for w in rec)


def test_calibration_measures_a_cost_line_per_claimed_elementwise_op(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    model = ToyBackend("caltoy3").calibrate(quick=True)
    lines = {op: (ns, rate) for op, ns, rate in model.op_costs}
    assert {"add", "exp", "erf", "reduce_sum", "softmax", "layer_norm"} <= set(lines)
    assert set(lines) <= set(calibration.OP_COST_OPS)
    assert all(ns >= 0 and rate > 0 for ns, rate in lines.values())
    assert rlx.CostModel.from_dict(model.to_dict()) == model  # persists through the JSON cache


def test_op_cost_lines_price_kernels_and_fused_regions():
    from rlx_core.passes.fuse import fuse_elementwise

    base = rlx.CostModel("m", sgemm_gflops=100.0, memory_bw_gbps=10.0, dispatch_overhead_ns=1000.0,
                         roundtrip_overhead_ns=0.0)  # fmt: skip
    lines = rlx.CostModel("m", sgemm_gflops=100.0, memory_bw_gbps=10.0, dispatch_overhead_ns=1000.0,
                          roundtrip_overhead_ns=0.0, op_costs=[("erf", 2000.0, 0.1), ("add", 500.0, 5.0)])  # fmt: skip
    g = rlx.Graph("erf")
    x = g.input("x", (1 << 20,))
    g.set_outputs([g.add(g.erf(x), 1.0)])
    g.freeze()
    # erf: 2 µs + 2^20 / 0.1e9 s; add: memory-bound at 10 GB/s (8 MiB) beats its 0.2 ms of compute
    erf, add_mem = 2e-6 + (1 << 20) / 0.1e9, 1e-6 + 8 * (1 << 20) / 10e9
    assert abs(rlx.estimate_graph_cost(g, lines) - (erf + add_mem)) < 1e-9
    assert rlx.estimate_graph_cost(g, lines) > 5 * rlx.estimate_graph_cost(g, base)  # erf is not an add
    fused = fuse_elementwise(g, lambda node: True, 32, 8)[0]
    assert [n.op for n in fused.nodes].count(rlx.OpKind.FUSED_ELEMENTWISE) == 1
    # one kernel: dispatch + per element the compute of each instruction (less its memory)
    moved = 8 / 10e9
    compute = (1 << 20) * (max(1 / 0.1e9 - moved, 0.2 / 0.1e9) + max(1 / 5e9 - moved, 0.2 / 5e9))
    assert abs(rlx.estimate_graph_cost(fused, lines) - (1e-6 + compute)) < 1e-9


def test_a_backend_that_fuses_by_itself_is_priced_on_regions():
    from support import registry_with

    from rlx_core.placement import priced_graph

    class Xla(ToyBackend):
        fuses_elementwise = True

    g = rlx.Graph("chain")
    x = g.input("x", (64, 64))
    g.set_outputs([g.tanh(g.mul(g.add(x, 1.0), x))])
    g.freeze()
    reg = registry_with(Xla("xla"), ToyBackend("plain"))
    assert rlx.OpKind.FUSED_ELEMENTWISE in {n.op for n in priced_graph(g, "xla", reg).nodes}
    assert rlx.OpKind.FUSED_ELEMENTWISE not in {n.op for n in priced_graph(g, "plain", reg).nodes}
