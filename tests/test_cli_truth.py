"""The ``rlx`` command tells the truth (issue 19, items 5 and 6), checked as a new user
meets it (in this process, as ``test_cli.run_rlx`` runs it; in a child of its own where
a fresh process or a terminal is the point, marked ``slow``): a bad ``RLX_*`` value is
one ``error:`` line naming the variable, whatever the command; ``recommended`` without a
graph is what ``rlx run --example mlp`` picks; tables fit 80 columns; ``rlx cache``
covers every cache; installed / available / usable agree between the table and
``--json``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import other_plugins_disabled
from test_cli import assert_user_error, mlp_graph, run_rlx


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.json"
    mlp_graph().save(path)
    return path


# ----------------------------------------------------------------------------- policy names
@pytest.mark.parametrize(("env", "fragments"), [
    ({"RLX_DEVICES": "cpu,,"}, ["RLX_DEVICES", "'cpu,,'", "empty entry"]),
    ({"RLX_DEVICES": "cpu,nonsense"}, ["RLX_DEVICES", "'nonsense'", "known devices: cpu"]),
    ({"RLX_DENY_DEVICES": "foo"}, ["RLX_DENY_DEVICES", "'foo'", "known devices: cpu"]),
    ({"RLX_PREFER_DEVICES": "cpu,bar"}, ["RLX_PREFER_DEVICES", "'bar'", "known devices: cpu"]),
    ({"RLX_DEVICE": "zz"}, ["RLX_DEVICE", "'zz'", "known devices: cpu"]),
])
def test_a_bad_device_name_in_the_policy_is_one_error_line_for_every_command(
        tmp_path: Path, model: Path, env: dict[str, str], fragments: list[str]) -> None:
    for args in (["devices"], ["run", "--example", "mlp"], ["check", str(model)]):
        assert_user_error(run_rlx(*args, cwd=tmp_path, env=env), *fragments)


def test_denying_an_own_backend_that_is_not_installed_is_fine(tmp_path: Path) -> None:
    # cuda and tpu cannot run here; naming them is still legitimate (the unit test
    # test_policy.py::test_rlx_own_backends_may_be_named_when_not_installed has no plugin of them at all)
    proc = run_rlx("run", "--example", "mlp", cwd=tmp_path, env={"RLX_DENY_DEVICES": "cuda,tpu"})
    assert proc.returncode == 0, proc.stderr
    assert "device: cpu" in proc.stdout


# ----------------------------------------------------------------------------- malformed environment
@pytest.mark.parametrize(("var", "value"), [("RLX_FUSION_REPORT", "maybe"), ("RLX_MEMORY_LIMIT", "abc")])
def test_a_malformed_variable_is_one_error_line_for_every_command(tmp_path: Path, model: Path, var: str,
                                                                   value: str) -> None:
    import numpy as np

    np.savez(tmp_path / "in.npz", x=np.zeros((8, 64), np.float32))
    for args in (["devices"], ["devices", "--graph", str(model)], ["check", str(model)],
                 ["bench", str(model), "--runs", "1"], ["batch", str(model), "in.npz", "out.npz"],
                 ["run", str(model)]):
        proc = run_rlx(*args, cwd=tmp_path, env={var: value})
        line = assert_user_error(proc, var, repr(value))
        assert "warning:" not in proc.stderr, (args, proc.stderr)  # no failure per device before it
        assert proc.stdout == "", (args, proc.stdout, line)  # nothing was done
    assert not (tmp_path / "out.npz").exists()
    assert run_rlx("cache", "info", cwd=tmp_path, env={var: value}).returncode == 0  # needs no policy


# ----------------------------------------------------------------------------- recommended without a graph
def _all_plugins(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Like ``run_rlx`` but with every installed plugin (jax, opencl, cuda too): the
    recommendation must agree with the pick on this host's real backends."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLX_")}
    base.update({"RLX_CACHE_DIR": str(cwd / "cache"), "COLUMNS": "200", **(env or {})})
    return subprocess.run([sys.executable, *args], cwd=cwd, env=base, capture_output=True, text=True,
                          timeout=180)


@pytest.mark.slow
@pytest.mark.parametrize("env", [{}, {"RLX_DENY_DEVICES": "cpu"}], ids=["default", "deny-cpu"])
def test_the_example_pick_agrees_with_the_example_run_on_the_real_backends(tmp_path: Path,
                                                                          env: dict[str, str]) -> None:
    """``rlx devices`` says where ``rlx run --example mlp`` runs (``example_pick``), and the
    run agrees; ``recommended`` stays the contract's highest-priority usable device."""
    doc = json.loads(_all_plugins("-m", "rlx_core", "devices", "--json", cwd=tmp_path, env=env).stdout)
    said = doc["example_pick"]["device"]
    usable = [r for r in doc["devices"] if r["usable"]]
    recommended = [r["device"] for r in doc["devices"] if r["recommended"]]
    assert recommended == ([max(usable, key=lambda r: r["priority"])["device"]] if usable else [])
    ran = _all_plugins("-m", "rlx_core", "run", "--example", "mlp", cwd=tmp_path, env=env)
    text = _all_plugins("-m", "rlx_core", "devices", cwd=tmp_path, env=env).stdout
    if said is None:  # deny-cpu on a host where nothing else runs: the run must fail too
        assert ran.returncode == 2, ran.stdout
        return
    assert ran.returncode == 0, ran.stderr
    picked = re.search(r"^device: (\S+)", ran.stdout, re.MULTILINE)
    assert picked is not None, ran.stdout
    assert said == picked.group(1), (said, ran.stdout)
    assert f"runs on {said}:" in " ".join(text.split()), text


