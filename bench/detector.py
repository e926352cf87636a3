"""torchvision detectors, exported as users export them, against ONNX Runtime.

``ssdlite320_mobilenet_v3_large`` and ``fasterrcnn_mobilenet_v3_large_320_fpn`` (random
weights, 91 classes) are exported with torch's classic exporter (opset 17). Their graphs
hold ``NonZero``, ``TopK`` (SSD: 90 of K = 300), ``RoiAlign`` (Faster R-CNN) and
torchvision's batched NMS inside ``If(boxes.numel() == 0)``, so rlx loads each as a
``StagedGraph`` (parts compiled, those ops on the host between them). Random weights
make every score nearly equal (ties, the order of the kept boxes arbitrary): the
BatchNorm statistics are first re-estimated on four seeded random images, which gives
distinct scores while the weights stay random, and the score threshold is 0 so that
every image keeps its boxes. Each image's outputs are compared with ORT's (boxes in
pixels, scores, labels), then rlx and ORT are timed interleaved (``bench/_timing.py``).

torch and torchvision are bench extras (``nox -s zoo`` installs them):

    python bench/detector.py                    # both models: export, compare, time (15 rounds)
    python bench/detector.py --models ssdlite --rounds 3
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


def build(name: str) -> Any:
    """The detector, its BatchNorm statistics re-estimated on seeded random images."""
    import torch
    from torchvision.models import detection

    torch.manual_seed(0)
    if name == "ssdlite":
        model = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=91)
        model.score_thresh = 0.0
    else:
        model = detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None)
        model.roi_heads.score_thresh = 0.0
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
        features = model.backbone(batch)
        if name == "ssdlite":
            model.head.train()
            model.head(list(features.values()))
    for m in norms:
        m.momentum = 0.1
    return model.eval()


#: Each detector's output names, in the order its forward returns them.
OUTPUTS = {"ssdlite": ["boxes", "scores", "labels"], "frcnn": ["boxes", "labels", "scores"]}


def export(model: Any, outputs: list[str]) -> bytes:
    import torch

    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, ([torch.rand(3, SIZE, SIZE)],), buf, opset_version=17, dynamo=False,
                          input_names=["images"], output_names=outputs)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="ssdlite,frcnn", help="comma-separated: ssdlite, frcnn")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    bad = 0
    for name in args.models.split(","):
        if name not in OUTPUTS:
            parser.error(f"unknown model {name!r}; known: {', '.join(OUTPUTS)}")
        bad += run(name, args.rounds)
    return 1 if bad else 0


def run(name: str, rounds: int) -> int:
    """Export, compare and time one detector; the number of images whose outputs differ."""
    import onnxruntime as ort

    import rlx_core
    from bench._contenders import Contender
    from bench._timing import measure
    from rlx_core.onnx import load

    names = OUTPUTS[name]
    data = export(build(name), names)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    graph = load(data)
    print(f"{name}: {graph!r}")
    cg = rlx_core.compile(graph, device="cpu")
    images = [np.random.default_rng(seed).random((3, SIZE, SIZE), dtype=np.float32) for seed in (1, 2)]
    bad = 0
    tolerance = {"boxes": 1e-2, "scores": 1e-5, "labels": 0}
    for k, image in enumerate(images):
        want, got = sess.run(None, {"images": image}), cg.run({"images": image})
        diffs = {n: float(np.max(np.abs(g.astype(np.float64) - w))) if g.shape == w.shape and g.size else
                 (0.0 if g.shape == w.shape else float("inf")) for n, g, w in zip(names, got, want)}
        bad += any(diffs[n] > tolerance[n] for n in names)
        print(f"  image {k}: {want[0].shape[0]} boxes; max |rlx - ORT|: boxes {diffs['boxes']:.2g} px, scores "
              f"{diffs['scores']:.2g}, labels {diffs['labels']:.2g}")
    feeds = {"images": images[0]}
    contenders = [Contender("onnxruntime", "onnxruntime", lambda: sess.run(None, feeds)[0], None, 0.0, 0.0),
                  Contender("rlx cpu", "rlx", lambda: cg.run(feeds)[0], None, 0.0, 0.0)]
    timings = measure(contenders, rounds, 0.15, 0.2)
    ort_s, rlx_s = timings["onnxruntime"].median, timings["rlx cpu"].median
    print(f"  medians of {rounds} interleaved rounds: ORT {ort_s * 1e3:.0f} ms, rlx cpu {rlx_s * 1e3:.0f} ms "
          f"({rlx_s / ort_s:.2f}x ORT)")
    return bad


if __name__ == "__main__":
    sys.exit(main())
