"""A working backend: numpy on the host, claims add and mul, and really computes them."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import rlx_core
from rlx_core.plugin import SOURCE_OP_NAMES


class _Run(rlx_core.Executable):
    def __init__(self, graph) -> None:
        self.graph = graph

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        values: dict[int, np.ndarray] = {}
        for node in self.graph.nodes:
            if node.op == "input":
                values[node.id] = np.asarray(inputs[node.name])
            elif node.op in SOURCE_OP_NAMES:
                values[node.id] = self.graph.value(node.id)
            elif node.op == "add":
                values[node.id] = np.add(*(values[i] for i in node.inputs))
            elif node.op == "mul":
                values[node.id] = np.multiply(*(values[i] for i in node.inputs))
            else:  # the core only hands us ops we claim
                raise AssertionError(f"fakenp was given {node.op}")
        return [values[i] for i in self.graph.outputs]


class FakeNumpyBackend(rlx_core.Backend):
    name = "fakenp"
    label = "Fake numpy (add, mul)"
    priority = 30

    def probe(self) -> rlx_core.Availability:
        ok = bool(np.array_equal(np.add([1, 2], [3, 4]), [4, 6]))
        return rlx_core.Availability(ok, "" if ok else "numpy add is wrong", ["fakenp"], {"numpy": np.__version__})

    def probed(self, answer: rlx_core.Availability) -> None:
        self.told = answer  # what the parent learns of a probe run in a child

    def supported_ops(self) -> frozenset[str]:
        return frozenset({"add", "mul"})

    def cost_model(self) -> rlx_core.CostModel:
        return rlx_core.CostModel(device=self.name, sgemm_gflops=5.0, source="fake figures")

    def compile(self, graph, options) -> rlx_core.Executable:
        return _Run(graph)


@rlx_core.hookimpl
def rlx_backends() -> list[rlx_core.Backend]:
    return [FakeNumpyBackend()]
