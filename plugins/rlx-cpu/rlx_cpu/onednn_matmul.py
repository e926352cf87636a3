"""Dense layers' products on oneDNN (the ``onednn`` extra): ``a (m, k) @ b (k, n)`` with
``b`` a resident weight matrix, reordered once into the layout oneDNN chose (and again by
``set_param``), the bias, a residual of the output's shape and the activation applied by
post-ops as the result is stored; under ``precision="bf16"`` with bf16 operands where this
host takes them (``bf16_units``). A residual operand (a transformer's projection added to
the value it came from, fused into the GEMM) had kept T5's output projections on float32
GEMMs under bf16: 1.7 ms each at sequence 128, 0.67 ms as one bf16 matmul with the add as
a post-op (Zen 4 EPYC).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from .gemm import stacked_rows
from .onednn import (
    _AB,
    _ANY,
    _ARG_BIAS,
    _ARG_POST_OP_BASE,
    _ARG_SRC_1,
    _ARG_WEIGHTS,
    _F32,
    ELTWISE,
    Dnnl,
    DnnlError,
    reduced,
    use,
)
from .onednn_steps import (
    ACTIVATION_POST,
    _addr,
    _declined,
    _f32_or_held,
    _held,
    _layouted,
    _MatmulCall,
    _reordered,
    _rounded,
    _weights_for,
    held_types,
    operand_types,
)
from .steps import Dyn, Step

__all__ = ["matmul_steps", "dense_steps"]


def matmul_steps(lib: Dnnl, a: Any, b: Any, bias: Any, out: Any, ctx: Any,
                 activation: str = "none") -> list[Step] | None:
    """``out = a @ b (+ bias)``, then ``activation``, as one oneDNN matmul; None where it
    does not apply. ``a`` (m, k) and ``out`` (m, n) are row-major (plan buffers or a
    caller's arrays), ``b`` (k, n) is a resident at any strides (a transposed weight
    included), reordered once into the layout oneDNN chose for it and again by
    ``set_param`` (``ctx.derived``); ``bias`` a resident of n values, or a value of the
    output's shape (a residual, not in the output's memory) added before the activation."""
    derived = getattr(ctx, "derived", None)
    if derived is None or isinstance(b, Dyn) or getattr(b, "dtype", None) != np.float32:
        return None
    if not (_f32_or_held(a) and _f32_or_held(out)):
        return None
    held = (_held(a), _held(out))  # (views held reduced: ``held.py``)
    as_held = held_types(ctx, held, (True, True))
    if as_held is None:
        return None
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2 or out.size == 0 or a.shape[1] == 0:
        return None
    (m, k), n = a.shape, out.shape[1]
    if tuple(b.shape) != (k, n) or out.shape[0] != m or min(b.strides) <= 0 or activation not in (
            "none", *ACTIVATION_POST):
        return None
    residual = None  # a whole (m, n) operand added before the activation: oneDNN's binary add post-op
    if bias is not None and not isinstance(bias, Dyn) and bias.size == m * n and n > 1 and bias.shape[-1] == n:
        if not (_f32_or_held(bias) and bias.flags.c_contiguous) or np.may_share_memory(bias, out):
            return None
        residual, bias = bias.reshape(m, n), None
    r_type = _F32
    if residual is not None and _held(residual):  # held reduced (``held.py``): read in that format
        found = reduced(getattr(ctx, "precision", "fp32"))
        if found is None:
            return None
        r_type = found[1]
    if bias is not None and (isinstance(bias, Dyn) or bias.dtype != np.float32 or bias.size != n
                             or bias.shape[-1] != n or not bias.flags.c_contiguous):
        return None
    if not all(isinstance(x, Dyn) or x.flags.c_contiguous for x in (a, out)):  # plan views read as row-major
        return None
    act = (() if activation == "none" else (("eltwise", ELTWISE[ACTIVATION_POST[activation]], 0.0, 0.0),))
    for dtype in operand_types(ctx, True):
        pd, made = None, []
        try:
            src, w_any = lib.md((m, k), _AB, dtype), lib.md((k, n), _ANY, dtype)
            dst = lib.md((m, n), _AB, dtype if held[1] and dtype != _F32 else _F32)
            made += [src, dst, w_any]
            r_md = lib.md((m, n), _AB, r_type) if residual is not None else None
            made += [r_md] if r_md is not None else []
            post = ((("add", r_md),) if r_md is not None else ()) + act
            b_md = lib.md((1, n), _AB) if bias is not None else None
            made += [b_md] if b_md is not None else []
            pd = lib.matmul_pd(src, w_any, b_md, dst, post)
            impl, w_md, w_plain, w_reorder = _weights_for(
                lib, pd, dtype, lib.md_strided((k, n), tuple(st // 4 for st in b.strides)), made)
        except DnnlError as exc:
            _declined(lib, pd, made, f"a product {tuple(a.shape)} @ {tuple(b.shape)}", dtype, exc)
            continue
        try:
            return _matmul_call(lib, pd, impl, a, b, bias, out, (src, dst, w_any, b_md, w_md, w_plain, w_reorder),
                                ctx, dtype, as_held, (residual, r_md))
        finally:
            lib.destroy(pds=(pd,))
    return None


def _matmul_call(lib: Dnnl, pd: Any, impl: str, a: Any, b: Any, bias: Any, out: Any, objs: tuple[Any, ...],
                 ctx: Any, dtype: int, as_held: tuple[int, int] = (_F32, _F32),
                 residual: tuple[Any, Any] = (None, None)) -> list[Step] | None:
    """``matmul_steps``' step once oneDNN took the product (``pd``; ``objs``: the
    descriptors and the weights' reorder made for it; ``dtype``: its operands';
    ``as_held``: the dtypes ``a`` and ``out`` lie in; ``residual``: the array added by the
    first post-op and its descriptor, or Nones)."""
    src, dst, w_any, b_md, w_md, w_plain, w_reorder = objs
    extra = [md for md in (b_md, residual[1]) if md is not None]  # the bias's and residual's descriptors
    (m, k), n = a.shape, out.shape[1]
    make = _reordered(lib, w_reorder, w_plain, w_md, lib.size(w_md), contiguous=False)
    wbuf = ctx.derived(b, ("onednn_matmul_weights", (k, n), tuple(b.strides), impl, lib.layout(w_md, (k, n))), make)
    if wbuf is None:
        lib.destroy((), (w_reorder,), (w_plain, w_md, src, dst, w_any, *extra))
        return None
    weakref.finalize(wbuf, lib.destroy, (), (w_reorder,), (w_plain, w_md))
    keep: list[Any] = [wbuf, b]
    mems: dict[str, Any] = {"w": lib.memory(w_md, wbuf.ctypes.data)}
    args = [(_ARG_WEIGHTS, mems["w"])]
    if bias is not None:
        keep.append(bias)
        mems["b"] = lib.memory(b_md, _addr(bias))
        args.append((_ARG_BIAS, mems["b"]))
    if residual[0] is not None:
        keep.append(residual[0])
        mems["post0"] = lib.memory(residual[1], _addr(residual[0]))
        args.append((_ARG_POST_OP_BASE | _ARG_SRC_1, mems["post0"]))
    held = (lib.md((m, k), _AB, as_held[0]), lib.md((m, n), _AB, as_held[1]))  # row-major, as the plan holds them
    call = _layouted(_MatmulCall, lib, pd, (src, dst), a, out, held, ctx, args, keep, mems,
                     [w_any, *extra])
    _rounded(ctx, dtype, "product")
    return [Step(call, (a, out))]


def dense_steps(a: Any, b: Any, bias: Any, activation: str, out: Any, ctx: Any) -> list[Step] | None:
    """A dense layer's product (``a (..., k) @ b (k, n)``, ``b`` a resident; ``bias`` and
    ``activation`` as the fused GEMM has them) on oneDNN where this host timed oneDNN's
    matmul faster (``onednn.use("matmul")``), as one ``(rows, k) @ (k, n)`` product
    (``gemm.stacked_rows``); None where it does not apply (rlx's way then runs it)."""
    if isinstance(b, Dyn) or getattr(ctx, "derived", None) is None or not _f32_or_held(out) or out.size == 0:
        return None
    a2, b2, out2 = stacked_rows(a, b, out)
    if a2.ndim != 2 or b2.ndim != 2 or out2.ndim != 2 or min(out2.shape) <= 1:  # a gemv: rlx_gemv's
        return None
    found = reduced(getattr(ctx, "precision", "fp32"))  # a reduced precision's products: all on oneDNN
    lib = found[0] if found is not None else use("matmul")
    return None if lib is None else matmul_steps(lib, a2, b2, bias, out2, ctx, activation)
