"""A planned graph on one OpenCL device: buffers bound once, one wait per run.

At build time: the graph's kernels become one program (built once per device and
source hash), every kernel object is created once, its buffer arguments set once
(shapes are constants of the source) and its work-group size chosen once
(``launch.py``: never the driver's choice), params and constants are uploaded, and the
memory plan's slots are allocated. A run then only copies the inputs in, enqueues every
kernel (a batched enqueue costs ~4 us on PoCL, an enqueue+finish per kernel ~36 us),
copies the outputs out and waits once. Runs are serialized by a lock, since they share
the buffers; ``set_param`` uploads under the same lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_core.errors import InputError
from rlx_core.ir import Graph
from rlx_core.ir.ops import OpKind
from rlx_core.plugin import Executable

from .codegen.common import header
from .launch import device_limits, kernel_limits, local_size
from .planner import Plan, describe_plan, plan_graph
from .runtime import DeviceRuntime

__all__ = ["OpenclExecutable"]

log = logging.getLogger("rlx_opencl")


class OpenclExecutable(Executable):
    """One graph compiled for one OpenCL device. ``run`` and ``set_param`` are thread-safe.

    Attributes: ``plan`` (steps, slots), ``source`` (the program's OpenCL C),
    ``compile_seconds``, ``device_name``; ``launch_sizes`` says how each kernel is launched.
    """

    def __init__(self, graph: Graph, runtime: DeviceRuntime) -> None:
        t0 = time.perf_counter()
        cl = runtime.cl
        self.graph, self.runtime, self._cl = graph, runtime, cl
        self.device_name = runtime.entry.describe()
        self.plan: Plan = plan_graph(graph, runtime.vector_bits)
        kernels = [k for step in self.plan.steps for k in step.kernels]
        fp64 = any(k.uses_fp64 for k in kernels)
        bodies = [k.source.replace(header(True), "") for k in kernels]
        self.source = header(fp64) + "\n\n".join(bodies)
        ctx = runtime.context
        mf = cl.mem_flags
        nodes = graph.nodes
        live = self.plan.live
        self._queue = runtime.queue()
        self._lock = threading.Lock()

        self._slot_buffers = [cl.Buffer(ctx, mf.READ_WRITE, size) for size in self.plan.slots]
        self._buffers: dict[int, Any] = {}  # root node id -> buffer
        self._inputs: list[tuple[str, Any, np.dtype]] = []
        self._params: dict[str, int] = {}
        for i in sorted(live):
            node = nodes[i]
            if node.op is OpKind.INPUT:
                self._buffers[i] = cl.Buffer(ctx, mf.READ_ONLY, max(node.size * np.dtype(node.dtype).itemsize, 1))
                self._inputs.append((node.name, self._buffers[i], np.dtype(node.dtype)))
            elif node.op in (OpKind.PARAM, OpKind.CONSTANT):
                host = np.ascontiguousarray(graph.value(i))
                self._buffers[i] = cl.Buffer(ctx, mf.READ_ONLY, max(host.nbytes, 1))
                if host.nbytes:
                    cl.enqueue_copy(self._queue, self._buffers[i], host)
                if node.op is OpKind.PARAM:
                    self._params[node.name] = i
        for r, slot in self.plan.slot_of.items():
            self._buffers[r] = self._slot_buffers[slot]
        checks = self.plan.checks
        self._status = cl.Buffer(ctx, mf.READ_WRITE, 16 * len(checks)) if checks else None
        self._status_host = np.zeros(2 * len(checks), np.int64)

        program = runtime.program(self.source) if kernels else None
        limits = device_limits(cl, runtime.device)
        # (kernel object, global size, local size) per launch, in order
        self._launches: list[tuple[Any, tuple[int, ...], tuple[int, ...]]] = []
        for s, step in enumerate(self.plan.steps):
            for kernel in step.kernels:
                obj = cl.Kernel(program, kernel.name)
                obj.set_args(*(self._arg_buffer(s, a) for a in kernel.args))
                local = local_size(kernel.global_size, limits, kernel.private_bytes,
                                   kernel_limits(cl, obj, runtime.device))
                self._launches.append((obj, kernel.global_size, local))
        self._outputs = []
        for o in graph.outputs:
            node = nodes[o]
            self._outputs.append((self._buffers[self.plan.root[o]], node.shape, np.dtype(node.dtype)))
        self._queue.finish()
        self.compile_seconds = time.perf_counter() - t0
        log.debug("rlx-opencl: compiled %r on %s: %s in %.1f ms", graph.name, self.device_name,
                  describe_plan(self.plan), self.compile_seconds * 1e3)

    @property
    def launch_sizes(self) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
        """``(kernel name, global size, local size)`` of every launch of a run, in order."""
        return [(str(k.function_name), size, local) for k, size, local in self._launches]

    def _arg_buffer(self, step: int, arg: Any) -> Any:
        if arg.status:
            return self._status
        if arg.scratch is not None:
            return self._slot_buffers[self.plan.scratch_slots[(step, arg.scratch)]]
        return self._buffers[self.plan.root[arg.value]]

    # ------------------------------------------------------------------ running
    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        cl, queue = self._cl, self._queue
        hosts = [np.ascontiguousarray(inputs[name], dtype=dtype) for name, _, dtype in self._inputs]
        outs = [np.empty(shape, dtype) for _, shape, dtype in self._outputs]
        with self._lock:
            for (_, buf, _), host in zip(self._inputs, hosts):
                if host.nbytes:
                    cl.enqueue_copy(queue, buf, host, is_blocking=False)
            if self._status is not None:
                self._status_host[:] = 0
                cl.enqueue_copy(queue, self._status, self._status_host, is_blocking=False)
            for kernel, size, local in self._launches:
                cl.enqueue_nd_range_kernel(queue, kernel, size, local)
            for (buf, _, _), out in zip(self._outputs, outs):
                if out.nbytes:
                    cl.enqueue_copy(queue, out, buf, is_blocking=False)
            if self._status is not None:
                cl.enqueue_copy(queue, self._status_host, self._status, is_blocking=False)
            queue.finish()
            if self._status is not None and self._status_host.any():
                raise self._check_error(self._status_host.copy())
        return outs

    def _check_error(self, status: np.ndarray) -> InputError:
        for k, check in enumerate(self.plan.checks):
            if status[2 * k]:
                if check.kind == "div":
                    return InputError(f"{check.node.describe()} (div): integer division by zero")
                axis = check.node.attrs["axis"]
                return InputError(f"{check.node.describe()} (gather): index {int(status[2 * k + 1])} is out of range "
                                  f"for axis {axis} of size {check.size}")
        return InputError(f"graph {self.graph.name!r}: a run-time check failed")  # pragma: no cover

    def set_param(self, name: str, value: np.ndarray) -> None:
        """Upload the new value into the param's buffer; later runs use it, none recompiles."""
        node = self.graph.input_node(name)
        if node.op is not OpKind.PARAM:
            raise InputError(f"{name!r} is an input of graph {self.graph.name!r}, not a param")
        arr = np.asarray(value)
        if arr.shape != node.shape or arr.dtype != np.dtype(node.dtype):
            raise InputError(f"param {name!r}: expected {node.shape} {node.dtype}, got {arr.shape} {arr.dtype}")
        i = self._params.get(name)
        if i is None or not arr.size:
            return  # no output depends on it
        host = np.ascontiguousarray(arr)
        with self._lock:
            self._cl.enqueue_copy(self._queue, self._buffers[i], host)
            self._queue.finish()

    def __repr__(self) -> str:
        return (f"<OpenclExecutable {self.graph.name!r} on {self.device_name}: {describe_plan(self.plan)}, "
                f"compiled in {self.compile_seconds * 1e3:.1f} ms>")
