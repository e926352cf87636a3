"""Dynamic shapes: rlx against ONNX Runtime on models with symbolic batch and sequence axes, as a server sees them.

Two models are written with ``onnx.helper`` (deterministic weights), their inputs
``(batch, seq)`` int64 with symbolic dims, and every size inside them computed at run
time the way torch's exporter writes dynamic axes (``Shape -> Gather -> Unsqueeze ->
Concat -> Reshape`` head splits and merges, ``Range`` or a ``Slice`` of a constant
arange for the position ids, ``ConstantOfShape`` token types, an ``Expand``-ed mask):

- ``encoder``: BERT-style, token + token-type + position embeddings (a 512-row position
  table), LayerNormalization, 2 post-LN layers of width 256, 4 heads, FFN 1024 with erf
  GELU, and the additive mask ``(1 - attention_mask) * -10000`` at ``(batch, 1, 1, seq)``;
- ``decoder``: GPT-2-style, pre-LN, 2 layers of width 256, 4 heads, ``Split`` of one qkv
  projection, a causal mask from ``Range``/``Less``/``Where`` expanded to ``(batch, 1,
  seq, seq)``, tanh GELU, the final LayerNormalization's output (no LM head).

rlx loads each without ``dims`` (``rlx_core.onnx.load(bytes)``: a symbolic graph), and
``rlx_core.compile(graph, device="cpu")`` gives a ``DynamicCompiledGraph``, which runs every
new set of sizes on the one executable rlx-cpu compiles for every size (``anysize.py``),
and compiles a size of its own once it has met it three times (an LRU of 8). ONNX Runtime runs the same bytes in an
``InferenceSession`` on the CPU provider (default options).

What is measured, per model:

1. **A stream of requests** (200; ``--quick``: 20), each with a batch uniform in 1..16 and
   a sequence length uniform in 1..256 (seeded, so the same stream for both runtimes and
   every run), served in blocks of ``BLOCK`` (10) requests: each runtime serves a block
   back to back, as a server does, after a ``PAUSE_S`` (~150 ms) pause, the two runtimes
   alternating per block and each going first on every other block. Every request is
   timed on its own; rlx's time includes a compile when the request's sizes need one:
   that is what a server pays. Every rlx output is checked against ONNX Runtime's (max
   abs difference over ORT's max abs value, at most 1e-3); a mismatch is reported loudly
   and makes the script exit 1. Before the stream both runtimes are warmed up (about 20
   calls) at the sizes rlx compiled first. Why blocks and pauses, not one request of
   each in turn: on a small host a runtime's threads keep spinning for a while after its
   call (ONNX Runtime's intra-op pool for milliseconds), so whichever ran second paid
   for the other's spinning on every request (measured: rlx's per-request ratio 1.46x
   when it went first, 1.9x when it went second, 1.16x served alone) -- a measure of the
   neighbour, not of the runtime.
2. **The steady state at one shape** (batch 8, seq 64): the dynamic compile (after its
   first call at that shape), a static compile of the same model loaded with
   ``dims={"batch": 8, "seq": 64}``, and ONNX Runtime, through ``bench/_timing.py``'s
   ``measure`` (interleaved blocks, ~150 ms pause before each, medians).

The targets of the issue are printed beside the figures, never asserted: the stream's
total ≤ 1.1x ONNX Runtime's, no request slower than 3x ONNX Runtime's, and the steady
state of the dynamic compile ≤ 1.05x the static compile's.

    python bench/dynamic.py                # 200 requests per model, 15 rounds of steady state
    python bench/dynamic.py --quick        # 20 requests, 3 rounds: checks that it runs (never writes)
    python bench/dynamic.py --write        # also rewrite the "Dynamic shapes" section of BENCHMARKS.md
    python bench/dynamic.py --requests 50 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file (python bench/dynamic.py): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import rlx_core as rlx
from bench import _markdown, _report, _timing
from bench._contenders import Contender
from bench._dynamic_models import HEADS, VOCAB, WIDTH, DynamicModel, build_models
from rlx_core.ir.specialize import representative

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
SECTION_NAME = "Dynamic shapes"

STREAM_SEED = 20261128
MAX_BATCH, MAX_SEQ = 16, 256
REQUESTS, QUICK_REQUESTS = 200, 20
STEADY_BATCH, STEADY_SEQ = 8, 64
#: Largest max|rlx - ORT| / max|ORT| accepted on an output.
TOLERANCE = 1e-3
PAUSE_S = 0.15
#: Requests one runtime serves back to back before the other takes its turn.
BLOCK = 10

#: The issue's targets (printed beside the figures, never asserted).
TARGET_TOTAL = 1.1
TARGET_WORST = 3.0
TARGET_STEADY = 1.05

log = logging.getLogger("rlx.bench")


# ------------------------------------------------------------------------- the requests
@dataclass(frozen=True)
class Request:
    """One request: its sizes and every input either model takes."""

    index: int
    batch: int
    seq: int
    input_ids: np.ndarray
    attention_mask: np.ndarray

    def feeds(self, model: DynamicModel) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in model.inputs}


def make_request(index: int, batch: int, seq: int, rng: np.random.Generator) -> Request:
    """Random token ids, and a padding mask keeping a random length (1..seq) of each row."""
    ids = rng.integers(0, VOCAB, (batch, seq), dtype=np.int64)
    lengths = rng.integers(1, seq + 1, batch)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    return Request(index, batch, seq, ids, mask)


def request_stream(count: int, seed: int = STREAM_SEED) -> list[Request]:
    """``count`` requests, batch uniform in 1..16 and seq in 1..256, the same for every run."""
    rng = np.random.default_rng(seed)
    stream = []
    for i in range(count):
        batch, seq = int(rng.integers(1, MAX_BATCH + 1)), int(rng.integers(1, MAX_SEQ + 1))
        stream.append(make_request(i, batch, seq, rng))
    return stream


# ------------------------------------------------------------------------- measuring
def relative_diff(got: np.ndarray, want: np.ndarray) -> float:
    """max|got - want| / max|want| (inf for a shape mismatch, nan for a nan)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return math.inf
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    return float(np.max(np.abs(got.astype(np.float64) - want))) / max(scale, 1e-30) if want.size else 0.0


