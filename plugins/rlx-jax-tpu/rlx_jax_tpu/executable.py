"""A legalized graph as one XLA executable: traced once, compiled ahead of time, run many.

The whole graph is one ``jax.jit`` function of ``(*state, *inputs)``. ``state`` holds the
params (and large constants) as device-resident buffers, so ``set_param`` swaps one
buffer and never recompiles; small constants are baked into the program, where XLA can
fold them. Compiling is eager (``jit(f).lower(...).compile()`` on the graph's static
shapes), so the first run costs a run, not a compile, and ``lower_seconds`` and
``compile_seconds`` say what tracing and XLA cost. Compiled programs are shared through a
``ProgramCache`` keyed by the graph's signature (``caching.py``): compiling an identical
graph again, whatever its param values, traces nothing.

A run passes the caller's arrays straight to the compiled call, which places each on the
device once (an explicit ``jax.device_put`` first measured 10x slower per array on cpu);
``run`` brings outputs back through ``np.asarray`` (a read-only view of XLA's buffer where
the platform allows it, as ``np.asarray`` of any ``jax.Array``), ``run_dlpack`` leaves
them on the device as ``jax.Array`` (which implements ``__dlpack__``).

Graphs that hold float64, int64 or uint64 values are traced and run with JAX's 64-bit mode on
(``jax.enable_x64``, a thread-local switch), so those dtypes round-trip exactly; other
graphs run in JAX's default 32-bit mode, untouched.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlx_core.errors import InputError
from rlx_core.ir import Graph, Node
from rlx_core.ir.ops import OpKind
from rlx_core.plugin import CompileOptions, Executable

from .caching import (
    PROGRAMS,
    CompiledProgram,
    ProgramCache,
    enable_persistent_cache,
    graph_signature,
    persistent_cache_reason,
)
from .lowering import LOWERINGS, RuntimeCheck, runtime_checks, runtime_error

__all__ = ["JaxExecutable", "enable_persistent_cache", "x64_enabled", "INLINE_CONSTANT_LIMIT"]

#: Constants with more elements than this are passed like params (device buffers) rather
#: than baked into the XLA program, which would slow compiling and duplicate memory.
INLINE_CONSTANT_LIMIT = 1024
_WIDE_DTYPES = frozenset({"float64", "int64", "uint64"})


def x64_enabled() -> contextlib.AbstractContextManager[Any]:
    """A fresh context manager turning JAX's 64-bit mode on for this thread."""
    switch = getattr(jax, "enable_x64", None)
    if switch is not None:
        return switch(True)
    from jax.experimental import enable_x64  # JAX before 0.5

    return enable_x64()


def _trace_graph(graph: Graph, order: Sequence[Node], arg_ids: Sequence[int], program: CompiledProgram,
                 checks_out: list[RuntimeCheck]) -> Any:
    """The graph as a Python function of its arguments, for ``jax.jit`` to trace.

    Each trace counts in ``program.traces`` and leaves the run-time checks it emitted in
    ``checks_out``; when there are any, the function also returns their flags and details.
    """
    args = frozenset(arg_ids)

    def function(*values: jax.Array) -> Any:
        program.traces += 1
        env: dict[int, jax.Array] = dict(zip(arg_ids, values))
        checks: list[RuntimeCheck] = []
        for node in order:
            if node.id in env:
                continue
            if node.op is OpKind.CONSTANT:
                env[node.id] = jnp.asarray(graph.value(node.id))
                continue
            ins = [env[i] for i in node.inputs]
            env[node.id] = _lower(node, ins)
            # Only constants baked into the program may waive a check: the program is shared by
            # every graph with its signature, which covers inlined constants but not arguments.
            statics = [graph.value(i) if graph.node(i).op is OpKind.CONSTANT and i not in args else None
                       for i in node.inputs]
            checks += runtime_checks(node, ins, statics)
        checks_out[:] = checks
        outs = tuple(env[i] for i in graph.outputs)
        if not checks:
            return outs
        return outs, jnp.stack([c.flag for c in checks]), tuple(c.detail for c in checks)

    return function


