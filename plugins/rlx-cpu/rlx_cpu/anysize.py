"""One executable for every size of a symbolic graph: kernels that read their sizes per run.

Why: rlx-core compiles a symbolic graph once per shape class, and a server fed a new
sequence length on most requests paid that compile on each (a 2-layer BERT-style encoder:
~8 ms to specialize the lowered graph and bind a plan, its dense layers' oneDNN primitives
made again for the new row count, on a request ORT served in 1 ms), then a first run
slower than the next (fresh buffers). ``CpuBackend.compile_symbolic`` returns this
executable instead: the core runs every new set of sizes on it with no compile, and
compiles a static plan only for sizes that recur (``rlx_core.compiler.dynamic``).

How it runs. Compiling analyses the graph as lowered once (symbolic shapes): residents
(params, constants and what is computed from them alone, folded once and again by
``set_param``), the values of the sizes alone (``_sizes_only``: kept per size), each
value's last reader, a slot per value (values whose lives do not overlap share one:
``_assign_slots``), and one runner per node. A run binds the symbols from the inputs'
sizes, evaluates each node's shape, views it in its slot's buffer in the run's arena
(``anysize_memory``: buffers kept from earlier runs, grown when a run needs more, warm
once the largest request has been seen: no buffer is looked for or given back per node),
or writes over an input that dies there, and runs the node. The runners:

- dense layers, elementwise ops and regions, layer norm, attention, softmax and slices:
  kernels that read their sizes from the run's arrays (``anysize_kernels``);
- mask arithmetic on integers and bools, gathers, concats and reductions: numpy calls
  that compute exactly as the interpreter (``anysize_numpy``);
- reshape: a view;
- every other op: the plan's own kernel, built for this run's arrays and run at once
  (the same kernels a plan runs, so the same answers), for the ops whose building is
  cheap next to their run; and the fallback of the kernels above for arrays that do not
  suit them.

What it declines (``None``, with the reason logged: rlx-core then compiles each shape
class): graphs with convolutions or pools. Their speed is in what a plan fixes per size
(channels-last layouts, packed weights, a oneDNN primitive per geometry), and their
sizes (a batch) recur, where a static plan per class serves best.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from rlx_core.errors import InputError
from rlx_core.ir import Graph, Node
from rlx_core.ir.internal_types import infer_any
from rlx_core.ir.ops import OpKind
from rlx_core.ir.shape_rules import has_sym, holds_sym
from rlx_core.ir.sized import is_sized, materialize
from rlx_core.ir.specialize import evaluated_attrs
from rlx_core.ir.symbolic import Sym, free_symbols
from rlx_core.plugin import Executable, shape_family

from . import bf16_units
from .anysize_kernels import (
    Place,
    Runner,
    attention_runner,
    dense_layer,
    dense_runner,
    layer_norm_runner,
    product_runner,
    region_runner,
    slice_runner,
    softmax_runner,
    transpose_runner,
)
from .anysize_memory import Arena, RunContext
from .anysize_numpy import numpy_runner
from .binding import _build_with
from .executor import kernel_ops
from .kernels import inplace_positions
from .native import library as native_library
from .native import thread_cap
from .onednn_dense import RunTimeDense
from .params import borrowed, owned_rebuild, param_array
from .regions import RegionTemplate
from .residents import _Owned
from .settings import ANY_SIZE
from .steps import aligned_empty, bind, owner
from .threads import native_thread_cap

__all__ = ["AnySizeExecutable", "DECLINED_OPS", "any_size_executable"]

log = logging.getLogger("rlx_cpu")

#: Ops whose graphs are compiled per shape class instead (see the module).
DECLINED_OPS = frozenset({OpKind.CONV2D, OpKind.FUSED_CONV, OpKind.MAX_POOL2D, OpKind.AVG_POOL2D})
#: What kernels built per run may derive from residents and keep (``BuildContext.derived``
#: keys): those that hold for every size of the graph. A GEMM's packed B is the same for
#: any number of rows; oneMKL's packed B is made per row count (and ten times the weights).
_DERIVED_KINDS = frozenset({"rlx_gemm_pack_b", "conv_bias_column"})
#: Bytes of values of the sizes alone an executable keeps (``_sizes_only``).
_KEPT_BYTES = 32 * 1024 * 1024


def any_size_executable(graph: Graph, precision: str = "fp32") -> AnySizeExecutable | None:
    """The any-size executable of ``graph`` (symbolic, legalized for cpu), or ``None``
    where a static plan per shape class serves it better (logged), or the user said so
    (``RLX_CPU_ANY_SIZE=0``)."""
    if not ANY_SIZE.read():
        return None
    declined = sorted({n.op.value for n in graph.nodes if n.op in DECLINED_OPS})
    if declined:
        log.debug("rlx-cpu: graph %r is compiled per shape class: it has %s", graph.name, ", ".join(declined))
        return None
    missing = sorted({n.op.value for n in graph.nodes if n.op.value not in kernel_ops() and n.op not in
                      (OpKind.INPUT, OpKind.PARAM, OpKind.CONSTANT)})
    if missing:
        log.debug("rlx-cpu: graph %r has op(s) with no cpu kernel: %s", graph.name, ", ".join(missing))
        return None
    return AnySizeExecutable(graph, precision=precision)


class _Type(NamedTuple):
    """What a type rule reads of an input: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: str


