"""Where rlx's cpu backend spends a model's time, node by node, beside ONNX Runtime's own
profile of the same file: for finding which layers lose, not for ratios (``onnx_time.py``).

    python bench/node_profile.py model.onnx [--runs 10] [--top 15] [--ort]

Each step a plan runs is timed as it returns (``time.perf_counter`` around the call, so a
step's time includes the wait for OpenMP's workers and nothing of Python's dispatch
between steps) and charged to the node that built it; a run image by image
(``images.py``) charges each image's steps to the node. Three sections: the run's mean
time and the steps' sum, the time by op, then the ``--top`` nodes: milliseconds a run,
GFLOP/s for convolutions (2 x outputs x taps x input channels a group), attributes,
input shapes and the kinds of step that ran (``_ConvCall``: oneDNN; ``partial``: a bound
native call; ``_Runner``: a fused region). The thread tuner's narrow runs (one thread) are
in the mean like its wide ones, as in a user's run. ``--ort`` adds ORT's per-op-type
totals from its profiler (``enable_profiling``), over the same feeds.

The timing wraps the plan's step builders (``binding._build_steps``, ``layout.steps``,
``held.dense_steps``) for the compile it makes; they are put back after, and
``tests/test_bench_node_profile.py`` fails if one of them moves. Feeds as
``onnx_time.py`` makes them (a ``.npz`` beside the model, else random).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import rlx_core as rlx  # noqa: E402
from bench.onnx_time import feeds_for  # noqa: E402
from rlx_core import onnx as rlx_onnx  # noqa: E402

_CONVS = ("conv2d", "fused_conv")


class Recorder:
    """Seconds and step kinds by ``(node id, op)`` of the steps built while ``wrapped``."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[int, str], float] = collections.defaultdict(float)
        self.kinds: dict[tuple[int, str], set[str]] = collections.defaultdict(set)

    def wrap(self, node: Any, steps: list[Any]) -> list[Any]:
        key = (node.id, node.op.value)
        out = []
        for step in steps:
            if isinstance(step, tuple) and len(step) == 3:
                fn, args, kwargs = step
                name = getattr(fn, "__name__", type(fn).__name__)
                self.kinds[key].add(name)
                out.append(type(step)(self._timed(fn, key, name), args, kwargs))
            else:  # a step of another form (a parallel group): run as it is, untimed
                self.kinds[key].add(type(step).__name__)
                out.append(step)
        return out

    def _timed(self, fn: Callable[..., Any], key: tuple[int, str], name: str) -> Callable[..., Any]:
        seconds, clock = self.seconds, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[key] += clock() - t

        timed.__name__ = name
        return timed


@contextlib.contextmanager
def wrapped(recorder: Recorder) -> Iterator[None]:
    """The cpu backend's step builders, each one's steps timed by ``recorder``."""
    from rlx_cpu import binding, held, layout

    build, lay, dense = binding._build_steps, layout.steps, held.dense_steps

    def build_steps(builder: Any, node: Any, *args: Any) -> Any:
        return recorder.wrap(node, build(builder, node, *args))

    def layout_steps(dnnl: Any, node: Any, *args: Any, **kwargs: Any) -> Any:
        return recorder.wrap(node, lay(dnnl, node, *args, **kwargs))

    def dense_steps(node: Any, *args: Any, **kwargs: Any) -> Any:
        return recorder.wrap(node, dense(node, *args, **kwargs))

    binding._build_steps, layout.steps, held.dense_steps = build_steps, layout_steps, dense_steps
    try:
        yield
    finally:
        binding._build_steps, layout.steps, held.dense_steps = build, lay, dense


def gflops(node: Any, shapes: list[tuple[int, ...]], seconds: float) -> float | None:
    """A convolution's GFLOP/s at ``seconds`` a run; None for other nodes."""
    if node.op.value not in _CONVS or len(shapes) < 2 or seconds <= 0:
        return None
    return 2 * math.prod(node.shape) * math.prod(shapes[1][1:]) / seconds / 1e9


