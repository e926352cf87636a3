"""One graph compiled for one device: ``CompiledGraph``, its ``CompileReport``, and the
single path from a graph to a backend's executable (``compile_on``).

A ``CompiledGraph`` validates inputs before any work, runs the backend's executable, and
checks what comes back, so that a backend's mistake surfaces as an error naming the
backend instead of a wrong answer. ``session.py`` decides *where* to compile (auto,
fallback, several devices); this module only compiles where it is told.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backends.registry import Registry, parse_device
from ..errors import ConfigError, DeviceError, InputError, PluginError, RlxError
from ..ir import Graph
from ..passes.pipeline import fusion_report_enabled
from ..passes.plan import plan_memory
from ..plugin import CompileOptions, Executable
from .inputs import check_param_value, input_specs, validate_inputs
from .lowering import pipeline_for
from .memory import check_memory

if TYPE_CHECKING:
    from ..placement.ranking import DeviceCandidate

__all__ = ["CompiledGraph", "CompileReport", "backend_compile", "compile_on"]

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
    partition: Any = None  # a graph split across devices: its partition.PartitionPlan
    measurement: Any = None  # an unsure pick settled by timing the candidates: its measured.Verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph, "device": self.device, "reason": self.reason, "label": self.label,
            "compile_seconds": self.compile_seconds, "user_nodes": self.user_nodes,
            "legalized_nodes": self.legalized_nodes, "decomposed": list(self.decomposed),
            "candidates": [{"device": c.device, "viable": c.viable, "blocker": c.blocker,
                            "est_seconds": c.est_seconds, "model_seconds": c.model_seconds,
                            "correction": None if c.correction is None else
                            {"factor": c.correction.factor, "measurements": c.correction.measurements}}
                           for c in self.candidates],
            "measurement": self.measurement.to_dict() if self.measurement is not None else None,
            "notes": list(self.notes), "compiled_nodes": self.compiled_nodes, "fused": list(self.fused),
            "pipeline": list(self.pipeline),
            "partition": self.partition.to_dict() if self.partition is not None else None,
        }

    def __str__(self) -> str:
        lines = [
            f"graph {self.graph!r} on {self.device}" + (f" ({self.label})" if self.label else ""),
            f"  why: {self.reason}",
            f"  compile: {self.compile_seconds * 1e3:.2f} ms, "
            f"{self.user_nodes} nodes -> {self.legalized_nodes} after legalization",
        ]
        if self.decomposed:
            lines.append("  legalized (composites decomposed because the device does not claim them):")
            lines += [f"    {d}" for d in self.decomposed]
        if self.measurement is not None:
            ranked = sorted(self.measurement.seconds.items(), key=lambda kv: kv[1])
            times = ", ".join(f"{d} {s * 1e6:.1f} µs" for d, s in ranked)
            source = "from the cache" if self.measurement.from_cache else "measured now"
            lines.append(f"  measured: {times} ({source}, by {self.measurement.where})")
        here = {parse_device(d)[0] for d in self.device.split("+")}
        for c in self.candidates:
            note = c.estimate_note() if c.viable else None
            if c.device in here:
                if note:
                    lines.append(f"  {note}")
                continue
            est = f", est {c.est_seconds * 1e6:.1f} µs" if c.est_seconds is not None else ""
            est += f" ({note.partition(': ')[2]})" if note else ""
            lines.append(f"  {c.device}: {'viable' + est if c.viable else 'not used: ' + str(c.blocker)}")
        if self.partition is not None:
            lines += [f"  {line}" for line in self.partition.describe()[1:]]
        if self.pipeline:
            lines.append(f"  pipeline ({self.compiled_nodes} nodes compiled):")
            lines += [f"    {p}" for p in self.pipeline]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class CompiledGraph:
    """One graph compiled for one device. Thread-safe ``run``."""

    def __init__(self, graph: Graph, device: str, executable: Executable, legal: Graph, report: CompileReport,
                 registry: Registry, options: CompileOptions | None = None, *, absorbed: frozenset[str] = frozenset(),
                 source: Graph | None = None) -> None:
        self.graph = graph
        # Params a pass of the pipeline took the value of (``absorbed_params``), and the
        # static graph to compile again from when one of them is replaced (None: cannot).
        self._absorbed, self._source = absorbed, source
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

    @property
    def can_compile_again(self) -> bool:
        """Whether this copy holds the static graph it was compiled from (``set_param`` of
        an absorbed param compiles that again); not a class made from a graph lowered once."""
        return self._source is not None

    @property
    def absorbed_params(self) -> frozenset[str]:
        """The params the compile pipeline took the value of (a scalar the attention fusion
        read, say): the compiled code no longer reads them, so ``set_param`` of one compiles
        the graph again with the new value instead of handing it to the executable."""
        return self._absorbed

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
        outs = self._execute(self._exe.run if run_dlpack is None else run_dlpack, arrays)
        return self._check_outputs(outs) if run_dlpack is None else self._check_device_outputs(outs)

    def _execute(self, run: Any, arrays: Any) -> Any:
        """``run(arrays)``, the executable's: a plugin's failure is a ``DeviceError`` naming
        the device and the graph (rlx's own errors pass as they are)."""
        try:
            return run(arrays)
        except RlxError:
            raise
        except (Exception, SystemExit) as exc:  # a plugin's sys.exit() must not end the host
            raise DeviceError(
                f"device {self._device} failed running graph {self.graph.name!r}: {type(exc).__name__}: {exc}"
            ) from exc

    def _check_device_outputs(self, outs: Any) -> list[Any]:
        """``_check_outputs`` for ``run_dlpack``: count, shape and dtype, without a copy to host."""
        checks = self._out_checks
        if not isinstance(outs, (list, tuple)) or len(outs) != len(checks):
            n = len(outs) if isinstance(outs, (list, tuple)) else type(outs).__name__
            raise PluginError(f"backend {self.backend!r} run_dlpack returned {n} outputs for graph "
                              f"{self.graph.name!r}, which has {len(checks)}")
        for i, (out, (shape, dtype)) in enumerate(zip(outs, checks)):
            if not hasattr(out, "__dlpack__"):
                raise PluginError(f"backend {self.backend!r} run_dlpack returned a {type(out).__name__} for "
                                  f"output {i}, which has no __dlpack__")
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
                              f"which has {len(checks)}")
        result = []
        for i, (out, (shape, dtype)) in enumerate(zip(outs, checks)):
            if type(out) is not np.ndarray:
                try:
                    out = np.asarray(out)
                except Exception:
                    raise PluginError(f"backend {self.backend!r} returned a {type(out).__name__} for output {i}, "
                                      "not an array") from None
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
        if name in self._absorbed:
            with self._lock:
                self._compile_again(name, frozen)
            return
        legal_id = next((i for i in self._legal.params if self._legal.node(i).name == name), None)
        if legal_id is None:  # the pipeline keeps every param; a backend's rewrite might not
            raise PluginError(f"device {self._device}: the compiled graph lost param {name!r}")
        with self._lock:
            old = self._legal.replace_value(legal_id, frozen)
            try:
                self._exe.set_param(name, frozen)
            except NotImplementedError:
                try:
                    self._exe = backend_compile(self._registry, self._device, self._legal, self._options)
                except Exception:
                    self._legal.replace_value(legal_id, old)
                    raise
            except Exception:
                self._legal.replace_value(legal_id, old)
                raise

    def _compile_again(self, name: str, frozen: np.ndarray) -> None:
        """Compile the source graph again with ``name`` set to ``frozen`` and every other
        param as this copy holds it now; swap in the result (nothing changes on failure)."""
        if self._source is None:
            raise InputError(f"graph {self.graph.name!r} on {self._device}: param {name!r} was folded into the "
                             "compiled code (absorbed by the compile pipeline) and this copy cannot be compiled "
                             "again on its own; compile the graph again with the new value")
        current = {self._legal.node(i).name: self._legal.value(i) for i in self._legal.params}
        current[name] = frozen
        source = self._source.copy()
        for i in source.params:
            value = current.get(source.node(i).name)
            if value is not None:
                source.replace_value(i, value)
        fresh = compile_on(source, self._device, self._report.reason, [], self._registry, self._options)
        self._exe, self._legal, self._absorbed, self._source = fresh._exe, fresh._legal, fresh._absorbed, source
        self._report.notes.append(f"compiled again at {time.strftime('%H:%M:%S')}: set_param of {name!r}, a "
                                  "param the pipeline had folded into the compiled code")
        log.info("graph %r on %s: compiled again for a new value of %r (a param folded into the compiled code)",
                 self.graph.name, self._device, name)

    def __repr__(self) -> str:
        return f"<CompiledGraph {self.graph.name!r} on {self._device}>"


