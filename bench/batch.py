"""Batch inference throughput: ``rlx batch`` in-process against an ONNX Runtime loop, and Ray against in-process.

The model is the suite MLP (784-128-64-10, fixed batch 64, ``bench/models.py``) written to
an ``.onnx`` file; the rows are an ``.npz`` of ``ROWS`` float32 rows plus an id column. The
rows are read back through ``rlx_core.distributed.tables`` and cut into batches of the
model's 64 rows, the batches ``rlx batch`` streams. Contenders, each timed over every row:

- ``onnxruntime loop``: one ``InferenceSession`` (CPU provider, default threads), ``run``
  once per batch: the yardstick;
- ``rlx <device>, compiled loop``: ``rlx_core.compile`` on the device the predictor chose,
  ``run`` once per batch (the backend alone: what the Predictor adds is the difference);
- ``rlx batch stream (Predictor)``: the loop of ``rlx batch`` in-process (``_cli_batch._in_process``):
  one ``Predictor`` called on each batch dict, outputs, ids and the device column;
- ``rlx batch job``: ``run_batch`` — what ``rlx batch MODEL rows.npz out.npz`` does after
  parsing its arguments: read, check, load, compile, stream, write the output;
- ``onnxruntime job``: the same whole job by hand (session, loop, ``np.savez``);
- ``read rows``: the ``.npz`` read and cut into batches, no model: the part of every
  contender above that is the same for all (both loops and both jobs read the rows this
  way), shown so that the ratios can be read net of it.

Then Ray on this machine (``ray.init(num_cpus=2)``, skipped with a note when Ray is
missing): the job of ``rlx batch --ray`` (``_cli_batch._on_ray``: ``map_batches`` over a
pool of 2 workers, outputs streamed back) against the same job in-process, both with
batches of ``RAY_BATCH`` rows, after one untimed Ray job; each job's start-up (to its
first output) and its rows/s after that are reported apart, as a job pays start-up once.

Method: each sample is one pass over every row; contenders are interleaved in blocks
(rotating order, ~150 ms sleep before every sample, so that the threads ONNX Runtime and
OpenBLAS leave spinning park before the next contender runs), and figures are medians
over blocks.
Every contender's outputs are checked against ONNX Runtime before anything is timed.

    python bench/batch.py                 # 16,384 rows, 20 blocks, 5 Ray jobs (1-2 minutes)
    python bench/batch.py --quick         # small and short: checks that it runs
    python bench/batch.py --write         # also rewrite the "Batch inference" section of BENCHMARKS.md
    python bench/batch.py --no-ray --json out.json
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file (python bench/batch.py): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench import _markdown, _report, models
from rlx_core.errors import ConfigError, RlxError
from rlx_core.timer import Entry, interleave

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
SECTION_NAME = "Batch inference"

ROWS = 16_384
RAY_BATCH = 256  # a multiple of the model's 64: Ray's per-batch cost is paid per 256 rows
RAY_CPUS = 2
#: What in-process ``rlx batch`` aims for: this fraction of the ORT loop's rows/s.
TARGET_VS_ORT = 0.9
#: Largest difference from ORT accepted on the MLP's softmax outputs (values in [0, 1]).
TOLERANCE = 1e-5
#: The contender that only reads the rows (no model; no output to compare).
READ = "read rows (.npz → batches, no model)"

log = logging.getLogger("rlx.bench")


class Setup:
    """The model file, the rows file and everything the contenders share, in ``folder``."""

    def __init__(self, folder: Path, rows: int) -> None:
        import onnxruntime as ort

        from rlx_core.distributed import BatchModel, Predictor

        suite = models.build("mlp", "full")
        self.batch = int(suite.params["batch"])
        if rows < self.batch or rows % self.batch:
            raise ConfigError(f"bench/batch.py: --rows must be a positive multiple of the model's batch "
                              f"{self.batch}, got {rows}")
        self.rows = rows
        self.summary = suite.summary
        self.model_path = folder / "mlp.onnx"
        self.model_path.write_bytes(suite.onnx)
        rng = np.random.default_rng(models.SEED)
        self.x = rng.standard_normal((rows, suite.inputs["x"].shape[1])).astype(np.float32)
        self.ids = np.arange(rows, dtype=np.int64)
        self.rows_path = folder / "rows.npz"
        np.savez(self.rows_path, x=self.x, id=self.ids)
        self.out_dir = folder
        self.session = ort.InferenceSession(suite.onnx, providers=["CPUExecutionProvider"])
        info = BatchModel(self.model_path)
        # As _cli_batch._in_process builds it; built once here, so the stream is timed warm.
        self.predictor = Predictor(info, device=None, batch_size=None if info.rows_per_run else self.batch)
        self.device = self.predictor.device or "cpu"
        import rlx_core as rlx

        self.compiled = rlx.compile(info.graph_for(self.batch), device=self.device)
        self.expected = self._ort_outputs()

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        """The rows as ``rlx batch`` reads them: the ``.npz`` source, in batches of 64."""
        from rlx_core.distributed.tables import open_source

        return open_source(self.rows_path).batches(self.batch)

    def _ort_outputs(self) -> np.ndarray:
        return np.concatenate([self.session.run(None, {"x": b["x"]})[0] for b in self.batches()])


# ---------------------------------------------------------------- in-process contenders
def contenders(s: Setup) -> dict[str, Callable[[], Any]]:
    """name -> one pass over every row; each pass's outputs are checked by ``check``."""
    from rich.console import Console

    from rlx_core.cli.batch import run_batch

    quiet = Console(file=io.StringIO())  # the job's progress bar and summary go nowhere
    job_out = s.out_dir / "out_rlx.npz"

    def ort_loop() -> list[np.ndarray]:
        return [s.session.run(None, {"x": b["x"]})[0] for b in s.batches()]

    def compiled_loop() -> list[np.ndarray]:
        return [s.compiled.run({"x": b["x"]})[0] for b in s.batches()]

    def stream() -> list[dict[str, np.ndarray]]:
        return [s.predictor(b) for b in s.batches()]

    def rlx_job() -> Path:
        run_batch(s.model_path, s.rows_path, job_out, console=quiet)
        return job_out

    def ort_job() -> Path:
        import onnxruntime as ort

        from rlx_core.distributed.tables import open_source

        sess = ort.InferenceSession(str(s.model_path), providers=["CPUExecutionProvider"])
        ys, ids = [], []
        for b in open_source(s.rows_path).batches(s.batch):
            ys.append(sess.run(None, {"x": b["x"]})[0])
            ids.append(b["id"])
        out = s.out_dir / "out_ort.npz"
        np.savez(out, y=np.concatenate(ys), id=np.concatenate(ids))
        return out

    def read() -> list[dict[str, np.ndarray]]:
        return list(s.batches())

    return {"onnxruntime loop": ort_loop, f"rlx {s.device}, compiled loop": compiled_loop,
            "rlx batch stream (Predictor)": stream, "rlx batch job (.npz → .npz)": rlx_job,
            "onnxruntime job (.npz → .npz)": ort_job, READ: read}


