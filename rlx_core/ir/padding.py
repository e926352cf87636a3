"""Shape buckets: a symbolic graph rewritten to run at larger sizes with the same results.

A backend that compiles for static shapes ahead of time (XLA, a CUDA graph, an OpenCL
program) serves a new sequence length fastest by not compiling at all: it runs the
program compiled for a larger size, a *bucket*, with the inputs padded with zeros and
the outputs cut back. That is exact only where the padded positions never reach a valid
one. ``pad_graph`` decides where that holds, symbol by symbol, and rewrites the graph so
that it holds wherever it can:

- **Valid prefixes.** An axis whose size involves a padded symbol holds the unpadded
  graph's values at positions ``[0, n)``, ``n`` its size at the actual sizes, and garbage
  after. Zero-padded inputs start so, and every op that works position by position
  keeps it: elementwise ops, a product's rows and columns, a normalization or softmax
  over other axes, a gather's indices, a slice from the start, a concat after fixed-size
  parts (ViT's class token), a convolution's batch, and a convolution or pool over an
  image axis once the padding is made what the window's own padding is.
- **Merged axes.** A reshape that merges a padded axis behind another
  (``(batch, seq, h) -> (batch*seq, h)``) interleaves garbage with valid rows. The axis
  keeps its factors, so a reshape back restores the prefixes and the outputs can be cut;
  nothing may mix positions along it.
- **Masks.** An op that mixes positions along a padded axis reads a mask,
  ``arange(n_bucket) < n``: a product contracting over the axis has both operands' padded
  positions zeroed (``where``, so garbage that is inf or NaN cannot leak), a softmax and an
  attention's keys are masked with -inf, a sum with 0, a max with the lowest value, a mean
  divides the masked sum by the true count. ``n`` (and a mean's count) is a scalar input
  that the executable computes from the actual sizes on each run (``Padded.limits``), so
  one compile serves every size in the bucket.
- **Declined.** Anything else that mixes positions along a padded axis (a layer norm over
  it, a concat after it, a slice from its end, a gather from it, an average whose windows
  run past its end, a size read as data) takes that symbol out of the padded set, and the graph is
  analysed again without it: that symbol then runs at its exact sizes, the others stay
  padded (``Padded.declined`` says why).

Only symbols that are a plain dim of some input are candidates: the executable pads
inputs, so every other dim follows from them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .graph import Graph, Node
from .index_forms import IndexForms
from .internal_types import conv_inputs
from .ops import ELEMENTWISE_OPS, OpKind
from .shape_rules import holds_sym
from .symbolic import Dim, Sym, exact_div, free_symbols

__all__ = ["Padded", "AxisPad", "pad_graph", "LIMIT_PREFIX"]

#: Names of the scalar inputs the rewrite adds (a number follows).
LIMIT_PREFIX = "__rlx_size_"

#: How an output's axis is cut back: ``None`` (not padded), a dim (a valid prefix of that
#: size), or a tuple of dims (a merged axis: its factors, each a valid prefix, row-major).
AxisPad = Any


@dataclass
class Padded:
    """``pad_graph``'s answer. ``graph`` computes ``source``'s outputs at any sizes at or
    above the actual ones for the ``symbols`` padded, given the inputs zero-padded and the
    scalar inputs of ``limits`` (name -> dim: its value at the actual sizes, an int32; or
    for a mean's count a float of ``limit_dtypes[name]``). ``outputs[i][axis]`` says how
    output ``i`` is cut back (``AxisPad``). ``declined`` is symbol -> why it is not padded."""

    source: Graph
    graph: Graph
    symbols: tuple[str, ...]
    limits: dict[str, Dim] = field(default_factory=dict)
    limit_dtypes: dict[str, str] = field(default_factory=dict)
    outputs: list[tuple[AxisPad, ...]] = field(default_factory=list)
    declined: dict[str, str] = field(default_factory=dict)


class _Decline(Exception):
    """The symbols ``symbols`` cannot be padded through this node (``why``)."""

    def __init__(self, symbols: Iterable[str], why: str) -> None:
        super().__init__(why)
        self.symbols = frozenset(symbols)
        self.why = why


def pad_graph(graph: Graph, symbols: Iterable[str] | None = None) -> Padded:
    """The graph rewritten so that the most of ``symbols`` (default: every symbol that is
    a plain dim of an input) can be padded; see the module."""
    declined: dict[str, str] = {}
    plain = {d.name for i in graph.inputs for d in graph.node(i).shape if isinstance(d, Sym) and d.name}
    wanted = plain if symbols is None else set(symbols) & plain
    for name in sorted(set(symbols or ()) - plain):
        declined[name] = "not a plain dim of any input (the executable pads inputs)"
    for i in graph.inputs:  # an input dim like 2*seq: its padding is not a prefix of each symbol
        for d in graph.node(i).shape:
            if isinstance(d, Sym) and d.name is None:
                for name in sorted(free_symbols(d) & wanted):
                    declined[name] = f"input {graph.node(i).name!r} has the dim {d}"
                wanted -= free_symbols(d)
    while wanted:
        try:
            return _Rewrite(graph, frozenset(wanted)).run(declined)
        except _Decline as exc:
            blamed = exc.symbols & wanted or wanted
            for name in sorted(blamed):
                declined[name] = exc.why
            wanted -= blamed
    return Padded(graph, graph, (), declined=declined)


@dataclass
class _Info:
    """What the rewrite knows of a value: its merged axes (axis -> factors) and the axes
    along which its padded positions are known to hold zeros."""

    merged: dict[int, tuple[Dim, ...]] = field(default_factory=dict)
    zero: frozenset[int] = frozenset()


_CLEAN = _Info()


class _Rewrite:
    def __init__(self, src: Graph, padded: frozenset[str]) -> None:
        self.src, self.P = src, padded
        self.g = Graph(src.name)
        self.ids: dict[int, int] = {}
        self.info: dict[int, _Info] = {}
        self.limits: dict[str, Dim] = {}
        self.limit_dtypes: dict[str, str] = {}
        self._limit_of: dict[tuple[Dim, str], int] = {}
        self._masks: dict[tuple[Dim, int], int] = {}
        self._fills: dict[tuple[str, Any], int] = {}
        self.forms = IndexForms(self.g)
        self.tainted: dict[int, frozenset[str]] = {}  # values computed from a padded size read as data
        self._consumed: set[int] = set()  # gathers whose index reads the padded layout (not tainted)

    # ------------------------------------------------------------------ helpers
    def padded(self, dim: Any) -> frozenset[str]:
        return free_symbols(dim) & self.P

    def shape(self, nid: int) -> tuple[Dim, ...]:
        return self.g.node(nid).shape

    def _scalar_input(self, dim: Dim, dtype: str) -> int:
        key = (dim, dtype)
        if key not in self._limit_of:
            name = f"{LIMIT_PREFIX}{len(self._limit_of)}"
            while name in self.src._names:  # (a user's input of that name: never in practice)
                name += "_"
            self._limit_of[key] = self.g.input(name, (), dtype).id
            self.limits[name], self.limit_dtypes[name] = dim, dtype
        return self._limit_of[key]

    def mask(self, dim: Dim, trailing: int) -> int:
        """A bool mask, true at the valid positions of an axis of size ``dim`` followed by
        ``trailing`` axes (shape ``(dim, 1, ..., 1)``)."""
        key = (dim, trailing)
        if key not in self._masks:
            g = self.g
            positions = g.sized_constant("arange", (dim,), "int32", start=0, delta=1).id
            valid = self.op(OpKind.LESS, positions, self._scalar_input(dim, "int32"))
            if trailing:
                valid = self.op(OpKind.RESHAPE, valid, shape=(dim,) + (1,) * trailing)
            self._masks[key] = valid
        return self._masks[key]

    def op(self, kind: OpKind, *ins: int, **attrs: Any) -> int:
        """A node the rewrite adds (inputs are node ids: the builders would read an int as
        a constant)."""
        return self.g.add_node(kind, ins, attrs).id

    def fill(self, dtype: str, value: Any) -> int:
        key = (dtype, value)
        if key not in self._fills:
            self._fills[key] = self.g.constant(np.asarray(value, dtype=dtype)).id
        return self._fills[key]

    def masked(self, nid: int, axis: int, value: Any) -> int:
        """``nid`` with its padded positions along ``axis`` set to ``value``."""
        info = self.info.get(nid, _CLEAN)
        if self.mixed(nid, axis):
            raise _Decline(self.padded(self.shape(nid)[axis]), "a merged axis would need its positions mixed")
        if value == 0 and axis in info.zero:
            return nid
        shape, dtype = self.shape(nid), self.g.node(nid).dtype
        out = self.op(OpKind.WHERE, self.mask(shape[axis], len(shape) - 1 - axis), nid, self.fill(dtype, value))
        self.info[out] = _Info(dict(info.merged), info.zero | {axis} if value == 0 else info.zero)
        return out

    def mixed(self, nid: int, axis: int) -> bool:
        """Whether ``nid``'s ``axis`` interleaves padding with valid positions (a padded
        factor behind another): no valid prefix, nothing may mix its positions."""
        factors = self.info.get(nid, _CLEAN).merged.get(axis)
        return factors is not None and any(self.padded(f) for f in factors[1:])

    def join(self, node: Node, dim: Dim, a: tuple | None, b: tuple | None) -> tuple | None:
        """One axis met with factors ``a`` and ``b`` (``None``: a plain valid prefix)."""
        if a == b:
            return a
        for x, y in ((a, b), (b, a)):  # a prefix known as factors, and the same prefix unsplit
            if x is None and not any(self.padded(f) for f in y[1:]):
                return y
        self.refuse(node, (dim,), "meets one axis padded in two ways")
        return None

    def refuse(self, node: Node, dims: Iterable[Dim], what: str) -> None:
        blamed = frozenset().union(*(self.padded(d) for d in dims)) or self.P
        raise _Decline(blamed, f"{node.op} {node.describe()} {what}")

    # ------------------------------------------------------------------ the walk
    def run(self, declined: dict[str, str]) -> Padded:
        src, g = self.src, self.g
        for node in src.nodes:
            if node.op in (OpKind.INPUT, OpKind.PARAM, OpKind.CONSTANT):
                self.source(node)
                continue
            ins = [self.ids[i] for i in node.inputs]
            touched = any(self.padded(self.shape(i)) for i in ins) or self.padded(node.shape)
            if not touched and not any(self.padded(v) for v in node.attrs.values() if holds_sym(v)):
                out = g.copy_node(src, node, ins).id
            else:
                rule = _RULES.get(node.op)
                if rule is None and (node.op in ELEMENTWISE_OPS or node.op is OpKind.FUSED_ELEMENTWISE):
                    rule = _Rewrite.elementwise
                if rule is None:
                    self.refuse(node, node.shape, "mixes positions along a padded axis (no padding rule)")
                out, info = rule(self, node, ins)
                if info.merged or info.zero:
                    self.info[out] = info
            self.ids[node.id] = out
            self.index_arithmetic(node, out, ins)
        for o in src.outputs:
            if self.ids[o] in self.tainted:
                self.refuse(src.node(o), self.tainted[self.ids[o]], "reads a size as data")
        g.set_outputs([self.ids[o] for o in src.outputs])
        cuts = [self.cut(self.ids[o]) for o in src.outputs]
        return Padded(src, g, tuple(sorted(self.P)), self.limits, self.limit_dtypes, cuts, declined)

    def cut(self, nid: int) -> tuple[AxisPad, ...]:
        merged = self.info.get(nid, _CLEAN).merged
        return tuple(merged.get(a, d if self.padded(d) else None) for a, d in enumerate(self.shape(nid)))

    def copy(self, node: Node, ins: Sequence[int]) -> int:
        return self.g.copy_node(self.src, node, ins).id

    def source(self, node: Node) -> None:
        nid = self.g.copy_source(self.src, node).id
        self.ids[node.id] = nid
        attrs = node.attrs
        if node.op is OpKind.CONSTANT:
            self.forms.source(node, nid, None if "sized" in attrs else self.src.value(node.id))
            read = self.padded((*attrs.get("values", ()), attrs.get("start", 0))) if "sized" in attrs else None
            if read:  # a size as data: exact only where it indexes the padded layout (index_forms.py)
                self.tainted[nid] = read
        if node.op is OpKind.INPUT:
            self.info[nid] = _Info(zero=frozenset(a for a, d in enumerate(node.shape) if self.padded(d)))

    def index_arithmetic(self, node: Node, out: int, ins: Sequence[int]) -> None:
        """Track ``out``'s affine form; a value computed from a padded size read as data
        stays exact only as an affine form, until a gather reads the padded layout with
        it (``index_forms``): anything else it reaches declines those sizes."""
        forms = self.forms
        if node.op is OpKind.GATHER:
            found = forms.gathered(node, ins[0], ins[1])
            if found is not None:
                forms.forms[out] = found
        else:
            forms.derive(node, out, ins)
        read = frozenset().union(*(self.tainted.get(i, frozenset()) for i in ins))
        if not read or out in self._consumed:
            return
        form, stack = forms.forms.get(out), forms.stacks.get(out)
        if form is None and stack is None:
            self.refuse(node, read, "reads a size as data")
        held = form.symbols() if form is not None else frozenset().union(*(f.symbols() for f in stack[1]))
        if held & self.P:
            self.tainted[out] = held & self.P

    # ------------------------------------------------------------------ rules
    def broadcast(self, node: Node, ins: Sequence[int], rank: int) -> dict[int, tuple]:
        """The merged axes of a broadcast of ``ins`` (right-aligned) to ``out``."""
        merged: dict[int, tuple] = {}
        for nid in ins:
            shape, info = self.shape(nid), self.info.get(nid, _CLEAN)
            off = rank - len(shape)
            for a, d in enumerate(shape):
                if d == 1 or not self.padded(d):
                    continue
                mine = info.merged.get(a)
                have = merged.get(off + a, "unset")
                merged[off + a] = mine if have == "unset" else self.join(node, d, have, mine)
        return {a: f for a, f in merged.items() if f is not None}

    def elementwise(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        merged = self.broadcast(node, ins, len(node.shape))
        zero = frozenset()
        if node.op is OpKind.CAST and len(ins) == 1:
            zero = self.info.get(ins[0], _CLEAN).zero
        return self.copy(node, ins), _Info(merged, zero)

    def matmul(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        a, b, *rest = ins
        sa, sb = self.shape(a), self.shape(b)
        if self.padded(sa[-1]):  # the contraction: zero both operands' padded positions
            a = self.masked(a, len(sa) - 1, 0)
            b = self.masked(b, max(len(sb) - 2, 0), 0)
        rank = len(node.shape)
        ia, ib = self.info.get(a, _CLEAN).merged, self.info.get(b, _CLEAN).merged
        merged: dict[int, tuple] = {}
        if len(sa) >= 2 and len(sb) >= 2:
            batch_rank = rank - 2
            batch_a = _Info({k: v for k, v in ia.items() if k < len(sa) - 2})
            batch_b = _Info({k: v for k, v in ib.items() if k < len(sb) - 2})
            merged = self._batch(node, [(sa[:-2], batch_a), (sb[:-2], batch_b)], batch_rank)
            if len(sa) - 2 in ia:
                merged[rank - 2] = ia[len(sa) - 2]
            if len(sb) - 1 in ib:
                merged[rank - 1] = ib[len(sb) - 1]
        elif ia or ib:
            self.refuse(node, node.shape, "is a vector product over a merged axis")
        if rest:  # gemm's bias: broadcast to the product
            bias = self.broadcast(node, rest, rank)
            for k, v in bias.items():
                merged[k] = self.join(node, node.shape[k], merged.get(k), v)
        return self.copy(node, [a, b, *rest]), _Info(merged)

    def _batch(self, node: Node, parts: Sequence[tuple[Sequence[Dim], _Info]], rank: int) -> dict[int, tuple]:
        merged: dict[int, tuple] = {}
        for shape, info in parts:
            off = rank - len(shape)
            for k, v in info.merged.items():
                merged[off + k] = self.join(node, shape[k], merged.get(off + k), v)
        return merged

    def softmax(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        axis, (x,) = node.attrs["axis"], ins
        info = self.info.get(x, _CLEAN)
        if not self.padded(node.shape[axis]):
            return self.copy(node, ins), _Info(dict(info.merged))
        x = self.masked(x, axis, -np.inf)
        return self.copy(node, [x]), _Info(dict(info.merged), frozenset({axis}))

    def layer_norm(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        axis = node.attrs["axis"]
        if any(self.padded(d) for d in node.shape[axis:]):
            self.refuse(node, node.shape[axis:], "normalizes over a padded axis")
        return self.copy(node, ins), _Info(dict(self.info.get(ins[0], _CLEAN).merged))

    def reduce(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        x, axes, keep = ins[0], node.attrs["axes"], node.attrs["keepdims"]
        shape, dtype = self.shape(x), node.dtype
        for a in axes:
            if self.padded(shape[a]):
                if np.dtype(dtype).kind not in "iuf":
                    self.refuse(node, (shape[a],), f"reduces {dtype} over a padded axis")
                if node.op is OpKind.REDUCE_MEAN and dtype not in ("float32", "float64"):
                    self.refuse(node, (shape[a],), f"averages {dtype} over a padded axis (its count would round)")
                if node.op is OpKind.REDUCE_MAX:
                    low = -np.inf if np.dtype(dtype).kind == "f" else np.iinfo(dtype).min
                    x = self.masked(x, a, low)
                else:
                    x = self.masked(x, a, 0)
        merged = self.info.get(x, _CLEAN).merged
        if keep:
            kept = {a: f for a, f in merged.items() if a not in axes}
        else:
            left = [a for a in range(len(shape)) if a not in axes]
            kept = {left.index(a): f for a, f in merged.items() if a in left}
        if node.op is not OpKind.REDUCE_MEAN or not any(self.padded(shape[a]) for a in axes):
            return self.copy(node, [x]), _Info(kept)
        total = self.op(OpKind.REDUCE_SUM, x, axes=axes, keepdims=keep)
        count = self._scalar_input(math.prod(shape[a] for a in axes), dtype)
        return self.op(OpKind.DIV, total, count), _Info(kept)

    def transpose(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        perm, merged = node.attrs["perm"], self.info.get(ins[0], _CLEAN).merged
        return self.copy(node, ins), _Info({i: merged[p] for i, p in enumerate(perm) if p in merged})

    def reshape(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        shape, info = self.shape(ins[0]), self.info.get(ins[0], _CLEAN)
        if tuple(shape) == tuple(node.shape):
            return self.copy(node, ins), _Info(dict(info.merged))
        tokens: list[Dim] = []
        for a, d in enumerate(shape):
            for f in info.merged.get(a, (d,)):
                if f == 1:
                    continue
                if tokens and not self.padded(f) and not self.padded(tokens[-1]):
                    tokens[-1] = tokens[-1] * f
                else:
                    tokens.append(f)
        merged: dict[int, tuple] = {}
        pos = 0
        for j, d in enumerate(node.shape):
            if d == 1:
                continue
            factors: list[Dim] = []
            need: Dim = d
            while need != 1:
                if pos >= len(tokens):
                    self.refuse(node, (d,), f"splits a padded axis ({shape} -> {node.shape})")
                t = tokens[pos]
                if exact_div(need, t) is not None and (self.padded(d) or not self.padded(t)):
                    factors.append(t)
                    need = exact_div(need, t)
                    pos += 1
                elif not self.padded(t) and not self.padded(need) and exact_div(t, need) is not None:
                    factors.append(need)
                    tokens[pos] = exact_div(t, need)
                    need = 1
                else:
                    self.refuse(node, (d, t), f"splits a padded axis ({shape} -> {node.shape})")
            if len(factors) > 1 and any(self.padded(f) for f in factors):
                merged[j] = tuple(factors)
        if any(t != 1 for t in tokens[pos:]):
            self.refuse(node, shape, f"splits a padded axis ({shape} -> {node.shape})")
        return self.copy(node, ins), _Info(merged)

    def slice(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        shape, info = self.shape(ins[0]), self.info.get(ins[0], _CLEAN)
        attrs = node.attrs
        for a, start, step in zip(attrs["axes"], attrs["starts"], attrs["steps"]):
            if self.padded(start):
                self.refuse(node, (start,), "starts at a padded size")
            if not self.padded(shape[a]):
                continue
            if self.mixed(ins[0], a):
                self.refuse(node, (shape[a],), "slices a merged axis")
            if isinstance(start, Sym) or step < 0 or start < 0:  # from the end: the padding, not the data
                self.refuse(node, (shape[a],), "slices a padded axis from its end")
        sliced = set(attrs["axes"])
        return self.copy(node, ins), _Info({a: f for a, f in info.merged.items() if a not in sliced})

    def concat(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        axis = node.attrs["axis"]
        for nid in ins[:-1]:
            if self.padded(self.shape(nid)[axis]):
                self.refuse(node, (self.shape(nid)[axis],), "puts values after a padded part")
        if self.mixed(ins[-1], axis):
            self.refuse(node, (node.shape[axis],), "concatenates along a merged axis")
        merged = self.broadcast(node, ins, len(node.shape))
        merged.pop(axis, None)  # (its size is no longer its factors')
        return self.copy(node, ins), _Info(merged)

    def gather(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        x, idx = ins
        axis, sx = node.attrs["axis"], self.shape(x)
        layout = False
        if self.padded(sx[axis]):  # exact for a Range read at positions, or an index of the padded layout
            ranged = len(sx) == 1 and self.forms.gathered(node, x, idx) is not None
            layout = not ranged and self.forms.reads_layout(idx, self.info.get(x, _CLEAN).merged.get(axis, (sx[axis],)))
            if not (ranged or layout):
                self.refuse(node, (sx[axis],), "gathers from a padded axis")
        for a, d in enumerate(self.shape(idx)):  # garbage indices could fall outside the table
            if self.padded(d):
                idx = self.masked(idx, a, 0)
        mx, mi = self.info.get(x, _CLEAN).merged, self.info.get(idx, _CLEAN).merged
        ri = len(self.shape(idx))
        merged = {a: f for a, f in mx.items() if a < axis}
        merged.update({axis + a: f for a, f in mi.items()})
        merged.update({a - 1 + ri: f for a, f in mx.items() if a > axis})
        out = self.copy(node, [x, idx])
        if layout:
            self._consumed.add(out)
        return out, _Info(merged)

    def spatial(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        """Convolutions and pools. The batch may be padded; an image axis too, its padding
        made what the window's own padding is (zeros, or -inf for a max), so each valid
        output reads what it read unpadded (a valid prefix again, of the output's size);
        an average that does not count its padding, or whose windows may run past the end,
        declines it, and so do padded channels."""
        x, op, attrs = ins[0], node.op, node.attrs
        x_shape = self.shape(x)
        if self.padded(x_shape[1]):
            self.refuse(node, x_shape[1:2], "has padded channels")
        n_conv = conv_inputs(attrs) if op is OpKind.FUSED_CONV else len(ins)
        for nid in ins[1:n_conv]:
            if self.padded(self.shape(nid)):
                self.refuse(node, self.shape(nid), "has padded weights")
        image = [a for a in (2, 3) if self.padded(x_shape[a])]
        if op is OpKind.GLOBAL_AVG_POOL2D and image:  # a mean over the image: the masked sum over its count
            if node.dtype not in ("float32", "float64"):
                self.refuse(node, [x_shape[a] for a in image], f"averages {node.dtype} over a padded axis")
            for a in image:
                x = self.masked(x, a, 0)
            total = self.op(OpKind.REDUCE_SUM, x, axes=(2, 3), keepdims=True)
            count = self._scalar_input(x_shape[2] * x_shape[3], node.dtype)
            return self.op(OpKind.DIV, total, count), _Info(self.broadcast(node, [x], len(node.shape)))
        for a in image:
            if op is OpKind.AVG_POOL2D and (attrs["ceil_mode"] or (not attrs["count_include_pad"]
                                                                  and attrs["padding"][a])):
                self.refuse(node, (x_shape[a],), "averages windows that may run past a padded axis's end")
            x = self.masked(x, a, -np.inf if op is OpKind.MAX_POOL2D else 0)
        merged = self.broadcast(node, [x, *ins[n_conv:]], len(node.shape))
        return self.copy(node, [x, *ins[1:]]), _Info(merged)

    def attention(self, node: Node, ins: Sequence[int]) -> tuple[int, _Info]:
        q, k, v, *mask = ins
        sq, sk, sv = self.shape(q), self.shape(k), self.shape(v)
        if self.padded(sq[-1]) or self.padded(sv[-1]):
            self.refuse(node, (sq[-1], sv[-1]), "has a padded head dimension")
        rank = len(node.shape)
        if self.padded(sk[-2]):  # the keys: masked out of the softmax, zeroed out of the sums
            k, v = self.masked(k, len(sk) - 2, 0), self.masked(v, len(sv) - 2, 0)
            valid = self.mask(sk[-2], 0)
            if not mask:
                mask = [valid]
            else:
                m = mask[0]
                off = self.g.node(m).dtype != "bool"
                mask = [self.op(OpKind.WHERE, valid, m, self.fill(self.g.node(m).dtype, -np.inf if off else False))]
        parts = [(self.shape(t)[:-2], _Info({a: f for a, f in self.info.get(t, _CLEAN).merged.items()
                                             if a < len(self.shape(t)) - 2})) for t in (q, k, v)]
        merged = self._batch(node, parts, rank - 2)
        if len(sq) - 2 in self.info.get(q, _CLEAN).merged:
            merged[rank - 2] = self.info[q].merged[len(sq) - 2]
        out = self.g.add_node(OpKind.ATTENTION, [q, k, v, *mask], node.attrs, node.name).id
        return out, _Info(merged)


_RULES: Mapping[OpKind, Any] = {
    OpKind.MATMUL: _Rewrite.matmul,
    OpKind.GEMM: _Rewrite.matmul,
    OpKind.SOFTMAX: _Rewrite.softmax,
    OpKind.LAYER_NORM: _Rewrite.layer_norm,
    OpKind.REDUCE_SUM: _Rewrite.reduce,
    OpKind.REDUCE_MEAN: _Rewrite.reduce,
    OpKind.REDUCE_MAX: _Rewrite.reduce,
    OpKind.TRANSPOSE: _Rewrite.transpose,
    OpKind.RESHAPE: _Rewrite.reshape,
    OpKind.SLICE: _Rewrite.slice,
    OpKind.CONCAT: _Rewrite.concat,
    OpKind.GATHER: _Rewrite.gather,
    OpKind.CONV2D: _Rewrite.spatial,
    OpKind.FUSED_CONV: _Rewrite.spatial,
    OpKind.MAX_POOL2D: _Rewrite.spatial,
    OpKind.AVG_POOL2D: _Rewrite.spatial,
    OpKind.GLOBAL_AVG_POOL2D: _Rewrite.spatial,
    OpKind.ATTENTION: _Rewrite.attention,
}
