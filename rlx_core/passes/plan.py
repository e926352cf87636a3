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

from ..dtypes import itemsize
from ..ir import Graph, Node
from ..ops import ELEMENTWISE_OPS, SOURCE_OPS, OpKind

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
                f"{len(self.inplace)} in place")  # fmt: skip


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


def plan_memory(graph: Graph) -> MemoryPlan:
    nodes = graph.nodes
    end = len(nodes)
    last = {n.id: n.id for n in nodes}
    for n in nodes:
        for i in n.inputs:
            last[i] = max(last[i], n.id)
    for i in graph.outputs:
        last[i] = end
    base = {}  # a reshape is a view: its base lives as long as it does
    for n in nodes:
        if n.op is OpKind.RESHAPE:
            base[n.id] = base.get(n.inputs[0], n.inputs[0])
    for n in reversed(nodes):
        if n.id in base:
            b = base[n.id]
            last[b] = max(last[b], last[n.id])
    computed = [n for n in nodes if n.op not in SOURCE_OPS and n.op is not OpKind.RESHAPE]
    intervals = {n.id: (n.id, last[n.id]) for n in computed}
    buffer_of: dict[int, int] = {}
    sizes: list[int] = []
    free: list[int] = []
    holders: dict[int, list[int]] = {}  # buffer -> values stored in it (for release)
    inplace: list[int] = []
    released: set[int] = set()
    for n in computed:
        # release buffers whose every value died before this node
        for b, vals in holders.items():
            if b not in released and all(intervals[v][1] < n.id for v in vals):
                released.add(b)
                free.append(b)
        need = _nbytes(n)
        chosen = None
        if _inplace_safe(n):
            for i in n.inputs:
                src = base.get(i, i)
                b = buffer_of.get(src)
                if (b is not None and b not in released and last[src] == n.id and nodes[i].shape == n.shape
                        and nodes[i].dtype == n.dtype and sum(1 for j in n.inputs if base.get(j, j) == src) == 1
                        and all(intervals[v][1] <= n.id for v in holders[b])):  # fmt: skip
                    chosen = b
                    inplace.append(n.id)
                    break
        if chosen is None:
            fits = [b for b in free if sizes[b] >= need]
            if fits:
                chosen = min(fits, key=lambda b: sizes[b])
                free.remove(chosen)
                released.discard(chosen)
            else:
                chosen = len(sizes)
                sizes.append(need)
            holders[chosen] = []
        holders[chosen].append(n.id)
        buffer_of[n.id] = chosen
    return MemoryPlan(intervals, buffer_of, tuple(sizes), tuple(inplace), sum(_nbytes(n) for n in computed))
