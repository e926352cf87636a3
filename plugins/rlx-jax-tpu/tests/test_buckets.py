"""Symbolic graphs on XLA through shape buckets (``compile_symbolic``): a new length inside
a bucket runs on the program already compiled, with the reference's values; ``buckets``
in the compile options picks the sizes or turns them off."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_core.ir.symbolic import Sym

pytest.importorskip("jax", reason="jax is not installed (pip install jax); the rlx-jax-tpu backends need it")


def encoder(rng: np.random.Generator) -> Graph:
    """Token embeddings, a position table sliced to the length, masked attention, a
    residual, layer norm, mean pooling over the tokens."""
    g = Graph("enc")
    ids = g.input("ids", ("batch", "seq"), "int64")
    keep = g.input("keep", ("batch", "seq"), "bool")
    w = {k: (rng.standard_normal(s) * 0.3).astype(np.float32)
         for k, s in {"emb": (40, 16), "pos": (128, 16), "qkv": (16, 48), "out": (16, 16)}.items()}
    h = g.add(g.gather(g.param("emb", w["emb"]), ids), g.slice(g.param("pos", w["pos"]), [0], [Sym("seq")], [0]))
    qkv = g.matmul(h, g.param("qkv", w["qkv"]))

    def heads(i: int) -> int:
        part = g.slice(qkv, [16 * i], [16 * i + 16], [2])
        return g.transpose(g.reshape(part, ("batch", "seq", 2, 8)), (0, 2, 1, 3))

    mask = g.reshape(keep, ("batch", 1, 1, "seq"))
    att = g.reshape(g.transpose(g.attention(heads(0), heads(1), heads(2), mask), (0, 2, 1, 3)), ("batch", "seq", 16))
    h = g.layer_norm(g.add(h, g.matmul(att, g.param("out", w["out"]))), g.param("ln", np.ones(16, np.float32)))
    g.set_outputs([g.reduce_mean(h, [1]), h])
    return g


def feeds(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    keep = np.ones((batch, seq), bool)
    keep[-1, seq // 2 + 1:] = False
    return {"ids": rng.integers(0, 40, (batch, seq)), "keep": keep}


def check(g: Graph, outs: list[np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    for out, ref in zip(outs, reference.evaluate(g, inputs)):
        assert out.shape == ref.shape
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def test_new_lengths_inside_a_bucket_run_with_no_compile(registry: Registry, rng: np.random.Generator) -> None:
    g = encoder(rng)
    cg = rlx.compile(g, device="jax", policy=rlx.DevicePolicy(), registry=registry)
    for batch, seq in ((2, 9), (2, 12), (1, 16), (2, 11), (1, 5), (1, 7)):
        inputs = feeds(rng, batch, seq)
        check(g, cg.run(inputs), inputs)
    # the executable for every size, then buckets (2, 16), (1, 16), (1, 8)
    assert cg.compiles == 4
    notes = cg.report().notes
    assert "buckets: seq padded to powers of two" in notes
    assert sum(n.startswith("bucket ") for n in notes) == 3, notes


def test_the_sizes_of_the_buckets_are_the_users_or_none(registry: Registry, rng: np.random.Generator) -> None:
    g = encoder(rng)
    opts = rlx.CompileOptions(extra={"buckets": {"seq": [12, 24], "batch": "exact"}})
    cg = rlx.compile(g, device="jax", policy=rlx.DevicePolicy(), registry=registry, options=opts)
    for batch, seq in ((2, 5), (2, 12), (2, 13), (3, 20)):
        inputs = feeds(rng, batch, seq)
        check(g, cg.run(inputs), inputs)
    notes = cg.report().notes
    assert "buckets: batch runs at its exact sizes" not in notes  # (exact by choice: not padded, not declined)
    assert [n.split(":")[0] for n in notes if n.startswith("bucket ")] == [
        "bucket batch=2, seq=12", "bucket batch=2, seq=24", "bucket batch=3, seq=24"]
    off = rlx.compile(g, device="jax", policy=rlx.DevicePolicy(), registry=registry,
                      options=rlx.CompileOptions(extra={"buckets": "off"}))
    for seq in (5, 6, 7):
        inputs = feeds(rng, 1, seq)
        check(g, off.run(inputs), inputs)
    assert not any(n.startswith("bucket") for n in off.report().notes)
    assert len(off.shapes()) == 3
