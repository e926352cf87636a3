"""The memory limit: a graph too big for a device is not placed there, and fails at
compile naming the size, before anything is allocated.

Without a check, a graph whose buffers exceed memory is discovered by the backend's
allocator: numpy refuses absurd sizes with a ``MemoryError``, but a merely large graph
really allocates and the process is killed by the OOM killer, with no message; a GPU
raises out-of-memory halfway through a run. The compile pipeline's plan stage already
knows what the graph needs on each device (its buffers after reuse, plus params and
constants), so placement compares that with what the device can give: a device that
cannot hold the graph gets a *blocker* naming both sizes, and the auto pick skips it
without trying (no fallback warning for a failure that was known in advance).

What a device can give, first match wins:

1. ``RLX_MEMORY_LIMIT``: one size for every device (``8G``), per device
   (``cuda=2G,cpu=16G``, ``cuda:1=4G``), or both (``16G,cuda=2G``: the bare size is
   the default for devices not named). Sizes are bytes or take a unit (``512M``,
   ``1.5T``); ``0`` or ``none`` turns the check off (for all, or for one device).
2. What the backend's probe measured (``Availability.memory_bytes``: a GPU's free
   memory when probed).
3. This host's physical memory (devices that compute in host memory).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError, DeviceError
from ..ir import Graph
from ..ir.dtypes import itemsize
from ..ir.ops import OpKind
from ..passes.plan import MemoryPlan

__all__ = ["ENV_MEMORY_LIMIT", "MemoryNeed", "check_memory", "device_memory_limit", "fits_unplanned", "format_bytes",
           "memory_blocker", "memory_limit", "memory_need", "parse_memory_limits", "resident_bytes"]

ENV_MEMORY_LIMIT = "RLX_MEMORY_LIMIT"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_DEVICE = re.compile(r"^[A-Za-z_][\w.-]*(?::\d+)?$")
_OFF = ("0", "none", "off")


def format_bytes(n: float) -> str:
    """``1.5 GiB``: sizes in error messages, in binary units."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # not POSIX, or the host will not say
        return None


def _size(raw: str, whole: str) -> int | None:
    """Bytes of one size entry (``None``: the check is off)."""
    if raw.strip().lower() in _OFF:
        return None
    m = _SIZE.match(raw)
    if m is None:
        raise ConfigError(f"{ENV_MEMORY_LIMIT}={whole!r}: expected a size in bytes such as 8G, 512M or 1073741824, "
                          "or per device such as cuda=2G,cpu=16G")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


_UNSET = object()


def parse_memory_limits(raw: str) -> tuple[object, dict[str, int | None]]:
    """``RLX_MEMORY_LIMIT``'s text as (the default for every device, or ``_UNSET``; the
    per-device sizes). ``ConfigError`` naming the variable for anything malformed."""
    default: object = _UNSET
    per_device: dict[str, int | None] = {}
    for entry in raw.split(","):
        if not entry.strip():
            raise ConfigError(f"{ENV_MEMORY_LIMIT}={raw!r}: an empty entry")
        device, eq, size = entry.partition("=")
        if not eq:
            if default is not _UNSET:
                raise ConfigError(f"{ENV_MEMORY_LIMIT}={raw!r}: two sizes for every device")
            default = _size(entry, raw)
            continue
        device = device.strip()
        if not _DEVICE.match(device):
            raise ConfigError(f"{ENV_MEMORY_LIMIT}={raw!r}: {device!r} is not a device name")
        if device in per_device:
            raise ConfigError(f"{ENV_MEMORY_LIMIT}={raw!r}: {device!r} is given twice")
        per_device[device] = _size(size, raw)
    return default, per_device


def memory_limit(environ: Mapping[str, str] | None = None) -> int | None:
    """Bytes a compiled graph may need on the host, or ``None`` for no check: the limit
    ``RLX_MEMORY_LIMIT`` sets for every device, else this host's physical memory."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_MEMORY_LIMIT, "").strip()
    if not raw:
        return _physical_memory()
    default, _ = parse_memory_limits(raw)
    return _physical_memory() if default is _UNSET else default  # type: ignore[return-value]


def device_memory_limit(device: str, probed: int | None = None,
                        environ: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """``(bytes, where that figure comes from)`` that ``device`` can give one graph, by
    the order of the module doc; ``(None, why)`` when nothing is checked. ``probed`` is
    what the backend's probe measured (``Availability.memory_bytes``)."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_MEMORY_LIMIT, "").strip()
    if raw:
        default, per_device = parse_memory_limits(raw)
        name = device.partition(":")[0]
        for key in (device, name):
            if key in per_device:
                return per_device[key], f"{ENV_MEMORY_LIMIT} for {key}"
        if default is not _UNSET:
            return default, ENV_MEMORY_LIMIT  # type: ignore[return-value]
    if probed is not None and probed > 0:
        return probed, f"free memory of {device} when probed"
    return _physical_memory(), "this host's memory"


def resident_bytes(graph: Graph) -> int:
    """Bytes of the params and constants a compiled copy keeps."""
    return sum(n.size * itemsize(n.dtype) for n in graph.nodes if n.op in (OpKind.PARAM, OpKind.CONSTANT))


@dataclass(frozen=True)
class MemoryNeed:
    """What one compiled copy of a graph needs on its device."""

    buffers: int  # the plan's buffers, after reuse
    resident: int  # params and constants

    @property
    def total(self) -> int:
        return self.buffers + self.resident

    def parts(self) -> str:
        buffers, resident = format_bytes(self.buffers), format_bytes(self.resident)
        return f"{buffers} of buffers after reuse, {resident} of params and constants"


def memory_need(graph: Graph, plan: MemoryPlan) -> MemoryNeed:
    return MemoryNeed(plan.total_bytes, resident_bytes(graph))


def fits_unplanned(graph: Graph, device: str, probed: int | None = None,
                   environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``graph`` surely fits ``device`` without its memory plan: every value of it
    in a buffer of its own, params and constants included, takes at most half of what
    the device can give. The compile pipeline only removes values or replaces them with
    fewer (folding never makes a value larger than its inputs, fusion and CSE drop
    values), so a graph that fits this way fits as planned; the half is a margin for
    what a backend adds (scratch, packed weights). False: plan it and check exactly."""
    limit, _ = device_memory_limit(device, probed, environ)
    if limit is None:
        return True
    if any(not isinstance(n.size, int) for n in graph.nodes):  # (a symbolic graph: priced at a size)
        return False
    return 2 * sum(n.size * itemsize(n.dtype) for n in graph.nodes) <= limit


def memory_blocker(graph: Graph, device: str, plan: MemoryPlan, probed: int | None = None,
                   environ: Mapping[str, str] | None = None) -> str | None:
    """Why ``device`` cannot hold ``graph`` as planned (both sizes named), or ``None``."""
    limit, source = device_memory_limit(device, probed, environ)
    if limit is None:
        return None
    need = memory_need(graph, plan)
    if need.total <= limit:
        return None
    return (f"needs {format_bytes(need.total)} on {device} ({need.parts()}), more than the "
            f"{format_bytes(limit)} it can give ({source})")


def check_memory(graph: Graph, device: str, plan: MemoryPlan, environ: Mapping[str, str] | None = None,
                 probed: int | None = None) -> None:
    """``DeviceError`` naming the needed size when ``graph`` (as planned) exceeds the limit."""
    why = memory_blocker(graph, device, plan, probed, environ)
    if why is not None:
        raise DeviceError(f"graph {graph.name!r} {why}; nothing was allocated")
