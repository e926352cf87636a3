"""``fused_conv`` on the cpu backend: the kernel that runs the convolution applies the
epilogue itself as it finishes each part of the output (the implicit GEMM in each of its
forms, rlx's GEMM on a 1x1 convolution, rlx_gemv on a 1x1 plane, both depthwise kernels);
where it cannot (a
grouped convolution through im2col, a residual known only at run time, float64, no
native library, a caller's array the C side cannot take) the epilogue follows as a
region, and the answer is the same."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph, Value
from rlx_core.ir.ops import SOURCE_OPS, OpKind
from rlx_cpu import CpuBackend, fused, implicit_gemm, native, native_nn, nn_kernels, regions

F32 = np.float32

#: name -> (x shape, w shape, conv2d kwargs, implicit GEMM panel or None, applied in the kernel)
CONVS: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any], int | None, bool]] = {
    "implicit 8-row panels: 13 channels, a partial tile, two images": ((2, 16, 9, 10), (13, 16, 3, 3),
                                                                        {"padding": 1}, 8, True),
    "implicit 12-row panels: two k blocks, stride 2": ((1, 40, 9, 10), (13, 40, 3, 3), {"padding": 1, "stride": 2},
                                                        12, True),
    "implicit, channels in vectors: 64 of 7x7": ((1, 40, 7, 7), (64, 40, 3, 3), {"padding": 1}, 32, True),
    "1x1 stride 2 (the implicit GEMM)": ((2, 8, 14, 14), (16, 8, 1, 1), {"stride": 2}, 8, True),
    "plain 1x1, channels in vectors": ((1, 300, 11, 9), (70, 300, 1, 1), {}, 32, True),
    "plain 1x1, a partial tile moved back over the last 32 outputs, two images": ((2, 24, 10, 11), (20, 24, 1, 1),
                                                                                  {}, 8, True),
    "plain 1x1 over 5x5, fewer outputs than a tile: rlx's GEMM": ((2, 24, 5, 5), (20, 24, 1, 1), {}, 8, True),
    "600 channels of 14x14, 12-row panels: the epilogue by groups of whole channels": ((1, 24, 14, 14),
                                                                                       (600, 24, 1, 1), {}, 12, True),
    "600 channels of 14x14 in vectors: the epilogue by groups of whole channels": ((1, 24, 14, 14), (600, 24, 3, 3),
                                                                                   {"padding": 1}, 32, True),
    "depthwise 3x3, the row kernel": ((1, 8, 12, 40), (8, 1, 3, 3), {"padding": 1, "groups": 8}, None, True),
    "depthwise 3x3 stride 2, the row kernel over split rows": ((1, 8, 10, 97), (8, 1, 3, 3),
                                                                {"padding": 1, "stride": 2, "groups": 8}, None, True),
    "depthwise 3x3, the row kernel, rows with tails of 14 and 15": ((1, 3, 13, 47), (3, 1, 3, 3),
                                                                    {"padding": 1, "groups": 3}, None, True),
    "depthwise 3x3 stride 2, split rows with a tail of 8": ((1, 3, 12, 112), (3, 1, 3, 3),
                                                            {"padding": 1, "stride": 2, "groups": 3}, None, True),
    "depthwise 3x3 stride 2 over 10 outputs a row, the lanes kernel": ((1, 16, 20, 20), (16, 1, 3, 3),
                                                                       {"padding": 1, "stride": 2, "groups": 16},
                                                                       None, True),
    "depthwise 5x5 over 7x7, 37 lanes": ((2, 37, 7, 7), (37, 1, 5, 5), {"padding": 2, "groups": 37}, None, True),
    "1x1 on a 1x1 plane, two threads' outputs (rlx_gemv)": ((1, 40, 1, 1), (40, 40, 1, 1), {}, None, True),
    "1x1 on 1x1 planes, a batch of 5: one dense product, the epilogue after": ((5, 40, 1, 1), (24, 40, 1, 1), {},
                                                                                None, False),
    "grouped 3x3, rlx's grouped kernel: 3 channels a group, rows of 9": ((2, 4, 9, 9), (6, 2, 3, 3),
                                                                         {"padding": 1, "groups": 2}, None, True),
    "grouped 3x3 dilated (im2col: the epilogue after)": ((1, 4, 8, 8), (6, 2, 3, 3),
                                                         {"padding": 2, "dilation": 2, "groups": 2}, None, False),
}


def _silu(g: Graph, c: Value, _: Graph) -> Value:
    return g.mul(c, g.sigmoid(c))


def _hardswish(g: Graph, c: Value, _: Graph) -> Value:
    return g.div(g.mul(c, g.minimum(g.maximum(g.add(c, 3.0), 0.0), 6.0)), 6.0)


def _residual(g: Graph, c: Value, _: Graph) -> Value:
    """relu(c * scale + r): a per-channel operand (read strided) and a full-shape one."""
    o = c.shape[1]
    scale = g.param("scale", np.linspace(0.5, 1.5, o, dtype=F32).reshape(1, o, 1, 1))
    r = g.param("r", np.random.default_rng(9).standard_normal(c.shape).astype(F32))
    return g.relu(g.add(g.mul(c, scale), r))


EPILOGUES: dict[str, Callable[[Graph, Value, Graph], Value]] = {
    "relu": lambda g, c, _: g.relu(c),
    "relu6": lambda g, c, _: g.minimum(g.maximum(c, 0.0), 6.0),
    "silu": _silu,
    "hard-swish": _hardswish,
    "scale and residual": _residual,
}


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def conv_graph(case: str, epilogue: str, dtype: str = "float32") -> Graph:
    xs, ws, kwargs, _, _ = CONVS[case]
    g = Graph(f"{case}-{epilogue}")
    x = g.input("x", xs, dtype)
    w = g.param("w", (rand(ws, 1) / math.sqrt(math.prod(ws[1:]))).astype(dtype))
    c = g.conv2d(x, w, g.param("b", rand((ws[0],), 2).astype(dtype)), **kwargs)
    g.set_outputs([EPILOGUES[epilogue](g, c, g)])
    return g


def compile_cpu(g: Graph) -> rlx.CompiledGraph:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


@pytest.fixture
def lib() -> native.Native:
    found = native.library()
    if found is None:
        pytest.skip(f"native kernels unavailable: {native.reason()}")
    return found


def spy_on(monkeypatch: pytest.MonkeyPatch, lib: native.Native, name: str) -> list[tuple[Any, ...]]:
    """The calls of ``lib.name`` by plans compiled from here on (the once-per-process probe
    of MKL's vector math, which runs regions of its own, done before)."""
    regions._vml_table(lib)
    calls: list[tuple[Any, ...]] = []
    real = getattr(lib, name)
    monkeypatch.setattr(lib, name, lambda *a: (calls.append(a), real(*a))[1])
    return calls


def kernels(monkeypatch: pytest.MonkeyPatch, panel: int | None) -> None:
    """rlx's GEMM and the implicit GEMM (whatever this host measured), with ``panel``."""
    monkeypatch.setenv("RLX_CPU_GEMM", "native")
    monkeypatch.setenv("RLX_CPU_CONV", "implicit")
    monkeypatch.setattr(native_nn, "DIRECT_CONV_TAPS", 0)
    if panel is not None:
        monkeypatch.setattr(implicit_gemm, "conv_gemm_panel", lambda o, n, k: panel)


@pytest.mark.parametrize("epilogue", list(EPILOGUES))
@pytest.mark.parametrize("case", list(CONVS))
def test_the_convolution_kernel_runs_the_epilogue(lib: native.Native, monkeypatch: pytest.MonkeyPatch, case: str,
                                                  epilogue: str) -> None:
    """One fused_conv node; where its kernel takes the epilogue, no region runs at all
    (the epilogue went in with the convolution); the result equals the reference's."""
    kernels(monkeypatch, CONVS[case][3])
    regions = spy_on(monkeypatch, lib, "region")
    g = conv_graph(case, epilogue)
    cg = compile_cpu(g)
    assert [n.op for n in cg._legal.nodes if n.op not in SOURCE_OPS] == [OpKind.FUSED_CONV]
    x = rand(CONVS[case][0], 3)
    (got,) = cg.run({"x": x})
    assert (not regions) == CONVS[case][4], f"regions run: {len(regions)}"
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["every other element", "fortran order"])
def test_a_caller_array_the_kernel_cannot_take_still_gets_the_epilogue(lib: native.Native,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       layout: str) -> None:
    """The convolution's numpy fallback (for an input the C side cannot address) runs the
    epilogue after it, over that image's outputs only; the next contiguous run is native."""
    case = "implicit 8-row panels: 13 channels, a partial tile, two images"
    kernels(monkeypatch, 8)
    implicit = spy_on(monkeypatch, lib, "conv_gemm")
    g = conv_graph(case, "silu")
    cg = compile_cpu(g)
    x = rand(CONVS[case][0], 4)
    odd = np.repeat(x, 2, axis=-1)[..., ::2] if layout == "every other element" else np.asfortranarray(x)
    want = reference.evaluate(g, {"x": x})[0]
    np.testing.assert_allclose(cg.run({"x": odd})[0], want, rtol=1e-5, atol=1e-5)
    assert not implicit
    np.testing.assert_allclose(cg.run({"x": x})[0], want, rtol=1e-5, atol=1e-5)
    assert implicit


