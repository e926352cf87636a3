"""The cost model's error on this host, per device: measured over predicted, remembered.

A cost model is a handful of figures, and on some hosts it is off by 2-4x for every graph
(a GPU whose calibration read a fraction of its bandwidth predicted over three times what
a model took; measured: BENCHMARKS.md, section 'Figures behind design choices (moved from
docstrings, issue 32)'), which is enough to rank a slower device first. Whenever rlx times a
graph on a device whose estimate it knows (a measured pick, ``measured.py``; the baseline
of a drift watch, ``drift.py``), the ratio *measured / predicted* is recorded here, per
device and host, and the ranking multiplies that device's later estimates by the running
figure (``Placement``: ``DeviceCandidate.est_seconds`` is the corrected estimate,
``model_seconds`` the model's own, and the reason of a pick says "estimate x corrected by
observed factor y from n measurements on this host"). A device with no record of its own
is lent the median of the others' (``borrowed``: why).

The running figure is the median of the last ``WINDOW`` log-ratios: one run on a busy
host moves a median by one place, not by its size, and the window lets an old error fade
when the host changes. Each ratio is clamped to ``1/CLAMP .. CLAMP`` (a broken timer or a
device that stalled once must not make a device look free or unusable for good).

Stored in the JSON cache namespace ``prediction-errors`` (``rlx cache clear
prediction-errors`` forgets them): one entry per device and host, since a cache directory
may be shared by several hosts. The payload also records the plugin version and a
fingerprint of the cost model the ratios were taken against; ratios taken against another
(an upgrade, a new ``rlx calibrate``) described a model no longer in use and are dropped
quietly, not applied and not warned about. Two processes recording at once may lose one
measurement (the last write wins), never corrupt the entry (``JsonCache`` writes
atomically).

``estimate_graph_cost`` itself is left alone: it prices a graph from the model alone, and
``rlx calibrate --verify`` judges the model by it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..cache import JsonCache

if TYPE_CHECKING:
    from ..backends.registry import Registry

__all__ = ["CLAMP", "Correction", "PredictionErrors", "WINDOW", "borrowed", "host_name"]

log = logging.getLogger("rlx.placement")

_SCHEMA = 1
WINDOW = 16  #: log-ratios kept per device and host; the factor is their median
CLAMP = 1000.0  #: one ratio counts as at most this far off, either way


def host_name() -> str:
    """This host's name as entries record it (a shared cache dir keeps hosts apart)."""
    return platform.node() or "unknown-host"


def _seconds(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


@dataclass(frozen=True)
class Correction:
    """A device's observed error on this host: estimates times ``factor`` is what it measured,
    as the median of its last ``measurements`` ratios."""

    device: str
    factor: float
    measurements: int
    borrowed_from: tuple[str, ...] = ()  # none recorded for this device: the other devices' median

    @property
    def off_by(self) -> float:
        """How far off the model is, either way (``2.0`` for a factor of 2 or of 0.5)."""
        return max(self.factor, 1.0 / self.factor)

    def describe(self, model_seconds: float) -> str:
        """``estimate 3.10 ms corrected by observed factor 0.28 from 4 measurements on this host``."""
        plural = "s" if self.measurements != 1 else ""
        if self.borrowed_from:
            return (f"estimate {_seconds(model_seconds)} corrected by factor {self.factor:.3g}, the median observed "
                    f"for {', '.join(self.borrowed_from)} on this host (none recorded for {self.device})")
        return (f"estimate {_seconds(model_seconds)} corrected by observed factor {self.factor:.3g} from "
                f"{self.measurements} measurement{plural} on this host")


def borrowed(device: str, recorded: Sequence[Correction]) -> Correction | None:
    """The correction for ``device``, which has no record of its own, from the devices that
    do (``recorded``): the median of their factors (geometric), or ``None`` without any.

    Correcting only the devices that were measured would favour the ones that were not: on
    a busy or slow host every device measures slower than its model says (cpu, jax and
    PoCL all run on the same cores), and a device never measured would then look fastest
    for no better reason than its missing record. Lending it the others' usual error
    keeps the ranking's relative order until its own measurement says otherwise (the
    drift watch does the same for devices it has not timed, ``drift.py``); the pick is
    then doubted by the margin as usual, never by a borrowed error."""
    own = [c for c in recorded if not c.borrowed_from and c.device != device]
    if not own:
        return None
    factor = math.exp(statistics.median(math.log(c.factor) for c in own))
    return Correction(device, factor, sum(c.measurements for c in own), tuple(sorted(c.device for c in own)))


class PredictionErrors:
    """Read and record the devices' prediction errors on this host (one per ``Placement``:
    each device's entry is read once per instance)."""

    def __init__(self, registry: Registry, root: str | None = None) -> None:
        self.registry = registry
        self._cache = JsonCache("prediction-errors", schema=_SCHEMA, root=root,
                                what="per device: how far the cost model's estimates were from measured times "
                                     "on this host", recompute="it is measured again as graphs run")
        self._read: dict[str, Correction | None] = {}

    def _key(self, device: str) -> str:
        return f"{device}@{host_name()}"

    def _identity(self, device: str) -> dict[str, str]:
        return {"device": device, "host": host_name()}

    def _model_identity(self, device: str) -> dict[str, str]:
        """What the ratios are valid for: the plugin's version and the cost model itself."""
        model = self.registry.cost_model(device).to_dict()
        digest = hashlib.sha256(json.dumps(model, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return {"plugin_version": self.registry.info(device).version, "model": digest}

    def _ratios(self, device: str) -> list[float]:
        """The stored log-ratios for ``device``, empty when none or taken against another model."""
        entry = self._cache.get(self._key(device), self._identity(device))
        if entry is None:
            return []
        ratios = entry.get("log_ratios")
        if not isinstance(ratios, list) or not all(isinstance(r, (int, float)) and math.isfinite(r) for r in ratios):
            self._cache.reject(self._key(device), "its payload is not a list of log-ratios")
            return []
        if any(entry.get(k) != v for k, v in self._model_identity(device).items()):
            log.info("rlx: %s's recorded prediction errors were taken against another cost model or plugin "
                     "version; not applied", device)
            return []
        return [float(r) for r in ratios][-WINDOW:]

    def get(self, device: str) -> Correction | None:
        """``device``'s correction on this host, or ``None`` when nothing was recorded."""
        if device not in self._read:
            ratios = self._ratios(device)
            self._read[device] = (Correction(device, math.exp(statistics.median(ratios)), len(ratios))
                                  if ratios else None)
        return self._read[device]

    def record(self, device: str, measured: float, predicted: float) -> Correction | None:
        """Add one observation (``measured`` and ``predicted`` seconds per run of one graph);
        the correction now in force. A non-positive or non-finite figure is not an
        observation and is ignored."""
        if not (measured > 0 and predicted > 0 and math.isfinite(measured) and math.isfinite(predicted)):
            return self.get(device)
        bound = math.log(CLAMP)
        ratio = max(-bound, min(bound, math.log(measured / predicted)))
        ratios = [*self._ratios(device), ratio][-WINDOW:]
        payload: dict[str, Any] = {"log_ratios": ratios, "updated": time.time(), **self._model_identity(device)}
        self._cache.put(self._key(device), self._identity(device), payload)
        correction = Correction(device, math.exp(statistics.median(ratios)), len(ratios))
        self._read[device] = correction
        log.info("rlx: %s measured %s against an estimate of %s; observed factor now %.3g from %d measurements",
                 device, _seconds(measured), _seconds(predicted), correction.factor, len(ratios))
        return correction
