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
``set_param``), each value's last reader, and one runner per node. A run binds the
symbols from the inputs' sizes, evaluates each node's shape, takes its buffer from the
run's arena (buffers kept from earlier runs, sized in quarter powers of two: warm memory
once the largest request has been seen), runs the node, and gives each buffer back after
its last reader. The runners:

- a dense layer (``gemm`` with resident weights) on oneDNN, where this host chose oneDNN
  for products: one matmul primitive for every row count (``RunTimeDense``);
- float32 add, sub, mul and div: numpy's ufuncs into the buffer;
- reshape: a view; a sized constant (``Range(0, seq)``): computed from the sizes, kept
  for the sizes last seen;
- every other op: the plan's own kernel, built for this run's arrays and run at once
  (the same kernels a plan runs, so the same answers), for the ops whose building is
  cheap next to their run.

What it declines (``None``, with the reason logged: rlx-core then compiles each shape
class): graphs with convolutions or pools. Their speed is in what a plan fixes per size
(channels-last layouts, packed weights, a oneDNN primitive per geometry), and their
sizes (a batch) recur, where a static plan per class serves best.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from rlx_core.errors import InputError
from rlx_core.ir import Graph, Node
from rlx_core.ir.internal_types import ACTIVATION_OPS, Instruction, infer_any, program_types
from rlx_core.ir.ops import ELEMENTWISE_OPS, OpKind, slice_index
from rlx_core.ir.shape_rules import evaluate_attr, has_sym, holds_sym
from rlx_core.ir.sized import is_sized, materialize
from rlx_core.ir.symbolic import Sym, free_symbols
from rlx_core.plugin import Executable

from . import onednn
from .blas import matmul_now
from .executor import _build_with, _Owned, _param_copy, kernel_ops
from .kernels import inplace_positions
from .native import library as native_library
from .native import thread_cap
from .native_nn import LAYER_NORM_NS, SOFTMAX_NS
from .onednn_steps import ACTIVATION_POST, RunTimeDense
from .regions import SPLIT_NS, NoFit, RegionTemplate
from .settings import ANY_SIZE
from .steps import aligned_empty, bind
from .threads import native_thread_cap
from .warm_pool import warm_pool

__all__ = ["AnySizeExecutable", "DECLINED_OPS", "any_size_executable"]

log = logging.getLogger("rlx_cpu")

#: Ops whose graphs are compiled per shape class instead (see the module).
DECLINED_OPS = frozenset({OpKind.CONV2D, OpKind.FUSED_CONV, OpKind.MAX_POOL2D, OpKind.AVG_POOL2D})
#: Bytes of values of the sizes alone an executable keeps (``_sizes_only``).
_KEPT_BYTES = 32 * 1024 * 1024
#: A free buffer up to this size serves any smaller value (larger ones: values at least half their size).
_SMALL = 64 * 1024


def any_size_executable(graph: Graph) -> AnySizeExecutable | None:
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
    return AnySizeExecutable(graph)


