"""Timing: the one place the core measures how long running something takes.

Three primitives, used by everything that times (the benchmark pick, ``GraphDevices.benchmark``,
``rlx verify``, ``rlx bench`` in-process and in its child processes):

- ``per_call(fn, n)``: seconds per call over ``n`` back-to-back calls — one *block*, the
  steady state a serving loop sees;
- ``loops_for(fn, target)``: calls per block so that a block lasts about ``target``
  seconds, sized from the fastest of three calls after a warm one (one call right after
  a pause, or after another device's, pays thread wake-ups and can be 10x slow);
- ``time_runs(cg, arrays, runs)``: a warm-up run (allocation and JIT are not the steady
  state), then the median of ``runs`` single timed runs (one slow run, a page fault or a
  context switch, does not move it).

``benchmark_devices`` times one graph on several devices, each compiled where it is told
(placement has ranked them already).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..backends.registry import Registry
from ..errors import CALLER_ERRORS, FallbackWarning, RlxError
from ..ir import Graph
from .compiled import CompiledGraph, compile_on
from .inputs import random_inputs

__all__ = ["benchmark_devices", "loops_for", "per_call", "time_runs"]


def per_call(fn: Callable[[], Any], n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` back-to-back calls."""
    n = max(1, int(n))
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def loops_for(fn: Callable[[], Any], target: float, *, most: int = 1000) -> int:
    """Calls per block so that ``per_call(fn, n)`` lasts about ``target`` seconds (1 to
    ``most``): a warm call, then the fastest of three timed ones."""
    fn()
    once = min(per_call(fn, 1) for _ in range(3))
    return max(1, min(most, int(target / max(once, 1e-7))))


def time_runs(cg: CompiledGraph, arrays: Mapping[str, Any], runs: int) -> float:
    """Median seconds per run of ``cg`` on ``arrays`` over ``runs`` timed runs, after one
    untimed warm-up run."""
    cg.run(arrays)
    return float(np.median([per_call(lambda: cg.run(arrays), 1) for _ in range(max(1, runs))]))


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
                          stacklevel=3)
    return times
