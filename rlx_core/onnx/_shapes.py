"""Static folding: IR ops whose operands are all known at import are computed there.

Converters never call the graph builder directly; they call ``Emitter.op``, which looks
at the operands and picks one of three outcomes:

- every operand is a plain array (a Constant, a shape, a folded shape computation): the
  op is computed now with the reference interpreter, so ``Shape -> Gather -> Concat ->
  Reshape`` chains end as a static reshape and leave nothing in the graph;
- every operand is known but one derives from a weight (an initializer): the result is
  a ``Lazy``, known at import (its array is computed only if a converter reads it as
  static data, e.g. a reshape target) but rebuilt as graph ops on the param when a
  run-time op consumes it, so that weights stay replaceable with ``set_param``;
- an operand is a run-time ``Value``: the op is added to the graph;
- in a symbolic load, an operand is ``Dims`` (a shape value whose elements depend on
  the sizes, ``_symdims``): the op folds to dims where that is exact for every size, and
  a run-time op reading dims as data reads a sized constant (``rlx_core.ir.sized``).

Folding goes through ``rlx_core.reference``, so a folded op means exactly what the same
op means at run time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any, Union

import numpy as np

from .. import reference
from ..errors import ModelError
from ..ir import Graph, Node, Value
from ..ir.dtypes import itemsize, normalize_dtype
from ..ir.ops import OpKind, infer
from ..ir.shape_rules import has_sym, holds_sym
from ..ir.symbolic import Dim, Sym
from ._symdims import Dims, fold_dims

__all__ = ["Emitter", "Lazy", "Operand", "frozen"]


def frozen(arr: np.ndarray) -> np.ndarray:
    """A read-only, contiguous, native-order copy-if-needed of ``arr``."""
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        arr = arr.copy(order="C")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.flags.writeable:
        arr = arr.copy() if arr.base is not None else arr
        arr.flags.writeable = False
    return arr


class _Spec:
    """What ``ops.infer`` needs to know about an operand: its shape and dtype."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype


class Lazy:
    """A value known at import that derives from a weight.

    Either a param itself (``recipe`` is ``("param", name)``) or an IR op on known
    operands (``(kind, operands, attrs, name)``). ``array`` computes the content on first
    read; ``Emitter.value`` turns it into graph ops on the param on first run-time use.
    """

    __slots__ = ("_array", "_emitter", "_value", "dtype", "recipe", "shape")

    def __init__(self, emitter: Emitter, shape: tuple[int, ...], dtype: str, recipe: tuple[Any, ...],
                 array: np.ndarray | None = None) -> None:
        self._emitter, self.shape, self.dtype, self.recipe = emitter, tuple(shape), dtype, recipe
        self._array, self._value = array, None

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            kind, operands, attrs, _ = self.recipe
            self._array = self._emitter.fold(kind, [self._emitter.array(o) for o in operands], attrs)
        return self._array

    def __repr__(self) -> str:
        return f"Lazy({self.recipe[0]!r}, {self.shape}, {self.dtype})"


Operand = Union[np.ndarray, Lazy, Value, Dims]


def _call_builder(g: Graph, kind: str, values: Sequence[Value], attrs: dict[str, Any], name: str) -> Value:
    if kind == "concat":
        return g.concat(list(values), name=name, **attrs)
    return getattr(g, kind)(*values, name=name, **attrs)


