"""The XLA executable's promises beyond single ops (the conformance kit's job): whole
models match the float64 reference; ``set_param`` swaps a device buffer without tracing
again; compiled programs are reused per signature; ``run_dlpack`` leaves outputs on the
device; float64/int64 graphs run exactly in 64-bit mode without leaking it; bad run-time
values raise the reference's ``InputError``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.errors import InputError
from rlx_core.ir import Graph

jax = pytest.importorskip("jax", reason="jax is not installed (pip install jax); the rlx-jax-tpu backends need it")

from rlx_jax_tpu.caching import ProgramCache  # noqa: E402  (imports jax)
from rlx_jax_tpu.executable import JaxExecutable  # noqa: E402


def mlp_graph(rng: np.random.Generator, batch: int = 8, sizes: tuple[int, ...] = (32, 64, 10)) -> Graph:
    g = Graph("mlp")
    h = g.input("x", (batch, sizes[0]))
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        w = g.param(f"w{i}", (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32))
        h = g.add(g.matmul(h, w), g.param(f"b{i}", rng.standard_normal(b).astype(np.float32)))
        if i < len(sizes) - 2:
            h = g.relu(h)
    g.set_outputs([g.softmax(h, axis=-1, name="probs")])
    return g


def attention_graph(rng: np.random.Generator, seq: int = 6, dim: int = 16) -> Graph:
    """A transformer-ish block: projections, masked attention, residual, layer norm, gelu MLP."""
    g = Graph("block")
    x = g.input("x", (2, seq, dim))
    mask = g.input("mask", (seq, seq), "bool")

    def weight(name: str, shape: tuple[int, ...]) -> rlx.ir.Value:
        return g.param(name, (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    q, k, v = (g.matmul(x, weight(n, (dim, dim))) for n in ("wq", "wk", "wv"))
    a = g.add(x, g.matmul(g.attention(q, k, v, mask=mask), weight("wo", (dim, dim))))
    n = g.layer_norm(a, g.param("ln_scale", np.ones(dim, np.float32)), g.param("ln_bias", np.zeros(dim, np.float32)))
    h = g.gelu(g.matmul(n, weight("w1", (dim, 2 * dim))))
    g.set_outputs([g.add(n, g.matmul(h, weight("w2", (2 * dim, dim)))), g.softmax(q, axis=-1)])
    return g


def compile_jax(graph: Graph, registry: Registry) -> rlx.CompiledGraph:
    cg = rlx.compile(graph, device="jax", registry=registry)
    assert isinstance(cg._exe, JaxExecutable)
    return cg


def test_an_mlp_matches_the_reference(registry: Registry, rng: np.random.Generator) -> None:
    g = mlp_graph(rng)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    (got,) = compile_jax(g, registry).run({"x": x})
    (want,) = reference.evaluate(g, {"x": x})
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_attention_block_matches_the_reference(registry: Registry, rng: np.random.Generator) -> None:
    g = attention_graph(rng)
    inputs = {"x": rng.standard_normal((2, 6, 16)).astype(np.float32), "mask": np.tril(np.ones((6, 6), bool))}
    got = compile_jax(g, registry).run(inputs)
    for out, want in zip(got, reference.evaluate(g, inputs)):
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_set_param_swaps_the_device_buffer_without_tracing_again(registry: Registry,
                                                                  rng: np.random.Generator) -> None:
    g = mlp_graph(rng, batch=3, sizes=(5, 7, 4))
    cg = compile_jax(g, registry)
    exe = cg._exe
    x = rng.standard_normal((3, 5)).astype(np.float32)
    before = cg.run({"x": x})[0]
    assert exe.traces == 1
    new_w = rng.standard_normal((5, 7)).astype(np.float32)
    cg.set_param("w0", new_w)
    after = cg.run({"x": x})[0]
    assert cg._exe is exe and exe.traces == 1  # same executable, no retrace, no recompile
    want = reference.evaluate(_with_param(g, "w0", new_w), {"x": x})[0]
    np.testing.assert_allclose(after, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(before, after)
    with pytest.raises(InputError, match="w0"):
        cg.set_param("w0", new_w.astype(np.float64))


def _with_param(g: Graph, name: str, value: np.ndarray) -> Graph:
    """A copy of ``g`` with param ``name`` set to ``value``, for the reference."""
    copy = g.copy()
    copy.replace_value(copy.input_node(name).id, value)
    return copy


def test_programs_are_cached_per_signature(rng: np.random.Generator) -> None:
    cache = ProgramCache()
    device = jax.devices()[0]
    x = rng.standard_normal((4, 6)).astype(np.float32)

    def build(batch: int, seed: int, const: float = 1.0, name: str = "x") -> Graph:
        r = np.random.default_rng(seed)
        g = Graph(f"g{seed}")
        h = g.matmul(g.input(name, (batch, 6)), g.param("w", r.standard_normal((6, 3)).astype(np.float32)))
        g.set_outputs([g.mul(h, g.constant(np.full(3, const, np.float32)))])
        return g.freeze()

    first = JaxExecutable(build(4, seed=1), device, programs=cache)
    same = JaxExecutable(build(4, seed=2, name="renamed"), device, programs=cache)  # other weights and names
    assert not first.cache_hit and same.cache_hit and len(cache) == 1
    assert same.traces == 1 and same.compile_seconds == 0.0
    out1, out2 = first.run({"x": x})[0], same.run({"renamed": x})[0]
    assert not np.allclose(out1, out2)  # the shared program runs each executable's own params
    np.testing.assert_allclose(out2, reference.evaluate(build(4, seed=2, name="renamed"), {"renamed": x})[0],
                               rtol=1e-5, atol=1e-6)
    other_shape = JaxExecutable(build(5, seed=1), device, programs=cache)
    other_const = JaxExecutable(build(4, seed=1, const=2.0), device, programs=cache)
    assert not other_shape.cache_hit and not other_const.cache_hit and len(cache) == 3
    assert cache.hits == 1 and cache.misses == 3


def test_run_dlpack_leaves_outputs_on_the_device(registry: Registry, rng: np.random.Generator) -> None:
    g = Graph("dl")
    x = g.input("x", (3, 4))
    g.set_outputs([g.tanh(x), x])  # an input passed through comes back as a copy
    cg = compile_jax(g, registry)
    xs = rng.standard_normal((3, 4)).astype(np.float32)
    outs = cg.run({"x": xs}, output="dlpack")
    assert all(isinstance(o, jax.Array) for o in outs)
    assert outs[0].devices() == {cg._exe.device}
    np.testing.assert_allclose(np.asarray(outs[0]), np.tanh(xs), rtol=1e-6)  # from_dlpack: cpu arrays only
    xs[0, 0] = 42.0  # the caller may reuse the input: the passthrough output is its own buffer
    assert float(outs[1][0, 0]) != 42.0
    device_input = jax.device_put(xs)
    on_device = cg._exe.run_dlpack({"x": device_input})
    np.testing.assert_allclose(np.asarray(on_device[0]), np.tanh(xs), rtol=1e-6)


def test_float64_and_int64_graphs_run_exactly_without_leaking_64_bit_mode(registry: Registry) -> None:
    g = Graph("wide")
    x = g.input("x", (4,), "float64")
    idx = g.input("idx", (3,), "int64")
    big = g.constant(np.array([3_000_000_000, -5, 7, 1 << 40], np.int64))
    g.set_outputs([g.sub(g.exp(x), g.constant(np.ones(4))), g.gather(big, idx), g.reduce_sum(big)])
    inputs = {"x": np.array([1e-12, 1e-9, 0.5, -2.0]), "idx": np.array([0, 3, -1], np.int64)}
    got = compile_jax(g, registry).run(inputs)
    want = reference.evaluate(g, inputs)
    assert [o.dtype for o in got] == [np.float64, np.int64, np.int64]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)  # exp(1e-12) - 1 needs float64
    np.testing.assert_array_equal(got[1], want[1])
    assert int(got[2]) == int(want[2]) == 3_000_000_002 + (1 << 40)
    assert not jax.config.jax_enable_x64  # the switch is per call, not global
    g32 = Graph("narrow")
    g32.set_outputs([g32.mul(g32.input("x", (2,)), g32.constant(np.float32(3.0)))])
    (out,) = compile_jax(g32, registry).run({"x": np.ones(2, np.float32)})
    assert out.dtype == np.float32


def test_bad_run_time_values_raise_the_references_input_error(registry: Registry) -> None:
    g = Graph("checks")
    a = g.input("a", (3,), "int32")
    b = g.input("b", (3,), "int32")
    g.set_outputs([g.div(a, b, name="ratio")])
    cg = compile_jax(g, registry)
    np.testing.assert_array_equal(cg.run({"a": np.array([7, -7, 9], np.int32), "b": np.array([2, 2, 3], np.int32)})[0],
                                  [3, -3, 3])
    with pytest.raises(InputError, match=r"'ratio'.*division by zero"):
        cg.run({"a": np.ones(3, np.int32), "b": np.array([1, 0, 1], np.int32)})


def test_attention_contracts_keys_on_their_last_axis_without_a_transpose() -> None:
    """q @ kᵀ as one dot_general over both operands' last axis: a transposed copy of k is
    what XLA's cpu pipeline then materializes (the ONNX suite transformer's largest extra
    kernel before), and what a hand-written ``einsum("hqd,hkd->hqk")`` never has."""
    from rlx_core.ir.ops import OpKind
    from rlx_jax_tpu.lowering import LOWERINGS

    g = Graph("attn")
    q, k, v = (g.input(n, (2, 3, 5, 4)) for n in "qkv")
    g.set_outputs([g.attention(q, k, v)])
    node = next(n for n in g.nodes if n.op is OpKind.ATTENTION)
    spec = jax.ShapeDtypeStruct((2, 3, 5, 4), np.float32)
    jaxpr = jax.make_jaxpr(lambda a, b, c: LOWERINGS[OpKind.ATTENTION](node, [a, b, c]))(spec, spec, spec)
    prims = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert "transpose" not in prims
    scores = next(e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general")
    (lhs_contract, rhs_contract), _ = scores.params["dimension_numbers"]
    assert tuple(lhs_contract) == (3,) and tuple(rhs_contract) == (3,)


def test_several_inputs_and_outputs_run_through_the_bound_state(registry: Registry,
                                                                 rng: np.random.Generator) -> None:
    """The run path binds the state once (``functools.partial``) and takes one input without
    a list; several inputs, several outputs and a swapped param all go through it."""
    g = Graph("multi")
    a, b = g.input("a", (3, 4)), g.input("b", (3, 4))
    w = g.param("w", rng.standard_normal((4, 2)).astype(np.float32))
    g.set_outputs([g.matmul(g.sub(a, b), w), g.mul(a, b)])
    cg = compile_jax(g, registry)
    feed = {"b": rng.standard_normal((3, 4)).astype(np.float32), "a": rng.standard_normal((3, 4)).astype(np.float32)}
    for got, want in zip(cg.run(feed), reference.evaluate(g, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    new_w = rng.standard_normal((4, 2)).astype(np.float32)
    cg.set_param("w", new_w)
    for run in (cg.run(feed), [np.asarray(o) for o in cg.run(feed, output="dlpack")]):
        np.testing.assert_allclose(run[0], (feed["a"] - feed["b"]) @ new_w, rtol=1e-5, atol=1e-6)
    assert cg._exe.traces == 1


def test_the_executable_says_what_compiling_cost(registry: Registry, rng: np.random.Generator) -> None:
    cg = compile_jax(mlp_graph(rng, batch=2, sizes=(3, 9, 2)), registry)
    exe = cg._exe
    notes = exe.report_notes()
    assert exe.lower_seconds > 0 or exe.cache_hit
    assert len(notes) == 1 and "jax" in notes[0] and "persistent cache" in notes[0]
    assert ("XLA compiled in" in notes[0]) != exe.cache_hit


def test_a_device_index_jax_does_not_have_is_a_device_error(registry: Registry) -> None:
    g = Graph("one")
    g.set_outputs([g.neg(g.input("x", (2,)))])
    count = len(jax.devices())
    with pytest.raises(rlx.DeviceError, match=rf"jax:{count}.*does not exist"):  # the core checks the probe's list
        rlx.compile(g, device=f"jax:{count}", registry=registry)
    with pytest.raises(rlx.DeviceError, match=rf"jax:{count} does not exist; JAX sees {count}"):  # and the backend
        registry.get("jax").device(count)
