"""Rebuilding a graph node by node: the one mechanism every rewriting pass uses.

A pass walks the source graph in order and, for each node, either copies it (with its
inputs mapped to the new graph), replaces it by a value already emitted, or emits
something else in its place. ``Emitter`` keeps the mapping, carries each node's
``origin`` (so reports still point at the user's node), keeps every input and param in
its original order (their names are the keys of ``run`` and ``set_param``), and keeps
the outputs' order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from ..ir import Graph, Node
from ..ir.ops import OpKind
from ..ir.sized import holds_array

__all__ = ["Emitter", "replace_planned", "attrs_key", "is_scalar_constant", "known_scalar"]


class Emitter:
    """Builds the rewritten copy of ``src``; ``mapped[old_id]`` is the new node's id."""

    def __init__(self, src: Graph) -> None:
        self.src = src
        self.out = Graph(src.name)
        self.mapped: dict[int, int] = {}

    def node(self, new_id: int) -> Node:
        return self.out.node(new_id)

    def copy(self, node: Node) -> int:
        """Emit ``node`` unchanged but for its inputs, which are mapped (its type kept
        without inferring it again where the inputs' types are unchanged: ``copy_node``)."""
        if node.op in (OpKind.INPUT, OpKind.PARAM, OpKind.CONSTANT):
            return self.emit(node, node.op, [], node.attrs, node.name)
        new = self.out.copy_node(self.src, node, [self.mapped[i] for i in node.inputs], keep_origin=True).id
        self.mapped[node.id] = new
        return new

    def emit(self, at: Node, op: OpKind | str, inputs: list[int], attrs: Mapping[str, Any], name: str = "") -> int:
        """Emit ``op`` on new ids ``inputs`` in place of source node ``at`` (its origin kept)."""
        out = self.out
        with out.origin(at.origin):
            if at.op is op and op in (OpKind.INPUT, OpKind.PARAM, OpKind.CONSTANT):
                new = out.copy_source(self.src, at).id
            else:
                new = out.add_node(op, inputs, attrs, name).id
        self.mapped[at.id] = new
        return new

    def constant(self, at: Node, value: np.ndarray, name: str = "") -> int:
        """Emit a constant holding ``value`` in place of ``at``."""
        with self.out.origin(at.origin):
            new = self.out.constant(np.asarray(value, dtype=at.dtype), name=name).id
        self.mapped[at.id] = new
        return new

    def alias(self, at: Node, new_id: int) -> None:
        """``at`` is replaced by the already emitted node ``new_id``."""
        self.mapped[at.id] = new_id

    def finish(self) -> Graph:
        self.out.set_outputs([self.mapped[i] for i in self.src.outputs])
        return self.out


Plan = TypeVar("Plan")


def replace_planned(graph: Graph, dropped: set[int], plans: Mapping[int, Plan],
                    emit: Callable[[Emitter, Node, Plan], str]) -> tuple[Graph, list[str]]:
    """``graph`` rebuilt with the ``dropped`` nodes left out, each node with a plan replaced
    by what ``emit(emitter, node, plan)`` emits in its place (which maps the node and
    returns its note), every other node copied: the loop every fusing pass shares."""
    em = Emitter(graph)
    notes = []
    for node in graph.nodes:
        if node.id in dropped:
            continue
        plan = plans.get(node.id)
        if plan is None:
            em.copy(node)
        else:
            notes.append(emit(em, node, plan))
    return em.finish(), notes


def attrs_key(attrs: Mapping[str, Any]) -> str:
    """A hashable, order-independent spelling of normalized attributes."""
    return repr(sorted(attrs.items()))


def is_scalar_constant(graph: Graph, node: Node, value: float) -> bool:
    """``node`` is a constant whose every element equals ``value`` (exactly)."""
    if not holds_array(node) or node.size == 0 or node.size > 4096:
        return False
    arr = graph.value(node.id)
    if arr.dtype == np.bool_:
        return False
    return bool(np.all(arr == value)) and not (value == 0 and arr.dtype.kind == "f" and np.any(np.signbit(arr)))



def known_scalar(graph: Graph, node: Node) -> np.ndarray | None:
    """The value of a one-element constant or param (a param's as it is now: a pass that
    matches it by value returns it as folded, so that ``set_param`` of it compiles again)."""
    if node.size != 1 or not (holds_array(node) or node.op is OpKind.PARAM):
        return None
    return np.asarray(graph.value(node.id)).reshape(())
