"""The cpu backend's fused kernels on shapes the conformance kit's small cases never reach:
several blocks, a partial last block, blocks that fix leading axes, broadcast operands,
the output written over a dying input, and gemm epilogues over big outputs."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir.ops import OpKind
from rlx_core.testing._compare import mismatch

pytest.importorskip("rlx_cpu")
RNG = np.random.default_rng(7)


def check(g: rlx.Graph, feeds: dict[str, np.ndarray], *, want: OpKind) -> rlx.CompiledGraph:
    cg = rlx.compile(g, "cpu")
    assert any(n.op is want for n in cg._legal.nodes), cg.report()
    for i, (got, ref) in enumerate(zip(cg.run(feeds), reference.evaluate(g, feeds))):
        bad = mismatch(g.node(g.outputs[i]).dtype, got, ref, terms=8)
        assert bad is None, f"output {i}: {bad}"
    return cg


@pytest.mark.parametrize("shape", [(37, 1000), (3, 50, 700), (40000,), (2, 3)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_region_over_many_blocks_with_broadcast_operands(shape, dtype):
    g = rlx.Graph("blocks")
    x = g.input("x", shape, dtype)
    row = g.input("row", shape[-1:], dtype)
    col = g.input("col", (*shape[:-1], 1), dtype) if len(shape) > 1 else g.input("col", (1,), dtype)
    h = g.mul(g.add(x, row), col)
    h = g.sub(g.tanh(h), g.sigmoid(g.neg(x)))
    h = g.maximum(g.mul(h, h), g.gelu(x, approximate="tanh"))
    g.set_outputs([h])
    feeds = {name: RNG.uniform(-2, 2, g.input_node(name).shape).astype(dtype) for name in ("x", "row", "col")}
    check(g, feeds, want=OpKind.FUSED_ELEMENTWISE)


def test_region_over_an_intermediate_writes_in_place_and_handles_ints():
    g = rlx.Graph("inplace")
    x = g.input("x", (64, 700))
    t = g.matmul(x, g.param("w", RNG.standard_normal((700, 300)).astype(np.float32) / 30))  # a dying buffer
    out = g.sub(g.mul(g.tanh(t), 3.0), g.exp(g.neg(g.abs(t))))
    i = g.input("i", (50, 500), "int32")
    ints = g.maximum(g.sub(g.mul(i, i), 7), g.neg(i))
    g.set_outputs([out, ints])
    feeds = {"x": RNG.standard_normal((64, 700)).astype(np.float32),
             "i": RNG.integers(-50, 50, (50, 500)).astype(np.int32)}
    cg = check(g, feeds, want=OpKind.FUSED_ELEMENTWISE)
    assert cg._exe.plan_stats()["inplace"] >= 1
    feeds2 = {k: v.copy() for k, v in feeds.items()}
    cg.run(feeds2)
    for k in feeds:
        np.testing.assert_array_equal(feeds[k], feeds2[k])  # the caller's arrays are never written


def test_region_program_with_a_dead_instruction_and_a_where():
    g = rlx.Graph("file")
    x = g.input("x", (300, 90))
    y = g.input("y", (90,))
    cond = g.input("c", (300, 1), "bool")
    prog = (("add", (0, 1), ()), ("exp", (1,), ()), ("where", (2, 3, 0), ()))  # instruction 1 (exp) is dead
    fused = g.add_node("fused_elementwise", [x.id, y.id, cond.id], {"program": prog})
    g.set_outputs([fused])
    feeds = {"x": RNG.standard_normal((300, 90)).astype(np.float32), "y": RNG.standard_normal(90).astype(np.float32),
             "c": RNG.random((300, 1)) < 0.5}
    check(g, feeds, want=OpKind.FUSED_ELEMENTWISE)


@pytest.mark.parametrize("act", ["relu", "gelu", "sigmoid", "tanh"])
def test_gemm_epilogue_on_a_big_output(act):
    g = rlx.Graph("dense")
    x = g.input("x", (300, 128))
    y = g.add(g.matmul(x, g.param("w", RNG.standard_normal((128, 200)).astype(np.float32) / 10)),
              g.param("b", RNG.standard_normal(200).astype(np.float32)))
    g.set_outputs([getattr(g, act)(y)])
    cg = check(g, {"x": RNG.standard_normal((300, 128)).astype(np.float32)}, want=OpKind.GEMM)
    cg.set_param("b", np.zeros(200, np.float32))
    expected = reference.evaluate(g, {"x": np.ones((300, 128), np.float32)}, params={"b": np.zeros(200, np.float32)})
    np.testing.assert_allclose(cg.run({"x": np.ones((300, 128), np.float32)})[0], expected[0], rtol=1e-4, atol=1e-4)
