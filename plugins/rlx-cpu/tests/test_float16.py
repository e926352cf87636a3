"""float16 graphs on the cpu backend: convolutions (with their fused epilogues) and
products run on the float32 kernels over float32 copies of their operands, rounded to
float16 once (``halves``); kept weights are converted once and again after
``set_param``. The answers: the reference's, within float16's rounding of each value."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_cpu import CpuBackend, halves, native

F16 = np.float16


def _rand(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(F16)


def _compile(g: Graph) -> rlx.CompiledGraph:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


def _check(g: Graph, feeds: dict[str, np.ndarray], got: np.ndarray, params: dict[str, np.ndarray] | None = None
           ) -> None:
    want = reference.evaluate(g, feeds, params=params)[0].astype(np.float64)
    assert got.dtype == F16  # (each value rounded to float16: a few of its ulps of the largest output)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=4e-3, atol=2e-3 * np.abs(want).max())


def _resnet_block(shape: tuple[int, ...], k: int, groups: int = 1) -> Graph:
    """conv (bias), ReLU, conv, plus the input, ReLU: fused convolutions with epilogues."""
    c = shape[1]
    g = Graph("half")
    x = g.input("x", shape, F16)
    w1 = g.param("w1", _rand((c, c // groups, k, k), 1, 0.3))
    b1 = g.param("b1", _rand((c,), 2, 0.1))
    y = g.relu(g.conv2d(x, w1, b1, padding=k // 2, groups=groups))
    w2 = g.param("w2", _rand((c, c // groups, k, k), 3, 0.3))
    g.set_outputs([g.relu(g.add(g.conv2d(y, w2, padding=k // 2, groups=groups), x))])
    return g


@pytest.mark.parametrize(("shape", "k", "groups"), [((2, 16, 9, 10), 3, 1), ((1, 32, 6, 6), 1, 1),
                                                     ((3, 8, 12, 12), 3, 2), ((1, 24, 7, 7), 3, 24)])
def test_convolutions_run_in_float32_and_round_once(shape: tuple[int, ...], k: int, groups: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    converted: list[tuple[int, ...]] = []
    real = halves.as_float32

    def spy(x, ctx):  # type: ignore[no-untyped-def]
        converted.append(tuple(x.shape))
        return real(x, ctx)

    for module in ("rlx_cpu.halves", "rlx_cpu.kernels", "rlx_cpu.nn_kernels", "rlx_cpu.fused"):
        monkeypatch.setattr(f"{module}.as_float32", spy, raising=False)
    g = _resnet_block(shape, k, groups)
    cg = _compile(g)
    assert (g.node(g.inputs[0]).shape in converted) and len(converted) >= 3  # x, the weights, the residual
    feeds = {"x": _rand(shape, 0)}
    _check(g, feeds, cg.run(feeds)[0])
    c = shape[1]
    new = {"w2": _rand((c, c // groups, k, k), 9, 0.3)}
    cg.set_param("w2", new["w2"])  # the kept float32 copy follows
    _check(g, feeds, cg.run(feeds)[0], params=new)


def test_a_product_by_kept_weights_follows_set_param() -> None:
    g = Graph("dense16")
    x = g.input("x", (5, 12), F16)
    w = g.param("w", _rand((12, 7), 1, 0.3))
    g.set_outputs([g.matmul(x, w)])
    cg = _compile(g)
    feeds = {"x": _rand((5, 12), 0)}
    _check(g, feeds, cg.run(feeds)[0])
    new = {"w": _rand((12, 7), 4, 0.3)}
    cg.set_param("w", new["w"])
    _check(g, feeds, cg.run(feeds)[0], params=new)


def test_the_native_conversions_are_numpys_casts() -> None:
    """Every float16 value to float32 and back, and float32 values at float16's rounding
    ties, past its range (to inf), subnormal and NaN, as numpy casts them; both
    directions on two threads and on one."""
    lib = native.library()
    if lib is None:
        pytest.skip(f"native kernels unavailable: {native.reason()}")
    halves_ = np.arange(1 << 16, dtype=np.uint16).view(F16)
    got = np.empty(halves_.shape, np.float32)
    for threads in (1, 2):
        lib.half_to_float(halves_.ctypes.data, got.ctypes.data, halves_.size, threads)
        want32 = halves_.astype(np.float32)  # (a signaling NaN comes back quiet: NaN either way)
        same = (got.view(np.uint32) == want32.view(np.uint32)) | (np.isnan(got) & np.isnan(want32))
        assert same.all(), halves_[~same][:5]
    rng = np.random.default_rng(0)
    ties = (halves_[np.isfinite(halves_)].astype(np.float32).view(np.uint32) + (1 << 12)).view(np.float32)
    floats = np.concatenate([rng.standard_normal(5000).astype(np.float32) * 1e3, ties, rng.standard_normal(100)
                             .astype(np.float32) * 1e-6, np.array([65504, 65519.99, 65520, 7e4, -7e4, np.inf, -np.inf,
                                                                   np.nan, -0.0, 6e-8, 3e-8, 2.9e-8], np.float32)])
    back = np.empty(floats.shape, F16)
    for threads in (1, 2):
        lib.float_to_half(floats.ctypes.data, back.ctypes.data, floats.size, threads)
        with np.errstate(over="ignore"):
            want = floats.astype(F16)
        same = (back.view(np.uint16) == want.view(np.uint16)) | (np.isnan(back) & np.isnan(want))
        assert same.all(), (floats[~same][:5], back[~same][:5], want[~same][:5])


def test_layer_norm_softmax_and_attention_run_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float16 attention block: LayerNorm, the attention op, a softmax over its output,
    each on the float32 kernels over float32 copies (``halves.in_float32``), against the
    reference."""
    built: list[str] = []
    real = halves.in_float32

    def spy(build, node, ins, out, ctx):  # type: ignore[no-untyped-def]
        built.append(node.op.value)
        return real(build, node, ins, out, ctx)

    monkeypatch.setattr("rlx_cpu.halves.in_float32", spy)
    g = Graph("attn16")
    x = g.input("x", (2, 4, 7, 16), F16)
    h = g.layer_norm(x, g.param("s", _rand((16,), 1, 0.5)), g.param("b", _rand((16,), 2, 0.1)))
    a = g.attention(h, g.mul(h, 0.5), x)
    g.set_outputs([g.softmax(a, axis=-1)])
    cg = _compile(g)
    assert {"layer_norm", "attention", "softmax"} <= set(built), built
    feeds = {"x": _rand((2, 4, 7, 16), 0)}
    _check(g, feeds, cg.run(feeds)[0])


