"""A backend whose driver crashes its process, as PoCL did on AMD hosts: on request.

``RLXFAKE_CRASH`` says where: ``probe`` (SIGSEGV in the probe), ``calibrate`` (SIGSEGV
when a product with k >= 256 is compiled, which a quick calibration reaches at step
``sgemm 256x256x256``), ``hang`` (calibration never finishes), ``raise`` (calibration
raises ValueError), ``exit`` (the probe calls ``os._exit(3)``). Unset: a working numpy
backend for add, mul and matmul. The probe reports its process id in its reason and
writes a compiler-like line to file descriptor 2, so tests can tell where it ran and
that a child's stderr stays out of the terminal.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping

import numpy as np

import rlx_core
from rlx_core.plugin import SOURCE_OP_NAMES


def _crash() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


class _Run(rlx_core.Executable):
    def __init__(self, graph) -> None:
        self.graph = graph

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        values: dict[int, np.ndarray] = {}
        ops = {"add": np.add, "mul": np.multiply, "matmul": np.matmul}
        for node in self.graph.nodes:
            if node.op == "input":
                values[node.id] = np.asarray(inputs[node.name])
            elif node.op in SOURCE_OP_NAMES:
                values[node.id] = self.graph.value(node.id)
            else:
                values[node.id] = ops[node.op](*(values[i] for i in node.inputs))
        return [values[i] for i in self.graph.outputs]


class CrashingBackend(rlx_core.Backend):
    name = "fakecrash"
    label = "Fake driver that crashes"
    priority = 60

    def probe(self) -> rlx_core.Availability:
        os.write(2, b"17 warnings generated.\n")
        where = os.environ.get("RLXFAKE_CRASH", "")
        if where == "probe":
            _crash()
        if where == "exit":
            os._exit(3)
        return rlx_core.Availability(True, f"pid {os.getpid()}", devices=["fakecrash"])

    def supported_ops(self) -> frozenset[str]:
        return frozenset({"add", "mul", "matmul"})

    def default_cost_model(self) -> rlx_core.CostModel:
        return rlx_core.CostModel(device=self.name, sgemm_gflops=1.0, memory_bw_gbps=1.0, source="fake figures")

    def calibrate(self, quick: bool = False) -> rlx_core.CostModel:
        where = os.environ.get("RLXFAKE_CRASH", "")
        if where == "hang":
            threading.Event().wait()
        if where == "raise":
            raise ValueError("the fake device is on fire")
        return super().calibrate(quick=quick)

    def compile(self, graph, options) -> rlx_core.Executable:
        big = any(n.op == "matmul" and graph.node(n.inputs[0]).shape[-1] >= 256 for n in graph.nodes)
        if big and os.environ.get("RLXFAKE_CRASH") == "calibrate":
            _crash()
        return _Run(graph)


@rlx_core.hookimpl
def rlx_backends():
    return [CrashingBackend()]
