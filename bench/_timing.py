"""Steady-state timing of one model's contenders: interleaved blocks, medians.

The clock and its rules are ``rlx_core.timer``'s, the one timer every rlx measurement
goes through (its docstring says why each rule): each contender is warmed up (about 20
calls, at most about a second, after a pause: a runtime may spend its first calls
learning the host, as rlx-cpu's thread tuner and ONNX Runtime's arena do), its block size
is taken so that a block lasts about ``target_s``, then every round times each contender
once in a shuffled order, ``pause`` (~150 ms) apart, each block after an untimed call,
with the garbage collector off. The figure is the median over rounds, with the
interquartile range as the spread.
"""

from __future__ import annotations

from collections.abc import Callable

from rlx_core.errors import ConfigError
from rlx_core.timer import Entry, interleave, loops_for, per_call, warm_up

from ._contenders import Contender

__all__ = ["loops_for", "measure", "per_call", "warm_up"]


def measure(contenders: list[Contender], rounds: int, pause: float, target_s: float,
            on_round: Callable[[int], None] | None = None, warmup: int = 20) -> dict[str, Entry]:
    """Each contender's ``timer.Entry`` (``times``: seconds per call, one a round; ``median``,
    ``iqr``, ``loops``), interleaved in ``rounds`` blocks of about ``target_s`` seconds, after
    ``warmup`` untimed calls of each. ``ConfigError`` naming a
    contender that failed while timed (the bench's contenders were checked when prepared)."""
    if rounds < 1:
        raise ConfigError(f"bench: rounds must be >= 1, got {rounds}")
    entries = [Entry(c.name, run=c.run) for c in contenders]
    interleave(entries, rounds, target_s, pause=pause, warmup=warmup, on_round=on_round)
    for e in entries:
        if e.note:
            raise ConfigError(f"bench: {e.name} failed while timed: {e.note}")
    return {e.name: e for e in entries}
