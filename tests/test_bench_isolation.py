"""``rlx bench`` keeps every contender in a worker process of its own (issue 18).

A kernel that segfaults (the fake plugin ``rlxfake_crash`` does, compiling a product with
k >= 256, as PoCL's matmul did on AMD hosts), a peer that aborts, a worker killed or
stopped from outside: each becomes a row saying how its worker ended, and the other
contenders are timed and printed. ``RLX_ISOLATION=0`` keeps them all in this process.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import CRASH_PLUGIN, FakeSite
from support import other_plugins_disabled
from test_cli import mlp_graph, run_rlx_process
from typer.testing import CliRunner

import rlx_core as rlx
from rlx_core.cli import app
from rlx_core.cli.bench_worker import BenchWorker, WorkerPool
from rlx_core.compiler.inputs import random_inputs
from rlx_core.onnx._peers import Contender, ContenderFailed, time_interleaved

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="signals are POSIX")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def crash_site(tmp_path: Path) -> FakeSite:
    """The crashing fake plugin, installed where a ``rlx`` subprocess finds it."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    return FakeSite(site_dir, CRASH_PLUGIN)


@pytest.fixture
def big_matmul(tmp_path: Path) -> Path:
    """A graph .json whose product has k = 256: the fake driver's crash when asked."""
    g = rlx.Graph("big_matmul")
    x = g.input("x", (4, 256), "float32")
    w = g.param("w", np.full((256, 8), 1 / 256, np.float32))
    b = g.param("b", np.zeros(8, np.float32))
    g.set_outputs([g.add(g.matmul(x, w), b)])
    path = tmp_path / "big_matmul.json"
    g.save(path)
    return path


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BenchWorker]]:
    """Every ``BenchWorker`` started in this process, in order."""
    workers: list[BenchWorker] = []
    real_start = BenchWorker.start

    def start(self: BenchWorker, *args: object, **kwargs: object) -> Contender:
        workers.append(self)
        return real_start(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(BenchWorker, "start", start)
    yield workers


@pytest.fixture
def quiet_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_registry: None) -> None:
    """A fresh default registry with cpu (no jax, opencl, cuda) and a private cache."""
    for name in [k for k in os.environ if k.startswith("RLX_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RLX_DISABLE_PLUGINS", other_plugins_disabled())
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "cache"))


def cli_env(site: FakeSite, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site.path), str(REPO)]), **extra}


def rows(stdout: str) -> dict[str, str]:
    """The bench table's rows by contender (the first line of each), each followed by the
    first line of the note it points to (a failure is ``failed (1)`` or ``(1)``, its
    message note 1 under the table)."""
    notes = {m.group(1): m.group(2) for m in re.finditer(r"^\((\d+)\) (.+)$", stdout, re.MULTILINE)}
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 2 and cells[1] and cells[1] not in found:
            marker = re.search(r"\((\d+)\)\s*$", cells[-2])
            found[cells[1]] = line + (f" {notes.get(marker.group(1), '')}" if marker else "")
    return found


def timed(row: str) -> bool:
    return "µs" in row or " ms" in row


def gone(pid: int | None) -> bool:
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# -- the CLI goes on -----------------------------------------------------------------


@pytest.mark.slow
def test_bench_survives_a_kernel_that_segfaults(crash_site: FakeSite, big_matmul: Path, tmp_path: Path) -> None:
    env = cli_env(crash_site, RLXFAKE_CRASH="calibrate")
    proc = run_rlx_process("bench", str(big_matmul), "--devices", "fakecrash,cpu", "--runs", "2", cwd=tmp_path, env=env)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    table = rows(proc.stdout)
    assert "died with SIGSEGV (Segmentation fault) while compiling" in table["rlx fakecrash"], proc.stdout
    assert timed(table["rlx cpu"]), proc.stdout
    assert "Fatal Python error" not in proc.stderr  # the worker's stderr stays out of the terminal


def test_isolation_off_keeps_the_contenders_in_this_process(crash_site: FakeSite, big_matmul: Path,
                                                            tmp_path: Path) -> None:
    env = cli_env(crash_site, RLXFAKE_CRASH="calibrate", RLX_ISOLATION="0")
    proc = run_rlx_process("bench", str(big_matmul), "--devices", "fakecrash,cpu", "--runs", "2", cwd=tmp_path, env=env)
    assert proc.returncode == -signal.SIGSEGV, (proc.stdout, proc.stderr)


