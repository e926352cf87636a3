"""Shape arithmetic on symbolic dims, and the run-time constraints it records.

``ops.py`` keeps the type rules; when a shape holds a ``Sym`` they call the helpers here:
broadcasting, equal-dim checks, reshape's ``-1``, slice lengths and window arithmetic.
What cannot be decided when the graph is built (``batch`` against ``4``, ``n`` against
``m``) is never assumed silently: it becomes a ``Constraint`` that the graph records
with the op and node that needed it, and that ``Graph.bind`` checks against the real
sizes. Static shapes never reach this module's symbolic paths.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import GraphError
from .symbolic import Dim, Sym, ceildiv, dim_eq, dim_lt, exact_div, floordiv, from_obj, lower_bound, sym_max, sym_min

__all__ = ["Constraint", "recording", "require", "same_dim", "has_sym", "has_sym_target", "parse_dim", "broadcast_dims",
           "reshape_dims", "slice_length", "window_out", "evaluate_attr", "HUGE"]

#: Slice bounds at or beyond this magnitude mean "to the end" (ONNX writes INT64_MAX): no
#: dim of a real array reaches it, so ``min(n, 2**63 - 1)`` is simply ``n``.
HUGE = 2**62


@dataclass(frozen=True)
class Constraint:
    """``lhs == rhs`` or ``lhs >= rhs``, required by ``op`` (at ``node``) for ``why``."""

    lhs: Dim
    relation: str
    rhs: Dim
    op: str
    why: str
    node: int | None = None

    def holds(self, bindings: Mapping[str, int]) -> bool:
        from .symbolic import evaluate

        lhs, rhs = evaluate(self.lhs, bindings), evaluate(self.rhs, bindings)
        return lhs == rhs if self.relation == "==" else lhs >= rhs

    def __str__(self) -> str:
        return f"{self.lhs} {self.relation} {self.rhs}"


_RECORDING: contextvars.ContextVar[list[Constraint] | None] = contextvars.ContextVar("rlx_constraints", default=None)


@contextlib.contextmanager
def recording() -> Iterator[list[Constraint]]:
    """Collect the constraints the type rules run inside this block require."""
    found: list[Constraint] = []
    token = _RECORDING.set(found)
    try:
        yield found
    finally:
        _RECORDING.reset(token)


def require(op: Any, lhs: Dim, relation: str, rhs: Dim, why: str) -> None:
    """Record that ``lhs relation rhs`` must hold at run time (the caller found it undecidable)."""
    found = _RECORDING.get()
    if found is None:
        raise GraphError(f"{op}: {why} needs {lhs} {relation} {rhs} checked at run time, and nothing records it here")
    found.append(Constraint(lhs, relation, rhs, str(op), why))


def same_dim(op: Any, a: Dim, b: Dim, why: str) -> bool:
    """Whether ``a`` and ``b`` may be equal: ``a == b`` for ints; for symbolic dims ``False``
    only when they provably differ, else ``True`` with ``a == b`` recorded when undecided."""
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return a == b
    eq = dim_eq(a, b)
    if eq is None:
        require(op, a, "==", b, why)
    return eq is not False


def has_sym(*shapes: Sequence[Any]) -> bool:
    return any(isinstance(d, Sym) for s in shapes for d in s)


def holds_sym(value: Any) -> bool:
    """Whether an attribute holds a symbolic dim: it is one, or a tuple of dims holding one.
    Those are the only places an IR attribute holds a size (a reshape's target, a slice's
    bounds); a fused region's program, nested tuples, never does, and is not walked (the
    symbolic pipeline asks this of every node it copies)."""
    return isinstance(value, Sym) or (isinstance(value, tuple) and any(isinstance(d, Sym) for d in value))


def parse_dim(raw: Any) -> Dim | None:
    """A dim from what a user or a graph file may write: an int, a symbol name, a ``Sym``
    or ``Sym``'s JSON form; ``None`` when ``raw`` is none of them."""
    if isinstance(raw, Sym):
        return raw
    if isinstance(raw, str):
        return Sym(raw) if raw.isidentifier() else None
    if isinstance(raw, dict):
        try:
            return from_obj(raw)
        except (ValueError, TypeError):
            return None
    if isinstance(raw, bool) or not hasattr(raw, "__index__"):
        return None
    return int(raw)


def broadcast_dims(op: Any, shapes: Sequence[tuple[Dim, ...]]) -> tuple[Dim, ...]:
    """numpy broadcasting with symbolic dims. A dim of 1 broadcasts; a symbol against an
    int ``k != 1`` or another symbol gives the int (else the first symbol) and records
    that they are equal: a symbol that is 1 at run time does not broadcast silently."""
    ndim = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(-ndim, 0):
        dims = list(dict.fromkeys(s[i] for s in shapes if len(s) >= -i and not (s[i] == 1)))
        ints = [d for d in dims if not isinstance(d, Sym)]
        if len(ints) > 1 or any(dim_eq(a, b) is False for a in dims for b in dims):
            raise GraphError(f"{op}: shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast")
        chosen = ints[0] if ints else (dims[0] if dims else 1)
        for d in dims:
            if d != chosen and dim_eq(d, chosen) is None:
                shown = " and ".join(str(tuple(s)) for s in shapes)
                require(op, d, "==", chosen, f"broadcasting {shown} (dim {ndim + i} of the result)")
        out.append(chosen)
    return tuple(out)


