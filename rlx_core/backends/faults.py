"""Devices whose calibration crashed: remembered across processes until it passes again.

A probe runs in every process, so a probe that dies says so again each time on its own.
Calibration runs once, on request (``rlx calibrate``); when its child process dies (a
driver's segfault in a big kernel, a timeout), the device it measured cannot be trusted
with real graphs either, and the next ``rlx devices`` or ``rlx run`` — another process —
must know that without crashing first. So the fault is written to the cache (JSON, like
every entry) and makes the device unavailable, with the signal and the step that died,
until ``rlx calibrate DEVICE`` succeeds, the plugin's version changes, or ``rlx cache
clear``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from ..cache import JsonCache

__all__ = ["DeviceFault", "FaultLog"]

_SCHEMA = 1


@dataclass(frozen=True)
class DeviceFault:
    """One crash: which backend, during what (``calibration``), at which step, how it
    ended (``died with SIGSEGV (Segmentation fault)``), when, and with which plugin version."""

    backend: str
    task: str
    what: str
    step: str = ""
    when: str = ""
    version: str = ""

    def reason(self) -> str:
        """One line for ``rlx devices`` and blockers."""
        at = f" at step {self.step!r}" if self.step else ""
        when = f" on {self.when}" if self.when else ""
        return (f"{self.task} {self.what}{at}{when}; unusable until `rlx calibrate {self.backend}` succeeds "
                "(or `rlx cache clear`)")


class FaultLog:
    """The faults on this host, one cache entry per backend (``<cache>/faults/<name>.json``)."""

    def __init__(self, root: str | None = None) -> None:
        self._cache = JsonCache("faults", schema=_SCHEMA, root=root,
                                what="devices whose calibration crashed (unusable until it passes)")

    def get(self, backend: str, version: str) -> DeviceFault | None:
        """The fault recorded for ``backend`` with plugin ``version``; one recorded with
        another version is ignored (an upgrade is worth a new try)."""
        entry = self._cache.get(backend, {"backend": backend})
        if entry is None:
            return None
        try:
            fault = DeviceFault(**{k: str(v) for k, v in entry.items()})
        except TypeError as exc:  # not a fault's fields: warned about once, removed, not trusted
            self._cache.reject(backend, f"it is not a fault record ({exc})")
            return None
        return fault if fault.version == version else None

    def record(self, backend: str, task: str, what: str, step: str, version: str) -> DeviceFault:
        fault = DeviceFault(backend, task, what, step, time.strftime("%Y-%m-%d %H:%M"), version)
        payload: dict[str, Any] = asdict(fault)
        self._cache.put(backend, {"backend": backend}, payload)
        return fault

    def clear(self, backend: str) -> bool:
        """Forget ``backend``'s fault (its calibration passed); ``True`` if there was one."""
        return self._cache.remove(backend)
