"""Index arithmetic an export computes from positions and sizes, as exact affine forms.

Exporters lower advanced indexing (``mask[batch_idx, kv_idx]``: the attention masks of
transformers' models) to a flat gather: the tensor reshaped to ``(batch*seq, ...)`` and
read at ``batch_idx * seq + kv_idx``, with ``seq`` read from the shape as data, the
positions from ``Range``s, and (rlx's GatherND) the index components stacked and picked
again. Padding such a graph to a bucket is exact when the index is the row-major
position of the padded layout, since ``seq`` then reads the bucket's size there: the
same element is read in both. ``pad_graph`` asks this module whether it is.

An integer value has an *affine form* when every element is ``const + sum(coef[a] *
p[a])``, ``p[a]`` the element's position along axis ``a`` and ``const``, ``coef`` dims
(ints or symbolic): ``Range``s, shape values, size-one constants, and what reshapes
adding or dropping unit axes, transposes, casts, sums, differences and products by a
form without positions make of them; a gather of a ``Range`` at a form, and the pick of
one stacked component, keep one too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .graph import Graph, Node
from .ops import OpKind
from .symbolic import Dim, free_symbols

__all__ = ["Affine", "IndexForms"]

_INT_KINDS = "iu"


@dataclass(frozen=True)
class Affine:
    """``const + sum(coefs[a] * position[a])`` over a value's axes (see the module)."""

    const: Dim = 0
    coefs: Mapping[int, Dim] = field(default_factory=dict)

    def symbols(self) -> frozenset[str]:
        return free_symbols((self.const, *self.coefs.values()))

    def shifted(self, by: int) -> Affine:
        return Affine(self.const, {a + by: c for a, c in self.coefs.items()})


def _plus(a: Affine, b: Affine, sign: int = 1) -> Affine:
    coefs = dict(a.coefs)
    for ax, c in b.coefs.items():
        coefs[ax] = coefs.get(ax, 0) + sign * c
    return Affine(a.const + sign * b.const, {ax: c for ax, c in coefs.items() if c != 0})


def _scaled(a: Affine, k: Dim) -> Affine:
    return Affine(a.const * k, {ax: c * k for ax, c in a.coefs.items() if c * k != 0})


