"""The ``Einsum`` converter: transposes, sums, diagonals and batched matmuls.

An equation (``"bij,bjk->bik"``, ``"i,j->ij"``, ``"...ii->...i"``; implicit outputs and
ellipses included) is evaluated operand by operand: each operand first loses its
repeated letters (a diagonal: one ``gather`` from the flattened pair of axes) and the
letters no one else needs (``reduce_sum``); two operands then meet in one batched
``matmul`` (letters in both and in what remains to be computed are the batch, letters
in both and nowhere else are contracted, the rest are rows or columns); a last
``reduce_sum``/``transpose`` gives the output's order. rlx shapes are static, so every
``reshape`` is known at import. Products of three or more operands are contracted left
to right. bfloat16 operands (a storage format) are computed in float32 and the result
rounded to bfloat16 once, as ONNX's reference does.
"""

from __future__ import annotations

import math
import string

import numpy as np

from ..ir.dtypes import FLOAT_DTYPES, INT_DTYPES
from ._context import NodeContext, converter
from ._shapes import Emitter, Operand, frozen

__all__: list[str] = []



def _parse(c: NodeContext, equation: str, shapes: list[tuple[int, ...]]) -> tuple[list[str], str]:
    """Each operand's letters and the output's, ellipses replaced by fresh capital letters
    (aligned to the right, as numpy broadcasts them)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise c.fail(f"equation {equation!r} has {len(terms)} operands, the node {len(shapes)}")
    spare = [ch for ch in string.ascii_uppercase if ch not in eq]
    ell_rank = 0
    for term, shape in zip(terms, shapes):
        if "..." in term:
            ell_rank = max(ell_rank, len(shape) - len(term.replace("...", "")))
    ell = "".join(spare[:ell_rank])
    out_terms = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            n = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", ell[ell_rank - n :] if n else "")
        if len(term) != len(shape) or not all(ch.isalpha() for ch in term):
            raise c.fail(f"term {term!r} of {equation!r} does not fit an operand of shape {shape}")
        out_terms.append(term)
    if arrow:
        out = rhs.replace("...", ell)
    else:  # implicit: the ellipsis, then every letter used once, in alphabetical order
        counts = {ch: sum(t.count(ch) for t in out_terms) for ch in set("".join(out_terms))}
        out = ell + "".join(sorted(ch for ch, k in counts.items() if k == 1 and ch not in ell))
    if len(set(out)) != len(out) or any(ch not in "".join(out_terms) for ch in out):
        raise c.fail(f"output {rhs!r} of {equation!r} repeats a letter or names one no operand has")
    return out_terms, out


def _diagonal(f: Emitter, x: Operand, term: str) -> tuple[Operand, str]:
    """``x`` with each repeated letter taken once (the diagonal of those axes)."""
    while True:
        repeated = next((ch for ch in term if term.count(ch) > 1), None)
        if repeated is None:
            return x, term
        i, j = term.index(repeated), term.index(repeated, term.index(repeated) + 1)
        shape = f.shape(x)
        order = [a for a in range(len(term)) if a not in (i, j)] + [i, j]
        x = f.op("transpose", x, perm=tuple(order))
        n = shape[i]
        x = f.op("reshape", x, shape=(*(shape[a] for a in order[:-2]), n * n))
        x = f.op("gather", x, frozen(np.arange(n, dtype=np.int64) * (n + 1)), axis=len(order) - 2)
        term = "".join(term[a] for a in order[:-2]) + repeated


def _sum_out(f: Emitter, x: Operand, term: str, keep: set[str]) -> tuple[Operand, str]:
    """``x`` summed over the letters not in ``keep``."""
    axes = tuple(a for a, ch in enumerate(term) if ch not in keep)
    if not axes:
        return x, term
    x = f.op("reduce_sum", x, axes=axes, keepdims=False)
    return x, "".join(ch for ch in term if ch in keep)


def _arrange(f: Emitter, x: Operand, term: str, order: str) -> Operand:
    if term == order:
        return x
    return f.op("transpose", x, perm=tuple(term.index(ch) for ch in order))


def _contract(f: Emitter, a: Operand, ta: str, b: Operand, tb: str, keep: set[str]) -> tuple[Operand, str]:
    """``a`` and ``b`` (no repeated letters) as one batched matmul; letters in ``keep``
    survive (batch, rows, columns), the shared others are contracted."""
    sa, sb = dict(zip(ta, f.shape(a))), dict(zip(tb, f.shape(b)))
    batch = "".join(ch for ch in ta if ch in tb and ch in keep)
    inner = "".join(ch for ch in ta if ch in tb and ch not in keep)
    rows = "".join(ch for ch in ta if ch not in tb)
    cols = "".join(ch for ch in tb if ch not in ta)
    for ch in batch + inner:
        if sa[ch] != sb[ch]:
            raise ValueError(f"letter {ch!r} is {sa[ch]} in one operand and {sb[ch]} in the other")
    nb, nr, nk, nc = (math.prod(s[ch] for ch in part) for s, part in ((sa, batch), (sa, rows), (sa, inner), (sb, cols)))
    a3 = f.op("reshape", _arrange(f, a, ta, batch + rows + inner), shape=(nb, nr, nk))
    b3 = f.op("reshape", _arrange(f, b, tb, batch + inner + cols), shape=(nb, nk, nc))
    out = f.op("matmul", a3, b3)
    term = batch + rows + cols
    return f.op("reshape", out, shape=tuple({**sa, **sb}[ch] for ch in term)), term


@converter("Einsum")
def _einsum(c: NodeContext) -> list[Operand | None]:
    f = c.f
    xs = c.inputs()
    if not xs:
        raise c.fail("needs at least one operand")
    dtypes = {f.dtype(x) for x in xs}
    if len(dtypes) != 1 or next(iter(dtypes)) not in FLOAT_DTYPES | INT_DTYPES | {"bfloat16"}:
        raise c.fail(f"operands must share one numeric dtype, got {sorted(dtypes)}")
    stored = next(iter(dtypes)) == "bfloat16"  # a storage format: computed in float32, rounded once at the end
    if stored:
        xs = [f.op("cast", x, dtype="float32") for x in xs]
    equation = c.attr("equation", "")
    if isinstance(equation, bytes):
        equation = equation.decode()
    terms, out = _parse(c, str(equation), [f.shape(x) for x in xs])
    ops = list(zip(xs, terms))
    try:
        for k, (x, term) in enumerate(ops):  # diagonals, then letters only this operand has
            x, term = _diagonal(f, x, term)
            elsewhere = set(out) | {ch for j, (_, t) in enumerate(ops) if j != k for ch in t}
            ops[k] = _sum_out(f, x, term, elsewhere)
        acc, term = ops[0]
        for k in range(1, len(ops)):
            later = set(out) | {ch for _, t in ops[k + 1 :] for ch in t}
            acc, term = _contract(f, acc, term, ops[k][0], ops[k][1], later)
    except ValueError as exc:
        raise c.fail(f"equation {equation!r}: {exc}") from None
    acc, term = _sum_out(f, acc, term, set(out))
    if term != out:
        acc = f.op("transpose", acc, perm=tuple(term.index(ch) for ch in out), name="" if stored else c.out())
    elif not stored:
        acc = f.op("reshape", acc, shape=f.shape(acc), name=c.out())
    return [f.op("cast", acc, dtype="bfloat16", name=c.out()) if stored else acc]
