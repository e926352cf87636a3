"""The arrays a compiled graph's steps read for its params: borrowed, then owned.

A compile used to copy every param into an array of its own, so that ``set_param`` could
refill it in place (the steps hold its address). Every compile paid for that copy, most
of it in page faults of fresh memory: on the 2-core VM these sessions run on, 0.3-2 ms per
MB depending on the host's memory (transparent huge pages compacted on fault), so the 114
MB of a BERT export's weights cost 254 ms of a 750 ms compile, and a CNN whose weights are
then laid out for oneDNN paid for its weights twice. Most graphs never see ``set_param``.

So a compile **borrows** the graph's own value where it is what the kernels read (the
param's dtype, C order, 16-byte aligned like numpy's own allocations): a graph's values
are immutable (``Graph`` copies what a caller could still write, and an ONNX tensor's
array reads an immutable ``bytes``), so nothing can change it under the steps. The first
``set_param`` of an executable whose params are borrowed makes them **owned**: writable
copies of every borrowed param at once (one re-binding, not one per param), after which
the executable is built again over them and every later ``set_param`` refills in place as
before. Within a ``ShapeFamily`` (the compiles of one symbolic graph's shape classes) the
owned copies are shared like everything else there, so that a class compiled after a
``set_param`` starts on them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from rlx_core.ir import Node
from rlx_core.plugin import ShapeFamily, shape_family

from .steps import owner

__all__ = ["SHARED_ROOTS", "borrowed", "owned_rebuild", "own_params", "param_array"]

#: In a ``ShapeFamily``: the ids of the arrays its copies share (weights, and what
#: ``residents.Residents._derived`` made from them), each kept alive by its entry there.
SHARED_ROOTS = "rlx_cpu.shared_roots"
_COPY = "rlx_cpu.param"  # (key prefix) a param's copy, where its value could not be borrowed
_OWNED = "rlx_cpu.param.owned"  # (key prefix) a param's owned copy, made by a set_param
_ALIGN = 16  # bytes: numpy's own allocations' alignment, which the kernels have always been given


def borrowed(array: np.ndarray) -> bool:
    """Whether ``array`` is a param's borrowed value (read-only: ``set_param`` must own it first)."""
    return not array.flags.writeable


def _borrowable(value: Any, dtype: str) -> bool:
    return (isinstance(value, np.ndarray) and not value.flags.writeable and value.dtype == np.dtype(dtype)
            and value.flags.c_contiguous and value.ctypes.data % _ALIGN == 0)


def param_array(node: Node, value: np.ndarray, owned: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """The array the steps read for param ``node`` whose graph value is ``value``: its
    owned copy (``owned``, or the family's), else ``value`` itself where it can be
    borrowed, else a copy (shared by the family's compiles)."""
    if owned is not None and node.name in owned:
        return owned[node.name]
    family = shape_family()
    if family is not None:
        with family.lock:
            found = family.shared.get((_OWNED, node.name, id(value)))
        if found is not None and found[0] is value:
            return found[1]
    if _borrowable(value, node.dtype):
        if family is not None:
            with family.lock:
                family.shared.setdefault(SHARED_ROOTS, set()).add(id(owner(value)))
        return value
    if family is None:
        return np.array(value, dtype=node.dtype, order="C", copy=True)
    key = (_COPY, node.name, id(value))
    with family.lock:
        found = family.shared.get(key)
        if found is not None and found[0] is value:
            return found[1]
        arr = np.array(value, dtype=node.dtype, order="C", copy=True)
        family.shared[key] = (value, arr)  # the value kept alive: its id names it
        family.shared.setdefault(SHARED_ROOTS, set()).add(id(arr))
    return arr


def own_params(params: Mapping[str, np.ndarray], family: ShapeFamily | None) -> dict[str, np.ndarray]:
    """``params`` with every borrowed array replaced by a writable copy (the family's,
    when one of its compiles made it already). Arrays a family shares that were derived
    from the borrowed ones (weights laid out for a kernel) are dropped from it: the
    executables built again derive theirs from the owned copies."""
    out: dict[str, np.ndarray] = {}
    made: set[str] = set()  # params whose owned copy this call made (the first of the family to own them)
    for name, arr in params.items():
        if not borrowed(arr):
            out[name] = arr
        elif family is None:
            out[name] = np.array(arr, order="C", copy=True)
        else:
            key = (_OWNED, name, id(arr))
            with family.lock:
                found = family.shared.get(key)
                if found is None or found[0] is not arr:
                    found = family.shared[key] = (arr, np.array(arr, order="C", copy=True))
                    family.shared.setdefault(SHARED_ROOTS, set()).add(id(found[1]))
                    made.add(name)
            out[name] = found[1]
    if made:
        assert family is not None
        with family.lock:  # derived from the borrowed arrays: never looked up again, let them go
            for k in [k for k, v in family.shared.items()
                      if isinstance(k, tuple) and k[0] == "rlx_cpu.derived" and v[3] & made]:
                del family.shared[k]
    return out


@contextlib.contextmanager
def owned_rebuild(params: Mapping[str, np.ndarray], family: ShapeFamily | None) -> Iterator[dict[str, np.ndarray]]:
    """``own_params(params, family)``, inside the family's compile (``shape_family()``
    answers it there): the block in which an executable builds itself again over them."""
    owned = own_params(params, family)
    with family.compiling() if family is not None else contextlib.nullcontext():
        yield owned