def _max_diff(got: np.ndarray, want: np.ndarray, what: str) -> float:
    if got.shape != want.shape:
        raise RlxError(f"bench/batch.py: {what} gave outputs of shape {got.shape}, ONNX Runtime {want.shape}")
    diff = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
    if not diff <= TOLERANCE:
        raise RlxError(f"bench/batch.py: {what} differs from ONNX Runtime by {diff:.3g} (> {TOLERANCE:g})")
    return diff


def check(s: Setup, name: str, result: Any) -> float | None:
    """The largest difference of one pass's outputs from ORT's (``None`` for rows read
    without a model: their ids and inputs are checked); ``RlxError`` if wrong."""
    if name == READ:
        if not (np.array_equal(np.concatenate([r["id"] for r in result]), s.ids)
                and np.array_equal(np.concatenate([r["x"] for r in result]), s.x)):
            raise RlxError(f"bench/batch.py: {name} lost, changed or reordered rows")
        return None
    if isinstance(result, Path):  # a job: the file, with ids in order and a device per row
        with np.load(result, allow_pickle=False) as out:
            if not np.array_equal(out["id"], s.ids):
                raise RlxError(f"bench/batch.py: {name} lost, duplicated or reordered rows (the id column)")
            if "rlx_device" in out.files and set(np.unique(out["rlx_device"]).tolist()) != {s.device}:
                raise RlxError(f"bench/batch.py: {name} ran rows on {sorted(set(out['rlx_device']))}, "
                               f"not {s.device}")
            return _max_diff(out["y"], s.expected, name)
    if result and isinstance(result[0], dict):
        if not np.array_equal(np.concatenate([r["id"] for r in result]), s.ids):
            raise RlxError(f"bench/batch.py: {name} lost or reordered rows (the id column)")
        return _max_diff(np.concatenate([r["y"] for r in result]), s.expected, name)
    return _max_diff(np.concatenate(result), s.expected, name)


