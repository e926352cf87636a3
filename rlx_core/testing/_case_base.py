"""What every case generator shares: dtypes per op, ``Operand``/``OpCase``, and the
drawing helpers (shapes, broadcasting, seeded values). ``_cases.py`` draws the user's
ops, ``_fused_cases.py`` the internal ones; both import this, neither the other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ..ir import Graph, Node
from ..ir.dtypes import EXTENDED_DTYPES, STORAGE_DTYPES, STORAGE_OPS, is_storage
from ..ir.ops import BITWISE_OPS, MORE_TRIG_OPS, SOURCE_OPS, OpKind

FLOATS = ("float32", "float16", "float64")
INTS = ("int32", "int64")  # the contract's integers (and the only index dtypes of gather)
NUMERIC = FLOATS + INTS
ANY_DTYPE = (*NUMERIC, "bool")

_FLOAT_OPS = frozenset({
    OpKind.POW, OpKind.EXP, OpKind.LOG, OpKind.SQRT, OpKind.RSQRT, OpKind.ERF, OpKind.TANH, OpKind.SIGMOID,
    OpKind.SIN, OpKind.COS, *MORE_TRIG_OPS,
    OpKind.GELU, OpKind.SOFTMAX, OpKind.LAYER_NORM, OpKind.REDUCE_MEAN, OpKind.CONV2D, OpKind.MAX_POOL2D,
    OpKind.AVG_POOL2D, OpKind.GLOBAL_AVG_POOL2D, OpKind.ATTENTION, OpKind.FLOOR, OpKind.CEIL, OpKind.ROUND,
    OpKind.FUSED_CONV,
})
_INT_OPS = frozenset(BITWISE_OPS)
_ANY_DTYPE_OPS = frozenset({OpKind.RESHAPE, OpKind.TRANSPOSE, OpKind.CONCAT, OpKind.SLICE, OpKind.GATHER,
                            OpKind.CAST, OpKind.WHERE, OpKind.EQUAL})

#: The dtypes a case factory draws its op's main operand from (``op_dtypes``).
Dtypes = tuple[str, ...]

try:  # numpy reads the storage dtypes through ml_dtypes; without it no backend runs them
    import ml_dtypes

    _STORAGE_TESTED: tuple[str, ...] = STORAGE_DTYPES
except ImportError:
    _STORAGE_TESTED = ()

#: The contract dtypes the kit draws for each op's main operand: exactly those of the six
#: that ops.py accepts (gather's x, where's branches, cast's source and target; indices
#: and conditions aside). What a backend that declares nothing else is tested on.
OP_DTYPES: dict[OpKind, tuple[str, ...]] = {
    op: FLOATS if op in _FLOAT_OPS else INTS if op in _INT_OPS else ANY_DTYPE if op in _ANY_DTYPE_OPS else NUMERIC
    for op in OpKind
    if op not in SOURCE_OPS
}
#: Every dtype ops.py accepts for each op's main operand: the contract's, then the extended
#: integers wherever it takes int32 (the float-only ops take none of them).
ALL_OP_DTYPES: dict[OpKind, tuple[str, ...]] = {
    op: dts if op in _FLOAT_OPS else (*dts, *EXTENDED_DTYPES, *(_STORAGE_TESTED if op.value in STORAGE_OPS else ()))
    for op, dts in OP_DTYPES.items()
}


def op_dtypes(op: OpKind, dtypes: Collection[str] | None = None) -> tuple[str, ...]:
    """The dtypes the kit draws for ``op`` on a backend that reads ``dtypes`` (its
    ``Backend.dtypes``): those of ``ALL_OP_DTYPES`` it reads. ``None`` means the
    contract's six, so a backend that declares nothing is tested exactly as before."""
    if dtypes is None:
        return OP_DTYPES[op]
    return tuple(d for d in ALL_OP_DTYPES[op] if d in dtypes)

#: Ops whose result is one of their input values (or an exact function of them): a backend
#: must reproduce the reference bit for bit, whatever the dtype.
EXACT_OPS = frozenset({
    OpKind.RESHAPE, OpKind.TRANSPOSE, OpKind.CONCAT, OpKind.SLICE, OpKind.GATHER, OpKind.WHERE, OpKind.NEG,
    OpKind.ABS, OpKind.RELU, OpKind.MAXIMUM, OpKind.MINIMUM, OpKind.REDUCE_MAX, OpKind.MAX_POOL2D,
    OpKind.EQUAL, OpKind.LESS, OpKind.GREATER, OpKind.FLOOR, OpKind.CEIL, OpKind.ROUND, OpKind.FMOD, *BITWISE_OPS,
})


