"""The six dtypes of the IR and the few facts about them that passes need.

Dtypes are plain strings (``"float32"``) so that graphs serialize to JSON and third
parties need no rlx type to talk about them; this module validates and classifies them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import GraphError

__all__ = ["DTYPES", "FLOAT_DTYPES", "INT_DTYPES", "normalize_dtype", "is_float", "is_int", "itemsize"]

FLOAT_DTYPES: frozenset[str] = frozenset({"float16", "float32", "float64"})
INT_DTYPES: frozenset[str] = frozenset({"int32", "int64"})
DTYPES: tuple[str, ...] = ("float32", "float16", "float64", "int32", "int64", "bool")

_ITEMSIZE = {"float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}


def normalize_dtype(dtype: Any, *, what: str = "dtype") -> str:
    """Return the canonical name of ``dtype`` (a string, numpy dtype or scalar type).

    Raises ``GraphError`` naming the value and the supported dtypes otherwise, because
    an unsupported dtype found late (inside a backend) is much harder to trace.
    """
    if isinstance(dtype, str) and dtype in _ITEMSIZE:
        return dtype
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in _ITEMSIZE:
        raise GraphError(f"{what}: unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


def itemsize(dtype: str) -> int:
    return _ITEMSIZE[dtype]