def backend_compile(registry: Registry, device: str, legal: Graph,
                     options: CompileOptions | None = None) -> Executable:
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


def declared_precisions(backend: Any) -> frozenset[str]:
    """``backend.precisions()`` (optional for plugins that do not subclass ``Backend``);
    a plugin whose answer fails is taken at float32, logged: precision is a permission."""
    ask = getattr(backend, "precisions", None)
    if not callable(ask):
        return frozenset()
    try:
        return frozenset(str(p) for p in ask())
    except Exception as exc:  # a plugin's fault: float32, which is always correct
        log.warning("backend %r: precisions() failed (%s: %s); computing in float32",
                    getattr(backend, "name", "?"), type(exc).__name__, exc)
        return frozenset()


def precision_note(backend: Any, device: str, precision: str) -> str:
    """The report's line on a reduced ``precision`` the user allowed: whether ``device``
    takes it (the backend's own notes say which nodes)."""
    if precision in declared_precisions(backend):
        return (f"precision {precision} allowed: {device} declares {precision} on this host and may compute float32 "
                f"products with {precision} operands (its own notes say which)")
    return (f"precision {precision} allowed, but {device} does not compute in {precision} on this host: "
            "float32 throughout")


def compile_on(graph: Graph, device: str, reason: str, rows: list[DeviceCandidate],
                registry: Registry, options: CompileOptions | None = None) -> CompiledGraph:
    name = parse_device(device)[0]
    graph.freeze()
    show = fusion_report_enabled()  # a malformed RLX_FUSION_REPORT fails before any work
    t0 = time.perf_counter()
    result = pipeline_for(graph, name, registry, options)
    if result.blocker is not None:
        raise DeviceError(f"device {device!r} cannot run graph {graph.name!r}: {result.blocker}")
    # The compiled copy owns its graph (set_param mutates its values).
    return compile_lowered(graph, result.graph.copy(), result, device, reason, rows, registry, options,
                           result.memory_plan, t0, show, user_nodes=len(graph),
                           source=None if graph.is_symbolic else graph)


