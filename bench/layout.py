"""Channels-last chains (rlx-cpu's ``layout.py``) against NCHW, and both against ONNX Runtime.

Each model of ``bench/zoo.py``'s zoo (torchvision CNNs by default) is exported with torch's
classic exporter, loaded once, and compiled twice on the cpu device in the same process:
with ``RLX_CPU_LAYOUT=auto`` (chains of convolutions held NHWC on oneDNN, their epilogues
as post-ops) and with ``RLX_CPU_LAYOUT=nchw`` (every value NCHW, each convolution as
``onednn.use`` measured, with its reorders). The two and ONNX Runtime are timed
interleaved by ``bench/_timing.measure`` (150 ms pauses, medians). Outputs are checked
against ONNX Runtime's first. Without the ``onednn`` extra both compiles are the same.

torch and torchvision are needed for the exports (the zoo's environment: ``nox -s zoo``
installs them), so ``nox -s bench`` does not run this script.

    python bench/layout.py                              # the CNNs, batch 1 and 8
    python bench/layout.py --models resnet50,densenet121 --batch 8 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

CNNS = ("resnet18", "resnet50", "resnext50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
        "squeezenet", "densenet121", "regnet_y_400mf", "shufflenet_v2", "convnext_tiny")


def _compile(graph: Any, layout: str) -> Any:
    import rlx_core

    before = os.environ.get("RLX_CPU_LAYOUT")
    os.environ["RLX_CPU_LAYOUT"] = layout  # read once per compile (layout.enabled)
    try:
        return rlx_core.compile(graph, device="cpu")
    finally:
        if before is None:
            os.environ.pop("RLX_CPU_LAYOUT", None)
        else:
            os.environ["RLX_CPU_LAYOUT"] = before


def run(name: str, batch: int, rounds: int, target_s: float) -> dict[str, Any]:
    """One model at one batch: medians (ms), ratios to ORT, the largest output error."""
    import onnxruntime as ort

    from bench._contenders import Contender
    from bench._timing import measure
    from bench.zoo import ZOO, export
    from rlx_core.onnx import load

    data, inputs = export(ZOO[name], batch, "classic")
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
    want = sess.run(None, feed)[0]
    graph = load(data)
    feeds = {k: v for k, v in inputs.items() if k in {graph.node(i).name for i in graph.inputs}}
    contenders = [Contender("onnxruntime", "onnxruntime", lambda: sess.run(None, feed)[0], want, 0.0, 0.0)]
    err = 0.0
    held = 0
    for layout in ("auto", "nchw"):
        cg = _compile(graph, layout)
        got = cg.run(feeds)[0]
        err = max(err, float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) or 1.0)))
        if layout == "auto":
            held = len(getattr(getattr(cg, "_exe", None), "_cl", ()))
        contenders.append(Contender(f"rlx {layout}", "rlx", lambda cg=cg: cg.run(feeds)[0], got, 0.0, 0.0))
    timings = measure(contenders, rounds, 0.15, target_s)
    ort_ms = timings["onnxruntime"].median * 1e3
    row: dict[str, Any] = {"model": name, "batch": batch, "ort_ms": ort_ms, "max_rel_err": err, "held_nhwc": held}
    for layout in ("auto", "nchw"):
        row[f"{layout}_ms"] = timings[f"rlx {layout}"].median * 1e3
        row[f"{layout}_vs_ort"] = row[f"{layout}_ms"] / ort_ms
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(CNNS), help="comma-separated zoo names")
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--target-ms", type=float, default=50.0, help="length of one measurement")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = []
    print("| model | batch | ORT | rlx channels-last | / ORT | rlx NCHW | / ORT | values NHWC |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for batch in (int(b) for b in args.batch.split(",")):
        for name in (m.strip() for m in args.models.split(",") if m.strip()):
            row = run(name, batch, args.rounds, args.target_ms / 1e3)
            rows.append(row)
            print(f"| {name} | {batch} | {row['ort_ms']:.1f} ms | {row['auto_ms']:.1f} | {row['auto_vs_ort']:.2f}x | "
                  f"{row['nchw_ms']:.1f} | {row['nchw_vs_ort']:.2f}x | {row['held_nhwc']} |", flush=True)
            if row["max_rel_err"] > 1e-4:
                print(f"  {name}: outputs off ORT's by {row['max_rel_err']:.1e} (relative)", flush=True)
    for key in ("auto_vs_ort", "nchw_vs_ort"):
        geo = math.exp(sum(math.log(r[key]) for r in rows) / len(rows))
        print(f"geometric mean, {key.replace('_vs_ort', '')}: {geo:.3f}x ORT over {len(rows)} rows")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if any(r["max_rel_err"] > 1e-4 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
