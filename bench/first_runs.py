"""A model's first runs as a user's benchmark times them, against onnxruntime.

    python bench/first_runs.py model.onnx --sizes 1x128,8x128,32x32 [--warmup 3] [--runs 10] [--device auto]
    python bench/first_runs.py resnet.onnx --sizes 1,8,32

Most benchmarks load a model, run it a few times untimed, then time a few runs and
report their mean. Everything rlx does in a model's first runs lands there: a shape
class compiled on its own after a few runs (``rlx_core.compiler.dynamic``), the cpu
thread tuner's trials of its narrow mode (``rlx_cpu.threads``), a plan's first touch of
its memory. This bench measures exactly that, in one process: the model loaded without
dims and compiled (``device``, default ``auto``) once, an ORT session on the same file;
then for each size, ``warmup`` + ``runs`` runs alternating rlx and ORT one by one (150 ms
apart, so that one's threads are not spinning when the other starts); mean and median
of the timed runs, each run of rlx listed, and the largest relative difference between
the outputs.

Sizes: ``BxS`` for a text model (``input_ids``-like integer inputs get random tokens below
``--vocab``, integer masks ones), ``B`` for an image model (float inputs get random values
at the model's fixed dims, each symbolic dim but the first taken from ``--image``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PAUSE_S = 0.15


def _feeds(session: Any, size: tuple[int, ...], vocab: int, image: int, rng: np.random.Generator) -> dict[str, Any]:
    feeds = {}
    for inp in session.get_inputs():
        dims = [d if isinstance(d, int) else None for d in inp.shape]
        batch, rest = size[0], list(size[1:])
        shape = []
        for k, d in enumerate(dims):
            if k == 0 and d is None:
                shape.append(batch)
            elif d is None:
                shape.append(rest.pop(0) if rest else image)
            else:
                shape.append(d)
        if "int" in inp.type:
            dtype = np.int64 if "int64" in inp.type else np.int32
            is_ids = "id" in inp.name.lower() or "token" in inp.name.lower()
            feeds[inp.name] = (rng.integers(0, vocab, shape) if is_ids else np.ones(shape)).astype(dtype)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--sizes", required=True, help="comma-separated: B or BxS")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--image", type=int, default=224)
    args = parser.parse_args(argv)
    import onnxruntime as ort

    import rlx_core as rlx
    from rlx_core import onnx as rlx_onnx

    session = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
    t0 = time.perf_counter()
    compiled = rlx.compile(rlx_onnx.load(args.model), device=args.device)
    print(f"{args.model.name}: rlx load + compile {1e3 * (time.perf_counter() - t0):.0f} ms on {compiled.device}")
    rng = np.random.default_rng(0)
    ratios = []
    for text in args.sizes.split(","):
        size = tuple(int(v) for v in text.split("x"))
        feeds = _feeds(session, size, args.vocab, args.image, rng)
        ours, theirs = [], []
        for _ in range(args.warmup + args.runs):
            t0 = time.perf_counter()
            got = compiled.run(feeds)
            ours.append(time.perf_counter() - t0)
            time.sleep(PAUSE_S)
            t0 = time.perf_counter()
            want = session.run(None, feeds)
            theirs.append(time.perf_counter() - t0)
            time.sleep(PAUSE_S)
        timed, peer = ours[args.warmup:], theirs[args.warmup:]
        err = max(float(np.max(np.abs(g - w)) / (np.max(np.abs(w)) + 1e-12)) for g, w in zip(got, want))
        ratio = statistics.mean(timed) / statistics.mean(peer)
        ratios.append(ratio)
        print(f"  {text:>7}: rlx mean {1e3 * statistics.mean(timed):7.1f} ms, "
              f"median {1e3 * statistics.median(timed):7.1f}"
              f" | ORT mean {1e3 * statistics.mean(peer):7.1f}, median {1e3 * statistics.median(peer):7.1f}"
              f" | mean {ratio:.2f}x, median {statistics.median(timed) / statistics.median(peer):.2f}x"
              f" | rel. err {err:.1e} | rlx runs (ms): {' '.join(f'{1e3 * t:.0f}' for t in ours)}")
    shapes = getattr(compiled, "shapes", None)
    if callable(shapes):
        print(f"  shape classes compiled: {shapes()}")
    print(f"  geometric mean of the mean ratios: {float(np.exp(np.mean(np.log(ratios)))):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