def test_single_elementwise_ops_and_pools_are_numpys_float16_results() -> None:
    """Unfused float16 ops (each the graph's output, so none fuses) run in float32 and
    round once: bit for bit numpy's float16 arithmetic for +, -, x, /, sqrt, max, and the
    pools."""
    g = Graph("ops16")
    a, b = g.input("a", (3, 4, 9, 9), F16), g.input("b", (3, 4, 9, 9), F16)
    outs = [g.add(a, b), g.sub(a, b), g.mul(a, b), g.div(a, b), g.maximum(a, b), g.sqrt(g.abs(a)),
            g.max_pool2d(a, 3, stride=2, padding=1), g.global_avg_pool2d(a)]
    g.set_outputs(outs)
    feeds = {"a": _rand((3, 4, 9, 9), 0), "b": _rand((3, 4, 9, 9), 1)}
    got = _compile(g).run(feeds)
    x, y = feeds["a"], feeds["b"]
    with np.errstate(all="ignore"):
        exact = [x + y, x - y, x * y, x / y, np.maximum(x, y), np.sqrt(np.abs(x))]
    for r, w in zip(got, exact):
        assert r.dtype == F16
        np.testing.assert_array_equal(r, w)
    for r, w in zip(got[6:], reference.evaluate(g, feeds)[6:]):
        assert r.dtype == F16
        np.testing.assert_allclose(r.astype(np.float64), w.astype(np.float64), rtol=1e-3, atol=1e-3)
