"""Symbolic graphs on OpenCL through shape buckets (``compile_symbolic``): a new length
inside a bucket runs on the kernels already built, with the reference's values."""

from __future__ import annotations

import numpy as np

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir import Graph
from rlx_core.ir.symbolic import Sym
from rlx_opencl import OpenclBackend


def block(rng: np.random.Generator) -> Graph:
    """A masked attention block over (batch, seq): projections (fused with their bias and
    activation by the pipeline), attention written out, layer norm, mean over the tokens."""
    g = Graph("block")
    x = g.input("x", ("batch", "seq", 8))
    keep = g.input("keep", ("batch", "seq"), "bool")
    w = {k: (rng.standard_normal((8, 8)) * 0.4).astype(np.float32) for k in ("q", "k", "v")}
    q, k, v = (g.relu(g.add(g.matmul(x, g.param(n, w[n])), g.param(f"b{n}", np.full(8, 0.1, np.float32))))
               for n in ("q", "k", "v"))
    scores = g.matmul(q, g.transpose(k, (0, 2, 1)))
    mask = g.reshape(keep, (Sym("batch"), 1, Sym("seq")))
    probs = g.softmax(g.where(mask, scores, g.constant(np.float32(-1e9))), -1)
    h = g.layer_norm(g.add(x, g.matmul(probs, v)), g.param("ln", np.ones(8, np.float32)))
    g.set_outputs([g.reduce_mean(h, [1]), h])
    return g


def test_new_lengths_inside_a_bucket_build_no_program(backend: OpenclBackend) -> None:
    rng = np.random.default_rng(3)
    g = block(rng)
    reg = rlx.Registry(entry_points=[], environ={})
    reg.register(backend)
    cg = rlx.compile(g, device="opencl", policy=rlx.DevicePolicy(), registry=reg)
    for batch, seq in ((2, 5), (2, 7), (1, 6), (2, 8), (1, 3)):
        keep = np.ones((batch, seq), bool)
        keep[-1, seq // 2 + 1:] = False
        inputs = {"x": rng.standard_normal((batch, seq, 8)).astype(np.float32), "keep": keep}
        for out, ref in zip(cg.run(inputs), reference.evaluate(g, inputs)):
            assert out.shape == ref.shape
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    notes = cg.report().notes
    assert [n.split(":")[0] for n in notes if n.startswith("bucket ")] == [
        "bucket batch=2, seq=8", "bucket batch=1, seq=8", "bucket batch=1, seq=4"]
    assert cg.compiles == 4  # the executable for every size, three buckets
