"""Partition: one graph across several devices, when no single device can run it or a
split is predicted faster.

ONNX Runtime and OpenVINO HETERO split a graph by op support alone. rlx prices the split:
each node costs what its device's cost model says it costs there, and every boundary
between devices costs what moving the tensors alive across it costs (the receiving
device's round trip, and the bytes over each side's transfer link). The rule, in full, is
in ``docs/partition.md``; in short:

1. Candidates are the devices that are available, permitted by the policy and not
   blocked by memory; a device that declines some node (its claims) can still take the
   others. The user's graph is taken in its topological order, dead nodes dropped.
2. A dynamic program over that order assigns each node the device that minimizes the
   total of node costs plus boundary costs (exact for a chain; for a DAG the segments
   are contiguous runs of the order, which is what is compiled anyway).
3. Consecutive nodes on one device form a *segment*, compiled on its backend as a graph
   of its own (params mirrored into each segment that reads them). Each segment is then
   priced exactly as the single-device ranking prices a whole graph (through the
   compile pipeline: fusion and all), plus the core's own per-segment overhead.
4. The split is taken when no single device can run the graph, or when it is predicted
   at most ``SPLIT_MARGIN`` of the best single device's time (transfers are the least
   certain part of a prediction: a split must win clearly, not by noise).

Tensors cross between segments as numpy arrays (host memory; every device reads them),
or through DLPack where both sides allow it (``_device_handover``).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..backends.registry import Registry
from ..compiler.compiled import CompiledGraph, CompileReport, compile_on
from ..compiler.lowering import legalize_for, priced_graph
from ..compiler.memory import format_bytes
from ..cost import CostModel, estimate_graph_cost, node_seconds
from ..errors import CALLER_ERRORS, DeviceError
from ..ir import Graph
from ..ir.dtypes import itemsize
from ..ir.ops import SOURCE_OPS, OpKind
from ..plugin import CompileOptions, Executable
from .policy import DevicePolicy
from .ranking import DeviceCandidate, Placement
from .ranking import _fmt_seconds as _fmt

__all__ = ["RUNNER_OVERHEAD_S", "SPLIT_MARGIN", "PartitionPlan", "PartitionedGraph", "Segment", "compile_partitioned",
           "plan_partition", "segment_graph", "split_for", "splittable"]

log = logging.getLogger("rlx.partition")

#: The core's own work per segment per run (validating the segment's inputs, a dict
#: lookup per tensor, the call), set from timings on a 2-core EPYC host (measured:
#: BENCHMARKS.md, section 'Figures behind design choices (moved from docstrings, issue 32)');
#: a boundary that saves less than this does not pay.
RUNNER_OVERHEAD_S = 15e-6
#: A split is taken over a device that can run the whole graph only when predicted at
#: most this fraction of that device's time.
SPLIT_MARGIN = 0.8


@dataclass(frozen=True)
class Segment:
    """Consecutive nodes of the user's graph that run on one device."""

    index: int
    device: str
    nodes: tuple[int, ...]  # user-graph node ids, in order
    inputs: tuple[int, ...]  # values it receives from earlier segments
    outputs: tuple[int, ...]  # values it hands to later segments or returns as graph outputs
    est_seconds: float  # priced like a whole graph on its device: round trip, transfers, kernels
    transfer_bytes: int  # bytes of ``inputs``
    transfer_seconds: float  # what moving them in costs on this device's link (0: host memory)
    reason: str

    def to_dict(self, graph: Graph | None = None) -> dict[str, Any]:
        names = [graph.node(i).describe() for i in self.nodes] if graph is not None else list(self.nodes)
        return {"index": self.index, "device": self.device, "nodes": names, "est_seconds": self.est_seconds,
                "transfer_bytes": self.transfer_bytes, "transfer_seconds": self.transfer_seconds,
                "reason": self.reason}