def profile(path: Path, graph: Any, feeds: dict[str, np.ndarray], runs: int, top: int) -> list[str]:
    """The report's lines for ``path`` (loaded as ``graph``) on rlx's cpu backend."""
    recorder = Recorder()
    with wrapped(recorder):
        cg = rlx.compile(graph, device="cpu")
        for _ in range(5):
            cg.run(feeds)
    recorder.seconds.clear()
    t0 = time.perf_counter()
    for _ in range(runs):
        cg.run(feeds)
    total = (time.perf_counter() - t0) / runs
    ms = {key: s / runs * 1e3 for key, s in recorder.seconds.items()}
    lines = [f"{path.stem}: {total * 1e3:.3f} ms a run, steps {sum(ms.values()):.3f} ms"]
    by_op: dict[str, float] = collections.defaultdict(float)
    for (_, op), v in ms.items():
        by_op[op] += v
    lines += [f"  {op:24s} {v:9.3f} ms" for op, v in sorted(by_op.items(), key=lambda kv: -kv[1])]
    nodes = _plan_nodes(cg)
    for (nid, op), v in sorted(ms.items(), key=lambda kv: -kv[1])[:top]:
        node = nodes.get(nid)
        if node is None:  # (an executable of another shape: no node table to read)
            lines.append(f"  node {nid} {op} {v:.3f} ms")
            continue
        shapes = [tuple(nodes[i].shape) for i in node.inputs if i in nodes]
        rate = gflops(node, shapes, v / 1e3)
        attrs = {k: a for k, a in node.attrs.items() if k not in ("program", "post")}
        lines.append(f"  node {nid} {op} {v:.3f} ms{f' {rate:.1f} GFLOP/s' if rate else ''} {attrs} "
                     f"{shapes} -> {tuple(node.shape)} [{', '.join(sorted(recorder.kinds[(nid, op)]))}]")
    return lines


def _plan_nodes(cg: Any) -> dict[int, Any]:
    """The nodes the cpu executable planned (the legalized, fused graph's, whole-batch
    shapes: a run image by image builds its steps over per-image copies of them)."""
    exe = getattr(cg, "_exe", None)
    return {n.id: n for n in getattr(exe, "_nodes", ())}


def ort_profile(path: Path, feeds: dict[str, np.ndarray], runs: int) -> list[str]:
    """ORT's per-op-type milliseconds a run (CPU provider, default options) on ``feeds``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"rlx_node_profile_{os.getpid()}")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(5):
        session.run(None, feeds)
    t0 = time.perf_counter()
    for _ in range(runs):
        session.run(None, feeds)
    total = (time.perf_counter() - t0) / runs
    trace = Path(session.end_profiling())
    try:
        events = json.loads(trace.read_text())
    finally:
        trace.unlink(missing_ok=True)
    kernels = [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
    per_run = len(kernels) // (runs + 5) if kernels else 0
    timed = kernels[len(kernels) - per_run * runs:] if per_run else []
    by_op: dict[str, float] = collections.defaultdict(float)
    for e in timed:
        by_op[str(e.get("args", {}).get("op_name", "?"))] += e["dur"] / runs / 1e3
    lines = [f"{path.stem}: ORT {total * 1e3:.3f} ms a run, kernels {sum(by_op.values()):.3f} ms"]
    return lines + [f"  {op:24s} {v:9.3f} ms" for op, v in sorted(by_op.items(), key=lambda kv: -kv[1])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="ONNX files (feeds from a .npz beside each)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs after 5 untimed ones")
    parser.add_argument("--top", type=int, default=15, help="the slowest nodes listed")
    parser.add_argument("--ort", action="store_true", help="ORT's per-op-type profile of each file too")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.top < 0:
        parser.error("--runs must be >= 1 and --top >= 0")
    for path in args.models:
        graph = rlx_onnx.load(str(path))
        feeds = feeds_for(path, graph)  # (one set for both runtimes)
        print("\n".join(profile(path, graph, feeds, args.runs, args.top)))
        if args.ort:
            print("\n".join(ort_profile(path, feeds, args.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
