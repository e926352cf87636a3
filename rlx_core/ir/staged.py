"""A graph run in stages, with ops on the host between them: ``StagedGraph``.

Why it exists: some ops make outputs whose *size* depends on the data they read
(ONNX's ``NonZero``, ``Unique``, ``NonMaxSuppression``), and some models compute a shape,
a count or an ``If`` condition from data deep inside the network. rlx's ops have shapes
known before they run, so neither fits in one compiled graph. A ``StagedGraph`` runs such
a model as a sequence of steps over named tensors:

- a ``GraphStage`` is a graph (static, symbolic, or itself built at run time) compiled
  and run like any other: the first computes what the host needs, placed on the device
  picked for it;
- a ``HostStep`` runs one op on the host (numpy) on what the stages before it made;
- the stage after it is *built* for the shapes (and, where the model reads them, the
  values) of what it reads, so every size the data makes is a static graph again.

The builder of each stage comes from the importer (``rlx_core.onnx``); this module knows
nothing of ONNX. ``run(inputs, run_graph)`` walks the steps: the compiled graph
(``compiler.staged``) hands in a ``run_graph`` that compiles each built graph once and
keeps it, the reference (``reference.evaluate``) one that evaluates it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from . import Graph
from .symbolic import Dim
from .valued import MAX_VALUE_ELEMENTS, RunTimeGraph

__all__ = ["StagedGraph", "GraphStage", "HostStep", "LoopStep", "ScanStep", "Signature"]

#: What a stage's graph is built for: each tensor it reads, with its shape, its dtype, and
#: its bytes where the stage is built from its value (else None).
Signature = tuple[tuple[str, tuple[int, ...], str, "bytes | None"], ...]


@dataclasses.dataclass(frozen=True)
class GraphStage:
    """A part of the model compiled as a graph: it reads ``reads`` and makes ``writes``
    (its graph's outputs, in order). ``build(signature)`` makes the graph for what it is
    fed: the same graph every time for a stage fixed at load, a new static graph per
    signature for one after a host step. ``values`` are the reads whose values (at most
    ``MAX_VALUE_ELEMENTS`` each) the graph is built from. ``what`` names it in reports;
    ``fixed`` is the graph of a stage built at load (what placement can price before a run)."""

    reads: tuple[str, ...]
    writes: tuple[str, ...]
    build: Callable[[Signature], Graph]
    what: str
    values: tuple[str, ...] = ()
    fixed: Graph | None = None


@dataclasses.dataclass(frozen=True)
class HostStep:
    """One op run on the host: ``run`` takes the arrays named by ``reads`` (``None`` for an
    optional input left out, named ``""``) and returns one array per name in ``writes``
    (``""`` for an output the model does not use)."""

    op: str
    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    run: Callable[[Sequence[np.ndarray | None]], Sequence[np.ndarray]]

    def apply(self, env: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The outputs of this op on the tensors of ``env``; ``InputError`` naming the op
        when they do not fit it."""
        args = [None if not name else np.asarray(env[name]) for name in self.reads]
        try:
            outs = self.run(args)
        except (ValueError, IndexError, TypeError, ArithmeticError) as exc:
            raise InputError(f"{self.describe()}, run on the host: {exc}") from None
        return {name: np.asarray(out) for name, out in zip(self.writes, outs) if name}

    def describe(self) -> str:
        return f"{self.op} {self.name!r}" if self.name else self.op


def _run_body(build: Callable[[Signature], Graph], run: Callable[[Graph, dict[str, Any]], Sequence[Any]],
              values: dict[str, Any]) -> list[np.ndarray]:
    """One iteration of a loop's body: the part built for ``values`` (its own inputs, then
    the enclosing values it reads), run on what it takes of them."""
    graph = build(signature(list(values), values))
    return [np.asarray(o) for o in run(graph, {graph.node(j).name: values[graph.node(j).name] for j in graph.inputs})]


@dataclasses.dataclass(frozen=True)
class LoopStep:
    """A loop whose exit depends on the data (or too long to unroll), run from the host:
    its body is a part built for what it reads (``build``, per signature: one compile while
    the carried shapes stay) and run once per iteration, the condition read on the host.
    ``reads``: the trip count and the condition (``""`` when left out), the initial carried
    values, then the enclosing values the body reads; ``writes``: the final carried
    values, then the scan outputs stacked on a new first axis. ``body_inputs`` names the
    body's own inputs (iteration number, condition, carried values)."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    carried: int
    body_inputs: tuple[str, ...]
    build: Callable[[Signature], Graph]
    what: str
    limit: int

    def describe(self) -> str:
        return f"Loop {self.name!r}" if self.name else "Loop"

    def iterate(self, env: Mapping[str, Any], run: Callable[[Graph, dict[str, Any]], Sequence[Any]]
                ) -> dict[str, np.ndarray]:
        """Run the loop on the tensors of ``env``: its outputs by name."""
        trips, cond = (np.asarray(env[n]) if n else None for n in self.reads[:2])
        limit = None if trips is None else int(trips.reshape(-1)[0])
        going = True if cond is None else bool(cond.reshape(-1)[0])
        carried = [np.asarray(env[n]) for n in self.reads[2:2 + self.carried]]
        outer = {n: env[n] for n in self.reads[2 + self.carried:]}
        scans: list[list[np.ndarray]] = []
        i = 0
        while going and (limit is None or i < limit):
            if i >= self.limit:
                raise InputError(f"{self.describe()} runs past {self.limit} iterations, the most rlx runs")
            own = [np.array(i, np.int64), np.array(going), *carried]
            outs = _run_body(self.build, run, {**dict(zip(self.body_inputs, own)), **outer})
            going = bool(outs[0].reshape(-1)[0])
            carried = outs[1:1 + self.carried]
            scans.append(outs[1 + self.carried:])
            i += 1
        n_scan = len(self.writes) - self.carried
        if n_scan and not scans:
            raise InputError(f"{self.describe()} ran no iteration, so its scan outputs have no shape")
        stacked = [np.stack([it[k] for it in scans]) for k in range(n_scan)]
        return {name: value for name, value in zip(self.writes, [*carried, *stacked]) if name}


@dataclasses.dataclass(frozen=True)
class ScanStep:
    """A Scan run from the host (longer than rlx unrolls, or a body with host ops): its
    body a part built for what it reads and run once per step. ``reads``: the initial
    states, the scan inputs, then the enclosing values the body reads; ``writes``: the
    final states, then the scan outputs; ``in_axes``/``in_reverse`` and
    ``out_axes``/``out_reverse`` as the Scan's attributes say (axes already normalized
    for the inputs; an output's may be negative, counted on the stacked rank)."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    states: int
    body_inputs: tuple[str, ...]
    in_axes: tuple[int, ...]
    in_reverse: tuple[bool, ...]
    out_axes: tuple[int, ...]
    out_reverse: tuple[bool, ...]
    build: Callable[[Signature], Graph]
    what: str

    def describe(self) -> str:
        return f"Scan {self.name!r}" if self.name else "Scan"

    def iterate(self, env: Mapping[str, Any], run: Callable[[Graph, dict[str, Any]], Sequence[Any]]
                ) -> dict[str, np.ndarray]:
        """Run the scan on the tensors of ``env``: its outputs by name."""
        n_in = len(self.in_axes)
        states = [np.asarray(env[n]) for n in self.reads[:self.states]]
        xs = [np.asarray(env[n]) for n in self.reads[self.states:self.states + n_in]]
        outer = {n: env[n] for n in self.reads[self.states + n_in:]}
        lengths = {x.shape[a] for x, a in zip(xs, self.in_axes)}
        if len(lengths) != 1:
            raise InputError(f"{self.describe()}: its scan inputs have different lengths: {sorted(lengths)}")
        steps = lengths.pop()
        n_out = len(self.writes) - self.states
        if steps == 0 and n_out:
            raise InputError(f"{self.describe()} scans no step, so its scan outputs have no shape")
        per_step: list[list[np.ndarray]] = []
        for t in range(steps):
            sliced = [np.take(x, steps - 1 - t if rev else t, axis=a)
                      for x, a, rev in zip(xs, self.in_axes, self.in_reverse)]
            outs = _run_body(self.build, run, {**dict(zip(self.body_inputs, [*states, *sliced])), **outer})
            states = outs[:self.states]
            per_step.append(outs[self.states:])
        stacked = []
        for k in range(n_out):
            items = [step[k] for step in per_step]
            if self.out_reverse[k]:
                items.reverse()
            stacked.append(np.stack(items, axis=self.out_axes[k] % (items[0].ndim + 1)))
        return {name: value for name, value in zip(self.writes, [*states, *stacked]) if name}


class StagedGraph(RunTimeGraph):
    """See the module docstring. ``inputs`` are ``(name, shape, dtype)`` (symbolic dims
    allowed), ``outputs`` the output names, ``steps`` the stages and host steps in order;
    ``constants`` are tensors known at load that host steps or outputs read directly
    (a threshold, an input bound at load); ``source`` names the model for messages."""

    def __init__(self, name: str, inputs: Sequence[tuple[str, Sequence[Dim], str]], outputs: Sequence[str],
                 steps: Sequence[GraphStage | HostStep | LoopStep | ScanStep], constants: Mapping[str, np.ndarray],
                 source: str) -> None:
        super().__init__(name, inputs, outputs, source)
        self._steps = tuple(steps)
        self._constants = dict(constants)
        hosts = [s for s in self._steps if isinstance(s, (HostStep, LoopStep, ScanStep))]
        self._why = hosts[0].describe() if hosts else ""

    @property
    def steps(self) -> tuple[GraphStage | HostStep | LoopStep | ScanStep, ...]:
        return self._steps

    def priced_part(self) -> GraphStage | None:
        """The stage that runs first when it is a graph built at load (the part before the
        first host op): what ``rlx devices --graph`` and placement price before a run."""
        first = self._steps[0] if self._steps else None
        return first if isinstance(first, GraphStage) and first.fixed is not None else None

    def priced(self) -> Graph | None:
        """The first part when it is a graph with a body of its own, built at load."""
        part = self.priced_part()
        return None if part is None or isinstance(part.fixed, RunTimeGraph) else part.fixed

    def needs(self) -> str:
        if self._why:
            cause = (f"runs {self._why} on the host: its output's size depends on the data, so what follows it is "
                     "built and compiled at run time, once per size")
        else:
            cause = ("computes a shape, a count or a condition from data it makes, so what reads it is built and "
                     "compiled at run time, once per value")
        return f"graph {self.name!r} ({self._source}) {cause}"

    def run(self, inputs: Mapping[str, Any],
            run_graph: Callable[[int, Graph, dict[str, Any]], Sequence[Any]]) -> list[np.ndarray]:
        """The outputs for ``inputs``: each step in turn, ``run_graph(index, graph, feed)``
        running each stage's graph built for what it reads."""
        self.bind(self.input_shapes(inputs))  # names and sizes checked here: a stage would check its own only
        env: dict[str, Any] = {**self._constants, **inputs}
        for index, step in enumerate(self._steps):
            if isinstance(step, HostStep):
                env.update(step.apply(env))
                continue
            if isinstance(step, (LoopStep, ScanStep)):
                env.update(step.iterate(env, lambda body, feed, at=index: run_graph(at, body, feed)))
                continue
            graph = step.build(signature(step.reads, env, step.values))
            feed = {graph.node(i).name: env[graph.node(i).name] for i in graph.inputs}
            env.update(zip(step.writes, run_graph(index, graph, feed)))
        return [np.asarray(env[name]) for name in self._output_names]

    def step_groups(self) -> list[tuple[int, str | None, tuple[str, ...]]]:
        """The steps as reports show them: ``(index, what, ())`` for a compiled step, and
        ``(index of the first, None, descriptions)`` for each run of host steps."""
        groups: list[tuple[int, str | None, tuple[str, ...]]] = []
        for i, step in enumerate(self._steps):
            if not isinstance(step, HostStep):
                groups.append((i, step.what, ()))
            elif groups and groups[-1][1] is None:
                groups[-1] = (groups[-1][0], None, (*groups[-1][2], step.describe()))
            else:
                groups.append((i, None, (step.describe(),)))
        return groups

    def summary(self) -> str:
        parts = []
        for _, what, hosts in self.step_groups():
            parts += [what] if what is not None else [f"{shown_ops(hosts)} on the host"]
        return (f"Graph {self.name!r}: run in steps ({'; '.join(parts)}); inputs {self._inputs_text()}; "
                f"outputs {', '.join(self._output_names)}")

    def __repr__(self) -> str:
        hosts = [s.describe() for s in self._steps if isinstance(s, HostStep)]
        return f"StagedGraph({self.name!r}, {len(self._steps)} steps, on the host: {shown_ops(hosts) or 'none'})"


def shown_ops(ops: Sequence[str], first: int = 3) -> str:
    """``a, b, c and 4 more``: how reports name a run of host ops."""
    return ", ".join(ops[:first]) + (f" and {len(ops) - first} more" if len(ops) > first else "")


def signature(names: Sequence[str], env: Mapping[str, Any], values: Sequence[str] = ()) -> Signature:
    """``names`` with the shape and dtype each has in ``env``, and the bytes of those in
    ``values`` (``InputError`` when one holds more than ``MAX_VALUE_ELEMENTS``)."""
    out = []
    for name in names:
        value = env[name]
        dtype = getattr(value, "dtype", None)
        dtype = np.dtype(dtype if dtype is not None else np.asarray(value).dtype).name
        data = None
        if name in values:
            arr = np.ascontiguousarray(np.asarray(value))
            if arr.size > MAX_VALUE_ELEMENTS:
                raise InputError(f"{name!r} holds {arr.size} elements: the model computes a shape, count or condition "
                                 f"from it, and rlx builds graphs from such values only up to {MAX_VALUE_ELEMENTS}")
            data = arr.tobytes()
        out.append((name, tuple(int(d) for d in np.shape(value)), dtype, data))
    return tuple(out)
