"""The any-size executable's kernels for the ops whose plan kernels cost too much to build
per run (``anysize.py``): each reads its sizes from the arrays of the run.

- a dense layer with resident weights on oneDNN's matmul made once for every row count
  (``RunTimeDense``), where this host chose oneDNN for products and the run's product has
  ``DENSE_MIN_MACS`` multiply-adds or more; else every float32 product on oneMKL's sgemm
  (numpy's without it), its bias and activation one pass after;
- float32 elementwise ops and fused regions on the native interpreter, planned once for
  every size (``regions.RegionTemplate``);
- layer norm with resident scale and bias on the native kernel, its rows counted per run;
- attention: the products on oneMKL, the mask added on the native interpreter, the
  native softmax; a softmax over the last axis on the native kernel;
- slices copied with their bounds evaluated at the run's sizes.

Each returns ``None`` where it does not apply, and falls back per run to ``built`` (the
plan's kernel built for the run's arrays) where the arrays of a run do not suit it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.ir import Node
from rlx_core.ir.internal_types import ACTIVATION_OPS, Instruction, program_types
from rlx_core.ir.ops import ELEMENTWISE_OPS, OpKind, slice_index
from rlx_core.ir.shape_rules import evaluate_attr, has_sym, holds_sym

from . import onednn
from .anysize_memory import Arena
from .blas import matmul_now, mkl
from .ccall import address_of
from .fused import gemm_epilogue
from .gemm import stacked_rows, use_native
from .native import library as native_library
from .native_nn import LAYER_NORM_NS, SOFTMAX_NS
from .onednn_dense import RunTimeDense
from .onednn_steps import ACTIVATION_POST
from .regions import SPLIT_NS, NoFit, RegionTemplate

__all__ = ["Runner", "Place", "Built", "elementwise_program", "dense_layer", "dense_runner", "product_runner",
           "region_runner", "layer_norm_runner", "attention_runner", "softmax_runner", "slice_runner",
           "transpose_runner", "DENSE_MIN_MACS"]

log = logging.getLogger("rlx_cpu")

#: float32 ops numpy's ufuncs compute exactly as the interpreter does (one IEEE operation).
_UFUNCS = {OpKind.ADD: np.add, OpKind.SUB: np.subtract, OpKind.MUL: np.multiply, OpKind.DIV: np.divide}
#: Outputs up to this many elements take a lone bias, or one of ``_UFUNCS``, as one numpy
#: call (a few µs) rather than a pass on the interpreter (its plan per call: ~15 µs), which
#: pays from here on (every core).
_SMALL_PASS = 32 * 1024

#: Products of fewer multiply-adds than this run on the BLAS's sgemm where oneDNN's matmul
#: with a run-time row count serves the larger ones (``dense_runner``).
DENSE_MIN_MACS = 1 << 22

#: Computes a node in a run: ``(values, sizes, arena) -> its value``.
Runner = Callable[[list[Any], Mapping[str, int], Arena], Any]
#: Gives a node's output array in a run (same arguments).
Place = Callable[[list[Any], Mapping[str, int], Arena], np.ndarray]
#: The plan's kernel for a node built for a run's arrays and run: ``(inputs, out, sizes, arena)``.
Built = Callable[[list[Any], np.ndarray, Mapping[str, int], Arena], None]


def dense_layer(node: Node, nodes: Sequence[Node], resident: Mapping[int, np.ndarray],
                precision: str = "fp32") -> RunTimeDense | None:
    """A dense layer with resident float32 weights (k, n) on oneDNN's matmul made once
    for every row count, where this host chose oneDNN for products or takes a reduced
    ``precision`` (``CompileOptions.precision``) there: a ``gemm``, or under a reduced
    precision a ``matmul`` by a resident matrix too (a layer without bias)."""
    if node.dtype != "float32" or not (node.op is OpKind.GEMM or (node.op is OpKind.MATMUL and precision != "fp32")):
        return None
    a_id, w_id = node.inputs[:2]
    w = resident.get(w_id)
    bias = resident.get(node.inputs[2]) if len(node.inputs) == 3 else None
    act = node.attrs.get("activation", "none")
    if (w is None or w.ndim != 2 or w.dtype != np.float32 or nodes[a_id].dtype != "float32"
            or min(w.strides) <= 0 or (act != "none" and act not in ACTIVATION_POST)
            or act not in ACTIVATION_OPS):
        return None
    n = w.shape[1]
    if len(node.inputs) == 3 and (bias is None or bias.dtype != np.float32 or bias.size != n
                                  or bias.shape[-1] != n or not bias.flags.c_contiguous):
        return None
    found = onednn.reduced(precision)
    lib = found[0] if found is not None else onednn.use("matmul")
    if lib is None:
        return None
    try:
        dense = RunTimeDense(lib, w, bias.reshape(1, n) if bias is not None else None, act, precision)
    except onednn.DnnlError as exc:
        log.debug("rlx-cpu: oneDNN declined %s at run-time sizes: %s", node.describe(), exc)
        return None
    return dense


def dense_runner(node: Node, dense: RunTimeDense, place: Place, small: Runner | None = None) -> Runner:
    """``dense`` for the run's rows, or ``small`` (the BLAS's product) below
    ``DENSE_MIN_MACS``: oneDNN's matmul with a run-time row count pays a fixed cost per call
    that a small layer does not amortize (BENCHMARKS.md, "Shape buckets")."""
    a_id, k, n = node.inputs[0], dense.k, dense.n
    least_rows = -(-DENSE_MIN_MACS // max(k * n, 1)) if small is not None else 0

    def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
        a = values[a_id]
        if a.size < least_rows * k:
            return small(values, env, arena)  # type: ignore[misc]
        out = place(values, env, arena)
        if out.size:
            a2 = a.reshape(-1, k)
            if not (a2.flags.c_contiguous and a2.flags.aligned):
                a2 = np.ascontiguousarray(a2)
            dense(a2, out.reshape(-1, n))
        return out
    return run


def product_runner(node: Node, nodes: Sequence[Node], resident: Mapping[int, np.ndarray], place: Place,
                   built: Built, templates: list[RegionTemplate]) -> Runner | None:
    """A float32 product (``matmul``, or ``gemm`` with its bias and activation) where the
    BLAS runs products on this host (not oneDNN's matmul, not rlx's GEMM, whose kernel is
    built per run around weights packed once): oneMKL's sgemm (or numpy's) called with
    the run's sizes, then the bias and activation as one pass on the native interpreter
    (planned once, like a region)."""
    if node.op not in (OpKind.MATMUL, OpKind.GEMM) or node.dtype != "float32" or any(
            nodes[i].dtype != "float32" for i in node.inputs):
        return None
    if use_native(nodes[node.inputs[0]].shape[-1] if not has_sym(nodes[node.inputs[0]].shape[-1:]) else None):
        return None  # rlx's GEMM, built per run around its weights packed once (the executable's derived)
    a_id, b_id = node.inputs[:2]
    epilogue = None
    program = gemm_epilogue(node) if node.op is OpKind.GEMM else ()  # the plan's: bias, then activation
    if program:
        lib = native_library()
        if lib is None:
            return None
        instructions = program_types(OpKind.FUSED_ELEMENTWISE, [node, *(nodes[i] for i in node.inputs[2:])],
                                     program)[1]
        known = {1: resident[node.inputs[2]]} if len(node.inputs) == 3 and node.inputs[2] in resident else {}
        try:
            epilogue = RegionTemplate(lib, instructions, len(node.inputs) - 1, known)
        except NoFit:
            return None
        templates.append(epilogue)
    rest = node.inputs[2:]
    w = resident.get(b_id)
    mkl_lib = mkl()
    dense = (mkl_lib is not None and w is not None and w.ndim == 2 and w.flags.c_contiguous and min(w.shape) > 0
             and max(w.shape) < 2**31)
    bias = resident.get(rest[0]) if rest and len(program) == 1 and rest[0] in resident else None
    if dense:
        k, n = w.shape
        sgemm, w_at = mkl_lib.sgemm, w.ctypes.data  # a resident: held, and refilled in place by set_param

    def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
        a, b = values[a_id], values[b_id]
        out = place(values, env, arena)
        if not out.size:
            return out
        if a.shape[-1] == 0 or (a.ndim < 2 or b.ndim < 2):  # an empty sum, a vector: the plan's kernel
            built([values[i] for i in node.inputs], out, env, arena)
            return out
        if dense and a.flags.c_contiguous and out.flags.c_contiguous and a.dtype == np.float32:
            m = a.size // k  # a dense layer: one product of every leading row, called directly
            sgemm(101, 111, 111, m, n, k, 1.0, address_of(a), k, w_at, n, 0.0, address_of(out), n)
        else:
            matmul_now(*stacked_rows(a, b, out))  # (batch, seq, k) @ (k, n): one product of batch * seq rows
        if epilogue is not None:
            if bias is not None and out.size <= _SMALL_PASS:  # a bias alone on a small output: one numpy add
                np.add(out, bias, out=out)
                return out
            try:
                epilogue([out, *(values[i] for i in rest)], out)
            except NoFit:
                built([values[i] for i in node.inputs], out, env, arena)
        return out
    return run


def elementwise_program(node: Node, ins: Sequence[Node]) -> list[Instruction] | None:
    """``node`` as a fused program over its inputs ``ins``: a fused region's own, or one
    instruction for an elementwise op; ``None`` for any other op."""
    if node.op is OpKind.FUSED_ELEMENTWISE:
        return program_types(node.op, ins, node.attrs["program"])[1]
    if node.op in ELEMENTWISE_OPS:
        return [Instruction(node.op, tuple(range(len(ins))), dict(node.attrs), node.shape, node.dtype)]
    return None


def region_runner(node: Node, nodes: Sequence[Node], resident: Mapping[int, np.ndarray], place: Place,
                  built: Built, templates: list[RegionTemplate]) -> Runner | None:
    """A float32 elementwise op or fused region on the native interpreter, planned once
    for every size (``regions.RegionTemplate``). Bool inputs are read as they lie (0/1
    floats to the program). An input of another dtype that the region only casts to
    float32 (an exporter's ``(1 - mask) * -10000`` over an int64 mask) is cast by numpy
    first, into a buffer of the arena, and read as float32."""
    lib = native_library()
    ins = [nodes[i] for i in node.inputs]
    if lib is None or node.dtype != "float32" or not ins:
        return None
    instructions = elementwise_program(node, ins)
    if instructions is None:
        return None
    cast = {k for k, x in enumerate(ins) if x.dtype not in ("float32", "bool")}  # cast per run first
    if any(k in i.args and (i.op is not OpKind.CAST or i.dtype != "float32") for i in instructions for k in cast):
        return None
    known = {k: resident[i] for k, i in enumerate(node.inputs) if i in resident and k not in cast}
    in_types = ["bool" if x.dtype == "bool" else "float32" for x in ins]  # (bools: read as 0/1 floats)
    try:
        template = RegionTemplate(lib, instructions, len(ins), known, in_types)
    except NoFit:
        return None
    templates.append(template)
    inputs = node.inputs
    ufunc = _UFUNCS.get(node.op) if not cast else None  # numpy computes these alike: small outputs take it
    f32 = np.dtype(np.float32)

    def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
        args = [values[i] for i in inputs]
        out = place(values, env, arena)
        if out.size and cast:
            taken = []
            for k in cast:
                x = args[k]
                cx, raw = arena.take(x.shape, f32)
                np.copyto(cx, x, casting="unsafe")
                args[k] = cx
                taken.append(raw)
            try:
                template(args, out)
            except NoFit:
                built([values[i] for i in inputs], out, env, arena)
            finally:
                for raw in taken:
                    arena.give(raw)
            return out
        if out.size:
            if ufunc is not None and out.size <= _SMALL_PASS:
                ufunc(*args, out=out)
                return out
            try:
                template(args, out)
            except NoFit:  # operands it cannot take as they are: the plan's kernel
                built(args, out, env, arena)
        return out
    return run


def transpose_runner(node: Node, place: Place) -> Runner | None:
    """A transpose: the input's permuted view copied into the output, no kernel built."""
    if node.op is not OpKind.TRANSPOSE:
        return None
    x_id, perm = node.inputs[0], tuple(node.attrs["perm"])

    def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
        out = place(values, env, arena)
        np.copyto(out, values[x_id].transpose(perm))
        return out
    return run


def layer_norm_runner(node: Node, resident: Mapping[int, np.ndarray], place: Place, built: Built) -> Runner | None:
    """A float32 layer norm with resident scale (and bias) on the native kernel, its
    rows counted per run."""
    lib = native_library()
    if lib is None or node.op is not OpKind.LAYER_NORM or node.dtype != "float32":
        return None
    axis, eps = node.attrs["axis"], float(node.attrs["eps"])
    scale = resident.get(node.inputs[1])
    bias = resident.get(node.inputs[2]) if len(node.inputs) == 3 else None
    inner = tuple(node.shape[axis:])
    if (has_sym(inner) or scale is None or tuple(scale.shape) != inner or scale.dtype != np.float32
            or not scale.flags.c_contiguous or (len(node.inputs) == 3 and (
                bias is None or tuple(bias.shape) != inner or bias.dtype != np.float32
                or not bias.flags.c_contiguous))):
        return None
    length = math.prod(inner)
    x_id = node.inputs[0]
    scale_p, bias_p = scale.ctypes.data, (bias.ctypes.data if bias is not None else None)  # residents: held

    def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
        x = values[x_id]
        out = place(values, env, arena)
        if out.size and length:
            if not (x.dtype == np.float32 and x.flags.c_contiguous and x.flags.aligned) or (
                    np.may_share_memory(x, out) and x.ctypes.data != out.ctypes.data):
                built([values[i] for i in node.inputs], out, env, arena)
                return out
            rows = out.size // length
            lib.layer_norm(address_of(x), scale_p, bias_p, address_of(out), rows, length, length, eps,
                           lib.threads_for(rows * length * LAYER_NORM_NS, SPLIT_NS))
        return out
    return run


def attention_runner(node: Node, nodes: Sequence[Node], place: Place, built: Built) -> Runner | None:
    """float32 attention (no mask, or an additive float32 one): ``q @ k^T`` on oneMKL
    (numpy without it), the mask added on the native interpreter, the native softmax
    over each row (the scale inside it, or applied to ``q`` first where a mask comes
    between), then ``@ v``; the scores in a buffer of the arena."""
    lib = native_library()
    if (lib is None or node.op is not OpKind.ATTENTION or node.dtype != "float32"
            or any(nodes[i].dtype != "float32" for i in node.inputs)):
        return None
    q_id, k_id, v_id = node.inputs[:3]
    m_id = node.inputs[3] if len(node.inputs) == 4 else None
    fixed = node.attrs.get("scale")
    nan_zero = int(bool(node.attrs.get("nan_to_zero")))
    f32 = np.dtype(np.float32)
    # the mask added over the scores on the native interpreter (every core; numpy's add is one)
    masked = RegionTemplate(lib, [Instruction(OpKind.ADD, (0, 1), {}, node.shape, "float32")], 2, {})

    def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
        q, k, v = values[q_id], values[k_id], values[v_id]
        out = place(values, env, arena)
        lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
        if not out.size:
            return out
        if lk == 0:  # softmax over no keys: the plan's kernel says what that is
            built([values[i] for i in node.inputs], out, env, arena)
            return out
        scale = fixed if fixed is not None else (1.0 / math.sqrt(d) if d else 1.0)
        mask_batch = values[m_id].shape[:-2] if m_id is not None and values[m_id].ndim > 2 else ()
        # the batch dims of q, k and the mask: v's others broadcast in the product with v
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], mask_batch)
        if np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) != batch:  # the mask's, which q and k lack
            q = np.ascontiguousarray(np.broadcast_to(q, (*batch, *q.shape[-2:])))
        scores, raw = arena.take((*batch, lq, lk), f32)
        scaled = None
        try:
            if m_id is not None and scale != 1.0:  # scaled before the mask: q, not the larger scores
                qs, scaled = arena.take(q.shape, f32)
                np.multiply(q, f32.type(scale), out=qs)
                q, scale = qs, 1.0
            matmul_now(q, k.swapaxes(-1, -2), scores)
            if m_id is not None:
                mask = values[m_id]
                try:
                    if scores.size <= _SMALL_PASS:
                        raise NoFit  # small: one numpy add
                    masked([scores, mask], scores)
                except NoFit:
                    np.add(scores, mask, out=scores)
            rows = scores.size // lk
            at = address_of(scores)
            lib.softmax(at, at, rows, lk, lk, scale, nan_zero,
                        lib.threads_for(rows * lk * SOFTMAX_NS, SPLIT_NS))
            matmul_now(scores, v, out)
        finally:
            arena.give(raw)
            if scaled is not None:
                arena.give(scaled)
        return out
    return run


