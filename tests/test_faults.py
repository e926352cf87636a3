"""Faults the caller did not make: misbehaving plugins, unwritable or contended caches,
and many threads at once. Each is survived: reported, fallen back from (or raised under
strict mode, exactly as ARCHITECTURE.md says), never a wrong answer or a dead host.

Discovery-time faults (import errors, raising or hanging probes, API versions,
``RLX_DISABLE_PLUGINS``) are covered by ``test_registry.py``; this module covers what
happens after a backend has been accepted.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from support import RefExecutable, ToyBackend, mlp, registry_with

import rlx_core as rlx
from rlx_core import reference
from rlx_core.calibration import CALIBRATION_SCHEMA, cached_cost_model, calibrate_backend
from rlx_core.errors import CacheWarning

X = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)


def expected(g: rlx.Graph, x: np.ndarray = X) -> np.ndarray:
    return reference.evaluate(g, {"x": x})[0]


class FailsOnOp(ToyBackend):
    """Claims every op, then fails on graphs holding ``op``: at compile or at run."""

    def __init__(self, name: str, op: str, when: str, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.op, self.when = op, when

    def compile(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable:
        has_op = any(n.op == self.op for n in graph.nodes)
        if has_op and self.when == "compile":
            raise NotImplementedError(f"{self.name} has no kernel for {self.op} after all")
        exe = super().compile(graph, options)
        if has_op and self.when == "run":
            return _Crashing(graph, self)
        return exe


class _Crashing(RefExecutable):
    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        raise FloatingPointError(f"{self.owner.name}: {self.owner.op} kernel crashed")


class Exits(ToyBackend):
    """A hostile backend whose executable calls ``sys.exit`` while running."""

    def compile(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable:
        return _Exiting(graph, self)


class _Exiting(RefExecutable):
    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        raise SystemExit(3)


# ---------------------------------------------------------------------------- plugin faults
@pytest.mark.parametrize("when", ["compile", "run"])
def test_claimed_op_that_fails_to_compile(when: str) -> None:
    """A backend claims softmax, then fails on it: the ranked fallback takes over with one
    warning naming it; an explicit device or a strict policy raises naming it instead."""
    liar = FailsOnOp("liar", "softmax", when, gflops=1000, priority=50)
    reg = registry_with(liar, ToyBackend("good", gflops=1))
    with pytest.warns(rlx.FallbackWarning, match=r"liar.*softmax") as rec:
        dev, outs = rlx.run_with_fallback(mlp(), {"x": X}, policy=rlx.DevicePolicy(), registry=reg)
    assert dev == "good" and len([w for w in rec if w.category is rlx.FallbackWarning]) == 1
    np.testing.assert_allclose(outs[0], expected(mlp()), rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: an explicit device never moves
        with pytest.raises(rlx.DeviceError, match="liar") as info:
            rlx.compile(mlp(), device="liar", policy=rlx.DevicePolicy(), registry=reg).run({"x": X})
        assert "softmax" in str(info.value) and info.value.__cause__ is not None
        with pytest.raises(rlx.DeviceError, match=r"liar.*RLX_STRICT"):
            rlx.run_with_fallback(mlp(), {"x": X}, policy=rlx.DevicePolicy(strict=True), registry=reg)
    if when == "compile":  # compile(device="auto") falls back at compile time too
        with pytest.warns(rlx.FallbackWarning, match="liar"):
            cg = rlx.compile(mlp(), policy=rlx.DevicePolicy(), registry=reg)
        assert cg.device == "good" and "liar" in " ".join(cg.report().notes)


@pytest.mark.parametrize("wrong", ["shape", "dtype", "count"])
def test_wrong_outputs_fall_back_or_raise_under_strict(wrong: str) -> None:
    """Outputs of the wrong shape, dtype or count never reach the caller as an answer."""
    reg = registry_with(ToyBackend("liar", wrong_output=wrong, gflops=1000, priority=50), ToyBackend("good"))
    with pytest.warns(rlx.FallbackWarning, match=r"liar.*PluginError"):
        dev, outs = rlx.run_with_fallback(mlp(), {"x": X}, policy=rlx.DevicePolicy(), registry=reg)
    assert dev == "good"
    np.testing.assert_allclose(outs[0], expected(mlp()), rtol=1e-5, atol=1e-6)
    with pytest.raises(rlx.DeviceError, match="liar") as info:
        rlx.run_with_fallback(mlp(), {"x": X}, policy=rlx.DevicePolicy(strict=True), registry=reg)
    assert isinstance(info.value.__cause__, rlx.PluginError)


def test_crash_in_run_falls_back_or_raises_under_strict_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RLX_STRICT=1`` read from the environment (policy=None) turns the fallback off."""
    reg = registry_with(ToyBackend("crashy", fail_run=True, gflops=1000, priority=50), ToyBackend("good"))
    monkeypatch.delenv("RLX_STRICT", raising=False)
    with pytest.warns(rlx.FallbackWarning, match=r"crashy.*exploded"):
        assert rlx.run_with_fallback(mlp(), {"x": X}, registry=reg)[0] == "good"
    monkeypatch.setenv("RLX_STRICT", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(rlx.DeviceError, match=r"crashy failed \(RLX_STRICT: no fallback\)") as info:
            rlx.run_with_fallback(mlp(), {"x": X}, registry=reg)
    assert "exploded" in str(info.value.__cause__)


def test_a_plugin_calling_sys_exit_in_run_does_not_end_the_host() -> None:
    reg = registry_with(Exits("exits", gflops=1000, priority=50), ToyBackend("good"))
    with pytest.warns(rlx.FallbackWarning, match="exits"):
        assert rlx.run_with_fallback(mlp(), {"x": X}, policy=rlx.DevicePolicy(), registry=reg)[0] == "good"


# ---------------------------------------------------------------------------- caches
class _Instant(rlx.Executable):
    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return []


class InstantBackend(ToyBackend):
    """Compiles to an executable that does nothing: calibrating it costs microseconds,
    so eight processes spend their time in the cache, not in arithmetic."""

    def compile(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable:
        return _Instant()


def _calibrate_into(root: str) -> None:
    """Subprocess body: a quick calibration into the cache at ``root``."""
    os.environ["RLX_CACHE_DIR"] = root
    calibrate_backend(InstantBackend("toycal"), quick=True)


@pytest.mark.slow
def test_eight_processes_calibrating_at_once_leave_a_valid_cache(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = multiprocessing.get_context("spawn")  # no fork: this process has probe threads
    procs = [ctx.Process(target=_calibrate_into, args=(str(tmp_path),)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 8
    folder = tmp_path / "calibration"
    assert sorted(p.name for p in folder.iterdir()) == ["CACHEDIR.TAG", "toycal.json"]  # no temp file left
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
        model = cached_cost_model(InstantBackend("toycal"))
    assert model is not None and model.calibrated and model.sgemm_gflops > 0
    assert f'"schema": {CALIBRATION_SCHEMA}' in (folder / "toycal.json").read_text()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user (root ignores modes)")
def test_read_only_cache_dir_warns_and_calibration_still_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    (root / "calibration").mkdir(parents=True)
    for d in (root / "calibration", root):
        d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    monkeypatch.setenv("RLX_CACHE_DIR", str(root))
    try:
        with pytest.warns(CacheWarning, match="could not write"):
            model = calibrate_backend(ToyBackend("toycal"), quick=True)
        assert model.calibrated
        assert cached_cost_model(ToyBackend("toycal")) is None  # nothing cached: recomputed next time
    finally:
        for d in (root, root / "calibration"):
            d.chmod(stat.S_IRWXU)


@pytest.mark.slow
def test_unwritable_cache_simulated_for_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same fault where permissions cannot be taken away (root, CI containers):
    every write is refused with EACCES."""
    import tempfile

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(kwargs.get("dir", "")))

    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.warns(CacheWarning, match=r"could not write .*PermissionError"):
        model = calibrate_backend(ToyBackend("toycal"), quick=True)
    assert model.calibrated and not any(tmp_path.rglob("*.json"))


# ---------------------------------------------------------------------------- threads
def _thread_devices() -> list[str]:
    return [d for d in rlx.available_devices() if d in ("cpu", "jax")] or ["cpu"]


@pytest.mark.parametrize("device", _thread_devices())
def test_eight_threads_share_one_compiled_graph(device: str) -> None:
    g = mlp(batch=16)
    cg = rlx.compile(g, device=device, policy=rlx.DevicePolicy())
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((16, 8)).astype(np.float32) for _ in range(8)]
    want = [expected(g, x) for x in xs]
    barrier = threading.Barrier(8)
    errors: list[str] = []

    def worker(k: int) -> None:
        barrier.wait()
        for i in range(40):
            j = (k + i) % 8
            got = cg.run({"x": xs[j]})[0]
            if not np.allclose(got, want[j], rtol=1e-4, atol=1e-5):
                errors.append(f"thread {k} run {i}: wrong result for input {j}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and not any(t.is_alive() for t in threads)


def test_graph_devices_under_threads() -> None:
    """Threads running on, compiling for and benchmarking one GraphDevices at once: each
    device is compiled once, every result is right, one benchmark winner."""
    a, b = ToyBackend("a", gflops=1), ToyBackend("b", gflops=50)
    gd = rlx.GraphDevices(mlp(), rlx.DevicePolicy(benchmark_runs=1), registry=registry_with(a, b))
    want = expected(mlp())
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []
    winners: set[str] = set()

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for i in range(10):
                dev = ("a", "b", None)[(k + i) % 3]
                np.testing.assert_allclose(gd.run({"x": X}, device=dev)[0], want, rtol=1e-5, atol=1e-6)
            winners.add(gd.resolve_with_inputs({"x": X}))
            np.testing.assert_allclose(gd.run_fastest({"x": X})[0], want, rtol=1e-5, atol=1e-6)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert a.compiles == 1 and b.compiles == 1
    assert len(winners) == 1
