"""Test backends for the dispatch path: real (they compute via the reference) and
configurable to misbehave in one precise way each."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType

import numpy as np

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir.ops import COMPOSITE_OPS, PRIMITIVE_OPS

ALL_OPS = frozenset(op.value for op in PRIMITIVE_OPS | COMPOSITE_OPS)
PRIMITIVES = frozenset(op.value for op in PRIMITIVE_OPS)


class RefExecutable(rlx.Executable):
    def __init__(self, graph: rlx.Graph, owner: ToyBackend) -> None:
        self.graph = graph
        self.owner = owner
        self.runs = 0

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self.runs += 1
        self.owner.runs += 1
        if self.owner.fail_run:
            raise RuntimeError(f"{self.owner.name} exploded")
        outs = reference.evaluate(self.graph, inputs)
        outs = [o.astype(self.graph.node(i).dtype) for o, i in zip(outs, self.graph.outputs)]
        if self.owner.wrong_output == "shape":
            outs[0] = outs[0].reshape(-1)[:1]
        elif self.owner.wrong_output == "dtype":
            outs[0] = outs[0].astype(np.float64)
        elif self.owner.wrong_output == "count":
            outs = outs + outs
        return outs


class ToyBackend(rlx.Backend):
    """A backend that really runs what it claims (through the reference interpreter)."""

    label = "toy backend for tests"

    def __init__(self, name: str = "toy", *, ops: Iterable[str] = ALL_OPS, priority: int = 10,
                 gflops: float = 20.0, available: bool | str = True, fail_compile: bool = False,
                 fail_run: bool = False, wrong_output: str | None = None,
                 set_param_supported: bool = False) -> None:
        self.name = name  # type: ignore[misc]
        self.priority = priority  # type: ignore[misc]
        self.ops = frozenset(ops)
        self.gflops = gflops
        self.available = available
        self.fail_compile = fail_compile
        self.fail_run = fail_run
        self.wrong_output = wrong_output
        self.compiles = 0
        self.runs = 0

    def probe(self) -> rlx.Availability:
        if self.available is True:
            return rlx.Availability(True, devices=[self.name])
        return rlx.Availability(False, self.available or "no toy device here")

    def supported_ops(self) -> frozenset[str]:
        return self.ops

    def cost_model(self) -> rlx.CostModel:
        return rlx.CostModel(device=self.name, sgemm_gflops=self.gflops, memory_bw_gbps=self.gflops / 2,
                             dispatch_overhead_ns=1000, roundtrip_overhead_ns=1000)

    def compile(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable:
        self.compiles += 1
        if self.fail_compile:
            raise RuntimeError(f"{self.name} cannot compile today")
        unclaimed = [n.op for n in graph.nodes if n.op not in ("input", "param", "constant") and n.op not in self.ops]
        assert not unclaimed, f"core handed {self.name} unclaimed ops {unclaimed}"
        return RefExecutable(graph, self)


def registry_with(*backends: rlx.Backend) -> rlx.Registry:
    reg = rlx.Registry(entry_points=[], environ={})
    for b in backends:
        reg.register(b)
    return reg


def mlp(batch: int = 4) -> rlx.Graph:
    g = rlx.Graph("mlp")
    rng = np.random.default_rng(0)
    x = g.input("x", (batch, 8))
    w = g.param("w", rng.standard_normal((8, 6)).astype(np.float32))
    b = g.param("b", rng.standard_normal(6).astype(np.float32))
    g.set_outputs([g.softmax(g.relu(g.add(g.matmul(x, w), b)), name="probs")])
    return g


def other_plugins_disabled(extra: str = "") -> str:
    """An ``RLX_DISABLE_PLUGINS`` value naming the entry points of this repository's other
    plugins (jax, opencl, cuda) that are installed, plus ``extra``: subprocess tests that
    reason about "cpu is the best device" stay true when those are installed beside it."""
    from importlib.metadata import entry_points

    ours = {"rlx-jax-tpu", "rlx-opencl", "rlx-cuda"}
    eps = entry_points(group=rlx.plugin.ENTRY_POINT_GROUP)
    names = sorted({ep.name for ep in eps if ep.dist is not None and ep.dist.name in ours})
    return ",".join([*names, *([extra] if extra else [])])


def bench_module(module: str) -> ModuleType:
    """``bench.<module>``: the repository's bench directory loaded as a package without
    touching sys.path (the benchmark tests import its model builders and scripts)."""
    if "bench" not in sys.modules:
        bench = Path(__file__).resolve().parents[1] / "bench"
        spec = importlib.util.spec_from_file_location("bench", bench / "__init__.py",
                                                      submodule_search_locations=[str(bench)])
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules["bench"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"bench.{module}")


def broken_error(registry: rlx.Registry, name: str) -> str:
    """The one broken-plugin error recorded for entry point ``name``."""
    errors = [error for ep, error in registry.broken() if ep == name]
    assert len(errors) == 1, registry.broken()
    return errors[0]
