"""The compile pipeline run once for a symbolic graph, then specialized per shape class.

``DynamicCompiledGraph`` compiles each new set of sizes. Specializing the user's graph
and running the pipeline (legalize, optimize, fuse) on it again for every size costs as
much as the backend's own compile on a small graph, and it is the same work each time:
the passes decide the same rewrites whatever the sizes. ``LoweredOnce`` runs the pipeline
once, on the symbolic graph, for the device the first compile chose, and each later
shape class specializes that lowered graph (``Graph.specialize``: every shape evaluated
at the sizes, the nodes whose attrs hold sizes typed again) and hands it to the backend.

What keeps it exact:

- The passes are written for symbolic shapes: a rewrite that pays only for some sizes
  (``known_less``), a constant read as data (``holds_array``), a sized constant copied as
  it is (``copy_source``).
- The backend's ``claims`` never sees a symbol (a plugin written against static shapes
  keeps working): it is asked about each node as it is at the representative size the
  graph was placed at, and every specialization is asked again, node by node, before
  the backend gets it. A node it declines at those sizes sends that size class down the
  old road (the user's graph specialized, then the whole pipeline), as does any failure
  of the symbolic pipeline itself (logged, never raised).
- The memory plan is made per specialization (it needs sizes), and checked like any
  compile's.

**Any size.** A backend that runs symbolic graphs itself (``Backend.compile_symbolic``:
rlx-cpu's kernels read their sizes per run) gets the lowered graph once, symbolic, and
returns one executable for every size (``any_size``, an ``AnySizeGraph``): the
``DynamicCompiledGraph`` then serves a new set of sizes on it with no compile at all, and
compiles a class of its own only for sizes that recur.

When: the symbolic pipeline costs about one and a half times the pipeline on one
specialization (symbolic shape arithmetic: mobilenet_v2 25 ms against 17), and each class
lowered from it then skips the pipeline. A graph that meets one more size (compiled at
its representative size and run at batch 1, or placed and run at one size) is better
served by the old road, so the first class this is asked for takes it, and the pipeline
runs symbolically at the second: from the third on, every class is cheaper than before.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..backends.registry import Registry, parse_device
from ..errors import PluginError
from ..ir import Graph, Node
from ..ir.shape_rules import evaluate_attr, has_sym, holds_sym
from ..ir.symbolic import evaluate
from ..passes.legalize import DtypeGate
from ..passes.pipeline import PipelineResult, first_declined, fusion_report_enabled, run_pipeline
from ..passes.plan import plan_memory
from ..plugin import CompileOptions
from .compiled import CompiledGraph, CompileReport, compile_lowered
from .inputs import validate_inputs
from .lowering import with_skipped_passes

__all__ = ["LoweredOnce", "AnySizeGraph", "show_notes"]

log = logging.getLogger("rlx.session")


class LoweredOnce:
    """``graph`` (symbolic) lowered once for ``device``; ``compile(bindings)`` compiles a
    shape class from it, or returns ``None`` where that class must take the old road."""

    def __init__(self, graph: Graph, device: str, at: Mapping[str, int], registry: Registry,
                 options: CompileOptions | None) -> None:
        self._graph, self._device, self._at = graph, device, dict(at)
        self._registry, self._options = registry, options or CompileOptions()
        self._backend = registry.get(parse_device(device)[0])
        self._lock = threading.Lock()
        self._result: PipelineResult | None = None
        self._failed: str | None = None
        self._asked = 0
        self.seconds = 0.0  # the symbolic pipeline's one run
        self._any: AnySizeGraph | None = None
        self._any_tried = False
        self._any_lock = threading.Lock()

    @property
    def failed(self) -> str | None:
        """Why the symbolic pipeline did not run (every class then takes the old road)."""
        return self._failed

    def _claims(self, node: Node) -> bool | str:
        """The backend's claim on ``node`` as it is at the representative sizes."""
        if not _symbolic(node):
            return self._backend.claims(node)
        at = self._at
        attrs = {k: evaluate_attr(v, at) if holds_sym(v) else v for k, v in node.attrs.items()}
        static = dataclasses.replace(node, shape=tuple(evaluate(d, at) for d in node.shape), attrs=attrs)
        return self._backend.claims(static)

    def _lowered(self) -> PipelineResult | None:
        with self._lock:
            if self._result is None and self._failed is None:
                t0 = time.perf_counter()
                try:
                    opts = replace(with_skipped_passes(self._backend, self._options), plan=False)
                    result = run_pipeline(self._graph, self._claims, opts, gate=DtypeGate.of(self._backend))
                    if result.blocker is not None:
                        raise ValueError(f"blocked: {result.blocker}")
                    result.graph.freeze()
                    self._result = result
                except Exception as exc:  # the old road works for this graph: say why, never raise
                    self._failed = f"{type(exc).__name__}: {exc}"
                    log.info("graph %r: the pipeline did not run on its symbolic form (%s); each shape class is "
                             "lowered on its own", self._graph.name, self._failed)
                self.seconds = time.perf_counter() - t0
            return self._result

    def compile(self, bindings: Mapping[str, int]) -> CompiledGraph | None:
        """The shape class ``bindings`` compiled from the lowered graph, or ``None`` when
        the symbolic pipeline failed or the backend declines a node of it at these sizes,
        and for the first class asked (see the module)."""
        with self._lock:
            self._asked += 1
            first = self._asked == 1
        if first:  # one more size may be all a graph meets: the pipeline on it alone is cheaper
            return None
        result = self._lowered()
        if result is None:
            return None
        show = fusion_report_enabled()
        t0 = time.perf_counter()
        try:
            legal = result.graph.specialize(bindings)
        except Exception as exc:
            log.debug("graph %r: the lowered graph does not specialize to %s (%s)", self._graph.name,
                      dict(bindings), exc)
            return None
        refused = first_declined(legal, self._backend.claims)
        if refused is not None:
            log.debug("graph %r: %s declines %s at %s; lowered on its own", self._graph.name, self._device, refused,
                      dict(bindings))
            return None
        plan = plan_memory(legal) if self._options.plan else None
        return compile_lowered(legal, legal, result, self._device,
                               "placed at the representative size; lowered once for every size", [], self._registry,
                               self._options, plan, t0, show, user_nodes=len(self._graph))


    def any_size(self) -> AnySizeGraph | None:
        """The lowered graph compiled once for every size, where the backend runs symbolic
        graphs itself (``Backend.compile_symbolic``); ``None`` where it does not, declines
        this graph or fails (logged: each class is then compiled), or the symbolic
        pipeline did not run. Made at most once."""
        with self._any_lock:
            if not self._any_tried:
                self._any_tried = True
                self._any = self._compile_any()
            return self._any

    def _compile_any(self) -> AnySizeGraph | None:
        compile_symbolic = getattr(self._backend, "compile_symbolic", None)
        if not callable(compile_symbolic):  # a plugin written before the hook existed
            return None
        result = self._lowered()
        if result is None:
            return None
        t0 = time.perf_counter()
        legal = result.graph.copy()  # the compiled copy owns its graph (set_param replaces its values)
        legal.freeze()
        opts = replace(self._options, device=self._device, device_index=parse_device(self._device)[1])
        try:
            exe = compile_symbolic(legal, opts)
        except Exception as exc:  # the classes compiled one by one still serve: say why, never raise
            log.info("graph %r: %s did not compile it for every size (%s: %s); each shape class is compiled",
                     self._graph.name, self._device, type(exc).__name__, exc)
            return None
        if exe is None:
            return None
        if not callable(getattr(exe, "run", None)):
            log.info("graph %r: %s compile_symbolic returned %s, not an Executable; each shape class is compiled",
                     self._graph.name, self._device, type(exe).__name__)
            return None
        info = self._registry.info(parse_device(self._device)[0])
        seconds = time.perf_counter() - t0
        report = CompileReport(graph=self._graph.name, device=self._device, reason="lowered once; one executable "
                               "for every size", label=info.backend.label or info.label, compile_seconds=seconds,
                               user_nodes=len(self._graph), legalized_nodes=len(result.legalized.graph),
                               decomposed=list(result.legalized.decomposed), compiled_nodes=len(legal),
                               fused=result.fused, pipeline=result.describe())
        log.info("graph %r: compiled once for every size on %s in %.1f ms", self._graph.name, self._device,
                 seconds * 1e3)
        return AnySizeGraph(self._graph, self._device, exe, legal, report, self._registry, opts,
                            absorbed=result.folded_params)


