"""Compile caches: XLA programs reused within a process, and JAX's own cache across processes.

Tracing and compiling a graph with XLA costs tens of milliseconds to seconds; running it,
microseconds. Two caches keep that cost off the paths users repeat:

- ``ProgramCache``, in memory: compiled programs keyed by the graph's *signature* (its
  structure, attributes, inlined constants, the shapes and dtypes of its arguments, the
  device and the 64-bit mode). Params are arguments of the program, not part of the
  signature, so compiling the same model again with other weights, recompiling after
  ``GraphDevices.invalidate_cache`` or building an identical graph elsewhere reuses the
  executable without tracing. ``PROGRAMS`` is the process-wide default; tests and
  embedders may pass their own.
- JAX's persistent compilation cache, at ``<rlx cache dir>/jax`` by
  ``enable_persistent_cache`` unless the user configured one: a new process finds the
  compiled XLA executable on disk (JAX decides what is worth writing: by default
  programs that took at least a second to compile), and runs it only once rlx has
  checked it against the keyed hash it recorded writing it (``persistent_cache.py``).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_core.errors import ConfigError
from rlx_core.ir import Graph

from .persistent_cache import enable_persistent_cache, persistent_cache_reason

__all__ = ["CompiledProgram", "ProgramCache", "PROGRAMS", "enable_persistent_cache", "persistent_cache_reason",
           "graph_signature"]


def graph_signature(graph: Graph, live: Iterable[int], arg_ids: Iterable[int], device: Any, x64: bool) -> str:
    """A digest of everything the compiled program depends on, and nothing it does not.

    In: each live node's id, op, inputs, attributes, shape and dtype; the values of the
    constants baked into the program; which nodes are arguments (params, large constants
    and inputs, by position: only their shapes and dtypes matter); the outputs; the
    device; JAX's 64-bit mode. Out: names and param values, which the program never sees.
    """
    import jax

    args = set(arg_ids)
    h = hashlib.sha256()
    for i in sorted(live):
        n = graph.node(i)
        h.update(repr((n.id, n.op.value, n.inputs, sorted(n.attrs.items()), n.shape, n.dtype)).encode())
        if n.op.value == "constant" and i not in args:
            h.update(np.ascontiguousarray(graph.value(i)).tobytes())
    h.update(repr((tuple(arg_ids), tuple(graph.outputs), device.platform, device.id, x64,
                   bool(jax.config.jax_enable_x64))).encode())
    return h.hexdigest()


@dataclass
class CompiledProgram:
    """One traced and compiled XLA program, shared by every executable with its signature.

    ``check_ids`` are the nodes whose run-time checks the program reports, in the order of
    its flag vector; ``traces`` counts how often the graph function was traced for it
    (one, unless JAX retraced, which a cache hit or a ``set_param`` must never cause).
    """

    compiled: Any
    check_ids: tuple[int, ...]
    lower_seconds: float
    compile_seconds: float
    traces: int = 0


class ProgramCache:
    """A thread-safe LRU of ``CompiledProgram`` by signature (at most ``maxsize``).

    Two threads compiling the same new signature may both build it; the first one stored
    wins and both get it, which is correct and cheaper than holding a lock over a compile.
    """

    def __init__(self, maxsize: int = 64) -> None:
        if maxsize < 1:
            raise ConfigError(f"ProgramCache maxsize must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict[str, CompiledProgram] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_build(self, key: str, build: Callable[[], CompiledProgram]) -> tuple[CompiledProgram, bool]:
        """The program for ``key`` and whether it came from the cache (else ``build()``)."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return found, True
            self.misses += 1
        program = build()
        with self._lock:
            kept = self._entries.setdefault(key, program)
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return kept, False

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


#: The process-wide default (``JaxExecutable(programs=...)`` takes another).
PROGRAMS = ProgramCache()