@dataclass(frozen=True)
class PartitionPlan:
    """Where each part of a graph runs, and the prediction that chose it."""

    graph: Graph
    segments: tuple[Segment, ...]
    est_seconds: float  # the segments plus the core's per-segment overhead
    single_device: str | None  # the best device that runs the whole graph, if any
    single_seconds: float | None
    # Each segment's own graph and what feeds its inputs (``segment_graph``), as priced:
    # compiled as they are, so the pipeline's cached result for them serves the compile.
    subgraphs: tuple[tuple[Graph, dict[int, str]], ...] = field(default=(), compare=False, repr=False)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.device for s in self.segments))

    @property
    def needed(self) -> bool:
        """True when no single device can run the graph."""
        return self.single_device is None

    @property
    def taken(self) -> bool:
        """Whether compile uses this split: it is needed, or clearly predicted faster."""
        if self.needed:
            return True
        return len(self.segments) > 1 and self.est_seconds <= SPLIT_MARGIN * (self.single_seconds or 0.0)

    def why(self) -> str:
        if self.needed and len(self.devices) == 1:  # what declined the whole graph reaches no output
            return (f"{self.devices[0]} runs every node that reaches an output (the others, which it declines, are "
                    f"dropped); est {_fmt(self.est_seconds)}")
        if self.needed:
            return (f"split across {len(self.devices)} devices ({', '.join(self.devices)}): no single device runs "
                    f"every node; est {_fmt(self.est_seconds)}")
        verdict = "predicted faster than" if self.taken else "not taken: not clearly faster than"
        return (f"split across {', '.join(self.devices)} est {_fmt(self.est_seconds)}, {verdict} "
                f"{self.single_device} alone est {_fmt(self.single_seconds or 0.0)}")

    def describe(self) -> list[str]:
        """One line per segment, then its nodes: what reports and the CLI print."""
        lines = [self.why()]
        for s in self.segments:
            moved = ""
            if s.transfer_bytes:
                link = f"{_fmt(s.transfer_seconds)} over its link" if s.transfer_seconds else "host memory, no copy"
                moved = f", receives {format_bytes(s.transfer_bytes)} ({link})"
            count = f"{len(s.nodes)} node" + ("s" if len(s.nodes) != 1 else "")
            lines.append(f"segment {s.index} on {s.device}: {count}, est {_fmt(s.est_seconds)}{moved}; {s.reason}")
            shown = [self.graph.node(i).describe() + f" {self.graph.node(i).op}" for i in s.nodes]
            lines.append("  " + ", ".join(shown[:12]) + (f", ... ({len(shown) - 12} more)" if len(shown) > 12 else ""))
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "est_seconds": self.est_seconds, "taken": self.taken,
                "needed": self.needed, "single_device": self.single_device, "single_seconds": self.single_seconds,
                "segments": [s.to_dict(self.graph) for s in self.segments]}


# ------------------------------------------------------------------ extraction
def _live_order(graph: Graph) -> list[int]:
    """Computational nodes that reach an output, in the graph's (topological) order."""
    live: set[int] = set()
    stack = list(graph.outputs)
    while stack:
        i = stack.pop()
        if i not in live:
            live.add(i)
            stack.extend(graph.node(i).inputs)
    return [n.id for n in graph.nodes if n.id in live and n.op not in SOURCE_OPS]


def _boundary_name(node_id: int) -> str:
    return f"rlx_segment_value_{node_id}"


def segment_graph(graph: Graph, nodes: Sequence[int], outputs: Sequence[int],
                  name: str) -> tuple[Graph, dict[int, str]]:
    """The nodes ``nodes`` of ``graph`` as a graph of their own, returning ``outputs``.

    Values computed elsewhere become inputs (graph inputs keep their names, others are
    named ``rlx_segment_value_<id>``); params and constants are copied in, so each
    segment owns what it reads. Returns the graph and, for each of its inputs, the
    user-graph value that feeds it."""
    sub = Graph(name)
    mapped: dict[int, Any] = {}
    feeds: dict[int, str] = {}
    inside = set(nodes)
    for nid in nodes:
        node = graph.node(nid)
        for i in node.inputs:
            if i in mapped:
                continue
            src = graph.node(i)
            if src.op is OpKind.PARAM:
                mapped[i] = sub.param(src.name, graph.value(i))
            elif src.op is OpKind.CONSTANT:
                mapped[i] = sub.constant(graph.value(i), name=src.name)
            else:
                assert i not in inside, "segments are contiguous in topological order"
                label = src.name if src.op is OpKind.INPUT else _boundary_name(i)
                mapped[i] = sub.input(label, src.shape, src.dtype)
                feeds[i] = label
        mapped[nid] = sub.copy_node(graph, node, [mapped[i].id for i in node.inputs])
    sub.set_outputs([mapped[i] for i in outputs])
    return sub.freeze(), feeds