def softmax_runner(node: Node, place: Place, built: Built) -> Runner | None:
    """A float32 softmax over the last axis on the native kernel, its rows counted per run."""
    lib = native_library()
    if lib is None or node.op is not OpKind.SOFTMAX or node.dtype != "float32" or \
            node.attrs["axis"] != len(node.shape) - 1:
        return None
    x_id = node.inputs[0]

    def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
        x = values[x_id]
        out = place(values, env, arena)
        length = out.shape[-1] if out.ndim else 0
        if not out.size or not length:
            return out
        if not (x.flags.c_contiguous and x.dtype == np.float32):
            built([x], out, env, arena)
            return out
        rows = out.size // length
        lib.softmax(address_of(x), address_of(out), rows, length, length, 1.0, 0,
                    lib.threads_for(rows * length * SOFTMAX_NS, SPLIT_NS))
        return out
    return run


def slice_runner(node: Node, place: Place, built: Built) -> Runner | None:
    """A slice copied out of its input with its bounds evaluated at the run's sizes (the
    symbolic type rule normalized them); where the view taken does not have the shape
    the graph says (a bound whose normal form holds for other sizes only), the plan's
    kernel, its bounds normalized again."""
    if node.op is not OpKind.SLICE:
        return None
    x_id = node.inputs[0]
    fixed = {k: v for k, v in node.attrs.items() if not holds_sym(v)}
    sized = {k: v for k, v in node.attrs.items() if holds_sym(v)}

    def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
        x = values[x_id]
        out = place(values, env, arena)
        attrs = {**fixed, **{k: evaluate_attr(v, env) for k, v in sized.items()}}
        view = x[slice_index(x.ndim, attrs)]
        if view.shape == out.shape:
            np.copyto(out, view)
        else:
            built([x], out, env, arena)
        return out
    return run