def _once(run: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds of one call (the garbage collector off, as in ``timeit``) and its result."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = run()
        return time.perf_counter() - t0, out
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class Served:
    """One request of the stream, on both runtimes."""

    index: int
    batch: int
    seq: int
    rlx_s: float
    ort_s: float
    compiled: bool
    diff: float

    @property
    def ratio(self) -> float:
        return self.rlx_s / self.ort_s


def serve(model: DynamicModel, stream: list[Request], cg: Any, sess: Any) -> list[Served]:
    """Every request through rlx and ONNX Runtime, in blocks of ``BLOCK`` served back to
    back by one runtime after a pause, the runtimes alternating per block (each first on
    every other block), after a warm-up of both at the sizes rlx compiled first."""
    first = representative(cg.graph)[1]  # the size rlx_core.compile placed it at (warmed up, so compiled, here)
    warm = make_request(-1, first.get("batch", 1), first.get("seq", 1), np.random.default_rng(0)).feeds(model)
    for run in (lambda: cg.run(warm), lambda: sess.run(None, warm)):
        _timing.warm_up(run)
    served: list[Served] = []
    for start in range(0, len(stream), BLOCK):
        block = stream[start : start + BLOCK]
        feeds = [req.feeds(model) for req in block]
        rlx_done = ort_done = None
        for turn in ((0, 1) if (start // BLOCK) % 2 == 0 else (1, 0)):
            time.sleep(PAUSE_S)  # the other runtime's threads park
            if turn == 0:
                rlx_done = [_rlx_once(cg, f) for f in feeds]
            else:
                ort_done = [_once(lambda f=f: sess.run(None, f)[0]) for f in feeds]
        assert rlx_done is not None and ort_done is not None
        for req, (rlx_s, got, compiled), (ort_s, want) in zip(block, rlx_done, ort_done):
            served.append(Served(req.index, req.batch, req.seq, rlx_s, ort_s, compiled, relative_diff(got, want)))
    return served


def _rlx_once(cg: Any, feeds: Mapping[str, np.ndarray]) -> tuple[float, Any, bool]:
    """One rlx request: seconds, output, and whether it compiled."""
    before = cg.compiles
    seconds, out = _once(lambda: cg.run(feeds)[0])
    return seconds, out, cg.compiles > before


def _contender(name: str, kind: str, run: Callable[[], Any], setup_s: float) -> Contender:
    first_s, out = _once(run)
    return Contender(name, kind, run, np.asarray(out), setup_s + first_s, setup_s)


def steady_state(model: DynamicModel, cg: Any, sess: Any, rounds: int, target_s: float) -> dict[str, Any]:
    """Seconds per run at batch 8, seq 64: the dynamic compile, a static one, ONNX Runtime."""
    from rlx_core import onnx as rlx_onnx

    feeds = make_request(-1, STEADY_BATCH, STEADY_SEQ, np.random.default_rng(1)).feeds(model)
    t0 = time.perf_counter()
    static = rlx.compile(rlx_onnx.load(model.onnx, dims={"batch": STEADY_BATCH, "seq": STEADY_SEQ}), device="cpu")
    static_s = time.perf_counter() - t0
    before = cg.compiles
    found = [_contender("rlx cpu, dynamic", "rlx", lambda: cg.run(feeds)[0], 0.0),
             _contender("rlx cpu, static", "rlx", lambda: static.run(feeds)[0], static_s),
             _contender("onnxruntime", "onnxruntime", lambda: sess.run(None, feeds)[0], 0.0)]
    compiled = cg.compiles > before  # this size may still be kept from the stream
    want = found[-1].first_output
    diffs = {c.name: relative_diff(c.first_output, want) for c in found[:-1]}
    timings = _timing.measure(found, rounds, PAUSE_S, target_s)
    return {"batch": STEADY_BATCH, "seq": STEADY_SEQ, "rounds": rounds, "static_load_compile_s": static_s,
            "dynamic_first_call_s": found[0].first_run_s, "dynamic_compiled": compiled, "diffs": diffs,
            "median_s": {name: t.median for name, t in timings.items()},
            "iqr_s": {name: t.iqr for name, t in timings.items()}}


def summarize(served: list[Served]) -> dict[str, Any]:
    """The stream's figures: totals, the worst request, compiles, the requests that did not compile."""
    total_rlx, total_ort = sum(s.rlx_s for s in served), sum(s.ort_s for s in served)
    worst = max(served, key=lambda s: s.ratio)
    warm = [s for s in served if not s.compiled]
    cold = [s for s in served if s.compiled]
    bad = [s for s in served if not s.diff <= TOLERANCE]
    return {
        "requests": len(served), "total_rlx_s": total_rlx, "total_ort_s": total_ort,
        "total_ratio": total_rlx / total_ort, "worst": {**asdict(worst), "ratio": worst.ratio},
        "compiled": len(cold), "distinct_shapes": len({(s.batch, s.seq) for s in served}),
        "warm_median_ratio": statistics.median(s.ratio for s in warm) if warm else None,
        "warm_median_rlx_s": statistics.median(s.rlx_s for s in warm) if warm else None,
        "warm_median_ort_s": statistics.median(s.ort_s for s in warm) if warm else None,
        "cold_median_rlx_s": statistics.median(s.rlx_s for s in cold) if cold else None,
        "cold_median_ort_s": statistics.median(s.ort_s for s in cold) if cold else None,
        "cold_median_ratio": statistics.median(s.ratio for s in cold) if cold else None,
        "max_diff": max(s.diff for s in served),
        "mismatches": [{"index": s.index, "batch": s.batch, "seq": s.seq, "diff": s.diff} for s in bad],
    }


def bench_model(model: DynamicModel, stream: list[Request], rounds: int, target_s: float,
                on_step: Callable[[str], None]) -> dict[str, Any]:
    """Everything measured on one model, as a JSON-ready dict (``error`` when rlx failed)."""
    import onnxruntime as ort

    from rlx_core import onnx as rlx_onnx

    doc: dict[str, Any] = {"name": model.name, "summary": model.summary}
    t0 = time.perf_counter()
    sess = ort.InferenceSession(model.onnx, providers=["CPUExecutionProvider"])
    doc["ort_session_s"] = time.perf_counter() - t0
    on_step(f"{model.name}: load and compile")
    try:
        t0 = time.perf_counter()
        graph = rlx_onnx.load(model.onnx, name=model.name)
        t1 = time.perf_counter()
        cg = rlx.compile(graph, device="cpu")
        t2 = time.perf_counter()
        doc.update(load_s=t1 - t0, compile_s=t2 - t1, first_shape=representative(graph)[1])
        on_step(f"{model.name}: {len(stream)} requests")
        served = serve(model, stream, cg, sess)
        doc["stream"] = summarize(served)
        doc["served"] = [asdict(s) for s in served]
        on_step(f"{model.name}: steady state")
        doc["steady"] = steady_state(model, cg, sess, rounds, target_s)
        doc["compiles"] = cg.compiles
        doc["report_tail"] = [n for n in cg.report().notes if n.startswith("shape class ")][-3:]
    except Exception as exc:  # one model's failure is reported, never hides the other's figures
        log.error("rlx failed on %s: %s: %s", model.name, type(exc).__name__, exc)
        doc["error"] = f"{type(exc).__name__}: {exc}"
    return doc


def problems(doc: dict[str, Any]) -> list[str]:
    """Every failure and mismatch of one model, one line each (empty: all outputs agreed)."""
    if "error" in doc:
        return [f"{doc['name']}: rlx failed: {doc['error']}"]
    lines = [f"{doc['name']}: MISMATCH at request #{m['index']} (batch {m['batch']}, seq {m['seq']}): relative "
             f"difference {m['diff']:.3g} > {TOLERANCE:g}" for m in doc["stream"]["mismatches"]]
    for name, diff in doc["steady"]["diffs"].items():
        if not diff <= TOLERANCE:
            lines.append(f"{doc['name']}: MISMATCH in the steady state, {name}: relative difference {diff:.3g} > "
                         f"{TOLERANCE:g}")
    return lines


# ------------------------------------------------------------------------- reporting
HEADER = ["figure", "rlx cpu", "onnxruntime", "ratio", "target"]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{_report.fmt_ms(seconds)} ms"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _target(ratio: float, target: float) -> str:
    return f"≤ {target:g}x: {'met' if ratio <= target else 'MISSED'}"


def table_rows(doc: dict[str, Any]) -> list[list[str]]:
    """The rows of one model's table (see ``HEADER``); the ratio is rlx / ORT but on the
    last row, dynamic / static."""
    s, st = doc["stream"], doc["steady"]
    w, n = s["worst"], s["requests"]
    med = st["median_s"]
    dyn, stat, ort = med["rlx cpu, dynamic"], med["rlx cpu, static"], med["onnxruntime"]
    at = f"batch {st['batch']}, seq {st['seq']}"
    return [
        [f"stream of {n} requests, total", f"{s['total_rlx_s']:.3g} s", f"{s['total_ort_s']:.3g} s",
         _x(s["total_ratio"]), _target(s["total_ratio"], TARGET_TOTAL)],
        [f"worst request: #{w['index']}, batch {w['batch']}, seq {w['seq']}, "
         f"{'compiled' if w['compiled'] else 'no compile'}", _ms(w["rlx_s"]), _ms(w["ort_s"]), _x(w["ratio"]),
         _target(w["ratio"], TARGET_WORST)],
        [f"requests that compiled ({s['compiled']} of {n}), medians", _ms(s["cold_median_rlx_s"]),
         _ms(s["cold_median_ort_s"]), _x(s["cold_median_ratio"]), ""],
        [f"requests with no compile ({n - s['compiled']} of {n}), medians", _ms(s["warm_median_rlx_s"]),
         _ms(s["warm_median_ort_s"]), _x(s["warm_median_ratio"]), ""],
        [f"steady state, {at}: static compile", _ms(stat), _ms(ort), _x(stat / ort), ""],
        [f"steady state, {at}: dynamic compile", _ms(dyn), _ms(ort), _x(dyn / ort), ""],
        [f"steady state, {at}: dynamic / static", "", "", _x(dyn / stat), _target(dyn / stat, TARGET_STEADY)],
    ]


def notes(doc: dict[str, Any]) -> list[str]:
    """What the table leaves out: setup times, compile counts, the outputs' agreement."""
    s, st = doc["stream"], doc["steady"]
    first = ", ".join(f"{k}={v}" for k, v in sorted(doc["first_shape"].items()))
    steady_compiles = " and one at the steady state's size" if st["dynamic_compiled"] else ""
    iqrs = ", ".join(f"{name.removeprefix('rlx cpu, ')} {_ms(iqr)}" for name, iqr in st["iqr_s"].items())
    return [
        f"compiles: {s['compiled']} during the stream ({s['distinct_shapes']} distinct sizes in {s['requests']} "
        f"requests; the LRU keeps 8), plus the warm-up's at {first} (the size `rlx_core.compile` placed the "
        f"graph at){steady_compiles}: {doc['compiles']} in all",
        f"setup, not in the stream's total: `rlx_core.onnx.load` {_ms(doc['load_s'])}, `rlx_core.compile` "
        f"{_ms(doc['compile_s'])}, ONNX Runtime session {_ms(doc['ort_session_s'])}; the static graph's load and "
        f"compile at batch {st['batch']}, seq {st['seq']} {_ms(st['static_load_compile_s'])}",
        f"outputs: largest max|rlx - ORT| / max|ORT| over the stream {s['max_diff']:.2g} (tolerance {TOLERANCE:g}), "
        f"{len(s['mismatches'])} mismatch(es)",
        "the compiled and not compiled requests' ratios are medians of per-request ratios; steady state: "
        f"medians of {st['rounds']} interleaved rounds (interquartile ranges: {iqrs})",
    ]


def print_console(doc: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    for model in doc["models"]:
        if "error" in model:
            console.print(f"{model['name']}: rlx failed: {model['error']}", style="bold red", highlight=False)
            continue
        table = Table(title=f"{model['name']}: {model['summary']}", title_justify="left")
        table.add_column(HEADER[0], ratio=1)  # wraps on a narrow terminal; the figures never do
        for head in HEADER[1:]:
            table.add_column(head, justify="left" if head == "target" else "right", no_wrap=True)
        for row in table_rows(model):
            table.add_row(*row)
        console.print(table)
        for note in notes(model):
            console.print(f"  {note}", highlight=False)
    m = doc["machine"]
    console.print(f"{m['usable_cores']} usable cores, {m['cpu']}; {doc['date']}", highlight=False)


def markdown_section(doc: dict[str, Any]) -> str:
    """The body of the ``## Dynamic shapes`` section of BENCHMARKS.md."""
    m = doc["machine"]
    load = f", 1-minute load average {m['load_1min']:.2f} at the start" if m.get("load_1min") is not None else ""
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if k in ("python", "numpy", "onnx",
                         "onnxruntime", "rlx-core", "rlx-cpu"))
    parts = [
        f"_Generated by `bench/dynamic.py` on {doc['date']}; do not edit by hand._",
        "ONNX models with symbolic `batch` and `seq` axes, every size inside computed at run time as torch's "
        "exporter writes them (`Shape -> Gather -> Unsqueeze -> Concat -> Reshape`, `Range`, `Slice`, "
        "`ConstantOfShape`, `Expand`), loaded by rlx without `dims` and compiled once with "
        "`rlx_core.compile(graph, device=\"cpu\")`: from the first run (the graph has two symbols), every new set of "
        "sizes runs on the executable rlx-cpu compiles once for every size (kernels reading their sizes per run, "
        "no compile per size), and a size met three times is compiled for itself (an LRU of 8); "
        "ONNX Runtime runs the same bytes (CPU provider, default options). The stream: "
        f"{doc['requests']} requests, batch uniform in 1..{MAX_BATCH} and seq in 1..{MAX_SEQ} (seed "
        f"{STREAM_SEED}), served in blocks of {BLOCK} back to back by each runtime in turn after a 150 ms pause "
        "(each first on every other block), each request timed on its own, rlx's time including any compile, "
        "after a warm-up of both. Every rlx output is compared with "
        f"ONNX Runtime's (max abs difference over ORT's max abs value ≤ {TOLERANCE:g}).",
        f"Targets: the stream's total ≤ {TARGET_TOTAL:g}x ONNX Runtime's, no request slower than "
        f"{TARGET_WORST:g}x ONNX Runtime's, the dynamic compile's steady state ≤ {TARGET_STEADY:g}x the static "
        "compile's.",
        f"Command: `{doc['command']}`; measured on {m['usable_cores']} usable cores ({m['logical_cores']} logical), "
        f"{m['cpu']}{load}; {versions}.",
    ]
    for model in doc["models"]:
        parts.append(f"### {model['name']}: {model['summary']}")
        if "error" in model:
            parts.append(f"rlx failed: `{model['error']}`")
            continue
        lines = ["| " + " | ".join(HEADER) + " |", "|---|--:|--:|--:|---|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table_rows(model)]
        parts.append("\n".join(lines))
        parts.append("\n".join(f"- {n}" for n in notes(model)))
    if m.get("load_1min") is not None and m["load_1min"] > (m["usable_cores"] or 1):
        parts.append(f"Note: the machine was busy (load {m['load_1min']:.1f} on {m['usable_cores']} cores): these "
                     "figures are inflated and noisy; rerun on a quiet machine.")
    parts.append("Reproduce: `nox -s bench`, or `python bench/dynamic.py [--write]` in an environment with "
                 "rlx-core, rlx-cpu, onnx, onnxruntime and rich.")
    return "\n\n".join(parts)


# ------------------------------------------------------------------------- main
def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/dynamic.py", description=(__doc__ or "").split("\n")[0])
    quick = f"{QUICK_REQUESTS} requests, 3 short rounds: checks that it runs (never writes)"
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--requests", type=int, help=f"per model (default {REQUESTS}, {QUICK_REQUESTS} with --quick)")
    parser.add_argument("--rounds", type=int, help="steady-state rounds (default 15, 3 with --quick)")
    parser.add_argument("--width", type=int, default=WIDTH, help=f"model width (default {WIDTH}; {HEADS} heads)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--write", nargs="?", const=str(BENCHMARKS_MD), metavar="FILE",
                        help=f"rewrite the '{SECTION_NAME}' section of BENCHMARKS.md (or FILE)")
    args = parser.parse_args(argv)
    args.requests = args.requests if args.requests is not None else (QUICK_REQUESTS if args.quick else REQUESTS)
    args.rounds = args.rounds if args.rounds is not None else (3 if args.quick else 15)
    args.target_s = 0.01 if args.quick else 0.05
    if args.requests < 1 or args.rounds < 1 or args.width < HEADS or args.width % HEADS:
        parser.error(f"--requests and --rounds must be >= 1, --width a positive multiple of {HEADS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rich.console import Console

    console = Console()
    try:
        import onnx  # noqa: F401  (the models are written with onnx.helper)
        import onnxruntime  # noqa: F401  (the yardstick)
    except ImportError as exc:
        console.print(f"bench/dynamic.py needs onnx and onnxruntime: {exc}", highlight=False)
        return 2
    given = sys.argv[1:] if argv is None else argv
    machine = _report.machine()
    machine["load_1min"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # before any work
    stream = request_stream(args.requests)
    step = lambda text: console.print(f"[dim]{text}[/dim]", highlight=False)
    results = [bench_model(model, stream, args.rounds, args.target_s, step) for model in build_models(args.width)]
    doc = {"benchmark": "dynamic", "command": "python bench/dynamic.py" + "".join(" " + shlex.quote(a) for a in given),
           "date": time.strftime("%Y-%m-%d %H:%M %Z"), "requests": args.requests, "width": args.width,
           "machine": machine, "models": results}
    print_console(doc, console)
    found = [line for model in results for line in problems(model)]
    for line in found:
        console.print(line, style="bold red", highlight=False)
    if args.json:
        import json

        _markdown.write_atomic(Path(args.json), json.dumps(doc, indent=2, default=float) + "\n")
        console.print(f"wrote {args.json}", highlight=False)
    if args.write and args.quick:
        console.print("--quick never writes BENCHMARKS.md", highlight=False)
    elif args.write and found:
        console.print(f"not writing {args.write}: rlx failed or its outputs did not match", style="bold red")
    elif args.write:
        _markdown.update_file(args.write, {SECTION_NAME: markdown_section(doc)})
        console.print(f"wrote the {SECTION_NAME!r} section of {args.write}", highlight=False)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
