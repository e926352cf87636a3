"""The ``Attention`` converter (opsets 23-25): scaled dot-product attention as ONNX
defines it, decomposed into matmuls, a softmax and masks.

Q, K, V are (batch, heads, seq, head_size), or (batch, seq, hidden) with
``q_num_heads``/``kv_num_heads``; grouped-query attention repeats each key/value head
(a ``gather`` over the heads); ``past_key``/``past_value`` are concatenated in front
(and are the ``present`` outputs). The attention bias is the sum of the ``attn_mask``
(a bool mask as 0 / -inf, shorter masks padded as masked) and of the structural masks —
bottom-right causal (offset: the past length, or ``nonpad_kv_seqlen - q_len`` per batch),
sliding windows, the ``nonpad_kv_seqlen`` padding — which depend on shapes only (and on
``nonpad_kv_seqlen``, which must then be known at import) and are one constant. Scores
are ``Q K^T * scale``, soft-capped when ``softcap > 0``, plus the bias; the softmax runs
in ``softmax_precision``; a query row with no key left gives a zero row, as the spec
says. The core's ``fuse_attention`` pass turns the plain form back into one
``attention`` op for backends that have one.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import FLOAT_DTYPES
from ._context import NodeContext, converter
from ._shapes import Emitter, Operand, frozen

__all__: list[str] = []

_PRECISIONS = {1: "float32", 10: "float16", 11: "float64"}  # ONNX TensorProto codes


def _heads(f: Emitter, x: Operand, heads: int) -> Operand:
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    b, s, hidden = f.shape(x)
    return f.op("transpose", f.op("reshape", x, shape=(b, s, heads, hidden // heads)), perm=(0, 2, 1, 3))


def _structural(q_len: int, kv_len: int, causal: bool, left: int, right: int,
                offset: np.ndarray, nonpad: np.ndarray | None) -> np.ndarray | None:
    """The allowed (batch or 1, 1, q, kv) positions of the causal, window and padding
    masks, or None when nothing is masked structurally."""
    if not causal and left < 0 and right < 0 and nonpad is None:
        return None
    i = np.arange(q_len).reshape(1, 1, q_len, 1)
    j = np.arange(kv_len).reshape(1, 1, 1, kv_len)
    pos = i + offset.reshape(-1, 1, 1, 1)  # each query's absolute position
    allowed = np.ones((offset.size, 1, q_len, kv_len), dtype=bool)
    if causal:
        allowed &= j <= pos
    if left >= 0:
        allowed &= pos - j <= left
    if right >= 0:
        allowed &= j - pos <= right
    if nonpad is not None:
        allowed &= j < nonpad.reshape(-1, 1, 1, 1)
    return allowed


@converter("Attention")
def _attention(c: NodeContext) -> list[Operand | None]:
    """ONNX ``Attention`` (opset 23+) as the IR's ops: the inputs checked and brought to
    (batch, heads, seq, head) with any past keys and values prepended, shared key/value
    heads repeated, the scaled (and soft-capped) scores, their bias (the structural masks
    as a constant plus the ``attn_mask``), the softmax at the asked precision, and the
    present keys/values and the debug output when used."""
    f = c.f
    q, k, v, past_k, rank = _attention_inputs(c)
    present_k, present_v = k, v
    dtype = f.dtype(q)
    q_len, head = f.shape(q)[2], f.shape(q)[3]
    kv_len = f.shape(k)[2]
    k, v = _shared_heads(c, q, k, v)
    scale = c.attr("scale")
    scale = 1.0 / math.sqrt(head) if scale is None else float(scale)
    scores = f.op("mul", f.op("matmul", q, f.op("transpose", k, perm=(0, 1, 3, 2))), f.const(scale, dtype))
    softcap = float(c.attr("softcap", 0.0) or 0.0)
    if softcap > 0:
        cap = f.const(softcap, dtype)
        scores = f.op("mul", f.op("tanh", f.op("div", scores, cap)), cap)
    capped = scores
    bias, allowed, runtime_masked = _attention_bias(c, dtype, q_len, kv_len, past_k)
    with_bias = scores if bias is None else f.op("add", scores, bias)
    probs = _attention_probs(c, with_bias, dtype, bias, allowed, runtime_masked)
    y = f.op("matmul", probs, v)
    if rank == 3:
        b, h, s, d = f.shape(y)
        y = f.op("reshape", f.op("transpose", y, perm=(0, 2, 1, 3)), shape=(b, s, h * d))
    outs: list[Operand | None] = [f.op("reshape", y, shape=f.shape(y), name=c.out(0))]
    outs += [f.op("reshape", t, shape=f.shape(t), name=c.out(i)) if c.used(i) else None
             for i, t in ((1, present_k), (2, present_v))]
    if c.used(3):
        mode = int(c.attr("qk_matmul_output_mode", 0))
        debug = {0: capped, 1: capped, 2: with_bias, 3: probs}.get(mode)
        if debug is None:
            raise c.fail(f"qk_matmul_output_mode {mode} is not one of 0-3")
        outs.append(f.op("reshape", debug, shape=f.shape(debug), name=c.out(3)))
    return outs


def _attention_inputs(c: NodeContext) -> tuple[Operand, Operand, Operand, Operand | None, int]:
    """Q, K, V checked and as (batch, heads, seq, head), K and V after any past ones; the
    past key (its length offsets the causal mask) and the inputs' rank (3 or 4)."""
    f = c.f
    q, k, v = c.input(0, "Q"), c.input(1, "K"), c.input(2, "V")
    past_k, past_v = c.optional(4), c.optional(5)
    dtype = f.dtype(q)
    if "bfloat16" in (dtype, f.dtype(k), f.dtype(v)):
        # Not computed in float32 and rounded once, as other converters read bfloat16: the spec's
        # function body computes in T, and ONNX's reference (numpy over bfloat16) rounds every
        # step to bfloat16: the scaled Q and K, the scores, the biased scores, each exp and each
        # partial sum of the softmax, the probabilities. One rounding at the end differs from it
        # in 22-39% of the outputs of ONNX's bf16 node tests (by one bfloat16 ulp), which
        # compare bfloat16 exactly; matching them means copying numpy's summation order.
        raise c.fail("bfloat16 Q, K and V are not supported: ONNX computes Attention in bfloat16 step by step, "
                     "which float32 rounded once does not reproduce; cast them to float32 (or float16) first")
    if dtype not in FLOAT_DTYPES or f.dtype(k) != dtype or f.dtype(v) != dtype:
        raise c.fail(f"Q, K and V must share a float dtype, got {f.dtype(q)}, {f.dtype(k)}, {f.dtype(v)}")
    rank = len(f.shape(q))
    if rank not in (3, 4) or len(f.shape(k)) != rank or len(f.shape(v)) != rank:
        raise c.fail(f"Q, K and V must all be 3-D or all 4-D, got {f.shape(q)}, {f.shape(k)}, {f.shape(v)}")
    q_heads, kv_heads = c.attr("q_num_heads"), c.attr("kv_num_heads")
    if rank == 3:
        if q_heads is None or kv_heads is None:
            raise c.fail("3-D inputs need q_num_heads and kv_num_heads")
        q, k, v = _heads(f, q, int(q_heads)), _heads(f, k, int(kv_heads)), _heads(f, v, int(kv_heads))
    elif (q_heads is not None or kv_heads is not None) and c.opset >= 25:
        raise c.fail("q_num_heads and kv_num_heads must not be given with 4-D inputs")
    if (past_k is None) != (past_v is None):
        raise c.fail("past_key and past_value must be given together")
    if c.optional(6) is not None and past_k is not None:
        raise c.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    if past_k is not None:
        k = f.op("concat", past_k, k, axis=2)
        v = f.op("concat", past_v, v, axis=2)  # type: ignore[arg-type]
    return q, k, v, past_k, rank


