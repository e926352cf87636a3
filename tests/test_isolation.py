"""A driver or kernel fault never takes the user's process down (issue 18).

Probes and calibration of entry-point backends run in a child process: the fake plugin
``rlxfake_crash`` kills its own process with SIGSEGV in its probe, or in a kernel that a
calibration compiles, or hangs, exactly where PoCL did on AMD hosts. Each time this
process goes on, the device is unusable with a one-line reason naming the signal and
the step, and ``rlx devices``, ``rlx calibrate`` and ``rlx run`` keep working.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import CRASH_PLUGIN, FakeSite
from test_cli import run_rlx

import rlx_core as rlx
from rlx_core.errors import ConfigError, DeviceError, PluginError, PluginWarning
from rlx_core.faults import FaultLog
from rlx_core.isolation import describe_exit, isolation_enabled
from rlx_core.registry import Registry

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="signals are POSIX")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def crash_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    """The crashing fake plugin installed on ``sys.path``, a private cache, no crash yet."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    site = FakeSite(site_dir, CRASH_PLUGIN)
    monkeypatch.syspath_prepend(str(site_dir))
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RLXFAKE_CRASH", raising=False)
    monkeypatch.delenv("RLX_ISOLATION", raising=False)
    import importlib

    importlib.invalidate_caches()
    try:
        yield site
    finally:
        sys.modules.pop("rlxfake_crash", None)


def crash_registry(site: FakeSite, **environ: str) -> Registry:
    return Registry(entry_points=site.entry_points("fakecrash"), environ={**os.environ, **environ})


def cli_env(site: FakeSite, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site.path), str(REPO)]), "RLX_CACHE_DIR": str(tmp_path / "cache"),
            **extra}  # fmt: skip


# -- the switch ----------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [("", True), ("1", True), (" 0 ", False)])
def test_isolation_switch(value: str, expected: bool) -> None:
    assert isolation_enabled({"RLX_ISOLATION": value}) is expected


@pytest.mark.parametrize("value", ["yes", "2", "off"])
def test_malformed_isolation_switch_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match=f"RLX_ISOLATION: '{value}'"):
        isolation_enabled({"RLX_ISOLATION": value})


def test_describe_exit() -> None:
    assert describe_exit(-11) == "died with SIGSEGV (Segmentation fault)"
    assert describe_exit(3) == "exited with status 3"


# -- probes --------------------------------------------------------------------------


def test_probe_runs_in_a_child_process_unless_isolation_is_off(crash_site: FakeSite) -> None:
    child = crash_registry(crash_site).availability("fakecrash")
    assert child.available and child.reason != f"pid {os.getpid()}"
    here = crash_registry(crash_site, RLX_ISOLATION="0").availability("fakecrash")
    assert here.available and here.reason == f"pid {os.getpid()}"


def test_directly_registered_backends_probe_in_this_process(crash_site: FakeSite) -> None:
    import rlxfake_crash

    registry = Registry(entry_points=[])
    registry.register(rlxfake_crash.CrashingBackend())
    assert registry.availability("fakecrash").reason == f"pid {os.getpid()}"


