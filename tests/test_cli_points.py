"""What a new user hit in the ``rlx`` command (issue 31, "CLI"), each checked as they met
it: a negative ``--seed``; ``--out`` into a folder that is not there, checked only after
the whole run; a wrong ``--input`` name; ``--device cuda`` without rlx-cuda; ``rlx`` bare
printing its help twice; numpy's RuntimeWarnings for NaN and Inf inputs; ``--out`` files
of mode 0600; nothing shown while a long command works; ``device=""`` taken as auto."""

from __future__ import annotations

import importlib.metadata
import io
import os
import time
from pathlib import Path

import numpy as np
import pytest
from test_cli import assert_user_error, run_rlx

import rlx_core as rlx


def cpu_only_registry() -> rlx.Registry:
    """The real cpu plugin and nothing else: rlx-cuda (installed here or not) is not."""
    eps = [ep for ep in importlib.metadata.entry_points(group="rlx.backends") if ep.name == "cpu"]
    assert eps, "rlx-cpu is not installed"
    return rlx.Registry(entry_points=eps)


@pytest.fixture
def nan_graph(tmp_path: Path) -> Path:
    """``log(x) * exp(x) / sqrt(x)`` (a graph file) and, as ``x.npy``, inputs whose results
    are NaN or Inf: zero, a negative, NaN, both infinities, a value whose exp overflows."""
    g = rlx.Graph("ieee")
    x = g.input("x", (2, 4))
    g.set_outputs([g.div(g.mul(g.log(x), g.exp(x)), g.sqrt(x), name="y")])
    g.save(tmp_path / "ieee.json")
    np.save(tmp_path / "x.npy", np.array([[0.0, -1.0, np.nan, np.inf], [-np.inf, 100.0, 1.0, 2.0]], np.float32))
    return tmp_path / "ieee.json"


# ----------------------------------------------------------------------------- bad values, one line each
@pytest.mark.parametrize("command", ["run", "bench"])
def test_a_negative_seed_is_one_error_line_not_a_traceback(tmp_path: Path, command: str) -> None:
    proc = run_rlx(command, "--example", "mlp", "--seed", "-1", cwd=tmp_path)
    assert_user_error(proc, "--seed", "-1")
    assert proc.stdout == ""


@pytest.mark.parametrize(("out", "fragments"), [
    ("no/such/dir/out.npz", ["'no/such/dir/out.npz'", "'no/such/dir' does not exist"]),
    ("a_file/out.npz", ["'a_file/out.npz'", "'a_file' is not a folder"]),
    ("a_folder", ["'a_folder' is a folder"]),
])
def test_out_is_checked_before_any_work(tmp_path: Path, out: str, fragments: list[str]) -> None:
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "a_folder").mkdir()
    proc = run_rlx("run", "--example", "mlp", "--out", out, cwd=tmp_path)
    assert_user_error(proc, "--out", *fragments)
    assert proc.stdout == ""  # nothing was loaded, compiled or run first


def test_a_wrong_input_name_is_unknown_with_the_inputs_and_what_is_not_given(tmp_path: Path) -> None:
    np.save(tmp_path / "y.npy", np.zeros((8, 64), np.float32))
    proc = run_rlx("run", "--example", "mlp", "--input", "y=y.npy", cwd=tmp_path)
    assert_user_error(proc, "--input y", "no input 'y'", "its inputs: x", "not given: x")


@pytest.mark.parametrize("args", [
    ["run", "--example", "mlp", "--device", "cuda"],
    ["run", "--example", "mlp", "--device", "cuda:1"],
    ["bench", "--example", "mlp", "--devices", "cpu,cuda"],
    ["check", "GRAPH", "--device", "cuda"],
    ["calibrate", "cuda"],
])
def test_a_device_whose_plugin_is_not_installed_says_what_to_install(tmp_path: Path, args: list[str]) -> None:
    rlx.Graph.from_json((Path(rlx.__file__).parent / "examples" / "mlp.json").read_text()).save(tmp_path / "g.json")
    args = [str(tmp_path / "g.json") if a == "GRAPH" else a for a in args]
    proc = run_rlx(*args, cwd=tmp_path, registry=cpu_only_registry())
    line = assert_user_error(proc, "not installed: pip install rlx-cuda")
    assert "unknown device" not in line
    assert proc.stdout == ""


