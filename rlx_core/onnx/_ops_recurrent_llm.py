"""Converters of three ops that LLM exports carry for their caches and recurrent layers:
TensorScatter (opset 24), LinearAttention and CausalConvWithState (opset 27).

The IR has no scatter, no loop and no 1-D depthwise convolution, and each backend (cpu,
jax, opencl) runs the plain ops, so each is decomposed into those:

- TensorScatter writes ``update`` into ``past_cache`` at each batch entry's
  ``write_indices`` along ``axis`` (``linear``, or ``circular``: modulo the cache
  length). The indices are known only at run time, so it is a gather built from them:
  for every cache position ``p`` of batch entry ``b`` the update row ``s = p - w[b]``
  (``mod max_sequence_length`` when circular) is gathered from the flattened update, and
  a ``where`` keeps the past value where ``s`` is outside ``[0, sequence_length)``. It is
  a move, never arithmetic on the values, so every dtype (ints, bools) is exact and a
  NaN in the update stays where it lands. Without ``write_indices`` (the prefill) it is
  a ``concat`` of the update and the rest of the cache. Linear-mode indices with
  ``w + sequence_length > max_sequence_length`` or ``w < 0`` are outside the spec (its
  reference raises or wraps); positions they would reach outside the cache are not written.
- LinearAttention is a recurrence over the sequence (``S_t`` from ``S_{t-1}``), which
  the spec allows computing chunk-parallel but defines step by step. The sequence length
  is known at import, so it is unrolled like the RNN converters (``_ops_rnn.py``): per
  step one ``gather`` of the step from each input, ``exp`` (gated), a ``matmul`` for the
  retrieval (delta), an outer product as a broadcast ``mul``, and one ``matmul`` of the
  query heads against the state, the query heads grouped (``reshape``) so that each
  key/value head's state serves its ``q_num_heads / kv_num_heads`` query heads without
  being repeated. It computes in float32 (as the reference does) and casts back. The
  unrolled length is capped (``MAX_STEPS``), refused by name beyond it; ``chunk_size``
  is a tuning hint of the chunk-parallel form and changes nothing here.
- CausalConvWithState left-pads the input with the carried state (or zeros) and sums the
  ``k`` shifted ``slice``s of it, each times its column of the depthwise weight, then adds
  the bias and applies SiLU (``x * sigmoid(x)``); ``present_state`` is the padded input's
  last ``k - 1`` positions. Slices rather than a gathered (B, C, L, k) window tensor keep
  the memory at the input's size for a long prefill; ``k`` is capped (``MAX_KERNEL``).
  It computes float16/bfloat16 in float32, rounding the convolution to the input dtype
  before the activation as the reference does.

Shapes must be known at import (the unrolled length, the flattened gather table); a
symbolic load meeting a symbolic dim falls back to converting at each size
(``NotSymbolic``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..ir.symbolic import Sym
from ._context import NodeContext, converter
from ._shapes import Emitter, Operand, frozen
from ._symdims import NotSymbolic

__all__ = ["MAX_KERNEL", "MAX_STEPS"]

#: The longest sequence LinearAttention unrolls (each step is about a dozen ops).
MAX_STEPS = 4096
#: The widest CausalConvWithState kernel (one slice, mul and add per tap).
MAX_KERNEL = 1024

_HALF = ("float16", "bfloat16")
_LINEAR_ATTENTION_RULES = ("linear", "gated", "delta", "gated_delta")


def _static_shape(c: NodeContext, x: Operand, what: str) -> tuple[int, ...]:
    """``x``'s shape as ints: the decompositions size their tables and unrolled steps by
    it, so a symbolic dim is ``NotSymbolic`` (the symbolic load converts at each size)."""
    shape = c.f.shape(x)
    if any(isinstance(d, Sym) for d in shape):
        raise NotSymbolic(f"{c.op_type}'s {what} has shape {shape}, which depends on the sizes")
    return tuple(int(d) for d in shape)


def _named(f: Emitter, x: Operand, name: str) -> Operand:
    """``x`` as the node output ``name`` (an identity reshape carries the ONNX name)."""
    return f.op("reshape", x, shape=f.shape(x), name=name)


def _in_float32(f: Emitter, x: Operand) -> Operand:
    """``x`` in float32: half-precision inputs are computed in float32, as the references do."""
    return x if f.dtype(x) == "float32" else f.op("cast", x, dtype="float32")


def _as(f: Emitter, x: Operand, dtype: str) -> Operand:
    """``x`` cast to ``dtype``, or as it is when it has it (no identity cast in the graph)."""
    return x if f.dtype(x) == dtype else f.op("cast", x, dtype=dtype)


# ---------------------------------------------------------------------------- TensorScatter
@converter("TensorScatter")
def _tensor_scatter(c: NodeContext) -> list[Operand | None]:
    """``past_cache`` with ``update`` written at each batch entry's write index along
    ``axis``; see the module docstring."""
    f = c.f
    past, update = c.input(0, "past_cache"), c.input(1, "update")
    shape, ushape = _static_shape(c, past, "past_cache"), _static_shape(c, update, "update")
    dtype = f.dtype(past)
    if f.dtype(update) != dtype:
        raise c.fail(f"past_cache and update must share a dtype, got {dtype} and {f.dtype(update)}")
    rank = len(shape)
    axis = int(c.attr("axis", -2))
    if not -rank <= axis < rank or axis % max(rank, 1) == 0:
        raise c.fail(f"axis {axis} must name a sequence axis other than the batch axis 0 of rank-{rank} caches")
    axis %= rank
    if len(ushape) != rank or any(u != p for i, (u, p) in enumerate(zip(ushape, shape)) if i != axis) \
            or ushape[axis] > shape[axis]:
        raise c.fail(f"update {ushape} must match past_cache {shape} except along axis {axis}, where it may be "
                     "no longer")
    mode = str(c.attr("mode", "linear"))
    if mode not in ("linear", "circular"):
        raise c.fail(f"mode {mode!r} is not 'linear' or 'circular'")
    seq, length = ushape[axis], shape[axis]
    indices = c.optional(2)
    if seq == 0:
        return [_named(f, past, c.out())]
    if indices is None:  # every entry writes at 0: the update, then the cache's rest
        if seq == length:
            return [_named(f, update, c.out())]
        rest = f.op("slice", past, starts=[seq], ends=[length], axes=[axis])
        return [f.op("concat", update, rest, axis=axis, name=c.out())]
    batch = shape[0]
    if _static_shape(c, indices, "write_indices") != (batch,) or np.dtype(f.dtype(indices)).kind not in "iu":
        raise c.fail(f"write_indices must be {batch} integers (one per batch entry), got "
                     f"{f.dtype(indices)}{list(f.shape(indices))}")
    picked_rows, hit = _scatter_rows(f, _as(f, indices, "int64"), seq, length, mode)
    inner = math.prod(shape[1:axis])
    outer = math.prod(shape[axis + 1:])
    # (batch, inner, length) rows of the flattened (batch * inner * seq, outer) update.
    base = np.arange(batch * inner, dtype=np.int64).reshape(batch, inner, 1) * seq
    flat_rows = f.op("add", frozen(base), f.op("reshape", picked_rows, shape=(batch, 1, length)))
    flat_update = f.op("reshape", update, shape=(batch * inner * seq, outer))
    written = f.op("gather", flat_update, flat_rows, axis=0)  # (batch, inner, length, outer)
    kept = f.op("reshape", past, shape=(batch, inner, length, outer))
    out = f.op("where", f.op("reshape", hit, shape=(batch, 1, length, 1)), written, kept)
    return [f.op("reshape", out, shape=shape, name=c.out())]


def _scatter_rows(f: Emitter, indices: Operand, seq: int, length: int, mode: str) -> tuple[Operand, Operand]:
    """For each (batch entry, cache position): the update row that lands there, clamped
    into ``[0, seq)``, and whether one does (bool), both (batch, length). Position ``p``
    of entry ``b`` takes row ``p - w[b]`` (``mod length`` when circular): no scatter, a
    table the gather reads."""
    zero = f.const(0, "int64")
    offset = f.op("sub", frozen(np.arange(length, dtype=np.int64).reshape(1, length)),
                  f.op("reshape", indices, shape=(f.shape(indices)[0], 1)))
    if mode == "circular":  # a floored modulo from the truncating division (not every backend has fmod)
        size = f.const(length, "int64")
        rem = f.op("sub", offset, f.op("mul", f.op("div", offset, size), size))
        offset = f.op("where", f.op("less", rem, zero), f.op("add", rem, size), rem)
    row = f.op("minimum", f.op("maximum", offset, zero), f.const(seq - 1, "int64"))
    return row, f.op("equal", row, offset)


# ---------------------------------------------------------------------------- LinearAttention
class _Heads:
    """LinearAttention's sizes and settings, read and checked."""

    def __init__(self, c: NodeContext) -> None:
        f = c.f
        self.q, self.k, self.v = c.input(0, "query"), c.input(1, "key"), c.input(2, "value")
        self.dtype = f.dtype(self.q)
        for name, x in (("query", self.q), ("key", self.k), ("value", self.v)):
            if f.dtype(x) not in ("float32", *_HALF):
                raise c.fail(f"{name} must be float32, float16 or bfloat16, got {f.dtype(x)}")
        qs, ks, vs = (_static_shape(c, x, n) for x, n in ((self.q, "query"), (self.k, "key"), (self.v, "value")))
        if len(qs) != 3 or len(ks) != 3 or len(vs) != 3:
            raise c.fail(f"query, key and value must be 3-D (batch, seq, heads * size), got {qs}, {ks}, {vs}")
        hq, hkv = c.attr("q_num_heads"), c.attr("kv_num_heads")
        if hq is None or hkv is None:
            raise c.fail("q_num_heads and kv_num_heads are required")
        self.hq, self.hkv = int(hq), int(hkv)
        if self.hq <= 0 or self.hkv <= 0 or self.hq % self.hkv:
            raise c.fail(f"q_num_heads ({self.hq}) must be a positive multiple of kv_num_heads ({self.hkv})")
        self.batch, self.steps = qs[0], qs[1]
        if qs[2] % self.hq or vs[2] % self.hkv:
            raise c.fail(f"query's last dim {qs[2]} must divide into {self.hq} heads and value's {vs[2]} into "
                         f"{self.hkv}")
        self.dk, self.dv = qs[2] // self.hq, vs[2] // self.hkv
        if ks != (self.batch, self.steps, self.hkv * self.dk) or vs[:2] != (self.batch, self.steps):
            raise c.fail(f"key {ks} and value {vs} do not fit query {qs} with {self.hq} query and {self.hkv} "
                         f"key/value heads of size {self.dk}")
        if self.steps > MAX_STEPS:
            raise c.fail(f"a sequence of {self.steps} steps is unrolled one op chain per step, more than the "
                         f"{MAX_STEPS} supported")
        scale = float(c.attr("scale", 0.0) or 0.0)
        self.scale = scale if scale != 0.0 else 1.0 / math.sqrt(self.dk)
        rule = str(c.attr("update_rule", "gated_delta"))
        if rule not in _LINEAR_ATTENTION_RULES:
            raise c.fail(f"update_rule {rule!r} is not one of {', '.join(_LINEAR_ATTENTION_RULES)}")
        self.gated, self.delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
        self.decay, self.beta = c.optional(4), c.optional(5)
        for name, x, needed in (("decay", self.decay, self.gated), ("beta", self.beta, self.delta)):
            if needed and x is None:
                raise c.fail(f"update_rule {rule!r} needs the {name} input")
            if not needed and x is not None:
                raise c.fail(f"update_rule {rule!r} takes no {name} input")
        self.decay_width = self._last(c, self.decay, "decay", (self.hkv, self.hkv * self.dk))
        self.beta_width = self._last(c, self.beta, "beta", (self.hkv, 1))
        self.past = c.optional(3)
        self.state_dtype = self.dtype
        if self.past is not None:
            want = (self.batch, self.hkv, self.dk, self.dv)
            if _static_shape(c, self.past, "past_state") != want or f.dtype(self.past) not in ("float32", *_HALF):
                raise c.fail(f"past_state must be a float {want}, got {f.dtype(self.past)}{list(f.shape(self.past))}")
            self.state_dtype = f.dtype(self.past)

    def _last(self, c: NodeContext, x: Operand | None, name: str, widths: Sequence[int]) -> int:
        """The last dim of ``decay`` or ``beta`` (batch, seq, width), checked against ``widths``."""
        if x is None:
            return 0
        shape = _static_shape(c, x, name)
        if len(shape) != 3 or shape[:2] != (self.batch, self.steps) or shape[2] not in widths \
                or c.f.dtype(x) not in ("float32", *_HALF):
            raise c.fail(f"{name} must be float ({self.batch}, {self.steps}, one of {sorted(set(widths))}), got "
                         f"{c.f.dtype(x)}{list(shape)}")
        return shape[2]