# ------------------------------------------------------------------ planning
@dataclass
class _Device:
    name: str
    model: CostModel
    cost: dict[int, float]  # user node id -> seconds of its kernels on this device
    declines: dict[int, str]  # user node id -> why this device cannot run it


def _device_view(graph: Graph, name: str, registry: Registry) -> _Device:
    legal = legalize_for(graph, name, registry)
    model = registry.cost_model(name)
    cost: dict[int, float] = defaultdict(float)
    for nid, seconds in node_seconds(legal.graph, model).items():
        origin = legal.graph.node(nid).origin
        if origin is not None:
            cost[origin] += seconds
    declines: dict[int, str] = {}
    for node, reason in legal.unclaimed:
        if node.origin is not None:
            declines.setdefault(node.origin, f"{node.op}: {reason}" if reason != "not claimed" else str(node.op))
    return _Device(name, model, dict(cost), declines)


def _crossing_bytes(graph: Graph, order: Sequence[int]) -> list[int]:
    """Bytes of computed values alive across the cut before each position of ``order``."""
    last_use: dict[int, int] = {}
    for nid in order:
        for i in graph.node(nid).inputs:
            if graph.node(i).op not in SOURCE_OPS:
                last_use[i] = max(last_use.get(i, -1), nid)
    ends: dict[int, int] = defaultdict(int)
    for value, consumer in last_use.items():
        node = graph.node(value)
        ends[consumer] += node.size * itemsize(node.dtype)
    crossing, alive = [0], 0
    for prev in order[:-1]:
        node = graph.node(prev)
        if last_use.get(prev, -1) > prev:
            alive += node.size * itemsize(node.dtype)
        alive -= ends.get(prev, 0)
        crossing.append(alive)
    return crossing


def _link_seconds(model: CostModel, nbytes: int) -> float:
    return nbytes / (model.transfer_bw_gbps * 1e9) if model.transfer_bw_gbps > 0 and nbytes else 0.0


def _enter(d: _Device) -> float:
    """What starting a segment on ``d`` costs: its round trip and the core's own work."""
    return d.model.roundtrip_overhead_ns * 1e-9 + RUNNER_OVERHEAD_S


def _assign(order: Sequence[int], crossing: Sequence[int],
            devices: Sequence[_Device]) -> tuple[list[int], float] | None:
    """Device index per position minimizing kernels plus boundaries, and that total
    (``None``: some node no device runs)."""
    inf = math.inf
    k = len(devices)

    def node_cost(d: _Device, nid: int) -> float:
        return inf if nid in d.declines else d.cost.get(nid, 0.0)

    best = [_enter(d) + node_cost(d, order[0]) for d in devices]
    back: list[list[int]] = []
    for p in range(1, len(order)):
        moved = crossing[p]
        row, new = [], []
        for j, d in enumerate(devices):
            here = node_cost(d, order[p])
            choice, value = j, best[j]
            if here < inf:
                for i, src in enumerate(devices):
                    if i != j and best[i] < inf:
                        switch = (best[i] + _enter(d) + _link_seconds(src.model, moved) + _link_seconds(d.model, moved))
                        if switch < value:
                            choice, value = i, switch
            row.append(choice)
            new.append(value + here)
        back.append(row)
        best = new
    last = min(range(k), key=lambda j: best[j])
    if best[last] == inf:
        return None
    picks = [last]
    for row in reversed(back):
        picks.append(row[picks[-1]])
    return picks[::-1], best[last]


