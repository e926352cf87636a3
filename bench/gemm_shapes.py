"""rlx's GEMM against the BLAS on the product shapes convolutions and dense layers make.

Each shape is timed three ways, interleaved (``bench/_timing.py``): ``rlx_gemm`` with A
packed once as a graph's weights are (what a compiled model runs), the BLAS call the
product would otherwise be (oneMKL's sgemm when the ``mkl`` extra is loaded, else
``numpy.matmul``), and, where onnxruntime is installed, ORT's ``MatMul`` with the
weights as an initializer (MLAS, which packs them once as rlx does), on every core and
on one thread. What the cpu backend chooses between
the two is measured per process by ``rlx_cpu.gemm`` on three of these shapes; this shows
the whole picture behind that choice (BENCHMARKS.md, "rlx's GEMM on AVX2").

    python bench/gemm_shapes.py               # every shape, GF/s and the ratio
    python bench/gemm_shapes.py --threads 1   # one thread each
    python bench/gemm_shapes.py --quick       # three shapes, two rounds (nox -s bench -- --quick)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: (M, K, N): what produces it
SHAPES: dict[tuple[int, int, int], str] = {
    (96, 16, 12544): "mobilenet_v2's 16 -> 96 1x1 over 112x112",
    (256, 128, 3136): "resnext50's 128 -> 256 1x1 over 56x56",
    (512, 256, 784): "resnet50's 256 -> 512 1x1 over 28x28",
    (1024, 512, 196): "resnet50's 512 -> 1024 1x1 over 14x14",
    (2048, 512, 49): "resnet50's 512 -> 2048 1x1 over 7x7",
    (64, 576, 3136): "resnet18's 64 -> 64 3x3 over 56x56 (im2col)",
    (128, 1152, 784): "resnet50's 128 -> 128 3x3 over 28x28 (im2col)",
    (256, 2304, 196): "resnet50's 256 -> 256 3x3 over 14x14 (im2col)",
    (512, 4608, 49): "resnet50's 512 -> 512 3x3 over 7x7 (im2col)",
    (256, 256, 256): "square",
}


def main(argv: list[str] | None = None) -> int:
    from bench._contenders import Contender
    from bench._timing import measure
    from rlx_cpu import blas, gemm
    from rlx_cpu.native import library

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="threads for both (0: every core)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="three shapes, two rounds: a check that it runs")
    args = parser.parse_args(argv)
    shapes = dict(list(SHAPES.items())[:3]) if args.quick else SHAPES
    rounds = 2 if args.quick else args.rounds
    lib = library()
    if lib is None:
        print("rlx-cpu's native kernels are not loaded here: nothing to compare")
        return 1
    threads = args.threads or gemm._cores()
    mkl = blas.mkl()
    previous = mkl.local_threads(threads) if mkl is not None and args.threads else None
    limit = None
    if mkl is None and args.threads:
        from threadpoolctl import threadpool_limits

        limit = threadpool_limits(limits=args.threads, user_api="blas")
    blas_name = "oneMKL" if mkl else "numpy"
    print(f"| M x K x N | what | rlx GEMM GF/s | {blas_name} GF/s | ORT MatMul GF/s | rlx / BLAS time "
          "| rlx / ORT time |")
    print("|---|---|--:|--:|--:|--:|--:|")
    try:
        for (m, k, n), what in shapes.items():
            case = gemm.ProbeCase(lib, (m, k, n), threads, np.random.default_rng(0))
            run_blas = case.blas[1]

            def run_rlx(case: gemm.ProbeCase = case) -> np.ndarray:
                lib.gemm(*case.args)
                return case.c_native

            def run_other(run: object = run_blas, case: gemm.ProbeCase = case) -> np.ndarray:
                run()  # type: ignore[operator]
                return case.c_blas

            contenders = [Contender("rlx", "rlx", run_rlx, run_rlx().copy(), 0.0, 0.0),
                          Contender("blas", "numpy", run_other, run_other().copy(), 0.0, 0.0)]
            ort_run = _ort_matmul(case.a, case.b, threads)
            if ort_run is not None:
                first = ort_run()
                contenders.append(Contender("ort", "onnxruntime", ort_run, first, 0.0, 0.0))
                np.testing.assert_allclose(first.T, case.c_blas, rtol=1e-3, atol=1e-3 * np.sqrt(k))
            np.testing.assert_allclose(case.c_native, case.c_blas, rtol=1e-3, atol=1e-3 * np.sqrt(k))
            t = measure(contenders, rounds, 0.15, 0.05, warmup=5)
            flops = 2.0 * m * n * k
            r, o = t["rlx"].median, t["blas"].median
            x = t["ort"].median if "ort" in t else float("nan")
            print(f"| {m} x {k} x {n} | {what} | {flops / r / 1e9:.1f} | {flops / o / 1e9:.1f} | "
                  f"{flops / x / 1e9:.1f} | {r / o:.2f}x | {r / x:.2f}x |", flush=True)
    finally:
        if previous is not None and mkl is not None:
            mkl.local_threads(previous)
        if limit is not None:
            limit.restore_original_limits()
    return 0


def _ort_matmul(a: np.ndarray, b: np.ndarray, threads: int) -> Callable[[], np.ndarray] | None:
    """ORT computing the same product as a model would: ``b.T @ a.T`` (activations times the
    weights, an initializer MLAS packs once at session creation), or None without onnxruntime."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    m, k = a.shape
    n = b.shape[1]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, m])],
                              [numpy_helper.from_array(np.ascontiguousarray(a.T), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"x": np.ascontiguousarray(b.T)}
    return lambda: session.run(None, feed)[0]


if __name__ == "__main__":
    sys.exit(main())