def measure(found: dict[str, Callable[[], Any]], blocks: int, pause: float,
            on_block: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Seconds per pass of each contender, one sample per interleaved block (``rlx_core.timer``;
    a pass lasts long enough that no untimed call settles it first)."""
    entries = [Entry(name, run=fn) for name, fn in found.items()]
    interleave(entries, blocks, lambda e, r: 1, pause=pause, settle=False,
               on_round=None if on_block is None else lambda r: on_block())
    for e in entries:
        if e.note:
            raise RlxError(f"bench/batch.py: {e.name} failed while timed: {e.note}")
    return {e.name: e.times for e in entries}


def summarize(rows: int, batch: int, samples: dict[str, list[float]],
              diffs: dict[str, float | None]) -> list[dict[str, Any]]:
    """One row per contender: median rows/s, its interquartile spread, the ratio to the ORT loop.

    The ratio is paired: the median over blocks of the ORT loop's time over the contender's
    in the same block, so that a spell of load on a shared machine, which slows a whole
    block, moves both sides of each ratio instead of one median.
    """
    rates = {name: [rows / t for t in s] for name, s in samples.items()}
    ort = samples["onnxruntime loop"]
    out = []
    for name, r in rates.items():
        q = statistics.quantiles(r, n=4) if len(r) >= 4 else [min(r), 0.0, max(r)]
        out.append({"contender": name, "rows_per_s": statistics.median(r), "rows_per_s_q1": q[0],
                    "rows_per_s_q3": q[2], "us_per_batch": 1e6 * statistics.median(samples[name]) * batch / rows,
                    "vs_ort_loop": statistics.median(o / t for o, t in zip(ort, samples[name])),
                    "max_abs_diff": diffs.get(name)})
    return out


# ---------------------------------------------------------------- Ray
def _timed_job(batches: Iterator[dict[str, np.ndarray]]) -> tuple[dict[str, float | None], list[dict]]:
    """Consume a job's output batches; its total time, start-up (to the first output) and
    rows/s after that, and the outputs."""
    t0 = time.perf_counter()
    outs, stamps = [], []
    for out in batches:
        stamps.append(time.perf_counter() - t0)
        outs.append(out)
    total = stamps[-1] if stamps else time.perf_counter() - t0
    after = sum(len(o["id"]) for o in outs[1:])
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return {"total_s": total, "first_s": stamps[0] if stamps else None,
            "steady_rows_per_s": after / span if span > 0 else None}, outs


def _check_job(s: Setup, name: str, outs: list[dict]) -> float:
    """Ray may hand blocks back in any order: rows are matched to ORT's through the id column."""
    ids = np.concatenate([o["id"] for o in outs])
    if not np.array_equal(np.sort(ids), s.ids):
        raise RlxError(f"bench/batch.py: {name} lost or duplicated rows (the id column)")
    y = np.concatenate([o["y"] for o in outs])
    return _max_diff(y[np.argsort(ids, kind="stable")], s.expected, name)


def bench_ray(s: Setup, jobs: int, pause: float, on_job: Callable[[], None] | None = None) -> dict[str, Any]:
    """``rlx batch --ray`` against ``rlx batch`` in-process, whole jobs, Ray started once and warm."""
    try:
        from rlx_core.distributed import require_ray

        ray = require_ray()
    except RlxError as exc:
        return {"skipped": f"Ray skipped: {exc}"}
    from rlx_core.cli.batch import _in_process, _on_ray
    from rlx_core.distributed import BatchModel
    from rlx_core.distributed.tables import open_source

    for name in ("ray", "ray.data"):  # its INFO lines about every execution would bury the table
        logging.getLogger(name).setLevel(logging.ERROR)
    started = not ray.is_initialized()
    # Ray starts its processes with fork+exec; jax (imported by the device probe) warns about any fork.
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    if started:
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 logging_level=logging.ERROR)
    try:
        def on_ray() -> tuple[dict[str, float | None], list[dict]]:
            return _timed_job(_on_ray(s.model_path, open_source(s.rows_path), "local", RAY_BATCH, None, RAY_CPUS))

        def in_process() -> tuple[dict[str, float | None], list[dict]]:
            t0 = time.perf_counter()
            info = BatchModel(s.model_path)  # run_batch loads the model before the stream starts
            load = time.perf_counter() - t0
            figures, outs = _timed_job(_in_process(info, open_source(s.rows_path), RAY_BATCH, None))
            figures["total_s"] = (figures["total_s"] or 0.0) + load
            figures["first_s"] = (figures["first_s"] or 0.0) + load
            return figures, outs

        found = {f"rlx batch --ray (local, {RAY_CPUS} workers)": on_ray, "rlx batch in-process": in_process}
        diffs = {name: _check_job(s, name, fn()[1]) for name, fn in found.items()}  # also warms Ray up
        runs: dict[str, list[dict[str, float | None]]] = {name: [] for name in found}
        names = list(found)
        for j in range(jobs):
            for name in names[j % 2 :] + names[: j % 2]:
                runs[name].append(found[name]()[0])
            if on_job:
                on_job()
            if pause > 0 and j + 1 < jobs:
                time.sleep(pause)
    finally:
        if started:
            ray.shutdown()
    rows = []
    for name, figures in runs.items():
        steady = [f["steady_rows_per_s"] for f in figures if f["steady_rows_per_s"]]
        total = statistics.median(f["total_s"] for f in figures)  # type: ignore[misc]
        rows.append({"path": name, "rows_per_s": s.rows / total, "total_s": total,
                     "first_s": statistics.median(f["first_s"] for f in figures),  # type: ignore[misc]
                     "steady_rows_per_s": statistics.median(steady) if steady else None,
                     "max_abs_diff": diffs[name]})
    return {"jobs": jobs, "batch": RAY_BATCH, "num_cpus": RAY_CPUS, "ray": ray.__version__, "results": rows}


