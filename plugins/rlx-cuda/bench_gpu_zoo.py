"""The zoo on a GPU: rlx cuda (and jax) against torch eager on the same GPU, and auto's pick.

For each model of ``bench/zoo.py`` (torchvision/transformers with random weights,
exported once by torch's classic exporter with a dynamic batch axis) and each batch:

* **vs torch eager**: rlx ``cuda`` with its inputs already on the GPU (``run_dlpack``)
  against the torch module itself on the GPU (no grad, TF32 off in both, cuDNN's default
  algorithm choice), medians of CUDA-synchronized runs; with ``--no-cudnn-too`` also
  rlx cuda with ``RLX_CUDA_CUDNN=off`` (im2col + cuBLAS) for the convolutions' share;
* **auto's regret**: what ``rlx_core.compile(graph)`` picked, and its ``run`` time (host
  arrays in and out: what the pick is about) over the fastest device's, among cuda, jax
  and (at batch 1, or when picked) cpu.

Every output is checked against torch's (relative error in the JSON). Run from the
repository root on a GPU host: ``python plugins/rlx-cuda/bench_gpu_zoo.py --json OUT
[--models resnet18,...] [--batches 1,32]``; one JSON line per (model, batch) as it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = "resnet18,resnet50,mobilenet_v2,convnext_tiny,efficientnet_b0,bert"


def median_seconds(fn: Callable[[], Any], sync: Callable[[], None], budget_s: float = 0.4) -> float:
    """Median of synchronized runs after warm-up: as many as fit in ``budget_s`` (5-50)."""
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    times = []
    for _ in range(int(min(50, max(5, budget_s / max(first, 1e-6))))):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / (np.max(np.abs(want)) or 1.0))


def one(name: str, data: bytes, module: Any, batch: int, no_cudnn_too: bool) -> dict[str, Any]:
    import cupy as cp
    import torch

    import rlx_core
    from bench.zoo import ZOO
    from rlx_core.onnx import load

    row: dict[str, Any] = {"model": name, "batch": batch}
    inputs = ZOO[name].inputs(batch)
    graph = load(data, dims={"batch": batch})
    feeds = {k: v for k, v in inputs.items() if k in {graph.node(i).name for i in graph.inputs}}
    tsync = torch.cuda.synchronize
    mod = module.cuda().eval()
    targs = [torch.from_numpy(inputs[k]).cuda() for k in inputs]
    with torch.no_grad():
        want = mod(*targs).float().cpu().numpy().astype(np.float64)
        row["torch_ms"] = 1e3 * median_seconds(lambda: mod(*targs), tsync)
    csync = cp.cuda.Device().synchronize
    dev_feeds = {k: cp.asarray(v) for k, v in feeds.items()}
    host: dict[str, float] = {}
    for label, mode in [("cuda", "auto")] + ([("cuda_no_cudnn", "off")] if no_cudnn_too else []):
        os.environ["RLX_CUDA_CUDNN"] = mode
        row.update(_time_cuda(label, graph, feeds, dev_feeds, want, csync, host if label == "cuda" else None))
        row[f"{label}_vs_torch"] = row[f"{label}_ms"] / row["torch_ms"]
    os.environ["RLX_CUDA_CUDNN"] = "auto"
    for device in ["jax"] + (["cpu"] if batch == 1 else []):
        try:
            cg = rlx_core.compile(graph, device=device)
            row[f"{device}_rel"] = _rel(cg.run(feeds)[0], want)
            host[device] = 1e3 * median_seconds(_runner(cg, feeds), lambda: None)
        except Exception as exc:
            row[f"{device}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    auto = rlx_core.compile(graph)
    row["auto"] = auto.device
    picked = auto.device.split(":")[0]
    if picked not in host:
        host[picked] = 1e3 * median_seconds(_runner(auto, feeds), csync)
    row["host_ms"] = host
    row["auto_regret"] = host[picked] / min(host.values())
    return row


def _runner(cg: Any, feeds: dict[str, Any]) -> Callable[[], Any]:
    return lambda: cg.run(feeds)


def _time_cuda(label: str, graph: Any, feeds: dict[str, np.ndarray], dev_feeds: dict[str, Any], want: np.ndarray,
               sync: Callable[[], None], host: dict[str, float] | None) -> dict[str, Any]:
    """Compile on cuda (under the RLX_CUDA_CUDNN set by the caller), check, time device-in
    (``run_dlpack``) and, given ``host``, host-in/out ``run`` too."""
    import rlx_core

    t0 = time.perf_counter()
    cg = rlx_core.compile(graph, device="cuda")
    out: dict[str, Any] = {f"{label}_compile_s": round(time.perf_counter() - t0, 2)}
    out[f"{label}_rel"] = _rel(cg.run(feeds)[0], want)
    exe = cg._exe
    out[f"{label}_ms"] = 1e3 * median_seconds(lambda: exe.run_dlpack(dev_feeds), sync)
    if host is not None:
        out["cuda_notes"] = [n for n in cg.report().notes if n.startswith(("convolutions", "CUDA graph"))]
        host["cuda"] = 1e3 * median_seconds(_runner(cg, feeds), sync)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--no-cudnn-too", action="store_true", help="also time cuda with RLX_CUDA_CUDNN=off")
    parser.add_argument("--json", type=Path, help="append one JSON line per (model, batch) here")
    args = parser.parse_args(argv)
    import torch

    from bench.zoo import ZOO, export_module, torch_module

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        try:
            inputs = ZOO[name].inputs(2)
            module = torch_module(ZOO[name], list(inputs))
            data = export_module(module, inputs, "classic", dynamic_batch=True)
        except Exception as exc:
            print(json.dumps({"model": name, "export_error": f"{type(exc).__name__}: {str(exc)[:200]}"}), flush=True)
            continue
        for batch in [int(b) for b in args.batches.split(",")]:
            try:
                row = one(name, data, module, batch, args.no_cudnn_too)
            except Exception as exc:
                row = {"model": name, "batch": batch, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            line = json.dumps(row, default=str)
            print(line, flush=True)
            if args.json:
                with args.json.open("a", encoding="utf-8") as f:
                    f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
