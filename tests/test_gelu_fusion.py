"""GELU as torch's exporters write it (the erf form, and the tanh form of GPT-2's
``gelu_new``) recognized as one ``gelu`` node, which the products' fusion then takes as a
dense layer's epilogue; left alone where an inner value has another reader, a constant is
another, or the backend does not claim ``gelu``; ``set_param`` of a scalar param the
fusion matched compiles again."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from support import registry_with

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir import Value
from rlx_core.ir.ops import OpKind
from rlx_core.passes import run_pipeline
from rlx_core.passes.gelu import fuse_gelu
from rlx_cpu import CpuBackend

RNG = np.random.default_rng(11)
SHAPE = (2, 5, 16)
ROOT2 = np.float32(math.sqrt(2.0))


def claim_all(node: object) -> bool:
    return True


def scalar(g: rlx.Graph, value: float, params: bool, name: str) -> Value:
    return g.param(name, np.array(value, np.float32)) if params else g.constant(np.float32(value))


#: The erf form in the orders the exporters write it: (x, scalar) -> x * 0.5 * (1 + erf(x / sqrt 2)).
ERF_FORMS: dict[str, Callable[[rlx.Graph, Value, Callable[[float, str], Value]], Value]] = {
    "classic: x / sqrt2, erf, + 1, * x, * 0.5": lambda g, x, c: g.mul(
        g.mul(x, g.add(g.erf(g.div(x, c(ROOT2, "root2"))), c(1.0, "one"))), c(0.5, "half")),
    "x * 0.5 first, then (erf + 1) on the left": lambda g, x, c: g.mul(
        g.add(c(1.0, "one"), g.erf(g.mul(x, c(1 / ROOT2, "inv_root2")))), g.mul(c(0.5, "half"), x)),
    "0.5 * ((1 + erf) * x)": lambda g, x, c: g.mul(
        c(0.5, "half"), g.mul(g.add(g.erf(g.div(x, c(ROOT2, "root2"))), c(1.0, "one")), x)),
}


def tanh_form(g: rlx.Graph, x: Value, c: Callable[[float, str], Value], cube: str) -> Value:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x ** 3))), the cube as ``cube`` says."""
    x3 = g.pow(x, c(3.0, "three")) if cube == "pow" else g.mul(g.mul(x, x), x)
    inner = g.mul(c(math.sqrt(2 / math.pi), "scale"), g.add(x, g.mul(c(0.044715, "k"), x3)))
    return g.mul(g.mul(c(0.5, "half"), x), g.add(c(1.0, "one"), g.tanh(inner)))


def mlp(form: Callable[[rlx.Graph, Value, Callable[[float, str], Value]], Value], params: bool = False) -> rlx.Graph:
    """A dense layer, its bias, the activation written as ``form``, a second dense layer."""
    g = rlx.Graph("mlp")
    x = g.input("x", SHAPE)
    h = g.add(g.matmul(x, g.param("w1", RNG.standard_normal((16, 32)).astype(np.float32) * 0.3)),
              g.param("b1", RNG.standard_normal(32).astype(np.float32)))
    a = form(g, h, lambda v, name: scalar(g, v, params, name))
    g.set_outputs([g.matmul(a, g.param("w2", RNG.standard_normal((32, 8)).astype(np.float32)))])
    return g


def feeds() -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal(SHAPE).astype(np.float32)}


def gelus(g: rlx.Graph) -> list:
    return [n for n in g.nodes if n.op is OpKind.GELU]


@pytest.mark.parametrize("form", list(ERF_FORMS))
def test_the_erf_form_becomes_one_gelu(form: str) -> None:
    g = mlp(ERF_FORMS[form])
    h, notes, folded = fuse_gelu(g, claim_all)
    (gelu,) = gelus(h)
    assert gelu.attrs["approximate"] == "none" and not folded and "gelu(none)" in notes[0]
    assert not any(n.op in (OpKind.ERF, OpKind.DIV) for n in h.nodes)
    assert [n.op for n in h.nodes].count(OpKind.MUL) == 0
    f = feeds()
    np.testing.assert_allclose(reference.evaluate(h, f)[0], reference.evaluate(g, f)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cube", ["pow", "products"])
def test_the_tanh_form_becomes_one_gelu(cube: str) -> None:
    g = mlp(lambda g, x, c: tanh_form(g, x, c, cube))
    h, _notes, _folded = fuse_gelu(g, claim_all)
    (gelu,) = gelus(h)
    assert gelu.attrs["approximate"] == "tanh"
    assert not any(n.op in (OpKind.TANH, OpKind.POW, OpKind.MUL) for n in h.nodes)
    f = feeds()
    np.testing.assert_allclose(reference.evaluate(h, f)[0], reference.evaluate(g, f)[0], rtol=1e-6, atol=1e-6)


def test_cpu_takes_the_gelu_into_the_dense_layer_and_recompiles_when_a_matched_param_changes() -> None:
    g = mlp(ERF_FORMS["classic: x / sqrt2, erf, + 1, * x, * 0.5"], params=True)
    cg = rlx.compile(g, device="cpu", registry=registry_with(CpuBackend()))
    report = str(cg.report())
    assert "into gelu(none)" in report and "into gemm(activation=gelu)" in report
    assert cg.absorbed_params == {"half", "one", "root2"}
    f = feeds()
    np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-5, atol=1e-5)
    new = {"half": np.array(0.25, np.float32)}  # no longer GELU: the chain's own value
    cg.set_param("half", new["half"])
    want = reference.evaluate(g, f, params=new)[0]
    np.testing.assert_allclose(cg.run(f)[0], want, rtol=1e-5, atol=1e-5)
    assert "compiled again" in str(cg.report())


