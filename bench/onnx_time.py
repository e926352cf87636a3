"""Median time of rlx on ONNX files, one process: for comparing two checkouts (or two
option sets) in alternating processes, where a change is too small for run-to-run noise.

    python bench/onnx_time.py a.onnx b.onnx [--device cpu] [--disable conv] [--blocks 7] [--runs 15]

Feeds come from ``a.npz`` beside ``a.onnx`` when there is one (``numpy.savez`` of the
inputs by name), else random normal floats and small integers, each symbolic dim (a
dynamic batch or sequence axis) 1, or its ``--dim NAME=SIZE``. Each model runs 30 times
untimed, then ``--blocks`` blocks of ``--runs`` back-to-back runs with a 100 ms sleep
before each; one line per model: its name and the median block's milliseconds a run.

Old against new: ``git worktree add /tmp/old <commit>``, build its native library there
(``python -m rlx_cpu._build`` in ``/tmp/old/plugins/rlx-cpu``), then alternate
``PYTHONPATH=/tmp/old:/tmp/old/plugins/rlx-cpu python bench/onnx_time.py ...`` with the
plain command, a few rounds each.

What a pass or a backend setting buys, in one process: ``--ab`` compiles each model twice,
with the passes of ``--disable`` off and the ``--before-env NAME=VALUE`` settings in the
environment (``RLX_CPU_LAYOUT=nchw``: no channels-last chains) and the ``--before-set
MODULE:NAME=VALUE`` constants set (``rlx_cpu.implicit_gemm:WHOLE_IMAGE_MACS=0``: a call an
image) ("before") and with the whole pipeline, settings and constants as they are
("after"), under
``--precision``, and runs onnxruntime's ``InferenceSession`` (CPU provider, default
options) beside them; after the warm runs the three take turns block by block (order
reversed every other block, 150 ms apart: ORT's and OpenBLAS's threads spin after each
call on a small host and spoil the next contender's first run). Lines: the nodes each
compile handed the backend, the largest output differences, and the medians with their
ratios.

rlx against ORT as a user would time them: ``--ort`` (``--blocks 8``, ``--precision``):
five warm runs each, then blocks in turn (``vs_ort``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx

#: ``--dim NAME=SIZE``: the size of a symbolic dim in generated feeds (others: 1).
DIMS: dict[str, int] = {}


def feeds_for(path: Path, graph: rlx.Graph) -> dict[str, np.ndarray]:
    saved = path.with_suffix(".npz")
    if saved.is_file():
        return dict(np.load(saved))
    rng = np.random.default_rng(0)
    feeds = {}
    for i in graph.inputs:
        node = graph.node(i)
        shape = tuple(d if isinstance(d, int) else DIMS.get(str(d), 1) for d in node.shape)
        if node.dtype.startswith("float"):
            feeds[node.name] = rng.standard_normal(shape).astype(node.dtype)
        else:
            feeds[node.name] = rng.integers(0, 100, shape).astype(node.dtype)
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


def in_turn(contenders: list[tuple[str, Any]], blocks: int, runs: int,
            times: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Milliseconds a run (the median block) of each ``(name, fn)``, taking turns block by
    block (order reversed every other block, 150 ms apart: ORT's and OpenBLAS's threads
    spin after each call on a small host and spoil the next contender's first run);
    ``times``, where given, gets each contender's blocks."""
    times = {} if times is None else times
    times.update({name: [] for name, _ in contenders})
    for block in range(blocks):
        for name, fn in contenders if block % 2 else contenders[::-1]:
            time.sleep(0.15)
            start = time.perf_counter()
            for _ in range(runs):
                fn()
            times[name].append((time.perf_counter() - start) / runs * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


@contextlib.contextmanager
def environment(settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in ``os.environ`` inside the block (what a backend reads at compile),
    the environment as it was after."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def constants(settings: dict[str, str]) -> Iterator[None]:
    """Module constants ``{"package.module:NAME": "python literal"}`` set inside the block
    (what a backend reads as it binds a plan), as they were after: a tuning constant's two
    values compared in one process, where two processes differ by more than it moves."""
    saved = []
    try:
        for target, value in settings.items():
            module_name, _, name = target.partition(":")
            module = importlib.import_module(module_name)
            if not hasattr(module, name):
                raise SystemExit(f"--before-set {target}: {module_name} has no {name!r}")
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, ast.literal_eval(value))
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def ab_model(path: Path, device: str, disable: tuple[str, ...], precision: str, blocks: int,
             runs: int, before_env: dict[str, str] | None = None,
             before_set: dict[str, str] | None = None) -> dict[str, float]:
    """Milliseconds a run (medians) of ``path`` compiled without ``disable`` ("before"), with
    the whole pipeline ("after"), and on onnxruntime ("ort"), in one process, and the
    median and quartiles of each block's after / before; prints what each compile made
    and how far the outputs are apart."""
    import onnxruntime as ort

    graph = rlx_onnx.load(str(path))
    feeds = feeds_for(path, graph)
    extra = {} if precision == "fp32" else {"precision": precision}
    with environment(before_env or {}), constants(before_set or {}):
        before = rlx.compile(graph, device=device, options=rlx.CompileOptions(disable=disable, **extra))
    after = rlx.compile(graph, device=device, options=rlx.CompileOptions(**extra))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ort_feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}
    nodes = [cg.report().compiled_nodes for cg in (before, after)]
    a, b, want = before.run(feeds)[0], after.run(feeds)[0], sess.run(None, ort_feeds)[0]
    print(f"{path.stem}: nodes compiled before {nodes[0]}, after {nodes[1]}; max |before - after| "
          f"{float(np.abs(a - b).max()):.3g}, max |after - ORT| {float(np.abs(b - want).max()):.3g}")
    contenders = [("before", lambda: before.run(feeds)), ("after", lambda: after.run(feeds)),
                  ("ort", lambda: sess.run(None, ort_feeds))]
    for _, fn in contenders:
        for _ in range(30):
            fn()
    times: dict[str, list[float]] = {}
    ms = in_turn(contenders, blocks, runs, times)
    # Each block's after / before, its neighbour's in time: on a host whose speed drifts
    # over seconds, their median and quartiles say more than the ratio of the medians.
    ratios = np.array(times["after"]) / np.array(times["before"])
    return {**ms, "block_ratio": float(np.median(ratios)), "block_q1": float(np.percentile(ratios, 25)),
            "block_q3": float(np.percentile(ratios, 75))}