class Emitter:
    """Adds ops to ``graph``, or computes them at import when their operands are known.

    ``max_bytes`` bounds every array made at import (folded results, ``ConstantOfShape``,
    ``Range``): a model cannot make the importer allocate more than that at once.
    """

    def __init__(self, graph: Graph, max_bytes: int) -> None:
        self.graph = graph
        self.max_bytes = max_bytes
        self._constants: dict[int, tuple[np.ndarray, Value]] = {}

    # ------------------------------------------------------------ operands
    @staticmethod
    def shape(x: Operand) -> tuple[int, ...]:
        return tuple(x.shape)

    @staticmethod
    def dtype(x: Operand) -> str:
        return x.dtype.name if isinstance(x, np.ndarray) else x.dtype

    @staticmethod
    def array(x: Operand) -> np.ndarray | None:
        """The content of ``x`` when it is known at import, else ``None``."""
        if isinstance(x, np.ndarray):
            return x
        if isinstance(x, Lazy):
            return x.array
        return None

    def const(self, value: Any, dtype: str) -> np.ndarray:
        """A small constant of ``dtype`` (how converters write Python scalars)."""
        return frozen(np.asarray(value, dtype=np.dtype(dtype)))

    def full(self, shape: Sequence[Dim], value: Any, dtype: str) -> Operand:
        """``value`` in every element of ``shape``: an array, or, where the shape depends on
        the sizes, a sized constant (``rlx_core.ir.sized``) filled once they are known."""
        if has_sym(shape):
            return self.graph.sized_constant("fill", tuple(shape), dtype, value=value)
        self.check_size(shape, dtype, "a filled constant")
        return frozen(np.full(tuple(shape), value, dtype=np.dtype(dtype)))

    def arange(self, n: Dim) -> Operand:
        """``arange(n)`` as int64: an array, or, where ``n`` depends on the sizes, a sized
        constant (``full``'s counterpart; a gather from it wraps negative indices)."""
        if isinstance(n, Sym):
            return self.graph.sized_constant("arange", (n,), "int64", start=0, delta=1)
        return frozen(np.arange(n, dtype=np.int64))

    def param(self, name: str, array: np.ndarray) -> Lazy:
        return Lazy(self, array.shape, array.dtype.name, ("param", name), array)

    def check_size(self, shape: Sequence[int], dtype: str, what: str) -> None:
        """``ModelError`` when a tensor of ``shape`` would exceed ``max_bytes``."""
        nbytes = math.prod(int(d) for d in shape) * itemsize(normalize_dtype(dtype))
        if nbytes > self.max_bytes:
            raise ModelError(
                f"{what} of shape {tuple(int(d) for d in shape)} {dtype} needs {nbytes} bytes, more than the "
                f"limit max_tensor_bytes={self.max_bytes}"
            )

    # ------------------------------------------------------------ building
    def value(self, x: Operand, name: str = "") -> Value:
        """``x`` as a graph value: arrays become constants (one node per array), ``Lazy``
        values become ops on their params."""
        if isinstance(x, Value):
            return x
        if isinstance(x, Dims):  # sizes used as data: computed once the sizes are known
            key = id(x)
            if key not in self._constants:
                made = self.graph.sized_constant("dims", x.shape, x.dtype, name=name, values=x.values())
                self._constants[key] = (x, made)  # (holds x: its id stays its own)
            return self._constants[key][1]
        if isinstance(x, Lazy):
            if x._value is None:
                if x.recipe[0] == "param":
                    x._value = self.graph.param(x.recipe[1], x._array)
                else:
                    kind, operands, attrs, op_name = x.recipe
                    x._value = self._build(kind, [self.value(o) for o in operands], attrs, op_name)
            return x._value
        key = id(x)
        if key not in self._constants:
            self._constants[key] = (x, self.graph.constant(x, name=name))
        return self._constants[key][1]

    def op(self, kind: str, *operands: Operand, name: str = "", **attrs: Any) -> Operand:
        """Apply IR op ``kind`` (a builder method's name) to ``operands``; see the module doc."""
        # A run-time operand, or a size only a run knows (a slice to ``seq``): the op goes in the graph.
        if any(isinstance(o, Value) for o in operands) or any(holds_sym(v) for v in attrs.values()):
            return self._build(kind, [self.value(o) for o in operands], attrs, name)
        if any(isinstance(o, Dims) for o in operands):  # (a weight read here is data, as a static load reads it)
            known = [o.array if isinstance(o, Lazy) else o for o in operands]
            op = OpKind(kind)
            norm, shape, dtype = infer(op, [_Spec(self.shape(o), self.dtype(o)) for o in known], attrs)
            return fold_dims(op, known, norm, tuple(shape), dtype)
        if any(isinstance(o, Lazy) for o in operands):
            _, shape, dtype = infer(OpKind(kind), [_Spec(self.shape(o), self.dtype(o)) for o in operands], attrs)
            return Lazy(self, shape, dtype, (kind, operands, attrs, name))
        return self.fold(kind, list(operands), attrs)

    def _build(self, kind: str, values: Sequence[Value], attrs: dict[str, Any], name: str) -> Value:
        return _call_builder(self.graph, kind, values, attrs, name)

    def fold(self, kind: str, arrays: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        """Compute IR op ``kind`` on ``arrays`` now, with the reference interpreter."""
        op = OpKind(kind)
        norm, shape, dtype = infer(op, [_Spec(a.shape, a.dtype.name) for a in arrays], attrs)
        self.check_size(shape, dtype, f"the folded result of {kind}")
        return frozen(reference.evaluate_node(Node(0, op, (), MappingProxyType(norm), tuple(shape), dtype), arrays))

    def flip(self, x: Operand, name: str = "") -> Operand:
        """An order-reversing map of ``x`` that is its own inverse and never overflows:
        ``-x`` for floats, the bitwise complement for integers (``-1 - x`` signed, where
        ``-x`` overflows at the minimum; ``MAX - x`` unsigned, where ``-x`` wraps). So a
        minimum is ``flip(max(flip(x)))`` in every dtype (ReduceMin, ArgMin, TopK)."""
        dtype = self.dtype(x)
        if dtype.startswith("float"):
            return self.op("neg", x, name=name)
        top = np.iinfo(dtype).max if np.dtype(dtype).kind == "u" else -1
        return self.op("sub", self.const(top, dtype), x, name=name)
