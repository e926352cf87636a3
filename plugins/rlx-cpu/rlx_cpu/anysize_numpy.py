"""The any-size executable's ops that numpy computes exactly as the reference does.

An export's mask arithmetic (int64 positions, bool masks: ``where``, comparisons, casts),
its embedding gathers, concats (rotary halves, stacked indices), the mean of an RMS norm,
and fused regions of such ops have no native kernel here (the native interpreter is
float32); the plan's kernel built per run for each costs ~50 µs of Python, most of a
small request. numpy's ufuncs compute each of these ops exactly as the interpreter
defines it (integers wrap, comparisons and selects are exact, a float32 sum,
difference, product or quotient is one IEEE operation), and the reductions as the plan's
kernels call them, so one numpy call serves; so do sine and cosine, whose plan kernel is
numpy's own function. Anything else (float to integer casts, integer division, other
transcendental functions) is left to the plan's kernel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.ir import Node
from rlx_core.ir.internal_types import Instruction
from rlx_core.ir.ops import OpKind

from .anysize_kernels import Built, Place, Runner, elementwise_program
from .anysize_memory import Arena

__all__ = ["numpy_runner"]

_BINARY = {OpKind.ADD: np.add, OpKind.SUB: np.subtract, OpKind.MUL: np.multiply, OpKind.MAXIMUM: np.maximum,
           OpKind.MINIMUM: np.minimum, OpKind.EQUAL: np.equal, OpKind.LESS: np.less, OpKind.GREATER: np.greater,
           OpKind.BITWISE_AND: np.bitwise_and, OpKind.BITWISE_OR: np.bitwise_or,
           OpKind.BITWISE_XOR: np.bitwise_xor}
_UNARY = {OpKind.NEG: np.negative, OpKind.ABS: np.absolute, OpKind.BITWISE_NOT: np.invert}
#: Functions whose plan kernel is numpy's own ufunc (``kernels._UNARY_UFUNCS``: the native
#: interpreter has none of them), so numpy's call is the plan's answer: a rotary table's angles.
_PLANS_OWN = {OpKind.SIN: np.sin, OpKind.COS: np.cos}
_UFUNCS = {**_BINARY, **_UNARY, **_PLANS_OWN, OpKind.DIV: np.divide}  # (a division: float32 only, ``_exact``)


def _exact(ins: Instruction, arg_dtypes: Sequence[str]) -> bool:
    """Whether numpy computes ``ins`` exactly as the interpreter (see the module)."""
    kinds = {np.dtype(d).kind for d in (*arg_dtypes, ins.dtype)}
    if ins.op in _BINARY or ins.op in _UNARY or ins.op is OpKind.WHERE:
        return not kinds & {"c", "V"} and (ins.op not in (OpKind.MAXIMUM, OpKind.MINIMUM) or "f" not in kinds)
    if ins.op is OpKind.DIV:
        return kinds == {"f"} and ins.dtype == "float32"
    if ins.op in _PLANS_OWN:  # (float16: the plan computes in float32)
        return kinds == {"f"} and ins.dtype in ("float32", "float64")
    if ins.op is OpKind.CAST:  # not float to integer (the interpreter's rule for NaN and range)
        return not (np.dtype(arg_dtypes[0]).kind == "f" and np.dtype(ins.dtype).kind in "iu")
    return False


def _program(node: Node, nodes: Sequence[Node]) -> list[Instruction] | None:
    ins = [nodes[i] for i in node.inputs]
    program = elementwise_program(node, ins)
    if program is None:
        return None
    dtypes = [n.dtype for n in ins]
    for step in program:
        if not _exact(step, [dtypes[a] for a in step.args]):
            return None
        dtypes.append(step.dtype)
    return program


def _reduction(node: Node) -> Any:
    """The numpy reduction computing ``node`` as the plan's kernel does, or ``None``: a
    max (exact), a float32 or integer sum, a float32 mean (a sum over the count)."""
    dtype = node.dtype
    if node.op is OpKind.REDUCE_MAX and dtype in ("float32", "int32", "int64"):
        return np.maximum.reduce
    if node.op is OpKind.REDUCE_SUM and dtype in ("float32", "int32", "int64"):
        return np.add.reduce
    if node.op is OpKind.REDUCE_MEAN and dtype == "float32":
        return np.add.reduce
    return None


def reduce_runner(node: Node, reduce: Any, place: Place) -> Runner:
    x_id, axes, keep = node.inputs[0], node.attrs["axes"], node.attrs["keepdims"]
    mean = node.op is OpKind.REDUCE_MEAN

    def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
        x = values[x_id]
        out = place(values, env, arena)
        reduce(x, axes, out.dtype, out, keep)
        if mean:
            np.divide(out, out.dtype.type(math.prod(x.shape[a] for a in axes)), out=out)
        return out
    return run


def numpy_runner(node: Node, nodes: Sequence[Node], place: Place, built: Built) -> Runner | None:
    """Elementwise ops and fused regions of them, and gathers, as numpy calls (see the
    module); ``None`` for any other node. A gather whose indices fall outside the table
    is left to the plan's kernel, which names them."""
    inputs = node.inputs
    if node.op is OpKind.GATHER:
        axis = node.attrs["axis"]

        def gather(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
            x, idx = values[inputs[0]], values[inputs[1]]
            out = place(values, env, arena)
            try:
                np.take(x, idx, axis=axis, out=out)
            except IndexError:
                built([x, idx], out, env, arena)
            return out
        return gather
    if node.op is OpKind.CONCAT:
        axis = node.attrs["axis"]

        def concat(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
            out = place(values, env, arena)
            np.concatenate([values[i] for i in inputs], axis=axis, out=out)
            return out
        return concat
    reduce = _reduction(node)
    if reduce is not None:
        return reduce_runner(node, reduce, place)
    program = _program(node, nodes)
    if program is None:
        return None
    steps = [(_UFUNCS.get(s.op), s.op, s.args, np.dtype(s.dtype)) for s in program]

    def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
        out = place(values, env, arena)
        args = [values[i] for i in inputs]
        for fn, op, at, dtype in steps:
            if op is OpKind.WHERE:
                got = np.where(args[at[0]], args[at[1]], args[at[2]])
            elif op is OpKind.CAST:
                got = np.asarray(args[at[0]]).astype(dtype)
            else:
                got = fn(*(args[a] for a in at))
            args.append(np.asarray(got, dtype=dtype))
        np.copyto(out, args[-1])
        return out
    return run
