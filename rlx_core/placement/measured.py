"""A pick that measures when unsure: time the close candidates, keep the faster, remember it.

The cost ranking is a prediction, and predictions are off: on a GPU host auto picked a
device 1.3-2.8x slower than another it had, because the two estimates were wrong by more
than the gap between them. When the ranking cannot tell its best two devices apart, or
the model is known to be far off for one of them on this host, the pick is *unsure*
(``find_doubt``):

- the two best viable estimates are within ``margin`` of each other (``UNSURE_MARGIN``,
  1.5: the second is predicted less than 1.5x slower than the first), or
- the best or the runner-up has a recorded prediction error (``corrections.py``) beyond
  ``error_limit`` (``ERROR_LIMIT``, 2x either way): its estimate, corrected or not, is
  not to be trusted to a margin.

An unsure pick is settled by timing the candidates (the best two, and a third within the
margin): ``GraphDevices.run`` in auto does it on its first runs with the caller's own
inputs (each call runs one candidate and returns its outputs, so measuring costs no extra
run), ``rlx.compile`` with ``DevicePolicy(pick="measure")`` at compile with generated
inputs (``measurement_inputs``). The schedule (``Trial``) is one untimed warm-up run per
candidate, then ``benchmark_runs`` rounds in which each runs once, the order alternating
so that neither always follows the other; the lowest median wins.

The *verdict* is cached on disk (namespace ``measured-picks``, ``Verdicts``): one entry per
graph structure and shapes (``graph_signature``: ops, attributes, shapes, dtypes; not
names, not values) and host, holding each measured device's time with its plugin and
library versions and date. A later process meeting a doubt among devices that all have a
time there uses them instead of measuring (``Placement.decide`` reads it under any pick);
a time older than ``VERDICT_MAX_AGE_S`` (a week: hosts change) or taken with other
versions (an upgrade changes the kernels) is ignored quietly. A measurement in which a
candidate failed is not cached. Each measurement also records the devices' prediction
errors (``corrections.py``), so the ranking of every later graph is corrected too.

Plain ``rlx.compile`` (``pick="cost"``) does not measure: it would compile every candidate
(XLA's compile of a large model takes seconds) and time runs on invented inputs, a cost
paid by scripts that compile once and run once; it uses a cached verdict when there is
one, and otherwise says in its report that the pick was unsure and how to settle it.
Measuring never overrides the user: an explicit device, ``RLX_DEVICE`` or a preferred
device at the top of the ranking is never doubted, and under ``strict`` only
``pick="measure"`` measures or uses a cached verdict (a candidate failing then is an
error, not a fallback); a strict cost pick stays the ranking's own, corrections included.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cache import JsonCache
from ..errors import CALLER_ERRORS, ConfigError, DeviceError, FallbackWarning
from .corrections import PredictionErrors, host_name

if TYPE_CHECKING:
    from ..backends.registry import Registry
    from ..compiler.compiled import CompiledGraph
    from ..ir import Graph
    from .ranking import DeviceCandidate

__all__ = ["ERROR_LIMIT", "MAX_CANDIDATES", "UNSURE_MARGIN", "VERDICT_MAX_AGE_S", "Doubt", "MeasureSettings",
           "Trial", "Verdict", "Verdicts", "find_doubt", "graph_signature", "measure_compiled",
           "measurement_inputs", "settle"]

log = logging.getLogger("rlx.placement")

UNSURE_MARGIN = 1.5  #: unsure when the runner-up's estimate is under this many times the best's
ERROR_LIMIT = 2.0  #: unsure when a top device's recorded error is beyond this factor, either way
MAX_CANDIDATES = 3  #: at most this many devices timed: the best two, and a third within the margin
VERDICT_MAX_AGE_S = 7 * 24 * 3600.0  #: a cached verdict older than this is measured again
_VERDICT_SCHEMA = 1


def _seconds(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


@dataclass(frozen=True)
class MeasureSettings:
    """How an unsure pick is recognised and measured.

    ``margin`` and ``error_limit`` as in the module doc (``margin=1.0`` never doubts two
    estimates, ``error_limit=math.inf`` never doubts a device for its record); ``on_run``
    lets ``GraphDevices.run`` measure on its first auto runs (``False``: only
    ``pick="measure"`` measures); ``clock`` is the timer runs are measured with (seconds;
    tests give a fake one).
    """

    margin: float = UNSURE_MARGIN
    error_limit: float = ERROR_LIMIT
    on_run: bool = True
    clock: Callable[[], float] = field(default=time.perf_counter, compare=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.margin, (int, float)) and self.margin >= 1.0):
            raise ConfigError(f"MeasureSettings margin: {self.margin!r} is not a number >= 1 (1 = never doubt)")
        if not (isinstance(self.error_limit, (int, float)) and self.error_limit > 1.0):
            raise ConfigError(f"MeasureSettings error_limit: {self.error_limit!r} is not a number > 1")


@dataclass(frozen=True)
class Doubt:
    """Why the ranking is unsure of its pick, and the devices to time (best estimate first)."""

    candidates: tuple[str, ...]
    reason: str


def find_doubt(ranked: Sequence[DeviceCandidate], settings: MeasureSettings) -> Doubt | None:
    """The doubt about ``ranked[0]`` (rows best first, as ``Placement.rank`` gives them), or
    ``None`` when the ranking is sure (or has only one device with an estimate)."""
    rated = [r for r in ranked if r.est_seconds is not None]
    if len(rated) < 2 or rated[0] is not ranked[0]:
        return None
    best, second = rated[0], rated[1]
    assert best.est_seconds is not None and second.est_seconds is not None
    reasons = []
    if second.est_seconds < best.est_seconds * settings.margin:
        reasons.append(f"estimates within {settings.margin:g}x: {best.device} {_seconds(best.est_seconds)} vs "
                       f"{second.device} {_seconds(second.est_seconds)}")
    for row in (best, second):
        if row.correction is not None and not row.correction.borrowed_from and \
                row.correction.off_by > settings.error_limit:
            n = row.correction.measurements
            reasons.append(f"{row.device}'s estimates were off by {row.correction.off_by:.2g}x on this host "
                           f"({n} measurement{'s' if n != 1 else ''})")
    if not reasons:
        return None
    close = [r.device for r in rated[2:] if r.est_seconds is not None and
             r.est_seconds < best.est_seconds * settings.margin]
    return Doubt((best.device, second.device, *close)[:MAX_CANDIDATES], "; ".join(reasons))


def graph_signature(graph: Graph) -> str:
    """A hash of what decides a graph's speed: each node's op, inputs, attributes, shape and
    dtype, and which nodes are inputs, params and outputs. Names and values are left out
    (two exports of one model with other weights run alike). Shapes are exact: rlx graphs
    have static shapes, and another batch size may well have another winner."""
    h = hashlib.sha256()
    for n in graph.nodes:
        attrs = json.dumps(dict(n.attrs), sort_keys=True, default=repr)
        h.update(f"{n.op}|{list(n.inputs)}|{attrs}|{list(n.shape)}|{n.dtype}\n".encode())
    h.update(f"in {list(graph.inputs)} params {list(graph.params)} out {list(graph.outputs)}".encode())
    return h.hexdigest()


def measurement_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs to time ``graph`` with when the caller's are not at hand: seeded uniform floats
    in [-1, 1), zeros for integer inputs (they may be indices into a table of any size),
    ``False`` for booleans."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in graph.inputs:
        n = graph.node(i)
        dtype = np.dtype(n.dtype)
        if dtype.kind in "fc":
            out[n.name] = rng.uniform(-1, 1, n.shape).astype(dtype)
        else:
            out[n.name] = np.zeros(n.shape, dtype)
    return out


class Trial:
    """The schedule of one measurement and its timings. ``next_device()`` says which
    candidate runs next, ``record`` takes its time, ``drop`` removes one that failed;
    ``done`` once every round is run (or one candidate is left)."""

    def __init__(self, candidates: Sequence[str], runs: int) -> None:
        self.candidates = list(dict.fromkeys(candidates))
        self.runs = max(1, int(runs))
        self.times: dict[str, list[float]] = {d: [] for d in self.candidates}
        self.failed: dict[str, str] = {}
        rounds = [self.candidates if r % 2 == 0 else self.candidates[::-1] for r in range(self.runs)]
        self._queue: list[tuple[str, bool]] = [(d, False) for d in self.candidates]
        self._queue += [(d, True) for order in rounds for d in order]

    @property
    def alive(self) -> list[str]:
        return [d for d in self.candidates if d not in self.failed]

    @property
    def done(self) -> bool:
        return not self._queue or len(self.alive) <= 1

    def next_device(self) -> str | None:
        """The candidate to run next (its run is timed when it is not a warm-up), or ``None``."""
        return None if self.done else self._queue[0][0]

    def record(self, device: str, seconds: float) -> None:
        """One run of ``device`` (the one ``next_device`` named) took ``seconds``."""
        if not self._queue or self._queue[0][0] != device:
            raise ValueError(f"Trial: {device!r} ran out of turn (next is {self.next_device()!r})")
        _, timed = self._queue.pop(0)
        if timed:
            self.times[device].append(float(seconds))

    def drop(self, device: str, why: str) -> None:
        """``device`` failed (``why``): it is not timed again and cannot win."""
        self.failed[device] = why
        self._queue = [(d, t) for d, t in self._queue if d != device]

    def medians(self) -> dict[str, float]:
        """Median seconds per run of each candidate still in, that has a timed run."""
        return {d: statistics.median(ts) for d, ts in self.times.items() if ts and d not in self.failed}

    def winner(self) -> str | None:
        """The fastest candidate measured; the only survivor when the others failed first."""
        medians = self.medians()
        if medians:
            return min(medians, key=lambda d: (medians[d], self.candidates.index(d)))
        alive = self.alive
        return alive[0] if len(alive) == 1 else None


@dataclass(frozen=True)
class Verdict:
    """What a measurement found: the ``winner``, each candidate's median ``seconds`` per run
    over ``runs`` timed runs, when (``measured_at``, epoch seconds), by whom (``where``),
    whether it was read from the cache, and the candidates that failed (never cached)."""

    winner: str
    seconds: Mapping[str, float]
    runs: int
    measured_at: float
    where: str
    from_cache: bool = False
    failed: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for a report: that the pick was measured, the times, and where they came from."""
        failed = "".join(f"; {d} failed while measured: {why}" for d, why in self.failed.items())
        if not self.seconds:
            return f"measured the unsure pick: {self.winner}, the only candidate left{failed}"
        times = ", ".join(f"{d} {_seconds(s)}" for d, s in sorted(self.seconds.items(), key=lambda kv: kv[1]))
        if self.from_cache:
            age = max(0.0, time.time() - self.measured_at)
            ago = f"{age / 3600:.1f} h" if age >= 3600 else f"{age / 60:.0f} min"
            source = f"verdict from the cache, measured {ago} ago by {self.where}; not measured again"
        else:
            source = f"measured now by {self.where}"
        return f"measured the unsure pick: {self.winner} fastest ({times}; median of {self.runs} runs each " \
               f"after a warm-up; {source}){failed}"

    def to_dict(self) -> dict[str, Any]:
        return {"winner": self.winner, "seconds": dict(self.seconds), "runs": self.runs,
                "measured_at": self.measured_at, "where": self.where, "from_cache": self.from_cache,
                "failed": dict(self.failed)}