class AnySizeGraph(CompiledGraph):
    """A symbolic graph compiled once for every size by a backend that runs symbolic graphs
    itself: ``run`` binds the sizes (an ``InputError`` for ones the graph refuses), runs
    the backend's executable, and checks each output against the graph's symbolic shape
    at those sizes (``output="dlpack"`` gets the same numpy arrays: host memory, each a
    DLPack producer)."""

    _shown: tuple[str, ...] = ()  # the executable's notes the report shows (``report``)

    def backend_notes(self) -> list[str]:
        """The executable's ``report_notes`` now (what it compiled since: shape buckets),
        ``[]`` when it has none or they fail."""
        notes = getattr(self._exe, "report_notes", None)
        try:
            return [str(n) for n in notes()] if callable(notes) else []
        except Exception as exc:  # a report must never fail for a plugin's notes
            log.debug("graph %r: report_notes failed: %s", self.graph.name, exc)
            return []

    def backend_compiles(self) -> int:
        """What the executable compiled since it was made (its ``compiles``: a bucketing
        backend's buckets), 0 when it does not say."""
        n = getattr(self._exe, "compiles", 0)
        return n if isinstance(n, int) and not isinstance(n, bool) else 0

    def exact_compile_pays(self, bindings: Mapping[str, int]) -> bool:
        """Whether a size met often is worth compiling on its own: the executable's optional
        ``exact_compile_pays(bindings)`` says (a bucket barely larger than the sizes runs as
        fast as their own compile would); ``True`` when it has none or it fails."""
        ask = getattr(self._exe, "exact_compile_pays", None)
        try:
            return bool(ask(bindings)) if callable(ask) else True
        except Exception as exc:
            log.debug("graph %r: exact_compile_pays failed: %s", self.graph.name, exc)
            return True

    def report(self) -> CompileReport:
        """The compile report, with the executable's notes as they are now."""
        self._shown = show_notes(self._report, self._shown, self.backend_notes())
        return self._report

    def run(self, inputs: Mapping[str, Any], output: str = "numpy") -> list[Any]:
        return self.run_bound(inputs, self.graph.bind(self.graph.input_shapes(inputs)), output)

    def run_bound(self, inputs: Mapping[str, Any], bindings: Mapping[str, int], output: str = "numpy") -> list[Any]:
        """``run`` with the sizes already bound from ``inputs`` (``Graph.bind``)."""
        if output not in ("numpy", "dlpack"):
            return super().run(inputs, output)  # (its error)
        arrays = validate_inputs(self._specs, inputs, self._device_inputs)
        return self._check_sized(self._execute(self._exe.run, arrays), bindings)

    def _check_sized(self, outs: Any, bindings: Mapping[str, int]) -> list[np.ndarray]:
        legal = self._legal
        if not isinstance(outs, (list, tuple)) or len(outs) != len(legal.outputs):
            n = len(outs) if isinstance(outs, (list, tuple)) else type(outs).__name__
            raise PluginError(f"backend {self.backend!r} returned {n} outputs for graph {self.graph.name!r}, "
                              f"which has {len(legal.outputs)}")
        result = []
        for i, (out, nid) in enumerate(zip(outs, legal.outputs)):
            node = legal.node(nid)
            shape, dtype = tuple(evaluate(d, bindings) for d in node.shape), np.dtype(node.dtype)
            if type(out) is not np.ndarray or out.shape != shape or out.dtype != dtype:
                got = f"{np.asarray(out).dtype}{list(np.shape(out))}" if hasattr(out, "shape") else type(out).__name__
                raise PluginError(f"backend {self.backend!r} returned output {i} of graph {self.graph.name!r} as "
                                  f"{got}; at {dict(bindings)} the graph declares {dtype}{list(shape)}")
            result.append(out)
        return result

    def __repr__(self) -> str:
        return f"<AnySizeGraph {self.graph.name!r} on {self._device}>"


def show_notes(report: CompileReport, shown: tuple[str, ...], fresh: list[str]) -> tuple[str, ...]:
    """``report``'s notes with the lines ``shown`` last time replaced by ``fresh`` (an
    executable's notes as they are now; the report stays the one object callers hold)."""
    notes = report.notes
    for line in shown:
        if line in notes:
            notes.remove(line)
    notes.extend(fresh)
    return tuple(fresh)


def _symbolic(node: Node) -> bool:
    return has_sym(node.shape) or any(holds_sym(v) for v in node.attrs.values())
