"""Compiling a graph into flat execution plans, and running them.

Compiling analyses the graph once: which values are run-time inputs, which are resident
(params, constants, and every node computed only from those, folded at compile time and
recomputed by ``set_param``), which are views (a reshape of a buffer-backed value), and
how long each value lives. A *plan* is then bound from that analysis: every other value
gets a preallocated buffer, buffers are reused once their value is dead, and each node
becomes a few zero-argument steps bound to those buffers. ``run`` only places the input
arrays into the plan's slots, calls the steps in order, and copies out the outputs.

Memory: buffers are raw byte arrays kept in a free list; a value takes the smallest free
one that fits (or a new one), viewed as its dtype and shape, and gives it back after its
last use. A view keeps its base's buffer alive until the view's own last use. An output
never shares a buffer with its op's inputs, except for elementwise ops over an input of
the same shape and dtype that dies at that op (``kernels.inplace_positions``). A concat
whose inputs are each a contiguous block of its output (every axis before the concat's
has length 1: a batch-1 NCHW concat of channels) has its buffer taken when its first
input is computed, and each input read by the concat alone is computed straight into its
block (SqueezeNet's fire modules, Inception's branches): the concat copies only the rest.

Layouts: where oneDNN is installed, ``layout.plan`` picks the values held channels-last
(NHWC) between convolutions; a node reading or writing one is built by ``layout.steps``
with NHWC arrays (same bytes, permuted shape), and the transposes it makes free are
views like a reshape. Every other value, and every graph output, stays NCHW.

Threads: a plan's buffers make it single-threaded, so the executable keeps a pool of
plans; ``run`` pops one (a new one when the pool is empty), runs it and pushes it back.
``list.pop`` and ``list.append`` are atomic under the GIL: the hot path takes no lock.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union

import numpy as np

from rlx_core.errors import GraphError, InputError
from rlx_core.ir import Graph, Node
from rlx_core.ir.ops import ELEMENTWISE_OPS, OpKind
from rlx_core.plugin import Executable, shape_family

from . import blas, held, layout, onednn
from .fused import FUSED_KERNELS
from .gathers import find_resize_taps, resize_steps
from .kernels import KERNELS, inplace_positions
from .native import library as native_library
from .native import thread_cap
from .nn_kernels import NN_KERNELS
from .params import SHARED_ROOTS, borrowed, owned_rebuild, param_array
from .plan_arena import Diverged, FreeListArena, Layout, PlannedArena, PlanStats, Recorder, block_pays
from .regions import node_steps
from .steps import Dyn, Outputs, Step, aligned_empty, bind, bind_run, owner
from .threads import PRODUCT_OPS, family_tuner, native_thread_cap
from .warm_pool import warm_pool

__all__ = ["CpuExecutable", "PlanStats", "kernel_ops"]

log = logging.getLogger("rlx_cpu")
Arena = Union[FreeListArena, PlannedArena, Recorder]  # what a binding takes its buffers from

_BUILDERS = {**KERNELS, **NN_KERNELS, **FUSED_KERNELS}


_KERNEL_OPS = frozenset(op.value for op in _BUILDERS) | {OpKind.RESHAPE.value}


def kernel_ops() -> frozenset[str]:
    """The ops this executor has a kernel for (reshape is a view, it needs none): what
    the backend claims, so that a claim can never outrun the kernels. Asked once per
    node by legalization: computed once."""
    return _KERNEL_OPS
#: A graph with less work than this (elements over all its values) and no products runs
#: as the thread policy says: its runs are too short for threads to matter either way.
TUNE_MIN_ELEMENTS = 1 << 16
#: Outputs at least this large are written into a fresh array each run and handed over
#: (``steps.bind_run``), instead of living in a plan buffer and being copied out.
HANDOFF_BYTES = 128 * 1024
#: The ops whose kernels write a run-time (``Dyn``) output: plain ufunc steps and the
#: fused kernels built on them (tested at hand-off sizes in tests/test_executor.py).
_HANDOFF_OPS = frozenset({OpKind.MATMUL, OpKind.GEMM, OpKind.FUSED_ELEMENTWISE, OpKind.ADD, OpKind.SUB,
                          OpKind.MUL, OpKind.MAXIMUM, OpKind.MINIMUM, OpKind.NEG, OpKind.ABS, OpKind.EXP,
                          OpKind.TANH, OpKind.SQRT, OpKind.LOG})

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


class _Owned:
    """The ``BuildContext`` of folded nodes: private temporaries, kept for recomputation."""

    def scratch(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return aligned_empty(shape, dtype)

    def derived(self, source: Any, key: Any, make: Callable[..., np.ndarray], also: Sequence[Any] = ()) -> None:
        return None  # a folded node runs once per set_param: nothing to keep


class _Group:
    """One buffer and the last node index at which any value stored in it is read."""

    __slots__ = ("end", "raw", "released")

    def __init__(self, raw: np.ndarray, end: int) -> None:
        self.raw, self.end, self.released = raw, end, False


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


#: The ``derived`` keys that name all their array depends on besides its sources, at any
#: size of the graph, so that one family's copies may share it. oneDNN's weights carry
#: the layout their primitive chose (``Dnnl.layout``), which may differ between sizes;
#: a key not listed here is made per copy.
_FAMILY_KEYS = frozenset({"onednn_conv_weights", "onednn_matmul_weights", "conv_bias_column", "conv_direct_pack",
                          "rlx_depthwise_lanes_pack", "rlx_conv_gemm_pack", "rlx_gemm_pack_a", "rlx_gemm_pack_b",
                          "sgemm_pack_b"})


class CpuExecutable(Executable):
    """A graph compiled for the cpu backend: a pool of bound plans over shared residents."""

    def __init__(self, graph: Graph, owned: Mapping[str, np.ndarray] | None = None, generation: int = 0, *,
                 precision: str = "fp32") -> None:
        self._graph = graph  # (its values are the params' borrowed arrays: ``params.py``)
        self._precision = precision  # CompileOptions.precision: products' operands (onednn_steps.operand_types)
        self._rounded: dict[int, tuple[str, str]] = {}  # node id -> (format, what) of products built rounded
        self._graph_name = graph.name
        self._nodes = graph.nodes
        self._outputs = graph.outputs
        self._input_names = tuple(graph.node(i).name for i in graph.inputs)
        self._input_ids = graph.inputs
        self._kinds = self._classify(graph)
        self._dnnl, self._cl, self._cl_views = self._channels_last(graph)
        reads = graph.use_counts()  # how many nodes read each value, a graph output one more
        self._taps = find_resize_taps(graph, self._plain, reads)  # region id -> its resize
        self._elided = {g: r for r, taps in self._taps.items() for g in taps.gathers}  # never made: read by r
        self._held = self._held_values(graph)
        self._ends = self._liveness(graph)
        self._handoff = {i for i in graph.outputs if self._kinds[i] == BUFFER and graph.node(i).op in _HANDOFF_OPS
                         and graph.node(i).size * np.dtype(graph.node(i).dtype).itemsize >= HANDOFF_BYTES}
        self._in_concat = self._concat_blocks(reads)
        self._params: dict[str, np.ndarray] = {}
        self._family = shape_family()  # plans bound later (a narrow mode, after set_param) share in it too
        self._residents: dict[int, np.ndarray] = {}
        self._folds: list[tuple[frozenset[str], list[Callable[[], Any]]]] = []
        self._resident_deps: dict[int, frozenset[str]] = {}  # id of a resident's memory owner -> params it reads
        self._derived_arrays: dict[Any, list[Any]] = {}  # key -> [source, make, array, params]
        self._thread_cap, self._thread_note = native_thread_cap(n.op for n in self._nodes)
        with thread_cap(self._thread_cap):
            self._fold(graph, owned)
        self._plan_count = itertools.count(1)
        self._layouts: dict[bool, Layout | Literal[False]] = {}  # per thread mode: the plans' block (False: free lists)
        self._baked: set[str] = set()  # params whose values some step holds as numbers (``_constant``)
        self._generation = generation  # bumped by set_param of a baked param: plans bound before are dropped
        self._plans_built = 0
        first = self._bind_plan()
        self._stats = first.stats
        self._pool: list[_Plan] = [first]  # plans of the wide mode (the thread policy's), with their twins
        # MKL's threads matter to a graph with products only (loading MKL is not free).
        self._mkl = blas.mkl() if any(n.op in PRODUCT_OPS for n in self._nodes) else None
        self._tuner = family_tuner(self._family, self._work()) if self._tunable() else None

    # ------------------------------------------------------------------ analysis
    def _classify(self, graph: Graph) -> list[str]:
        kinds: list[str] = []
        for node in self._nodes:
            if node.op is OpKind.INPUT:
                kind = DYNAMIC
            elif node.op in (OpKind.PARAM, OpKind.CONSTANT):
                kind = RESIDENT
            elif node.op not in _BUILDERS and node.op is not OpKind.RESHAPE:
                raise GraphError(f"cpu: {node.describe()}: op {node.op} has no cpu kernel")
            elif all(kinds[i] == RESIDENT for i in node.inputs):
                kind = RESIDENT  # folded: computed at compile time and by set_param
            elif node.op is OpKind.RESHAPE:
                kind = DYNAMIC if kinds[node.inputs[0]] == DYNAMIC else VIEW
            else:
                kind = BUFFER
            kinds.append(kind)
        return kinds

    def _channels_last(self, graph: Graph) -> tuple[Any, frozenset[int], frozenset[int]]:
        """oneDNN, the values held NHWC and the transposes made views (``layout.py``),
        where the graph has convolutions. A transpose made a view shares its input's array
        (``VIEW``, or ``DYNAMIC`` over a caller's array), like a reshape."""
        none: frozenset[int] = frozenset()
        if not any(n.op in (OpKind.CONV2D, OpKind.FUSED_CONV) for n in self._nodes):
            return None, none, none
        lib = layout.enabled()
        if lib is None:
            return None, none, none
        kinds = self._kinds
        found = layout.plan(graph, [k == BUFFER for k in kinds], [k == RESIDENT for k in kinds])
        for nid in found.views:
            kinds[nid] = DYNAMIC if kinds[self._nodes[nid].inputs[0]] == DYNAMIC else VIEW
        return lib, found.cl, found.views

    def _held_values(self, graph: Graph) -> frozenset[int]:
        """The values held in the reduced format between the steps that write and read
        them (``held.py``), under a reduced precision this host takes; never a resize's
        region (its gathers' kernel writes float32: dropping a held value is always
        safe)."""
        if onednn.reduced(self._precision) is None:
            return frozenset()
        fixed = [k == RESIDENT for k in self._kinds]
        buffered = [k == BUFFER for k in self._kinds]
        found = held.plan(graph, self._cl) | held.plan_dense(graph, self._cl, buffered, fixed)
        return found - frozenset(self._taps)

    def _held_flags(self, node: Node) -> tuple[list[bool], bool]:
        """Which of ``node``'s inputs, and whether its output, are held reduced."""
        return [i in self._held for i in node.inputs], node.id in self._held

    def _plain(self, nid: int) -> bool:
        """Whether value ``nid`` is held NCHW in a plan buffer of its own or a caller's
        array (``gathers.find_resize_taps``' candidates)."""
        return self._kinds[nid] in (BUFFER, DYNAMIC, VIEW) and nid not in self._cl

    def _liveness(self, graph: Graph) -> list[int]:
        """For each value, the last node index reading it or any view of it; graph
        outputs live to the end (they are copied out after the last step). A gather never
        made (``_elided``) reads its input where its reader runs."""
        end_of_run = len(self._nodes)
        last = [node.id for node in self._nodes]
        for node in self._nodes:
            reader = self._elided.get(node.id, node.id)
            for i in node.inputs:
                last[i] = max(last[i], reader)
        for i in self._outputs:
            last[i] = end_of_run
        for node in reversed(self._nodes):
            if self._kinds[node.id] == VIEW:
                base = node.inputs[0]
                last[base] = max(last[base], last[node.id])
        return last

    def _concat_blocks(self, reads: Sequence[int]) -> dict[int, tuple[int, int]]:
        """Values computed straight into their concat's buffer: id -> (the concat's id, the
        element offset of its block). A concat qualifies when each input is a contiguous
        block of its output (every axis before the concat's has length 1); an input does
        when it is a buffer of the concat's dtype that the concat reads once and nothing
        else reads (not an output, not a view's base) and it is not a concat itself;
        ``reads``: each value's readers, an output counting as one."""
        blocks: dict[int, tuple[int, int]] = {}
        for node in self._nodes:
            if (node.op is not OpKind.CONCAT or self._kinds[node.id] != BUFFER or node.id in self._handoff
                    or node.id in self._cl
                    or math.prod(node.shape[: node.attrs["axis"]]) != 1):
                continue
            axis, offset = node.attrs["axis"], 0
            inner = math.prod(node.shape[axis + 1 :])
            for i in node.inputs:
                src = self._nodes[i]
                if (self._kinds[i] == BUFFER and reads[i] == 1 and src.op not in (OpKind.CONCAT, OpKind.RESHAPE)
                        and src.dtype == node.dtype and i not in self._handoff):
                    blocks[i] = (node.id, offset)
                offset += src.shape[axis] * inner
        return blocks

    def _fold(self, graph: Graph, owned_params: Mapping[str, np.ndarray] | None) -> None:
        """Make the resident arrays: params (borrowed, or ``owned_params``: ``params.py``),
        constants as they are, and every node of only residents computed once (and again
        by ``set_param``)."""
        deps: dict[int, frozenset[str]] = {}
        owned = _Owned()
        gemv_weights = self._gemv_weights(graph)
        for node in self._nodes:
            if self._kinds[node.id] != RESIDENT:
                continue
            if node.op is OpKind.PARAM:
                arr = param_array(node, graph.value(node.id), owned_params)
                self._params[node.name] = arr
                deps[node.id] = frozenset({node.name})
            elif node.op is OpKind.CONSTANT:
                arr = np.asarray(graph.value(node.id), dtype=node.dtype, order="C")  # keeps 0-d as 0-d
                deps[node.id] = frozenset()
            else:
                ins = [self._residents[i] for i in node.inputs]
                deps[node.id] = frozenset().union(*(deps[i] for i in node.inputs))
                if node.op is OpKind.RESHAPE:
                    arr = ins[0].reshape(node.shape)
                elif node.id in gemv_weights:
                    arr = ins[0].transpose(node.attrs["perm"])  # a view: see _gemv_weights
                else:
                    arr = aligned_empty(node.shape, node.dtype)
                    steps = [bind(s, []) for s in _build_steps(_BUILDERS[node.op], node, ins, arr, owned)]
                    for step in steps:
                        step()
                    if deps[node.id]:
                        self._folds.append((deps[node.id], steps))
            self._residents[node.id] = arr
            root = id(owner(arr))
            self._resident_deps[root] = self._resident_deps.get(root, frozenset()) | deps[node.id]

    def _derived(self, source: Any, key: Any, make: Callable[[np.ndarray, np.ndarray | None], np.ndarray],
                 also: Sequence[Any] = ()) -> np.ndarray | None:
        """``BuildContext.derived``: ``make(source, None)`` once per source and key, shared
        by every plan, and refilled in place by ``set_param`` when a param it reads (through
        ``source`` or the arrays in ``also``, which ``make`` reads too) changes."""
        deps: frozenset[str] = frozenset()
        for array in (source, *also):
            if not isinstance(array, np.ndarray):
                return None
            found = self._resident_deps.get(id(owner(array)))
            if found is None:  # a plan buffer: its contents change every run
                return None
            deps |= found
        k = (*((a.__array_interface__["data"][0], a.shape, a.strides) for a in (source, *also)), key)
        entry = self._derived_arrays.get(k)
        if entry is None and self._family is not None and key[0] in _FAMILY_KEYS:
            entry = self._derived_arrays[k] = self._family_derived(k, source, make, also, deps)
        if entry is None:
            entry = self._derived_arrays[k] = [source, make, make(source, None), deps]
            # A derived array may be the source of another (weights with a bias column,
            # then packed for the GEMM): set_param refills them in the order they were made.
            self._resident_deps.setdefault(id(owner(entry[2])), deps)
        return entry[2]

    def _family_derived(self, k: Any, source: np.ndarray, make: Callable[[np.ndarray, np.ndarray | None], np.ndarray],
                        also: Sequence[Any], deps: frozenset[str]) -> list[Any] | None:
        """``_derived``'s entry shared with the other copies of this graph's family, when
        every array it is made from is one they share (``params.param_array``); else ``None``.
        ``set_param`` reaches every copy, and each refills it in place: the same values."""
        family = self._family
        assert family is not None
        with family.lock:
            roots = family.shared.get(SHARED_ROOTS, set())
            if not all(id(owner(a)) in roots for a in (source, *also)):
                return None
            entry = family.shared.get(("rlx_cpu.derived", k))
            if entry is None:
                entry = family.shared[("rlx_cpu.derived", k)] = [source, make, make(source, None), deps]
                roots.add(id(owner(entry[2])))  # (a derived array may be the source of another)
        self._resident_deps.setdefault(id(owner(entry[2])), deps)
        return entry

    def _constant(self, array: Any) -> bool:
        """``BuildContext.constant``: whether a step may hold ``array``'s values as numbers
        (a oneDNN post-op's clamp bound): it is a resident. One a param reaches (the
        dynamo exporter stores ReLU6's bounds as initializers) is recorded, and
        ``set_param`` of that param drops the plans bound with its old values."""
        if not isinstance(array, np.ndarray):
            return False
        deps = self._resident_deps.get(id(owner(array)))
        if deps is None:
            return False
        self._baked |= deps
        return True

    def _gemv_weights(self, graph: Graph) -> set[int]:
        """Resident 2-d transposes read only as the weights of one-row matmuls.

        ONNX's ``Gemm(transB=1)`` stores a dense layer's weights as (N, K) and the graph
        transposes them. Folded into a contiguous (K, N) array, a one-row product
        ``x @ w`` walks the weights column-wise (3x slower for a 1x8192 @ 8192x10 head);
        left as a view of the (N, K) array, BLAS runs it as a row-major gemv. With more
        rows the contiguous copy is as fast or faster, so only these stay views."""
        readers: dict[int, list[Node]] = {}
        for node in self._nodes:
            for i in node.inputs:
                readers.setdefault(i, []).append(node)
        found = set()
        for node in self._nodes:
            if node.op is not OpKind.TRANSPOSE or len(node.shape) != 2 or self._kinds[node.id] != RESIDENT:
                continue
            users = readers.get(node.id, [])
            if users and node.id not in self._outputs and all(
                u.op in (OpKind.MATMUL, OpKind.GEMM) and u.inputs[1] == node.id and u.inputs[0] != node.id
                and math.prod(graph.node(u.inputs[0]).shape[:-1]) == 1 for u in users
            ):
                found.add(node.id)
        return found

    # ------------------------------------------------------------------ plans
    def report_notes(self) -> list[str]:
        """What the compile report says about this executable (the thread policy)."""
        notes = [self._thread_note] if self._thread_note else []
        if self._rounded:
            fmt = next(iter(self._rounded.values()))[0]
            counts = Counter(what for _, what in self._rounded.values())
            kinds = " and ".join(f"{k} {what}{'s' if k > 1 else ''}" for what, k in sorted(counts.items()))
            n = len(self._held)
            kept = (f"; {n} value{'s' if n > 1 else ''} held {fmt} between the steps that write and read "
                    f"{'them' if n > 1 else 'it'}" if n else "")
            notes.append(f"precision: {kinds} with {fmt} operands on AMX (float32 accumulation){kept}; everything "
                         "else float32")
        elif self._precision != "fp32":
            notes.append(f"precision: {self._precision} allowed, but no product here took it (oneDNN runs none of "
                         "them on AMX, or the graph has none): float32 throughout")
        if self._tuner is not None:
            notes.append("threads: each run's own time picks wide (the policy's threads) or narrow (one "
                         "thread for the native kernels and MKL), re-checked now and then (threads.ThreadTuner)"
                         + ("; wide from the start: a smaller size of this graph found it clearly faster"
                            if self._tuner.known_wide else ""))
        return notes

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
        with thread_cap(1 if narrow else self._thread_cap):
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

    def _tunable(self) -> bool:
        """Whether wide and narrow differ for this graph: some kernel could use more than
        one thread (the native kernels under the thread policy's cap, or MKL's products),
        and the graph does enough work for threads to matter at all."""
        lib = native_library()
        with thread_cap(self._thread_cap):
            wide_native = lib is not None and lib.threads() > 1
        wide_mkl = self._mkl is not None and self._mkl.max_threads() > 1
        products = any(n.op in PRODUCT_OPS for n in self._nodes)
        if not (wide_native or (wide_mkl and products)):
            return False
        return products or self._work() >= TUNE_MIN_ELEMENTS

    def _work(self) -> int:
        """Elements over the graph's nodes: how much work threads may split (``threads``)."""
        return sum(n.size for n in self._nodes)

    def _bind_plan_capped(self, arena: Arena, stats: PlanStats, outputs: Outputs | None) -> _Plan:
        slots: list[Any] = [None] * len(self._input_ids)
        slot_of = {nid: k for k, nid in enumerate(self._input_ids)}
        values: dict[int, Any] = {}
        groups: dict[int, _Group] = {}
        concats: dict[int, np.ndarray] = {}  # a concat's buffer, taken at its first input computed in place
        steps: list[Callable[[], Any]] = []
        fresh: list[Dyn] = []
        kinds, cl = self._kinds, self._cl
        for node in self._nodes:
            nid, kind = node.id, kinds[node.id]
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
                    groups[cid] = _Group(arena.take(cat.size * dtype.itemsize), self._ends[cid])
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
            for i in {*read, nid}:
                group = groups.get(i)
                if group is not None and not group.released and group.end <= nid:
                    arena.give(group.raw)
                    group.released = True
        stats.steps = len(steps)
        recycle = Outputs(len(self._outputs) + len(fresh)) if outputs is None else outputs
        run = bind_run(self._input_names, steps, [values[i] for i in self._outputs], slots, recycle, fresh)
        plan = _Plan(run, slots, stats, self._generation, arena.held, recycle)
        weakref.finalize(plan, warm_pool().give, arena.owned)  # its buffers, kept warm once nothing can run it
        return plan

    def _output_buffer(self, node: Node, values: dict[int, Any], groups: dict[int, _Group], arena: Arena,
                       stats: PlanStats) -> np.ndarray:
        """An input's buffer when the op may overwrite it and nothing reads it later, else a
        buffer from the arena."""
        end = self._ends[node.id]
        shape, dtype = node.shape, np.dtype(node.dtype)
        for pos in inplace_positions(node):
            src = node.inputs[pos]
            group = groups.get(src)
            if group is None or group.end > node.id:
                continue
            arr = values[src]
            if arr.shape != shape or arr.dtype != dtype:
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

    # ------------------------------------------------------------------ running
    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        tuner = self._tuner
        try:
            plan = self._pool.pop()
        except IndexError:
            plan = self._bind_plan()
        if tuner is None:
            return self._run_plan(plan, plan, inputs)
        mode = tuner.next_mode()
        narrow = mode == "narrow"
        if plan.twin is None and (narrow or tuner.comparing()):
            # Bound before the clock starts (the tuner compares runs), and while the first
            # comparison is pending already in a wide run before it (this plan is this
            # run's alone until it goes back to the pool): not inside the narrow run a
            # caller times (20-35 ms at batch 1 for a segmentation net, a few runs after a
            # benchmark's warm-up).
            plan.twin = self._bind_plan(True, over=plan)
        runner = plan.twin if narrow else plan
        assert runner is not None
        mkl = self._mkl if narrow else None
        previous = mkl.local_threads(1) if mkl is not None else 0
        t0 = time.perf_counter()
        try:
            outs = self._run_plan(plan, runner, inputs)
        finally:
            if mkl is not None:
                mkl.local_threads(previous)
        tuner.observe(mode, time.perf_counter() - t0)
        return outs

    def _run_plan(self, plan: _Plan, runner: _Plan, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run ``runner`` (``plan`` or its twin), then give ``plan`` back to the pool."""
        try:
            return runner.run(inputs)
        except BaseException as exc:
            runner.slots[:] = [None] * len(runner.slots)  # hold no caller array past the run
            missing = [name for name in self._input_names if name not in inputs]
            if isinstance(exc, KeyError) and missing:
                raise InputError(f"graph {self._graph_name!r}: missing input(s) {missing}") from None
            raise
        finally:
            if plan.generation == self._generation:  # else bound before set_param changed a baked value
                self._pool.append(plan)

    def set_param(self, name: str, value: np.ndarray) -> None:
        """Copy ``value`` into the param's resident array (seen by every plan) and
        recompute the folded values that depend on it."""
        target = self._params.get(name)
        if target is None:
            raise InputError(f"set_param: graph {self._graph_name!r} has no param {name!r}; "
                             f"its params: {sorted(self._params)}")
        value = np.asarray(value)
        if value.dtype != target.dtype:
            raise InputError(f"set_param {name!r}: expected dtype {target.dtype}, got {value.dtype} (no silent casts)")
        if value.shape != target.shape:
            raise InputError(f"set_param {name!r}: expected shape {target.shape}, got {value.shape}")
        if borrowed(target):
            self._own_params()
            target = self._params[name]
        np.copyto(target, value)
        for deps, steps in self._folds:
            if name in deps:
                for step in steps:
                    step()
        for source, make, array, deps in self._derived_arrays.values():
            if name in deps:
                make(source, array)  # in place: the plans' steps hold its address
        if name in self._baked:  # steps hold its old values: plans are bound again, as they are needed
            self._generation += 1
            self._pool.clear()

    def _own_params(self) -> None:
        """Own every borrowed param (``params.py``) and build the executable again over the
        owned copies: its folds, derived arrays and plans read them from now on (a plan of
        the borrowed arrays that a run in another thread gives back later is dropped: a
        new generation). The thread tuner's verdict is kept."""
        tuner = self._tuner
        with owned_rebuild(self._params, self._family) as owned:
            self.__init__(self._graph, owned, self._generation + 1, precision=self._precision)  # type: ignore[misc]
        self._tuner = tuner

    # ------------------------------------------------------------------ introspection
    def plan_stats(self) -> dict[str, int]:
        """How a plan uses memory and steps, and how many plans exist (for tests and tools)."""
        s = self._stats
        return {
            "plans": self._plans_built, "pooled": len(self._pool),
            "narrow": sum(p.twin is not None for p in self._pool), "steps": s.steps, "buffers": s.buffers,
            "buffer_bytes": s.buffer_bytes, "allocations": s.allocations, "reused": s.reused,
            "inplace": s.inplace, "views": s.views,
            "folded": sum(1 for n in self._nodes if self._kinds[n.id] == RESIDENT and n.op not in
                          (OpKind.PARAM, OpKind.CONSTANT)),
        }

    @property
    def num_buffers(self) -> int:
        """Raw buffers one plan holds (intermediates and scratch, after reuse)."""
        return self._stats.buffers

    def __repr__(self) -> str:
        return f"<CpuExecutable {self._graph_name!r}: {self._stats.steps} steps, {self._stats.buffers} buffers>"