@pytest.mark.slow
def test_isolation_off_times_in_process(big_matmul: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        quiet_registry: None, started: list[BenchWorker]) -> None:
    monkeypatch.setenv("RLX_ISOLATION", "0")
    result = CliRunner().invoke(app, ["bench", str(big_matmul), "--peers", "--runs", "2"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    table = rows(result.stdout)
    assert timed(table["rlx cpu"]) and "chosen" in table["rlx cpu"] and timed(table["numpy"]), result.stdout
    assert started == []


@pytest.mark.slow
def test_peers_are_timed_each_in_a_worker(tmp_path: Path, quiet_registry: None, started: list[BenchWorker]) -> None:
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import helper
    from test_onnx_support import init, make_model, vi

    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    w = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
    model = make_model(nodes, [vi("x", "float32", ["batch", 8])], [vi("y", "float32", ["batch", 4])], [init("w", w)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    result = CliRunner().invoke(app, ["bench", str(tmp_path / "m.onnx"), "--dim", "batch=4", "--devices",
                                              "cpu", "--peers", "--runs", "2"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    table = rows(result.stdout)
    for name in ("rlx cpu", "onnxruntime", "numpy"):
        assert timed(table[name]), result.stdout
    assert [w.name for w in started] == ["rlx cpu", "onnxruntime", "numpy"]
    pids = {w.pid for w in started}
    assert len(pids) == 3 and os.getpid() not in pids
    assert all(gone(pid) for pid in pids)  # closed and reaped when the bench ended


# -- the workers ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_a_row_and_the_others_finish(quiet_registry: None) -> None:
    g = mlp_graph()
    with WorkerPool(g, random_inputs(g, 0)) as pool:
        victim, survivor = pool.rlx("cpu", "chosen"), pool.numpy()
        assert victim.compile_seconds is not None and victim.note == "chosen" and survivor.note
        pids = [w.pid for w in pool.workers]

        def kill_after_the_first_block() -> None:
            if not gone(pids[0]):
                os.kill(pids[0], signal.SIGKILL)

        time_interleaved([victim, survivor], runs=3, pause=0.0, on_block=kill_after_the_first_block)
    assert victim.note == "died with SIGKILL (Killed) while timing" and victim.block is None
    assert len(victim.times) == 1 and len(survivor.times) == 3
    assert all(gone(pid) for pid in pids)


@pytest.mark.slow
def test_a_worker_that_stops_answering_is_killed_at_its_deadline(quiet_registry: None) -> None:
    g = mlp_graph()
    with WorkerPool(g, random_inputs(g, 0), block_timeout=0.5) as pool:
        stuck = pool.numpy()
        pid = pool.workers[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # as a hung kernel: alive, silent
        with pytest.raises(ContenderFailed, match=r"^did not answer within 0.5 s while timing$"):
            assert stuck.block is not None
            stuck.block(2)
        assert gone(pid)


@pytest.mark.slow
def test_a_contender_that_cannot_run_says_why_in_its_row(quiet_registry: None) -> None:
    g = mlp_graph()
    with WorkerPool(g, random_inputs(g, 0)) as pool:
        missing, ort = pool.rlx("nosuchdevice"), pool.onnxruntime()  # onnxruntime needs an .onnx source
    assert missing.block is None and missing.note.startswith("failed: ") and "nosuchdevice" in missing.note
    assert ort.block is None and ort.note.startswith(("cannot load the model", "not installed")), ort.note
    assert all(gone(w.pid) for w in pool.workers)


def test_the_worker_times_the_inputs_it_was_given(quiet_registry: None) -> None:
    """A feed named like ``np.savez``'s own parameter travels too (the archive is positional)."""
    g = rlx.Graph("named_file")
    x = g.input("file", (3,), "float32")
    g.set_outputs([g.add(x, x)])
    with WorkerPool(g, {"file": np.ones(3, np.float32)}) as pool:
        c = pool.rlx("cpu")
        assert c.block is not None and c.block(3) > 0, c.note


def test_interleaving_mixes_contenders_timed_here_and_elsewhere() -> None:
    order: list[str] = []

    def block(n: int) -> float:
        order.append(f"remote {n}")
        return 1e-3

    def dead(n: int) -> float:
        raise ContenderFailed("died with SIGSEGV (Segmentation fault) while timing")

    here = Contender("here", run=lambda: order.append("here"))
    remote = Contender("remote", block=block)
    crashed = Contender("crashed", block=dead, kind="peer")
    time_interleaved([here, remote, crashed], runs=4, pause=0.0)
    # A warm-up here, then per block an untimed call and a timed one; none for a worker: it warmed up already.
    assert order[0] == "here" and order.count("here") == 1 + 4 * 2 and order.count("remote 1") == 4
    assert remote.times == [1e-3] * 4 and crashed.note == "died with SIGSEGV (Segmentation fault) while timing"
    assert crashed.block is None and crashed.times == []
