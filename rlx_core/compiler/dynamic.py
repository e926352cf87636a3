"""Graphs with symbolic dims: compiled once per shape class, on the device picked once.

A graph whose inputs have symbolic dims (``g.input("x", ("batch", 64), "float32")``)
accepts any sizes that satisfy its shape rules. No backend of API 1 runs such a graph
itself: each is handed the graph *specialized* to concrete sizes (``Graph.specialize``),
exactly what the builder would have made with those sizes, so every backend, kernel and
pass works unchanged. This module keeps those specializations:

- **Placement at a representative size.** The cost ranking, the blockers, partitioning
  and the memory check need sizes. A symbolic graph is priced with every symbol bound
  to ``REPRESENTATIVE_SIZES[0]`` (16), or to the first of ``REPRESENTATIVE_SIZES`` its
  shape rules accept (a 7x7 convolution over a 16-pixel image does not fit); the
  report says which. The device picked there serves every size: re-ranking per size
  would compile a new device's copy for every new shape and make the choice flicker.
  Under ``"auto"`` the representative class is compiled there too (a device that fails
  to compile falls back to the next, as for any graph); on an explicit device it is only
  placed (``compile_placed``: its blocker named by ``compile``), and each class, the
  representative one included, is compiled when a run first needs it, so a model run at
  batch 1 waits for one compile, not two.
- **One executable per shape class.** ``run`` binds the symbols from the inputs'
  shapes (``Graph.bind``: a conflict is an ``InputError`` naming the input, the dim and
  both sizes), then runs the executable compiled for exactly those values, compiling it
  on first use. The shape classes are kept in a bounded LRU (``max_shapes``, default
  8): a server fed every sequence length from 1 to 512 holds at most eight compiled
  copies, not 512. The report lists every class compiled, when, and how long it took.
- **Params** set on the compiled graph reach every kept copy and every later one.
- **Lowered once.** From the second class after the representative one, a class is the
  graph lowered once for the device (``lowered_once.py``: the compile pipeline run on the
  symbolic graph) specialized to its sizes, not the pipeline run again; the report says
  which classes came from it.
- **One family.** Every copy is compiled inside the graph's ``ShapeFamily``
  (``rlx_core.plugin``), where a backend keeps what is the same at every size (rlx-cpu:
  its writable copies of the weights and their oneDNN layouts, held once, not once per
  shape class, and not made again for a new size).

- **Any size, no compile.** Where the backend runs symbolic graphs itself
  (``Backend.compile_symbolic``, e.g. rlx-cpu's kernels that read their sizes per run),
  the graph lowered once is compiled once for every size (``LoweredOnce.any_size``) and
  every new set of sizes from then on runs on it with no compile. It is made at the first
  new class for a graph of two symbols or more (batch and sequence: a server meets a new
  size on most requests), at the second for a graph of one (a batch: a few sizes that
  recur, and a model run at one more size is served cheapest by compiling just that). A
  class run ``STATIC_AFTER`` times there is compiled on its own at its next run (a plan fixed for
  sizes that recur is the fastest way to run them), into the same LRU, once: dropped
  from the LRU later, it runs on the executable for every size again; unless the
  executable's optional ``exact_compile_pays(bindings)`` says no (shape buckets: a size
  whose bucket is barely larger runs as fast there). The report counts the runs served
  this way, and ``compiles`` counts what the executable compiled since (buckets).

A backend that does not run symbolic graphs itself (every API-1 plugin) gets the
specializations above, the fallback every backend gets.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DeviceError, FallbackWarning
from ..ir import Graph
from ..ir.specialize import REPRESENTATIVE_SIZES, representative
from ..ir.valued import ValueDependentGraph
from ..plugin import ShapeFamily
from .compiled import CompiledGraph, CompileReport
from .inputs import check_param_value
from .lowered_once import AnySizeGraph, show_notes

__all__ = ["REPRESENTATIVE_SIZES", "DEFAULT_MAX_SHAPES", "representative", "DynamicCompiledGraph", "shape_key",
           "compile_symbolic", "compile_placed", "Placed", "describe_bindings", "ValueCompiledGraph"]

log = logging.getLogger("rlx.session")

#: Shape classes a ``DynamicCompiledGraph`` keeps compiled (least recently used dropped).
DEFAULT_MAX_SHAPES = 8
#: Lines of "compiled for ..." the report keeps (the newest).
_REPORT_LINES = 32
#: Runs of a shape class on the any-size executable before the class is compiled on its
#: own (at its next run): a size met this often is likely to recur.
STATIC_AFTER = 3
#: Shape classes whose runs on the any-size executable are counted (least recent dropped).
_COUNTED = 4096

def shape_key(bindings: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """The shape class of ``bindings``: its symbols and values, in name order."""
    return tuple(sorted(bindings.items()))


def describe_bindings(bindings: Mapping[str, int]) -> str:
    """``batch=8, seq=7``: how reports name a shape class."""
    return ", ".join(f"{k}={v}" for k, v in sorted(bindings.items())) or "(no symbols)"


class DynamicCompiledGraph(CompiledGraph):
    """A symbolic graph compiled per shape class on one device (see the module).

    ``compile_shape(graph)`` compiles a specialization (a static graph) on the device the
    first compile chose; ``first`` is that first compile, at ``bindings``. ``run`` takes
    any sizes that satisfy the graph; ``shapes()`` lists the classes compiled so far.
    """

    _shown: tuple[str, ...] = ()  # the executable for every size's notes the report shows (``report``)

    def __init__(self, graph: Graph, first: CompiledGraph | Placed, bindings: Mapping[str, int],
                 compile_shape: Callable[[Graph], CompiledGraph], *, max_shapes: int = DEFAULT_MAX_SHAPES,
                 seconds: float | None = None, family: ShapeFamily | None = None,
                 lowered: Any = None) -> None:
        if max_shapes < 1:
            raise ValueError(f"max_shapes must be at least 1, got {max_shapes}")
        # The base's executable and legal graph are never used for running here (``run`` and
        # ``set_param`` go to the copy of each shape class); ``first`` (a partitioned one too)
        # and its static graph stand in for them, or, placed only, the representative graph.
        if isinstance(first, Placed):
            super().__init__(graph, first.device, None, first.representative, first.report,  # type: ignore[arg-type]
                             first.registry, first.options)
        else:
            super().__init__(graph, first.device, first, first.graph, first.report(), first._registry,
                             getattr(first, "_options", None))
        self._compile_shape = compile_shape
        self._lowered = lowered  # the graph lowered once for the device (a ``LoweredOnce``; None: the old road)
        self._any: CompiledGraph | None = None  # its any-size executable, once made
        self._served: OrderedDict[tuple[tuple[str, int], ...], int] = OrderedDict()  # class -> runs on it
        self._misses = 0  # new classes met
        self._no_any = False  # the backend does not run this graph at any size
        # The new class from which the executable for every size is made: the first for a graph
        # of two symbols or more (batch and sequence: a new size on most requests), the second
        # for one (a batch: a few sizes that recur, where one compile of the first may be all).
        self._any_from = 1 if len(graph.symbols) >= 2 else 2
        self._any_served = 0
        self._served_lock = threading.Lock()
        self._failed: set[tuple[tuple[str, int], ...]] = set()  # classes it failed to run
        self._max_shapes = max_shapes
        self._family = family or ShapeFamily()  # (``first`` was compiled in it, when given)
        self._params: dict[str, np.ndarray] = {}  # set_param's values, for copies compiled later
        self._classes: OrderedDict[tuple[tuple[str, int], ...], CompiledGraph] = OrderedDict()
        self._compiling = threading.Lock()  # one compile at a time; runs of compiled classes never wait
        self._history: list[str] = []
        self._compiles = 0
        if isinstance(first, CompiledGraph):
            self._classes[shape_key(bindings)] = first
            when = first.report().compile_seconds if seconds is None else seconds
            self._record(bindings, when, "placed and priced here")
            self._compiles = 1

    # ------------------------------------------------------------------ running
    def run(self, inputs: Mapping[str, Any], output: str = "numpy") -> list[Any]:
        """Bind the symbols from the inputs' shapes, then run the copy compiled for them
        (compiled now if this shape class is new), or the executable for every size."""
        bindings = self.graph.bind(self.graph.input_shapes(inputs))
        cg = self._for_bindings(bindings)
        if isinstance(cg, AnySizeGraph):
            try:
                return cg.run_bound(inputs, bindings, output)
            except DeviceError as exc:  # its kernels failed at these sizes: this class compiled on its own
                warnings.warn(f"rlx: the executable for every size of graph {self.graph.name!r} failed at "
                              f"{describe_bindings(bindings)} ({exc}); compiling that size on its own",
                              FallbackWarning, stacklevel=2)
                key = shape_key(bindings)
                with self._served_lock:
                    if len(self._failed) < _COUNTED:
                        self._failed.add(key)  # that size never runs there again
                cg = self._compiled(bindings, key)
        return cg.run(inputs, output)

    def for_inputs(self, inputs: Mapping[str, Any]) -> CompiledGraph:
        """The compiled copy for the sizes of ``inputs`` (an ``InputError`` naming what is
        wrong when they fit no shape class of the graph), or the executable for every size
        where that serves them. Set params on this graph, not on a copy: copies may share
        their weights (``ShapeFamily``)."""
        return self._for_bindings(self.graph.bind(self.graph.input_shapes(inputs)))

    def _for_bindings(self, bindings: Mapping[str, int]) -> CompiledGraph:
        key = shape_key(bindings)
        cg = self._classes.get(key)
        if cg is not None:
            try:
                self._classes.move_to_end(key)
            except KeyError:  # dropped by another thread meanwhile: still a valid copy to run
                pass
            return cg
        any_size = self._any_size_for(key)
        if any_size is not None:
            return any_size
        return self._compiled(bindings, key)

    def _compiled(self, bindings: Mapping[str, int], key: tuple[tuple[str, int], ...]) -> CompiledGraph:
        """The class ``key`` compiled on its own (now, if it is not in the LRU)."""
        with self._compiling:
            cg = self._classes.get(key)
            if cg is None:
                cg = self._compile(bindings)
                self._classes[key] = cg
                while len(self._classes) > self._max_shapes:
                    dropped, _ = self._classes.popitem(last=False)
                    log.debug("graph %r: shape class %s dropped (max_shapes=%d)", self.graph.name,
                              describe_bindings(dict(dropped)), self._max_shapes)
        return cg

    def _any_size_for(self, key: tuple[tuple[str, int], ...]) -> CompiledGraph | None:
        """The any-size executable for a class with no compile of its own, or ``None``
        (none is made, or it is the first new class, or the class has just run
        ``STATIC_AFTER`` times on it: compile it). A class is compiled for itself once: one
        the LRU drops later runs on the executable for every size again, with no compile
        (else a server cycling through more sizes than the LRU keeps would compile one
        every few requests)."""
        if self._lowered is None or self._no_any or key in self._failed:
            return None
        served = self._served
        with self._served_lock:  # (runs may come from several threads)
            runs = served.get(key, 0)
            if runs == STATIC_AFTER and self._any is not None:
                served[key] = runs + 1  # (past the mark: never compiled again)
                pays = getattr(self._any, "exact_compile_pays", None)
                if pays is None or pays(dict(key)):
                    return None
        any_size = self._any
        if any_size is None:
            with self._served_lock:
                self._misses += 1
                first = self._misses < self._any_from
            if first:  # one more size may be all the graph meets: compile it
                return None
            any_size = self._make_any()
            if any_size is None:
                return None
        with self._served_lock:
            served[key] = served.get(key, 0) + 1
            served.move_to_end(key)
            while len(served) > _COUNTED:
                served.popitem(last=False)
            self._note_served()
        return any_size

    def _make_any(self) -> CompiledGraph | None:
        """The any-size executable, made once (``LoweredOnce.any_size``), set to the
        params set so far."""
        with self._compiling:
            if self._any is None:
                t0 = time.perf_counter()
                with self._family.compiling():
                    made = self._lowered.any_size()
                if made is None or self._params.keys() & made.absorbed_params:  # (see set_param)
                    self._no_any = True
                    return None
                for name, value in self._params.items():
                    made.set_param(name, value)
                seconds = time.perf_counter() - t0
                self._report.notes.append(f"any size: one executable for every size compiled in {seconds * 1e3:.1f} "
                                          f"ms at {time.strftime('%H:%M:%S')} (new sizes run on it with no compile; a "
                                          f"class run {STATIC_AFTER} times there is compiled on its own)")
                log.info("graph %r: compiled for every size on %s in %.1f ms", self.graph.name, self.device,
                         seconds * 1e3)
                self._compiles += 1  # (a compile, if not of one class: a request that waited for it says so)
                self._any = made
        return self._any

    def _note_served(self) -> None:
        notes = self._report.notes
        self._any_served += 1
        line = f"any size: {self._any_served} run(s) of new sizes served with no compile"
        for i in range(len(notes) - 1, -1, -1):
            if notes[i].startswith("any size: ") and notes[i].endswith("with no compile"):
                notes[i] = line
                return
        notes.append(line)

    def _compile(self, bindings: Mapping[str, int]) -> CompiledGraph:
        t0 = time.perf_counter()
        with self._family.compiling():
            cg = self._lowered.compile(bindings) if self._lowered is not None else None
            if cg is not None and self._params.keys() & cg.absorbed_params:  # (see set_param)
                self._lowered, cg = None, None
            once = cg is not None
            if cg is None:
                cg = self._compile_shape(self.graph.specialize(bindings))
        for name, value in self._params.items():
            cg.set_param(name, value)
        seconds = time.perf_counter() - t0
        self._record(bindings, seconds, "from the graph lowered once" if once else "")
        self._compiles += 1
        log.info("graph %r: compiled for %s on %s in %.1f ms", self.graph.name, describe_bindings(bindings),
                 self.device, seconds * 1e3)
        return cg

    def _record(self, bindings: Mapping[str, int], seconds: float, note: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        line = f"shape class {describe_bindings(bindings)}: compiled in {seconds * 1e3:.1f} ms at {stamp}" + (
            f" ({note})" if note else "")
        self._history.append(line)
        del self._history[:-_REPORT_LINES]
        notes = self._report.notes
        notes[:] = [n for n in notes if not n.startswith("shape class ")] + self._history

    # ------------------------------------------------------------------ the rest
    @property
    def compiles(self) -> int:
        """Compiles made for this graph: each shape class, the executable for every size,
        and what that executable compiled since (a bucketing backend's buckets)."""
        any_size = self._any
        return self._compiles + (any_size.backend_compiles() if isinstance(any_size, AnySizeGraph) else 0)

    def report(self) -> CompileReport:
        """The compile report, with what the executable for every size says of itself now
        (a backend serving sizes by buckets lists the buckets it compiled)."""
        any_size = self._any
        if isinstance(any_size, AnySizeGraph):
            self._shown = show_notes(self._report, self._shown, any_size.backend_notes())
        return self._report

    def shapes(self) -> list[dict[str, int]]:
        """The shape classes compiled and kept, least recently used first."""
        return [dict(k) for k in self._classes]

    def set_param(self, name: str, value: Any) -> None:
        """Replace a param in every kept copy and in every copy compiled later.

        A param the graph lowered once folded into its compiled code (``absorbed_params``)
        cannot be replaced in the copies made from it: they are dropped, and from then on
        each class is compiled on its own from the graph (whose copies compile again for a
        new value of such a param)."""
        _node, frozen = check_param_value(self.graph, name, value)
        with self._compiling:
            if self._any is not None and name in self._any.absorbed_params:
                self._any, self._no_any, self._lowered = None, True, None
            for key, cg in list(self._classes.items()):
                if name in cg.absorbed_params and not cg.can_compile_again:  # made from the graph lowered once
                    del self._classes[key]
                    self._lowered = None
            for cg in [*self._classes.values(), *((self._any,) if self._any is not None else ())]:
                cg.set_param(name, frozen)
            self._params[name] = frozen

    def __repr__(self) -> str:
        return (f"<DynamicCompiledGraph {self.graph.name!r} on {self.device}, "
                f"{len(self._classes)} shape class(es)>")


def compile_symbolic(graph: Graph, first_compile: Callable[[Graph], CompiledGraph],
                     later_compile: Callable[[Graph], CompiledGraph] | None = None,
                     lower_once: Callable[[str, Mapping[str, int]], Any] | None = None) -> DynamicCompiledGraph:
    """Compile symbolic ``graph``: ``first_compile`` of its representative specialization
    (placement, fallback and partition happen there), then, for each new shape class it
    meets, a compile from the graph lowered once for the device chosen (``lower_once(device,
    bindings)`` makes that lowering, or returns None) where it serves, else
    ``later_compile`` (default ``first_compile``) of the class's specialization."""
    graph.freeze()
    rep, bindings = representative(graph)
    family = ShapeFamily()
    with family.compiling():
        first = first_compile(rep)
    first.report().notes.append(f"symbolic dims ({', '.join(graph.symbols)}): placed and priced at "
                                f"{describe_bindings(bindings)}; compiled again per shape class on {first.device}")
    return DynamicCompiledGraph(graph, first, bindings, later_compile or first_compile, family=family,
                                lowered=_lowered(lower_once, first.device, bindings))


def _lowered(lower_once: Callable[[str, Mapping[str, int]], Any] | None, device: str,
             bindings: Mapping[str, int]) -> Any:
    """The graph lowered once for ``device`` (a ``LoweredOnce``; None: none is)."""
    return lower_once(device, bindings) if lower_once is not None else None


@dataclass(frozen=True)
class Placed:
    """A symbolic graph placed, not compiled: the device, the report saying why, and the
    representative specialization it was priced at (``compile_placed``)."""

    device: str
    report: CompileReport
    representative: Graph
    registry: Any
    options: Any


def compile_placed(graph: Graph, device: str, reason: str, registry: Any, options: Any,
                   compile_shape: Callable[[Graph], CompiledGraph],
                   lower_once: Callable[[str, Mapping[str, int]], Any] | None = None) -> DynamicCompiledGraph:
    """Symbolic ``graph`` placed on ``device`` (priced at its representative size, for
    ``reason``) with nothing compiled: each shape class is compiled with
    ``compile_shape`` (or from the graph lowered once) when a run first needs it. For an
    explicit device, where no fallback needs a compile to have succeeded: a model run at
    batch 1 then waits for one compile, not for its representative batch's as well."""
    graph.freeze()
    rep, bindings = representative(graph)
    report = CompileReport(graph.name, device, reason, user_nodes=len(graph))
    report.notes.append(f"symbolic dims ({', '.join(graph.symbols)}): placed and priced at "
                        f"{describe_bindings(bindings)}; each shape class compiled on {device} when a run first "
                        "needs it, or every size run on one executable where the backend runs symbolic graphs itself")
    return DynamicCompiledGraph(graph, Placed(device, report, rep, registry, options), bindings, compile_shape,
                                lowered=_lowered(lower_once, device, bindings))


class ValueCompiledGraph(DynamicCompiledGraph):
    """A ``ValueDependentGraph`` compiled per set of sizes and values (see ``ir/valued.py``).

    Nothing is placed or compiled before the first run: the graph has no body until the
    values of its value inputs are known. The first run builds the graph for its inputs
    and compiles it with ``first`` (placement, fallback and partition happen there, as for
    any static graph); each later set of values is built and compiled with ``later`` on
    the device the first chose. Compiled copies are kept in an LRU of ``max_shapes``, and
    the report lists each one, when, and how long it took. Until the first run ``device``
    is the device asked for (``"auto"`` when none was).
    """

    def __init__(self, graph: ValueDependentGraph, first: Callable[[Graph], CompiledGraph],
                 later: Callable[[Graph], CompiledGraph], device: str | None = None, *,
                 max_shapes: int = DEFAULT_MAX_SHAPES) -> None:
        if max_shapes < 1:
            raise ValueError(f"max_shapes must be at least 1, got {max_shapes}")
        # Nothing compiled yet: the base's constructor (which takes a first copy) is not run;
        # ``device`` and ``report`` are the first copy's once the first run compiles it.
        self.graph = graph
        self._device = device if device not in (None, "", "auto") else "auto"
        self._report = CompileReport(graph.name, self._device, f"not compiled yet: {graph.needs()}")
        self._first, self._compile_shape = first, later
        self._max_shapes = max_shapes
        self._params = {}
        self._classes = OrderedDict()
        self._compiling = threading.Lock()
        self._family = ShapeFamily()
        self._history = []
        self._compiles = 0
        self._any = None  # (it never runs on an executable for every size)

    def run(self, inputs: Mapping[str, Any], output: str = "numpy") -> list[Any]:
        """Build and compile for the sizes and values of ``inputs`` (when new), then run
        the copy on the other inputs."""
        return self.for_inputs(inputs).run(self.graph.feed(inputs), output)

    def for_inputs(self, inputs: Mapping[str, Any]) -> CompiledGraph:
        graph: ValueDependentGraph = self.graph  # type: ignore[assignment]
        key = graph.key(inputs)
        cg = self._classes.get(key)
        if cg is not None:
            return cg
        with self._compiling:
            cg = self._classes.get(key)
            if cg is None:
                t0 = time.perf_counter()
                with self._family.compiling():
                    key, static = graph.build(inputs)
                    cg = (self._compile_shape if self._compiles else self._first)(static)
                for name, value in self._params.items():
                    cg.set_param(name, value)
                if not self._compiles:
                    self._device, self._report = cg.device, cg.report()
                self._compiles += 1
                seconds = time.perf_counter() - t0
                shown = graph.describe(key)
                self._record_line(f"values {shown}: built and compiled in {seconds * 1e3:.1f} ms on {cg.device}")
                log.info("graph %r: built and compiled for %s on %s in %.1f ms", graph.name, shown, cg.device,
                         seconds * 1e3)
                self._classes[key] = cg
                while len(self._classes) > self._max_shapes:
                    self._classes.popitem(last=False)
        return cg

    def _record_line(self, line: str) -> None:
        self._history.append(f"{line} at {time.strftime('%H:%M:%S')}")
        del self._history[:-_REPORT_LINES]
        notes = self._report.notes
        notes[:] = [n for n in notes if not n.startswith("values ")] + self._history

    def shapes(self) -> list[dict[str, int]]:
        return [dict(k[0]) for k in self._classes]  # type: ignore[index]

    def set_param(self, name: str, value: Any) -> None:
        """Replace a param in every kept copy and every copy compiled later (checked
        against a compiled copy: before the first run, at the first run)."""
        frozen = np.asarray(value)
        with self._compiling:
            for cg in [*self._classes.values(), *((self._any,) if self._any is not None else ())]:
                cg.set_param(name, frozen)
            self._params[name] = frozen

    def __repr__(self) -> str:
        return f"<ValueCompiledGraph {self.graph.name!r} on {self._device}, {len(self._classes)} set(s) of values>"
