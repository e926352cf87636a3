"""``fuse_attention``: exported attention chains become one ``attention`` node, exactly."""

from __future__ import annotations

import numpy as np
import pytest
from support import registry_with

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir.ops import OpKind
from rlx_core.passes import run_pipeline
from rlx_core.passes.attention import fuse_attention
from rlx_cpu import CpuBackend

RNG = np.random.default_rng(11)
B, H, L, D = 2, 3, 5, 8


def claim_all(node) -> bool:
    return True


def ops_of(g: rlx.Graph) -> list[str]:
    return [n.op.value for n in g.nodes if n.op not in (OpKind.INPUT, OpKind.PARAM, OpKind.CONSTANT)]


def exported(scale: str = "div8", mask: bool = False, softmax_is_output: bool = False) -> rlx.Graph:
    """Attention as torch.onnx writes it: heads split by reshape + transpose, k transposed
    to (.., D, L) by the same transpose, the scores scaled, softmax, times v."""
    g = rlx.Graph("attn")
    qkv = [g.input(n, (B, L, H * D)) for n in "qkv"]
    q, k, v = (g.reshape(t, (B, L, H, D)) for t in qkv)
    q, v = g.transpose(q, (0, 2, 1, 3)), g.transpose(v, (0, 2, 1, 3))
    kt = g.transpose(k, (0, 2, 3, 1))
    s = g.matmul(q, kt)
    if scale == "div8":
        s = g.div(s, g.constant(np.float32(8.0)))
    elif scale == "mul":
        s = g.mul(g.constant(np.float32(0.3)), s)
    elif scale == "div3":
        s = g.div(s, g.constant(np.float32(3.0)))
    elif scale == "param8":
        s = g.div(s, g.param("sqrt_d", np.array(8.0, np.float32)))
    if mask:
        s = g.add(s, g.input("mask", (1, 1, L, L)))
    p = g.softmax(s, axis=-1)
    out = g.matmul(p, v)
    g.set_outputs([out, p] if softmax_is_output else [out])
    return g


def feeds(g: rlx.Graph) -> dict[str, np.ndarray]:
    f = {n: RNG.standard_normal((B, L, H * D)).astype(np.float32) for n in "qkv"}
    if any(g.node(i).name == "mask" for i in g.inputs):
        f["mask"] = np.triu(np.full((L, L), -np.inf, np.float32), k=1)[None, None]  # causal
    return f