class IndexForms:
    """The affine forms (and stacks of them) of a graph's integer values, by node id."""

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.forms: dict[int, Affine] = {}
        self.stacks: dict[int, tuple[int, tuple[Affine, ...]]] = {}  # id -> (axis, one form per component)

    def _int(self, nid: int) -> bool:
        return np.dtype(self.g.node(nid).dtype).kind in _INT_KINDS

    def _shape(self, nid: int) -> tuple[Dim, ...]:
        return self.g.node(nid).shape

    def source(self, node: Node, nid: int, value: Any = None) -> None:
        """A source's form: a sized ``arange``, ``dims`` or ``fill``, or a constant of one element."""
        if node.op is not OpKind.CONSTANT or not self._int(nid):
            return
        attrs = node.attrs
        kind = attrs.get("sized")
        if kind == "arange" and node.shape[0] != 1:
            self.forms[nid] = Affine(attrs["start"], {0: attrs["delta"]})
        elif kind == "arange" or kind == "fill":
            self.forms[nid] = Affine(attrs.get("value", attrs.get("start", 0)))
        elif kind == "dims" and len(attrs["values"]) == 1:
            self.forms[nid] = Affine(attrs["values"][0])
        elif kind is None and value is not None and np.size(value) == 1:
            self.forms[nid] = Affine(int(np.asarray(value).reshape(())))

    def derive(self, node: Node, nid: int, ins: Sequence[int]) -> None:
        """The form (or stack) of ``nid``, ``node`` computed on ``ins``, where it has one."""
        if not self._int(nid):
            return
        op, forms = node.op, [self.forms.get(i) for i in ins]
        rank = len(self._shape(nid))
        if op in (OpKind.ADD, OpKind.SUB, OpKind.MUL) and None not in forms:
            a, b = (f.shifted(rank - len(self._shape(i))) for f, i in zip(forms, ins))
            a, b = self._unit_free(a, nid), self._unit_free(b, nid)
            if op is OpKind.MUL:
                if a.coefs and b.coefs:
                    return
                self.forms[nid] = _scaled(b, a.const) if not a.coefs else _scaled(a, b.const)
            else:
                self.forms[nid] = _plus(a, b, -1 if op is OpKind.SUB else 1)
        elif op is OpKind.CAST and forms[0] is not None and self._int(ins[0]):
            self.forms[nid] = forms[0]
        elif op is OpKind.TRANSPOSE and forms[0] is not None:
            perm = node.attrs["perm"]
            self.forms[nid] = Affine(forms[0].const, {i: forms[0].coefs[p] for i, p in enumerate(perm)
                                                      if p in forms[0].coefs})
        elif op is OpKind.RESHAPE and forms[0] is not None:
            before = [a for a, d in enumerate(self._shape(ins[0])) if d != 1]
            after = [a for a, d in enumerate(self._shape(nid)) if d != 1]
            if [self._shape(ins[0])[a] for a in before] == [self._shape(nid)[a] for a in after]:
                moved = dict(zip(before, after))
                self.forms[nid] = Affine(forms[0].const, {moved[a]: c for a, c in forms[0].coefs.items()})
        elif op is OpKind.CONCAT and None not in forms:
            axis = node.attrs["axis"]
            if all(self._shape(i)[axis] == 1 for i in ins):
                self.stacks[nid] = (axis, tuple(forms))

    def _unit_free(self, form: Affine, nid: int) -> Affine:
        shape = self._shape(nid)
        return Affine(form.const, {a: c for a, c in form.coefs.items() if a < len(shape) and shape[a] != 1})

    def gathered(self, node: Node, data: int, idx: int) -> Affine | None:
        """The form of ``gather(data, idx)`` (``node``'s attrs), where it has one: a picked
        component of a stack, or a 1-D form read at a form's positions (a ``Range`` read at
        indices)."""
        axis, form_i = node.attrs["axis"], self.forms.get(idx)
        found = None
        stack = self.stacks.get(data)
        if stack is not None and stack[0] == axis and form_i is not None and not form_i.coefs \
                and not self._shape(idx) and isinstance(form_i.const, int):
            pieces = stack[1]
            k = form_i.const + len(pieces) if form_i.const < 0 else form_i.const
            if 0 <= k < len(pieces):
                piece = pieces[k]
                found = Affine(piece.const, {(a if a < axis else a - 1): c for a, c in piece.coefs.items()
                                             if a != axis})
        form_d = self.forms.get(data)
        if found is None and form_d is not None and form_i is not None and len(self._shape(data)) == 1:
            step = form_d.coefs.get(0, 0)
            found = Affine(form_d.const + step * form_i.const, {a: c * step for a, c in form_i.coefs.items()
                                                                if c * step != 0})
        return found

    def reads_layout(self, idx: int, factors: Sequence[Dim]) -> bool:
        """Whether ``idx`` indexes an axis made of ``factors`` (row-major) exactly at the
        positions of its own axes of those sizes: each term ``position[a] * stride`` with
        ``stride`` the product of the factors after one of size ``shape[a]``, each factor
        used once, no constant. Read in a padded layout, such an index reads the same
        element there (the strides are the bucket's sizes, and so are the factors)."""
        form = self.forms.get(idx)
        if form is None or form.const != 0:
            return False
        shape = self._shape(idx)
        strides = [_product(factors[j + 1:]) for j in range(len(factors))]
        used: set[int] = set()
        for a, c in form.coefs.items():
            j = next((j for j, f in enumerate(factors) if j not in used and shape[a] == f and c == strides[j]), None)
            if j is None:
                return False
            used.add(j)
        return True


def _product(dims: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return out