class AnySizeExecutable(Executable):
    """A symbolic graph compiled once for cpu; ``run`` takes any sizes it accepts (see
    the module)."""

    def __init__(self, graph: Graph, owned: Mapping[str, np.ndarray] | None = None, *,
                 precision: str = "fp32") -> None:
        self._graph = graph
        self._native = native_library()  # (its workers' pinning is checked before each run)
        self._precision = precision  # CompileOptions.precision: the dense layers' operands (onednn.reduced)
        self._family = shape_family()
        self._name = graph.name
        nodes = graph.nodes
        self._nodes = nodes
        self._outputs = graph.outputs
        self._input_ids = graph.inputs
        self._resident: dict[int, np.ndarray] = {}
        self._params: dict[str, np.ndarray] = {}
        self._folds: list[tuple[Node, list[np.ndarray], np.ndarray]] = []
        self._dense: list[RunTimeDense] = []
        self._templates: list[RegionTemplate] = []
        self._kept: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}  # values of the sizes alone (see _by_sizes)
        self._kept_bytes = 0
        self._kept_lock = threading.Lock()
        self._cap, _ = native_thread_cap(n.op for n in nodes)
        self._fold(graph, owned)
        self._resident_roots = {id(owner(a)) for a in self._resident.values()}
        self._derived_arrays: dict[Any, tuple[np.ndarray, Callable[..., np.ndarray], np.ndarray]] = {}
        self._by_sizes = self._sizes_only()
        self._broadcasts = self._broadcast_views()
        self._ends = self._liveness()
        outputs = {nid: k for k, nid in reversed(list(enumerate(graph.outputs)))}  # a node's first output place
        program: list[tuple[int, Runner]] = []
        self._owns: set[int] = set()  # nodes whose value holds a slot of the arena
        self._inplace: dict[int, int] = {}  # a node computed over its input's slot: that input
        self._slot_cells: dict[int, list[int]] = {}  # each slot holder's slot, as its place reads it
        for node in nodes:
            if node.id not in self._resident and node.op is not OpKind.INPUT:
                program.append((node.id, self._runner(node, outputs.get(node.id))))
        self._slots = self._assign_slots([nid for nid, _ in program])
        self._program = program
        self._arenas: list[Arena] = []
        self._values: list[Any] = [self._resident.get(i) for i in range(len(nodes))]  # (set_param refills in place)
        self._input_names = tuple((i, nodes[i].name) for i in graph.inputs)

    # ------------------------------------------------------------------ analysis
    def _fold(self, graph: Graph, owned_params: Mapping[str, np.ndarray] | None) -> None:
        """Params (borrowed, or ``owned_params``: ``params.py``; shared with the graph's other
        compiles), constants, and every node of static shape computed from those alone,
        computed now."""
        owned = _Owned()
        for node in self._nodes:
            if node.op is OpKind.PARAM:
                arr = param_array(node, graph.value(node.id), owned_params)
                self._params[node.name] = arr
            elif node.op is OpKind.CONSTANT and not is_sized(node.attrs):
                arr = np.asarray(graph.value(node.id), dtype=node.dtype, order="C")
            elif (node.op not in (OpKind.INPUT, OpKind.CONSTANT) and not has_sym(node.shape)
                  and node.inputs and all(i in self._resident for i in node.inputs)):
                ins = [self._resident[i] for i in node.inputs]
                if node.op is OpKind.RESHAPE:
                    arr = ins[0].reshape(node.shape)
                else:
                    arr = aligned_empty(node.shape, node.dtype)
                    self._compute(node, ins, arr, owned)
                    self._folds.append((node, ins, arr))
            else:
                continue
            self._resident[node.id] = arr

    def _sizes_only(self) -> dict[int, tuple[str, ...]]:
        """The values computed from the sizes alone (a sized constant such as ``Range(0,
        seq)``, and what is computed from those and residents only: the position embeddings
        it gathers) that depend on one symbol, with it. A run keeps them by its value
        (``_KEPT_BYTES`` in all): a request of a sequence length met before finds its
        position embeddings computed (a plan folds them: they are constants at its sizes)."""
        found: dict[int, tuple[str, ...]] = {}
        for node in self._nodes:
            if node.id in self._resident or node.op is OpKind.INPUT or (not node.inputs and not is_sized(node.attrs)):
                continue
            if not all(i in self._resident or i in found for i in node.inputs):
                continue
            syms = set(free_symbols(node.shape)) | set(free_symbols(tuple(v for v in node.attrs.values()
                                                                            if holds_sym(v))))
            if is_sized(node.attrs):
                syms |= free_symbols((node.attrs.get("start", 0), *node.attrs.get("values", ())))
            for i in node.inputs:
                syms |= set(found.get(i, ()))
            found[node.id] = tuple(sorted(syms))
        # Kept: values of one symbol (a sequence length recurs across requests); one of two
        # (batch and sequence) almost never does, and keeping it cost fresh memory per request.
        return {nid: syms for nid, syms in found.items() if len(syms) <= 1}

    def _keep(self, key: tuple[int, tuple[int, ...]], arr: np.ndarray) -> None:
        """Keep a value of the sizes alone, the oldest dropped past ``_KEPT_BYTES``."""
        arr.flags.writeable = False
        with self._kept_lock:
            if key in self._kept:  # another run made it meanwhile
                return
            self._kept[key] = arr
            self._kept_bytes += arr.nbytes
            while self._kept_bytes > _KEPT_BYTES and len(self._kept) > 1:
                old = self._kept.pop(next(iter(self._kept)))
                self._kept_bytes -= old.nbytes

    def _derived(self, source: Any, key: Any, make: Callable[[np.ndarray, np.ndarray | None], np.ndarray],
                 also: Sequence[Any] = ()) -> np.ndarray | None:
        """``BuildContext.derived`` for kernels built per run: made once and kept, for the
        kinds that hold at every size (``_DERIVED_KINDS``: a weight packed for rlx's GEMM,
        the same for any row count) of residents; ``None`` for anything else (the kernel
        does without: a pack made per run would cost more than it saves). Refilled in place
        by ``set_param``."""
        if key[0] not in _DERIVED_KINDS or not all(isinstance(a, np.ndarray) and id(owner(a)) in self._resident_roots
                                                   for a in (source, *also)):
            return None
        k = (*((a.__array_interface__["data"][0], a.shape, a.strides) for a in (source, *also)), key)
        with self._kept_lock:
            entry = self._derived_arrays.get(k)
            if entry is None:
                entry = self._derived_arrays[k] = (source, make, make(source, None))
        return entry[2]

    @staticmethod
    def _compute(node: Node, ins: list[Any], out: np.ndarray, ctx: Any) -> None:
        with np.errstate(all="ignore"):
            for step in _build_with(node, ins, out, ctx):
                bind(step, [])()

    def _liveness(self) -> list[int]:
        """For each value, the index of the last node reading it or a view of it (graph
        outputs: past the end)."""
        nodes = self._nodes
        last = [n.id for n in nodes]
        for node in nodes:
            for i in node.inputs:
                last[i] = max(last[i], node.id)
        for i in self._outputs:
            last[i] = len(nodes)
        for node in reversed(nodes):
            base = self._view_of(node)
            if base is not None:
                last[base] = max(last[base], last[node.id])
        return last

    def _view_of(self, node: Node) -> int | None:
        """The value ``node`` is a view of (a reshape's input, the operand a product with
        ones broadcasts), else None."""
        if node.op is OpKind.RESHAPE:
            return node.inputs[0]
        return self._broadcasts.get(node.id)

    def _root(self, nid: int) -> int:
        """The value whose memory ``nid`` reads (itself, or the base of its views)."""
        node = self._nodes[nid]
        base = self._view_of(node)
        return nid if base is None else self._root(base)

    def _broadcast_views(self) -> dict[int, int]:
        """Products with a sized constant of ones (an exporter's ``Expand`` of a mask to the
        batch, converted as ``x * ones``), each with the operand it only broadcasts: ``x *
        1`` is ``x`` exactly in IEEE arithmetic, so the value is ``x`` seen at the product's
        shape (a view: nothing computed, nothing written; a plan folds the same value)."""
        found: dict[int, int] = {}
        for node in self._nodes:
            if node.op is not OpKind.MUL or not node.dtype.startswith("float") or node.id in self._resident:
                continue
            for k in (0, 1):
                one, other = self._nodes[node.inputs[k]], node.inputs[1 - k]
                if (one.op is OpKind.CONSTANT and is_sized(one.attrs) and one.attrs["sized"] == "fill"
                        and one.attrs["value"] == 1 and one.dtype == node.dtype
                        and self._nodes[other].dtype == node.dtype):
                    found[node.id] = other
                    break
        return found

    def _assign_slots(self, order: list[int]) -> int:
        """Give each value that holds memory of the run a slot, in program ``order``: a
        slot whose last value's last reader has run, else a new one; a value computed over
        its input takes the input's. Returns the number of slots (each grows to the largest
        value it has held: buffers kept from run to run, whatever the sizes)."""
        slot_of: dict[int, int] = {}
        free: list[int] = []
        ends: dict[int, list[int]] = {}
        passed = set(self._inplace.values())  # (one passed on is given back by the last holder)
        for nid in self._owns - passed:
            ends.setdefault(self._ends[nid], []).append(nid)
        count = 0
        for nid in order:
            if nid in self._inplace:
                slot_of[nid] = slot_of[self._inplace[nid]]
            elif nid in self._owns:
                if free:
                    slot_of[nid] = free.pop()
                else:
                    slot_of[nid], count = count, count + 1
                self._slot_cells[nid][0] = slot_of[nid]
            for done in ends.get(nid, ()):  # after its last reader ran: free for what comes next
                free.append(slot_of[done])
        return count

    def _inplace_source(self, node: Node) -> int | None:
        """An input whose buffer ``node`` may write its result over: one ``inplace_positions``
        allows, of the same symbolic shape and dtype, holding a buffer of its own that no
        one reads after ``node`` (no view of it either: views extend its end), read once
        by ``node``."""
        for pos in inplace_positions(node):
            src = node.inputs[pos]
            other = self._nodes[src]
            if (src in self._owns and self._ends[src] == node.id
                    and sum(self._root(i) == src for i in node.inputs) == 1  # nor a view of it
                    and other.dtype == node.dtype and tuple(other.shape) == tuple(node.shape)):
                return src
        return None

    def _runner(self, node: Node, output_at: int | None) -> Runner:
        """The function computing ``node`` in a run (its value in its slot of the arena
        where ``self._owns`` says so: ``_assign_slots``)."""
        shape_of = _shape_fn(node.shape)
        dtype = np.dtype(node.dtype)
        nid, inputs = node.id, node.inputs
        if node.op is OpKind.RESHAPE:
            def view(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
                return values[inputs[0]].reshape(shape_of(env))
            return view
        if nid in self._broadcasts:
            base = self._broadcasts[nid]

            def broadcast(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
                return np.broadcast_to(values[base], shape_of(env))
            return broadcast
        if node.op is OpKind.CONSTANT:  # a sized one (the others are resident)
            def sized(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
                return materialize(node.attrs, shape_of(env), node.dtype, env)
            return self._kept_runner(node, sized) if nid in self._by_sizes else sized
        place: Place
        dense = dense_layer(node, self._nodes, self._resident, self._precision)
        if dense is not None:
            self._dense.append(dense)
        kept = nid in self._by_sizes
        src = self._inplace_source(node) if output_at is None and dense is None and not kept else None
        if kept:  # a value of the sizes alone: its own array, kept for them
            def place(values: list[Any], env: Mapping[str, int], arena: Arena) -> np.ndarray:
                return np.empty(shape_of(env), dtype)
        elif output_at is not None:  # handed to the caller
            def place(values: list[Any], env: Mapping[str, int], arena: Arena) -> np.ndarray:
                return arena.outputs.take(output_at, shape_of(env), dtype)
        elif src is not None:  # over an input that dies here: its slot
            self._inplace[nid] = src

            def place(values: list[Any], env: Mapping[str, int], arena: Arena) -> np.ndarray:
                return values[src]
        else:
            cell = self._slot_cells[nid] = [0]  # (its slot, set once every node's is known)

            def place(values: list[Any], env: Mapping[str, int], arena: Arena) -> np.ndarray:
                return arena.slot(cell[0], shape_of(env), dtype)
        if output_at is None and not kept:
            self._owns.add(nid)
        fn = self._compute_runner(node, place, dense)
        return self._kept_runner(node, fn) if kept else fn

    def _compute_runner(self, node: Node, place: Place, dense: RunTimeDense | None) -> Runner:
        built = self._built(node)
        if dense is not None:
            small = product_runner(node, self._nodes, self._resident, place, built, self._templates)
            return dense_runner(node, dense, place, small)
        fn = (product_runner(node, self._nodes, self._resident, place, built, self._templates)
              or region_runner(node, self._nodes, self._resident, place, built, self._templates)
              or layer_norm_runner(node, self._resident, place, built)
              or attention_runner(node, self._nodes, place, built) or softmax_runner(node, place, built)
              or slice_runner(node, place, built) or transpose_runner(node, place)
              or numpy_runner(node, self._nodes, place, built))
        if fn is not None:
            return fn
        inputs = node.inputs

        def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
            out = place(values, env, arena)
            if out.size:
                built([values[i] for i in inputs], out, env, arena)
            return out
        return run

    def _kept_runner(self, node: Node, compute: Runner) -> Runner:
        """``compute`` of a value of the sizes alone, kept for the values of its symbols."""
        nid, syms, kept = node.id, self._by_sizes[node.id], self._kept

        def run(values: list[Any], env: Mapping[str, int], arena: Arena) -> Any:
            key = (nid, tuple(env[s] for s in syms))
            arr = kept.get(key)
            if arr is None:
                arr = compute(values, env, arena)
                self._keep(key, arr)
            return arr
        return run

    def _built(self, node: Node) -> Callable[[list[Any], np.ndarray, Mapping[str, int], Arena], None]:
        """``node`` computed into ``out`` by the plan's kernel for it, built for these arrays
        (its attrs evaluated at the run's sizes where they hold symbols)."""
        symbolic_attrs = any(holds_sym(v) for v in node.attrs.values()) or (
            node.op is OpKind.ATTENTION and node.attrs.get("scale") is None)  # 1/sqrt(D) of a symbolic D
        in_dtypes = [self._nodes[i].dtype for i in node.inputs]
        compute, derived = self._compute, self._derived

        def built(ins: list[Any], out: np.ndarray, env: Mapping[str, int], arena: Arena) -> None:
            concrete = _concrete(node, out.shape, env, ins, in_dtypes) if symbolic_attrs else (
                dataclasses.replace(node, shape=out.shape))
            ctx = RunContext(arena, derived)
            try:
                compute(concrete, ins, out, ctx)
            finally:
                ctx.release()
        return built

    # ------------------------------------------------------------------ running
    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        graph = self._graph
        env = graph.bind(graph.input_shapes(inputs))  # the sizes, and an InputError for ones the graph refuses
        if self._native is not None:
            self._native.check_team()
        try:
            arena = self._arenas.pop()
        except IndexError:
            arena = Arena(len(self._outputs), self._slots)
        values = self._values[:]  # the residents in place, the rest None
        for nid, name in self._input_names:
            values[nid] = inputs[name]
        try:
            with thread_cap(self._cap), np.errstate(all="ignore"):
                for nid, runner in self._program:
                    values[nid] = runner(values, env, arena)
            return self._outputs_of(values)
        finally:
            self._arenas.append(arena)

    def _outputs_of(self, values: list[Any]) -> list[np.ndarray]:
        """The graph's outputs: arrays computed for the caller as they are; a copy of any
        other (a view of a buffer, a resident, an input, an output listed twice)."""
        outs, handed = [], set()
        for i in self._outputs:
            arr = values[i]
            fresh = (i not in self._owns and i not in self._resident and i not in self._input_ids
                     and i not in self._by_sizes and self._view_of(self._nodes[i]) is None and i not in handed)
            outs.append(arr if fresh else np.array(arr))
            handed.add(i)
        return outs

    def set_param(self, name: str, value: np.ndarray) -> None:
        target = self._params.get(name)
        if target is None:
            raise InputError(f"set_param: graph {self._name!r} has no param {name!r}; its params: "
                             f"{sorted(self._params)}")
        value = np.asarray(value)
        if value.dtype != target.dtype or value.shape != target.shape:
            raise InputError(f"set_param {name!r}: expected {target.dtype}{list(target.shape)}, got "
                             f"{value.dtype}{list(value.shape)}")
        if borrowed(target):  # own every param, then build again over the owned copies (``params.py``)
            with owned_rebuild(self._params, self._family) as owned:
                self.__init__(self._graph, owned, precision=self._precision)  # type: ignore[misc]
            target = self._params[name]
        np.copyto(target, value)
        owned = _Owned()
        for node, ins, out in self._folds:  # in graph order: a fold reads earlier ones
            self._compute(node, ins, out, owned)
        for dense in self._dense:
            dense.refresh()
        for source, make, array in self._derived_arrays.values():  # in the order made (a pack of a pack)
            make(source, array)
        for template in self._templates:  # a param folded into a fused activation
            template.forget()
        with self._kept_lock:  # values of the sizes alone may read the param (a position table)
            self._kept.clear()
            self._kept_bytes = 0

    def report_notes(self) -> list[str]:
        dense = f"; {len(self._dense)} dense layer(s) on one oneDNN matmul for every row count" if self._dense else ""
        notes = [f"any size: one executable runs every size, kernels reading their sizes per run{dense}"]
        rounded = [d.precision for d in self._dense if d.precision != "float32"]
        if rounded:
            notes.append(f"precision: {len(rounded)} dense layer{'s' if len(rounded) > 1 else ''} with {rounded[0]} "
                         f"operands on {bf16_units.unit()} (float32 accumulation); everything else float32")
        return notes

    def __repr__(self) -> str:
        return f"<AnySizeExecutable {self._name!r}: {len(self._program)} runners>"


def _shape_fn(shape: tuple[Any, ...]) -> Callable[[Mapping[str, int]], tuple[int, ...]]:
    """``shape`` (ints and ``Sym``) evaluated under a run's sizes: a function that builds
    the tuple directly (a plain symbol read from the sizes, an expression evaluated, an
    int as it is), ~0.1 µs a call where a loop over the dims took ~0.5 (a run evaluates a
    shape for nearly every node)."""
    if not has_sym(shape):
        fixed = tuple(int(d) for d in shape)
        return lambda env: fixed
    dims = tuple(d.name if isinstance(d, Sym) and d.name is not None else d for d in shape)
    kinds = tuple("s" if type(d) is str else "e" if isinstance(d, Sym) else "i" for d in dims)
    return _shape_maker(kinds)(*(d if k != "i" else int(d) for d, k in zip(dims, kinds)))


@functools.cache
def _shape_maker(kinds: tuple[str, ...]) -> Callable[..., Callable[[Mapping[str, int]], tuple[int, ...]]]:
    """The factory of ``_shape_fn``'s functions for one pattern of dims (``s`` a symbol's
    name, ``e`` an expression, ``i`` an int), written once per pattern."""
    args = [f"d{k}" for k in range(len(kinds))]
    items = [f"env[{a}]" if k == "s" else f"{a}.evaluate(env)" if k == "e" else a for a, k in zip(args, kinds)]
    source = f"def make({', '.join(args)}):\n    return lambda env: ({', '.join(items)},)\n"
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # (the source is built here from the pattern alone)
    return namespace["make"]


def _concrete(node: Node, shape: tuple[int, ...], env: Mapping[str, int], ins: list[np.ndarray],
              in_dtypes: list[str]) -> Node:
    """``node`` as a static graph would hold it at these sizes: its attrs evaluated and
    normalized by its type rule again (a slice's bounds, a reshape's target), as
    ``Graph.specialize`` does."""
    norm, _, _ = infer_any(node.op, [_Type(tuple(x.shape), dt) for x, dt in zip(ins, in_dtypes)],
                           evaluated_attrs(node, env))
    return dataclasses.replace(node, attrs=norm, shape=shape)

