"""Cost models and graph pricing: how the core predicts which device is fastest.

A ``CostModel`` is a handful of figures about one device (gemm rate, memory bandwidth,
per-kernel dispatch, per-run round trip, host transfer rate). ``estimate_graph_cost``
prices a graph already legalized for that device: a round trip, the input and output
bytes over the transfer link, then for each kernel its dispatch plus the larger of its
compute time and its memory time (a roofline).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .ir.dtypes import itemsize
from .ir.ops import SOURCE_OPS, OpKind

if TYPE_CHECKING:
    from .ir import Graph, Node

_SHAPE_BANDWIDTH = 0.1  # (log units)^2: a point 2x away in one dim weighs exp(-4.8) of an exact hit

__all__ = ["CostModel", "estimate_graph_cost", "node_seconds", "node_flops", "node_bytes", "FREE_OPS"]

#: Ops that cost no kernel on any sensible backend (metadata changes or views).
FREE_OPS: frozenset[OpKind] = frozenset({OpKind.RESHAPE}) | SOURCE_OPS


@dataclass(frozen=True)
class CostModel:
    """Figures describing one device; ``calibrated`` says whether they were measured here.

    ``transfer_bw_gbps`` of 0 means the device computes in host memory (no copy in or
    out). ``sgemm_points`` holds measured ``(m, k, n, gflops)`` points; when present,
    ``sgemm_gflops_at`` interpolates between them by problem size. ``op_costs`` holds
    measured ``(op, overhead_ns, g_elements_per_s)`` lines for elementwise, reduction and
    normalization ops: a kernel's fixed cost and its throughput differ by an order of
    magnitude between ``add`` and ``erf`` (or a reduction), which one dispatch figure
    and one compute rate cannot say. ``region_costs`` holds ``(op, g_elements_per_s)``
    for the same op as one more instruction of a fused region: in registers for a
    backend that compiles a region into one loop (XLA, OpenCL), a pass over a cached
    block for one that runs it op by op (numpy) — the two differ by 10x, and only a
    measurement on the backend tells which it is.
    """

    device: str
    sgemm_gflops: float = 20.0
    memory_bw_gbps: float = 10.0
    dispatch_overhead_ns: float = 2_000.0
    roundtrip_overhead_ns: float = 5_000.0
    transfer_bw_gbps: float = 0.0
    num_threads: int = 1
    calibrated: bool = False
    source: str = ""
    sgemm_points: tuple[tuple[int, int, int, float], ...] = field(default=())
    op_costs: tuple[tuple[str, float, float], ...] = field(default=())
    region_costs: tuple[tuple[str, float], ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("sgemm_gflops", "memory_bw_gbps"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"CostModel({self.device!r}): {name} must be a finite number > 0, got {v!r}")
        for name in ("dispatch_overhead_ns", "roundtrip_overhead_ns", "transfer_bw_gbps"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"CostModel({self.device!r}): {name} must be a finite number >= 0, got {v!r}")
        object.__setattr__(self, "sgemm_points", tuple(sorted(tuple(p) for p in self.sgemm_points)))  # type: ignore
        costs = tuple(sorted((str(op), float(ns), float(rate)) for op, ns, rate in self.op_costs))
        for op, ns, rate in costs:
            if not (math.isfinite(ns) and ns >= 0 and math.isfinite(rate) and rate > 0):
                raise ConfigError(f"CostModel({self.device!r}): op_costs for {op!r} must be overhead >= 0 and "
                                  f"rate > 0, got {ns!r} ns, {rate!r} G elements/s")
        object.__setattr__(self, "op_costs", costs)
        object.__setattr__(self, "_op_index", {op: (ns, rate) for op, ns, rate in costs})
        regions = tuple(sorted((str(op), float(rate)) for op, rate in self.region_costs))
        for op, rate in regions:
            if not (math.isfinite(rate) and rate > 0):
                raise ConfigError(f"CostModel({self.device!r}): region_costs for {op!r} must be a rate > 0, "
                                  f"got {rate!r} G elements/s")
        object.__setattr__(self, "region_costs", regions)
        object.__setattr__(self, "_region_index", dict(regions))

    def op_cost(self, op: str) -> tuple[float, float] | None:
        """``(overhead_ns, g_elements_per_s)`` measured for ``op``, or ``None``."""
        return self._op_index.get(str(op))  # type: ignore[attr-defined]

    def region_cost(self, op: str) -> float | None:
        """G elements/s of ``op`` as one more instruction of a fused region, or ``None``."""
        return self._region_index.get(str(op))  # type: ignore[attr-defined]

    def sgemm_gflops_at(self, m: int, k: int, n: int) -> float:
        """The gemm rate for an ``m x k @ k x n`` product.

        Calibrated models hold measured points: squares of several sizes and *shaped*
        products (a dense layer on a small batch, one attention head, a convolution's
        im2col), which run far below the square rate of the same flops. The square
        points make a curve by size (linear in log flops, clamped at the ends); the
        query's rate is then the mean, in log space, of the shaped points' rates and of
        the square curve at the query's own flops, weighted by ``exp(-d^2 / h)`` with
        ``d`` the distance in (log m, log k, log n) from the query to each (the square
        curve sits at the cube of the query's volume). A square query gets the square
        curve, a query on a shaped point that point's rate, and a shape far from every
        point the nearest one's. Uncalibrated models scale the peak down for small
        problems instead.
        """
        flops = max(2.0 * m * k * n, 1.0)  # an empty product still costs its dispatch, never a 0 rate
        if not self.sgemm_points:
            half = 2.0 * 128**3  # half of peak at ~2*128^3 flops, approaching peak for large problems
            return self.sgemm_gflops * flops / (flops + half)
        squares = [p for p in self.sgemm_points if p[0] == p[1] == p[2]] or list(self.sgemm_points)
        q = [math.log(max(d, 1)) for d in (m, k, n)]
        cube = sum(q) / 3
        candidates = [(sum((x - cube) ** 2 for x in q), math.log(_by_size(squares, flops)))]
        for a, b, c, gflops in self.sgemm_points:
            if not a == b == c:
                d2 = sum((x - math.log(max(d, 1))) ** 2 for x, d in zip(q, (a, b, c)))
                candidates.append((d2, math.log(gflops)))
        nearest = min(d2 for d2, _ in candidates)
        weights = [math.exp(-(d2 - nearest) / _SHAPE_BANDWIDTH) for d2, _ in candidates]
        return math.exp(sum(w * r for w, (_, r) in zip(weights, candidates)) / sum(weights))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sgemm_points"] = [list(p) for p in self.sgemm_points]
        d["op_costs"] = [list(c) for c in self.op_costs]
        d["region_costs"] = [list(c) for c in self.region_costs]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CostModel:
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["sgemm_points"] = tuple(tuple(p) for p in kwargs.get("sgemm_points", ()))
        kwargs["op_costs"] = tuple(tuple(c) for c in kwargs.get("op_costs", ()))
        kwargs["region_costs"] = tuple(tuple(c) for c in kwargs.get("region_costs", ()))
        return cls(**kwargs)

    def with_source(self, source: str) -> CostModel:
        return replace(self, source=source)


def _by_size(points: Sequence[tuple[int, int, int, float]], flops: float) -> float:
    """Rate at ``flops``, linear in log(flops) between ``points``, clamped at the ends."""
    pts = sorted((math.log(2.0 * a * b * c), r) for a, b, c, r in points)
    x = math.log(max(flops, 1.0))
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x <= x1:
            return y0 + (y1 - y0) * ((x - x0) / (x1 - x0) if x1 != x0 else 1.0)
    return pts[-1][1]


def node_flops(node: Node, in_shapes: Sequence[tuple[int, ...]]) -> float:
    """Floating-point operations of one node; exact for matmul, conv2d and attention."""
    op, out = node.op, math.prod(node.shape)
    if op is OpKind.MATMUL:
        k = in_shapes[0][-1]
        return 2.0 * out * k
    if op is OpKind.GEMM:  # the product, then bias and activation on the output
        epilogue = (len(in_shapes) == 3) + (node.attrs.get("activation", "none") != "none")
        return 2.0 * out * in_shapes[0][-1] + epilogue * out
    if op is OpKind.FUSED_ELEMENTWISE:  # one flop per element per instruction
        return float(out * len(node.attrs.get("program", ())))
    if op is OpKind.CONV2D:
        w = in_shapes[1]
        return 2.0 * out * w[1] * w[2] * w[3] + (out if len(in_shapes) == 3 else 0)
    if op is OpKind.FUSED_CONV:  # the convolution, then one flop per element per epilogue instruction
        w = in_shapes[1]
        program = node.attrs.get("program", ())
        return 2.0 * out * w[1] * w[2] * w[3] + out * (bool(node.attrs.get("bias")) + len(program))
    if op is OpKind.ATTENTION:
        q, k, v = in_shapes[:3]
        batch = math.prod(node.shape[:-2])
        lq, lk, d, dv = q[-2], k[-2], q[-1], v[-1]
        return batch * (2.0 * lq * lk * d + 2.0 * lq * lk * dv + 5.0 * lq * lk)
    if op in (OpKind.REDUCE_SUM, OpKind.REDUCE_MAX, OpKind.REDUCE_MEAN):
        return float(math.prod(in_shapes[0]))
    if op in (OpKind.SOFTMAX, OpKind.LAYER_NORM):
        return 5.0 * out
    if op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D):
        k = node.attrs["kernel"]
        return float(out * k[0] * k[1])
    if op is OpKind.GLOBAL_AVG_POOL2D:
        return float(math.prod(in_shapes[0]))
    if op in FREE_OPS:
        return 0.0
    return float(out)


def node_bytes(node: Node, in_shapes: Sequence[tuple[int, ...]], in_dtypes: Sequence[str]) -> float:
    """Bytes a kernel reads and writes, assuming each operand is touched once."""
    total = math.prod(node.shape) * itemsize(node.dtype)
    for s, d in zip(in_shapes, in_dtypes):
        total += math.prod(s) * itemsize(d)
    return float(total)


def estimate_graph_cost(graph: Graph, model: CostModel) -> float:
    """Predicted seconds per run of ``graph`` on ``model.device``, priced as that device will
    run it: pass the graph the compile pipeline makes for it (legalized, optimized, fused;
    ``placement.pipeline_for``), so a fused region costs one kernel that reads its inputs
    and writes its output once, and a gemm epilogue adds no memory pass of its own."""
    nodes = graph.nodes
    seconds = model.roundtrip_overhead_ns * 1e-9
    if model.transfer_bw_gbps > 0:
        moved = sum(nodes[i].size * itemsize(nodes[i].dtype) for i in graph.inputs)
        moved += sum(nodes[i].size * itemsize(nodes[i].dtype) for i in graph.outputs)
        seconds += moved / (model.transfer_bw_gbps * 1e9)
    return seconds + sum(node_seconds(graph, model).values())


def node_seconds(graph: Graph, model: CostModel) -> dict[int, float]:
    """Predicted seconds per run of each kernel of ``graph`` (by node id), without the
    run's round trip and transfers: what ``estimate_graph_cost`` adds up, and what the
    partitioner compares node by node between devices. Nodes that cost nothing per run
    (sources, views, anything computed from params and constants only, which runs once)
    are absent."""
    nodes = graph.nodes
    bw = model.memory_bw_gbps * 1e9
    static: set[int] = set()  # computed from params and constants only: once, not per run
    costs: dict[int, float] = {}
    for node in nodes:
        if node.op in (OpKind.PARAM, OpKind.CONSTANT) or (node.inputs and all(i in static for i in node.inputs)):
            static.add(node.id)
            continue
        if node.op in FREE_OPS:
            continue
        in_shapes = [nodes[i].shape for i in node.inputs]
        data = node_bytes(node, in_shapes, [nodes[i].dtype for i in node.inputs])
        parts = _structured_seconds(node, in_shapes, model)
        if parts is not None:  # products, attention, convolution, pools: priced part by part
            costs[node.id] = model.dispatch_overhead_ns * 1e-9 + max(parts, data / bw)
            continue
        measured = _measured_seconds(node, in_shapes, model)
        if measured is not None:  # calibrated per-op figures (see _measured_seconds)
            costs[node.id] = max(measured, model.dispatch_overhead_ns * 1e-9 + data / bw)
            continue
        flops = node_flops(node, in_shapes)
        costs[node.id] = model.dispatch_overhead_ns * 1e-9 + max(flops / (model.sgemm_gflops * 1e9), data / bw)
    return costs


#: Output channels per group up to which a grouped convolution is priced as one sweep over
#: its channels rather than one product per group (depthwise convolutions and their
#: channel multipliers).
_FEW_CHANNELS = 4


def _gemm_seconds(m: int, k: int, n: int, model: CostModel) -> float:
    return 2.0 * m * k * n / (model.sgemm_gflops_at(m, k, n) * 1e9)


def _pass_seconds(op: str, elements: int, model: CostModel) -> float:
    """One elementwise pass of ``op`` over ``elements``: its measured line, else its memory
    traffic (an input and an output of float32)."""
    line = model.op_cost(op)
    if line is not None:
        return line[0] * 1e-9 + elements / (line[1] * 1e9)
    return 8.0 * elements / (model.memory_bw_gbps * 1e9)


def _structured_seconds(node: Node, in_shapes: Sequence[tuple[int, ...]], model: CostModel) -> float | None:
    """Compute time of the ops made of products, as their parts run: a batched matmul is
    one product per matrix (a 4-head 128x64 @ 64x128 runs at the rate of that small
    shape, not of one 512x64 @ 64x128), attention is its two products per head plus the
    softmax and scaling passes over its scores, a convolution its im2col copy plus one
    product per image and group, a pool one pass per window tap."""
    op = node.op
    if op in (OpKind.MATMUL, OpKind.GEMM):
        a, b = in_shapes[:2]
        n, k = (b[-1] if len(b) > 1 else 1), a[-1]
        if len(b) > 2:
            batch, m = math.prod(node.shape[:-2]), (a[-2] if len(a) > 1 else 1)
        else:
            batch, m = 1, max(math.prod(node.shape) // max(n, 1), 1)
        seconds = batch * _gemm_seconds(m, k, n, model)
        if op is OpKind.GEMM:
            epilogue = (len(in_shapes) == 3) + (node.attrs.get("activation", "none") != "none")
            seconds += epilogue * _pass_seconds("add", node.size, model)
        return seconds
    if op is OpKind.ATTENTION:
        q, k, v = in_shapes[:3]
        batch, lq, lk = math.prod(node.shape[:-2]), q[-2], k[-2]
        scores = batch * lq * lk
        return (batch * (_gemm_seconds(lq, q[-1], lk, model) + _gemm_seconds(lq, lk, v[-1], model))
                + _pass_seconds("softmax", scores, model) + _pass_seconds("mul", scores, model))
    if op in (OpKind.CONV2D, OpKind.FUSED_CONV):
        n, o, oh, ow = node.shape
        w = in_shapes[1]
        groups = node.attrs["groups"]
        kk = w[1] * w[2] * w[3]
        # Groups of a few output channels each (depthwise: one) are not run as that many
        # tiny products: backends sweep all channels in one kernel that reads each window
        # in place (rlx-cpu's depthwise kernels, XLA's grouped conv). Priced as products
        # one group at a time, each paid a tiny product's start-up: mobilenet_v3_small's
        # depthwise layers alone were priced at over a hundred times what the whole model
        # takes (measured: BENCHMARKS.md, section 'Figures behind design choices (moved from
        # docstrings, issue 32)'). Their flops go at the whole layer's rate; the caller adds
        # the memory side.
        if groups > 1 and o // groups <= _FEW_CHANNELS:
            return n * _gemm_seconds(o, kk, oh * ow, model)
        seconds = n * groups * _gemm_seconds(o // max(groups, 1), kk, oh * ow, model)
        if w[2] * w[3] > 1 or node.attrs["stride"] != (1, 1):  # im2col: the windows written, then read
            seconds += 2.0 * n * groups * kk * oh * ow * itemsize(node.dtype) / (model.memory_bw_gbps * 1e9)
        if op is OpKind.FUSED_CONV:  # the epilogue over the output while in cache: half a pass an
            # instruction (a standalone pass is about as much memory traffic as compute)
            seconds += sum(_pass_seconds(instr[0], node.size, model) for instr in node.attrs["program"]) / 2
        return seconds
    if op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D):
        kh, kw = node.attrs["kernel"]
        line = "maximum" if op is OpKind.MAX_POOL2D else "add"
        return kh * kw * _pass_seconds(line, node.size, model)
    return None


def _measured_seconds(node: Node, in_shapes: Sequence[tuple[int, ...]], model: CostModel) -> float | None:
    """Seconds for ``node`` from the model's per-op lines, when it has them for every part.

    An op on its own costs its line: overhead + elements / rate (the rate was measured on
    a standalone kernel, so it includes that kernel's memory traffic). A fused region is
    one kernel: its dispatch, then per element the *compute* of each instruction, which is
    the measured time per element less the standalone kernel's memory time (an input and
    an output), kept at no less than a fifth of it; the region's own memory is priced by
    the caller (the roofline's other side)."""
    if not model.op_costs:
        return None
    if node.op is OpKind.FUSED_ELEMENTWISE:
        per_element, moved = 0.0, 2 * itemsize(node.dtype) / (model.memory_bw_gbps * 1e9)
        for instr in node.attrs.get("program", ()):
            marginal = model.region_cost(instr[0])
            if marginal is not None:  # measured as one more op of a region on this backend
                per_element += 1.0 / (marginal * 1e9)
                continue
            line = model.op_cost(instr[0])
            if line is None:
                return None
            standalone = 1.0 / (line[1] * 1e9)
            per_element += max(standalone - moved, 0.2 * standalone)
        return model.dispatch_overhead_ns * 1e-9 + node.size * per_element
    line = model.op_cost(node.op.value)
    if line is None:
        return None
    elems = max(math.prod(s) for s in in_shapes) if in_shapes else node.size  # reductions read more than they write
    return line[0] * 1e-9 + max(elems, node.size) / (line[1] * 1e9)
