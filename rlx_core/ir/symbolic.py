"""Symbolic dims: ``Sym``, a small exact expression type for shapes that vary at run time.

A dim is an ``int`` or a ``Sym``. A ``Sym`` is an integer polynomial over *atoms* (a sum of
``coefficient * monomial``), an atom being a symbol name (``batch``) or an opaque node for
floor division or min/max of dims. Every expression is kept in one canonical form, so
that equal expressions compare (and hash) equal: ``a*b == b*a``, ``a + a == 2*a``,
``(a + 1) - 1 == a``, ``(2*a)//2 == a``, ``min(a, a) == a``; a result without symbols
collapses to a plain ``int`` (a ``Sym`` never equals an ``int``). Ceil division is
``-((-a)//b)`` and ``%`` is ``a - b*(a//b)``, so neither needs its own node.

Symbols are assumed to be >= 1 (a size of 0 is a static corner case), which is what
lets ``min``/``max`` and ``dim_eq`` decide some comparisons (``max(n, 1) == n``,
``n + 1 != n``); nothing else is assumed, and what cannot be decided is left open
(``dim_eq`` answers ``None``) for the caller to record as a run-time constraint.

Why not sympy (ORT's symbolic shape inference uses it): it would be imported by every
``import rlx_core`` (a few hundred milliseconds, and a dependency for every user), while
shape inference needs only these few forms, exact integer semantics (sympy's ``floor``
of a quotient does not simplify the way sizes need) and cheap hashing for caches.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any, Union

__all__ = ["Sym", "Dim", "UnboundSymbolError", "is_static", "dim_eq", "evaluate", "free_symbols",
           "floordiv", "ceildiv", "sym_min", "sym_max", "exact_div", "lower_bound", "dim_lt", "known_less", "to_obj",
           "from_obj",
           "format_shape"]

Dim = Union[int, "Sym"]


class UnboundSymbolError(LookupError):
    """``evaluate`` met a symbol its bindings do not give (``.name``)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _Op:
    """An opaque atom: ``floordiv(num, den)``, ``min(*args)`` or ``max(*args)`` of dims."""

    __slots__ = ("_key", "args", "kind")

    def __init__(self, kind: str, args: tuple[Dim, ...]) -> None:
        self.kind = kind
        self.args = args
        self._key = (1, kind, str(self))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Op) and self.kind == other.kind and self.args == other.args

    def __hash__(self) -> int:
        return hash((self.kind, self.args))

    def __str__(self) -> str:
        if self.kind == "floordiv":
            num, den = self.args
            return f"{_wrap(num)}//{_wrap(den)}"
        return f"{self.kind}({', '.join(str(a) for a in self.args)})"

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        vals = [evaluate(a, bindings) for a in self.args]
        if self.kind == "floordiv":
            return vals[0] // vals[1]
        return min(vals) if self.kind == "min" else max(vals)


Atom = Union[str, _Op]
Mono = tuple[tuple[Atom, int], ...]  # (atom, power) pairs sorted by atom key; () is the constant


def _atom_key(atom: Atom) -> tuple:
    return (0, atom) if isinstance(atom, str) else atom._key


def _term_key(term: tuple[Mono, int]) -> tuple:
    mono = term[0]
    return (-sum(p for _, p in mono), tuple((_atom_key(a), -p) for a, p in mono))


def _wrap(d: Dim | _Op) -> str:
    """``d`` as an operand of ``//`` or ``*``: parenthesized unless it is a symbol, a min/max or an int."""
    s = str(d)
    if isinstance(d, _Op):
        return s if d.kind != "floordiv" else f"({s})"
    if isinstance(d, int):
        return s if d >= 0 else f"({s})"
    atom = d._atom()
    return s if isinstance(atom, str) or (isinstance(atom, _Op) and atom.kind != "floordiv") else f"({s})"


