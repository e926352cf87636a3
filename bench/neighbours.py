"""rlx cpu beside other runtimes in one process (issue 35's "good neighbours").

A service may hold rlx next to torch, ONNX Runtime or OpenVINO. Each keeps a thread pool
that spins for a while after every call (ORT's intra-op pool, OpenMP in torch, TBB in
OpenVINO), and on a host with few cores those spinning threads take the cores rlx's
threads need. This bench measures how much rlx's time moves when a neighbour lives in its
process, and how much rlx moves the neighbour's time.

Each model of ``bench/zoo.py`` is exported once (torch's classic exporter), written to a
temporary directory, and every scenario then runs in a fresh Python process (so that
what is imported, and which ``libgomp`` the loader keeps, is exactly that scenario's):

- ``alone``: rlx only (numpy and onnx; torch never imported);
- ``<n> idle``: neighbour ``n`` (torch running the same network as a torch module,
  ``onnxruntime`` or ``openvino`` on the ONNX file; ``onnxruntime-quiet`` is ORT with
  ``session.intra_op.allow_spinning=0``) created and run a few times, then left idle
  while rlx is timed;
- ``<n> interleaved``: every rlx call comes right after one call of the neighbour (two
  models served in turn); rlx's calls and the neighbour's calls are timed apart, and
  the neighbour's are compared with its own ``<n> alone`` process.
- ``busy``: rlx alone in its process, run for ``BUSY_WARM_S`` (a service that ran on a
  quiet host: its thread tuner's probes have grown far apart), then timed while another
  process spins one thread on the same cores; ``<n> busy``: the neighbour the same way,
  so that each runtime's slowdown under load sits beside rlx's.

rlx's figure is the median over rounds of the mean time per call (one block of calls a
round, 150 ms pauses between rounds); "/ alone" divides by the ``alone`` scenario's. The
issue's target is at most 1.1x rlx's time alone in every scenario.

torch, torchvision and onnxruntime are needed (the zoo's environment); openvino where
installed (``pip install openvino``); a neighbour that does not import is skipped.

    python bench/neighbours.py                                  # resnet50, mobilenet_v2, bert at batch 1
    python bench/neighbours.py --models resnet18 --batch 8 --neighbours onnxruntime
    python bench/neighbours.py --busy --neighbours onnxruntime,openvino   # also under another process's load
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

NEIGHBOURS = ("torch", "onnxruntime", "onnxruntime-quiet", "openvino")
#: Seconds the ``busy`` scenarios run their model on the quiet host before the load starts.
BUSY_WARM_S = 3.0


def _neighbour(kind: str, model_path: Path, feeds: dict[str, np.ndarray], name: str) -> Any:
    """A zero-argument call running ``kind`` on the model (its pool created and warm)."""
    if kind in ("onnxruntime", "onnxruntime-quiet"):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if kind == "onnxruntime-quiet":  # its pool sleeps as soon as a call ends
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        feed = {i.name: feeds[i.name] for i in sess.get_inputs()}
        return lambda: sess.run(None, feed)[0]
    if kind == "openvino":
        import openvino as ov

        compiled = ov.Core().compile_model(str(model_path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        order = [feeds[p.get_any_name()] for p in compiled.inputs]
        return lambda: request.infer(order)
    if kind == "torch":
        import torch

        from bench.zoo import ZOO, torch_module

        module = torch_module(ZOO[name], list(feeds))
        args = [torch.from_numpy(v) for v in feeds.values()]

        def call() -> Any:
            with torch.inference_mode():
                return module(*args)
        return call
    raise ValueError(f"neighbours: unknown neighbour {kind!r}; known: {', '.join(NEIGHBOURS)}")


def _blocks(calls: list[Any], rounds: int, per_block: int, pause: float) -> list[list[float]]:
    """Per round, each call's mean seconds over ``per_block`` calls made in turn (call 0,
    call 1, ..., call 0, ...): with one call that is a plain block; with two, each call of
    the second comes right after one of the first."""
    import gc

    out: list[list[float]] = [[] for _ in calls]
    gc.disable()
    try:
        for _ in range(rounds):
            time.sleep(pause)
            spent = [0.0] * len(calls)
            for _ in range(per_block):
                for i, call in enumerate(calls):
                    t0 = time.perf_counter()
                    call()
                    spent[i] += time.perf_counter() - t0
            for i, s in enumerate(spent):
                out[i].append(s / per_block)
    finally:
        gc.enable()
    return out


def child(scenario: str, workdir: Path, name: str, rounds: int, target_s: float) -> dict[str, Any]:
    """One scenario, in this (fresh) process: medians in ms."""
    feeds = dict(np.load(workdir / "inputs.npz"))
    model_path = workdir / "model.onnx"
    kind, _, mode = scenario.partition(" ")
    busy = "busy" in (kind, mode)
    mode = "only" if mode == "busy" else mode
    neighbour = None
    if kind in NEIGHBOURS:
        neighbour = _neighbour(kind, model_path, feeds, name)
        for _ in range(5):
            neighbour()
    calls = []
    if mode != "only":
        import rlx_core
        from rlx_core.onnx import load

        graph = load(model_path.read_bytes())
        mine = {k: v for k, v in feeds.items() if k in {graph.node(i).name for i in graph.inputs}}
        cg = rlx_core.compile(graph, device="cpu")
        for _ in range(20):  # past the thread tuner's comparison
            cg.run(mine)
        start = time.perf_counter()
        while busy and time.perf_counter() - start < BUSY_WARM_S:
            cg.run(mine)
        calls.append(lambda: cg.run(mine)[0])
    if neighbour is not None and mode in ("interleaved", "only"):
        calls.append(neighbour)
    t0 = time.perf_counter()
    for call in calls:
        call()
    per_block = max(1, round(target_s / max(time.perf_counter() - t0, 1e-6)))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        times = _blocks(calls, rounds, per_block, 0.15)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    row: dict[str, Any] = {"scenario": scenario}
    if mode != "only":
        row["rlx_ms"] = float(np.median(times[0])) * 1e3
    if len(times) > (0 if mode == "only" else 1):
        row["neighbour_ms"] = float(np.median(times[-1])) * 1e3
    return row


def _scenarios(neighbours: list[str], busy: bool = False) -> list[str]:
    out = ["alone", *(["busy"] if busy else [])]
    for n in neighbours:
        out += [f"{n} idle", f"{n} interleaved", f"{n} only", *([f"{n} busy"] if busy else [])]
    return out


def _available(kind: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(kind.split("-")[0]) is not None


def run(name: str, batch: int, neighbours: list[str], rounds: int, target_s: float,
        busy: bool = False) -> list[dict[str, Any]]:
    """Every scenario of one model, each in its own process."""
    from bench.zoo import ZOO, export

    data, inputs = export(ZOO[name], batch, "classic")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlx-neighbours-") as tmp:
        work = Path(tmp)
        (work / "model.onnx").write_bytes(data)
        np.savez(work / "inputs.npz", **inputs)
        for scenario in _scenarios(neighbours, busy):
            cmd = [sys.executable, __file__, "--child", scenario, "--workdir", str(work), "--models", name,
                   "--batch", str(batch), "--rounds", str(rounds), "--target-ms", str(target_s * 1e3)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), check=False)
            if done.returncode != 0:
                rows.append({"scenario": scenario, "error": done.stderr.strip().splitlines()[-1:]})
                continue
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return rows


def _table(name: str, batch: int, rows: list[dict[str, Any]]) -> list[float]:
    """Print one model's rows; return rlx's ratios to its time alone."""
    alone = next((r["rlx_ms"] for r in rows if r["scenario"] == "alone" and "rlx_ms" in r), None)
    only = {r["scenario"].split()[0]: r["neighbour_ms"] for r in rows if r["scenario"].endswith(" only")
            and "neighbour_ms" in r}
    ratios = []
    for r in rows:
        if "error" in r:
            print(f"| {name} | {batch} | {r['scenario']} | error: {r['error']} | | | |")
            continue
        if r["scenario"].endswith(" only"):
            continue
        n = r["scenario"].split()[0]
        if "rlx_ms" not in r:  # a neighbour under load: beside its own process
            print(f"| {name} | {batch} | {r['scenario']} | | | {r['neighbour_ms']:.2f} ms | "
                  f"{r['neighbour_ms'] / only[n] if n in only else float('nan'):.2f}x |", flush=True)
            continue
        ratio = r["rlx_ms"] / alone if alone else float("nan")
        if r["scenario"] != "busy":  # the 1.1x is about neighbours in the process, not load
            ratios.append(ratio)
        moved = (f"{r['neighbour_ms']:.2f} ms | {r['neighbour_ms'] / only[n]:.2f}x" if "neighbour_ms" in r
                 and n in only else " | ")
        print(f"| {name} | {batch} | {r['scenario']} | {r['rlx_ms']:.2f} ms | {ratio:.2f}x | {moved} |", flush=True)
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,mobilenet_v2,bert", help="comma-separated zoo names")
    parser.add_argument("--batch", default="1", help="comma-separated batch sizes")
    parser.add_argument("--neighbours", default=",".join(NEIGHBOURS), help="comma-separated: " + ", ".join(NEIGHBOURS))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--target-ms", type=float, default=200.0, help="length of one round's block")
    parser.add_argument("--busy", action="store_true",
                        help="also time rlx and each neighbour while another process spins one thread")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        row = child(args.child, args.workdir, args.models, args.rounds, args.target_ms / 1e3)
        print(json.dumps(row))
        return 0
    neighbours = [n.strip() for n in args.neighbours.split(",") if n.strip()]
    unknown = [n for n in neighbours if n not in NEIGHBOURS]
    if unknown:
        parser.error(f"unknown neighbours {unknown}; known: {', '.join(NEIGHBOURS)}")
    missing = [n for n in neighbours if not _available(n)]
    for n in missing:
        print(f"neighbours: {n} is not installed here, skipped", file=sys.stderr)
    neighbours = [n for n in neighbours if n not in missing]
    print("| model | batch | scenario | rlx | / alone | neighbour | / its own process |")
    print("|---|--:|---|--:|--:|--:|--:|")
    everything, ratios = [], []
    for batch in (int(b) for b in args.batch.split(",")):
        for name in (m.strip() for m in args.models.split(",") if m.strip()):
            rows = run(name, batch, neighbours, args.rounds, args.target_ms / 1e3, args.busy)
            ratios += _table(name, batch, rows)
            everything.append({"model": name, "batch": batch, "rows": rows})
    finite = [r for r in ratios if math.isfinite(r)]
    if finite:
        print(f"worst rlx / alone: {max(finite):.2f}x over {len(finite)} rows")
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