class _Type(NamedTuple):
    """What a type rule reads of an input: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: str


def _rounded(nbytes: int) -> int:
    """The bytes of a new buffer for ``nbytes``: up to the next quarter power of two (so
    that sizes that grow a little reuse it), in whole cache lines."""
    size = 2 ** (math.ceil(4 * math.log2(max(nbytes, 64))) / 4)
    return -(-math.ceil(size) // 64) * 64


class _Arena:
    """The buffers of one run at a time, kept between runs: a value takes the smallest
    free buffer that holds it, a new one (from the warm pool, else fresh memory) only
    when none does, and gives it back after its last reader. Once the largest request
    has run, a run faults in no fresh memory (about half a millisecond per megabyte on
    this kind of host: the sizes of a stream of requests change on every one)."""

    __slots__ = ("_free", "_sizes", "outputs", "owned")

    def __init__(self, outputs: int) -> None:
        self._free: list[np.ndarray] = []  # sorted by size
        self._sizes: list[int] = []
        self.owned: list[np.ndarray] = []
        self.outputs = _Outputs(outputs)

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """A ``shape`` ``dtype`` array and the raw buffer under it (to give back)."""
        nbytes = math.prod(shape) * dtype.itemsize
        i = bisect.bisect_left(self._sizes, nbytes)
        if i < len(self._free) and self._sizes[i] <= max(2 * nbytes, _SMALL):  # no big buffer on a small value
            raw = self._free.pop(i)
            del self._sizes[i]
        else:
            size = _rounded(nbytes)
            raw = warm_pool().take(size)
            if raw is None:
                raw = aligned_empty(size, np.uint8)
            self.owned.append(raw)
        return raw[:nbytes].view(dtype).reshape(shape), raw

    def give(self, raw: np.ndarray) -> None:
        i = bisect.bisect_left(self._sizes, raw.nbytes)
        self._sizes.insert(i, raw.nbytes)
        self._free.insert(i, raw)


class _Outputs:
    """The arrays handed to the caller, kept so that a later run writes into the same
    memory once the caller has let them go (``steps.Outputs``' rule: nothing but this
    object refers to the memory): a new output is fresh memory, faulted in by the kernel
    that writes it. One per arena (a run at a time). What is counted is the buffer that
    owns the memory (``aligned_empty`` hands out a view of it: every view the caller
    holds refers to the owner, not to our view)."""

    __slots__ = ("_kept",)

    def __init__(self, count: int) -> None:
        self._kept: list[tuple[np.ndarray, np.ndarray] | None] = [None] * count  # (our view, its owner)

    def take(self, k: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = math.prod(shape) * dtype.itemsize
        kept = self._kept[k]
        if kept is not None and sys.getrefcount(kept[1]) == _UNOWNED:
            raw = kept[0]
            if nbytes <= raw.nbytes <= max(2 * nbytes, _SMALL):
                return raw[:nbytes].view(dtype).reshape(shape)
        raw = aligned_empty(_rounded(nbytes), np.uint8)
        self._kept[k] = (raw, _owner(raw))
        return raw[:nbytes].view(dtype).reshape(shape)


def _owner(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _unowned() -> int:
    """``sys.getrefcount`` of an owner only an ``_Outputs`` holds, counted as ``take`` counts it."""
    probe = _Outputs(1)
    raw = aligned_empty(64, np.uint8)
    probe._kept[0] = (raw, _owner(raw))
    del raw
    kept = probe._kept[0]
    del kept
    return sys.getrefcount(probe._kept[0][1])


_UNOWNED = _unowned()


class _Ctx:
    """The ``BuildContext`` of a kernel built for one run: scratch from the run's arena,
    given back once the kernel ran; nothing derived is kept (a plan's packed weights are
    for its own sizes)."""

    __slots__ = ("_arena", "_taken")

    def __init__(self, arena: _Arena) -> None:
        self._arena, self._taken = arena, []

    def scratch(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        arr, raw = self._arena.take(tuple(shape), np.dtype(dtype))
        self._taken.append(raw)
        return arr

    def derived(self, source: Any, key: Any, make: Callable[..., np.ndarray], also: Any = ()) -> None:
        return None

    def constant(self, array: Any) -> bool:
        return False  # no value is baked into a kernel: the kernels that would take one fall back

    def release(self) -> None:
        for raw in self._taken:
            self._arena.give(raw)


Runner = Callable[[list[Any], Mapping[str, int], _Arena, dict[int, np.ndarray]], Any]
Place = Callable[[list[Any], Mapping[str, int], _Arena, dict[int, np.ndarray]], np.ndarray]


class AnySizeExecutable(Executable):
    """A symbolic graph compiled once for cpu; ``run`` takes any sizes it accepts (see
    the module)."""

    def __init__(self, graph: Graph) -> None:
        self._graph = graph
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
        self._fold(graph)
        self._by_sizes = self._sizes_only()
        self._ends = self._liveness()
        outputs = {nid: k for k, nid in reversed(list(enumerate(graph.outputs)))}  # a node's first output place
        program: list[tuple[int, Runner]] = []
        self._owns: set[int] = set()  # nodes whose value holds a buffer of the arena
        self._passed: set[int] = set()  # ... that pass it on to a node computed over them
        for node in nodes:
            if node.id not in self._resident and node.op is not OpKind.INPUT:
                program.append((node.id, self._runner(node, outputs.get(node.id))))
        frees: dict[int, list[int]] = {}
        for nid in sorted(self._owns - self._passed):
            frees.setdefault(self._ends[nid], []).append(nid)
        self._program = [(nid, run, tuple(frees.get(nid, ()))) for nid, run in program]
        self._arenas: list[_Arena] = []

    # ------------------------------------------------------------------ analysis
    def _fold(self, graph: Graph) -> None:
        """Params (writable copies, shared with the graph's other compiles), constants,
        and every node of static shape computed from those alone, computed now."""
        owned = _Owned()
        for node in self._nodes:
            if node.op is OpKind.PARAM:
                arr = _param_copy(node, graph.value(node.id))
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
        it gathers), each with the symbols it depends on. A run keeps them by those symbols'
        values (``_KEPT_BYTES`` in all): a request of a sequence length met before finds its
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
        return found

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
            if node.op is OpKind.RESHAPE:
                base = node.inputs[0]
                last[base] = max(last[base], last[node.id])
        return last

    def _inplace_source(self, node: Node) -> int | None:
        """An input whose buffer ``node`` may write its result over: one ``inplace_positions``
        allows, of the same symbolic shape and dtype, holding a buffer of its own that no
        one reads after ``node`` (no view of it either: views extend its end), read once
        by ``node``."""
        for pos in inplace_positions(node):
            src = node.inputs[pos]
            other = self._nodes[src]
            if (src in self._owns and self._ends[src] == node.id and node.inputs.count(src) == 1
                    and other.dtype == node.dtype and tuple(other.shape) == tuple(node.shape)):
                return src
        return None

    def _runner(self, node: Node, output_at: int | None) -> Runner:
        """The function computing ``node`` in a run (its value taking a buffer of the arena
        where ``self._owns`` says so, given back after its last reader)."""
        shape_of = _shape_fn(node.shape)
        dtype = np.dtype(node.dtype)
        nid, inputs = node.id, node.inputs
        if node.op is OpKind.RESHAPE:
            def view(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]) -> Any:
                return values[inputs[0]].reshape(shape_of(env))
            return view
        if node.op is OpKind.CONSTANT:  # a sized one (the others are resident)
            return self._kept_runner(node, lambda values, env, arena, raws: materialize(
                node.attrs, shape_of(env), node.dtype, env))
        place: Place
        dense = self._dense_layer(node)
        kept = nid in self._by_sizes
        src = self._inplace_source(node) if output_at is None and dense is None and not kept else None
        if kept:  # a value of the sizes alone: its own array, kept for them
            def place(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]
                      ) -> np.ndarray:
                return np.empty(shape_of(env), dtype)
        elif output_at is not None:  # handed to the caller
            def place(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]
                      ) -> np.ndarray:
                return arena.outputs.take(output_at, shape_of(env), dtype)
        elif src is not None:  # over an input that dies here
            self._passed.add(src)

            def place(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]
                      ) -> np.ndarray:
                raws[nid] = raws.pop(src)
                return values[src]
        else:
            def place(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]
                      ) -> np.ndarray:
                out, raws[nid] = arena.take(shape_of(env), dtype)
                return out
        if output_at is None and not kept:
            self._owns.add(nid)
        fn = self._compute_runner(node, place, dense)
        return self._kept_runner(node, fn) if kept else fn

    def _compute_runner(self, node: Node, place: Place, dense: RunTimeDense | None) -> Runner:
        if dense is not None:
            return self._dense_runner(node, dense, place)
        built = self._built(node)
        fn = (self._region_runner(node, place, built) or self._layer_norm_runner(node, place, built)
              or self._attention_runner(node, place, built) or self._slice_runner(node, place, built))
        if fn is not None:
            return fn
        inputs = node.inputs

        def run(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]) -> Any:
            out = place(values, env, arena, raws)
            if out.size:
                built([values[i] for i in inputs], out, env, arena)
            return out
        return run

    def _kept_runner(self, node: Node, compute: Runner) -> Runner:
        """``compute`` of a value of the sizes alone, kept for the values of its symbols."""
        nid, syms, kept = node.id, self._by_sizes[node.id], self._kept

        def run(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]) -> Any:
            key = (nid, tuple(env[s] for s in syms))
            arr = kept.get(key)
            if arr is None:
                arr = compute(values, env, arena, raws)
                self._keep(key, arr)
            return arr
        return run

    def _built(self, node: Node) -> Callable[[list[Any], np.ndarray, Mapping[str, int], _Arena], None]:
        """``node`` computed into ``out`` by the plan's kernel for it, built for these arrays
        (its attrs evaluated at the run's sizes where they hold symbols)."""
        symbolic_attrs = any(holds_sym(v) for v in node.attrs.values()) or (
            node.op is OpKind.ATTENTION and node.attrs.get("scale") is None)  # 1/sqrt(D) of a symbolic D
        in_dtypes = [self._nodes[i].dtype for i in node.inputs]
        compute = self._compute

        def built(ins: list[Any], out: np.ndarray, env: Mapping[str, int], arena: _Arena) -> None:
            concrete = _concrete(node, out.shape, env, ins, in_dtypes) if symbolic_attrs else (
                dataclasses.replace(node, shape=out.shape))
            ctx = _Ctx(arena)
            compute(concrete, ins, out, ctx)
            ctx.release()
        return built

    def _dense_layer(self, node: Node) -> RunTimeDense | None:
        """A dense layer with resident float32 weights (k, n) on oneDNN's matmul made once
        for every row count, where this host chose oneDNN for products."""
        if node.op is not OpKind.GEMM or node.dtype != "float32":
            return None
        a_id, w_id = node.inputs[:2]
        w = self._resident.get(w_id)
        bias = self._resident.get(node.inputs[2]) if len(node.inputs) == 3 else None
        act = node.attrs["activation"]
        if (w is None or w.ndim != 2 or w.dtype != np.float32 or self._nodes[a_id].dtype != "float32"
                or min(w.strides) <= 0 or (act != "none" and act not in ACTIVATION_POST)
                or act not in ACTIVATION_OPS):
            return None
        n = w.shape[1]
        if len(node.inputs) == 3 and (bias is None or bias.dtype != np.float32 or bias.size != n
                                      or bias.shape[-1] != n or not bias.flags.c_contiguous):
            return None
        lib = onednn.use("matmul")
        if lib is None:
            return None
        try:
            dense = RunTimeDense(lib, w, bias.reshape(1, n) if bias is not None else None, act)
        except onednn.DnnlError as exc:
            log.debug("rlx-cpu: oneDNN declined %s at run-time sizes: %s", node.describe(), exc)
            return None
        self._dense.append(dense)
        return dense

    @staticmethod
    def _dense_runner(node: Node, dense: RunTimeDense, place: Place) -> Runner:
        a_id, k, n = node.inputs[0], dense.k, dense.n

        def run(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]) -> Any:
            a = values[a_id]
            out = place(values, env, arena, raws)
            if out.size:
                a2 = a.reshape(-1, k)
                if not (a2.flags.c_contiguous and a2.flags.aligned):
                    a2 = np.ascontiguousarray(a2)
                dense(a2, out.reshape(-1, n))
            return out
        return run

    def _region_runner(self, node: Node, place: Place, built: Callable[..., None]) -> Runner | None:
        """A float32 elementwise op or fused region on the native interpreter, planned once
        for every size (``regions.RegionTemplate``)."""
        lib = native_library()
        ins = [self._nodes[i] for i in node.inputs]
        if lib is None or node.dtype != "float32" or any(x.dtype != "float32" for x in ins) or not ins:
            return None
        if node.op is OpKind.FUSED_ELEMENTWISE:
            instructions = program_types(node.op, ins, node.attrs["program"])[1]
        elif node.op in ELEMENTWISE_OPS:
            instructions = [Instruction(node.op, tuple(range(len(ins))), dict(node.attrs), node.shape, node.dtype)]
        else:
            return None
        known = {k: self._resident[i] for k, i in enumerate(node.inputs) if i in self._resident}
        try:
            template = RegionTemplate(lib, instructions, len(ins), known)
        except NoFit:
            return None
        self._templates.append(template)
        inputs = node.inputs

        def run(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]) -> Any:
            args = [values[i] for i in inputs]
            out = place(values, env, arena, raws)
            if out.size:
                try:
                    template(args, out)
                except NoFit:  # operands it cannot take as they are: the plan's kernel
                    built(args, out, env, arena)
            return out
        return run

    def _layer_norm_runner(self, node: Node, place: Place, built: Callable[..., None]) -> Runner | None:
        """A float32 layer norm with resident scale (and bias) on the native kernel, its
        rows counted per run."""
        lib = native_library()
        if lib is None or node.op is not OpKind.LAYER_NORM or node.dtype != "float32":
            return None
        axis, eps = node.attrs["axis"], float(node.attrs["eps"])
        scale = self._resident.get(node.inputs[1])
        bias = self._resident.get(node.inputs[2]) if len(node.inputs) == 3 else None
        inner = tuple(node.shape[axis:])
        if (has_sym(inner) or scale is None or tuple(scale.shape) != inner or scale.dtype != np.float32
                or not scale.flags.c_contiguous or (len(node.inputs) == 3 and (
                    bias is None or tuple(bias.shape) != inner or bias.dtype != np.float32
                    or not bias.flags.c_contiguous))):
            return None
        length = math.prod(inner)
        x_id = node.inputs[0]
        scale_p, bias_p = scale.ctypes.data, (bias.ctypes.data if bias is not None else None)  # residents: held

        def run(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]) -> Any:
            x = values[x_id]
            out = place(values, env, arena, raws)
            if out.size and length:
                if not (x.dtype == np.float32 and x.flags.c_contiguous and x.flags.aligned) or (
                        np.may_share_memory(x, out) and x.ctypes.data != out.ctypes.data):
                    built([values[i] for i in node.inputs], out, env, arena)
                    return out
                rows = out.size // length
                lib.layer_norm(x.ctypes.data, scale_p, bias_p, out.ctypes.data, rows, length, length, eps,
                               lib.threads_for(rows * length * LAYER_NORM_NS, SPLIT_NS))
            return out
        return run

    def _attention_runner(self, node: Node, place: Place, built: Callable[..., None]) -> Runner | None:
        """float32 attention (no mask, or an additive float32 one): ``q @ k^T`` on oneMKL
        (numpy without it), the mask added on the native interpreter, the native softmax
        over each row (the scale inside it, or applied to ``q`` first where a mask comes
        between), then ``@ v``; the scores in a buffer of the arena."""
        lib = native_library()
        if (lib is None or node.op is not OpKind.ATTENTION or node.dtype != "float32"
                or any(self._nodes[i].dtype != "float32" for i in node.inputs)):
            return None
        q_id, k_id, v_id = node.inputs[:3]
        m_id = node.inputs[3] if len(node.inputs) == 4 else None
        fixed = node.attrs.get("scale")
        f32 = np.dtype(np.float32)
        # the mask added over the scores on the native interpreter (every core; numpy's add is one)
        masked = RegionTemplate(lib, [Instruction(OpKind.ADD, (0, 1), {}, node.shape, "float32")], 2, {})

        def run(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]) -> Any:
            q, k, v = values[q_id], values[k_id], values[v_id]
            out = place(values, env, arena, raws)
            lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
            if not out.size:
                return out
            if lk == 0:  # softmax over no keys: the plan's kernel says what that is
                built([values[i] for i in node.inputs], out, env, arena)
                return out
            scale = fixed if fixed is not None else (1.0 / math.sqrt(d) if d else 1.0)
            scores, raw = arena.take((*out.shape[:-2], lq, lk), f32)
            scaled = None
            try:
                if m_id is not None and scale != 1.0:  # scaled before the mask: q, not the larger scores
                    qs, scaled = arena.take(q.shape, f32)
                    np.multiply(q, f32.type(scale), out=qs)
                    q, scale = qs, 1.0
                matmul_now(q, k.swapaxes(-1, -2), scores)
                if m_id is not None:
                    mask = values[m_id]
                    try:
                        masked([scores, mask], scores)
                    except NoFit:
                        np.add(scores, mask, out=scores)
                rows = scores.size // lk
                lib.softmax(scores.ctypes.data, scores.ctypes.data, rows, lk, lk, scale,
                            lib.threads_for(rows * lk * SOFTMAX_NS, SPLIT_NS))
                matmul_now(scores, v, out)
            finally:
                arena.give(raw)
                if scaled is not None:
                    arena.give(scaled)
            return out
        return run

    @staticmethod
    def _slice_runner(node: Node, place: Place, built: Callable[..., None]) -> Runner | None:
        """A slice copied out of its input with its bounds evaluated at the run's sizes (the
        symbolic type rule normalized them); where the view taken does not have the shape
        the graph says (a bound whose normal form holds for other sizes only), the plan's
        kernel, its bounds normalized again."""
        if node.op is not OpKind.SLICE:
            return None
        x_id = node.inputs[0]
        fixed = {k: v for k, v in node.attrs.items() if not holds_sym(v)}
        sized = {k: v for k, v in node.attrs.items() if holds_sym(v)}

        def run(values: list[Any], env: Mapping[str, int], arena: _Arena, raws: dict[int, np.ndarray]) -> Any:
            x = values[x_id]
            out = place(values, env, arena, raws)
            attrs = {**fixed, **{k: evaluate_attr(v, env) for k, v in sized.items()}}
            view = x[slice_index(x.ndim, attrs)]
            if view.shape == out.shape:
                np.copyto(out, view)
            else:
                built([x], out, env, arena)
            return out
        return run

    # ------------------------------------------------------------------ running
    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        graph = self._graph
        env = graph.bind(graph.input_shapes(inputs))  # the sizes, and an InputError for ones the graph refuses
        try:
            arena = self._arenas.pop()
        except IndexError:
            arena = _Arena(len(self._outputs))
        values: list[Any] = [None] * len(self._nodes)
        for nid, arr in self._resident.items():
            values[nid] = arr
        for nid in self._input_ids:
            values[nid] = inputs[self._nodes[nid].name]
        raws: dict[int, np.ndarray] = {}
        try:
            with thread_cap(self._cap), np.errstate(all="ignore"):
                for nid, runner, frees in self._program:
                    values[nid] = runner(values, env, arena, raws)
                    for done in frees:
                        arena.give(raws.pop(done))
            return self._outputs_of(values)
        finally:
            for raw in raws.values():  # an error midway: what the run still held
                arena.give(raw)
            self._arenas.append(arena)

    def _outputs_of(self, values: list[Any]) -> list[np.ndarray]:
        """The graph's outputs: arrays computed for the caller as they are; a copy of any
        other (a view of a buffer, a resident, an input, an output listed twice)."""
        outs, handed = [], set()
        for i in self._outputs:
            arr = values[i]
            fresh = (i not in self._owns and i not in self._resident and i not in self._input_ids
                     and i not in self._by_sizes and self._nodes[i].op is not OpKind.RESHAPE and i not in handed)
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
        np.copyto(target, value)
        owned = _Owned()
        for node, ins, out in self._folds:  # in graph order: a fold reads earlier ones
            self._compute(node, ins, out, owned)
        for dense in self._dense:
            dense.refresh()
        for template in self._templates:  # a param folded into a fused activation
            template.forget()

    def report_notes(self) -> list[str]:
        dense = f"; {len(self._dense)} dense layer(s) on one oneDNN matmul for every row count" if self._dense else ""
        return [f"any size: one executable runs every size, kernels reading their sizes per run{dense}"]

    def __repr__(self) -> str:
        return f"<AnySizeExecutable {self._name!r}: {len(self._program)} runners>"


