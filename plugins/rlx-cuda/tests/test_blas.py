"""The cuBLAS plan of a product (``blas.plan_gemm``), checked without a GPU by running the
plan as column-major BLAS would, with numpy, on the raw buffers the operands live in."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from rlx_cuda.blas import OP_N, OP_T, element_strides, layout, plan_gemm


def _colmajor(buf: np.ndarray, offset: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The column-major ``rows x cols`` matrix with leading dimension ``ld`` at ``offset``."""
    return as_strided(buf[offset:], shape=(rows, cols), strides=(buf.itemsize, ld * buf.itemsize))


def _run_plan(a: np.ndarray, b: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    """What cuBLAS computes for the plan: C^T (n x m) = op(B) @ op(A), per batch."""
    plan = plan_gemm(a.shape, element_strides(a), b.shape, element_strides(b), out_shape)
    if plan.copy_a:
        a = np.ascontiguousarray(np.broadcast_to(a, plan.copy_a))
    if plan.copy_b:
        b = np.ascontiguousarray(np.broadcast_to(b, plan.copy_b))
    abuf, aoff = _base(a)
    bbuf, boff = _base(b)
    out = np.zeros(out_shape, np.float64)
    flat = out.reshape(plan.batch, plan.m, plan.n)
    for i in range(plan.batch):
        ra = plan.a.batch_stride * i + aoff
        rb = plan.b.batch_stride * i + boff
        # The column-major operands as stored, then the operation cuBLAS applies.
        sa = _colmajor(abuf, ra, plan.k, plan.m, plan.a.ld) if plan.a.op == OP_N else \
            _colmajor(abuf, ra, plan.m, plan.k, plan.a.ld).T
        sb = _colmajor(bbuf, rb, plan.n, plan.k, plan.b.ld) if plan.b.op == OP_N else \
            _colmajor(bbuf, rb, plan.k, plan.n, plan.b.ld).T
        flat[i] = (sb @ sa).T  # C^T = B^T A^T, stored column-major = C row-major
    return out


def _base(x: np.ndarray) -> tuple[np.ndarray, int]:
    base = x
    while base.base is not None and isinstance(base.base, np.ndarray):
        base = base.base
    flat = base.reshape(-1)
    offset = (x.__array_interface__["data"][0] - flat.__array_interface__["data"][0]) // x.itemsize
    return flat, offset


RNG = np.random.default_rng(0)


def _r(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


CASES = {
    "plain": (_r(5, 3), _r(3, 4)),
    "b transposed view": (_r(5, 3), _r(4, 3).T),
    "a transposed view": (_r(3, 5).T, _r(3, 4)),
    "batched": (_r(2, 5, 3), _r(2, 3, 4)),
    "weight broadcast": (_r(2, 6, 5, 3), _r(3, 4)),
    "lhs broadcast": (_r(5, 3), _r(3, 3, 4)),
    "k transposed (attention)": (_r(2, 4, 5, 8), np.swapaxes(_r(2, 4, 6, 8), -1, -2)),
    "mixed broadcast copies": (_r(2, 1, 5, 3), _r(1, 3, 3, 4)),
    "vector rows": (_r(1, 3), _r(3, 1)),
    "sliced rows": (_r(5, 6)[:, :3], _r(3, 4)),
}


@pytest.mark.parametrize("name", CASES)
def test_plan_computes_the_product(name):
    a, b = CASES[name]
    want = np.matmul(a, b)
    got = _run_plan(a, b, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_layouts():
    assert layout((5, 3), (3, 1), ()).op == OP_N and layout((5, 3), (3, 1), ()).ld == 3
    t = layout((5, 3), (1, 5), ())
    assert t.op == OP_T and t.ld == 5
    assert layout((4, 5, 3), (15, 3, 1), (4,)).batch_stride == 15
    assert layout((5, 3), (3, 1), (4,)).batch_stride == 0  # broadcast over the batch
    assert layout((5, 3), (2, 2), ()) is None  # neither rows nor columns contiguous
    assert layout((2, 1, 5, 3), (15, 15, 3, 1), (2, 3)) is None  # half broadcast: no single stride
    plan = plan_gemm((2, 1, 5, 3), (15, 15, 3, 1), (1, 3, 3, 4), (36, 12, 4, 1), (2, 3, 5, 4))
    assert plan.copy_a == (2, 3, 5, 3) and plan.copy_b == (2, 3, 3, 4) and plan.batch == 6


class _FakeCublas:
    """Records the calls a handle makes; ``fail`` names the call that returns an error."""

    def __init__(self, fail: str = "") -> None:
        self.calls: list[str] = []
        self.fail = fail

    def __getattr__(self, name: str):
        def call(*args):
            self.calls.append(name)
            return 7 if name == self.fail else 0

        return call


class _Workspace:
    nbytes = 1 << 20
    data = type("Ptr", (), {"ptr": 4096})()


def test_owned_handle_binds_stream_and_workspace_and_is_destroyed():
    import gc

    from rlx_cuda.cublas import CtypesBlas, workspace_bytes

    lib = _FakeCublas()
    blas = CtypesBlas(lib, 1234, _Workspace())
    assert lib.calls == ["cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2"] and blas.capturable
    blas.gemm_ex(0, 0, 1, 1, 1)
    assert lib.calls[-1] == "cublasGemmEx"
    del blas
    gc.collect()
    assert lib.calls[-1] == "cublasDestroy_v2"
    with pytest.raises(RuntimeError, match="cublasSetWorkspace_v2 failed with cuBLAS status 7"):
        CtypesBlas(_FakeCublas("cublasSetWorkspace_v2"), 1234, _Workspace())
    assert workspace_bytes(9) == 32 << 20 and workspace_bytes(8) == 4 << 20
