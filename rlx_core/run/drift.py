"""Re-pick on slowdown: a long-lived session notices when its device gets much slower than
it was, and moves to the device that is now predicted fastest.

The cost ranking is made once, from models calibrated on a quiet host. A server then runs
the same graph for hours while the host changes under it: another process takes the
cores, a GPU is shared, a laptop throttles. ``DriftWatch`` times every run on the picked
device and compares it with the device's own *baseline*, the ratio of measured to
predicted time over its first runs (the model's error on this host, which is not drift).
When the median of the recent window exceeds ``factor`` times that baseline, the device
has drifted: its estimate becomes what it now measures, every other device keeps its
prediction corrected by the baseline error seen so far, and the lowest wins. A re-pick is
logged (``rlx.session``, WARNING) and kept in ``repicks``. Each baseline, once set, is
handed to ``on_baseline``: ``GraphDevices`` records it on disk as the model's error for
that device on this host (``corrections.py``), so later rankings start corrected.

The slowdown is forgotten after ``forget_seconds``: the ranking then trusts the drifted
device's baseline again, so a device whose neighbour went quiet is picked back (and, if
it is still slow, noticed again one window later).

Settings: ``RLX_REPICK_DRIFT`` (the factor, default 3; ``0`` or ``off`` disables),
``RLX_REPICK_FORGET`` (seconds, default 60).
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["ENV_DRIFT", "ENV_FORGET", "DriftWatch", "Repick", "drift_settings"]

log = logging.getLogger("rlx.session")

ENV_DRIFT = "RLX_REPICK_DRIFT"
ENV_FORGET = "RLX_REPICK_FORGET"
DEFAULT_FACTOR = 3.0
DEFAULT_FORGET_S = 60.0


def _number(environ: Mapping[str, str], name: str, default: float, *, may_disable: bool) -> float | None:
    """``name``'s number > 0, ``default`` when unset; ``None`` for ``0``/``off``/``none``
    where the setting ``may_disable`` the feature (else those are malformed)."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if may_disable and raw.lower() in ("0", "off", "none"):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(f"{name}={raw!r}: expected a number > 0")
    return value


def drift_settings(environ: Mapping[str, str] | None = None) -> tuple[float | None, float]:
    """``(factor or None when disabled, forget seconds)`` from the environment."""
    env = os.environ if environ is None else environ
    factor = _number(env, ENV_DRIFT, DEFAULT_FACTOR, may_disable=True)
    if factor is not None and factor <= 1.0:
        raise ConfigError(f"{ENV_DRIFT}={env.get(ENV_DRIFT)!r}: the factor must be > 1 (0 or off disables it)")
    forget = _number(env, ENV_FORGET, DEFAULT_FORGET_S, may_disable=False)
    assert forget is not None
    return factor, forget


@dataclass(frozen=True)
class Repick:
    """One move: from which device to which, why, and the re-ranking that made it."""

    old: str
    new: str
    reason: str
    estimates: tuple[tuple[str, float], ...]  # seconds per run, best first

    def __str__(self) -> str:
        ranked = ", ".join(f"{d} {s * 1e6:.0f} µs" for d, s in self.estimates)
        return f"{self.reason}: re-ranked {ranked}; now {self.new}"


class _Track:
    """One device's timings: warm-up, baseline, then a rolling window."""

    def __init__(self, window: int) -> None:
        self.seen = 0
        self.baseline: float | None = None  # median seconds over the first full window
        self.recent: deque[float] = deque(maxlen=window)
        self.drifted: float | None = None  # median seconds when drift was noticed
        self.drifted_at = 0.0


