"""A symbolic graph whose body is rebuilt for each set of sizes: ``DeferredGraph``.

Why it exists: an ONNX export computes its shapes at run time (``Shape -> Gather ->
Concat -> Reshape`` chains, ``ConstantOfShape``, ``Range``, ``Expand`` to a computed
shape). Where the importer cannot carry such a computation as symbolic IR, it can still
fold it exactly once the sizes are known, as a static import does. A ``DeferredGraph``
is that contract made into a graph: its inputs have symbolic dims, so ``bind``,
``is_symbolic``, placement at a representative size and ``DynamicCompiledGraph``'s
compile per shape class all work as for any symbolic graph, while ``specialize`` calls
the builder it was given (the ONNX import re-run with those sizes) instead of
re-inferring its own nodes. Params are handed back to the builder, so a copy shares the
arrays of this graph (no weight is read or held twice).

Its body (``nodes``) is the graph built at the first representative size, with the inputs'
shapes shown symbolic: good for ``summary``, counting ops and pricing, not a graph to edit
(it is frozen) or to save (``to_json`` refuses; save the model file instead).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping

import numpy as np

from ..errors import GraphError, InputError, RlxError
from . import Graph
from .ops import OpKind
from .symbolic import Dim, evaluate, format_shape

__all__ = ["DeferredGraph", "Builder"]

#: Builds the static graph for ``bindings`` (symbol -> size), reusing ``params``
#: (name -> array) for the weights; raises an ``RlxError`` when the sizes do not fit.
Builder = Callable[[Mapping[str, int], Mapping[str, np.ndarray]], Graph]

#: Specializations kept (built graphs are cheap to hold: their weights are shared).
_KEEP = 4


class DeferredGraph(Graph):
    """See the module docstring. ``body`` is the graph built at ``at`` (symbol -> size);
    ``shapes`` gives each symbolic input's shape (input name -> dims); ``source`` names
    what the builder rebuilds from, for messages."""

    def __init__(self, body: Graph, shapes: Mapping[str, tuple[Dim, ...]], build: Builder,
                 at: Mapping[str, int], source: str) -> None:
        super().__init__(body.name)
        self._build = build
        self._source = source
        self._at = dict(at)
        self._take_contents(body)
        self._nodes = []
        for node in body.nodes:
            if node.op is OpKind.INPUT and node.name in shapes:
                shape = tuple(shapes[node.name])
                if tuple(evaluate(d, self._at) for d in shape) != node.shape:
                    raise GraphError(f"DeferredGraph: input {node.name!r} is {format_shape(shape)}, which under "
                                     f"{self._at} is not the body's {node.shape}")
                node = dataclasses.replace(node, shape=shape)
            self._nodes.append(node)
        self._recount_symbols()  # its inputs now carry the symbols
        missing = sorted(set(self.symbols) - set(self._at))
        if missing:
            raise GraphError(f"DeferredGraph: the body's sizes {self._at} give no value for {missing}")
        self._frozen = True
        self._lock = threading.Lock()
        self._built: OrderedDict[tuple[tuple[str, int], ...], Graph] = OrderedDict()
        self._built[tuple(sorted(self._at.items()))] = body

    @property
    def body_sizes(self) -> dict[str, int]:
        """The sizes (symbol -> size) the body was built at: ones the model converts at,
        where every symbol at one size may not (``specialize.representative`` tries
        them first)."""
        return dict(self._at)

    @property
    def source(self) -> str:
        """What the body is rebuilt from (the model file), as messages name it."""
        return self._source

    def _check_open(self, what: str) -> None:
        raise GraphError(f"{what}: graph {self.name!r} has symbolic dims and is rebuilt from {self._source} for "
                         "each set of sizes, so it cannot be edited; load it with its dims bound (dims=...) for a "
                         "static graph you can edit")

    def specialize(self, bindings: Mapping[str, int]) -> Graph:
        """The graph the builder makes for ``bindings`` (kept for the last few sizes).
        ``GraphError`` for a missing binding; ``InputError`` when the model does not accept
        the sizes (what the builder said, with the sizes)."""
        missing = sorted(set(self.symbols) - set(bindings))
        if missing:
            raise GraphError(f"specialize: graph {self.name!r} needs a value for symbol(s) {missing}; "
                             f"got {dict(bindings)}")
        sizes = {s: int(bindings[s]) for s in self.symbols}
        key = tuple(sorted(sizes.items()))
        with self._lock:
            found = self._built.get(key)
            if found is not None:
                self._built.move_to_end(key)
                return found
        params = {self._nodes[i].name: self._values[i] for i in self._params}
        try:
            graph = self._build(sizes, params)
        except RlxError as exc:
            text = ", ".join(f"{k}={v}" for k, v in key)
            raise InputError(f"graph {self.name!r} ({self._source}) does not accept {text}: {exc}") from None
        self._check_built(graph, sizes)
        with self._lock:
            self._built[key] = graph
            while len(self._built) > _KEEP:
                self._built.popitem(last=False)
        return graph

    def _check_built(self, graph: Graph, sizes: Mapping[str, int]) -> None:
        """The builder's graph takes the inputs this graph declares, at ``sizes``."""
        for i in self._inputs:
            node = self._nodes[i]
            want = tuple(evaluate(d, sizes) for d in node.shape)
            try:
                got = graph.input_node(node.name)
            except GraphError:
                got = None
            if got is None or got.op is not OpKind.INPUT or got.shape != want or got.dtype != node.dtype:
                have = "nothing" if got is None else f"{got.dtype}{format_shape(got.shape)}"
                raise GraphError(f"graph {self.name!r}: rebuilt for {dict(sizes)}, input {node.name!r} is {have}, "
                                 f"expected {node.dtype}{format_shape(want)}")

    def summary(self) -> str:
        at = ", ".join(f"{k}={v}" for k, v in sorted(self._at.items()))
        return (f"(symbolic dims; rebuilt from {self._source} for each set of sizes; the body below is shown at "
                f"{at})\n" + super().summary())

    def to_json(self) -> str:
        raise GraphError(f"graph {self.name!r} is rebuilt from {self._source} for each set of sizes and cannot be "
                         "saved as JSON; keep the model file, or load it with its dims bound (dims=...) and save "
                         "that static graph")

    def __repr__(self) -> str:
        return f"DeferredGraph({self.name!r}, {len(self._nodes)} nodes, symbols {list(self.symbols)})"

