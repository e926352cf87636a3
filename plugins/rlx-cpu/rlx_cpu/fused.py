"""Step builders for the pipeline's fused ops: ``fused_elementwise`` regions, ``gemm``
and ``fused_conv``.

A region of k elementwise ops run one op at a time over a big array streams every
intermediate through main memory: k full-size reads and writes. Here the output is cut
into blocks of about ``BLOCK_ELEMENTS`` elements (whole trailing rows, so every block is
a contiguous slice), and each block runs the whole program with its intermediates in a
few block-sized registers that stay in cache; only the region's inputs are read from
memory and only its result is written. Each instruction is built by the op's ordinary
builder (``kernels.py``) on block views, so a region computes exactly what its ops
compute one by one (float16 rounding included).

Registers are reused once their value is dead, and an instruction writes over an
operand's register when that operand dies there and the op's kernel is in-place safe.
The last instruction writes straight into the output block, unless one of its operands
is a region input at a position its kernel may not overwrite (the executor may hand the
region an input's buffer as its output): then it goes through a register and a copy.

``gemm`` is the matmul into the output, then its epilogue (bias add and activation) as a
blocked program over the output itself, in place while each block is in cache.

``fused_conv`` is the convolution into the output with its epilogue run by the native
kernel itself, on each part of the output as it is finished (``regions.epilogue``): the
implicit GEMM per chunk of a channel's outputs, the depthwise kernels per plane, rlx's
GEMM per block of rows. Where the kernel that runs the convolution cannot (another dtype,
a run-time operand, numpy's path), the epilogue follows as a region of its own.
"""

from __future__ import annotations

import itertools
import math
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from rlx_core.ir import Node
from rlx_core.ir.ops import OpKind
from rlx_core.plugin import (
    ACTIVATION_OPS,
    CONV_ATTRS,
    Instruction,
    conv_inputs,
    live_instructions,
    make_instruction,
    program_types,
)

from . import gemm
from .halves import in_float32
from .kernels import KERNELS, BuildContext, inplace_positions
from .nn_kernels import conv2d_steps
from .onednn_matmul import dense_steps
from .regions import Epilogue, epilogue, node_steps, region_steps
from .steps import Parallel, Step, helper_threads

__all__ = ["FUSED_KERNELS", "BLOCK_ELEMENTS", "block_plan", "gemm_epilogue", "program_epilogue", "region_after"]

#: Elements per block: a few float32 registers of this size stay in a 256 KiB-1 MiB L2.
BLOCK_ELEMENTS = 16384
#: Regions of at least this many elements run as two halves on two threads, in blocks of
#: PARALLEL_BLOCK (see ``steps.Parallel``: 1.4x on the suite's 1024x1024 chain).
PARALLEL_ELEMENTS = 1 << 19
PARALLEL_BLOCK = 65536


class _Type(NamedTuple):
    shape: tuple[int, ...]
    dtype: str


