"""Channels-last chains on rlx's own kernels (``layout.NativeChains``: where oneDNN does
not run, the channels-inner convolution and NHWC pools of ``conv_nhwc``): which values a
plan holds NHWC, and the reference's answers whatever it holds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_cpu import CpuBackend, conv_nhwc, layout, native, native_nn

F32 = np.float32
LIB = native.library()
needs_chains = pytest.mark.skipif(LIB is None or not LIB.gemm_avx512,
                                  reason="native chains run where the native library has its AVX-512 clones")


@pytest.fixture(autouse=True)
def _no_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CPU_ONEDNN", "off")
    monkeypatch.setenv("RLX_CPU_LAYOUT", "auto")


def rand(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(F32)


def conv(g: Graph, x: Any, cin: int, cout: int, seed: int, k: int = 3, **kw: Any) -> Any:
    kw.setdefault("padding", k // 2)
    groups = kw.get("groups", 1)
    w = g.param(f"w{seed}", rand((cout, cin // groups, k, k), seed, 1.0 / np.sqrt(cin // groups * k * k)))
    return g.conv2d(x, w, g.param(f"b{seed}", rand((cout,), seed + 100, 0.1)), **kw)


def compiled(g: Graph) -> Any:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


def held_cl(cg: Any) -> set[str]:
    exe = cg._exe
    return {exe._nodes[i].name for i in exe._cl}


def held_ops(cg: Any) -> set[str]:
    exe = cg._exe
    return {exe._nodes[i].op.value for i in exe._cl}


def check(g: Graph, feeds: dict[str, np.ndarray], cg: Any = None, params: dict[str, np.ndarray] | None = None) -> Any:
    """``g`` compiled (or ``cg``), with ``params`` set on it first, against the reference."""
    cg = cg or compiled(g)
    for name, value in (params or {}).items():
        cg.set_param(name, value)
    for got, want in zip(cg.run(feeds), reference.evaluate(g, feeds, params=params)):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    return cg


def resnet_graph(batch: int = 2) -> Graph:
    """ResNet in small: a 3-channel stem (NCHW kernels), a max pool, a basic block, a
    downsampling block (3x3 stride 2 and a 1x1 stride-2 shortcut), the global pool and a
    dense layer."""
    g = Graph("resnet")
    x = g.input("x", (batch, 3, 32, 32))
    h = g.relu(conv(g, x, 3, 16, 1, k=7, stride=2, padding=3), name="stem")
    h = g.max_pool2d(h, 3, 2, 1, name="pool")
    a = g.relu(conv(g, h, 16, 16, 2), name="b1_a")
    h = g.relu(g.add(conv(g, a, 16, 16, 3), h), name="b1_out")
    a = g.relu(conv(g, h, 16, 32, 4, stride=2), name="b2_a")
    short = conv(g, h, 16, 32, 5, k=1, stride=2, padding=0)
    h = g.relu(g.add(conv(g, a, 32, 32, 6), short), name="b2_out")
    s = g.reshape(g.global_avg_pool2d(h), (batch, 32))
    g.set_outputs([g.matmul(s, g.param("fc", rand((32, 10), 9, 0.2)), name="logits")])
    return g


@needs_chains
def test_a_resnet_is_held_channels_last_from_its_pool_and_matches_the_reference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool reads the stem's NCHW output and writes NHWC itself (``rlx_pool_to_nhwc``),
    the five convolutions after it run on the channels-inner kernel."""
    taken: list[Any] = []
    real = conv_nhwc.chain_conv_steps
    monkeypatch.setattr(conv_nhwc, "chain_conv_steps", lambda *a: (taken.append(real(*a)), taken[-1])[1])
    pooled: list[Any] = []
    real_pool = LIB.pool_to_nhwc
    monkeypatch.setattr(LIB, "pool_to_nhwc", lambda *a: (pooled.append(a), real_pool(*a))[1])
    assert layout.enabled() is layout.NATIVE
    g = resnet_graph()
    cg = compiled(g)
    cl = held_cl(cg)
    assert {"pool", "b1_a", "b1_out", "b2_a", "b2_out"} <= cl and "stem" not in cl  # 3 channels: NCHW
    assert len(taken) == 5 and all(t is not None for t in taken)
    feeds = {"x": rand((2, 3, 32, 32), 0)}
    feeds["x"][1, :, 4:8, 4:8] = np.nan  # NaN through the stem's windows into the pool's
    check(g, feeds, cg)
    assert pooled
    check(g, feeds, cg, params={"w3": rand((16, 16, 3, 3), 30, 0.1), "b6": rand((32,), 31)})