def test_a_chain_with_an_inner_value_read_elsewhere_is_left_alone() -> None:
    g = rlx.Graph("shared")
    x = g.input("x", SHAPE)
    e = g.erf(g.div(x, ROOT2))
    g.set_outputs([g.mul(g.mul(x, g.add(e, 1.0)), 0.5), e])  # erf is an output too
    h, notes, _ = fuse_gelu(g, claim_all)
    assert not gelus(h) and not notes


@pytest.mark.parametrize("wrong", ["half", "root2", "other x"])
def test_a_near_miss_is_left_alone(wrong: str) -> None:
    g = rlx.Graph("near")
    x, y = g.input("x", SHAPE), g.input("y", SHAPE)
    half, root2 = (0.6 if wrong == "half" else 0.5), (1.5 if wrong == "root2" else ROOT2)
    g.set_outputs([g.mul(g.mul(y if wrong == "other x" else x, g.add(g.erf(g.div(x, root2)), 1.0)), half)])
    assert not gelus(fuse_gelu(g, claim_all)[0])


def test_a_backend_that_does_not_claim_gelu_keeps_the_chain() -> None:
    g = mlp(ERF_FORMS["classic: x / sqrt2, erf, + 1, * x, * 0.5"])
    h, notes, folded = fuse_gelu(g, lambda node: node.op is not OpKind.GELU)
    assert h is g and not notes and not folded


def test_the_pass_can_be_disabled() -> None:
    g = mlp(ERF_FORMS["classic: x / sqrt2, erf, + 1, * x, * 0.5"])
    reg = registry_with(CpuBackend())
    cg = rlx.compile(g, device="cpu", registry=reg, options=rlx.CompileOptions(disable=("gelu",)))
    assert "into gelu" not in str(cg.report())
    f = feeds()
    np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-5, atol=1e-5)


def conv1d_mlp(extra_reader: bool = False, act_is_output: bool = False) -> rlx.Graph:
    """GPT-2's dense layer as HF's Conv1D exports it: a 2-D product and bias between
    reshapes, the activation after the reshape back."""
    g = rlx.Graph("conv1d")
    x = g.input("x", SHAPE)
    flat = g.reshape(x, (SHAPE[0] * SHAPE[1], SHAPE[2]))
    h = g.add(g.matmul(flat, g.param("w1", RNG.standard_normal((16, 32)).astype(np.float32) * 0.3)),
              g.param("b1", RNG.standard_normal(32).astype(np.float32)))
    back = g.reshape(h, (SHAPE[0], SHAPE[1], 32))
    a = g.gelu(back, approximate="tanh")
    outs = [g.matmul(a, g.param("w2", RNG.standard_normal((32, 8)).astype(np.float32)))]
    outs += [back] if extra_reader else []
    outs += [a] if act_is_output else []
    g.set_outputs(outs)
    return g


@pytest.mark.parametrize("case", ["moved", "reshape read elsewhere", "activation an output"])
def test_an_activation_read_through_a_reshape_goes_into_the_dense_layer(case: str) -> None:
    """The hoist pass moves the gelu above the reshape (``passes/hoist.py``) where the
    reshape and the product have no other reader and the gelu is not an output; the dense
    layer then takes it."""
    g = conv1d_mlp(extra_reader=case == "reshape read elsewhere", act_is_output=case == "activation an output")
    cg = rlx.compile(g, device="cpu", registry=registry_with(CpuBackend()))
    report = str(cg.report())
    assert ("above the reshape" in report and "into gemm(activation=gelu_tanh)" in report) is (case == "moved")
    f = feeds()
    for got, want in zip(cg.run(f), reference.evaluate(g, f), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_symbolic_graph_gets_the_gelu_at_every_size() -> None:
    """The matching reads no sizes: a graph with a symbolic batch has its chain fused in the
    graph lowered once, and every size runs it (as the reference)."""
    g = rlx.Graph("symbolic")
    x = g.input("x", ("batch", 16), "float32")
    h = g.add(g.matmul(x, g.param("w", RNG.standard_normal((16, 32)).astype(np.float32))),
              g.param("b", RNG.standard_normal(32).astype(np.float32)))
    chain = ERF_FORMS["classic: x / sqrt2, erf, + 1, * x, * 0.5"]
    g.set_outputs([chain(g, h, lambda v, name: scalar(g, v, False, name))])
    lowered = run_pipeline(g, CpuBackend().claims).graph
    assert [n.attrs["activation"] for n in lowered.nodes if n.op is OpKind.GEMM] == ["gelu"]
    cg = rlx.compile(g, device="cpu", registry=registry_with(CpuBackend()))
    for batch in (1, 3, 8):
        f = {"x": RNG.standard_normal((batch, 16)).astype(np.float32)}
        np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-5, atol=1e-5)
