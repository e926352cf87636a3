"""Where a plan's buffers live: one block, laid out from the plan's own buffer lifetimes.

Binding a plan (``binding.PlanBinding._bind_plan``) asks an arena for a buffer per
value and per kernel's scratch, in graph order, and gives each back once nothing later
reads it. The first arena (``FreeListArena``) served each request from the buffers given
back, best fit by size, else a new one. Requests that grow along the graph never fit a
smaller buffer given back, so every larger one was fresh memory: densenet121's layers each
concatenate all earlier feature maps into a new, larger buffer, and its plan at batch 8
held 266 MB in 29 buffers while at most ~70 MB were alive at once. Every megabyte of a plan
is faulted in by its first run (0.5-2 ms per MB on the 2-core VMs here): densenet121's first
run took 470-550 ms against 190 ms for the next.

So the plan's requests are laid out the way ORT's and TFLite's memory planners do: a first
binding (on the free list) records each request's size and when it is taken and given
back (``Recorder``); ``plan_layout`` places the requests in one block, largest first, each
at the lowest offset free for its whole lifetime (greedy by size). Where the block pays
(``block_pays``: it saves at least ``REPLAN_BYTES`` and holds at most ``BLOCK_SHARE`` of
the first binding's free list), that first plan is dropped before it ever ran (nothing of
it faulted in) and bound again on the block, and so is every later plan (``PlannedArena``
replays the recording): one more binding (41 ms for densenet121) against hundreds of MB of
first touches; elsewhere the mode keeps its free lists and pays nothing more. Binding is
deterministic, and the replay checks it: a request or a give-back that differs from the
recording in order or size raises ``Diverged`` and the executable binds that plan with
the free list instead (never two live values in the same bytes). The choice and the
layout are kept per executable and thread mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .steps import aligned_empty
from .warm_pool import warm_pool

__all__ = ["ALIGN", "BLOCK_SHARE", "REPLAN_BYTES", "Diverged", "FreeListArena", "Layout", "PlanStats", "PlannedArena",
           "Recorder", "block_pays", "plan_layout"]

#: Every buffer's size is rounded up to this, so offsets in a block keep a cache line's alignment.
ALIGN = 64
#: A block pays when it is smaller than the first plan's free list by at least this much
#: (on the VMs here, 4-16 ms of page faults at a first run, about what binding a
#: mid-sized graph again costs) ...
REPLAN_BYTES = 8 << 20
#: ... and at most this share of it (see ``block_pays``).
BLOCK_SHARE = 0.5


def block_pays(free_list_bytes: int, block_bytes: int) -> bool:
    """Whether a plan's buffers go in one block (``block_bytes``) rather than on the free
    list its first binding used (``free_list_bytes``): the block must save ``REPLAN_BYTES``
    and hold at most ``BLOCK_SHARE`` of the free list. Why the share: on the 2-core VM
    these sessions run on, the block made the conv nets whose gain is moderate slower when
    their runs come apart (a request every 150 ms: mobilenet_v2 at batch 8, block 48 MB
    against a free list of 83, median 29-47 ms against 28; mobilenet_v3_large 32 against
    57 MB, 29-37 ms against 24-25), with 50-130 waits on OpenMP's workers per slow run
    against 2-4, a cause not found yet, while back to back the block was faster (20.7
    against 22 ms); where the block is a fraction of the free list (densenet121 at batch
    8: 61 MB against 266, its first run 537 -> 175 ms, the next ones 192 -> 175 ms) it
    pays either way (BENCHMARKS.md, section 'The first runs of a model (issues 33 and 35,
    session 30)')."""
    return free_list_bytes - block_bytes >= REPLAN_BYTES and block_bytes <= BLOCK_SHARE * free_list_bytes


_NEVER = float("inf")


@dataclass
class PlanStats:
    """What binding one plan did; every plan of an executable binds identically."""

    steps: int = 0
    buffers: int = 0
    buffer_bytes: int = 0
    allocations: int = 0  # buffer requests: one per buffer-backed value, plus scratch
    reused: int = 0  # requests served from memory an earlier request of the plan used
    inplace: int = 0  # outputs written over a dead input's buffer
    views: int = 0  # reshapes that are views (no step, no buffer)
    per_image: int = 0  # nodes bound image by image (``images.py``)


