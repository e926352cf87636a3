"""``paused()``: Python's cyclic garbage collector held off while rlx loads and compiles.

Why: loading and compiling make a few hundred thousand small objects (protobuf messages,
IR nodes, attribute tuples, kernel steps) that all stay alive until the compile ends.
Each allocation burst sets off the collector, whose passes walk every tracked object of
the process, find nothing to free here, and cost 1-22 ms of a 20-95 ms compile on the
zoo (bert at batch 8: 94 ms with the collector, 73 ms without; BENCHMARKS.md, "Load +
compile time"). In a large application the process holds more objects, and each pass
costs more. Reference counting still frees everything that is not in a cycle; cycles
made meanwhile are collected at the next pass after the outermost compile returns.

The pause is re-entrant and shared by threads: the collector is switched off when the
first paused block starts (only if it was on) and back on when the last one ends, so a
compile inside a load, or two threads compiling, never turn it on early. A caller who
switched the collector off keeps it off.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["paused", "pausing"]

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_depth = 0
_restore = False  # whether the outermost block found the collector on


@contextmanager
def paused() -> Iterator[None]:
    """Hold off cyclic garbage collection for the ``with`` block (see the module)."""
    global _depth, _restore
    with _lock:
        if _depth == 0:
            _restore = gc.isenabled()
            if _restore:
                gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _restore:
                gc.enable()


def pausing(fn: F) -> F:
    """``fn`` run inside ``paused()`` (the decorator form, for load and compile entry points)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with paused():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