class Verdicts:
    """What was measured of each graph on this host (``<cache>/measured-picks/``): one entry
    per graph signature and host, holding each device's last measured time with its
    versions and date. A doubt among devices that all have a usable time is settled by
    the lowest; a device measured later adds to (or replaces its line in) the entry, so
    that a doubt between other devices of the same graph reuses what is known."""

    def __init__(self, registry: Registry, root: str | None = None, *, max_age: float = VERDICT_MAX_AGE_S,
                 precision: str = "fp32") -> None:
        self.registry = registry
        self.precision = precision  # a reduced precision changes which device is faster: its own entries
        self.max_age = max_age
        self._cache = JsonCache("measured-picks", schema=_VERDICT_SCHEMA, root=root,
                                what="per graph: which devices measured how fast when the cost estimates were too "
                                     "close to call", recompute="it is measured again when next unsure")

    def _where(self, graph: Graph) -> tuple[str, dict[str, str]]:
        identity = {"graph": graph_signature(graph), "host": host_name()}
        if self.precision != "fp32":  # fp32 entries keep the identity they had before precisions
            identity["precision"] = self.precision
        key = "pick-" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:40]
        return key, identity

    def _version(self, device: str) -> str:
        """``device``'s plugin version and the library versions its probe found."""
        libraries = json.dumps(dict(self.registry.availability(device).versions), sort_keys=True)
        return f"{self.registry.info(device).version} {libraries}"

    def _usable(self, graph: Graph) -> dict[str, dict[str, Any]]:
        """The entry's device lines that still hold: measured within ``max_age``, with the
        versions installed now (others are ignored quietly: age and upgrades are not faults)."""
        key, identity = self._where(graph)
        entry = self._cache.get(key, identity)  # another identity or schema: warned about, removed
        if entry is None:
            return {}
        try:
            lines = {str(d): {"seconds": float(v["seconds"]), "measured_at": float(v["measured_at"]),
                              "runs": int(v["runs"]), "where": str(v["where"]), "version": str(v["version"])}
                     for d, v in dict(entry["devices"]).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            self._cache.reject(key, f"its payload is not a table of measured times ({type(exc).__name__}: {exc})")
            return {}
        now, usable = time.time(), {}
        for device, line in lines.items():
            age = now - line["measured_at"]
            if age > self.max_age or age < -60:  # a clock set back by a minute is not a reason to measure again
                log.info("rlx: graph %r: %s's measured time is %.1f days old; not used", graph.name, device,
                         age / 86400)
            elif device not in self.registry.names() or line["version"] != self._version(device):
                log.info("rlx: graph %r: %s was measured with other versions; not used", graph.name, device)
            else:
                usable[device] = line
        return usable

    def get(self, graph: Graph, devices: Sequence[str]) -> Verdict | None:
        """The verdict among ``devices`` for ``graph`` from the times cached for it, when every
        one of ``devices`` has a usable time; else ``None``."""
        lines = self._usable(graph)
        if len(devices) < 2 or any(d not in lines for d in devices):
            return None
        seconds = {d: lines[d]["seconds"] for d in devices}
        winner = min(devices, key=lambda d: (seconds[d], list(devices).index(d)))
        oldest = min(lines[d]["measured_at"] for d in devices)
        return Verdict(winner, seconds, min(lines[d]["runs"] for d in devices), oldest, lines[winner]["where"],
                       from_cache=True)

    def put(self, graph: Graph, verdict: Verdict) -> None:
        """Add ``verdict``'s times to ``graph``'s entry (replacing those devices' lines, and
        dropping lines no longer usable)."""
        key, identity = self._where(graph)
        lines = self._usable(graph)
        for device, seconds in verdict.seconds.items():
            lines[device] = {"seconds": seconds, "measured_at": verdict.measured_at, "runs": verdict.runs,
                             "where": verdict.where, "version": self._version(device)}
        self._cache.put(key, identity, {"devices": lines})


def settle(graph: Graph, trial: Trial, where: str, rows: Sequence[DeviceCandidate], registry: Registry,
           errors: PredictionErrors | None = None, precision: str = "fp32") -> Verdict | None:
    """The verdict of a finished ``trial`` (``None`` when every candidate failed), cached
    when every candidate was measured, with each measured device's error recorded against
    the model's own estimate in ``rows``."""
    winner = trial.winner()
    if winner is None:
        return None
    seconds = trial.medians()
    verdict = Verdict(winner, seconds, trial.runs, time.time(), where, failed=dict(trial.failed))
    if not trial.failed and len(seconds) == len(trial.candidates) >= 2:
        Verdicts(registry, precision=precision).put(graph, verdict)
    errors = errors if errors is not None else PredictionErrors(registry)
    model = {r.device: r.model_seconds for r in rows}
    for device, measured in seconds.items():
        predicted = model.get(device)
        if predicted is not None:
            errors.record(device, measured, predicted)
    log.info("rlx: graph %r: %s", graph.name, verdict.describe())
    return verdict


def measure_compiled(graph: Graph, trial: Trial, compile: Callable[[str], CompiledGraph], *,
                     clock: Callable[[], float] = time.perf_counter, strict: bool = False,
                     inputs: Mapping[str, Any] | None = None) -> dict[str, CompiledGraph]:
    """Run ``trial`` to the end now: compile each candidate (``compile(device)``), then its
    schedule on ``inputs`` (default ``measurement_inputs``). A candidate that fails is
    dropped with a ``FallbackWarning`` (``DeviceError`` naming it under ``strict``); the
    caller's own errors are raised at once. Returns the compiled copies that survived."""
    arrays = dict(inputs) if inputs is not None else measurement_inputs(graph)
    compiled: dict[str, CompiledGraph] = {}

    def failed(device: str, exc: Exception, when: str) -> None:
        if strict:
            raise DeviceError(f"device {device} failed while {when} for the measured pick of graph "
                              f"{graph.name!r} (strict: no fallback): {type(exc).__name__}: {exc}") from exc
        warnings.warn(f"rlx: device {device} failed while {when} for the measured pick of graph {graph.name!r} "
                      f"({type(exc).__name__}: {exc}); dropping it", FallbackWarning, stacklevel=4)
        trial.drop(device, f"{type(exc).__name__}: {exc}")

    for device in trial.candidates:
        try:
            compiled[device] = compile(device)
        except CALLER_ERRORS:
            raise
        except Exception as exc:
            failed(device, exc, "compiling")
    while (device := trial.next_device()) is not None:
        cg = compiled[device]
        try:
            t0 = clock()
            cg.run(arrays)
            seconds = clock() - t0
        except CALLER_ERRORS:
            raise
        except Exception as exc:
            failed(device, exc, "running")
            continue
        trial.record(device, seconds)
    return {d: cg for d, cg in compiled.items() if d not in trial.failed}