class Sym:
    """An immutable, hashable symbolic dim. ``Sym("batch")`` is the symbol ``batch``;
    arithmetic (``+ - * // %`` with ints and other ``Sym``) builds expressions."""

    __slots__ = ("_free", "_hash", "_terms")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a symbol name must be an identifier, got {name!r}")
        self._terms: tuple[tuple[Mono, int], ...] = ((((name, 1),), 1),)
        self._hash = hash(self._terms)
        self._free: frozenset[str] | None = None

    @classmethod
    def _new(cls, terms: tuple[tuple[Mono, int], ...]) -> Sym:
        obj = object.__new__(cls)
        obj._terms = terms
        obj._hash = hash(terms)
        obj._free = None
        return obj

    # ----------------------------------------------------------------- reading
    @property
    def name(self) -> str | None:
        """The symbol's name when this is a plain symbol, else ``None``."""
        atom = self._atom()
        return atom if isinstance(atom, str) else None

    def _atom(self) -> Atom | None:
        """The atom when this is exactly one atom (coefficient 1, power 1)."""
        if len(self._terms) == 1:
            mono, coeff = self._terms[0]
            if coeff == 1 and len(mono) == 1 and mono[0][1] == 1:
                return mono[0][0]
        return None

    @property
    def free_symbols(self) -> frozenset[str]:
        if self._free is None:  # (immutable: computed once; shape inference asks of every node)
            out: set[str] = set()
            for mono, _ in self._terms:
                for atom, _ in mono:
                    if isinstance(atom, str):
                        out.add(atom)
                    else:
                        for a in atom.args:
                            out |= free_symbols(a)
            self._free = frozenset(out)
        return self._free

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        total = 0
        for mono, coeff in self._terms:
            value = coeff
            for atom, power in mono:
                if isinstance(atom, str):
                    if atom not in bindings:
                        raise UnboundSymbolError(atom)
                    base = int(bindings[atom])
                else:
                    base = atom.evaluate(bindings)
                value *= base**power
            total += value
        return total

    # ----------------------------------------------------------------- identity
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sym) and self._terms == other._terms

    def __hash__(self) -> int:
        return self._hash

    def __bool__(self) -> bool:
        raise TypeError(f"the symbolic dim {self} has no truth value (compare with dim_eq)")

    def __str__(self) -> str:
        parts = []
        for mono, coeff in self._terms:
            if not mono:
                parts.append((coeff < 0, str(abs(coeff))))
                continue
            factors = [(_wrap(a) if not isinstance(a, str) and (len(mono) > 1 or abs(coeff) != 1) else str(a))
                       + (f"**{p}" if p != 1 else "") for a, p in mono]
            if abs(coeff) != 1:
                factors.insert(0, str(abs(coeff)))
            parts.append((coeff < 0, "*".join(factors)))
        neg, first = parts[0]
        out = ("-" if neg else "") + first
        for neg, text in parts[1:]:
            out += f" {'-' if neg else '+'} {text}"
        return out

    __repr__ = __str__  # shapes print as ``(batch, 64)`` in messages and reprs

    # ----------------------------------------------------------------- arithmetic
    def __add__(self, other: Any) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else _from_dict(_add_dicts(_dict(self), _dict(o)))

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return _from_dict({m: -c for m, c in self._terms})

    def __sub__(self, other: Any) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else self + (-o)

    def __rsub__(self, other: Any) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else o + (-self)

    def __mul__(self, other: Any) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else _mul(self, o)

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else floordiv(self, o)

    def __rfloordiv__(self, other: Any) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else floordiv(o, self)

    def __mod__(self, other: Any) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else self - o * floordiv(self, o)

    def __rmod__(self, other: Any) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else o - self * floordiv(o, self)


def _coerce(x: Any) -> Dim | None:
    if isinstance(x, Sym):
        return x
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        return None
    return operator.index(x)


def _dict(d: Dim) -> dict[Mono, int]:
    if isinstance(d, Sym):
        return dict(d._terms)
    return {(): int(d)} if d else {}


def _add_dicts(a: dict[Mono, int], b: dict[Mono, int]) -> dict[Mono, int]:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + c
    return out


def _from_dict(d: dict[Mono, int]) -> Dim:
    terms = [(m, c) for m, c in d.items() if c]
    if not terms:
        return 0
    if len(terms) == 1 and terms[0][0] == ():
        return terms[0][1]
    return Sym._new(tuple(sorted(terms, key=_term_key)))


def _from_atom(atom: Atom) -> Sym:
    return Sym._new(((((atom, 1),), 1),))


def _mono_mul(a: Mono, b: Mono) -> Mono:
    powers: dict[Atom, int] = dict(a)
    for atom, p in b:
        powers[atom] = powers.get(atom, 0) + p
    return tuple(sorted(powers.items(), key=lambda ap: _atom_key(ap[0])))


def _mul(a: Dim, b: Dim) -> Dim:
    out: dict[Mono, int] = {}
    for ma, ca in _dict(a).items():
        for mb, cb in _dict(b).items():
            m = _mono_mul(ma, mb)
            out[m] = out.get(m, 0) + ca * cb
    return _from_dict(out)


