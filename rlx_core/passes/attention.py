"""Recognizing scaled dot-product attention in an exported graph.

Exporters (torch.onnx, tf2onnx) write attention as its parts::

    matmul(softmax(matmul(q, kT) * c [/ c] [+ mask], axis=-1), v)

``fuse_attention`` replaces that chain by one ``attention(q, k, v[, mask], scale)`` node
for a backend that claims ``attention``, where ``k`` is ``kT`` with its last two axes
swapped (folded into ``kT``'s own transpose when it has one, as exported graphs do). A
backend's attention kernel can then lay the scores out as it likes: the cpu backend
computes them transposed, so that softmax reduces across rows (vectorized) instead of
along 128-element rows (one reduction call per row), and skips the copy of ``kT``.

Only exact rewrites are made, so results stay equal to the unfused graph: a constant
``c`` becomes the scale, ``c`` for a multiplication and ``1 / c`` for a division only
when ``1 / c`` is exact (a power of two, like the usual ``sqrt(64)``). A scalar *param*
(ONNX initializers are params) may change under ``set_param``, so it stays a node: the
multiplication or division moves onto ``q``, which is exact when ``c`` is a power of two
(checked on its value at compile time; a later non-power-of-two value is then applied
before the product instead of after, a difference of rounding only). An additive mask
must already have the scores' dtype. Every absorbed value must have no other reader and
not be an output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from ..errors import GraphError
from ..ir import Graph, Node
from ..ir.ops import OpKind, infer
from ..ir.sized import holds_array
from .legalize import ask_claims
from .optimize import dce
from .rewrite import Emitter, replace_planned

__all__ = ["fuse_attention"]

Claims = Callable[[Node], "bool | str"]


class _Tensor(NamedTuple):
    shape: tuple[int, ...]
    dtype: str


class _Match(NamedTuple):
    q: int
    kt: int
    v: int
    mask: int | None
    scale: float
    absorbed: tuple[int, ...]  # the chain's nodes before the final matmul
    q_scale: tuple[OpKind, int] | None = None  # (mul or div, scalar param) applied to q


def _power_of_two(c: float) -> bool:
    return math.frexp(c)[0] in (0.5, -0.5)


def _scalar(graph: Graph, node: Node) -> float | None:
    if not (holds_array(node) or node.op is OpKind.PARAM) or node.size != 1:
        return None
    value = float(np.asarray(graph.value(node.id)).reshape(()))
    return value if math.isfinite(value) and value != 0 else None


def _match(graph: Graph, out: Node, uses: list[int]) -> _Match | None:
    """The attention chain ending at matmul ``out``, if it is one."""
    def single(i: int) -> Node | None:
        node = graph.node(i)
        return node if uses[i] == 1 else None

    if out.op is not OpKind.MATMUL or len(out.shape) < 2:
        return None
    sm = single(out.inputs[0])
    if sm is None or sm.op is not OpKind.SOFTMAX or sm.attrs["axis"] != len(sm.shape) - 1:
        return None
    absorbed = [sm.id]
    t = single(sm.inputs[0])
    mask = None
    if t is not None and t.op is OpKind.ADD:
        a, b = (graph.node(i) for i in t.inputs)
        chain, other = (a, b) if a.op in (OpKind.MUL, OpKind.DIV, OpKind.MATMUL) else (b, a)
        if other.dtype != t.dtype or other.id == chain.id or chain.shape != t.shape:
            return None
        mask, t = other.id, single(chain.id)
        absorbed.append(sm.inputs[0])
    scale, q_scale = 1.0, None
    if t is not None and t.op in (OpKind.MUL, OpKind.DIV):
        a, b = (graph.node(i) for i in t.inputs)
        for chain, const in ((a, b), (b, a)) if t.op is OpKind.MUL else ((a, b),):
            c = _scalar(graph, const)
            if c is not None and chain.shape == t.shape:
                break
        else:
            return None
        if const.op is OpKind.PARAM:
            if not _power_of_two(c):
                return None
            q_scale = (t.op, const.id)
        elif t.op is OpKind.DIV:
            if not _power_of_two(c):  # 1/c is exact only for powers of two
                return None
            scale = 1.0 / c
        else:
            scale = c
        absorbed.append(t.id)
        t = single(chain.id)
    if t is None or t.op is not OpKind.MATMUL or t.shape != sm.shape:
        return None
    q, kt = (graph.node(i) for i in t.inputs)
    if min(len(q.shape), len(kt.shape), len(graph.node(out.inputs[1]).shape)) < 2:
        return None
    absorbed.append(t.id)
    return _Match(q.id, kt.id, out.inputs[1], mask, scale, tuple(absorbed), q_scale)


def _swap_last(ndim: int) -> tuple[int, ...]:
    return (*range(ndim - 2), ndim - 1, ndim - 2)


def _k_source(graph: Graph, kt: Node) -> tuple[int, tuple[int, ...]]:
    """``(node, perm)`` with ``transpose(node, perm)`` = k: through kT's own transpose."""
    swap = _swap_last(len(kt.shape))
    if kt.op is OpKind.TRANSPOSE:
        inner = kt.attrs["perm"]
        return kt.inputs[0], tuple(inner[p] for p in swap)
    return kt.id, swap


