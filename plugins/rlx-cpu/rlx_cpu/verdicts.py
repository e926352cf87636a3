"""The cpu backend's timed choices, kept on disk so that the next process does not time them again.

rlx-cpu decides by measurement, once per process, which code runs a kind of work on this
host: rlx's GEMM or the BLAS (``gemm``), implicit GEMM, im2col or the direct kernel for
convolutions (``conv_choice``), oneDNN or rlx's kernels per kind of convolution
(``onednn``). The probes are most of the first compile of every process: on a 2-core
Zen 3, mobilenet_v2's first compile took several times as long as the same compile
again, and many times ONNX Runtime's session creation (measured: BENCHMARKS.md, section
'GEMM stores, recycled outputs and kept verdicts (issue 35, session 19)'). A verdict is a
fact about the host and the code, so it is kept (namespace ``cpu-verdicts``, JSON through
rlx-core's ``JsonCache``) and reused while nothing it depends on has changed:

- the CPU (its model name and the vector extensions the kernels pick from), the cores
  this process may use, and the threads settings of the OpenMP and BLAS runtimes;
- rlx-cpu's version and the modules that probe (their size and mtime), the native library
  (the source it was built from, its size and mtime), the BLAS (oneMKL's version, or
  numpy's build and version) and oneDNN's library;
- every ``RLX_CPU_*`` setting.

An entry older than ``VERDICT_TTL_S`` (a day) is measured again. A verdict timed while
other processes took more than ``load.BUSY_SHARE`` of this process's CPUs is timed once
more; if the load held, the answer serves this process only and is not kept (the bf16
probe, timed in CI beside a busy pytest worker, once kept a 0.71x for a 1.9x). The report
(``rlx devices --explain``) says when a verdict came from the cache and how old it is.
A cache that cannot be written only costs the next process its probes (logged, not
warned: the user asked for nothing). ``forget`` drops a question's entry (tests; the
modules' ``reset``)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlx_core.errors import CacheWarning
from rlx_core.plugin import JsonCache

from . import load

__all__ = ["HostVerdicts", "TimedAnswer", "VERDICTS", "VERDICT_TTL_S", "cpu_flags", "how_old", "kept_answer",
           "settled", "settled_answer"]

log = logging.getLogger("rlx_cpu")

#: Seconds a verdict is reused by later processes.
VERDICT_TTL_S = 86400.0
_SCHEMA = 1
_NAMESPACE = "cpu-verdicts"
_WHAT = "rlx-cpu's timed choices on this host (GEMM or BLAS, convolution kernels, oneDNN per kind)"
#: The variables of the threading runtimes a timing depends on, besides ``RLX_CPU_*``.
_THREAD_VARS = ("OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: The modules whose probes make the verdicts: an edited one times them again.
_DECIDERS = ("gemm.py", "conv_choice.py", "onednn.py", "bf16_units.py", "swish.py")
_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16", "avx2", "fma", "neon", "asimd", "sve")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """The CPU's model name and feature flags from ``/proc/cpuinfo`` (empty elsewhere)."""
    model, flags = "", frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return model, flags


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where there is none)."""
    return _cpuinfo()[1]


def _cpu() -> str:
    """The CPU's model name and the vector extensions the kernels choose between (from
    ``/proc/cpuinfo``; elsewhere the machine's architecture only: ``platform.processor``
    runs ``uname -p`` in a child process)."""
    model, present = _cpuinfo()
    if not model and not present:  # no /proc/cpuinfo
        return platform.machine()
    flags = " ".join(f for f in _FLAGS if f in present)
    return f"{model or platform.machine()} [{flags}]"


def _file(path: str | None) -> str:
    """A library file's identity: its path, size and mtime (no read of its bytes)."""
    if not path:
        return ""
    try:
        st = os.stat(path)
    except OSError:
        return str(path)
    return f"{path} {st.st_size} {st.st_mtime_ns}"


def _identity() -> dict[str, Any]:
    from . import blas, gemm, native, onednn

    lib = native.library()
    info = native.read_info(native._DIRECTORY) if lib is not None else {}
    mkl = blas.mkl()
    return {
        "rlx_cpu": _version(),
        "python": sys.implementation.cache_tag,
        "cpu": _cpu(),
        "cores": gemm._cores(),
        "native": f"{info.get('source_sha256', '')} {_file(lib.path if lib is not None else None)}",
        "blas": f"{mkl.version} {_file(mkl.path)}" if mkl is not None else f"numpy {_numpy_version()} "
                                                                          f"{blas.numpy_blas()}",
        "onednn": _file(onednn.find_library()) if onednn.wanted() != "off" else "off",
        "env": _settings(),
        "code": [_file(str(Path(__file__).with_name(name))) for name in _DECIDERS],
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlx-cpu")
    except PackageNotFoundError:
        return "unknown"


def _numpy_version() -> str:
    import numpy as np

    return np.__version__


def _settings() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("RLX_CPU_") or k in _THREAD_VARS}


def _key(question: str) -> str:
    """The entry's file name: the question (``gemm``) and a digest of the settings, so that
    a user who switches ``RLX_CPU_*`` settings back and forth keeps a verdict for each
    (anything else that changed, the code or the CPU, replaces the entry)."""
    digest = hashlib.sha256(json.dumps(_settings()).encode("utf-8")).hexdigest()[:12]
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in question)[:48] + "-" + digest


