"""The loopback backend: the reference interpreter behind the plugin interface.

It claims every op and runs a graph by calling ``reference.evaluate`` and casting each
output to its declared dtype, so the whole dispatch path (registry, legalization,
placement, sessions, fallback) can be tested without a real device, and the conformance
kit can be shown to pass on a backend that is right by construction.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .. import reference
from ..cost import CostModel
from ..errors import InputError
from ..ir import Graph
from ..ir.ops import SOURCE_OPS, OpKind
from ..plugin import Availability, Backend, CompileOptions, Executable


class LoopbackExecutable(Executable):
    """Runs the reference interpreter; ``set_param`` swaps a param for later runs."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.params: dict[str, np.ndarray] = {}
        self._dtypes = [np.dtype(graph.node(i).dtype) for i in graph.outputs]

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        outs = reference.evaluate(self.graph, inputs, params=self.params)
        return [np.asarray(o).astype(d) for o, d in zip(outs, self._dtypes)]

    def set_param(self, name: str, value: np.ndarray) -> None:
        node = self.graph.input_node(name)
        arr = np.array(value, dtype=node.dtype, copy=True)
        if arr.shape != node.shape:
            raise InputError(f"param {name!r}: expected shape {node.shape}, got {arr.shape}")
        self.params = {**self.params, name: arr}  # a new dict: concurrent runs see old or new, never half


class LoopbackBackend(Backend):
    """Device ``loopback``: every op, computed by ``rlx_core.reference`` (slow, exact)."""

    name = "loopback"
    label = "rlx reference interpreter (loopback, for tests)"
    priority = -100

    def probe(self) -> Availability:
        return Availability(True, devices=[self.name], versions={"numpy": np.__version__})

    def supported_ops(self) -> frozenset[str]:
        return frozenset(op.value for op in OpKind if op not in SOURCE_OPS)

    def cost_model(self) -> CostModel:
        return CostModel(device=self.name, sgemm_gflops=1.0, memory_bw_gbps=1.0, dispatch_overhead_ns=20_000.0,
                         source="loopback: deliberately slow, never the fastest")

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        return LoopbackExecutable(graph)
