"""The one timer: how rlx measures how long something takes, wherever it measures.

Everything that times goes through here: the benchmark pick and ``GraphDevices.benchmark``
(``compiler/timing.py``), ``rlx verify``, ``rlx bench`` and its child processes, generic
calibration, the bench scripts, and backends deciding between kernels on this host (the
plugin kit re-exports ``best_of`` and ``per_call``). Standard library only, so any layer
may use it.

Why it is written this way:

- One measurement is ``n`` back-to-back calls divided by ``n``, with the garbage
  collector off (as ``timeit`` does): a collection in the middle of a block is not the
  callee's time.
- A block's size comes from the fastest of three calls after a warm one
  (``loops_for``): one call right after a pause, or after another runtime's, pays thread
  wake-ups and can be 10x slow, which would leave blocks of a few calls.
- Contenders are timed *interleaved* (``interleave``): each round times every contender
  once, in an order shuffled from round to round (seeded; a fixed rotation keeps the
  same neighbours), sleeping ``pause`` (~150 ms) before each block and making one untimed
  call after it. On a small host OpenBLAS and ONNX Runtime leave worker threads spinning
  after each call; whoever runs next on those cores is slowed down, so timing all of A
  and then all of B hands each a different machine.
- A choice between kernels takes the shortest of a few calls (``best_of``): the question
  is which kernel is faster, and the quietest instant answers it with the least noise.
  A cost model wants a run's typical time instead (``first_quartile``).
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Entry", "EntryFailed", "best_of", "first_quartile", "interleave", "loops_for", "per_call", "warm_up"]

#: The seed of the interleaved order: runs of one command time in the same order.
ORDER_SEED = 20261123


def per_call(fn: Callable[[], Any], n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` back-to-back calls, the collector off."""
    n = max(1, int(n))
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n
    finally:
        if enabled:
            gc.enable()


def best_of(fn: Callable[[], Any], repeats: int = 3) -> float:
    """The shortest of ``repeats`` single timed calls of ``fn``, after one that warms it up."""
    fn()
    return min(per_call(fn, 1) for _ in range(max(1, repeats)))


def loops_for(fn: Callable[[], Any], target: float, *, most: int = 1000, pause: float = 0.0) -> int:
    """Calls per block so that ``per_call(fn, n)`` lasts about ``target`` seconds (1 to
    ``most``): after ``pause`` and a warm call, sized from the fastest of three calls."""
    if pause > 0:
        time.sleep(pause)
    once = best_of(fn, 3)
    return max(1, min(most, math.ceil(target / max(once, 1e-9))))


def warm_up(fn: Callable[[], Any], calls: int = 20, budget: float = 1.0) -> int:
    """Calls ``fn`` ``calls`` times, or fewer once ``budget`` seconds have passed (at least
    once); returns how many calls it made. A runtime may spend its first calls learning
    the host (rlx-cpu's thread tuner, ONNX Runtime's arena): steady-state figures start
    after them."""
    t0 = time.perf_counter()
    made = 0
    while made < calls and (made == 0 or time.perf_counter() - t0 < budget):
        fn()
        made += 1
    return made


def first_quartile(fn: Callable[[], Any], budget: float, most: int = 50) -> float:
    """The first quartile of single calls (at least 5, at most ``most``, until ``budget``
    seconds are spent), after one warm-up. A cost model predicts a run's typical time,
    which the fastest call (a quiet instant, every cache warm) understates; the median,
    on a host where something else wakes up, can be 10x off when BLAS threads lose their
    cores mid-product. The quartile keeps the first bias small and ignores the second
    unless it hits most calls."""
    fn()
    times: list[float] = []
    spent = 0.0
    while len(times) < most and (spent < budget or len(times) < 5):
        dt = per_call(fn, 1)
        times.append(dt)
        spent += dt
    return statistics.quantiles(times, n=4)[0] if len(times) > 1 else times[0]


class EntryFailed(Exception):
    """Raised by an entry's ``block`` to stop it; the message is its note as is
    (``died with SIGSEGV (Segmentation fault) while timing``)."""


