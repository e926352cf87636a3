"""An example rlx backend: device ``toy``, a dozen ops computed with plain numpy.

It claims elementwise math, matmul, reshape and transpose, and deliberately no
reductions, so a graph with ``softmax`` is blocked on ``reduce_max`` and runs elsewhere.
"""

from __future__ import annotations

import numpy as np

import rlx_core

__version__ = "0.1.0"

_UNARY = {"neg": np.negative, "exp": np.exp, "tanh": np.tanh, "relu": lambda x: np.maximum(x, 0)}
_BINARY = {
    "matmul": np.matmul, "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "div": np.true_divide, "maximum": np.maximum, "minimum": np.minimum,
}


class ToyExecutable(rlx_core.Executable):
    """A flat list of steps made once at compile time; ``run`` only calls them."""

    def __init__(self, graph: rlx_core.Graph) -> None:
        self.slots: dict[int, np.ndarray] = {}  # constants and params, fixed at compile time
        self.inputs = {graph.node(i).name: i for i in graph.inputs}
        self.steps = []  # (node id, function, input ids)
        for node in graph.nodes:
            if node.op in ("param", "constant"):
                self.slots[node.id] = graph.value(node.id)
            elif node.op in _UNARY:
                self.steps.append((node.id, _UNARY[node.op], node.inputs))
            elif node.op in _BINARY:
                self.steps.append((node.id, _BINARY[node.op], node.inputs))
            elif node.op == "reshape":
                self.steps.append((node.id, lambda x, s=node.attrs["shape"]: np.reshape(x, s), node.inputs))
            elif node.op == "transpose":
                self.steps.append((node.id, lambda x, p=node.attrs["perm"]: np.transpose(x, p), node.inputs))
        self.outputs = graph.outputs
        self.dtypes = [graph.node(i).dtype for i in graph.outputs]

    def run(self, inputs):
        env = dict(self.slots)
        for name, i in self.inputs.items():
            env[i] = inputs[name]
        for out, fn, args in self.steps:
            env[out] = fn(*(env[a] for a in args))
        # Copy: an output may be a view of an input (reshape), which we must not hand out.
        return [np.array(env[i], dtype=d, copy=True) for i, d in zip(self.outputs, self.dtypes)]


class ToyBackend(rlx_core.Backend):
    name = "toy"
    label = "Toy numpy backend (rlx example plugin)"
    priority = 10
    api_version = rlx_core.PLUGIN_API_VERSION

    def probe(self) -> rlx_core.Availability:
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        got = np.tanh(a @ a.T)
        if not np.allclose(got, np.tanh(np.array([[5.0, 14.0], [14.0, 50.0]])), atol=1e-6):
            return rlx_core.Availability(False, f"numpy {np.__version__} computed a wrong matmul")
        return rlx_core.Availability(True, devices=["toy"], versions={"numpy": np.__version__})

    def supported_ops(self) -> frozenset[str]:
        return frozenset(_UNARY) | frozenset(_BINARY) | {"reshape", "transpose"}

    def claims(self, node) -> bool | str:
        if node.op == "div" and not node.dtype.startswith("float"):
            return f"toy divides floats only, not {node.dtype}"
        return node.op in self.supported_ops()

    def default_cost_model(self) -> rlx_core.CostModel:
        # Used until `rlx calibrate toy` measures this host. One Python call per step with
        # fresh allocations: a larger dispatch than cpu's.
        return rlx_core.CostModel(device="toy", sgemm_gflops=20.0, memory_bw_gbps=8.0, dispatch_overhead_ns=3_000.0,
                                  roundtrip_overhead_ns=10_000.0, source="rlx-example-plugin defaults")

    def compile(self, graph, options) -> rlx_core.Executable:
        return ToyExecutable(graph)


@rlx_core.hookimpl
def rlx_backends() -> list[rlx_core.Backend]:
    return [ToyBackend()]