# --------------------------------------------------------------------- division, min, max
def exact_div(a: Dim, b: Dim) -> Dim | None:
    """``a / b`` when it is a polynomial for every value of the symbols (``b`` an int or a
    single term, e.g. ``batch*seq*768 / (seq*12)``); ``None`` when it is not, or not known."""
    if isinstance(b, int) and not isinstance(a, Sym):
        return a // b if b and a % b == 0 else None
    if a == b:
        return 1
    bd = _dict(b)
    if len(bd) != 1:  # a quotient of one term: ``(32*n*k - 32*n) / (16*n*k - 16*n) == 2``
        ad = _dict(a)
        if not ad:
            return 0
        first = _from_dict(dict([next(iter(ad.items()))]))
        for m, c in bd.items():
            q = exact_div(first, _from_dict({m: c}))
            if q is not None and q * b == a:
                return q
        return None
    (bm, bc), = bd.items()
    if bc == 0:
        return None
    bpow = dict(bm)
    out: dict[Mono, int] = {}
    for m, c in _dict(a).items():
        powers = dict(m)
        if c % bc or any(powers.get(atom, 0) < p for atom, p in bpow.items()):
            return None
        for atom, p in bpow.items():
            powers[atom] -= p
        mono = tuple(sorted(((at, p) for at, p in powers.items() if p), key=lambda ap: _atom_key(ap[0])))
        out[mono] = c // bc
    return _from_dict(out)


def floordiv(a: Dim, b: Dim) -> Dim:
    """``a // b`` (Python's floor division), simplified where exact: ``(2*a + 3)//2 == a + 1``."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    q = exact_div(a, b)
    if q is not None:
        return q
    if isinstance(b, int):
        if b == 0:
            raise ZeroDivisionError(f"{a} // 0")
        if b < 0:
            a, b = -a, -b
        quotient: dict[Mono, int] = {}
        rest: dict[Mono, int] = {}
        for m, c in _dict(a).items():  # a = b*Q + R with R's coefficients in [0, b): a//b = Q + R//b
            quotient[m], rest[m] = divmod(c, b)
        r = _from_dict(rest)
        tail = r // b if isinstance(r, int) else _floor_atom(r, b)
        return _from_dict(quotient) + tail
    return _from_atom(_Op("floordiv", (a, b)))


def _floor_atom(r: Sym, b: int) -> Dim:
    """``r // b`` for a positive ``b`` as one atom; ``(x//m)//b`` is ``x//(m*b)``, so that
    the two ways of writing it are one canonical form."""
    atom = r._atom()
    if b > 0 and isinstance(atom, _Op) and atom.kind == "floordiv" and isinstance(atom.args[1], int) \
            and atom.args[1] > 0:
        return floordiv(atom.args[0], atom.args[1] * b)
    return _from_atom(_Op("floordiv", (r, b)))


def ceildiv(a: Dim, b: Dim) -> Dim:
    """``ceil(a / b)`` for a positive ``b``."""
    return -floordiv(-a, b)


def lower_bound(d: Dim) -> int | None:
    """A lower bound on ``d`` for all symbols >= 1 when one is evident (every non-constant
    term a positive multiple of a product of symbols), else ``None``."""
    if isinstance(d, int):
        return d
    total = 0
    for mono, coeff in d._terms:
        term = coeff
        if mono:
            if coeff < 0:
                return None
            for atom, power in mono:  # a symbol is >= 1; an opaque atom as its arguments bound it
                lo = 1 if isinstance(atom, str) else _atom_lower_bound(atom)
                if lo is None or lo < 0:
                    return None
                term *= lo ** power
        total += term
    return total


def _atom_lower_bound(atom: _Op) -> int | None:
    """A lower bound on ``min``/``max``/``floordiv`` of dims, from their arguments'."""
    bounds = [lower_bound(a) for a in atom.args]
    if atom.kind == "min":
        return None if None in bounds else min(b for b in bounds if b is not None)
    if atom.kind == "max":
        known = [b for b in bounds if b is not None]
        return max(known) if known else None
    den = atom.args[1]  # floordiv
    lo = bounds[0]
    return lo // den if isinstance(den, int) and den > 0 and lo is not None else None


def _minmax(kind: str, args: Iterable[Dim]) -> Dim:
    pick = min if kind == "min" else max
    flat: list[Dim] = []
    for a in args:
        atom = a._atom() if isinstance(a, Sym) else None
        flat.extend(atom.args if isinstance(atom, _Op) and atom.kind == kind else (a,))
    ints = [a for a in flat if isinstance(a, int)]
    syms = list(dict.fromkeys(a for a in flat if isinstance(a, Sym)))
    cands: list[Dim] = ([pick(ints)] if ints else []) + syms
    keep: list[Dim] = []
    for i, a in enumerate(cands):  # drop a candidate another one provably beats or ties
        dominated = False
        for j, b in enumerate(cands):
            if i == j:
                continue
            lb = lower_bound(a - b if kind == "min" else b - a)  # >= 0: b is at least as good as a
            if lb is not None and lb >= 0:  # (equal candidates were merged above)
                dominated = True
                break
        if not dominated:
            keep.append(a)
    if len(keep) == 1:
        return keep[0]
    return _from_atom(_Op(kind, tuple(sorted(keep, key=lambda d: (isinstance(d, Sym), str(d))))))


