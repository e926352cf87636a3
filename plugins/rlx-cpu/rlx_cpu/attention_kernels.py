"""Step builders for attention: ``softmax(q k^T * scale [+ mask]) v`` (and its
``nan_to_zero`` extension) as its two products around an in-place softmax, never its
decomposition. Long sequences go a block of heads and rows at a time so that each
block's scores stay in cache; under ``precision="bf16"`` the products take bf16 operands
on oneDNN where this host runs them faster (``onednn_attention``). Same contract as
``kernels.py``; ``nn_kernels.NN_KERNELS`` hands attention nodes here."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlx_core.ir import Node

from . import onednn, onednn_attention
from .gemm import matmul_step
from .kernels import BuildContext, compute_dtype, const, softmax_steps
from .native import library as native_library
from .native_nn import softmax_bf16_step, softmax_step
from .steps import Step

__all__ = ["attention", "ATTENTION_BLOCKED_BYTES", "ATTENTION_BLOCK_BYTES"]


def attention(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    """softmax(q k^T * scale [+ mask]) v, with the scores held *transposed*, (Lk, Lq) per
    head: ``k @ q^T``. The softmax then reduces across rows (axis -2), which numpy runs as
    vectorized passes over whole rows, instead of along each 128-wide row, which costs
    numpy one reduction call per row (6x slower at 4 x 128 x 128 scores). The second
    product reads the transposed scores as a transposed view, which BLAS takes as is.
    The scores have the batch dims of q, k and the mask only (``_scores_batch``); v's
    others broadcast in the second product."""
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) == 4 else None
    cd = compute_dtype(out.dtype)
    steps: list[Step] = []
    if cd != out.dtype:
        copies = []
        for t in (q, k, v):
            c = ctx.scratch(t.shape, cd)
            steps.append(Step(np.copyto, (c, t)))
            copies.append(c)
        q, k, v = copies
    batch, lq, lk = _scores_batch(q, k, mask), q.shape[-2], k.shape[-2]
    if lk == 0:  # softmax over no keys, times an empty v: the product is all zeros
        return [Step(np.copyto, (out, const(0, out.dtype)))]
    if tuple(np.broadcast_shapes(q.shape[:-2], k.shape[:-2])) != batch:
        qb = ctx.scratch((*batch, *q.shape[-2:]), q.dtype)  # the mask's batch dims, which q and k lack
        steps.append(Step(np.copyto, (qb, q)))
        q = qb
    if cd == out.dtype == np.float32 and native_library() is not None:
        native = _attention_native(node, q, k, v, mask, out, ctx)
        if native is not None:
            return [*steps, *native]
    st = ctx.scratch((*batch, lk, lq), cd)
    steps.append(matmul_step(k, q.swapaxes(-1, -2), st))
    if node.attrs["scale"] != 1.0:
        steps.append(Step(np.multiply, (st, const(node.attrs["scale"], cd), st)))
    if mask is not None:
        m = mask.reshape((1,) * (2 - mask.ndim) + tuple(mask.shape)).swapaxes(-1, -2)  # (.., Lk, Lq) like st
        if mask.dtype == np.bool_:
            masked = ctx.scratch(m.shape, np.bool_)
            steps += [Step(np.logical_not, (m, masked)),
                      Step(np.copyto, (st, const(-np.inf, cd)), {"where": masked})]
        else:
            steps.append(Step(np.add, (st, m, st)))
    steps += softmax_steps(st, -2, st, st, ctx)
    if node.attrs.get("nan_to_zero"):  # a row masked everywhere gives zeros (NaN is unequal to itself)
        nan = ctx.scratch(st.shape, np.bool_)
        steps += [Step(np.not_equal, (st, st, nan)), Step(np.copyto, (st, const(0, cd)), {"where": nan})]
    p = st.swapaxes(-1, -2)
    if cd == out.dtype:
        steps.append(matmul_step(p, v, out))
    else:
        res = ctx.scratch(out.shape, cd)
        steps += [matmul_step(p, v, res), Step(np.copyto, (out, res), {"casting": "same_kind"})]
    return steps


#: Scores past this many bytes are computed a block of rows at a time, each block this
#: many bytes (``_attention_blocks``). 4 MB, not the 1 MB first chosen: each block is two
#: products, a softmax and (bf16) a rounding, each a call with its own fork-join, and on
#: the 2-core Zen 4 Whisper's encoder (1500 frames) ran 0.88x the time with 4 MB blocks at
#: float32 and 0.95x under bf16 (2 MB: 0.91x, 0.96x; 8 MB: slower again; A/B in one
#: process, BENCHMARKS.md "Attention blocks of 4 MB").
ATTENTION_BLOCKED_BYTES, ATTENTION_BLOCK_BYTES = 16 << 20, 4 << 20


def _attention_native(node: Node, q: Any, k: Any, v: Any, mask: Any, out: np.ndarray,
                      ctx: BuildContext) -> list[Step] | None:
    """float32 attention with the native softmax: scores (Lq, Lk) per head, the scale
    applied inside the softmax's pass (or before the mask, when there is one). Under a
    reduced precision the products take its operands, block by block, where this host
    takes it (``onednn_attention``)."""
    batch, lq, lk = _scores_batch(q, k, mask), q.shape[-2], k.shape[-2]
    blocked = None
    if getattr(ctx, "precision", "fp32") != "fp32":
        blocked = _attention_blocks(node, q, k, v, mask, out, ctx, rounded=True)
    if blocked is None and math.prod(batch) * lq * lk * 4 > ATTENTION_BLOCKED_BYTES:
        blocked = _attention_blocks(node, q, k, v, mask, out, ctx)
    if blocked is not None:
        return blocked
    st = ctx.scratch((*batch, lq, lk), np.float32)
    return _attention_chain(node, matmul_step(q, k.swapaxes(-1, -2), st), mask, st, [matmul_step(st, v, out)], ctx)


def _scores_batch(q: Any, k: Any, mask: Any) -> tuple[int, ...]:
    """The batch dims of attention's scores: those of q, k and the mask broadcast. Not
    the output's: batch dims only v has (heads of v over shared q and k) broadcast in the
    product with v. A product writing scores over v's batch dims, which its own operands
    lack, filled the first of them only (the conformance kit found it: q (1, 1, 1, 1), k
    (2, 1), v (2, 1, 2, 1))."""
    shapes = [tuple(q.shape[:-2]), tuple(k.shape[:-2])]
    if mask is not None and mask.ndim > 2:
        shapes.append(tuple(mask.shape[:-2]))
    return tuple(np.broadcast_shapes(*shapes))


def _attention_blocks(node: Node, q: Any, k: Any, v: Any, mask: Any, out: np.ndarray,
                      ctx: BuildContext, rounded: bool = False) -> list[Step] | None:
    """The attention of long sequences a block of heads and rows at a time, each block's
    scores (about ``ATTENTION_BLOCK_BYTES``) staying in cache from their product through the
    softmax to the product with ``v``, instead of every head's whole (Lq, Lk) scores
    written, read and written again through memory: a Whisper-style encoder's 1500
    frames, 48 heads of batch 8, 219 -> 156 ms a layer's attention on the 2-core Xeon.
    None (the caller computes whole scores) where an operand is not one contiguous plan
    array or the mask differs between heads, or where ``rounded`` (bf16 products:
    ``onednn_attention``) and this host does not take them."""
    arrays = (q, k, v, out) if mask is None else (q, k, v, out, mask)
    if not all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays):
        return None
    if mask is not None and (mask.ndim > 2 and math.prod(mask.shape[:-2]) != 1):
        return None
    lq, lk = q.shape[-2], k.shape[-2]
    q3, k3, v3, o3 = (a.reshape(-1, *a.shape[-2:]) for a in (q, k, v, out))
    if not (q3.shape[0] == k3.shape[0] == v3.shape[0] == o3.shape[0]):
        return None  # heads broadcast between the operands
    heads = q3.shape[0]
    bf16 = onednn_attention.products(q3, k3, v3, ctx) if rounded else None
    if rounded and bf16 is None:
        return None
    m2 = None if mask is None else mask.reshape(mask.shape[-2:]) if mask.ndim >= 2 else mask.reshape(1, -1)
    rows = min(lq, max(32, ATTENTION_BLOCK_BYTES // (lk * 4)))
    group = max(1, ATTENTION_BLOCK_BYTES // (rows * lk * 4))
    block = ctx.scratch((min(group, heads), rows, lk), np.float32)
    steps: list[Step] = [] if bf16 is None else list(bf16.setup)
    for h0 in range(0, heads, group):
        hs = slice(h0, min(heads, h0 + group))
        for r0 in range(0, lq, rows):
            rs = slice(r0, min(lq, r0 + rows))
            part = None if m2 is None else m2 if m2.shape[0] == 1 else m2[rs]
            n = (hs.stop - hs.start) * (rs.stop - rs.start) * lk
            scores = block.reshape(-1)[:n].reshape(hs.stop - hs.start, rs.stop - rs.start, lk)  # contiguous
            try:
                if bf16 is None:
                    chain = _attention_chain(node, matmul_step(q3[hs, rs], k3[hs].swapaxes(-1, -2), scores), part,
                                             scores, [matmul_step(scores, v3[hs], o3[hs, rs])], ctx)
                else:  # the softmax writes the weights rounded to bf16 for the product with v
                    p16 = bf16.weights16(scores)
                    chain = _attention_chain(node, bf16.scores(hs, rs, scores), part, scores,
                                             [bf16.weighted(hs, p16, o3[hs, rs])], ctx, out16=p16)
            except onednn.DnnlError:  # oneDNN declined a product, or runs it where bf16 does not pay
                return None
            if chain is None:
                return None
            steps += chain
    if bf16 is not None:
        bf16.taken()
    return steps


def _attention_chain(node: Node, first: Step, mask: Any, st: Any, last: list[Step],
                     ctx: BuildContext, out16: np.ndarray | None = None) -> list[Step] | None:
    """``out = softmax(st * scale + mask)`` then ``last`` (the product with ``v`` into
    ``out``), the scores ``st`` written by ``first`` (``q k^T``); attention ``node``'s
    scale, and its rows masked everywhere as zeros where it says ``nan_to_zero``. With
    ``out16`` the softmax writes its weights there, rounded to bf16, for ``last``."""
    scale = node.attrs["scale"]
    steps = [first]
    if mask is not None:
        if scale != 1.0:
            steps.append(Step(np.multiply, (st, const(scale, np.float32), st)))
            scale = 1.0
        if mask.dtype == np.bool_:
            masked = ctx.scratch(np.broadcast_shapes(tuple(mask.shape), st.shape[-2:]), np.bool_)
            steps += [Step(np.logical_not, (mask, masked)),
                      Step(np.copyto, (st, const(-np.inf, np.float32)), {"where": masked})]
        else:
            steps.append(Step(np.add, (st, mask, st)))
    guard = bool(node.attrs.get("nan_to_zero"))
    soft = softmax_step(st, st, scale, guard) if out16 is None else softmax_bf16_step(st, out16, scale, guard)
    if soft is None:
        return None
    return [*steps, soft, *last]
