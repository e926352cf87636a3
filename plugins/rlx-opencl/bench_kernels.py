"""Micro-benchmarks of rlx-opencl's generated kernels, through whole graph runs.

    python plugins/rlx-opencl/bench_kernels.py            # sgemm 1024^3, elementwise, overhead
    python plugins/rlx-opencl/bench_kernels.py --quick    # small sizes: checks it runs
    python plugins/rlx-opencl/bench_kernels.py --driver-local-size   # the driver picks group sizes

Prints, on the default OpenCL device:

- sgemm GFLOP/s of ``matmul`` (the register-blocked, vectorized kernel), NN and NT forms;
- elementwise G elements/s of a fused transcendental chain (``tanh(exp(x) * 0.5 + x)``);
- per-kernel overhead inside a graph run: the time per kernel of a chain of many tiny
  unfused kernels, minus the time of a one-kernel run (inputs and outputs copied in both).

Each figure is the best of several timed runs after a warm-up (the first run pays
PoCL's kernel compilation). Timings depend on machine load: run it on a quiet machine.
``--driver-local-size`` launches every kernel with ``local_size=None`` instead of rlx's
choice (``rlx_opencl.launch``), to compare the two (the driver's choice may crash: issue 18).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

import rlx_core
from rlx_core.plugin import CompileOptions


def _best(fn: Callable[[], object], runs: int) -> float:
    fn()
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


DRIVER_LOCAL_SIZE = False


def _compile(backend: rlx_core.Backend, g: rlx_core.Graph) -> rlx_core.Executable:
    exe = backend.compile(g.freeze(), CompileOptions(device="opencl"))
    if DRIVER_LOCAL_SIZE:
        exe._launches = [(kernel, size, None) for kernel, size, _ in exe._launches]  # type: ignore[attr-defined]
    return exe


def bench_sgemm(backend: rlx_core.Backend, n: int, runs: int, transposed: bool) -> float:
    rng = np.random.default_rng(0)
    g = rlx_core.Graph(f"sgemm_{n}")
    a = g.input("a", (n, n))
    b = g.param("b", rng.standard_normal((n, n), dtype=np.float32))
    g.set_outputs([g.matmul(a, g.transpose(b) if transposed else b)])
    exe = _compile(backend, g)
    inputs = {"a": rng.standard_normal((n, n), dtype=np.float32)}
    got = exe.run(inputs)[0]
    want = inputs["a"] @ (np.asarray(g.value(b)).T if transposed else np.asarray(g.value(b)))
    assert np.allclose(got, want, rtol=1e-3, atol=1e-3 * np.sqrt(n)), "sgemm result is wrong"
    return 2.0 * n**3 / _best(lambda: exe.run(inputs), runs) / 1e9


def bench_elementwise(backend: rlx_core.Backend, size: int, runs: int) -> float:
    g = rlx_core.Graph("elementwise")
    x = g.input("x", (size,))
    g.set_outputs([g.tanh(g.add(g.mul(g.exp(x), 0.5), x))])
    exe = _compile(backend, g)
    inputs = {"x": np.linspace(-2, 2, size, dtype=np.float32)}
    return size / _best(lambda: exe.run(inputs), runs) / 1e9


def bench_overhead(backend: rlx_core.Backend, kernels: int, runs: int) -> tuple[float, float]:
    """(seconds per kernel inside a run, seconds of a one-kernel run)."""

    def chain(length: int) -> tuple[rlx_core.Executable, dict[str, np.ndarray]]:
        g = rlx_core.Graph(f"chain_{length}")
        x = g.input("x", (16,))
        y = x
        for _ in range(length):
            y = g.reduce_sum(g.reshape(g.add(y, x), (1, 16)), axes=0)  # a reduction ends every region
        g.set_outputs([y])
        return _compile(backend, g), {"x": np.ones(16, np.float32)}

    one, one_in = chain(1)
    many, many_in = chain(kernels)
    t1 = _best(lambda: one.run(one_in), runs)
    tn = _best(lambda: many.run(many_in), runs)
    return (tn - t1) / (2 * (kernels - 1)), t1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few runs, to check that it works")
    parser.add_argument("--driver-local-size", action="store_true",
                        help="let the driver choose work-group sizes (local_size=None), for comparison")
    args = parser.parse_args(argv)
    global DRIVER_LOCAL_SIZE
    DRIVER_LOCAL_SIZE = args.driver_local_size
    backend = rlx_core.get_backend("opencl")
    avail = backend.probe()
    if not avail.available:
        raise SystemExit(f"opencl is unavailable: {avail.reason}")
    n, size, kernels, runs = (128, 1 << 16, 16, 3) if args.quick else (1024, 1 << 24, 64, 10)
    print(f"device: {backend.label} ({avail.reason})")
    print(f"sgemm {n}^3 (NN):          {bench_sgemm(backend, n, runs, False):8.2f} GFLOP/s")
    print(f"sgemm {n}^3 (NT, fused):   {bench_sgemm(backend, n, runs, True):8.2f} GFLOP/s")
    print(f"elementwise {size:,} elts: {bench_elementwise(backend, size, runs):8.3f} G elements/s")
    per_kernel, one = bench_overhead(backend, kernels, runs * 10)
    print(f"per-kernel overhead:       {per_kernel * 1e6:8.2f} us (one-kernel run: {one * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
