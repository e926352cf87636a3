"""A legalized graph as one XLA executable: traced once, compiled ahead of time, run many.

The whole graph is one ``jax.jit`` function of ``(*state, *inputs)``. ``state`` holds the
params (and large constants) as device-resident buffers, so ``set_param`` swaps one
buffer and never recompiles; small constants are baked into the program, where XLA can
fold them. ``compile`` lowers and compiles eagerly (``jit(f).lower(...).compile()``), so
the first run costs a run, not a compile, and ``compile_seconds`` says what compiling
cost. Inputs go straight to the compiled call, which places each on the device once (an
explicit ``jax.device_put`` first measured 10x slower per array on cpu); outputs come back
through ``np.asarray``, a view of XLA's result buffer where the platform allows it.

Graphs that hold float64 or int64 values are traced and run with JAX's 64-bit mode on
(``jax.enable_x64``, a thread-local switch), so those dtypes round-trip exactly; other
graphs run in JAX's default 32-bit mode, untouched.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlx_core.cache import cache_dir
from rlx_core.errors import CacheWarning, InputError
from rlx_core.ir import Graph, Node
from rlx_core.ops import OpKind
from rlx_core.plugin import CompileOptions, Executable

from .lowering import LOWERINGS, RuntimeCheck, runtime_checks

__all__ = ["JaxExecutable", "enable_persistent_cache", "x64_enabled"]

#: Constants with more elements than this are passed like params (device buffers) rather
#: than baked into the XLA program, which would slow compiling and duplicate memory.
INLINE_CONSTANT_LIMIT = 1024
_WIDE_DTYPES = frozenset({"float64", "int64"})

_cache_lock = threading.Lock()
_cache_state: dict[str, Any] = {}


def enable_persistent_cache() -> str | None:
    """Point JAX's persistent compilation cache at ``<rlx cache dir>/jax``, once per process.

    Left alone when the user configured one (``JAX_COMPILATION_CACHE_DIR`` or
    ``jax.config``). JAX's own thresholds decide what is written (by default, programs
    that took at least a second to compile). Returns the directory in use, or ``None``.
    """
    with _cache_lock:
        if "dir" in _cache_state:
            return _cache_state["dir"]
        current = jax.config.jax_compilation_cache_dir
        if current:
            _cache_state["dir"] = str(current)
            return _cache_state["dir"]
        path = cache_dir() / "jax"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            warnings.warn(f"rlx-jax-tpu: cannot create the JAX compilation cache {path}: {exc}; compiling without "
                          "a persistent cache", CacheWarning, stacklevel=3)  # fmt: skip
            _cache_state["dir"] = None
            return None
        jax.config.update("jax_compilation_cache_dir", str(path))
        _cache_state["dir"] = str(path)
        return _cache_state["dir"]


def x64_enabled() -> contextlib.AbstractContextManager[Any]:
    """A fresh context manager turning JAX's 64-bit mode on for this thread."""
    switch = getattr(jax, "enable_x64", None)
    if switch is not None:
        return switch(True)
    from jax.experimental import enable_x64  # JAX before 0.5

    return enable_x64()


def _live_nodes(graph: Graph) -> set[int]:
    """Ids of the nodes the outputs depend on (XLA would drop the rest; we do not trace them)."""
    nodes = graph.nodes
    live: set[int] = set()
    stack = list(graph.outputs)
    while stack:
        i = stack.pop()
        if i not in live:
            live.add(i)
            stack.extend(nodes[i].inputs)
    return live


