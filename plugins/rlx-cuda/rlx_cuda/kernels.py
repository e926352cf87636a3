"""Step builders: one node of the graph -> the CuPy calls that compute it on the GPU.

This is the thin GPU-only glue. The kernel sources come from ``codegen`` and
``nn_source`` (pure Python, tested without a GPU); here they are compiled through a
``KernelCache`` (once per source text, per backend) and bound to the executable's
buffers. A ``Step`` reads and writes the executable's value slots; every output buffer
exists before the first run, so a step allocates nothing unless it says so
(``allocates``), and a graph whose steps allocate nothing can be captured as a CUDA graph.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_core.errors import DeviceError
from rlx_core.ir import Node
from rlx_core.ir.ops import ELEMENTWISE_OPS, OpKind, slice_index
from rlx_core.plugin import ACTIVATION_OPS, conv_inputs, make_instruction

from . import cudnn
from . import nn_source as nn
from .blas import GEMM_DTYPES, GemmCall, plan_gemm
from .codegen import ElementwiseSource, elementwise_source, single_op_program, used_inputs
from .cublas import Blas, open_blas, workspace_bytes

__all__ = ["KernelCache", "Step", "BuildContext", "build_steps"]

Slots = list[Any]
Product = Callable[[Any, Any, Any], None]  # (a, b, out) device arrays



class KernelCache:
    """Compiled CuPy kernel objects by source text, shared by a backend's executables.

    CuPy compiles a kernel on its first launch per device (NVRTC, cached on disk too);
    keeping the objects here means each distinct source is built once per process.
    """

    def __init__(self, cp: Any) -> None:
        self._cp = cp
        self._lock = threading.Lock()
        self._kernels: dict[tuple, Any] = {}

    def _get(self, key: tuple, make: Callable[[], Any]) -> Any:
        with self._lock:
            k = self._kernels.get(key)
            if k is None:
                k = self._kernels[key] = make()
            return k

    def elementwise(self, src: ElementwiseSource | nn.IndexedSource) -> Any:
        cp = self._cp
        return self._get(("ew", src.name, src.body), lambda: cp.ElementwiseKernel(
            src.in_params, src.out_params, src.body, src.name))

    def raw(self, src: nn.RowSource) -> Any:
        return self._get(("raw", src.name, src.code), lambda: self._cp.RawKernel(src.code, src.name))

    def reduction(self, src: nn.ReductionSource) -> Any:
        cp = self._cp
        return self._get(("red", src.name), lambda: cp.ReductionKernel(
            src.in_params, src.out_params, src.map_expr, src.reduce_expr, src.post_map_expr, src.identity,
            src.name, src.reduce_type))

    def __len__(self) -> int:
        return len(self._kernels)


@dataclass
class Step:
    """One launch (or a few) of one node; ``allocates`` rules out CUDA graph capture."""

    name: str
    fn: Callable[[Slots], None]
    allocates: bool = False


@dataclass
class SharedWorkspace:
    """Scratch memory every convolution of an executable shares (its steps run one after
    another on one stream): sized to the largest need once every step is built."""

    need: int = 0
    buf: Any = None

    def ptr(self) -> int:
        return 0 if self.buf is None else int(self.buf.data.ptr)


@dataclass
class BuildContext:
    """What builders need besides the node: CuPy, the kernel cache, scratch memory and the
    error flags (one int32 per node that can fail on bad data)."""

    cp: Any
    cache: KernelCache
    tf32: bool = False
    stream_ptr: int = 0  # the executable's stream, which its cuBLAS handle is bound to
    cc_major: int = 0
    device: int = 0
    workspaces: list[Any] = field(default_factory=list)
    flag_nodes: list[Node] = field(default_factory=list)
    flags: Any = None  # the device int32 array, sized once every step is built
    _blas: Blas | None = None
    _dnn: cudnn.Cudnn | str | None = None
    conv_workspace: SharedWorkspace = field(default_factory=SharedWorkspace)
    conv_paths: list[str] = field(default_factory=list)  # how each convolution runs, for the report

    def blas(self) -> Blas:
        """The executable's cuBLAS handle (opened on first use, with its own workspace)."""
        if self._blas is None:
            ws = self.workspace((workspace_bytes(self.cc_major),), np.uint8)
            self._blas = open_blas(self.cp, self.stream_ptr, ws)
        return self._blas

    def dnn(self) -> cudnn.Cudnn | str:
        """The executable's cuDNN handle (opened on first use, and checked against the
        reference once per process and device: ``self_test``), or why there is none."""
        if self._dnn is None:
            dnn = cudnn.open_cudnn(self.stream_ptr, self.device)
            if not isinstance(dnn, str):
                why = cudnn.self_test(self.cp, dnn, self.device)
                if why is not None:
                    if str(cudnn.CUDNN.read()) == "on":
                        raise DeviceError(f"RLX_CUDA_CUDNN=on but {why}")
                    dnn = why
            self._dnn = dnn
        return self._dnn

    def finish(self) -> None:
        """Allocate what the steps share, now that every step is built."""
        ws = self.conv_workspace
        if ws.need and ws.buf is None:
            ws.buf = self.cp.empty((ws.need,), dtype=np.uint8)

    def workspace(self, shape: tuple[int, ...], dtype: Any) -> Any:
        buf = self.cp.empty(shape, dtype=dtype)
        self.workspaces.append(buf)
        return buf

    def flag_slot(self, node: Node) -> int:
        self.flag_nodes.append(node)
        return len(self.flag_nodes) - 1

    def flag(self, k: int) -> Any:
        return self.flags[k : k + 1]