class DriftWatch:
    """Which of ``predictions``' devices to run now, learning from measured run times."""

    def __init__(self, predictions: Mapping[str, float], current: str, *, factor: float = DEFAULT_FACTOR,
                 window: int = 16, warmup: int = 3, forget_seconds: float = DEFAULT_FORGET_S,
                 clock: Callable[[], float] = time.monotonic,
                 on_baseline: Callable[[str, float], None] | None = None) -> None:
        """``on_baseline(device, seconds)`` is told each device's baseline once it is set (the
        session records it as the model's error on this host, ``corrections.py``); it is
        called outside the watch's lock, and its failure is logged, never raised into a run."""
        if current not in predictions:
            raise ValueError(f"current device {current!r} has no prediction")
        self.predictions = {d: max(float(s), 1e-9) for d, s in predictions.items()}
        self.current = current
        self.factor, self.window, self.warmup, self.forget_seconds = factor, window, warmup, forget_seconds
        self._clock = clock
        self._tracks = {d: _Track(window) for d in self.predictions}
        self._since_switch = 0
        self._lock = threading.Lock()
        self._on_baseline = on_baseline
        self.repicks: list[Repick] = []

    def observe(self, device: str, seconds: float) -> str:
        """Record one run of ``device``; the device to run next (``current``)."""
        current, fresh = self._observe(device, seconds)
        if fresh is not None and self._on_baseline is not None:
            try:
                self._on_baseline(device, fresh)
            except Exception as exc:  # recording the error is a bonus; the run has its answer
                log.warning("rlx: recording %s's baseline failed: %s: %s", device, type(exc).__name__, exc)
        return current

    def _observe(self, device: str, seconds: float) -> tuple[str, float | None]:
        """``observe`` under the lock: the next device, and the baseline it set, if it did."""
        with self._lock:
            track = self._tracks.get(device)
            if track is None or device != self.current:
                return self.current, None  # an explicit run elsewhere says nothing about the pick
            self._since_switch += 1
            track.seen += 1
            if track.seen <= self.warmup:
                return self.current, None  # first runs pay allocation and JIT: not the steady state
            track.recent.append(seconds)
            if len(track.recent) < self.window:
                return self.current, None
            median = statistics.median(track.recent)
            if track.baseline is None:
                track.baseline = median
                track.recent.clear()
                return self.current, median
            if self._forget_old() and self._rerank(f"a slowdown is over {self.forget_seconds:g} s old: trusting "
                                                   "that device's baseline again"):
                return self.current, None  # the device that had slowed down is back on top
            if median > self.factor * track.baseline and self._since_switch >= self.window:
                track.drifted, track.drifted_at = median, self._clock()
                track.recent.clear()
                why = f"{device} drifted to {median * 1e6:.0f} µs per run (baseline {track.baseline * 1e6:.0f} µs)"
                if not self._rerank(why):
                    log.info("rlx: %s but is still predicted fastest", why)
            return self.current, None

    def _error(self) -> float:
        """The model's usual error on this host: measured over predicted at baseline."""
        ratios = [t.baseline / self.predictions[d] for d, t in self._tracks.items() if t.baseline is not None]
        return statistics.median(ratios) if ratios else 1.0

    def estimate(self, device: str) -> float:
        track, error = self._tracks[device], self._error()
        if track.drifted is not None:
            return track.drifted
        if track.baseline is not None:
            return track.baseline
        return self.predictions[device] * error

    def _forget_old(self) -> bool:
        """Forget slowdowns older than ``forget_seconds``; whether any was forgotten."""
        now, forgot = self._clock(), False
        for track in self._tracks.values():
            if track.drifted is not None and now - track.drifted_at >= self.forget_seconds:
                track.drifted, forgot = None, True
        return forgot

    def _rerank(self, why: str) -> bool:
        """Pick the lowest estimate (ties keep the current device); whether it moved."""
        current = self.current
        ranked = sorted(((self.estimate(d), d) for d in self._tracks), key=lambda p: (p[0], p[1] != current))
        best = ranked[0][1]
        if best == current:
            return False
        move = Repick(current, best, why, tuple((d, s) for s, d in ranked))
        self.repicks.append(move)
        self.current, self._since_switch = best, 0
        log.warning("rlx: re-picked the device: %s", move)
        return True
