"""Loading a graph from JSON: every field checked, every node re-inferred.

Separate from ``ir`` because it is the one place that trusts nothing: a graph file may
come from another version, another tool, or a truncated download.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import GraphError, ModelError
from .dtypes import DTYPES
from .ops import OpKind
from .sized import sized_from_json

if TYPE_CHECKING:
    from .graph import Graph

GRAPH_FORMAT = "rlx.graph"
GRAPH_FORMAT_VERSION = 1
MAX_ARRAY_BYTES = 1 << 34  # 16 GiB: a declared size past this is a corrupt or hostile file


def _field(d: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise ModelError(f"graph JSON: {where} has no {key!r}")
    v = d[key]
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is int):
        raise ModelError(f"graph JSON: {where} field {key!r} has the wrong type ({type(v).__name__})")
    return v


def _array(spec: Any, where: str) -> np.ndarray:
    dtype = _field(spec, "dtype", str, where)
    if dtype not in DTYPES:
        raise ModelError(f"graph JSON: {where} has unsupported dtype {dtype!r}")
    shape = _field(spec, "shape", list, where)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ModelError(f"graph JSON: {where} has a bad shape {shape!r}")
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes > MAX_ARRAY_BYTES:
        raise ModelError(f"graph JSON: {where} declares {nbytes} bytes, over the limit of {MAX_ARRAY_BYTES}")
    try:
        raw = base64.b64decode(_field(spec, "data", str, where), validate=True)
    except (binascii.Error, ValueError):
        raise ModelError(f"graph JSON: {where} data is not valid base64") from None
    if len(raw) != nbytes:
        raise ModelError(f"graph JSON: {where} holds {len(raw)} bytes, its shape {shape} {dtype} needs {nbytes}")
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape)


def graph_from_json(cls: type[Graph], text: str | bytes) -> Graph:
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelError(f"graph JSON: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != GRAPH_FORMAT:
        raise ModelError("graph JSON: not an rlx graph (missing \"format\": \"rlx.graph\")")
    version = _field(doc, "version", int, "the document")
    if version > GRAPH_FORMAT_VERSION:
        raise ModelError(
            f"graph JSON: format version {version} is newer than this rlx-core reads "
            f"({GRAPH_FORMAT_VERSION}); upgrade rlx-core"
        )
    if version < 1:
        raise ModelError(f"graph JSON: unknown format version {version}")
    g = cls(str(doc.get("name", "graph")))
    nodes = _field(doc, "nodes", list, "the document")
    for i, d in enumerate(nodes):
        where = f"node {i}"
        if _field(d, "id", int, where) != i:
            raise ModelError(f"graph JSON: {where} has id {d['id']}; ids must be 0, 1, 2, ... in order")
        op_name = _field(d, "op", str, where)
        name = d.get("name", "") or ""
        try:
            op = OpKind(op_name)
        except ValueError:
            raise ModelError(f"graph JSON: {where} has unknown op {op_name!r}") from None
        try:
            if op is OpKind.INPUT:
                g.input(name, _field(d, "shape", list, where), _field(d, "dtype", str, where))
            elif op is OpKind.PARAM:
                g.param(name, _array(_field(d, "value", dict, where), where))
            elif op is OpKind.CONSTANT and "sized" in d:
                try:
                    kind, shape, params = sized_from_json(_field(d, "sized", dict, where))
                except (KeyError, TypeError, ValueError) as exc:
                    raise ModelError(f"graph JSON: {where} has a malformed sized constant ({exc})") from None
                g.sized_constant(kind, shape, _field(d, "dtype", str, where), name=name, **params)
            elif op is OpKind.CONSTANT:
                g.constant(_array(_field(d, "value", dict, where), where), name=name)
            else:
                inputs = _field(d, "inputs", list, where)
                if not all(isinstance(j, int) and 0 <= j < i for j in inputs):
                    raise ModelError(f"graph JSON: {where} ({op_name}) refers to inputs {inputs} not defined before it")
                attrs = d.get("attrs", {})
                if not isinstance(attrs, dict):
                    raise ModelError(f"graph JSON: {where} attrs must be an object")
                g.add_node(op, inputs, attrs, name)
        except GraphError as exc:
            raise ModelError(f"graph JSON: {where} ({op_name}): {exc}") from None
    outputs = _field(doc, "outputs", list, "the document")
    if not outputs or not all(isinstance(j, int) and 0 <= j < len(nodes) for j in outputs):
        raise ModelError(f"graph JSON: outputs {outputs!r} must be a non-empty list of node ids")
    g.set_outputs(outputs)
    return g
