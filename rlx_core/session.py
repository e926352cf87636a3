"""Where graphs compile and run: ``compile`` (auto placement, fallback, partition) and
``GraphDevices`` (one graph on as many devices as asked, params mirrored). Compiling on
one named device is ``compiled.compile_on``; ``run_with_fallback`` and the sessions it
keeps belong to a ``runtime.Runtime``.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .compiled import CompiledGraph, CompileReport, compile_on
from .drift import DriftWatch, Repick, drift_settings
from .errors import CALLER_ERRORS, DeviceError, FallbackWarning
from .fallback import Wording, try_in_turn
from .inputs import check_param_value, input_specs, validate_inputs
from .ir import Graph
from .partition import compile_partitioned, split_for
from .placement import DeviceCandidate, Placement
from .plugin import CompileOptions
from .policy import DevicePolicy
from .registry import Registry, default_registry, parse_device
from .timing import benchmark_devices, time_runs

__all__ = ["CompiledGraph", "CompileReport", "GraphDevices", "compile", "benchmark_devices", "resolve_chain_default"]

log = logging.getLogger("rlx.session")


def compile(graph: Graph, device: str | None = "auto", policy: DevicePolicy | None = None, *,
            registry: Registry | None = None, options: CompileOptions | None = None,
            partition: bool | None = None) -> CompiledGraph:  # fmt: skip
    """Compile ``graph`` for ``device`` (``"auto"``: policy and cost ranking).

    An explicit device is strict: it runs there or raises ``DeviceError`` naming the
    blocker. ``"auto"`` tries the ranked devices in turn when one fails to compile,
    with a ``FallbackWarning`` for each (unless the policy is strict). ``options``
    switches the pipeline's stages and passes (``CompileOptions``, ``docs/pipeline.md``).

    ``partition`` (``docs/partition.md``): with ``"auto"``, ``None`` (the default) splits
    the graph across devices when no single device can run it or when a split is
    predicted clearly faster; ``True`` does the same under a strict policy too (a split
    is never taken silently there); ``False`` never splits. The result is then a
    ``PartitionedGraph``, a ``CompiledGraph`` whose ``device`` is ``"cpu+opencl"`` and
    whose report lists each segment. An explicit device never splits.
    """
    reg = registry or default_registry()
    placement = Placement(graph, policy, reg)
    explicit = device not in (None, "", "auto") or bool(placement.policy.device)
    if explicit:
        return _compile_whole(graph, device, placement, reg, options, explicit)
    rows = placement.candidates()
    excluded: list[tuple[str, str]] = []  # devices whose segment failed to compile, and why
    while True:
        split = split_for(placement, [r for r in rows if r.device not in dict(excluded)], partition)
        if isinstance(split, str):
            break
        try:
            cg = compile_partitioned(graph, split, rows, reg, options)
        except CALLER_ERRORS:
            raise
        except Exception as exc:
            failed = getattr(exc, "device", None) or split.devices[0]
            excluded.append((failed, f"{type(exc).__name__}: {exc}"))
            warnings.warn(f"rlx: device {failed} failed to compile its segment of graph {graph.name!r} ({exc}); "
                          "planning again without it", FallbackWarning, stacklevel=2)  # fmt: skip
            continue
        if excluded:
            cg.report().notes.append("fell back after: " + "; ".join(f"{d}: {e}" for d, e in excluded))
        return cg
    if not placement.rank(rows):
        reasons = "; ".join(f"{r.device}: {r.blocker}" for r in rows) or "no backends are installed"
        failed = "".join(f"; {d} failed: {e}" for d, e in excluded)
        raise DeviceError(f"no device can run graph {graph.name!r}: {reasons}; no split either: {split}{failed}")
    return _compile_whole(graph, device, placement, reg, options, explicit, rows)


def _compile_whole(graph: Graph, device: str | None, placement: Placement, reg: Registry,
                   options: CompileOptions | None, explicit: bool,
                   rows: list[DeviceCandidate] | None = None) -> CompiledGraph:  # fmt: skip
    """``graph`` on one device: the chosen one, then (auto) the next ranked on failure
    (``rows``: the candidates when the caller has them already)."""
    chosen, reason, rows = placement.choose(device, rows)
    if explicit or placement.policy.strict:
        return compile_on(graph, chosen, reason, rows, reg, options)
    ranked = [chosen] + [r.device for r in placement.rank(rows) if r.device != parse_device(chosen)[0]]
    failed: list[str] = []

    def attempt(dev: str) -> CompiledGraph:
        why = reason if not failed else f"fallback after {failed[-1]} failed"
        return compile_on(graph, dev, why, rows, reg, options)

    _, cg, attempts = try_in_turn(ranked, attempt, graph=graph.name, wording=_COMPILE_WORDING, stacklevel=4,
                                  on_failure=lambda dev, exc, error: failed.append(dev))  # fmt: skip
    if attempts:
        cg.report().notes.append("fell back after: " + "; ".join(f"{d}: {e}" for d, e in attempts))
    return cg


_COMPILE_WORDING = Wording(failed="rlx: device {device} failed to compile graph {graph!r} ({message}); ",
                           none="no device could compile graph {graph!r}: {detail}")
_CHAIN_WORDING = Wording(last="no device left in the chain")


class GraphDevices:
    """One graph, compiled lazily on as many devices as asked, params mirrored to all."""

    def __init__(self, graph: Graph, policy: DevicePolicy | None = None, *, registry: Registry | None = None) -> None:
        self.graph = graph.freeze()
        self._policy = policy
        self._registry = registry or default_registry()
        self._compiled: dict[str, CompiledGraph] = {}
        self._params: dict[str, np.ndarray] = {}
        self._winner: str | None = None
        self._watch: DriftWatch | None = None  # auto runs: re-pick on slowdown (drift.py)
        self._picked: tuple[DevicePolicy, str] | None = None  # auto runs without a watch: the pick per policy
        self._lock = threading.RLock()
        self.last_device: str | None = None

    @property
    def policy(self) -> DevicePolicy:
        return self._policy if self._policy is not None else DevicePolicy.from_env()

    def _placement(self) -> Placement:
        return Placement(self.graph, self.policy, self._registry)

    def compile(self, device: str) -> CompiledGraph:
        """The compiled copy for ``device`` (strict), compiling it on first use."""
        cached = self._compiled.get(device)
        if cached is not None and self.policy.permits(device) is None:
            return cached  # hot path (a batch loop): the full placement check ran when it was compiled
        p = self._placement()
        dev = p.check_explicit(device)
        with self._lock:
            cg = self._compiled.get(dev)
            if cg is None:
                cg = compile_on(self.graph, dev, "explicit device (argument)", [], self._registry)
                for name, value in self._params.items():
                    cg.set_param(name, value)
                self._compiled[dev] = cg
            return cg

    def resolve(self, hint: str | None = None) -> str:
        return self._placement().choose(hint)[0]

    def compile_fastest(self) -> CompiledGraph:
        return self.compile(self.resolve())

    def compile_chain(self, chain: Iterable[str]) -> CompiledGraph:
        """The first device of ``chain`` that compiles (each failure a ``FallbackWarning``)."""
        return self._over_chain(list(chain), lambda cg: cg)[1]

    def resolve_with_inputs(self, inputs: Mapping[str, Any]) -> str:
        """Benchmark the viable devices on ``inputs`` and cache the fastest."""
        with self._lock:
            if self._winner is None:
                times = self.benchmark(inputs, runs=self.policy.benchmark_runs)
                if not times:
                    raise DeviceError(f"no device could run graph {self.graph.name!r} in the benchmark")
                self._winner = min(times, key=times.__getitem__)
            return self._winner

    def warm_all(self) -> dict[str, CompiledGraph]:
        """Compile every viable device now (so the first run pays no compile)."""
        for d in self._placement().rank(self._placement().candidates()):
            self.compile(d.device)
        return dict(self._compiled)

    def benchmark(self, inputs: Mapping[str, Any], runs: int = 5) -> dict[str, float]:
        """Seconds per run on each viable device (median of ``runs`` after a warm-up)."""
        arrays = validate_inputs(input_specs(self.graph), inputs)
        times: dict[str, float] = {}
        for row in self._placement().rank(self._placement().candidates()):
            try:
                cg = self.compile(row.device)
                times[row.device] = time_runs(cg, arrays, runs)
            except CALLER_ERRORS:
                raise
            except Exception as exc:
                warnings.warn(f"rlx: device {row.device} failed in the benchmark ({exc}); skipping it",
                              FallbackWarning, stacklevel=2)  # fmt: skip
        return times

    def run(self, inputs: Mapping[str, Any], device: str | None = None) -> list[np.ndarray]:
        """Run on ``device``, or (``None``/``"auto"``) on the device the ranking picked,
        re-picked when that device slows down far past its own baseline (``drift.py``;
        ``repicks`` lists the moves)."""
        if device not in (None, "auto"):
            cg = self.compile(device)
            self.last_device = cg.device
            return cg.run(inputs)
        watch = self._drift_watch()
        if watch is None:
            policy = self.policy
            picked = self._picked
            if picked is None or picked[0] != policy:  # rank once per policy, not once per run
                picked = self._picked = (policy, Placement(self.graph, policy, self._registry).choose()[0])
            cg = self.compile(picked[1])
            self.last_device = cg.device
            return cg.run(inputs)
        dev = watch.current
        if self.policy.permits(dev) is not None:  # the policy changed under a long-lived session
            self._watch = None
            return self.run(inputs)
        cg = self.compile(dev)
        self.last_device = cg.device
        t0 = time.perf_counter()
        outs = cg.run(inputs)
        watch.observe(dev, time.perf_counter() - t0)
        return outs

    @property
    def repicks(self) -> list[Repick]:
        """Every re-pick on slowdown of the auto runs so far (``drift.Repick``)."""
        return list(self._watch.repicks) if self._watch is not None else []

    def _drift_watch(self) -> DriftWatch | None:
        """The watch over auto runs, made on first use when the pick is the cost ranking's
        own (not a default device, a preference or a benchmark) and drift is enabled."""
        if self._watch is not None:
            return self._watch
        policy = self.policy
        if policy.device or policy.prefer or policy.pick != "cost":
            return None
        factor, forget = drift_settings()
        if factor is None:
            return None
        with self._lock:
            if self._watch is None:
                placement = self._placement()
                ranked = placement.rank(placement.candidates())
                if not ranked:
                    return None
                estimates = {r.device: r.est_seconds for r in ranked if r.est_seconds is not None}
                if ranked[0].device not in estimates:
                    return None
                self._watch = DriftWatch(estimates, ranked[0].device, factor=factor, forget_seconds=forget)
            return self._watch

    def run_fastest(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        return self.run(inputs, self.resolve_with_inputs(inputs))

    def run_chain(self, inputs: Mapping[str, Any], chain: Iterable[str]) -> list[np.ndarray]:
        """Run on the first device of ``chain`` that succeeds (see ``run_with_fallback``)."""
        validate_inputs(input_specs(self.graph), inputs)
        return self._over_chain(list(chain), lambda cg: cg.run(inputs))[1]

    def _over_chain(self, chain: Sequence[str], action: Any) -> tuple[str, Any]:
        """``action`` on the first device of ``chain`` that can run the graph and does
        (``fallback.try_in_turn``: blocked devices skipped, failures warned about)."""
        if not chain:
            chain = resolve_chain_default(self.graph, self.policy, self._registry)
        p = self._placement()

        def blocker(dev: str) -> str | None:
            name = parse_device(dev)[0]
            self._registry.get(name)  # an unknown name is a DeviceError, before anything runs
            row = p._row(name)
            return None if row.viable else row.blocker

        dev, out, _ = try_in_turn(chain, lambda d: action(self.compile(d)), graph=self.graph.name,
                                  wording=_CHAIN_WORDING, strict=self.policy.strict, skip=blocker, stacklevel=4)
        self.last_device = dev
        return dev, out

    def set_param(self, name: str, value: Any) -> None:
        """Replace a param on every compiled copy now and on every later one."""
        _, frozen = check_param_value(self.graph, name, value)
        with self._lock:
            for dev, cg in list(self._compiled.items()):
                try:
                    cg.set_param(name, frozen)
                except CALLER_ERRORS:
                    raise
                except Exception as exc:  # that copy is dropped and recompiled on next use
                    log.warning("set_param on %s failed (%s); recompiling it on next use", dev, exc)
                    del self._compiled[dev]
            self._params[name] = frozen

    def invalidate_cache(self) -> None:
        """Drop every compiled copy, the benchmark winner and what the drift watch learned
        (params are kept)."""
        with self._lock:
            self._compiled.clear()
            self._winner = None
            self._watch = self._picked = None

    def set_policy(self, policy: DevicePolicy | None) -> None:
        with self._lock:
            if policy != self._policy:
                self._watch = None
            self._policy = policy
            self._winner = None


def resolve_chain_default(graph: Graph, policy: DevicePolicy, registry: Registry) -> list[str]:
    if policy.chain:
        return list(policy.chain)
    p = Placement(graph, policy, registry)
    return [r.device for r in p.rank(p.candidates())]
