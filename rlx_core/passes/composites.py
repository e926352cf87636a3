"""Decompositions of the composite ops into primitives.

Each function re-expresses one composite node with builder calls on the graph being
legalized; legalization applies them to every composite a backend does not claim.
They may emit other composites (layer_norm emits reduce_mean), which legalization
decomposes in turn. The reference interpreter defines the same ops directly, and the
conformance tests check that both agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..ir import Graph, Node, Value
from ..ir.ops import OpKind

__all__ = ["DECOMPOSITIONS", "decompose"]

Decomposition = Callable[[Graph, Node, Sequence[Value]], Value]


def _sigmoid(g: Graph, n: Node, ins: Sequence[Value]) -> Value:
    return g.div(1.0, g.add(1.0, g.exp(g.neg(ins[0]))))


def _gelu(g: Graph, n: Node, ins: Sequence[Value]) -> Value:
    x = ins[0]
    if n.attrs["approximate"] == "tanh":
        cube = g.mul(x, g.mul(x, x))
        inner = g.mul(math.sqrt(2.0 / math.pi), g.add(x, g.mul(0.044715, cube)))
        return g.mul(g.mul(0.5, x), g.add(1.0, g.tanh(inner)))
    return g.mul(g.mul(0.5, x), g.add(1.0, g.erf(g.mul(x, 1.0 / math.sqrt(2.0)))))


def _rsqrt(g: Graph, n: Node, ins: Sequence[Value]) -> Value:
    return g.div(1.0, g.sqrt(ins[0]))


def _reduce_mean(g: Graph, n: Node, ins: Sequence[Value]) -> Value:
    axes, keep = n.attrs["axes"], n.attrs["keepdims"]
    count = math.prod(ins[0].shape[a] for a in axes)
    return g.div(g.reduce_sum(ins[0], axes, keep), float(count))


def _softmax(g: Graph, n: Node, ins: Sequence[Value]) -> Value:
    axis = (n.attrs["axis"],)
    x = ins[0]
    if x.shape[axis[0]] == 0:  # an empty result: nothing to compute (and no max over nothing)
        return g.mul(x, 1.0)
    e = g.exp(g.sub(x, g.reduce_max(x, axis, keepdims=True)))
    return g.div(e, g.reduce_sum(e, axis, keepdims=True))


def _layer_norm(g: Graph, n: Node, ins: Sequence[Value]) -> Value:
    x = ins[0]
    axes = tuple(range(n.attrs["axis"], len(x.shape)))
    d = g.sub(x, g.reduce_mean(x, axes, keepdims=True))
    var = g.reduce_mean(g.mul(d, d), axes, keepdims=True)
    y = g.mul(g.mul(d, g.rsqrt(g.add(var, n.attrs["eps"]))), ins[1])
    return g.add(y, ins[2]) if len(ins) == 3 else y


def _global_avg_pool2d(g: Graph, n: Node, ins: Sequence[Value]) -> Value:
    return g.reduce_mean(ins[0], (2, 3), keepdims=True)


def _attention(g: Graph, n: Node, ins: Sequence[Value]) -> Value:
    q, k, v = ins[:3]
    perm = (*range(len(k.shape) - 2), len(k.shape) - 1, len(k.shape) - 2)
    scores = g.mul(g.matmul(q, g.transpose(k, perm)), n.attrs["scale"])
    if len(ins) == 4:
        mask = ins[3]
        if mask.dtype == "bool":
            scores = g.where(mask, scores, g.constant(np.array(-np.inf, dtype=scores.dtype)))
        else:
            scores = g.add(scores, mask)
    p = g.softmax(scores, axis=-1)
    if n.attrs.get("nan_to_zero"):  # NaN is the one value unequal to itself
        p = g.where(g.equal(p, p), p, g.constant(np.array(0, dtype=p.dtype)))
    return g.matmul(p, v)


DECOMPOSITIONS: dict[OpKind, Decomposition] = {
    OpKind.SIGMOID: _sigmoid,
    OpKind.GELU: _gelu,
    OpKind.RSQRT: _rsqrt,
    OpKind.REDUCE_MEAN: _reduce_mean,
    OpKind.SOFTMAX: _softmax,
    OpKind.LAYER_NORM: _layer_norm,
    OpKind.GLOBAL_AVG_POOL2D: _global_avg_pool2d,
    OpKind.ATTENTION: _attention,
}


def decompose(g: Graph, node: Node, ins: Sequence[Value]) -> Value:
    """Emit ``node``'s decomposition into ``g`` and return the value that replaces it."""
    out = DECOMPOSITIONS[node.op](g, node, ins)
    assert out.shape == node.shape and out.dtype == node.dtype, (node.op, out.shape, node.shape)
    return out
