"""The internal ops the pipeline makes (``gemm``, ``fused_elementwise``, ``fused_conv``): their
expansion back into the ops they stand for, for a backend that does not claim them
(``expand``), and how reports name them (``describe_program``).

What they mean and how they are typed — the ops, the program format, the type rules —
is ``rlx_core/ir/internal_types.py`` (re-exported here); the reference evaluates them
(``reference.evaluate_internal``, re-exported too).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..ir.internal_types import (
    ACTIVATION_OPS,
    CONV_ATTRS,
    GEMM_ACTIVATIONS,
    MAX_PROGRAM_LENGTH,
    Instruction,
    conv_inputs,
    infer_internal,
    live_instructions,
    make_instruction,
    program_types,
)
from ..ir.ops import OpKind
from ..reference import evaluate_internal

if TYPE_CHECKING:
    from ..ir import Graph, Node, Value

__all__ = [
    "GEMM_ACTIVATIONS",
    "ACTIVATION_OPS",
    "MAX_PROGRAM_LENGTH",
    "Instruction",
    "infer_internal",
    "evaluate_internal",
    "expand",
    "program_types",
    "make_instruction",
    "describe_program",
    "live_instructions",
]


def expand(g: Graph, node: Node, ins: Sequence[Value]) -> Value:
    """Emit the plain ops ``node`` stands for into ``g`` (for a backend that does not claim it)."""
    if node.op is OpKind.GEMM:
        y = g.matmul(ins[0], ins[1])
        if len(ins) == 3:
            y = g.add(y, ins[2])
        spec = ACTIVATION_OPS[node.attrs["activation"]]
        if spec is not None:
            y = g.add_node(spec[0], [y.id], spec[1])
        return y
    values = list(ins)
    if node.op is OpKind.FUSED_CONV:
        n_conv = conv_inputs(node.attrs)
        conv = g.add_node(OpKind.CONV2D, [v.id for v in ins[:n_conv]], {k: node.attrs[k] for k in CONV_ATTRS})
        values = [conv, *ins[n_conv:]]
    for op, args, attrs in node.attrs["program"]:
        values.append(g.add_node(op, [values[a].id for a in args], dict(attrs)))
    return values[-1]


def describe_program(node: Node) -> str:
    """``gemm(relu)`` or ``exp, add, mul (3 ops)``: how reports name an internal node."""
    if node.op is OpKind.GEMM:
        bias = "+bias" if len(node.inputs) == 3 else ""
        return f"gemm(matmul{bias}, {node.attrs['activation']})"
    ops = [ins[0] for ins in node.attrs["program"]]
    if node.op is OpKind.FUSED_CONV:
        return f"conv2d{'+bias' if node.attrs['bias'] else ''} + {', '.join(ops)}"
    return f"{', '.join(ops)} ({len(ops)} ops)"