def test_probe_that_segfaults_costs_its_device_not_this_process(crash_site: FakeSite,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("RLXFAKE_CRASH", "probe")
    registry = crash_registry(crash_site)
    with pytest.warns(PluginWarning, match="fakecrash"):
        answer = registry.availability("fakecrash")
    assert not answer.available
    assert answer.reason == "probe died with SIGSEGV (Segmentation fault) in its child process"
    assert registry.broken() == [("fakecrash", "rlxfake-fakecrash 1.0: backend 'fakecrash' probe died with SIGSEGV "
                                                "(Segmentation fault) in its child process")]  # fmt: skip
    with pytest.raises(DeviceError, match="probe died with SIGSEGV"):
        _compile_on(registry)


def test_probe_that_exits_names_the_status(crash_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLXFAKE_CRASH", "exit")
    with pytest.warns(PluginWarning):
        answer = crash_registry(crash_site).availability("fakecrash")
    assert answer.reason == "probe exited with status 3 in its child process"


def test_a_childs_stderr_stays_out_of_the_terminal(crash_site: FakeSite, capfd: pytest.CaptureFixture[str]) -> None:
    assert crash_registry(crash_site).availability("fakecrash").available
    assert "warnings generated" not in capfd.readouterr().err


def test_probe_child_leaves_when_its_parent_exits(crash_site: FakeSite, tmp_path: Path) -> None:
    """A probe that hangs forever in a parent that exits: the child goes too."""
    script = textwrap.dedent("""
        import importlib.metadata, os, sys
        from rlx_core.registry import Registry
        eps = [ep for ep in importlib.metadata.entry_points(group="rlx.backends") if ep.name == "fakecrash"]
        registry = Registry(entry_points=eps, environ={**os.environ, "RLX_PROBE_TIMEOUT": "30"})
        import threading
        threading.Thread(target=registry.availability, args=("fakecrash",), daemon=True).start()
        import time
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.02)
        print("started", flush=True)
    """)
    pid_file = tmp_path / "child.pid"
    plugin = crash_site.path / "rlxfake_crash.py"
    source = plugin.read_text(encoding="utf-8")
    plugin.write_text(source.replace('        os.write(2, b"17 warnings generated.\\n")',
                                     f'        open({str(pid_file)!r}, "w").write(str(os.getpid()))\n'
                                     '        threading.Event().wait()'), encoding="utf-8")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(crash_site.path), str(REPO)])}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", script, str(pid_file)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0 and "started" in proc.stdout, proc.stderr
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), f"the probe's child {child} outlived its parent"


# -- calibration ---------------------------------------------------------------------