def has_sym_target(raw: Any) -> bool:
    """Whether reshape's ``shape`` attribute names a symbol (a name, a ``Sym`` or its JSON form)."""
    return isinstance(raw, (list, tuple)) and any(isinstance(d, (str, dict, Sym)) for d in raw)


def reshape_dims(op: Any, x: tuple[Dim, ...], raw: Any) -> tuple[Dim, ...]:
    """``reshape``'s target with its ``-1`` inferred by exact division of the symbolic
    element counts (``[b, s, 12, 64] -> [b, s, -1]``); ``GraphError`` when it is not exact."""
    want = [parse_dim(d) for d in (raw if isinstance(raw, (list, tuple)) else (raw,))]
    if any(d is None for d in want):
        raise GraphError(f"{op}: shape must be a sequence of ints or symbols, got {raw!r}")
    size = math.prod(x)
    bad = GraphError(f"{op}: cannot reshape {x} ({size} elements) to {tuple(want)}")
    minus = [i for i, d in enumerate(want) if not isinstance(d, Sym) and d == -1]
    if len(minus) > 1 or any(not isinstance(d, Sym) and d < -1 for d in want):
        raise GraphError(f"{op}: shape {tuple(want)} may hold at most one -1 and no other negative")
    if minus:
        known = math.prod(d for i, d in enumerate(want) if i != minus[0])
        q = None if not isinstance(known, Sym) and known == 0 else exact_div(size, known)
        if q is None:
            raise bad
        want[minus[0]] = q
    total = math.prod(want)
    eq = dim_eq(total, size)
    if eq is False:
        raise bad
    if eq is None:
        require(op, total, "==", size, f"reshaping {x} to {tuple(want)} (same number of elements)")
    return tuple(want)


def slice_length(dim: Dim, start: Dim, end: Dim, step: int) -> Dim:
    """``len(range(*slice(start, end, step).indices(dim)))`` where ``dim`` or a bound is
    symbolic: negative bounds count from the end, out-of-range ones clamp (min/max
    expressions). A symbolic bound must have a known sign (``seq``, ``seq - 1``, ``-seq``)."""
    neg_start, neg_end = _negative(start), _negative(end)
    if step > 0:
        lo = 0 if _huge(start, -1) else (sym_max(start + dim, 0) if neg_start else sym_min(start, dim))
        hi = dim if _huge(end, 1) else (sym_max(end + dim, 0) if neg_end else sym_min(end, dim))
        return sym_max(ceildiv(hi - lo, step), 0)
    hi = dim - 1 if _huge(start, 1) else (sym_max(start + dim, -1) if neg_start else sym_min(start, dim - 1))
    lo = -1 if _huge(end, -1) else (sym_max(end + dim, -1) if neg_end else sym_min(end, dim - 1))
    return sym_max(ceildiv(hi - lo, -step), 0)


def _huge(bound: Dim, sign: int) -> bool:
    """Whether ``bound`` is an int at or past ``sign * HUGE`` (ONNX's "to the end")."""
    return isinstance(bound, int) and bound * sign >= HUGE


def _negative(bound: Dim) -> bool:
    """Whether a slice bound counts from the end; ``GraphError`` when its sign depends on the sizes."""
    negative = dim_lt(bound, 0)
    if negative is None:
        raise GraphError(f"slice: bound {bound} may be negative (counting from the end) or not, depending on the "
                         "sizes")
    return negative


def window_out(op: Any, size: Dim, k: int, s: int, p0: int, p1: int, d: int, ceil: bool) -> Dim:
    """Output length of a window of ``k`` (stride ``s``, dilation ``d``, pads ``p0``/``p1``)
    over a symbolic ``size``; the window must fit, which is recorded when undecided."""
    span = size + p0 + p1 - d * (k - 1) - 1
    least = d * (k - 1) + 1 - p0 - p1
    lo = lower_bound(span)
    if lo is None or lo < 0:
        neg = lower_bound(-span)
        if neg is not None and neg > 0:
            raise GraphError(f"{op}: window {k} (dilation {d}) is larger than the padded input {size + p0 + p1}")
        require(op, size, ">=", least, f"window {k} (dilation {d}, padding {p0}+{p1}) must fit the input")
    if not ceil:
        return floordiv(span, s) + 1
    # the last window must start inside the input or the left pad
    return sym_min(ceildiv(span, s) + 1, floordiv(size + p0 - 1, s) + 1)


def evaluate_attr(value: Any, bindings: Mapping[str, int]) -> Any:
    """An attribute with every ``Sym`` in it (at any tuple depth) evaluated under ``bindings``."""
    from .symbolic import evaluate

    if isinstance(value, Sym):
        return evaluate(value, bindings)
    if isinstance(value, tuple):
        return tuple(evaluate_attr(v, bindings) for v in value)
    return value
