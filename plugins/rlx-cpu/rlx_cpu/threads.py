"""One thread policy for the cpu backend: BLAS and the native kernels share the cores.

The native kernels run their parallel regions on OpenMP's team (libgomp). A BLAS with an
OpenMP threading layer (MKL's GNU layer, an OpenMP build of OpenBLAS) runs on that same
team, so the two take turns on the same threads. numpy's wheels ship OpenBLAS with its
*own* pthreads pool: after each product its workers keep spinning for a while, and an
OpenMP region started meanwhile puts a second team on the same cores. On a 2-core host
that made an exported resnet18 143 ms instead of 55 (mobilenet_v3_small 43 vs 13 ms).

So a graph that calls products (matmul, gemm, conv2d, attention) while the BLAS has a
pool of its own with more than one thread runs its native kernels on the caller's
thread; graphs without products (elementwise chains: the BLAS pool sleeps) and hosts
whose BLAS shares OpenMP's team keep the native kernels parallel. Nothing is written to
the environment and no library's thread count is changed: what the libraries report is
read once per process with threadpoolctl.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlx_core.ops import OpKind

__all__ = ["PRODUCT_OPS", "separate_blas_pools", "native_thread_cap"]

log = logging.getLogger("rlx_cpu")

#: Ops whose kernels call the BLAS.
PRODUCT_OPS = frozenset({OpKind.MATMUL, OpKind.GEMM, OpKind.CONV2D, OpKind.ATTENTION})


def _pools_of(info: Sequence[Mapping[str, Any]]) -> list[str]:
    """The BLAS libraries in ``info`` (threadpoolctl's ``threadpool_info()``) that keep a
    thread pool of their own with more than one thread."""
    found = []
    for lib in info:
        if lib.get("user_api") != "blas" or int(lib.get("num_threads") or 1) <= 1:
            continue
        layer = str(lib.get("threading_layer") or "").lower()
        if layer in ("openmp", "gnu", "sequential", "disabled"):
            continue  # on OpenMP's team (or none): it takes turns with the native kernels
        found.append(f"{lib.get('internal_api', 'blas')} ({layer or 'own'} threads, {lib.get('num_threads')})")
    return found


@functools.lru_cache(maxsize=1)
def separate_blas_pools() -> tuple[str, ...]:
    """The loaded BLAS pools that are not OpenMP's team, read once per process."""
    import numpy as np  # noqa: F401  (numpy's BLAS must be loaded to be seen)

    try:
        from threadpoolctl import threadpool_info

        info = threadpool_info()
    except Exception as exc:  # an unreadable process map: assume the cores are shared
        log.debug("rlx-cpu: threadpoolctl could not read the thread pools: %s", exc)
        return ()
    return tuple(_pools_of(info))


def _products_pools() -> list[str]:
    """The separate pools that run rlx's products: with oneMKL loaded (``blas.py``), the
    products above ``MIN_MACS`` are MKL's and the small ones stay on numpy's OpenBLAS,
    which runs those on the calling thread: only MKL's own pool counts then."""
    from . import blas

    pools = list(separate_blas_pools())
    if blas.mkl() is not None:
        pools = [p for p in pools if not p.startswith("openblas")]
    return pools


def native_thread_cap(ops: Iterable[OpKind], pools: Sequence[str] | None = None) -> tuple[int | None, str]:
    """The cap on the native kernels' threads for a graph of ``ops`` (``None``: no cap)
    and the reason, for the compile report."""
    ops = list(ops)
    if not any(op in PRODUCT_OPS for op in ops):
        return None, ""
    pools = _products_pools() if pools is None else pools
    products = sorted({op.value for op in ops if op in PRODUCT_OPS})
    if not products or not pools:
        return None, ""
    return 1, (f"native kernels on one thread: the graph's products ({', '.join(products)}) run on "
               f"{pools[0]}, a pool that would fight OpenMP's for the cores")  # fmt: skip
