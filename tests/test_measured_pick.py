"""A pick that measures when unsure (``rlx_core/placement/measured.py``) and the observed errors that
correct later rankings (``rlx_core/placement/corrections.py``).

The fake devices below take their time on a fake clock: the cost model predicts ``a``
faster (``gflops``), while ``a``'s runs take 5 ms of fake time and ``b``'s 1 ms, so a
measurement must pick ``b`` and nothing here depends on the host's speed. Every test has
its own ``RLX_CACHE_DIR`` (``conftest._own_cache_dir``).
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from support import RefExecutable, ToyBackend, mlp

import rlx_core as rlx
from rlx_core.cache import cache_dir
from rlx_core.compiler.lowering import priced_graph
from rlx_core.cost import estimate_graph_cost
from rlx_core.placement.corrections import PredictionErrors
from rlx_core.placement.measured import MeasureSettings, Trial, Verdicts, graph_signature, measurement_inputs
from rlx_core.placement.ranking import Placement

X = {"x": np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)}
RUNS = 3  # DevicePolicy's default benchmark_runs
TRIAL_RUNS = 2 * (1 + RUNS)  # a warm-up and RUNS timed runs on each of two candidates


class Clock:
    """A fake timer: what the fake devices' runs advance."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Timed(ToyBackend):
    """A toy device whose every run takes ``seconds`` on ``clock``."""

    def __init__(self, name: str, clock: Clock, seconds: float, **kw: object) -> None:
        super().__init__(name, **kw)  # type: ignore[arg-type]
        self.clock, self.seconds = clock, seconds

    def compile(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable:
        exe = super().compile(graph, options)
        owner = self

        class Run(RefExecutable):
            def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
                owner.clock.now += owner.seconds
                return super().run(inputs)

        return Run(exe.graph, self)


def devices(clock: Clock, *, b_gflops: float = 500, version: str = "", **b_kw: object) -> tuple[Timed, Timed,
                                                                                                  rlx.Registry]:
    """``a`` predicted faster than ``b``; ``b`` measures 5x faster. With ``b_gflops=500``
    the estimates are 1.46x apart (unsure); with ``1`` far apart (sure)."""
    a = Timed("a", clock, 5e-3, gflops=1000)
    b = Timed("b", clock, 1e-3, gflops=b_gflops, **b_kw)
    reg = rlx.Registry(entry_points=[], environ={})
    reg.register(a, version=version)
    reg.register(b, version=version)
    return a, b, reg


def expected(g: rlx.Graph) -> np.ndarray:
    return rlx.reference.evaluate(g, X)[0]


def session(reg: rlx.Registry, clock: Clock, policy: rlx.DevicePolicy | None = None,
            g: rlx.Graph | None = None) -> rlx.GraphDevices:
    return rlx.GraphDevices(g or mlp(), policy or rlx.DevicePolicy(), registry=reg,
                            measure=MeasureSettings(clock=clock))


def verdict_files() -> list[Path]:
    return sorted((cache_dir() / "measured-picks").glob("pick-*.json"))


# ------------------------------------------------------------------ the measured pick
def test_unsure_auto_runs_measure_on_their_first_runs_and_keep_the_faster() -> None:
    clock = Clock()
    a, b, reg = devices(clock)
    doubt = Placement(mlp(), rlx.DevicePolicy(), reg).decide()
    assert doubt.device == "a" and doubt.doubt is not None and "estimates within 1.5x" in doubt.doubt.reason
    gd = session(reg, clock)
    order = []
    for _ in range(TRIAL_RUNS):  # every call of the trial returns the right answer from the device it ran
        np.testing.assert_allclose(gd.run(X)[0], expected(mlp()), rtol=1e-5, atol=1e-6)
        order.append(gd.last_device)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-ups, then rounds in alternating order
    assert (a.runs, b.runs) == (1 + RUNS, 1 + RUNS)
    for _ in range(5):
        gd.run(X)
    assert gd.last_device == "b" and (a.runs, b.runs) == (1 + RUNS, 1 + RUNS + 5)
    why = gd.pick_reason or ""
    assert "measured the unsure pick: b fastest (b 1.00 ms, a 5.00 ms" in why and "measured now" in why
    assert "estimates within 1.5x" in why


def test_a_sure_pick_is_not_measured() -> None:
    clock = Clock()
    _, b, reg = devices(clock, b_gflops=1)
    gd = session(reg, clock)
    for _ in range(TRIAL_RUNS):
        gd.run(X)
    assert gd.last_device == "a" and b.runs == 0 and b.compiles == 0
    assert (gd.pick_reason or "").startswith("lowest estimated cost") and "unsure" not in (gd.pick_reason or "")
    assert verdict_files() == []


def test_the_verdict_is_cached_on_disk_and_reused_without_timing() -> None:
    clock = Clock()
    _, _, reg = devices(clock)
    gd = session(reg, clock)
    for _ in range(TRIAL_RUNS):
        gd.run(X)
    assert len(verdict_files()) == 1
    # Another process: new device objects, new registry; a graph of the same structure
    # with other weights and names shares the verdict.
    other = mlp()
    other.name = "another export"
    a2, b2, reg2 = devices(Clock())
    gd2 = session(reg2, clock, g=other)
    for _ in range(3):
        np.testing.assert_allclose(gd2.run(X)[0], expected(other), rtol=1e-5, atol=1e-6)
    assert (a2.runs, b2.runs, a2.compiles) == (0, 3, 0)
    assert "verdict from the cache" in (gd2.pick_reason or "")
    cg = rlx.compile(mlp(), registry=reg2)  # plain compile (pick="cost") uses the cached verdict too
    assert cg.device == "b" and cg.report().measurement is not None and cg.report().measurement.from_cache
    assert "verdict from the cache" in cg.report().reason and "measured: b 1000.0 µs" in str(cg.report())
    assert rlx.fastest_device_for(mlp(), rlx.DevicePolicy(), registry=reg2) == "b"
    assert a2.runs == 0  # nothing was timed again
    assert graph_signature(mlp(8)) != graph_signature(mlp(4))  # another batch size is another verdict


def test_times_of_one_graph_add_up_across_doubts() -> None:
    """One entry per graph: a doubt between devices measured at different times is settled
    from what is known of each."""
    clock = Clock()
    a, b, reg = devices(clock)
    c = Timed("c", clock, 2e-3, gflops=700)
    reg.register(c)
    for pair in (("a", "b"), ("b", "c")):
        gd = session(reg, clock, rlx.DevicePolicy.only(pair))
        for _ in range(TRIAL_RUNS):
            gd.run(X)
    assert (a.runs, b.runs, c.runs) == (1 + RUNS, 2 * (1 + RUNS), 1 + RUNS)
    (path,) = verdict_files()
    assert sorted(json.loads(path.read_text())["payload"]["devices"]) == ["a", "b", "c"]
    gd = session(reg, clock, rlx.DevicePolicy.only(["a", "c"]))
    gd.run(X)
    assert gd.last_device == "c" and a.runs == 1 + RUNS and "verdict from the cache" in (gd.pick_reason or "")


def _one_verdict(clock: Clock, reg: rlx.Registry) -> Path:
    gd = session(reg, clock)
    for _ in range(TRIAL_RUNS):
        gd.run(X)
    (path,) = verdict_files()
    return path


def test_a_stale_verdict_is_measured_again() -> None:
    clock = Clock()
    path = _one_verdict(clock, devices(clock)[2])
    entry = json.loads(path.read_text())
    entry["payload"]["devices"]["a"]["measured_at"] = time.time() - 8 * 24 * 3600  # older than VERDICT_MAX_AGE_S
    path.write_text(json.dumps(entry))
    a, _, reg = devices(clock)
    assert Verdicts(reg).get(mlp(), ["a", "b"]) is None
    gd = session(reg, clock)
    gd.run(X)
    assert "measuring b, a" in (gd.pick_reason or "")  # the first measurement's errors ranked b first
    for _ in range(TRIAL_RUNS - 1):
        gd.run(X)
    assert a.runs == 1 + RUNS and "measured now" in (gd.pick_reason or "")


def test_a_verdict_of_other_plugin_versions_is_measured_again() -> None:
    clock = Clock()
    _one_verdict(clock, devices(clock)[2])
    a, _, reg = devices(clock, version="2.0")  # an upgrade: other kernels
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ignored quietly: an upgrade is not a fault
        assert Verdicts(reg).get(mlp(), ["a", "b"]) is None
        gd = session(reg, clock)
        for _ in range(TRIAL_RUNS):
            gd.run(X)
    assert a.runs == 1 + RUNS


def test_a_foreign_verdict_is_ignored_with_a_warning() -> None:
    clock = Clock()
    path = _one_verdict(clock, devices(clock)[2])
    entry = json.loads(path.read_text())
    entry["identity"]["graph"] = "0" * 64  # written for another graph under this key
    path.write_text(json.dumps(entry))
    a, _, reg = devices(clock)
    gd = session(reg, clock)
    with pytest.warns(rlx.CacheWarning, match="another identity"):
        gd.run(X)
    for _ in range(TRIAL_RUNS - 1):
        gd.run(X)
    assert a.runs == 1 + RUNS and "measured now" in (gd.pick_reason or "")  # measured again
    assert len(verdict_files()) == 1  # the foreign entry was removed, this one written


def test_compile_with_pick_measure_times_the_candidates_and_compiles_the_winner_once() -> None:
    clock = Clock()
    a, b, reg = devices(clock)
    cg = rlx.compile(mlp(), policy=rlx.DevicePolicy(pick="measure"), registry=reg,
                     measure=MeasureSettings(clock=clock))
    assert cg.device == "b" and (a.compiles, b.compiles) == (1, 1)  # the measured copy is kept
    assert (a.runs, b.runs) == (1 + RUNS, 1 + RUNS)
    report = cg.report()
    assert report.measurement is not None and not report.measurement.from_cache
    assert dict(report.measurement.seconds) == pytest.approx({"a": 5e-3, "b": 1e-3})
    assert "measured the unsure pick: b fastest" in report.reason and "generated inputs" in report.reason
    assert report.to_dict()["measurement"]["winner"] == "b"
    np.testing.assert_allclose(cg.run(X)[0], expected(mlp()), rtol=1e-5, atol=1e-6)
    assert len(verdict_files()) == 1


def test_plain_compile_keeps_the_cost_pick_and_says_it_was_unsure() -> None:
    clock = Clock()
    _, b, reg = devices(clock)
    cg = rlx.compile(mlp(), registry=reg)
    assert cg.device == "a" and b.compiles == 0
    assert "unsure (estimates within 1.5x" in cg.report().reason and "pick='measure'" in cg.report().reason
    assert cg.report().measurement is None


def test_measurement_inputs_are_seeded_and_safe_as_indices() -> None:
    g = rlx.Graph("emb")
    table = g.param("table", np.ones((5, 3), np.float32))
    ids = g.input("ids", (4,), "int64")
    x = g.input("x", (4, 3))
    g.set_outputs([g.add(g.gather(table, ids), x)])
    inputs = measurement_inputs(g)
    assert (inputs["ids"] == 0).all() and inputs["ids"].dtype == np.int64
    np.testing.assert_array_equal(inputs["x"], measurement_inputs(g)["x"])
    assert inputs["x"].dtype == np.float32 and np.abs(inputs["x"]).max() <= 1


# ------------------------------------------------------------------ the observed error
def test_recorded_errors_correct_later_rankings_and_the_report_says_so() -> None:
    _, _, reg = devices(Clock(), b_gflops=1)
    g = mlp()
    assert rlx.devices_for(g, rlx.DevicePolicy(), registry=reg) == ["a", "b"]
    rows = {r.device: r for r in rlx.device_report(g, rlx.DevicePolicy(), registry=reg)}
    model_b = rows["b"].model_seconds
    assert model_b is not None and rows["b"].est_seconds == model_b and rows["b"].correction is None
    errors = PredictionErrors(reg)
    for _ in range(3):
        errors.record("a", rows["a"].model_seconds * 1000, rows["a"].model_seconds)  # type: ignore[operator]
    # b, never measured, is lent a's error: a missing record is no reason to look faster
    assert rlx.devices_for(g, rlx.DevicePolicy(), registry=reg) == ["a", "b"]
    lent = {r.device: r for r in rlx.device_report(g, rlx.DevicePolicy(), registry=reg)}["b"]
    assert lent.correction is not None and lent.correction.borrowed_from == ("a",)
    assert lent.est_seconds == pytest.approx(model_b * 1000)
    assert "the median observed for a on this host (none recorded for b)" in (lent.estimate_note() or "")
    errors.record("b", model_b, model_b)  # b measured as its model says
    rows = {r.device: r for r in rlx.device_report(g, rlx.DevicePolicy(), registry=reg)}
    assert rows["a"].correction is not None and rows["a"].correction.factor == pytest.approx(1000)
    assert rows["a"].est_seconds == pytest.approx(rows["a"].model_seconds * 1000)  # type: ignore[operator]
    assert rows["b"].recommended
    # the model's own price is left alone
    assert rows["a"].model_seconds == estimate_graph_cost(priced_graph(g, "a", reg), reg.cost_model("a"))
    assert rlx.fastest_device_for(g, rlx.DevicePolicy(), registry=reg) == "b"
    cg = rlx.compile(g, registry=reg)
    why = cg.report().reason
    assert "a: estimate" in why and "corrected by observed factor 1e+03 from 3 measurements on this host" in why
    assert "corrected by observed factor" in str(cg.report())


def test_a_large_recorded_error_makes_a_clear_pick_unsure() -> None:
    clock = Clock()
    _, b, reg = devices(clock, b_gflops=1)
    model_a = Placement(mlp(), rlx.DevicePolicy(), reg).candidates()[0].model_seconds
    assert model_a is not None
    PredictionErrors(reg).record("a", model_a * 3, model_a)  # a is 3x slower than its model says, still first
    decision = Placement(mlp(), rlx.DevicePolicy(), reg).decide()
    assert decision.device == "a" and decision.doubt is not None
    assert "a's estimates were off by 3x on this host (1 measurement)" in decision.doubt.reason
    gd = session(reg, clock)
    for _ in range(TRIAL_RUNS + 1):
        gd.run(X)
    assert gd.last_device == "b" and b.runs == 1 + RUNS + 1


def test_measurements_and_baselines_feed_the_errors_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_REPICK_DRIFT", "20")
    clock = Clock()
    _, _, reg = devices(clock)
    gd = session(reg, clock)
    for _ in range(TRIAL_RUNS):
        gd.run(X)
    rows = {r.device: r for r in Placement(mlp(), rlx.DevicePolicy(), reg).candidates()}
    for device, seconds in (("a", 5e-3), ("b", 1e-3)):
        c = rows[device].correction
        assert c is not None and c.measurements == 1
        assert c.factor == pytest.approx(seconds / rows[device].model_seconds)  # type: ignore[operator]
    assert gd._watch is not None and gd._watch.current == "b"
    for _ in range(3 + 16):  # the drift watch's warm-up and first window set b's baseline
        gd.run(X)
    assert PredictionErrors(reg).get("b").measurements == 2  # type: ignore[union-attr]


def test_errors_against_another_cost_model_are_dropped() -> None:
    _, _, reg = devices(Clock())
    PredictionErrors(reg).record("b", 1.0, 0.1)
    assert PredictionErrors(reg).get("b").factor == pytest.approx(10)  # type: ignore[union-attr]
    _, _, recalibrated = devices(Clock(), b_gflops=7)  # b's cost model changed
    assert PredictionErrors(recalibrated).get("b") is None
    _, _, upgraded = devices(Clock(), version="2.0")
    assert PredictionErrors(upgraded).get("b") is None
    assert PredictionErrors(reg).get("b") is not None  # ignored, not removed: the next record replaces it


# ------------------------------------------------------------------ the user's choice stands
@pytest.mark.parametrize("policy", [
    rlx.DevicePolicy(prefer=("a",)),
    rlx.DevicePolicy(device="a"),
    rlx.DevicePolicy(strict=True),
], ids=["prefer", "default-device", "strict"])
def test_measuring_never_overrides_the_policy(policy: rlx.DevicePolicy) -> None:
    clock = Clock()
    _, b, reg = devices(clock)
    gd = session(reg, clock, policy)
    for _ in range(TRIAL_RUNS):
        gd.run(X)
    assert gd.last_device == "a" and b.runs == 0
    gd.run(X, device="a")  # an explicit device runs there, measured or not
    assert rlx.compile(mlp(), policy=policy, registry=reg).device == "a"
    if not policy.strict:  # (strict with pick="measure" is asked for: the next test)
        assert rlx.compile(mlp(), policy=replace(policy, pick="measure"), registry=reg).device == "a"
    assert b.runs == 0 and b.compiles == 0


def test_strict_does_not_take_a_cached_verdict() -> None:
    clock = Clock()
    _, _, reg = devices(clock)
    gd = session(reg, clock)
    for _ in range(TRIAL_RUNS):
        gd.run(X)
    model = {r.device: r.model_seconds for r in Placement(mlp(), rlx.DevicePolicy(), reg).candidates()}
    for device in ("a", "b"):  # as measured by their models: the cost ranking's own order again
        for _ in range(3):
            PredictionErrors(reg).record(device, model[device], model[device])  # type: ignore[arg-type]
    assert rlx.compile(mlp(), registry=reg).device == "b"  # the cached verdict
    cg = rlx.compile(mlp(), policy=rlx.DevicePolicy(strict=True), registry=reg)
    assert cg.device == "a" and cg.report().measurement is None
    assert "under strict only DevicePolicy(pick='measure') measures" in cg.report().reason


def test_strict_measures_only_when_asked_and_a_failure_is_an_error() -> None:
    strict = rlx.DevicePolicy(strict=True, pick="measure")
    _, _, broken = devices(Clock(), fail_run=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no FallbackWarning: an error
        with pytest.raises(rlx.DeviceError, match=r"device b failed while running for the measured pick.*strict"):
            rlx.compile(mlp(), policy=strict, registry=broken)
    clock = Clock()
    _, _, reg = devices(clock)
    cg = rlx.compile(mlp(), policy=strict, registry=reg, measure=MeasureSettings(clock=clock))
    assert cg.device == "b" and cg.report().measurement is not None  # asked for: measured under strict too


def test_explicit_device_compile_is_never_measured() -> None:
    clock = Clock()
    a, b, reg = devices(clock)
    cg = rlx.compile(mlp(), "a", rlx.DevicePolicy(pick="measure"), registry=reg)
    assert cg.device == "a" and b.compiles == 0 and a.runs == 0


# ------------------------------------------------------------------ failures while measuring
def test_a_device_that_fails_while_measured_is_dropped_and_the_other_kept() -> None:
    clock = Clock()
    _, b, reg = devices(clock, fail_run=True)
    gd = session(reg, clock)
    with pytest.warns(rlx.FallbackWarning, match=r"device b failed while the auto pick .* measured .*b exploded"):
        out = gd.run(X)  # a's warm-up
        out = gd.run(X)  # b's warm-up fails: this call runs on a instead
    np.testing.assert_allclose(out[0], expected(mlp()), rtol=1e-5, atol=1e-6)
    assert gd.last_device == "a"
    for _ in range(3):
        gd.run(X)
    assert gd.last_device == "a" and b.runs == 1
    assert "b failed while measured" in (gd.pick_reason or "")
    assert verdict_files() == []  # a verdict with a failure in it is not cached


def test_a_device_that_fails_to_compile_for_pick_measure_is_dropped() -> None:
    clock = Clock()
    _, _, reg = devices(clock, fail_compile=True)
    with pytest.warns(rlx.FallbackWarning, match=r"device b failed while compiling for the measured pick"):
        cg = rlx.compile(mlp(), policy=rlx.DevicePolicy(pick="measure"), registry=reg,
                         measure=MeasureSettings(clock=clock))
    assert cg.device == "a"
    np.testing.assert_allclose(cg.run(X)[0], expected(mlp()), rtol=1e-5, atol=1e-6)


def test_when_every_measured_candidate_fails_compile_falls_back_to_the_rest() -> None:
    clock = Clock()
    reg = rlx.Registry(entry_points=[], environ={})
    for name, gflops in (("a", 1000), ("b", 500), ("c", 1)):
        reg.register(Timed(name, clock, 1e-3, gflops=gflops, fail_compile=name != "c"))
    with pytest.warns(rlx.FallbackWarning) as warned:
        cg = rlx.compile(mlp(), policy=rlx.DevicePolicy(pick="measure"), registry=reg)
    assert sorted(str(w.message).split()[2] for w in warned) == ["a", "b"]
    assert cg.device == "c" and "fell back after: a: " in "; ".join(cg.report().notes)
    assert verdict_files() == []


def test_trial_schedule() -> None:
    trial = Trial(["a", "b", "c"], runs=2)
    seen = []
    while (d := trial.next_device()) is not None:
        seen.append(d)
        trial.record(d, {"a": 3.0, "b": 1.0, "c": 2.0}[d])
        if len(seen) == 4:
            trial.drop("c", "boom")
    assert seen == ["a", "b", "c", "a", "b", "b", "a"]
    assert trial.winner() == "b" and trial.medians() == {"a": 3.0, "b": 1.0}
    with pytest.raises(ValueError, match="out of turn"):
        Trial(["a", "b"], 1).record("b", 1.0)
    with pytest.raises(rlx.ConfigError, match="margin"):
        MeasureSettings(margin=0.5)
    assert math.isinf(MeasureSettings(error_limit=math.inf).error_limit)


# ------------------------------------------------------------------ real devices
def test_cpu_and_jax_measure_a_tiny_graph(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The real thing on this host: whichever wins, the answer is right and the report says
    it was measured. The margin makes any two estimates unsure."""
    if "jax" not in rlx.available_devices():
        pytest.skip("jax is not available here")
    g = mlp()
    policy = rlx.DevicePolicy.only(["cpu", "jax"])
    wide = MeasureSettings(margin=1e9)
    gd = rlx.GraphDevices(g, policy, measure=wide)
    for _ in range(TRIAL_RUNS + 2):
        np.testing.assert_allclose(gd.run(X)[0], expected(g), rtol=1e-5, atol=1e-6)
    assert gd.last_device in ("cpu", "jax") and "measured the unsure pick" in (gd.pick_reason or "")
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "fresh"))  # no verdict: measure again at compile
    cg = rlx.compile(g, policy=replace(policy, pick="measure"), measure=wide)
    assert cg.report().measurement is not None and set(cg.report().measurement.seconds) == {"cpu", "jax"}
    np.testing.assert_allclose(cg.run(X)[0], expected(g), rtol=1e-5, atol=1e-6)
