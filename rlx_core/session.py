"""Compiled graphs and sessions: ``compile``, ``CompiledGraph``, ``GraphDevices``, fallback.

A ``CompiledGraph`` is one graph on one device: it validates inputs before any work,
runs the backend's executable, and checks what comes back, so that a backend's mistake
surfaces as an error naming the backend instead of a wrong answer. ``GraphDevices``
keeps one compiled copy per device with params mirrored to all of them.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .errors import (
    CALLER_ERRORS,
    ConfigError,
    DeviceError,
    DeviceFallbackError,
    FallbackWarning,
    PluginError,
    RlxError,
)
from .inputs import check_param_value, input_specs, random_inputs, validate_inputs
from .ir import Graph
from .memory import check_memory
from .passes.pipeline import fusion_report_enabled
from .passes.plan import plan_memory
from .placement import DeviceCandidate, Placement, pipeline_for
from .plugin import CompileOptions, Executable
from .policy import DevicePolicy
from .registry import Registry, default_registry, parse_device

__all__ = ["CompiledGraph", "CompileReport", "GraphDevices", "compile", "run_with_fallback", "benchmark_devices"]

log = logging.getLogger("rlx.session")
RLX_FUSION_REPORT_HEADER = "compile report (RLX_FUSION_REPORT=1)"


@dataclass
class CompileReport:
    """Where a graph was placed, why, and what compiling it did."""

    graph: str
    device: str
    reason: str
    label: str = ""
    compile_seconds: float = 0.0
    user_nodes: int = 0
    legalized_nodes: int = 0
    decomposed: list[str] = field(default_factory=list)
    candidates: list[DeviceCandidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    compiled_nodes: int = 0  # nodes of the graph the backend received (after optimize and fuse)
    fused: list[str] = field(default_factory=list)
    pipeline: list[str] = field(default_factory=list)  # per stage: what it did and why

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph, "device": self.device, "reason": self.reason, "label": self.label,
            "compile_seconds": self.compile_seconds, "user_nodes": self.user_nodes,
            "legalized_nodes": self.legalized_nodes, "decomposed": list(self.decomposed),
            "candidates": [{"device": c.device, "viable": c.viable, "blocker": c.blocker,
                            "est_seconds": c.est_seconds} for c in self.candidates],
            "notes": list(self.notes), "compiled_nodes": self.compiled_nodes, "fused": list(self.fused),
            "pipeline": list(self.pipeline),
        }  # fmt: skip

    def __str__(self) -> str:
        lines = [
            f"graph {self.graph!r} on {self.device}" + (f" ({self.label})" if self.label else ""),
            f"  why: {self.reason}",
            f"  compile: {self.compile_seconds * 1e3:.2f} ms, "
            f"{self.user_nodes} nodes -> {self.legalized_nodes} after legalization",
        ]  # fmt: skip
        if self.decomposed:
            lines.append("  legalized (composites decomposed because the device does not claim them):")
            lines += [f"    {d}" for d in self.decomposed]
        for c in self.candidates:
            if c.device == parse_device(self.device)[0]:
                continue
            est = f", est {c.est_seconds * 1e6:.1f} µs" if c.est_seconds is not None else ""
            lines.append(f"  {c.device}: {'viable' + est if c.viable else 'not used: ' + str(c.blocker)}")
        if self.pipeline:
            lines.append(f"  pipeline ({self.compiled_nodes} nodes compiled):")
            lines += [f"    {p}" for p in self.pipeline]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class CompiledGraph:
    """One graph compiled for one device. Thread-safe ``run``."""

    def __init__(self, graph: Graph, device: str, executable: Executable, legal: Graph, report: CompileReport,
                 registry: Registry, options: CompileOptions | None = None) -> None:  # fmt: skip
        self.graph = graph
        self._options = options
        self._device = device
        self._exe = executable
        self._legal = legal
        self._report = report
        self._registry = registry
        self._specs = input_specs(graph)
        # An executable that takes device arrays (cuda: CuPy, torch CUDA tensors) gets them as
        # they are, checked by shape and dtype; every other gets numpy arrays.
        self._device_inputs = bool(getattr(executable, "accepts_device_inputs", False))
        outs = [legal.node(i) for i in legal.outputs]
        self._out_checks = tuple((n.shape, np.dtype(n.dtype)) for n in outs)
        self._lock = threading.Lock()  # set_param vs set_param; runs never take it

    @property
    def device(self) -> str:
        return self._device

    @property
    def backend(self) -> str:
        return parse_device(self._device)[0]

    def report(self) -> CompileReport:
        return self._report

    def run(self, inputs: Mapping[str, Any], output: str = "numpy") -> list[Any]:
        """Run on validated ``inputs``; one array per graph output.

        ``output="numpy"`` (the default) returns numpy arrays. ``output="dlpack"`` returns
        arrays that stay where the device computed them, each a ``__dlpack__`` producer
        (hand them to ``torch.from_dlpack``, ``cupy.from_dlpack``, ``jax.dlpack``... without a
        copy): from the executable's optional ``run_dlpack`` when it has one, else the
        numpy arrays of ``run`` (host memory, itself a DLPack producer, as on cpu).
        """
        if output not in ("numpy", "dlpack"):
            raise ConfigError(f"run: output must be 'numpy' or 'dlpack', got {output!r}")
        arrays = validate_inputs(self._specs, inputs, self._device_inputs)
        run_dlpack = getattr(self._exe, "run_dlpack", None) if output == "dlpack" else None
        try:
            outs = self._exe.run(arrays) if run_dlpack is None else run_dlpack(arrays)
        except RlxError:
            raise
        except (Exception, SystemExit) as exc:  # a plugin's sys.exit() must not end the host
            raise DeviceError(
                f"device {self._device} failed running graph {self.graph.name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        return self._check_outputs(outs) if run_dlpack is None else self._check_device_outputs(outs)

    def _check_device_outputs(self, outs: Any) -> list[Any]:
        """``_check_outputs`` for ``run_dlpack``: count, shape and dtype, without a copy to host."""
        checks = self._out_checks
        if not isinstance(outs, (list, tuple)) or len(outs) != len(checks):
            n = len(outs) if isinstance(outs, (list, tuple)) else type(outs).__name__
            raise PluginError(f"backend {self.backend!r} run_dlpack returned {n} outputs for graph "
                              f"{self.graph.name!r}, which has {len(checks)}")  # fmt: skip
        for i, (out, (shape, dtype)) in enumerate(zip(outs, checks)):
            if not hasattr(out, "__dlpack__"):
                raise PluginError(f"backend {self.backend!r} run_dlpack returned a {type(out).__name__} for "
                                  f"output {i}, which has no __dlpack__")  # fmt: skip
            try:
                got_shape, got_dtype = tuple(out.shape), np.dtype(out.dtype)
            except (AttributeError, TypeError):
                continue  # a producer whose dtype numpy cannot name (e.g. torch): trust DLPack's own metadata
            if got_shape != shape or got_dtype != dtype:
                raise PluginError(
                    f"backend {self.backend!r} returned output {i} of graph {self.graph.name!r} as {got_dtype}"
                    f"{list(got_shape)}; the graph declares {dtype}{list(shape)}"
                )
        return list(outs)

    def _check_outputs(self, outs: Any) -> list[np.ndarray]:
        checks = self._out_checks
        if type(outs) is list and len(outs) == len(checks):  # fast path: a list of right arrays, as is
            for out, (shape, dtype) in zip(outs, checks):
                if type(out) is not np.ndarray or out.shape != shape or (out.dtype is not dtype and out.dtype != dtype):
                    break
            else:
                return outs
        if not isinstance(outs, (list, tuple)) or len(outs) != len(checks):
            n = len(outs) if isinstance(outs, (list, tuple)) else type(outs).__name__
            raise PluginError(f"backend {self.backend!r} returned {n} outputs for graph {self.graph.name!r}, "
                              f"which has {len(checks)}")  # fmt: skip
        result = []
        for i, (out, (shape, dtype)) in enumerate(zip(outs, checks)):
            if type(out) is not np.ndarray:
                try:
                    out = np.asarray(out)
                except Exception:
                    raise PluginError(f"backend {self.backend!r} returned a {type(out).__name__} for output {i}, "
                                      "not an array") from None  # fmt: skip
            if out.shape != shape or out.dtype != dtype:
                raise PluginError(
                    f"backend {self.backend!r} returned output {i} of graph {self.graph.name!r} as {out.dtype}"
                    f"{list(out.shape)}; the graph declares {dtype}{list(shape)}"
                )
            result.append(out)
        return result

    def set_param(self, name: str, value: Any) -> None:
        """Replace a param (same shape and dtype, else ``InputError``); atomic on failure."""
        _node, frozen = check_param_value(self.graph, name, value)
        legal_id = next((i for i in self._legal.params if self._legal.node(i).name == name), None)
        if legal_id is None:  # the pipeline keeps every param; a backend's rewrite might not
            raise PluginError(f"device {self._device}: the compiled graph lost param {name!r}")
        with self._lock:
            old = self._legal._values[legal_id]
            self._legal._values[legal_id] = frozen
            try:
                self._exe.set_param(name, frozen)
            except NotImplementedError:
                try:
                    self._exe = _backend_compile(self._registry, self._device, self._legal, self._options)
                except Exception:
                    self._legal._values[legal_id] = old
                    raise
            except Exception:
                self._legal._values[legal_id] = old
                raise

    def __repr__(self) -> str:
        return f"<CompiledGraph {self.graph.name!r} on {self._device}>"


def _backend_compile(registry: Registry, device: str, legal: Graph,
                     options: CompileOptions | None = None) -> Executable:  # fmt: skip
    name, index = parse_device(device)
    backend = registry.get(name)
    options = replace(options or CompileOptions(), device=device, device_index=index)
    try:
        exe = backend.compile(legal, options)
    except RlxError:
        raise
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise DeviceError(f"device {device} failed to compile graph {legal.name!r}: {why}") from exc
    if not callable(getattr(exe, "run", None)):
        raise PluginError(f"backend {name!r}: compile() returned {type(exe).__name__}, not an Executable")
    return exe


def _compile_on(graph: Graph, device: str, reason: str, rows: list[DeviceCandidate],
                registry: Registry, options: CompileOptions | None = None) -> CompiledGraph:  # fmt: skip
    name = parse_device(device)[0]
    graph.freeze()
    show = fusion_report_enabled()  # a malformed RLX_FUSION_REPORT fails before any work
    t0 = time.perf_counter()
    result = pipeline_for(graph, name, registry, options)
    if result.blocker is not None:
        raise DeviceError(f"device {device!r} cannot run graph {graph.name!r}: {result.blocker}")
    # Too big for this machine: a clear error naming the size, before anything is allocated.
    check_memory(result.graph, device, result.memory_plan or plan_memory(result.graph),
                 probed=registry.availability(name).memory_bytes)
    # The compiled copy owns its graph (set_param mutates its values).
    legal = _own_copy(result.graph).freeze()
    opts = replace(options or CompileOptions(), memory_plan=result.memory_plan)
    exe = _backend_compile(registry, device, legal, opts)
    info = registry.info(name)
    report = CompileReport(
        graph=graph.name, device=device, reason=reason, label=info.backend.label or info.label,
        compile_seconds=time.perf_counter() - t0, user_nodes=len(graph), legalized_nodes=len(result.legalized.graph),
        decomposed=list(result.legalized.decomposed), candidates=rows, compiled_nodes=len(legal), fused=result.fused,
        pipeline=result.describe(),
    )  # fmt: skip
    notes = getattr(exe, "report_notes", None)  # optional: what the backend wants said (e.g. XLA times)
    if callable(notes):
        report.notes.extend(str(n) for n in notes())
    log.info("compiled graph %r on %s (%s)", graph.name, device, reason)
    if show:
        print(f"rlx: {RLX_FUSION_REPORT_HEADER}\n{report}", file=sys.stderr, flush=True)
    return CompiledGraph(graph, device, exe, legal, report, registry, opts)


def _own_copy(g: Graph) -> Graph:
    copy = Graph(g.name)
    copy._nodes = list(g._nodes)
    copy._values = dict(g._values)
    copy._inputs, copy._params, copy._outputs = list(g._inputs), list(g._params), g._outputs
    copy._names = dict(g._names)
    return copy


def compile(graph: Graph, device: str | None = "auto", policy: DevicePolicy | None = None, *,
            registry: Registry | None = None, options: CompileOptions | None = None) -> CompiledGraph:  # fmt: skip
    """Compile ``graph`` for ``device`` (``"auto"``: policy and cost ranking).

    An explicit device is strict: it runs there or raises ``DeviceError`` naming the
    blocker. ``"auto"`` tries the ranked devices in turn when one fails to compile,
    with a ``FallbackWarning`` for each (unless the policy is strict). ``options``
    switches the pipeline's stages and passes (``CompileOptions``, ``docs/pipeline.md``).
    """
    reg = registry or default_registry()
    placement = Placement(graph, policy, reg)
    chosen, reason, rows = placement.choose(device)
    explicit = device not in (None, "", "auto") or bool(placement.policy.device)
    if explicit or placement.policy.strict:
        return _compile_on(graph, chosen, reason, rows, reg, options)
    ranked = [chosen] + [r.device for r in placement.rank(rows) if r.device != parse_device(chosen)[0]]
    attempts: list[tuple[str, str]] = []
    for i, dev in enumerate(ranked):
        try:
            why = reason if i == 0 else f"fallback after {attempts[-1][0]} failed"
            cg = _compile_on(graph, dev, why, rows, reg, options)
        except CALLER_ERRORS:
            raise
        except Exception as exc:
            attempts.append((dev, f"{type(exc).__name__}: {exc}"))
            nxt = ranked[i + 1] if i + 1 < len(ranked) else None
            then = f"falling back to {nxt}" if nxt else "no device left"
            warnings.warn(f"rlx: device {dev} failed to compile graph {graph.name!r} ({exc}); {then}",
                          FallbackWarning, stacklevel=2)  # fmt: skip
            continue
        if attempts:
            cg.report().notes.append("fell back after: " + "; ".join(f"{d}: {e}" for d, e in attempts))
        return cg
    raise DeviceFallbackError(f"no device could compile graph {graph.name!r}", attempts)


class GraphDevices:
    """One graph, compiled lazily on as many devices as asked, params mirrored to all."""

    def __init__(self, graph: Graph, policy: DevicePolicy | None = None, *, registry: Registry | None = None) -> None:
        self.graph = graph.freeze()
        self._policy = policy
        self._registry = registry or default_registry()
        self._compiled: dict[str, CompiledGraph] = {}
        self._params: dict[str, np.ndarray] = {}
        self._winner: str | None = None
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
                cg = _compile_on(self.graph, dev, "explicit device (argument)", [], self._registry)
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
                times[row.device] = _time_runs(cg, arrays, runs)
            except CALLER_ERRORS:
                raise
            except Exception as exc:
                warnings.warn(f"rlx: device {row.device} failed in the benchmark ({exc}); skipping it",
                              FallbackWarning, stacklevel=2)  # fmt: skip
        return times

    def run(self, inputs: Mapping[str, Any], device: str | None = None) -> list[np.ndarray]:
        dev = device if device not in (None, "auto") else self.resolve()
        cg = self.compile(dev)
        self.last_device = cg.device
        return cg.run(inputs)

    def run_fastest(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        return self.run(inputs, self.resolve_with_inputs(inputs))

    def run_chain(self, inputs: Mapping[str, Any], chain: Iterable[str]) -> list[np.ndarray]:
        """Run on the first device of ``chain`` that succeeds (see ``run_with_fallback``)."""
        validate_inputs(input_specs(self.graph), inputs)
        return self._over_chain(list(chain), lambda cg: cg.run(inputs))[1]

    def _over_chain(self, chain: Sequence[str], action: Any) -> tuple[str, Any]:
        if not chain:
            chain = resolve_chain_default(self.graph, self.policy, self._registry)
        p = self._placement()
        strict = self.policy.strict
        attempts: list[tuple[str, str]] = []
        tried = 0
        for i, dev in enumerate(chain):
            name = parse_device(dev)[0]
            self._registry.get(name)
            row = p._row(name)
            if not row.viable:
                attempts.append((dev, f"skipped: {row.blocker}"))
                continue
            tried += 1
            try:
                out = action(self.compile(dev))
                self.last_device = dev
                return dev, out
            except CALLER_ERRORS:
                raise
            except Exception as exc:
                if strict:
                    raise DeviceError(f"device {dev} failed (RLX_STRICT: no fallback): {exc}") from exc
                attempts.append((dev, f"{type(exc).__name__}: {exc}"))
                rest = [d for d in chain[i + 1 :]]
                warnings.warn(
                    f"rlx: device {dev} failed on graph {self.graph.name!r} ({type(exc).__name__}: {exc}); "
                    + (f"falling back to {rest[0]}" if rest else "no device left in the chain"),
                    FallbackWarning, stacklevel=3,
                )  # fmt: skip
        detail = "; ".join(f"{d}: {e}" for d, e in attempts) or "the chain is empty"
        raise DeviceFallbackError(f"no device could run graph {self.graph.name!r}: {detail}", attempts)

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
        """Drop every compiled copy and the benchmark winner (params are kept)."""
        with self._lock:
            self._compiled.clear()
            self._winner = None

    def set_policy(self, policy: DevicePolicy | None) -> None:
        with self._lock:
            self._policy = policy
            self._winner = None


def resolve_chain_default(graph: Graph, policy: DevicePolicy, registry: Registry) -> list[str]:
    if policy.chain:
        return list(policy.chain)
    p = Placement(graph, policy, registry)
    return [r.device for r in p.rank(p.candidates())]


def _time_runs(cg: CompiledGraph, arrays: Mapping[str, np.ndarray], runs: int) -> float:
    cg.run(arrays)  # warm-up: first-run costs (allocation, JIT) are not the steady state
    samples = []
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        cg.run(arrays)
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def benchmark_devices(graph: Graph, devices: Sequence[str], policy: DevicePolicy,
                      registry: Registry) -> dict[str, float]:  # fmt: skip
    """Seconds per run of ``graph`` on each of ``devices``, on seeded random inputs."""
    gd = GraphDevices(graph, replace(policy, pick="cost"), registry=registry)
    arrays = random_inputs(graph, seed=0)
    times = {}
    for d in devices:
        try:
            times[d] = _time_runs(gd.compile(d), arrays, policy.benchmark_runs)
        except RlxError as exc:
            warnings.warn(f"rlx: device {d} failed in the benchmark pick ({exc}); skipping it", FallbackWarning,
                          stacklevel=3)  # fmt: skip
    return times


_SESSIONS: weakref.WeakKeyDictionary[Graph, GraphDevices] = weakref.WeakKeyDictionary()
_SESSIONS_LOCK = threading.Lock()


def run_with_fallback(graph: Graph, inputs: Mapping[str, Any], chain: Iterable[str] | None = None,
                      policy: DevicePolicy | None = None, *,
                      registry: Registry | None = None) -> tuple[str, list[np.ndarray]]:  # fmt: skip
    """Run ``graph`` on the first device of ``chain`` that succeeds: ``(device, outputs)``.

    ``chain=None`` is the policy's chain (``RLX_DEVICE_CHAIN``), else every viable device
    best first. Devices that cannot run the graph are skipped and recorded; one that fails
    emits a ``FallbackWarning`` and the next is tried; ``DeviceFallbackError`` (with
    ``.attempts``) when none succeeds. ``InputError`` and ``ConfigError`` (the caller's
    faults) are raised at once. Under a strict policy only the first viable device is
    tried. Compiled copies are cached per graph.
    """
    pol = policy if policy is not None else DevicePolicy.from_env()
    reg = registry or default_registry()
    validate_inputs(input_specs(graph), inputs)
    with _SESSIONS_LOCK:
        gd = _SESSIONS.get(graph)
        if gd is None or gd._registry is not reg:
            gd = _SESSIONS[graph] = GraphDevices(graph, pol, registry=reg)
    gd.set_policy(pol)
    devices = list(chain) if chain is not None else resolve_chain_default(graph, pol, reg)
    return gd._over_chain(devices, lambda cg: cg.run(inputs))
