"""Property tests of the compile pipeline: random graphs, every stage and pass on and off.

Each drawn graph (elementwise chains with broadcast operands, neutral constants, repeated
subexpressions, constant-only subgraphs, reshape and transpose chains, dense layers) is
compiled with one option set; the graph the backend receives must compute what the
user's graph computes (both through the reference), and the cpu backend must match
the reference on it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ALL_OPS, ToyBackend

import rlx_core as rlx
from rlx_core import reference
from rlx_core.passes import PASS_NAMES, run_pipeline
from rlx_core.testing._compare import mismatch

FUSING = ToyBackend("fusing", ops=ALL_OPS | {"gemm", "fused_elementwise"})
PLAIN = ToyBackend("plain", ops=ALL_OPS)
VARIANTS = {
    "all": rlx.CompileOptions(),
    "no-optimize": rlx.CompileOptions(optimize=False),
    "no-fuse": rlx.CompileOptions(fuse=False),
    "no-plan": rlx.CompileOptions(plan=False),
    "nothing": rlx.CompileOptions(optimize=False, fuse=False, plan=False),
    "small-regions": rlx.CompileOptions(max_fused_ops=3, max_fused_inputs=2),
    **{f"no-{p}": rlx.CompileOptions(disable=(p,)) for p in PASS_NAMES},
}
SHAPES = [(4, 6), (6,), (1, 6), ()]
UNARY = ["tanh", "sigmoid", "relu", "neg", "abs", "gelu", "exp_tanh"]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]
NEUTRAL = [0.0, -0.0, 1.0, 0.5, 2.0]


@st.composite
def graphs(draw) -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    g = rlx.Graph("random")
    x = g.input("x", (4, 6))
    b = g.input("b", (6,))
    values = [x, b, g.param("p", rng.uniform(-1, 1, (1, 6)).astype(np.float32))]
    for _ in range(draw(st.integers(2, 12))):
        kind = draw(st.sampled_from(["unary", "binary", "const", "dup", "dense", "reshape", "transpose", "folded"]))
        v = draw(st.sampled_from(values))
        if kind in ("dense", "reshape", "transpose"):
            v = draw(st.sampled_from([u for u in values if u.shape == (4, 6)]))
        if kind == "unary":
            op = draw(st.sampled_from(UNARY))
            values.append(g.exp(g.tanh(v)) if op == "exp_tanh" else getattr(g, op)(v))
        elif kind == "binary":
            w = draw(st.sampled_from(values))
            values.append(getattr(g, draw(st.sampled_from(BINARY)))(v, w))
        elif kind == "const":
            c = g.constant(np.full(draw(st.sampled_from(SHAPES)), draw(st.sampled_from(NEUTRAL)), np.float32))
            values.append(getattr(g, draw(st.sampled_from(["add", "mul", "sub"])))(v, c))
        elif kind == "dup":  # the same expression twice: one for cse
            op = draw(st.sampled_from(["tanh", "relu"]))
            values.append(g.add(getattr(g, op)(v), getattr(g, op)(v)))
        elif kind == "dense":
            w = g.param(f"w{len(g)}", (rng.standard_normal((6, 6)) / 3).astype(np.float32))
            h = g.add(g.matmul(v, w), g.param(f"c{len(g)}", rng.uniform(-1, 1, 6).astype(np.float32)))
            values.append(getattr(g, draw(st.sampled_from(["relu", "gelu", "tanh", "sigmoid"])))(h))
        elif kind == "reshape":
            values.append(g.reshape(g.reshape(v, (24,)), (4, 6)))
        elif kind == "transpose":
            values.append(g.transpose(g.exp(g.transpose(g.tanh(v)))))
        elif kind == "folded":  # a subgraph of constants only
            c = g.constant(rng.uniform(-1, 1, 6).astype(np.float32))
            values.append(g.mul(v, g.tanh(g.add(c, 1.0))))
    picks = draw(st.lists(st.integers(3, len(values) - 1), min_size=0, max_size=2)) if len(values) > 3 else []
    g.set_outputs([values[-1], *(values[i] for i in picks)])
    feeds = {"x": rng.uniform(-2, 2, (4, 6)).astype(np.float32), "b": rng.uniform(-2, 2, 6).astype(np.float32)}
    return g, feeds


def _close(got: list[np.ndarray], ref: list[np.ndarray], dtypes: list[str], what: str) -> None:
    for i, (a, r, dt) in enumerate(zip(got, ref, dtypes)):
        bad = mismatch(dt, a, r, terms=6)
        assert bad is None, f"{what}: output {i}: {bad}"


@settings(max_examples=25, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=graphs(), variant=st.sampled_from(sorted(VARIANTS)))
def test_pipeline_keeps_the_reference_result(case, variant):
    g, feeds = case
    options = VARIANTS[variant]
    expected = reference.evaluate(g, feeds)
    for backend in (FUSING, PLAIN):
        result = run_pipeline(g, backend.claims, options)
        assert result.supported
        got = reference.evaluate(result.graph, feeds)
        for a, r in zip(got, expected):
            np.testing.assert_allclose(a, r, rtol=2e-6, atol=2e-6, err_msg=f"{variant} on {backend.name}")
        assert [result.graph.node(i).name for i in result.graph.inputs] == ["x", "b"]
        assert {result.graph.node(i).name for i in result.graph.params} == {g.node(i).name for i in g.params}


@settings(max_examples=20, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=graphs(), variant=st.sampled_from(["all", "no-fuse", "no-optimize", "small-regions", "no-gemm"]))
def test_cpu_runs_the_pipelines_graph_like_the_reference(case, variant):
    pytest.importorskip("rlx_cpu")
    g, feeds = case
    cg = rlx.compile(g, "cpu", options=VARIANTS[variant])
    dtypes = [g.node(i).dtype for i in g.outputs]
    _close(cg.run(feeds), reference.evaluate(g, feeds), dtypes, variant)
    params = {name: np.asarray(g.value(g.input_node(name).id)) * 0.5 for name in ("p",)}
    cg.set_param("p", params["p"].astype(np.float32))
    _close(cg.run(feeds), reference.evaluate(g, feeds, params=params), dtypes, f"{variant} after set_param")