def _step_of(f: Emitter, x: Operand, t: int) -> Operand:
    """Step ``t`` of a (batch, seq, ...) operand, the seq axis dropped (a 0-d gather)."""
    return f.op("gather", x, frozen(np.asarray(t, dtype=np.int64)), axis=1)


@converter("LinearAttention")
def _linear_attention(c: NodeContext) -> list[Operand | None]:
    """The recurrence ``S_t = exp(g_t) S_{t-1} + k_t (x) v'_t``, ``o_t = scale q_t S_t``
    (``v'_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)`` with the delta rule), unrolled; see
    the module docstring."""
    f, h = c.f, _Heads(c)
    b, hkv, group, dk, dv = h.batch, h.hkv, h.hq // h.hkv, h.dk, h.dv
    # Each input once as float32 (batch, seq, heads, ...), so that one gather takes a step.
    q = f.op("reshape", _in_float32(f, h.q), shape=(b, h.steps, hkv, group, dk))
    k_col = f.op("reshape", _in_float32(f, h.k), shape=(b, h.steps, hkv, dk, 1))
    k_row = f.op("reshape", k_col, shape=(b, h.steps, hkv, 1, dk))
    v = f.op("reshape", _in_float32(f, h.v), shape=(b, h.steps, hkv, 1, dv))
    decay = None if h.decay is None else f.op(
        "reshape", f.op("exp", _in_float32(f, h.decay)), shape=(b, h.steps, hkv, h.decay_width // hkv, 1))
    beta = None if h.beta is None else f.op(
        "reshape", _in_float32(f, h.beta), shape=(b, h.steps, h.beta_width, 1, 1))
    state: Operand = (frozen(np.zeros((b, hkv, dk, dv), dtype=np.float32)) if h.past is None
                      else _in_float32(f, h.past))
    outs: list[Operand] = []
    for t in range(h.steps):
        if decay is not None:
            state = f.op("mul", state, _step_of(f, decay, t))
        v_t = _step_of(f, v, t)  # (b, hkv, 1, dv)
        if beta is not None:
            retrieved = f.op("matmul", _step_of(f, k_row, t), state)
            v_t = f.op("mul", _step_of(f, beta, t), f.op("sub", v_t, retrieved))
        state = f.op("add", state, f.op("mul", _step_of(f, k_col, t), v_t))
        o_t = f.op("matmul", _step_of(f, q, t), state)  # (b, hkv, group, dv)
        outs.append(f.op("reshape", o_t, shape=(b, 1, h.hq * dv)))
    if not outs:  # an empty sequence: no output rows, the state passed on
        y: Operand = frozen(np.zeros((b, 0, h.hq * dv), dtype=h.dtype))
    else:
        y = outs[0] if len(outs) == 1 else f.op("concat", *outs, axis=1)
        y = _as(f, f.op("mul", y, f.const(h.scale, "float32")), h.dtype)
    results: list[Operand | None] = [_named(f, y, c.out(0))]
    results.append(_named(f, _as(f, state, h.state_dtype), c.out(1)) if c.used(1) else None)
    return results


# ---------------------------------------------------------------------------- CausalConvWithState
@converter("CausalConvWithState")
def _causal_conv_with_state(c: NodeContext) -> list[Operand | None]:
    """A causal depthwise 1-D convolution over the input left-padded with the carried
    state: ``k`` shifted slices times the weight's columns, plus the bias, SiLU when
    asked; ``present_state`` the last ``k - 1`` padded positions."""
    f = c.f
    x, w = c.input(0, "input"), c.input(1, "weight")
    dtype = f.dtype(x)
    if dtype not in ("float32", "float64", *_HALF) or f.dtype(w) != dtype:
        raise c.fail(f"input and weight must share a float dtype, got {dtype} and {f.dtype(w)}")
    xs, ws = _static_shape(c, x, "input"), _static_shape(c, w, "weight")
    if len(xs) != 3:
        raise c.fail(f"input must be 3-D (batch, channels, length), got shape {xs}")
    batch, channels, length = xs
    if len(ws) != 3 or ws[:2] != (channels, 1) or ws[2] < 1:
        raise c.fail(f"weight must be depthwise ({channels}, 1, k) with k >= 1, got shape {ws}")
    k = ws[2]
    if k > MAX_KERNEL:
        raise c.fail(f"kernel size {k} is summed one slice per tap, more than the {MAX_KERNEL} supported")
    activation = str(c.attr("activation", "none"))
    if activation not in ("none", "silu", "swish"):
        raise c.fail(f"activation {activation!r} is not 'none', 'silu' or 'swish'")
    bias, past = c.optional(2), c.optional(3)
    if bias is not None and (_static_shape(c, bias, "bias") != (channels,) or f.dtype(bias) != dtype):
        raise c.fail(f"bias must be {dtype}[{channels}], got {f.dtype(bias)}{list(f.shape(bias))}")
    if past is not None and (_static_shape(c, past, "past_state") != (batch, channels, k - 1)
                             or f.dtype(past) != dtype):
        raise c.fail(f"past_state must be {dtype}[{batch}, {channels}, {k - 1}], got "
                     f"{f.dtype(past)}{list(f.shape(past))}")
    work = "float64" if dtype == "float64" else "float32"
    f.check_size((batch, channels, length + k - 1), work, "CausalConvWithState's padded input")
    xw = _as(f, x, work)
    if k == 1:
        padded = xw
    else:
        pad = frozen(np.zeros((batch, channels, k - 1), dtype=work)) if past is None else _as(f, past, work)
        padded = f.op("concat", pad, xw, axis=2)
    taps = f.op("reshape", _as(f, w, work), shape=(channels, k))
    y: Operand | None = None
    for j in range(k):
        shifted = padded if k == 1 else f.op("slice", padded, starts=[j], ends=[j + length], axes=[2])
        column = f.op("reshape", f.op("slice", taps, starts=[j], ends=[j + 1], axes=[1]), shape=(1, channels, 1))
        term = f.op("mul", shifted, column)
        y = term if y is None else f.op("add", y, term)
    assert y is not None
    if bias is not None:
        y = f.op("add", y, f.op("reshape", _as(f, bias, work), shape=(1, channels, 1)))
    if activation != "none":
        y = _as(f, _as(f, y, dtype), work)  # the reference rounds the convolution first
        y = f.op("mul", y, f.op("sigmoid", y))
    results: list[Operand | None] = [_named(f, _as(f, y, dtype), c.out(0))]
    if not c.used(1):
        return [*results, None]
    if k == 1:
        state: Operand = frozen(np.zeros((batch, channels, 0), dtype=dtype))
    else:  # a move of the padded input (the float32 round trip of a half value is exact)
        state = _as(f, f.op("slice", padded, starts=[length], ends=[length + k - 1], axes=[2]), dtype)
    results.append(_named(f, state, c.out(1)))
    return results