def test_an_unknown_device_still_lists_the_known_ones(tmp_path: Path) -> None:
    proc = run_rlx("run", "--example", "mlp", "--device", "cdua", cwd=tmp_path, registry=cpu_only_registry())
    assert_user_error(proc, "unknown device 'cdua'", "known devices: cpu")


@pytest.mark.parametrize("device", ["", "  "])
def test_an_empty_device_is_an_error_naming_it_not_auto(tmp_path: Path, device: str) -> None:
    proc = run_rlx("run", "--example", "mlp", "--device", device, cwd=tmp_path)
    assert_user_error(proc, f"device {device!r} is empty")
    g = rlx.Graph("g")
    g.set_outputs([g.relu(g.input("x", (2,)))])
    with pytest.raises(rlx.DeviceError, match=f"device {device!r} is empty"):
        rlx.compile(g, device=device)


@pytest.mark.parametrize("args", [[], ["cache"]])
def test_bare_rlx_prints_its_help_once(tmp_path: Path, args: list[str]) -> None:
    proc = run_rlx(*args, cwd=tmp_path)
    assert proc.stdout.count("Usage:") == 1, proc.stdout
    assert proc.returncode == 2 and proc.stderr == ""


# ----------------------------------------------------------------------------- nothing leaks, nothing odd
@pytest.mark.parametrize("native", ["1", "0"])
def test_nan_and_inf_inputs_give_no_runtime_warning(tmp_path: Path, nan_graph: Path, native: str) -> None:
    """NaN and Inf in, NaN and Inf out (the IEEE answer), without numpy's warnings from
    inside rlx-cpu's kernels (``RLX_CPU_NATIVE=0``: the numpy ones)."""
    proc = run_rlx("run", str(nan_graph), "--input", "x=x.npy", "--device", "cpu", "--out", "o.npz", cwd=tmp_path,
                   env={"RLX_CPU_NATIVE": native, "RLX_CPU_BLAS": "numpy"})
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr.lower(), proc.stderr
    with np.load(tmp_path / "o.npz") as out:
        y = out["y"]
    assert not np.isfinite(y[0]).any() and not np.isfinite(y[1, :2]).any() and np.isfinite(y[1, 2:]).all()


def test_out_gets_the_mode_of_the_umask_not_0600(tmp_path: Path) -> None:
    umask = os.umask(0o027)
    try:
        proc = run_rlx("run", "--example", "mlp", "--out", "o.npz", cwd=tmp_path)
    finally:
        os.umask(umask)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "o.npz").stat().st_mode & 0o777 == 0o640


# ----------------------------------------------------------------------------- progress
def test_a_long_command_shows_its_phase_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from rlx_core.cli.common import phases

    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=80)
    with phases(terminal, delay=0.0) as phase:
        phase("compiling mlp for cpu")
        deadline = time.monotonic() + 30
        while "compiling mlp for cpu" not in screen.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)  # the spinner starts on a timer thread
        phase("running mlp on cpu")
    assert "compiling mlp for cpu" in screen.getvalue()


def test_no_phase_is_shown_before_the_delay_or_off_a_terminal() -> None:
    from rich.console import Console

    from rlx_core.cli.common import phases

    quick, log = io.StringIO(), io.StringIO()
    with phases(Console(file=quick, force_terminal=True), delay=3600) as phase:
        phase("compiling")
    with phases(Console(file=log, force_terminal=False), delay=0.0) as phase:
        phase("compiling")
        time.sleep(0.05)
    assert quick.getvalue() == "" and log.getvalue() == ""


def test_rlx_run_shows_its_phases_on_a_terminal_and_nothing_else_in_a_pipe(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from rlx_core.cli import common as _cli_common

    piped = run_rlx("run", "--example", "mlp", cwd=tmp_path)
    assert piped.returncode == 0 and "compiling" not in piped.stdout and "loading" not in piped.stdout

    screen = io.StringIO()
    monkeypatch.setattr(_cli_common, "console", Console(file=screen, force_terminal=True, width=120))
    monkeypatch.setattr(_cli_common, "PHASE_DELAY_S", 0.0)
    assert run_rlx("run", "--example", "mlp", cwd=tmp_path).returncode == 0
    shown = screen.getvalue()
    assert any(f"{what} " in shown for what in ("loading", "compiling", "running")), shown
