"""Two backends that run a graph only together: ``fakemm`` runs products, ``fakerest``
everything else; both compute through the core's reference interpreter."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import rlx_core
from rlx_core import reference
from rlx_core.ir.ops import COMPOSITE_OPS, PRIMITIVE_OPS


class _Run(rlx_core.Executable):
    def __init__(self, graph: rlx_core.Graph) -> None:
        self.graph = graph

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        outs = reference.evaluate(self.graph, inputs)
        return [np.asarray(o).astype(self.graph.node(i).dtype) for o, i in zip(outs, self.graph.outputs)]


class _Half(rlx_core.Backend):
    ops: frozenset[str] = frozenset()

    def probe(self) -> rlx_core.Availability:
        return rlx_core.Availability(True, devices=[self.name])

    def supported_ops(self) -> frozenset[str]:
        return self.ops

    def cost_model(self) -> rlx_core.CostModel:
        return rlx_core.CostModel(device=self.name, source="fake figures")

    def compile(self, graph: rlx_core.Graph, options: rlx_core.CompileOptions) -> rlx_core.Executable:
        return _Run(graph)


class Products(_Half):
    name = "fakemm"
    label = "Fake products only"
    priority = 20
    ops = frozenset({"matmul"})


class Rest(_Half):
    name = "fakerest"
    label = "Fake everything but products"
    priority = 10
    ops = frozenset(op.value for op in PRIMITIVE_OPS | COMPOSITE_OPS) - {"matmul"}


@rlx_core.hookimpl
def rlx_backends() -> list[rlx_core.Backend]:
    return [Products(), Rest()]
