"""Memory of the any-size executable's runs (``anysize.py``): a slot per value (given by
liveness once, at compile) whose buffer is kept between runs whatever the sizes, scratch
buffers kept the same way, outputs recycled once the caller lets them go, and the build
context of a kernel built for one run.

Why keep them: on this kind of host the first touch of fresh memory costs about half a
millisecond per megabyte in page faults, and a stream of requests changes its sizes on
every one; buffers sized per run and taken from what earlier runs left behind fault in
nothing once the largest request has been seen.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .steps import aligned_empty, owner
from .warm_pool import warm_pool

__all__ = ["Arena", "Outputs", "RunContext"]

#: A free buffer up to this size serves any smaller value (larger ones: values at least half their size).
_SMALL = 64 * 1024
#: An empty slot (no buffer yet).
_NONE = np.empty(0, np.uint8)


def _rounded(nbytes: int) -> int:
    """The bytes of a new buffer for ``nbytes``: up to the next quarter power of two (so
    that sizes that grow a little reuse it), in whole cache lines."""
    size = 2 ** (math.ceil(4 * math.log2(max(nbytes, 64))) / 4)
    return -(-math.ceil(size) // 64) * 64


class Arena:
    """The memory of one run at a time, kept between runs. A value's memory is its slot's
    buffer (``slot``: the executable gave each value a slot no other live value holds),
    grown when a run needs more, never shrunk; scratch takes the smallest free buffer
    that holds it, a new one (from the warm pool, else fresh memory) only when none does,
    and gives it back. Once the largest request has run, a run faults in no fresh memory
    (about half a millisecond per megabyte on this kind of host: the sizes of a stream of
    requests change on every one)."""

    __slots__ = ("_free", "_sizes", "_slots", "outputs")

    def __init__(self, outputs: int, slots: int = 0) -> None:
        self._free: list[np.ndarray] = []  # sorted by size
        self._sizes: list[int] = []
        self._slots: list[np.ndarray] = [_NONE] * slots
        self.outputs = Outputs(outputs)

    def slot(self, k: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A ``shape`` ``dtype`` array in slot ``k``'s buffer (grown to hold it)."""
        nbytes = math.prod(shape) * dtype.itemsize
        raw = self._slots[k]
        if raw.nbytes < nbytes:  # (the smaller one is let go: a slot grows a few times, to the largest run)
            raw = self._slots[k] = self._fresh(nbytes)
        return raw[:nbytes].view(dtype).reshape(shape)

    @staticmethod
    def _fresh(nbytes: int) -> np.ndarray:
        size = _rounded(nbytes)
        raw = warm_pool().take(size)
        return raw if raw is not None else aligned_empty(size, np.uint8)

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """A ``shape`` ``dtype`` array and the raw buffer under it (to give back)."""
        nbytes = math.prod(shape) * dtype.itemsize
        i = bisect.bisect_left(self._sizes, nbytes)
        if i < len(self._free) and self._sizes[i] <= max(2 * nbytes, _SMALL):  # no big buffer on a small value
            raw = self._free.pop(i)
            del self._sizes[i]
        else:
            raw = self._fresh(nbytes)
        return raw[:nbytes].view(dtype).reshape(shape), raw

    def give(self, raw: np.ndarray) -> None:
        i = bisect.bisect_left(self._sizes, raw.nbytes)
        self._sizes.insert(i, raw.nbytes)
        self._free.insert(i, raw)


class Outputs:
    """The arrays handed to the caller, kept so that a later run writes into the same
    memory once the caller has let them go (``steps.Outputs``' rule: nothing but this
    object refers to the memory): a new output is fresh memory, faulted in by the kernel
    that writes it. One per arena (a run at a time). What is counted is the buffer that
    owns the memory (``aligned_empty`` hands out a view of it: every view the caller
    holds refers to the owner, not to our view)."""

    __slots__ = ("_kept",)

    def __init__(self, count: int) -> None:
        self._kept: list[tuple[np.ndarray, np.ndarray] | None] = [None] * count  # (our view, its owner)

    def take(self, k: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = math.prod(shape) * dtype.itemsize
        kept = self._kept[k]
        if kept is not None and sys.getrefcount(kept[1]) == _UNOWNED:
            raw = kept[0]
            if nbytes <= raw.nbytes <= max(2 * nbytes, _SMALL):
                return raw[:nbytes].view(dtype).reshape(shape)
        raw = aligned_empty(_rounded(nbytes), np.uint8)
        self._kept[k] = (raw, owner(raw))
        return raw[:nbytes].view(dtype).reshape(shape)


def _unowned() -> int:
    """``sys.getrefcount`` of an owner only an ``Outputs`` holds, counted as ``take`` counts it."""
    probe = Outputs(1)
    raw = aligned_empty(64, np.uint8)
    probe._kept[0] = (raw, owner(raw))
    del raw
    kept = probe._kept[0]
    del kept
    return sys.getrefcount(probe._kept[0][1])


_UNOWNED = _unowned()


class RunContext:
    """The ``BuildContext`` of a kernel built for one run: scratch from the run's arena,
    given back once the kernel ran; arrays derived from residents (a weight packed for
    rlx's GEMM) from ``derived``, the executable's, which keeps those that hold at every
    size and declines the rest (``None``: the kernel does without)."""

    __slots__ = ("_arena", "_taken", "derived")

    def __init__(self, arena: Arena, derived: Callable[..., np.ndarray | None]) -> None:
        self._arena, self._taken, self.derived = arena, [], derived

    def scratch(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        arr, raw = self._arena.take(tuple(shape), np.dtype(dtype))
        self._taken.append(raw)
        return arr

    def constant(self, array: Any) -> bool:
        return False  # no value is baked into a kernel: the kernels that would take one fall back

    def release(self) -> None:
        for raw in self._taken:
            self._arena.give(raw)