def _reason(graph: Graph, nodes: Sequence[int], dev: _Device, others: Sequence[_Device]) -> str:
    """Why a segment runs where it does: a claim only its device makes, else its cost."""
    for nid in nodes:
        refusing = [o for o in others if nid in o.declines]
        if others and len(refusing) == len(others):
            node = graph.node(nid)
            why = "; ".join(f"{o.name} declines {o.declines[nid]}" for o in refusing)
            return f"only {dev.name} runs {node.op} at {node.describe()} ({why})"
    here = sum(dev.cost.get(n, 0.0) for n in nodes)
    alts = [(sum(o.cost.get(n, 0.0) for n in nodes), o.name) for o in others
            if not any(n in o.declines for n in nodes)]
    if not alts:
        return f"cost: its kernels est {_fmt(here)} on {dev.name}"
    alt, name = min(alts)
    return f"cost: its kernels est {_fmt(here)} on {dev.name} vs {_fmt(alt)} on {name}"


def splittable(rows: Sequence[DeviceCandidate], policy: DevicePolicy) -> list[str]:
    """Devices of ``rows`` a split may use: available, permitted, and not blocked by memory
    (a device that declines some nodes may still take the others)."""
    return [r.device for r in rows
            if r.available and policy.permits(r.device) is None and (r.viable or r.supports_graph is False)]


def plan_partition(graph: Graph, placement: Placement, rows: Sequence[DeviceCandidate]) -> PartitionPlan | str:
    """The cheapest split of ``graph`` over the devices of ``rows`` (see the module doc), or
    why there is none (a node that no candidate device runs)."""
    reg = placement.registry
    names = splittable(rows, placement.policy)
    if not names:
        return "no device is available and permitted"
    order = _live_order(graph)
    devices = [_device_view(graph, n, reg) for n in names]
    if not order:
        return "the graph computes nothing (its outputs are inputs, params or constants)"
    assigned = _assign(order, _crossing_bytes(graph, order), devices)
    if assigned is None:
        for nid in order:
            if all(nid in d.declines for d in devices):
                node = graph.node(nid)
                why = "; ".join(f"{d.name}: {d.declines[nid]}" for d in devices)
                return f"no device runs {node.op} at {node.describe()} ({why})"
        return "no assignment of devices covers the graph"  # unreachable: some node is always the culprit
    picks, total = assigned
    single = [r for r in rows if r.viable and r.est_seconds is not None]
    best = min(single, key=lambda r: r.est_seconds or 0.0) if single else None
    runs: list[tuple[int, list[int]]] = []
    for nid, j in zip(order, picks):
        if runs and runs[-1][0] == j:
            runs[-1][1].append(nid)
        else:
            runs.append((j, [nid]))
    if len(runs) == 1 and best is not None:
        return f"no split pays: the search puts every node on {devices[runs[0][0]].name}"
    if best is not None:  # first in the search's own terms (kernels one by one): pricing segments costs a pipeline
        alone = min(_enter(d) + sum(d.cost.get(n, 0.0) for n in order) for d in devices if not d.declines)
        if total > SPLIT_MARGIN * alone:
            across = ", ".join(dict.fromkeys(devices[j].name for j, _ in runs))
            return (f"no split pays: the best split, across {across}, is est {_fmt(total)} against {_fmt(alone)} "
                    "on one device (kernels one by one)")
    segments, subgraphs = _price(graph, runs, devices, reg)
    total = sum(s.est_seconds for s in segments) + RUNNER_OVERHEAD_S * len(segments)
    return PartitionPlan(graph, tuple(segments), total, best.device if best else None,
                         best.est_seconds if best else None, tuple(subgraphs))