@pytest.mark.parametrize(("scale", "want"), [("div8", 0.125), ("mul", np.float32(0.3)), ("none", 1.0)])
@pytest.mark.parametrize("mask", [False, True])
def test_chain_becomes_attention_with_the_same_results(scale: str, want: float, mask: bool) -> None:
    g = exported(scale, mask)
    h, notes, _ = fuse_attention(g, claim_all)
    att = [n for n in h.nodes if n.op is OpKind.ATTENTION]
    assert len(att) == 1 and att[0].attrs["scale"] == pytest.approx(float(want), rel=0, abs=0)
    assert (len(att[0].inputs) == 4) is mask
    assert "softmax" not in ops_of(h) and ops_of(h).count("transpose") == 3  # kT's transpose merged into k's
    assert "into attention" in notes[0]
    f = feeds(g)
    for a, b in zip(reference.evaluate(g, f), reference.evaluate(h, f)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def split_heads(g: rlx.Graph, batched_kt: bool) -> tuple[object, object, object]:
    """q, kT and v of heads split by reshape + transpose; kT as torch.onnx's classic
    exporter writes it (one transpose of k's reshape) or as the dynamo exporter writes
    ``k.transpose(-2, -1)`` before a 3-D product (k's heads merged into one batch axis,
    transposed, split again)."""
    qkv = [g.input(n, (B, L, H * D)) for n in "qkv"]
    q, k, v = (g.transpose(g.reshape(t, (B, L, H, D)), (0, 2, 1, 3)) for t in qkv)
    if batched_kt:
        kt = g.reshape(g.transpose(g.reshape(k, (B * H, L, D)), (0, 2, 1)), (B, H, D, L))
    else:
        kt = g.transpose(k, (0, 1, 3, 2))
    return q, kt, v


@pytest.mark.parametrize("batched_kt", [False, True])
def test_sdpas_two_factors_without_the_guard_become_the_scale(batched_kt: bool) -> None:
    """``(q * c) @ (kT * c)``, SDPA's ``sqrt(1 / sqrt(D))`` on each side as transformers'
    exports write it without the isnan guard (BERT at opset 17): one scale ``c * c``, no
    multiplication left, and kT read as k (its transpose merged into k's, or, batched,
    k itself: no transpose left for it)."""
    g = rlx.Graph("sdpa")
    q, kt, v = split_heads(g, batched_kt)
    c = g.constant(np.float32(1 / np.sqrt(np.sqrt(D))))
    s = g.add(g.matmul(g.mul(q, c), g.mul(kt, c)), g.input("mask", (1, 1, L, L)))
    g.set_outputs([g.matmul(g.softmax(s, axis=-1), v)])
    h, notes, folded = fuse_attention(g, claim_all)
    (att,) = [n for n in h.nodes if n.op is OpKind.ATTENTION]
    assert att.attrs == {"scale": pytest.approx(1 / np.sqrt(D), rel=1e-6)} and not folded
    assert "matmul + mul + mul + add + softmax" in notes[0]
    assert "mul" not in ops_of(h) and "softmax" not in ops_of(h)
    assert ops_of(h).count("transpose") == 3 and h.node(att.inputs[1]).op is OpKind.TRANSPOSE
    f = feeds(g)
    np.testing.assert_allclose(reference.evaluate(h, f)[0], reference.evaluate(g, f)[0], rtol=1e-5, atol=1e-6)


def test_the_dynamo_exporters_batched_kt_is_read_as_k() -> None:
    """kT made by merging k's heads, transposing and splitting them again is k with its
    last two axes swapped: the attention node reads k's own transpose (one transpose for
    k where the chain had it, its kT turned back cost two more), and runs as before; a
    reshape that does not split the heads back the same way is left as it is."""
    g = rlx.Graph("attn")
    q, kt, v = split_heads(g, batched_kt=True)
    g.set_outputs([g.matmul(g.softmax(g.div(g.matmul(q, kt), g.constant(np.float32(8.0))), axis=-1), v)])
    h, notes, _ = fuse_attention(g, claim_all)
    (att,) = [n for n in h.nodes if n.op is OpKind.ATTENTION]
    k = h.node(att.inputs[1])
    assert k.op is OpKind.TRANSPOSE and k.attrs["perm"] == (0, 2, 1, 3) and h.node(k.inputs[0]).op is OpKind.RESHAPE
    assert ops_of(h).count("transpose") == 3 and "into attention" in notes[0]
    f = feeds(g)
    np.testing.assert_allclose(reference.evaluate(h, f)[0], reference.evaluate(g, f)[0], rtol=1e-6, atol=1e-7)
    g2 = rlx.Graph("attn")  # kT's heads split back in the other order: not k's transpose
    q, k3, v = split_heads(g2, batched_kt=False)
    kt2 = g2.reshape(g2.transpose(g2.reshape(g2.transpose(k3, (0, 1, 3, 2)), (B * H, D, L)), (0, 2, 1)), (H, B, D, L))
    g2.set_outputs([g2.matmul(g2.softmax(g2.matmul(g2.reshape(q, (H, B, L, D)), kt2), axis=-1),
                              g2.reshape(v, (H, B, L, D)))])
    h2, _, _ = fuse_attention(g2, claim_all)
    (att2,) = [n for n in h2.nodes if n.op is OpKind.ATTENTION]
    assert h2.node(att2.inputs[1]).op is OpKind.TRANSPOSE and h2.node(h2.node(att2.inputs[1]).inputs[0]).op is \
        OpKind.RESHAPE and h2.node(h2.node(att2.inputs[1]).inputs[0]).shape == (H, B, D, L)
    f2 = feeds(g2)
    np.testing.assert_allclose(reference.evaluate(h2, f2)[0], reference.evaluate(g2, f2)[0], rtol=1e-6, atol=1e-7)


def test_inexact_scales_and_shared_values_are_left_alone() -> None:
    for g in (exported("div3"), exported(softmax_is_output=True)):
        h, notes, _ = fuse_attention(g, claim_all)
        assert not notes and ops_of(h) == ops_of(g)


def test_a_param_scale_moves_onto_q_and_set_param_still_works() -> None:
    g = exported("param8")
    h, notes, _ = fuse_attention(g, claim_all)
    assert "moved onto q" in notes[0] and ops_of(h).count("div") == 1
    div = next(n for n in h.nodes if n.op is OpKind.DIV)
    assert h.node(div.inputs[1]).op is OpKind.PARAM and h.node(div.inputs[0]).shape == (B, H, L, D)
    reg = registry_with(CpuBackend())  # the real cpu backend
    cg = rlx.compile(g, device="cpu", registry=reg)
    assert "into attention" in str(cg.report())
    f = feeds(g)
    np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-5, atol=1e-6)
    cg.set_param("sqrt_d", np.array(2.0, np.float32))
    want = reference.evaluate(g, f, params={"sqrt_d": np.array(2.0, np.float32)})[0]
    np.testing.assert_allclose(cg.run(f)[0], want, rtol=1e-5, atol=1e-6)