class JaxExecutable(Executable):
    """One graph compiled by XLA for one JAX device. ``run`` and ``run_dlpack`` are thread-safe.

    Attributes: ``device`` (the ``jax.Device``), ``lower_seconds`` (tracing and lowering to
    StableHLO) and ``compile_seconds`` (XLA), both zero on a ``cache_hit``; ``signature``
    (the ``ProgramCache`` key); ``x64`` (64-bit mode on); ``compiled`` (the
    ``jax.stages.Compiled``; ``compiled.as_text()`` shows the optimized program);
    ``persistent_cache`` (JAX's compilation cache directory, or ``None``).
    """

    def __init__(self, graph: Graph, device: Any, *, backend: str = "jax", options: CompileOptions | None = None,
                 programs: ProgramCache | None = None) -> None:
        self.graph = graph
        self.device = device
        self.backend = backend
        self.options = options
        self.persistent_cache = enable_persistent_cache()
        nodes = graph.nodes
        live = graph.live_nodes()  # XLA would drop the rest; we do not trace it
        self.x64 = any(nodes[i].dtype in _WIDE_DTYPES for i in live)
        state_ids = [i for i in graph.params if i in live]
        big = [n.id for n in nodes if n.op is OpKind.CONSTANT and n.size > INLINE_CONSTANT_LIMIT]
        state_ids += [i for i in big if i in live]
        input_ids = [i for i in graph.inputs if i in live]
        arg_ids = state_ids + input_ids
        self._input_names = tuple(nodes[i].name for i in input_ids)
        self._param_slots = {nodes[i].name: k for k, i in enumerate(state_ids) if nodes[i].op is OpKind.PARAM}
        # Outputs that are graph inputs are copied, never aliased to the caller's array.
        self._passthrough = tuple((k, nodes[i].name) for k, i in enumerate(graph.outputs)
                                  if nodes[i].op is OpKind.INPUT)
        self._lock = threading.Lock()
        with self._mode():
            self._state = tuple(jax.device_put(np.asarray(graph.value(i)), device) for i in state_ids)
        self.signature = graph_signature(graph, live, arg_ids, device, self.x64)

        def build() -> CompiledProgram:
            return self._build(graph, [n for n in nodes if n.id in live], arg_ids, input_ids)

        self.program, self.cache_hit = (programs if programs is not None else PROGRAMS).get_or_build(
            self.signature, build)
        self.compiled = self.program.compiled
        self.lower_seconds = 0.0 if self.cache_hit else self.program.lower_seconds
        self.compile_seconds = 0.0 if self.cache_hit else self.program.compile_seconds
        self._checks = tuple(graph.node(i) for i in self.program.check_ids)
        self._call = self.compiled if not self.x64 else self._call_x64
        # The call with the state already bound: one C-level argument merge per run instead of
        # unpacking ~20 state buffers in Python (a run's Python time slows down most when XLA's
        # worker threads and other processes share the cores).
        self._bound = functools.partial(self._call, *self._state)

    def _build(self, graph: Graph, order: Sequence[Node], arg_ids: Sequence[int],
               input_ids: Sequence[int]) -> CompiledProgram:
        program = CompiledProgram(compiled=None, check_ids=(), lower_seconds=0.0, compile_seconds=0.0)
        checks: list[RuntimeCheck] = []
        function = _trace_graph(graph, order, arg_ids, program, checks)
        sharding = jax.sharding.SingleDeviceSharding(self.device)
        specs = [jax.ShapeDtypeStruct(graph.node(i).shape, np.dtype(graph.node(i).dtype), sharding=sharding)
                 for i in input_ids]
        with self._mode():
            t0 = time.perf_counter()
            lowered = jax.jit(function).lower(*self._state, *specs)
            t1 = time.perf_counter()
            program.compiled = lowered.compile()
            t2 = time.perf_counter()
        program.lower_seconds, program.compile_seconds = t1 - t0, t2 - t1
        program.check_ids = tuple(c.node.id for c in checks)
        return program

    @property
    def traces(self) -> int:
        """How often this executable's program was traced (1; a ``set_param`` adds none)."""
        return self.program.traces

    def report_notes(self) -> list[str]:
        """Lines for ``CompiledGraph.report()``: what XLA compiling cost, and the caches."""
        platform = getattr(self.device, "platform", "?")
        if self.cache_hit:
            what = "reused a compiled XLA program with the same signature (no trace, no compile)"
        else:
            what = (f"traced and lowered in {self.lower_seconds * 1e3:.1f} ms, XLA compiled in "
                    f"{self.compile_seconds * 1e3:.1f} ms")
        return [f"jax ({jax.__version__}) on {platform} {self.device}: {what}; "
                f"{'64-bit' if self.x64 else '32-bit'} mode; {persistent_cache_reason()}"]

    def _mode(self) -> contextlib.AbstractContextManager[Any]:
        return x64_enabled() if self.x64 else contextlib.nullcontext()

    def _call_x64(self, *args: Any) -> Any:
        with x64_enabled():
            return self.compiled(*args)

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        names = self._input_names
        result = self._bound(inputs[names[0]]) if len(names) == 1 else self._bound(*[inputs[n] for n in names])
        if self._checks:
            result, flags, details = result
            self._raise_if_bad(flags, details)
        outs = list(map(np.asarray, result))
        for k, name in self._passthrough:
            outs[k] = np.array(inputs[name], copy=True)
        return outs

    def run_dlpack(self, inputs: Mapping[str, Any]) -> list[jax.Array]:
        """Run and leave the outputs on the device as ``jax.Array`` (``__dlpack__``, no host copy).

        Inputs may be numpy arrays or ``jax.Array``s; one already on this device is used
        in place, one on another device is moved here first.
        """
        args = [self._on_device(inputs[name]) for name in self._input_names]
        result = self._bound(*args)
        if self._checks:
            result, flags, details = result
            self._raise_if_bad(flags, details)
        outs = list(result)
        for k, name in self._passthrough:
            outs[k] = jax.device_put(np.array(inputs[name], copy=True), self.device)
        return outs

    def _on_device(self, value: Any) -> Any:
        if isinstance(value, jax.Array) and value.devices() != {self.device}:
            return jax.device_put(value, self.device)
        return value

    def _raise_if_bad(self, flags: jax.Array, details: Sequence[jax.Array]) -> None:
        bad = np.asarray(flags)
        if not bad.any():
            return
        k = int(np.argmax(bad))
        node = self._checks[k]
        size = None
        if node.op is OpKind.GATHER:
            size = self.graph.node(node.inputs[0]).shape[node.attrs["axis"]]
        raise runtime_error(node, np.asarray(details[k]), size)

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
            self._state = tuple(state)
            # One assignment: a concurrent run calls the old bound state or the new, never half.
            self._bound = functools.partial(self._call, *self._state)

    def __repr__(self) -> str:
        how = "cached program" if self.cache_hit else f"compiled in {self.compile_seconds * 1e3:.1f} ms"
        return f"<JaxExecutable {self.graph.name!r} on {self.device} ({self.backend}), {how}>"


def _lower(node: Node, ins: Sequence[jax.Array]) -> jax.Array:
    out = LOWERINGS[node.op](node, ins)
    if tuple(out.shape) != node.shape:  # a disagreement between lowering.py and rlx_core.ir.ops
        raise AssertionError(f"rlx-jax-tpu bug: {node.describe()} ({node.op}) traced to shape {tuple(out.shape)}, "
                             f"the graph declares {node.shape}")
    if out.dtype != np.dtype(node.dtype):
        out = out.astype(node.dtype)  # float16 rules compute in float32 and round here
    return out