class JaxExecutable(Executable):
    """One graph compiled by XLA for one JAX device. ``run`` is thread-safe.

    Attributes: ``device`` (the ``jax.Device``), ``compile_seconds`` (XLA compile time),
    ``lower_seconds`` (tracing and lowering to StableHLO), ``x64`` (64-bit mode on),
    ``compiled`` (the ``jax.stages.Compiled``; ``compiled.as_text()`` shows the program).
    """

    def __init__(self, graph: Graph, device: Any, *, backend: str = "jax",
                 options: CompileOptions | None = None) -> None:  # fmt: skip
        self.graph = graph
        self.device = device
        self.backend = backend
        self.options = options
        nodes = graph.nodes
        live = _live_nodes(graph)
        self.x64 = any(nodes[i].dtype in _WIDE_DTYPES for i in live)
        state_ids = [i for i in graph.params if i in live]
        big = [n.id for n in nodes if n.op is OpKind.CONSTANT and n.size > INLINE_CONSTANT_LIMIT]
        state_ids += [i for i in big if i in live]
        input_ids = [i for i in graph.inputs if i in live]
        self._input_names = tuple(nodes[i].name for i in input_ids)
        self._param_slots = {nodes[i].name: k for k, i in enumerate(state_ids) if nodes[i].op is OpKind.PARAM}
        # Outputs that are graph inputs are copied on the host, never aliased to the caller's array.
        self._passthrough = {k: nodes[i].name for k, i in enumerate(graph.outputs) if nodes[i].op is OpKind.INPUT}
        self._checks: list[RuntimeCheck] = []
        self._lock = threading.Lock()
        arg_ids = state_ids + input_ids
        order = [n for n in nodes if n.id in live]

        def program(*args: jax.Array) -> Any:
            env: dict[int, jax.Array] = dict(zip(arg_ids, args))
            checks: list[RuntimeCheck] = []
            for node in order:
                if node.id in env:
                    continue
                if node.op is OpKind.CONSTANT:
                    env[node.id] = jnp.asarray(graph.value(node.id))
                    continue
                ins = [env[i] for i in node.inputs]
                env[node.id] = _lower(node, ins)
                statics = [graph.value(i) if nodes[i].op is OpKind.CONSTANT else None for i in node.inputs]
                checks += runtime_checks(node, ins, statics)
            self._checks = checks
            outs = tuple(env[i] for i in graph.outputs)
            if not checks:
                return outs
            return outs, jnp.stack([c.flag for c in checks]), tuple(c.detail for c in checks)

        sharding = jax.sharding.SingleDeviceSharding(device)
        with self._mode():
            self._state = tuple(jax.device_put(np.asarray(graph.value(i)), device) for i in state_ids)
            specs = [jax.ShapeDtypeStruct(nodes[i].shape, np.dtype(nodes[i].dtype), sharding=sharding)
                     for i in input_ids]  # fmt: skip
            t0 = time.perf_counter()
            lowered = jax.jit(program).lower(*self._state, *specs)
            t1 = time.perf_counter()
            self.compiled = lowered.compile()
            t2 = time.perf_counter()
        self.lower_seconds = t1 - t0
        self.compile_seconds = t2 - t1

    def _mode(self) -> contextlib.AbstractContextManager[Any]:
        return x64_enabled() if self.x64 else contextlib.nullcontext()

    def run_on_device(self, inputs: Mapping[str, np.ndarray]) -> list[jax.Array]:
        """Run and leave the outputs on the device as ``jax.Array`` (no copy to the host)."""
        args = [inputs[name] for name in self._input_names]
        with self._mode():
            result = self.compiled(*self._state, *args)
        if self._checks:
            result, flags, details = result
            self._raise_if_bad(flags, details)
        return list(result)

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        args = [inputs[name] for name in self._input_names]
        with self._mode():
            result = self.compiled(*self._state, *args)
            if self._checks:
                result, flags, details = result
                self._raise_if_bad(flags, details)
            outs = [np.asarray(r) for r in result]
        for k, name in self._passthrough.items():
            outs[k] = np.array(inputs[name], copy=True)
        return outs

    def _raise_if_bad(self, flags: jax.Array, details: Sequence[jax.Array]) -> None:
        bad = np.asarray(flags)
        if not bad.any():
            return
        k = int(np.argmax(bad))
        check = self._checks[k]
        size = None
        if check.node.op is OpKind.GATHER:
            size = self.graph.node(check.node.inputs[0]).shape[check.node.attrs["axis"]]
        raise check.error(np.asarray(details[k]), size)

    def set_param(self, name: str, value: np.ndarray) -> None:
        """Swap the param's device buffer; later runs use it, none recompiles."""
        node = self.graph.input_node(name)
        if node.op is not OpKind.PARAM:
            raise InputError(f"{name!r} is an input of graph {self.graph.name!r}, not a param")
        arr = np.asarray(value)
        if arr.shape != node.shape or arr.dtype != np.dtype(node.dtype):
            raise InputError(f"param {name!r}: expected {node.shape} {node.dtype}, got {arr.shape} {arr.dtype}")
        slot = self._param_slots.get(name)
        if slot is None:
            return  # no output depends on it
        if arr.flags.writeable:
            arr = arr.copy()  # JAX may alias host memory on cpu; the caller may reuse theirs
        with self._mode():
            buffer = jax.device_put(arr, self.device)
        with self._lock:
            state = list(self._state)
            state[slot] = buffer
            self._state = tuple(state)  # one assignment: a concurrent run sees old or new, never half

    def __repr__(self) -> str:
        return (f"<JaxExecutable {self.graph.name!r} on {self.device} ({self.backend}), "
                f"compiled in {self.compile_seconds * 1e3:.1f} ms>")  # fmt: skip


def _lower(node: Node, ins: Sequence[jax.Array]) -> jax.Array:
    out = LOWERINGS[node.op](node, ins)
    if tuple(out.shape) != node.shape:  # a disagreement between lowering.py and rlx_core.ops
        raise AssertionError(f"rlx-jax-tpu bug: {node.describe()} ({node.op}) traced to shape {tuple(out.shape)}, "
                             f"the graph declares {node.shape}")  # fmt: skip
    if out.dtype != np.dtype(node.dtype):
        out = out.astype(node.dtype)  # float16 rules compute in float32 and round here
    return out
