"""rlx-core: graph IR, compile pipeline, device policy, cost ranking and plugin registry.

``import rlx_core`` is cheap: it loads no plugin, probes no device and imports none of
cupy, jax, pyopencl, onnx or ray. Backends are discovered and probed on first use.
"""

from __future__ import annotations

from . import _moved, errors, reference
from ._version import __version__ as __version__
from .backends.registry import Registry, broken_plugins, default_registry, get_backend
from .cost import CostModel, estimate_graph_cost
from .errors import (
    CacheWarning,
    ConfigError,
    DeviceError,
    DeviceFallbackError,
    FallbackWarning,
    GraphError,
    InputError,
    ModelError,
    PluginError,
    PluginWarning,
    RlxError,
    RlxWarning,
)
from .ir import Graph, Node, Value, ops
from .ir.ops import OpKind
from .ir.symbolic import Sym
from .placement.policy import DevicePolicy
from .placement.ranking import (
    DeviceCandidate,
    available_devices,
    device_report,
    devices_for,
    fastest_device_for,
    resolve_device,
    resolve_device_chain,
)
from .plugin import (
    PLUGIN_API_VERSION,
    Availability,
    Backend,
    CompileOptions,
    Executable,
    hookimpl,
)
from .run.runtime import Runtime, default_runtime, run_with_fallback
from .run.session import CompiledGraph, CompileReport, GraphDevices, compile

_moved.install()


def __getattr__(name: str) -> object:
    # ``rlx_core.testing`` needs hypothesis; load it only when someone asks for it.
    import importlib

    if name == "testing":
        return importlib.import_module(".testing", __name__)
    moved = _moved.MOVED.get(f"{__name__}.{name}")
    if moved is not None:  # ``rlx_core.dtypes`` and the like, from before the packages (issue 32)
        return importlib.import_module(moved)
    raise AttributeError(f"module 'rlx_core' has no attribute {name!r}")

__all__ = [
    "PLUGIN_API_VERSION",
    "Availability",
    "Backend",
    "CacheWarning",
    "CompileOptions",
    "CompileReport",
    "CompiledGraph",
    "ConfigError",
    "CostModel",
    "DeviceCandidate",
    "DeviceError",
    "DeviceFallbackError",
    "DevicePolicy",
    "Executable",
    "FallbackWarning",
    "Graph",
    "GraphDevices",
    "GraphError",
    "InputError",
    "ModelError",
    "Node",
    "OpKind",
    "PluginError",
    "PluginWarning",
    "Registry",
    "RlxError",
    "Runtime",
    "Sym",
    "RlxWarning",
    "Value",
    "available_devices",
    "broken_plugins",
    "compile",
    "default_registry",
    "default_runtime",
    "device_report",
    "devices_for",
    "errors",
    "estimate_graph_cost",
    "fastest_device_for",
    "get_backend",
    "hookimpl",
    "ops",
    "reference",
    "resolve_device",
    "resolve_device_chain",
    "run_with_fallback",
    "testing",
]
