"""Steps that call a C function with array addresses bound when the plan is made.

Used for oneMKL (``blas.py``) and rlx's own kernels (``native.c``): every argument of the
call is fixed at plan time (shapes, strides, the addresses of plan buffers and
residents), so a run makes the call with no Python frame beyond one. Only a caller's
array (a ``Dyn`` placeholder) has its address read per run, a small fixed cost (measured:
BENCHMARKS.md, section 'Figures behind design choices (moved from docstrings, issue 32)');
one the C side cannot take as it is (not C-contiguous, read-only) makes that run go
through a numpy fallback that computes the same result. rlx's own kernels take their
arguments as one int64 array through ``rlx_packed`` (``register_packed``): ctypes
converts each argument on every call, and that conversion was most of a small kernel's
time.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .steps import Dyn, Step

__all__ = ["address", "address_of", "bound_call", "packed_call", "register_packed", "target"]


def address(x: np.ndarray) -> int:
    """The address of a C-contiguous, writable array; raises TypeError/BufferError/ValueError else."""
    return ctypes.addressof(ctypes.c_char.from_buffer(x))


def address_of(x: np.ndarray) -> int:
    """The address of any array: ctypes' view of its buffer where it is writable and
    contiguous (~0.5 µs), numpy's ``ctypes.data`` otherwise (~1 µs); for kernels called
    per run with the run's arrays."""
    try:
        return address(x)
    except (TypeError, BufferError, ValueError):
        return int(x.ctypes.data)


def _call(fn: Callable[..., None], args: tuple[Any, ...], keep: tuple[Any, ...]) -> None:
    fn(*args)  # ``keep`` holds the arrays whose addresses are in ``args``


class _RunTimeCall:
    """A call with at least one caller array among its operands: the addresses of those
    are read each run, and an array the C side cannot take as it is (strided, read-only)
    makes this run go through ``fallback(*operands)``, numpy's way to the same result."""

    def __init__(self, fn: Callable[..., None], args: list[Any], slots: dict[int, int], keep: tuple[Any, ...],
                 fallback: Callable[..., None]) -> None:
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


#: rlx's own kernels that also take their arguments packed: id(fn) -> (fn, the packed
#: entry point, the kernel's number there). See ``register_packed``.
_PACKED: dict[int, tuple[Callable[..., Any], Callable[[int], int], int]] = {}


def register_packed(fn: Callable[..., Any], packed: Callable[[int], int], kernel: int) -> None:
    """Steps calling ``fn`` (a ctypes function of native.c) go through ``packed(address of
    an int64 array: kernel, then fn's arguments)`` instead (``rlx_packed``): ctypes converts
    every argument on every call, so a call costs in proportion to its arguments:
    rlx_gemm's 18 cost over ten times as much as one address (measured: BENCHMARKS.md,
    sections 'On the same 2-core Zen 5, session 10' and 'Figures behind design choices
    (moved from docstrings, issue 32)'). ``fn``'s ``argtypes`` say which arguments are
    floats (passed as the bits of a double)."""
    _PACKED[id(fn)] = (fn, packed, kernel)


def packed_call(fn: Callable[..., Any], args: list[Any]) -> tuple[Callable[[int], int], np.ndarray] | None:
    """For a kernel registered with ``register_packed``: its packed entry point and the
    int64 array of ``args`` to pass it (by address; the caller keeps the array alive).
    None for any other function."""
    entry = _PACKED.get(id(fn))
    if entry is None or entry[0] is not fn:
        return None
    return entry[1], _packed_args(fn, entry[2], args)


def _packed_args(fn: Callable[..., Any], kernel: int, args: list[Any]) -> np.ndarray:
    floats = {i for i, t in enumerate(getattr(fn, "argtypes", None) or ()) if t in (ctypes.c_float, ctypes.c_double)}
    arr = np.zeros(len(args) + 1, np.int64)
    arr[0] = kernel
    for i, value in enumerate(args):
        arr[i + 1] = np.float64(value).view(np.int64) if i in floats else int(value or 0)
    return arr


class _PackedRunTimeCall:
    """``_RunTimeCall`` through the packed entry point: a caller array's address is
    written into the step's own argument array each run."""

    def __init__(self, fn: Callable[..., None], packed: Callable[[int], int], arr: np.ndarray, slots: dict[int, int],
                 keep: tuple[Any, ...], fallback: Callable[..., None]) -> None:
        self.fn, self.packed, self.arr, self.slots, self.keep, self.fallback = fn, packed, arr, slots, keep, fallback
        self.args = list(arr[1:])
        self._ptr = arr.ctypes.data

    def __call__(self, *operands: np.ndarray) -> None:
        arr = self.arr
        try:
            for which, pos in self.slots.items():
                arr[pos + 1] = address(operands[which])
        except (TypeError, BufferError, ValueError):
            self.fallback(*operands)
            return
        self.packed(self._ptr)


def target(step: Step) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
    """``(fn, its bound arguments)`` of a step ``bound_call`` made (packed or not), None
    for any other step; for tests and reports."""
    fn = step.fn
    if isinstance(fn, (_RunTimeCall, _PackedRunTimeCall)):
        return fn.fn, tuple(fn.args)
    if isinstance(fn, functools.partial):
        if fn.func is _call:
            return fn.args[0], fn.args[1]
        if hasattr(fn, "rlx_target"):
            return fn.rlx_target, fn.rlx_args
    return None


def bound_call(fn: Callable[..., None], args: list[Any], operands: tuple[Any, ...], positions: tuple[int, ...],
               fallback: Callable[..., None], keep: tuple[Any, ...] = ()) -> Step:
    """The step calling ``fn(*args)``, where ``args[positions[i]]`` is the address of
    ``operands[i]``: filled in now for arrays, read per run for ``Dyn`` placeholders
    (``fallback(*operands)`` runs instead when one cannot be taken as it is). ``keep``:
    more arrays whose addresses are already in ``args``, held alive by the step. A kernel
    registered with ``register_packed`` is called through its packed entry point."""
    args = list(args)
    for x, pos in zip(operands, positions):
        if not isinstance(x, Dyn):
            args[pos] = x.ctypes.data
    keep = (*keep, *(x for x in operands if not isinstance(x, Dyn)))
    dyn = {i: positions[i] for i, x in enumerate(operands) if isinstance(x, Dyn)}
    found = packed_call(fn, args)
    if found is not None:
        packed, arr = found
        if dyn:
            return Step(_PackedRunTimeCall(fn, packed, arr, dyn, (arr, *keep), fallback), operands)
        call = functools.partial(packed, arr.ctypes.data)
        call.rlx_target, call.rlx_args, call.rlx_keep = fn, tuple(args), (arr, *keep)  # type: ignore[attr-defined]
        return Step(call)
    if not dyn:
        return Step(functools.partial(_call, fn, tuple(args), keep))
    return Step(_RunTimeCall(fn, args, dyn, keep, fallback), operands)
