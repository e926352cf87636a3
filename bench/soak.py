"""Soak: run one compiled graph many times and show that memory stays flat.

A runtime that leaks a little per run (a cached array per call, a plan that is never
returned to its pool, inputs held past the run) is fine in a benchmark and fatal in a
server. This script compiles a small MLP on each chosen device, warms it up, then runs
it ``--runs`` times (10,000 by default) and prints the process's resident set size at
regular checkpoints, and its growth between the first and the last checkpoint. The
exit status is 1 when the growth passes ``--max-growth-mib`` (default 16 MiB), so
``nox -s soak`` fails on a leak; the figures are printed either way.

    python bench/soak.py                       # every available device, 10,000 runs
    python bench/soak.py --device cpu --runs 2000 --quick
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

import rlx_core as rlx


def rss_mib() -> float:
    """Resident set size of this process in MiB (``/proc`` on Linux, ``resource`` elsewhere)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    import resource  # peak, not current, where /proc is missing: still catches steady growth

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def soak_graph(batch: int, width: int) -> rlx.Graph:
    """An MLP with a softmax head: matmuls, a fused epilogue candidate, composites."""
    rng = np.random.default_rng(0)
    g = rlx.Graph("soak_mlp")
    x = g.input("x", (batch, width))
    h = x
    for i in range(3):
        w = g.param(f"w{i}", (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32))
        b = g.param(f"b{i}", np.zeros(width, np.float32))
        h = g.gelu(g.add(g.matmul(h, w), b))
    g.set_outputs([g.softmax(g.layer_norm(h, np.ones(width, np.float32)), name="probs")])
    return g


def soak(device: str, runs: int, batch: int, width: int, checkpoints: int) -> tuple[list[tuple[int, float]], float]:
    """Run the graph ``runs`` times on ``device``; ``([(run, rss MiB)...], seconds)``."""
    g = soak_graph(batch, width)
    cg = rlx.compile(g, device=device, policy=rlx.DevicePolicy())
    rng = np.random.default_rng(1)
    inputs = [{"x": rng.standard_normal((batch, width)).astype(np.float32)} for _ in range(4)]
    for feed in inputs * 25:  # warm-up: first-run allocations, JIT, plan pools
        cg.run(feed)
    gc.collect()
    every = max(1, runs // checkpoints)
    samples = [(0, rss_mib())]
    t0 = time.perf_counter()
    for i in range(1, runs + 1):
        cg.run(inputs[i % len(inputs)])
        if i % every == 0 or i == runs:
            gc.collect()
            samples.append((i, rss_mib()))
    return samples, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", action="append", help="device to soak (repeatable); default: every available")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--max-growth-mib", type=float, default=16.0)
    parser.add_argument("--quick", action="store_true", help="small sizes, for checking that the script runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.batch, args.width = min(args.runs, 500), 4, 32
    devices = args.device or rlx.available_devices()
    print(f"soak: {args.runs} runs per device of a {args.batch}x{args.width} MLP (pid {os.getpid()})")
    leaked = []
    for device in devices:
        samples, seconds = soak(device, args.runs, args.batch, args.width, args.checkpoints)
        first, last = samples[0][1], samples[-1][1]
        peak = max(m for _, m in samples)
        print(f"\n{device}: {args.runs} runs in {seconds:.2f} s ({seconds / args.runs * 1e6:.1f} µs/run)")
        print("  run      RSS MiB")
        for run, mib in samples:
            print(f"  {run:<8} {mib:8.1f}")
        growth = last - first
        print(f"  RSS after warm-up {first:.1f} MiB, after {args.runs} runs {last:.1f} MiB, peak {peak:.1f} MiB: "
              f"growth {growth:+.1f} MiB")
        if growth > args.max_growth_mib:
            leaked.append(f"{device} grew {growth:.1f} MiB")
    if leaked:
        print(f"\nsoak: FAILED, memory is not flat: {'; '.join(leaked)} (limit {args.max_growth_mib} MiB)")
        return 1
    print(f"\nsoak: memory flat on {', '.join(devices)} (growth within {args.max_growth_mib} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
