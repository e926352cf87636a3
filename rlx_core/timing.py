"""Timing compiled graphs: the one place the core measures how long a run takes.

``time_runs`` is what the benchmark pick (``RLX_BENCHMARK_PICK``), ``GraphDevices.benchmark``
and ``rlx bench``'s in-process numbers rest on: a warm-up run first (allocation and JIT
are not the steady state), then the median of the timed runs (one slow run, a page fault
or a context switch, does not move it). ``benchmark_devices`` times one graph on several
devices, each compiled where it is told (placement has ranked them already).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .compiled import CompiledGraph, compile_on
from .errors import CALLER_ERRORS, FallbackWarning, RlxError
from .inputs import random_inputs
from .ir import Graph
from .registry import Registry

__all__ = ["benchmark_devices", "time_runs"]


def time_runs(cg: CompiledGraph, arrays: Mapping[str, Any], runs: int) -> float:
    """Median seconds per run of ``cg`` on ``arrays`` over ``runs`` timed runs, after one
    untimed warm-up run."""
    cg.run(arrays)
    samples = []
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        cg.run(arrays)
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def benchmark_devices(graph: Graph, devices: Sequence[str], runs: int, registry: Registry) -> dict[str, float]:
    """Seconds per run of ``graph`` on each of ``devices`` (seeded random inputs). A device
    that fails is skipped with a ``FallbackWarning``; the caller's own errors (a malformed
    ``RLX_*`` setting) are raised at once, since every device would fail the same way."""
    arrays = random_inputs(graph, seed=0)
    times = {}
    for d in devices:
        try:
            times[d] = time_runs(compile_on(graph, d, "benchmark pick", [], registry), arrays, runs)
        except CALLER_ERRORS:
            raise
        except RlxError as exc:
            warnings.warn(f"rlx: device {d} failed in the benchmark pick ({exc}); skipping it", FallbackWarning,
                          stacklevel=3)  # fmt: skip
    return times
