"""Generic calibration: measure any backend through its own ``compile``, and cache it.

Every backend gets a working ``calibrate()`` for free: the core builds small probe
graphs (gemm at several sizes, a large elementwise add, chains of tiny kernels), runs
them through the backend's executable, and derives the ``CostModel`` figures from the
timings. Backends may override ``calibrate`` with device-specific measurements; either
way the result is cached as JSON keyed by the backend, its plugin version and the
library versions its probe reported, so a driver upgrade triggers recalibration.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .cache import JsonCache
from .cost import CostModel
from .errors import CacheWarning, ConfigError, DeviceError, RlxError
from .ir import Graph
from .options import CompileOptions
from .passes.legalize import DtypeGate, legalize
from .timer import first_quartile

if TYPE_CHECKING:
    from .backends.registry import Registry
    from .plugin import Backend, Executable

__all__ = ["calibrate_backend", "cached_cost_model", "calibration_identity", "progress_sink", "CALIBRATION_SCHEMA",
           "save_calibration", "SaveOutcome", "recording_saves", "check_calibration_writable"]

CALIBRATION_SCHEMA = 3  # 2: per-op cost lines; 3: shaped gemm points, region costs, first-quartile times
log = logging.getLogger(__name__)
Progress = Callable[[str, float], None]
_SINK: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("rlx_calibration_progress", default=None)
_SAVES: contextvars.ContextVar[list[SaveOutcome] | None] = contextvars.ContextVar("rlx_calibration_saves",
                                                                                  default=None)


@dataclass(frozen=True)
class SaveOutcome:
    """Where a calibration was saved (``path``), or why it was not (``error``, with the
    path it was meant for). What ``save_calibration`` returns and what a calibration
    child reports, so that a calibration nobody can use later is never silent."""

    path: str
    error: str = ""

    @property
    def saved(self) -> bool:
        return not self.error

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "error": self.error}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SaveOutcome:
        return cls(path=str(d.get("path", "")), error=str(d.get("error", "")))


@contextlib.contextmanager
def recording_saves() -> Iterator[list[SaveOutcome]]:
    """Collect the outcome of every calibration saved inside the block, in order, instead
    of warning about one that could not be written: whoever records them reports them
    (``rlx calibrate``: a line naming the path and the reason, and a non-zero exit; a
    calibration child: its result payload). Outside such a block a failed save stays a
    ``CacheWarning``, as for any cache."""
    saves: list[SaveOutcome] = []
    token = _SAVES.set(saves)
    try:
        yield saves
    finally:
        _SAVES.reset(token)


@contextlib.contextmanager
def progress_sink(progress: Progress | None) -> Iterator[None]:
    """Send the progress of every ``calibrate_backend`` call inside the block (that is
    not given its own ``progress``) to ``progress``. ``Backend.calibrate(quick)`` takes
    no callback, yet a progress bar, and the step a crashed calibration died in, need
    its steps: this carries them past the plugin's method."""
    token = _SINK.set(progress)
    try:
        yield
    finally:
        _SINK.reset(token)


def _cache() -> JsonCache:
    return JsonCache("calibration", schema=CALIBRATION_SCHEMA, what="cost models measured by rlx calibrate",
                     recompute="the default cost model is used until `rlx calibrate` measures again")


def _owner(backend: Backend) -> Registry | None:
    """The registry that holds ``backend`` (``Registry`` records itself on each backend it
    adds), or ``None`` for a backend used on its own. This module does not import the
    registry at run time (the registry imports it)."""
    ref = getattr(backend, "_rlx_registry", None)
    return ref() if callable(ref) else None


def calibration_identity(backend: Backend) -> dict[str, str]:
    """What a cached model is valid for: backend, plugin version, library/driver versions
    (as the probe of the registry holding the backend found them; none for a backend
    used on its own)."""
    module = sys.modules.get(type(backend).__module__.split(".")[0])
    owner = _owner(backend)
    try:
        versions = owner.availability(backend.name).versions if owner is not None else {}
    except Exception:
        versions = {}
    return {
        "backend": backend.name,
        "class": f"{type(backend).__module__}.{type(backend).__qualname__}",
        "plugin_version": str(getattr(module, "__version__", "unknown")),
        "versions": json.dumps(dict(versions), sort_keys=True),
    }


