"""Plan steps on oneDNN (the ``onednn`` extra): convolutions, pools, concats and dense
layers' products, each one call into oneDNN with its operands in NCHW or channels-last
(NHWC) memory.

``onednn.py`` loads the library and decides where it runs; this module builds the steps:
a convolution with its weights reordered once into the layout oneDNN chose (and again by
``set_param``) and its epilogue as post-ops where ``layout.post_ops`` maps it, a max or
average pool, a concat of NHWC values. An operand held NCHW is reordered to NHWC in plan
scratch first, and a result wanted NCHW reordered back after (``_layouted``): inside the
channels-last chains ``layout.py`` plans there is no reorder at all. Where oneDNN would
run only its reference loops (``ref:any``: a 3-channel NCHW source took 3.8 s, thousands
of times its jit kernels' time) the builder declines, and rlx's kernels run the node. Dense layers' products are
``onednn_matmul``'s, on the helpers here.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from . import amx_groups, bf16_units
from .ccall import address
from .onednn import (
    _ABCD,
    _ABCDE,
    _ACDB,
    _ANY,
    _ARG_BIAS,
    _ARG_DST,
    _ARG_POST_OP_BASE,
    _ARG_SCRATCHPAD,
    _ARG_SRC,
    _ARG_SRC_1,
    _ARG_WEIGHTS,
    _BF16,
    _F32,
    _POOL_AVG_EXCLUDE,
    _POOL_AVG_INCLUDE,
    _POOL_MAX,
    _QUERY_SCRATCHPAD_MD,
    _QUERY_WEIGHTS_MD,
    _TAG_A,
    Dnnl,
    DnnlError,
    _Arg,
    reduced,
)
from .openmp import team
from .openmp import threads as openmp_threads
from .steps import HELD16, Dyn, Step, aligned_empty

__all__ = ["conv_steps", "pool_steps", "concat_steps", "ACTIVATION_POST",
           "operand_types", "held_types", "convert_steps"]

log = logging.getLogger("rlx_cpu")
_TYPE_NAMES = {_F32: "float32", _BF16: "bf16"}
_ARG_MULTIPLE_SRC = 1024  # DNNL_ARG_MULTIPLE_SRC: a concat's i-th source is this + i


def _plan_threads() -> int | None:
    """The native thread cap the plan being bound runs under (``native.thread_cap``: one
    for the thread tuner's narrow plans), or None for every core."""
    from .native import _THREAD_CAP

    return _THREAD_CAP.get()


class _Call:
    """One oneDNN primitive: the input reordered to NHWC where it is held NCHW, the
    primitive, the result reordered back where it is wanted NCHW; operands read per run
    only where they are a caller's arrays. Under a thread cap (a narrow plan: on a busy
    host one thread beats two waiting on each other) the calling thread's OpenMP team is
    set to it for the call and put back after: the primitives were made under the same
    cap (the plan binds under ``openmp.team``), and this holds the kernels oneDNN sizes
    per run. ``team``'s own steps, inline: a generator per call is overhead on this path."""

    def __init__(self, lib: Dnnl, prims: tuple[tuple[Any, Any, int], ...], handles: tuple[Any, Any],
                 keep: tuple[Any, ...]) -> None:
        self.lib, self.prims, self.handles, self.keep = lib, prims, handles, keep
        cap = _plan_threads()
        self.openmp = openmp_threads() if cap is not None else None
        self.cap = cap

    def __call__(self, x: np.ndarray, y: np.ndarray) -> None:
        lib = self.lib
        x_mem, y_mem = self.handles  # the memories over a caller's arrays (None: a plan buffer's, fixed)
        if x_mem is not None:
            try:
                lib.set_handle(x_mem, address(x))
            except (TypeError, BufferError, ValueError):  # a strided or read-only caller array: a copy
                x = np.ascontiguousarray(x, dtype=np.float32).copy()
                lib.set_handle(x_mem, address(x))
        if y_mem is not None:
            lib.set_handle(y_mem, address(y))
        s = lib.stream()
        omp = self.openmp
        before = omp.get() if omp is not None else 0
        if omp is not None:
            omp.set(self.cap)
        try:
            for prim, args, n in self.prims:
                status = lib.execute(prim, s, n, args)
                if status != 0:
                    raise DnnlError(f"oneDNN primitive_execute failed (status {status})")
            lib.wait(s)
        finally:
            if omp is not None:
                omp.set(before)


class _ConvCall(_Call):
    """A convolution's call (tests count them)."""


class _PoolCall(_Call):
    """A pool's call."""


class _MatmulCall(_Call):
    """A product's call (tests count them)."""


def conv_steps(lib: Dnnl, x: Any, w: Any, bias: Any, out: Any, pads: tuple[int, int, int, int],
               stride: tuple[int, int], dilation: tuple[int, int], groups: int,
               ctx: Any, src_cl: bool = False, dst_cl: bool = False,
               post: tuple[tuple[Any, ...], ...] = (), reduced_only: bool = False) -> list[Step] | None:
    """A float32 convolution as one step on oneDNN; None when it does not apply (weights
    computed per run, another dtype, post-ops it does not take). ``x`` and ``out`` are
    NCHW arrays, or NHWC ones (shaped ``(n, h, w, c)``) where ``src_cl`` / ``dst_cl`` say
    so: those need no reorder (``layout.py`` keeps chains of convolutions channels-last).
    ``post``: post-ops applied as the output is written, each ``("eltwise", algorithm,
    alpha, beta)`` or ``("add", array)``, an array of the output's shape and layout
    (``dst_cl`` only). Under a reduced precision (``operand_types``) its operands are in
    that format where oneDNN runs it on AMX; ``reduced_only``: else None (not float32).
    ``x``, ``out`` and a residual may be views of NHWC plan buffers holding their values
    in that format (``steps.HELD16``, ``held.py``): read and written so, in place where
    the convolution's operands are in it."""
    if isinstance(w, Dyn) or getattr(w, "dtype", None) != np.float32 or not (_f32_or_held(x) and _f32_or_held(out)):
        return None
    held = (_held(x), _held(out))
    if bias is not None and (isinstance(bias, Dyn) or bias.dtype != np.float32):
        return None
    if any(op[0] == "add" and (not dst_cl or isinstance(op[1], Dyn) or tuple(op[1].shape) != tuple(out.shape)
                               or not op[1].flags.c_contiguous) for op in post):
        return None
    found = reduced(getattr(ctx, "precision", "fp32"))
    if any(op[0] == "add" and _held(op[1]) for op in post) and found is None:
        return None
    derived = getattr(ctx, "derived", None)
    if src_cl:
        n, h, wd, c = x.shape
    else:
        n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if derived is None or out.size == 0:
        return None
    oh, ow = out.shape[1:3] if dst_cl else out.shape[2:]
    pt, pl, pb, pr = pads
    wshape = (o, cg, kh, kw) if groups == 1 else (groups, o // groups, cg, kh, kw)
    tiled = not groups == c == o
    # A depthwise convolution reading a value held reduced reads it as it lies (AVX-512's
    # bf16 instructions: no AMX kernel takes it, and none is needed to pay: ``held.py``).
    types = operand_types(ctx, tiled or held[0])
    k = amx_groups.factor(groups, cg) if tiled and types[0] != _F32 and bf16_units.merges() else 1
    if k > 1:  # groups too narrow for AMX, merged in pairs (``amx_groups``)
        wide = derived(w, ("amx_merged_groups", groups, k),
                       lambda src, dest: amx_groups.merged_weights(src, groups, k, dest))
        done = None if wide is None else conv_steps(lib, x, wide, bias, out, pads, stride, dilation, groups // k,
                                                    ctx, src_cl, dst_cl, post, reduced_only=True)
        if done is not None:
            return done
    if reduced_only:
        types = types[:1] if types[0] != _F32 else ()
    as_held = held_types(ctx, held, (src_cl, dst_cl))
    if as_held is None:
        return None
    for dtype in types:
        pd, made = None, []
        try:
            src = lib.md((n, c, h, wd), _ACDB, dtype)
            dst = lib.md((n, o, oh, ow), _ACDB, dtype if held[1] and dtype != _F32 else _F32)
            # A residual add's operand, laid out as the output (float32, or held reduced).
            post_mds = {k: lib.md((n, o, oh, ow), _ACDB, found[1] if _held(op[1]) and found else _F32)
                        for k, op in enumerate(post) if op[0] == "add"}
            w_any = lib.md(wshape, _ANY, dtype)
            b_md = lib.md((o,), _TAG_A) if bias is not None else None
            made += [src, dst, *post_mds.values(), w_any, *((b_md,) if b_md is not None else ())]
            pd = lib.conv_pd(src, w_any, b_md, dst, stride, dilation, (pt, pl), (pb, pr),
                             tuple(("add", post_mds[k]) if op[0] == "add" else op for k, op in enumerate(post)))
            plain = lib.md(wshape, _ABCD if groups == 1 else _ABCDE)
            impl, w_md, w_plain, w_reorder = _weights_for(lib, pd, dtype, plain, made, paying=tiled)
        except DnnlError as exc:
            _declined(lib, pd, made, f"a convolution {tuple(x.shape)} -> {tuple(out.shape)}", dtype, exc)
            continue
        try:
            lies = (lib.md((n, c, h, wd), _ACDB if src_cl else _ABCD, as_held[0]),
                    lib.md((n, o, oh, ow), _ACDB if dst_cl else _ABCD, as_held[1]))
            return _conv_call(lib, pd, impl, x, w, bias, out, post,
                              (src, dst, post_mds, w_any, b_md, w_md, w_plain, w_reorder), lies, wshape, ctx, dtype)
        finally:
            lib.destroy(pds=(pd,))
    return None


def _conv_call(lib: Dnnl, pd: Any, impl: str, x: Any, w: Any, bias: Any, out: Any, post: tuple[tuple[Any, ...], ...],
               objs: tuple[Any, ...], held: tuple[Any, Any], wshape: tuple[int, ...], ctx: Any,
               dtype: int) -> list[Step] | None:
    """``conv_steps``' step once oneDNN took the convolution (``pd``; ``objs``: the
    descriptors and the weights' reorder made for it; ``held``: how ``x`` and ``out``
    lie; ``dtype``: its operands')."""
    src, dst, post_mds, w_any, b_md, w_md, w_plain, w_reorder = objs
    w_size = lib.size(w_md)

    make = _reordered(lib, w_reorder, w_plain, w_md, w_size, contiguous=True)
    wbuf = ctx.derived(w, ("onednn_conv_weights", wshape, impl, lib.layout(w_md, wshape)), make)
    if wbuf is None:
        lib.destroy((), (w_reorder,), (w_plain, w_md))
        return None
    keep: list[Any] = [wbuf, w]
    mems: dict[str, Any] = {"w": lib.memory(w_md, wbuf.ctypes.data)}
    args = [(_ARG_WEIGHTS, mems["w"])]
    if bias is not None:
        mems["b"] = lib.memory(b_md, _addr(bias))
        args.append((_ARG_BIAS, mems["b"]))
        keep.append(bias)
    for k, op in enumerate(post):
        if op[0] == "add":  # the second tensor, laid out like the output (a plan buffer or resident)
            keep.append(op[1])
            mems[f"post{k}"] = lib.memory(post_mds[k], _addr(op[1]))
            args.append((_ARG_POST_OP_BASE * (k + 1) | _ARG_SRC_1, mems[f"post{k}"]))
    call = _layouted(_ConvCall, lib, pd, (src, dst), x, out, held, ctx, args, keep, mems,
                     [w_any, *post_mds.values(), *((b_md,) if b_md is not None else ())])
    _rounded(ctx, dtype, "convolution")
    # The weights' reorder (and its descriptors) are freed with the executable's derived
    # array, which ``make`` refills.
    weakref.finalize(wbuf, lib.destroy, (), (w_reorder,), (w_plain, w_md))
    return [Step(call, (x, out))]


def _jit_impl(lib: Dnnl, pd: Any, dtype: int = _F32, paying: bool = True) -> str:
    """The implementation oneDNN chose for ``pd``; ``DnnlError`` where that is one of its
    reference loops (orders of magnitude slower than rlx's kernels: rlx's then run it),
    or, for reduced-precision operands of a product (``paying``), not one on a unit that
    makes them pay here (``bf16_units.takes``: AMX; AVX512-BF16 where it measured faster).
    ``paying=False``: any kernel oneDNN has (a depthwise convolution or pool reading a
    value held reduced, which needs no unit to pay)."""
    impl = lib.impl(pd)
    if impl.startswith("ref"):
        raise DnnlError(f"only its reference implementation ({impl}) takes it")
    if dtype != _F32 and paying and not bf16_units.takes(lib, impl):
        raise DnnlError(f"its {_TYPE_NAMES[dtype]} implementation here ({impl}) is not on a unit that makes it pay "
                        f"({bf16_units.describe()})")
    return impl


def _weights_for(lib: Dnnl, pd: Any, dtype: int, plain: Any, made: list[Any],
                 paying: bool = True) -> tuple[str, Any, Any, Any]:
    """A product's implementation (``_jit_impl``), the layout its weights take (cloned:
    ``make`` needs it after ``pd`` is gone), ``plain`` (the weights as they lie) and the
    reorder between the two; the descriptors join ``made``."""
    made.append(plain)
    impl = _jit_impl(lib, pd, dtype, paying)
    w_md = lib.clone_md(lib.query_md(pd, _QUERY_WEIGHTS_MD))
    made.append(w_md)
    with reorder_team(lib, w_md):
        reorder = lib.reorder(plain, w_md)
    return impl, w_md, plain, reorder


#: Weights smaller than this are reordered on the calling thread alone (``reorder_team``).
REORDER_ALONE_BYTES = 4 << 20


def reorder_team(lib: Dnnl, blocked: Any) -> Any:
    """The OpenMP team a weights' reorder into ``blocked`` is made and run under: the
    calling thread alone below ``REORDER_ALONE_BYTES``, else every thread.

    Why: a compile reorders every convolution's weights once, each a parallel region of
    its own, and on a 2-vCPU VM waking the sleeping worker for one took ~0.3 ms, more than
    the reorder: mobilenet_v2's 52 took 13-20 ms of its 37-46 ms backend compile on two
    threads, 2 ms on one (2-core Zen 5, fresh processes). oneDNN fixes a primitive's
    threads when it is made, so the team holds for both."""
    return team(1 if lib.size(blocked) < REORDER_ALONE_BYTES else None)


def _declined(lib: Dnnl, pd: Any, made: list[Any], what: str, dtype: int, exc: Exception) -> None:
    """Free what an attempt at ``what`` with ``dtype`` operands made, and log why oneDNN
    declined it."""
    log.debug("rlx-cpu: oneDNN declined %s (%s operands): %s", what, _TYPE_NAMES[dtype], exc)
    lib.destroy(descs=made)
    if pd is not None:
        lib.destroy(pds=(pd,))


def operand_types(ctx: Any, tiled: bool) -> tuple[int, ...]:
    """The dtypes to try, in order, for a product's operands under the build's precision
    (``ctx.precision``, ``CompileOptions.precision``): the reduced one first where this
    host takes it and the product may run on AMX's tiles (``tiled``: not a depthwise
    convolution, which oneDNN runs on AVX-512 in bf16 too, no faster than float32), then
    float32. ``_jit_impl`` keeps the reduced one only where oneDNN chose an AMX kernel: a
    grouped convolution of 32 channels a group ran 5x float32's speed there, one of 4 or
    8 channels a group, on AVX-512's bf16 instructions, 1.3-2.3x slower (BENCHMARKS.md,
    "bf16 on AMX")."""
    found = reduced(getattr(ctx, "precision", "fp32")) if tiled else None
    return (found[1], _F32) if found is not None else (_F32,)


def _held(x: Any) -> bool:
    """Whether ``x`` is a view holding its value in the build's reduced format."""
    return getattr(x, "dtype", None) == HELD16


def _f32_or_held(x: Any) -> bool:
    """Whether ``x`` is a float32 operand, or one held in the reduced format."""
    return getattr(x, "dtype", None) == np.float32 or _held(x)


def held_types(ctx: Any, held: tuple[bool, bool], cl: tuple[bool, bool]) -> tuple[int, int] | None:
    """The dtypes a step's source and destination lie in (``held``: in the build's
    reduced format, else float32); None where one is held reduced but this build has no
    reduced format or the value is not NHWC (``held.plan`` holds only NHWC values)."""
    if not any(held):
        return (_F32, _F32)
    found = reduced(getattr(ctx, "precision", "fp32"))
    if found is None or any(h and not c for h, c in zip(held, cl)):
        return None
    return tuple(found[1] if h else _F32 for h in held)  # type: ignore[return-value]


def convert_steps(lib: Dnnl, x: np.ndarray, out: np.ndarray, ctx: Any) -> list[Step] | None:
    """A value (row-major plan buffers both, NHWC ones shaped ``(n, h, w, c)``) rounded
    into the build's reduced format (``out`` a ``HELD16`` view) or widened back to float32 (``x``
    one): one oneDNN reorder. Where a step planned to read or write a value held reduced
    cannot (``held._widened``: rlx's kernels, an epilogue oneDNN does not take), it runs
    in float32 scratch between two of these. None where the build has no reduced
    format."""
    types = held_types(ctx, (_held(x), _held(out)), (True, True))
    if types is None or tuple(x.shape) != tuple(out.shape) or not 1 <= x.ndim <= 5:
        return None
    plain = x.ndim + 1  # dnnl_a, dnnl_ab, ...: row-major (an NHWC array's dims in its own order)
    a, b = lib.md(tuple(x.shape), plain, types[0]), lib.md(tuple(x.shape), plain, types[1])
    mems = (lib.memory(a, _addr(x)), lib.memory(b, _addr(out)))
    prim = lib.reorder(a, b)
    args = (_Arg * 2)(_Arg(_ARG_SRC, mems[0]), _Arg(_ARG_DST, mems[1]))
    call = _Call(lib, ((prim, args, 2),), (None, None), (x, out))
    weakref.finalize(call, lib.destroy, mems, (prim,), (a, b))
    return [Step(call, (x, out))]


def _rounded(ctx: Any, dtype: int, what: str) -> None:
    """Tell the build (``ctx.rounded``, where it counts them for the report) that a
    ``what`` runs with ``dtype`` operands, when that is a reduced precision."""
    note = getattr(ctx, "rounded", None)
    if dtype != _F32 and note is not None:
        note(_TYPE_NAMES[dtype], what)


def _reordered(lib: Dnnl, reorder: Any, plain: Any, blocked: Any, size: int,
               contiguous: bool) -> Callable[[np.ndarray, np.ndarray | None], np.ndarray]:
    """``ctx.derived``'s ``make`` for weights in oneDNN's layout: ``reorder`` from the
    param as laid out by ``plain`` (a C-contiguous copy first where ``contiguous``; else
    ``plain`` describes the param's own strides) into ``blocked`` memory of ``size``
    bytes, a new array or ``dest`` (``set_param``: in place, where the steps point)."""

    def make(src_w: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            dest = aligned_empty(-(-size // 4), np.float32)
        src = np.ascontiguousarray(src_w, dtype=np.float32) if contiguous else src_w
        pair = (lib.memory(plain, _addr(src)), lib.memory(blocked, dest.ctypes.data))
        try:
            with reorder_team(lib, blocked):
                lib.run(reorder, (_Arg * 2)(_Arg(_ARG_SRC, pair[0]), _Arg(_ARG_DST, pair[1])), 2)
        finally:
            lib.destroy(memories=pair)
        return dest

    return make


def _layouted(kind: type[_Call], lib: Dnnl, pd: Any, mds: tuple[Any, Any], x: Any, out: Any,
              held_as: tuple[Any, Any], ctx: Any, args: list[tuple[int, Any]], keep: list[Any],
              mems: dict[str, Any], descs: list[Any]) -> _Call:
    """The call running primitive ``pd`` (source and destination ``mds``) from ``x`` into
    ``out``, which lie as ``held_as`` describes (descriptors this call takes over): each
    read in place where that is the primitive's own, else through a reorder in plan
    scratch (NCHW to NHWC, float32 to a reduced precision's operands; the result back to
    NCHW); ``args``: the primitive's other arguments (``(DNNL_ARG_*, memory)``). Every
    array whose address oneDNN holds stays referenced by the call (a plan's scratch is a
    view of an arena buffer that lives only as long as its views); the memories,
    descriptors and primitives are freed with it (with the plan that holds its step)."""
    src, dst = mds
    descs = [*descs, src, dst, *held_as]
    pad = lib.query_md(pd, _QUERY_SCRATCHPAD_MD)
    scratch = ctx.scratch((max(lib.size(pad) // 4 + 16, 1),), np.float32)
    keep.append(scratch)
    mems["pad"] = lib.memory(pad, _addr(scratch))
    prims: list[tuple[Any, Any, int]] = []
    handles: list[Any] = [None, None]

    def held(arr: Any, md: Any, key: int) -> Any:
        """A memory over ``arr`` itself (its address set per run when it is a caller's)."""
        if isinstance(arr, Dyn):
            handles[key] = lib.memory(md, 0)
            return handles[key]
        keep.append(arr)
        return lib.memory(md, _addr(arr))

    def reorder(a: str, b: str) -> tuple[Any, Any, int]:
        return (lib.reorder(mds_of[a], mds_of[b]), (_Arg * 2)(_Arg(_ARG_SRC, mems[a]), _Arg(_ARG_DST, mems[b])), 2)

    x_as, y_as = held_as
    in_place = lib.equal(x_as, src), lib.equal(y_as, dst)
    mds_of = {"x_nhwc": src, "y_nhwc": dst, "x": x_as, "y": y_as}
    if in_place[0]:
        mems["x_nhwc"] = held(x, src, 0)
    else:
        x_nhwc = ctx.scratch((-(-lib.size(src) // 4),), np.float32)
        keep.append(x_nhwc)
        mems["x"], mems["x_nhwc"] = held(x, x_as, 0), lib.memory(src, _addr(x_nhwc))
        prims.append(reorder("x", "x_nhwc"))
    if in_place[1]:
        mems["y_nhwc"] = held(out, dst, 1)
    else:
        y_nhwc = ctx.scratch((-(-lib.size(dst) // 4),), np.float32)
        keep.append(y_nhwc)
        mems["y_nhwc"] = lib.memory(dst, _addr(y_nhwc))
    main = [_Arg(_ARG_SRC, mems["x_nhwc"]), _Arg(_ARG_DST, mems["y_nhwc"]), _Arg(_ARG_SCRATCHPAD, mems["pad"]),
            *(_Arg(a, m) for a, m in args)]
    prims.append((lib.primitive(pd), (_Arg * len(main))(*main), len(main)))
    if not in_place[1]:
        mems["y"] = held(out, y_as, 1)
        prims.append(reorder("y_nhwc", "y"))
    call = kind(lib, tuple(prims), (handles[0], handles[1]), tuple(keep))
    weakref.finalize(call, lib.destroy, tuple(mems.values()), tuple(p for p, _, _ in prims), tuple(descs))
    return call


def pool_steps(lib: Dnnl, x: Any, out: Any, is_max: bool, include_pad: bool, kernel: tuple[int, int],
               stride: tuple[int, int], dilation: tuple[int, int], pads: tuple[int, int, int, int], ctx: Any,
               src_cl: bool = False, dst_cl: bool = False) -> list[Step] | None:
    """A float32 max or average pool as one step on oneDNN (NHWC where ``src_cl`` /
    ``dst_cl`` say so, and in the build's reduced format where ``x`` or ``out`` is held
    so, like ``conv_steps``); None where it does not apply. ONNX's ``ceil_mode`` windows become
    padding on the bottom and right, which a max pool ignores and an average pool
    excluding padding does not count; an average pool counting its padding is declined
    where that padding would count too."""
    if not (_f32_or_held(x) and _f32_or_held(out)) or out.size == 0:
        return None
    held = (_held(x), _held(out))
    n, c, h, wd = (x.shape[0], x.shape[3], x.shape[1], x.shape[2]) if src_cl else x.shape
    oh, ow = out.shape[1:3] if dst_cl else out.shape[2:]
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    pt, pl, pb, pr = pads
    # The bottom and right padding that makes oneDNN's floor division give ONNX's size.
    pb2 = (oh - 1) * sh + (kh - 1) * dh + 1 - h - pt
    pr2 = (ow - 1) * sw + (kw - 1) * dw + 1 - wd - pl
    if pb2 < 0 or pr2 < 0 or (not is_max and include_pad and (pb2, pr2) != (pb, pr)):
        return None
    alg = _POOL_MAX if is_max else _POOL_AVG_INCLUDE if include_pad else _POOL_AVG_EXCLUDE
    as_held = held_types(ctx, held, (src_cl, dst_cl))
    if as_held is None:
        return None
    dtype = as_held[0] if as_held[0] == as_held[1] else _F32  # (held on one side only: a reorder there)
    pd = None
    try:
        src, dst = lib.md((n, c, h, wd), _ACDB, dtype), lib.md((n, c, oh, ow), _ACDB, dtype)
        pd = lib.pool_pd(alg, src, dst, stride, kernel, dilation, (pt, pl), (pb2, pr2))
        _jit_impl(lib, pd, dtype, paying=False)
        lies = (lib.md((n, c, h, wd), _ACDB if src_cl else _ABCD, as_held[0]),
                lib.md((n, c, oh, ow), _ACDB if dst_cl else _ABCD, as_held[1]))
        call = _layouted(_PoolCall, lib, pd, (src, dst), x, out, lies, ctx, [], [], {}, [])
    except DnnlError as exc:
        log.debug("rlx-cpu: oneDNN declined a pool %s -> %s: %s", tuple(x.shape), tuple(out.shape), exc)
        return None
    finally:
        if pd is not None:
            lib.destroy(pds=(pd,))
    return [Step(call, (x, out))]


def _addr(arr: np.ndarray) -> int:
    """The address of a plan buffer or resident (fixed for the plan's life)."""
    return int(arr.__array_interface__["data"][0])


def concat_steps(lib: Dnnl, ins: list[Any], out: Any, axis: int, ctx: Any) -> list[Step] | None:
    """A concat of float32 NHWC plan buffers (shaped ``(n, h, w, c)``) along ``axis`` of
    that order, as oneDNN's concat (threaded, vectorized copies); None where an input is
    a caller's array or not float32. numpy's copies into the strided channel blocks of an
    NHWC output ran DenseNet's concats at twice the time of the NCHW model's. Every
    input and the output may instead be held in the build's reduced format (``held.py``)."""
    held = _held(out)
    if any(isinstance(x, Dyn) or x.dtype != (HELD16 if held else np.float32) or not x.flags.c_contiguous
           for x in (*ins, out)):
        return None
    to_nchw = (0, 3, 1, 2)  # oneDNN's logical order is NCHW: its dims, with the NHWC tag
    as_held = held_types(ctx, (held, held), (True, True))
    if as_held is None:
        return None
    pd = None
    try:
        dst = lib.md(tuple(out.shape[p] for p in to_nchw), _ACDB, as_held[1])
        srcs = [lib.md(tuple(x.shape[p] for p in to_nchw), _ACDB, as_held[0]) for x in ins]
        pd = lib.concat_pd(dst, to_nchw.index(axis), srcs)
        _jit_impl(lib, pd, as_held[0], paying=False)
        prim = lib.primitive(pd)
    except DnnlError as exc:
        log.debug("rlx-cpu: oneDNN declined a concat into %s: %s", tuple(out.shape), exc)
        return None
    finally:
        if pd is not None:
            lib.destroy(pds=(pd,))
    mems = [lib.memory(md, _addr(x)) for md, x in zip(srcs, ins)] + [lib.memory(dst, _addr(out))]
    args = [_Arg(_ARG_MULTIPLE_SRC + i, m) for i, m in enumerate(mems[:-1])] + [_Arg(_ARG_DST, mems[-1])]
    call = _Call(lib, ((prim, (_Arg * len(args))(*args), len(args)),), (None, None), (*ins, out))
    weakref.finalize(call, lib.destroy, tuple(mems), tuple(p for p, _, _ in call.prims), (dst, *srcs))
    return [Step(call, (ins[0], out))]


#: The fused GEMM's activations (``ACTIVATION_OPS``) as oneDNN eltwise post-ops.
ACTIVATION_POST = {"relu": "relu", "gelu": "gelu_erf", "gelu_tanh": "gelu_tanh", "sigmoid": "logistic",
                   "tanh": "tanh"}