def _elementwise(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext,
                 program: tuple) -> list[Step]:
    src = elementwise_source(program, [n.dtype for n in ins], [n.shape for n in ins])
    kern = ctx.cache.elementwise(src)
    used = [ids[i] for i in used_inputs(src)]
    if math.prod(node.shape) == 0:
        return []
    if src.uses_error_flag:
        k = ctx.flag_slot(node)
        return [Step(node.name or str(node.op), lambda s: kern(*[s[i] for i in used], ctx.flag(k), s[out]))]
    return [Step(node.name or str(node.op), lambda s: kern(*[s[i] for i in used], s[out]))]


def _c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def _product(ctx: BuildContext, dtype: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...],
             out_shape: tuple[int, ...], b_strides: tuple[int, ...] | None = None) -> Product:
    """``matmul(a, b) -> out`` planned once (``blas.py``): a direct cuBLAS call on the
    current stream, allocation-free (capturable); integer products use ``cupy.matmul``.
    ``b_strides`` describes a strided view of b (attention's k transposed)."""
    cp = ctx.cp
    if dtype not in GEMM_DTYPES:
        return lambda a, b, o: cp.matmul(a, b, out=o)
    a2 = (1, *a_shape) if len(a_shape) == 1 else tuple(a_shape)
    b2 = (*b_shape, 1) if len(b_shape) == 1 else tuple(b_shape)
    # The output's batch may be wider than both operands' (attention: v brings it); an
    # operand missing a batch dim is read with batch stride 0.
    batch = tuple(out_shape[:-2]) if len(a_shape) > 1 and len(b_shape) > 1 else np.broadcast_shapes(a2[:-2], b2[:-2])
    o2 = (*batch, a2[-2], b2[-1])
    bs = b_strides if b_strides is not None and len(b_shape) > 1 else _c_strides(b2)
    plan = plan_gemm(a2, _c_strides(a2), b2, bs, o2)
    call = GemmCall(ctx.blas(), plan, dtype, tf32=ctx.tf32)
    fix_a = _contiguous_operand(ctx, plan.copy_a, dtype)
    fix_b = _contiguous_operand(ctx, plan.copy_b, dtype)
    if (a2, b2, o2) == (tuple(a_shape), tuple(b_shape), tuple(out_shape)) and fix_a is None and fix_b is None:
        return call
    fa = fix_a or (lambda a: a)
    fb = fix_b or (lambda b: b)
    return lambda a, b, o: call(fa(a.reshape(a2)), fb(b.reshape(b2) if len(b_shape) == 1 else b), o.reshape(o2))


def _contiguous_operand(ctx: BuildContext, shape: tuple[int, ...] | None, dtype: str) -> Callable[[Any], Any] | None:
    """A copy into a workspace of ``shape`` for an operand cuBLAS cannot read in place."""
    if shape is None:
        return None
    cp, ws = ctx.cp, ctx.workspace(shape, np.dtype(dtype))

    def copy(x: Any) -> Any:
        cp.copyto(ws, cp.broadcast_to(x, shape))
        return ws

    return copy


