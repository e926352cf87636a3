"""The generic calibration measures through a backend's compile and caches per host."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from support import ToyBackend

import rlx_core as rlx
from rlx_core import calibration
from rlx_core.cache import JsonCache


@pytest.mark.slow
def test_calibrate_measures_caches_and_cost_model_uses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    toy = ToyBackend("caltoy")
    toy.cost_model = lambda: rlx.Backend.cost_model(toy)  # use the base class's cache lookup
    assert not toy.cost_model().calibrated
    model = toy.calibrate(quick=True)
    assert model.calibrated and model.device == "caltoy" and len(model.sgemm_points) == 4
    shapes = {p[:3] for p in model.sgemm_points}
    assert {(64, 64, 64), (256, 256, 256), *calibration.SHAPED_GEMMS[:2]} == shapes  # squares and skinny ones
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


def _stale(toy, cache):
    ident = dict(calibration.calibration_identity(toy), plugin_version="0.0.0-other")
    cache.put(toy.name, ident, rlx.CostModel(device=toy.name, calibrated=True).to_dict())


def _old_schema(toy, cache):
    JsonCache("calibration", schema=calibration.CALIBRATION_SCHEMA - 1).put(
        toy.name, calibration.calibration_identity(toy), {"sgemm_gflops": 1.0})


def _not_a_model(toy, cache):
    cache.put(toy.name, calibration.calibration_identity(toy), {"device": toy.name, "sgemm_gflops": -3})


def _truncated(toy, cache):
    cache.put("other", {}, {"x": 1})  # the namespace folder, made by rlx (a folder it did not make is not its)
    cache.path(toy.name).write_text('{"schema": 3, "identity": {"backend"')


@pytest.mark.parametrize("corrupt", [_stale, _old_schema, _not_a_model, _truncated])
def test_a_bad_calibration_entry_is_warned_about_once_then_removed(tmp_path, monkeypatch, corrupt):
    # issue 19: not "warned about by every process until someone recalibrates"
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    toy = ToyBackend(f"caltoy{corrupt.__name__}".replace("_", ""))
    cache = calibration._cache()
    corrupt(toy, cache)
    assert cache.path(toy.name).exists()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(3):  # as three fresh processes would: each asks the disk
            assert calibration.cached_cost_model(toy) is None
    warned = [str(w.message) for w in rec if issubclass(w.category, rlx.CacheWarning)]
    assert len(warned) == 1, warned
    assert "removed" in warned[0] and "rlx calibrate" in warned[0]  # says what happens next
    assert not cache.path(toy.name).exists()


@pytest.mark.slow
def test_calibration_measures_a_cost_line_per_claimed_elementwise_op(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    model = ToyBackend("caltoy3").calibrate(quick=True)
    lines = {op: (ns, rate) for op, ns, rate in model.op_costs}
    assert {"add", "exp", "erf", "reduce_sum", "softmax", "layer_norm"} <= set(lines)
    assert set(lines) <= set(calibration.OP_COST_OPS)
    assert all(ns >= 0 and rate > 0 for ns, rate in lines.values())
    regions = dict(model.region_costs)  # one more op of a region: elementwise ops only
    assert {"add", "exp", "erf"} <= set(regions) and not {"softmax", "reduce_sum"} & set(regions)
    assert all(rate > 0 for rate in regions.values())
    assert rlx.CostModel.from_dict(model.to_dict()) == model  # persists through the JSON cache


def test_region_costs_price_the_instructions_of_a_fused_region():
    g = rlx.Graph("r")
    x = g.input("x", (1000,))
    g.set_outputs([g.exp(g.add(x, x))])
    from rlx_core.passes.fuse import fuse_elementwise

    fused = fuse_elementwise(g.freeze(), lambda n: True, 32, 8)[0]
    model = rlx.CostModel("m", dispatch_overhead_ns=1000.0, roundtrip_overhead_ns=0.0, memory_bw_gbps=1e6,
                          op_costs=(("add", 1.0, 1.0), ("exp", 1.0, 1.0)),
                          region_costs=(("add", 2.0), ("exp", 0.5)))
    want = 1e-6 + 1000 * (1 / 2e9 + 1 / 0.5e9)  # dispatch, then each instruction's marginal cost
    assert abs(rlx.estimate_graph_cost(fused, model) - want) < 1e-12
    with pytest.raises(rlx.errors.ConfigError, match="region_costs"):
        rlx.CostModel("bad", region_costs=(("add", 0.0),))


def test_op_cost_lines_price_kernels_and_fused_regions():
    from rlx_core.passes.fuse import fuse_elementwise

    base = rlx.CostModel("m", sgemm_gflops=100.0, memory_bw_gbps=10.0, dispatch_overhead_ns=1000.0,
                         roundtrip_overhead_ns=0.0)
    lines = rlx.CostModel("m", sgemm_gflops=100.0, memory_bw_gbps=10.0, dispatch_overhead_ns=1000.0,
                          roundtrip_overhead_ns=0.0, op_costs=[("erf", 2000.0, 0.1), ("add", 500.0, 5.0)])
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

    from rlx_core.placement.ranking import priced_graph

    class Xla(ToyBackend):
        fuses_elementwise = True

    g = rlx.Graph("chain")
    x = g.input("x", (64, 64))
    g.set_outputs([g.tanh(g.mul(g.add(x, 1.0), x))])
    g.freeze()
    reg = registry_with(Xla("xla"), ToyBackend("plain"))
    assert rlx.OpKind.FUSED_ELEMENTWISE in {n.op for n in priced_graph(g, "xla", reg).nodes}
    assert rlx.OpKind.FUSED_ELEMENTWISE not in {n.op for n in priced_graph(g, "plain", reg).nodes}


# ----------------------------------------------------------------------------- shapes and structure
SHAPED = rlx.CostModel("s", calibrated=True, memory_bw_gbps=1000.0, dispatch_overhead_ns=0.0, roundtrip_overhead_ns=0.0,
                       sgemm_points=((64, 64, 64, 50.0), (1024, 1024, 1024, 400.0), (128, 64, 128, 10.0)))


def test_gemm_rate_comes_from_the_nearest_measured_shapes():
    assert abs(SHAPED.sgemm_gflops_at(1024, 1024, 1024) - 400.0) < 1e-6
    assert 10.0 <= SHAPED.sgemm_gflops_at(128, 64, 128) < 11.5  # the skinny point, not the square curve (~100)
    assert abs(SHAPED.sgemm_gflops_at(8192, 8192, 8192) - 400.0) < 1e-6  # beyond every point: the nearest
    squares = [SHAPED.sgemm_gflops_at(n, n, n) for n in (64, 256, 1024, 4096)]
    assert squares == sorted(squares)


def test_batched_products_attention_and_convolutions_are_priced_by_their_parts():
    g = rlx.Graph("heads")
    q, k = g.input("q", (4, 128, 64)), g.input("k", (4, 64, 128))
    g.set_outputs([g.matmul(q, k)])
    per_head = 2 * 128 * 64 * 128 / (SHAPED.sgemm_gflops_at(128, 64, 128) * 1e9)
    assert abs(rlx.estimate_graph_cost(g.freeze(), SHAPED) - 4 * per_head) < 1e-12  # not one 512x64x128 product

    a = rlx.Graph("att")
    qa, ka, va = (a.input(n, (4, 128, 64)) for n in "qkv")
    a.set_outputs([a.attention(qa, ka, va)])
    scores = 4 * 128 * 128 * 8 / 1000e9  # softmax and scale passes at the memory rate (no cost lines)
    second = 2 * 128 * 128 * 64 / (SHAPED.sgemm_gflops_at(128, 128, 64) * 1e9)  # (scores) @ v
    want = 4 * (per_head + second) + 2 * scores
    assert abs(rlx.estimate_graph_cost(a.freeze(), SHAPED) - want) < 1e-12

    c = rlx.Graph("conv")
    x = c.input("x", (1, 16, 32, 32))
    c.set_outputs([c.conv2d(x, c.param("w", np.zeros((32, 16, 3, 3), np.float32)), padding=1)])
    product = 2 * 32 * 144 * 1024 / (SHAPED.sgemm_gflops_at(32, 144, 1024) * 1e9)
    im2col = 2 * 144 * 1024 * 4 / 1000e9
    assert abs(rlx.estimate_graph_cost(c.freeze(), SHAPED) - (product + im2col)) < 1e-12


def test_a_depthwise_convolution_is_priced_as_one_sweep_not_one_product_per_channel():
    """Backends sweep every channel of a depthwise layer in one kernel. Priced one tiny
    product per group, each at a tiny product's rate, mobilenet_v3_small's depthwise
    layers came to 180 ms on a host that runs the whole model in 1.4."""
    def conv(groups: int, channels: int = 576) -> float:
        c = rlx.Graph("dw")
        x = c.input("x", (1, channels, 7, 7))
        w = c.param("w", np.zeros((channels, channels // groups, 3, 3), np.float32))
        c.set_outputs([c.conv2d(x, w, padding=1, groups=groups)])
        return rlx.estimate_graph_cost(c.freeze(), SHAPED)

    flops = 2 * 576 * 9 * 49
    sweep = flops / (SHAPED.sgemm_gflops_at(576, 9, 49) * 1e9)
    assert abs(conv(576) - sweep) < 1e-12  # the whole layer's rate; no window copy
    assert conv(576) < conv(1) / 10  # 576x fewer flops than the dense layer, at a skinny shape's rate
    per_group = 32 * 2 * 18 * 162 * 49 / (SHAPED.sgemm_gflops_at(18, 162, 49) * 1e9)  # 32 groups of 18: products
    im2col = 2 * 32 * 162 * 49 * 4 / 1000e9
    assert abs(conv(32) - (per_group + im2col)) < 1e-12


def test_values_computed_from_params_alone_cost_nothing_per_run():
    def dense(transposed: bool) -> rlx.Graph:
        g = rlx.Graph("d")
        x = g.input("x", (8, 64))
        w = g.param("w", np.zeros((32, 64) if transposed else (64, 32), np.float32))
        g.set_outputs([g.matmul(x, g.transpose(w, (1, 0)) if transposed else w)])
        return g.freeze()

    assert rlx.estimate_graph_cost(dense(True), SHAPED) == rlx.estimate_graph_cost(dense(False), SHAPED)


def test_the_identity_reads_the_probe_of_the_registry_holding_the_backend() -> None:
    """A backend in a fresh Registry is calibrated against that registry's probe, never the
    process-wide default one (calibration.py imports no registry)."""
    import json

    from support import ToyBackend, registry_with

    from rlx_core.calibration import calibration_identity

    class Versioned(ToyBackend):
        driver = "0"

        def probe(self) -> rlx.Availability:
            return rlx.Availability(True, devices=[self.name], versions={"driver": self.driver})

    held = Versioned("cpu")  # the default registry has a real "cpu": it must not be asked
    held.driver = "7"
    reg = registry_with(held)  # held while it lives (a weak reference: no cycle)
    assert json.loads(calibration_identity(held)["versions"]) == {"driver": "7"} and reg.get("cpu") is held
    alone = Versioned("cpu")
    assert json.loads(calibration_identity(alone)["versions"]) == {}


# ----------------------------------------------------------------------------- nothing lost, nothing silent
class SavingToy(ToyBackend):
    """Calibrates in no time: a fixed model, saved as ``calibrate_backend`` saves one."""

    def calibrate(self, quick: bool = False) -> rlx.CostModel:
        model = rlx.CostModel(device=self.name, sgemm_gflops=123.0, calibrated=True, source="calibrated (toy)")
        calibration.save_calibration(self, model)
        return model


def _blocked(tmp_path, monkeypatch, key: str = "savetoy"):
    """A cache whose calibration folder is rlx's and writable, where ``key``'s entry cannot
    be written: a folder stands where its file would go."""
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "cache"))
    cache = JsonCache("calibration", schema=calibration.CALIBRATION_SCHEMA)
    cache.put("other", {}, {"x": 1})  # the namespace folder, made by rlx
    cache.path(key).mkdir()
    return cache.path(key)


def test_a_save_says_where_or_why_not_and_is_recorded_instead_of_warned(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "ok"))
    toy = SavingToy("savetoy")
    saved = calibration.save_calibration(toy, rlx.CostModel(device="savetoy", calibrated=True))
    assert saved.saved and saved.path.endswith("savetoy.json") and (tmp_path / "ok" / "calibration").is_dir()

    where = _blocked(tmp_path, monkeypatch)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with calibration.recording_saves() as saves:
            toy.calibrate()
    assert [s.path for s in saves] == [str(where)] and not saves[0].saved and str(where) in saves[0].error
    assert not [w for w in seen if issubclass(w.category, rlx.CacheWarning)]  # the recorder reports it
    with pytest.warns(rlx.CacheWarning, match="could not write"):  # outside a recorder: a warning, as before
        toy.calibrate()


@pytest.mark.parametrize("blocked", [False, True])
def test_the_calibration_child_answers_where_the_model_was_saved(tmp_path, monkeypatch, blocked: bool) -> None:
    """The child's result carries the save's outcome: its warning would die with it."""
    from rlx_core.backends._isolated_child import _calibrate_task

    if blocked:
        where = _blocked(tmp_path, monkeypatch)
    else:
        monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "ok"))
        where = JsonCache("calibration", schema=calibration.CALIBRATION_SCHEMA).path("savetoy")

    class Channel:
        sent: list[tuple[str, dict]] = []

        def send(self, event: str, **fields) -> None:
            self.sent.append((event, fields))

    channel = Channel()
    _calibrate_task(SavingToy("savetoy"), True, channel)  # type: ignore[arg-type]
    event, fields = channel.sent[-1]
    assert event == "result" and fields["payload"]["model"]["sgemm_gflops"] == 123.0
    saved = fields["payload"]["saved"]
    assert saved["path"] == str(where) and (bool(saved["error"]) is blocked)


@pytest.mark.slow
def test_rlx_calibrate_checks_the_cache_before_measuring(tmp_path) -> None:
    from test_cli import assert_user_error, run_rlx

    (tmp_path / "a_file").write_text("not a folder")
    for isolation in ("0", "1"):
        proc = run_rlx("calibrate", "cpu", "--quick", cwd=tmp_path,
                       env={"RLX_CACHE_DIR": str(tmp_path / "a_file" / "cache"), "RLX_ISOLATION": isolation})
        assert_user_error(proc, "cannot save calibrations in", str(tmp_path / "a_file"), "is a file", "RLX_CACHE_DIR")
        assert proc.stdout == ""  # nothing was measured


def test_rlx_calibrate_exits_1_naming_the_path_and_reason_when_the_save_fails(tmp_path, monkeypatch) -> None:
    from support import registry_with
    from test_cli import run_rlx

    where = _blocked(tmp_path, monkeypatch)
    proc = run_rlx("calibrate", "savetoy", cwd=tmp_path, registry=registry_with(SavingToy("savetoy")),
                   env={"RLX_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    said = " ".join(proc.stdout.split())
    assert f"savetoy: measured but not saved (rlx cache: could not write {where}" in said, said
    assert "IsADirectoryError" in said and "123.0" in said  # the reason; and the table shows what was measured
    assert "warning" not in proc.stderr  # said once, as the command's outcome


@pytest.mark.slow
def test_rlx_calibrate_in_a_child_process_exits_1_too(tmp_path, monkeypatch) -> None:
    """The real cpu backend calibrated in its child process (``RLX_ISOLATION=1``), whose
    save fails: the same line and exit code as in this process."""
    from test_cli import run_rlx

    where = _blocked(tmp_path, monkeypatch, key="cpu")
    proc = run_rlx("calibrate", "cpu", "--quick", cwd=tmp_path,
                   env={"RLX_CACHE_DIR": str(tmp_path / "cache"), "RLX_ISOLATION": "1"})
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    said = " ".join(proc.stdout.split())
    assert f"cpu: measured but not saved (rlx cache: could not write {where}" in said and "GFLOP/s" in said, said
