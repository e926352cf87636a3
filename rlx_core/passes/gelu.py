"""Recognizing GELU in an exported graph, so that a product's epilogue can take it.

torch's exporters write ``nn.GELU`` below opset 20 as its parts, the exact (erf) form::

    x * 0.5 * (1 + erf(x / 1.4142135))        # or x * 0.70710677, the products in any order

and HF's ``gelu_new`` / ``gelu(approximate="tanh")`` (GPT-2) as the tanh form::

    0.5 * x * (1 + tanh(0.7978846 * (x + 0.044715 * x ** 3)))   # x ** 3 as pow or x * x * x

``fuse_gelu`` makes each such chain one ``gelu(x, approximate="none" | "tanh")`` node for a
backend that claims ``gelu``. What it buys is not the activation itself (rlx-cpu already
runs the erf chain as one interpreter instruction) but what comes next: ``fuse_gemm``
then takes the ``gelu`` after a dense layer's bias as the product's epilogue, so a
transformer's MLP hidden value (1500 x 1536 floats in a Whisper-tiny layer) is written
once, activated, instead of written, read, activated and written again: a dense layer and
its GELU 0.90-0.95x the time on the 2-core Zen 5 (BENCHMARKS.md, "GELU recognized ahead
of the dense layers' fusion").

The constants are matched as exporters round them to float32 (within 1e-6 relative); the
fused op computes GELU itself, so results differ from the chain's by the rounding of its
parts (a few float32 ulps). A scalar *param* (the dynamo exporter makes every constant an
initializer) counts as its value: those params are returned as *folded* and ``set_param``
of one compiles the graph again (``CompiledGraph.absorbed_params``, as for attention).
Every absorbed node must have no other reader and not be an output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from ..ir import Graph, Node
from ..ir.ops import OpKind
from .legalize import offer
from .optimize import dce
from .rewrite import Emitter, known_scalar, replace_planned

__all__ = ["fuse_gelu"]

Claims = Callable[[Node], "bool | str"]

_SQRT2 = math.sqrt(2.0)
_TANH_SCALE = math.sqrt(2.0 / math.pi)
_TANH_CUBE = 0.044715


class _Match(NamedTuple):
    x: int
    approximate: str
    absorbed: tuple[int, ...]  # the chain's nodes but the last (which the gelu replaces)
    folded: tuple[int, ...]  # scalar params whose values were matched


class _Matcher:
    """Matching one chain: the graph's use counts and the nodes the chain absorbed so far."""

    def __init__(self, graph: Graph, uses: list[int], outputs: frozenset[int], absorbed: list[int] | None = None
                 ) -> None:
        self.graph, self.uses, self.outputs = graph, uses, outputs
        self.absorbed: list[int] = list(absorbed or [])

    def inner(self, i: int, *ops: OpKind) -> Node | None:
        """Node ``i`` if it is one of ``ops``, read once and not an output: absorbed."""
        node = self.graph.node(i)
        if node.op not in ops or self.uses[i] != 1 or i in self.outputs:
            return None
        self.absorbed.append(i)
        return node

    def scalar(self, i: int, value: float) -> bool:
        """Node ``i`` is a one-element float constant or param within 1e-6 of ``value``."""
        arr = known_scalar(self.graph, self.graph.node(i))
        return arr is not None and arr.dtype.kind == "f" and abs(float(arr) - value) <= 1e-6 * abs(value)

    def split(self, node: Node, value: float) -> int | None:
        """The other operand of two-operand ``node`` whose one operand is the scalar ``value``."""
        a, b = node.inputs
        if self.scalar(b, value):
            return a
        if self.scalar(a, value):
            return b
        return None

    def product(self, node: Node, count: int) -> list[int] | None:
        """The ``count`` factors of ``node``, a tree of multiplications whose inner ones are
        read once (absorbed), in no particular order; None for another number."""
        factors: list[int] = []
        pending = list(node.inputs)
        while pending:
            i = pending.pop()
            if self.inner(i, OpKind.MUL) is not None:
                pending += self.graph.node(i).inputs
            else:
                factors.append(i)
            if len(factors) > count:
                return None
        return factors if len(factors) == count else None

    def one_plus(self, i: int, fn: OpKind) -> Node | None:
        """The node ``fn`` of ``1 + fn(argument)`` at ``i`` (both absorbed)."""
        add = self.inner(i, OpKind.ADD)
        rest = None if add is None else self.split(add, 1.0)
        return None if rest is None else self.inner(rest, fn)

    def erf_of(self, i: int) -> int | None:
        """``x`` where ``i`` is ``1 + erf(x / sqrt(2))`` (or ``x * (1 / sqrt(2))``)."""
        erf = self.one_plus(i, OpKind.ERF)
        arg = None if erf is None else self.inner(erf.inputs[0], OpKind.DIV, OpKind.MUL)
        if arg is None:
            return None
        if arg.op is OpKind.DIV:
            return arg.inputs[0] if self.scalar(arg.inputs[1], _SQRT2) else None
        return self.split(arg, 1.0 / _SQRT2)

    def tanh_of(self, i: int) -> int | None:
        """``x`` where ``i`` is ``1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))``."""
        tanh = self.one_plus(i, OpKind.TANH)
        scaled = None if tanh is None else self.inner(tanh.inputs[0], OpKind.MUL)
        inner = None if scaled is None else self.split(scaled, _TANH_SCALE)
        total = None if inner is None else self.inner(inner, OpKind.ADD)
        if total is None:
            return None
        for x, term in (total.inputs, total.inputs[::-1]):
            mark = len(self.absorbed)
            mul = self.inner(term, OpKind.MUL)
            cube = None if mul is None else self.split(mul, _TANH_CUBE)
            if cube is not None and self.is_cube(cube, x):
                return x
            del self.absorbed[mark:]  # that order was not it: nothing of it is absorbed
        return None

    def is_cube(self, i: int, x: int) -> bool:
        """Node ``i`` is ``x ** 3`` (a power by the scalar 3, or ``x * x * x``), absorbed."""
        node = self.graph.node(i)
        if node.op is OpKind.POW:
            return node.inputs[0] == x and self.scalar(node.inputs[1], 3.0) and self.inner(i, OpKind.POW) is not None
        mul = self.inner(i, OpKind.MUL)
        return mul is not None and self.product(mul, 3) == [x, x, x]