# ----------------------------------------------------------------------------- installed / available / usable
def _status_and_note(text: str, device: str) -> tuple[str, str]:
    """The status cell of ``device``'s row in the ``rlx devices`` table, and the text of
    the note it points to (``""`` when none)."""
    row = next(line for line in text.splitlines() if line.startswith(f"│ {device} "))
    status = row.split("│")[2].strip()
    marker = re.search(r"\((\d+)\)", status)
    if marker is None:
        return status, ""
    below = text[text.index("\n└"):].split("\n", 2)[2]  # after the table's last line
    notes = below[below.index(f"({marker.group(1)}) "):].split("\n(")[0]
    return status, " ".join(notes.split())


def test_installed_available_usable_agree_between_table_and_json(monkeypatch, isolated_registry) -> None:
    from support import ToyBackend, registry_with
    from typer.testing import CliRunner

    from rlx_core.backends.registry import set_default_registry
    from rlx_core.cli import app

    # no plugin of rlx's own is installed in this registry: cpu, cuda... get "not installed" rows
    set_default_registry(registry_with(ToyBackend("toy"), ToyBackend("gone", available="no gone device here"),
                                       ToyBackend("shy")))
    for var in [v for v in os.environ if v.startswith("RLX_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("RLX_DENY_DEVICES", "shy")
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, ["devices", "--json"]).stdout)
    rows = {r["device"]: r for r in doc["devices"]}
    states = {d: (r["installed"], r["available"], r["usable"], r["state"]) for d, r in rows.items()}
    assert states == {
        "toy": (True, True, True, "usable"), "shy": (True, True, False, "blocked"),
        "gone": (True, False, False, "unavailable"), **{d: (False, False, False, "not installed")
                                                          for d in ("tpu", "cuda", "opencl", "jax", "cpu")},
    }
    assert rows["cuda"]["reason"] == rows["cuda"]["blocker"] == "not installed: pip install rlx-cuda"
    assert rows["cuda"]["distribution"] == "rlx-cuda" and rows["cuda"]["ops"] == []
    assert rows["opencl"]["reason"] == "not installed: pip install 'rlx-opencl[pocl]'"
    assert rows["shy"]["blocker"] == "denied by policy (RLX_DENY_DEVICES)"
    assert {m["device"] for m in doc["not_installed"]} == {"tpu", "cuda", "opencl", "jax", "cpu"}

    text = runner.invoke(app, ["devices"]).stdout
    expected_notes = {"toy": "", "shy": "shy: denied by policy (RLX_DENY_DEVICES)",
                      "gone": "gone: no gone device here", "cuda": "cuda: not installed: pip install rlx-cuda",
                      "jax": "jax: not installed: pip install rlx-jax-tpu"}
    for device, note in expected_notes.items():
        status, said = _status_and_note(text, device)
        assert status.split(" (")[0] == rows[device]["state"], (device, status, text)  # the same word as --json
        assert said == (f"{status[status.index('('):]} {note}" if note else ""), (device, said)


