"""Per-run dispatch overhead: a tiny graph through rlx vs the same numpy calls by hand.

Contenders, all on the same 16-element float32 input:

- ``rlx cpu, 10 nodes``: a 10-op elementwise chain compiled with ``rlx_core.compile(g,
  device="cpu")`` and run with ``cg.run`` (input validation and output checks included);
- ``numpy by hand``: the same ten numpy calls as a user would write them (``y = x + c1``);
- ``numpy by hand, out=``: the same calls into preallocated buffers (numpy's floor);
- ``rlx cpu, 1 node`` and ``numpy, 1 call``: the fixed cost of one run;
- ``onnxruntime, 10 nodes`` / ``1 node``: the equivalent ONNX models (built with
  ``onnx.helper``) in an ``InferenceSession``, when onnx and onnxruntime are installed.

Method: each contender's loop count is sized to ~20 ms per measurement; contenders are
interleaved in blocks (rotating order, ~150 ms sleep between blocks so that no one
contender owns a warm or throttled stretch of the machine); the figure is the minimum over
blocks (timeit's recommendation: the min is the run least disturbed by everything else).

    python bench/overhead.py [--blocks 20] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np

import rlx_core as rlx

SIZE = 16
CHAIN = ("add", "mul", "sub", "tanh", "maximum", "mul", "add", "neg", "abs", "minimum")
_UNARY = {"tanh", "neg", "abs"}
_NUMPY = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "maximum": np.maximum, "minimum": np.minimum,
          "tanh": np.tanh, "neg": np.negative, "abs": np.abs}  # fmt: skip
_ONNX = {"add": "Add", "mul": "Mul", "sub": "Sub", "maximum": "Max", "minimum": "Min", "tanh": "Tanh",
         "neg": "Neg", "abs": "Abs"}  # fmt: skip


def constants(ops: tuple[str, ...]) -> list[np.ndarray | None]:
    rng = np.random.default_rng(1)
    return [None if op in _UNARY else rng.uniform(0.5, 1.5, SIZE).astype(np.float32) for op in ops]


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
    """The same calls into two preallocated buffers (the least numpy can do)."""
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
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


CONSTS = constants(CHAIN)


def contenders(x: np.ndarray) -> tuple[dict[str, tuple[Callable[[], Any], int]], list[str]]:
    """name -> (zero-argument callable, nodes per run); plus notes on what was skipped."""
    chain = rlx.compile(rlx_graph(CHAIN), device="cpu")
    one = rlx.compile(rlx_graph(CHAIN[:1]), device="cpu")
    feed = {"x": x}
    by_out = numpy_out(CHAIN)
    c0 = CONSTS[0]
    found: dict[str, tuple[Callable[[], Any], int]] = {
        "rlx cpu, 10 nodes": (lambda: chain.run(feed), 10),
        "numpy by hand": (lambda: numpy_by_hand(x), 10),
        "numpy by hand, out=": (lambda: by_out(x), 10),
        "rlx cpu, 1 node": (lambda: one.run(feed), 1),
        "numpy, 1 call": (lambda: x + c0, 1),
    }
    want = numpy_by_hand(x)
    checks = {"rlx cpu, 10 nodes": chain.run(feed)[0], "numpy by hand, out=": by_out(x)}
    notes = []
    try:
        sess10, sess1 = onnx_session(CHAIN), onnx_session(CHAIN[:1])
    except ImportError as exc:
        notes.append(f"onnxruntime skipped: {exc}")
    else:
        found["onnxruntime, 10 nodes"] = (lambda: sess10.run(["y"], feed), 10)
        found["onnxruntime, 1 node"] = (lambda: sess1.run(["y"], feed), 1)
        checks["onnxruntime, 10 nodes"] = sess10.run(["y"], feed)[0]
    for name, got in checks.items():
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{name} disagrees with numpy")
    return found, notes


def measure(found: dict[str, tuple[Callable[[], Any], int]], blocks: int, pause: float) -> dict[str, float]:
    """Seconds per run of each contender: min over interleaved blocks."""
    from rich.progress import Progress

    timers = {name: timeit.Timer(fn) for name, (fn, _) in found.items()}
    loops = {}
    for name, t in timers.items():
        n, took = t.autorange()  # >= 0.2 s; we want ~20 ms per measurement
        loops[name] = max(1, int(n * 0.02 / took))
    best = dict.fromkeys(timers, float("inf"))
    names = list(timers)
    with Progress(transient=True) as progress:
        task = progress.add_task("timing", total=blocks)
        for b in range(blocks):
            order = names[b % len(names):] + names[: b % len(names)]
            for name in order:
                best[name] = min(best[name], timers[name].timeit(loops[name]) / loops[name])
            progress.advance(task)
            time.sleep(pause)
    return best


def machine() -> dict[str, Any]:
    import importlib.metadata as md

    versions = {"python": platform.python_version(), "numpy": np.__version__, "rlx-core": rlx.__version__}
    for dist in ("rlx-cpu", "onnxruntime"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "system": platform.system(),
            "versions": versions}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=20, help="interleaved blocks (default 20)")
    parser.add_argument("--pause", type=float, default=0.15, help="seconds between blocks (default 0.15)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-' for stdout only)")
    args = parser.parse_args(argv)

    x = np.random.default_rng(0).uniform(-1, 1, SIZE).astype(np.float32)
    found, notes = contenders(x)
    best = measure(found, args.blocks, args.pause)
    rows = []
    for name, seconds in best.items():
        nodes = found[name][1]
        peer = "numpy by hand" if nodes == 10 else "numpy, 1 call"
        ort = best.get("onnxruntime, 10 nodes" if nodes == 10 else "onnxruntime, 1 node")
        rows.append({"contender": name, "nodes": nodes, "us_per_run": seconds * 1e6,
                     "us_per_node": seconds * 1e6 / nodes, "vs_numpy": seconds / best[peer],
                     "vs_onnxruntime": seconds / ort if ort else None})  # fmt: skip
    doc = {"benchmark": "overhead", "size": SIZE, "chain": list(CHAIN), "blocks": args.blocks,
           "machine": machine(), "results": rows, "notes": notes}  # fmt: skip
    if args.json == "-":
        print(json.dumps(doc, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("contender", "µs / run", "µs / node", "vs numpy by hand", "vs onnxruntime",
                  title=f"rlx dispatch overhead: float32[{SIZE}], min of {args.blocks} interleaved blocks",
                  title_justify="left")  # fmt: skip
    for r in rows:
        vs_ort = f"{r['vs_onnxruntime']:.2f}x" if r["vs_onnxruntime"] else "-"
        table.add_row(r["contender"], f"{r['us_per_run']:.2f}", f"{r['us_per_node']:.2f}", f"{r['vs_numpy']:.2f}x",
                      vs_ort)  # fmt: skip
    console = Console()
    console.print(table)
    m = doc["machine"]
    console.print(f"{m['cores']} cores, {m['cpu']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()))
    for note in notes:
        console.print(note)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