def save_calibration(backend: Backend, model: CostModel) -> SaveOutcome:
    """Cache ``model`` as ``backend``'s calibration on this host (a backend whose own
    ``calibrate`` adds measurements to ``calibrate_backend``'s model stores it here), and
    say where, or why not (see ``recording_saves``)."""
    cache = _cache()
    path = cache.path(backend.name)
    with warnings.catch_warnings(record=True) as caught:  # JsonCache.put warns instead of raising
        warnings.simplefilter("always", CacheWarning)
        cache.put(backend.name, calibration_identity(backend), model.to_dict())
    failures = [w for w in caught if issubclass(w.category, CacheWarning)]
    for w in caught:  # anything else said meanwhile (a probe thread's warning) is said as before
        if w not in failures:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    outcome = SaveOutcome(str(path), "; ".join(str(w.message) for w in failures))
    recorder = _SAVES.get()
    if recorder is not None:
        recorder.append(outcome)
    elif failures:
        warnings.warn(failures[0].message, CacheWarning, stacklevel=2)
    return outcome


def check_calibration_writable() -> Path:
    """The directory calibrations are saved in, after checking, before anything is
    measured, that a file can be created there (or in the nearest folder that exists,
    where it will be made): ``ConfigError`` naming the folder and the reason otherwise.
    A calibration takes minutes per device, and one that cannot be saved is lost."""
    from .cache import cache_dir

    directory = _cache().directory
    existing = directory
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is a file, not a folder")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        where = "RLX_CACHE_DIR" if os.environ.get("RLX_CACHE_DIR", "").strip() else "the user cache dir"
        raise ConfigError(f"cannot save calibrations in {directory} ({type(exc).__name__}: {exc}); nothing was "
                          f"measured: make {cache_dir()} ({where}) writable, or set RLX_CACHE_DIR to a writable "
                          "absolute path") from None
    return directory


def cached_cost_model(backend: Backend) -> CostModel | None:
    """The calibrated model cached for this backend on this host, or ``None``."""
    cache = _cache()
    entry = cache.get(backend.name, calibration_identity(backend))  # a bad entry: warned about, then removed
    if entry is None:
        return None
    try:
        return CostModel.from_dict(entry)
    except Exception as exc:  # a well-formed entry whose payload is not a model: the same, once
        cache.reject(backend.name, f"its payload is not a cost model ({type(exc).__name__}: {exc})")
        return None


def _compile(backend: Backend, g: Graph) -> Executable:
    result = legalize(g.freeze(), backend.claims, gate=DtypeGate.of(backend))
    if result.blocker is not None:
        raise DeviceError(f"cannot calibrate {backend.name}: it cannot run {g.name} ({result.blocker})")
    return backend.compile(result.graph.freeze(), CompileOptions(device=backend.name))


_SETTLE_S = 0.1  # the pause before a second look at a measurement


def _typical_time(exe: Executable, inputs: dict[str, np.ndarray], budget: float, max_runs: int = 50) -> float:
    """A run's typical time (``timer.first_quartile``: what a cost model predicts)."""
    return first_quartile(lambda: exe.run(inputs), budget, max_runs)


