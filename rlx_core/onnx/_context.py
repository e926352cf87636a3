"""What a converter sees: one ONNX node's operands, attributes and outputs.

A converter is a function ``(NodeContext) -> list[Operand | None]`` (one entry per
ONNX output, ``None`` for an optional output it does not produce), registered for one
or more op types with ``@converter("Add", ...)``. It reads run-time operands with
``input``, data that must be known at import (shapes, axes, pads) with ``ints`` or
``static``, and builds its result with ``c.f.op`` (see ``_shapes.Emitter``), passing
``name=c.out()`` to the op that produces the node's output so the graph keeps the ONNX
value names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from onnx import AttributeProto, GraphProto, NodeProto, TensorProto, helper

from ..errors import ModelError
from ..ir.dtypes import DTYPES
from ._shapes import Emitter, Operand
from ._symdims import Dims, NotSymbolic

__all__ = ["CONVERTERS", "Converter", "NeedsValue", "NodeContext", "converter", "describe_node", "onnx_dtype"]


class NeedsValue(ModelError):
    """A node needs the value of ``tensor`` at import (a shape, axes, pads...), and the
    model computes it at run time. ``load`` catches it: when the value comes from graph
    inputs, the model loads as a graph rebuilt from those inputs' values at each run
    (``_values``); otherwise it is the model's refusal."""

    def __init__(self, message: str, tensor: str) -> None:
        super().__init__(message)
        self.tensor = tensor


class NeedsHost(ModelError):
    """A node that rlx's ops cannot express at this size (a TopK whose K is too large to
    unroll) and that the host runs (``_host_ops.HOST_RUNS``); ``tensor`` is its first
    output, ``tensors`` the first outputs of every such node a conversion met (it goes on
    past the first, so that one cut takes them all). ``load`` cuts the model around them
    (``_staged``); in a subgraph it is the model's refusal."""

    def __init__(self, message: str, tensor: str, tensors: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.tensor = tensor
        self.tensors = tuple(tensors) or (tensor,)


class SpliceIf(ModelError):
    """An ``If`` whose condition is known at import but whose branch holds ops that run on
    the host: ``load`` splices the branch into the graph (``_inline``) and loads again, so
    those ops run between compiled parts. ``tensor`` is the If's first output, ``taken``
    the branch (True: then)."""

    def __init__(self, message: str, tensor: str, taken: bool) -> None:
        super().__init__(message)
        self.tensor, self.taken = tensor, taken


_ONNX_DTYPES: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "float64",
    TensorProto.INT32: "int32",
    TensorProto.INT64: "int64",
    TensorProto.BOOL: "bool",
    # The extended integers: a graph holding them runs on a backend that declares them
    # (Backend.dtypes; rlx-cpu and jax do).
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.INT16: "int16",
    TensorProto.UINT16: "uint16",
    TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64",
    # The storage formats (rlx_core.ir.dtypes.STORAGE_DTYPES): cast and moved, never
    # computed in; a graph holding them runs on a backend that declares them (rlx-cpu, jax).
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    TensorProto.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    TensorProto.FLOAT8E5M2: "float8_e5m2",
    TensorProto.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
    TensorProto.FLOAT4E2M1: "float4_e2m1fn",
    TensorProto.INT4: "int4",
    TensorProto.UINT4: "uint4",
    TensorProto.INT2: "int2",
    TensorProto.UINT2: "uint2",
}


def onnx_dtype(code: int, what: str) -> str:
    """The rlx dtype of ONNX element type ``code``; ``ModelError`` naming ``what`` if none."""
    if code in _ONNX_DTYPES:
        return _ONNX_DTYPES[code]
    try:
        onnx_name = TensorProto.DataType.Name(code)
    except ValueError:
        onnx_name = f"#{code}"
    raise ModelError(f"{what} has ONNX dtype {onnx_name}, which rlx does not support (it has {', '.join(DTYPES)})")


def describe_node(node: NodeProto, index: int) -> str:
    """``node 'conv1' (Conv)``, or ``node #3 (Conv) -> 'y'`` for an unnamed node."""
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
    if node.name:
        return f"node {node.name!r} ({op})"
    outs = ", ".join(repr(o) for o in node.output if o)
    return f"node #{index} ({op})" + (f" -> {outs}" if outs else "")


TensorReader = Callable[[TensorProto, str], np.ndarray]
#: Converts a subgraph inline: (graph, its inputs' operands, what it is) -> its outputs.
SubgraphRunner = Callable[[GraphProto, Sequence[Operand], str], list[Operand]]