def split_for(placement: Placement, rows: Sequence[DeviceCandidate],
              partition: bool | None = None) -> PartitionPlan | str:
    """The split ``compile(graph, "auto", partition=partition)`` takes over the devices of
    ``rows``, or why it takes none. ``rlx check`` and ``rlx devices --explain`` ask this
    too, so that what they say is what compile does."""
    policy, graph = placement.policy, placement.graph
    if graph is None:
        return "no graph"
    if partition is False:
        return "partition=False"
    if policy.device:
        return f"a default device is set ({policy.sources.get('device', 'policy')}): it runs the whole graph"
    if policy.strict and not partition:
        return "a strict policy never splits silently (compile with partition=True to allow it)"
    whole = bool(placement.rank(rows))
    if whole and (policy.prefer or policy.pick != "cost"):
        return "the policy picks one device (prefer or benchmark pick)"
    if whole and len(splittable(rows, policy)) < 2:
        return "only one device can take part"
    plan = plan_partition(graph, placement, rows)
    if isinstance(plan, str) or plan.taken:
        return plan
    return plan.why()


def _price(graph: Graph, runs: Sequence[tuple[int, list[int]]], devices: Sequence[_Device],
           registry: Registry) -> tuple[list[Segment], list[tuple[Graph, dict[int, str]]]]:
    position = {nid: s for s, (_, nodes) in enumerate(runs) for nid in nodes}
    consumers: dict[int, set[int]] = defaultdict(set)
    for _, nodes in runs:
        for nid in nodes:
            for i in graph.node(nid).inputs:
                consumers[i].add(position[nid])
    outputs = set(graph.outputs)
    segments, subgraphs = [], []
    for s, (j, nodes) in enumerate(runs):
        outs = tuple(n for n in nodes if n in outputs or any(c != s for c in consumers.get(n, ())))
        sub, feeds = segment_graph(graph, nodes, outs, f"{graph.name}[{s}]")
        subgraphs.append((sub, feeds))
        received = tuple(i for i in feeds if graph.node(i).op is not OpKind.INPUT)
        moved = sum(graph.node(i).size * itemsize(graph.node(i).dtype) for i in received)
        dev = devices[j]
        est = estimate_graph_cost(priced_graph(sub, dev.name, registry), dev.model)
        others = [d for i, d in enumerate(devices) if i != j]
        segments.append(Segment(s, dev.name, tuple(nodes), received, outs, est, moved,
                                _link_seconds(dev.model, moved), _reason(graph, nodes, dev, others)))
    return segments, subgraphs


# ------------------------------------------------------------------ running
@dataclass(frozen=True)
class _Part:
    segment: Segment
    compiled: CompiledGraph
    feeds: tuple[tuple[int, str], ...]  # (user value id, the segment's input name)
    on_device: bool = False  # hand its outputs over as device arrays (DLPack): every reader takes them


def _device_handover(graph: Graph, parts: Sequence[_Part]) -> list[_Part]:
    """Mark the parts whose outputs may stay on their device: none is a graph output, and
    every segment reading them accepts device arrays (DLPack where both sides allow)."""
    takes_device = {p.segment.index: p.compiled._device_inputs for p in parts}
    readers: dict[int, set[int]] = defaultdict(set)
    for p in parts:
        for vid, _ in p.feeds:
            readers[vid].add(p.segment.index)
    outputs = set(graph.outputs)
    marked = []
    for p in parts:
        values = p.segment.outputs
        ok = bool(values) and not any(v in outputs for v in values) and all(
            readers[v] and all(takes_device[r] for r in readers[v]) for v in values)
        marked.append(replace(p, on_device=ok))
    return marked


