"""A torchvision detector, exported as users export it, against ONNX Runtime.

``ssdlite320_mobilenet_v3_large`` (random weights, 91 classes) is exported with torch's
classic exporter (opset 17): its graph holds 180 ``NonZero``, 90 ``TopK`` of K = 300 and
torchvision's batched NMS inside ``If(boxes.numel() == 0)``, so rlx loads it as a
``StagedGraph`` (parts compiled, those ops on the host between them). Random weights
make every score 1/91 (all tied, the order of the kept boxes arbitrary): the BatchNorm
statistics are first re-estimated on four seeded random images, which gives distinct
scores while the weights stay random, and ``score_thresh`` is 0 so that every image
keeps its 300 boxes. Each image's outputs are compared with ORT's (boxes in pixels,
scores, labels), then rlx and ORT are timed interleaved (``bench/_timing.py``).

torch and torchvision are bench extras (``nox -s zoo`` installs them):

    python bench/detector.py              # export, compare, time (15 rounds)
    python bench/detector.py --rounds 3   # a quick look
"""

from __future__ import annotations

import argparse
import io
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZE = 320


def build() -> Any:
    """The detector, its BatchNorm statistics re-estimated on seeded random images."""
    import torch
    from torchvision.models import detection

    torch.manual_seed(0)
    model = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=91)
    model.score_thresh = 0.0
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the calibration batch
    gen = torch.Generator().manual_seed(1234)
    images = [torch.rand(3, SIZE, SIZE, generator=gen) for _ in range(4)]
    model.eval()
    with torch.no_grad():
        batch = model.transform(images)[0].tensors
        model.backbone.train()
        model.head.train()
        model.head(list(model.backbone(batch).values()))
    for m in norms:
        m.momentum = 0.1
    return model.eval()


def export(model: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, ([torch.rand(3, SIZE, SIZE)],), buf, opset_version=17, dynamo=False,
                          input_names=["images"], output_names=["boxes", "scores", "labels"])
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    import onnxruntime as ort

    import rlx_core
    from bench._contenders import Contender
    from bench._timing import measure
    from rlx_core.onnx import load

    data = export(build())
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    graph = load(data)
    print(repr(graph))
    cg = rlx_core.compile(graph, device="cpu")
    images = [np.random.default_rng(seed).random((3, SIZE, SIZE), dtype=np.float32) for seed in (1, 2)]
    bad = 0
    for k, image in enumerate(images):
        want, got = sess.run(None, {"images": image}), cg.run({"images": image})
        diffs = [float(np.max(np.abs(g.astype(np.float64) - w))) if g.shape == w.shape and g.size else
                 (0.0 if g.shape == w.shape else float("inf")) for g, w in zip(got, want)]
        bad += any(d > tol for d, tol in zip(diffs, (1e-2, 1e-5, 0)))
        print(f"image {k}: {want[0].shape[0]} boxes; max |rlx - ORT|: boxes {diffs[0]:.2g} px, scores "
              f"{diffs[1]:.2g}, labels {diffs[2]:.2g}")
    feeds = {"images": images[0]}
    contenders = [Contender("onnxruntime", "onnxruntime", lambda: sess.run(None, feeds)[0], None, 0.0, 0.0),
                  Contender("rlx cpu", "rlx", lambda: cg.run(feeds)[0], None, 0.0, 0.0)]
    timings = measure(contenders, args.rounds, 0.15, 0.2)
    ort_s, rlx_s = timings["onnxruntime"].median, timings["rlx cpu"].median
    print(f"medians of {args.rounds} interleaved rounds: ORT {ort_s * 1e3:.0f} ms, rlx cpu {rlx_s * 1e3:.0f} ms "
          f"({rlx_s / ort_s:.2f}x ORT)")
    print("\n".join(cg.report().notes[-6:]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
