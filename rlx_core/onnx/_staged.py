"""Loading a model in stages, with ops run on the host between them (``StagedGraph``).

``load_any`` is the whole of ``load`` once the model is read and checked. A model with a
top-level ``NonZero``, ``Unique`` or ``NonMaxSuppression`` (``_host_ops``) is cut there:

- the *prefix*, every node that does not depend on such an op, is one graph, loaded as
  any model is (static, symbolic dims, or built from input values), that outputs what
  the host op and the rest read;
- the host ops whose inputs the prefix makes run on the host (numpy);
- the *rest* is loaded at run time, for the shapes and dtypes of what it reads, with
  ``load_any`` again (it may hold host ops of its own): one static graph per signature.

A model that needs the *value* of a tensor it computes from large data (a ``Range``
bound from a ``ReduceMax``, an ``If`` condition from a comparison of activations, a
``Reshape`` target computed deep in the net) is cut the same way at that tensor: the
prefix computes it, and the rest is built with its value, which it reads as a small
run-time input (``ValueDependentGraph``, so at most ``MAX_VALUE_ELEMENTS`` elements).

The weights are read once, at load; every part converted takes those arrays
(``Model.params``), so no weight is read or held twice.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np
from onnx import GraphProto, NodeProto, TensorProto, ValueInfoProto, helper

from ..errors import ModelError
from ..ir import Graph
from ..ir.staged import GraphStage, HostStep, LoopStep, ScanStep, Signature, StagedGraph
from ..ir.valued import MAX_VALUE_ELEMENTS
from ._by_value import inputs_behind, load_valued
from ._context import NeedsHost, NeedsValue, SpliceIf, describe_node
from ._dynamic import load_symbolic, symbol_names, symbolic_shapes
from ._host_ops import HOST_OPS, HOST_RUNS, held_in
from ._inline import constant_value, inline_known_ifs, splice_if
from ._loader import Model, _live, _TensorReader, _toposort
from ._ops_control import scan_layout
from ._subgraphs import implicit_inputs, node_reads, subgraphs

__all__ = ["load_any"]

#: Rest graphs kept built, per signature (their compiled copies are kept by the compiled graph).
_KEEP = 8


def load_any(model: Model, dims: Mapping[str, int], free: Sequence[str]) -> Graph:
    """``model`` as the graph ``load`` returns: staged when it holds host ops or needs a
    value computed from large data, built per value when it needs small inputs' values,
    symbolic when ``free`` leaves dims unbound, else static."""
    model = inline_known_ifs(model)
    hosts = {i for i, node in enumerate(model.gp.node) if node.op_type in HOST_OPS and node.domain in ("", "ai.onnx")}
    if hosts:
        staged = _load_staged(model, dims, free, hosts, None)
        assert staged is not None
        return staged
    try:
        if free:
            return load_symbolic(model, dims, free)
        return model.convert(dims)
    except NeedsHost as exc:  # nodes the ops cannot express here: the host runs them
        wanted = set(exc.tensors)
        nodes = {i for i, n in enumerate(model.gp.node) if wanted.intersection(n.output)}
        runnable = len(nodes) == len(wanted) and all(model.gp.node[i].op_type in (*HOST_RUNS, *_FROM_HOST)
                                                     for i in nodes)
        staged = _load_staged(model, dims, free, nodes, None) if runnable else None  # else: a cut would recur
        if staged is None:
            raise ModelError(str(exc)) from None
        return staged
    except SpliceIf as exc:  # a branch with host ops, its condition known: spliced in, then loaded again
        spliced = None if free else splice_if(model, exc.tensor, exc.taken)
        if spliced is None:
            why = "its condition may change with the symbolic dims: bind them with dims=" if free else \
                "it could not be spliced into the graph"
            raise ModelError(f"{exc}; {why}") from None
        return load_any(spliced, dims, free)
    except NeedsValue as exc:
        readers = _readers_of(model.gp, exc.tensor)
        # Computed from data, or the condition of an If whose branch holds host ops (which
        # only a part built with the value, its branch spliced in, can run): cut there.
        if readers and (_hosts_in_branches(model.gp, readers) or not _behind_small_inputs(model, exc.tensor)):
            staged = _load_staged(model, dims, free, readers, exc)
            if staged is not None:
                return staged
        return load_valued(model, dims, free, exc)


def _hosts_in_branches(gp: GraphProto, nodes: set[int]) -> bool:
    """Whether one of ``nodes`` is an If with an op that runs on the host in a branch."""
    return any(held_in(branch) for i in nodes if gp.node[i].op_type == "If" for branch in subgraphs(gp.node[i]))


def _behind_small_inputs(model: Model, tensor: str) -> bool:
    """Whether ``tensor`` is computed from inputs of a static size small enough to build
    the graph per value of (a value from an input whose size is symbolic is data: a mask
    of a batch, lengths of a sequence)."""
    fed = [name for name, _, _ in model.specs if name not in model.values]
    wanted = set(inputs_behind(model.gp, tensor, fed))
    sizes = [shape for name, _, shape in model.specs if name in wanted]
    return bool(wanted) and all(all(isinstance(d, int) for d in shape) and math.prod(shape) <= MAX_VALUE_ELEMENTS
                                for shape in sizes)  # type: ignore[arg-type]


def _readers_of(gp: GraphProto, tensor: str) -> set[int]:
    """The top-level nodes reading ``tensor``, when a top-level node makes it or it is an
    input (none for an initializer or a value made inside a subgraph: no cut helps)."""
    if not any(tensor in node.output for node in gp.node) and tensor not in {v.name for v in gp.input}:
        return set()
    return {i for i, node in enumerate(gp.node) if tensor in node_reads(node)}


def _load_staged(model: Model, dims: Mapping[str, int], free: Sequence[str], blocked: set[int],
                 why: NeedsValue | None) -> StagedGraph | None:
    """``model`` cut before the ``blocked`` nodes: the host ops among them run between the
    parts. ``None`` when cutting for a value (``why``) leaves nothing to compute first."""
    gp, where = model.gp, model.where
    specs = [(name, dtype, shape) for name, dtype, shape in model.specs if name not in model.values]
    order = _toposort(gp, {t.name for t in gp.initializer} | {v.name for v in gp.input}, where)
    live = _live(gp, order)
    arrays, folded = _weights(model, live)
    live -= folded
    after = _descendants(gp, blocked & live, live)
    made_after = {out for i in after for out in gp.node[i].output if out}
    prefix = [i for i in order if i in live and i not in after]
    hosts = [i for i in order if i in blocked and i in live and gp.node[i].op_type in (*HOST_RUNS, *_FROM_HOST)
             and not set(node_reads(gp.node[i])) & made_after]
    rest = [i for i in order if i in after and i not in hosts]
    if why is not None and not blocked & live:
        return None
    if why is not None and not prefix and not _hosts_in_branches(gp, blocked):  # an input's value: built per
        return None  # value as a whole (load_valued), not as a part
    outputs = [o.name for o in gp.output]
    read_later = {name for i in hosts + rest for name in node_reads(gp.node[i])} | set(outputs)
    made_first = [out for i in prefix for out in gp.node[i].output if out and out in read_later]
    made_on_host = {out for i in hosts for out in gp.node[i].output if out}

    steps: list[GraphStage | HostStep | LoopStep | ScanStep] = []
    constants = {**model.values, **{n: a for n, a in arrays.items() if n in read_later}}
    if prefix:
        body = load_any(Model(_part(arrays, [gp.node[i] for i in prefix], [s[0] for s in model.specs], made_first),
                              where, model.base_dir, model.opset, model.specs, model.max_bytes, model.name,
                              model.values, arrays), dims, free)
        first = f"{len(prefix)} node(s) up to {_names(gp, hosts) if hosts else repr(why.tensor) if why else ''}"
        steps.append(GraphStage(tuple(s[0] for s in specs), tuple(made_first), lambda _sig, g=body: g, first,
                                fixed=body))
    for i in hosts:
        node = gp.node[i]
        if node.op_type in _FROM_HOST:
            steps.append(_FROM_HOST[node.op_type](model, node, i, arrays))
            continue
        try:
            run = HOST_RUNS[node.op_type](node, model.opset)
        except ModelError as exc:
            raise ModelError(f"{where}: {describe_node(node, i)}: {exc}") from None
        steps.append(HostStep(node.op_type, node.name, tuple(node.input), tuple(node.output), run))
    if rest:
        produced = {out for i in rest for out in gp.node[i].output if out}
        reads = sorted({n for i in rest for n in node_reads(gp.node[i]) if n not in produced and n not in arrays},
                       key=lambda n: (n not in made_on_host, n))
        rest_out = [n for n in outputs if n in produced]
        values = (why.tensor,) if why is not None and why.tensor in reads else ()
        builds = _RestBuilds(model, _part(arrays, [gp.node[i] for i in rest], reads, rest_out), arrays,
                             f"after {_names(gp, hosts) if hosts else repr(why.tensor) if why else ''}")
        steps.append(GraphStage(tuple(reads), tuple(rest_out), builds, f"the {len(rest)} node(s) {builds.after}",
                                values))
    names = symbol_names(free)
    shapes = symbolic_shapes(model, dims, names)
    inputs = [(name, shapes[name], dtype) for name, dtype, _ in specs]
    return StagedGraph(model.name, inputs, outputs, steps, constants, source=where)


#: The most iterations a loop run from the host may take.
MAX_HOST_ITERATIONS = 1_000_000


def _body(model: Model, node: NodeProto, body: GraphProto, what: str,
          arrays: Mapping[str, np.ndarray]) -> tuple[list[str], list[str], _RestBuilds]:
    """A loop's body as a part built per signature: its own inputs' names, the enclosing
    values it reads by name (not weights: the part lists those itself), and its builder;
    the body's own initializers stay with it."""
    body_inputs = [v.name for v in body.input]
    outer = sorted(n for n in implicit_inputs(node) if n not in arrays)
    part = _part(arrays, list(body.node), body_inputs + outer, [o.name for o in body.output])
    part.initializer.extend(body.initializer)
    return body_inputs, outer, _RestBuilds(model, part, arrays, f"in the body of {what}")