# ----------------------------------------------------------------------------- caches
def test_a_stale_calibration_is_warned_about_by_one_process_not_every_one(tmp_path: Path) -> None:
    from rlx_core.cache import JsonCache
    from rlx_core.calibration import CALIBRATION_SCHEMA

    cache = JsonCache("calibration", CALIBRATION_SCHEMA, tmp_path / "cache")
    cache.put("cpu", {"backend": "cpu", "plugin_version": "0.0.1-long-gone"}, {"device": "cpu"})
    first, second = (run_rlx("devices", cwd=tmp_path) for _ in range(2))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    warned = [line for line in first.stderr.splitlines() if line.startswith("warning: rlx cache:")]
    assert len(warned) == 1 and "removed" in warned[0] and "rlx calibrate" in warned[0], first.stderr
    assert "warning" not in second.stderr, second.stderr
    assert not cache.path("cpu").exists()


def test_cache_info_and_clear_cover_every_namespace(tmp_path: Path) -> None:
    from rlx_core.backends.faults import FaultLog
    from rlx_core.cache import JsonCache

    root = tmp_path / "cache"
    JsonCache("calibration", 3, root, what="cost models measured by rlx calibrate").put("cpu", {}, {"x": 1})
    FaultLog(str(root)).record("cpu", "calibration", "died with SIGSEGV", "sgemm", "0.1")
    JsonCache("opencl-label", 1, root).put("label", {"backend": "opencl"}, {"label": "x"})
    # rlx-jax-tpu's records: a signature entry naming the file JAX wrote beside it
    jax_records = JsonCache("jax", 1, root, what="JAX's compiled XLA programs (rlx-jax-tpu)")
    jax_records.put("jit_f-0123", {}, {"mac": "x"}, files=["jit_f-0123-cache"])
    jax = jax_records.directory
    (jax / "jit_f-0123-cache").write_bytes(b"\0" * 2048)

    info = json.loads(run_rlx("cache", "info", "--json", cwd=tmp_path).stdout)
    assert info["entries"] == {"calibration": 1, "faults": 1, "jax": 2, "opencl-label": 1}
    people = run_rlx("cache", "info", cwd=tmp_path, env={"COLUMNS": "80"})
    assert people.returncode == 0 and max(len(line) for line in people.stdout.splitlines()) <= 80
    for name in ("calibration", "faults", "jax", "opencl-label", "JAX's compiled XLA programs", "2.1 KiB"):
        assert name in people.stdout, (name, people.stdout)

    one = run_rlx("cache", "clear", "jax", cwd=tmp_path)
    assert one.returncode == 0 and "removed 2 files (jax)" in one.stdout, one.stdout
    assert not jax.exists() and (root / "faults").exists()
    assert_user_error(run_rlx("cache", "clear", "nope", cwd=tmp_path), "'nope'", "calibration, faults, opencl-label")
    every = run_rlx("cache", "clear", cwd=tmp_path)
    assert every.returncode == 0 and "removed 3 files" in every.stdout, every.stdout
    assert json.loads(run_rlx("cache", "info", "--json", cwd=tmp_path).stdout)["total_entries"] == 0


# ----------------------------------------------------------------------------- 80 columns
def _wide_terminal() -> tuple[int, int] | None:
    """A pseudo-terminal 200 columns wide, ``(leader, follower)``: the follower as the
    command's stdin is how a user's wide terminal reaches a command whose output goes to a
    file (rich measures any standard stream that is a terminal). ``None`` without ptys."""
    try:
        import fcntl
        import pty
        import struct
        import termios
    except ImportError:
        return None
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    return leader, follower