class HostVerdicts:
    """This host's verdicts on disk (see the module docstring). The identity is worked out
    at each use (a few per process): a setting changed since is a different identity."""

    def __init__(self, root: str | os.PathLike[str] | None = None, ttl_s: float = VERDICT_TTL_S) -> None:
        self._cache = JsonCache(_NAMESPACE, _SCHEMA, root, what=_WHAT, recompute="it will be timed again")
        self._ttl_s = ttl_s

    def recall(self, question: str) -> tuple[dict[str, Any], float] | None:
        """The payload kept for ``question`` and its age in seconds, or None (none kept, too
        old, from the future, or written for another identity)."""
        with warnings.catch_warnings():
            # a stale or foreign entry is replaced once measured again: logged, not warned
            warnings.simplefilter("ignore", CacheWarning)
            try:
                found = self._cache.get(_key(question), _identity())
            except Exception as exc:  # a cache is an optimization: never a reason to fail a compile
                log.debug("rlx-cpu: verdict cache unreadable (%s: %s)", type(exc).__name__, exc)
                return None
        if not found or not isinstance(found.get("at"), (int, float)) or found.get("question") != question:
            return None
        age = time.time() - float(found["at"])
        if not 0 <= age <= self._ttl_s:
            return None
        return found, age

    def keep(self, question: str, payload: Mapping[str, Any]) -> None:
        """Store ``payload`` (JSON data) as the verdict on ``question``, timed now."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWarning)  # logged below instead: nobody asked for this cache
            try:
                self._cache.put(_key(question), _identity(), {**payload, "question": question, "at": time.time()})
            except Exception as exc:
                log.debug("rlx-cpu: verdict on %s not kept (%s: %s)", question, type(exc).__name__, exc)

    def forget(self, question: str) -> None:
        """Drop the verdict on ``question``: the next process (and this one) times it again."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWarning)
            try:
                self._cache.remove(_key(question))
            except Exception as exc:
                log.debug("rlx-cpu: verdict on %s not removed (%s: %s)", question, type(exc).__name__, exc)


VERDICTS = HostVerdicts()


def how_old(seconds: float) -> str:
    """``seconds`` as the reports say how old a verdict is."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _metered(measure: Callable[[], Mapping[str, Any]]) -> tuple[dict[str, Any], float | None]:
    """``measure()``'s verdict, timed once more where other processes were busy (the load
    may have passed), and the share they took of the run it comes from (None: unknown)."""
    with load.Meter() as meter:
        verdict = dict(measure())
    if not meter.busy:
        return verdict, meter.others
    log.info("rlx-cpu: other processes took %.0f%% of the CPUs while a verdict was timed: timing it again",
             100 * (meter.others or 0.0))
    with load.Meter() as again:
        second = dict(measure())
    return (second, again.others) if (again.others or 0.0) <= (meter.others or 0.0) else (verdict, meter.others)


def settled(question: str, measure: Callable[[], Mapping[str, Any]],
            verdicts: HostVerdicts | None = None) -> dict[str, Any]:
    """The verdict on ``question``: ``{"yes": bool, "why": str, ...}`` (JSON data), kept
    from an earlier process's measurement when ``verdicts`` has one (``why`` then says how
    old it is), else ``measure()``'s, which is then kept unless other processes held the
    CPUs while it ran (twice: ``_metered``; ``why`` then says so)."""
    store = VERDICTS if verdicts is None else verdicts
    found = store.recall(question)
    if found is not None:
        payload, age = found
        if isinstance(payload.get("yes"), bool) and isinstance(payload.get("why"), str):
            kept = {k: v for k, v in payload.items() if k not in ("question", "at")}
            return {**kept, "why": f"{payload['why']}; timed {how_old(age)} ago, kept in rlx's cache"}
    verdict, others = _metered(measure)
    if others is not None and others > load.BUSY_SHARE:
        why = str(verdict.get("why", ""))
        return {**verdict, "why": f"{why}; timed while other processes took {others:.0%} of the CPUs: for this "
                                  "process only, timed again by the next"}
    store.keep(question, verdict)
    return verdict


def kept_answer(question: str) -> tuple[bool, str] | None:
    """A ``settled_answer`` verdict as rlx's cache keeps it, with how old it is, or None
    (reads the file, times nothing: for ``describe``, which ``rlx devices --explain`` asks)."""
    kept = VERDICTS.recall(question)
    if kept is None or not isinstance(kept[0].get("yes"), bool) or not isinstance(kept[0].get("why"), str):
        return None
    return kept[0]["yes"], f"{kept[0]['why']}; timed {how_old(kept[1])} ago, kept in rlx's cache"


def settled_answer(question: str, measure: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
    """``settled`` for a measurement that answers ``(yes, why)``: the convolution choices'."""
    found = settled(question, lambda: dict(zip(("yes", "why"), measure(), strict=True)))
    return bool(found["yes"]), str(found["why"])


class TimedAnswer:
    """One yes-or-no question timed on the host (``settled_answer``), answered once per
    process under a lock: the state the modules that probe (``bf16_units``, ``swish``)
    would otherwise each keep in a global of their own. ``measure`` answers
    ``(yes, why)``; ``told`` logs the answer as the module words it."""

    def __init__(self, question: str, told: Callable[[bool, str], None]) -> None:
        self.question = question
        self._told = told
        self._lock = threading.Lock()
        self._answer: tuple[bool, str] | None = None

    def answer(self, measure: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
        """This process's answer: kept by an earlier process, else timed now."""
        with self._lock:
            if self._answer is None:
                self._answer = settled_answer(self.question, measure)
                self._told(*self._answer)
            return self._answer

    def known(self) -> tuple[bool, str] | None:
        """The answer where this process or rlx's cache has it, timing nothing (for the
        reports: ``rlx devices --explain`` asks)."""
        return self._answer or kept_answer(self.question)

    def reset(self) -> None:
        """Forget the answer, here and on disk (tests)."""
        with self._lock:
            self._answer = None
            VERDICTS.forget(self.question)