def _gemm(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext) -> list[Step]:
    mm = _product(ctx, node.dtype, ins[0].shape, ins[1].shape, node.shape)
    steps = [Step(f"{node.name or 'gemm'}:matmul", lambda s: mm(s[ids[0]], s[ids[1]], s[out]))]
    program: list[tuple] = []
    operands = [node]
    if len(ins) == 3:
        operands.append(ins[2])
        program.append(make_instruction(OpKind.ADD, (0, 1), {}))
    spec = ACTIVATION_OPS[node.attrs["activation"]]
    if spec is not None:
        program.append(make_instruction(spec[0], (len(operands) + len(program) - 1,), spec[1]))
    if program:
        epi_ids = [out] + ([ids[2]] if len(ins) == 3 else [])
        steps += _elementwise(node, operands, out, epi_ids, ctx, tuple(program))
    return steps


def _reduce(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext,
            kind: str, axes: tuple[int, ...], keepdims: bool) -> list[Step]:
    kern = ctx.cache.reduction(nn.reduction_source(kind, node.dtype))
    x = ids[0]
    return [Step(node.name or kind, lambda s: kern(s[x], axis=axes, keepdims=keepdims, out=s[out]))]


def _rows(n: int, rows: int) -> tuple[tuple[int], tuple[int]]:
    return (max(rows, 1),), (nn.row_threads(n),)


def _softmax(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext) -> list[Step]:
    shape, axis = node.shape, node.attrs["axis"]
    n, inner = shape[axis], math.prod(shape[axis + 1 :])
    rows = math.prod(shape) // max(n, 1)
    if math.prod(shape) == 0:
        return []
    kern = ctx.cache.raw(nn.softmax_source(node.dtype))
    grid, block = _rows(n, rows)
    one = np.dtype(np.float64 if node.dtype == "float64" else np.float32).type(1.0)
    args = (np.int64(n), np.int64(inner), np.int64(rows), one)
    x = ids[0]
    return [Step(node.name or "softmax", lambda s: kern(grid, block, (s[x], s[x], s[out], *args)))]


def _broadcast_row(ctx: BuildContext, src_node: Node, src_id: int, norm: tuple[int, ...],
                   steps: list[Step]) -> Callable[[Slots], Any]:
    """A getter of ``src`` as a contiguous row of the normalized shape (copied into a
    workspace each run when it must be broadcast)."""
    if src_node.shape == norm:
        return lambda s: s[src_id]
    ws = ctx.workspace(norm, np.dtype(src_node.dtype))
    cp = ctx.cp
    steps.append(Step("broadcast", lambda s: cp.copyto(ws, cp.broadcast_to(s[src_id], norm))))
    return lambda s: ws


def _layer_norm(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext) -> list[Step]:
    shape, axis = node.shape, node.attrs["axis"]
    norm = shape[axis:]
    n = math.prod(norm)
    rows = math.prod(shape[:axis])
    if math.prod(shape) == 0:
        return []
    steps: list[Step] = []
    scale = _broadcast_row(ctx, ins[1], ids[1], norm, steps)
    has_bias = len(ins) == 3
    bias = _broadcast_row(ctx, ins[2], ids[2], norm, steps) if has_bias else scale
    kern = ctx.cache.raw(nn.layer_norm_source(node.dtype, has_bias))
    grid, block = _rows(n, rows)
    eps = np.dtype(np.float64 if node.dtype == "float64" else np.float32).type(node.attrs["eps"])
    args = (np.int64(n), np.int64(rows), eps)
    x = ids[0]
    steps.append(Step(node.name or "layer_norm",
                      lambda s: kern(grid, block, (s[x], scale(s), bias(s), s[out], *args))))
    return steps


def _copy_view(node: Node, out: int, view: Callable[[Any], Any], x: int, ctx: BuildContext) -> list[Step]:
    cp = ctx.cp
    if math.prod(node.shape) == 0:
        return []
    return [Step(node.name or str(node.op), lambda s: cp.copyto(s[out], view(s[x])))]