@needs_chains
def test_layout_nchw_turns_native_chains_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CPU_LAYOUT", "nchw")
    assert layout.enabled() is None and layout.describe() == "NCHW everywhere (RLX_CPU_LAYOUT=nchw)"
    g = resnet_graph(1)
    cg = compiled(g)
    assert not held_cl(cg)
    check(g, {"x": rand((1, 3, 32, 32), 0)}, cg)


@needs_chains
def test_the_probe_says_native_chains_run() -> None:
    assert "channels-inner kernel" in layout.describe() and "RLX_CPU_ONEDNN=off" in layout.describe()
    assert "channels-inner" in CpuBackend().probe().versions["layout"]


def inverted_graph(batch: int = 1) -> Graph:
    """MobileNetV2 in small: a 3-channel stem (NCHW kernels), a depthwise convolution right
    after it, two inverted residual blocks (expansion, depthwise 3x3 stride 1 and 5x5
    stride 2 with ReLU6, projection, a residual add), then a concat of two branches."""
    g = Graph("inverted")
    x = g.input("x", (batch, 3, 28, 28))
    h = g.relu(conv(g, x, 3, 24, 1, stride=2), name="stem")
    h = g.relu(conv(g, h, 24, 24, 2, groups=24), name="dw0")  # reads the stem's NCHW output
    p = conv(g, h, 24, 24, 3, k=1, name="project0")
    e = g.minimum(g.relu(conv(g, p, 24, 72, 4, k=1)), 6.0, name="expand1")
    d = g.minimum(g.relu(conv(g, e, 72, 72, 5, groups=72)), 6.0, name="dw1")
    y = g.add(conv(g, d, 72, 24, 6, k=1), p, name="residual1")
    e = g.relu(conv(g, y, 24, 48, 7, k=1), name="expand2")
    d = g.relu(conv(g, e, 48, 48, 8, k=5, stride=2, groups=48), name="dw2")
    z = conv(g, d, 48, 32, 9, k=1, name="project2")
    c = g.concat([g.relu(conv(g, z, 32, 16, 10), name="left"), g.relu(conv(g, z, 32, 16, 11, k=1), name="right")],
                 axis=1, name="cat")
    g.set_outputs([g.relu(conv(g, c, 32, 16, 12), name="out")])
    return g