# ---------------------------------------------------------------- report
def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _spread(r: dict[str, Any]) -> str:
    """The interquartile range of a contender's rows/s."""
    return f"{_rate(r['rows_per_s_q1'])} to {_rate(r['rows_per_s_q3'])}"


def verdict(results: list[dict[str, Any]], device: str, rows: int) -> str:
    """Whether in-process ``rlx batch`` meets the target, and where its time goes, in one line."""
    by = {r["contender"]: r for r in results}
    stream, job = by["rlx batch stream (Predictor)"], by["rlx batch job (.npz → .npz)"]
    ort_job = by["onnxruntime job (.npz → .npz)"]
    ok = stream["vs_ort_loop"] >= TARGET_VS_ORT
    backend = by[f"rlx {device}, compiled loop"]
    # From the paired ratios: each contender's time in units of the ORT loop's, times that.
    over = by["onnxruntime loop"]["us_per_batch"] * (1 / stream["vs_ort_loop"] - 1 / backend["vs_ort_loop"])
    net = ""
    if READ in by:  # the ratio without the reading every contender does alike (times in ORT loops, paired)
        read, mine = 1 / by[READ]["vs_ort_loop"], 1 / stream["vs_ort_loop"]
        if read < 1 and read < mine:
            net = (f"; net of reading the rows ({by[READ]['us_per_batch']:.0f} µs per batch, the same on both "
                   f"sides) the stream is {(1 - read) / (mine - read):.2f}x the ORT loop")
    return (f"rlx batch in-process (stream): {stream['vs_ort_loop']:.2f}x the ORT loop's rows/s (target ≥ "
            f"{TARGET_VS_ORT:g}x: {'met' if ok else 'MISSED'}); the {device} backend alone "
            f"{backend['vs_ort_loop']:.2f}x, so the Predictor adds {over:+.0f} µs per batch of {rows}{net}; whole job "
            f"{job['vs_ort_loop'] / ort_job['vs_ort_loop']:.2f}x the ORT job")