def _rounded(nbytes: int) -> int:
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


class Diverged(Exception):
    """A binding's requests differ from the recording its layout was made from."""


class FreeListArena:
    """The free list of one plan: raw byte buffers, best fit by size; new ones from
    ``lent`` (another plan's buffers, for a twin that never runs at the same time as it),
    then the process's warm pool (``warm_pool``: dead plans' buffers, faulted in already),
    then fresh memory. ``owned`` lists the buffers the plan holds of its own (not lent),
    for the pool when it dies."""

    def __init__(self, stats: PlanStats, lent: Sequence[np.ndarray] = ()) -> None:
        self._free: list[np.ndarray] = []
        self._lent = list(lent)
        self._stats = stats
        self._pool = warm_pool()
        self.owned: list[np.ndarray] = []

    @staticmethod
    def _best(raws: list[np.ndarray], nbytes: int) -> int | None:
        best = None
        for i, raw in enumerate(raws):
            if raw.nbytes >= nbytes and (best is None or raw.nbytes < raws[best].nbytes):
                best = i
        return best

    def take(self, nbytes: int) -> np.ndarray:
        self._stats.allocations += 1
        best = self._best(self._free, nbytes)
        if best is not None:
            self._stats.reused += 1
            return self._free.pop(best)
        size = _rounded(nbytes)
        lent = self._best(self._lent, size)
        if lent is not None:  # each lent buffer handed out once, then recycled by this free list
            raw = self._lent.pop(lent)
        else:
            raw = self._pool.take(size)
            if raw is None:
                raw = aligned_empty(size, np.uint8)  # a cache line's alignment, for every dtype
            self.owned.append(raw)
        self._stats.buffers += 1
        self._stats.buffer_bytes += raw.nbytes
        return raw

    @property
    def held(self) -> list[np.ndarray]:
        """The buffers the plan's memory lies in (its own: what it may lend a twin)."""
        return self.owned

    def give(self, raw: np.ndarray) -> None:
        self._free.append(raw)


