"""Recognizing scaled dot-product attention in an exported graph.

Exporters (torch.onnx, tf2onnx) write attention as its parts::

    matmul(softmax(matmul(q, kT) * c [/ c] [+ mask], axis=-1), v)

``fuse_attention`` replaces that chain by one ``attention(q, k, v[, mask], scale)`` node
for a backend that claims ``attention``, where ``k`` is ``kT`` with its last two axes
swapped (folded into ``kT``'s own transpose when it has one, as exported graphs do). A
backend's attention kernel can then lay the scores out as it likes: the cpu backend
computes them transposed, so that softmax reduces across rows (vectorized) instead of
along 128-element rows (one reduction call per row), and skips the copy of ``kT``.

torch's SDPA export (both exporters; every transformers model exported with its default
``attn_implementation="sdpa"``) writes it as::

    where(isnan(p), 0, p) @ v,  p = softmax((q * c) @ (kT * c) + mask)

with ``c = sqrt(1 / sqrt(D))`` (0.3536 for D = 64) on each side and the guard giving 0
where a row is masked everywhere. For a backend that lists the ``attention.nan_to_zero``
extension (``Backend.op_extensions``) that becomes ``attention(..., scale=c * c,
nan_to_zero=True)``; for any other the chain is left as it is. The same two factors
without the guard (``softmax((q * c) @ (kT * c) + mask) @ v``, as BERT exports at opset
17) become ``attention(..., scale=c * c)`` for any backend that claims attention: left
as multiplications, each cost a pass over q and over kT, and kept kT's transpose from
merging into k's. ``kT`` may also be the dynamo exporter's batched transpose of ``k``
(``_k_source``).

Only exact rewrites are made, so results stay equal to the unfused graph: a constant
``c`` becomes the scale, ``c`` for a multiplication and ``1 / c`` for a division only
when ``1 / c`` is exact (a power of two, like the usual ``sqrt(64)``). The one rounding
difference taken: SDPA's two constant factors, one on ``q`` and one on ``kT``, become
one scale, their product (a difference of an ulp in the scores, below what the fused
kernel's own order of operations makes). A scalar *param*
(ONNX initializers are params) may change under ``set_param``, so it stays a node: the
multiplication or division moves onto ``q``, which is exact when ``c`` is a power of two
(checked on its value at compile time; a later non-power-of-two value is then applied
before the product instead of after, a difference of rounding only). SDPA's factors and
its guard's 0 are taken as their values even when they are params (the dynamo exporter
makes every constant an initializer): those params are returned as *folded*, and
``set_param`` of one compiles the graph again (``CompiledGraph.absorbed_params``). An
additive mask must already have the scores' dtype. Every absorbed value must have no
other reader and not be an output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from ..ir import Graph, Node
from ..ir.ops import OpKind
from .legalize import offer
from .optimize import dce
from .rewrite import Emitter, known_scalar, replace_planned

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
    nan_to_zero: bool = False  # the softmax guarded by where(isnan(p), 0, p)
    folded: tuple[int, ...] = ()  # scalar params whose value the fused node holds (guard fill, split scale)


def _power_of_two(c: float) -> bool:
    return math.frexp(c)[0] in (0.5, -0.5)


def _scalar(graph: Graph, node: Node) -> float | None:
    """``known_scalar`` as a float, where it is finite and not 0 (a scale)."""
    arr = known_scalar(graph, node)
    value = None if arr is None else float(arr)
    return value if value is not None and math.isfinite(value) and value != 0 else None


def _guard(graph: Graph, node: Node, uses: list[int]) -> tuple[Node, list[int], list[int]] | None:
    """``(p, the guard's nodes, the params it reads)`` where ``node`` is ``where(isnan(p),
    0, p)`` as the ONNX import writes it (``where(where(p == p, False, True), 0, p)``) or
    as the attention decomposition does (``where(p == p, p, 0)``), and nothing else reads
    ``p``. The dynamo exporter makes its 0 an initializer, a param here."""
    if node.op is not OpKind.WHERE:
        return None
    cond, a, b = (graph.node(i) for i in node.inputs)

    def is_const(n: Node, value: object) -> bool:
        arr = known_scalar(graph, n)
        return arr is not None and bool(arr == value)

    if cond.op is OpKind.WHERE and uses[cond.id] == 1 and is_const(a, 0) and a.dtype == b.dtype:
        eq, no, yes = (graph.node(i) for i in cond.inputs)
        if not (no.dtype == yes.dtype == "bool" and is_const(no, False) and is_const(yes, True)):
            return None
        p, parts, fill = b, [node.id, cond.id, eq.id], a
    elif is_const(b, 0) and a.dtype == b.dtype:
        eq, p, parts, fill = cond, a, [node.id, cond.id], b
    else:
        return None
    if eq.op is not OpKind.EQUAL or eq.inputs != (p.id, p.id) or uses[eq.id] != 1 or uses[p.id] != 3:
        return None
    if node.shape != p.shape or node.dtype != p.dtype:
        return None
    return p, parts, [fill.id] if fill.op is OpKind.PARAM else []


def _split_scale(graph: Graph, t: Node, uses: list[int]) -> tuple[Node, Node, float, list[int], list[int]] | None:
    """``(q, kT, c1 * c2, the two products, the params among c1 and c2)`` where matmul
    ``t`` is ``(q * c1) @ (kT * c2)`` with scalar constants or params (torch's SDPA
    export), each product read by ``t`` only."""
    sides, params = [], []
    for i in t.inputs:
        side = graph.node(i)
        if side.op is not OpKind.MUL or uses[i] != 1:
            return None
        a, b = (graph.node(j) for j in side.inputs)
        for chain, const in ((a, b), (b, a)):
            c = _scalar(graph, const)
            if c is not None and chain.shape == side.shape:
                sides.append((chain, c))
                if const.op is OpKind.PARAM:
                    params.append(const.id)
                break
        else:
            return None
    (q, cq), (kt, ck) = sides
    return q, kt, cq * ck, [t.inputs[0], t.inputs[1]], params


def _match(graph: Graph, out: Node, uses: list[int], guarded: bool = False) -> _Match | None:
    """The attention chain ending at matmul ``out``, if it is one (``guarded``: the backend
    takes ``nan_to_zero``, so a guarded softmax matches too)."""
    def single(i: int) -> Node | None:
        node = graph.node(i)
        return node if uses[i] == 1 else None

    if out.op is not OpKind.MATMUL or len(out.shape) < 2:
        return None
    sm, absorbed, folded = single(out.inputs[0]), [], []
    guard = _guard(graph, graph.node(out.inputs[0]), uses) if guarded and sm is not None else None
    if guard is not None:
        sm, absorbed, folded = guard[0], guard[1], guard[2]
    if sm is None or sm.op is not OpKind.SOFTMAX or sm.attrs["axis"] != len(sm.shape) - 1:
        return None
    absorbed.append(sm.id)
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
    split = _split_scale(graph, t, uses) if scale == 1.0 and q_scale is None else None
    if split is not None:  # SDPA's sqrt(scale) on each side, guarded or not (see the module doc)
        q, kt, scale = split[0], split[1], split[2]
        absorbed += split[3]
        folded += split[4]
    if min(len(q.shape), len(kt.shape), len(graph.node(out.inputs[1]).shape)) < 2:
        return None
    absorbed.append(t.id)
    return _Match(q.id, kt.id, out.inputs[1], mask, scale, tuple(absorbed), q_scale, guard is not None,
                  tuple(folded))


def _attrs(m: _Match) -> dict[str, object]:
    return {"scale": m.scale, "nan_to_zero": True} if m.nan_to_zero else {"scale": m.scale}


def _swap_last(ndim: int) -> tuple[int, ...]:
    return (*range(ndim - 2), ndim - 1, ndim - 2)


def _k_source(graph: Graph, kt: Node) -> tuple[int, tuple[int, ...]]:
    """``(node, perm)`` with ``transpose(node, perm)`` = k: through kT's own transpose, or
    through the batched form of it, ``reshape(transpose(reshape(k, (B, L, D)), (0, 2, 1)),
    (b..., D, L))`` with ``B`` the product of ``k``'s batch dims ``b...`` (how the dynamo
    exporter writes ``k.transpose(-2, -1)`` before a 3-D matmul: kT turned back into k
    cost two transposes a layer, GPT-2's 0.5-0.8 ms each at batch 8)."""
    swap = _swap_last(len(kt.shape))
    if kt.op is OpKind.TRANSPOSE:
        inner = kt.attrs["perm"]
        return kt.inputs[0], tuple(inner[p] for p in swap)
    k = _batched_transpose_of(graph, kt)
    if k is not None:
        return k.id, tuple(range(len(kt.shape)))
    return kt.id, swap