def _shape_fn(shape: tuple[Any, ...]) -> Callable[[Mapping[str, int]], tuple[int, ...]]:
    """``shape`` (ints and ``Sym``) evaluated under a run's sizes (a plain symbol read from
    them directly: most dims are one)."""
    if not has_sym(shape):
        fixed = tuple(int(d) for d in shape)
        return lambda env: fixed
    dims = tuple(d.name if isinstance(d, Sym) and d.name is not None else d for d in shape)
    if all(type(d) in (int, str) for d in dims):
        return lambda env: tuple(env[d] if type(d) is str else d for d in dims)
    return lambda env: tuple(env[d] if type(d) is str else d.evaluate(env) if isinstance(d, Sym) else d
                             for d in dims)


def _concrete(node: Node, shape: tuple[int, ...], env: Mapping[str, int], ins: list[np.ndarray],
              in_dtypes: list[str]) -> Node:
    """``node`` as a static graph would hold it at these sizes: its attrs evaluated and
    normalized by its type rule again (a slice's bounds, a reshape's target), as
    ``Graph.specialize`` does."""
    attrs = {k: evaluate_attr(v, env) for k, v in node.attrs.items()}
    if node.op is OpKind.ATTENTION and attrs.get("scale") is None:
        attrs.pop("scale", None)
    norm, _, _ = infer_any(node.op, [_Type(tuple(x.shape), dt) for x, dt in zip(ins, in_dtypes)], attrs)
    return dataclasses.replace(node, attrs=norm, shape=shape)

