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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..backends.registry import Registry, default_registry, parse_device
from ..compiler.compiled import CompiledGraph, CompileReport, compile_on
from ..compiler.dynamic import ValueCompiledGraph, compile_placed, compile_symbolic
from ..compiler.inputs import check_param_value, input_specs, validate_inputs
from ..compiler.lowered_once import LoweredOnce
from ..compiler.staged import StagedCompiledGraph
from ..compiler.timing import benchmark_devices, time_runs
from ..errors import CALLER_ERRORS, DeviceError, DeviceFallbackError, FallbackWarning
from ..ir import Graph
from ..ir.deferred import DeferredGraph
from ..ir.specialize import representative
from ..ir.staged import StagedGraph
from ..ir.valued import ValueDependentGraph
from ..options import precision_name
from ..placement.corrections import PredictionErrors
from ..placement.measured import MeasureSettings, Trial, Verdict, measure_compiled, settle
from ..placement.partition import compile_partitioned, split_for
from ..placement.policy import DevicePolicy
from ..placement.ranking import Decision, DeviceCandidate, Placement
from ..plugin import CompileOptions
from .drift import DriftWatch, Repick, drift_settings
from .fallback import Wording, try_in_turn

__all__ = ["CompiledGraph", "CompileReport", "GraphDevices", "compile", "benchmark_devices", "resolve_chain_default"]

log = logging.getLogger("rlx.session")


