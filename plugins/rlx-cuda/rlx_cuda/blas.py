"""Matrix products planned once at compile and issued straight to cuBLAS.

``cupy.matmul`` re-derives shapes, strides and transposes on every call, may copy a
strided operand (an allocation, which rules out CUDA graph capture) and costs tens of
microseconds of Python per call. A graph's products have fixed shapes, so the layout
work is done here once: each operand becomes a cuBLAS operation (``N`` for a row-major
matrix, ``T`` for a transposed view, so a transposed weight needs no copy), a leading
dimension and one batch stride (0 when the operand is broadcast over the batch); the
run-time call is a single ``cublasGemmEx`` / ``cublasGemmStridedBatchedEx`` on the
executable's own cuBLAS handle (``cublas.py``), with the pointers read from the value
slots at that moment.

Row-major ``C = A @ B`` is issued as column-major ``C^T = B^T @ A^T`` (cuBLAS is
column-major), which reads every row-major buffer in place.

``layout`` and ``plan_gemm`` are pure Python (tested without a GPU); ``GemmCall`` needs
CuPy. Operands that fit no cuBLAS layout (a batch that is neither contiguous nor
broadcast, say) are copied to a contiguous workspace by the caller (``plan_gemm``
says which).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Layout", "GemmPlan", "layout", "plan_gemm", "GemmCall", "GEMM_DTYPES"]

#: Dtypes planned onto cuBLAS; other dtypes (integers) go through ``cupy.matmul``.
GEMM_DTYPES = frozenset({"float16", "float32", "float64"})
OP_N, OP_T = 0, 1  # cublasOperation_t


@dataclass(frozen=True)
class Layout:
    """One operand as cuBLAS reads it: operation, leading dimension, batch stride (elements)."""

    op: int
    ld: int
    batch_stride: int


@dataclass(frozen=True)
class GemmPlan:
    """``out[b] = a[b] @ b[b]`` for ``batch`` products of ``(m, k) @ (k, n)``.

    ``a`` and ``b`` are ``None`` when that operand must first be copied to a contiguous
    array of the full batch (``copy_a`` / ``copy_b`` hold the shape to copy to).
    """

    m: int
    n: int
    k: int
    batch: int
    a: Layout | None
    b: Layout | None
    copy_a: tuple[int, ...] | None = None
    copy_b: tuple[int, ...] | None = None


def _batch_stride(shape: Sequence[int], strides: Sequence[int], out_batch: Sequence[int]) -> int | None:
    """The one stride walking ``shape``'s batch dims (broadcast to ``out_batch``) in the
    output's order, or ``None`` when no single stride does."""
    nb = len(out_batch)
    own = list(shape[:-2])
    own_strides = list(strides[:-2])
    pad = nb - len(own)
    dims = [1] * pad + own
    st = [0] * pad + own_strides
    st = [0 if d == 1 and o != 1 else s for d, s, o in zip(dims, st, out_batch)]  # broadcast dims
    live = [(o, s) for o, s in zip(out_batch, st) if o != 1]
    if not live or all(s == 0 for _, s in live):
        return 0
    unit = live[-1][1]
    expected = unit
    for o, s in reversed(live):
        if s != expected:
            return None
        expected *= o
    return unit


def layout(shape: Sequence[int], strides: Sequence[int], out_batch: Sequence[int]) -> Layout | None:
    """How cuBLAS reads a row-major-indexed matrix operand of ``shape`` with element
    ``strides`` (its last two dims are the matrix), or ``None`` if it cannot in place."""
    rows, cols = shape[-2], shape[-1]
    s_r, s_c = strides[-2], strides[-1]
    batch = _batch_stride(shape, strides, out_batch)
    if batch is None:
        return None
    if (s_c == 1 or cols == 1) and (rows == 1 or s_r >= cols) and s_r > 0:
        return Layout(OP_N, max(s_r if rows > 1 else cols, cols, 1), batch)
    if (s_r == 1 or rows == 1) and (cols == 1 or s_c >= rows) and s_c > 0:
        return Layout(OP_T, max(s_c if cols > 1 else rows, rows, 1), batch)
    return None


def plan_gemm(a_shape: Sequence[int], a_strides: Sequence[int], b_shape: Sequence[int],
              b_strides: Sequence[int], out_shape: Sequence[int]) -> GemmPlan:
    """The cuBLAS plan of ``matmul(a, b)`` into a C-contiguous ``out_shape`` (operands of
    at least two dims; strides in elements)."""
    m, k = a_shape[-2], a_shape[-1]
    n = b_shape[-1]
    out_batch = tuple(out_shape[:-2])
    batch = math.prod(out_batch)
    la = layout(a_shape, a_strides, out_batch)
    lb = layout(b_shape, b_strides, out_batch)
    copy_a = None if la is not None else (*out_batch, m, k)
    copy_b = None if lb is not None else (*out_batch, k, n)
    if la is None:
        la = Layout(OP_N, max(k, 1), m * k if batch > 1 else 0)
    if lb is None:
        lb = Layout(OP_N, max(n, 1), k * n if batch > 1 else 0)
    return GemmPlan(m, n, k, batch, la, lb, copy_a, copy_b)


def element_strides(arr: Any) -> tuple[int, ...]:
    """An array's strides in elements (numpy and CuPy arrays give bytes)."""
    return tuple(s // arr.itemsize for s in arr.strides)


class GemmCall:
    """One planned product on a ``cublas.Blas``: ``call(a, b, out)`` with device arrays
    whose shapes and strides are the planned ones (only their pointers may change)."""

    def __init__(self, blas: Any, plan: GemmPlan, dtype: str, tf32: bool = False) -> None:
        from cupy_backends.cuda.api import runtime
        from cupy_backends.cuda.libs import cublas

        self._blas = blas
        self.plan = plan
        if dtype == "float64":
            self._type, compute, coef = runtime.CUDA_R_64F, cublas.CUBLAS_COMPUTE_64F, np.float64
        elif dtype == "float16":
            self._type, compute, coef = runtime.CUDA_R_16F, cublas.CUBLAS_COMPUTE_32F, np.float32
        else:
            self._type = runtime.CUDA_R_32F
            compute = cublas.CUBLAS_COMPUTE_32F_FAST_TF32 if tf32 else cublas.CUBLAS_COMPUTE_32F
            coef = np.float32
        self._compute = compute
        self._algo = cublas.CUBLAS_GEMM_DEFAULT
        self._one = np.ones(1, dtype=coef)  # host scalars (pointer mode host), kept alive here
        self._zero = np.zeros(1, dtype=coef)

    def __call__(self, a: Any, b: Any, out: Any) -> None:
        p, la, lb = self.plan, self.plan.a, self.plan.b
        assert la is not None and lb is not None
        if p.m == 0 or p.n == 0:
            return
        if p.k == 0:
            out.fill(0)
            return
        one, zero, t = self._one.ctypes.data, self._zero.ctypes.data, self._type
        # Column-major C^T (n x m) = B^T (n x k) @ A^T (k x m): B comes first.
        if p.batch == 1:
            self._blas.gemm_ex(lb.op, la.op, p.n, p.m, p.k, one, b.data.ptr, t, lb.ld, a.data.ptr, t, la.ld, zero,
                               out.data.ptr, t, p.n, self._compute, self._algo)
        else:
            self._blas.gemm_strided_batched_ex(
                lb.op, la.op, p.n, p.m, p.k, one, b.data.ptr, t, lb.ld, lb.batch_stride, a.data.ptr, t, la.ld,
                la.batch_stride, zero, out.data.ptr, t, p.n, p.m * p.n, p.batch, self._compute, self._algo)