def _concat(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext) -> list[Step]:
    cp, axis = ctx.cp, node.attrs["axis"]
    steps, start = [], 0
    for n_in, i in zip(ins, ids):
        size = n_in.shape[axis]
        if size and math.prod(n_in.shape):
            index = (slice(None),) * axis + (slice(start, start + size),)
            steps.append(Step(node.name or "concat", lambda s, i=i, index=index: cp.copyto(s[out][index], s[i])))
        start += size
    return steps


def _gather(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext) -> list[Step]:
    x, idx = ins
    axis = node.attrs["axis"]
    if math.prod(node.shape) == 0:
        return []
    src = nn.gather_source(node.dtype, idx.dtype, x.shape[axis], math.prod(idx.shape), math.prod(x.shape[axis + 1 :]))
    kern = ctx.cache.elementwise(src)
    k = ctx.flag_slot(node)
    return [Step(node.name or "gather", lambda s: kern(s[ids[0]], s[ids[1]], ctx.flag(k), s[out]))]


def _pool(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext) -> list[Step]:
    a = node.attrs
    if math.prod(node.shape) == 0:
        return []
    if node.op is OpKind.MAX_POOL2D:
        src = nn.pool_source("max", node.dtype, ins[0].shape[2:], node.shape[2:], a["kernel"], a["stride"],
                             a["padding"], a["dilation"])
    else:
        src = nn.pool_source("avg", node.dtype, ins[0].shape[2:], node.shape[2:], a["kernel"], a["stride"],
                             a["padding"], count_include_pad=a["count_include_pad"])
    kern = ctx.cache.elementwise(src)
    return [Step(node.name or str(node.op), lambda s: kern(s[ids[0]], s[out]))]


def _conv2d(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext,
            program: tuple = ()) -> list[Step]:
    """A ``conv2d``, or a ``fused_conv`` (``program`` its epilogue over the convolution's
    result and ``ins[n_conv:]``): on cuDNN where it takes the convolution, else im2col +
    cuBLAS; the epilogue in one cuDNN call where it can, else as one elementwise kernel."""
    n_conv = conv_inputs(node.attrs) if node.op is OpKind.FUSED_CONV else len(ins)
    if math.prod(node.shape) == 0:
        return []
    extras, extra_ids = list(ins[n_conv:]), list(ids[n_conv:])
    on_dnn = _cudnn_conv(node, ins[:n_conv], out, ids[:n_conv], ctx, program, extras, extra_ids)
    steps, epilogue_done = on_dnn if on_dnn is not None else (_im2col_conv(node, ins[:n_conv], out, ids[:n_conv], ctx),
                                                             False)
    if program and not epilogue_done:
        steps += _elementwise(node, [node, *extras], out, [out, *extra_ids], ctx, program)
    return steps


def _cudnn_conv(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext, program: tuple,
                extras: list[Node], extra_ids: list[int]) -> tuple[list[Step], bool] | None:
    """The convolution (with its bias, and the epilogue when one call computes it) on
    cuDNN and whether that call computed the epilogue, or None when cuDNN does not take
    it (the reason is counted for the report)."""
    dnn = ctx.dnn()
    if isinstance(dnn, str):
        ctx.conv_paths.append(f"im2col + cuBLAS (no cuDNN: {dnn})")
        return None
    spec = cudnn.conv_spec(ins[0].shape, ins[1].shape, node.shape, node.attrs, ins[0].dtype)
    if isinstance(spec, str):
        ctx.conv_paths.append(f"im2col + cuBLAS (cuDNN does not take {spec})")
        return None
    residual = cudnn.fused_epilogue(program, [e.shape for e in extras], node.shape) if program else None
    fuse = residual is not None and node.dtype == "float32" == ins[0].dtype
    math_kind = cudnn.math_type(spec.dtype, ctx.tf32)
    try:
        plan = dnn.plan(spec, math_kind, fuse)
        if fuse and not cudnn.fused_call_runs(ctx.cp, dnn, plan, ctx.device):
            fuse, plan = False, dnn.plan(spec, math_kind, False)
    except DeviceError as exc:  # no algorithm for this one (or the call failed): it stays on im2col
        ctx.conv_paths.append(f"im2col + cuBLAS ({exc})")
        return None
    ws = ctx.conv_workspace
    ws.need = max(ws.need, plan.workspace)
    ctx.conv_paths.append(f"cuDNN {plan.algo_name}" + (" + bias, relu" if fuse else ""))
    xid, wid = ids[0], ids[1]
    name = node.name or str(node.op)
    if fuse:
        bias = (lambda s: s[ids[2]]) if len(ins) == 3 else _zeros(ctx, (spec.w[0],), spec.dtype)
        rid = extra_ids[residual] if residual is not None and residual >= 0 else None
        return [Step(f"{name}:cudnn", lambda s: dnn.forward_bias_relu(
            plan, s[xid].data.ptr, s[wid].data.ptr, bias(s).data.ptr, None if rid is None else s[rid].data.ptr,
            s[out].data.ptr, ws.ptr(), ws.need))], True
    steps = [Step(f"{name}:cudnn", lambda s: dnn.forward(plan, s[xid].data.ptr, s[wid].data.ptr, s[out].data.ptr,
                                                          ws.ptr(), ws.need))]
    return steps + _conv_bias(node, ins, out, ids, ctx), False