def _shared_heads(c: NodeContext, q: Operand, k: Operand, v: Operand) -> tuple[Operand, Operand]:
    """K and V with each of their heads repeated for the query heads that share it
    (grouped-query attention: h0, h0, h1, h1, ...), or as they are."""
    f = c.f
    hq, hk = f.shape(q)[1], f.shape(k)[1]
    if hq == hk:
        return k, v
    if hq % hk or f.shape(v)[1] != hk:
        raise c.fail(f"{hq} query heads cannot share {hk} key/value heads")
    repeat = frozen(np.repeat(np.arange(hk, dtype=np.int64), hq // hk))
    return f.op("gather", k, repeat, axis=1), f.op("gather", v, repeat, axis=1)


def _attention_bias(c: NodeContext, dtype: str, q_len: int, kv_len: int, past_k: Operand | None
                    ) -> tuple[Operand | None, np.ndarray | None, bool]:
    """The scores' bias: the structural masks (causal, windows, non-padded lengths) as a
    constant, plus the ``attn_mask`` (a boolean one as 0 / -inf, padded with -inf over the
    keys it does not cover); the structural ``allowed`` table; whether a run-time mask is in."""
    f = c.f
    nonpad = c.static(6, "nonpad_kv_seqlen") if c.optional(6) is not None else None
    past_len = f.shape(past_k)[2] if past_k is not None else 0
    offset = (nonpad.reshape(-1).astype(np.int64) - q_len) if nonpad is not None else np.array([past_len])
    allowed = _structural(q_len, kv_len, bool(c.attr("is_causal", 0)), int(c.attr("left_window_size", -1)),
                          int(c.attr("right_window_size", -1)), offset, nonpad)
    bias: Operand | None = None
    if allowed is not None:
        bias = frozen(np.where(allowed, 0.0, -np.inf).astype(dtype))
    m = c.optional(3)
    if m is None:
        return bias, allowed, False
    short = kv_len - f.shape(m)[-1]
    if short < 0:
        raise c.fail(f"attn_mask covers {f.shape(m)[-1]} keys, more than the {kv_len} there are")
    if short:  # the keys past the mask are masked
        pad_shape = (*f.shape(m)[:-1], short)
        fill = np.zeros(pad_shape, bool) if f.dtype(m) == "bool" else np.full(pad_shape, -np.inf, dtype)
        m = f.op("concat", m, frozen(fill.astype(f.dtype(m))), axis=-1)
    if f.dtype(m) == "bool":
        m = f.op("where", m, f.const(0.0, dtype), f.const(-np.inf, dtype))
    elif f.dtype(m) != dtype:
        raise c.fail(f"a float attn_mask must have Q's dtype {dtype}, got {f.dtype(m)}")
    return (m if bias is None else f.op("add", bias, m)), allowed, True


def _attention_probs(c: NodeContext, with_bias: Operand, dtype: str, bias: Operand | None,
                     allowed: np.ndarray | None, runtime_masked: bool) -> Operand:
    """The softmax of the biased scores at ``softmax_precision``; a query with every key
    masked attends nothing (a zero row, where the softmax gives NaN)."""
    f = c.f
    precision = _PRECISIONS.get(int(c.attr("softmax_precision", 0) or 0), dtype)
    logits = with_bias if precision == dtype else f.op("cast", with_bias, dtype=precision)
    probs = f.op("softmax", logits, axis=-1)
    if precision != dtype:
        probs = f.op("cast", probs, dtype=dtype)
    zero = f.const(0.0, dtype)
    if runtime_masked:
        assert bias is not None
        last = len(f.shape(bias)) - 1
        empty = f.op("equal", f.op("reduce_max", bias, axes=(last,), keepdims=True), f.const(-np.inf, dtype))
        probs = f.op("where", empty, zero, probs)
    elif allowed is not None and not np.all(allowed.any(axis=-1)):
        probs = f.op("where", frozen(~allowed.any(axis=-1, keepdims=True)), zero, probs)
    return probs


@converter("RotaryEmbedding")
def _rotary_embedding(c: NodeContext) -> list[Operand | None]:
    """RotaryEmbedding (opset 23): the first ``rotary_embedding_dim`` channels of each head
    rotated by the cached angles of each position: ``x1 cos - x2 sin`` and
    ``x1 sin + x2 cos``, where (x1, x2) are the two halves of those channels or, with
    ``interleaved``, their even and odd ones. X is (batch, heads, seq, size), or (batch,
    seq, hidden) with ``num_heads``; the caches are (batch, seq, dim/2), or (positions,
    dim/2) read at ``position_ids`` (a ``gather``). Everything runs as (batch, seq,
    heads, size): slices, products, a concat."""
    f, x = c.f, c.input(0)
    cos, sin, positions = c.input(1, "cos_cache"), c.input(2, "sin_cache"), c.optional(3)
    shape, dtype = f.shape(x), f.dtype(x)
    if dtype not in FLOAT_DTYPES or f.dtype(cos) != dtype or f.dtype(sin) != dtype:
        raise c.fail(f"needs float X and caches of its dtype, got {dtype}, {f.dtype(cos)}, {f.dtype(sin)}")
    if len(shape) == 4:
        b, _, s, _ = shape
        y = f.op("transpose", x, perm=(0, 2, 1, 3))
    elif len(shape) == 3:
        heads = int(c.attr("num_heads", 0))
        b, s, hidden = shape
        if heads < 1 or hidden % heads:
            raise c.fail(f"a 3-D input needs num_heads dividing its {hidden} channels, got {heads}")
        y = f.op("reshape", x, shape=(b, s, heads, hidden // heads))
    else:
        raise c.fail(f"needs a 3-D or 4-D input, got shape {shape}")
    h, size = f.shape(y)[2], f.shape(y)[3]
    dim = int(c.attr("rotary_embedding_dim", 0)) or size
    if dim > size or dim % 2:
        raise c.fail(f"rotary_embedding_dim {dim} must be even and at most the head size {size}")
    half = dim // 2
    if positions is not None:
        cos, sin = (f.op("gather", t, positions, axis=0) for t in (cos, sin))
    for what, t in (("cos_cache", cos), ("sin_cache", sin)):
        if f.shape(t) != (b, s, half):
            raise c.fail(f"{what} must give ({b}, {s}, {half}) values (batch, sequence, dim/2), got {f.shape(t)}")
    cos, sin = (f.op("reshape", t, shape=(b, s, 1, half)) for t in (cos, sin))
    rot = f.op("slice", y, starts=(0,), ends=(dim,), axes=(3,)) if dim < size else y
    if int(c.attr("interleaved", 0)):
        pairs = f.op("reshape", rot, shape=(b, s, h, half, 2))
        x1, x2 = (f.op("reshape", f.op("slice", pairs, starts=(k,), ends=(k + 1,), axes=(4,)), shape=(b, s, h, half))
                  for k in (0, 1))
    else:
        x1, x2 = (f.op("slice", rot, starts=(k * half,), ends=((k + 1) * half,), axes=(3,)) for k in (0, 1))
    real = f.op("sub", f.op("mul", cos, x1), f.op("mul", sin, x2))
    imag = f.op("add", f.op("mul", sin, x1), f.op("mul", cos, x2))
    if int(c.attr("interleaved", 0)):
        parts = [f.op("reshape", t, shape=(b, s, h, half, 1)) for t in (real, imag)]
        rot = f.op("reshape", f.op("concat", *parts, axis=4), shape=(b, s, h, dim))
    else:
        rot = f.op("concat", real, imag, axis=3)
    if dim < size:
        rot = f.op("concat", rot, f.op("slice", y, starts=(dim,), ends=(size,), axes=(3,)), axis=3)
    if len(shape) == 3:
        return [f.op("reshape", rot, shape=shape, name=c.out())]
    return [f.op("transpose", rot, perm=(0, 2, 1, 3), name=c.out())]
