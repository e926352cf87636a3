"""Load + compile time of rlx against onnxruntime's session creation, on ONNX files.

    python bench/compile_time.py a.onnx b.onnx [--device cpu] [--rounds 5] [--json OUT]

One process. A first model is loaded and compiled untimed (imports, the backend's
once-per-process measurements), then for each file, ``--rounds`` times, interleaved:
``onnxruntime.InferenceSession`` (CPU provider, default options) and rlx's
``onnx.load`` + ``compile``; each figure is the best round (compile time is
deterministic work: the best round is the least disturbed one). The first round of each
file is also reported apart: later rounds find oneDNN's primitives in its process-wide
cache (a model compiled again in one process), which a process loading a model once
does not. rlx's compile is split
into the pass pipeline (``run_pipeline``: legalize, optimize, fuse, plan) and the
backend's ``compile``, the rest being placement and checks.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
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
            t0 = time.perf_counter()
            ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            t_ort = time.perf_counter() - t0
            spent.clear()
            t0 = time.perf_counter()
            graph = rlx_onnx.load(path)
            t1 = time.perf_counter()
            rlx.compile(graph, device=args.device)
            t2 = time.perf_counter()
            got = {"ort": t_ort, "load": t1 - t0, "compile": t2 - t1, "pipeline": spent["pipeline"],
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
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    first_geomean = math.exp(sum(map(math.log, firsts)) / len(firsts))
    print(f"geometric mean (load + compile) / ORT session: {geomean:.2f}x best rounds, "
          f"{first_geomean:.2f}x first rounds")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "geomean": geomean, "first_round_geomean": first_geomean},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