@dataclass(frozen=True)
class Operand:
    """One operand of the op under test: a run-time input, or a param when ``param``."""

    name: str
    array: np.ndarray
    param: bool = False

    def describe(self) -> str:
        kind = "param" if self.param else "input"
        return f"{self.name}: {self.array.shape} {self.array.dtype} {kind}"


@dataclass(frozen=True)
class OpCase:
    """One example: ``op`` applied to ``operands`` with builder keyword ``attrs``.

    ``terms`` is how many products or values each output element sums (K of a matmul,
    the reduced count of a reduction); float tolerances grow with its square root.
    """

    op: OpKind
    operands: tuple[Operand, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    terms: int = 1

    def build(self) -> tuple[Graph, Node]:
        """A frozen graph whose only computational node is the op under test."""
        g = Graph(f"check_{self.op.value}")
        values = [
            g.param(o.name, o.array) if o.param else g.input(o.name, o.array.shape, o.array.dtype.name)
            for o in self.operands
        ]
        method = getattr(g, self.op.value, None)
        if method is None:  # an internal op (gemm, fused_elementwise): no builder, added as a graph file adds it
            out = g.add_node(self.op, [v.id for v in values], self.attrs)
        else:
            out = method(values, **self.attrs) if self.op is OpKind.CONCAT else method(*values, **self.attrs)
        g.set_outputs([out])
        return g.freeze(), g.node(out)

    def run_inputs(self) -> dict[str, np.ndarray]:
        return {o.name: np.array(o.array, copy=True) for o in self.operands if not o.param}

    def describe(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items())
        return f"{self.op.value}({'; '.join(o.describe() for o in self.operands)}{'; ' if attrs else ''}{attrs})"

    __repr__ = describe  # hypothesis prints cases in its falsifying-example notes


# ----------------------------------------------------------------------------- values
def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, lo: float = -2.0, hi: float = 2.0,
            ilo: int = -20, ihi: int = 20) -> np.ndarray:
    """Floats in ``[lo, hi]``; ints in ``[ilo, ihi]`` cut to the dtype's range (unsigned
    ones from 0); bools half True."""
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if is_storage(dtype):  # through float32, inside the format's range (float4 holds 6 at most)
        whole = dtype in ("int4", "uint4", "int2", "uint2")
        info = ml_dtypes.iinfo(dtype) if whole else ml_dtypes.finfo(dtype)
        values = np.clip(rng.uniform(lo, hi, size=shape), float(info.min), float(info.max))
        return np.asarray(np.rint(values) if whole else values).astype(dtype)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return np.asarray(rng.integers(max(ilo, info.min), min(ihi, info.max) + 1, size=shape)).astype(dtype)
    return np.asarray(rng.uniform(lo, hi, size=shape)).astype(dtype)


def _nonzero(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Divisors: floats with magnitude in [0.5, 2], ints in [-9, 9] without 0 ([1, 9] unsigned)."""
    sign = np.where(rng.random(shape) < 0.5, -1, 1)
    kind = np.dtype(dtype).kind
    if kind == "u":
        return np.asarray(rng.integers(1, 10, size=shape)).astype(dtype)
    if kind == "i":
        return np.asarray(sign * rng.integers(1, 10, size=shape)).astype(dtype)
    return np.asarray(sign * rng.uniform(0.5, 2.0, size=shape)).astype(dtype)


# ----------------------------------------------------------------------------- shapes
def _shape(draw: Callable, min_rank: int = 0, max_rank: int = 4, max_side: int = 5) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(1, max_side), min_size=min_rank, max_size=max_rank)))


def _broadcastable(draw: Callable, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``shape``: leading dims dropped, some dims set to 1."""
    s = shape[draw(st.integers(0, len(shape))) :]
    ones = draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s)))
    return tuple(1 if one else d for d, one in zip(s, ones))


def _binary_operands(draw: Callable, seed: int, dtypes: Dtypes
                     ) -> tuple[str, tuple[int, ...], tuple[int, ...], np.random.Generator]:
    """A binary op's dtype, its two operand shapes (numpy broadcasting: ``a`` the full shape
    or broadcastable to it, ``b`` broadcastable) and the values' generator."""
    dtype = draw(st.sampled_from(dtypes))
    base = _shape(draw)
    a_shape = _broadcastable(draw, base) if draw(st.booleans()) else base
    b_shape = _broadcastable(draw, base)
    return dtype, a_shape, b_shape, _rng(draw, seed)


def _axis(draw: Callable, ndim: int) -> int:
    """An axis in ``[-ndim, ndim)``: negative spellings are part of the builder's API."""
    return draw(st.integers(-ndim, ndim - 1))


def _rng(draw: Callable, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, draw(st.integers(0, 2**32 - 1))])


# ----------------------------------------------------------------------------- ops