@needs_chains
def test_inverted_residuals_are_held_channels_last_through_their_depthwise_convolutions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``conv_nhwc.DEPTHWISE``, depthwise convolutions join the chains
    (``rlx_depthwise_nhwc``, NHWC on both sides): expansion, depthwise and projection
    all NHWC. The one reading the stem's NCHW output stays NCHW with it (the kernel
    reads NHWC only), and a concat keeps its inputs NCHW. As the reference, NaN through
    the stem, and after ``set_param`` of a depthwise filter and bias (packed again)."""
    monkeypatch.setattr(conv_nhwc, "DEPTHWISE", True)
    taken: list[Any] = []
    real = conv_nhwc.depthwise_steps
    monkeypatch.setattr(conv_nhwc, "depthwise_steps", lambda *a: (taken.append(real(*a)), taken[-1])[1])
    g = inverted_graph(2)
    cg = compiled(g)
    cl = held_cl(cg)
    assert {"project0", "expand1", "dw1", "residual1", "expand2", "dw2", "project2"} <= cl
    assert not {"stem", "dw0", "left", "right", "cat", "out"} & cl
    assert len(taken) == 2 and all(t is not None for t in taken)
    feeds = {"x": rand((2, 3, 28, 28), 0)}
    feeds["x"][1, :, 6:9, 6:9] = np.nan
    check(g, feeds, cg)
    check(g, feeds, cg, params={"w5": rand((72, 1, 3, 3), 50, 0.3), "b8": rand((48,), 51)})


@needs_chains
def test_depthwise_convolutions_stay_nchw_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """``conv_nhwc.DEPTHWISE = False`` (the default: see it): the blocks joined to them
    would each transpose a side, so the chains are dropped (the NCHW plan, same answers)."""
    monkeypatch.setattr(conv_nhwc, "DEPTHWISE", False)
    g = inverted_graph()
    cg = compiled(g)
    assert not held_cl(cg)
    check(g, {"x": rand((1, 3, 28, 28), 0)}, cg)


@needs_chains
def test_a_chain_feeding_few_convolutions_is_dropped() -> None:
    """GoogLeNet's stem: a pool, a 1x1 and a 3x3 convolution, then a pool into a concat's
    branches: two convolutions read NHWC, not worth the transposes at the chain's ends."""
    g = Graph("stem")
    x = g.input("x", (1, 16, 28, 28))
    h = g.max_pool2d(g.relu(conv(g, x, 16, 32, 1, stride=2)), 3, 2, 1, name="pool")
    h = g.relu(conv(g, g.relu(conv(g, h, 32, 32, 2, k=1)), 32, 48, 3), name="conv3")
    h = g.max_pool2d(h, 3, 2, 1, name="pool2")
    g.set_outputs([g.concat([conv(g, h, 48, 16, 4, k=1), conv(g, h, 48, 16, 5)], axis=1)])
    cg = compiled(g)
    assert not held_cl(cg)
    check(g, {"x": rand((1, 16, 28, 28), 0)}, cg)


@needs_chains
@pytest.mark.parametrize(("kind", "kernel", "stride", "padding", "ceil", "include"), [
    ("max", 3, 2, 1, False, False),
    ("max", 3, 2, 0, True, False),    # ceil_mode: a window past the edge
    ("max", 2, 2, 0, False, False),
    ("avg", 3, 1, 1, False, True),    # Inception's, counting the padding
    ("avg", 3, 1, 1, False, False),
    ("avg", 3, 2, 1, True, True),     # the declared padding counts, ceil_mode's overhang does not
    ("avg", 2, 2, 0, False, False),   # DenseNet's transitions
])
def test_pools_inside_a_chain_match_the_reference(kind: str, kernel: int, stride: int, padding: int, ceil: bool,
                                                  include: bool) -> None:
    g = Graph("pooled")
    x = g.input("x", (2, 16, 13, 13))
    h = g.relu(conv(g, g.relu(conv(g, x, 16, 24, 1)), 24, 24, 3), name="before")
    if kind == "max":
        p = g.max_pool2d(h, kernel, stride, padding, ceil_mode=ceil, name="pool")
    else:
        p = g.avg_pool2d(h, kernel, stride, padding, ceil_mode=ceil, count_include_pad=include, name="pool")
    p = g.relu(conv(g, g.relu(conv(g, p, 24, 16, 2)), 16, 16, 4))
    g.set_outputs([conv(g, p, 16, 16, 5, name="after")])
    cg = compiled(g)
    assert f"{kind}_pool2d" in held_ops(cg) and held_ops(cg) & {"conv2d", "fused_conv"}
    feeds = {"x": rand((2, 16, 13, 13), 0)}
    feeds["x"][0, 3, 5, 5] = np.nan  # NaN stays NaN through a max (and a sum)
    cg_out = cg.run(feeds)[0]
    want = reference.evaluate(g, feeds)[0]
    assert np.array_equal(np.isnan(cg_out), np.isnan(want))
    np.testing.assert_allclose(cg_out, want, rtol=2e-4, atol=2e-4)


