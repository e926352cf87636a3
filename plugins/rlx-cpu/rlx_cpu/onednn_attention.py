"""Attention's two products with bf16 operands on oneDNN, under ``precision="bf16"``.

Why: attention's products (``q k^T`` and the softmax's weights times ``v``) are most of a
transformer's time at long sequences: a Whisper-style encoder's 1500 frames spent 53 of
its 92 ms there at batch 1 once its dense layers ran in bf16 (2-core Zen 4 EPYC), the
products in float32. OpenVINO's default computes them in bf16 too. Here ``q``, ``k`` and
``v`` are rounded to bf16 once, each block of heads and rows (``attention_kernels.
_attention_blocks``) multiplies them on oneDNN's batched matmul into float32 scores, the
softmax runs in float32 as before and writes its weights rounded to bf16 in its last
pass (``native_nn.softmax_bf16_step``) for the product with ``v``, which writes float32
into the output. Each product is
held to the bf16 bound like any other (float32 accumulation); the softmax and the
mask are not rounded.

Taken only on AVX512-BF16 hosts where that unit pays (``bf16_units``) and oneDNN runs
both products on it, else the float32 chain runs. Not on AMX: the same rounding of both
operands per run before oneDNN's AMX product ran 0.97-1.00x float32's time on the AMX
Xeon of session 33, where rlx's float32 attention is fast enough that the rounding eats
the gain.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from . import bf16_units
from .onednn import (
    _ARG_DST,
    _ARG_SCRATCHPAD,
    _ARG_SRC,
    _ARG_WEIGHTS,
    _BF16,
    _F32,
    _QUERY_SCRATCHPAD_MD,
    Dnnl,
    _Arg,
    reduced,
)
from .onednn_steps import _addr, _jit_impl, _MatmulCall, _rounded
from .steps import Step

__all__ = ["Bf16Products", "MIN_MACS", "products"]

#: The multiply-adds of one product (heads x Lq x Lk x d) below which attention stays
#: float32: oneDNN's calls cost more than bf16 saves (4 heads of 7 x 9 x 16: 0.016 ms in
#: float32, 0.026 in bf16; 12 heads of 64 x 64 x 64: 1.27x float32's speed, of 128 x 128
#: x 64 1.6x, of 1500 x 1500 x 64: 1.7x; Zen 4 EPYC).
MIN_MACS = 1 << 20


def products(q: Any, k: Any, v: Any, ctx: Any) -> Bf16Products | None:
    """The bf16 products of an attention over the contiguous plan arrays ``q`` (heads,
    Lq, d), ``k`` (heads, Lk, d) and ``v`` (heads, Lk, dv), where the build's precision
    is bf16, this host takes it on AVX512-BF16 and the products are large enough
    (``MIN_MACS``); else None."""
    found = reduced(getattr(ctx, "precision", "fp32"))
    if found is None or found[1] != _BF16 or bf16_units.unit() != bf16_units.AVX512_BF16:
        return None
    if not all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 3 for a in (q, k, v)):
        return None
    if q.shape[0] * q.shape[1] * k.shape[1] * q.shape[2] < MIN_MACS:
        return None
    return Bf16Products(found[0], q, k, v, ctx)


class Bf16Products:
    """``q``, ``k``, ``v`` rounded to bf16 once a run (``setup``), and per block the
    product into float32 scores (``scores``) and the product of the weights the softmax
    rounded (``weights16``) with ``v`` into the output (``weighted``). Primitives are made once per block shape; a
    ``DnnlError`` from any (oneDNN declining, or a kernel that does not pay) makes the
    caller fall back to float32 for the whole attention."""

    def __init__(self, lib: Dnnl, q: np.ndarray, k: np.ndarray, v: np.ndarray, ctx: Any) -> None:
        self.lib, self.ctx = lib, ctx
        self._p16: np.ndarray | None = None  # the block's rounded weights (``weights16``)
        self.q16, self.k16, self.v16 = (ctx.scratch(a.shape, np.uint16) for a in (q, k, v))
        self._pds: dict[tuple[Any, ...], tuple[Any, Any]] = {}  # per shapes: (primitive, (scratchpad memory,))
        self._descs: list[Any] = []
        self._mems: list[Any] = []
        self._prims: list[Any] = []
        self._keep: list[Any] = [q, k, v, self.q16, self.k16, self.v16]
        self.setup = [self._call([self._reorder(a, b) for a, b in ((q, self.q16), (k, self.k16), (v, self.v16))])]
        weakref.finalize(self, lib.destroy, self._mems, self._prims, self._descs, ())

    # ---------------------------------------------------------------- descriptors
    def _md(self, a: np.ndarray, dtype: int) -> Any:
        md = self.lib.md_strided(tuple(a.shape), tuple(s // a.itemsize for s in a.strides), dtype)
        self._descs.append(md)
        return md

    def _mem(self, md: Any, a: np.ndarray) -> Any:
        mem = self.lib.memory(md, _addr(a))
        self._mems.append(mem)
        return mem

    def _reorder(self, src: np.ndarray, dst: np.ndarray) -> tuple[Any, Any, int]:
        """float32 ``src`` rounded into bf16 ``dst`` (same shape, contiguous)."""
        lib = self.lib
        a, b = self._md(src, _F32), self._md(dst, _BF16)
        prim = lib.reorder(a, b)
        self._prims.append(prim)
        return prim, (_Arg * 2)(_Arg(_ARG_SRC, self._mem(a, src)), _Arg(_ARG_DST, self._mem(b, dst))), 2

    def _matmul(self, src: np.ndarray, w: np.ndarray, dst: np.ndarray) -> tuple[Any, Any, int]:
        """``dst = src @ w``: bf16 operands (``np.uint16`` views at any strides), float32
        ``dst``; one primitive per distinct shape and strides."""
        lib = self.lib
        mds = (self._md(src, _BF16), self._md(w, _BF16), self._md(dst, _F32))
        key = tuple((a.shape, a.strides) for a in (src, w, dst))
        if key not in self._pds:
            pd = lib.matmul_pd(mds[0], mds[1], None, mds[2])
            try:
                _jit_impl(lib, pd, _BF16)
                pad_md = lib.query_md(pd, _QUERY_SCRATCHPAD_MD)
                pad = self.ctx.scratch((max(lib.size(pad_md) // 4 + 16, 1),), np.float32)
                prim = lib.primitive(pd)
            finally:
                lib.destroy(pds=(pd,))
            self._prims.append(prim)
            self._keep.append(pad)
            self._pds[key] = (prim, (lib.memory(pad_md, _addr(pad)),))
            self._mems.extend(self._pds[key][1])
        prim, (pad_mem,) = self._pds[key]
        args = (_Arg * 4)(_Arg(_ARG_SRC, self._mem(mds[0], src)), _Arg(_ARG_WEIGHTS, self._mem(mds[1], w)),
                          _Arg(_ARG_DST, self._mem(mds[2], dst)), _Arg(_ARG_SCRATCHPAD, pad_mem))
        return prim, args, 4

    def _call(self, prims: list[tuple[Any, Any, int]]) -> Step:
        return Step(_MatmulCall(self.lib, tuple(prims), (None, None), (self, *self._keep)), (None, None))

    # ---------------------------------------------------------------- per block
    def scores(self, h: slice, r: slice, st: np.ndarray) -> Step:
        """``st = q[h, r] @ k[h]^T`` (float32 scores of a block)."""
        return self._call([self._matmul(self.q16[h, r], self.k16[h].swapaxes(-1, -2), st)])

    def weights16(self, st: np.ndarray) -> np.ndarray:
        """The bf16 block the softmax weights of scores ``st`` are rounded into (one
        buffer for every block: the first block is the largest)."""
        if self._p16 is None or self._p16.size < st.size:
            self._p16 = self.ctx.scratch((st.size,), np.uint16)
            self._keep.append(self._p16)
        return self._p16[: st.size].reshape(st.shape)

    def weighted(self, h: slice, p16: np.ndarray, out: np.ndarray) -> Step:
        """``out = p16 @ v[h]``: the block's softmax weights, which the softmax rounded into
        ``p16`` (``weights16``; ``native_nn.softmax_bf16_step``)."""
        return self._call([self._matmul(p16, self.v16[h], out)])

    def taken(self) -> None:
        """Tell the build's report that this attention's products took bf16 (every block's
        steps made)."""
        _rounded(self.ctx, _BF16, "attention")