def _loop_step(model: Model, node: NodeProto, index: int, arrays: Mapping[str, np.ndarray]) -> LoopStep:
    """A Loop run from the host: its body a part built for what it reads (its own inputs,
    then the enclosing values it reads by name), its own initializers kept with it."""
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    carried = max(len(node.input) - 2, 0)
    if body is None or len(body.input) != 2 + carried or len(body.output) != 1 + carried + (
            len(node.output) - carried):
        raise ModelError(f"{model.where}: {describe_node(node, index)}: its body must take the iteration, the "
                         f"condition and the {carried} carried values, and return the condition, those values and "
                         "one value per scan output")
    body_inputs, outer, builds = _body(model, node, body, describe_node(node, index), arrays)
    heads = tuple(node.input[k] if k < len(node.input) else "" for k in range(2))
    return LoopStep(node.name, (*heads, *node.input[2:], *outer), tuple(node.output), carried, tuple(body_inputs),
                    builds, f"the body of {describe_node(node, index)}, run from the host per iteration",
                    MAX_HOST_ITERATIONS)


def _scan_step(model: Model, node: NodeProto, index: int, arrays: Mapping[str, np.ndarray]) -> ScanStep:
    """A Scan run from the host: its body a part built for what it reads (its states and
    one slice of each scan input, then the enclosing values it reads by name)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    body = attrs.get("body")
    n_in = int(attrs.get("num_scan_inputs", 0))  # type: ignore[call-overload]
    n_state = len(node.input) - n_in
    n_out = len(node.output) - n_state
    what = describe_node(node, index)
    if not isinstance(body, GraphProto) or n_in < 1 or n_state < 0 or n_out < 0 or len(body.input) != n_state + n_in:
        raise ModelError(f"{model.where}: {what}: its body must take its {max(n_state, 0)} states and one slice of "
                         f"each of its {n_in} scan inputs")
    try:
        in_axes, in_dirs, out_axes, out_dirs = scan_layout(attrs.get, n_in, n_out)
    except ValueError as exc:
        raise ModelError(f"{model.where}: {what}: {exc}") from None
    body_inputs, outer, builds = _body(model, node, body, what, arrays)
    return ScanStep(node.name, (*node.input, *outer), tuple(node.output), n_state, tuple(body_inputs),
                    tuple(in_axes), tuple(map(bool, in_dirs)), tuple(out_axes), tuple(map(bool, out_dirs)), builds,
                    f"the body of {what}, run from the host per step")


#: Nodes run from the host by a step of their own (their bodies compiled as parts).
_FROM_HOST = {"Loop": _loop_step, "Scan": _scan_step}


class _RestBuilds:
    """Builds the rest of a staged model for a signature (``GraphStage.build``), keeping
    the last few built."""

    def __init__(self, model: Model, gp: GraphProto, arrays: Mapping[str, np.ndarray], after: str) -> None:
        self._model, self._gp, self._arrays, self.after = model, gp, arrays, after
        self._built: OrderedDict[Signature, Graph] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, signature: Signature) -> Graph:
        with self._lock:
            found = self._built.get(signature)
            if found is not None:
                self._built.move_to_end(signature)
                return found
        m = self._model
        specs = [(name, dtype, list(shape)) for name, shape, dtype, _ in signature]
        values = {n: v for n, v in m.values.items() if n in {s[0] for s in specs}}
        values.update({name: np.frombuffer(data, dtype).reshape(shape) for name, shape, dtype, data in signature
                       if data is not None})  # the values the cut was made for: constants of this part
        part = Model(self._gp, m.where, m.base_dir, m.opset, specs, m.max_bytes, f"{m.name}.rest", values,
                     self._arrays)
        try:
            graph = load_any(part, {}, [])
        except ModelError as exc:
            shown = ", ".join(f"{n}{list(s)} {d}" for n, s, d, _ in signature[:4])
            more = f" and {len(signature) - 4} more" if len(signature) > 4 else ""
            raise ModelError(f"the part of the model {self.after}, built at run time for {shown}{more}: {exc}"
                             ) from None
        with self._lock:
            self._built[signature] = graph
            while len(self._built) > _KEEP:
                self._built.popitem(last=False)
        return graph


def _weights(model: Model, live: set[int]) -> tuple[dict[str, np.ndarray], set[int]]:
    """Every initializer the live nodes read, read once, with the top-level ``Constant``
    nodes' values (those nodes folded away: a host op reads them as arrays, the parts as
    weights); and the nodes folded."""
    gp = model.gp
    used = {n for i in live for n in node_reads(gp.node[i])} | {o.name for o in gp.output}
    reader = _TensorReader(model.where, model.base_dir, model.max_bytes)
    arrays = dict(model.params)
    for t in gp.initializer:
        if t.name in used and t.name not in arrays:
            arrays[t.name] = reader.read(t, f"{model.where}: initializer {t.name!r}")
    folded: set[int] = set()
    for i in live:
        node = gp.node[i]
        if node.op_type == "Constant":
            value = constant_value(node)
            if value is not None:
                arrays[node.output[0]] = value
                folded.add(i)
    return arrays, folded


def _stub(name: str, arr: np.ndarray) -> TensorProto:
    """A data-less initializer (name, dtype, dims): a part's graph lists its weights by
    these, and takes the arrays themselves from ``Model.params``."""
    stub = TensorProto()
    stub.name, stub.data_type = name, helper.np_dtype_to_tensor_dtype(arr.dtype)
    stub.dims.extend(arr.shape)
    return stub


def _part(arrays: Mapping[str, np.ndarray], nodes: Sequence[NodeProto], inputs: Sequence[str],
          outputs: Sequence[str]) -> GraphProto:
    """A graph of ``nodes`` taking ``inputs`` (names: their types come from the part's
    specs) and, as stubs, the weights its nodes read, giving ``outputs``."""
    part = GraphProto()
    part.node.extend(nodes)
    part.input.extend(ValueInfoProto(name=n) for n in inputs)
    part.output.extend(ValueInfoProto(name=n) for n in outputs)
    reads = {n for node in nodes for n in node_reads(node)} | set(outputs)
    part.initializer.extend(_stub(n, arrays[n]) for n in sorted(reads) if n in arrays and n not in inputs)
    return part


def _descendants(gp: GraphProto, start: set[int], live: set[int]) -> set[int]:
    """``start`` and every live node that reads, directly or not, what they make."""
    readers: dict[str, list[int]] = {}
    for i in live:
        for name in node_reads(gp.node[i]):
            readers.setdefault(name, []).append(i)
    seen: set[int] = set()
    stack = list(start)
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        for out in gp.node[i].output:
            stack.extend(readers.get(out, ()))
    return seen


def _names(gp: GraphProto, nodes: Sequence[int]) -> str:
    shown = [f"{gp.node[i].op_type} {gp.node[i].name!r}" if gp.node[i].name else gp.node[i].op_type
             for i in nodes[:3]]
    return ", ".join(shown) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