def _narrow(args: list[str], cwd: Path, env: dict[str, str], columns: str | None) -> Any:
    """``rlx ARGS`` as run_rlx runs it, but with ``COLUMNS`` as given instead of run_rlx's
    200; with ``columns=None``, ``python -m rlx_core ARGS`` with ``COLUMNS`` unset and a
    200-column terminal on stdin (rich measures it: a child of its own is the point)."""
    if columns is not None:
        return run_rlx(*args, cwd=cwd, env={"COLUMNS": columns, "RLX_DISABLE_PLUGINS": "fakehang", **env},
                       columns=int(columns))
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLX_") and k != "COLUMNS"}
    base.update({"RLX_CACHE_DIR": str(cwd / "cache"), "RLX_DISABLE_PLUGINS": other_plugins_disabled("fakehang"),
                 **env})
    terminal = _wide_terminal()
    try:
        return subprocess.run([sys.executable, "-m", "rlx_core", *args], cwd=cwd, env=base, capture_output=True,
                              stdin=terminal[1] if terminal else subprocess.DEVNULL, text=True, timeout=180)
    finally:
        for fd in terminal or ():
            os.close(fd)


@pytest.mark.parametrize("columns", ["80", pytest.param(None, marks=pytest.mark.slow)],
                         ids=["COLUMNS=80", "not-a-tty"])
def test_every_table_fits_80_columns_with_reasons_below_it(tmp_path: Path, model: Path, fake_site,
                                                           columns: str | None) -> None:
    env = {"PYTHONPATH": str(fake_site.path), "RLX_PROBE_TIMEOUT": "5"}
    commands = [
        ["devices"], ["devices", "--explain"], ["devices", "--explain", "--graph", str(model)],
        ["check", str(model)], ["run", "--example", "mlp"], ["cache", "info"],
        ["bench", str(model), "--runs", "1", "--devices", "cpu,fakenp,fakeraise"],
    ]
    for args in commands:
        proc = _narrow(args, tmp_path, env, columns)
        assert proc.returncode in (0, 1), (args, proc.stderr)
        lines = proc.stdout.splitlines()
        assert lines and max(len(line) for line in lines) <= 80, (args, proc.stdout)
        if args[0] in ("devices", "check", "bench"):  # fakeraise's probe raised: its reason is a note below
            end = min(i for i, line in enumerate(lines) if line.startswith("└"))  # the first table's
            below = " ".join(lines[end + 1:])
            assert "no device 0" in below and "no device 0" not in "\n".join(lines[:end]), (args, proc.stdout)
    check = _narrow(["check", str(model)], tmp_path, env, columns)
    assert re.search(r"^pick: cpu \(", check.stdout, re.MULTILINE), check.stdout  # the pick's own reason


# ----------------------------------------------------------------------------- usage errors
def _main(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """``rlx ARGV`` in this process: its exit code (0 when it returns)."""
    import warnings

    from rlx_core.cli import main

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main() installs its own
    try:
        main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return 0


@pytest.mark.parametrize("argv", [
    ["devices", "--bogus"],                                          # unknown option
    ["check"],                                                       # missing argument
    ["batch", "m.json", "in.npz", "out.npz", "--batch-size", "abc"],  # bad option value
    ["batch", "m.json", "in.npz", "out.npz", "--batch-size", "0"],    # out of range
    ["bench", "--example", "mlp", "--runs", "x"],
    ["run", "--example", "mlp", "--device"],                         # option without its value
    ["devices", "--json", "extra"],                                  # extra argument
    ["nosuchcommand"],                                               # unknown command
    ["cache", "nosuch"],
    ["run", "-h"],                                                   # not an option of rlx
])
def test_a_usage_error_is_one_error_line_and_exit_2(argv: list[str], capsys, monkeypatch) -> None:
    code = _main(argv, monkeypatch)
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    assert out == "", (argv, out)  # no usage box, no help
    assert len(err.splitlines()) == 1 and err.startswith("error: "), (argv, err)


@pytest.mark.parametrize("argv", [["--help"], ["devices", "--help"], ["cache", "clear", "--help"], ["--version"]])
def test_help_and_version_still_work(argv: list[str], capsys, monkeypatch) -> None:
    code = _main(argv, monkeypatch)
    out, err = capsys.readouterr()
    assert code == 0 and err == "", (argv, err)
    assert ("Usage" in out) if "--help" in argv else out.startswith("rlx-core ")
