"""Load + compile time of rlx against onnxruntime's session creation, on ONNX files.

    python bench/compile_time.py a.onnx b.onnx [--device cpu] [--rounds 5] [--json OUT]
    python bench/compile_time.py warm.onnx b.onnx c.onnx --fresh 5   # fresh processes; warm.onnx not measured

One process (by default). A first model is loaded and compiled untimed (imports, the backend's
once-per-process measurements), then for each file, ``--rounds`` times, interleaved:
``onnxruntime.InferenceSession`` (CPU provider, default options) and rlx's
``onnx.load`` + ``compile``; each figure is the best round (compile time is
deterministic work: the best round is the least disturbed one). The first round of each
file is also reported apart: later rounds find oneDNN's primitives in its process-wide
cache (a model compiled again in one process), which a process loading a model once
does not. rlx's compile is split
into the pass pipeline (``run_pipeline``: legalize, optimize, fuse, plan) and the
backend's ``compile``, the rest being placement and checks.

``--fresh N`` measures what a user's process pays instead: for each file after the
first, N new processes, each of which imports both runtimes, loads, compiles and runs the
first file once untimed in each (the once-per-process work: libraries loaded, this host's
verdicts read; that file is not measured),
then times one ``InferenceSession`` and one
rlx load + compile of the file, in alternating order from process to process; the
figures are medians over the N processes. Each process then runs the model once in
each runtime at ``first_inputs`` (every symbolic dim 1): "to the first result" adds that
run to both sides, which is what a user waits for (a model with a symbolic batch is
compiled by rlx at a representative batch, and a batch of one is a second compile).
Nothing compiled before is in the process, so no cache of a previous compile and no
memory a previous compile freed is there to reuse (on a 2-core VM a compile that must
touch fresh memory pays ~0.5 ms per MB in page faults, which the one-process rounds
hide or add depending on what the round before left behind).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx


def _timed(spent: dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t0

    return wrapper


def _session_seconds(ort: Any, path: Path) -> float:
    """Seconds onnxruntime takes to create a session on ``path`` (CPU provider, defaults)."""
    t0 = time.perf_counter()
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return time.perf_counter() - t0


def _rlx_seconds(path: Path, device: str) -> tuple[float, float, Any]:
    """Seconds rlx takes to load ``path`` and to compile it on ``device``, and the graph."""
    t0 = time.perf_counter()
    graph = rlx_onnx.load(path)
    t1 = time.perf_counter()
    compiled = rlx.compile(graph, device=device)
    return t1 - t0, time.perf_counter() - t1, (graph, compiled)


def first_inputs(path: Path) -> dict[str, Any]:
    """Zeros for every input of the model at ``path``, each symbolic dim 1 (a batch of one,
    the size a model with a symbolic batch most often meets first), the fixed ones as the
    model declares them."""
    import numpy as np

    feeds = {}
    for spec in rlx_onnx.list_inputs(path):
        shape = tuple(d if isinstance(d, int) else 1 for d in spec.shape)
        feeds[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return feeds


def _first_runs(ort: Any, path: Path, compiled: Any) -> tuple[float, float]:
    """Seconds of one run at ``first_inputs`` in a new ORT session (not timed: its
    creation) and in rlx's compiled graph: what a first request pays after the session or
    compile (rlx: its compile for those sizes, when they are a new shape class)."""
    feeds = first_inputs(path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    t0 = time.perf_counter()
    sess.run(None, feeds)
    t1 = time.perf_counter()
    compiled.run(feeds)
    return t1 - t0, time.perf_counter() - t1


def _geomean(ratios: list[float]) -> float:
    return math.exp(sum(map(math.log, ratios)) / len(ratios))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--fresh", type=int, default=0, metavar="N",
                        help="N fresh processes per model instead of rounds in this one")
    parser.add_argument("--child", choices=("ort-first", "rlx-first"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.models[0], args.models[-1], args.device, args.child)
    if args.fresh:
        return _fresh(args.models, args.device, args.fresh, args.json)
    import onnxruntime as ort

    import rlx_core.compiler.compiled as compiled
    import rlx_core.compiler.lowering as lowering

    spent: dict[str, float] = defaultdict(float)
    lowering.run_pipeline = _timed(spent, "pipeline", lowering.run_pipeline)  # type: ignore[attr-defined]
    compiled.backend_compile = _timed(spent, "backend", compiled.backend_compile)
    rlx.compile(rlx_onnx.load(args.models[0]), device=args.device)  # once-per-process work, untimed
    rows, ratios, firsts = [], [], []
    for path in args.models:
        best: dict[str, float] = {}
        first = 0.0
        for round_ in range(args.rounds):
            t_ort = _session_seconds(ort, path)
            spent.clear()
            load, comp, (graph, _) = _rlx_seconds(path, args.device)
            got = {"ort": t_ort, "load": load, "compile": comp, "pipeline": spent["pipeline"],
                   "backend": spent["backend"]}
            if round_ == 0:
                first = (got["load"] + got["compile"]) / t_ort
            best["ort"] = min(best.get("ort", math.inf), t_ort)
            if got["load"] + got["compile"] < best.get("load", math.inf) + best.get("compile", math.inf):
                best.update({k: v for k, v in got.items() if k != "ort"})
        ratio = (best["load"] + best["compile"]) / best["ort"]
        ratios.append(ratio)
        firsts.append(first)
        row = {"model": path.name, "nodes": len(graph), **{f"{k}_ms": round(v * 1e3, 1) for k, v in best.items()},
               "ratio": round(ratio, 2), "first_round_ratio": round(first, 2)}
        rows.append(row)
        print(f"{path.name:28s} ORT {row['ort_ms']:6.0f} ms | rlx load {row['load_ms']:6.0f} + compile "
              f"{row['compile_ms']:6.0f} (pipeline {row['pipeline_ms']:5.0f}, backend {row['backend_ms']:5.0f}) "
              f"| {ratio:.2f}x (first round {first:.2f}x)", flush=True)
    geomean, first_geomean = _geomean(ratios), _geomean(firsts)
    print(f"geometric mean (load + compile) / ORT session: {geomean:.2f}x best rounds, "
          f"{first_geomean:.2f}x first rounds")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "geomean": geomean, "first_round_geomean": first_geomean},
                                        indent=1))
    return 0


def _child(warm: Path, path: Path, device: str, order: str) -> int:
    """One fresh process's figures for ``path`` (after ``warm`` once in each runtime), as
    one JSON line on stdout."""
    import onnxruntime as ort

    _session_seconds(ort, warm)
    _, _, (_, warmed) = _rlx_seconds(warm, device)
    _first_runs(ort, warm, warmed)  # (a compile may leave a class to its first run: libraries load there)
    if order == "ort-first":
        t_ort = _session_seconds(ort, path)
        load, comp, (_, compiled) = _rlx_seconds(path, device)
    else:
        load, comp, (_, compiled) = _rlx_seconds(path, device)
        t_ort = _session_seconds(ort, path)
    ort_run, rlx_run = _first_runs(ort, path, compiled)
    print(json.dumps({"ort": t_ort, "load": load, "compile": comp, "ort_run": ort_run, "rlx_run": rlx_run}))
    return 0


def _fresh(models: list[Path], device: str, n: int, out: Path | None) -> int:
    import statistics
    import subprocess
    import sys

    if len(models) < 2:
        raise SystemExit("--fresh: give a model to warm up with first, then the models to measure")
    rows, ratios, firsts = [], [], []
    for path in models[1:]:
        got: dict[str, list[float]] = defaultdict(list)
        for i in range(n):
            order = "ort-first" if i % 2 == 0 else "rlx-first"
            proc = subprocess.run([sys.executable, __file__, str(models[0]), str(path), "--device", device,
                                   "--child", order], capture_output=True, text=True, check=True)
            for key, value in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                got[key].append(value)
        med = {k: statistics.median(v) for k, v in got.items()}
        ratio = (med["load"] + med["compile"]) / med["ort"]
        first = (med["load"] + med["compile"] + med["rlx_run"]) / (med["ort"] + med["ort_run"])
        ratios.append(ratio)
        firsts.append(first)
        row = {"model": path.name, **{f"{k}_ms": round(v * 1e3, 1) for k, v in med.items()}, "ratio": round(ratio, 2),
               "first_result_ratio": round(first, 2)}
        rows.append(row)
        print(f"{path.name:28s} ORT {row['ort_ms']:6.0f} ms | rlx load {row['load_ms']:6.0f} + compile "
              f"{row['compile_ms']:6.0f} | {ratio:.2f}x; first run ORT {row['ort_run_ms']:6.1f} rlx "
              f"{row['rlx_run_ms']:6.1f} ms: to the first result {first:.2f}x (medians of {n} fresh processes)",
              flush=True)
    geomean, first_geomean = _geomean(ratios), _geomean(firsts)
    print(f"geometric mean (load + compile) / ORT session, fresh processes: {geomean:.2f}x; "
          f"to the first result (+ one run, symbolic dims 1): {first_geomean:.2f}x")
    if out:
        out.write_text(json.dumps({"rows": rows, "geomean": geomean, "first_result_geomean": first_geomean,
                                   "fresh": n}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