def compile(graph: Graph, device: str | None = "auto", policy: DevicePolicy | None = None, *,
            registry: Registry | None = None, options: CompileOptions | None = None,
            partition: bool | None = None, measure: MeasureSettings | None = None,
            precision: str | None = None) -> CompiledGraph:
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

    When the cost ranking is unsure of its pick (``measured.py``; ``measure`` tunes when,
    default ``MeasureSettings()``), a verdict measured earlier for the same graph and
    devices is used; without one, ``DevicePolicy(pick="measure")`` times the candidates
    now on generated inputs and compiles the faster (its report gives the times), while
    the default ``pick="cost"`` compiles the cost pick and its report says the pick was
    unsure: compiling and timing every candidate would double the compile of a script
    that runs the graph once, and a ``GraphDevices`` measures for free on its first runs.

    ``precision`` (``"bf16"``, ``"fp16"``; ``docs/precision.md``) is short for
    ``options=CompileOptions(precision=...)`` (over ``options``' own): a permission for the
    device to compute float32 products with operands in that format where it declares it.
    """
    if precision is not None:
        options = replace(options or CompileOptions(), precision=precision_name(precision, "precision"))
    if isinstance(device, str) and not device.strip():  # a variable that expanded to nothing, not a wish for auto
        raise DeviceError(f"device {device!r} is empty; give a device name such as 'cpu' or 'cuda:1', or 'auto' "
                          "(or None) for the policy's pick")
    reg = registry or default_registry()
    if isinstance(graph, StagedGraph):  # each stage compiled as a graph of its own, when first run

        def part(stage: Graph, placed: str | None) -> CompiledGraph:
            return compile(stage, placed or device, policy, registry=reg, options=options, partition=partition,
                           measure=measure)

        return StagedCompiledGraph(graph, part, device)
    if graph.is_symbolic:  # placed at a representative size, then compiled per shape class (dynamic.py)

        def again(spec: Graph, device: str | None) -> CompiledGraph:
            return compile(spec, device, policy, registry=reg, options=options, partition=partition, measure=measure)

        def later(spec: Graph) -> CompiledGraph:  # on the device the first compile chose; a split is planned again
            if "+" in first_device[0]:
                return again(spec, device)
            # Placed already: no ranking or pricing again (a third of a small graph's compile).
            return compile_on(spec, first_device[0], "placed at the representative size", [], reg, options)

        first_device: list[str] = []

        def first(spec: Graph) -> CompiledGraph:
            cg = again(spec, device)
            first_device.append(cg.device)
            return cg

        if isinstance(graph, ValueDependentGraph):  # no body before its values: placed at the first run
            return ValueCompiledGraph(graph, first, later, device)
        graph.freeze()
        resolved = policy if policy is not None else DevicePolicy.from_env()
        if device not in (None, "", "auto") or resolved.device:
            # An explicit device: placed (its blocker named) now, each class compiled when first run.
            decision = Placement(representative(graph)[0], resolved, reg, measure=measure,
                                 precision=_precision(options)).decide(device)
            first_device.append(decision.device)
            return compile_placed(graph, decision.device, decision.why, reg, options, later,
                                  _lower_once(graph, reg, options))
        return compile_symbolic(graph, first, later, _lower_once(graph, reg, options))
    # Frozen before placement: the pipeline placement runs to price the graph is then the
    # one compile hands the backend (``lowering.pipeline_for`` keys on it), not run twice.
    graph.freeze()
    placement = Placement(graph, policy, reg, measure=measure, precision=_precision(options))
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
            failed = (exc.device if isinstance(exc, DeviceError) else None) or split.devices[0]
            excluded.append((failed, f"{type(exc).__name__}: {exc}"))
            warnings.warn(f"rlx: device {failed} failed to compile its segment of graph {graph.name!r} ({exc}); "
                          "planning again without it", FallbackWarning, stacklevel=2)
            continue
        if excluded:
            cg.report().notes.append("fell back after: " + "; ".join(f"{d}: {e}" for d, e in excluded))
        return cg
    if not placement.rank(rows):
        reasons = "; ".join(f"{r.device}: {r.blocker}" for r in rows) or "no backends are installed"
        failed = "".join(f"; {d} failed: {e}" for d, e in excluded)
        raise DeviceError(f"no device can run graph {graph.name!r}: {reasons}; no split either: {split}{failed}")
    return _compile_whole(graph, device, placement, reg, options, explicit, rows)


def _lower_once(graph: Graph, registry: Registry,
                options: CompileOptions | None) -> Callable[[str, Mapping[str, int]], LoweredOnce | None]:
    """What ``compile_symbolic`` calls with the device the first compile chose: the graph
    lowered once for it (``lowered_once.py``). None for a split (planned per class) and for
    a ``DeferredGraph``, whose nodes hold one size's folded shapes (each class is converted
    on its own)."""

    def lower_once(placed: str, at: Mapping[str, int]) -> LoweredOnce | None:
        if "+" in placed or isinstance(graph, DeferredGraph):
            return None
        return LoweredOnce(graph, placed, at, registry, options)

    return lower_once


def _compile_whole(graph: Graph, device: str | None, placement: Placement, reg: Registry,
                   options: CompileOptions | None, explicit: bool,
                   rows: list[DeviceCandidate] | None = None) -> CompiledGraph:
    """``graph`` on one device: the chosen one (measured first when the policy asks and
    the ranking is unsure), then (auto) the next ranked on failure (``rows``: the
    candidates when the caller has them already)."""
    decision = placement.decide(device, rows)
    chosen, reason, rows = decision.device, decision.why, decision.rows
    failed: list[str] = []
    measured: list[tuple[str, str]] = []  # candidates that failed while measured
    if not explicit and placement.policy.pick == "measure" and placement.wants_measuring(decision):
        cg, measured = _compile_measured(graph, placement, decision, options)
        if cg is not None:
            return cg
        failed += [d for d, _ in measured]
    if explicit or placement.policy.strict:
        return _with_verdict(compile_on(graph, chosen, reason, rows, reg, options), decision.verdict)
    ranked = [chosen] + [r.device for r in placement.rank(rows) if r.device != parse_device(chosen)[0]]
    ranked = [d for d in ranked if d not in dict(measured)]

    def attempt(dev: str) -> CompiledGraph:
        why = reason if not failed else f"fallback after {failed[-1]} failed"
        return compile_on(graph, dev, why, rows, reg, options)

    _, cg, attempts = try_in_turn(ranked, attempt, graph=graph.name, wording=_COMPILE_WORDING, stacklevel=4,
                                  attempts=measured, on_failure=lambda dev, exc, error: failed.append(dev))
    if attempts:
        cg.report().notes.append("fell back after: " + "; ".join(f"{d}: {e}" for d, e in attempts))
    return _with_verdict(cg, decision.verdict if cg.device == chosen else None)


def _precision(options: CompileOptions | None) -> str:
    return options.precision if options is not None else "fp32"


def _compile_measured(graph: Graph, placement: Placement, decision: Decision, options: CompileOptions | None,
                      ) -> tuple[CompiledGraph | None, list[tuple[str, str]]]:
    """Compile and time the unsure pick's candidates now (``pick="measure"``); the
    winner's compiled copy, its report saying what was measured, and the candidates that
    failed (``None`` for the copy when every one did)."""
    assert decision.doubt is not None
    reg = placement.registry
    trial = Trial(decision.doubt.candidates, placement.policy.benchmark_runs)
    compiled = measure_compiled(graph, trial, lambda d: compile_on(graph, d, "measured pick", decision.rows, reg,
                                                                   options),
                                clock=placement.measure.clock, strict=placement.policy.strict)
    verdict = settle(graph, trial, "rlx.compile (pick='measure', generated inputs)", decision.rows, reg,
                     placement.errors, placement.precision)
    if verdict is None:
        return None, list(trial.failed.items())
    cg = compiled[verdict.winner]
    cg.report().reason = f"{verdict.describe()}; unsure by cost: {decision.doubt.reason}"
    return _with_verdict(cg, verdict), list(trial.failed.items())


def _with_verdict(cg: CompiledGraph, verdict: Verdict | None) -> CompiledGraph:
    if verdict is not None:
        cg.report().measurement = verdict
    return cg


_COMPILE_WORDING = Wording(failed="rlx: device {device} failed to compile graph {graph!r} ({message}); ",
                           none="no device could compile graph {graph!r}: {detail}")
_CHAIN_WORDING = Wording(last="no device left in the chain")


@dataclass
class _AutoPick:
    """Where a ``GraphDevices``' auto runs go under one policy, and why: the placement's
    decision, then (when it was unsure) the measurement under way on the first runs and
    the verdict that settled it."""

    policy: DevicePolicy
    placement: Placement
    decision: Decision
    device: str
    why: str
    trial: Trial | None = None
    verdict: Verdict | None = None


class GraphDevices:
    """One graph, compiled lazily on as many devices as asked, params mirrored to all.

    ``measure`` (``measured.MeasureSettings``) says when the auto pick of ``run`` is unsure
    and how its first runs are timed then. ``precision`` (``"bf16"``, ``"fp16"``;
    ``docs/precision.md``) is allowed to every device it compiles for, as
    ``rlx.compile(precision=...)`` allows it to one."""

    def __init__(self, graph: Graph, policy: DevicePolicy | None = None, *, registry: Registry | None = None,
                 measure: MeasureSettings | None = None, precision: str = "fp32") -> None:
        self.graph = graph.freeze()
        self._options = CompileOptions(precision=precision_name(precision, "precision"))
        self._policy = policy
        self._registry = registry or default_registry()
        self._measure = measure if measure is not None else MeasureSettings()
        self._compiled: dict[str, CompiledGraph] = {}
        self._params: dict[str, np.ndarray] = {}
        self._winner: str | None = None
        self._watch: DriftWatch | None = None  # auto runs: re-pick on slowdown (drift.py)
        self._auto: _AutoPick | None = None  # auto runs: the pick under the policy it was made for
        self._lock = threading.RLock()
        self.last_device: str | None = None

    @property
    def policy(self) -> DevicePolicy:
        return self._policy if self._policy is not None else DevicePolicy.from_env()

    def _placement(self, policy: DevicePolicy | None = None) -> Placement:
        return Placement(self.graph, policy if policy is not None else self.policy, self._registry,
                         measure=self._measure, precision=self._options.precision)

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
                cg = self._compile_on(dev)
                for name, value in self._params.items():
                    cg.set_param(name, value)
                self._compiled[dev] = cg
            return cg

    def _compile_on(self, dev: str, graph: Graph | None = None) -> CompiledGraph:
        def on(static: Graph) -> CompiledGraph:
            return compile_on(static, dev, "explicit device (argument)", [], self._registry, self._options)

        graph = self.graph if graph is None else graph
        if isinstance(graph, StagedGraph):
            return StagedCompiledGraph(graph, lambda stage, _placed: self._compile_on(dev, stage), dev)
        if isinstance(graph, ValueDependentGraph):
            return ValueCompiledGraph(graph, on, on, dev)
        if graph.is_symbolic:
            return compile_symbolic(graph, on, lower_once=_lower_once(graph, self._registry, self._options))
        return on(graph)

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
                              FallbackWarning, stacklevel=2)
        return times

    def run(self, inputs: Mapping[str, Any], device: str | None = None) -> list[np.ndarray]:
        """Run on ``device``, or (``None``/``"auto"``) on the device the ranking picked.

        When the ranking was unsure (``measured.py``) and no verdict was cached, the first
        auto runs measure: each runs one candidate on the caller's inputs and returns its
        outputs (a warm-up run each, then ``benchmark_runs`` timed rounds, interleaved);
        then the faster is kept, the verdict cached on disk and the observed errors
        recorded. A candidate that fails meanwhile is dropped with a ``FallbackWarning``
        and the call runs on another. After that, the device is re-picked when it slows
        down far past its own baseline (``drift.py``; ``repicks`` lists the moves), and
        ``pick_reason`` says why it runs where it does."""
        if device not in (None, "auto"):
            cg = self.compile(device)
            self.last_device = cg.device
            return cg.run(inputs)
        policy = self.policy
        auto = self._auto
        if auto is None or auto.policy != policy:  # first auto run, or the policy changed under the session
            auto = self._decide(policy)
        if auto.trial is not None:
            return self._run_measuring(auto, inputs)
        watch = self._watch
        dev = watch.current if watch is not None else auto.device
        cg = self.compile(dev)
        self.last_device = cg.device
        if watch is None:
            return cg.run(inputs)
        t0 = time.perf_counter()
        outs = cg.run(inputs)
        watch.observe(dev, time.perf_counter() - t0)
        return outs

    @property
    def repicks(self) -> list[Repick]:
        """Every re-pick on slowdown of the auto runs so far (``drift.Repick``)."""
        return list(self._watch.repicks) if self._watch is not None else []

    @property
    def pick_reason(self) -> str | None:
        """Why auto runs go where they go (measured, from a cached verdict, or by cost, and
        any correction applied); ``None`` before the first auto run."""
        auto = self._auto
        if auto is None:
            return None
        if auto.trial is not None:
            return f"measuring {', '.join(auto.trial.candidates)} on the first runs: {auto.why}"
        return auto.why

    def _decide(self, policy: DevicePolicy) -> _AutoPick:
        """Make the auto pick for ``policy``: the placement's decision, and a measurement to
        run on the first runs when it is unsure and the policy lets a measurement decide."""
        with self._lock:
            if self._auto is not None and self._auto.policy == policy:
                return self._auto  # another thread decided meanwhile
            placement = self._placement(policy)
            decision = placement.decide()
            auto = _AutoPick(policy, placement, decision, decision.device, decision.why, verdict=decision.verdict)
            if (self._measure.on_run or policy.pick == "measure") and placement.wants_measuring(decision):
                assert decision.doubt is not None
                auto.trial = Trial(decision.doubt.candidates, policy.benchmark_runs)
            self._watch = None if auto.trial is not None else self._new_watch(auto)
            self._auto = auto
            return auto

    def _run_measuring(self, auto: _AutoPick, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        """One auto run while the pick is measured: the trial's next candidate runs (and is
        timed) on ``inputs``; runs are serialized meanwhile, so that one does not time
        another. A candidate that fails is dropped and the call goes to the next."""
        clock = self._measure.clock
        with self._lock:
            trial = auto.trial
            if trial is None or self._auto is not auto:  # settled (or replaced) by another thread meanwhile
                return self.run(inputs)
            while (dev := trial.next_device()) is not None:
                try:
                    cg = self.compile(dev)
                    t0 = clock()
                    outs = cg.run(inputs)
                    seconds = clock() - t0
                except CALLER_ERRORS:
                    raise
                except Exception as exc:
                    if auto.policy.strict:
                        raise DeviceError(f"device {dev} failed while the pick of graph {self.graph.name!r} was "
                                          f"measured (strict: no fallback): {type(exc).__name__}: {exc}") from exc
                    warnings.warn(f"rlx: device {dev} failed while the auto pick of graph {self.graph.name!r} was "
                                  f"measured ({type(exc).__name__}: {exc}); dropping it from the pick",
                                  FallbackWarning, stacklevel=3)
                    trial.drop(dev, f"{type(exc).__name__}: {exc}")
                    continue
                trial.record(dev, seconds)
                self.last_device = cg.device
                if trial.done:
                    self._settle(auto)
                return outs
            if self._settle(auto) is None:
                attempts = list(trial.failed.items())
                detail = "; ".join(f"{d}: {e}" for d, e in attempts)
                raise DeviceFallbackError(f"no device could run graph {self.graph.name!r} while its auto pick was "
                                          f"measured: {detail}", attempts)
            return self.run(inputs)  # one candidate left, untimed: it runs this call

    def _settle(self, auto: _AutoPick) -> Verdict | None:
        """End ``auto``'s measurement: keep the winner, cache the verdict, record the errors,
        and watch the winner for drift from now on. ``None`` when every candidate failed
        (the next auto run decides again)."""
        assert auto.trial is not None and auto.decision.doubt is not None
        verdict = settle(self.graph, auto.trial, "GraphDevices.run (the caller's inputs)", auto.decision.rows,
                         self._registry, auto.placement.errors, self._options.precision)
        auto.trial = None
        if verdict is None:
            self._auto = None
            return None
        auto.device, auto.verdict = verdict.winner, verdict
        auto.why = f"{verdict.describe()}; unsure by cost: {auto.decision.doubt.reason}"
        self._watch = self._new_watch(auto)
        return verdict

    def _new_watch(self, auto: _AutoPick) -> DriftWatch | None:
        """The watch over auto runs when the pick is the ranking's own (cost, measured where
        unsure; not a default device, a preference or a benchmark) and drift is enabled.
        Measured devices are predicted by what they measured; each baseline the watch sets
        is recorded as that device's error on this host (``corrections.py``)."""
        policy = auto.policy
        if policy.device or policy.prefer or policy.pick not in ("cost", "measure"):
            return None
        factor, forget = drift_settings()
        if factor is None:
            return None
        ranked = auto.placement.rank(auto.decision.rows)
        estimates = {r.device: r.est_seconds for r in ranked if r.est_seconds is not None}
        if auto.verdict is not None:
            estimates.update({d: s for d, s in auto.verdict.seconds.items() if d in estimates})
        if auto.device not in estimates:
            return None
        model = {r.device: r.model_seconds for r in ranked if r.model_seconds is not None}
        errors: PredictionErrors = auto.placement.errors

        def record(device: str, seconds: float) -> None:
            if device in model:
                errors.record(device, seconds, model[device])

        return DriftWatch(estimates, auto.device, factor=factor, forget_seconds=forget, on_baseline=record)

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
            self._watch = self._auto = None

    def set_policy(self, policy: DevicePolicy | None) -> None:
        with self._lock:
            if policy != self._policy:
                self._watch = self._auto = None
            self._policy = policy
            self._winner = None


def resolve_chain_default(graph: Graph, policy: DevicePolicy, registry: Registry) -> list[str]:
    if policy.chain:
        return list(policy.chain)
    p = Placement(graph, policy, registry)
    return [r.device for r in p.rank(p.candidates())]
