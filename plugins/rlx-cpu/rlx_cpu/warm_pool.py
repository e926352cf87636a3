"""Plan buffers kept warm between plans: a new shape class does not fault in fresh memory.

A plan's buffers (``plan_arena``: one block a plan) are fresh allocations. On this kind of host the
first touch of fresh memory costs about half a millisecond per megabyte in page faults,
so a plan's first run paid for every buffer it holds: a BERT-style encoder's new shape
class ran its first request 5-30 ms slower than the next (tens of MB of activations), and
a server fed a new sequence length on most requests paid that every time, while the
plans of the classes it had just evicted freed the same amount of memory back to the OS.

The pool sits between the two: when a plan dies (its executable dropped by an LRU of
shape classes, or replaced after ``set_param``), its buffers come here instead of going
back to the allocator, and a plan being bound takes from here first. Only buffers of at
least ``MIN_BYTES`` are kept (smaller ones come from the allocator's own free lists,
already warm), a buffer is handed out only for a request of at least half its size (no
large buffer wasted on a small need), and the pool holds at most ``RLX_CPU_POOL_MB``
megabytes (default 256; 0 turns it off), the oldest given back first.

Safety: a buffer comes back only when the plan holding it is garbage, that is when
nothing can run the plan's steps any more (a run in progress holds its plan). Buffers
come back from a finalizer, which may run in any thread and at any allocation, so
``give`` only appends to a deque; ``take`` moves them into the free list under the lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

import numpy as np

from .settings import POOL_MB

__all__ = ["MIN_BYTES", "WarmPool", "warm_pool"]

#: Buffers smaller than this go back to the allocator (its free lists keep them warm).
MIN_BYTES = 256 * 1024


class WarmPool:
    """Raw byte buffers (uint8 arrays) of dead plans, kept for the next plans; see the module."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = max(0, int(limit_bytes))
        self._lock = threading.Lock()
        self._returned: deque[np.ndarray] = deque()  # from finalizers: appended without the lock
        self._free: list[np.ndarray] = []  # oldest first
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def held_bytes(self) -> int:
        with self._lock:
            self._drain()
            return self._bytes

    def give(self, raws: Iterable[np.ndarray]) -> None:
        """Take back a dead plan's buffers (safe from a finalizer: no lock, no allocation
        but the deque's)."""
        if self.limit:
            self._returned.extend(raws)

    def take(self, nbytes: int) -> np.ndarray | None:
        """A kept buffer of at least ``nbytes`` and at most twice that (the smallest such),
        or ``None``."""
        if not self.limit or nbytes < MIN_BYTES:
            return None
        with self._lock:
            self._drain()
            best = -1
            for i, raw in enumerate(self._free):
                size = raw.nbytes
                if nbytes <= size <= 2 * nbytes and (best < 0 or size < self._free[best].nbytes):
                    best = i
            if best < 0:
                self.misses += 1
                return None
            raw = self._free.pop(best)
            self._bytes -= raw.nbytes
            self.hits += 1
            return raw

    def clear(self) -> None:
        with self._lock:
            self._drain()
            self._free.clear()
            self._bytes = 0

    def _drain(self) -> None:
        returned = self._returned
        while returned:
            raw = returned.popleft()
            if raw.nbytes >= MIN_BYTES and raw.nbytes <= self.limit:
                self._free.append(raw)
                self._bytes += raw.nbytes
        while self._bytes > self.limit:  # the oldest go back to the allocator
            self._bytes -= self._free.pop(0).nbytes


_POOL: WarmPool | None = None
_POOL_LOCK = threading.Lock()


def warm_pool() -> WarmPool:
    """The process's pool (``RLX_CPU_POOL_MB`` read on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WarmPool(int(POOL_MB.read()) * 1024 * 1024)
        return _POOL
