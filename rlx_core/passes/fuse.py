"""Device-specific fusion: gemm epilogues, elementwise regions, convolution epilogues.

Each runs only for a backend that claims its fused op: each candidate node is shown to
``claims`` before it replaces anything, so a backend may refuse one (too many inputs,
an activation it lacks) with a reason, and a backend that does not know these ops never
sees them.

``fuse_gemm`` turns ``activation(matmul(a, b) + bias)`` (bias and activation each
optional, at least one present) into one ``gemm`` node when the intermediate values have
no other reader and the bias broadcasts to the product without growing it.

``fuse_elementwise`` groups chains of elementwise ops into ``fused_elementwise`` regions.
A region has one result (its *root*); every other member has all its readers inside the
region, so no value computed inside is needed outside and the region can be evaluated
in one sweep over the output. Members all have the root's shape: smaller operands (a
bias row, a scalar) enter as broadcast inputs instead, so a backend can split the work
into blocks of the output. Regions grow backwards from the root, in reverse order of the
graph, within ``max_ops`` instructions and ``max_inputs`` distinct inputs (scalar constants free).

``fuse_conv`` (after the regions) gives a ``conv2d`` the elementwise node or region that
is its only reader as an epilogue, one ``fused_conv`` node: the activation after a
convolution (relu, SiLU's ``x * sigmoid(x)``, hard-swish's clamps), a residual add. The
epilogue must have the convolution's shape; where it reads two convolutions (a residual
block's two branches), it takes the one computed last.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from ..ir import Graph, Node
from ..ir.dtypes import is_storage
from ..ir.internal_types import CONV_ATTRS
from ..ir.ops import ELEMENTWISE_OPS, SOURCE_OPS, OpKind
from ..ir.shape_rules import recording
from ..ir.sized import holds_array
from ..ir.symbolic import known_less
from .internal_ops import ACTIVATION_OPS, describe_program, infer_internal, make_instruction
from .legalize import ask_claims
from .rewrite import Emitter, replace_planned

__all__ = ["fuse_gemm", "fuse_elementwise", "fuse_conv", "candidate_node"]

Claims = Callable[[Node], "bool | str"]
_MAX_REFUSAL_NOTES = 8  # a backend refusing many regions for one reason need not fill the report


def candidate_node(graph: Graph, at: Node, op: OpKind, inputs: list[int], attrs: dict[str, Any]) -> Node:
    """The node that would replace ``at``: typed and normalized, for ``claims`` to judge."""
    with recording():  # (the constraints a symbolic candidate needs are recorded when it is added)
        norm, shape, dtype = infer_internal(op, [graph.node(i) for i in inputs], attrs)
    return Node(at.id, op, tuple(inputs), MappingProxyType(norm), tuple(shape), dtype, at.name, at.origin)


class _NotClaimed(Exception):
    """The backend does not claim the fused op at all: no candidate of the pass will do."""


def _claimed(claims: Claims, candidate: Node, notes: list[str], refused: str) -> bool:
    """Whether the backend takes ``candidate``; a refusal's reason goes into ``notes`` as
    ``"{refused}: {reason}"`` (the first ``_MAX_REFUSAL_NOTES`` of them). Raises
    ``_NotClaimed`` where the backend does not claim the op."""
    answer = ask_claims(claims, candidate)
    if answer == "not claimed":
        raise _NotClaimed
    if answer is not True:
        if len(notes) < _MAX_REFUSAL_NOTES:
            notes.append(f"{refused}: {answer}")
        return False
    return True


def _replace(graph: Graph, absorbed: set[int], plans: dict[int, tuple[OpKind, list[int], dict[str, Any]]],
             note: Callable[[Node, Node], str]) -> tuple[Graph, list[str]]:
    """``graph`` with every planned node (id -> its fused op, inputs, attributes) replaced
    by the fused node and the ``absorbed`` nodes dropped; a note per fused node,
    ``note(node it replaces, fused node)``."""

    def emit(em: Emitter, node: Node, plan: tuple[OpKind, list[int], dict[str, Any]]) -> str:
        op, inputs, attrs = plan
        return note(node, em.node(em.emit(node, op, [em.mapped[i] for i in inputs], attrs, node.name)))

    return replace_planned(graph, absorbed, plans, emit)


def _activation_of(node: Node) -> str | None:
    for name, spec in ACTIVATION_OPS.items():
        if spec is not None and node.op is spec[0] and all(node.attrs.get(k) == v for k, v in spec[1].items()):
            return name
    return None


def fuse_gemm(graph: Graph, claims: Claims) -> tuple[Graph, list[str]]:
    uses = graph.use_counts()
    consumers: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for i in node.inputs:
            consumers.setdefault(i, []).append(node)
    plans: dict[int, tuple[list[int], str, list[int]]] = {}  # top id -> (gemm inputs, activation, absorbed)
    refusals: list[str] = []
    for mm in graph.nodes:
        if mm.op is not OpKind.MATMUL or uses[mm.id] != 1 or mm.id not in consumers:
            continue
        inputs, absorbed, top, act = list(mm.inputs), [mm.id], mm, "none"
        nxt = consumers[mm.id][0]
        if nxt.op is OpKind.ADD and nxt.shape == mm.shape and nxt.dtype == mm.dtype:
            other = nxt.inputs[1] if nxt.inputs[0] == mm.id else nxt.inputs[0]
            if other != mm.id:
                inputs.append(other)
                absorbed.append(nxt.id)
                top = nxt
        if uses[top.id] == 1 and top.id in consumers:
            follower = consumers[top.id][0]
            name = _activation_of(follower)
            if name is not None:
                act, top = name, follower
                absorbed.append(follower.id)
        if len(absorbed) == 1:
            continue
        candidate = candidate_node(graph, top, OpKind.GEMM, inputs, {"activation": act})
        try:
            if not _claimed(claims, candidate, refusals, f"gemm at {top.describe()} not fused"):
                continue
        except _NotClaimed:
            return graph, [f"matmul epilogues not fused: the backend does not claim {OpKind.GEMM}"]
        plans[top.id] = (inputs, act, absorbed)
    if not plans:
        return graph, refusals
    skip = {i for _, _, absorbed in plans.values() for i in absorbed[:-1]}

    def note(node: Node, new: Node) -> str:
        ops = " + ".join(str(graph.node(i).op) for i in plans[node.id][2])
        return f"fused {ops} at {node.describe()} into gemm(activation={new.attrs['activation']})"

    fused, notes = _replace(graph, skip, {top: (OpKind.GEMM, inputs, {"activation": act})
                                          for top, (inputs, act, _) in plans.items()}, note)
    return fused, refusals + notes


# ----------------------------------------------------------------------------- regions
def _fusable(graph: Graph, node: Node) -> bool:
    """An elementwise op a region may hold: not empty, and reading and writing no storage
    dtype (a backend's fused kernels compute in the dtypes it computes in)."""
    return (node.op in ELEMENTWISE_OPS and known_less(0, node.size) and not is_storage(node.dtype)
            and not any(is_storage(graph.node(i).dtype) for i in node.inputs))


#: Scalar constants (an exporter's 0.5, 1.0, sqrt(2)...) cost a region nothing to read,
#: so they do not count against ``max_inputs``; this bounds them all the same.
_SCALAR_SLACK = 4


def _input_count(graph: Graph, inputs: dict[int, None]) -> int:
    """A region's inputs as ``max_inputs`` counts them: scalar constants are free."""
    return sum(1 for i in inputs if not (holds_array(graph.node(i)) and graph.node(i).size == 1))


def _grow(graph: Graph, root: Node, uses: list[int], taken: set[int], outputs: frozenset[int], max_ops: int,
          max_inputs: int) -> list[int]:
    """Members of the region rooted at ``root`` (ids, ascending)."""
    members = {root.id}
    inside = {}  # producer id -> reads from members so far
    external = dict.fromkeys(root.inputs)  # ordered set of the region's inputs

    def offer(node: Node) -> None:
        for i in node.inputs:
            inside[i] = inside.get(i, 0) + 1
            if i not in seen:
                seen.add(i)
                heapq.heappush(heap, -i)

    seen: set[int] = set()
    heap: list[int] = []
    offer(root)
    while heap and len(members) < max_ops:
        pid = -heapq.heappop(heap)
        p = graph.node(pid)
        if (pid in taken or pid in outputs or not _fusable(graph, p) or p.shape != root.shape or p.op in SOURCE_OPS
                or inside.get(pid, 0) != uses[pid]):
            continue
        ext = dict(external)
        ext.pop(pid, None)
        ext.update(dict.fromkeys(i for i in p.inputs if i not in members))
        if _input_count(graph, ext) > max_inputs or len(ext) > _SCALAR_SLACK * max_inputs:
            continue
        members.add(pid)
        external = ext
        offer(p)
    return sorted(members)


def _program(graph: Graph, members: list[int]) -> tuple[list[int], tuple]:
    """The region's external inputs (in first-read order) and its program."""
    index: dict[int, int] = {}
    inputs: list[int] = []
    for m in members:
        for i in graph.node(m).inputs:
            if i not in members and i not in index:
                index[i] = len(inputs)
                inputs.append(i)
    program = []
    for k, m in enumerate(members):
        index[m] = len(inputs) + k
        node = graph.node(m)
        program.append(make_instruction(node.op, [index[i] for i in node.inputs], node.attrs))
    return inputs, tuple(program)


def fuse_elementwise(graph: Graph, claims: Claims, max_ops: int, max_inputs: int) -> tuple[Graph, list[str]]:
    uses = graph.use_counts()
    outputs = frozenset(graph.outputs)
    taken: set[int] = set()
    regions: dict[int, tuple[list[int], tuple, list[int]]] = {}  # root -> (inputs, program, members)
    notes: list[str] = []
    for root in reversed(graph.nodes):
        if root.id in taken or not _fusable(graph, root):
            continue
        members = _grow(graph, root, uses, taken, outputs, max_ops, max_inputs)
        if len(members) < 2:
            continue
        inputs, program = _program(graph, members)
        candidate = candidate_node(graph, root, OpKind.FUSED_ELEMENTWISE, inputs, {"program": program})
        try:
            if not _claimed(claims, candidate, notes, f"region of {len(members)} ops at {root.describe()} not fused"):
                continue
        except _NotClaimed:
            return graph, [f"elementwise regions not fused: the backend does not claim {OpKind.FUSED_ELEMENTWISE}"]
        taken.update(members)
        regions[root.id] = (inputs, program, members)
    if not regions:
        return graph, notes
    def note(node: Node, new: Node) -> str:
        return (f"fused {describe_program(new)} into one node at {node.describe()}, {len(new.inputs)} input(s), "
                f"shape {list(node.shape)}")

    fused_nodes = {root: (OpKind.FUSED_ELEMENTWISE, inputs, {"program": program})
                   for root, (inputs, program, _) in regions.items()}
    fused, made = _replace(graph, taken - set(regions), fused_nodes, note)
    return fused, notes + made


# ----------------------------------------------------------------------------- conv epilogues
def _epilogue(node: Node) -> tuple | None:
    """``node``'s elementwise program over its inputs: a region's own, one instruction for
    a single elementwise op, None for anything else."""
    if node.op is OpKind.FUSED_ELEMENTWISE:
        return tuple(node.attrs["program"])
    if node.op in ELEMENTWISE_OPS and node.op not in SOURCE_OPS and known_less(0, node.size):
        return (make_instruction(node.op, range(len(node.inputs)), node.attrs),)
    return None


def _conv_epilogue_plan(graph: Graph, node: Node, readers: dict[int, set[int]], outputs: frozenset[int]
                        ) -> tuple[Node, list[int], tuple] | None:
    """The convolution ``node`` can take as its epilogue's input, the epilogue's other
    inputs and its program renumbered (the convolution's result as value 0), or None."""
    program = _epilogue(node)
    if program is None:
        return None
    inputs = list(dict.fromkeys(node.inputs))
    convs = [i for i in inputs if graph.node(i).op is OpKind.CONV2D and readers.get(i) == {node.id}
             and i not in outputs and graph.node(i).shape == node.shape]
    if not convs:
        return None
    conv = graph.node(max(convs))
    order = [conv.id, *(i for i in inputs if i != conv.id)]
    where = {v: k for k, v in enumerate(order)}
    n_in = len(node.inputs)
    remap = {k: where[i] for k, i in enumerate(node.inputs)}  # a region's inputs are distinct; an op's may repeat
    renumbered = tuple(
        make_instruction(op, [remap[a] if a < n_in else a - n_in + len(order) for a in args], dict(attrs))
        for op, args, attrs in program
    )
    return conv, order[1:], renumbered


def fuse_conv(graph: Graph, claims: Claims) -> tuple[Graph, list[str]]:
    outputs = frozenset(graph.outputs)
    readers: dict[int, set[int]] = {}
    for node in graph.nodes:
        for i in node.inputs:
            readers.setdefault(i, set()).add(node.id)
    plans: dict[int, tuple[OpKind, list[int], dict[str, Any]]] = {}  # epilogue id -> (fused_conv, inputs, attrs)
    absorbed: set[int] = set()
    notes: list[str] = []
    for node in graph.nodes:
        found = _conv_epilogue_plan(graph, node, readers, outputs)
        if found is None:
            continue
        conv, others, program = found
        attrs = {**{k: conv.attrs[k] for k in CONV_ATTRS}, "bias": len(conv.inputs) == 3, "program": program}
        inputs = [*conv.inputs, *others]
        candidate = candidate_node(graph, node, OpKind.FUSED_CONV, inputs, attrs)
        try:
            if not _claimed(claims, candidate, notes, f"epilogue at {node.describe()} not fused into its conv2d"):
                continue
        except _NotClaimed:
            return graph, [f"convolution epilogues not fused: the backend does not claim {OpKind.FUSED_CONV}"]
        plans[node.id] = (OpKind.FUSED_CONV, inputs, attrs)
        absorbed.add(conv.id)
    if not plans:
        return graph, notes
    fused, made = _replace(graph, absorbed, plans,
                           lambda node, new: f"fused {describe_program(new)} at {node.describe()} into fused_conv")
    return fused, notes + made