_GATES: dict[str, Callable[[_Matcher, int], int | None]] = {"none": _Matcher.erf_of, "tanh": _Matcher.tanh_of}


def _match(graph: Graph, out: Node, uses: list[int], outputs: frozenset[int]) -> _Match | None:
    """The GELU chain ending at multiplication ``out``, if it is one: the product of ``x``,
    ``0.5`` and ``1 + erf(...)`` or ``1 + tanh(...)`` of that same ``x``."""
    if out.op is not OpKind.MUL or not out.dtype.startswith(("float", "bfloat")):
        return None
    m = _Matcher(graph, uses, outputs)
    factors = m.product(out, 3)
    halves = [] if factors is None else [k for k, f in enumerate(factors) if m.scalar(f, 0.5)]
    if not halves:
        return None
    rest = [f for k, f in enumerate(factors) if k != halves[0]]  # type: ignore[arg-type]
    for x, gate in (rest, rest[::-1]):
        for approximate, of in _GATES.items():
            trial = _Matcher(graph, uses, outputs, m.absorbed)
            xs = graph.node(x)
            if of(trial, gate) == x and xs.shape == out.shape and xs.dtype == out.dtype:
                chain = (*trial.absorbed, out.id)
                folded = {i for n in chain for i in graph.node(n).inputs
                          if i != x and graph.node(i).op is OpKind.PARAM}
                return _Match(x, approximate, tuple(trial.absorbed), tuple(sorted(folded)))
    return None


def fuse_gelu(graph: Graph, claims: Claims) -> tuple[Graph, list[str], frozenset[str]]:
    """``graph`` with each GELU chain the backend (``claims``) takes as one ``gelu`` node, a
    note per fusion, and the names of the params whose value a fused node holds
    (``PipelineResult.folded_params``: their ``set_param`` compiles again)."""
    uses = graph.use_counts()
    outputs = frozenset(graph.outputs)
    plans: dict[int, _Match] = {}
    taken: set[int] = set()
    for node in graph.nodes:
        m = _match(graph, node, uses, outputs)
        if m is None or taken & set(m.absorbed):
            continue
        claimed = offer(claims, node, OpKind.GELU, [graph.node(m.x)], {"approximate": m.approximate})
        if claimed is None:
            return graph, [], frozenset()
        if claimed:
            plans[node.id] = m
            taken |= set(m.absorbed)
    if not plans:
        return graph, [], frozenset()

    def emit(em: Emitter, node: Node, m: _Match) -> str:
        em.emit(node, OpKind.GELU, [em.mapped[m.x]], {"approximate": m.approximate}, node.name)
        ops = sorted({str(graph.node(i).op) for i in (*m.absorbed, node.id)})
        return f"fused {', '.join(ops)} ({len(m.absorbed) + 1} ops) at {node.describe()} into gelu({m.approximate})"

    rebuilt, notes = replace_planned(graph, {i for m in plans.values() for i in m.absorbed}, plans, emit)
    fused, _ = dce(rebuilt)  # the chain's constants, where only it read them (params stay)
    folded = frozenset(graph.node(i).name for m in plans.values() for i in m.folded)
    return fused, notes, folded
