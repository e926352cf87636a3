"""Legalization: rewrite a graph so that a backend claims every node in it.

Each composite op the backend does not claim is replaced by its decomposition (see
``composites.py``), and each internal op (gemm, fused_elementwise: made by the pipeline,
or read from a graph file) by the ops it stands for (``internal_ops.expand``), pass after
pass, until no unclaimed composite remains (layer_norm emits reduce_mean, which a second
pass may decompose). A primitive the backend does not claim cannot be rewritten: it
becomes the *blocker*, reported with the user's node it came from, e.g. ``reduce_max,
from softmax at node 7 'probs'``. Every node of the result keeps in ``origin`` the id of
the user's node it stands for.

Before any of that, the *dtype gate*: a backend reads the dtypes it declares
(``Backend.dtypes``, by default the contract's six), and a node whose value or an input
has another dtype (a ``uint8`` input, a cast from it) is refused for it here, sources
included, with the dtype named — without asking the backend's ``claims``, so that a
plugin written for the six never sees a node of another dtype, whatever its ``claims``
does. Likewise an op extension (``OP_EXTENSIONS``: an optional attribute, like
attention's ``nan_to_zero``) the backend does not list in ``Backend.op_extensions``: such
a composite is decomposed for it without asking ``claims``. Legalization is the one
place every question about a backend goes through
(placement, ``rlx check``, ``rlx devices --explain``, the partitioner, compile), so every
one of them sees the same blocker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import GraphError
from ..ir import Graph, Node, Value
from ..ir.dtypes import CONTRACT_DTYPES, DTYPES
from ..ir.ops import COMPOSITE_OPS, INTERNAL_OPS, OP_EXTENSIONS, OpKind, infer
from .composites import decompose
from .internal_ops import expand

__all__ = ["LegalizeResult", "DtypeGate", "legalize", "describe_blocker", "Claims"]

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


def offer(claims: Claims, at: Node, op: OpKind, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> bool | None:
    """Whether the backend takes ``op`` on ``inputs`` (nodes, or anything with a shape and
    a dtype) with ``attrs`` in place of node ``at``: a fusing pass's question. False where
    ``op`` does not take those inputs (``infer`` refuses them) or would not give ``at``'s
    shape and dtype (a replacement keeps its node's type), or the backend refuses this
    one; None where it does not claim ``op`` at all (the pass has nothing to fuse for it)."""
    try:
        norm, shape, dtype = infer(op, list(inputs), attrs)
    except GraphError:
        return False
    if tuple(shape) != tuple(at.shape) or dtype != at.dtype:
        return False
    candidate = Node(at.id, op, (), MappingProxyType(dict(norm)), tuple(shape), dtype, at.name, at.origin)
    answer = ask_claims(claims, candidate)
    return None if answer == "not claimed" else answer is True


@dataclass(frozen=True)
class DtypeGate:
    """The dtypes one backend reads, and the refusal of nodes that hold any other; and the
    op extensions it honours (``Backend.op_extensions``), without which a node carrying
    one is rewritten for it (``unlisted``)."""

    backend: str
    dtypes: frozenset[str]
    extensions: frozenset[str] = frozenset()

    @classmethod
    def of(cls, backend: object) -> DtypeGate:
        """The gate of a ``Backend`` (its ``name``, ``dtypes`` and ``op_extensions``)."""
        dtypes = getattr(backend, "dtypes", CONTRACT_DTYPES)
        listed = getattr(backend, "op_extensions", None)
        extensions = frozenset(listed) if isinstance(listed, (set, frozenset)) else frozenset()
        return cls(str(getattr(backend, "name", backend)), frozenset(dtypes), extensions)

    def unlisted(self, node: Node) -> str | None:
        """The op extension (``OP_EXTENSIONS``) ``node`` carries, switched on, that the
        backend does not list, phrased as a refusal; else ``None``."""
        for key, value in node.attrs.items():
            name = f"{node.op}.{key}"
            if value and name in OP_EXTENSIONS and name not in self.extensions:
                return f"{name} is an extension the backend does not list (Backend.op_extensions)"
        return None

    def refusal(self, graph: Graph, node: Node) -> str | None:
        """Why the backend cannot take ``node`` of ``graph`` (its dtype, or an input's), or ``None``."""
        if node.dtype not in self.dtypes:
            return f"dtype {node.dtype}, {self._outside()}"
        for i in node.inputs:
            src = graph.node(i)
            if src.dtype not in self.dtypes:
                return f"its input {src.describe()} has dtype {src.dtype}, {self._outside()}"
        return None

    def _outside(self) -> str:
        reads = ", ".join(d for d in DTYPES if d in self.dtypes)
        return f"which {self.backend} does not read (it reads {reads})"


def _refused(gate: DtypeGate | None, graph: Graph, node: Node) -> str | None:
    return None if gate is None else gate.refusal(graph, node)


def _unlisted(gate: DtypeGate | None, node: Node) -> str | None:
    """Without a gate, only the extensions ``claims`` is asked about (rlx's own callers)."""
    return None if gate is None else gate.unlisted(node)


def _origin_node(user: Graph, node: Node) -> Node | None:
    if node.origin is None or not 0 <= node.origin < len(user):
        return None
    return user.node(node.origin)


def _replay(src: Graph, claims: Claims, user: Graph, notes: list[str],
            gate: DtypeGate | None) -> tuple[Graph, bool]:
    """One pass: copy ``src``, decomposing each composite that ``claims`` declines (a node
    the dtype gate refuses is copied as it is: its decomposition holds the same dtypes)."""
    out = Graph(src.name)
    mapped: dict[int, Value] = {}
    changed = False
    for node in src.nodes:
        with out.origin(node.origin):
            if node.op in (OpKind.INPUT, OpKind.PARAM, OpKind.CONSTANT):
                mapped[node.id] = out.copy_source(src, node)
            else:
                ins = tuple(mapped[i] for i in node.inputs)
                rewritable = node.op in COMPOSITE_OPS or node.op in INTERNAL_OPS
                if rewritable and _refused(gate, src, node) is None and (
                        _unlisted(gate, node) is not None or ask_claims(claims, node) is not True):
                    before = len(out)
                    rewrite = expand if node.op in INTERNAL_OPS else decompose
                    mapped[node.id] = rewrite(out, node, ins)
                    changed = True
                    made = (out.node(i) for i in range(before, len(out)))
                    ops = dict.fromkeys(n.op.value for n in made if n.op is not OpKind.CONSTANT)
                    origin = _origin_node(user, node)
                    where = f" at {origin.describe()}" if origin is not None else ""
                    via = f" (from {origin.op})" if origin is not None and origin.op != node.op else ""
                    notes.append(f"{node.op}{where}{via} -> {', '.join(ops)}")
                else:
                    mapped[node.id] = out.copy_node(src, node, [v.id for v in ins])
    out.set_outputs([mapped[i] for i in src.outputs])
    return out, changed


def legalize(graph: Graph, claims: Claims, *, user_graph: Graph | None = None,
             gate: DtypeGate | None = None) -> LegalizeResult:
    """Return ``graph`` rewritten for a backend whose per-node answer is ``claims``.

    The result is always a new graph (the caller may own and mutate its param values).
    ``user_graph`` is the graph that ``origin`` ids refer to (``graph`` by default).
    ``gate`` (``DtypeGate.of(backend)``) refuses every node, sources included, whose
    dtype or an input's the backend does not read, before ``claims`` is asked about it;
    ``None`` lets ``claims`` answer for every dtype.
    """
    user = user_graph if user_graph is not None else graph
    notes: list[str] = []
    current = graph
    for _ in range(_MAX_PASSES):
        current, changed = _replay(current, claims, user, notes, gate)
        if not changed:
            break
    result = LegalizeResult(current, decomposed=notes)
    for node in current.nodes:
        refusal = _refused(gate, current, node)
        if refusal is not None:
            result.unclaimed.append((node, refusal))
            continue
        if node.op in (OpKind.INPUT, OpKind.PARAM, OpKind.CONSTANT):
            continue
        answer = _unlisted(gate, node) or ask_claims(claims, node)
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
