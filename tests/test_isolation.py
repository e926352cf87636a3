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
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import CRASH_PLUGIN, FAKE_PLUGINS_DIR, IMPORT_FAULT_PLUGINS, FakeSite
from support import broken_error
from test_cli import rlx_environment, run_rlx_process

import rlx_core as rlx
from rlx_core.backends.faults import FaultLog
from rlx_core.backends.isolation import describe_exit, isolation_enabled
from rlx_core.backends.registry import Registry
from rlx_core.errors import ConfigError, DeviceError, PluginError, PluginWarning

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
            **extra}


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_probe_that_segfaults_costs_its_device_not_this_process(crash_site: FakeSite,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLXFAKE_CRASH", "probe")
    registry = crash_registry(crash_site)
    with pytest.warns(PluginWarning, match="fakecrash"):
        answer = registry.availability("fakecrash")
    assert not answer.available
    assert answer.reason == "probe died with SIGSEGV (Segmentation fault) in its child process"
    assert registry.broken() == [("fakecrash", "rlxfake-fakecrash 1.0: backend 'fakecrash' probe died with SIGSEGV "
                                                "(Segmentation fault) in its child process")]
    with pytest.raises(DeviceError, match="probe died with SIGSEGV"):
        _compile_on(registry)


@pytest.mark.slow
def test_probe_that_exits_names_the_status(crash_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLXFAKE_CRASH", "exit")
    with pytest.warns(PluginWarning):
        answer = crash_registry(crash_site).availability("fakecrash")
    assert answer.reason == "probe exited with status 3 in its child process"


@pytest.mark.slow
def test_a_childs_stderr_stays_out_of_the_terminal(crash_site: FakeSite, capfd: pytest.CaptureFixture[str]) -> None:
    assert crash_registry(crash_site).availability("fakecrash").available
    assert "warnings generated" not in capfd.readouterr().err


@pytest.mark.slow
def test_probe_child_leaves_when_its_parent_exits(crash_site: FakeSite, tmp_path: Path) -> None:
    """A probe that hangs forever in a parent that exits: the child goes too."""
    script = textwrap.dedent("""
        import importlib.metadata, os, sys
        from rlx_core.backends.registry import Registry
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
                                     '        threading.Event().wait()'), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(crash_site.path), str(REPO)])}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", script, str(pid_file)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "started" in proc.stdout, proc.stderr
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 60  # it leaves at once; a loaded host may take a while to say so
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), f"the probe's child {child} outlived its parent"


# -- calibration ---------------------------------------------------------------------


@pytest.mark.slow
def test_calibration_that_segfaults_marks_the_device_unusable_until_it_passes(
        crash_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> None:
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


@pytest.mark.slow
def test_calibration_that_hangs_is_killed_at_its_timeout(crash_site: FakeSite,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLXFAKE_CRASH", "hang")
    registry = crash_registry(crash_site, RLX_CALIBRATE_TIMEOUT="0.5")
    with pytest.raises(DeviceError, match=r"did not finish within 0.5 s \(RLX_CALIBRATE_TIMEOUT\)"):
        registry.calibrate("fakecrash", quick=True)  # a child not killed at its timeout would hang the test
    assert "did not finish" in registry.fault("fakecrash").what  # type: ignore[union-attr]


@pytest.mark.slow
def test_calibration_that_raises_is_an_error_not_a_fault(crash_site: FakeSite,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
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


@pytest.mark.slow
def test_cli_survives_a_probe_that_segfaults(crash_site: FakeSite, tmp_path: Path) -> None:
    env = cli_env(crash_site, tmp_path, RLXFAKE_CRASH="probe")
    proc = run_rlx_process("devices", "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    row = next(d for d in json.loads(proc.stdout)["devices"] if d["device"] == "fakecrash")
    assert not row["available"] and row["reason"] == "probe died with SIGSEGV (Segmentation fault) in its child process"
    assert "warnings generated" not in proc.stderr
    proc = run_rlx_process("run", "--example", "mlp", cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "device: cpu" in proc.stdout, proc.stderr


@pytest.mark.slow
def test_cli_calibrate_survives_a_crash_and_devices_says_why(crash_site: FakeSite, tmp_path: Path) -> None:
    env = cli_env(crash_site, tmp_path, RLXFAKE_CRASH="calibrate")
    proc = run_rlx_process("calibrate", "fakecrash", "cpu", "--quick", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "fakecrash: calibration died with SIGSEGV" in proc.stdout + proc.stderr
    assert "Calibrated cost models" in proc.stdout and "cpu" in proc.stdout  # the other device was calibrated
    proc = run_rlx_process("devices", "--json", cwd=tmp_path, env=env)
    row = next(d for d in json.loads(proc.stdout)["devices"] if d["device"] == "fakecrash")
    assert not row["available"] and "at step 'sgemm 256x256x256'" in row["reason"]
    proc = run_rlx_process("run", "--example", "mlp", cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "device: cpu" in proc.stdout, proc.stderr
    del env["RLXFAKE_CRASH"]
    proc = run_rlx_process("calibrate", "fakecrash", "--quick", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    proc = run_rlx_process("devices", "--json", cwd=tmp_path, env=env)
    assert next(d for d in json.loads(proc.stdout)["devices"] if d["device"] == "fakecrash")["available"]


# -- children never import from the working directory (issue 31) --------------------


@pytest.fixture
def hostile_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory is an unpacked model folder whose ``numpy.py``, ``rlx_core.py``
    and plugin-named modules write a marker and exit when imported; returns the marker."""
    folder, marker = tmp_path / "model", tmp_path / "imported-from-cwd.txt"
    folder.mkdir()
    for module in ("numpy", "rlx_core", "pluggy", "rlxfake_crash", "rlxfake_good"):
        (folder / f"{module}.py").write_text(f"import os\nopen({str(marker)!r}, 'a').write({module!r} + '\\n')\n"
                                             "os._exit(7)\n", encoding="utf-8")
    # the control: a plain `python -m` there runs them (so the test below can fail)
    plain = subprocess.run([sys.executable, "-m", "rlx_core.backends._isolated_child"], cwd=folder, input="",
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 7 and marker.read_text().split() == ["rlx_core"], plain.stderr
    marker.unlink()
    monkeypatch.chdir(folder)
    return marker


@pytest.mark.slow
@pytest.mark.parametrize("safe_path_flag", [True, False], ids=["-P", "python3.10-empty-cwd"])
def test_children_never_import_from_the_working_directory(crash_site: FakeSite, hostile_cwd: Path,
                                                          monkeypatch: pytest.MonkeyPatch, safe_path_flag: bool,
                                                          children: list[str]) -> None:
    """Import check, probe, calibration and bench worker, with ``-P`` (3.11+) and, as on
    Python 3.10 (no ``-P``), in a private empty directory instead."""
    from rlx_core.backends import isolation
    from rlx_core.cli.bench_worker import WorkerPool

    monkeypatch.setattr(isolation, "SAFE_PATH_FLAG", safe_path_flag)
    assert ("-P" in isolation.child_command("m")) is safe_path_flag
    assert (isolation.child_cwd() is None) is safe_path_flag
    registry = crash_registry(crash_site)
    answer = registry.availability("fakecrash")  # the plugin's import check, then its probe
    assert answer.available and answer.reason != f"pid {os.getpid()}", answer
    assert registry.calibrate("fakecrash", quick=True).calibrated
    with WorkerPool(_add_graph(), {"x": np.ones(2, np.float32)}) as pool:
        row = pool.numpy()
        assert row.block is not None, row.note
        assert row.block(2) > 0
    assert children == ["import", "task", "task", "bench"]
    assert not hostile_cwd.exists(), hostile_cwd.read_text()


@pytest.mark.slow
def test_the_rlx_command_never_imports_from_the_working_directory(hostile_cwd: Path, tmp_path: Path) -> None:
    """The console script puts its own directory on ``sys.path``, not the cwd (``python
    -m rlx_core`` would, as every ``python -m`` does): ``rlx devices`` there is safe."""
    command = Path(sys.executable).with_name("rlx")
    if not command.exists():
        pytest.skip("the rlx console script is not installed beside this interpreter")
    proc = subprocess.run([str(command), "devices", "--json"], env=rlx_environment(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["devices"] and not hostile_cwd.exists()


def test_child_env_leaves_the_working_directory_off_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``python -m rlx_core`` or ``python -c`` put the cwd (``''`` or its path), the
    child's ``PYTHONPATH`` leaves it out; the parent's other entries (installed
    distributions, ``PYTHONPATH``) stay, and a cwd the user named in ``PYTHONPATH`` too."""
    from rlx_core.backends.isolation import child_env

    here, site = tmp_path / "here", tmp_path / "site"
    here.mkdir()
    site.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "path", ["", str(here), str(site), *sys.path])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    passed = child_env(os.environ)["PYTHONPATH"].split(os.pathsep)
    assert str(here) not in passed and "" not in passed and passed[0] == str(site)
    assert all(os.path.isabs(p) for p in passed)
    monkeypatch.setenv("PYTHONPATH", str(here))
    assert str(here) in child_env(os.environ)["PYTHONPATH"].split(os.pathsep)


# -- plugin imports cannot take rlx down; reserved names (issue 31) -------------------


@pytest.fixture
def fault_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    """Plugins whose import segfaults or hangs, a third party's ``cpu``, and a good one,
    installed on ``sys.path``; isolation on, imports given a second each."""
    site_dir = tmp_path / "faults"
    site_dir.mkdir()
    site = FakeSite(site_dir, {**IMPORT_FAULT_PLUGINS, "fakenp": "rlxfake_good"})
    monkeypatch.syspath_prepend(str(site_dir))
    monkeypatch.delenv("RLX_ISOLATION", raising=False)
    import importlib

    importlib.invalidate_caches()
    try:
        yield site
    finally:
        for name in [m for m in sys.modules if m.startswith("rlxfake_")]:
            del sys.modules[name]


def fault_registry(site: FakeSite, *names: str, **environ: str) -> Registry:
    registry = Registry(entry_points=site.entry_points(*names), environ={"RLX_PROBE_TIMEOUT": "1", **environ})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)
        registry.names()
    return registry


@pytest.mark.slow
def test_a_plugin_whose_import_segfaults_is_broken_and_never_imported_here(fault_site: FakeSite,
                                                                            children: list[str]) -> None:
    registry = Registry(entry_points=fault_site.entry_points("fakeimportsegv", "fakenp"),
                        environ={"RLX_PROBE_TIMEOUT": "10"})
    with pytest.warns(PluginWarning, match="rlx plugin 'fakeimportsegv' is broken"):
        assert registry.names() == ["fakenp"]  # this process is alive to say so
    assert broken_error(registry, "fakeimportsegv") == (
        "rlxfake-fakeimportsegv 1.0: importing entry point 'fakeimportsegv' (rlxfake_importsegv) in a child process "
        "died with SIGSEGV (Segmentation fault); rlx will not import it until the plugin changes (or `rlx cache "
        "clear plugin-imports`)")
    assert "rlxfake_importsegv" not in sys.modules
    assert registry.availability("fakenp").available  # everything else works
    assert children == ["import", "import", "task"]  # the check went on in a fresh child after the crash


@pytest.mark.slow
def test_a_plugin_whose_import_hangs_is_broken_after_a_second_try(fault_site: FakeSite, children: list[str]) -> None:
    registry = fault_registry(fault_site, "fakenp", "fakeimporthang")
    assert registry.names() == ["fakenp"]
    error = broken_error(registry, "fakeimporthang")
    assert error.startswith("rlxfake-fakeimporthang 1.0: importing entry point 'fakeimporthang' (rlxfake_importhang) "
                            "in a child process did not finish within 1 s, twice (RLX_PROBE_TIMEOUT); "), error
    assert children == ["import", "import"]  # fakenp, then the hang; the hang alone again
    assert "rlxfake_importhang" not in sys.modules


@pytest.mark.slow
def test_import_verdicts_are_kept_until_the_plugin_changes(fault_site: FakeSite, children: list[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    first = fault_registry(fault_site, "fakeimportsegv", "fakenp")
    assert children == ["import", "import"]
    again = fault_registry(fault_site, "fakeimportsegv", "fakenp")  # a later command: no child, same verdict
    assert children == ["import", "import"] and again.broken() == first.broken() and again.names() == ["fakenp"]
    assert "rlxfake_importsegv" not in sys.modules
    # one of rlx's own children (a bench worker, say) checks nothing, but skips what is known bad
    monkeypatch.setenv("RLX_ISOLATION_CHILD", "1")
    inside = fault_registry(fault_site, "fakeimportsegv", "fakenp", RLX_ISOLATION="0")
    assert children == ["import", "import"] and inside.broken() == first.broken()
    monkeypatch.delenv("RLX_ISOLATION_CHILD")
    # the plugin is fixed (upgraded, edited): checked again, then imported here
    source = (FAKE_PLUGINS_DIR / "rlxfake_good.py").read_text(encoding="utf-8").replace('"fakenp"', '"fixed"')
    (fault_site.path / "rlxfake_importsegv.py").write_text(source, encoding="utf-8")
    fixed = fault_registry(fault_site, "fakeimportsegv", "fakenp")
    assert children == ["import", "import", "import"] and fixed.names() == ["fakenp", "fixed"]
    assert fixed.broken() == []


def test_isolation_off_imports_in_this_process_as_before(fault_site: FakeSite, children: list[str]) -> None:
    registry = fault_registry(fault_site, "fakenp", RLX_ISOLATION="0")
    assert registry.names() == ["fakenp"] and "rlxfake_good" in sys.modules
    assert children == []


@pytest.mark.parametrize("order", ["impostor first", "rlx-cpu first"])
def test_a_third_party_backend_named_cpu_never_takes_cpu_over(fault_site: FakeSite, children: list[str],
                                                               order: str) -> None:
    import importlib.metadata

    real = [ep for ep in importlib.metadata.entry_points(group="rlx.backends") if ep.name == "cpu"]
    if not real:
        pytest.skip("rlx-cpu is not installed")
    impostor = fault_site.entry_points("fakecpu")
    eps = impostor + real if order == "impostor first" else real + impostor
    registry = Registry(entry_points=eps, environ={"RLX_PROBE_TIMEOUT": "10"})
    with pytest.warns(PluginWarning, match="rlx plugin 'fakecpu' is broken"):
        assert registry.names() == ["cpu"]
    assert registry.info("cpu").distribution == "rlx-cpu"
    assert broken_error(registry, "fakecpu") == ("rlxfake-fakecpu 1.0: backend name 'cpu' is reserved for rlx's own "
                                                 "rlx-cpu; another distribution may not take it; not imported")
    assert "rlxfake_cpu" not in sys.modules  # its child said what its hook returns: nothing here to load
    # without isolation it is imported as before, and refused all the same
    here = fault_registry(fault_site, "fakecpu", RLX_ISOLATION="0")
    assert here.names() == [] and "rlxfake_cpu" in sys.modules
    assert broken_error(here, "fakecpu").endswith("rlx-cpu; another distribution may not take it")  # imported: no note
    assert here.not_installed()["cpu"] == "pip install rlx-cpu"  # the impostor does not stand for rlx-cpu


def test_reserved_names_bind_registered_backends_only_when_they_claim_a_distribution() -> None:
    class Cpu(rlx.Backend):
        name = "cpu"

    registry = Registry(entry_points=[])
    registry.register(Cpu())  # tests and loopback backends: no distribution, any name
    with pytest.raises(PluginError, match="backend name 'cpu' is reserved for rlx's own rlx-cpu"):
        Registry(entry_points=[]).register(Cpu(), distribution="someone-else", version="1")
    Registry(entry_points=[]).register(Cpu(), distribution="rlx_cpu", version="1")  # its own, however spelled


@pytest.mark.slow
def test_rlx_devices_survives_and_lists_every_fault_plugin(fault_site: FakeSite, tmp_path: Path) -> None:
    """``rlx devices --json`` as a user runs it, with the fault plugins installed: an
    import segfault, an import hang, a probe hang and a third party's ``cpu``."""
    FakeSite(fault_site.path, {"fakehang": "rlxfake_hang"})
    env = {"PYTHONPATH": str(fault_site.path), "RLX_PROBE_TIMEOUT": "1"}
    for _ in range(2):  # the second time from the verdicts kept on disk
        proc = run_rlx_process("devices", "--json", cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        broken = {b["name"]: b["error"] for b in doc["broken_plugins"]}
        assert "died with SIGSEGV (Segmentation fault)" in broken["fakeimportsegv"], broken
        assert "did not finish within 1 s, twice (RLX_PROBE_TIMEOUT)" in broken["fakeimporthang"], broken
        assert "reserved for rlx's own rlx-cpu" in broken["fakecpu"], broken
        rows = {r["device"]: r for r in doc["devices"]}
        assert rows["cpu"]["available"] and rows["cpu"]["distribution"] == "rlx-cpu"
        assert rows["fakenp"]["available"]
        assert not rows["fakehang"]["available"] and "did not answer within 1 s" in rows["fakehang"]["reason"]
    kept = {p.name.partition(".")[0] for p in (tmp_path / "cache" / "plugin-imports").glob("*.json")}
    assert {"rlxfake-fakeimportsegv", "rlxfake-fakeimporthang", "rlxfake-fakecpu", "rlx-cpu"} <= kept, kept


@pytest.mark.slow
def test_a_probe_that_crashed_is_not_kept_for_the_next_process(crash_site: FakeSite,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_core.cache import cache_dir

    monkeypatch.setenv("RLXFAKE_CRASH", "probe")
    with pytest.warns(PluginWarning, match="fakecrash"):
        assert not crash_registry(crash_site).availability("fakecrash").available
    assert not any((cache_dir() / "probes").glob("fakecrash.*"))
    monkeypatch.delenv("RLXFAKE_CRASH")
    assert crash_registry(crash_site).availability("fakecrash").available


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
    from rlx_core.backends import registry as registry_module

    saved = registry_module._default
    registry_module.set_default_registry(registry)
    try:
        rlx.compile(_add_graph(), device="fakecrash").run({"x": np.ones(2, np.float32)})
    finally:
        registry_module.set_default_registry(saved)


def test_children_know_they_are_children() -> None:
    """A backend's code can tell it runs in rlx's child (``in_isolation_child``): the
    child's environment says so, with isolation off (no grandchildren)."""
    from rlx_core.backends.isolation import CHILD_ENV, ISOLATION_ENV, child_env, in_isolation_child

    env = child_env({"RLX_PROBE_TIMEOUT": "3"})
    assert env[CHILD_ENV] == "1" and env[ISOLATION_ENV] == "0" and env["RLX_PROBE_TIMEOUT"] == "3"
    assert not in_isolation_child()  # the test process itself is no child


@pytest.mark.slow
def test_the_parent_backend_is_told_what_the_child_probe_found(fake_site) -> None:
    """``Backend.probed``: what a probe learns in its child reaches the parent's backend
    (the jax platform, a GPU's properties); an in-process probe needs no telling."""
    from rlx_core.backends.registry import Registry

    isolated = Registry(entry_points=fake_site.entry_points("fakenp"), environ={"RLX_PROBE_TIMEOUT": "30"})
    answer = isolated.availability("fakenp")
    assert answer.available and isolated.info("fakenp").backend.told == answer
    here = Registry(entry_points=fake_site.entry_points("fakenp"), environ={"RLX_ISOLATION": "0"})
    assert here.availability("fakenp").available and not hasattr(here.info("fakenp").backend, "told")
