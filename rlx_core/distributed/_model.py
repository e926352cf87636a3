"""A model seen as a row-wise function: where its batch dimension is and what a row looks like.

Batch inference feeds a model rows, not tensors. This module answers the questions that
needs, without choosing a device (the driver of a cluster job asks them too, and it may
have no accelerator): which inputs and outputs carry the batch as their leading
dimension, whether that dimension is fixed (a graph built for ``B`` rows) or symbolic (an
ONNX ``batch`` dim, bound to each batch size in use), and the per-row shape and dtype of
every column.

Models travel to workers as bytes (graph JSON or ONNX protobuf), never as pickled graphs
and never as paths: a worker on another host may not see the driver's filesystem.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelError
from ..ir import Graph

__all__ = ["ColumnSpec", "BatchModel", "model_bytes", "output_column_names"]

#: How many batch sizes a symbolic model keeps bound (and compiled) at once. A job sees
#: its batch size and a remainder or two; more than this means sizes vary freely.
BOUND_SIZES_KEPT = 4


@dataclass(frozen=True)
class ColumnSpec:
    """One column as a model sees it: the shape of one row and its dtype."""

    name: str
    row_shape: tuple[int, ...]
    dtype: np.dtype

    def describe(self) -> str:
        return f"{self.dtype}{list(self.row_shape)} per row"


def _sniff(data: bytes) -> str:
    """``"graph"`` for graph JSON (starts with ``{``), else ``"onnx"`` (a protobuf)."""
    return "graph" if data.lstrip()[:1] == b"{" else "onnx"


def model_bytes(model: Any) -> tuple[str, bytes, str]:
    """``(kind, data, origin)`` of a model given as a Graph, a path or bytes.

    ``kind`` is ``"graph"`` or ``"onnx"``; ``origin`` is how messages name the model.
    """
    if isinstance(model, Graph):
        return "graph", model.to_json().encode("utf-8"), f"graph {model.name!r}"
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        if not data:
            raise ModelError("model bytes are empty; give graph JSON or an ONNX model")
        return _sniff(data), data, f"{_sniff(data)} bytes"
    if isinstance(model, (str, os.PathLike)):
        path = Path(os.fspath(model))
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelError(f"cannot read model file {str(path)!r}: {exc.strerror or exc}") from None
        suffix = path.suffix.lower()
        kind = "graph" if suffix == ".json" else "onnx" if suffix == ".onnx" else _sniff(data)
        return kind, data, str(path)
    raise ModelError(f"model must be a Graph, a .json or .onnx path, or the bytes of either; "
                     f"got {type(model).__name__}")


def output_column_names(graph: Graph) -> list[str]:
    """The column each graph output becomes: its name, made unique (``y``, ``y_1``, ...)."""
    return graph.output_names()


def _onnx() -> Any:
    from .. import onnx as rlx_onnx

    return rlx_onnx


class BatchModel:
    """A model and its batch dimension: a fixed-size graph, or an ONNX model bound per size.

    ``rows_per_run`` is the fixed batch ``B`` (``None`` when symbolic); ``inputs`` and
    ``outputs`` are the per-row column specs; ``graph_for(rows)`` is the graph to run a
    batch of ``rows`` rows with (the fixed graph, or the ONNX model bound to ``rows``).
    """

    def __init__(self, model: Any) -> None:
        """Load ``model`` (a ``Graph``, a ``.json``/``.onnx`` path, or bytes) and find its batch dimension."""
        self._onnx_data: bytes | None = None
        self._batch_keys: tuple[str, ...] = ()
        self._bound: OrderedDict[int, Graph] = OrderedDict()
        if isinstance(model, Graph):
            kind, data, self.origin = "graph", b"", f"graph {model.name!r}"
            graph: Graph | None = model
        else:
            kind, data, self.origin = model_bytes(model)
            graph = None
        if kind == "graph":
            if graph is None:
                try:
                    graph = Graph.from_json(data)
                except ModelError as exc:
                    raise ModelError(f"{self.origin}: {exc}") from None
            self.rows_per_run: int | None = self._fixed_batch(graph)
            self._fixed: Graph | None = graph
            probe = graph
        else:
            self._fixed = None
            self._onnx_data = data
            self.rows_per_run = self._onnx_batch(data)
            if self.rows_per_run is not None:
                self._fixed = _onnx().load(data)
                self._fixed_batch(self._fixed)
                probe = self._fixed
            else:
                probe = self.graph_for(1)
        self.name = probe.name
        self.inputs: tuple[ColumnSpec, ...] = tuple(
            ColumnSpec(n.name, n.shape[1:], np.dtype(n.dtype)) for n in (probe.node(i) for i in probe.inputs)
        )
        self.outputs: tuple[ColumnSpec, ...] = tuple(
            ColumnSpec(name, probe.node(i).shape[1:], np.dtype(probe.node(i).dtype))
            for name, i in zip(output_column_names(probe), probe.outputs)
        )

    # ------------------------------------------------------------------ analysis
    def _fixed_batch(self, graph: Graph) -> int:
        """The leading dimension every input and output shares, or ``ModelError``."""
        if not graph.inputs:
            raise ModelError(f"{self.origin}: the graph has no inputs, so there are no rows to feed it")
        if not graph.outputs:
            raise ModelError(f"{self.origin}: the graph has no outputs")
        first = graph.node(graph.inputs[0])
        if not first.shape:
            raise ModelError(f"{self.origin}: input {first.name!r} is a scalar; batch inference needs a leading "
                             "batch dimension on every input")
        rows = first.shape[0]
        if rows < 1:
            raise ModelError(f"{self.origin}: input {first.name!r} has batch dimension {rows}; it must be >= 1")
        for i in graph.inputs:
            n = graph.node(i)
            if not n.shape or n.shape[0] != rows:
                raise ModelError(f"{self.origin}: input {n.name!r} has shape {n.shape}, but input {first.name!r} "
                                 f"has batch dimension {rows}; every input must lead with the batch dimension")
        for name, i in zip(output_column_names(graph), graph.outputs):
            n = graph.node(i)
            if not n.shape or n.shape[0] != rows:
                raise ModelError(f"{self.origin}: output {name!r} has shape {n.shape}, which does not lead with "
                                 f"the batch dimension {rows}; its rows cannot be told apart")
        return rows

    def _onnx_batch(self, data: bytes) -> int | None:
        """The fixed batch of an ONNX model, or ``None`` (and the dims keys to bind) if symbolic."""
        specs = _onnx().list_inputs(data)
        if not specs:
            raise ModelError(f"{self.origin}: the model has no inputs, so there are no rows to feed it")
        keys: list[str] = []
        fixed: set[int] = set()
        for spec in specs:
            if not spec.shape:
                raise ModelError(f"{self.origin}: input {spec.name!r} is a scalar; batch inference needs a leading "
                                 "batch dimension on every input")
            lead, rest = spec.shape[0], spec.shape[1:]
            for axis, d in enumerate(rest, start=1):
                if isinstance(d, str):
                    raise ModelError(f"{self.origin}: input {spec.name!r} axis {axis} is symbolic ({d!r}); batch "
                                     "inference binds only the leading (batch) dimension, so fix the others when "
                                     "exporting the model")
            if isinstance(lead, str):
                keys.append(lead)
            else:
                fixed.add(lead)
        if keys and fixed:
            raise ModelError(f"{self.origin}: some inputs have a symbolic batch dimension and others a fixed one "
                             f"({sorted(fixed)}); the batch dimension must be the same on every input")
        if len(fixed) > 1:
            raise ModelError(f"{self.origin}: inputs disagree on the batch dimension ({sorted(fixed)})")
        self._batch_keys = tuple(dict.fromkeys(keys))
        return None if keys else fixed.pop()

    # ------------------------------------------------------------------ graphs
    @property
    def symbolic(self) -> bool:
        return self.rows_per_run is None

    def graph_for(self, rows: int) -> Graph:
        """The graph that runs ``rows`` rows at once (bound and cached for a symbolic model)."""
        if self._fixed is not None:
            return self._fixed
        graph = self._bound.get(rows)
        if graph is not None:
            self._bound.move_to_end(rows)
            return graph
        assert self._onnx_data is not None
        graph = _onnx().load(self._onnx_data, dims={key: rows for key in self._batch_keys})
        for name, i in zip(output_column_names(graph), graph.outputs):
            shape = graph.node(i).shape
            if not shape or shape[0] != rows:
                raise ModelError(f"{self.origin}: bound to {rows} rows, output {name!r} has shape {shape}; its "
                                 "leading dimension is not the batch dimension, so its rows cannot be told apart")
        self._bound[rows] = graph
        while len(self._bound) > BOUND_SIZES_KEPT:
            self._bound.popitem(last=False)
        return graph

    # ------------------------------------------------------------------ schema
    def check_columns(self, columns: Mapping[str, tuple[tuple[int, ...], Any]],
                      device_column: str | None = None) -> None:
        """Check ``{column: (row_shape, dtype)}`` against the model's inputs, before any work.

        Raises ``InputError`` naming the first input column that is missing or whose
        per-row shape or dtype differs (rlx never casts silently), or a column that an
        output (or ``device_column``) would overwrite.
        """
        for spec in self.inputs:
            if spec.name not in columns:
                have = ", ".join(repr(c) for c in columns) or "none"
                takes = ", ".join(f"{c.name!r} ({c.describe()})" for c in self.inputs)
                raise InputError(f"column {spec.name!r} is missing: model {self.name!r} takes {takes}; the data "
                                 f"has columns {have}")
            row_shape, dtype = columns[spec.name]
            if np.dtype(dtype) != spec.dtype:
                raise InputError(f"column {spec.name!r}: expected dtype {spec.dtype}, got {np.dtype(dtype)} "
                                 f"(rlx never casts silently; convert it with .astype('{spec.dtype}'))")
            if tuple(row_shape) != spec.row_shape:
                raise InputError(f"column {spec.name!r}: expected rows of shape {list(spec.row_shape)}, got "
                                 f"{list(row_shape)}")
        inputs = {c.name for c in self.inputs}
        taken = {c.name for c in self.outputs} | ({device_column} if device_column else set())
        for name in columns:
            if name in taken and name not in inputs:
                raise InputError(f"column {name!r} would be overwritten by the model output (or device column) of "
                                 "that name; rename the column")

    def __repr__(self) -> str:
        batch = "symbolic" if self.symbolic else str(self.rows_per_run)
        return f"<BatchModel {self.name!r} batch={batch} inputs={[c.name for c in self.inputs]}>"