class NodeContext:
    """One node being converted; see the module docstring."""

    def __init__(self, node: NodeProto, index: int, operands: Sequence[Operand | None], emitter: Emitter,
                 opset: int, used: Sequence[bool], read_tensor: TensorReader,
                 subgraph: SubgraphRunner | None = None) -> None:
        self.node = node
        self.index = index
        self.f = emitter
        self.opset = opset
        self._operands = list(operands)
        self._used = list(used)
        self._read_tensor = read_tensor
        self._subgraph = subgraph
        self._attrs = {a.name: a for a in node.attribute}

    @property
    def op_type(self) -> str:
        return self.node.op_type

    def describe(self) -> str:
        return describe_node(self.node, self.index)

    def fail(self, message: str) -> ModelError:
        return ModelError(message)

    # ------------------------------------------------------------ inputs
    @property
    def num_inputs(self) -> int:
        return len(self._operands)

    def optional(self, i: int) -> Operand | None:
        """Input ``i``, or ``None`` when the model leaves it out (absent or named "")."""
        return self._operands[i] if i < len(self._operands) else None

    def input(self, i: int, what: str = "") -> Operand:
        x = self.optional(i)
        if x is None:
            raise self.fail(f"input {i}{f' ({what})' if what else ''} is required")
        return x

    def inputs(self) -> list[Operand]:
        """Every input, none of which may be left out (variadic ops)."""
        return [self.input(i) for i in range(self.num_inputs)]

    def static(self, i: int, what: str) -> np.ndarray | None:
        """Input ``i`` as an array known at import, ``None`` if left out; ``ModelError``
        when it is only known at run time (rlx graphs have static shapes)."""
        x = self.optional(i)
        if x is None:
            return None
        if isinstance(x, Dims):
            raise NotSymbolic(f"input {what} ({self.node.input[i]!r}) is read as data, and it depends on the sizes")
        arr = self.f.array(x)
        if arr is None:
            name = self.node.input[i]
            raise NeedsValue(f"input {what} ({name!r}) must be known at import (rlx shapes are static), "
                             "but it is computed at run time", name)
        return arr

    def ints(self, i: int, what: str) -> tuple[int, ...] | None:
        """Input ``i`` as a tuple of ints known at import (shape, axes, pads...); in a
        symbolic load, of dims where it depends on the sizes (``_symdims``)."""
        x = self.optional(i)
        if isinstance(x, Dims):
            return x.values()
        arr = self.static(i, what)
        if arr is None:
            return None
        if arr.dtype.kind not in "iu":
            raise self.fail(f"input {what} must hold integers, got {arr.dtype}")
        return tuple(int(v) for v in arr.reshape(-1))

    def shape(self, i: int) -> tuple[int, ...]:
        return self.f.shape(self.input(i))

    def dtype(self, i: int) -> str:
        return self.f.dtype(self.input(i))

    def subgraph(self, name: str, inputs: Sequence[Operand] = ()) -> list[Operand]:
        """Convert the subgraph held in attribute ``name`` (an If branch, a Loop or Scan
        body) inline, its inputs bound to ``inputs``; its outputs, as operands."""
        a = self._attrs.get(name)
        if a is None or a.type != AttributeProto.GRAPH:
            raise self.fail(f"needs a graph attribute {name!r}")
        if self._subgraph is None:
            raise self.fail("subgraphs are not read here")
        return self._subgraph(a.g, inputs, f"{name} {a.g.name!r}" if a.g.name else name)

    def tensor(self, t: TensorProto, what: str) -> np.ndarray:
        """A ``TensorProto`` (an attribute's) as an array, checked like an initializer."""
        return self._read_tensor(t, what)

    # ------------------------------------------------------------ attributes
    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute's value: int, float, str, list, or an array for tensors."""
        a = self._attrs.get(name)
        if a is None:
            return default
        if a.type == AttributeProto.TENSOR:
            return self.tensor(a.t, f"attribute {name!r}")
        if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSOR,
                      AttributeProto.TENSORS, AttributeProto.SPARSE_TENSORS, AttributeProto.TYPE_PROTO,
                      AttributeProto.TYPE_PROTOS):
            return a
        value = helper.get_attribute_value(a)
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if isinstance(value, list):
            return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
        return value

    def attr_ints(self, name: str, default: Sequence[int] | None = None) -> tuple[int, ...] | None:
        value = self.attr(name)
        if value is None:
            return None if default is None else tuple(default)
        return tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))

    # ------------------------------------------------------------ outputs
    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def out(self, i: int = 0) -> str:
        """The ONNX name of output ``i`` (the name its graph node gets)."""
        return self.node.output[i] if i < len(self.node.output) else ""

    def used(self, i: int) -> bool:
        """Whether output ``i`` is consumed by a node or is a graph output."""
        return i < len(self._used) and self._used[i]


Converter = Callable[[NodeContext], "list[Operand | None]"]
CONVERTERS: dict[str, Converter] = {}


def converter(*op_types: str) -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of ``op_types`` (default domain)."""

    def register(fn: Converter) -> Converter:
        for op in op_types:
            assert op not in CONVERTERS, f"two converters for {op}"
            CONVERTERS[op] = fn
        return fn

    return register
