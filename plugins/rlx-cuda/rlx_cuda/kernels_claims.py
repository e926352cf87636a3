"""The op claims of the cuda backend, importable without CuPy or the step builders.

Each op here has a builder in ``kernels.build_steps``; a test checks the two agree.
Composites claimed (softmax, layer_norm, reduce_mean, global_avg_pool2d, attention,
sigmoid, gelu, rsqrt) run as one kernel (or a few) instead of their decomposition;
``gemm`` and ``fused_elementwise`` are the compile pipeline's fused ops.
"""

from __future__ import annotations

from rlx_core.ops import ELEMENTWISE_OPS, OpKind

__all__ = ["CLAIMED_OPS"]

CLAIMED_OPS: frozenset[str] = frozenset(
    {op.value for op in ELEMENTWISE_OPS}
    | {op.value for op in (
        OpKind.MATMUL, OpKind.GEMM, OpKind.FUSED_ELEMENTWISE, OpKind.SOFTMAX, OpKind.LAYER_NORM,
        OpKind.REDUCE_SUM, OpKind.REDUCE_MEAN, OpKind.REDUCE_MAX, OpKind.RESHAPE, OpKind.TRANSPOSE,
        OpKind.CONCAT, OpKind.SLICE, OpKind.GATHER, OpKind.CONV2D, OpKind.MAX_POOL2D, OpKind.AVG_POOL2D,
        OpKind.GLOBAL_AVG_POOL2D, OpKind.ATTENTION)}
)  # fmt: skip
