"""Shape values known as dims: how a symbolic load carries ``Shape -> Gather -> Concat``.

An export with dynamic axes computes its reshape targets, position ranges and masks from
``Shape``. A static load folds those computations to arrays (``_shapes``); a symbolic load
(``_dynamic``) folds them to ``Dims``: a small integer tensor whose elements are dims, ints
or ``Sym`` expressions of the input symbols (``[batch, seq, 4, 64]``, ``[batch*seq]``). A
``Reshape`` reading one gets a symbolic target, and a run-time op reading one as data gets
a sized constant (``rlx_core.ir.sized``) that specializing the graph computes.

Every fold here is exact for every size the symbols may take (each symbol >= 1), or it
is refused with ``NotSymbolic``: a comparison ``seq == 1`` that depends on the size, an
integer division whose operands' signs are not known, an op with no dims meaning. The
symbolic load then falls back to converting the model at each size, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ModelError
from ..ir.ops import OpKind, slice_index
from ..ir.shape_rules import has_sym
from ..ir.symbolic import Dim, Sym, dim_eq, dim_lt, floordiv, sym_max, sym_min

__all__ = ["Dims", "NotSymbolic", "fold_dims", "make_dims", "nonnegative"]

_INT = ("int64", "int32")


class NotSymbolic(ModelError):
    """A symbolic load met a computation it cannot carry exactly as dims."""


class Dims:
    """An integer tensor known at import whose elements are dims (``items``: an object
    array of ints and ``Sym``); at least one element is symbolic."""

    __slots__ = ("dtype", "items")

    def __init__(self, items: np.ndarray, dtype: str) -> None:
        self.items, self.dtype = items, dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.items.shape)

    def values(self) -> tuple[Dim, ...]:
        return tuple(self.items.reshape(-1).tolist())

    def __repr__(self) -> str:
        return f"Dims({self.items.tolist()}, {self.dtype})"


def make_dims(items: Any, dtype: str) -> Dims | np.ndarray:
    """``Dims`` of ``items``, or a plain read-only array when no element is symbolic."""
    arr = np.empty(np.shape(items), dtype=object)
    arr[...] = items
    if not has_sym(arr.reshape(-1).tolist()):
        out = np.asarray(arr.tolist(), dtype=np.dtype(dtype)).reshape(arr.shape)
        out.flags.writeable = False
        return out
    return Dims(arr, dtype)


def _objects(x: Dims | np.ndarray) -> np.ndarray:
    if isinstance(x, Dims):
        return x.items
    if x.dtype.kind not in "iub":
        raise NotSymbolic(f"dims mixed with {x.dtype} data")
    return x.astype(object)


def _compare(a: Dim, b: Dim, op: str) -> bool:
    found = dim_eq(a, b) if op == "equal" else dim_lt(a, b) if op == "less" else dim_lt(b, a)
    if found is None:
        raise NotSymbolic(f"{a} {op} {b} depends on the sizes")
    return found


def nonnegative(d: Dim) -> bool:
    """Whether ``d >= 0`` for every size."""
    return dim_lt(d, 0) is False


def _div(a: Dim, b: Dim) -> Dim:
    if not (isinstance(a, Sym) or isinstance(b, Sym)):
        q = abs(int(a)) // abs(int(b))  # ONNX's integer Div truncates toward zero
        return q if (int(a) >= 0) == (int(b) > 0) else -q
    if isinstance(b, int) and b > 0 and nonnegative(a):
        return floordiv(a, b)
    raise NotSymbolic(f"{a} / {b}: the signs are not known")


_ARITH = {
    OpKind.ADD: lambda a, b: a + b,
    OpKind.SUB: lambda a, b: a - b,
    OpKind.MUL: lambda a, b: a * b,
    OpKind.DIV: _div,
    OpKind.MAXIMUM: lambda a, b: sym_max(a, b) if isinstance(a, Sym) or isinstance(b, Sym) else max(a, b),
    OpKind.MINIMUM: lambda a, b: sym_min(a, b) if isinstance(a, Sym) or isinstance(b, Sym) else min(a, b),
}


def fold_dims(op: OpKind, operands: Sequence[Dims | np.ndarray], attrs: Mapping[str, Any], shape: tuple[int, ...],
              dtype: str) -> Dims | np.ndarray:
    """IR op ``op`` on ``operands`` (``Dims`` or integer/bool arrays), ``attrs`` normalized
    by ``ops.infer`` and the result's ``shape`` and ``dtype`` from it; ``NotSymbolic`` when
    no exact answer exists for every size."""
    xs = [_objects(o) for o in operands]
    if op in _ARITH:
        if dtype not in _INT:
            raise NotSymbolic(f"{op} of dims as {dtype}")
        out = np.frompyfunc(_ARITH[op], 2, 1)(*np.broadcast_arrays(*xs))
    elif op in (OpKind.EQUAL, OpKind.LESS, OpKind.GREATER):
        a, b = np.broadcast_arrays(*xs)
        flat = [_compare(p, q, op.value) for p, q in zip(a.reshape(-1).tolist(), b.reshape(-1).tolist())]
        return _frozen(np.array(flat, dtype=bool).reshape(shape))
    elif op is OpKind.NEG:
        out = -xs[0]
    elif op is OpKind.WHERE:
        cond = operands[0]
        if isinstance(cond, Dims):
            raise NotSymbolic("a where whose condition is dims")
        out = np.where(cond.astype(bool), *np.broadcast_arrays(xs[1], xs[2]))
    elif op is OpKind.CAST:
        if dtype not in _INT:
            raise NotSymbolic(f"dims cast to {dtype}")
        out = xs[0]
    elif op is OpKind.RESHAPE:
        out = xs[0].reshape(shape)
    elif op is OpKind.TRANSPOSE:
        out = xs[0].transpose(attrs["perm"])
    elif op is OpKind.CONCAT:
        out = np.concatenate(xs, axis=attrs["axis"])
    elif op is OpKind.SLICE:
        out = xs[0][slice_index(xs[0].ndim, attrs)]
    elif op is OpKind.GATHER:
        if isinstance(operands[1], Dims):
            raise NotSymbolic("a gather at indices that are dims")
        out = np.take(xs[0], np.asarray(operands[1], dtype=np.int64), axis=attrs["axis"])
    else:
        raise NotSymbolic(f"{op} of dims")
    return make_dims(np.asarray(out, dtype=object).reshape(shape), dtype)


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr
