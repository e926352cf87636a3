"""Device placement: which devices can run a graph, which is best, and why not the others.

Every answer comes from one place, ``Placement``: for each registered backend it asks
the probe (availability), the policy (allow/deny), the legalizer (does the backend claim
every primitive after decomposition?) and the cost model (estimated seconds), and turns
the first refusal into a *blocker* string that people can act on.

An estimate is the cost model's, corrected by the error the model showed for that device
on this host (``corrections.py``); when the ranking cannot tell its best devices apart,
``decide`` says so (``measured.find_doubt``) and uses the verdict of an earlier
measurement when one is cached (``measured.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..backends.registry import Registry, default_registry, parse_device
from ..compiler.compiled import compile_on
from ..compiler.dynamic import representative
from ..compiler.lowering import legalize_for, pipeline_for, priced_graph
from ..compiler.memory import fits_unplanned, memory_blocker
from ..compiler.timing import benchmark_devices
from ..cost import estimate_graph_cost
from ..errors import DeviceError
from ..ir import Graph
from ..ir.valued import RunTimeGraph
from ..passes.plan import plan_memory
from .corrections import Correction, PredictionErrors, borrowed
from .measured import Doubt, MeasureSettings, Trial, Verdict, Verdicts, find_doubt, measure_compiled, settle
from .policy import DevicePolicy

__all__ = [
    "Decision",
    "DeviceCandidate",
    "Placement",
    "available_devices",
    "devices_for",
    "fastest_device_for",
    "resolve_device",
    "resolve_device_chain",
    "device_report",
    "legalize_for",
    "pipeline_for",
]

log = logging.getLogger("rlx.placement")


@dataclass(frozen=True)
class DeviceCandidate:
    """One row of ``device_report``: can this device run the graph, and at what cost?

    ``est_seconds`` is what the ranking uses: ``model_seconds`` (the cost model's own
    estimate, ``estimate_graph_cost``) times the ``correction`` observed for this device
    on this host, when one was recorded (``corrections.py``).
    """

    device: str
    label: str
    available: bool
    reason: str
    registered: bool
    supports_graph: bool | None
    recommended: bool
    blocker: str | None
    est_seconds: float | None
    priority: int = 0
    distribution: str = ""
    version: str = ""
    ops: tuple[str, ...] = field(default=(), repr=False)
    calibrated: bool = False
    model_seconds: float | None = None
    correction: Correction | None = None

    @property
    def viable(self) -> bool:
        return self.blocker is None and self.available and self.supports_graph is not False

    def estimate_note(self) -> str | None:
        """``cpu: estimate 3.10 ms corrected by observed factor 0.28 from 4 measurements on
        this host``, or ``None`` when the estimate is the model's own."""
        if self.correction is None or self.model_seconds is None:
            return None
        return f"{self.device}: {self.correction.describe(self.model_seconds)}"


@dataclass(frozen=True)
class Decision:
    """Where a graph goes and why (``Placement.decide``): the ``device``, the reason, the
    candidate rows; ``doubt`` when the cost ranking was unsure of it (``measured.py``),
    and the ``verdict`` of the measurement that settled it, if one did."""

    device: str
    why: str
    rows: list[DeviceCandidate]
    doubt: Doubt | None = None
    verdict: Verdict | None = None


def _fmt_seconds(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


class Placement:
    """Answers placement questions about one graph (or none) under one policy."""

    def __init__(self, graph: Graph | None, policy: DevicePolicy | None = None,
                 registry: Registry | None = None, *, measure: MeasureSettings | None = None,
                 precision: str = "fp32") -> None:
        # A symbolic graph is placed and priced at a representative size (dynamic.py says which);
        # a staged one by its first part when that is built at load; one with no body before it
        # runs (built from values) by the policy alone here: what it runs is placed when built.
        if isinstance(graph, RunTimeGraph):
            graph = graph.priced()
        self.graph = representative(graph)[0] if graph is not None and graph.is_symbolic else graph
        self.policy = policy if policy is not None else DevicePolicy.from_env()
        self.registry = registry or default_registry()
        self.policy.validate(self.registry)  # a device name no backend has is a ConfigError, not ignored
        self.measure = measure if measure is not None else MeasureSettings()
        self.precision = precision  # CompileOptions.precision: measured verdicts are kept per precision
        self.errors = PredictionErrors(self.registry)  # read once per device per placement

    # -------------------------------------------------------------- per device
    def _row(self, name: str, probe: bool = True, price: bool = True) -> DeviceCandidate:
        """``name``'s row; without ``price`` (a device the user named: nothing is ranked)
        no estimate, and the memory check plans the graph only where it may not fit
        (``fits_unplanned``): a symbolic graph placed on a named device is compiled per
        shape class later, and running the compile pipeline at its representative size
        only to price it cost a third of a small CNN's load and compile."""
        reg, info = self.registry, self.registry.info(name)
        backend = info.backend
        avail = reg.availability(name)
        try:
            ops = tuple(sorted(str(o) for o in backend.supported_ops()))
        except Exception as exc:  # foreign code: a failure here is the plugin's, reported not raised
            ops = ()
            log.warning("backend %s: supported_ops() raised %s", name, exc)
        blocker: str | None = None
        if not avail.available:
            blocker = f"unavailable: {avail.reason}" if avail.reason else "unavailable"
        refusal = self.policy.permits(name)
        if blocker is None and refusal:
            blocker = refusal
        supports = est = model_est = correction = None
        calibrated = False
        if self.graph is not None:
            legal = legalize_for(self.graph, name, reg)
            supports = legal.supported
            if blocker is None and legal.blocker is not None:
                blocker = legal.blocker
            if avail.available and supports:
                model = reg.cost_model(name)
                calibrated = model.calibrated
                if price:
                    est = model_est = estimate_graph_cost(priced_graph(self.graph, name, reg), model)
                    correction = self.errors.get(name)
                    if correction is not None:
                        est = model_est * correction.factor
                if blocker is None and (price or not fits_unplanned(legal.graph, name, avail.memory_bytes)):
                    blocker = self._memory_blocker(name, avail.memory_bytes)  # never tried where it cannot fit
        elif avail.available:
            calibrated = reg.cost_model(name).calibrated
        return DeviceCandidate(
            device=name, label=info.backend.label or info.label or name, available=avail.available, reason=avail.reason,
            registered=True, supports_graph=supports, recommended=False, blocker=blocker, est_seconds=est,
            priority=info.priority, distribution=info.distribution, version=info.version, ops=ops,
            calibrated=calibrated, model_seconds=model_est, correction=correction,
        )

    def _memory_blocker(self, name: str, probed: int | None) -> str | None:
        assert self.graph is not None
        result = pipeline_for(self.graph, name, self.registry)
        return memory_blocker(result.graph, name, result.memory_plan or plan_memory(result.graph), probed)

    def candidates(self, names: Iterable[str] | None = None) -> list[DeviceCandidate]:
        """One row per backend (all of them by default), highest priority first."""
        names = list(names) if names is not None else self.registry.names()
        self.registry.probe_all(names)  # concurrently, before asking one by one
        rows = [self._row(n) for n in names]
        recorded = [r.correction for r in rows if r.correction is not None and r.est_seconds is not None]
        for i, r in enumerate(rows):  # a device never measured here is lent the others' usual error
            if r.correction is None and r.model_seconds is not None:
                lent = borrowed(r.device, recorded)
                if lent is not None:
                    rows[i] = _replace(r, correction=lent, est_seconds=r.model_seconds * lent.factor)
        return rows

    def rank(self, rows: Sequence[DeviceCandidate]) -> list[DeviceCandidate]:
        """Viable rows, best first: the policy's ``prefer`` order, then cost, then priority."""
        viable = [r for r in rows if r.viable]
        preferred = []
        for want in self.policy.prefer:
            name = parse_device(want)[0]
            preferred += [r for r in viable if r.device == name and r not in preferred]
        rest = sorted((r for r in viable if r not in preferred),
                      key=lambda r: (r.est_seconds if r.est_seconds is not None else float("inf"),
                                     -r.priority, r.device))
        return preferred + rest

    # -------------------------------------------------------------- decisions
    def check_explicit(self, device: str, source: str = "argument") -> str:
        """Validate a device the user named; ``DeviceError`` naming the blocker if it cannot run."""
        name, index = parse_device(device)
        self.registry.get(name)  # DeviceError listing the known devices
        row = self._row(name, price=False)
        if row.blocker is not None:
            what = f"graph {self.graph.name!r}" if self.graph is not None else "graphs"
            raise DeviceError(f"device {device!r} ({source}) cannot run {what}: {row.blocker}")
        if index is not None:
            known = self.registry.availability(name).devices
            if known and f"{name}:{index}" not in known and not (index == 0 and name in known):
                raise DeviceError(
                    f"device {device!r} ({source}) does not exist here; {name} devices: {', '.join(known)}"
                )
        return device.strip()

    def choose(self, hint: str | None = None,
               rows: list[DeviceCandidate] | None = None) -> tuple[str, str, list[DeviceCandidate]]:
        """``(device, why, rows)``: the hint, else ``RLX_DEVICE``, else the ranking (of
        ``rows`` when the caller has already asked ``candidates()``). Under
        ``pick="measure"`` an unsure ranking is settled by measuring here (compiled copies
        are discarded; ``rlx.compile`` keeps the winner's instead, see ``session.py``)."""
        decision = self.decide(hint, rows)
        if self.wants_measuring(decision) and self.policy.pick == "measure":
            assert self.graph is not None and decision.doubt is not None
            trial = Trial(decision.doubt.candidates, self.policy.benchmark_runs)
            measure_compiled(self.graph, trial, lambda d: compile_on(self.graph, d, "measured pick", [], self.registry),
                             clock=self.measure.clock, strict=self.policy.strict)
            verdict = settle(self.graph, trial, "compile (pick='measure', generated inputs)", decision.rows,
                             self.registry, self.errors, self.precision)
            if verdict is not None:
                return verdict.winner, verdict.describe(), decision.rows
        return decision.device, decision.why, decision.rows

    def wants_measuring(self, decision: Decision) -> bool:
        """Whether ``decision`` is an unsure cost pick no cached verdict settled, that this
        policy lets a measurement change (never under ``strict`` unless ``pick="measure"``)."""
        if decision.doubt is None or decision.verdict is not None or self.graph is None:
            return False
        return not self.policy.strict or self.policy.pick == "measure"

    def decide(self, hint: str | None = None, rows: list[DeviceCandidate] | None = None) -> Decision:
        """Where the graph goes without running anything: ``choose``'s answer, with the doubt
        about an unsure cost pick and the cached verdict that settles it, if any."""
        if hint not in (None, "", "auto"):
            return Decision(self.check_explicit(hint, "explicit device"), "explicit device (argument)", [])
        if self.policy.device:
            src = self.policy.sources.get("device", "policy")
            return Decision(self.check_explicit(self.policy.device, src), f"default device from {src}", [])
        rows = self.candidates() if rows is None else rows
        ranked = self.rank(rows)
        if not ranked:
            what = f"graph {self.graph.name!r}" if self.graph is not None else "anything"
            reasons = "; ".join(f"{r.device}: {r.blocker}" for r in rows) or "no backends are installed"
            raise DeviceError(f"no device can run {what}: {reasons}")
        best = ranked[0]
        if self.policy.pick == "benchmark" and self.graph is not None and len(ranked) > 1:
            times = benchmark_devices(self.graph, [r.device for r in ranked], self.policy.benchmark_runs,
                                      self.registry)
            if times:
                winner = min(times, key=times.__getitem__)
                detail = ", ".join(f"{d} {_fmt_seconds(t)}" for d, t in sorted(times.items(), key=lambda kv: kv[1]))
                return Decision(winner, f"fastest in a benchmark of {self.policy.benchmark_runs} runs: {detail}",
                                rows)
        if best.device in [parse_device(p)[0] for p in self.policy.prefer]:
            src = self.policy.sources.get("prefer", "policy")
            return Decision(best.device, f"preferred by policy ({src})", rows)
        if len(ranked) == 1:
            why = "the only device that can run it"
        else:
            others = ", ".join(f"{r.device} {_fmt_seconds(r.est_seconds or 0)}" for r in ranked[1:])
            why = f"lowest estimated cost {_fmt_seconds(best.est_seconds or 0)} (vs {others})"
        notes = [n for n in (r.estimate_note() for r in ranked) if n]
        if notes:
            why += " [" + "; ".join(notes) + "]"
        doubt = find_doubt(ranked, self.measure) if self.graph is not None else None
        if doubt is None:
            return Decision(best.device, why, rows)
        assert self.graph is not None
        measuring = not self.policy.strict or self.policy.pick == "measure"  # strict: the ranking's own pick
        verdicts = Verdicts(self.registry, precision=self.precision)
        verdict = verdicts.get(self.graph, doubt.candidates) if measuring else None
        if verdict is not None:
            return Decision(verdict.winner, f"{verdict.describe()}; unsure by cost: {doubt.reason}", rows, doubt,
                            verdict)
        if self.policy.pick == "measure":
            how = "measured now (pick='measure')"
        elif self.policy.strict:
            how = "not measured: under strict only DevicePolicy(pick='measure') measures"
        else:
            how = "not measured here: GraphDevices.run measures on its first runs, DevicePolicy(pick='measure') at " \
                  "compile"
        return Decision(best.device, f"{why}; unsure ({doubt.reason}): {how}", rows, doubt)

    def report(self) -> list[DeviceCandidate]:
        rows = self.candidates()
        rows += [
            DeviceCandidate(device=ep, label=ep, available=False, reason=err, registered=False,
                            supports_graph=None, recommended=False, blocker=f"plugin failed to load: {err}",
                            est_seconds=None)
            for ep, err in self.registry.broken()
            if ep not in {r.device for r in rows} | {self.registry.info(r.device).entry_point for r in rows}
        ]  # a probe failure is listed under its entry point, which may differ from the device name
        recommended: str | None = None
        if self.graph is None:  # the contract: RLX_DEVICE when usable, else the highest priority
            usable = [r for r in rows if r.viable]
            if self.policy.device and parse_device(self.policy.device)[0] in {r.device for r in usable}:
                recommended = parse_device(self.policy.device)[0]
            elif usable:
                recommended = max(usable, key=lambda r: r.priority).device
        else:
            try:
                recommended = parse_device(self.choose()[0])[0]
            except DeviceError:
                recommended = None
        return [r if r.device != recommended else _replace(r, recommended=True) for r in rows]


def example_pick(policy: DevicePolicy | None = None, registry: Registry | None = None) -> tuple[str | None, str]:
    """``(device, why)``: where ``rlx run --example mlp`` runs under ``policy`` (the policy
    and the cost ranking on the bundled representative graph, priced, never compiled, so by
    cost even under a benchmark pick); ``(None, why not)`` when no device can run it.
    Without a graph of the user's, ``recommended`` marks the highest-priority device (the
    contract); this says what a first run will actually pick, which may differ."""
    from dataclasses import replace

    from ..examples import REPRESENTATIVE, representative_graph

    pol = policy if policy is not None else DevicePolicy.from_env()
    sample = Placement(representative_graph(), replace(pol, pick="cost"), registry)
    try:
        device, why, _ = sample.choose()
    except DeviceError as exc:
        return None, f"rlx run --example {REPRESENTATIVE} cannot run here: {exc}"
    return parse_device(device)[0], why


def _replace(row: DeviceCandidate, **kw: object) -> DeviceCandidate:
    from dataclasses import replace

    return replace(row, **kw)


# ------------------------------------------------------------------ public functions
def available_devices(*, registry: Registry | None = None) -> list[str]:
    """Devices whose probe succeeded here, highest priority first (policy not applied)."""
    reg = registry or default_registry()
    names = reg.names()
    avail = reg.probe_all(names)
    return [n for n in names if avail[n].available]


def devices_for(g: Graph, policy: DevicePolicy | None = None, *, registry: Registry | None = None) -> list[str]:
    """Devices that can run ``g`` under ``policy``, best first."""
    p = Placement(g, policy, registry)
    return [r.device for r in p.rank(p.candidates())]


def fastest_device_for(g: Graph, policy: DevicePolicy | None = None, *, registry: Registry | None = None) -> str:
    """The best viable device for ``g`` by the policy's ranking (ignores ``RLX_DEVICE``)."""
    p = Placement(g, policy, registry)
    if p.policy.device:
        from dataclasses import replace

        p.policy = replace(p.policy, device=None)
    return p.choose()[0]


def resolve_device(g: Graph, hint: str | None = None, policy: DevicePolicy | None = None, *,
                   registry: Registry | None = None) -> str:
    """The device ``g`` runs on: ``hint``, then ``RLX_DEVICE``, then the cost ranking."""
    return Placement(g, policy, registry).choose(hint)[0]


def resolve_device_chain(g: Graph, chain: Iterable[str] | None, policy: DevicePolicy | None = None, *,
                         registry: Registry | None = None) -> list[str]:
    """The devices of ``chain`` (default: the policy's chain, else every viable device)
    that can run ``g``, in chain order. Unknown names raise ``DeviceError``; when none
    can run it, ``DeviceError`` lists each device's blocker."""
    p = Placement(g, policy, registry)
    wanted = list(chain) if chain is not None else list(p.policy.chain)
    if not wanted:
        return [r.device for r in p.rank(p.candidates())]
    for d in wanted:
        p.registry.get(parse_device(d)[0])
    rows = {r.device: r for r in p.candidates(dict.fromkeys(parse_device(d)[0] for d in wanted))}
    viable = [d.strip() for d in wanted if rows[parse_device(d)[0]].viable]
    if not viable:
        reasons = "; ".join(f"{d}: {rows[parse_device(d)[0]].blocker}" for d in wanted)
        raise DeviceError(f"no device of the chain {', '.join(wanted)} can run graph {g.name!r}: {reasons}")
    return viable


def device_report(g: Graph | None = None, policy: DevicePolicy | None = None, *,
                  registry: Registry | None = None) -> list[DeviceCandidate]:
    """One ``DeviceCandidate`` per discovered backend (and per plugin that failed to load)."""
    return Placement(g, policy, registry).report()