@dataclass
class Entry:
    """One contender of an interleaved timing: ``run()`` calls it once here, or, for one
    timed elsewhere (a child process, already warm there), ``block(n)`` runs it ``n``
    times and returns the seconds per call. Neither: it is not timed, and ``note`` says
    why. ``times`` gets one figure (seconds per call) per block."""

    name: str
    run: Callable[[], Any] | None = None
    block: Callable[[int], float] | None = None
    note: str = ""
    times: list[float] = field(default_factory=list)
    loops: int = 0  # calls in its last block

    @property
    def runnable(self) -> bool:
        return self.run is not None or self.block is not None

    def stop(self, note: str) -> None:
        """Take this entry out of the timing, saying why."""
        self.note, self.run, self.block = note, None, None

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def best(self) -> float | None:
        return min(self.times) if self.times else None

    @property
    def iqr(self) -> float | None:
        """The interquartile range of ``times`` (the range, under four figures)."""
        if not self.times:
            return None
        if len(self.times) < 4:
            return max(self.times) - min(self.times)
        q = statistics.quantiles(self.times, n=4)
        return q[2] - q[0]

    def time_block(self, n: int, settle: bool = True) -> float:
        """Seconds per call over ``n`` calls: timed elsewhere (``block``) or here (``run``,
        after one untimed call unless ``settle`` is off: the first call after a pause pays
        for waking up)."""
        self.loops = n
        if self.block is not None:
            return self.block(n)
        if self.run is None:
            raise EntryFailed(self.note or "not runnable")
        if settle:
            self.run()
        return per_call(self.run, n)


def interleave(entries: Sequence[Entry], rounds: int, loops: Callable[[Entry, int], int] | float, *,
               pause: float = 0.15, warmup: int = 0, settle: bool = True, seed: int = ORDER_SEED,
               on_round: Callable[[int], None] | None = None) -> None:
    """Time every runnable entry in ``rounds`` interleaved blocks, appending seconds per
    call to each entry's ``times``.

    ``loops`` is the calls per block: ``loops(entry, round)``, or a number of seconds a
    block should last, each entry's count then sized by ``loops_for`` after its warm-up
    (entries with ``run`` only). First each entry with ``run`` is called ``warmup`` times
    (``warm_up``; 0: once, so that a lazy compile or a failing model shows before any
    timing), after ``pause``. Then each round times the live entries in a shuffled order,
    ``pause`` seconds apart, each block after an untimed call (``settle=False``: none,
    for calls that last seconds, whose wake-up is lost in them). An entry that raises is
    stopped (``Entry.stop``) with the error as its note: an ``EntryFailed``'s message as
    is, any other exception as ``failed: Type: message``.
    """
    if rounds < 1:
        raise ValueError(f"interleave: rounds must be >= 1, got {rounds}")
    live = [e for e in entries if e.runnable]
    for e in list(live):
        if e.run is None:
            continue
        if pause > 0:  # the previous entry's threads park first, as before a block
            time.sleep(pause)
        if not _guarded(e, lambda e=e: warm_up(e.run, max(1, warmup))):
            live.remove(e)
    count = loops if callable(loops) else _sized(live, float(loops), pause)
    order = random.Random(seed)
    for r in range(rounds):
        for e in order.sample(live, len(live)):
            if pause > 0:
                time.sleep(pause)
            if not _guarded(e, lambda e=e, r=r: e.times.append(e.time_block(count(e, r), settle))):
                live.remove(e)
        if on_round is not None:
            on_round(r)


def _sized(live: list[Entry], target: float, pause: float) -> Callable[[Entry, int], int]:
    """Calls per block for each of ``live`` so that a block lasts about ``target`` seconds
    (entries that fail while sized are stopped and dropped from ``live``)."""
    sized: dict[int, int] = {}
    for e in list(live):
        if e.run is None:
            raise ValueError(f"interleave: entry {e.name!r} is timed elsewhere (block), so it needs a count of "
                             "calls, not a target in seconds")
        if not _guarded(e, lambda e=e: sized.__setitem__(id(e), loops_for(e.run, target, most=10_000, pause=pause))):
            live.remove(e)
    return lambda e, r: sized[id(e)]


def _guarded(entry: Entry, work: Callable[[], object]) -> bool:
    """Run ``work`` for ``entry``; on an exception stop the entry and answer False."""
    try:
        work()
    except EntryFailed as exc:
        entry.stop(str(exc))
        return False
    except Exception as exc:  # a contender's own failure, whatever its type: a row says why
        entry.stop(f"failed: {type(exc).__name__}: {exc}")
        return False
    return True
