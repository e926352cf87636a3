"""Binding a symbolic graph's symbols to sizes, and specializing it to a static graph.

``Graph.bind`` reads the symbols' values off the inputs' concrete shapes and checks every
recorded constraint; ``Graph.specialize`` rebuilds the graph with those values through
the normal type rules, so a specialized graph is exactly the one the builder would have
made with those sizes (the compile pipeline and static-only backends see nothing else).
Nothing is cached here: callers cache specializations per shape class.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import GraphError, InputError
from .ops import ELEMENTWISE_OPS, OpKind
from .shape_rules import Constraint, evaluate_attr, holds_sym
from .sized import is_sized, materialize
from .symbolic import Sym, UnboundSymbolError, evaluate, format_shape, free_symbols

if TYPE_CHECKING:
    from .graph import Graph

__all__ = ["input_shapes", "bind_shapes", "specialize_graph", "representative", "evaluated_attrs",
           "REPRESENTATIVE_SIZES"]

#: Sizes tried, in order, for every symbol when a symbolic graph must be priced or placed.
REPRESENTATIVE_SIZES = (16, 64, 224)

_representatives: weakref.WeakKeyDictionary[Graph, tuple[tuple, Graph, dict[str, int]]] = weakref.WeakKeyDictionary()
_rep_lock = threading.Lock()


def _values(c: Constraint, bindings: Mapping[str, int]) -> str:
    names = sorted(free_symbols((c.lhs, c.rhs)))
    return ", ".join(f"{n} = {bindings[n]}" for n in names if n in bindings)


def _describe(graph: Graph, c: Constraint) -> str:
    where = graph.node(c.node).describe() if c.node is not None else "a node"
    return f"constraint {c} (from {c.op} {where}: {c.why})"


class _Binder:
    """What binding reads of a frozen graph, made once (a server binds on every request):
    each input's name and, per dim, its fixed size or its symbol's name. ``simple`` when
    every symbol is a plain name on some input's dim and nothing else is recorded (no
    expression dim, no symbol bound by no input, no constraint): then binding is reading
    those dims, and anything unexpected goes to the full path, which names it."""

    __slots__ = ("inputs", "simple")

    def __init__(self, graph: Graph) -> None:
        nodes = graph.nodes
        self.inputs = tuple((nodes[i].name, len(nodes[i].shape),
                             tuple((k, d if not isinstance(d, Sym) else d.name) for k, d in enumerate(nodes[i].shape)))
                            for i in graph.inputs)
        plain = all(not isinstance(d, Sym) or d.name is not None for i in graph.inputs for d in nodes[i].shape)
        named = {d for _, _, dims in self.inputs for _, d in dims if type(d) is str}
        self.simple = plain and set(graph.symbol_origins) <= named and not graph.constraints

    def bind(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, int] | None:
        """The bindings, or None where the full path must look (it also names what is wrong)."""
        if len(shapes) != len(self.inputs):
            return None
        bindings: dict[str, int] = {}
        for name, rank, dims in self.inputs:
            got = shapes.get(name)
            if got is None or len(got) != rank:
                return None
            for k, want in dims:
                size = got[k]
                if type(size) is not int:
                    return None
                if type(want) is str:
                    if bindings.setdefault(want, size) != size:
                        return None
                elif want != size:
                    return None
        return bindings


_binders: weakref.WeakKeyDictionary[Graph, _Binder] = weakref.WeakKeyDictionary()


def input_shapes(graph: Graph, inputs: Any) -> dict[str, tuple[int, ...]]:
    """The shape of each of ``graph``'s inputs in ``inputs`` (a mapping of input name to
    array), as the caller gave it: what ``bind_shapes`` reads the symbols from. An
    ``InputError`` names the inputs missing or unknown (and lists what the graph takes),
    or an input whose shape cannot be read. Symbolic and run-time graphs both read their
    inputs' sizes this way before anything is built."""
    if type(inputs) is dict and graph.frozen:  # the common case: a dict of arrays, exactly the inputs
        binder = _binders.get(graph)
        if binder is not None and len(inputs) == len(binder.inputs):
            try:
                return {name: inputs[name].shape for name, _, _ in binder.inputs}
            except (KeyError, AttributeError):
                pass  # the full path names what is wrong
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a mapping of input name to array, got {type(inputs).__name__}")
    declared = [graph.node(i) for i in graph.inputs]
    names = [n.name for n in declared]
    missing = [n for n in names if n not in inputs]
    unknown = [k for k in inputs if k not in names]
    if missing or unknown:
        parts = [f"missing input(s) {', '.join(map(repr, missing))}"] if missing else []
        parts += [f"unknown input(s) {', '.join(map(repr, unknown))}"] if unknown else []
        takes = ", ".join(f"{n.name!r} {format_shape(n.shape)} {n.dtype}" for n in declared)
        raise InputError(" and ".join(parts) + f"; the graph takes {takes}")
    shapes = {}
    for name in names:
        value = inputs[name]
        shape = getattr(value, "shape", None)
        try:
            shapes[name] = tuple(int(d) for d in (np.shape(value) if shape is None else shape))
        except (TypeError, ValueError):
            raise InputError(f"input {name!r}: cannot read its shape ({type(value).__name__})") from None
    return shapes


