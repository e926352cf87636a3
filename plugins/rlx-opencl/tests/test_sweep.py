"""Every kernel family of rlx-opencl over awkward sizes, against the float64 reference.

Sizes 1, 7, 127 (below, between and past the vector widths and the matmul's row blocks),
64 and 1024 (exact multiples), and 2048 in one or two dimensions of a case: the tails of
the vector loops, the row and column remainders of the register blocks, broadcast
batches and work-group sizes chosen for grids that are prime, tiny or long. One graph
per family, so one program build each: the file runs in well under a minute on PoCL.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

import rlx_core
from rlx_core import reference
from rlx_core.ir import Value
from rlx_core.plugin import CompileOptions
from rlx_opencl import OpenclBackend
from rlx_opencl.executable import OpenclExecutable

pytest.importorskip("pyopencl", reason="pyopencl is not installed")

#: float32 accumulation error per term summed, on values of magnitude about 1.
_PER_TERM = 5e-7


class Sweep:
    """One graph of many cases of a family: inputs drawn from U(-1, 1), outputs labelled
    with their case and given an absolute tolerance that grows with the terms summed."""

    def __init__(self, name: str) -> None:
        self.graph = rlx_core.Graph(name)
        self.inputs: dict[str, np.ndarray] = {}
        self.cases: list[tuple[str, float]] = []
        self._outputs: list[Value] = []
        self._rng = np.random.default_rng(len(name))

    def input(self, shape: tuple[int, ...]) -> Value:
        name = f"x{len(self.inputs)}"
        self.inputs[name] = self._rng.uniform(-1.0, 1.0, shape).astype(np.float32)
        return self.graph.input(name, shape)

    def output(self, label: str, value: Value, terms: int = 1) -> None:
        self._outputs.append(value)
        self.cases.append((f"{label} -> {value.shape}", 1e-5 + _PER_TERM * terms))

    def compile(self, backend: OpenclBackend) -> OpenclExecutable:
        self.graph.set_outputs(self._outputs)
        return backend.compile(self.graph.freeze(), CompileOptions(device="opencl"))

    def check(self, backend: OpenclBackend) -> None:
        """Every case within tolerance of the reference, every launch a uniform grid."""
        exe = self.compile(backend)
        for name, size, local in exe.launch_sizes:
            assert all(g % n == 0 for g, n in zip(size, local)), f"{name}: local {local} does not divide {size}"
        got = exe.run(self.inputs)
        want = reference.evaluate(self.graph, self.inputs)
        failures = []
        for (label, atol), a, b in zip(self.cases, got, want):
            if a.shape != b.shape:
                failures.append(f"{label}: shape {a.shape}")
            elif not np.allclose(a.astype(np.float64), b, rtol=1e-4, atol=atol):
                failures.append(f"{label}: max error {np.max(np.abs(a - b)):.3g} (atol {atol:.3g})")
        assert not failures, "\n".join(failures)


def matmul_nn(s: Sweep) -> None:
    for m, k, n in [(1, 1, 1), (7, 7, 7), (1, 64, 127), (127, 7, 64), (64, 127, 1), (7, 1024, 7),
                    (1024, 7, 127), (127, 127, 1024), (2048, 64, 7), (7, 64, 2048), (64, 2048, 64),
                    (1024, 64, 1024)]:
        s.output(f"[{m},{k}] @ [{k},{n}]", s.graph.matmul(s.input((m, k)), s.input((k, n))), k)


def matmul_nt(s: Sweep) -> None:
    """``matmul(q, transpose(k))``: B given as ``[N, K]``, read in the fused NT form."""
    for m, k, n in [(1, 1, 1), (7, 7, 7), (1, 127, 64), (127, 7, 1), (64, 64, 127), (7, 2048, 7),
                    (127, 1024, 64), (2048, 16, 7), (7, 33, 2048)]:
        b = s.input((n, k))
        s.output(f"[{m},{k}] @ [{n},{k}]^T", s.graph.matmul(s.input((m, k)), s.graph.transpose(b)), k)


def matmul_batched(s: Sweep) -> None:
    g = s.graph
    for a, b in [((3, 7, 64), (64, 127)), ((7, 64), (2, 64, 127)), ((2, 1, 7, 33), (3, 33, 5)),
                 ((1, 127, 7), (4, 7, 64)), ((64,), (64, 127)), ((7, 64), (64,)), ((3, 7, 64), (64,)),
                 ((2, 1024, 1), (1, 1, 7))]:
        s.output(f"{a} @ {b}", g.matmul(s.input(a), s.input(b)), a[-1])
    for q, k in [((2, 3, 127, 64), (2, 3, 7, 64)), ((4, 7, 16), (1, 64, 16)), ((1, 1, 1), (5, 1, 1))]:
        kt = g.transpose(s.input(k), (*range(len(k) - 2), len(k) - 1, len(k) - 2))
        s.output(f"{q} @ {k}^T", g.matmul(s.input(q), kt), q[-1])


def conv2d(s: Sweep) -> None:
    g = s.graph
    cases: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, object], bool]] = [
        ((1, 1, 1, 1), (1, 1, 1, 1), {}, False),
        ((2, 3, 7, 7), (8, 3, 3, 3), {"padding": 1}, True),
        ((1, 4, 127, 64), (7, 4, 3, 3), {"stride": 2, "padding": 1}, True),
        ((2, 8, 15, 15), (6, 4, 3, 3), {"groups": 2, "dilation": 2, "padding": (1, 2)}, False),
        ((1, 64, 7, 7), (127, 64, 1, 1), {}, True),  # 1x1, stride 1: no im2col
        ((1, 3, 64, 64), (16, 3, 7, 7), {"stride": 2, "padding": 3}, False),
        ((1, 2, 1, 1024), (3, 2, 1, 7), {"padding": (0, 3, 0, 2)}, True),
    ]
    for x, w, kwargs, bias in cases:
        b = s.input((w[0],)) if bias else None
        terms = w[1] * w[2] * w[3]
        s.output(f"conv2d {x} * {w} {kwargs} bias={bias}", g.conv2d(s.input(x), s.input(w), b, **kwargs), terms)


def pools(s: Sweep) -> None:
    g = s.graph
    for x, kwargs in [((2, 3, 7, 7), {"kernel": 3, "stride": 2, "padding": 1}), ((1, 1, 127, 64), {"kernel": 2}),
                      ((1, 4, 64, 64), {"kernel": 3, "stride": 1, "padding": 1, "dilation": 2}),
                      ((1, 2, 7, 7), {"kernel": 2, "stride": 2, "ceil_mode": True}),
                      ((1, 1, 1, 1), {"kernel": 1})]:
        s.output(f"max_pool2d {x} {kwargs}", g.max_pool2d(s.input(x), **kwargs))
    for x, kwargs in [((2, 3, 7, 7), {"kernel": 3, "stride": 2, "padding": 1, "count_include_pad": True}),
                      ((2, 3, 7, 7), {"kernel": 3, "stride": 2, "padding": 1}),
                      ((1, 1, 127, 64), {"kernel": (7, 1)}),
                      ((1, 2, 7, 7), {"kernel": 2, "stride": 2, "ceil_mode": True}),
                      ((1, 1, 1, 1), {"kernel": 1})]:
        window = math.prod(np.atleast_1d(kwargs["kernel"]))
        s.output(f"avg_pool2d {x} {kwargs}", g.avg_pool2d(s.input(x), **kwargs), window)
    for x in [(1, 1, 1, 1), (2, 7, 127, 3), (1, 64, 7, 7), (1, 3, 64, 127)]:
        s.output(f"global_avg_pool2d {x}", g.global_avg_pool2d(s.input(x)), x[2] * x[3])


def reductions(s: Sweep) -> None:
    g = s.graph
    ops = {"sum": g.reduce_sum, "max": g.reduce_max, "mean": g.reduce_mean}
    cases = [((1,), 0, False), ((7,), 0, False), ((127, 64), 0, False), ((127, 64), 1, True),
             ((127, 64), (0, 1), False), ((3, 7, 127), 1, False), ((3, 7, 127), (0, 2), True),
             ((3, 7, 127), -1, False), ((2048, 7), 0, False), ((7, 2048), -1, False),
             ((1, 1024, 1), None, False)]
    for op, fn in ops.items():
        for shape, axes, keepdims in cases:
            x = s.input(shape)
            terms = shape[axes] if isinstance(axes, int) else math.prod(shape)
            s.output(f"reduce_{op} {shape} axes={axes} keepdims={keepdims}", fn(x, axes, keepdims), terms)


def softmax(s: Sweep) -> None:
    for shape, axis in [((1,), -1), ((7, 127), -1), ((7, 127), 0), ((3, 64, 7), 1), ((2048, 64), -1),
                        ((1, 1024), -1), ((64, 2048), -1)]:
        s.output(f"softmax {shape} axis={axis}", s.graph.softmax(s.input(shape), axis), shape[axis])


def layer_norm(s: Sweep) -> None:
    g = s.graph
    for shape, axis, scale, bias in [((7, 127), -1, (127,), (127,)), ((3, 7, 64), 1, (7, 64), None),
                                     ((2048, 64), -1, (64,), (64,)), ((1, 1), -1, (1,), (1,)),
                                     ((4, 127), -1, (1,), None), ((2, 1024), 1, (1024,), (1024,))]:
        terms = math.prod(shape[axis:])
        y = g.layer_norm(s.input(shape), s.input(scale), s.input(bias) if bias else None, axis=axis)
        s.output(f"layer_norm {shape} axis={axis} scale={scale} bias={bias}", y, terms)


FAMILIES: dict[str, Callable[[Sweep], None]] = {
    "matmul_nn": matmul_nn,
    "matmul_nt": matmul_nt,
    "matmul_batched": matmul_batched,
    "conv2d": conv2d,
    "pools": pools,
    "reductions": reductions,
    "softmax": softmax,
    "layer_norm": layer_norm,
}


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_the_reference(backend, family):
    sweep = Sweep(family)
    FAMILIES[family](sweep)
    sweep.check(backend)


def test_nt_cases_are_fused(backend):
    """The NT sweep exercises the transposed matmul kernel, not a transpose and an NN one."""
    sweep = Sweep("nt_fused")
    matmul_nt(sweep)
    exe = sweep.compile(backend)
    assert not any(step.node.op == "transpose" for step in exe.plan.steps)
