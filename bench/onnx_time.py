"""Median time of rlx on ONNX files, one process: for comparing two checkouts (or two
option sets) in alternating processes, where a change is too small for run-to-run noise.

    python bench/onnx_time.py a.onnx b.onnx [--device cpu] [--disable conv] [--blocks 7] [--runs 15]

Feeds come from ``a.npz`` beside ``a.onnx`` when there is one (``numpy.savez`` of the
inputs by name), else random normal floats and small integers. Each model runs 30 times
untimed, then ``--blocks`` blocks of ``--runs`` back-to-back runs with a 100 ms sleep
before each; one line per model: its name and the median block's milliseconds a run.

Old against new: ``git worktree add /tmp/old <commit>``, build its native library there
(``python -m rlx_cpu._build`` in ``/tmp/old/plugins/rlx-cpu``), then alternate
``PYTHONPATH=/tmp/old:/tmp/old/plugins/rlx-cpu python bench/onnx_time.py ...`` with the
plain command, a few rounds each.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx


def feeds_for(path: Path, graph: rlx.Graph) -> dict[str, np.ndarray]:
    saved = path.with_suffix(".npz")
    if saved.is_file():
        return dict(np.load(saved))
    rng = np.random.default_rng(0)
    feeds = {}
    for i in graph.inputs:
        node = graph.node(i)
        if node.dtype.startswith("float"):
            feeds[node.name] = rng.standard_normal(node.shape).astype(node.dtype)
        else:
            feeds[node.name] = rng.integers(0, 100, node.shape).astype(node.dtype)
    return feeds


def time_model(path: Path, device: str, disable: tuple[str, ...], blocks: int, runs: int) -> float:
    graph = rlx_onnx.load(str(path))
    feeds = feeds_for(path, graph)
    compiled = rlx.compile(graph, device=device, options=rlx.CompileOptions(disable=disable))
    for _ in range(30):
        compiled.run(feeds)
    times = []
    for _ in range(blocks):
        time.sleep(0.1)
        start = time.perf_counter()
        for _ in range(runs):
            compiled.run(feeds)
        times.append((time.perf_counter() - start) / runs)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help="ONNX files")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--disable", action="append", default=[], help="a pipeline pass to switch off (repeatable)")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args(argv)
    for path in args.models:
        seconds = time_model(path, args.device, tuple(args.disable), args.blocks, args.runs)
        print(f"{path.stem} {seconds * 1e3:.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
