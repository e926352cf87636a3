"""Per-run dispatch overhead: a tiny graph through rlx vs the same numpy calls by hand vs ONNX Runtime.

Contenders, all on the same 16-element float32 input ``x``:

- ``rlx cpu, 10 nodes``: a 10-op elementwise chain compiled with ``rlx_core.compile(g,
  device="cpu")`` and run with ``cg.run({"x": x})`` (input validation, the executable and
  the output checks: everything a user pays);
- ``numpy by hand``: the same ten numpy calls as a user would write them (``y = x + c1``);
- ``numpy by hand, out=``: the same calls into preallocated buffers (numpy's floor);
- ``onnxruntime, 10 nodes``: the same chain as an ONNX model built with ``onnx.helper``,
  run by an ``InferenceSession`` on the CPU provider;
- ``rlx cpu, 1 node``, ``numpy, 1 call``, ``onnxruntime, 1 node``: the fixed cost of one run.

Method: each contender's loop count is sized to ~20 ms per sample; the contenders are
interleaved in blocks (rotating order, ~150 ms sleep between blocks so that no contender
owns a warm or a throttled stretch of the machine), and the figure is the median over the
blocks. Every contender's result is checked against numpy before anything is timed.

    python bench/overhead.py                 # 30 blocks, a table
    python bench/overhead.py --quick         # 5 short blocks: checks that it runs
    python bench/overhead.py --write         # also rewrite the "Dispatch overhead" section of BENCHMARKS.md
    python bench/overhead.py --json out.json # also the raw figures ('-': JSON on stdout only)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import rlx_core as rlx
from rlx_core.timer import Entry, interleave

SIZE = 16
CHAIN = ("add", "mul", "sub", "tanh", "maximum", "mul", "add", "neg", "abs", "minimum")
_UNARY = {"tanh", "neg", "abs"}
_NUMPY = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "maximum": np.maximum, "minimum": np.minimum,
          "tanh": np.tanh, "neg": np.negative, "abs": np.abs}
_ONNX = {"add": "Add", "mul": "Mul", "sub": "Sub", "maximum": "Max", "minimum": "Min", "tanh": "Tanh",
         "neg": "Neg", "abs": "Abs"}

#: What the runtime aims for on this benchmark (the 10-node chain through ``cg.run``).
TARGET_US = 15.0
TARGET_VS_NUMPY = 1.5

SECTION_NAME = "Dispatch overhead"
BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"

Contenders = dict[str, tuple[Callable[[], Any], int]]


def constants(ops: tuple[str, ...]) -> list[np.ndarray | None]:
    rng = np.random.default_rng(1)
    return [None if op in _UNARY else rng.uniform(0.5, 1.5, SIZE).astype(np.float32) for op in ops]


CONSTS = constants(CHAIN)


def rlx_graph(ops: tuple[str, ...]) -> rlx.Graph:
    g = rlx.Graph(f"chain{len(ops)}")
    y = g.input("x", (SIZE,), "float32")
    for op, c in zip(ops, constants(ops)):
        y = getattr(g, op)(y) if c is None else getattr(g, op)(y, g.constant(c))
    g.set_outputs([y])
    return g


def numpy_by_hand(x: np.ndarray) -> np.ndarray:
    """The ten calls of ``CHAIN`` as a user would write them."""
    c = CONSTS
    y = x + c[0]
    y = y * c[1]
    y = y - c[2]
    y = np.tanh(y)
    y = np.maximum(y, c[4])
    y = y * c[5]
    y = y + c[6]
    y = -y
    y = np.abs(y)
    return np.minimum(y, c[9])


def numpy_out(ops: tuple[str, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """The same calls into two preallocated buffers (the least numpy can do), and a copy
    out, as a runtime must hand back a fresh array."""
    consts = constants(ops)
    bufs = [np.empty(SIZE, np.float32), np.empty(SIZE, np.float32)]
    plan = [(_NUMPY[op], c, bufs[i % 2]) for i, (op, c) in enumerate(zip(ops, consts))]

    def run(x: np.ndarray) -> np.ndarray:
        y = x
        for fn, c, out in plan:
            y = fn(y, out=out) if c is None else fn(y, c, out=out)
        return y.copy()

    return run


def onnx_session(ops: tuple[str, ...]) -> Any:
    """An ONNX Runtime session running ``ops`` as a chain (opset 17, CPU provider)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, prev = [], [], "x"
    for i, (op, c) in enumerate(zip(ops, constants(ops))):
        out = "y" if i == len(ops) - 1 else f"t{i}"
        ins = [prev]
        if c is not None:
            inits.append(numpy_helper.from_array(c, name=f"c{i}"))
            ins.append(f"c{i}")
        nodes.append(helper.make_node(_ONNX[op], ins, [out]))
        prev = out
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [SIZE]) for n in ("x", "y"))
    graph = helper.make_graph(nodes, f"chain{len(ops)}", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # 16 elements: a thread pool only adds wake-ups
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def contenders(x: np.ndarray) -> tuple[Contenders, list[str]]:
    """name -> (zero-argument callable, nodes per run), every result checked against
    numpy; plus notes on what was skipped and why."""
    chain = rlx.compile(rlx_graph(CHAIN), device="cpu")
    one = rlx.compile(rlx_graph(CHAIN[:1]), device="cpu")
    feed = {"x": x}
    by_out = numpy_out(CHAIN)
    c0 = CONSTS[0]
    found: Contenders = {
        "rlx cpu, 10 nodes": (lambda: chain.run(feed), 10),
        "numpy by hand": (lambda: numpy_by_hand(x), 10),
        "numpy by hand, out=": (lambda: by_out(x), 10),
        "rlx cpu, 1 node": (lambda: one.run(feed), 1),
        "numpy, 1 call": (lambda: x + c0, 1),
    }
    want = numpy_by_hand(x)
    checks = {"rlx cpu, 10 nodes": chain.run(feed)[0], "numpy by hand, out=": by_out(x)}
    one_checks = {"rlx cpu, 1 node": one.run(feed)[0]}
    notes = []
    try:
        sess10, sess1 = onnx_session(CHAIN), onnx_session(CHAIN[:1])
    except ImportError as exc:
        notes.append(f"onnxruntime skipped: {exc} (pip install onnx onnxruntime)")
    else:
        found["onnxruntime, 10 nodes"] = (lambda: sess10.run(["y"], feed), 10)
        found["onnxruntime, 1 node"] = (lambda: sess1.run(["y"], feed), 1)
        checks["onnxruntime, 10 nodes"] = sess10.run(["y"], feed)[0]
        one_checks["onnxruntime, 1 node"] = sess1.run(["y"], feed)[0]
    for name, got in checks.items():
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{name} disagrees with numpy")
    for name, got in one_checks.items():
        np.testing.assert_allclose(got, x + c0, rtol=1e-6, err_msg=f"{name} disagrees with numpy")
    # The ordering within the dict is the ordering of the table.
    order = ["rlx cpu, 10 nodes", "numpy by hand", "numpy by hand, out=", "onnxruntime, 10 nodes",
             "rlx cpu, 1 node", "numpy, 1 call", "onnxruntime, 1 node"]
    return {k: found[k] for k in order if k in found}, notes


def measure(found: Contenders, blocks: int, pause: float, sample_s: float) -> dict[str, list[float]]:
    """Seconds per run of each contender, one sample per interleaved block of about
    ``sample_s`` seconds, after 100 warm-up calls (``rlx_core.timer``)."""
    from rich.progress import Progress

    entries = [Entry(name, run=fn) for name, (fn, _) in found.items()]
    with Progress(transient=True) as progress:
        task = progress.add_task("timing", total=blocks)
        interleave(entries, blocks, sample_s, pause=pause, warmup=100, on_round=lambda r: progress.advance(task))
    for e in entries:
        if e.note:
            raise SystemExit(f"bench/overhead.py: {e.name} failed while timed: {e.note}")
    return {e.name: e.times for e in entries}


def machine() -> dict[str, Any]:
    """What the figures were measured on, including how busy the machine was."""
    import importlib.metadata as md

    versions = {"python": platform.python_version(), "numpy": np.__version__, "rlx-core": rlx.__version__}
    for dist in ("rlx-cpu", "onnxruntime"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": _cpu_name(), "cores": os.cpu_count(), "system": platform.system(), "load_1min": load,
            "versions": versions}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def summarize(found: Contenders, samples: dict[str, list[float]]) -> list[dict[str, Any]]:
    """One row per contender: median and min µs per run, per node, and the ratios."""
    med = {name: statistics.median(s) for name, s in samples.items()}
    rows = []
    for name, seconds in med.items():
        nodes = found[name][1]
        peer = "numpy by hand" if nodes == 10 else "numpy, 1 call"
        ort = med.get("onnxruntime, 10 nodes" if nodes == 10 else "onnxruntime, 1 node")
        rows.append({"contender": name, "nodes": nodes, "us_per_run": seconds * 1e6,
                     "us_min": min(samples[name]) * 1e6, "us_per_node": seconds * 1e6 / nodes,
                     "vs_numpy": seconds / med[peer], "vs_onnxruntime": seconds / ort if ort else None})
    return rows


def verdict(rows: list[dict[str, Any]]) -> str:
    """Whether the 10-node run meets the targets, in one line."""
    r = next(r for r in rows if r["contender"] == "rlx cpu, 10 nodes")
    ok_us, ok_ratio = r["us_per_run"] <= TARGET_US, r["vs_numpy"] <= TARGET_VS_NUMPY
    return (f"rlx cpu, 10 nodes: {r['us_per_run']:.2f} µs (target ≤ {TARGET_US:g}: {'met' if ok_us else 'MISSED'}), "
            f"{r['vs_numpy']:.2f}x numpy by hand (target ≤ {TARGET_VS_NUMPY:g}x: {'met' if ok_ratio else 'MISSED'})")


def markdown_section(doc: dict[str, Any]) -> str:
    """The body of the ``## Dispatch overhead`` section of BENCHMARKS.md for these results."""
    m = doc["machine"]
    load = f", 1-minute load average {m['load_1min']:.2f} at the start" if m.get("load_1min") is not None else ""
    lines = [
        f"What a run costs beyond the arithmetic: a chain of {len(CHAIN)} elementwise float32 ops "
        f"(`{' '.join(CHAIN)}`) on {SIZE} elements, where every op takes a few hundred nanoseconds, so "
        "the figures are almost all dispatch. `rlx cpu` is `rlx_core.compile(g, device=\"cpu\").run({\"x\": x})` "
        "— input validation, the cpu executable's flat plan and the output checks, everything a user pays. "
        "`numpy by hand` is the same ten numpy calls written out (`y = x + c1` ...); `numpy by hand, out=` "
        "writes into preallocated buffers (numpy's floor); `onnxruntime` runs the same chain built with "
        "`onnx.helper` in an `InferenceSession` (CPU provider, one intra-op thread). The 1-node rows are the "
        "fixed cost of one run.",
        "",
        f"Target: the 10-node run in ≤ {TARGET_US:g} µs and ≤ {TARGET_VS_NUMPY:g}x numpy by hand.",
        "",
        f"Median of {doc['blocks']} interleaved blocks (~{doc['sample_ms']:g} ms per sample, rotating order, "
        f"{doc['pause_ms']:g} ms pause between blocks), measured {doc['date']} on {m['cores']} cores, "
        f"{m['cpu']} ({m['system']}{load}); " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        "",
        "| contender | nodes | µs / run (median) | µs / run (min) | µs / node | vs numpy by hand | vs onnxruntime |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["results"]:
        vs_ort = f"{r['vs_onnxruntime']:.2f}x" if r["vs_onnxruntime"] else "-"
        lines.append(f"| {r['contender']} | {r['nodes']} | {r['us_per_run']:.2f} | {r['us_min']:.2f} | "
                     f"{r['us_per_node']:.2f} | {r['vs_numpy']:.2f}x | {vs_ort} |")
    lines += ["", verdict(doc["results"]) + ".", ""]
    if m.get("load_1min") is not None and m["load_1min"] > (m["cores"] or 1):
        lines += [f"Note: the machine was busy (load {m['load_1min']:.1f} on {m['cores']} cores): these figures "
                  "are inflated and noisy; rerun on a quiet machine.", ""]
    lines += [f"Note: {n}" for n in doc["notes"]] + ([""] if doc["notes"] else [])
    lines += ["Reproduce: `nox -s bench`, or `python bench/overhead.py [--write]` in an environment with "
              "rlx-core, rlx-cpu, onnx, onnxruntime and rich.", ""]
    return "\n".join(lines)


def write_section(path: Path, body: str) -> None:
    """Replace the ``## Dispatch overhead`` section of ``path`` with ``body``, leaving the
    other sections (the model suite's) as they are (``bench/_markdown.py``)."""
    if __package__:
        from ._markdown import update_file
    else:  # run as a script: bench/ itself is on sys.path
        from _markdown import update_file

    update_file(path, {SECTION_NAME: body})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--blocks", type=int, default=30, help="interleaved blocks (default 30)")
    parser.add_argument("--pause", type=float, default=0.15, help="seconds between blocks (default 0.15)")
    parser.add_argument("--sample", type=float, default=0.02, help="seconds per sample (default 0.02)")
    parser.add_argument("--quick", action="store_true", help="5 blocks of 5 ms samples: check that it runs")
    parser.add_argument("--write", nargs="?", const=str(BENCHMARKS_MD), metavar="FILE",
                        help="rewrite the 'Dispatch overhead' section of BENCHMARKS.md (or FILE)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-' for stdout only)")
    args = parser.parse_args(argv)
    if args.quick:
        args.blocks, args.sample, args.pause = 5, 0.005, 0.02
    if args.blocks < 1 or args.sample <= 0 or args.pause < 0:
        parser.error("--blocks must be >= 1, --sample > 0 and --pause >= 0")

    x = np.random.default_rng(0).uniform(-1, 1, SIZE).astype(np.float32)
    found, notes = contenders(x)
    load = machine()  # before timing: the load average says how busy the machine was
    samples = measure(found, args.blocks, args.pause, args.sample)
    rows = summarize(found, samples)
    doc = {"benchmark": "overhead", "size": SIZE, "chain": list(CHAIN), "blocks": args.blocks,
           "sample_ms": args.sample * 1e3, "pause_ms": args.pause * 1e3,
           "date": datetime.date.today().isoformat(), "machine": load, "results": rows, "notes": notes}
    if args.json == "-":
        print(json.dumps(doc, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"rlx dispatch overhead: float32[{SIZE}], median of {args.blocks} interleaved blocks",
                  title_justify="left")
    table.add_column("contender", no_wrap=True)
    for head in ("nodes", "µs/run", "min", "µs/node", "vs numpy", "vs ORT"):
        table.add_column(head, justify="right", no_wrap=True)
    for r in rows:
        vs_ort = f"{r['vs_onnxruntime']:.2f}x" if r["vs_onnxruntime"] else "-"
        table.add_row(r["contender"], str(r["nodes"]), f"{r['us_per_run']:.2f}", f"{r['us_min']:.2f}",
                      f"{r['us_per_node']:.2f}", f"{r['vs_numpy']:.2f}x", vs_ort)
    console = Console()
    console.print(table)
    m = doc["machine"]
    load_note = f", load {m['load_1min']:.2f}" if m.get("load_1min") is not None else ""
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    console.print(f"{m['cores']} cores, {m['cpu']}{load_note}; {versions}")
    console.print(verdict(rows))
    for note in notes:
        console.print(note)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
        console.print(f"wrote {args.json}")
    if args.write:
        write_section(Path(args.write), markdown_section(doc))
        console.print(f"wrote the {SECTION_NAME!r} section of {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