def sym_min(*args: Dim) -> Dim:
    """``min`` of dims, simplified where the order is evident (``min(n, n + 1) == n``)."""
    return _minmax("min", args)


def sym_max(*args: Dim) -> Dim:
    """``max`` of dims, simplified where the order is evident (``max(n, 1) == n``)."""
    return _minmax("max", args)


# --------------------------------------------------------------------- helpers on dims
def is_static(dim: Any) -> bool:
    """Whether ``dim`` is a plain int (not a ``Sym``)."""
    return not isinstance(dim, Sym)


def dim_eq(a: Dim, b: Dim) -> bool | None:
    """``True``/``False`` when ``a == b`` is decided for all symbols >= 1, ``None`` when it
    depends on their values."""
    d = a - b
    if isinstance(d, int):
        return d == 0
    lo, hi = lower_bound(d), lower_bound(-d)
    if (lo is not None and lo > 0) or (hi is not None and hi > 0):
        return False
    return None


def dim_lt(a: Dim, b: Dim) -> bool | None:
    """``True``/``False`` when ``a < b`` is decided for all symbols >= 1, ``None`` when it
    depends on their values (the order counterpart of ``dim_eq``)."""
    lo = lower_bound(b - a)
    if lo is not None and lo > 0:
        return True
    hi = lower_bound(a - b)
    if hi is not None and hi >= 0:
        return False
    return None


def known_less(a: Dim, b: Dim) -> bool:
    """Whether ``a < b`` for every size (``False`` also where it depends on them): what a
    pass asks before a rewrite that pays only when it holds."""
    return dim_lt(a, b) is True


def evaluate(dim: Dim, bindings: Mapping[str, int]) -> int:
    """The int value of ``dim`` under ``bindings`` (``UnboundSymbolError`` for a missing one)."""
    return dim.evaluate(bindings) if isinstance(dim, Sym) else int(dim)


def free_symbols(dim: Any) -> frozenset[str]:
    """The symbol names in ``dim`` (a dim, or a tuple/list of them)."""
    if isinstance(dim, Sym):
        return dim.free_symbols
    if isinstance(dim, (tuple, list)):
        return frozenset().union(*(free_symbols(d) for d in dim))
    return frozenset()


def format_shape(shape: Iterable[Dim]) -> str:
    """``[batch, seq, 64]``; exactly ``str(list(shape))`` for a static shape."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


# --------------------------------------------------------------------- JSON form
def _atom_obj(atom: Atom) -> Any:
    return atom if isinstance(atom, str) else {atom.kind: [to_obj(a) for a in atom.args]}


def to_obj(dim: Dim) -> Any:
    """A JSON-able form: an int stays an int, a plain symbol is its name, any other
    expression ``{"poly": [[coeff, [[atom, power], ...]], ...]}`` with an atom a name or
    ``{"floordiv"|"min"|"max": [dim, ...]}``."""
    if not isinstance(dim, Sym):
        return int(dim)
    if dim.name is not None:
        return dim.name
    return {"poly": [[c, [[_atom_obj(a), p] for a, p in m]] for m, c in dim._terms]}


def _atom_from(obj: Any) -> Sym:
    if isinstance(obj, str):
        return Sym(obj)
    if isinstance(obj, dict) and len(obj) == 1:
        (kind, args), = obj.items()
        if kind in ("floordiv", "min", "max") and isinstance(args, list) and args:
            dims = [from_obj(a) for a in args]
            if kind == "floordiv":
                if len(dims) != 2:
                    raise ValueError(f"floordiv takes 2 operands, got {args!r}")
                return floordiv(dims[0], dims[1])  # type: ignore[return-value]
            return _minmax(kind, dims)  # type: ignore[return-value]
    raise ValueError(f"not a symbolic atom: {obj!r}")


def from_obj(obj: Any) -> Dim:
    """The inverse of ``to_obj`` (``ValueError`` for anything else); the result is canonical."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    if isinstance(obj, str):
        return Sym(obj)
    if isinstance(obj, dict) and set(obj) == {"poly"} and isinstance(obj["poly"], list):
        total: Dim = 0
        for term in obj["poly"]:
            if not (isinstance(term, list) and len(term) == 2 and isinstance(term[0], int)
                    and isinstance(term[1], list)):
                raise ValueError(f"not a polynomial term: {term!r}")
            value: Dim = term[0]
            for pair in term[1]:
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], int) and pair[1] >= 1):
                    raise ValueError(f"not an (atom, power) pair: {pair!r}")
                atom = _atom_from(pair[0])
                for _ in range(pair[1]):
                    value = value * atom
            total = total + value
        return total
    raise ValueError(f"not a symbolic dim: {obj!r}")
