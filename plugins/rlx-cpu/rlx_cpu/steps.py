"""Steps: the zero-argument callables a plan is made of, and how they are bound.

A kernel builder describes its work as a list of ``Step(fn, args, kwargs)``. Binding
turns each into a callable that the run loop calls with no arguments. When every
argument is an array known at compile time (a preallocated buffer, a param, a
constant), the callable is a ``functools.partial`` of the numpy function itself, so a
``np.add(a, b, out)`` step runs with no Python frame at all. Arguments that only exist
at run time (the caller's input arrays, and views of them) are ``Dyn`` placeholders;
a step holding one is compiled into a small function that reads its slot.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = ["CACHE_LINE", "HELD16", "Dyn", "Parallel", "Step", "aligned_empty", "held16", "owner", "bind", "bind_run",
           "is_fixed", "helper_threads"]

#: The byte alignment of the buffers the native kernels read and write. numpy's own
#: allocations start at any multiple of 16 bytes (big ones 16 bytes past a page), so the
#: 32- and 64-byte vector loads of a kernel split across cache lines in half or all of
#: them, by the luck of each buffer: two compiles of one model in one process ran
#: 1.1-1.35x apart on the 2-core Zen 3 (BENCHMARKS.md, session 18).
CACHE_LINE = 64


def aligned_empty(shape: int | tuple[int, ...], dtype: Any, align: int = CACHE_LINE) -> np.ndarray:
    """``np.empty(shape, dtype)`` starting on an ``align``-byte boundary (a view into a
    slightly larger buffer, which it keeps alive)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start : start + nbytes].view(dtype).reshape(shape)


#: The dtype of a view of a plan buffer holding its value in the build's reduced 16-bit
#: format (``held.py``: bf16 under ``precision="bf16"``), in the first half of the float32
#: buffer's bytes. A structured dtype, so that no kernel takes it for an integer array:
#: only the steps that read and write that format (oneDNN's, the native interpreter's)
#: accept it.
HELD16 = np.dtype([("held16", "<u2")])


def held16(x: np.ndarray) -> np.ndarray:
    """Plan buffer ``x`` (float32, C-contiguous) as the view that holds its value in the
    reduced format: same shape, two bytes an element."""
    return x.reshape(-1).view(HELD16)[: x.size].reshape(x.shape)


