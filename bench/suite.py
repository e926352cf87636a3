"""The model suite: every rlx device against ONNX Runtime, hand-written numpy and jax.jit.

Five models (``bench/models.py``: an MLP, a transformer encoder layer, a 15-op
elementwise chain, a small CNN, a 2048³ MatMul) are written as ONNX files with fixed
seeds; rlx imports each with ``rlx_core.onnx.load`` and compiles it for every available
device that can run it. All contenders run on the same inputs and are checked against
ORT (``bench/_checks.py``), then timed interleaved, median of rounds
(``bench/_timing.py``). Results go to ``bench/results/suite.json`` and, with ``--write``,
to the ``## Suite`` and ``## Machine`` sections of BENCHMARKS.md (other sections are
kept as they are: ``bench/overhead.py --write`` owns ``## Dispatch overhead``).

    python bench/suite.py --write          # full sizes, 20 rounds, updates BENCHMARKS.md
    python bench/suite.py --quick          # small sizes, 5 rounds: checks that it all runs
    python bench/suite.py --models mlp,cnn --rounds 30 --devices cpu

Exit status: 0 when every contender ran and agreed with ORT, 1 when one disagreed or an
rlx device failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file (python bench/suite.py): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _checks, _contenders, _markdown, _report, _timing, models
from rlx_core.errors import ConfigError, RlxError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "bench" / "results" / "suite.json"
DEFAULT_MARKDOWN = ROOT / "BENCHMARKS.md"
log = logging.getLogger("rlx.bench")


def bench_model(model: models.SuiteModel, *, rounds: int, pause: float, target_s: float,
                devices: list[str] | None = None, with_jax: bool = True,
                on_step: Callable[[str], None] | None = None,
                on_round: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Prepare, check and time every contender of ``model``; a JSON-ready result."""
    step = on_step or (lambda _what: None)
    step("rlx_core.onnx.load")
    graph, import_s, import_error = _contenders.import_graph(model)
    chosen, skipped = _contenders.rlx_devices(graph, devices) if graph is not None else ([], {})
    prepared = _contenders.prepare_all(model, graph, chosen, with_jax=with_jax, on_step=step)
    ort = next((c for c in prepared if isinstance(c, _contenders.Contender) and c.name == "onnxruntime"), None)
    if ort is None:
        why = next((f.error for f in prepared if f.name == "onnxruntime"), "not prepared")
        raise RlxError(f"bench model {model.name!r}: ONNX Runtime, the yardstick, failed: {why}")
    step("float64 reference")
    tol = _checks.derive_tolerance(model.name, ort.first_output, model.reference64())
    ready = [c for c in prepared if isinstance(c, _contenders.Contender)]
    step("timing")
    timings = _timing.measure(ready, rounds, pause, target_s, on_round=on_round)

    rows = []
    for c in prepared:
        if isinstance(c, _contenders.Failure):
            rows.append({"name": c.name, "kind": c.kind, "status": "unavailable" if c.expected else "failed",
                         "error": c.error})
            continue
        t = timings[c.name]
        good, diff = tol.check(c.first_output, ort.first_output)
        is_ort = c is ort
        rows.append({"name": c.name, "kind": c.kind, "status": "ok" if good or is_ort else "mismatch",
                     "median_s": t.median, "iqr_s": t.iqr, "loops": t.loops, "samples_s": list(t.times),
                     "ratio_to_ort": t.median / timings[ort.name].median, "first_run_s": c.first_run_s,
                     "setup_s": c.setup_s, "max_abs_diff": None if is_ort else diff, "info": c.info})
    return {"name": model.name, "summary": model.summary, "size": model.size, "params": model.params,
            "import_s": import_s if graph is not None else None, "import_error": import_error,
            "skipped_devices": skipped, "tolerance": {"scale": tol.scale, "ort_err": tol.ort_err, "tol": tol.tol},
            "contenders": rows}