@dataclass(frozen=True)
class Layout:
    """A plan's requests placed in one block: the recorded events (``("take", size)`` or
    ``("give", k)``, k the request's number), each request's offset, the block's size,
    and how many requests reuse bytes an earlier one used."""

    events: tuple[tuple[str, int], ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    total: int
    reused: int


class Recorder:
    """Records a binding's requests (sizes, when each is taken and given back) while
    ``inner`` serves them: the first binding of an executable is a plan of its own on the
    free list, and its recording lays out the next ones (``layout``)."""

    def __init__(self, inner: FreeListArena) -> None:
        self.inner = inner
        self._events: list[tuple[str, int]] = []
        self._sizes: list[int] = []
        self._starts: list[int] = []
        self._ends: list[float] = []
        self._taker: dict[int, int] = {}  # id of a raw handed out -> the request holding it now

    @property
    def owned(self) -> list[np.ndarray]:
        return self.inner.owned

    @property
    def held(self) -> list[np.ndarray]:
        return self.inner.held

    def take(self, nbytes: int) -> np.ndarray:
        raw = self.inner.take(nbytes)
        size = _rounded(nbytes)
        self._taker[id(raw)] = len(self._sizes)
        self._sizes.append(size)
        self._starts.append(len(self._events))
        self._ends.append(_NEVER)
        self._events.append(("take", size))
        return raw

    def give(self, raw: np.ndarray) -> None:
        k = self._taker.pop(id(raw))
        self._ends[k] = len(self._events)
        self._events.append(("give", k))
        self.inner.give(raw)

    def layout(self) -> Layout:
        offsets, total, reused = plan_layout(self._sizes, self._starts, self._ends)
        return Layout(tuple(self._events), tuple(offsets), tuple(self._sizes), total, reused)


def plan_layout(sizes: Sequence[int], starts: Sequence[int], ends: Sequence[float]) -> tuple[list[int], int, int]:
    """Offsets for requests of ``sizes`` alive from ``starts[k]`` to ``ends[k]`` (an
    event count; given back at ``ends[k]``, ``inf`` never), no two alive at once sharing
    a byte: largest first, each at the lowest offset free for its whole life. Returns the
    offsets, the block's size, and how many requests lie over bytes of one given back
    before them."""
    n = len(sizes)
    offsets = [0] * n
    placed_off = np.zeros(n, np.int64)
    placed_end_byte = np.zeros(n, np.int64)
    placed_start = np.zeros(n, np.float64)
    placed_stop = np.zeros(n, np.float64)
    count = 0
    for k in sorted(range(n), key=lambda i: (-sizes[i], starts[i])):
        size, start, stop = sizes[k], starts[k], ends[k]
        live = (placed_start[:count] < stop) & (start < placed_stop[:count])
        lo, hi = placed_off[:count][live], placed_end_byte[:count][live]
        order = np.argsort(lo, kind="stable")
        offset = 0
        for a, b in zip(lo[order].tolist(), hi[order].tolist()):
            if offset + size <= a:
                break
            offset = max(offset, b)
        offsets[k] = offset
        placed_off[count], placed_end_byte[count] = offset, offset + size
        placed_start[count], placed_stop[count] = start, stop
        count += 1
    total = max((o + s for o, s in zip(offsets, sizes)), default=0)
    off, size_arr = np.asarray(offsets, np.int64), np.asarray(sizes, np.int64)
    end_arr = np.asarray(ends, np.float64)
    reused = sum(bool(np.any((end_arr[:k] <= starts[k]) & (off[:k] < off[k] + size_arr[k])
                             & (off[k] < off[:k] + size_arr[:k]))) for k in range(n))
    return offsets, total, reused


class PlannedArena:
    """Replays a recorded binding on one block laid out by ``plan_layout``: the k-th
    request gets its bytes at its offset. The block is ``block`` when given and large
    enough (a twin's: its plan's block), else from the warm pool or fresh (``owned``).
    Any request or give-back other than the recording's next raises ``Diverged``."""

    def __init__(self, layout: Layout, stats: PlanStats, block: np.ndarray | None = None) -> None:
        self._layout = layout
        self._next = 0
        self._handed: list[np.ndarray] = []
        self.owned: list[np.ndarray] = []
        if block is None or block.nbytes < layout.total:
            block = warm_pool().take(max(layout.total, ALIGN))
            if block is None:
                block = aligned_empty(max(layout.total, ALIGN), np.uint8)
            self.owned.append(block)
        self.block = block
        self.held = [block]  # (lent or its own: a twin of this plan may lie in it too)
        stats.buffers, stats.buffer_bytes, stats.reused = 1, layout.total, layout.reused

    def _expect(self, kind: str) -> int:
        events = self._layout.events
        if self._next >= len(events) or events[self._next][0] != kind:
            raise Diverged(f"event {self._next}: a {kind} where the recording has "
                           f"{events[self._next] if self._next < len(events) else 'none'}")
        value = events[self._next][1]
        self._next += 1
        return value

    def take(self, nbytes: int) -> np.ndarray:
        size = self._expect("take")
        if _rounded(nbytes) != size:
            raise Diverged(f"request {len(self._handed)}: {nbytes} bytes where the recording has {size}")
        k = len(self._handed)
        offset = self._layout.offsets[k]
        raw = self.block[offset : offset + size]
        self._handed.append(raw)
        return raw

    def give(self, raw: np.ndarray) -> None:
        k = self._expect("give")
        if k >= len(self._handed) or self._handed[k] is not raw:
            raise Diverged(f"a give-back of other bytes than request {k}'s")

    def finish(self) -> None:
        """``Diverged`` unless the binding made every recorded request and give-back."""
        if self._next != len(self._layout.events):
            raise Diverged(f"{len(self._layout.events) - self._next} recorded event(s) never came")