def owner(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory (``a`` itself, or the base of its views)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class Step(NamedTuple):
    """``fn(*args, **kwargs)``, where args may hold ``Dyn`` placeholders."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}


class Dyn:
    """A value that exists only at run time: the array in ``slots[slot]``, seen through
    a chain of view operations (reshape, transpose, indexing).

    It answers ``shape``, ``dtype``, ``ndim`` and ``size`` like the array will, and its
    view methods return new placeholders, so kernel builders treat it like an ndarray.
    """

    __slots__ = ("chain", "dtype", "shape", "slot")

    def __init__(self, slot: int, shape: tuple[int, ...], dtype: np.dtype, chain: tuple[tuple[str, Any], ...] = ()):
        self.slot = slot
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.chain = chain

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def _then(self, op: str, arg: Any, shape: tuple[int, ...]) -> Dyn:
        return Dyn(self.slot, shape, self.dtype, (*self.chain, (op, arg)))

    def reshape(self, *shape: Any) -> Dyn:
        want = list(shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
        if -1 in want:
            known = math.prod(d for d in want if d != -1)
            want[want.index(-1)] = self.size // known if known else 0
        if math.prod(want) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}")
        return self._then("reshape", tuple(want), tuple(want))

    def transpose(self, perm: Sequence[int]) -> Dyn:
        perm = tuple(perm)
        return self._then("transpose", perm, tuple(self.shape[p] for p in perm))

    def swapaxes(self, a: int, b: int) -> Dyn:
        perm = list(range(self.ndim))
        perm[a], perm[b] = perm[b], perm[a]
        return self.transpose(perm)

    def __getitem__(self, index: Any) -> Dyn:
        shape = np.broadcast_to(np.zeros((), self.dtype), self.shape)[index].shape
        return self._then("getitem", index, shape)

    def expr(self, ns: dict[str, Any]) -> str:
        """Python source reading this value from slot list ``S``; constants go into ``ns``."""
        src = f"S[{self.slot}]"
        for op, arg in self.chain:
            name = f"_c{len(ns)}"
            ns[name] = arg
            src += f"[{name}]" if op == "getitem" else f".{op}({name})"
        return src

    def __repr__(self) -> str:
        return f"Dyn(slot={self.slot}, shape={self.shape}, dtype={self.dtype}, chain={self.chain})"


class Parallel(NamedTuple):
    """Two independent lists of steps (two halves of a big fused region) that run at the
    same time: the second on a helper thread, the first on the caller's.

    numpy releases the GIL inside its loops, so two threads each sweeping half of a
    region over 64k-element blocks run 1.4-1.8x faster than one on a two-core host;
    with the usual 16k blocks they do not (the GIL handoffs between short calls eat the
    gain), which is why only regions big enough for large blocks are split.
    """

    first: tuple[Step, ...]
    second: tuple[Step, ...]


_POOL: list[Any] = []  # the helper threads, made on first use; emptied in a forked child
_POOL_LOCK = threading.Lock()


def helper_threads() -> int:
    """Threads a ``Parallel`` step may use besides the caller's (0 on a one-core host)."""
    return max(min((os.cpu_count() or 1) - 1, 1), 0)


def _pool() -> Any:
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor

        with _POOL_LOCK:  # two plans running their first big region at once make one pool
            if not _POOL:
                _POOL.append(ThreadPoolExecutor(max_workers=max(helper_threads(), 1),
                                                thread_name_prefix="rlx-cpu-region"))
    return _POOL[0]


if hasattr(os, "register_at_fork"):  # a forked child has the pool object but not its threads
    os.register_at_fork(after_in_child=_POOL.clear)


#: Set on a bound step that runs a numpy ufunc (``_ieee``).
_IEEE = "_rlx_ieee"


def _ieee(fn: Any, args: Sequence[Any] = ()) -> bool:
    """Whether ``fn(*args)`` may warn about IEEE results the graph asks for: a numpy
    ufunc or one of its methods (``log(0)``, ``inf - inf``, an ``exp`` that overflows, a
    ``maximum.reduce`` over NaN), or ``np.copyto`` casting floats to another type (NaN or
    out of range to an integer: a Cast the graph makes on values it holds). A plan with
    such a step runs under ``np.errstate(all="ignore")`` (``bind_run``): numpy's
    RuntimeWarnings would reach the user from inside rlx's kernels about values their
    own inputs hold, and the native kernels, which compute the same, say nothing. Only
    those plans pay for the errstate (a few µs a run); numpy's settings elsewhere in
    the process are left as they are."""
    if isinstance(fn, np.ufunc) or isinstance(getattr(fn, "__self__", None), np.ufunc):
        return True
    if fn is np.copyto and len(args) >= 2:
        dst, src = (getattr(a, "dtype", None) for a in args[:2])
        return src is not None and np.dtype(src).kind == "f" and dst != src
    return False


def _quiet(steps: Sequence[Callable[[], Any]]) -> bool:
    return any(getattr(s, _IEEE, False) for s in steps)


def _bind_parallel(step: Parallel, slots: list[Any]) -> Callable[[], None]:
    first = tuple(bind(s, slots) for s in step.first)
    second = tuple(bind(s, slots) for s in step.second)
    quiet_second = _quiet(second)  # the helper thread does not share the caller's errstate

    def run_second() -> None:
        with np.errstate(all="ignore") if quiet_second else contextlib.nullcontext():
            for s in second:
                s()

    def run() -> None:
        future = _pool().submit(run_second)
        try:
            for s in first:
                s()
        finally:
            future.result()  # the other half's error, if any, surfaces here

    if quiet_second or _quiet(first):
        setattr(run, _IEEE, True)
    return run


def is_fixed(x: Any) -> bool:
    """True for an array known when the plan is bound (not a run-time ``Dyn``)."""
    return not isinstance(x, Dyn)


def laid_out(x: Any) -> bool:
    """Whether a native kernel may take ``x`` by its address: a C-contiguous, aligned plan
    array, or a caller's (``Dyn``), whose layout ``ccall`` checks each run (a numpy
    fallback for one it cannot take)."""
    return isinstance(x, Dyn) or (x.flags.c_contiguous and x.flags.aligned)


_CODE: dict[str, Any] = {}  # step source -> code object; the sources depend only on structure


def _compiled(src: str) -> Any:
    code = _CODE.get(src)
    if code is None:
        code = _CODE[src] = compile(src, "<rlx_cpu step>", "exec")
    return code


def bind(step: Step | Parallel, slots: list[Any]) -> Callable[[], Any]:
    """The zero-argument callable running ``step``, reading run-time values from ``slots``."""
    if isinstance(step, Parallel):
        return _bind_parallel(step, slots)
    fn, args, kwargs = step
    if not any(isinstance(a, Dyn) for a in args) and not any(isinstance(v, Dyn) for v in kwargs.values()):
        if not (args or kwargs):
            return fn
        bound = functools.partial(fn, *args, **kwargs)
        if _ieee(fn, args):
            setattr(bound, _IEEE, True)
        return bound
    ns: dict[str, Any] = {"_fn": fn, "S": slots}
    parts = []
    for value in args:
        parts.append(_operand(value, ns))
    for key, value in kwargs.items():
        parts.append(f"{key}={_operand(value, ns)}")
    src = f"def _step():\n    _fn({', '.join(parts)})\n"
    exec(_compiled(src), ns)
    step = ns.pop("_step")  # (not left in its own globals: no reference cycle, see bind_run)
    if _ieee(fn, args):
        setattr(step, _IEEE, True)
    return step


def _operand(value: Any, ns: dict[str, Any]) -> str:
    if isinstance(value, Dyn):
        return value.expr(ns)
    name = f"_a{len(ns)}"
    ns[name] = value
    return name


#: Outputs of at least this many bytes are handed out in recycled arrays (``Outputs``);
#: smaller ones are plain copies, which cost less than the bookkeeping.
RECYCLE_BYTES = 1 << 16


class Outputs:
    """The arrays one plan hands its caller, kept so that the next run can write into
    them again once the caller has let them go.

    Why: a fresh output array is new memory, and the kernel that writes it first pays a
    page fault for every 4 KiB of it (glibc maps blocks over 32 MiB anew on every
    allocation, and returns them on every free). On outputs of tens of megabytes (a
    batch of feature maps, a language model's logits) that cost as much as the model's
    own last layer: a 1x1 convolution into 8 x 96 x 112 x 112 floats, as a graph of its
    own, ran 2.4x onnxruntime's time, 1.6x with its output's memory reused (BENCHMARKS.md,
    session 19). ONNX Runtime gets the same memory back from its arena.

    An array is reused only when nothing but this object refers to it: the caller
    dropped it and no view, memoryview or other object holds it (each of those keeps a
    reference). The count that means "only us" is measured once, through the same code
    path, rather than assumed, since interpreters count references to locals
    differently. Each plan owns one; a plan serves one run at a time, so no lock."""

    def __init__(self, count: int) -> None:
        self._kept: list[np.ndarray | None] = [None] * count

    def take(self, k: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` for output ``k``: last run's when the caller
        let it go, else a new one (kept for the next run)."""
        if self._kept[k] is not None and self._references(k) == _UNOWNED:  # counted before any local holds it
            prev = self._kept[k]
            if prev.shape == shape and prev.dtype == dtype:
                return prev
        arr = np.empty(shape, dtype)
        self._kept[k] = arr if arr.nbytes >= RECYCLE_BYTES else None
        return arr

    def copy(self, k: int, src: np.ndarray) -> np.ndarray:
        """A copy of ``src`` for output ``k``, in last run's array when it can be reused."""
        if src.nbytes < RECYCLE_BYTES:
            return src.copy()
        out = self.take(k, src.shape, src.dtype)
        np.copyto(out, src)
        return out


    def _references(self, k: int) -> int:
        """References to output ``k``'s kept array (ours included, and this call's)."""
        return sys.getrefcount(self._kept[k])


def _unowned_refs() -> int:
    """``Outputs._references`` of an array that only an ``Outputs`` holds."""
    probe = Outputs(1)
    probe._kept[0] = np.empty(1, np.uint8)
    return probe._references(0)


_UNOWNED = _unowned_refs()


def bind_run(input_names: Sequence[str], steps: Sequence[Callable[[], Any]], outputs: Sequence[Any],
             slots: list[Any], recycle: Outputs, fresh: Sequence[Dyn] = ()) -> Callable[[Any], list[np.ndarray]]:
    """The body of one run of a plan: put ``inputs[name]`` into the slots, call every
    step, copy out ``outputs`` (arrays or ``Dyn``), and let go of the caller's arrays.

    ``fresh`` are output slots that the steps write into an array handed to the caller as
    it is: for a large output that saves a copy as big as the output, the price numpy
    itself pays for ``a @ b``; small outputs are cheaper to copy out. Large outputs, fresh
    or copied, go into arrays recycled from earlier runs once the caller has dropped
    them (``recycle``, of ``len(outputs) + len(fresh)`` places: this plan's own, or that of
    another plan that never runs at the same time as this one, whose arrays are faulted in
    already)."""
    ns: dict[str, Any] = {"S": slots, "_steps": tuple(steps), "_take": recycle.take, "_copy": recycle.copy,
                          "_errstate": np.errstate}
    lines = ["def _run(inputs):"]
    lines += [f"    S[{k}] = inputs[{_operand(name, ns)}]" for k, name in enumerate(input_names)]
    handed: dict[int, int] = {}  # a fresh slot -> the output position that hands it out
    for j, v in enumerate(outputs):
        if isinstance(v, Dyn) and not v.chain and v.slot not in handed and any(d.slot == v.slot for d in fresh):
            handed[v.slot] = j
    for i, d in enumerate(fresh):  # one not handed out whole has a place of its own
        lines.append(f"    S[{d.slot}] = _take({handed.get(d.slot, len(outputs) + i)}, {_operand(d.shape, ns)}, "
                     f"{_operand(d.dtype, ns)})")
    if _quiet(steps):  # IEEE results, not warnings (``_ieee``)
        lines += ["    with _errstate(all='ignore'):", "        for _s in _steps:", "            _s()"]
    else:
        lines += ["    for _s in _steps:", "        _s()"]
    outs = []
    for j, v in enumerate(outputs):
        if isinstance(v, Dyn) and not v.chain and handed.get(v.slot) == j:
            outs.append(f"S[{v.slot}]")
        else:
            outs.append(f"_copy({j}, {_operand(v, ns)})")
    lines.append(f"    _r = [{', '.join(outs)}]")
    lines += [f"    S[{k}] = None" for k in [*range(len(input_names)), *(d.slot for d in fresh)]]
    lines.append("    return _r")
    exec(_compiled("\n".join(lines) + "\n"), ns)
    # A function defined by exec sits in the globals it reads: function -> globals -> function,
    # a cycle only the collector frees, holding every step, kernel and plan buffer the run
    # reaches. Taken out, a compiled graph dropped by its last owner (an LRU of shape
    # classes evicting one) frees its memory at once.
    return ns.pop("_run")