def ceil_mode_plane(h: int, w: int, k: int, s: int, p: int) -> tuple[int, int] | None:
    """A k x k pool's output plane with ceil_mode's extra row and column (no window starting
    past the padding); None where the IR takes no such pool (padding past half the window,
    an empty plane)."""
    if p * 2 > k:
        return None
    oh, ow = (h + 2 * p - k + s - 1) // s + 1, (w + 2 * p - k + s - 1) // s + 1
    oh -= (oh - 1) * s >= h + p
    ow -= (ow - 1) * s >= w + p
    return (oh, ow) if oh >= 1 and ow >= 1 else None


@needs_chains
@settings(max_examples=40, deadline=None)
@given(c=st.sampled_from([1, 5, 16, 20, 33]), h=st.integers(1, 9), w=st.integers(1, 70), k=st.integers(1, 3),
       s=st.integers(1, 2), p=st.integers(0, 1), kind=st.integers(0, 2), threads=st.integers(1, 2))
def test_the_nchw_to_nhwc_pool_kernel_matches_its_numpy_form(c: int, h: int, w: int, k: int, s: int, p: int,
                                                             kind: int, threads: int) -> None:
    """``rlx_pool_to_nhwc`` (NCHW in, NHWC out) against its fallback (the padded pool's
    numpy form, transposed): channels in blocks of 16 and a partial block, rows wider than
    one chunk of 64 outputs, windows clipped at every edge, ceil_mode's extra row and
    column; inf, -inf and NaN as numpy's."""
    out = ceil_mode_plane(h, w, k, s, p)
    if out is None:
        return
    oh, ow = out
    x = rand((2, c, h, w), c + h)
    x.flat[::7], x.flat[3::11], x.flat[5::29] = np.inf, -np.inf, np.nan
    pads = (p, p, p, p)
    got = np.zeros((2, oh, ow, c), F32)
    LIB.pool_to_nhwc(x.ctypes.data, got.ctypes.data, 2, c, h, w, k, k, s, s, *pads, oh, ow, kind, threads)
    want = np.zeros_like(got)
    with np.errstate(invalid="ignore"):
        native_nn.pool_to_nhwc_numpy((2, c, h, w, k, k, s, s, *pads, oh, ow, kind))(x, want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@needs_chains
@settings(max_examples=40, deadline=None)
@given(c=st.sampled_from([1, 5, 16, 20, 33]), h=st.integers(1, 9), w=st.integers(1, 9), k=st.integers(1, 3),
       s=st.integers(1, 3), p=st.integers(0, 1), kind=st.integers(0, 2), threads=st.integers(1, 2))
def test_the_pool_kernel_matches_its_numpy_form(c: int, h: int, w: int, k: int, s: int, p: int, kind: int,
                                                threads: int) -> None:
    """``rlx_pool_nhwc`` against ``conv_nhwc._pool_numpy`` (its fallback), any plane,
    window, stride and padding, with ceil_mode's extra row and column."""
    out = ceil_mode_plane(h, w, k, s, p)
    if out is None:
        return
    oh, ow = out
    x = rand((2, h, w, c), c + h)
    x.flat[::7], x.flat[3::11], x.flat[5::29] = np.inf, -np.inf, np.nan  # a max of inf and -inf is inf, not NaN
    geometry = (2, h, w, c, k, k, s, s, p, p, p, p, oh, ow, kind)
    got = np.zeros((2, oh, ow, c), F32)
    LIB.pool_nhwc(x.ctypes.data, got.ctypes.data, *geometry, threads)
    want = np.zeros_like(got)
    with np.errstate(invalid="ignore"):
        conv_nhwc._pool_numpy(geometry)(x, want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