def fuse_attention(graph: Graph, claims: Claims) -> tuple[Graph, list[str]]:
    uses = graph.use_counts()
    outputs = frozenset(graph.outputs)
    plans: dict[int, _Match] = {}
    for node in graph.nodes:
        m = _match(graph, node, uses)
        if m is None or any(i in outputs for i in m.absorbed):
            continue
        src, perm = _k_source(graph, graph.node(m.kt))
        k_shape = tuple(graph.node(src).shape[p] for p in perm)
        ins = [graph.node(m.q), _Tensor(k_shape, graph.node(m.kt).dtype), graph.node(m.v)]
        if m.mask is not None:
            ins.append(graph.node(m.mask))
        try:
            attrs, shape, dtype = infer(OpKind.ATTENTION, ins, {"scale": m.scale})
        except GraphError:  # a chain attention does not express (e.g. batch dims that do not broadcast)
            continue
        if shape != node.shape or dtype != node.dtype:
            continue
        candidate = Node(node.id, OpKind.ATTENTION, (), MappingProxyType(attrs), shape, dtype, node.name, node.origin)
        answer = ask_claims(claims, candidate)
        if answer == "not claimed":
            return graph, []
        if answer is True:
            plans[node.id] = m
    if not plans:
        return graph, []

    def emit(em: Emitter, node: Node, m: _Match) -> str:
        src, perm = _k_source(graph, graph.node(m.kt))
        k = em.mapped[src]
        if perm != tuple(range(len(perm))):
            k = em.emit(node, OpKind.TRANSPOSE, [k], {"perm": perm})
        q = em.mapped[m.q]
        if m.q_scale is not None:
            q = em.emit(node, m.q_scale[0], [q, em.mapped[m.q_scale[1]]], {})
        inputs = [q, k, em.mapped[m.v]] + ([em.mapped[m.mask]] if m.mask is not None else [])
        em.emit(node, OpKind.ATTENTION, inputs, {"scale": m.scale}, node.name)
        parts = " + ".join(str(graph.node(i).op) for i in reversed(m.absorbed))
        on_q = f"; {m.q_scale[0]} by param {graph.node(m.q_scale[1]).name!r} moved onto q" if m.q_scale else ""
        return (f"fused {parts} + matmul at {node.describe()} into attention(scale={m.scale:g}"
                f"{', mask' if m.mask is not None else ''}){on_q}")

    rebuilt, notes = replace_planned(graph, {i for m in plans.values() for i in m.absorbed}, plans, emit)
    fused, _ = dce(rebuilt)  # kT's transpose, when only the chain read it
    return fused, notes