def vs_ort(path: Path, device: str, precision: str, blocks: int) -> dict[str, float]:
    """Milliseconds a run (medians) of ``path`` on rlx and on onnxruntime in one process,
    timed as a user's benchmark would: five warm runs each (rlx's first comparison of its
    thread modes included: a model is not timed only once it has settled), then blocks
    of a few runs in turn, sized to about 0.15 s of ORT's, order reversed every other
    block, 150 ms apart. Prints the largest output difference."""
    import onnxruntime as ort

    graph = rlx_onnx.load(str(path))
    feeds = feeds_for(path, graph)
    extra = {} if precision == "fp32" else {"precision": precision}
    compiled = rlx.compile(graph, device=device, options=rlx.CompileOptions(**extra))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ort_feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}
    got, want = compiled.run(feeds)[0], sess.run(None, ort_feeds)[0]
    print(f"{path.stem}: max |rlx - ORT| {float(np.abs(got - want).max()):.3g}")
    contenders = [("rlx", lambda: compiled.run(feeds)), ("ort", lambda: sess.run(None, ort_feeds))]
    start = time.perf_counter()
    contenders[1][1]()
    runs = max(2, min(20, int(0.15 / max(time.perf_counter() - start, 1e-4))))
    for _, fn in contenders:
        for _ in range(max(5, runs)):
            fn()
    return in_turn(contenders, blocks, runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help="ONNX files")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--disable", action="append", default=[], help="a pipeline pass to switch off (repeatable)")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--ab", action="store_true",
                        help="the model with and without --disable / --before-env / --before-set, and ORT, in turn")
    parser.add_argument("--before-env", action="append", default=[], metavar="NAME=VALUE",
                        help="with --ab: a setting in the environment for the 'before' compile (repeatable)")
    parser.add_argument("--before-set", action="append", default=[], metavar="MODULE:NAME=VALUE",
                        help="with --ab: a module constant (a Python literal) for the 'before' compile (repeatable)")
    parser.add_argument("--precision", default="fp32", help="with --ab or --ort: CompileOptions.precision")
    parser.add_argument("--ort", action="store_true", help="rlx and ORT in turn, warmed up as a user would")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="a symbolic dim's size in generated feeds (repeatable; others 1)")
    args = parser.parse_args(argv)
    if args.ab and not args.disable and not args.before_env and not args.before_set:
        parser.error("--ab compares the pipeline with and without --disable, --before-env or --before-set: name one")
    if any("=" not in kv for kv in args.before_env):
        parser.error("--before-env takes NAME=VALUE")
    if any("=" not in kv or ":" not in kv.split("=", 1)[0] for kv in args.before_set):
        parser.error("--before-set takes MODULE:NAME=VALUE")
    before_env = dict(kv.split("=", 1) for kv in args.before_env)
    before_set = dict(kv.split("=", 1) for kv in args.before_set)
    try:
        DIMS.update((name, int(size)) for name, size in (kv.split("=", 1) for kv in args.dim))
    except ValueError:
        parser.error(f"--dim takes NAME=SIZE with an int size, got {args.dim}")
    for path in args.models:
        if args.ort:
            ms = vs_ort(path, args.device, args.precision, args.blocks)
            print(f"{path.stem} rlx {ms['rlx']:.3f} ms, ORT {ms['ort']:.3f} ms; rlx / ORT {ms['rlx'] / ms['ort']:.3f}",
                  flush=True)
            continue
        if args.ab:
            ms = ab_model(path, args.device, tuple(args.disable), args.precision, args.blocks, args.runs, before_env,
                          before_set)
            print(f"{path.stem} before {ms['before']:.3f} ms, after {ms['after']:.3f} ms, ORT {ms['ort']:.3f} ms; "
                  f"after / before {ms['after'] / ms['before']:.3f} (block by block {ms['block_ratio']:.3f}, "
                  f"quartiles {ms['block_q1']:.3f}-{ms['block_q3']:.3f}), after / ORT {ms['after'] / ms['ort']:.3f}",
                  flush=True)
            continue
        seconds = time_model(path, args.device, tuple(args.disable), args.blocks, args.runs)
        print(f"{path.stem} {seconds * 1e3:.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
