"""The dtypes of the IR and the few facts about them that passes need.

Dtypes are plain strings (``"float32"``) so that graphs serialize to JSON and third
parties need no rlx type to talk about them; this module validates and classifies them.

Two sets matter. ``CONTRACT_DTYPES`` are the six every backend reads (float32, float16,
float64, int32, int64, bool): a backend that declares nothing gets exactly those, so a
plugin written before the others existed never sees anything else. ``EXTENDED_DTYPES``
are the fixed-width integers ONNX models also carry (int8, uint8, int16, uint16, uint32,
uint64): a graph may hold them, but only a backend that lists them in
``Backend.dtypes`` is asked to run them (the core refuses the rest, see
``passes/legalize.py``). ``DTYPES`` is every dtype a graph may hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GraphError

__all__ = [
    "DTYPES",
    "CONTRACT_DTYPES",
    "CONTRACT_DTYPE_ORDER",
    "EXTENDED_DTYPES",
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "SIGNED_INT_DTYPES",
    "UNSIGNED_INT_DTYPES",
    "normalize_dtype",
    "is_float",
    "is_int",
    "is_unsigned",
    "itemsize",
]

FLOAT_DTYPES: frozenset[str] = frozenset({"float16", "float32", "float64"})
#: The six dtypes of the plugin contract, in the order messages list them: what every
#: backend reads, and what ``Backend.dtypes`` defaults to.
CONTRACT_DTYPE_ORDER: tuple[str, ...] = ("float32", "float16", "float64", "int32", "int64", "bool")
CONTRACT_DTYPES: frozenset[str] = frozenset(CONTRACT_DTYPE_ORDER)
#: Opt-in integer dtypes: a graph may hold them, a backend runs them only when it declares them.
EXTENDED_DTYPES: tuple[str, ...] = ("int8", "uint8", "int16", "uint16", "uint32", "uint64")
#: Every dtype a graph may hold: the contract's six, then the extended integers.
DTYPES: tuple[str, ...] = (*CONTRACT_DTYPE_ORDER, *EXTENDED_DTYPES)

SIGNED_INT_DTYPES: frozenset[str] = frozenset({"int8", "int16", "int32", "int64"})
UNSIGNED_INT_DTYPES: frozenset[str] = frozenset({"uint8", "uint16", "uint32", "uint64"})
#: Every integer dtype (ops' type rules accept them wherever they accept int32).
INT_DTYPES: frozenset[str] = SIGNED_INT_DTYPES | UNSIGNED_INT_DTYPES

_ITEMSIZE = {name: np.dtype(name).itemsize for name in DTYPES}


def normalize_dtype(dtype: Any, *, what: str = "dtype") -> str:
    """Return the canonical name of ``dtype`` (a string, numpy dtype or scalar type).

    Raises ``GraphError`` naming the value and the supported dtypes otherwise, because
    an unsupported dtype found late (inside a backend) is much harder to trace.
    """
    if isinstance(dtype, str) and dtype in _ITEMSIZE:
        return dtype
    known = _NAMES.get(dtype) if isinstance(dtype, np.dtype) else None
    if known is not None:
        return known
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in _ITEMSIZE:
        raise GraphError(f"{what}: unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    return name


#: The supported numpy dtypes by their names: ``np.dtype.name`` is a Python-level property
#: of numpy's (about 10 µs), and a compile asks it of every param and constant: 3,200 times
#: for each new size of a small encoder loaded without dims, ~10% of that compile.
_NAMES: dict[np.dtype, str] = {np.dtype(name): name for name in DTYPES}


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    """Any integer dtype, signed or unsigned, of any width."""
    return dtype in INT_DTYPES


def is_unsigned(dtype: str) -> bool:
    return dtype in UNSIGNED_INT_DTYPES


def itemsize(dtype: str) -> int:
    return _ITEMSIZE[dtype]
