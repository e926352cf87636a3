"""Running one fuzz case on one device, fused and unfused, against the reference.

``Unfused`` wraps a discovered backend so that it claims only primitive ops: the core then
legalizes softmax, layer_norm, gelu, attention, ... into their decompositions and fuses
nothing before the same backend compiles the graph, so one case checks both the
backend's fused kernels and the core's decompositions. Cases that disagree are saved as JSON replay files (graph,
inputs, new params, the message), which ``test_differential.py`` replays as plain tests.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir.ops import PRIMITIVE_OPS

from ._bounds import Tracker, mismatch
from ._graphs import FuzzCase

REGRESSIONS = Path(__file__).parent / "regressions"
#: Graphs checked per device in this process (printed by ``conftest.py``'s summary).
CHECKED: collections.Counter[str] = collections.Counter()
#: Graphs a device declined (its claims refused an op), per device.
DECLINED: collections.Counter[str] = collections.Counter()
_PRIMITIVES = frozenset(op.value for op in PRIMITIVE_OPS)


class Unfused(rlx.Backend):
    """A discovered backend that claims only primitive ops: the core decomposes every
    composite and the backend never sees a fused op (gemm, fused_elementwise)."""

    label = "decomposed composites"

    def __init__(self, inner: rlx.Backend) -> None:
        self.inner = inner
        self.name = f"{inner.name}-unfused"  # type: ignore[misc]
        self.priority = inner.priority  # type: ignore[misc]

    def probe(self) -> rlx.Availability:
        return self.inner.probe()

    def supported_ops(self) -> frozenset[str]:
        return frozenset(self.inner.supported_ops()) & _PRIMITIVES

    def claims(self, node: Any) -> bool | str:
        return self.inner.claims(node) if str(node.op) in _PRIMITIVES else "unfused: primitives only"

    def cost_model(self) -> rlx.CostModel:
        return self.inner.cost_model()

    def compile(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable:
        return self.inner.compile(graph, dataclasses.replace(options, device=self.inner.name))


_UNFUSED: dict[str, rlx.Registry] = {}


def unfused_registry(device: str) -> rlx.Registry:
    if device not in _UNFUSED:
        reg = rlx.Registry(entry_points=[], environ={})
        reg.register(Unfused(rlx.get_backend(device)))
        _UNFUSED[device] = reg
    return _UNFUSED[device]


def _compare(case: FuzzCase, outs: list[np.ndarray], params: Mapping[str, np.ndarray], where: str) -> str | None:
    g = case.graph
    ref = reference.evaluate(g, case.inputs, params)
    tracker = Tracker(g, case.inputs, params)
    tracker.sync()
    for i, (nid, got, want) in enumerate(zip(g.outputs, outs, ref)):
        problem = mismatch(g.node(nid).dtype, got, want, tracker.errors[nid])
        if problem:
            return f"{where}: output {i} (node {nid}, {g.node(nid).op}): {problem}"
    return None


def run_case(case: FuzzCase, device: str) -> str | None:
    """Check ``case`` on ``device`` fused and unfused; ``None`` or what went wrong.

    Returns ``"declined"`` when the backend does not claim an op of the graph.
    """
    problems = []
    for label, reg, dev in (("fused", None, device), ("unfused", unfused_registry(device), f"{device}-unfused")):
        try:
            cg = rlx.compile(case.graph, device=dev, policy=rlx.DevicePolicy(), registry=reg)
        except rlx.DeviceError as exc:
            if "cannot run graph" in str(exc):
                return "declined"
            raise
        before = {k: v.copy() for k, v in case.inputs.items()}
        outs = cg.run(case.inputs)
        for k, v in before.items():
            if not np.array_equal(v, case.inputs[k], equal_nan=v.dtype.kind == "f"):
                problems.append(f"{dev} modified input {k!r}")
        problems.append(_compare(case, outs, {}, f"{dev} ({label})"))
        if case.new_params:
            for name, value in case.new_params.items():
                cg.set_param(name, value)
            problems.append(_compare(case, cg.run(case.inputs), case.new_params, f"{dev} ({label}) after set_param"))
    found = [p for p in problems if p]
    return "; ".join(found) if found else None


def check(case: FuzzCase, device: str) -> None:
    """``run_case`` as a test assertion: counts the graph, saves a replay file on failure."""
    try:
        problem = run_case(case, device)
    except Exception as exc:  # a crash is a finding too: keep the case, then let it propagate
        save_replay(case, device, f"raised {type(exc).__name__}: {exc}")
        raise
    if problem == "declined":
        DECLINED[device] += 1
        return
    CHECKED[device] += 1
    if problem:
        saved = save_replay(case, device, problem)
        where = f"\nreplay file: {saved}" if saved else ""
        raise AssertionError(f"{problem}\n{case.describe()}{where}")


# ---------------------------------------------------------------------------- replays
def _encode(arr: np.ndarray) -> dict[str, Any]:
    a = np.asarray(arr, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
    return {"dtype": a.dtype.name, "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode("ascii")}


def _decode(spec: Mapping[str, Any]) -> np.ndarray:
    raw = base64.b64decode(spec["data"])
    return np.frombuffer(raw, dtype=spec["dtype"]).reshape(spec["shape"]).copy()


def save_replay(case: FuzzCase, device: str, message: str) -> Path | None:
    """Write the case to ``RLX_FUZZ_SAVE_DIR`` (set by ``nox -s fuzz``), overwriting the
    device's last failure: hypothesis runs the shrunk example last, so that is what stays."""
    folder = os.environ.get("RLX_FUZZ_SAVE_DIR", "").strip()
    if not folder:
        return None
    doc = {
        "device": device, "message": message, "graph": json.loads(case.graph.to_json()),
        "inputs": {k: _encode(v) for k, v in case.inputs.items()},
        "new_params": {k: _encode(v) for k, v in case.new_params.items()}, "alive": sorted(case.alive),
    }
    path = Path(folder) / f"found-{device}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def load_replay(path: Path) -> tuple[FuzzCase, dict[str, Any]]:
    doc = json.loads(path.read_text())
    graph = rlx.Graph.from_json(json.dumps(doc["graph"]))
    inputs = {k: _decode(v) for k, v in doc["inputs"].items()}
    new_params = {k: _decode(v) for k, v in doc.get("new_params", {}).items()}
    case = FuzzCase(graph, inputs, new_params, frozenset(doc.get("alive", ())))
    return case, doc


def replay_id(path: Path) -> str:
    return f"{path.stem}-{hashlib.sha256(path.read_bytes()).hexdigest()[:6]}"
