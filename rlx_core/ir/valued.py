"""A graph whose shapes depend on the values of some inputs: ``ValueDependentGraph``.

Why it exists: a model may compute a shape, axes, pads, scales or a count from what it
is fed (ONNX's own node tests feed Reshape's ``shape``, Resize's ``sizes``, a
reduction's ``axes``, TopK's ``k`` at run time). rlx's IR has no op whose output shape
depends on a value, so such a graph has no body until those values are known. This
class is that contract: it declares the inputs (symbolic dims allowed) and the output
names; ``build(inputs)`` reads the *value inputs* (small tensors, on the host) and the
other inputs' shapes, and hands back the static graph the builder makes for them, with
the value inputs folded in as constants. Built graphs are kept per key (sizes and
values) in a small LRU: feeding the same values again rebuilds nothing.

Placement needs a body, so a ``ValueDependentGraph`` is placed at its first run
(``compiler.dynamic.ValueCompiledGraph``); ``specialize`` and ``representative`` refuse it
with a ``GraphError`` that says so. A value input holds at most ``MAX_VALUE_ELEMENTS``
elements: compiling per value of a large tensor would be a compile per request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import GraphError, InputError, RlxError
from . import Graph
from .symbolic import Dim, format_shape

__all__ = ["RunTimeGraph", "ValueDependentGraph", "ValueBuilder", "MAX_VALUE_ELEMENTS"]

#: The most elements a value input may hold (its values key the graph built).
MAX_VALUE_ELEMENTS = 4096
#: Built graphs kept (their weights are shared, so they are cheap to hold).
_KEEP = 8

#: Builds the static graph for ``sizes`` (symbol -> size), reading value inputs with
#: ``read(name)``; returns it and the names of every input whose value it read (a builder
#: may find more than it was told of). Raises an ``RlxError`` when the values do not fit.
ValueBuilder = Callable[[Mapping[str, int], Callable[[str], np.ndarray]], "tuple[Graph, tuple[str, ...]]"]


class RunTimeGraph(Graph):
    """A graph with no body before it runs: its inputs (symbolic dims allowed) and output
    names are declared, and what runs is made at run time from what the inputs hold
    (``ValueDependentGraph`` here, ``staged.StagedGraph``). It refuses what needs a body:
    ``specialize``, edits, ``to_json``, and ``specialize.representative`` (so placing,
    pricing and made-up inputs wait for the run); ``needs()`` says why, for messages."""

    def __init__(self, name: str, inputs: Sequence[tuple[str, Sequence[Dim], str]], outputs: Sequence[str],
                 source: str) -> None:
        super().__init__(name)
        declared = Graph(name)  # built open, then taken: this graph refuses edits (_check_open)
        for in_name, shape, dtype in inputs:
            declared.input(in_name, tuple(shape), dtype)
        self._take_contents(declared)
        self._recount_symbols()
        self._output_names = list(outputs)
        self._source = source
        self._frozen = True

    @property
    def source(self) -> str:
        return self._source

    @property
    def is_symbolic(self) -> bool:
        """Always: like a graph with symbolic dims, it has no static body of its own."""
        return True

    @property
    def value_inputs(self) -> tuple[str, ...]:
        """The inputs whose values (not only shapes) shape what runs: made-up values would
        not fit the model, so tools ask for them."""
        return ()

    def needs(self) -> str:
        """Why the graph has no body yet, as messages say it."""
        raise NotImplementedError

    def priced(self) -> Graph | None:
        """The graph placement prices before a run (none here: what runs is placed when
        it is built; a staged graph gives its first part)."""
        return None

    def output_names(self) -> list[str]:
        return list(self._output_names)

    def specialize(self, bindings: Mapping[str, int]) -> Graph:
        raise GraphError(f"specialize: {self.needs()}")

    def _check_open(self, what: str) -> None:
        raise GraphError(f"{what}: {self.needs()}; it cannot be edited")

    def to_json(self) -> str:
        raise GraphError(f"{self.needs()}; it cannot be saved as JSON: keep the model file")

    def _inputs_text(self) -> str:
        return ", ".join(f"{n.name} {format_shape(n.shape)} {n.dtype}" for n in map(self.node, self._inputs))


class ValueDependentGraph(RunTimeGraph):
    """See the module docstring. ``inputs`` are ``(name, shape, dtype)`` with symbolic dims
    allowed; ``outputs`` the output names; ``value_inputs`` the inputs whose values are
    known to shape the graph; ``source`` names what the builder builds from, for messages."""

    def __init__(self, name: str, inputs: Sequence[tuple[str, Sequence[Dim], str]], outputs: Sequence[str],
                 value_inputs: Sequence[str], build: ValueBuilder, source: str) -> None:
        super().__init__(name, inputs, outputs, source)
        unknown = [v for v in value_inputs if v not in self._names]
        if unknown or not value_inputs:
            raise GraphError(f"ValueDependentGraph {name!r}: value inputs {list(value_inputs)} must be some of its "
                             f"inputs {[n for n, _, _ in inputs]}")
        self._value_inputs = tuple(value_inputs)
        self._build = build
        self._lock = threading.Lock()
        self._built: OrderedDict[Hashable, Graph] = OrderedDict()

    # ------------------------------------------------------------------ what it is
    @property
    def value_inputs(self) -> tuple[str, ...]:
        """The inputs whose values shape the graph (read on the host at each run)."""
        return self._value_inputs

    def needs(self) -> str:
        listed = ", ".join(repr(v) for v in self._value_inputs)
        return (f"graph {self.name!r} ({self._source}) computes its shapes from the values of input(s) {listed}, "
                "so it is built, placed and compiled when they are known: at each run, once per set of values")

    # ------------------------------------------------------------------ building
    def key(self, inputs: Mapping[str, Any]) -> Hashable:
        """What identifies the graph built for ``inputs``: every symbol's size and every
        value input's bytes. ``InputError`` naming what is missing, too large or of a
        shape the graph does not take."""
        bindings = self.bind(self.input_shapes(inputs))
        arrays = [self.read(inputs, v) for v in self._value_inputs]
        return (tuple(sorted(bindings.items())),
                tuple((v, a.shape, a.tobytes()) for v, a in zip(self._value_inputs, arrays)))

    def describe(self, key: Hashable) -> str:
        """A ``key`` as reports show it: each value input's values, then the sizes."""
        sizes, values = key  # type: ignore[misc]
        shown = [f"{name}={_show(np.frombuffer(data, self.input_node(name).dtype).reshape(shape))}"
                 for name, shape, data in values]
        return ", ".join(shown + [f"{k}={v}" for k, v in sizes])

    def build(self, inputs: Mapping[str, Any]) -> tuple[Hashable, Graph]:
        """The key of ``inputs`` and the static graph built for them (kept for the last
        few keys). ``InputError`` when the model does not accept these sizes or values."""
        key = self.key(inputs)
        with self._lock:
            found = self._built.get(key)
            if found is not None:
                self._built.move_to_end(key)
                return key, found
        bindings = dict(key[0])  # type: ignore[index]
        try:
            graph, used = self._build(bindings, lambda name: self.read(inputs, name))
        except InputError:
            raise
        except RlxError as exc:
            shown = ", ".join(f"{v}={_show(self.read(inputs, v))}" for v in self._value_inputs)
            raise InputError(f"graph {self.name!r} ({self._source}) cannot be built for {shown}"
                             f"{' at ' + _sizes(bindings) if bindings else ''}: {exc}") from None
        with self._lock:
            if set(used) - set(self._value_inputs):  # the builder read more: every key so far lacks them
                self._value_inputs = tuple(n for n in self._names if n in set(used) | set(self._value_inputs))
                self._built.clear()
            key = self.key(inputs)
            self._built[key] = graph
            while len(self._built) > _KEEP:
                self._built.popitem(last=False)
        return key, graph

    def feed(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``inputs`` without the value inputs: what the built graph takes."""
        return {k: v for k, v in inputs.items() if k not in self._value_inputs}

    def read(self, inputs: Mapping[str, Any], name: str) -> np.ndarray:
        """Value input ``name`` of ``inputs`` as a host array of its declared dtype;
        ``InputError`` when it is missing, not an array, too large, or holds values its
        dtype cannot (``3.5`` for an int64 input)."""
        node = self.input_node(name)
        if name not in inputs:
            raise InputError(f"missing input {name!r}: {self.needs()}")
        try:
            arr = np.asarray(inputs[name])
        except Exception as exc:
            raise InputError(f"input {name!r}: rlx reads its values on the host to build the graph, and cannot "
                             f"read a {type(inputs[name]).__name__} there ({exc})") from None
        if arr.size > MAX_VALUE_ELEMENTS:
            raise InputError(f"input {name!r} holds {arr.size} elements: its values shape graph {self.name!r}, and rlx "
                             f"reads such values only up to {MAX_VALUE_ELEMENTS} elements (one compile per set of "
                             "values)")
        want = np.dtype(node.dtype)
        if arr.dtype != want:
            cast = arr.astype(want)
            if arr.dtype.kind not in "biuf" or not np.array_equal(cast, arr):
                raise InputError(f"input {name!r}: got {arr.dtype} values {_show(arr)}, which {want} (the input's "
                                 "dtype) does not hold exactly")
            arr = cast
        return arr if arr.flags.c_contiguous else arr.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)

    # ------------------------------------------------------------------ what it refuses
    def specialize(self, bindings: Mapping[str, int]) -> Graph:
        raise GraphError(f"specialize: {self.needs()}; build(inputs) makes the graph for a set of inputs")

    def _check_open(self, what: str) -> None:
        raise GraphError(f"{what}: {self.needs()}; it cannot be edited (load it with values=... for a graph you can "
                         "edit)")

    def summary(self) -> str:
        return (f"Graph {self.name!r}: built per set of values of {', '.join(self._value_inputs)} "
                f"(rebuilt from {self._source}); inputs {self._inputs_text()}; outputs {', '.join(self._output_names)}")

    def __repr__(self) -> str:
        return f"ValueDependentGraph({self.name!r}, value inputs {list(self._value_inputs)})"


def _show(arr: np.ndarray) -> str:
    """A value input as messages show it: a scalar as a number, else its first elements."""
    if arr.ndim == 0:
        return str(arr.item())
    flat = [str(v) for v in arr.reshape(-1)[:8].tolist()]
    return "[" + ", ".join(flat) + (", ...]" if arr.size > 8 else "]")


def _sizes(bindings: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(bindings.items()))