def test_a_residual_known_only_at_run_time_goes_in_a_region_after(lib: native.Native,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph input among the epilogue's operands has a new address each run: the
    kernel leaves the epilogue to a region after it."""
    kernels(monkeypatch, 8)
    regions = spy_on(monkeypatch, lib, "region")
    g = Graph("run-time residual")
    x, r = g.input("x", (1, 8, 10, 10)), g.input("r", (1, 8, 10, 10))
    c = g.conv2d(x, g.param("w", rand((8, 8, 3, 3), 1) / 8), padding=1)
    g.set_outputs([g.relu(g.add(c, r))])
    cg = compile_cpu(g)
    assert any(n.op is OpKind.FUSED_CONV for n in cg._legal.nodes)
    feeds = {"x": rand((1, 8, 10, 10), 2), "r": rand((1, 8, 10, 10), 3)}
    np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)
    assert regions


@pytest.mark.parametrize("how", ["float64", "numpy"])
def test_without_the_native_kernels_the_epilogue_follows_as_numpy(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    case = "depthwise 3x3, the row kernel"
    if how == "numpy":
        monkeypatch.setenv("RLX_CPU_NATIVE", "0")
    g = conv_graph(case, "scale and residual" if how == "numpy" else "silu", "float32" if how == "numpy" else "float64")
    cg = compile_cpu(g)
    assert any(n.op is OpKind.FUSED_CONV for n in cg._legal.nodes)
    x = rand(CONVS[case][0], 5).astype(g.node(g.inputs[0]).dtype)
    np.testing.assert_allclose(cg.run({"x": x})[0], reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_the_epilogue_follows_set_param(lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its operands are residents read by address: set_param's new values are what it reads."""
    case = "implicit, channels in vectors: 64 of 7x7"
    kernels(monkeypatch, 32)
    g = conv_graph(case, "scale and residual")
    cg = compile_cpu(g)
    x = rand(CONVS[case][0], 6)
    new = {"scale": rand((1, 64, 1, 1), 7), "r": rand((1, 64, 7, 7), 8), "b": rand((64,), 9)}
    for k, v in new.items():
        cg.set_param(k, v)
    want = reference.evaluate(g, {"x": x}, params=new)[0]
    np.testing.assert_allclose(cg.run({"x": x})[0], want, rtol=1e-5, atol=1e-5)


def _program(*ops: tuple[str, tuple[int, ...]]) -> list:
    from rlx_core.plugin import Instruction

    return [Instruction(OpKind(op), args, {}, (2, 3), "float32") for op, args in ops]


def test_clamp_bounds_reads_relu_relu6_and_clip_chains() -> None:
    out, zero, six, one = np.zeros((2, 3), F32), np.array(0.0, F32), np.array(6.0, F32), np.ones(1, F32)
    ops = [out, zero, six]
    assert regions.clamp_bounds(_program(("relu", (0,))), [out]) == (0.0, math.inf)
    assert regions.clamp_bounds(_program(("maximum", (0, 1)), ("minimum", (3, 2))), ops) == (0.0, 6.0)
    assert regions.clamp_bounds(_program(("minimum", (2, 0)), ("maximum", (1, 3))), ops) == (0.0, 6.0)
    assert regions.clamp_bounds(_program(("minimum", (0, 2))), ops) == (-math.inf, 6.0)
    # max(min(x, 0), 6) is the constant 6: the bounds say so exactly
    assert regions.clamp_bounds(_program(("minimum", (0, 1)), ("maximum", (3, 2))), ops) == (6.0, 6.0)
    assert regions.clamp_bounds(_program(("maximum", (0, 1))), [out, one]) == (1.0, math.inf)
    # Not a clamp: another op, an operand that is not a float32 constant, a step not reading the last
    assert regions.clamp_bounds(_program(("neg", (0,))), [out]) is None
    assert regions.clamp_bounds(_program(("maximum", (0, 1))), [out, np.zeros((2, 3), F32)]) is None
    assert regions.clamp_bounds(_program(("maximum", (0, 1))), [out, np.array(0, np.int32)]) is None
    assert regions.clamp_bounds(_program(("maximum", (0, 1)), ("minimum", (0, 2))), ops) is None
    assert regions.clamp_bounds([], [out]) is None


@pytest.mark.parametrize(("case", "gemm"), [
    ("plain 1x1 over 5x5, fewer outputs than a tile: rlx's GEMM", True),
    ("plain 1x1, a partial tile moved back over the last 32 outputs, two images", True),
    ("plain 1x1, channels in vectors", True),  # k = 300: the clamp after the second k block's add
    ("implicit 8-row panels: 13 channels, a partial tile, two images", False),
    ("implicit 12-row panels: two k blocks, stride 2", False),
])
def test_the_gemms_clamp_in_registers_and_keep_nan(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                   case: str, gemm: bool) -> None:
    """A convolution through rlx's GEMM or the implicit GEMM with a ReLU6: the epilogue is
    a clamp the kernel applies as it stores its tiles (after the last k block, a partial
    tile's scratch included), NaN stays NaN, and values past either bound land on it."""
    kernels(monkeypatch, CONVS[case][3])
    if gemm:  # rlx's GEMM, not the implicit one
        monkeypatch.setattr(nn_kernels, "conv_gemm_steps", lambda *a, **k: None)
    made: list[Any] = []
    real = fused.epilogue
    monkeypatch.setattr(fused, "epilogue", lambda *a: (made.append(real(*a)), made[-1])[1])
    g = conv_graph(case, "relu6")
    cg = compile_cpu(g)
    assert [e.clamp for e in made if e is not None] == [(0.0, 6.0)]
    x = rand(CONVS[case][0], 3) * 40
    x[0, :, 0, 0] = np.nan
    (got,) = cg.run({"x": x})
    want = reference.evaluate(g, {"x": x})[0]
    assert np.isnan(got[0, :, 0, 0]).all() and np.array_equal(np.isnan(got), np.isnan(want))
    assert got[~np.isnan(got)].min() == 0.0 and got[~np.isnan(got)].max() == 6.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # inputs 40x the usual: sums that large


@pytest.mark.parametrize(("case", "kernel"), [
    ("depthwise 3x3, the row kernel", "depthwise"),
    ("depthwise 3x3 stride 2, the row kernel over split rows", "depthwise"),
    ("depthwise 3x3, the row kernel, rows with tails of 14 and 15", "depthwise"),
    ("depthwise 3x3 stride 2, split rows with a tail of 8", "depthwise"),
    ("depthwise 3x3 stride 2 over 10 outputs a row, the lanes kernel", "depthwise_lanes"),
    ("depthwise 5x5 over 7x7, 37 lanes", "depthwise_lanes"),
])
def test_the_depthwise_kernels_clamp_as_they_store_and_keep_nan(lib: native.Native, monkeypatch: pytest.MonkeyPatch,
                                                               case: str, kernel: str) -> None:
    """A ReLU6 after a depthwise convolution: the row kernel clamps each output row as it
    writes it, its last floats short of a vector too; the lanes kernel as it moves its
    results back to their planes, a block's last pixels and a partial block of channels
    too (no region runs); NaN stays NaN (at a plane's first output and at a row's last),
    values past either bound land on it."""
    regions_run = spy_on(monkeypatch, lib, "region")
    rows = spy_on(monkeypatch, lib, kernel)
    g = conv_graph(case, "relu6")
    cg = compile_cpu(g)
    x = rand(CONVS[case][0], 3) * 40
    x[0, :, 0, 0] = np.nan
    x[0, :, 4, -1] = np.nan
    (got,) = cg.run({"x": x})
    want = reference.evaluate(g, {"x": x})[0]
    assert rows and not regions_run
    assert np.isnan(got[0, :, 0, 0]).all() and np.isnan(got[0, :, 4 // CONVS[case][2].get("stride", 1), -1]).all()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert got[~np.isnan(got)].min() == 0.0 and got[~np.isnan(got)].max() == 6.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("onednn", ["off", "on"])
def test_a_batch_of_1x1_planes_is_one_dense_product(monkeypatch: pytest.MonkeyPatch, onednn: str) -> None:
    """A squeeze-excitation's 1x1 convolutions at batch 2 and up: ``x (n, c) @ w (o, c)^T``
    as one product (the weights read once), not a product per image nor oneDNN's
    convolution over a 1x1 plane; set_param's new weights and bias are what it reads."""
    from rlx_cpu import onednn as dnnl

    if onednn == "on" and dnnl.find_library() is None:
        pytest.skip("oneDNN's library is not installed (the onednn extra)")
    monkeypatch.setenv("RLX_CPU_ONEDNN", onednn)
    from rlx_cpu import nn_kernels

    products: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
    real = nn_kernels.matmul_step
    monkeypatch.setattr(nn_kernels, "matmul_step",
                        lambda a, b, out, ctx=None: (products.append((a.shape, b.shape, out.shape)),
                                                     real(a, b, out, ctx))[1])
    g = conv_graph("1x1 on 1x1 planes, a batch of 5: one dense product, the epilogue after", "hard-swish")
    cg = compile_cpu(g)
    assert products == [((5, 40), (40, 24), (5, 24))]
    x = rand((5, 40, 1, 1), 3)
    np.testing.assert_allclose(cg.run({"x": x})[0], reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)
    new = {"w": rand((24, 40, 1, 1), 4) / 6, "b": rand((24,), 5)}
    for k, v in new.items():
        cg.set_param(k, v)
    want = reference.evaluate(g, {"x": x}, params=new)[0]
    np.testing.assert_allclose(cg.run({"x": x})[0], want, rtol=1e-5, atol=1e-5)
