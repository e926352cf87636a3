"""What the suite writes: the machine it ran on, and its results as markdown and rich tables.

Everything is rendered from the JSON document that ``bench/suite.py`` saves
(``bench/results/suite.json``), so BENCHMARKS.md never says something the JSON does not.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

import rlx_core as rlx

from . import _checks

_DISTRIBUTIONS = ("numpy", "scipy", "onnx", "onnxruntime", "onnxruntime-gpu", "jax", "jaxlib", "rich")
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _blas() -> str:
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # older numpy, or a build without the metadata
        return "unknown"


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for dist in _DISTRIBUTIONS:
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    found["rlx-core"] = rlx.__version__
    for ep in md.entry_points(group="rlx.backends"):
        if ep.dist is not None:
            found[ep.dist.name] = ep.dist.version
    return found


def machine() -> dict[str, Any]:
    """The machine and software the figures belong to."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    devices = []
    for cand in rlx.device_report():
        devices.append({"device": cand.device, "label": cand.label, "available": cand.available,
                        "reason": cand.reason})
    return {"cpu": _cpu_model(), "logical_cores": os.cpu_count(), "usable_cores": usable,
            "memory_gib": _memory_gib(), "system": platform.platform(), "blas": _blas(),
            "versions": _versions(), "rlx_devices": devices,
            "thread_env": {k: os.environ[k] for k in _THREAD_VARS if k in os.environ}}


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" if ms >= 1 else f"{ms:.3f}"


def _ratio(row: dict[str, Any]) -> str:
    return f"{row['ratio_to_ort']:.2f}" if row.get("ratio_to_ort") is not None else "-"


def _diff(row: dict[str, Any]) -> str:
    if row["status"] in ("failed", "unavailable"):
        return "-"
    if row.get("max_abs_diff") is None:
        return "(reference)" if row["kind"] == "onnxruntime" else "-"
    mark = "" if row["status"] == "ok" else " **MISMATCH**"
    return f"{row['max_abs_diff']:.2g}{mark}"


def contender_rows(model: dict[str, Any]) -> list[list[str]]:
    """One table row per contender: name, median, IQR, ratio to ORT, first run, diff."""
    rows = []
    for r in model["contenders"]:
        if r["status"] in ("failed", "unavailable"):
            rows.append([r["name"], r["status"], "-", "-", "-", r.get("error", "")[:200]])
            continue
        first = fmt_ms(r["first_run_s"])
        rows.append([r["name"], fmt_ms(r["median_s"]), fmt_ms(r["iqr_s"]), _ratio(r), first, _diff(r)])
    return rows


HEADER = ["contender", "median ms", "IQR ms", "ratio to ORT", "first run ms", "max abs diff vs ORT"]


def _md_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|---|--:|--:|--:|--:|--:|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _model_notes(model: dict[str, Any]) -> list[str]:
    notes = []
    tol = model.get("tolerance")
    if tol:
        notes.append(f"tolerance {tol['tol']:.2g} (output scale {tol['scale']:.3g}, ORT vs float64 "
                     f"{tol['ort_err']:.2g})")
    if model.get("import_error"):
        notes.append(f"rlx_core.onnx.load failed: {model['import_error']}")
    elif model.get("import_s") is not None:
        notes.append(f"rlx_core.onnx.load {fmt_ms(model['import_s'])} ms")
    setups = [f"{r['name']} {fmt_ms(r['setup_s'])}" for r in model["contenders"]
              if r.get("setup_s") is not None and r["kind"] in ("rlx", "onnxruntime")]
    if setups:
        notes.append("of which compile or session creation, ms: " + ", ".join(setups))
    for device, why in model.get("skipped_devices", {}).items():
        notes.append(f"rlx {device} not run: {why}")
    return notes


def suite_markdown(doc: dict[str, Any]) -> str:
    """The body of ``## Suite``."""
    cfg = doc["config"]
    parts = [
        f"_Generated by `bench/suite.py` on {doc['date']}; do not edit by hand (rerun `nox -s bench`)._",
        f"Command: `{doc['command']}`. Sizes `{cfg['size']}`; {cfg['rounds']} rounds, median and interquartile "
        f"range of seconds per call, contenders interleaved (shuffled order, {cfg['pause_s'] * 1e3:.0f} ms pause and "
        f"a warm call before every contender block), each measurement ≥ {cfg['target_s'] * 1e3:.0f} ms of back-to-back "
        "calls. Every "
        "contender takes host numpy inputs and returns host numpy outputs. `ratio to ORT` is the median over ONNX "
        "Runtime's (CPU provider, default threads): below 1 is faster. `first run` is compile or session "
        "creation plus the first call.",
        f"Correctness: each output is compared with ORT's; the tolerance is {_checks.K:g} * max|ORT - ref64| + "
        f"{_checks.FLOOR:g} * eps32 * max|ref64|, where ref64 is the hand-written numpy model in float64 "
        "(see `bench/_checks.py`).",
    ]
    for model in doc["models"]:
        parts.append(f"### {model['name']}: {model['summary']}")
        parts.append(_md_table(contender_rows(model)))
        notes = _model_notes(model)
        if notes:
            parts.append("\n".join(f"- {n}" for n in notes))
    return "\n\n".join(parts)


def machine_markdown(doc: dict[str, Any]) -> str:
    """The body of ``## Machine``."""
    m = doc["machine"]
    mem = f", {m['memory_gib']} GiB" if m.get("memory_gib") else ""
    lines = [
        f"- CPU: {m['cpu']}, {m['logical_cores']} logical cores ({m['usable_cores']} usable){mem}",
        f"- System: {m['system']}; BLAS (numpy): {m['blas']}",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
    ]
    avail = [f"{d['device']} ({d['label']})" for d in m["rlx_devices"] if d["available"]]
    unavail = [f"{d['device']} ({d['reason']})" for d in m["rlx_devices"] if not d["available"]]
    lines.append("- rlx devices available: " + (", ".join(avail) or "none"))
    if unavail:
        lines.append("- rlx devices unavailable: " + ", ".join(unavail))
    if m.get("thread_env"):
        lines.append("- Thread settings: " + ", ".join(f"{k}={v}" for k, v in m["thread_env"].items()))
    lines.append(f"- Command: `{doc['command']}` ({doc['date']})")
    return "\n".join(lines)


def print_console(doc: dict[str, Any], console: Any) -> None:
    """The results as rich tables (what a developer sees at the end of a run)."""
    from rich.table import Table

    for model in doc["models"]:
        table = Table(*HEADER, title=f"{model['name']}: {model['summary']}", title_justify="left")
        for row in contender_rows(model):
            table.add_row(*row)
        console.print(table)
        for note in _model_notes(model):
            console.print(f"  {note}", highlight=False)
    console.print(f"python {sys.version.split()[0]}, {doc['machine']['cpu']}", highlight=False)
