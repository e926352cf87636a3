"""Conformance cases for the exact elementwise ops: rounding (``floor ceil round``),
``fmod``, and the integer bit ops (``bitwise_*``, ``bit_shift_*``).

Their results are exact functions of the operands, so a backend must match the
reference bit for bit; the values are drawn where implementations go wrong rather than
where they are well conditioned: halves and signed zeros for rounding, infinities, NaN
and zero divisors for float ``fmod`` (the C rules), the whole integer range and shifts
outside ``[0, bits)`` (ONNX BitShift-28's rule) for the bit ops.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import strategies as st

from ..ir.ops import BITWISE_OPS, OpKind
from ._case_base import Dtypes, OpCase, Operand, _binary_operands, _nonzero, _rng, _shape, _values

__all__ = ["EXACT_FACTORIES"]

_SPECIALS = (np.nan, np.inf, -np.inf, 0.0, -0.0)


def _with_specials(rng: np.random.Generator, x: np.ndarray, specials: tuple[float, ...], share: float) -> np.ndarray:
    """``x`` with about ``share`` of its elements replaced by ``specials`` (floats only)."""
    if x.dtype.kind != "f" or not x.size:
        return x
    hit = rng.random(x.shape) < share
    return np.where(hit, rng.choice(np.asarray(specials, x.dtype), size=x.shape), x).astype(x.dtype)


def _rounding(op: OpKind, seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    """Quarter steps (halves are the ties round must break to even), and specials."""

    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        shape = _shape(draw)
        rng = _rng(draw, seed)
        quarters = (rng.integers(-24, 25, size=shape) / 4.0).astype(dtype)
        x = np.where(rng.random(shape) < 0.5, quarters, _values(rng, shape, dtype, -40.0, 40.0)).astype(dtype)
        return OpCase(op, (Operand("x", _with_specials(rng, x, _SPECIALS, 0.1)),))

    return case()


def _full_range(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Integers over the dtype's whole range (sign bits set and clear), some small."""
    info = np.iinfo(dtype)
    wide = rng.integers(info.min, info.max, size=shape, dtype=np.dtype(dtype), endpoint=True)
    small = rng.integers(max(info.min, -9), 10, size=shape).astype(dtype)
    return np.where(rng.random(shape) < 0.3, small, wide).astype(dtype)


def _shifts(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Shift amounts: mostly in ``[0, bits)``, some negative (signed dtypes) or too large."""
    info = np.iinfo(dtype)
    inside = rng.integers(0, info.bits, size=shape)
    outside = rng.integers(max(info.min, -2 * info.bits), 3 * info.bits, size=shape)
    return np.where(rng.random(shape) < 0.7, inside, outside).astype(dtype)


def _pair(op: OpKind, seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    """``fmod`` and the binary bit ops, with numpy broadcasting like every binary op."""

    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype, a_shape, b_shape, rng = _binary_operands(draw, seed, dtypes)
        if op is OpKind.FMOD:
            a = _values(rng, a_shape, dtype, -20.0, 20.0, ilo=-60, ihi=60)
            b = _nonzero(rng, b_shape, dtype)
            a = _with_specials(rng, a, (np.nan, np.inf, -np.inf, -0.0), 0.1)
            b = _with_specials(rng, b, (np.nan, np.inf, -np.inf, 0.0), 0.1)  # float fmod by 0 is NaN
        elif op in (OpKind.BIT_SHIFT_LEFT, OpKind.BIT_SHIFT_RIGHT):
            a, b = _full_range(rng, a_shape, dtype), _shifts(rng, b_shape, dtype)
        else:
            a, b = _full_range(rng, a_shape, dtype), _full_range(rng, b_shape, dtype)
        return OpCase(op, (Operand("a", a), Operand("b", b, param=draw(st.booleans()))))

    return case()


def _bitwise_not(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        return OpCase(OpKind.BITWISE_NOT, (Operand("x", _full_range(_rng(draw, seed), _shape(draw), dtype)),))

    return case()


#: The generators of this module, by op (merged into ``_cases._FACTORIES``).
EXACT_FACTORIES: dict[OpKind, Callable[[int, Dtypes], st.SearchStrategy[OpCase]]] = {
    **{op: (lambda seed, dtypes, op=op: _rounding(op, seed, dtypes))
       for op in (OpKind.FLOOR, OpKind.CEIL, OpKind.ROUND)},
    **{op: (lambda seed, dtypes, op=op: _pair(op, seed, dtypes))
       for op in (OpKind.FMOD, *BITWISE_OPS) if op is not OpKind.BITWISE_NOT},
    OpKind.BITWISE_NOT: _bitwise_not,
}