def compile_lowered(graph: Graph, legal: Graph, result: Any, device: str, reason: str, rows: list[DeviceCandidate],
                    registry: Registry, options: CompileOptions | None, plan: Any, t0: float, show: bool, *,
                    user_nodes: int, source: Graph | None = None) -> CompiledGraph:
    """The end of every compile: ``legal`` (the pipeline's ``result``, a graph the compiled
    copy owns) checked against the memory there is, frozen, compiled by the backend, and
    reported (``user_nodes`` nodes before the pipeline; ``plan`` the memory plan handed on;
    ``source`` the static graph ``set_param`` of an absorbed param compiles again from).
    ``compile_on`` and the classes of a graph lowered once (``lowered_once.py``) share it."""
    name = parse_device(device)[0]
    # Too big for this machine: a clear error naming the size, before anything is allocated.
    check_memory(legal, device, plan or plan_memory(legal), probed=registry.availability(name).memory_bytes)
    legal.freeze()
    opts = replace(options or CompileOptions(), memory_plan=plan)
    exe = backend_compile(registry, device, legal, opts)
    info = registry.info(name)
    report = CompileReport(
        graph=graph.name, device=device, reason=reason, label=info.backend.label or info.label,
        compile_seconds=time.perf_counter() - t0, user_nodes=user_nodes,
        legalized_nodes=len(result.legalized.graph), decomposed=list(result.legalized.decomposed), candidates=rows,
        compiled_nodes=len(legal), fused=result.fused, pipeline=result.describe(),
    )
    if opts.precision != "fp32":
        report.notes.append(precision_note(info.backend, device, opts.precision))
    notes = getattr(exe, "report_notes", None)  # optional: what the backend wants said (e.g. XLA times)
    if callable(notes):
        report.notes.extend(str(n) for n in notes())
    log.info("compiled graph %r on %s (%s)", graph.name, device, reason)
    if show:
        print(f"rlx: {RLX_FUSION_REPORT_HEADER}\n{report}", file=sys.stderr, flush=True)
    return CompiledGraph(graph, device, exe, legal, report, registry, opts,
                         absorbed=getattr(result, "folded_params", frozenset()), source=source)

