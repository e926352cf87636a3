"""The process's OpenMP runtime (libgomp): loaded once, with a short spin, before any
library that needs it.

The native kernels, oneDNN's ``gomp`` build and oneMKL's GNU threading layer all run
their parallel regions on libgomp's team. When a region ends, libgomp's workers spin,
waiting for the next one, before they sleep: ``GOMP_SPINCOUNT`` iterations, 300,000 by
default, which is about 5 ms of a core burnt after every rlx run. A runtime beside rlx in
the same process (ONNX Runtime, OpenVINO, a second rlx model) then finds one of its
cores taken when its own call starts. On a 2-core host that made ONNX Runtime's calls
made right after rlx's 1.22-1.24x slower, and OpenVINO's up to 1.68x (mobilenet_v2 at
batch 1; ``bench/neighbours.py``, BENCHMARKS.md section 'Good neighbours (issue 35,
session 24)').

libgomp reads its spin count once, when it is loaded, and has no call to change it
later. So rlx-cpu loads it itself, before the first library that links it, with
``GOMP_SPINCOUNT`` set to ``SPIN`` for that moment only (the environment is put back
right after: child processes and other libraries never see it). ``SPIN`` is long
enough to span the gaps between one run's regions (shorter counts made rlx itself up to
1.5x slower: efficientnet_b0 at 1,000) and ends about half a millisecond after a run.

Nothing changes where the user chose (``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` set), or
where libgomp was loaded before rlx-cpu (torch bundles and loads its own copy, and the
first library of a soname is the one every later user gets): ``describe()`` says which,
and logs it at info level.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["SPIN", "Threads", "describe", "load", "loaded", "team", "threads"]

log = logging.getLogger("rlx_cpu")

#: libgomp's spin count under rlx-cpu: about half a millisecond of spinning (measured
#: against the default 300,000 and 1,000-30,000 in between; see the module docstring).
SPIN = 10_000

LIBRARY = "libgomp.so.1"

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


def _loaded_already(name: str) -> bool:
    """Whether a library of soname ``name`` is in the process now (``RTLD_NOLOAD``)."""
    try:
        ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except OSError:
        return False
    return True


def load() -> str:
    """Load libgomp as described above, once per process; returns ``describe()``."""
    with _LOCK:
        if "how" not in _STATE:
            _STATE["loaded"], _STATE["how"] = _load()
            log.info("rlx-cpu: OpenMP: %s", _STATE["how"])
        return str(_STATE["how"])


def loaded() -> bool:
    """Whether libgomp is in the process (``load`` first, if it has not run)."""
    load()
    return bool(_STATE["loaded"])


def _chosen() -> str:
    """The user's own OpenMP wait settings, as ``NAME=value, ...`` ("" when none)."""
    return ", ".join(f"{k}={os.environ[k]}" for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if k in os.environ)


def _load() -> tuple[bool, str]:
    if sys.platform != "linux":
        return False, "not libgomp (not Linux): the OpenMP runtime's defaults"
    if _loaded_already(LIBRARY):
        return True, "libgomp loaded before rlx-cpu (torch, say): its spin count is the one set then"
    chosen = _chosen()
    if not chosen:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN)  # read by libgomp's constructor, at load only
    try:
        ctypes.CDLL(LIBRARY, mode=os.RTLD_GLOBAL)
    except OSError as exc:
        return False, f"libgomp not loaded ({exc})"
    finally:
        if not chosen:
            del os.environ["GOMP_SPINCOUNT"]
    if chosen:
        return True, f"libgomp, as the environment chose ({chosen})"
    return True, f"libgomp, spin {SPIN:,} (rlx-cpu's; GOMP_SPINCOUNT or OMP_WAIT_POLICY choose another)"


def describe(measured: bool = True) -> str:
    """How the OpenMP runtime was loaded (loading it if not yet). ``measured=False`` (the
    probe's ``versions["openmp"]``, part of the calibration's identity) says only what
    rlx-cpu does in a process of its own, without loading anything: whether torch was
    imported first is this process's state, which must not make a calibration stale."""
    if measured:
        return load()
    chosen = _chosen()
    if chosen:
        return f"libgomp, as the environment chooses ({chosen})"
    return f"libgomp, spin {SPIN:,} where rlx-cpu loads it first (GOMP_SPINCOUNT or OMP_WAIT_POLICY choose another)"


class Threads:
    """libgomp's ``omp_get_max_threads``/``omp_set_num_threads``: how many threads the
    next parallel region started from the calling thread uses (oneDNN's OpenMP build and
    the native kernels read it per call)."""

    def __init__(self) -> None:
        load()
        gomp = ctypes.CDLL(LIBRARY)
        self.get, self.set = gomp.omp_get_max_threads, gomp.omp_set_num_threads
        self.get.restype, self.set.argtypes = ctypes.c_int, [ctypes.c_int]


@functools.lru_cache(maxsize=1)
def threads() -> Threads | None:
    """The process's ``Threads``, or None where libgomp's thread controls are not there."""
    try:
        return Threads()
    except (OSError, AttributeError) as exc:
        log.debug("rlx-cpu: libgomp's thread controls not found (%s)", exc)
        return None


@contextlib.contextmanager
def team(cap: int | None) -> Iterator[None]:
    """Parallel regions started from this thread inside use at most ``cap`` threads
    (``None``: unchanged), as do oneDNN primitives *created* inside.

    Why creation: oneDNN's OpenMP build fixes a primitive's thread count when it is
    created (``omp_get_max_threads`` then), and a primitive created for two threads forks
    two whatever the caller's count when it runs. The thread tuner's narrow plans set the
    count to one around each call, yet their convolutions, created under the default,
    still ran on both cores (resnet18 on the 2-core Zen 5: 15 ms of CPU per 7.7 ms run
    "narrow"), so beside a busy process narrow was no cure: the plans bind under this."""
    omp = threads() if cap is not None else None
    if omp is None:
        yield
        return
    before = omp.get()
    omp.set(cap)
    try:
        yield
    finally:
        omp.set(before)
