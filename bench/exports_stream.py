"""A stream of new sizes through real dynamic-axes exports: rlx devices against ONNX Runtime.

``bench/dynamic.py`` serves its two width-256 models; this serves the exports of
``bench/dynamic_exports.py`` (torch's classic and dynamo exporters, tiny widths, random
weights), where per-request overheads weigh more. Each model is loaded without dims, once
per runtime, and served ``--requests`` requests of random batch (1 to ``--max-batch``)
and sequence (1 to ``--max-seq``), the same requests for every runtime, every time and
compile counted (a compile is what a new size costs). Runtimes serve blocks of 10
requests back to back after a 150 ms pause, in turn (on two cores the one that runs
second pays for the other's spinning threads otherwise).

    python bench/exports_stream.py                                   # bert, gpt2, llama; both exporters; cpu
    python bench/exports_stream.py --devices cpu,jax,jax/exact --exporters classic --requests 60
    python bench/exports_stream.py --models bert --json out.json
    python bench/exports_stream.py --static 8x128,1x64                # one size, served again and again

``--static BxS`` serves each export at that one batch and sequence instead, after
``WARMUP`` runs (rlx has compiled a plan for the size at the fourth, as it does for a size
met three times, and its thread tuner has timed its two modes):
blocks of 10 runs, in turn with ORT, 150 ms apart; medians of 10 blocks per runtime.

One line per (model, exporter, device): total / ORT's, the worst request / ORT's same
request, the median request / ORT's, and the compiles rlx made (``cg.compiles``). A device
written ``jax/exact`` runs with shape buckets off (``CompileOptions(extra={"buckets":
"off"})``): every new set of sizes compiled, what buckets save.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.dynamic_exports import EXPORTERS, MODELS, _names, available, export, inputs  # noqa: E402

__all__ = ["main", "requests", "serve"]

TEXT_MODELS = ("bert", "gpt2", "llama")
BLOCK = 10
PAUSE_S = 0.15
#: Runs before ``--static`` times a size: the plan compiled, the cpu thread tuner's trials
#: (~21 runs) done.
WARMUP = 30


def requests(n: int, max_batch: int, max_seq: int, seed: int) -> list[tuple[int, int]]:
    """``n`` random (batch, sequence) pairs."""
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(1, max_batch + 1)), int(rng.integers(1, max_seq + 1))) for _ in range(n)]


def serve(runners: dict[str, Any], feeds: list[dict[str, np.ndarray]]) -> dict[str, list[float]]:
    """Each runner's seconds per request, blocks of ``BLOCK`` after a pause, in turn."""
    times: dict[str, list[float]] = {k: [] for k in runners}
    order = list(runners)
    for start in range(0, len(feeds), BLOCK):
        for name in order:
            time.sleep(PAUSE_S)
            run = runners[name]
            for feed in feeds[start:start + BLOCK]:
                t0 = time.perf_counter()
                run(feed)
                times[name].append(time.perf_counter() - t0)
        order = order[1:] + order[:1]
    return times


