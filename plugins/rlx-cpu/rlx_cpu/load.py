"""Whether other processes held this process's CPUs while rlx-cpu timed something.

Why: the backend's timed choices (``verdicts``) are kept a day, so one timed while another
process ran flat out on the same cores outlives the load that made it. Seen in CI on the
2-core Zen 4 EPYC: the bf16 probe ran while the other pytest worker was busy, read bf16
at 0.71x float32's speed (1.9-2.0x quiet) and kept "not taken" for a day. A timing can
not tell on its own that it was disturbed (both ways run slower, unevenly), but Linux
can: ``/proc/stat`` counts every CPU's busy time and ``time.process_time`` this process's,
so what the CPUs this process may run on spent on other processes (and on the hypervisor
stealing them) over the span is the difference. ``Meter`` reads both around a span;
``verdicts.settled`` keeps no verdict timed while others took more than ``BUSY_SHARE``.

Off Linux (no ``/proc/stat``) the share is unknown (None) and verdicts are kept as before.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType

__all__ = ["BUSY_SHARE", "Meter", "others_share"]

#: The share of this process's CPUs' time that other processes (and steal) may take while
#: a verdict is timed for it to be kept. On the 2-core hosts an idle system's own work took
#: 0-3%; another process running one busy thread takes ~50%.
BUSY_SHARE = 0.15
#: ``/proc/stat``'s fields counted busy: user, nice, system, irq, softirq, steal (guest
#: time is counted in user already); idle and iowait are not.
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
_STAT = Path("/proc/stat")


def _cpus() -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _read(cpus: frozenset[int] | None) -> tuple[float, float] | None:
    """(busy, all) seconds of the CPUs in ``cpus`` (all of them when None) since boot, or
    None where ``/proc/stat`` cannot be read."""
    try:
        text = _STAT.read_text(encoding="ascii", errors="replace")
        hz = float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, AttributeError):
        return None
    busy = total = 0.0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        fields = [float(v) for v in rest.split()[:8]]
        if len(fields) < 8:
            return None
        busy += sum(fields[i] for i in _BUSY_FIELDS)
        total += sum(fields[:8])
    return (busy / hz, total / hz) if total > 0 else None


class Meter:
    """A context manager: over its span, the share of this process's CPUs' time that went
    to other processes (``others``, 0 to 1, or None where it cannot be told)."""

    def __init__(self) -> None:
        self._cpus = _cpus()
        self._start: tuple[tuple[float, float] | None, float] = (None, 0.0)
        self.others: float | None = None

    def __enter__(self) -> Meter:
        self._start = (_read(self._cpus), time.process_time())
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        end, own_end = _read(self._cpus), time.process_time()
        start, own_start = self._start
        if start is None or end is None:
            return
        total = end[1] - start[1]
        if total <= 0:  # too short a span for the counters' ticks (10 ms)
            return
        others = (end[0] - start[0]) - (own_end - own_start)
        self.others = min(1.0, max(0.0, others / total))

    @property
    def busy(self) -> bool:
        """Whether other processes took more than ``BUSY_SHARE`` of the span (False where
        it cannot be told)."""
        return self.others is not None and self.others > BUSY_SHARE


def others_share(seconds: float = 0.2) -> float | None:
    """The share other processes take of this process's CPUs now, read over ``seconds``
    of sleep (``rlx devices --explain`` and the tests ask)."""
    with Meter() as meter:
        time.sleep(seconds)
    return meter.others