def markdown_section(doc: dict[str, Any]) -> str:
    """The body of the ``## Batch inference`` section of BENCHMARKS.md."""
    m = doc["machine"]
    load = f", 1-minute load average {m['load_1min']:.2f} at the start" if m.get("load_1min") is not None else ""
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    lines = [
        f"Rows per second of `rlx batch` on the suite MLP ({doc['model']}), {doc['rows']:,} float32 rows of 784 "
        f"from an `.npz`, in batches of {doc['batch']} rows (the model's fixed batch). `onnxruntime loop` is "
        "`InferenceSession.run` once per batch (CPU provider, default threads) over the same batches; "
        f"`rlx {doc['device']}, compiled loop` is `rlx_core.compile(...).run` once per batch (the backend "
        "alone); `rlx batch stream` is the loop of `rlx batch` in-process (one `Predictor` called on each batch "
        "dict, with the id column passed through and the device column added); the two jobs are the whole "
        "`rlx batch MODEL rows.npz out.npz` (read, check, load, compile, stream, write) and the same job written "
        "by hand with ONNX Runtime; `read rows` only reads the `.npz` and cuts it into batches, which every "
        "other contender does alike (so its time is in each of theirs). Every output is checked against ONNX "
        "Runtime first.",
        "",
        f"Target: in-process `rlx batch` ≥ {TARGET_VS_ORT:g}x the ORT loop's rows/s.",
        "",
        f"Median of {doc['blocks']} interleaved blocks (one pass over every row per sample, rotating order, "
        f"{doc['pause_ms']:g} ms pause before every sample; `vs ORT loop` is the median over blocks of the ratio "
        f"within a block), measured {doc['date']} on {m['usable_cores']} usable cores, {m['cpu']}{load}; "
        f"{versions}.",
        "",
        f"| contender | rows/s (median) | rows/s (IQR) | µs / {doc['batch']} rows | vs ORT loop "
        "| max abs diff vs ORT |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for r in doc["results"]:
        diff = ("(reference)" if r["contender"] == "onnxruntime loop" else "-" if r["max_abs_diff"] is None
                else f"{r['max_abs_diff']:.2g}")
        lines.append(f"| {r['contender']} | {_rate(r['rows_per_s'])} | {_spread(r)} | {r['us_per_batch']:.0f} | "
                     f"{r['vs_ort_loop']:.2f}x | {diff} |")
    lines += ["", verdict(doc["results"], doc["device"], doc["batch"]) + ".", ""]
    ray = doc.get("ray") or {}
    if "results" in ray:
        lines += [
            f"Ray on this machine (`ray.init(num_cpus={ray['num_cpus']})`, Ray {ray['ray']}): the job of `rlx "
            f"batch --ray` — `map_batches` over a pool of {ray['num_cpus']} workers, outputs streamed back to the "
            f"driver — against the same job in-process, batches of {ray['batch']} rows, median of {ray['jobs']} "
            "jobs after one untimed Ray job. Every Ray job starts its worker pool (a process per worker, which "
            "imports rlx, loads and compiles the model): that is the start-up column; `rows/s after start-up` "
            "counts the rows that came back after the first output.",
            "",
            "| path | job rows/s | job s | start-up s (to first output) | rows/s after start-up |",
            "|---|--:|--:|--:|--:|",
        ]
        for r in ray["results"]:
            lines.append(f"| {r['path']} | {_rate(r['rows_per_s'])} | {r['total_s']:.2f} | {r['first_s']:.2f} | "
                         f"{_rate(r['steady_rows_per_s'])} |")
        lines.append("")
    elif ray.get("skipped"):
        lines += [f"Note: {ray['skipped']}", ""]
    if m.get("load_1min") is not None and m["load_1min"] > (m["usable_cores"] or 1):
        lines += [f"Note: the machine was busy (load {m['load_1min']:.1f} on {m['usable_cores']} cores): these "
                  "figures are inflated and noisy; rerun on a quiet machine.", ""]
    lines += [f"Reproduce: `{doc['command']}` (or `nox -s bench`) in an environment with rlx-core, rlx-cpu, onnx, "
              "onnxruntime, rich and `rlx-core[ray]`.", ""]
    return "\n".join(lines)


def print_console(doc: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"rlx batch: {doc['rows']:,} rows, batches of {doc['batch']}, median of {doc['blocks']} "
                        "interleaved blocks", title_justify="left")
    table.add_column("contender", ratio=1)  # wraps on a narrow terminal; the figures never do
    for head in ("rows/s", "IQR", f"µs/{doc['batch']} rows", "vs ORT loop"):
        table.add_column(head, justify="right", no_wrap=True)
    for r in doc["results"]:
        table.add_row(r["contender"], _rate(r["rows_per_s"]), _spread(r), f"{r['us_per_batch']:.0f}",
                      f"{r['vs_ort_loop']:.2f}x")
    console.print(table)
    console.print(verdict(doc["results"], doc["device"], doc["batch"]), highlight=False)
    ray = doc.get("ray") or {}
    if "results" in ray:
        t = Table(title=f"Ray (num_cpus={ray['num_cpus']}) vs in-process, batches of {ray['batch']}, median of "
                        f"{ray['jobs']} jobs", title_justify="left")
        t.add_column("path", ratio=1)
        for head in ("job rows/s", "job s", "start-up s", "rows/s after"):
            t.add_column(head, justify="right", no_wrap=True)
        for r in ray["results"]:
            t.add_row(r["path"], _rate(r["rows_per_s"]), f"{r['total_s']:.2f}", f"{r['first_s']:.2f}",
                      _rate(r["steady_rows_per_s"]))
        console.print(t)
    elif ray.get("skipped"):
        console.print(ray["skipped"], highlight=False)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/batch.py", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4,096 rows, 3 blocks, 1 Ray job: checks that it runs")
    parser.add_argument("--rows", type=int, help=f"rows to run (default {ROWS:,}; 4,096 with --quick)")
    parser.add_argument("--blocks", type=int, help="interleaved blocks (default 20, 3 with --quick)")
    parser.add_argument("--ray-jobs", type=int, help="timed Ray jobs (default 5, 1 with --quick)")
    parser.add_argument("--no-ray", action="store_true", help="leave out the Ray comparison")
    parser.add_argument("--pause", type=float, help="seconds of sleep before every sample (default 0.15)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-': JSON on stdout only)")
    parser.add_argument("--write", nargs="?", const=str(BENCHMARKS_MD), metavar="FILE",
                        help=f"rewrite the '{SECTION_NAME}' section of BENCHMARKS.md (or FILE)")
    args = parser.parse_args(argv)
    args.rows = args.rows if args.rows is not None else (4096 if args.quick else ROWS)
    args.blocks = args.blocks if args.blocks is not None else (3 if args.quick else 20)
    args.ray_jobs = args.ray_jobs if args.ray_jobs is not None else (1 if args.quick else 5)
    args.pause = args.pause if args.pause is not None else (0.02 if args.quick else 0.15)
    if args.rows < 1 or args.blocks < 1 or args.ray_jobs < 1 or args.pause < 0:
        parser.error("--rows, --blocks and --ray-jobs must be >= 1 and --pause >= 0")
    return args


