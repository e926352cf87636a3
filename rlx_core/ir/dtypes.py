"""The dtypes of the IR and the few facts about them that passes need.

Dtypes are plain strings (``"float32"``) so that graphs serialize to JSON and third
parties need no rlx type to talk about them; this module validates and classifies them.

Two sets matter. ``CONTRACT_DTYPES`` are the six every backend reads (float32, float16,
float64, int32, int64, bool): a backend that declares nothing gets exactly those, so a
plugin written before the others existed never sees anything else. ``EXTENDED_DTYPES``
are the fixed-width integers ONNX models also carry (int8, uint8, int16, uint16, uint32,
uint64): a graph may hold them, but only a backend that lists them in
``Backend.dtypes`` is asked to run them (the core refuses the rest, see
``passes/legalize.py``). ``STORAGE_DTYPES`` are the formats models store weights and
activations in (bfloat16, the float8s, float4, int4, uint4, int2, uint2): rlx casts to and from them
and moves them (reshape, transpose, slice, concat, gather, where) but computes nothing in
them (an op that would is refused by name: cast to float32 first); numpy reads them
through ``ml_dtypes``, imported when a graph first names one, and a backend runs them
only when it declares them, like the extended integers. ``DTYPES`` is every dtype a
graph may hold.
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
    "STORAGE_DTYPES",
    "STORAGE_OPS",
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "SIGNED_INT_DTYPES",
    "UNSIGNED_INT_DTYPES",
    "normalize_dtype",
    "is_float",
    "is_int",
    "is_unsigned",
    "is_storage",
    "itemsize",
]

FLOAT_DTYPES: frozenset[str] = frozenset({"float16", "float32", "float64"})
#: The six dtypes of the plugin contract, in the order messages list them: what every
#: backend reads, and what ``Backend.dtypes`` defaults to.
CONTRACT_DTYPE_ORDER: tuple[str, ...] = ("float32", "float16", "float64", "int32", "int64", "bool")
CONTRACT_DTYPES: frozenset[str] = frozenset(CONTRACT_DTYPE_ORDER)
#: Opt-in integer dtypes: a graph may hold them, a backend runs them only when it declares them.
EXTENDED_DTYPES: tuple[str, ...] = ("int8", "uint8", "int16", "uint16", "uint32", "uint64")
#: Storage formats (see the module docstring), by their ``ml_dtypes`` names.
STORAGE_DTYPES: tuple[str, ...] = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                                   "float4_e2m1fn", "int4", "uint4", "int2", "uint2")
#: The ops that take a storage dtype: casts and the ops that only move values.
STORAGE_OPS: frozenset[str] = frozenset({"cast", "reshape", "transpose", "slice", "concat", "gather", "where"})
#: Every dtype a graph may hold: the contract's six, the extended integers, the storage formats.
DTYPES: tuple[str, ...] = (*CONTRACT_DTYPE_ORDER, *EXTENDED_DTYPES, *STORAGE_DTYPES)
_STORAGE: frozenset[str] = frozenset(STORAGE_DTYPES)

SIGNED_INT_DTYPES: frozenset[str] = frozenset({"int8", "int16", "int32", "int64"})
UNSIGNED_INT_DTYPES: frozenset[str] = frozenset({"uint8", "uint16", "uint32", "uint64"})
#: Every integer dtype (ops' type rules accept them wherever they accept int32).
INT_DTYPES: frozenset[str] = SIGNED_INT_DTYPES | UNSIGNED_INT_DTYPES

_ITEMSIZE = {name: np.dtype(name).itemsize for name in DTYPES if name not in _STORAGE}
_ITEMSIZE.update({name: 2 if name == "bfloat16" else 1 for name in STORAGE_DTYPES})  # 4- and 2-bit: a byte each


def _ml_dtypes(name: str) -> None:
    """Make numpy know the storage dtypes (``ml_dtypes`` registers them), once."""
    if "bfloat16" in _NAMES.values():
        return
    try:
        import ml_dtypes  # noqa: F401  (registers the names with numpy)

        known = {np.dtype(n): n for n in STORAGE_DTYPES}
    except (ImportError, TypeError):  # absent, or older than 0.5 (no int2, float4)
        raise GraphError(f"dtype {name!r} needs the ml_dtypes package, 0.5 or later (pip install 'ml_dtypes>=0.5'), "
                         "through which numpy reads it") from None
    _NAMES.update(known)


def normalize_dtype(dtype: Any, *, what: str = "dtype") -> str:
    """Return the canonical name of ``dtype`` (a string, numpy dtype or scalar type).

    Raises ``GraphError`` naming the value and the supported dtypes otherwise, because
    an unsupported dtype found late (inside a backend) is much harder to trace.
    """
    if isinstance(dtype, str) and dtype in _ITEMSIZE:
        if dtype in _STORAGE:
            _ml_dtypes(dtype)
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
    if name in _STORAGE:
        _ml_dtypes(name)
    return name


#: The supported numpy dtypes by their names: ``np.dtype.name`` is a Python-level property
#: of numpy's (about 10 µs), and a compile asks it of every param and constant: 3,200 times
#: for each new size of a small encoder loaded without dims, ~10% of that compile.
_NAMES: dict[np.dtype, str] = {np.dtype(name): name for name in DTYPES if name not in _STORAGE}


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    """Any integer dtype, signed or unsigned, of any width."""
    return dtype in INT_DTYPES


def is_storage(dtype: str) -> bool:
    """A storage format: cast and moved, never computed in (``STORAGE_DTYPES``)."""
    return dtype in _STORAGE


def is_unsigned(dtype: str) -> bool:
    return dtype in UNSIGNED_INT_DTYPES


def itemsize(dtype: str) -> int:
    return _ITEMSIZE[dtype]
