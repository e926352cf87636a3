"""Compiling a graph into flat execution plans, and running them.

Compiling analyses the graph once: which values are run-time inputs, which are resident
(params, constants, and every node computed only from those, folded at compile time and
recomputed by ``set_param``), which are views (a reshape of a buffer-backed value), and
how long each value lives. A *plan* is then bound from that analysis: every other value
gets a preallocated buffer, buffers are reused once their value is dead, and each node
becomes a few zero-argument steps bound to those buffers. ``run`` only places the input
arrays into the plan's slots, calls the steps in order, and copies out the outputs.

``CpuExecutable`` is three modules, one concern each: this one (the analysis at
construction, the thread policy, running and introspection), ``residents.py`` (the
weights, folded constants and arrays derived from them, refreshed by ``set_param``) and
``binding.py`` (a plan's buffers and steps, and how buffers are reused).

Layouts: where oneDNN is installed (else, on AVX-512 hosts, for rlx's own channels-inner
convolution), ``layout.plan`` picks the values held channels-last (NHWC) between
convolutions; a node reading or writing one is built by ``layout.steps``
with NHWC arrays (same bytes, permuted shape), and the transposes it makes free are
views like a reshape. Every other value, and every graph output, stays NCHW.

Threads: a plan's buffers make it single-threaded, so the executable keeps a pool of
plans; ``run`` pops one (a new one when the pool is empty), runs it and pushes it back.
``list.pop`` and ``list.append`` are atomic under the GIL: the hot path takes no lock.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from rlx_core.errors import GraphError, InputError
from rlx_core.ir import Graph, Node
from rlx_core.ir.ops import OpKind
from rlx_core.plugin import Executable, shape_family

from . import bf16_units, blas, held, images, layout, onednn
from .binding import _BUILDERS, BUFFER, DYNAMIC, RESIDENT, VIEW, PlanBinding, _Plan
from .gathers import find_resize_taps
from .native import library as native_library
from .native import thread_cap
from .plan_arena import Layout, PlanStats
from .residents import Residents
from .threads import PRODUCT_OPS, family_tuner, native_thread_cap

__all__ = ["CpuExecutable", "PlanStats", "kernel_ops"]

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


class CpuExecutable(Residents, PlanBinding, Executable):
    """A graph compiled for the cpu backend: a pool of bound plans over shared residents."""

    def __init__(self, graph: Graph, owned: Mapping[str, np.ndarray] | None = None, generation: int = 0, *,
                 precision: str = "fp32") -> None:
        self._graph = graph  # (its values are the params' borrowed arrays: ``params.py``)
        self._native = native_library()  # (its workers' pinning is checked before each run)
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
        self._in_concat, self._concat_ends = self._concat_blocks()
        self._segments = self._image_segments()
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
        found = layout.plan(graph, [k == BUFFER for k in kinds], [k == RESIDENT for k in kinds],
                            native_kernels=lib is layout.NATIVE)
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

    def _image_segments(self) -> tuple[images.Segment, ...]:
        """The runs of nodes bound image by image (``images.py``): every node of one made
        by its op's own builder (or ``layout.steps``, NHWC) over plain buffers: none held in
        a reduced format, read through a transpose made a view, in a concat's block,
        handed to the caller or read by a resize."""
        special = {*self._cl_views, *self._held, *self._taps, *self._elided, *self._handoff,
                   *self._in_concat, *self._concat_ends}
        eligible = [self._kinds[n.id] == BUFFER and n.id not in special and not any(i in special for i in n.inputs)
                    for n in self._nodes]
        return tuple(images.segments(self._nodes, [k == RESIDENT for k in self._kinds], eligible))

    def _concat_blocks(self) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
        """Values computed straight into their concat's buffer: id -> (the outermost
        concat's id, the element offset of its block), and each outermost concat's group
        end (the last node index reading it or any value in it). A concat qualifies when
        each input is a contiguous block of its output (every axis before the concat's
        has length 1); an input does when it is a buffer of the concat's dtype, not a
        view's base (a reshape), not handed to the caller, and not an earlier block of the
        same concat. Its other readers may be any nodes: they only read it, and the
        buffer lives until the last of them (no reader writes over it in place: the
        group's end is past theirs). A qualifying concat may itself be an input, or be
        the start of a later one (its inputs the first of the later one's): DenseNet's
        growing features, ``cat(cat(x, f1), f2)`` or, as exported and flattened,
        ``cat(x, f1)``, ``cat(x, f1, f2)``, ..., are one buffer, each layer's features
        computed into their block once (copying every earlier feature map into each new
        concat was 1.9-2.6 ms of DenseNet-169's 22 at batch 1; BENCHMARKS.md,
        "Concatenation chains in one buffer"). Not a value held channels-last or in a
        reduced format, nor a gather never made (``_elided``)."""
        blocks: dict[int, tuple[int, int]] = {}
        qualifying = [node for node in self._nodes if node.op is OpKind.CONCAT and self._kinds[node.id] == BUFFER
                      and node.id not in self._handoff and node.id not in self._cl and node.id not in self._held
                      and math.prod(node.shape[: node.attrs["axis"]]) == 1]
        ids = {node.id for node in qualifying}
        by_first: dict[int, list[Node]] = {}  # qualifying concats by their first input, in graph order
        for node in qualifying:
            by_first.setdefault(node.inputs[0], []).append(node)
        for a in qualifying:  # a concat whose inputs begin a later one's: a view at its start
            for b in by_first[a.inputs[0]]:
                if (b.id > a.id and b.attrs["axis"] == a.attrs["axis"] and b.dtype == a.dtype
                        and len(b.inputs) > len(a.inputs) and b.inputs[: len(a.inputs)] == a.inputs):
                    blocks[a.id] = (b.id, 0)
                    break
        for node in qualifying:
            axis, offset = node.attrs["axis"], 0
            inner = math.prod(node.shape[axis + 1 :])
            for i in node.inputs:
                src = self._nodes[i]
                if (self._kinds[i] == BUFFER and src.op is not OpKind.RESHAPE and src.dtype == node.dtype
                        and i not in self._handoff and i not in blocks and i not in self._cl and i not in self._held
                        and i not in self._elided and (src.op is not OpKind.CONCAT or i in ids)):
                    blocks[i] = (node.id, offset)
                offset += src.shape[axis] * inner
        roots: dict[int, tuple[int, int]] = {}
        for i in blocks:  # each block's offset in its outermost concat
            cid, offset = blocks[i]
            while cid in blocks:
                outer, at = blocks[cid]
                cid, offset = outer, offset + at
            roots[i] = (cid, offset)
        ends = {cid: self._ends[cid] for cid, _ in roots.values()}
        for i, (cid, _) in roots.items():
            ends[cid] = max(ends[cid], self._ends[i])
        return roots, ends

    # ------------------------------------------------------------------ threads
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

    # ------------------------------------------------------------------ running
    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if self._native is not None:
            self._native.check_team()
        tuner = self._tuner
        try:
            plan = self._pool.pop()
        except IndexError:
            plan = self._bind_plan()
        if tuner is None:
            return self._run_plan(plan, plan, inputs)
        mode = tuner.next_mode()
        narrow = mode == "narrow"
        if plan.twin is None and (narrow or tuner.narrow_next()):
            # Bound before the clock starts (the tuner compares runs), and for the first
            # comparison in the wide run just before its first narrow one (this plan is
            # this run's alone until it goes back to the pool): not inside the narrow run
            # a caller times (20-35 ms at batch 1 for a segmentation net, a few runs after
            # a benchmark's warm-up), nor in the first run (``ThreadTuner.narrow_next``).
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

    # ------------------------------------------------------------------ introspection
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
            notes.append(f"precision: {kinds} with {fmt} operands on {bf16_units.unit()} (float32 accumulation)"
                         f"{kept}; everything else float32")
        elif self._precision != "fp32":
            notes.append(f"precision: {self._precision} allowed, but no product here took it (oneDNN runs none of "
                         f"them on a unit that makes it pay here: {bf16_units.describe()}; or the graph has none): "
                         "float32 throughout")
        if self._tuner is not None:
            notes.append("threads: each run's own time picks wide (the policy's threads) or narrow (one "
                         "thread for the native kernels and MKL), re-checked now and then (threads.ThreadTuner)"
                         + ("; wide from the start: a smaller size of this graph found it clearly faster"
                            if self._tuner.known_wide else ""))
        return notes

    def plan_stats(self) -> dict[str, int]:
        """How a plan uses memory and steps, and how many plans exist (for tests and tools)."""
        s = self._stats
        return {
            "plans": self._plans_built, "pooled": len(self._pool),
            "narrow": sum(p.twin is not None for p in self._pool), "steps": s.steps, "buffers": s.buffers,
            "buffer_bytes": s.buffer_bytes, "allocations": s.allocations, "reused": s.reused,
            "inplace": s.inplace, "views": s.views, "per_image": s.per_image,
            "folded": sum(1 for n in self._nodes if self._kinds[n.id] == RESIDENT and n.op not in
                          (OpKind.PARAM, OpKind.CONSTANT)),
        }

    @property
    def num_buffers(self) -> int:
        """Raw buffers one plan holds (intermediates and scratch, after reuse)."""
        return self._stats.buffers

    def __repr__(self) -> str:
        return f"<CpuExecutable {self._graph_name!r}: {self._stats.steps} steps, {self._stats.buffers} buffers>"
