"""Timing compiled graphs: the benchmark pick and ``GraphDevices.benchmark``.

``time_runs(cg, arrays, runs)``: a warm-up run (allocation and JIT are not the steady
state), then the median of ``runs`` single timed runs (one slow run, a page fault or a
context switch, does not move it). ``benchmark_devices`` times one graph on several
devices, each compiled where it is told (placement has ranked them already). The clock
and its rules are ``rlx_core.timer``'s, the one timer every measurement goes through.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..backends.registry import Registry
from ..errors import CALLER_ERRORS, FallbackWarning, RlxError
from ..ir import Graph
from ..timer import per_call
from .compiled import CompiledGraph, compile_on
from .inputs import random_inputs

__all__ = ["benchmark_devices", "time_runs"]


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
