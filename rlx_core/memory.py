"""The memory limit: a graph too big for the machine fails at compile, before allocating.

Without a check, a graph whose buffers exceed memory is discovered by the backend's
allocator: numpy refuses absurd sizes with a ``MemoryError``, but a merely large graph
really allocates and the process is killed by the OOM killer, with no message. The
compile pipeline's plan stage already knows what the graph needs (its buffers after
reuse, plus params and constants), so the core compares that with a limit first.

The limit is ``RLX_MEMORY_LIMIT`` (bytes, or with a unit: ``512M``, ``8G``, ``1.5T``;
``0`` or ``none`` turns the check off), else this host's physical memory. A backend
whose device has less memory than the host checks its own limit in ``compile``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .dtypes import itemsize
from .errors import ConfigError, DeviceError
from .ir import Graph
from .ops import OpKind
from .passes.plan import MemoryPlan

__all__ = ["ENV_MEMORY_LIMIT", "check_memory", "format_bytes", "memory_limit", "resident_bytes"]

ENV_MEMORY_LIMIT = "RLX_MEMORY_LIMIT"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


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


def memory_limit(environ: Mapping[str, str] | None = None) -> int | None:
    """Bytes a compiled graph may need, or ``None`` for no check (see the module doc)."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_MEMORY_LIMIT, "").strip()
    if not raw:
        return _physical_memory()
    if raw.lower() in ("0", "none", "off"):
        return None
    m = _SIZE.match(raw)
    if m is None:
        raise ConfigError(f"{ENV_MEMORY_LIMIT}={raw!r}: expected a size in bytes such as 8G, 512M or 1073741824")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def resident_bytes(graph: Graph) -> int:
    """Bytes of the params and constants a compiled copy keeps."""
    return sum(n.size * itemsize(n.dtype) for n in graph.nodes if n.op in (OpKind.PARAM, OpKind.CONSTANT))


def check_memory(graph: Graph, device: str, plan: MemoryPlan, environ: Mapping[str, str] | None = None) -> None:
    """``DeviceError`` naming the needed size when ``graph`` (as planned) exceeds the limit."""
    limit = memory_limit(environ)
    if limit is None:
        return
    buffers, resident = plan.total_bytes, resident_bytes(graph)
    need = buffers + resident
    if need > limit:
        source = ENV_MEMORY_LIMIT if (environ if environ is not None else os.environ).get(ENV_MEMORY_LIMIT) \
            else "this host's memory"
        raise DeviceError(
            f"graph {graph.name!r} needs {format_bytes(need)} on {device} ({format_bytes(buffers)} of buffers "
            f"after reuse, {format_bytes(resident)} of params and constants), more than the limit of "
            f"{format_bytes(limit)} ({source}); nothing was allocated"
        )