def _batched_transpose_of(graph: Graph, kt: Node) -> Node | None:
    """``k`` where ``kt`` is ``reshape(transpose(reshape(k, (B, L, D)), (0, 2, 1)), (b...,
    D, L))``, ``k`` of shape ``(b..., L, D)`` and ``B`` the product of ``b...``, else None."""
    if kt.op is not OpKind.RESHAPE or len(kt.shape) < 3:
        return None
    t = graph.node(kt.inputs[0])
    if t.op is not OpKind.TRANSPOSE or t.attrs["perm"] != (0, 2, 1):
        return None
    r = graph.node(t.inputs[0])
    if r.op is not OpKind.RESHAPE:
        return None
    k = graph.node(r.inputs[0])
    *batch, length, depth = k.shape
    if (len(k.shape) != len(kt.shape) or tuple(kt.shape) != (*batch, depth, length)
            or tuple(r.shape) != (math.prod(batch), length, depth)):
        return None
    return k


def fuse_attention(graph: Graph, claims: Claims, extensions: frozenset[str] = frozenset()
                   ) -> tuple[Graph, list[str], frozenset[str]]:
    """``graph`` with each attention chain the backend (``claims``, and the op extensions
    it lists) takes as one ``attention`` node, a note per fusion, and the names of the
    params whose value a fused node holds (``PipelineResult.folded_params``: their
    ``set_param`` compiles again)."""
    uses = graph.use_counts()
    outputs = frozenset(graph.outputs)
    guarded = "attention.nan_to_zero" in extensions
    plans: dict[int, _Match] = {}
    for node in graph.nodes:
        m = _match(graph, node, uses, guarded)
        if m is None or any(i in outputs for i in m.absorbed):
            continue
        src, perm = _k_source(graph, graph.node(m.kt))
        k_shape = tuple(graph.node(src).shape[p] for p in perm)
        ins = [graph.node(m.q), _Tensor(k_shape, graph.node(m.kt).dtype), graph.node(m.v)]
        if m.mask is not None:
            ins.append(graph.node(m.mask))
        # (False also for a chain attention does not express: batch dims that do not broadcast)
        taken = offer(claims, node, OpKind.ATTENTION, ins, _attrs(m))
        if taken is None:
            return graph, [], frozenset()
        if taken:
            plans[node.id] = m
    if not plans:
        return graph, [], frozenset()

    def emit(em: Emitter, node: Node, m: _Match) -> str:
        src, perm = _k_source(graph, graph.node(m.kt))
        k = em.mapped[src]
        if perm != tuple(range(len(perm))):
            k = em.emit(node, OpKind.TRANSPOSE, [k], {"perm": perm})
        q = em.mapped[m.q]
        if m.q_scale is not None:
            q = em.emit(node, m.q_scale[0], [q, em.mapped[m.q_scale[1]]], {})
        inputs = [q, k, em.mapped[m.v]] + ([em.mapped[m.mask]] if m.mask is not None else [])
        em.emit(node, OpKind.ATTENTION, inputs, _attrs(m), node.name)
        parts = " + ".join(str(graph.node(i).op) for i in reversed(m.absorbed))
        on_q = f"; {m.q_scale[0]} by param {graph.node(m.q_scale[1]).name!r} moved onto q" if m.q_scale else ""
        return (f"fused {parts} + matmul at {node.describe()} into attention(scale={m.scale:g}"
                f"{', mask' if m.mask is not None else ''}{', nan_to_zero' if m.nan_to_zero else ''}){on_q}")

    rebuilt, notes = replace_planned(graph, {i for m in plans.values() for i in m.absorbed}, plans, emit)
    fused, _ = dce(rebuilt)  # kT's transpose, when only the chain read it
    folded = frozenset(graph.node(i).name for m in plans.values() for i in m.folded)
    return fused, notes, folded
