"""Rough timing of the compile pipeline's fusion on the cpu backend (``python bench/fusion.py``).

Two graphs, each compiled with the pipeline on and with optimize + fuse off:

- ``chain``: a 1024 x 1024 float32 input through 15 elementwise ops (one region when fused);
- ``mlp``: 256 x 1024 -> 1024 -> 1024 -> 256, bias and gelu/relu after each matmul (gemm).

Prints the median seconds per run of each and the ratio. Figures on a busy machine are
rough; ``--quick`` uses small sizes and few runs, to check that the script works.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import numpy as np

import rlx_core as rlx


def chain_graph(n: int) -> rlx.Graph:
    g = rlx.Graph("chain15")
    x = g.input("x", (n, n), "float32")
    b = g.param("b", np.linspace(-1, 1, n, dtype=np.float32))
    h = g.add(x, b)  # 1
    for _ in range(2):  # 2 x 7 = 14 more
        h = g.mul(h, 0.5)
        h = g.tanh(h)
        h = g.add(h, 1.0)
        h = g.mul(h, h)
        h = g.sub(h, 0.25)
        h = g.maximum(h, -0.5)
        h = g.sigmoid(h)
    g.set_outputs([h])
    return g


def mlp_graph(batch: int, width: int) -> rlx.Graph:
    rng = np.random.default_rng(0)
    g = rlx.Graph("mlp")
    h = g.input("x", (batch, width), "float32")
    dims = [width, width, width, width // 4]
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        w = g.param(f"w{i}", (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32))
        bias = g.param(f"b{i}", rng.standard_normal(b).astype(np.float32) * 0.1)
        h = g.add(g.matmul(h, w), bias)
        h = g.gelu(h, approximate="tanh") if i % 2 == 0 else g.relu(h)
    g.set_outputs([h])
    return g


def seconds_per_run(cg: rlx.CompiledGraph, feeds: dict[str, np.ndarray], runs: int) -> float:
    cg.run(feeds)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        cg.run(feeds)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few runs: check the script works")
    args = parser.parse_args()
    n, batch, width, runs = (128, 32, 128, 3) if args.quick else (1024, 256, 1024, 20)
    plain = rlx.CompileOptions(optimize=False, fuse=False)
    rng = np.random.default_rng(1)
    for graph, feeds in ((chain_graph(n), {"x": rng.standard_normal((n, n)).astype(np.float32)}),
                         (mlp_graph(batch, width), {"x": rng.standard_normal((batch, width)).astype(np.float32)})):
        fused = rlx.compile(graph, "cpu")
        unfused = rlx.compile(graph, "cpu", options=plain)
        a, b = fused.run(feeds)[0], unfused.run(feeds)[0]
        err = float(np.max(np.abs(a - b)))
        t_fused, t_plain = seconds_per_run(fused, feeds, runs), seconds_per_run(unfused, feeds, runs)
        print(f"{graph.name:8s} fused {t_fused * 1e3:8.3f} ms  unfused {t_plain * 1e3:8.3f} ms  "
              f"speedup {t_plain / t_fused:5.2f}x  ({fused.report().compiled_nodes} vs "
              f"{unfused.report().compiled_nodes} nodes, max diff {err:.2e})")


if __name__ == "__main__":
    main()