def _gemm_graph(m: int, k: int, n: int) -> tuple[Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    g = Graph(f"calibrate_gemm_{m}x{k}x{n}")
    a = g.input("a", (m, k))
    g.set_outputs([g.matmul(a, g.param("b", rng.standard_normal((k, n), dtype=np.float32)))])
    return g, {"a": rng.standard_normal((m, k), dtype=np.float32)}


#: Products unlike a square that inference runs all the time, each far below the square
#: rate of its flops: a dense layer on a batch of 64, one attention head's scores, a
#: convolution's im2col product (a mid layer; a first layer, with few input channels), a
#: layer on a batch of 8.
SHAPED_GEMMS: tuple[tuple[int, int, int], ...] = ((64, 1024, 128), (128, 64, 128), (32, 256, 2048), (16, 32, 4096),
                                                  (8, 512, 512))


def _chain_graph(length: int, size: int) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph(f"calibrate_chain_{length}x{size}")
    x = g.input("x", (size,))
    y = x
    for _ in range(length):
        y = g.add(y, x)
    g.set_outputs([y])
    return g, {"x": np.ones(size, np.float32)}


#: Ops whose kernels are priced by measured per-op lines (``CostModel.op_costs``): one
#: figure for all of them is off by 10x between ``add`` and ``erf`` or a reduction.
_UNARY_OPS = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu")
_BINARY_OPS = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")
_ROW_OPS = ("reduce_sum", "reduce_max", "reduce_mean", "softmax", "layer_norm")
OP_COST_OPS = _UNARY_OPS + _BINARY_OPS + _ROW_OPS
_ROW = 256  # row length of the reduction and normalization probes


def _op_graph(op: str, elements: int) -> tuple[Graph, dict[str, np.ndarray]]:
    """One ``op`` node over ``elements`` float32 values (rows of 256 for row ops)."""
    g = Graph(f"calibrate_{op}_{elements}")
    rng = np.random.default_rng(1)
    shape = (max(1, elements // _ROW), _ROW) if op in _ROW_OPS else (elements,)
    x = g.input("x", shape)
    inputs = {"x": rng.uniform(0.5, 1.5, shape).astype(np.float32)}  # valid for log, sqrt, pow
    if op in _BINARY_OPS:
        y = getattr(g, op)(x, g.input("y", shape))
        inputs["y"] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    elif op in ("reduce_sum", "reduce_max", "reduce_mean"):
        y = getattr(g, op)(x, axes=-1)
    elif op == "softmax":
        y = g.softmax(x, axis=-1)
    elif op == "layer_norm":
        y = g.layer_norm(x, g.param("s", np.ones(_ROW, np.float32)), g.param("b", np.zeros(_ROW, np.float32)))
    else:
        y = getattr(g, op)(x)
    g.set_outputs([y])
    return g, inputs


def _op_costs(backend: Backend, roundtrip: float, transfer_gbps: float, budget: float, quick: bool,
              report: Progress, at: float, span: float) -> list[tuple[str, float, float]]:
    """``(op, overhead_ns, g_elements_per_s)`` for each op of OP_COST_OPS the backend claims
    itself: the time of one small and one large single-op graph, less the round trip, and
    for a device with its own memory less the copies of the probe's operands in and out
    (a graph pays those once for its inputs and outputs, not once per kernel)."""
    claimed = backend.supported_ops()
    ops = [op for op in OP_COST_OPS if op in claimed]
    small, large = _ROW * 4, _ROW * (256 if quick else 1024)
    lines = []
    for i, op in enumerate(ops):
        report(f"kernel cost: {op}", at + span * i / max(len(ops), 1))
        try:
            g, inputs = _op_graph(op, small)
            t_small = _typical_time(_compile(backend, g), inputs, budget / 4, max_runs=500)
            g, inputs = _op_graph(op, large)
            t_large = _typical_time(_compile(backend, g), inputs, budget, max_runs=50)
        except RlxError as exc:  # declined by claims, or failed: that op is priced the generic way
            log.info("calibration: no cost line for %s on %s (%s)", op, backend.name, exc)
            continue
        overhead = max(t_small - roundtrip, 0.0)
        per_element = max(t_large - t_small, 1e-9) / (large - small)
        if transfer_gbps > 0:
            moved = 4.0 * (1 + (op in _BINARY_OPS) + (op not in _ROW_OPS[:3]))  # operands in, result out
            per_element = max(per_element - moved / (transfer_gbps * 1e9), 0.1 * per_element)
        rate = 1.0 / per_element / 1e9
        lines.append((op, overhead * 1e9, rate))
    return lines


def _chain_of(op: str, length: int, elements: int) -> tuple[Graph, dict[str, np.ndarray]]:
    """``op`` applied ``length`` times in a row over ``elements`` float32 values."""
    rng = np.random.default_rng(2)
    g = Graph(f"calibrate_{op}_chain{length}")
    x = g.input("x", (elements,))
    inputs = {"x": rng.uniform(0.5, 1.5, elements).astype(np.float32)}
    z = g.input("z", (elements,)) if op in _BINARY_OPS else None
    if z is not None:
        inputs["z"] = rng.uniform(0.5, 1.5, elements).astype(np.float32)
    y = x
    for _ in range(length):
        y = getattr(g, op)(y, z) if z is not None else getattr(g, op)(y)
    g.set_outputs([y])
    return g, inputs


def _region_costs(backend: Backend, budget: float, quick: bool, report: Progress, at: float,
                  span: float) -> list[tuple[str, float]]:
    """``(op, g_elements_per_s)`` of each claimed elementwise op as one more instruction of
    a fused region: a chain of 8 of it against a chain of 1, both compiled the way graphs
    are (the pipeline, then the backend), so the difference is what the backend pays for
    one more op inside whatever it makes of a chain (one loop, or passes over blocks)."""
    from .passes.pipeline import run_pipeline

    claimed = backend.supported_ops()
    ops = [op for op in _UNARY_OPS + _BINARY_OPS if op in claimed]
    elements = _ROW * (256 if quick else 1024)
    lines = []
    with np.errstate(all="ignore"):  # a chain of exp overflows, of log goes NaN: timing does not care
        for i, op in enumerate(ops):
            report(f"region cost: {op}", at + span * i / max(len(ops), 1))
            times = []
            try:
                for length in (1, 8):
                    g, inputs = _chain_of(op, length, elements)
                    piped = run_pipeline(g.freeze(), backend.claims, gate=DtypeGate.of(backend)).graph.freeze()
                    exe = backend.compile(piped, CompileOptions(device=backend.name))
                    times.append(_typical_time(exe, inputs, budget / 2, max_runs=30))
            except RlxError as exc:
                log.info("calibration: no region cost for %s on %s (%s)", op, backend.name, exc)
                continue
            per_element = max((times[1] - times[0]) / 7 / elements, 1e-13)
            lines.append((op, 1.0 / per_element / 1e9))
    return lines


def calibrate_backend(backend: Backend, quick: bool = False, progress: Progress | None = None) -> CostModel:
    """Measure ``backend`` on this host, cache the model, and return it."""
    report = progress or _SINK.get() or (lambda step, frac: None)
    budget = 0.05 if quick else 0.25
    shapes = [(n, n, n) for n in ((64, 256) if quick else (64, 256, 1024))]
    shapes += SHAPED_GEMMS[:2] if quick else SHAPED_GEMMS
    base = backend.cost_model()
    steps = len(shapes) + 5
    points = []
    for i, (m, k, n) in enumerate(shapes):
        report(f"sgemm {m}x{k}x{n}", i / steps)
        g, inputs = _gemm_graph(m, k, n)
        exe = _compile(backend, g)
        t = _typical_time(exe, inputs, budget / 2 if m != k else budget)
        if m == k == n and m >= 256:  # the big squares set the rate of big products: a second look
            time.sleep(_SETTLE_S)  # after a pause, kept if faster (a slow window is another process's)
            t = min(t, _typical_time(exe, inputs, budget))
        points.append((m, k, n, 2.0 * m * k * n / t / 1e9))
    best = 0.0
    for i, (m, k, n, rate) in enumerate(points):  # squares come first, smallest first
        if m == k == n:  # a bigger square product is never slower per flop: a dip is another process's doing
            best = max(best, rate)
            points[i] = (m, k, n, best)
    report("memory bandwidth", len(shapes) / steps)
    big = (1 << 20) if quick else (1 << 22)
    g, inputs = _chain_graph(1, big)
    t_bw = _typical_time(_compile(backend, g), inputs, budget, max_runs=20)
    g, inputs = _chain_graph(8, big)  # 7 more kernels, the same copies in and out
    kernel = (_typical_time(_compile(backend, g), inputs, budget, max_runs=10) - t_bw) / 7
    report("dispatch overhead", (len(shapes) + 1) / steps)
    g1, in1 = _chain_graph(1, 16)
    g32, in32 = _chain_graph(32, 16)
    t1 = _typical_time(_compile(backend, g1), in1, budget, max_runs=2000)
    t32 = _typical_time(_compile(backend, g32), in32, budget, max_runs=2000)
    dispatch = max((t32 - t1) / 31, 1e-9)
    roundtrip = max(t1 - dispatch, 0.0)
    single = max(t_bw - roundtrip - dispatch, 1e-9)
    copies = 2 * big * 4 / (base.transfer_bw_gbps * 1e9) if base.transfer_bw_gbps > 0 else 0.0
    one_add = max(single - copies, 0.1 * single)  # the one add less its copies at the default link rate
    if kernel < 0.25 * single:  # the backend fused the chain into one kernel (XLA does): time the one add
        kernel = one_add
    # An add reads two operands and writes one. The chain's difference comes out near 0
    # when a backend fuses most of it and the test above misses by noise; the one add,
    # which moves the same bytes, bounds the rate (jax: 114 vs 11 GB/s between two
    # calibrations before this bound).
    bw = 3 * big * 4 / max(kernel, one_add) / 1e9
    transfer = base.transfer_bw_gbps
    if transfer > 0:  # a device with its own memory: what is left of one add is its input and output copies
        copies = t_bw - roundtrip - dispatch - kernel
        transfer = 2 * big * 4 / copies / 1e9 if copies > 0 else transfer
    op_costs = _op_costs(backend, roundtrip, transfer, budget, quick, report, (len(shapes) + 2) / steps, 1 / steps)
    region_costs = _region_costs(backend, budget, quick, report, (len(shapes) + 3) / steps, 1 / steps)
    report("saving", (len(shapes) + 4) / steps)
    model = replace(
        base,
        sgemm_gflops=max(p[3] for p in points),
        memory_bw_gbps=bw,
        transfer_bw_gbps=transfer,
        dispatch_overhead_ns=dispatch * 1e9,
        roundtrip_overhead_ns=roundtrip * 1e9,
        calibrated=True,
        source=f"calibrated {'(quick) ' if quick else ''}{time.strftime('%Y-%m-%d %H:%M')}",
        sgemm_points=tuple(points),
        op_costs=tuple(op_costs),
        region_costs=tuple(region_costs),
    )
    save_calibration(backend, model)
    owner = _owner(backend)
    if owner is not None:  # its cached cost model is stale now
        owner.invalidate(backend.name)
    report("done", 1.0)
    return model
