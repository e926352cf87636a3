"""Each graph lowered for each backend, computed once while the graph lives.

Every question about a backend and a graph comes through here, so this is where the
backend's ``DtypeGate`` (the dtypes it declares it reads) joins its ``claims``.

Placement asks the same questions of one graph for every backend (does it claim every
node after legalization? what will it run, and at what cost?), compile asks them again
for the device it picked, and a split asks them per segment. The answers are the
legalized graph and the compile pipeline's result per (graph, backend, options): kept
in the registry whose backend gave them (``Registry.lowered``, weakly keyed by the
graph), so that each is computed once, dies with its graph, and never answers for a
backend of another registry.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..backends.registry import Registry, default_registry
from ..errors import PluginError
from ..ir import Graph
from ..options import PASS_NAMES
from ..passes.legalize import DtypeGate, LegalizeResult, legalize
from ..passes.pipeline import PipelineResult, run_pipeline
from ..plugin import CompileOptions

__all__ = ["legalize_for", "pipeline_for", "priced_graph", "with_skipped_passes"]


def _cached(reg: Registry, graph: Graph, key: tuple) -> Any:
    with reg.lowered_lock:
        return reg.lowered.get(graph, {}).get(key)


def _keep(reg: Registry, graph: Graph, key: tuple, value: Any) -> None:
    with reg.lowered_lock:
        reg.lowered.setdefault(graph, {})[key] = value


def legalize_for(graph: Graph, backend_name: str, registry: Registry | None = None) -> LegalizeResult:
    """``graph`` legalized for a backend, cached while the graph is unchanged."""
    reg = registry or default_registry()
    backend = reg.get(backend_name)
    key = ("legal", backend_name, id(backend), len(graph), graph.outputs, graph.frozen)
    hit = _cached(reg, graph, key)
    if hit is not None:
        return hit
    result = legalize(graph, backend.claims, gate=DtypeGate.of(backend))
    _keep(reg, graph, key, result)
    return result


def pipeline_for(graph: Graph, backend_name: str, registry: Registry | None = None,
                 options: CompileOptions | None = None) -> PipelineResult:
    """``graph`` through the compile pipeline for a backend (legalize, optimize, fuse,
    plan), cached while the graph is unchanged; what ``compile`` hands the backend and
    what the ranking prices."""
    reg = registry or default_registry()
    backend = reg.get(backend_name)
    opts = with_skipped_passes(backend, options if options is not None else CompileOptions())
    okey = (opts.legalize, opts.optimize, opts.fuse, opts.plan, tuple(opts.disable), opts.max_fused_ops,
            opts.max_fused_inputs)
    key = ("pipeline", backend_name, id(backend), len(graph), graph.outputs, graph.frozen, okey)
    hit = _cached(reg, graph, key)
    if hit is not None:
        return hit
    if opts.legalize and graph.frozen:  # share legalization with the questions placement asks
        legal = legalize_for(graph, backend_name, reg)
        result = run_pipeline(graph, backend.claims, opts, legalized=legal, gate=DtypeGate.of(backend))
    else:
        result = run_pipeline(graph, backend.claims, opts, gate=DtypeGate.of(backend))
    _keep(reg, graph, key, result)
    return result


def with_skipped_passes(backend: Any, opts: CompileOptions) -> CompileOptions:
    """``opts`` with the passes ``backend`` is better without (``Backend.skipped_passes``,
    optional for plugins that do not subclass ``Backend``) added to ``disable``."""
    ask = getattr(backend, "skipped_passes", None)
    name = getattr(backend, "name", type(backend).__name__)
    answer = ask() if callable(ask) else frozenset()
    try:
        skipped = None if isinstance(answer, str) else frozenset(answer)
    except TypeError:  # not a collection
        skipped = None
    if skipped is None or not all(isinstance(p, str) for p in skipped):
        raise PluginError(f"backend {name!r}: skipped_passes() must return a set of pass names, got {answer!r}")
    unknown = sorted(skipped - set(PASS_NAMES))
    if unknown:
        raise PluginError(f"backend {name!r}: skipped_passes() named unknown pass(es) {unknown}; "
                          f"known: {', '.join(PASS_NAMES)}")
    extra = tuple(sorted(skipped - set(opts.disable)))
    return dataclasses.replace(opts, disable=(*opts.disable, *extra)) if extra else opts


def priced_graph(graph: Graph, backend_name: str, registry: Registry | None = None) -> Graph:
    """The graph as ``backend_name`` will run it, for pricing: the pipeline's graph, and for
    a backend that fuses elementwise chains itself (``Backend.fuses_elementwise``, e.g.
    XLA) that graph with its chains priced as the regions the backend will make of them."""
    reg = registry or default_registry()
    result = pipeline_for(graph, backend_name, reg)
    backend = reg.get(backend_name)
    if not getattr(backend, "fuses_elementwise", False):
        return result.graph
    if result.priced is None:  # computed once per pipeline result (which is cached per graph)
        from ..passes.fuse import fuse_elementwise

        result.priced = fuse_elementwise(result.graph, lambda node: True, 32, 8)[0]
    return result.priced
