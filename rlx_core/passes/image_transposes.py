"""Transposes between a sequence of pixels and an image, written as the 4-D ones they are.

Vision transformers with a convolution in their MLP (SegFormer's Mix-FFN, PVT v2's,
exported by torch) move the ``(B, H*W, C)`` sequence into an image and back around each
depthwise convolution: ``transpose(0, 2, 1)`` then ``reshape(B, C, H, W)``, and
``reshape(B, C, H*W)`` then ``transpose(0, 2, 1)``. The same data movement is
``reshape(B, H, W, C)`` then ``transpose(0, 3, 1, 2)``, and ``transpose(0, 2, 3, 1)``
then ``reshape(B, H*W, C)``. Why rewrite it so: a backend that holds images channels-last
(rlx-cpu's layout plan) runs a 4-D transpose to or from NHWC beside its convolutions as a
view of what it holds, where each 3-D one was a copy: SegFormer-B0 spent 2.1 of 9.3 ms
at batch 1 in them (the Zen 4 EPYC of BENCHMARKS.md's "Sequences into images and back").
Elsewhere it is the same copy, along the same axes.

Only where the transpose (or the reshape) before has no other reader and is not a graph
output, and every size involved is known (static graphs; a symbolic graph is rewritten
once its sizes are specialized).
"""

from __future__ import annotations

from ..ir import Graph, Node
from ..ir.ops import OpKind
from .rewrite import Emitter

__all__ = ["image_transposes"]

_SWAP = (0, 2, 1)
_TO_NCHW = (0, 3, 1, 2)
_TO_NHWC = (0, 2, 3, 1)


def _ints(*shapes: tuple[object, ...]) -> bool:
    return all(isinstance(d, int) for shape in shapes for d in shape)


def _into_image(graph: Graph, reshape: Node) -> Node | None:
    """The sequence ``x`` (B, H*W, C) where ``reshape`` is ``transpose(x, (0, 2, 1))``
    reshaped to (B, C, H, W); else None."""
    if reshape.op is not OpKind.RESHAPE or len(reshape.shape) != 4:
        return None
    swap = graph.node(reshape.inputs[0])
    if swap.op is not OpKind.TRANSPOSE or tuple(swap.attrs["perm"]) != _SWAP:
        return None
    x = graph.node(swap.inputs[0])
    b, c, h, w = reshape.shape
    if not _ints(x.shape, reshape.shape) or tuple(x.shape) != (b, h * w, c):
        return None
    return x


def _out_of_image(graph: Graph, swap: Node) -> Node | None:
    """The image ``y`` (B, C, H, W) where ``swap`` is ``transpose(reshape(y, (B, C,
    H*W)), (0, 2, 1))``; else None."""
    if swap.op is not OpKind.TRANSPOSE or tuple(swap.attrs["perm"]) != _SWAP:
        return None
    flat = graph.node(swap.inputs[0])
    if flat.op is not OpKind.RESHAPE:
        return None
    y = graph.node(flat.inputs[0])
    if len(y.shape) != 4 or not _ints(y.shape, flat.shape):
        return None
    b, c, h, w = y.shape
    return y if tuple(flat.shape) == (b, c, h * w) else None


def image_transposes(graph: Graph) -> tuple[Graph, list[str]]:
    """The optimize stage's pass (see the module)."""
    uses = graph.use_counts()
    outputs = frozenset(graph.outputs)

    def alone(node_id: int) -> bool:  # the node between is read by the rewritten node only
        return uses[node_id] == 1 and node_id not in outputs

    into = {n.id: x for n in graph.nodes if (x := _into_image(graph, n)) is not None and alone(n.inputs[0])}
    swaps = {graph.node(i).inputs[0] for i in into}  # (an image into a sequence straight into another image: once)
    out_of = {n.id: y for n in graph.nodes
              if n.id not in swaps and (y := _out_of_image(graph, n)) is not None and alone(n.inputs[0])}
    if not into and not out_of:
        return graph, []
    dropped = {graph.node(i).inputs[0] for i in (*into, *out_of)}
    em = Emitter(graph)
    notes = []
    for node in graph.nodes:
        if node.id in dropped:
            continue
        if node.id in into:
            b, c, h, w = node.shape
            image = em.emit(node, OpKind.RESHAPE, [em.mapped[into[node.id].id]], {"shape": (b, h, w, c)})
            em.emit(node, OpKind.TRANSPOSE, [image], {"perm": _TO_NCHW}, node.name)
            notes.append(f"sequence into an image at {node.describe()} as reshape to (B, H, W, C) and a 4-D transpose")
        elif node.id in out_of:
            y = out_of[node.id]
            image = em.emit(node, OpKind.TRANSPOSE, [em.mapped[y.id]], {"perm": _TO_NHWC})
            em.emit(node, OpKind.RESHAPE, [image], {"shape": tuple(node.shape)}, node.name)
            notes.append(f"image into a sequence at {node.describe()} as a 4-D transpose and a reshape")
        else:
            em.copy(node)
    return em.finish(), notes