def test_only_for_backends_that_claim_attention_and_can_be_disabled() -> None:
    g = exported()
    h, notes, _ = fuse_attention(g, lambda n: n.op is not OpKind.ATTENTION)
    assert h is g and not notes
    opts = rlx.CompileOptions(disable=("attention",))
    assert "attention" not in ops_of(run_pipeline(g, claim_all, opts).graph)
    assert "attention" in ops_of(run_pipeline(g, claim_all).graph)


@pytest.mark.parametrize("mask_kind", ["bool", "float", "row"])
def test_cpu_attention_kernel_with_masks_and_no_keys(mask_kind: str) -> None:
    """The cpu kernel holds the scores transposed: masks of every broadcast shape line up."""
    g = rlx.Graph("att")
    q = g.input("q", (2, 4, 6))
    k = g.input("k", (2, 7, 6))
    v = g.input("v", (2, 7, 3))
    shape, dtype = {"bool": ((4, 7), "bool"), "float": ((2, 1, 7), "float32"), "row": ((7,), "float32")}[mask_kind]
    m = g.input("m", shape, dtype)
    g.set_outputs([g.attention(q, k, v, m, scale=0.5)])
    sizes = {"q": (2, 4, 6), "k": (2, 7, 6), "v": (2, 7, 3)}
    f = {n: RNG.standard_normal(s).astype(np.float32) for n, s in sizes.items()}
    f["m"] = (RNG.random(shape) > 0.3) if dtype == "bool" else RNG.standard_normal(shape).astype(np.float32)
    if dtype == "bool":
        f["m"][:, 0] = True  # every query sees a key
    cg = rlx.compile(g, device="cpu", registry=registry_with(CpuBackend()))
    np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-5, atol=1e-6)
    e = rlx.Graph("empty")
    e.set_outputs([e.attention(e.input("q", (3, 4)), e.input("k", (0, 4)), e.input("v", (0, 2)))])
    got = rlx.compile(e, device="cpu", registry=registry_with(CpuBackend())).run(
        {"q": np.ones((3, 4), np.float32), "k": np.ones((0, 4), np.float32), "v": np.ones((0, 2), np.float32)})
    np.testing.assert_array_equal(got[0], reference.evaluate(e, {"q": np.ones((3, 4), np.float32),
                                  "k": np.ones((0, 4), np.float32), "v": np.ones((0, 2), np.float32)})[0])