class SegmentRunner(Executable):
    """The segments of a split, run in order, as one ``Executable``: what a
    ``PartitionedGraph`` wraps the way a ``CompiledGraph`` wraps a backend's executable.

    Each segment is a ``CompiledGraph`` of its own (inputs checked, outputs checked, its
    device's errors named); values cross between segments as numpy arrays, or through
    DLPack where every reader takes device arrays (``_device_handover``)."""

    def __init__(self, graph: Graph, parts: Sequence[_Part]) -> None:
        self.parts = tuple(parts)
        self._outputs = graph.outputs
        self._inputs = {graph.node(i).name: i for i in graph.inputs}
        self._sources: dict[int, np.ndarray] = {i: graph.value(i) for i in graph.outputs
                                                 if graph.node(i).op in (OpKind.PARAM, OpKind.CONSTANT)}
        self._output_params = {i: graph.node(i).name for i in self._sources if graph.node(i).op is OpKind.PARAM}

    def run(self, inputs: Mapping[str, Any]) -> list[Any]:
        env: dict[int, Any] = {self._inputs[name]: value for name, value in inputs.items()}
        for part in self.parts:
            feed = {label: env[vid] for vid, label in part.feeds}
            outs = part.compiled.run(feed, output="dlpack" if part.on_device else "numpy")
            env.update(zip(part.segment.outputs, outs))
        return [env[i] if i in env else self._sources[i] for i in self._outputs]

    def set_param(self, name: str, value: np.ndarray) -> None:
        """Replace a param in every segment that reads it (and an output that is the param)."""
        for part in self.parts:
            if any(n.name == name and n.op is OpKind.PARAM for n in part.compiled.graph.nodes):
                part.compiled.set_param(name, value)
        for i, param in self._output_params.items():
            if param == name:
                self._sources[i] = value


class PartitionedGraph(CompiledGraph):
    """A graph compiled as segments on several devices; runs them in order.

    It is a ``CompiledGraph`` to its callers (``run``, ``set_param``, ``report``,
    ``device``) over a ``SegmentRunner``; ``device`` names every device,
    ``"cpu+opencl"``, ``backend`` the first segment's, and ``segments`` says which part
    runs where."""

    def __init__(self, graph: Graph, plan: PartitionPlan, parts: Sequence[_Part], report: CompileReport,
                 registry: Registry) -> None:
        # Its own copy of the graph (arrays shared): set_param swaps arrays there, never in the user's.
        super().__init__(graph, "+".join(plan.devices), SegmentRunner(graph, parts), graph.copy().freeze(), report,
                         registry)
        self.plan = plan

    @property
    def backend(self) -> str:
        return self.plan.segments[0].device

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self.plan.segments

    def __repr__(self) -> str:
        return f"<PartitionedGraph {self.graph.name!r} on {self.device}: {len(self.plan.segments)} segments>"


def compile_partitioned(graph: Graph, plan: PartitionPlan, rows: list[DeviceCandidate], registry: Registry,
                        options: CompileOptions | None = None) -> PartitionedGraph:
    """Compile each segment of ``plan`` on its device (a failure raises; the caller falls back)."""
    parts = []
    for seg in plan.segments:
        if plan.subgraphs:
            sub, feeds = plan.subgraphs[seg.index]
        else:  # a plan made by hand
            sub, feeds = segment_graph(graph, seg.nodes, seg.outputs, f"{graph.name}[{seg.index}]")
        try:
            cg = compile_on(sub, seg.device, f"segment {seg.index} of a split: {seg.reason}", [], registry, options)
        except CALLER_ERRORS:
            raise
        except Exception as exc:  # named for the caller's fallback, which plans again without it
            raise DeviceError(f"device {seg.device} failed to compile segment {seg.index} of graph "
                              f"{graph.name!r}: {exc}", device=seg.device) from exc
        parts.append(_Part(seg, cg, tuple(feeds.items())))
    parts = _device_handover(graph, parts)
    seconds = sum(p.compiled.report().compile_seconds for p in parts)
    report = CompileReport(
        graph=graph.name, device="+".join(plan.devices), reason=plan.why(), compile_seconds=seconds,
        user_nodes=len(graph), legalized_nodes=sum(p.compiled.report().legalized_nodes for p in parts),
        candidates=rows, compiled_nodes=sum(p.compiled.report().compiled_nodes for p in parts),
        partition=plan,
    )
    for p in parts:
        report.notes += [f"segment {p.segment.index} ({p.segment.device}): {n}" for n in p.compiled.report().notes]
    log.info("compiled graph %r split across %s", graph.name, ", ".join(plan.devices))
    return PartitionedGraph(graph, plan, parts, report, registry)
