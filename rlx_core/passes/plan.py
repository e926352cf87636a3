"""The plan stage: value lifetimes and a buffer assignment, offered to the backend.

The plan is advisory. A backend reads ``CompileOptions.memory_plan`` if it wants one
(a backend with its own allocator, like the cpu executor, may ignore it); the report
shows what it would save. Each computed value gets an interval ``[defined, last read]``
(graph outputs live to the end of the run). Buffers are assigned greedily in graph
order, best fit by size from the buffers whose values are dead; an elementwise result
takes the buffer of an operand of the same shape and dtype that dies at that node (in
place), which is safe because an elementwise kernel reads each element before it writes
the same position. Views (``reshape``) and sources get no buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Graph, Node
from ..ir.dtypes import itemsize
from ..ir.ops import ELEMENTWISE_OPS, SOURCE_OPS, OpKind

__all__ = ["MemoryPlan", "plan_memory"]

_INPLACE_OPS = (ELEMENTWISE_OPS | {OpKind.FUSED_ELEMENTWISE}) - {OpKind.WHERE}


@dataclass(frozen=True)
class MemoryPlan:
    """Lifetimes and buffers of the computed values of one graph.

    ``intervals[id] = (first, last)`` node indices; ``buffer_of[id]`` the buffer index of
    that value; ``buffer_bytes[k]`` the size of buffer ``k``; ``inplace`` the ids whose
    result overwrites a dying operand. ``naive_bytes`` is what one buffer per value takes.
    """

    intervals: dict[int, tuple[int, int]] = field(default_factory=dict)
    buffer_of: dict[int, int] = field(default_factory=dict)
    buffer_bytes: tuple[int, ...] = ()
    inplace: tuple[int, ...] = ()
    naive_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.buffer_bytes)

    def describe(self) -> str:
        return (f"{len(self.buffer_of)} values in {len(self.buffer_bytes)} buffers, "
                f"{_fmt_bytes(self.total_bytes)} (vs {_fmt_bytes(self.naive_bytes)} one per value), "
                f"{len(self.inplace)} in place")


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


def _nbytes(node: Node) -> int:
    return node.size * itemsize(node.dtype)


def _inplace_safe(node: Node) -> bool:
    if node.op not in _INPLACE_OPS:
        return False
    return node.op is not OpKind.DIV or node.dtype.startswith("float")  # integer div re-reads its operands


def _lifetimes(graph: Graph) -> tuple[dict[int, int], dict[int, int]]:
    """The last node reading each value (the graph's end for an output), a reshape's base
    living as long as its views; and each reshape's base (a reshape is a view)."""
    nodes = graph.nodes
    last = {n.id: n.id for n in nodes}
    for n in nodes:
        for i in n.inputs:
            last[i] = max(last[i], n.id)
    for i in graph.outputs:
        last[i] = len(nodes)
    base: dict[int, int] = {}
    for n in nodes:
        if n.op is OpKind.RESHAPE:
            base[n.id] = base.get(n.inputs[0], n.inputs[0])
    for n in reversed(nodes):
        if n.id in base:
            b = base[n.id]
            last[b] = max(last[b], last[n.id])
    return last, base


class _Buffers:
    """The buffers handed out so far: their sizes, the values each holds, the free ones."""

    def __init__(self, intervals: dict[int, tuple[int, int]]) -> None:
        self.intervals = intervals
        self.sizes: list[int] = []
        self.free: list[int] = []
        self.holders: dict[int, list[int]] = {}  # buffer -> values stored in it (for release)
        self.released: set[int] = set()

    def release_before(self, nid: int) -> None:
        """Free the buffers whose every value died before node ``nid``."""
        for b, vals in self.holders.items():
            if b not in self.released and all(self.intervals[v][1] < nid for v in vals):
                self.released.add(b)
                self.free.append(b)

    def take(self, need: int) -> int:
        """The smallest free buffer that fits, else a new one."""
        fits = [b for b in self.free if self.sizes[b] >= need]
        if fits:
            chosen = min(fits, key=lambda b: self.sizes[b])
            self.free.remove(chosen)
            self.released.discard(chosen)
        else:
            chosen = len(self.sizes)
            self.sizes.append(need)
        self.holders[chosen] = []
        return chosen


def _inplace_buffer(n: Node, nodes: tuple[Node, ...], base: dict[int, int], last: dict[int, int],
                    buffer_of: dict[int, int], buffers: _Buffers) -> int | None:
    """The buffer of an input ``n`` may overwrite: read last by ``n``, once, of its shape
    and dtype, every value in that buffer dead by then."""
    if not _inplace_safe(n):
        return None
    for i in n.inputs:
        src = base.get(i, i)
        b = buffer_of.get(src)
        if (b is not None and b not in buffers.released and last[src] == n.id and nodes[i].shape == n.shape
                and nodes[i].dtype == n.dtype and sum(1 for j in n.inputs if base.get(j, j) == src) == 1
                and all(buffers.intervals[v][1] <= n.id for v in buffers.holders[b])):
            return b
    return None


def plan_memory(graph: Graph) -> MemoryPlan:
    """One buffer per computed value, shared by values whose lifetimes do not overlap
    (best fit among the free ones), an elementwise node writing over an input it reads
    last where that is safe; reshapes are views of their base."""
    nodes = graph.nodes
    last, base = _lifetimes(graph)
    computed = [n for n in nodes if n.op not in SOURCE_OPS and n.op is not OpKind.RESHAPE]
    intervals = {n.id: (n.id, last[n.id]) for n in computed}
    buffers = _Buffers(intervals)
    buffer_of: dict[int, int] = {}
    inplace: list[int] = []
    for n in computed:
        buffers.release_before(n.id)
        chosen = _inplace_buffer(n, nodes, base, last, buffer_of, buffers)
        if chosen is not None:
            inplace.append(n.id)
        else:
            chosen = buffers.take(_nbytes(n))
        buffers.holders[chosen].append(n.id)
        buffer_of[n.id] = chosen
    return MemoryPlan(intervals, buffer_of, tuple(buffers.sizes), tuple(inplace), sum(_nbytes(n) for n in computed))
