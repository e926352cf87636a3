"""``Runtime``: one registry and one policy, and the state the core keeps for them.

rlx's module functions (``rlx.compile``, ``rlx.run_with_fallback``, ``rlx.device_report``,
``rlx.devices_for``) are what most users call; each is answered by a ``Runtime`` — the
process-wide ``default_runtime()`` (the default registry, the policy from ``RLX_*`` at
each call), or a short-lived one for an explicit ``registry=``. A program that wants its
own plugins and policy, isolated from the process's, makes its own:

    rt = rlx.Runtime(registry=my_registry, policy=rlx.DevicePolicy(deny=("cuda",)))
    cg = rt.compile(g)
    device, outs = rt.run_with_fallback(g, inputs)

What a runtime owns: the ``GraphDevices`` of every graph it ran with fallback (a
compiled copy per device, params mirrored), kept on the graph so that it dies with the
graph (a session holds its graph: a runtime holding sessions would keep every graph it
ever ran alive, as the module-level cache this replaced did). What it does not:
the lowering caches (owned by the registry whose backends they are for, ``lowering.py``)
and the probe answers and cost models (the registry's).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..backends.registry import Registry, default_registry
from ..compiler.compiled import CompiledGraph
from ..compiler.inputs import input_specs, validate_inputs
from ..ir import Graph
from ..placement.policy import DevicePolicy
from ..placement.ranking import DeviceCandidate, Placement
from ..plugin import CompileOptions
from .session import GraphDevices, compile, resolve_chain_default

__all__ = ["Runtime", "default_runtime", "run_with_fallback"]


class Runtime:
    """A registry (``None``: the process default) and a policy (``None``: ``RLX_*`` read
    at each call), with the sessions of the graphs run through it."""

    def __init__(self, registry: Registry | None = None, policy: DevicePolicy | None = None) -> None:
        self._registry = registry
        self.policy = policy
        self._lock = threading.Lock()

    @property
    def registry(self) -> Registry:
        return self._registry if self._registry is not None else default_registry()

    def policy_for(self, policy: DevicePolicy | None = None) -> DevicePolicy:
        """``policy``, else this runtime's, else ``DevicePolicy.from_env()`` now."""
        if policy is not None:
            return policy
        return self.policy if self.policy is not None else DevicePolicy.from_env()

    def placement(self, graph: Graph | None = None, policy: DevicePolicy | None = None) -> Placement:
        return Placement(graph, self.policy_for(policy), self.registry)

    def compile(self, graph: Graph, device: str | None = "auto", *, policy: DevicePolicy | None = None,
                options: CompileOptions | None = None, partition: bool | None = None,
                precision: str | None = None) -> CompiledGraph:
        """``rlx.compile`` with this runtime's registry and policy."""
        return compile(graph, device, self.policy_for(policy), registry=self.registry, options=options,
                       partition=partition, precision=precision)

    def session(self, graph: Graph, policy: DevicePolicy | None = None) -> GraphDevices:
        """The ``GraphDevices`` this runtime keeps for ``graph`` (made on first use), set to
        ``policy`` (or this runtime's)."""
        pol = self.policy_for(policy)
        reg = self.registry
        with self._lock:  # kept on the graph (its attachments): it dies with the graph, never with us
            gd = graph.attachments.get(self)
            if gd is None or gd._registry is not reg:
                gd = graph.attachments[self] = GraphDevices(graph, pol, registry=reg)
        gd.set_policy(pol)
        return gd

    def run_with_fallback(self, graph: Graph, inputs: Mapping[str, Any], chain: Iterable[str] | None = None,
                          policy: DevicePolicy | None = None) -> tuple[str, list[np.ndarray]]:
        """``rlx.run_with_fallback`` with this runtime (compiled copies kept per graph)."""
        validate_inputs(input_specs(graph), inputs)
        gd = self.session(graph, policy)
        pol = gd.policy
        devices = list(chain) if chain is not None else resolve_chain_default(graph, pol, self.registry)
        return gd._over_chain(devices, lambda cg: cg.run(inputs))

    def device_report(self, graph: Graph | None = None, policy: DevicePolicy | None = None) -> list[DeviceCandidate]:
        return self.placement(graph, policy).report()

    def devices_for(self, graph: Graph, policy: DevicePolicy | None = None) -> list[str]:
        p = self.placement(graph, policy)
        return [r.device for r in p.rank(p.candidates())]

    def __repr__(self) -> str:
        reg = "default registry" if self._registry is None else repr(self._registry)
        return f"<Runtime {reg}, policy {'from RLX_*' if self.policy is None else self.policy}>"


_default: Runtime | None = None
_default_lock = threading.Lock()


def default_runtime() -> Runtime:
    """The process-wide runtime: the default registry, the policy from ``RLX_*`` per call."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Runtime()
        return _default


def run_with_fallback(graph: Graph, inputs: Mapping[str, Any], chain: Iterable[str] | None = None,
                      policy: DevicePolicy | None = None, *,
                      registry: Registry | None = None) -> tuple[str, list[np.ndarray]]:
    """Run ``graph`` on the first device of ``chain`` that succeeds: ``(device, outputs)``.

    ``chain=None`` is the policy's chain (``RLX_DEVICE_CHAIN``), else every viable device
    best first. Devices that cannot run the graph are skipped and recorded; one that fails
    emits a ``FallbackWarning`` and the next is tried; ``DeviceFallbackError`` (with
    ``.attempts``) when none succeeds. ``InputError`` and ``ConfigError`` (the caller's
    faults) are raised at once. Under a strict policy only the first viable device is
    tried. Compiled copies are cached per graph (by the default runtime, or for an
    explicit ``registry`` by a runtime made for this call).
    """
    runtime = default_runtime() if registry is None or registry is default_registry() else Runtime(registry)
    return runtime.run_with_fallback(graph, inputs, chain, policy)