def test_calibration_that_segfaults_marks_the_device_unusable_until_it_passes(
        crash_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    registry = crash_registry(crash_site)
    assert registry.availability("fakecrash").available
    monkeypatch.setenv("RLXFAKE_CRASH", "calibrate")
    steps: list[str] = []
    with pytest.raises(DeviceError) as info:
        registry.calibrate("fakecrash", quick=True, progress=lambda step, frac: steps.append(step))
    message = str(info.value)
    assert "died with SIGSEGV (Segmentation fault)" in message and "'sgemm 256x256x256'" in message, message
    assert "sgemm 64x64x64" in steps
    fault = registry.fault("fakecrash")
    assert fault is not None and (fault.task, fault.step) == ("calibration", "sgemm 256x256x256")
    # this process and the next one (a fresh registry) know, without crashing first
    for reg in (registry, crash_registry(crash_site)):
        answer = reg.availability("fakecrash")
        assert not answer.available and answer.reason.startswith(
            "calibration died with SIGSEGV (Segmentation fault) at step 'sgemm 256x256x256'"), answer.reason
        assert "rlx calibrate fakecrash" in answer.reason
    # the retry passes: the fault is gone and the device is back
    monkeypatch.delenv("RLXFAKE_CRASH")
    model = registry.calibrate("fakecrash", quick=True)
    assert model.calibrated and registry.fault("fakecrash") is None
    assert registry.availability("fakecrash").available
    assert registry.cost_model("fakecrash").calibrated


def test_calibration_that_hangs_is_killed_at_its_timeout(crash_site: FakeSite,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("RLXFAKE_CRASH", "hang")
    registry = crash_registry(crash_site, RLX_CALIBRATE_TIMEOUT="0.5")
    start = time.monotonic()
    with pytest.raises(DeviceError, match=r"did not finish within 0.5 s \(RLX_CALIBRATE_TIMEOUT\)"):
        registry.calibrate("fakecrash", quick=True)
    assert time.monotonic() - start < 30
    assert "did not finish" in registry.fault("fakecrash").what  # type: ignore[union-attr]


def test_calibration_that_raises_is_an_error_not_a_fault(crash_site: FakeSite,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("RLXFAKE_CRASH", "raise")
    registry = crash_registry(crash_site)
    with pytest.raises(PluginError, match="calibrate raised ValueError: the fake device is on fire"):
        registry.calibrate("fakecrash", quick=True)
    assert registry.fault("fakecrash") is None and registry.availability("fakecrash").available


def test_malformed_calibrate_timeout_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="RLX_CALIBRATE_TIMEOUT: 'soon'"):
        Registry(entry_points=[], environ={"RLX_CALIBRATE_TIMEOUT": "soon"}).calibrate_timeout()


def test_a_fault_from_another_plugin_version_is_ignored(crash_site: FakeSite) -> None:
    FaultLog().record("fakecrash", "calibration", "died with SIGSEGV (Segmentation fault)", "x", "0.9")
    assert crash_registry(crash_site).fault("fakecrash") is None
    FaultLog().record("fakecrash", "calibration", "died with SIGSEGV (Segmentation fault)", "x", "1.0")
    assert crash_registry(crash_site).fault("fakecrash") is not None


# -- the CLI goes on -----------------------------------------------------------------


def test_cli_survives_a_probe_that_segfaults(crash_site: FakeSite, tmp_path: Path) -> None:
    env = cli_env(crash_site, tmp_path, RLXFAKE_CRASH="probe")
    proc = run_rlx("devices", "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    row = next(d for d in json.loads(proc.stdout)["devices"] if d["device"] == "fakecrash")
    assert not row["available"] and row["reason"] == "probe died with SIGSEGV (Segmentation fault) in its child process"
    assert "warnings generated" not in proc.stderr
    proc = run_rlx("run", "--example", "mlp", cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "device: cpu" in proc.stdout, proc.stderr


def test_cli_calibrate_survives_a_crash_and_devices_says_why(crash_site: FakeSite, tmp_path: Path) -> None:
    env = cli_env(crash_site, tmp_path, RLXFAKE_CRASH="calibrate")
    proc = run_rlx("calibrate", "fakecrash", "cpu", "--quick", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "fakecrash: calibration died with SIGSEGV" in proc.stdout + proc.stderr
    assert "Calibrated cost models" in proc.stdout and "cpu" in proc.stdout  # the other device was calibrated
    proc = run_rlx("devices", "--json", cwd=tmp_path, env=env)
    row = next(d for d in json.loads(proc.stdout)["devices"] if d["device"] == "fakecrash")
    assert not row["available"] and "at step 'sgemm 256x256x256'" in row["reason"]
    proc = run_rlx("run", "--example", "mlp", cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "device: cpu" in proc.stdout, proc.stderr
    del env["RLXFAKE_CRASH"]
    proc = run_rlx("calibrate", "fakecrash", "--quick", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    proc = run_rlx("devices", "--json", cwd=tmp_path, env=env)
    assert next(d for d in json.loads(proc.stdout)["devices"] if d["device"] == "fakecrash")["available"]


# -- helpers -------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for every purpose but the process table
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return True


def _add_graph() -> rlx.Graph:
    g = rlx.Graph("add")
    x = g.input("x", (2,), "float32")
    g.set_outputs([g.add(x, x)])
    return g


def _compile_on(registry: Registry) -> None:
    from rlx_core import registry as registry_module

    saved = registry_module._default
    registry_module.set_default_registry(registry)
    try:
        rlx.compile(_add_graph(), device="fakecrash").run({"x": np.ones(2, np.float32)})
    finally:
        registry_module.set_default_registry(saved)


def test_children_know_they_are_children() -> None:
    """A backend's code can tell it runs in rlx's child (``in_isolation_child``): the
    child's environment says so, with isolation off (no grandchildren)."""
    from rlx_core.isolation import CHILD_ENV, ISOLATION_ENV, child_env, in_isolation_child

    env = child_env({"RLX_PROBE_TIMEOUT": "3"})
    assert env[CHILD_ENV] == "1" and env[ISOLATION_ENV] == "0" and env["RLX_PROBE_TIMEOUT"] == "3"
    assert not in_isolation_child()  # the test process itself is no child


def test_the_parent_backend_is_told_what_the_child_probe_found(fake_site) -> None:
    """``Backend.probed``: what a probe learns in its child reaches the parent's backend
    (the jax platform, a GPU's properties); an in-process probe needs no telling."""
    from rlx_core.registry import Registry

    isolated = Registry(entry_points=fake_site.entry_points("fakenp"), environ={"RLX_PROBE_TIMEOUT": "30"})
    answer = isolated.availability("fakenp")
    assert answer.available and isolated.info("fakenp").backend.told == answer
    here = Registry(entry_points=fake_site.entry_points("fakenp"), environ={"RLX_ISOLATION": "0"})
    assert here.availability("fakenp").available and not hasattr(here.info("fakenp").backend, "told")
