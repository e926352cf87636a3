"""The cpu backend's thread policy (``rlx_cpu/threads.py``): native kernels stay on one
thread when a graph's products run on a BLAS pool that is not OpenMP's team."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core
from rlx_core.ops import OpKind
from rlx_cpu import blas, native, threads

OPENBLAS = {"user_api": "blas", "internal_api": "openblas", "threading_layer": "pthreads", "num_threads": 2}
MKL_GNU = {"user_api": "blas", "internal_api": "mkl", "threading_layer": "gnu", "num_threads": 2}
OMP = {"user_api": "openmp", "internal_api": "openmp", "num_threads": 2}


def test_pools_of_keeps_only_separate_multithreaded_blas_pools():
    assert threads._pools_of([OPENBLAS, MKL_GNU, OMP]) == ["openblas (pthreads threads, 2)"]
    assert threads._pools_of([{**OPENBLAS, "num_threads": 1}]) == []  # one thread: no pool to fight
    assert threads._pools_of([{**OPENBLAS, "threading_layer": "openmp"}]) == []  # on OpenMP's team
    assert threads._pools_of([{**MKL_GNU, "threading_layer": "intel"}]) == ["mkl (intel threads, 2)"]


def test_cap_only_for_graphs_with_products_and_a_separate_pool():
    pools = ["openblas (pthreads threads, 2)"]
    cap, why = threads.native_thread_cap([OpKind.ADD, OpKind.MATMUL], pools)
    assert cap == 1 and "matmul" in why and "openblas" in why
    assert threads.native_thread_cap([OpKind.ADD, OpKind.EXP], pools) == (None, "")  # the pool sleeps
    assert threads.native_thread_cap([OpKind.CONV2D], []) == (None, "")  # BLAS on OpenMP's team


def test_native_threads_honour_the_cap(native_lib):
    lib = native_lib
    if not lib.openmp:
        pytest.skip("the native kernels were built without OpenMP here")
    with native.thread_cap(1):
        assert lib.threads() == 1
    assert lib.threads() >= 1


@pytest.mark.parametrize("separate", [True, False])
def test_the_report_says_when_native_kernels_are_kept_on_one_thread(monkeypatch, separate):
    monkeypatch.setattr(threads, "separate_blas_pools", lambda: ("openblas (pthreads threads, 2)",) if separate else ())
    monkeypatch.setattr(blas, "mkl", lambda: None)
    g = rlx_core.Graph("dense")
    x = g.input("x", (8, 16))
    w = g.param("w", np.ones((16, 4), np.float32))
    g.set_outputs([g.relu(g.matmul(x, w))])
    cg = rlx_core.compile(g, device="cpu")
    noted = any("native kernels on one thread" in n for n in cg.report().notes)
    assert noted is separate
    np.testing.assert_allclose(cg.run({"x": np.ones((8, 16), np.float32)})[0], np.full((8, 4), 16.0))
