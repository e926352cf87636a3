"""Loading a model whose shapes depend on the values of some of its inputs.

A node may need, at import, a tensor that the model computes from what it is fed:
Reshape's ``shape``, Resize's ``scales`` or ``sizes``, Pad's ``pads``, a reduction's
``axes``, TopK's ``k``, Range's bounds, Tile's ``repeats``. rlx's ops have static (or
symbolic) shapes, so the graph cannot exist before those values do. When every such
value comes from graph inputs, ``load`` returns a ``ValueDependentGraph``
(``rlx_core.ir.valued``): at each run it reads those inputs on the host and converts the
model with them bound as constants, exactly as a model that stores them as initializers
converts (shape computations fold, every op ``load`` reads works), keeping each built
graph by sizes and values. ``load(model, values={...})`` binds such inputs once, at load,
for a graph that is static in them.

Only small inputs may be read this way (``MAX_VALUE_ELEMENTS``): a value computed from a
large tensor (a mask's ``NonZero``) is a data-dependent shape, which rlx refuses.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
from onnx import GraphProto, NodeProto

from ..errors import ModelError
from ..ir import Graph
from ..ir.valued import MAX_VALUE_ELEMENTS, ValueDependentGraph
from ._context import NeedsValue
from ._dynamic import symbol_names, symbolic_shapes, without_weights
from ._loader import Model
from ._subgraphs import node_reads, subgraphs

__all__ = ["inputs_behind", "load_valued"]

#: Ops whose output depends only on their input's shape (and dtype): the search for the
#: inputs behind a value does not go through them.
_SHAPE_ONLY = frozenset({"Shape", "Size", "EyeLike"})


def inputs_behind(gp: GraphProto, tensor: str, fed: Sequence[str]) -> list[str]:
    """The graph inputs among ``fed`` whose values ``tensor`` is computed from, in
    ``fed``'s order (none when it comes from initializers and shapes only). ``tensor``
    may be a value inside a subgraph (an If branch): subgraphs' nodes are searched too,
    and a node holding subgraphs reads what they read."""
    producers = {out: node for node in _every_node(gp) for out in node.output if out}
    wanted, seen, stack = set(fed), set(), [tensor]
    found: set[str] = set()
    while stack:
        name = stack.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        if name in wanted:
            found.add(name)
            continue
        node = producers.get(name)
        if node is not None and node.op_type not in _SHAPE_ONLY:
            stack.extend(node_reads(node))
    return [n for n in fed if n in found]


def _every_node(gp: GraphProto) -> Iterator[NodeProto]:
    """``gp``'s nodes and those of every subgraph inside them."""
    for node in gp.node:
        yield node
        for inner in subgraphs(node):
            yield from _every_node(inner)


def load_valued(model: Model, dims: Mapping[str, int], free: Sequence[str], first: NeedsValue) -> ValueDependentGraph:
    """``model`` as a graph built from the values of the inputs behind ``first`` (the
    value the conversion stopped at); ``ModelError`` (``first``'s) when no input is
    behind it, or when one is too large to be read as a value."""
    fed = [name for name, _, _ in model.specs if name not in model.values]
    wanted = inputs_behind(model.gp, first.tensor, fed)
    if not wanted:
        raise ModelError(str(first))
    _check_small(model, wanted, first)
    names = symbol_names(free)
    shapes = symbolic_shapes(model, dims, names)
    builder = _Builder(model, dims, {key: names[key] for key in free}, fed, wanted)
    inputs = [(name, shapes[name], dtype) for name, dtype, _ in model.specs if name not in model.values]
    return ValueDependentGraph(model.name, inputs, [o.name for o in model.gp.output], wanted, builder,
                               source=model.where)


def _check_small(model: Model, wanted: Sequence[str], first: NeedsValue) -> None:
    """A value input whose declared shape is static and larger than ``MAX_VALUE_ELEMENTS``
    is refused at load, naming it (one of symbolic size is checked at each run)."""
    for name, _, shape in model.specs:
        if name in wanted and all(isinstance(d, int) for d in shape):
            n = math.prod(shape)  # type: ignore[arg-type]
            if n > MAX_VALUE_ELEMENTS:
                raise ModelError(f"{first}; that value is computed from input {name!r} ({n} elements), and rlx builds "
                                 f"graphs from input values only up to {MAX_VALUE_ELEMENTS} elements")


class _Builder:
    """Converts the model for a set of sizes and values (``ValueBuilder``). The first
    conversion reads the weights; later ones take the arrays it made, and the model kept
    for them drops the weights' data (no weight is held twice)."""

    def __init__(self, model: Model, dims: Mapping[str, int], free: Mapping[str, str], fed: Sequence[str],
                 wanted: Sequence[str]) -> None:
        self._model, self._dims, self._free, self._fed = model, dict(dims), dict(free), list(fed)
        self._known = list(wanted)
        self._params: dict[str, np.ndarray] | None = None
        self._lock = threading.Lock()

    def __call__(self, sizes: Mapping[str, int], read: Callable[[str], np.ndarray]) -> tuple[Graph, tuple[str, ...]]:
        dims = {**self._dims, **{key: sizes[symbol] for key, symbol in self._free.items()}}
        with self._lock:
            model, params, used = self._model, self._params, list(self._known)
        while True:
            try:
                graph = model.convert(dims, preloaded=params, values={n: read(n) for n in used})
                break
            except NeedsValue as exc:  # a further value: the inputs behind it are read too
                more = [n for n in inputs_behind(model.gp, exc.tensor, self._fed) if n not in used]
                if not more:
                    raise ModelError(str(exc)) from None
                used += more
        with self._lock:
            self._known = [n for n in self._fed if n in set(used) | set(self._known)]
            if self._params is None:
                self._params = {graph.node(i).name: graph.value(i) for i in graph.params}
                self._model = model.with_graph(without_weights(model.gp, set(self._params)))
        return graph, tuple(used)