class _BlockScratch:
    """A ``BuildContext`` handing out the same memory to the same request in every block.

    Builders ask for temporaries each time they are called (once per block); request
    ``n`` of instruction ``k`` always gets the buffer of its first (largest) block.
    """

    def __init__(self, ctx: BuildContext) -> None:
        self._ctx = ctx
        self._raw: dict[tuple[Any, int], np.ndarray] = {}
        self._key: Any = None
        self._n = 0

    def begin(self, key: Any) -> None:
        self._key, self._n = key, 0

    def bytes(self, key: tuple[Any, int], nbytes: int) -> np.ndarray:
        raw = self._raw.get(key)
        if raw is None or raw.nbytes < nbytes:
            raw = self._raw[key] = self._ctx.scratch((max(nbytes, 8),), np.uint8)
        return raw

    def scratch(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize
        raw = self.bytes((self._key, self._n), n)
        self._n += 1
        return raw[:n].view(dtype).reshape(shape)


def block_plan(shape: tuple[int, ...], block: int = BLOCK_ELEMENTS) -> tuple[int, int]:
    """``(axis, length)``: blocks fix every axis before ``axis``, take ``length`` indices of
    ``axis`` and all of the axes after it (about ``block`` elements in all)."""
    for axis in range(len(shape)):
        inner = math.prod(shape[axis + 1 :])
        if inner <= block:
            return axis, max(1, block // max(inner, 1))
    return 0, 1  # pragma: no cover - the last axis always fits (inner == 1)


def _blocks(shape: tuple[int, ...], axis: int, length: int):
    """Yield ``(fixed, start, stop)`` for every block of an array of ``shape``."""
    for fixed in itertools.product(*(range(d) for d in shape[:axis])):
        for start in range(0, shape[axis], length):
            yield fixed, start, min(start + length, shape[axis])


def _index(vshape: tuple[int, ...], ndim: int, axis: int, fixed: tuple[int, ...], start: int,
           stop: int) -> tuple[Any, ...]:
    """The index of a block in a value of shape ``vshape`` that broadcasts to the output."""
    offset = ndim - len(vshape)
    index: list[Any] = []
    for j, d in enumerate(vshape):
        k = j + offset  # the output axis this value axis lines up with
        if k < axis:
            index.append(fixed[k] if d > 1 else 0)
        elif k == axis:
            index.append(slice(start, stop) if d > 1 else slice(0, 1))
        else:
            index.append(slice(None))
    return tuple(index)


def _block_shape(vshape: tuple[int, ...], ndim: int, axis: int, n: int) -> tuple[int, ...]:
    offset = ndim - len(vshape)
    out = []
    for j, d in enumerate(vshape):
        k = j + offset
        if k == axis:
            out.append(n if d > 1 else 1)
        elif k > axis:
            out.append(d)
    return tuple(out)


def _pseudo(ins: Instruction, shape: tuple[int, ...], name: str) -> Node:
    return Node(-1, ins.op, (), MappingProxyType(ins.attrs), shape, ins.dtype, name)


def _registers(instructions: list[Instruction], n_inputs: int, final_direct: bool) -> list[int]:
    """A register number per instruction (-1: the output), reusing dead ones, in place
    where the kernel allows it."""
    last = {}
    for k, ins in enumerate(instructions):
        for a in ins.args:
            last[a] = k
    reg: list[int] = []
    free: list[tuple[int, tuple[int, ...], str]] = []  # (register, shape, dtype)
    kinds: dict[int, tuple[tuple[int, ...], str]] = {}
    count = 0
    for k, ins in enumerate(instructions):
        if k == len(instructions) - 1 and final_direct:
            reg.append(-1)
            break
        chosen = None
        safe = inplace_positions(_pseudo(ins, ins.shape, ""))
        for pos in safe:
            a = ins.args[pos]
            if a >= n_inputs and last[a] == k and ins.args.count(a) == 1:
                r = reg[a - n_inputs]
                if kinds.get(r) == (ins.shape, ins.dtype) and r != -1:
                    chosen = r
                    break
        dead = {reg[a - n_inputs] for a in set(ins.args) if a >= n_inputs and last[a] == k}
        if chosen is None:
            for i, (_, shape, dtype) in enumerate(free):
                if (shape, dtype) == (ins.shape, ins.dtype):
                    chosen = free.pop(i)[0]
                    break
        if chosen is None:
            chosen, count = count, count + 1
        kinds[chosen] = (ins.shape, ins.dtype)
        for r in dead - {chosen}:
            free.append((r, *kinds[r]))
        reg.append(chosen)
    return reg


def program_steps(instructions: list[Instruction], ins: list[Any], out: np.ndarray, ctx: BuildContext,
                  name: str = "", block: int = BLOCK_ELEMENTS) -> list[Step]:
    """The steps evaluating ``instructions`` over operands ``ins`` into ``out``, block by block."""
    n_in = len(ins)
    instructions = live_instructions(instructions, n_in)
    used = {a for instr in instructions for a in instr.args if a < n_in}
    final = instructions[-1]
    safe_final = inplace_positions(_pseudo(final, final.shape, name))
    final_direct = final.shape == out.shape and all(
        pos in safe_final for pos, a in enumerate(final.args) if a < n_in
    )
    regs = _registers(instructions, n_in, final_direct)
    scratch = _BlockScratch(ctx)
    ndim = out.ndim
    steps: list[Step] = []
    if ndim == 0:
        plan = [((), 0, 0)]
        axis, length = 0, 0
    else:
        axis, length = block_plan(out.shape, block)
        plan = list(_blocks(out.shape, axis, length))
    reg_bytes: dict[int, int] = {}
    for k, instr in enumerate(instructions):
        if regs[k] >= 0:
            full = _block_shape(instr.shape, ndim, axis, min(length, out.shape[axis])) if ndim else instr.shape
            reg_bytes[regs[k]] = max(reg_bytes.get(regs[k], 0), math.prod(full) * np.dtype(instr.dtype).itemsize)
    # One block spanning the whole output (small regions): the operands themselves, not
    # views of them; a view of a run-time input would cost an indexing call every run.
    whole = ndim == 0 or (axis == 0 and len(plan) == 1)
    views: dict[tuple[int, tuple[int, ...], str], np.ndarray] = {}
    for fixed, start, stop in plan:
        values: list[Any] = []
        for i, x in enumerate(ins):
            if whole or i not in used or x.ndim == 0:
                values.append(x)
            else:
                values.append(x[_index(x.shape, ndim, axis, fixed, start, stop)])
        out_block = out if whole else out[_index(out.shape, ndim, axis, fixed, start, stop)]
        for k, instr in enumerate(instructions):
            shape = instr.shape if ndim == 0 else _block_shape(instr.shape, ndim, axis, stop - start)
            if regs[k] == -1:
                target = out_block
            else:  # one array object per (register, shape, dtype): numpy runs an in-place ufunc
                # much faster on the same object than on two views of the same memory
                key = (regs[k], shape, instr.dtype)
                target = views.get(key)
                if target is None:
                    raw = scratch.bytes(("reg", regs[k]), reg_bytes[regs[k]])
                    dt = np.dtype(instr.dtype)
                    target = views[key] = raw[: math.prod(shape) * dt.itemsize].view(dt).reshape(shape)
            scratch.begin(k)
            node = _pseudo(instr, shape, name)
            if target.size:
                steps += KERNELS[instr.op](node, [values[a] for a in instr.args], target, scratch)
            values.append(target)
        if regs[-1] != -1 and out_block.size:
            steps.append(Step(np.copyto, (out_block, values[-1]), {"casting": "unsafe"}))
    return steps


def _types(ins: list[Any]) -> list[_Type]:
    return [_Type(tuple(x.shape), np.dtype(x.dtype).name) for x in ins]


def _halves(ins: list[Any], out: np.ndarray) -> tuple[tuple[list[Any], Any], tuple[list[Any], Any]] | None:
    """The operands and output of the two halves of ``out`` along its first axis longer
    than 1 (a broadcast operand keeps its whole extent there), or None if there is none."""
    axis = next((a for a, d in enumerate(out.shape) if d > 1), None)
    if axis is None:
        return None
    half = out.shape[axis] // 2
    parts = []
    for sl in (slice(0, half), slice(half, out.shape[axis])):
        index = (slice(None),) * axis + (sl,)
        part_ins = []
        for x in ins:
            k = axis - (out.ndim - x.ndim)  # the operand's axis aligned with the output's
            part_ins.append(x[(slice(None),) * k + (sl,)] if k >= 0 and x.shape[k] > 1 else x)
        parts.append((part_ins, out[index]))
    return parts[0], parts[1]


def _fused_elementwise(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step | Parallel]:
    program = node.attrs["program"]
    if (out.dtype == np.float16 and any(v.dtype == np.float16 for v in ins)
            and all(v.dtype in (np.float16, np.float32) for v in ins)
            and not any(op == OpKind.CAST.value for op, _, _ in program)):
        # a float16 chain on the float32 interpreter, rounded once (as its float32
        # temporaries round it); a cast inside names its own dtypes: left as written
        return in_float32(_fused_elementwise, node, ins, out, ctx)
    _, instructions = program_types(node.op, _types(ins), program)
    native = region_steps(instructions, ins, out)
    if native is not None:
        return native
    if out.size >= PARALLEL_ELEMENTS and helper_threads() > 0:
        halves = _halves(ins, out)
        if halves is not None:  # each half is a region of its own: its instructions typed on its operands
            first, second = (tuple(program_steps(program_types(node.op, _types(part), program)[1], part, part_out,
                                                 ctx, node.name, PARALLEL_BLOCK))
                             for part, part_out in halves)
            return [Parallel(first, second)]
    return program_steps(instructions, ins, out, ctx, node.name)


def native_region(node: Node, ins: list[Any], out: Any, typed: list[Any]) -> list[Step] | None:
    """Elementwise ``node`` (a fused region, or one op) on the native interpreter alone,
    its program typed on ``typed`` (the operands as the graph holds them, where ``ins``
    and ``out`` may be views held reduced: ``held.py``); None where it does not fit
    there."""
    if node.op is OpKind.FUSED_ELEMENTWISE:
        return program_region(node.attrs["program"], ins, out, typed)
    return node_steps(node, ins, out)


def program_region(program: Any, ins: list[Any], out: Any, typed: list[Any]) -> list[Step] | None:
    """A fused region's ``program`` on the native interpreter alone, typed on ``typed``
    (``native_region``); None where it does not fit there."""
    _, instructions = program_types(OpKind.FUSED_ELEMENTWISE, _types(typed), program)
    return region_steps(instructions, ins, out)


def _gemm(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    on_onednn = dense_steps(ins[0], ins[1], ins[2] if len(ins) == 3 else None, node.attrs["activation"], out, ctx)
    if on_onednn is not None:
        return on_onednn
    mm = Node(-1, OpKind.MATMUL, (), MappingProxyType({}), node.shape, node.dtype, node.name)
    operands: list[Any] = [out, *ins[2:]]
    program = gemm_epilogue(node)
    if not program:
        return KERNELS[OpKind.MATMUL](mm, ins[:2], out, ctx)

    def inside() -> Epilogue | None:
        # the bias and activation applied by rlx's GEMM to each block of C as it is final,
        # while it is in cache, instead of a pass of their own over the output (a ViT's
        # 1576 x 1536 dense layers at batch 8 spent 0.6-0.7 ms each in that pass, on the
        # 2-core Zen 3: BENCHMARKS.md, session 19)
        _, instructions = program_types(OpKind.FUSED_ELEMENTWISE, _types(operands), program)
        return epilogue(instructions, operands, out, ctx.scratch)

    step = gemm.matmul_epilogue_step(ins[0], ins[1], out, inside, ctx)
    if step is not None:
        return [step]
    return KERNELS[OpKind.MATMUL](mm, ins[:2], out, ctx) + region_after(program, operands, out, ctx, node.name)


def gemm_epilogue(node: Node) -> tuple[Any, ...]:
    """A ``gemm`` node's bias and activation as a region's program over ``(product, bias)``
    (the bias when the node has one; empty when it has neither)."""
    after: list[tuple[OpKind, tuple[int, ...], dict[str, Any]]] = []
    if len(node.inputs) == 3:
        after.append((OpKind.ADD, (0, 1), {}))
    spec = ACTIVATION_OPS[node.attrs["activation"]]
    if spec is not None:
        after.append((spec[0], (len(node.inputs) - 1 + len(after) - 1,), spec[1]))
    return tuple((op.value, args, tuple(sorted(attrs.items()))) for op, args, attrs in after)


def region_after(program: Any, operands: list[Any], out: np.ndarray, ctx: BuildContext, name: str) -> list[Step]:
    """``program`` over ``operands`` (the first: the result of the steps before) into
    ``out``, as a native region or else numpy's blocked program."""
    _, instructions = program_types(OpKind.FUSED_ELEMENTWISE, _types(operands), program)
    native = region_steps(instructions, operands, out)
    if native is not None:
        return native
    return program_steps(instructions, operands, out, ctx, name)


def _fused_conv(node: Node, ins: list[Any], out: np.ndarray, ctx: BuildContext) -> list[Step]:
    n_conv = conv_inputs(node.attrs)
    conv_ins, extra = ins[:n_conv], ins[n_conv:]
    conv_dtype = np.dtype(conv_ins[0].dtype)
    conv = Node(-1, OpKind.CONV2D, (), MappingProxyType({k: node.attrs[k] for k in CONV_ATTRS}), node.shape,
                conv_dtype.name, node.name)
    res = out if conv_dtype == out.dtype else ctx.scratch(out.shape, conv_dtype)
    operands = [res, *extra]
    program = node.attrs["program"]
    native = program_epilogue(program, operands, out, ctx) if res is out else None
    pending: list[Any] = []  # the bias, when it would be a pass of its own: the epilogue adds it
    steps, applied = conv2d_steps(conv, conv_ins, res, ctx, native, pending)
    if applied:
        return steps
    if pending:
        program, operands = _with_bias_first(program, operands, pending[0])
    return steps + region_after(program, operands, out, ctx, node.name)


def program_epilogue(program: Any, operands: list[Any], out: np.ndarray, ctx: BuildContext) -> Epilogue | None:
    """A fused node's ``program`` over ``operands`` (the first: ``out``, the kernel's own
    result) as the epilogue a native kernel runs over ``out`` as it finishes it, or None
    where the region interpreter cannot take it."""
    _, instructions = program_types(OpKind.FUSED_ELEMENTWISE, _types(operands), program)
    return epilogue(instructions, operands, out, ctx.scratch)


def _with_bias_first(program: Any, operands: list[Any], bias: Any) -> tuple[tuple, list[Any]]:
    """``program`` over ``operands`` (the convolution's result first) with ``bias`` (one
    per channel) added to that result first: one pass over the output instead of two."""
    m = len(operands)

    def moved(a: int) -> int:  # operand 0 is now the biased result; earlier results shift by the new one
        return m + 1 if a == 0 else a if a < m else a + 2

    first = make_instruction(OpKind.ADD, (0, m), {})
    rest = tuple(make_instruction(op, [moved(a) for a in args], dict(attrs)) for op, args, attrs in program)
    return (first, *rest), [*operands, bias.reshape(1, -1, 1, 1)]


FUSED_KERNELS = {OpKind.FUSED_ELEMENTWISE: _fused_elementwise, OpKind.GEMM: _gemm, OpKind.FUSED_CONV: _fused_conv}