def _ort(data: bytes) -> tuple[Any, set[str]]:
    """An ONNX Runtime session over ``data`` (CPU provider) and its input names."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    return sess, {i.name for i in sess.get_inputs()}


def _rlx(data: bytes, device: str) -> tuple[Any, set[str]]:
    """``data`` loaded without dims and compiled for ``device`` (``DEVICE/exact``: shape
    buckets off), and its input names."""
    import rlx_core
    from rlx_core.onnx import load

    base_device, _, how = device.partition("/")
    graph = load(data)
    options = rlx_core.CompileOptions(extra={"buckets": "off"}) if how == "exact" else None
    return (rlx_core.compile(graph, device=base_device, options=options),
            {graph.node(i).name for i in graph.inputs})


def stream(name: str, exporter: str, devices: list[str], reqs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    data = export(name, exporter)
    sess, ort_names = _ort(data)
    feeds = [inputs(name, b, s, seed=i) for i, (b, s) in enumerate(reqs)]
    runners: dict[str, Any] = {"ort": lambda f: sess.run(None, {k: v for k, v in f.items() if k in ort_names})}
    compiled = {}
    for device in devices:
        cg, names = _rlx(data, device)
        compiled[device] = cg
        runners[device] = (lambda c, n: lambda f: c.run({k: v for k, v in f.items() if k in n}))(cg, names)
    times = serve(runners, feeds)
    base = np.asarray(times["ort"])
    rows = []
    for device in devices:
        mine = np.asarray(times[device])
        ratio = mine / base
        rows.append({"model": name, "exporter": exporter, "device": device, "requests": len(reqs),
                     "total_ratio": round(float(mine.sum() / base.sum()), 3),
                     "worst_ratio": round(float(ratio.max()), 2), "median_ratio": round(float(np.median(ratio)), 3),
                     "rlx_total_s": round(float(mine.sum()), 3), "ort_total_s": round(float(base.sum()), 3),
                     "compiles": int(getattr(compiled[device], "compiles", 0))})
    return rows


def steady(name: str, exporter: str, device: str, size: tuple[int, int], blocks: int = 10) -> dict[str, Any]:
    """rlx's time over ORT's at one ``(batch, seq)``, served again and again (see the module)."""
    data = export(name, exporter)
    sess, ort_names = _ort(data)
    cg, rlx_names = _rlx(data, device)
    feed = inputs(name, *size, seed=0)
    ort_feed = {k: v for k, v in feed.items() if k in ort_names}
    rlx_feed = {k: v for k, v in feed.items() if k in rlx_names}
    runners = {"rlx": lambda: cg.run(rlx_feed), "ort": lambda: sess.run(None, ort_feed)}
    for _ in range(WARMUP):
        for run in runners.values():
            run()
    times: dict[str, list[float]] = {k: [] for k in runners}
    order = list(runners)
    for _ in range(blocks):
        for key in order:
            time.sleep(PAUSE_S)
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                runners[key]()
            times[key].append((time.perf_counter() - t0) / BLOCK)
        order.reverse()
    rlx_s, ort_s = float(np.median(times["rlx"])), float(np.median(times["ort"]))
    return {"model": name, "exporter": exporter, "device": device, "batch": size[0], "seq": size[1],
            "rlx_ms": round(rlx_s * 1e3, 3), "ort_ms": round(ort_s * 1e3, 3), "ratio": round(rlx_s / ort_s, 3)}


def _sizes(text: str, parser: argparse.ArgumentParser) -> list[tuple[int, int]]:
    sizes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        b, sep, s = part.partition("x")
        if not (sep and b.isdigit() and s.isdigit() and int(b) >= 1 and int(s) >= 1):
            parser.error(f"--static: {part!r} is not BATCHxSEQ (e.g. 8x128)")
        sizes.append((int(b), int(s)))
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(TEXT_MODELS), help=f"comma-separated, of {', '.join(TEXT_MODELS)}")
    parser.add_argument("--exporters", default="both", help="classic, dynamo, or both")
    parser.add_argument("--devices", default="cpu", help="comma-separated rlx devices; unavailable ones skipped; "
                        "DEVICE/exact: with shape buckets off (each new size compiled)")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-seq", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--quick", action="store_true", help="10 requests, bert, the classic exporter")
    parser.add_argument("--static", metavar="BxS[,BxS]", help="serve each export at these sizes instead of a stream")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.models, args.exporters = 10, "bert", "classic"
    models = _names(args.models, TEXT_MODELS, "model", parser)
    exporters = _names(args.exporters, EXPORTERS, "exporter", parser)
    asked = [d.strip() for d in args.devices.split(",") if d.strip()]
    found = set(available(list(dict.fromkeys(d.partition("/")[0] for d in asked))))
    devices = [d for d in asked if d.partition("/")[0] in found]
    if args.requests < 1 or args.max_batch < 1 or args.max_seq < 1:
        parser.error("--requests, --max-batch and --max-seq must be at least 1")
    reqs = requests(args.requests, args.max_batch, args.max_seq, args.seed)
    rows = []
    if args.static:
        for size in _sizes(args.static, parser):
            for name in models:
                for exporter in exporters:
                    for device in devices:
                        row = steady(name, exporter, device, size)
                        rows.append(row)
                        print(f"{name:6} {exporter:7} {device:4} batch {size[0]}, seq {size[1]}: rlx "
                              f"{row['rlx_ms']:.2f} ms, ORT {row['ort_ms']:.2f} ms, {row['ratio']:.2f}x", flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0
    for name in models:
        for exporter in exporters:
            assert MODELS[name].length == "seq"
            for row in stream(name, exporter, devices, reqs):
                rows.append(row)
                print(f"{name:6} {exporter:7} {row['device']:4} {row['requests']} requests: total "
                      f"{row['total_ratio']:.2f}x ORT, worst {row['worst_ratio']:.2f}x, median "
                      f"{row['median_ratio']:.2f}x, {row['compiles']} compile(s); in all {row['rlx_total_s']:.2f} s, "
                      f"ORT {row['ort_total_s']:.2f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
