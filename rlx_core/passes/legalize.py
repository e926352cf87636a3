"""Legalization: rewrite a graph so that a backend claims every node in it.

Each composite op the backend does not claim is replaced by its decomposition (see
``composites.py``), and each internal op (gemm, fused_elementwise: made by the pipeline,
or read from a graph file) by the ops it stands for (``internal_ops.expand``), pass after
pass, until no unclaimed composite remains (layer_norm emits reduce_mean, which a second
pass may decompose). A primitive the backend does not claim cannot be rewritten: it
becomes the *blocker*, reported with the user's node it came from, e.g. ``reduce_max,
from softmax at node 7 'probs'``. Every node of the result keeps in ``origin`` the id of
the user's node it stands for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..composites import decompose
from ..ir import Graph, Node, Value
from ..ops import COMPOSITE_OPS, INTERNAL_OPS, OpKind
from .internal_ops import expand

__all__ = ["LegalizeResult", "legalize", "describe_blocker", "Claims"]

Claims = Callable[[Node], "bool | str"]
_MAX_PASSES = 8  # composites nest at most three deep (attention > softmax > ...)


@dataclass
class LegalizeResult:
    """The legalized graph and what legalization did or could not do.

    ``decomposed`` describes each rewritten node; ``unclaimed`` lists every node the
    backend declines, with its reason; ``blocker`` is the first of them, phrased for
    people, or ``None`` when the backend can run the whole graph.
    """

    graph: Graph
    decomposed: list[str] = field(default_factory=list)
    unclaimed: list[tuple[Node, str]] = field(default_factory=list)
    blocker: str | None = None

    @property
    def supported(self) -> bool:
        return self.blocker is None


def ask_claims(claims: Claims, node: Node) -> bool | str:
    """A backend's answer for ``node``: ``True``, or a reason string for a refusal."""
    try:
        answer = claims(node)
    except Exception as exc:  # a plugin's claims() is foreign code: its failure is a refusal
        return f"claims() raised {type(exc).__name__}: {exc}"
    if answer is True:
        return True
    if isinstance(answer, str) and answer:
        return answer
    return "not claimed" if not answer else True


def _origin_node(user: Graph, node: Node) -> Node | None:
    if node.origin is None or not 0 <= node.origin < len(user):
        return None
    return user.node(node.origin)


def _replay(src: Graph, claims: Claims, user: Graph, notes: list[str]) -> tuple[Graph, bool]:
    """One pass: copy ``src``, decomposing each composite that ``claims`` declines."""
    out = Graph(src.name)
    mapped: dict[int, Value] = {}
    changed = False
    for node in src.nodes:
        out._origin = node.origin
        try:
            if node.op is OpKind.INPUT:
                mapped[node.id] = out.input(node.name, node.shape, node.dtype)
            elif node.op is OpKind.PARAM:
                mapped[node.id] = out.param(node.name, src.value(node.id))
            elif node.op is OpKind.CONSTANT:
                mapped[node.id] = out.constant(src.value(node.id), name=node.name)
            else:
                ins = tuple(mapped[i] for i in node.inputs)
                rewritable = node.op in COMPOSITE_OPS or node.op in INTERNAL_OPS
                if rewritable and ask_claims(claims, node) is not True:
                    before = len(out)
                    rewrite = expand if node.op in INTERNAL_OPS else decompose
                    mapped[node.id] = rewrite(out, node, ins)
                    changed = True
                    ops = dict.fromkeys(n.op.value for n in out._nodes[before:] if n.op is not OpKind.CONSTANT)
                    origin = _origin_node(user, node)
                    where = f" at {origin.describe()}" if origin is not None else ""
                    via = f" (from {origin.op})" if origin is not None and origin.op != node.op else ""
                    notes.append(f"{node.op}{where}{via} -> {', '.join(ops)}")
                else:
                    mapped[node.id] = out._add_node(node.op, [v.id for v in ins], node.attrs, node.name)
        finally:
            out._origin = None
    out.set_outputs([mapped[i] for i in src.outputs])
    return out, changed


def legalize(graph: Graph, claims: Claims, *, user_graph: Graph | None = None) -> LegalizeResult:
    """Return ``graph`` rewritten for a backend whose per-node answer is ``claims``.

    The result is always a new graph (the caller may own and mutate its param values).
    ``user_graph`` is the graph that ``origin`` ids refer to (``graph`` by default).
    """
    user = user_graph if user_graph is not None else graph
    notes: list[str] = []
    current = graph
    for _ in range(_MAX_PASSES):
        current, changed = _replay(current, claims, user, notes)
        if not changed:
            break
    result = LegalizeResult(current, decomposed=notes)
    for node in current.nodes:
        if node.op in (OpKind.INPUT, OpKind.PARAM, OpKind.CONSTANT):
            continue
        answer = ask_claims(claims, node)
        if answer is not True:
            result.unclaimed.append((node, answer))  # type: ignore[arg-type]
    if result.unclaimed:
        node, reason = result.unclaimed[0]
        result.blocker = describe_blocker(user, node, reason)
    return result


def describe_blocker(user: Graph, node: Node, reason: str) -> str:
    """``reduce_max, from softmax at node 7 'probs'``, plus the backend's own reason if any."""
    origin = _origin_node(user, node)
    if origin is not None and origin.op != node.op:
        where = f"{node.op}, from {origin.op} at {origin.describe()}"
    elif origin is not None:
        where = f"{node.op} at {origin.describe()}"
    else:
        where = str(node.op)
    return where if reason == "not claimed" else f"{where}: {reason}"
