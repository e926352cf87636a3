"""float16 nodes on the float32 kernels: ``in_float32`` builds a float16 node as its
float32 twin over float32 copies of its operands (``as_float32``: kept once for weights)
and rounds the result to float16 once (``rounded_step``); ``float32_twin`` wraps a
builder so. Convolutions with their epilogues, products, gemms, fused chains, softmax,
LayerNorm, attention, pools and single elementwise ops build this way.

Why: numpy has no float16 GEMM and rlx's fast kernels (its GEMM, implicit GEMM, grouped
and depthwise convolutions, oneDNN, the native region interpreter) are float32. A float16
export (``model.half()``) ran its convolutions through float16 im2col at ~3 GFLOP/s and
its epilogues through numpy's float16 arithmetic (a residual add and ReLU over 100K
values: ~1 ms): regnet_x_400mf 4.5x ORT's time, a GPT-NeoX 5.1x. Products,
convolutions and fused chains now run in float32 over float32 copies and round to
float16 once, as every float16 chain in rlx computes in float32 temporaries
(``kernels``). The conversions run on native.c's F16C loops (numpy's cast: ~1.4 ns a
value on the 2-core Zen 5, as long as the 1x1 convolution it feeds), numpy's where the
library or the layout is not there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .ccall import bound_call
from .native import library
from .regions import SPLIT_NS
from .steps import Step, laid_out

__all__ = ["as_float32", "float32_twin", "half_step", "in_float32", "rounded_step"]

F32 = np.dtype(np.float32)
#: single-thread ns a value converted, for the threads decision
_HALF_NS = 0.1


def half_step(src: Any, dst: Any) -> Step:
    """``dst = src`` between float16 and float32 (either way; to nearest even, as
    numpy's cast)."""
    lib = library()
    if lib is None or src.size == 0 or not (laid_out(src) and laid_out(dst)):
        return Step(_cast, (src, dst))
    fn = lib.half_to_float if src.dtype == np.float16 else lib.float_to_half
    threads = int(lib.threads_for(src.size * _HALF_NS, SPLIT_NS))
    return bound_call(fn, [0, 0, int(src.size), threads], (src, dst), (0, 1), _cast)


def _cast(src: np.ndarray, dst: np.ndarray) -> None:
    """numpy's cast, quiet: a value past float16's range becomes inf as IEEE says, with
    no RuntimeWarning at the user's run (as the native loop)."""
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(dst, src, casting="same_kind")


def as_float32(x: Any, ctx: Any) -> tuple[Any, list[Step]]:
    """``x`` in float32, and the steps that fill it: a weight the executable keeps
    (``ctx.derived``) is converted once and again after ``set_param``, anything else into
    scratch every run."""
    if x.dtype == F32:
        return x, []

    def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            return src.astype(F32)
        np.copyto(dest, src)
        return dest

    derived = getattr(ctx, "derived", None)
    kept = derived(x, ("float32_copy",), make) if derived is not None and isinstance(x, np.ndarray) else None
    if kept is not None:
        return kept, []
    x32 = ctx.scratch(x.shape, F32)
    return x32, [half_step(x, x32) if x.dtype == np.float16 else Step(np.copyto, (x32, x))]


def rounded_step(x32: Any, out: Any) -> Step:
    """``out`` (float16) = ``x32`` (float32) rounded to nearest even."""
    return half_step(x32, out)


def in_float32(build: Callable[..., list[Any]], node: Any, ins: list[Any], out: Any, ctx: Any) -> list[Any]:
    """A float16 node built by ``build`` as its float32 twin over float32 copies of its
    float16 operands (other dtypes as they are), the result rounded to float16 once: a
    convolution and its epilogue, a softmax, a normalization, an attention are each one
    chain, computed in float32 temporaries as every float16 chain is (``kernels``), here
    on the float32 kernels."""
    filled = [as_float32(v, ctx) if v.dtype == np.float16 else (v, []) for v in ins]
    out32 = ctx.scratch(out.shape, F32)
    steps = build(node, [v for v, _ in filled], out32, ctx)
    return [*(s for _, fill in filled for s in fill), *steps, rounded_step(out32, out)]


def float32_twin(build: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """``build``, or for a float16 node (a float16 output and operand) its float32 twin
    over float32 copies, rounded once (``in_float32``): for the ops whose fast kernels are
    float32 (products, fused convolutions, softmax, LayerNorm, attention, pools: the list
    is ``binding._FLOAT32_TWINS``) and for single elementwise ops
    (numpy's float16 add: 3.6 ns a value on the 2-core Zen 5, float32 and two native
    conversions ~0.6). One op rounded once from float32 is numpy's float16 result: float32
    holds more than twice float16's digits, so +, -, x, /, sqrt and max round the same,
    and numpy computes float16 transcendentals in float32 too."""

    def builder(node: Any, ins: list[Any], out: Any, ctx: Any) -> list[Any]:
        if out.dtype == np.float16 and any(v.dtype == np.float16 for v in ins):
            return in_float32(build, node, ins, out, ctx)
        return build(node, ins, out, ctx)

    return builder
