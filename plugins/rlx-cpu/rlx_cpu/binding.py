"""Binding a plan: the executable's analysis turned into buffers and zero-argument steps.

Why a module of its own: binding is the one place where memory is laid out and kernels
are built (once per plan, never per run). ``PlanBinding`` is a mixin of
``executor.CpuExecutable``: it reads the executable's analysis (each value's kind, last
reader, layout and concat block) and residents (``residents.py``), and gives back a
``_Plan`` that ``CpuExecutable.run`` calls.

Memory: buffers are raw byte arrays kept in a free list; a value takes the smallest free
one that fits (or a new one), viewed as its dtype and shape, and gives it back after its
last use. A view keeps its base's buffer alive until the view's own last use. An output
never shares a buffer with its op's inputs, except for elementwise ops over an input of
the same shape and dtype that dies at that op (``kernels.inplace_positions``). A concat
whose inputs are each a contiguous block of its output (every axis before the concat's
has length 1: a batch-1 NCHW concat of channels) has its buffer taken when its first
input is computed, and each input read by the concat alone is computed straight into its
block (SqueezeNet's fire modules, Inception's branches): the concat copies only the rest.
The first plan of a thread mode is bound on a free list and recorded; where one block
laid out from the recording pays, it and every later plan of the mode are bound on that
block instead (``plan_arena.py``).
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, Union

import numpy as np

from rlx_core.ir import Node
from rlx_core.ir.ops import ELEMENTWISE_OPS, OpKind

from . import held, images, layout
from .fused import FUSED_KERNELS
from .gathers import resize_steps
from .halves import float32_twin
from .kernels import KERNELS, inplace_positions
from .native import thread_cap
from .nn_kernels import NN_KERNELS
from .openmp import team
from .plan_arena import Diverged, FreeListArena, Layout, PlannedArena, PlanStats, Recorder, block_pays
from .regions import node_steps
from .steps import Dyn, Outputs, Step, bind, bind_run
from .warm_pool import warm_pool

log = logging.getLogger("rlx_cpu")
Arena = Union[FreeListArena, PlannedArena, Recorder]  # what a binding takes its buffers from

#: Each op's step builder: read here, by folding (``residents``) and by the executor's
#: check that every op of a graph has one.
_BUILDERS = {**KERNELS, **NN_KERNELS, **FUSED_KERNELS}
#: Ops a float16 node of which is built as its float32 twin over float32 copies, rounded
#: once (``halves``): products, fused convolutions (their epilogues with them), softmax,
#: LayerNorm, attention and pools, whose fast kernels are float32, and single elementwise
#: ops. (A plain convolution does it in ``nn_kernels.conv2d_steps``, every caller's way
#: in; a fused chain decides for itself: ``fused._fused_elementwise``.)
_FLOAT32_TWINS = (OpKind.MATMUL, OpKind.GEMM, OpKind.FUSED_CONV, OpKind.SOFTMAX, OpKind.LAYER_NORM,
                  OpKind.ATTENTION, OpKind.MAX_POOL2D, OpKind.AVG_POOL2D, OpKind.GLOBAL_AVG_POOL2D, OpKind.ADD,
                  OpKind.SUB, OpKind.MUL, OpKind.DIV, OpKind.MAXIMUM, OpKind.MINIMUM, OpKind.NEG, OpKind.ABS,
                  OpKind.SQRT, OpKind.RSQRT, OpKind.EXP, OpKind.TANH, OpKind.RELU, OpKind.SIGMOID, OpKind.ERF,
                  OpKind.GELU)
_BUILDERS.update({op: float32_twin(_BUILDERS[op]) for op in _FLOAT32_TWINS})

# How a value is held. DYNAMIC: in a slot, set per run (inputs and views of them).
# RESIDENT: an array owned by the executable, shared by every plan. BUFFER: a plan's
# buffer. VIEW: a reshape sharing the buffer of the value it reshapes.
DYNAMIC, RESIDENT, BUFFER, VIEW = "dynamic", "resident", "buffer", "view"


def _view(raw: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return raw[: math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


class _Scratch:
    """The ``BuildContext`` of one node in a plan: temporaries from the arena, given back
    once the node's steps are built (they are dead outside those steps); arrays derived
    from residents come from the executable (``CpuExecutable._derived``)."""

    def __init__(self, arena: Arena, derived: Callable[..., np.ndarray | None],
                 constant: Callable[[Any], bool], precision: str = "fp32",
                 rounded: Callable[[str, str], None] | None = None) -> None:
        self._arena = arena
        self._taken: list[np.ndarray] = []
        self.derived = derived
        self.constant = constant
        self.precision = precision  # CompileOptions.precision, where this host takes it (else fp32)
        self.rounded = rounded  # told of each product built with reduced-precision operands

    def scratch(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        raw = self._arena.take(math.prod(shape) * dtype.itemsize)
        self._taken.append(raw)
        return _view(raw, tuple(shape), dtype)

    def release(self) -> None:
        for raw in self._taken:
            self._arena.give(raw)


class _Group:
    """One buffer and the last node index at which any value stored in it is read."""

    __slots__ = ("end", "raw", "released")

    def __init__(self, raw: np.ndarray, end: int) -> None:
        self.raw, self.end, self.released = raw, end, False


def _give_back(arena: Arena, groups: dict[int, _Group], values: Iterable[int], by: int) -> None:
    """Give ``arena`` back the buffers of ``values`` that no node after ``by`` reads."""
    for i in values:
        group = groups.get(i)
        if group is not None and not group.released and group.end <= by:
            arena.give(group.raw)
            group.released = True


class _Plan:
    """One bound plan: its slots for the run's inputs, the function running it, the
    generation of param values it was bound under (``CpuExecutable._generation``), its
    buffers, and its ``twin``: the same graph bound on one native thread over the same
    buffers (the thread tuner's narrow mode), made when first needed. A plan and its twin
    never run at once: both leave the pool together."""

    __slots__ = ("__weakref__", "buffers", "generation", "outputs", "run", "slots", "stats", "twin")

    def __init__(self, run: Callable[[Any], list[np.ndarray]], slots: list[Any], stats: PlanStats,
                 generation: int, buffers: list[np.ndarray], outputs: Outputs) -> None:
        self.run, self.slots, self.stats, self.generation = run, slots, stats, generation
        self.buffers, self.outputs = buffers, outputs  # (the arrays it hands out, recycled: a twin shares them)
        self.twin: _Plan | None = None


def _build_steps(builder: Callable[..., list[Step]], node: Node, ins: list[Any], out: np.ndarray,
                 ctx: Any) -> list[Step]:
    if out.size == 0:
        return []
    if node.op in ELEMENTWISE_OPS:  # float32: one call of the native interpreter when it is here
        native = node_steps(node, ins, out)
        if native is not None:
            return native
    return builder(node, ins, out, ctx)


def _build_with(node: Node, ins: list[Any], out: Any, ctx: Any) -> list[Step]:
    """``node``'s steps from its op's builder (``layout.steps``' way back to the NCHW kernels)."""
    return _build_steps(_BUILDERS[node.op], node, ins, out, ctx)


class PlanBinding:
    """Binding plans, the part of ``executor.CpuExecutable`` that lays out a plan's
    buffers and builds its steps. A mixin: what it reads of the executable is set by
    ``CpuExecutable.__init__`` (its analysis, declared here, and ``_held_flags``) and by
    ``residents.Residents`` (``_residents``, ``_derived``, ``_constant``)."""

    _graph_name: str
    _nodes: tuple[Node, ...]
    _input_names: tuple[str, ...]
    _input_ids: tuple[int, ...]
    _outputs: tuple[int, ...]
    _kinds: list[str]  # each value's DYNAMIC, RESIDENT, BUFFER or VIEW
    _dnnl: Any
    _cl: frozenset[int]
    _cl_views: frozenset[int]
    _taps: dict[int, Any]
    _elided: dict[int, int]
    _held: frozenset[int]
    _ends: list[int]
    _handoff: set[int]
    _in_concat: dict[int, tuple[int, int]]
    _concat_ends: dict[int, int]
    _segments: tuple[images.Segment, ...]
    _residents: dict[int, np.ndarray]
    _precision: str
    _rounded: dict[int, tuple[str, str]]
    _generation: int
    _thread_cap: int | None
    _plan_count: Iterator[int]
    _plans_built: int
    _layouts: dict[bool, Layout | Literal[False]]

    def _bind_plan(self, narrow: bool = False, over: _Plan | None = None) -> _Plan:
        """Allocate one plan's buffers and bind its steps (deterministic: every plan of
        this executable comes out the same), under the executable's native thread cap
        (one thread for a ``narrow`` plan), over ``over``'s buffers where given (a twin:
        the thread tuner's narrow trial held a second plan's memory, 266 MB of fresh
        pages for densenet121 at batch 8, faulted in during the run it timed). The
        first plan of a mode is bound on a free list and recorded; where one block laid out
        from the recording pays (``plan_arena.block_pays``), that plan is bound again on
        it, and so is every later plan of the mode (the free list where a binding does not
        replay the recording)."""
        cap = 1 if narrow else self._thread_cap
        with thread_cap(cap), team(cap):  # (oneDNN fixes a primitive's threads when it is created)
            plan = self._bind_in_arena(narrow, over.buffers if over is not None else [],
                                       over.outputs if over is not None else None)
        self._plans_built = next(self._plan_count)
        return plan

    def _bind_in_arena(self, narrow: bool, lent: list[np.ndarray], outputs: Outputs | None) -> _Plan:
        """``_bind_plan``'s choice of arena (see there), under the mode's thread cap."""
        layout = self._layouts.get(narrow)
        if layout is None:  # the first plan of this mode: on the free list, recorded
            # A twin of a plan laid out in one block is laid out in that block where it
            # fits: its pages are faulted in already (a free list took the whole block for
            # its first buffer and fresh memory for the rest: LR-ASPP at batch 8, 26 MB
            # faulted in during the tuner's first narrow run, 172 ms against 47).
            block = lent[0] if len(lent) == 1 else None
            recorder = Recorder(FreeListArena(stats := PlanStats(), [] if block is not None else lent))
            plan = self._bind_plan_capped(recorder, stats, outputs)
            layout = recorder.layout()
            in_block = block is not None and layout.total <= block.nbytes
            if not in_block and not block_pays(stats.buffer_bytes, layout.total):  # this mode stays on free lists
                self._layouts[narrow] = layout = False
                if block is None:
                    return plan
            else:
                self._layouts[narrow] = layout
            del plan  # never ran: nothing of it faulted in; bound again (on the block, or the lent one)
        if layout is not False:
            stats = PlanStats()
            arena = PlannedArena(layout, stats, lent[0] if len(lent) == 1 else None)
            try:
                plan = self._bind_plan_capped(arena, stats, outputs)
                arena.finish()
                return plan
            except Diverged as exc:
                log.warning("rlx-cpu: graph %r: a plan's buffers did not replay their recording (%s); "
                            "binding with a free list", self._graph_name, exc)
                self._layouts[narrow] = False
        return self._bind_plan_capped(FreeListArena(stats := PlanStats(), lent), stats, outputs)

    def _bind_plan_capped(self, arena: Arena, stats: PlanStats, outputs: Outputs | None) -> _Plan:
        slots: list[Any] = [None] * len(self._input_ids)
        slot_of = {nid: k for k, nid in enumerate(self._input_ids)}
        values: dict[int, Any] = {}
        groups: dict[int, _Group] = {}
        concats: dict[int, np.ndarray] = {}  # a concat's buffer, taken at its first input computed in place
        steps: list[Callable[[], Any]] = []
        fresh: list[Dyn] = []
        kinds, cl = self._kinds, self._cl
        runs = {seg.nodes[0]: seg for seg in self._segments}  # bound image by image (images.py)
        done: set[int] = set()
        for node in self._nodes:
            nid, kind = node.id, kinds[node.id]
            if nid in done:
                continue
            if nid in runs:
                steps.extend(bind(s, slots) for s in self._bind_images(runs[nid], values, groups, arena, stats))
                done.update(runs[nid].nodes)
                continue
            if kind == RESIDENT:
                values[nid] = self._residents[nid]
                continue
            if node.op is OpKind.INPUT:
                values[nid] = Dyn(slot_of[nid], node.shape, np.dtype(node.dtype))
                continue
            if nid in self._elided:  # its reader computes from its input (gathers.resize_steps)
                continue
            if node.op is OpKind.RESHAPE or nid in self._cl_views:  # a view: of a slot (DYNAMIC) or a buffer (VIEW)
                base = values[node.inputs[0]]
                values[nid] = base if nid in self._cl_views else base.reshape(node.shape)  # layout.plan's
                if kind == VIEW:
                    groups[nid] = groups[node.inputs[0]]
                    stats.views += 1
                continue
            ins = [] if nid in self._taps else [values[i] for i in node.inputs]  # (a resize reads its gathers' input)
            if nid in self._handoff:  # a fresh array per run, handed to the caller (no copy out)
                out = Dyn(len(slots), node.shape, np.dtype(node.dtype))
                slots.append(None)
                fresh.append(out)
            elif nid in self._in_concat:  # straight into its block of the concat's buffer
                cid, offset = self._in_concat[nid]
                if cid not in concats:
                    cat = self._nodes[cid]
                    dtype = np.dtype(cat.dtype)
                    groups[cid] = _Group(arena.take(cat.size * dtype.itemsize), self._concat_ends[cid])
                    concats[cid] = _view(groups[cid].raw, cat.shape, dtype)
                out = concats[cid].reshape(-1)[offset : offset + node.size].reshape(node.shape)
                groups[nid] = groups[cid]
                stats.inplace += 1
            elif nid in concats:
                out = concats[nid]
            else:
                out = self._output_buffer(layout.builder_node(node) if nid in cl else node, values, groups, arena,
                                          stats)
            values[nid] = out
            ctx = _Scratch(arena, self._derived, self._constant, self._precision,
                           lambda fmt, what, nid=nid: self._rounded.__setitem__(nid, (fmt, what)))
            read = node.inputs
            if nid in self._taps:
                read = (self._taps[nid].x,)
                built = resize_steps(self._taps[nid], values[read[0]], out)
            elif nid in cl or any(i in cl for i in node.inputs):  # NHWC in or out (layout.py)
                built = layout.steps(self._dnnl, node, ins, out, ctx, [i in cl for i in node.inputs], nid in cl,
                                     _build_with, self._held_flags(node))
            elif nid in self._held or any(i in self._held for i in node.inputs):  # a dense layer (held.py)
                built = held.dense_steps(node, ins, out, ctx, self._held_flags(node), _build_with)
            else:
                built = _build_steps(_BUILDERS[node.op], node, ins, out, ctx)
            ctx.release()
            steps.extend(bind(s, slots) for s in built)
            _give_back(arena, groups, {*read, nid}, nid)
        stats.steps = len(steps)
        recycle = Outputs(len(self._outputs) + len(fresh)) if outputs is None else outputs
        run = bind_run(self._input_names, steps, [values[i] for i in self._outputs], slots, recycle, fresh)
        plan = _Plan(run, slots, stats, self._generation, arena.held, recycle)
        weakref.finalize(plan, warm_pool().give, arena.owned)  # its buffers, kept warm once nothing can run it
        return plan

    def _bind_images(self, run: images.Segment, values: dict[int, Any], groups: dict[int, _Group], arena: Arena,
                     stats: PlanStats) -> list[Step]:
        """The steps of ``run`` (``images.segments``), chunk-major: each node built once
        per chunk of ``run.chunk`` images over that chunk's slice of its values.

        Memory: a value read after the run keeps a whole-batch buffer, taken before any
        other of the run's and given back only after the run (a chunk's steps run after
        later nodes' earlier chunks). A value read only inside the run has a buffer of one
        chunk, shared by all chunks, taken and given back in node order like the plan's
        own (each chunk runs the nodes in that order), and each node is built for every
        chunk at its place in that order, so its scratch overlaps only values dead there.
        (Held to the run's end, DenseNet-121's first block at batch 8 took 87 MiB against
        58 for the whole-batch plan.)"""
        nodes, ids, chunk = self._nodes, run.nodes, run.chunk
        last, batch = ids[-1], nodes[ids[0]].shape[0]
        cl = self._cl
        inner = {nid for nid in ids if nid not in self._outputs and self._ends[nid] <= last}

        def allocate(nid: int) -> None:
            node = images.per_image_node(nodes[nid], chunk) if nid in inner else nodes[nid]
            one = nid in inner
            # In place only over the same images: a one-chunk value (or a whole-batch one,
            # whose slices line up), never a value every image reads.
            values[nid] = self._output_buffer(layout.builder_node(node) if nid in cl else node, values, groups,
                                              arena, stats, over=lambda src: (src in inner) == one)

        for nid in ids:
            if nid not in inner:
                allocate(nid)
        stats.per_image += len(ids)

        def part(i: int, b: int, n: int, rank: int) -> Any:
            v = values[i] if i in values else self._residents[i]
            if i in inner:
                return v if n == chunk else v[:n]
            if self._kinds[i] == RESIDENT or v.ndim != rank or v.shape[0] != batch:
                return v  # a constant, or broadcast over the batch
            return v[b : b + n]

        starts = range(0, batch, chunk)
        built: dict[int, list[Step]] = {b: [] for b in starts}
        for nid in ids:
            if nid in inner:
                allocate(nid)
            node = nodes[nid]
            for b in starts:
                n = min(chunk, batch - b)
                ctx = _Scratch(arena, self._derived, self._constant, self._precision,
                               lambda fmt, what, nid=nid: self._rounded.__setitem__(nid, (fmt, what)))
                ins, out = [part(i, b, n, len(node.shape)) for i in node.inputs], part(nid, b, n, len(node.shape))
                if nid in cl or any(i in cl for i in node.inputs):  # NHWC in or out (layout.py)
                    built[b].extend(layout.steps(self._dnnl, images.per_image_node(node, n), ins, out, ctx,
                                                 [i in cl for i in node.inputs], nid in cl, _build_with))
                else:
                    built[b].extend(_build_steps(_BUILDERS[node.op], images.per_image_node(node, n), ins, out, ctx))
                ctx.release()
            _give_back(arena, groups, (i for i in {*node.inputs, nid} if i in inner), nid)  # one-chunk, dead here
        for nid in ids:
            _give_back(arena, groups, {*nodes[nid].inputs, nid}, last)
        return [step for b in starts for step in built[b]]

    def _output_buffer(self, node: Node, values: dict[int, Any], groups: dict[int, _Group], arena: Arena,
                       stats: PlanStats, over: Callable[[int], bool] | None = None) -> np.ndarray:
        """An input's buffer when the op may overwrite it and nothing reads it later (and,
        where ``over`` is given, ``over(input)`` allows it), else a buffer from the arena."""
        end = self._ends[node.id]
        shape, dtype = node.shape, np.dtype(node.dtype)
        for pos in inplace_positions(node):
            src = node.inputs[pos]
            group = groups.get(src)
            if group is None or group.end > node.id or (over is not None and not over(src)):
                continue
            arr = values[src]
            if arr.shape != shape or arr.dtype != dtype:
                continue
            if (src in self._held) != (node.id in self._held):
                # a value held bf16 lies in the first half of its float32 buffer: written over
                # an input of the other format, the interpreter's blocks would write where
                # another thread still reads, so it declined and the node ran between
                # conversions (EfficientNet-B0's squeeze-excitation scales at batch 8: 2.5 ms)
                continue
            if any(groups.get(other) is group for j, other in enumerate(node.inputs) if j != pos):
                continue  # another operand reads the same memory
            group.end = max(group.end, end)
            groups[node.id] = group
            stats.inplace += 1
            return arr
        group = _Group(arena.take(math.prod(shape) * dtype.itemsize), end)
        groups[node.id] = group
        return _view(group.raw, shape, dtype)
