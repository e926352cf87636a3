"""Activations moved above the reshapes and transposes between them and their producer.

Exporters put layout moves between a product and its activation: SegFormer's Mix-FFN
moves its depthwise convolution's image back into a sequence before the GELU
(``gelu(reshape(transpose(conv(x))))``), HF's ``Conv1D`` reshapes its 2-D product back to
3-D before GPT-2's GELU. A unary elementwise function commutes with a reshape and a
transpose exactly, so ``act(layout(x))`` becomes ``layout(act(x))``; the activation then
reads its producer directly, which the fusions after this pass can take as an epilogue
(``fuse_gemm``'s activation, ``fuse_conv``'s region). Taken only where it is free: the
layout nodes and ``x`` have no other reader and are not outputs, and ``x`` is computed
(not an input or a param: nothing would take the activation there).
"""

from __future__ import annotations

from ..ir import Graph, Node
from ..ir.ops import SOURCE_OPS, UNARY_OPS, OpKind
from .rewrite import Emitter

__all__ = ["hoist_activations"]

_LAYOUT = (OpKind.RESHAPE, OpKind.TRANSPOSE)


def _chain(graph: Graph, act: Node, uses: list[int], outputs: frozenset[int]) -> list[int] | None:
    """The layout nodes between ``act`` and its producer (in graph order), where ``act``
    may be moved above them."""
    if act.op not in UNARY_OPS or act.id in outputs:
        return None
    chain: list[int] = []
    i = act.inputs[0]
    while graph.node(i).op in _LAYOUT and uses[i] == 1 and i not in outputs:
        chain.append(i)
        i = graph.node(i).inputs[0]
    x = graph.node(i)
    if not chain or x.op in SOURCE_OPS or uses[i] != 1 or i in outputs or x.dtype != act.dtype:
        return None
    return chain[::-1]


def hoist_activations(graph: Graph) -> tuple[Graph, list[str]]:
    """``graph`` with each unary activation read through reshapes and transposes applied
    before them instead (see the module doc), and a note per move."""
    uses = graph.use_counts()
    outputs = frozenset(graph.outputs)
    moves: dict[int, Node] = {}  # the first layout node of a chain -> the activation moved above it
    last: dict[int, int] = {}  # an activation moved -> the last layout node of its chain
    for node in graph.nodes:
        chain = _chain(graph, node, uses, outputs)
        if chain is not None:
            moves[chain[0]] = node
            last[node.id] = chain[-1]
    if not moves:
        return graph, []
    em = Emitter(graph)
    notes = []
    for node in graph.nodes:
        act = moves.get(node.id)
        if act is not None:  # the activation on the producer, then this layout node on it
            moved = em.emit(act, act.op, [em.mapped[node.inputs[0]]], act.attrs)
            em.emit(node, node.op, [moved], node.attrs, node.name)
            notes.append(f"moved {act.op} at {act.describe()} above the {node.op} at {node.describe()}")
        elif node.id in last:
            em.alias(node, em.mapped[last[node.id]])
        else:
            em.copy(node)
    return em.finish(), notes
