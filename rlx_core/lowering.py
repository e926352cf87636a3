"""Each graph lowered for each backend, computed once while the graph lives.

Placement asks the same questions of one graph for every backend (does it claim every
node after legalization? what will it run, and at what cost?), compile asks them again
for the device it picked, and a split asks them per segment. The answers are the
legalized graph and the compile pipeline's result per (graph, backend, options): kept
here, weakly keyed by the graph, so that each is computed once and dies with its graph.
"""

from __future__ import annotations

import threading
import weakref

from .ir import Graph
from .passes.legalize import LegalizeResult, legalize
from .passes.pipeline import PipelineResult, run_pipeline
from .plugin import CompileOptions
from .registry import Registry, default_registry

__all__ = ["legalize_for", "pipeline_for", "priced_graph"]


# Legalization per (graph, backend), reused by every question asked about the same graph.
_LEGAL_CACHE: weakref.WeakKeyDictionary[Graph, dict[tuple, LegalizeResult]] = weakref.WeakKeyDictionary()
_LEGAL_LOCK = threading.Lock()


def legalize_for(graph: Graph, backend_name: str, registry: Registry | None = None) -> LegalizeResult:
    """``graph`` legalized for a backend, cached while the graph is unchanged."""
    reg = registry or default_registry()
    backend = reg.get(backend_name)
    key = (backend_name, id(backend), len(graph), graph.outputs, graph.frozen)
    with _LEGAL_LOCK:
        hit = _LEGAL_CACHE.get(graph, {}).get(key)
    if hit is not None:
        return hit
    result = legalize(graph, backend.claims)
    with _LEGAL_LOCK:
        _LEGAL_CACHE.setdefault(graph, {})[key] = result
    return result


_PIPE_CACHE: weakref.WeakKeyDictionary[Graph, dict[tuple, PipelineResult]] = weakref.WeakKeyDictionary()


def pipeline_for(graph: Graph, backend_name: str, registry: Registry | None = None,
                 options: CompileOptions | None = None) -> PipelineResult:  # fmt: skip
    """``graph`` through the compile pipeline for a backend (legalize, optimize, fuse,
    plan), cached while the graph is unchanged; what ``compile`` hands the backend and
    what the ranking prices."""
    reg = registry or default_registry()
    backend = reg.get(backend_name)
    opts = options if options is not None else CompileOptions()
    okey = (opts.legalize, opts.optimize, opts.fuse, opts.plan, tuple(opts.disable), opts.max_fused_ops,
            opts.max_fused_inputs)  # fmt: skip
    key = (backend_name, id(backend), len(graph), graph.outputs, graph.frozen, okey)
    with _LEGAL_LOCK:
        hit = _PIPE_CACHE.get(graph, {}).get(key)
    if hit is not None:
        return hit
    if opts.legalize and graph.frozen:  # share legalization with the questions placement asks
        legal = legalize_for(graph, backend_name, reg)
        result = run_pipeline(graph, backend.claims, opts, legalized=legal)
    else:
        result = run_pipeline(graph, backend.claims, opts)
    with _LEGAL_LOCK:
        _PIPE_CACHE.setdefault(graph, {})[key] = result
    return result


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
        from .passes.fuse import fuse_elementwise

        result.priced = fuse_elementwise(result.graph, lambda node: True, 32, 8)[0]
    return result.priced
