"""The compiled graph on one GPU: buffers, resident params, one stream, CUDA graph replay.

At compile, every value gets its device buffer (from the core's memory plan when it
offers one, so dead values share memory; from CuPy's memory pool), params and constants
are uploaded once, inputs and outputs get pinned host staging buffers, and each node
becomes a few ``Step`` calls bound to those buffers (``kernels.py``). A warm-up run on
zeros compiles every kernel before the first real run.

A run uploads the inputs on the executable's own stream, runs the steps, and copies the
outputs back through pinned memory. When every step is allocation-free the second run
captures the steps as a CUDA graph and later runs replay it (one launch instead of one
per kernel); any failure to capture falls back to plain launches, said in the report.
Runs hold a lock: buffers are the executable's, and the GPU runs them in order anyway.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

import rlx_core
from rlx_core.errors import ConfigError, InputError
from rlx_core.ir import Graph
from rlx_core.ir.ops import SOURCE_OPS, OpKind

from .kernels import BuildContext, KernelCache, Step, build_steps

__all__ = ["CudaExecutable", "parse_extra", "conv_note"]

log = logging.getLogger("rlx_cuda")

#: For the graphs-or-not choice: a device-to-device copy's rate (a conservative HBM
#: figure) and what one launch from Python costs; a replay saves the latter per step.
COPY_BYTES_PER_S = 1.5e12
LAUNCH_SECONDS = 10e-6
_FLAG_MESSAGES = {1: "integer division by zero", 2: "a gather index is out of range"}


def _allocation_refused(size: int) -> Any:
    raise RuntimeError(f"a step allocated {size} bytes of device memory during CUDA graph capture")


def parse_extra(extra: Mapping[str, Any]) -> dict[str, Any]:
    """``CompileOptions.extra`` for this backend: ``tf32`` (bool, default False),
    ``cuda_graphs`` (``"auto"``, True or False; default ``"auto"``), ``warmup`` (bool,
    default True). Unknown ``cuda_*`` keys and wrong types are a ``ConfigError``."""
    out: dict[str, Any] = {"tf32": False, "cuda_graphs": "auto", "warmup": True}
    for key in ("tf32", "warmup"):
        if key in extra:
            if not isinstance(extra[key], bool):
                raise ConfigError(f"CompileOptions.extra[{key!r}] must be True or False, got {extra[key]!r}")
            out[key] = extra[key]
    if "cuda_graphs" in extra:
        v = extra["cuda_graphs"]
        if v not in ("auto", True, False) or (isinstance(v, int) and not isinstance(v, bool)):
            raise ConfigError(f"CompileOptions.extra['cuda_graphs'] must be 'auto', True or False, got {v!r}")
        out["cuda_graphs"] = v
    unknown = sorted(k for k in extra if str(k).startswith("cuda_") and k not in out)
    if unknown:
        raise ConfigError(f"CompileOptions.extra: unknown rlx-cuda option(s) {unknown}; known: tf32, cuda_graphs, "
                          "warmup")
    return out


class CudaExecutable(rlx_core.Executable):
    """One graph on one CUDA device. ``run``, ``run_dlpack`` and ``set_param`` are thread-safe."""

    #: The core passes CuPy arrays and torch/JAX CUDA tensors through as they are (checked by
    #: shape and dtype); ``_device_array`` views them without a copy.
    accepts_device_inputs = True

    def __init__(self, cp: Any, graph: Graph, device_index: int, cache: KernelCache,
                 extra: Mapping[str, Any] | None = None, memory_plan: Any = None) -> None:
        opts = parse_extra(extra or {})
        self._cp = cp
        self._cache = cache
        self._graph = graph
        self._index = device_index
        self._lock = threading.Lock()
        self._notes: list[str] = []
        self._graph_exec: Any = None
        self._runs = 0
        self._tf32 = opts["tf32"]
        if self._tf32:
            self._notes.append("TF32 tensor cores for float32 matmul/conv/attention (opted in with extra['tf32']): "
                               "results differ from float32 by about 1e-3 relative")
        with cp.cuda.Device(device_index):
            self._stream = cp.cuda.Stream(non_blocking=True)
            with self._stream:
                self._build(memory_plan)
                self._use_graphs = self._graph_mode(opts["cuda_graphs"])
                if opts["warmup"]:
                    self._warmup()
                    if self._use_graphs:  # capture now, so that the report says what runs
                        self._capture()
                elif self._use_graphs:
                    self._notes.append("CUDA graphs on: the first run compiles the kernels, the second captures "
                                       "them, later runs replay them")

    # ------------------------------------------------------------------ building
    def _build(self, plan: Any) -> None:
        cp, g = self._cp, self._graph
        nodes = g.nodes
        slots: list[Any] = [None] * len(nodes)
        buffers: dict[int, Any] = {}
        if plan is not None and getattr(plan, "buffer_of", None):
            buffers = {k: cp.empty(max(int(b), 1), dtype=np.uint8) for k, b in enumerate(plan.buffer_bytes)}
        self._params: dict[str, Any] = {}
        self._inputs: list[tuple[str, int, Any]] = []  # (name, slot, pinned host staging)
        ctx = BuildContext(cp, self._cache, tf32=self._tf32, stream_ptr=self._stream.ptr, device=self._index,
                           cc_major=int(cp.cuda.Device(self._index).compute_capability) // 10)
        steps: list[Step] = []
        prologue: list[Step] = []  # nodes computed from params and constants only
        static: set[int] = set()
        views: list[tuple[int, int, tuple[int, ...]]] = []
        for node in nodes:
            dtype = np.dtype(node.dtype)
            if node.op in SOURCE_OPS:
                if node.op is OpKind.INPUT:
                    slots[node.id] = cp.empty(node.shape, dtype=dtype)
                    self._inputs.append((node.name, node.id, _pinned(cp, node.shape, dtype)))
                else:
                    slots[node.id] = cp.asarray(np.asarray(g.value(node.id), order="C"))
                    if node.op is OpKind.PARAM:
                        self._params[node.name] = slots[node.id]
                    static.add(node.id)
                continue
            is_static = all(i in static for i in node.inputs)
            if is_static:
                static.add(node.id)
            if node.op is OpKind.RESHAPE:
                views.append((node.id, node.inputs[0], node.shape))
                slots[node.id] = slots[node.inputs[0]].reshape(node.shape)
                continue
            # A value of params only (a transposed weight, a cast table) is computed at
            # build and after set_param, in its own buffer, never once per run.
            slots[node.id] = self._value_buffer(node.id, node.shape, dtype, None if is_static else plan, buffers)
            ins = [nodes[i] for i in node.inputs]
            (prologue if is_static else steps).extend(build_steps(node, ins, node.id, list(node.inputs), ctx))
        ctx.finish()
        if ctx.conv_paths:
            self._notes.append(conv_note(ctx.conv_paths))
        ctx.flags = cp.zeros(max(len(ctx.flag_nodes), 1), dtype=np.int32)
        self._flag_nodes = list(ctx.flag_nodes)
        self._ctx = ctx
        if self._flag_nodes:
            flags = ctx.flags
            steps.insert(0, Step("reset error flags", lambda s: flags.fill(0)))
        self._views = views
        self._steps = steps
        self._prologue = prologue
        self._slots = slots
        self._outputs = [(i, _pinned(cp, nodes[i].shape, np.dtype(nodes[i].dtype))) for i in g.outputs]
        # Outputs a step writes (not inputs, params or views): run_dlpack can hand each
        # run a new buffer instead of copying out of the executable's own.
        self._fresh_outputs = sorted({i for i in g.outputs if nodes[i].op not in SOURCE_OPS
                                      and nodes[i].op is not OpKind.RESHAPE and i not in static})
        if prologue:
            self._notes.append(f"{len(prologue)} step(s) computed from params only run at compile and after "
                               "set_param, not per run")
        self._run_prologue()

    def _run_prologue(self) -> None:
        """The steps of values that depend on params and constants only (on the stream)."""
        for step in self._prologue:
            step.fn(self._slots)

    def _value_buffer(self, nid: int, shape: tuple[int, ...], dtype: np.dtype, plan: Any,
                      buffers: dict[int, Any]) -> Any:
        cp = self._cp
        b = plan.buffer_of.get(nid) if plan is not None and getattr(plan, "buffer_of", None) else None
        nbytes = math.prod(shape) * dtype.itemsize
        if b is None or b not in buffers or buffers[b].nbytes < nbytes:
            return cp.empty(shape, dtype=dtype)
        return buffers[b][:nbytes].view(dtype).reshape(shape)

    def _graph_mode(self, wanted: Any) -> bool:
        allocating = [s.name for s in self._steps if s.allocates]
        if wanted is False:
            self._notes.append("CUDA graphs off (extra['cuda_graphs'] = False)")
            return False
        if allocating:
            self._notes.append(f"CUDA graphs off: step {allocating[0]!r} allocates memory while it runs")
            return False
        blas = self._ctx._blas
        if blas is not None and not blas.capturable:
            self._notes.append(f"CUDA graphs off: {blas.why_not}")
            return False
        if not self._steps:
            return False
        # A replayed graph reads and writes fixed buffers: inputs are copied in, outputs
        # out. For big tensors those copies cost more than the launches a graph saves.
        io = sum(self._slots[slot].nbytes for _, slot, _ in self._inputs) + sum(
            self._slots[i].nbytes for i, _ in self._outputs)
        if wanted == "auto" and 2 * io / COPY_BYTES_PER_S > len(self._steps) * LAUNCH_SECONDS:
            self._notes.append(f"CUDA graphs off: copying {io / 2**20:.0f} MiB of inputs and outputs through the "
                               f"graph's buffers would cost more than the {len(self._steps)} launch(es) it saves")
            return False
        return True

    def _warmup(self) -> None:
        """Run once on the current (zero-filled) buffers: compiles every kernel now, not
        in the first real run; the error flags a zero input may raise are ignored."""
        for _name, slot, _ in self._inputs:
            self._slots[slot].fill(0)
        self._launch_eager()
        self._stream.synchronize()
        self._runs = 1  # the next run may capture

    # ------------------------------------------------------------------ running
    def _launch_eager(self) -> None:
        s = self._slots
        for nid, src, shape in self._views:
            s[nid] = s[src].reshape(shape)
        for step in self._steps:
            step.fn(s)

    def _capture(self) -> None:
        cp, stream = self._cp, self._stream
        mode = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", None)  # other threads may use CUDA meanwhile
        try:
            with cp.cuda.using_allocator(_allocation_refused):
                stream.begin_capture() if mode is None else stream.begin_capture(mode)
                try:
                    self._launch_eager()
                finally:
                    graph = stream.end_capture()
            self._graph_exec = graph
            self._notes.append(f"CUDA graph captured: {len(self._steps)} steps replayed as one launch")
        except Exception as exc:
            self._use_graphs = False
            self._graph_exec = None
            self._notes.append(f"CUDA graphs off: capture failed ({type(exc).__name__}: {exc}); each step is "
                               "launched on its own")
            log.info("rlx-cuda: CUDA graph capture failed for %r: %s", self._graph.name, exc)

    def _execute(self, inputs: Mapping[str, Any], bound: list[tuple[int, Any]], caller: Any,
                 fresh: bool = False) -> bool:
        """Upload, compute; the caller holds the lock, the device and the stream, and puts
        back the buffers swapped for this run (``bound``: inputs bound without a copy,
        outputs written to new buffers when ``fresh``) once it has read the outputs.
        Returns whether the outputs are in new buffers (eager runs only)."""
        cp, stream = self._cp, self._stream
        if any(not isinstance(inputs[name], np.ndarray) for name, _, _ in self._inputs):
            # A device input may still be being written on the caller's stream (CuPy's
            # asarray, a torch kernel): this non-blocking stream waits for that work.
            done = cp.cuda.Event(block=False, disable_timing=True)
            done.record(caller)
            stream.wait_event(done)
        for name, slot, pinned in self._inputs:
            value = inputs[name]
            dev = self._slots[slot]
            if isinstance(value, np.ndarray):
                np.copyto(pinned, value, casting="no")
                dev.set(pinned, stream=stream)
            else:
                arr = _device_array(cp, value, name)
                if arr.shape != dev.shape or arr.dtype != dev.dtype:
                    raise InputError(f"input {name!r}: expected {dev.shape} {dev.dtype}, got {tuple(arr.shape)} "
                                     f"{arr.dtype} (rlx never casts or broadcasts silently)")
                if not self._use_graphs and _is_contiguous_like(arr, dev):
                    bound.append((slot, dev))
                    self._slots[slot] = arr  # zero copy: the steps read the caller's array
                elif arr.flags.c_contiguous:  # one device-to-device copy (peer devices too)
                    rt = cp.cuda.runtime
                    rt.memcpyAsync(dev.data.ptr, arr.data.ptr, dev.nbytes, rt.memcpyDefault, stream.ptr)
                else:
                    cp.copyto(dev, arr)  # on the device: no host round trip
        self._runs += 1
        if self._use_graphs and self._runs >= 2:
            if self._graph_exec is None:
                self._capture()
            if self._graph_exec is not None:
                self._graph_exec.launch(stream)
                return False
        if fresh:
            for i in self._fresh_outputs:
                bound.append((i, self._slots[i]))
                self._slots[i] = cp.empty_like(self._slots[i])
        self._launch_eager()
        return fresh

    def _restore(self, bound: list[tuple[int, Any]]) -> None:
        for slot, dev in bound:
            self._slots[slot] = dev

    def _check_flags(self) -> None:
        if not self._flag_nodes:
            return
        flags = self._ctx.flags.get(stream=self._stream)
        self._stream.synchronize()
        bad = np.nonzero(flags[: len(self._flag_nodes)])[0]
        if bad.size:
            node = self._flag_nodes[int(bad[0])]
            what = _FLAG_MESSAGES.get(int(flags[bad[0]]), f"error code {int(flags[bad[0]])}")
            raise InputError(f"{node.describe()} ({node.op}) on cuda:{self._index}: {what}")

    def run(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        cp = self._cp
        bound: list[tuple[int, Any]] = []
        caller = cp.cuda.get_current_stream()
        with self._lock, cp.cuda.Device(self._index), self._stream:
            try:
                self._execute(inputs, bound, caller)
                for i, pinned in self._outputs:
                    self._slots[i].get(stream=self._stream, out=pinned)
                self._stream.synchronize()
            finally:
                self._restore(bound)
            self._check_flags()
            return [np.array(pinned, copy=True) for _, pinned in self._outputs]

    def run_dlpack(self, inputs: Mapping[str, Any]) -> list[Any]:
        """Run and leave the outputs on the GPU as new CuPy arrays (``__dlpack__``)."""
        cp = self._cp
        bound: list[tuple[int, Any]] = []
        caller = cp.cuda.get_current_stream()
        with self._lock, cp.cuda.Device(self._index), self._stream:
            try:
                fresh = self._execute(inputs, bound, caller, fresh=True)
                new = set(self._fresh_outputs) if fresh else set()
                outs = [self._slots[i] if i in new else self._slots[i].copy() for i, _ in self._outputs]
                self._stream.synchronize()
            finally:
                self._restore(bound)
            self._check_flags()
            return outs

    def set_param(self, name: str, value: np.ndarray) -> None:
        dev = self._params.get(name)
        if dev is None:
            raise InputError(f"set_param: graph {self._graph.name!r} has no param {name!r} on cuda")
        arr = np.asarray(value, order="C")
        if arr.shape != dev.shape or arr.dtype != dev.dtype:
            raise InputError(f"set_param {name!r}: expected {dev.shape} {dev.dtype}, got {arr.shape} {arr.dtype}")
        with self._lock, self._cp.cuda.Device(self._index), self._stream:
            dev.set(arr, stream=self._stream)  # same buffer: a captured CUDA graph stays valid
            self._run_prologue()  # values derived from params, in their same buffers too
            self._stream.synchronize()

    def report_notes(self) -> list[str]:
        """What the compile report says about this executable (TF32, CUDA graphs, prologue)."""
        return list(self._notes)

    @property
    def uses_cuda_graph(self) -> bool:
        return self._graph_exec is not None


def conv_note(paths: list[str]) -> str:
    """``convolutions: 17 on cuDNN implicit_precomp_gemm + bias, relu, 3 on ...``: how
    the report says each convolution of the graph runs."""
    counts = Counter(paths)
    return "convolutions: " + ", ".join(f"{n} on {path}" for path, n in counts.most_common())


def _pinned(cp: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A numpy array in page-locked host memory (fast, asynchronous copies)."""
    import cupyx

    return cupyx.empty_pinned(shape, dtype=dtype)


def _device_array(cp: Any, value: Any, name: str) -> Any:
    """A CuPy view of a GPU array (CuPy, ``__cuda_array_interface__`` or ``__dlpack__``:
    torch, JAX...), without a copy; anything else goes through the host."""
    try:
        if isinstance(value, cp.ndarray):
            return value
        if hasattr(value, "__cuda_array_interface__"):
            return cp.asarray(value)
        if hasattr(value, "__dlpack__"):
            return cp.from_dlpack(value)
        return cp.asarray(np.asarray(value))
    except Exception as exc:
        raise InputError(f"input {name!r}: cannot use a {type(value).__name__} on cuda: {exc}") from None


def _is_contiguous_like(arr: Any, like: Any) -> bool:
    return (arr.flags.c_contiguous and arr.shape == like.shape and arr.dtype == like.dtype
            and arr.device.id == like.device.id)
