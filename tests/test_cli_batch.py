"""``rlx batch`` in-process (no Ray): .npz and Parquet in and out, schema checks, atomic output."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import ToyBackend, mlp, other_plugins_disabled, registry_with

from rlx_core import reference
from rlx_core.cli import main


@pytest.fixture
def toy_registry() -> Iterator[dict[str, ToyBackend]]:
    from rlx_core.backends import registry

    backends = {"toy": ToyBackend("toy")}
    saved = registry._default
    registry.set_default_registry(registry_with(*backends.values()))
    try:
        yield backends
    finally:
        registry.set_default_registry(saved)


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Path]:
    """A batch-4 MLP and 10 rows with an id column, as .npz."""
    mlp(4).save(tmp_path / "mlp.json")
    x = np.random.default_rng(3).standard_normal((10, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x, id=np.arange(10) * 7)
    return {"model": tmp_path / "mlp.json", "input": tmp_path / "in.npz", "dir": tmp_path}


def rlx(*args: str | Path) -> int:
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def check_rows(out: dict[str, np.ndarray], x: np.ndarray, ids: np.ndarray, device: str = "toy") -> None:
    """Every row present once, and equal to the reference for the row with that id."""
    assert sorted(out["id"].tolist()) == sorted(ids.tolist())
    one = mlp(1)
    by_id = {int(i): row for i, row in zip(ids, x)}
    for i, probs in zip(out["id"], out["probs"]):
        np.testing.assert_allclose(probs, reference.evaluate(one, {"x": by_id[int(i)][None]})[0][0], rtol=1e-5,
                                   atol=1e-6)
    assert set(out["rlx_device"].tolist()) == {device}


def read_parquet(path: Path) -> dict[str, np.ndarray]:
    from rlx_core.distributed.tables import open_source

    src = open_source(path)
    parts = list(src.batches(1000))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def test_npz_in_npz_out(toy_registry, job, capsys) -> None:
    out_path = job["dir"] / "out.npz"
    assert rlx("batch", job["model"], job["input"], out_path) == 0
    printed = capsys.readouterr().out
    assert "toy" in printed and "10 rows" in printed and "rows/s" in printed
    with np.load(out_path) as f:
        out = {k: f[k] for k in f.files}
    assert sorted(out) == ["id", "probs", "rlx_device"]
    with np.load(job["input"]) as f:
        check_rows(out, f["x"], f["id"])
    assert [p.name for p in job["dir"].iterdir() if p.name.startswith(".")] == []  # no temp sibling left


def test_parquet_out_then_parquet_in(toy_registry, job) -> None:
    pytest.importorskip("pyarrow")
    pq_path = job["dir"] / "out.parquet"
    assert rlx("batch", job["model"], job["input"], pq_path, "--batch-size", "3") == 0
    out = read_parquet(pq_path)
    with np.load(job["input"]) as f:
        x, ids = f["x"], f["id"]
    check_rows(out, x, ids)

    # Parquet in: a folder of files with a tensor column, written by another tool (pyarrow).
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = job["dir"] / "rows"
    folder.mkdir()
    for part, sl in enumerate((slice(0, 6), slice(6, 10))):
        table = pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(x[sl]), "id": pa.array(ids[sl])})
        pq.write_table(table, folder / f"part-{part}.parquet")
    assert rlx("batch", job["model"], folder, job["dir"] / "again.npz") == 0
    with np.load(job["dir"] / "again.npz") as f:
        check_rows({k: f[k] for k in f.files}, x, ids)
    assert rlx("batch", job["model"], folder, job["dir"] / "outdir") == 0
    check_rows(read_parquet(job["dir"] / "outdir"), x, ids)


def test_fixed_size_list_parquet_columns_are_tensors(toy_registry, job) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    col = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 8)
    pq.write_table(pa.table({"x": col, "id": pa.array(np.arange(5))}), job["dir"] / "lists.parquet")
    assert rlx("batch", job["model"], job["dir"] / "lists.parquet", job["dir"] / "o.npz") == 0
    with np.load(job["dir"] / "o.npz") as f:
        check_rows({k: f[k] for k in f.files}, x, np.arange(5))


@pytest.mark.parametrize(
    ("columns", "fragment"),
    [
        ({"y": np.zeros((4, 8), np.float32)}, "column 'x' is missing"),
        ({"x": np.zeros((4, 8), np.float64)}, "column 'x': expected dtype float32, got float64"),
        ({"x": np.zeros((4, 9), np.float32)}, "column 'x': expected rows of shape [8], got [9]"),
        ({"x": np.zeros((4, 8), np.float32), "id": np.arange(5)}, "column 'id'"),
    ],
)
def test_bad_input_fails_before_any_work_and_writes_nothing(toy_registry, job, capsys, columns, fragment) -> None:
    bad = job["dir"] / "bad.npz"
    np.savez(bad, **columns)
    out_path = job["dir"] / "out.npz"
    assert rlx("batch", job["model"], bad, out_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err
    assert toy_registry["toy"].compiles == 0  # checked before any work
    assert not out_path.exists()
    assert [p.name for p in job["dir"].iterdir() if p.name.startswith(".")] == []


def test_a_failed_job_leaves_no_output_and_keeps_an_old_one(toy_registry, job, capsys) -> None:
    out_path = job["dir"] / "out.npz"
    out_path.write_bytes(b"old result")
    toy_registry["toy"].fail_run = True
    assert rlx("batch", job["model"], job["input"], out_path) == 2
    err = capsys.readouterr().err
    assert "error: " in err and "toy" in err
    assert out_path.read_bytes() == b"old result"
    assert [p.name for p in job["dir"].iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["auto"], "without --ray"),
        (["--concurrency", "2"], "needs --ray"),
        (["--device", "nosuch"], "nosuch"),
    ],
)
def test_usage_errors(toy_registry, job, capsys, args, fragment) -> None:
    assert rlx("batch", job["model"], job["input"], job["dir"] / "o.npz", *args) == 2
    assert fragment in capsys.readouterr().err


def test_missing_model_and_input_files(toy_registry, job, capsys) -> None:
    assert rlx("batch", job["dir"] / "nope.json", job["input"], job["dir"] / "o.npz") == 2
    assert "nope.json" in capsys.readouterr().err
    assert rlx("batch", job["model"], job["dir"] / "nope.npz", job["dir"] / "o.npz") == 2
    assert "nope.npz" in capsys.readouterr().err
    assert rlx("batch", job["model"], job["input"], job["dir"] / "o.csv") == 2
    assert "unknown table format" in capsys.readouterr().err


@pytest.mark.slow
def test_real_cpu_backend_in_a_subprocess(job) -> None:
    """As a user runs it: ``python -m rlx_core batch`` on the real registry, cpu only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLX_")}
    env.update({"RLX_DEVICES": "cpu", "RLX_DISABLE_PLUGINS": other_plugins_disabled(), "COLUMNS": "200",
                "RLX_CACHE_DIR": str(job["dir"] / "cache")})
    out_path = job["dir"] / "out.npz"
    proc = subprocess.run([sys.executable, "-m", "rlx_core", "batch", str(job["model"]), str(job["input"]),
                           str(out_path)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "cpu" in proc.stdout and "rows/s" in proc.stdout
    assert "ray" not in proc.stderr.lower()
    with np.load(out_path) as f, np.load(job["input"]) as g:
        check_rows({k: f[k] for k in f.files}, g["x"], g["id"], device="cpu")


def test_rows_per_device_from_one_value_or_mixed_columns() -> None:
    from rlx_core.cli.batch import _unique_counts

    assert _unique_counts(np.broadcast_to(np.array("cpu"), (5,))) == (["cpu"], [5])
    assert _unique_counts(np.array(["jax", "cpu", "jax"])) == (["cpu", "jax"], [1, 2])
    assert _unique_counts(np.array(["cpu"] * 3)) == (["cpu"], [3])
    assert _unique_counts(np.empty(0, "<U1")) == ([], [])


def test_the_progress_bar_gets_every_row_although_updates_are_coalesced(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console
    from rich.progress import Progress

    from rlx_core.cli.batch import _progress

    handed: list[float] = []
    real = Progress.advance
    monkeypatch.setattr(Progress, "advance", lambda self, task, n=1: (handed.append(n), real(self, task, n))[1])
    with _progress(Console(file=io.StringIO()), 1000) as advance:
        for _ in range(100):
            advance(10)
    assert sum(handed) == 1000 and len(handed) <= 100


def test_no_bar_and_no_blank_line_when_the_console_is_not_a_terminal(toy_registry, job) -> None:
    """A transient bar is invisible in a log or a pipe; it is not drawn there at all."""
    import io

    from rich.console import Console

    from rlx_core.cli.batch import run_batch

    buf = io.StringIO()
    assert run_batch(job["model"], job["input"], job["dir"] / "out.npz", console=Console(file=buf, width=100)) == {
        "toy": 10
    }
    assert buf.getvalue().startswith("rlx batch: 10 rows"), buf.getvalue()[:40]


def test_the_output_gets_the_mode_of_the_umask_not_of_a_temporary_file(toy_registry, job) -> None:
    """A table written for others to read is not 0600 (the temporary file's mode)."""
    umask = os.umask(0o022)
    os.umask(umask)
    out = job["dir"] / "out.npz"
    assert rlx("batch", job["model"], job["input"], out) == 0
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_device_whose_plugin_is_not_installed_says_what_to_install(toy_registry, job, capsys) -> None:
    assert rlx("batch", job["model"], job["input"], job["dir"] / "out.npz", "--device", "cuda") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not installed: pip install rlx-cuda" in err and "unknown" not in err, err
    assert not (job["dir"] / "out.npz").exists()


def test_the_bar_says_the_first_batch_compiles_until_it_is_back() -> None:
    import io

    from rich.console import Console
    from rich.progress import Progress

    from rlx_core.cli.batch import _progress

    said: list[str] = []
    real = Progress.update

    def spy(self: Progress, task: object, **kw: object) -> None:
        if "description" in kw:
            said.append(str(kw["description"]))
        real(self, task, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Progress, "update", spy)
        with _progress(Console(file=io.StringIO(), force_terminal=True), 20) as advance:
            advance(10)
            advance(10)
    assert said == ["rows"]  # once, when the first batch came back; it started as "... compiles"
