"""The interpreter's fused activation chains (``rlx_cpu/peephole.py``): which chains become
one instruction, which stay as they are, and that the fused instructions compute what the
chains do, NaN and infinities included."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import Graph, reference
from rlx_core.backends.registry import Registry
from rlx_cpu import native, regions
from rlx_cpu.backend import CpuBackend
from rlx_cpu.peephole import fuse_chains

# inputs 0: x, 1: a (scalar), 2: b (scalar), 3: the constant 1, 4: the constant 0, 5: a tensor
SCALARS = {1: 0.25, 2: 0.5, 3: 1.0, 4: 0.0}
CONSTANTS = {3: 1.0, 4: 0.0}


def fused(code: list[tuple[str, tuple[int, ...]]], constants: dict[int, float] = CONSTANTS) -> list[Any]:
    return fuse_chains(code, 6, SCALARS.get, constants.get)


HARD_SIGMOID = [("mul", (0, 1)), ("add", (6, 2)), ("min", (7, 3)), ("max", (8, 4))]


def test_hard_sigmoid_in_either_clamp_order_and_operand_order():
    assert fused(HARD_SIGMOID) == [("hardsigmoid", (0, 1, 2))]
    swapped = [("mul", (1, 0)), ("add", (2, 6)), ("max", (4, 7)), ("min", (3, 8))]
    assert fused(swapped) == [("hardsigmoid", (0, 1, 2))]


def test_hard_swish_and_silu():
    assert fused([*HARD_SIGMOID, ("mul", (0, 9))]) == [("hardswish", (0, 1, 2))]
    assert fused([*HARD_SIGMOID, ("mul", (9, 0))]) == [("hardswish", (0, 1, 2))]
    assert fused([("sigmoid", (0,)), ("mul", (6, 0))]) == [("silu", (0,))]
    # a chain inside a longer program: values after it are renumbered
    code = [("add", (0, 5)), ("sigmoid", (6,)), ("mul", (6, 7)), ("mul", (8, 1))]
    assert fused(code) == [("add", (0, 5)), ("silu", (6,)), ("mul", (7, 1))]


# GELU as torch's exporters write it below opset 20; inputs 1: sqrt(2) (or 1 / sqrt(2)),
# 2: the constant 1, 3: the constant 0.5 (float32, as the exporters store them)
GELU_CONSTANTS = {1: float(np.float32(np.sqrt(2.0))), 2: 1.0, 3: 0.5}
GELU = [("div", (0, 1)), ("erf", (6,)), ("add", (7, 2)), ("mul", (0, 8)), ("mul", (9, 3))]


def test_gelu_as_the_exporters_write_it():
    assert fused(GELU, GELU_CONSTANTS) == [("gelu", (0,))]
    half_first = [("div", (0, 1)), ("erf", (6,)), ("add", (2, 7)), ("mul", (0, 3)), ("mul", (9, 8))]
    assert fused(half_first, GELU_CONSTANTS) == [("gelu", (0,))]
    by_product = [("mul", (1, 0)), ("erf", (6,)), ("add", (7, 2)), ("mul", (8, 0)), ("mul", (3, 9))]
    assert fused(by_product, {**GELU_CONSTANTS, 1: float(np.float32(np.sqrt(0.5)))}) == [("gelu", (0,))]


@pytest.mark.parametrize("case", ["another divisor", "erf of another value", "an intermediate read again",
                                  "a scale that is a param"])
def test_gelu_like_chains_that_stay(case: str):
    code, constants = list(GELU), dict(GELU_CONSTANTS)
    if case == "another divisor":
        constants[1] = 2.0
    elif case == "erf of another value":
        code[3] = ("mul", (5, 8))
    elif case == "an intermediate read again":
        code.append(("add", (10, 7)))
    elif case == "a scale that is a param":
        del constants[3]
    assert fused(code, constants) == code


def test_a_power_by_one_scalar_reads_it_at_run_time():
    assert fused([("pow", (0, 1)), ("add", (6, 2))]) == [("pows", (0, 1)), ("add", (6, 2))]
    assert fused([("pow", (0, 5))]) == [("pow", (0, 5))]  # a tensor exponent: powf per element


@pytest.mark.parametrize("case", ["an intermediate read again", "bounds that are params", "a bound of 6",
                                  "a tensor scale", "the gate of another value", "the gate is the result"])
def test_chains_that_stay_as_they_are(case: str):
    code, constants = list(HARD_SIGMOID), CONSTANTS
    if case == "an intermediate read again":
        code.append(("add", (9, 7)))  # x * a + b read by the end too
    elif case == "bounds that are params":
        constants = {}
    elif case == "a bound of 6":
        constants = {3: 6.0, 4: 0.0}
    elif case == "a tensor scale":
        code[0] = ("mul", (0, 5))
    elif case == "the gate of another value":
        code = [("sigmoid", (0,)), ("mul", (6, 5))]
    elif case == "the gate is the result":
        code = [("sigmoid", (0,))]
    assert fused(code, constants) == code


def compile_cpu(g: Graph) -> rlx.CompiledGraph:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


def _programs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    seen: list[tuple[str, ...]] = []
    real = regions._compile

    def spy(*args: Any) -> Any:
        compiled = real(*args)
        seen.append(tuple(compiled.ops))
        return compiled

    monkeypatch.setattr(regions, "_compile", spy)
    return seen


ACTIVATIONS = {
    "hard-swish": lambda g, x: g.mul(x, g.maximum(g.minimum(g.add(g.mul(x, 1 / 6), 0.5), 1.0), 0.0)),
    "hard-sigmoid, the other clamp order": lambda g, x: g.minimum(g.maximum(g.add(g.mul(x, 0.2), 0.5), 0.0), 1.0),
    "silu": lambda g, x: g.mul(g.sigmoid(x), x),
    "gelu": lambda g, x: g.mul(g.mul(x, g.add(g.erf(g.div(x, np.float32(np.sqrt(2.0)))), 1.0)), 0.5),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_fused_instructions_compute_the_chains(native_lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                               name: str):
    """One instruction, and the reference's values (one fused multiply-add: within an
    ulp or two of the chain's two roundings; GELU's own erf: a few ulps), NaN and both
    infinities as the chain gives."""
    seen = _programs(monkeypatch)
    g = Graph(name)
    x = g.input("x", (4, 1000))
    g.set_outputs([ACTIVATIONS[name](g, x)])
    cg = compile_cpu(g)
    feed = np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32) * 6
    feed[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    (got,) = cg.run({"x": feed})
    assert any(p in [("hardswish",), ("hardsigmoid",), ("silu",), ("gelu",)] for p in seen), seen
    chains = [p for p in seen if len(p) > 1]  # (the one-op programs: MKL's vector math probes)
    assert not any(op in p for p in chains for op in ("min", "max", "sigmoid", "erf")), seen  # no chain left
    with np.errstate(invalid="ignore", over="ignore"):
        want = reference.evaluate(g, {"x": feed})[0]
    # (GELU: native.c's erf against the reference's; each is within 6e-7 of float64's
    # GELU over these values, the float32 chain's own error where erf nears -1)
    rtol, atol = (2e-6, 1e-6) if name == "gelu" else (1e-6, 1e-7)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


def test_a_bound_that_set_param_can_change_is_not_built_in(native_lib: native.Native,
                                                          monkeypatch: pytest.MonkeyPatch):
    """Before any ``set_param`` a param is the graph's own immutable value (borrowed:
    ``params.py``), as fixed as a constant, and may be built in; the first ``set_param``
    builds the executable again over owned copies, where the bound is read each run."""
    seen = _programs(monkeypatch)
    g = Graph("param-bound")
    x = g.input("x", (2, 500))
    top = g.param("top", np.ones((), np.float32))
    g.set_outputs([g.maximum(g.minimum(g.add(g.mul(x, 0.25), 0.5), top), 0.0)])
    cg = compile_cpu(g)
    feed = np.linspace(-8, 8, 1000, dtype=np.float32).reshape(2, 500)
    assert cg.run({"x": feed})[0].max() == np.float32(1.0)
    seen.clear()
    cg.set_param("top", np.full((), 0.75, np.float32))
    (got,) = cg.run({"x": feed})
    assert any("min" in p for p in seen) and not any("hardsigmoid" in p for p in seen), seen
    assert got.max() == np.float32(0.75)
    seen.clear()
    cg.set_param("top", np.full((), 0.5, np.float32))  # owned now: refilled in place, nothing built again
    assert cg.run({"x": feed})[0].max() == np.float32(0.5) and not seen


def test_a_power_whose_exponent_is_a_param_follows_set_param(native_lib: native.Native,
                                                             monkeypatch: pytest.MonkeyPatch):
    """torch's dynamo exports give GPT-2's gelu its 3.0 as an initializer (a param): one
    ``pows`` instruction, products for 2 and 3, powf otherwise, the exponent read each run."""
    seen = _programs(monkeypatch)
    g = Graph("param-power")
    x = g.input("x", (4, 700))
    g.set_outputs([g.pow(x, g.param("e", np.full((), 3.0, np.float32)))])
    cg = compile_cpu(g)
    feed = np.random.default_rng(1).standard_normal((4, 700)).astype(np.float32) * 3
    feed[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    for e in (3.0, 2.0, 0.5, 3.0):
        cg.set_param("e", np.full((), e, np.float32))
        x = np.abs(feed) if e == 0.5 else feed  # (libm and numpy differ on -inf ** 0.5)
        (got,) = cg.run({"x": x})
        with np.errstate(invalid="ignore"):
            want = np.power(x, np.float32(e))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert ("pows",) in seen, seen
