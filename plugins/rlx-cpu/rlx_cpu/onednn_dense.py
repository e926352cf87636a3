"""A dense layer's product on oneDNN made once for every row count: the any-size
executable's (``anysize.py``), where a plan makes one per size (``onednn_steps``)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from .onednn import (
    _AB,
    _ANY,
    _ARG_BIAS,
    _ARG_DST,
    _ARG_SCRATCHPAD,
    _ARG_SRC,
    _ARG_WEIGHTS,
    _F32,
    _QUERY_SCRATCHPAD_MD,
    _QUERY_WEIGHTS_MD,
    ELTWISE,
    Dnnl,
    DnnlError,
    _Arg,
    reduced,
)
from .onednn_steps import _TYPE_NAMES, ACTIVATION_POST, _addr, _jit_impl, _reordered, reorder_team
from .steps import aligned_empty

__all__ = ["RunTimeDense"]


#: ``DNNL_RUNTIME_DIM_VAL``: a dim given at execution, not when the primitive is made.
_RUNTIME_DIM = -(1 << 63)


class RunTimeDense:
    """``out (rows, n) = a (rows, k) @ w (k, n) (+ bias)``, then ``activation``: one oneDNN
    matmul made once for every row count (``DNNL_RUNTIME_DIM_VAL``), for the any-size
    executable (``anysize.py``), where a plan makes one per size. ``w`` is reordered once
    into the layout the primitive chose (``refresh`` again after ``set_param``); ``a`` and
    ``out`` are described per call. oneDNN 3.2 runs it as its jit GEMM where a fixed row
    count gets its brgemm kernels: 0.95-1.2x their time at 37 to 4096 rows of a 256 x 1024
    dense layer, 1.5x at 1-9 rows (tens of microseconds; BENCHMARKS.md, "Any size").
    Under a reduced ``precision`` this host takes (``onednn.reduced``) its operands are in
    that format, ``a`` rounded per call by a reorder made once for every row count too.
    ``make`` raises ``DnnlError`` where oneDNN declines it or runs only a reference loop."""

    def __init__(self, lib: Dnnl, w: np.ndarray, bias: np.ndarray | None, activation: str,
                 precision: str = "fp32") -> None:
        k, n = w.shape
        self.lib, self.w, self.bias, self.k, self.n = lib, w, bias, k, n
        post = (() if activation == "none" else (("eltwise", ELTWISE[ACTIVATION_POST[activation]], 0.0, 0.0),))
        found = reduced(precision)
        dtypes = (found[1], _F32) if found is not None and found[0] is lib else (_F32,)
        for dtype in dtypes:
            try:
                self._make_primitive(lib, w, bias, post, dtype)
                break
            except DnnlError:
                if dtype == _F32:
                    raise
        self.precision = _TYPE_NAMES[self.dtype]
        self.weights = self._make(w, None)
        # oneDNN's scratchpad for the call (none for its jit GEMM), and the rounded source
        # under a reduced precision: one per thread, since the executable's runs may
        # overlap and a primitive's scratchpad is the caller's.
        self._pad_floats, self._local = lib.size(self._pad) // 4 + 16, threading.local()
        mems = [lib.memory(self._w_md, self.weights.ctypes.data)]
        fixed = [_Arg(_ARG_WEIGHTS, mems[0])]
        if bias is not None:
            mems.append(lib.memory(self._b_md, _addr(bias)))
            fixed.append(_Arg(_ARG_BIAS, mems[-1]))
        self._fixed = fixed
        self._nargs = len(fixed) + 3
        weakref.finalize(self, lib.destroy, tuple(mems), tuple(self._prims), tuple(self._descs))

    def _make_primitive(self, lib: Dnnl, w: np.ndarray, bias: np.ndarray | None, post: tuple[Any, ...],
                        dtype: int) -> None:
        """The matmul (and, for reduced operands, the source's rounding) with ``dtype``
        operands; ``DnnlError`` where oneDNN declines them (nothing kept)."""
        k, n = self.k, self.n
        pd, made, prims = None, [], []
        try:
            src, dst = lib.md((_RUNTIME_DIM, k), _AB, dtype), lib.md((_RUNTIME_DIM, n), _AB)
            w_any = lib.md((k, n), _ANY, dtype)
            made += [src, dst, w_any]
            b_md = lib.md((1, n), _AB) if bias is not None else None
            made += [b_md] if b_md is not None else []
            pd = lib.matmul_pd(src, w_any, b_md, dst, post)
            _jit_impl(lib, pd, dtype)
            w_md = lib.clone_md(lib.query_md(pd, _QUERY_WEIGHTS_MD))
            made.append(w_md)
            w_plain = lib.md_strided((k, n), tuple(st // 4 for st in w.strides))
            made.append(w_plain)
            with reorder_team(lib, w_md):
                prims.append(lib.reorder(w_plain, w_md))
            prims.append(lib.primitive(pd))
            if dtype != _F32:
                plain_src = lib.md((_RUNTIME_DIM, k), _AB)
                made.append(plain_src)
                prims.append(lib.reorder(plain_src, src))
            pad = lib.clone_md(lib.query_md(pd, _QUERY_SCRATCHPAD_MD))
            made.append(pad)
        except DnnlError:
            lib.destroy(primitives=prims, descs=made)
            raise
        finally:
            if pd is not None:
                lib.destroy(pds=(pd,))
        self.dtype, self._w_md, self._b_md, self._pad = dtype, w_md, b_md, pad
        self._reorder, self.prim = prims[0], prims[1]
        self._round = prims[2] if dtype != _F32 else None
        self._prims, self._descs = prims, made
        self._make = _reordered(lib, self._reorder, w_plain, w_md, lib.size(w_md), contiguous=False)

    def refresh(self) -> None:
        """Reorder the weights again from ``w`` (its values changed in place: ``set_param``)."""
        self._make(self.w, self.weights)

    def _scratch(self, rows: int) -> tuple[Any, np.ndarray | None]:
        """This thread's scratchpad memory, and its buffer for ``rows`` rounded source rows
        (grown as needed; None in float32)."""
        local, lib = self._local, self.lib
        pad = getattr(local, "pad", None)
        if pad is None:  # this thread's scratchpad, and its memory (freed with the thread's local)
            scratch = aligned_empty(self._pad_floats, np.float32)
            pad = local.pad = (lib.memory(self._pad, scratch.ctypes.data), scratch)
            weakref.finalize(scratch, lib.destroy, (pad[0],))
        if self._round is None:
            return pad[0], None
        rounded = getattr(local, "rounded", None)
        if rounded is None or rounded.size * 2 < rows * self.k:  # two bf16 operands per float32
            rounded = local.rounded = aligned_empty(-(-rows * self.k // 2), np.float32)
        return pad[0], rounded

    def __call__(self, a: np.ndarray, out: np.ndarray) -> None:
        """``a`` (rows, k) and ``out`` (rows, n): C-contiguous float32."""
        lib, rows = self.lib, a.shape[0]
        pad, rounded = self._scratch(rows)
        src, dst = lib.md((rows, self.k), _AB, self.dtype), lib.md((rows, self.n), _AB)
        descs, mems = [src, dst], []
        try:
            if rounded is None:
                mems.append(lib.memory(src, _addr(a)))
            else:  # a rounded into this thread's buffer first
                plain = lib.md((rows, self.k), _AB)
                descs.append(plain)
                mems += [lib.memory(plain, _addr(a)), lib.memory(src, rounded.ctypes.data)]
                lib.run(self._round, (_Arg * 2)(_Arg(_ARG_SRC, mems[0]), _Arg(_ARG_DST, mems[1])), 2)
            mems.append(lib.memory(dst, _addr(out)))
            args = (_Arg * self._nargs)(_Arg(_ARG_SRC, mems[-2]), _Arg(_ARG_DST, mems[-1]), _Arg(_ARG_SCRATCHPAD, pad),
                                        *self._fixed)
            lib.run(self.prim, args, self._nargs)
        finally:
            lib.destroy(memories=mems, descs=descs)
