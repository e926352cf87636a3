"""The contenders of one model: each a zero-argument call from host numpy inputs to a host
numpy output (what a user of a runtime gets), prepared and run once before any timing.

- ``rlx <device>``: ``rlx_core.compile(graph, device=d)`` for every available device that
  can run the graph (``available_devices() ∩ devices_for(graph)``), run with ``cg.run``;
- ``onnxruntime``: an ``InferenceSession`` on the CPU execution provider with default
  options (threads included), plus ``onnxruntime cuda`` when that provider exists;
- ``numpy``: the hand-written numpy math of ``bench/_numpy_models.py``;
- ``jax.jit``: the hand-written JAX of ``bench/_jax_models.py``, when jax imports, with
  the weights put on the device once (as a runtime holds its params) and float32
  matmuls at full float32 precision (no TF32 on GPUs).

Preparing a contender records its first-run time (session creation or compile, plus
the first call) separately from the steady state that ``bench/_timing.py`` measures.
A contender that fails to prepare becomes a ``Failure`` row, never an aborted suite.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import rlx_core as rlx

from .models import SuiteModel

log = logging.getLogger("rlx.bench")


@dataclass
class Contender:
    """A prepared contender: ``run()`` computes the model's output once."""

    name: str
    kind: str  # rlx | onnxruntime | numpy | jax
    run: Callable[[], np.ndarray]
    first_output: np.ndarray
    first_run_s: float  # setup + first call
    setup_s: float  # compile or session creation alone
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    """A contender that could not be prepared, and why (a row in the report)."""

    name: str
    kind: str
    error: str
    expected: bool = False  # an optional contender that is simply not installed here


Setup = Callable[[], tuple[Callable[[], Any], dict[str, Any]]]


def _prepare(name: str, kind: str, setup: Setup, *, optional: bool = False) -> Contender | Failure:
    """Set up and run once. With ``optional``, a missing import (scipy for the numpy
    transformer, say) makes an "unavailable" row instead of a failure."""
    try:
        t0 = time.perf_counter()
        run, info = setup()
        t1 = time.perf_counter()
        out = np.asarray(run())
        t2 = time.perf_counter()
    except Exception as exc:  # one broken contender must not abort the others
        if optional and isinstance(exc, ImportError):
            return Failure(name, kind, f"not installed ({exc})", expected=True)
        log.warning("%s failed to prepare: %s: %s", name, type(exc).__name__, exc)
        return Failure(name, kind, f"{type(exc).__name__}: {exc}")
    return Contender(name, kind, lambda: np.asarray(run()), out, t2 - t0, t1 - t0, info)


def import_graph(model: SuiteModel) -> tuple[rlx.Graph | None, float, str]:
    """``(graph, seconds, error)``: the model through ``rlx_core.onnx.load``."""
    import rlx_core.onnx

    t0 = time.perf_counter()
    try:
        graph = rlx_core.onnx.load(model.onnx, name=model.name)
    except Exception as exc:
        log.error("rlx_core.onnx.load failed on bench model %r: %s: %s", model.name, type(exc).__name__, exc)
        return None, 0.0, f"{type(exc).__name__}: {exc}"
    return graph, time.perf_counter() - t0, ""


def rlx_devices(graph: rlx.Graph, wanted: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The devices to time (available and able to run ``graph``, in the report's order),
    and why each other available device is left out."""
    available = rlx.available_devices()
    viable = set(rlx.devices_for(graph))
    skipped: dict[str, str] = {}
    chosen = []
    for cand in rlx.device_report(graph):
        if cand.device not in available or (wanted is not None and cand.device not in wanted):
            continue
        if cand.device in viable:
            chosen.append(cand.device)
        else:
            skipped[cand.device] = cand.blocker or "not viable for this graph"
    return chosen, skipped


def rlx_contender(graph: rlx.Graph, model: SuiteModel, device: str) -> Contender | Failure:
    def setup() -> tuple[Callable[[], Any], dict[str, Any]]:
        cg = rlx.compile(graph, device=device)
        feed = model.inputs
        report = cg.report()
        return (lambda: cg.run(feed)[0]), {"device": cg.device, "label": report.label,
                                           "legalized_nodes": report.legalized_nodes}

    return _prepare(f"rlx {device}", "rlx", setup)


def ort_contenders(model: SuiteModel) -> list[Contender | Failure]:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return [Failure("onnxruntime", "onnxruntime", f"not installed ({exc})")]
    providers = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        providers.append("CUDAExecutionProvider")
    found: list[Contender | Failure] = []
    for provider in providers:
        def setup(provider: str = provider) -> tuple[Callable[[], Any], dict[str, Any]]:
            sess = ort.InferenceSession(model.onnx, providers=[provider])
            feed, out = model.inputs, [model.output]
            return (lambda: sess.run(out, feed)[0]), {"provider": provider}

        name = "onnxruntime" if provider == "CPUExecutionProvider" else "onnxruntime cuda"
        found.append(_prepare(name, "onnxruntime", setup))
    return found


def numpy_contender(model: SuiteModel) -> Contender | Failure:
    fn, w, x = model.numpy_fn, model.weights, model.inputs
    return _prepare("numpy", "numpy", lambda: ((lambda: fn(w, x)), {}), optional=True)


def jax_contender(model: SuiteModel) -> Contender | Failure:
    try:
        import jax
    except ImportError as exc:
        return Failure("jax.jit", "jax", f"jax is not installed ({exc})", expected=True)

    def setup() -> tuple[Callable[[], Any], dict[str, Any]]:
        fn = model.jax_fn

        def traced(w: Any, x: Any) -> Any:
            with jax.default_matmul_precision("float32"):
                return fn(w, x)

        jitted = jax.jit(traced)
        weights = jax.device_put(model.weights)
        feed = model.inputs
        return (lambda: np.asarray(jitted(weights, feed))), {"platform": jax.default_backend()}

    return _prepare("jax.jit", "jax", setup, optional=True)


def prepare_all(model: SuiteModel, graph: rlx.Graph | None, devices: list[str], *, with_jax: bool = True,
                on_step: Callable[[str], None] | None = None) -> list[Contender | Failure]:
    """Every contender of ``model``: ORT first (the yardstick), then rlx, numpy, jax."""
    step = on_step or (lambda _name: None)
    found: list[Contender | Failure] = []
    step("onnxruntime")
    found += ort_contenders(model)
    for device in devices if graph is not None else []:
        step(f"rlx {device}")
        found.append(rlx_contender(graph, model, device))
    step("numpy")
    found.append(numpy_contender(model))
    if with_jax:
        step("jax.jit")
        found.append(jax_contender(model))
    return found
