"""Steps that call a C function with array addresses bound when the plan is made.

Used for oneMKL (``blas.py``) and rlx's own kernels (``native.c``): every argument of the
call is fixed at plan time (shapes, strides, the addresses of plan buffers and
residents), so a run makes the call with no Python frame beyond one. Only a caller's
array (a ``Dyn`` placeholder) has its address read per run (0.3 µs); one the C side
cannot take as it is (not C-contiguous, read-only) makes that run go through a numpy
fallback that computes the same result.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .steps import Dyn, Step

__all__ = ["address", "bound_call"]


def address(x: np.ndarray) -> int:
    """The address of a C-contiguous, writable array; raises TypeError/BufferError/ValueError else."""
    return ctypes.addressof(ctypes.c_char.from_buffer(x))


def _call(fn: Callable[..., None], args: tuple[Any, ...], keep: tuple[Any, ...]) -> None:
    fn(*args)  # ``keep`` holds the arrays whose addresses are in ``args``


class _RunTimeCall:
    """A call with at least one caller array among its operands: the addresses of those
    are read each run, and an array the C side cannot take as it is (strided, read-only)
    makes this run go through ``fallback(*operands)``, numpy's way to the same result."""

    def __init__(self, fn: Callable[..., None], args: list[Any], slots: dict[int, int], keep: tuple[Any, ...],
                 fallback: Callable[..., None]) -> None:  # fmt: skip
        self.fn, self.args, self.slots, self.keep, self.fallback = fn, args, slots, keep, fallback

    def __call__(self, *operands: np.ndarray) -> None:
        args = list(self.args)
        try:
            for which, pos in self.slots.items():
                args[pos] = address(operands[which])
        except (TypeError, BufferError, ValueError):
            self.fallback(*operands)
            return
        self.fn(*args)


def bound_call(fn: Callable[..., None], args: list[Any], operands: tuple[Any, ...], positions: tuple[int, ...],
               fallback: Callable[..., None], keep: tuple[Any, ...] = ()) -> Step:  # fmt: skip
    """The step calling ``fn(*args)``, where ``args[positions[i]]`` is the address of
    ``operands[i]``: filled in now for arrays, read per run for ``Dyn`` placeholders
    (``fallback(*operands)`` runs instead when one cannot be taken as it is). ``keep``:
    more arrays whose addresses are already in ``args``, held alive by the step."""
    args = list(args)
    for x, pos in zip(operands, positions):
        if not isinstance(x, Dyn):
            args[pos] = x.ctypes.data
    keep = (*keep, *(x for x in operands if not isinstance(x, Dyn)))
    dyn = {i: positions[i] for i, x in enumerate(operands) if isinstance(x, Dyn)}
    if not dyn:
        return Step(functools.partial(_call, fn, tuple(args), keep))
    return Step(_RunTimeCall(fn, args, dyn, keep, fallback), operands)
