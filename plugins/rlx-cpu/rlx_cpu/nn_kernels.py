"""Step builders for the fused neural-network ops: softmax, layer_norm, conv2d and the
pools (same contract as ``kernels.py``; attention's are ``attention_kernels.py``).

Each is a short sequence of numpy calls into preallocated temporaries, not its
decomposition: softmax is five calls, layer_norm about a dozen. conv2d gathers its windows (im2col) through one strided
view of a padded copy and does one batched matmul over the groups; the pools reduce
over their kernel taps, each tap a strided view of the padded input.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from rlx_core.ir import Node
from rlx_core.ir.ops import OpKind

from . import onednn, onednn_steps
from .attention_kernels import attention
from .conv_nhwc import conv_nhwc_steps
from .gemm import gemv_step, matmul_bias_step, matmul_step, native_step, use_native
from .grouped_conv import group_conv_step
from .halves import in_float32
from .implicit_gemm import conv_gemm_steps
from .kernels import (
    BuildContext,
    Builder,
    compute_dtype,
    const,
    mean_rows_step,
    softmax_steps,
    ufunc_step,
)
from .native_nn import (
    conv_direct_steps,
    depthwise_step,
    im2col_step,
    layer_norm_step,
    pool_kind,
    pool_padded_step,
    pool_step,
    softmax_step,
    window_counts,
)
from .regions import Epilogue
from .sparse_taps import sparse_tap_steps
from .steps import Step, aligned_empty, is_fixed

__all__ = ["NN_KERNELS"]


#: Rows at most this long are normalized in a transposed copy: numpy pays about 100 ns
#: per row and reduction along a row, which dwarfs 10 elements (a classifier's softmax).
SHORT_ROW = 32


def _softmax(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    x, axis = ins[0], node.attrs["axis"]
    if axis == out.ndim - 1:
        native = softmax_step(x, out)
        if native is not None:
            return [native]
    cd = compute_dtype(out.dtype)
    rows, length = out.size // max(out.shape[axis], 1), out.shape[axis]
    if axis == out.ndim - 1 and length <= SHORT_ROW and rows >= 16 and out.size:
        t = ctx.scratch((length, rows), cd)  # the rows as columns: reductions across rows are vectorized
        x2, out2 = x.reshape(rows, length), out.reshape(rows, length)
        return [Step(np.copyto, (t, x2.swapaxes(0, 1))), *softmax_steps(t, 0, t, t, ctx),
                Step(np.copyto, (out2, t.swapaxes(0, 1)), {"casting": "same_kind"})]
    if cd == out.dtype:
        return softmax_steps(x, axis, out, out, ctx)
    work = ctx.scratch(out.shape, cd)
    return [Step(np.copyto, (work, x)), *softmax_steps(work, axis, work, out, ctx)]


def _vecdot_steps(d: np.ndarray, out: np.ndarray) -> Step:
    """``out[i] = sum_j d[i, j]**2`` without a temporary the size of ``d``."""
    if hasattr(np, "vecdot"):  # numpy >= 2.0
        return Step(np.vecdot, (d, d, out))
    return Step(np.einsum, ("ij,ij->i", d, d), {"out": out})


def _layer_norm(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) == 3 else None
    axis, eps = node.attrs["axis"], node.attrs["eps"]
    native = layer_norm_step(x, scale, bias, out, axis, eps)
    if native is not None:
        return [native]
    rows, n = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    cd = compute_dtype(out.dtype)
    x2 = x.reshape(rows, n)
    d = out.reshape(rows, n) if cd == out.dtype else ctx.scratch((rows, n), cd)
    stat = ctx.scratch((rows, 1), cd)
    count = const(n, cd)
    steps = [
        Step(np.add.reduce, (x2, 1, cd, stat, True)),
        Step(np.divide, (stat, count, stat)),  # mean
        Step(np.subtract, (x2, stat, d)),  # x - mean; x is not read after this
        _vecdot_steps(d, stat.reshape(rows)),
        Step(np.divide, (stat, count, stat)),  # biased variance
        Step(np.add, (stat, const(eps, cd), stat)),
        Step(np.sqrt, (stat, stat)),
        Step(np.divide, (const(1, cd), stat, stat)),
        Step(np.multiply, (d, stat, d)),
    ]
    dn = d.reshape(x.shape)
    if bias is None:
        steps.append(Step(np.multiply, (dn, scale, out)))
    else:
        steps += [Step(np.multiply, (dn, scale, dn)), Step(np.add, (dn, bias, out))]
    return steps


# ----------------------------------------------------------------------------- windows
def _padded(x: Any, top: int, left: int, height: int, width: int, fill: float, dtype: np.dtype,
            ctx: BuildContext, *, concrete: bool = False) -> tuple[Any, list[Step]]:
    """``x`` (N, C, H, W) placed at (top, left) of a ``height`` x ``width`` temporary whose
    other positions hold ``fill``, and the steps filling it; ``x`` itself when no padding
    or cast is needed (and, with ``concrete``, when it is not a run-time ``Dyn``). The
    temporary's memory is shared with other nodes, so the border is refilled on every
    run (a few thin strips)."""
    n, c, h, w = x.shape
    if top == left == 0 and height == h and width == w and x.dtype == dtype and (is_fixed(x) or not concrete):
        return x, []
    xp = ctx.scratch((n, c, height, width), dtype)
    value = const(fill, dtype)
    strips = [xp[:, :, :top], xp[:, :, top + h :], xp[:, :, top : top + h, :left], xp[:, :, top : top + h, left + w :]]
    steps = [Step(np.copyto, (s, value)) for s in strips if s.size]
    steps.append(Step(np.copyto, (xp[:, :, top : top + h, left : left + w], x)))
    return xp, steps


def _with_bias_column(w3: Any, b: Any, ctx: BuildContext) -> tuple[Any, list[Step]]:
    """The weights ``w3`` (groups, og, kk) with the bias as one more column (groups, og,
    kk + 1), and the steps that fill it. For resident weights and bias the executable keeps
    the array and refills it only when ``set_param`` changes either (``ctx.derived``):
    copying resnet18's weights every run was a measurable share of each run (measured:
    BENCHMARKS.md, section 'Figures behind design choices (moved from docstrings,
    issue 32)'). Otherwise (a run-time weight, a float16 copy) a scratch is refilled every
    run."""
    groups, og, kk = w3.shape
    bias = b.reshape(groups, og)

    def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            dest = aligned_empty((groups, og, kk + 1), src.dtype)
        dest[:, :, :kk] = src
        dest[:, :, kk] = bias
        return dest

    derived = getattr(ctx, "derived", None)
    kept = derived(w3, ("conv_bias_column",), make, also=(b,)) if derived is not None else None
    if kept is not None:
        return kept, []
    wb = ctx.scratch((groups, og, kk + 1), w3.dtype)
    return wb, [Step(np.copyto, (wb[:, :, :kk], w3)), Step(np.copyto, (wb[:, :, kk], bias))]


def _conv_product(w3: Any, cols: Any, b: Any, res4: Any, ctx: BuildContext, bias_in_gemm: bool,
                  epilogue: Epilogue | None) -> tuple[Step, bool, bool]:
    """A convolution's product ``res4 = w3 @ cols`` as one step, whether that step adds
    the bias too (rlx's GEMM, when ``bias_in_gemm`` and it takes the product; else the
    caller adds the bias in a pass of its own), and whether it applied ``epilogue`` (rlx's
    GEMM, or rlx_gemv for one output per channel, where it takes the product with the
    bias in it or none to add)."""
    if epilogue is not None and (b is None or bias_in_gemm) and use_native(w3.shape[-1]):
        if min(res4.shape[-2:]) > 1:
            step = native_step(w3, cols, res4, ctx, row_bias=b, epilogue=epilogue)
        else:  # one output per channel (a squeeze-excitation block's 1x1 plane): rlx_gemv's
            step = gemv_step(w3, cols, res4, bias=b, epilogue=epilogue) if res4.shape[-1] == 1 else None
        if step is not None:
            return step, True, True
    fused = matmul_bias_step(w3, cols, b, res4, ctx) if bias_in_gemm else None
    if fused is not None:
        return fused, True, False
    return matmul_step(w3, cols, res4, ctx), False, False


def _pixel_dense(x: Any, w: Any, b: Any, out: np.ndarray, ctx: BuildContext, bias_sink: list[Any] | None) -> list[Step]:
    """A 1x1 convolution of a batch of 1x1 planes (a squeeze-excitation block's, at batch
    2 and up) as the dense layer it is: ``out (n, o) = x (n, c) @ w (o, c)^T``, one product
    reading the weights once. As a convolution it was a matrix-vector product per image
    (the weights read n times) or oneDNN's convolution over a 1x1 plane, which has no
    kernel for it: MobileNetV3-Large's 960 <-> 240 pair at batch 4 took 0.21 ms each on
    oneDNN, 0.077 as four products, against ORT's 0.035 (2-core Zen 5; BENCHMARKS.md,
    session 40). The bias (one per output channel, a column of the product here) goes to
    ``bias_sink`` for the caller's epilogue pass, else a pass of its own."""
    n, c = x.shape[0], x.shape[1]
    o = w.shape[0]
    steps = [matmul_step(x.reshape(n, c), w.reshape(o, c).T, out.reshape(n, o), ctx)]
    if b is not None and bias_sink is not None:
        bias_sink.append(b)
    elif b is not None:
        steps.append(Step(np.add, (out, b.reshape(o, 1, 1), out)))
    return steps


