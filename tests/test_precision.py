"""``CompileOptions.precision`` (``docs/precision.md``): the permission to compute float32
products with reduced-precision operands, what the core does with it (passes it to the
backend, says in the report whether the device took it, keeps measured picks apart per
precision) and the conformance kit's check of a backend that declares one.

The toy backends compute through the reference interpreter; the rounding one rounds every
float32 operand to bfloat16 first (round to nearest even), as bf16 hardware does."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import pytest
from support import ToyBackend

import rlx_core as rlx
from rlx_core.errors import ConfigError
from rlx_core.placement.measured import Verdicts
from rlx_core.testing import check_backend
from rlx_core.testing._precision import product_bound


def to_bf16(x: np.ndarray, mantissa_bits: int = 7) -> np.ndarray:
    """float32 rounded to nearest (ties to even) with ``mantissa_bits`` (bfloat16: 7)."""
    drop = 23 - mantissa_bits
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    half = (1 << (drop - 1)) - 1
    rounded = (bits + half + ((bits >> drop) & 1)) >> drop << drop
    return rounded.astype(np.uint32).view(np.float32)


class RoundingExecutable(rlx.Executable):
    """Every float32 input and param rounded to ``bits`` mantissa bits, then the reference."""

    def __init__(self, graph: rlx.Graph, bits: int | None) -> None:
        self.graph, self.bits = graph, bits

    def _round(self, v: np.ndarray) -> np.ndarray:
        v = np.asarray(v)
        return to_bf16(v, self.bits) if self.bits is not None and v.dtype == np.float32 else v

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        g = self.graph
        params = {g.node(i).name: self._round(g.value(i)) for i in g.params}
        outs = rlx.reference.evaluate(g, {k: self._round(v) for k, v in inputs.items()}, params=params)
        return [o.astype(g.node(nid).dtype) for o, nid in zip(outs, g.outputs)]


class Rounding(ToyBackend):
    """Declares ``declared``; compiled with a precision it declares, rounds to ``bits``."""

    def __init__(self, name: str = "rounding", *, declared: frozenset[str] = frozenset({"bf16"}), bits: int = 7,
                 **kw: object) -> None:
        super().__init__(name, **kw)  # type: ignore[arg-type]
        self.declared, self.bits = declared, bits
        self.asked: list[str] = []

    def precisions(self) -> frozenset[str]:
        return self.declared  # type: ignore[return-value]

    def compile(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable:
        self.asked.append(options.precision)
        return RoundingExecutable(graph, self.bits if options.precision in self.declared else None)


class Broken(ToyBackend):
    def precisions(self) -> frozenset[str]:
        raise RuntimeError("cannot tell")


def product_graph() -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    g = rlx.Graph("product")
    x = g.input("x", (8, 64))
    g.set_outputs([g.matmul(x, g.param("w", rng.standard_normal((64, 16)).astype(np.float32)))])
    return g, {"x": rng.standard_normal((8, 64)).astype(np.float32)}


def registry(*backends: rlx.Backend) -> rlx.Registry:
    reg = rlx.Registry(entry_points=[], environ={})
    for b in backends:
        reg.register(b)
    return reg


@pytest.mark.parametrize(("given", "name"), [("bf16", "bf16"), ("bfloat16", "bf16"), (" BF16 ", "bf16"),
                                             ("float16", "fp16"), ("half", "fp16"), ("float32", "fp32")])
def test_precision_spellings(given, name):
    assert rlx.CompileOptions(precision=given).precision == name
    assert rlx.CompileOptions().precision == "fp32"


@pytest.mark.parametrize("bad", ["int8", "", "bf8", 16, None])
def test_an_unknown_precision_is_a_config_error_naming_it(bad):
    with pytest.raises(ConfigError, match=r"CompileOptions\.precision must be one of fp32, bf16, fp16"):
        rlx.CompileOptions(precision=bad)
    g, _ = product_graph()
    with pytest.raises(ConfigError, match=r"^precision must be one of .*got 'tf33'"):
        rlx.compile(g, device="toy", registry=registry(ToyBackend()), precision="tf33")


def test_the_backend_gets_the_precision_and_the_report_says_it_took_it():
    backend = Rounding()
    g, feeds = product_graph()
    cg = rlx.compile(g, device="rounding", registry=registry(backend), precision="bfloat16")
    assert backend.asked == ["bf16"]
    assert any("precision bf16 allowed: rounding declares bf16 on this host and may compute float32 products" in n
               for n in cg.report().notes), cg.report().notes
    got, exact = cg.run(feeds)[0], rlx.reference.evaluate(g, feeds)[0]
    assert not np.allclose(got, exact, rtol=1e-6, atol=0)  # really rounded
    np.testing.assert_allclose(got, exact, rtol=0.05, atol=0.05)
    # options= carries it too, and precision= wins over options' own
    rlx.compile(g, device="rounding", registry=registry(backend), options=rlx.CompileOptions(precision="bf16"))
    rlx.compile(g, device="rounding", registry=registry(backend), options=rlx.CompileOptions(precision="bf16"),
                precision="fp32")
    assert backend.asked[1:] == ["bf16", "fp32"]


def test_graph_devices_allow_it_to_every_device_they_compile_for():
    backend = Rounding()
    g, feeds = product_graph()
    gd = rlx.GraphDevices(g, registry=registry(backend, ToyBackend()), precision="bf16")
    cg = gd.compile("rounding")
    assert backend.asked == ["bf16"]
    assert any("precision bf16 allowed: rounding declares bf16" in n for n in cg.report().notes)
    assert any("toy does not compute in bf16" in n for n in gd.compile("toy").report().notes)
    assert not np.allclose(gd.run(feeds, device="rounding")[0], rlx.reference.evaluate(g, feeds)[0], rtol=1e-6)
    with pytest.raises(ConfigError, match="precision must be one of"):
        rlx.GraphDevices(g, precision="int2")


def test_fp32_by_default_says_nothing_of_precision():
    backend = Rounding()
    g, feeds = product_graph()
    cg = rlx.compile(g, device="rounding", registry=registry(backend))
    assert backend.asked == ["fp32"]
    assert not any("precision" in n for n in cg.report().notes)
    np.testing.assert_allclose(cg.run(feeds)[0], rlx.reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_device_that_does_not_declare_it_computes_float32_and_the_report_says_so():
    g, feeds = product_graph()
    cg = rlx.compile(g, device="toy", registry=registry(ToyBackend()), precision="bf16")
    assert any("precision bf16 allowed, but toy does not compute in bf16 on this host: float32 throughout" in n
               for n in cg.report().notes), cg.report().notes
    np.testing.assert_allclose(cg.run(feeds)[0], rlx.reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_plugin_whose_precisions_fail_is_taken_at_float32(caplog):
    g, _ = product_graph()
    with caplog.at_level(logging.WARNING, logger="rlx.session"):
        cg = rlx.compile(g, device="broken", registry=registry(Broken("broken")), precision="bf16")
    assert any("does not compute in bf16" in n for n in cg.report().notes)
    assert "precisions() failed (RuntimeError: cannot tell)" in caplog.text


def test_measured_picks_are_kept_apart_per_precision():
    g, _ = product_graph()
    reg = registry(ToyBackend())
    fp32_key, fp32_identity = Verdicts(reg)._where(g)
    bf16_key, bf16_identity = Verdicts(reg, precision="bf16")._where(g)
    assert "precision" not in fp32_identity  # entries from before precisions keep their key
    assert bf16_identity["precision"] == "bf16" and bf16_key != fp32_key


def test_the_kit_passes_a_backend_whose_bf16_products_are_within_the_bound():
    report = check_backend(Rounding(), ops=["matmul", "conv2d"], max_examples=3)
    assert report["precisions"].outcome == "passed", report.summary()
    assert report["precisions"].message == "within bounds at bf16"


def test_the_kit_fails_a_backend_rounding_coarser_than_it_declares():
    report = check_backend(Rounding(bits=3), ops=["matmul"], max_examples=3, raise_on_failure=False)
    result = report["precisions"]
    assert result.outcome == "failed"
    assert "at precision bf16" in result.message and "further off than bf16 operands" in result.message


def test_the_kit_fails_a_backend_declaring_a_precision_rlx_does_not_name():
    report = check_backend(Rounding(declared=frozenset({"int8"})), ops=["matmul"], max_examples=3,
                           raise_on_failure=False)
    assert report["precisions"].outcome == "failed"
    assert "precisions() names 'int8'" in report["precisions"].message


def test_the_kit_leaves_out_backends_that_keep_the_default():
    report = check_backend(ToyBackend(), ops=["matmul"], max_examples=3)
    assert "precisions" not in [r.name for r in report.results]


def test_the_bound_holds_for_exact_bf16_rounding_and_not_for_coarser():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((32, 256)).astype(np.float32), rng.standard_normal((256, 8)).astype(np.float32)
    exact = a.astype(np.float64) @ b
    bound = product_bound("bf16", 256, np.abs(a).astype(np.float64) @ np.abs(b))
    rounded = (to_bf16(a).astype(np.float64) @ to_bf16(b)).astype(np.float32)
    assert np.all(np.abs(rounded - exact) <= bound)
    coarse = (to_bf16(a, 2).astype(np.float64) @ to_bf16(b, 2)).astype(np.float32)
    assert np.any(np.abs(coarse - exact) > bound)