def _zeros(ctx: BuildContext, shape: tuple[int, ...], dtype: str) -> Callable[[Slots], Any]:
    buf = ctx.workspace(shape, np.dtype(dtype))
    buf.fill(0)
    return lambda s: buf


def _conv_bias(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext) -> list[Step]:
    if len(ins) != 3:
        return []
    cp, bid, o = ctx.cp, ids[2], ins[1].shape[0]
    return [Step(f"{node.name or 'conv2d'}:bias", lambda s: cp.add(s[out], s[bid].reshape(1, o, 1, 1), out=s[out]))]


def _im2col_conv(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext) -> list[Step]:
    a = node.attrs
    (n, c, h, w), (o, cg, kh, kw) = ins[0].shape, ins[1].shape
    groups, (_, _, oh, ow) = a["groups"], node.shape
    og, k, p = o // groups, cg * kh * kw, oh * ow
    wshape, oshape = (groups, og, k), (n, groups, og, p)
    mm = _product(ctx, ins[0].dtype, wshape, (n, groups, k, p), oshape)
    steps: list[Step] = []
    pointwise = (kh, kw) == (1, 1) and a["stride"] == (1, 1) and a["padding"] == (0, 0, 0, 0)
    if pointwise:
        cols = lambda s: s[ids[0]].reshape(n, groups, cg, h * w)
    else:
        buf = ctx.workspace((n, groups, k, p), np.dtype(ins[0].dtype))
        src = nn.im2col_source(ins[0].dtype, c, (h, w), (oh, ow), (kh, kw), a["stride"], a["padding"],
                               a["dilation"], groups)
        im2col = ctx.cache.elementwise(src)
        steps.append(Step(f"{node.name or 'conv2d'}:im2col", lambda s: im2col(s[ids[0]], buf)))
        cols = lambda s: buf
    wid = ids[1]
    gemm = lambda s: mm(s[wid].reshape(wshape), cols(s), s[out].reshape(oshape))
    steps.append(Step(f"{node.name or 'conv2d'}:gemm", gemm))
    return steps + _conv_bias(node, ins, out, ids, ctx)