def _conv2d(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    return conv2d_steps(node, ins, out, ctx)[0]


def conv2d_steps(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext, epilogue: Epilogue | None = None,
                 bias_sink: list[Any] | None = None) -> tuple[list[Step], bool]:
    """The steps of a convolution into ``out``, and whether they also applied
    ``epilogue`` (a region over ``out``: ``fused_conv``'s), which the kernels that write
    ``out`` themselves do as they finish each part of it: the implicit GEMM, the
    depthwise kernels, rlx's GEMM on a 1x1 convolution or im2col's columns. Where the
    answer is False the caller runs the epilogue after the steps. ``bias_sink``: where the
    bias would be one more pass over ``out`` after the product (the BLAS cannot add it),
    it is appended there instead, for the caller's epilogue pass to add."""
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) == 3 else None
    a = node.attrs
    (sh, sw), (dh, dw), groups = a["stride"], a["dilation"], a["groups"]
    pt, pl, pb, pr = a["padding"]
    n, _c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh, ow = out.shape[2:]
    og, kk = o // groups, cg * kh * kw
    cd = compute_dtype(out.dtype)
    steps: list[Step] = []
    if cd != out.dtype:  # float16: on the float32 kernels, rounded once (``halves``); the caller's epilogue after
        return in_float32(_conv2d, node, ins, out, ctx), False
    if (n > 1 and groups == 1 and h == wd == 1 and (kh, kw) == (1, 1) and (sh, sw) == (1, 1)
            and (pt, pl, pb, pr) == (0, 0, 0, 0) and cd == out.dtype == x.dtype == np.float32
            and all(not isinstance(v, np.ndarray) or v.flags.c_contiguous for v in (x, out))):
        return _pixel_dense(x, w, b, out, ctx, bias_sink), False
    kind = onednn.kind_of((kh, kw), (sh, sw), groups, _c, o, oh * ow)
    reduced = onednn.reduced(getattr(ctx, "precision", "fp32")) if cd == out.dtype == np.float32 else None
    if reduced is not None and kind != "depthwise":  # a reduced precision's, where oneDNN runs it on AMX
        on_dnnl = onednn_steps.conv_steps(reduced[0], x, w, b, out, (pt, pl, pb, pr), (sh, sw), (dh, dw), groups, ctx,
                                          reduced_only=True)
        if on_dnnl is not None:
            return on_dnnl, False
    dnnl = onednn.use(kind) if cd == out.dtype == np.float32 else None
    if dnnl is not None:  # oneDNN where it measured faster (onednn.py): channels-last, reordered in and out
        on_dnnl = onednn_steps.conv_steps(dnnl, x, w, b, out, (pt, pl, pb, pr), (sh, sw), (dh, dw), groups, ctx)
        if on_dnnl is not None:
            return on_dnnl, False
    if cd == out.dtype == np.float32 and groups == 1 and (dh, dw) != (1, 1):
        # An atrous convolution whose outer taps reach only a border of the outputs
        # (DeepLabV3's pyramid): one product per tap over what it reaches
        sparse = sparse_tap_steps(x, w, b, out, (pt, pl), (sh, sw), (dh, dw), ctx)
        if sparse is not None:
            return sparse, False
    if cd == out.dtype == np.float32 and groups > 1 and not groups == _c == o:
        # Few channels a group (ResNeXt, RegNet) where oneDNN does not take them: rlx's
        # grouped kernel, not im2col and a product of a few rows per group (1.2-3x faster)
        grouped = group_conv_step(x, w, b, out, (sh, sw), (dh, dw), (pt, pl), groups, ctx, epilogue)
        if grouped is not None:
            return grouped, epilogue is not None
    if cd == out.dtype == np.float32 and groups == 1:
        # Small output planes (7x7) on the channels-inner kernel (conv_nhwc: rows of one
        # tile); else an implicit GEMM reading its columns from the input where rlx's GEMM runs the
        # products (a plain 1x1 convolution: where the channels-in-vectors form wins, else
        # rlx_gemm's product below); else the direct kernel for few taps; what is left goes
        # through im2col.
        implicit = (conv_nhwc_steps(x, w, b, out, (pt, pl), (sh, sw), (dh, dw), ctx, epilogue)
                    or conv_gemm_steps(x, w, b, out, (pt, pl), (sh, sw), (dh, dw), ctx, epilogue))
        if implicit is not None:
            return implicit, epilogue is not None
        if ((dh, dw) == (1, 1) and (kh, kw) != (1, 1) and oh == (h + pt + pb - kh) // sh + 1
                and ow == (wd + pl + pr - kw) // sw + 1):
            direct = conv_direct_steps(x, w, b, out, (pt, pl), (sh, sw), ctx)
            if direct is not None:
                return direct, False
    if cd == out.dtype == np.float32 and groups == _c == o and cg == 1:
        # Depthwise (MobileNet, EfficientNet): one pass per plane, not C one-row products.
        depthwise = depthwise_step(x, w, b, out, (sh, sw), (dh, dw), (pt, pl), ctx, epilogue)
        if depthwise is not None:
            return depthwise, epilogue is not None
    w3 = w.reshape(groups, og, kk)
    res = out if cd == out.dtype else ctx.scratch(out.shape, cd)
    res4 = res.reshape(n, groups, og, oh * ow)
    bias_in_gemm = b is not None and groups == 1 and res is out  # rlx's GEMM may add it as it stores C
    epilogue = epilogue if groups == 1 and res is out else None  # one product writing all of out
    applied = False
    if kh == kw == 1 and sh == sw == 1 and pt == pl == pb == pr == 0:
        if cd != out.dtype:
            x32 = ctx.scratch(x.shape, cd)
            steps.append(Step(np.copyto, (x32, x)))
            x = x32
        product, with_bias, applied = _conv_product(w3, x.reshape(n, groups, cg, h * wd), b, res4, ctx, bias_in_gemm,
                                                    epilogue)
        steps.append(product)
        b = None if with_bias else b
    else:
        # Where rlx's GEMM will add the bias, the columns need no row of ones for it.
        bias_in_gemm = bias_in_gemm and isinstance(b, np.ndarray) and use_native(kk)
        if b is not None and not bias_in_gemm:
            # One more row of ones in the columns and the bias as one more column of the
            # weights, instead of a pass over the output. The row of ones is rewritten
            # every run (the scratch is shared).
            cols = ctx.scratch((n, groups, kk + 1, oh * ow), cd)
            steps.append(Step(np.copyto, (cols[:, :, kk], const(1, cd))))
            w3, bias_steps = _with_bias_column(w3, b, ctx)
            steps += bias_steps
            b = None
        else:
            cols = ctx.scratch((n, groups, kk, oh * ow), cd)
        native = None
        if x.dtype == cd:  # one pass writing the windows and their zero padding
            native = im2col_step(x, cols, groups, (kh, kw), (sh, sw), (dh, dw), (pt, pl), (oh, ow))
        if native is not None:
            steps.append(native)
        else:  # the windows are one strided view planned now, so a run-time input is copied too
            xp, pad_steps = _padded(x, pt, pl, h + pt + pb, wd + pl + pr, 0.0, cd, ctx, concrete=True)
            s_n, s_c, s_h, s_w = xp.strides
            windows = as_strided(xp, (n, groups, cg, kh, kw, oh, ow),
                                 (s_n, cg * s_c, s_c, dh * s_h, dw * s_w, sh * s_h, sw * s_w),
                                 writeable=False)
            steps += [*pad_steps, Step(np.copyto, (cols[:, :, :kk].reshape(n, groups, cg, kh, kw, oh, ow), windows))]
        product, with_bias, applied = _conv_product(w3, cols, b, res4, ctx, bias_in_gemm, epilogue)
        steps.append(product)
        b = None if with_bias else b
    if isinstance(b, np.ndarray) and bias_sink is not None and res is out and not applied:
        bias_sink.append(b)
    elif b is not None:
        steps.append(Step(np.add, (res, b.reshape(o, 1, 1), out)))
    elif res is not out:
        steps.append(Step(np.copyto, (out, res), {"casting": "same_kind"}))
    return steps, applied


def _pool_input(x: Any, node: Node, dilation: tuple[int, int], fill: float, dtype: np.dtype,
                ctx: BuildContext) -> tuple[Any, list[Step]]:
    """The input the pool's taps read: ``x`` itself when no window leaves it, else a
    padded copy covering the declared padding and the extra windows of ceil_mode."""
    a = node.attrs
    (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["stride"], dilation
    pt, pl, _, _ = a["padding"]
    _, _, h, w = x.shape
    oh, ow = node.shape[2:]
    need_h = (oh - 1) * sh + dh * (kh - 1) + 1
    need_w = (ow - 1) * sw + dw * (kw - 1) + 1
    if pt == pl == 0 and need_h <= h and need_w <= w and x.dtype == dtype:
        return x, []
    return _padded(x, pt, pl, max(need_h, pt + h), max(need_w, pl + w), fill, dtype, ctx)


def _separable(xp: Any, node: Node, dilation: tuple[int, int], combine: np.ufunc, out: np.ndarray,
               ctx: BuildContext) -> list[Step]:
    """``out`` = ``combine`` over each window of ``xp``, done as two 1-d passes: first over
    the window's rows into a scratch (oh, full width) whose rows stay contiguous, then
    over its columns. kh + kw - 2 calls instead of kh * kw - 1 (a 2x2 max pool: 2 instead
    of 4), each over fewer strided elements. Exact for max; for sums only the order of
    the additions changes."""
    (kh, kw), (sh, sw), (dh, dw) = node.attrs["kernel"], node.attrs["stride"], dilation
    oh, ow = node.shape[2:]
    def fold(views: list[Any], target: np.ndarray) -> list[Step]:  # target = combine over views
        if len(views) == 1:
            return [Step(np.copyto, (target, views[0]))]
        return [ufunc_step(combine, views[0], views[1], target), *(ufunc_step(combine, target, t, target)
                                                                    for t in views[2:])]

    rows = [xp[:, :, i * dh : i * dh + (oh - 1) * sh + 1 : sh, :] for i in range(kh)]
    if kw == 1 and xp.shape[3] == ow:  # the row pass already has the output's shape
        return fold(rows, out)
    r = ctx.scratch((*rows[0].shape[:3], xp.shape[3]), out.dtype)
    cols = [r[..., j * dw : j * dw + (ow - 1) * sw + 1 : sw] for j in range(kw)]
    return fold(rows, r) + fold(cols, out)


def _native_pool(node: Node, x: Any, out: np.ndarray, dilation: tuple[int, int], is_max: bool) -> Step | None:
    """The native pool when no window reaches into padding."""
    if any(node.attrs["padding"]):
        return None
    return pool_step(x, out, node.attrs["kernel"], node.attrs["stride"], dilation, is_max)


def _max_pool2d(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    dilation = node.attrs["dilation"]
    native = _native_pool(node, ins[0], out, dilation, True)
    if native is not None:
        return [native]
    a = node.attrs
    if dilation == (1, 1):  # padding or ceil_mode windows, clipped to the image: no padded copy
        native = pool_padded_step(ins[0], out, a["kernel"], a["stride"], a["padding"], pool_kind(True, False))
        if native is not None:  # resnet18's 3x3 stride-2 pool, padding 1, 64x112x112: several times faster
            # than the native pool over a padded copy (measured: BENCHMARKS.md, section 'Figures behind
            # design choices (moved from docstrings, issue 32)')
            return [native]
    xp, steps = _pool_input(ins[0], node, dilation, -np.inf, out.dtype, ctx)
    if steps:  # the native pool over the -inf-padded copy
        native = pool_step(xp, out, a["kernel"], a["stride"], dilation, True)
        if native is not None:
            return [*steps, native]
    return steps + _separable(xp, node, dilation, np.maximum, out, ctx)


def _avg_pool2d(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    """The native pool where no window reaches into padding; else, float32 windows up to 8
    wide at strides 1 and 2, the native padded pool (taps clipped to the image, each sum
    divided by its window's count: no padded copy); else the native pool over a
    zero-padded copy and, where a window counts fewer (``count_include_pad=0``,
    ceil_mode's positions past the padding), one multiplication by kh * kw / count.
    Inception-v3's eight 3x3 stride-1 pools, padding 1, at batch 1: 0.9-1.6 ms a run over
    padded copies with their corrections, 0.19-0.27 ms clipped (2-core Zen 5, without the
    extras; with them oneDNN's pooling runs them). numpy's passes remain for other dtypes."""
    a = node.attrs
    native = _native_pool(node, ins[0], out, (1, 1), False)
    if native is not None:
        return [native]
    cd = compute_dtype(out.dtype)
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = a["kernel"], a["stride"], a["padding"]
    include = a["count_include_pad"]
    native = pool_padded_step(ins[0], out, (kh, kw), (sh, sw), (pt, pl, pb, pr), pool_kind(False, include))
    if native is not None:  # (float32 arrays only: the step's check)
        return [native]
    h, w = ins[0].shape[2:]
    oh, ow = out.shape[2:]
    counts = np.outer(window_counts(h, oh, kh, sh, pt, pb, include), window_counts(w, ow, kw, sw, pl, pr, include))
    xp, steps = _pool_input(ins[0], node, (1, 1), 0.0, cd, ctx)
    if cd == out.dtype == np.float32:
        native = pool_step(xp, out, (kh, kw), (sh, sw), (1, 1), False)
        if native is not None:
            steps.append(native)
            if np.any(counts != kh * kw):
                factor = (kh * kw / counts).astype(np.float32)
                factor.flags.writeable = False
                steps.append(Step(np.multiply, (out, factor, out)))
            return steps
    acc = out if cd == out.dtype else ctx.scratch(out.shape, cd)
    steps += _separable(xp, node, (1, 1), np.add, acc, ctx)
    counts = counts.astype(cd)
    counts.flags.writeable = False
    steps.append(Step(np.divide, (acc, counts, out)))
    return steps


def _global_avg_pool2d(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    x = ins[0]
    step = mean_rows_step(x, (2, 3), out)  # each plane's mean: one matrix-vector product
    if step is not None:
        return [step]
    cd = compute_dtype(out.dtype)
    acc = out if cd == out.dtype else ctx.scratch(out.shape, cd)
    count = const(x.shape[2] * x.shape[3], cd)
    return [Step(np.add.reduce, (x, (2, 3), cd, acc, True)), Step(np.divide, (acc, count, out))]


NN_KERNELS: dict[OpKind, Builder] = {
    OpKind.SOFTMAX: _softmax,
    OpKind.LAYER_NORM: _layer_norm,
    OpKind.ATTENTION: attention,
    OpKind.CONV2D: _conv2d,
    OpKind.MAX_POOL2D: _max_pool2d,
    OpKind.AVG_POOL2D: _avg_pool2d,
    OpKind.GLOBAL_AVG_POOL2D: _global_avg_pool2d,
}