def bind_shapes(graph: Graph, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    if graph.frozen:
        binder = _binders.get(graph)
        if binder is None:
            binder = _binders[graph] = _Binder(graph)
        if binder.simple:
            found = binder.bind(shapes)
            if found is not None:
                return found
    nodes = graph.nodes
    ins = {nodes[i].name: nodes[i] for i in graph.inputs}
    missing, unknown = sorted(set(ins) - set(shapes)), sorted(set(shapes) - set(ins))
    if missing or unknown:
        parts = [f"missing {missing}" if missing else "", f"unknown {unknown}" if unknown else ""]
        raise InputError(f"graph {graph.name!r}: input shapes {' and '.join(p for p in parts if p)}; "
                         f"it takes {sorted(ins)}")
    bindings: dict[str, int] = {}
    source: dict[str, str] = {}
    later = []
    for name, node in ins.items():
        got = tuple(int(d) for d in shapes[name])
        if len(got) != len(node.shape):
            raise InputError(f"input {name!r}: expected rank {len(node.shape)} (shape {node.shape}), got shape {got}")
        for i, (want, size) in enumerate(zip(node.shape, got)):
            if not isinstance(want, Sym):
                if want != size:
                    raise InputError(f"input {name!r} dim {i}: expected {want} (shape {node.shape}), got {size}")
            elif want.name is None:
                later.append((name, i, want, size))
            elif want.name in bindings and bindings[want.name] != size:
                sym = want.name
                raise InputError(f"input {name!r} dim {i} ({sym!r}): {size}, but input {source[sym]!r} "
                                 f"gave {sym} = {bindings[sym]}")
            else:
                bindings.setdefault(want.name, size)
                source.setdefault(want.name, name)
    for name, i, want, size in later:  # an expression dim (Sym("n") * 2): checked once its symbols are known
        try:
            value = evaluate(want, bindings)
        except UnboundSymbolError as exc:
            raise InputError(f"input {name!r} dim {i} ({want}): symbol {exc.name!r} is bound by no input dim "
                             "of its own") from None
        if value != size:
            raise InputError(f"input {name!r} dim {i} ({want}): {size}, but the other inputs give {want} = {value}")
    for sym, nid in graph.symbol_origins.items():
        if sym not in bindings:
            raise InputError(f"symbol {sym!r} (first used by {graph.node(nid).describe()}, "
                             f"{graph.node(nid).op}) is bound by no input dim")
    for c in graph.constraints:
        if not c.holds(bindings):
            raise InputError(f"{_describe(graph, c)} does not hold: {_values(c, bindings)}")
    return bindings


def specialize_graph(graph: Graph, bindings: Mapping[str, int]) -> Graph:
    needed = set(graph.symbols) | set(graph.symbol_origins)
    missing = sorted(needed - set(bindings))
    if missing:
        raise GraphError(f"specialize: graph {graph.name!r} needs a value for symbol(s) {missing}; "
                         f"got {dict(bindings)}")
    sizes = {k: int(v) for k, v in bindings.items()}
    for c in graph.constraints:
        if not c.holds(sizes):
            raise GraphError(f"specialize: {_describe(graph, c)} does not hold: {_values(c, sizes)}")
    new = type(graph)(graph.name)
    for node in graph.nodes:
        with new.origin(node.origin):
            _respecialize(graph, new, node, sizes)
    if graph.outputs:  # (a graph may be specialized before its outputs are declared)
        new.set_outputs(list(graph.outputs))
    return new


#: Ops whose normalized attrs never depend on the sizes (they read ranks, not dims): a
#: specialization keeps a node's attrs and evaluates its symbolic shape, with no type rule
#: run again (a third of a specialization's time; the rules that gave the symbolic shape
#: are the static ones, ``tests/test_symbolic.py``, and the constraints they recorded were
#: checked above). Reshape, slice and attention normalize sizes into their attrs: typed again.
_TYPED_ONCE = frozenset(ELEMENTWISE_OPS) | {
    OpKind.MATMUL, OpKind.GEMM, OpKind.FUSED_ELEMENTWISE, OpKind.FUSED_CONV, OpKind.CONV2D, OpKind.MAX_POOL2D,
    OpKind.AVG_POOL2D, OpKind.GLOBAL_AVG_POOL2D, OpKind.LAYER_NORM, OpKind.SOFTMAX, OpKind.TRANSPOSE,
    OpKind.CONCAT, OpKind.GATHER, OpKind.REDUCE_SUM, OpKind.REDUCE_MEAN, OpKind.REDUCE_MAX,
}


def _respecialize(graph: Graph, new: Graph, node: Any, sizes: Mapping[str, int]) -> None:
    """Add ``node`` to ``new`` with every dim and shape-valued attribute under ``sizes``."""
    shape = tuple(evaluate(d, sizes) for d in node.shape)
    if node.op in (OpKind.INPUT, OpKind.PARAM, OpKind.CONSTANT):
        if node.op is OpKind.CONSTANT and is_sized(node.attrs):  # computed from the sizes, now known
            value: Any = materialize(node.attrs, shape, node.dtype, sizes)
            value.flags.writeable = False
        else:
            value = graph.value(node.id) if node.op is not OpKind.INPUT else None  # shared: read-only
        new._add_source(node.op, node.name, shape, node.dtype, value)
        return
    if node.op in _TYPED_ONCE and not any(holds_sym(v) for v in node.attrs.values()):
        new._append_typed(node, shape)  # its rule reads no size into its attrs: only the shape changes
        return
    made = new.add_node(node.op, node.inputs, evaluated_attrs(node, sizes), node.name)
    if made.shape != shape:  # the symbolic rule and the static one disagree: a bug, never a silent one
        raise GraphError(f"specialize: {node.describe()} ({node.op}) has shape {made.shape} under {sizes}, "
                         f"but its symbolic shape {node.shape} gives {shape}")


def evaluated_attrs(node: Any, sizes: Mapping[str, int]) -> dict[str, Any]:
    """``node``'s attrs with every dim in them evaluated under ``sizes``, as its type rule
    is to take them again at those sizes (an attention's scale left to default to
    1/sqrt(D), now that D is known): ``specialize``'s, and a backend's that runs a
    symbolic graph node by node at a run's sizes."""
    attrs = {k: evaluate_attr(v, sizes) for k, v in node.attrs.items()}
    if node.op is OpKind.ATTENTION and attrs.get("scale") is None:
        attrs.pop("scale", None)
    return attrs


def representative(graph: Graph) -> tuple[Graph, dict[str, int]]:
    """``graph`` specialized at a representative size, and the bindings used: what a
    symbolic graph is placed and priced at (``dynamic.py``), and what tools feed it when
    they make up inputs.

    Every symbol takes the same size, the first of ``REPRESENTATIVE_SIZES`` that the
    graph's shape rules (and the constraints its ops recorded) accept; a graph rebuilt per
    size (``DeferredGraph``) is first tried at the sizes its body was built at, which its
    model is known to convert at (a KV-cache step's ``tp = t + p`` never converts with
    every symbol one size). Kept per graph until
    it changes (a node added, its outputs set again; a user graph keeps its arrays), so
    the load that checked it and the compile that places it specialize it once."""
    from .valued import RunTimeGraph, ValueDependentGraph

    if isinstance(graph, ValueDependentGraph):  # no sizes make a body without the values
        raise GraphError(f"{graph.needs()}; before then it has no body to place, price or make inputs for: give "
                         "those inputs (rlx run --input NAME=FILE.npy), or bind them at load "
                         "(rlx_core.onnx.load(model, values={NAME: array}))")
    if isinstance(graph, RunTimeGraph):
        raise GraphError(f"{graph.needs()}; before then it has no body to place or price")
    version = (len(graph), graph.outputs)  # a graph still being built is kept until it changes
    with _rep_lock:
        found = _representatives.get(graph)
    if found is not None and found[0] == version:
        return found[1], found[2]
    problems: list[str] = []
    body_sizes = getattr(graph, "body_sizes", None)  # a DeferredGraph's: sizes its model converts at
    candidates = [dict.fromkeys(graph.symbols, size) for size in REPRESENTATIVE_SIZES]
    for bindings in ([dict(body_sizes)] if body_sizes else []) + candidates:
        size = "/".join(str(v) for v in dict.fromkeys(bindings.values()))
        try:
            spec = graph.specialize(bindings)
            shapes = {spec.node(i).name: spec.node(i).shape for i in spec.inputs}
            graph.bind(shapes)  # the constraints recorded by the ops (``batch == 4``) must hold too
        except (GraphError, InputError) as exc:
            problems.append(f"{size}: {exc}")
            continue
        with _rep_lock:
            _representatives[graph] = (version, spec, bindings)
        return spec, bindings
    raise GraphError(f"graph {graph.name!r} has symbolic dims ({', '.join(graph.symbols)}) and no representative "
                     f"size fits its shape rules, so it cannot be placed; tried {'; '.join(problems)}")