def suite_ok(doc: dict[str, Any]) -> bool:
    """Every contender agreed with ORT, no rlx device failed, every model imported."""
    for model in doc["models"]:
        if model["import_error"] or any(r["status"] in ("mismatch", "failed") for r in model["contenders"]):
            return False
    return True


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/suite.py", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and 5 rounds: a check that it all runs")
    parser.add_argument("--size", choices=("full", "quick", "tiny"),
                        help="size preset (default full, quick with --quick)")
    parser.add_argument("--models", action="append", metavar="NAMES",
                        help=f"comma-separated models to run (default all: {','.join(models.MODEL_NAMES)})")
    parser.add_argument("--devices", metavar="NAMES", help="comma-separated rlx devices to time (default every viable)")
    parser.add_argument("--no-jax", action="store_true", help="leave out the hand-written jax.jit contender")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per model (default 20, 5 with --quick)")
    parser.add_argument("--pause", type=float, default=0.15,
                        help="seconds of sleep before every contender block (default 0.15)")
    parser.add_argument("--target-ms", type=float, help="length of one measurement (default 20 ms, 5 with --quick)")
    parser.add_argument("--json", default=str(DEFAULT_JSON), metavar="FILE", help="results as JSON ('-': stdout)")
    parser.add_argument("--write", nargs="?", const=str(DEFAULT_MARKDOWN), metavar="FILE",
                        help="rewrite the '## Suite' and '## Machine' sections of BENCHMARKS.md (or FILE)")
    args = parser.parse_args(argv)
    args.size = args.size or ("quick" if args.quick else "full")
    args.rounds = args.rounds if args.rounds is not None else (5 if args.quick else 20)
    args.target_s = (args.target_ms if args.target_ms is not None else (5.0 if args.quick else 20.0)) / 1e3
    names = [n.strip() for chunk in (args.models or []) for n in chunk.split(",") if n.strip()]
    args.model_names = names or list(models.MODEL_NAMES)
    unknown = [n for n in args.model_names if n not in models.MODEL_NAMES]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(models.MODEL_NAMES)}")
    args.device_list = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else None
    if args.rounds < 1 or args.pause < 0 or args.target_s <= 0:
        parser.error("--rounds must be >= 1, --pause >= 0 and --target-ms > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=args.json == "-")
    try:
        import onnxruntime  # noqa: F401  (the yardstick: nothing is judged without it)
    except ImportError:
        console.print("bench/suite.py needs onnxruntime: pip install onnxruntime", highlight=False)
        return 2
    if args.device_list is not None:
        import rlx_core as rlx

        known = rlx.available_devices()
        missing = [d for d in args.device_list if d not in known]
        if missing:
            raise ConfigError(f"--devices: {', '.join(missing)} not available here; available: {', '.join(known)}")

    command = "python bench/suite.py" + "".join(" " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    built = models.build_many(args.model_names, args.size)
    results = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("suite", total=len(built) * (args.rounds + 1))
        for model in built:
            def step(what: str, model: models.SuiteModel = model) -> None:
                progress.update(task, description=f"{model.name}: {what}")

            results.append(bench_model(model, rounds=args.rounds, pause=args.pause, target_s=args.target_s,
                                       devices=args.device_list, with_jax=not args.no_jax, on_step=step,
                                       on_round=lambda _r: progress.advance(task)))
            progress.advance(task)
    doc = {"benchmark": "suite", "command": command, "date": time.strftime("%Y-%m-%d %H:%M %Z"),
           "config": {"size": args.size, "rounds": args.rounds, "pause_s": args.pause, "target_s": args.target_s,
                      "tolerance": {"k": _checks.K, "floor_eps": _checks.FLOOR}},
           "machine": _report.machine(), "models": results}
    doc["ok"] = suite_ok(doc)

    if args.json == "-":
        print(json.dumps(doc, indent=2))
    else:
        _report.print_console(doc, console)
        _markdown.write_atomic(Path(args.json), json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {args.json}", highlight=False)
    if args.write:
        sections = {"Suite": _report.suite_markdown(doc), "Machine": _report.machine_markdown(doc)}
        _markdown.update_file(args.write, sections)
        console.print(f"wrote the 'Suite' and 'Machine' sections of {args.write}", highlight=False)
    if not doc["ok"]:
        console.print("[bold red]some contenders failed or disagreed with ONNX Runtime (see above)[/]")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RlxError as exc:
        print(f"bench/suite.py: {exc}", file=sys.stderr)
        sys.exit(2)
