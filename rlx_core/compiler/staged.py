"""A ``StagedGraph`` compiled: each stage compiled once per graph built, ops on the host between.

Each stage's graph is compiled through the same entry point as any graph (``compile``:
placement under the caller's policy, fallback, partition; a symbolic or value-built stage
gets its own per-size copies), the first time it is met, and kept: a stage fixed at load
is compiled once, a stage built after a host step once per signature (the sizes the data
made), in an LRU of ``max_shapes`` per stage. The report says which stages run where,
what ran on the host, and each build: when and how long it took.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError
from ..ir import Graph
from ..ir.staged import HostStep, StagedGraph, shown_ops
from ..ir.valued import RunTimeGraph
from .compiled import CompiledGraph, CompileReport
from .dynamic import DEFAULT_MAX_SHAPES

__all__ = ["StagedCompiledGraph"]

log = logging.getLogger("rlx.session")

#: Lines of "stage ... built" the report keeps (the newest).
_REPORT_LINES = 32


class StagedCompiledGraph(CompiledGraph):
    """See the module docstring. ``compile_graph(graph, device)`` compiles one stage's
    graph (static, symbolic or built at run time) on ``device``, or where the policy picks
    when it is None: a stage's first graph is placed so, every later graph of that stage
    (a new size the data made) goes to the device its first went to, as a symbolic graph's
    shape classes do (no ranking per size, no device flicker). ``device`` is the device
    asked for (``auto`` until the first stage compiles, then that stage's device)."""

    def __init__(self, graph: StagedGraph, compile_graph: Callable[[Graph, str | None], CompiledGraph],
                 device: str | None = None, *, max_shapes: int = DEFAULT_MAX_SHAPES) -> None:
        if max_shapes < 1:
            raise ValueError(f"max_shapes must be at least 1, got {max_shapes}")
        # Nothing is compiled yet: the base's constructor (which takes an executable) is not run.
        self.graph = graph
        self._device = device if device not in (None, "", "auto") else "auto"
        self._report = CompileReport(graph.name, self._device, f"not compiled yet: {graph.needs()}")
        self._report.notes.extend(_plan(graph))
        self._compile_graph = compile_graph
        self._max_shapes = max_shapes
        self._stages: dict[int, OrderedDict[int, tuple[Graph, CompiledGraph]]] = {}
        self._placed: dict[int, str] = {}  # stage index -> the device its first graph compiled on
        self._params: dict[str, np.ndarray] = {}
        self._compiling = threading.Lock()
        self._history: list[str] = []
        self._first_notes: list[str] = []
        self.compiles = 0

    def run(self, inputs: Mapping[str, Any], output: str = "numpy") -> list[Any]:
        """Every step in turn on ``inputs``. Outputs are numpy arrays (host memory, each a
        DLPack producer, so ``output="dlpack"`` gets them too): the host steps read the
        stages' outputs on the host anyway."""
        if output not in ("numpy", "dlpack"):
            raise ConfigError(f"run: output must be 'numpy' or 'dlpack', got {output!r}")
        return self.graph.run(inputs, self._run_stage)  # type: ignore[attr-defined]

    def _run_stage(self, index: int, graph: Graph, feed: dict[str, Any]) -> list[Any]:
        return self._compiled(index, graph).run(feed)

    def _compiled(self, index: int, graph: Graph) -> CompiledGraph:
        kept = self._stages.setdefault(index, OrderedDict())
        found = kept.get(id(graph))
        if found is not None and found[0] is graph:
            return found[1]
        with self._compiling:
            found = kept.get(id(graph))
            if found is not None and found[0] is graph:
                return found[1]
            t0 = time.perf_counter()
            placed = self._placed.get(index)
            cg = self._compile_graph(graph, placed)
            if placed is None and cg.device != "auto" and "+" not in cg.device:  # a split is planned again
                self._placed[index] = cg.device
            for name, value in self._params.items():
                _hand(graph, cg, name, value)
            seconds = time.perf_counter() - t0
            if not self.compiles:  # the first stage placed: its report (candidates, why) leads
                self._device = cg.device
                self._report = dataclasses.replace(cg.report(), notes=list(cg.report().notes))
                self._first_notes = list(cg.report().notes)
            self.compiles += 1
            step = self.graph.steps[index]  # type: ignore[attr-defined]
            shown = ", ".join(f"{graph.node(i).name}{list(graph.node(i).shape)}" for i in graph.inputs
                              if not graph.is_symbolic)
            where = f"compiled in {seconds * 1e3:.1f} ms on {cg.device}" if cg.device != "auto" else (
                "built and compiled at each run for the values it reads")
            line = f"{step.what}: {where}{' for ' + shown if shown and index else ''} at {time.strftime('%H:%M:%S')}"
            self._history.append(line)
            del self._history[:-_REPORT_LINES]
            self._report.notes[:] = self._first_notes + _plan(self.graph) + self._history  # type: ignore[arg-type]
            log.info("graph %r: %s", self.graph.name, line)
            kept[id(graph)] = (graph, cg)
            while len(kept) > self._max_shapes:
                kept.popitem(last=False)
        return cg

    def set_param(self, name: str, value: Any) -> None:
        """Replace a param in every stage compiled that holds it (a nested staged part's
        too), and in every stage built later. ``InputError`` when no stage compiled so far
        holds it, and every stage has been compiled at least once. A part built per value
        (``ValueDependentGraph``) takes the file's weights at each build."""
        frozen = np.asarray(value)
        with self._compiling:
            held = self._offer(name, frozen)
            stages = sum(not isinstance(s, HostStep) for s in self.graph.steps)  # type: ignore[attr-defined]
            if not held and len(self._stages) == stages:
                raise InputError(f"graph {self.graph.name!r} has no param {name!r} in any of its stages")

    def _offer(self, name: str, frozen: np.ndarray) -> bool:
        """Hand ``name`` to every compiled stage that holds it, and keep it for later
        builds; whether any held it."""
        self._params[name] = frozen
        compiled = [pair for kept in self._stages.values() for pair in kept.values()]
        return any([_hand(graph, cg, name, frozen) for graph, cg in compiled])

    @property
    def device(self) -> str:
        return self._device

    def __repr__(self) -> str:
        return f"<StagedCompiledGraph {self.graph.name!r} on {self._device}, {self.compiles} stage compile(s)>"


def _hand(graph: Graph, cg: CompiledGraph, name: str, value: np.ndarray) -> bool:
    """Give a param to one compiled stage when it holds it (a nested staged part looks in
    its own stages); whether it did."""
    if isinstance(cg, StagedCompiledGraph):
        with cg._compiling:  # (the caller holds its own stage's lock: locks are taken outside in)
            return cg._offer(name, value)
    if isinstance(graph, RunTimeGraph) or name not in {graph.node(i).name for i in graph.params}:
        return False
    cg.set_param(name, value)
    return True


def _plan(graph: StagedGraph) -> list[str]:
    """The steps as the report lists them (a run of host steps as one line)."""
    return [f"step {i + 1}: {what}" if what is not None else f"on the host (numpy): {shown_ops(hosts)}"
            for i, what, hosts in graph.step_groups()]
