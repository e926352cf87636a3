"""Constants computed from the sizes: what an export computes from ``Shape`` at run time.

A model exported with dynamic axes makes small tensors out of its sizes: the position ids
``Range(0, seq)``, the token types ``ConstantOfShape((batch, seq))``, the ones an ``Expand``
multiplies by, a shape vector used as data. In a static graph each is a constant; in a
symbolic one its value (and often its shape) depends on the symbols. A *sized constant* is
such a value: a ``constant`` node that holds a recipe instead of an array, its shape
symbolic where the recipe's is. Specializing the graph computes it (``materialize``), so a
specialized graph, and every backend and pass that sees one, holds a plain constant.

Three recipes, each kept small and exact:

- ``fill``: every element ``value`` (ONNX ``ConstantOfShape``; ``Expand``'s ones);
- ``arange``: ``start + i * delta`` for ``i`` in ``range(shape[0])`` (``Range``), with
  ``start`` a dim;
- ``dims``: the elements are dims, listed (a ``Shape`` output used as data).

The recipe lives in the node's attrs (``{"sized": kind, ...}``), so the graph's JSON
round-trips it; a symbolic graph's ``value`` of one raises ``GraphError`` (no array yet).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import GraphError
from .dtypes import normalize_dtype
from .symbolic import Dim, Sym, evaluate, from_obj, to_obj

__all__ = ["SIZED_KINDS", "sized_attrs", "materialize", "is_sized", "holds_array", "sized_to_json", "sized_from_json"]

SIZED_KINDS = ("fill", "arange", "dims")
_INT_DTYPES = ("int64", "int32")


def _dim(value: Any, what: str) -> Dim:
    if isinstance(value, Sym):
        return value
    if isinstance(value, str) and value.isidentifier():  # a symbol's name, as ``Graph.input`` takes it
        return Sym(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise GraphError(f"sized constant: {what} must be an int or a symbolic dim (a Sym or a symbol's name), "
                         f"got {value!r}")
    return int(value)


def _number(value: Any, dtype: str, what: str) -> int | float | bool:
    """``value`` as the Python number ``dtype`` holds exactly (``GraphError`` otherwise)."""
    arr = np.asarray(value)
    if arr.shape != () or arr.dtype.kind not in "biuf":
        raise GraphError(f"sized constant: {what} must be a number, got {value!r}")
    cast = arr.astype(dtype)
    both_nan = arr.dtype.kind == "f" and cast.dtype.kind == "f" and bool(np.isnan(arr)) and bool(np.isnan(cast))
    if not (both_nan or cast == arr):
        raise GraphError(f"sized constant: {what} {value!r} is not exactly a {dtype}")
    return cast.item()


def sized_attrs(kind: str, shape: Sequence[Dim], dtype: str,
                params: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[Dim, ...]]:
    """The checked attrs of a sized constant of ``kind`` (see the module), ``shape`` and
    ``dtype``, and its shape (symbol names made ``Sym``); ``GraphError`` naming what is wrong."""
    dtype = normalize_dtype(dtype)
    shape = tuple(_dim(d, "a dim of its shape") for d in shape)
    return _attrs(kind, shape, dtype, params), shape


def _attrs(kind: str, shape: tuple[Dim, ...], dtype: str, params: Mapping[str, Any]) -> dict[str, Any]:
    if kind == "fill":
        if set(params) != {"value"}:
            raise GraphError(f"sized constant 'fill' takes value, got {sorted(params)}")
        return {"sized": kind, "value": _number(params["value"], dtype, "value")}
    if kind == "arange":
        if set(params) != {"start", "delta"}:
            raise GraphError(f"sized constant 'arange' takes start and delta, got {sorted(params)}")
        if len(shape) != 1:
            raise GraphError(f"sized constant 'arange' is 1-D, got shape {shape}")
        start = params["start"]
        if dtype in _INT_DTYPES:
            start = _dim(start, "start")
        elif isinstance(start, Sym):
            raise GraphError(f"sized constant 'arange' of {dtype} needs a number start, got {start}")
        else:
            start = _number(start, dtype, "start")
        delta = _number(params["delta"], dtype, "delta")
        if delta == 0:
            raise GraphError("sized constant 'arange': delta is 0")
        return {"sized": kind, "start": start, "delta": delta}
    if kind == "dims":
        if set(params) != {"values"}:
            raise GraphError(f"sized constant 'dims' takes values, got {sorted(params)}")
        if dtype not in _INT_DTYPES:
            raise GraphError(f"sized constant 'dims' holds {' or '.join(_INT_DTYPES)}, not {dtype}")
        if not all(isinstance(d, int) for d in shape):
            raise GraphError(f"sized constant 'dims' has a static shape, got {shape}")
        values = tuple(_dim(v, "a value") for v in params["values"])
        if len(values) != math.prod(shape):
            raise GraphError(f"sized constant 'dims': {len(values)} values for shape {shape}")
        return {"sized": kind, "values": values}
    raise GraphError(f"unknown sized constant {kind!r} (known: {', '.join(SIZED_KINDS)})")


def is_sized(attrs: Mapping[str, Any]) -> bool:
    """Whether a constant node's ``attrs`` hold a recipe (no array until specialized)."""
    return "sized" in attrs


def holds_array(node: Any) -> bool:
    """Whether ``node`` is a constant with an array (``graph.value`` answers), not a sized
    one: what a pass that reads a constant's value must ask first."""
    return node.op == "constant" and "sized" not in node.attrs


def materialize(attrs: Mapping[str, Any], shape: Sequence[int], dtype: str, sizes: Mapping[str, int]) -> np.ndarray:
    """The array of a sized constant under ``sizes`` (``shape`` already evaluated there)."""
    kind, np_dtype = attrs["sized"], np.dtype(dtype)
    if kind == "fill":
        return np.full(tuple(shape), attrs["value"], dtype=np_dtype)
    if kind == "arange":
        start = attrs["start"]
        start = evaluate(start, sizes) if isinstance(start, Sym) else start
        n = int(shape[0])
        return (start + np.arange(n, dtype=np.float64 if np_dtype.kind == "f" else np.int64)
                * attrs["delta"]).astype(np_dtype)
    values = [evaluate(v, sizes) for v in attrs["values"]]
    return np.asarray(values, dtype=np_dtype).reshape(tuple(shape))


def sized_to_json(attrs: Mapping[str, Any], shape: Sequence[Dim]) -> dict[str, Any]:
    """A sized constant's recipe and shape, JSON-able (dims through ``to_obj``)."""
    out: dict[str, Any] = {"sized": attrs["sized"], "shape": [to_obj(d) for d in shape]}
    for key, value in attrs.items():
        if key == "values":
            out[key] = [to_obj(v) for v in value]
        elif key == "start" and isinstance(value, (int, Sym)) and not isinstance(value, bool):
            out[key] = to_obj(value)
        elif key != "sized":
            out[key] = value
    return out


def sized_from_json(doc: Mapping[str, Any]) -> tuple[str, tuple[Dim, ...], dict[str, Any]]:
    """``(kind, shape, params)`` from ``sized_to_json``'s form (``ValueError`` if malformed)."""
    kind = doc["sized"]
    shape = tuple(from_obj(d) for d in doc["shape"])
    params = {k: v for k, v in doc.items() if k not in ("sized", "shape")}
    if "values" in params:
        params["values"] = [from_obj(v) for v in params["values"]]
    if kind == "arange" and isinstance(params.get("start"), (str, dict)):
        params["start"] = from_obj(params["start"])
    return kind, shape, params
