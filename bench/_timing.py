"""Steady-state timing of one model's contenders: interleaved blocks, medians.

On a small machine, OpenBLAS and ONNX Runtime leave their worker threads spinning for a
while after each call, so whoever runs next on the same cores is slowed down, and
timing contenders one after the other (all of A, then all of B) hands each one a
different machine. So every *round* times each contender once, in an order shuffled
from round to round (a fixed seed; a rotation would keep the same neighbours, so one
contender would always follow the same spinning peer), sleeping (``pause``, ~150 ms)
before each contender's block to let the previous one's spinning threads park, then
making one untimed call (the first call after a sleep is slow: caches and thread pools
wake up); the figure is the median over rounds, with the interquartile range as the
spread.

Before any of that, each contender is warmed up (``warmup``: about 20 calls, at most about
a second): the figures are steady-state ones. Why: a runtime may spend its first calls
learning the host (rlx-cpu's thread tuner times its first 21 runs, half of them on one
thread; ONNX Runtime's first run allocates its arena), and blocks of a few calls of a
40 ms target would otherwise put those calls in the first rounds' samples. Each warm-up
comes after the pause too: right after ONNX Runtime's, its spinning threads made
rlx-cpu's tuner time its two-thread runs at one-thread speed.

One measurement is ``loops`` back-to-back calls divided by ``loops``, with ``loops``
sized so that a measurement lasts about ``target_s`` (microsecond models are not timed
at the resolution of the clock). The sizing is taken the way a block runs — after the
pause and a warm call, the fastest of three calls — since one call right after another
contender's can be 10x slow and would leave that contender blocks of a few calls, whose
wake-up cost then shows in its figure. The garbage collector is off inside a
measurement, as in ``timeit``.
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlx_core.errors import ConfigError

from ._contenders import Contender


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one contender, over all rounds."""

    loops: int
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def iqr(self) -> float:
        if len(self.samples) < 4:
            return max(self.samples) - min(self.samples)
        q = statistics.quantiles(self.samples, n=4)
        return q[2] - q[0]


def _timed(run: Callable[[], object], loops: int) -> float:
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(loops):
            run()
        return (time.perf_counter() - t0) / loops
    finally:
        if enabled:
            gc.enable()


def loops_for(run: Callable[[], object], target_s: float, max_loops: int = 10_000, pause: float = 0.0) -> int:
    """Calls per measurement so that one lasts about ``target_s``: after ``pause`` and one
    untimed call, the fastest of three timed calls."""
    if pause > 0:
        time.sleep(pause)
    run()
    once = min(_timed(run, 1) for _ in range(3))
    return max(1, min(max_loops, math.ceil(target_s / max(once, 1e-9))))


def warm_up(run: Callable[[], object], calls: int = 20, budget_s: float = 1.0) -> int:
    """Calls ``run`` ``calls`` times, or fewer once ``budget_s`` has passed (at least
    once), and returns how many calls it made."""
    t0 = time.perf_counter()
    made = 0
    while made < calls and (made == 0 or time.perf_counter() - t0 < budget_s):
        run()
        made += 1
    return made


def measure(contenders: list[Contender], rounds: int, pause: float, target_s: float,
            on_round: Callable[[int], None] | None = None, warmup: int = 20) -> dict[str, Timing]:
    """Median-able samples of every contender, interleaved in ``rounds`` blocks, after
    ``warmup`` untimed calls of each (0: none)."""
    if rounds < 1:
        raise ConfigError(f"bench: rounds must be >= 1, got {rounds}")
    if warmup > 0:
        for c in contenders:
            if pause > 0:  # the previous contender's threads park first, as before a block
                time.sleep(pause)
            warm_up(c.run, warmup)
    loops = {c.name: loops_for(c.run, target_s, pause=pause) for c in contenders}
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    order = random.Random(20261123)
    for r in range(rounds):
        for c in order.sample(contenders, len(contenders)):
            if pause > 0:  # before every block: the previous contender's threads park first
                time.sleep(pause)
            c.run()  # untimed: the first call after a sleep pays for waking up
            samples[c.name].append(_timed(c.run, loops[c.name]))
        if on_round:
            on_round(r)
    return {name: Timing(loops[name], tuple(s)) for name, s in samples.items()}
