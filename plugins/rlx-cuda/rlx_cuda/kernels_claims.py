"""The op claims of the cuda backend, importable without CuPy or the step builders.

Each op here has a builder in ``kernels.build_steps``; a test checks the two agree.
Composites claimed (softmax, layer_norm, reduce_mean, global_avg_pool2d, attention,
sigmoid, gelu, rsqrt) run as one kernel (or a few) instead of their decomposition;
``gemm``, ``fused_elementwise`` and ``fused_conv`` are the compile pipeline's fused ops.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlx_core.ir.ops import MORE_TRIG_OPS, OpKind

__all__ = ["CLAIMED_OPS", "RENDERED_ELEMENTWISE", "EPILOGUE_DTYPE_CHANGES", "unrendered_ops"]

#: The elementwise ops ``codegen._render`` writes as CUDA C. The IR's other elementwise
#: ops (floor, ceil, round, fmod, the bitwise ops and shifts) have no rendering here: a
#: graph using them is unsupported on cuda, and a fused region holding one is declined.
RENDERED_ELEMENTWISE: frozenset[OpKind] = frozenset({
    OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.DIV, OpKind.POW, OpKind.MAXIMUM, OpKind.MINIMUM, OpKind.NEG,
    OpKind.ABS, OpKind.EXP, OpKind.LOG, OpKind.SQRT, OpKind.RSQRT, OpKind.ERF, OpKind.TANH, OpKind.SIGMOID,
    OpKind.RELU, OpKind.GELU, OpKind.EQUAL, OpKind.LESS, OpKind.GREATER, OpKind.CAST, OpKind.WHERE, OpKind.SIN,
    OpKind.COS, *MORE_TRIG_OPS,
})

CLAIMED_OPS: frozenset[str] = frozenset(
    {op.value for op in RENDERED_ELEMENTWISE}
    | {op.value for op in (
        OpKind.MATMUL, OpKind.GEMM, OpKind.FUSED_ELEMENTWISE, OpKind.SOFTMAX, OpKind.LAYER_NORM,
        OpKind.REDUCE_SUM, OpKind.REDUCE_MEAN, OpKind.REDUCE_MAX, OpKind.RESHAPE, OpKind.TRANSPOSE,
        OpKind.CONCAT, OpKind.SLICE, OpKind.GATHER, OpKind.CONV2D, OpKind.MAX_POOL2D, OpKind.AVG_POOL2D,
        OpKind.GLOBAL_AVG_POOL2D, OpKind.ATTENTION, OpKind.FUSED_CONV)}
)


#: Ops whose result is not their operands' dtype: a convolution's epilogue holding one
#: would not fit the convolution's output buffer, so such a ``fused_conv`` is declined.
EPILOGUE_DTYPE_CHANGES: frozenset[str] = frozenset(
    op.value for op in (OpKind.CAST, OpKind.EQUAL, OpKind.LESS, OpKind.GREATER))


def unrendered_ops(program: Iterable[Any]) -> list[str]:
    """The ops of a ``fused_elementwise`` program (``(op, args, attrs)`` instructions)
    that ``codegen`` cannot write, sorted; empty when the region can run here."""
    rendered = {op.value for op in RENDERED_ELEMENTWISE}
    return sorted({OpKind(ins[0]).value for ins in program} - rendered)