def run(args: argparse.Namespace, command: str, console: Any) -> dict[str, Any]:
    """Every measurement of one invocation, as a JSON-ready document."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    machine = _report.machine()
    machine["load_1min"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # before any work
    with tempfile.TemporaryDirectory(prefix="rlx-bench-batch-") as tmp:
        s = Setup(Path(tmp), args.rows)
        found = contenders(s)
        diffs = {name: check(s, name, fn()) for name, fn in found.items()}
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("in-process", total=args.blocks)
            samples = measure(found, args.blocks, args.pause, on_block=lambda: progress.advance(task))
            ray: dict[str, Any] = {"skipped": "Ray skipped: --no-ray"} if args.no_ray else {}
            if not args.no_ray:
                job = progress.add_task("Ray jobs", total=args.ray_jobs)
                ray = bench_ray(s, args.ray_jobs, args.pause, on_job=lambda: progress.advance(job))
        rows = summarize(s.rows, s.batch, samples, diffs)
        return {"benchmark": "batch", "command": command, "date": time.strftime("%Y-%m-%d %H:%M %Z"),
                "model": s.summary, "rows": s.rows, "batch": s.batch, "device": s.device, "blocks": args.blocks,
                "pause_ms": args.pause * 1e3, "machine": machine, "results": rows, "ray": ray}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rich.console import Console

    console = Console(stderr=args.json == "-")
    try:
        import onnxruntime  # noqa: F401  (the yardstick)
    except ImportError:
        console.print("bench/batch.py needs onnxruntime: pip install onnxruntime", highlight=False)
        return 2
    given = sys.argv[1:] if argv is None else argv
    command = "python bench/batch.py" + "".join(" " + shlex.quote(a) for a in given)
    doc = run(args, command, console)
    if args.json == "-":
        import json

        print(json.dumps(doc, indent=2))
    else:
        print_console(doc, console)
        if args.json:
            import json

            _markdown.write_atomic(Path(args.json), json.dumps(doc, indent=2) + "\n")
            console.print(f"wrote {args.json}", highlight=False)
    if args.write:
        _markdown.update_file(args.write, {SECTION_NAME: markdown_section(doc)})
        console.print(f"wrote the {SECTION_NAME!r} section of {args.write}", highlight=False)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RlxError as exc:
        print(f"bench/batch.py: {exc}", file=sys.stderr)
        sys.exit(1)
