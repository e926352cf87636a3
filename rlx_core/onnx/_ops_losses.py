"""Converters of the loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Models exported for evaluation keep their loss. Both pick, for every sample (and every
spatial position), the log-probability of its target class: a ``gather`` from the
flattened input by ``target * D + offset`` (``D`` the spatial size, the offsets a
constant table), the target wrapped and range-checked by a ``gather`` from
``arange(C)``. ``ignore_index`` positions count neither in the loss nor in the mean's
denominator; ``weight`` scales each class; ``reduction`` is none, sum or mean (the
weighted mean divides by the weights actually used), as the spec defines it.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import FLOAT_DTYPES
from ._context import NodeContext, converter
from ._ops import _log_softmax
from ._shapes import Emitter, Operand, frozen

__all__: list[str] = []



def _nll(c: NodeContext, logp: Operand, target: Operand, weight: Operand | None, name: str) -> Operand:
    f = c.f
    shape, dtype = f.shape(logp), f.dtype(logp)
    if dtype not in FLOAT_DTYPES:
        raise c.fail(f"needs float scores, got {dtype}")
    if len(shape) < 2:
        raise c.fail(f"the input must be (N, C, d1, ...), got shape {shape}")
    n, classes, spatial = shape[0], shape[1], tuple(shape[2:])
    if f.dtype(target) not in ("int32", "int64") or tuple(f.shape(target)) != (n, *spatial):
        raise c.fail(f"the target must be int32/int64 of shape {(n, *spatial)}, got {f.dtype(target)}"
                     f"{tuple(f.shape(target))}")
    if weight is not None and tuple(f.shape(weight)) != (classes,):
        raise c.fail(f"the weight must have shape ({classes},), got {tuple(f.shape(weight))}")
    reduction = c.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise c.fail(f"reduction {reduction!r} is not one of none, sum, mean")
    target = target if f.dtype(target) == "int64" else f.op("cast", target, dtype="int64")
    ignored = None
    if c.has_attr("ignore_index"):
        ignored = f.op("equal", target, f.const(int(c.attr("ignore_index")), "int64"))
        target = f.op("where", ignored, f.const(0, "int64"), target)  # any valid class: masked below
    cls = f.op("gather", frozen(np.arange(classes, dtype=np.int64)), target, axis=0)  # wraps, range-checks
    d = math.prod(spatial)
    offsets = (np.arange(n, dtype=np.int64) * classes * d).reshape((n,) + (1,) * len(spatial))
    offsets = offsets + np.arange(d, dtype=np.int64).reshape(spatial)
    flat = f.op("add", f.op("mul", cls, f.const(d, "int64")) if d != 1 else cls, frozen(offsets))
    picked = f.op("gather", f.op("reshape", logp, shape=(n * classes * d,)), flat, axis=0)
    loss = f.op("neg", picked)
    used = f.op("gather", weight, cls, axis=0) if weight is not None else None
    if used is not None:
        loss = f.op("mul", loss, used)
    zero = f.const(0.0, dtype)
    if ignored is not None:
        loss = f.op("where", ignored, zero, loss)
        if used is not None or reduction == "mean":
            used = f.op("where", ignored, zero, used if used is not None else f.const(1.0, dtype))
    axes = tuple(range(1 + len(spatial)))
    if reduction == "none":
        return f.op("reshape", loss, shape=(n, *spatial), name=name)
    total = f.op("reduce_sum", loss, axes=axes, keepdims=False)
    if reduction == "sum":
        return f.op("reshape", total, shape=(), name=name)
    if used is None:
        return f.op("div", total, f.const(float(n * d), dtype), name=name)
    if tuple(f.shape(used)) != (n, *spatial):  # the scalar 1 of an unweighted ignore: as many as the positions
        used = f.op("mul", used, frozen(np.ones((n, *spatial), dtype=dtype)))
    return f.op("div", total, f.op("reduce_sum", used, axes=axes, keepdims=False), name=name)


@converter("NegativeLogLikelihoodLoss")
def _nll_loss(c: NodeContext) -> list[Operand | None]:
    return [_nll(c, c.input(0, "input"), c.input(1, "target"), c.optional(2), c.out())]


@converter("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(c: NodeContext) -> list[Operand | None]:
    """``NegativeLogLikelihoodLoss(log_softmax(scores, axis=1), labels)``; the optional
    second output is that log-softmax."""
    f: Emitter = c.f
    scores = c.input(0, "scores")
    if len(f.shape(scores)) < 2:
        raise c.fail(f"scores must be (N, C, d1, ...), got shape {f.shape(scores)}")
    logp = _log_softmax(f, scores, 1, c.out(1) if c.used(1) else "")
    loss = _nll(c, logp, c.input(1, "labels"), c.optional(2), c.out())
    return [loss, logp if c.used(1) else None]