def _attention(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext) -> list[Step]:
    q, k_node = ins[0], ins[1]
    scores_shape = (*node.shape[:-2], q.shape[-2], k_node.shape[-2])
    if math.prod(node.shape) == 0:
        return []
    dtype = np.dtype(node.dtype)
    scores = ctx.workspace(scores_shape, dtype)
    cp = ctx.cp
    qid, kid = ids[0], ids[1]
    # The scores carry the output's batch dims, which q and k may both lack (v brings
    # them): the planned product reads them with batch stride 0.
    kt_shape = (*k_node.shape[:-2], k_node.shape[-1], k_node.shape[-2])
    kt_strides = _c_strides(k_node.shape)
    kt_strides = (*kt_strides[:-2], kt_strides[-1], kt_strides[-2])  # k transposed: a view, read as op T
    mm_scores = _product(ctx, node.dtype, q.shape, kt_shape, scores_shape, b_strides=kt_strides)
    mm_values = _product(ctx, node.dtype, scores_shape, ins[2].shape, node.shape)
    steps = [Step(f"{node.name or 'attention'}:scores",
                  lambda s: mm_scores(s[qid], cp.swapaxes(s[kid], -1, -2), scores))]
    mode = "none"
    mask: Any = None
    if len(ins) == 4:
        mode = "bool" if ins[3].dtype == "bool" else "add"
        if ins[3].shape == scores_shape:
            mask_get = lambda s: s[ids[3]]
        else:
            mbuf = ctx.workspace(scores_shape, np.dtype(ins[3].dtype))
            steps.append(Step("mask", lambda s: cp.copyto(mbuf, cp.broadcast_to(s[ids[3]], scores_shape))))
            mask_get = lambda s: mbuf
        mask = mask_get
    lk = scores_shape[-1]
    rows = math.prod(scores_shape) // max(lk, 1)
    kern = ctx.cache.raw(nn.softmax_source(node.dtype, mode))
    grid, block = _rows(lk, rows)
    scale = np.dtype(np.float64 if node.dtype == "float64" else np.float32).type(node.attrs["scale"])
    args = (np.int64(lk), np.int64(1), np.int64(rows), scale)
    if mask is None:
        steps.append(Step("softmax", lambda s: kern(grid, block, (scores, scores, scores, *args))))
    else:
        steps.append(Step("softmax", lambda s: kern(grid, block, (scores, mask(s), scores, *args))))
    steps.append(Step(f"{node.name or 'attention'}:values", lambda s: mm_values(scores, s[ids[2]], s[out])))
    return steps


def build_steps(node: Node, ins: Sequence[Node], out: int, ids: Sequence[int], ctx: BuildContext) -> list[Step]:
    """The steps computing ``node`` into slot ``out`` from slots ``ids``."""
    op = node.op
    if op in ELEMENTWISE_OPS:
        return _elementwise(node, ins, out, ids, ctx, single_op_program(op, len(ins), node.attrs))
    if op is OpKind.FUSED_ELEMENTWISE:
        return _elementwise(node, ins, out, ids, ctx, node.attrs["program"])
    if op is OpKind.MATMUL:
        mm = _product(ctx, node.dtype, ins[0].shape, ins[1].shape, node.shape)
        return [Step(node.name or "matmul", lambda s: mm(s[ids[0]], s[ids[1]], s[out]))]
    if op is OpKind.GEMM:
        return _gemm(node, ins, out, ids, ctx)
    if op in (OpKind.REDUCE_SUM, OpKind.REDUCE_MEAN, OpKind.REDUCE_MAX):
        kind = {OpKind.REDUCE_SUM: "sum", OpKind.REDUCE_MEAN: "mean", OpKind.REDUCE_MAX: "max"}[op]
        return _reduce(node, ins, out, ids, ctx, kind, node.attrs["axes"], node.attrs["keepdims"])
    if op is OpKind.GLOBAL_AVG_POOL2D:
        return _reduce(node, ins, out, ids, ctx, "mean", (2, 3), True)
    if op is OpKind.SOFTMAX:
        return _softmax(node, ins, out, ids, ctx)
    if op is OpKind.LAYER_NORM:
        return _layer_norm(node, ins, out, ids, ctx)
    if op is OpKind.TRANSPOSE:
        perm = node.attrs["perm"]
        return _copy_view(node, out, lambda x: x.transpose(perm), ids[0], ctx)
    if op is OpKind.SLICE:
        index = slice_index(len(ins[0].shape), node.attrs)
        return _copy_view(node, out, lambda x: x[index], ids[0], ctx)
    if op is OpKind.CONCAT:
        return _concat(node, ins, out, ids, ctx)
    if op is OpKind.GATHER:
        return _gather(node, ins, out, ids, ctx)
    if op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D):
        return _pool(node, ins, out, ids, ctx)
    if op is OpKind.CONV2D:
        return _conv2d(node, ins, out, ids, ctx)
    if op is OpKind.FUSED_CONV:
        return _conv2d(node, ins, out, ids, ctx, node.attrs["program"])
    if op is OpKind.ATTENTION:
        return _attention(node, ins, out, ids, ctx)
    raise NotImplementedError(f"rlx-cuda has no kernel for {op}")  # claims() keeps this unreachable
