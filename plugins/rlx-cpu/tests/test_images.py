"""Runs of per-image layers bound image by image (``images.py``): the same answers as the
whole-batch plan and the float64 reference, whatever the chunk of images a call, the
operands broadcast over the batch and the values read after a run; and which nodes make
a run."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_core.ir.ops import OpKind
from rlx_cpu import CpuBackend, images, layout, onednn, warm_pool

PLANE = 64  # 64 x 64 planes: 4096 pixels, a large node from 16 channels (256 KiB an image)


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def compile_cpu(g: Graph) -> rlx.CompiledGraph:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


def block_graph(batch: int) -> Graph:
    """A mobile net's first blocks over 64 x 64 planes: a stem, a depthwise convolution, an
    expansion, a squeeze-excitation scale (a per-image (N, C, 1, 1) operand), a projection
    with a residual, a max pool; then an input broadcast over the batch (1, C, H, W) added
    to a value read again after the run, and a softmax (not per image) that ends it."""
    g = Graph("blocks")
    x = g.input("x", (batch, 3, PLANE, PLANE))
    shift = g.input("shift", (1, 16, PLANE, PLANE))
    stem = g.relu(g.conv2d(x, g.param("w0", rand((16, 3, 3, 3), 1) / 4), g.param("b0", rand((16,), 2)), padding=1))
    dw = g.relu(g.conv2d(stem, g.param("w1", rand((16, 1, 3, 3), 3) / 3), g.param("b1", rand((16,), 4)),
                         padding=1, groups=16))
    exp = g.relu(g.conv2d(dw, g.param("w2", rand((32, 16, 1, 1), 5) / 4), g.param("b2", rand((32,), 6))))
    squeeze = g.sigmoid(g.conv2d(g.global_avg_pool2d(exp), g.param("w3", rand((32, 32, 1, 1), 7) / 6)))
    scaled = g.mul(exp, squeeze)
    proj = g.add(g.conv2d(scaled, g.param("w4", rand((16, 32, 1, 1), 8) / 6), g.param("b4", rand((16,), 9))), stem)
    moved = g.add(proj, shift)  # an input every image reads, dead after this node
    pooled = g.max_pool2d(g.relu(moved), 3, stride=1, padding=1)
    head = g.softmax(g.reshape(pooled, (batch, 16 * PLANE * PLANE)), axis=-1)
    g.set_outputs([head, g.mul(proj, 0.5)])  # proj read after the run
    return g


@pytest.fixture(autouse=True)
def _nchw(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every value NCHW: a chain held channels-last (layout.py) is not bound image by image."""
    monkeypatch.setenv("RLX_CPU_LAYOUT", "nchw")


@pytest.mark.parametrize(("batch", "budget", "chunk"), [(4, 1 << 20, 1), (5, 3 << 20, 2), (3, 1 << 30, 0)])
def test_a_run_image_by_image_computes_what_the_whole_batch_plan_does(monkeypatch: pytest.MonkeyPatch, batch: int,
                                                                      budget: int, chunk: int) -> None:
    """One image a call, two (batch 5: a last chunk of one image; the widest node, the
    scale's product, reads and writes 1 MiB an image), and a budget that takes the whole
    batch (no run)."""
    monkeypatch.setattr(images, "BUDGET_BYTES", budget)
    g = block_graph(batch)
    feeds = {"x": rand((batch, 3, PLANE, PLANE), 10), "shift": rand((1, 16, PLANE, PLANE), 11)}
    by_image = compile_cpu(g)
    runs = by_image._exe._segments
    monkeypatch.setenv("RLX_CPU_PER_IMAGE", "0")
    whole = compile_cpu(g)
    assert whole._exe._segments == () and whole._exe.plan_stats()["per_image"] == 0
    if not chunk:
        assert runs == ()
    else:
        assert len(runs) == 1 and runs[0].chunk == chunk
        assert by_image._exe.plan_stats()["per_image"] == len(runs[0].nodes) >= 6
    want = reference.evaluate(g, feeds)
    for _ in range(2):  # the plan's buffers reused by a second run
        got, again = by_image.run(feeds), whole.run(feeds)
        for a, b, w in zip(got, again, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # (kernels picked per size: other sums)
            np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5)


def test_values_read_only_inside_a_run_take_one_chunk_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the run's output keeps a whole batch; its stem, depthwise and expansion
    values take one image each (convolutions on the implicit GEMM: no scratch of a kernel
    timed per host; no warm pool, whose buffers may be up to twice a request)."""
    monkeypatch.setattr(warm_pool, "_POOL", warm_pool.WarmPool(0))
    monkeypatch.setattr(images, "BUDGET_BYTES", 1 << 20)
    monkeypatch.setenv("RLX_CPU_CONV", "implicit")
    g = Graph("chain")
    x = g.input("x", (8, 3, PLANE, PLANE))
    stem = g.relu(g.conv2d(x, g.param("w0", rand((16, 3, 3, 3), 1)), padding=1))
    dw = g.relu(g.conv2d(stem, g.param("w1", rand((16, 1, 3, 3), 2)), padding=1, groups=16))
    exp = g.relu(g.conv2d(dw, g.param("w2", rand((32, 16, 1, 1), 3))))
    g.set_outputs([g.conv2d(exp, g.param("w3", rand((16, 32, 1, 1), 4)))])
    by_image = compile_cpu(g)
    monkeypatch.setenv("RLX_CPU_PER_IMAGE", "off")
    whole = compile_cpu(g)
    assert by_image._exe.plan_stats()["per_image"] == 4
    assert by_image._exe.plan_stats()["buffer_bytes"] < 0.6 * whole._exe.plan_stats()["buffer_bytes"]
    feeds = {"x": rand((8, 3, PLANE, PLANE), 5)}
    np.testing.assert_allclose(by_image.run(feeds)[0], reference.evaluate(g, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chains", ["native", "onednn"])
def test_a_run_over_values_held_channels_last(monkeypatch: pytest.MonkeyPatch, chains: str) -> None:
    """A chain of ungrouped convolutions held NHWC (``layout.py``: rlx's channels-inner
    kernel, or oneDNN's) bound image by image: each image's NHWC slice, the chain's entry
    and exit transposes per image too."""
    monkeypatch.setenv("RLX_CPU_LAYOUT", "auto")
    if chains == "onednn":
        if onednn.find_library() is None:
            pytest.skip("oneDNN is not installed (pip install 'rlx-cpu[onednn]')")
        monkeypatch.setenv("RLX_CPU_ONEDNN", "on")
    elif not layout.native_chains():
        pytest.skip("rlx's channels-last chains need an AVX-512 host and the native kernels")
    g = Graph("chain")
    x = g.input("x", (3, 16, PLANE, PLANE))
    a = g.relu(g.conv2d(x, g.param("w0", rand((16, 16, 3, 3), 1) / 8), g.param("b0", rand((16,), 2)), padding=1))
    b = g.relu(g.conv2d(a, g.param("w1", rand((32, 16, 1, 1), 3) / 4)))
    c = g.add(g.conv2d(b, g.param("w2", rand((16, 32, 1, 1), 4) / 6)), a)
    d = g.relu(g.conv2d(c, g.param("w3", rand((16, 16, 3, 3), 6) / 8), padding=1))
    e = g.conv2d(d, g.param("w4", rand((16, 16, 1, 1), 7) / 4))  # (a native chain: 3 convolutions NHWC both sides)
    g.set_outputs([g.max_pool2d(e, 2, stride=2)])
    cg = compile_cpu(g)
    exe = cg._exe
    assert exe._cl, "no value held channels-last"
    assert any(nid in exe._cl for seg in exe._segments for nid in seg.nodes)
    feeds = {"x": rand((3, 16, PLANE, PLANE), 5)}
    for _ in range(2):
        np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_dense_block_runs_image_by_image_through_its_concatenations(monkeypatch: pytest.MonkeyPatch) -> None:
    """DenseNet's layers: each a normalization, a 1x1 and a 3x3 convolution whose output
    joins every earlier one along the channels; the joined values are read only inside
    the run (one chunk each, reused in node order with the kernels' scratch)."""
    monkeypatch.setattr(images, "BUDGET_BYTES", 1 << 20)
    g = Graph("dense block")
    x = g.input("x", (3, 16, PLANE, PLANE))
    feats = [g.relu(x)]
    for k in range(3):
        joined = g.concat(feats, axis=1) if len(feats) > 1 else feats[0]
        c = 16 + 8 * k
        normed = g.relu(g.add(g.mul(joined, g.param(f"s{k}", rand((c, 1, 1), 10 + k))),
                              g.param(f"t{k}", rand((c, 1, 1), 20 + k))))
        mid = g.relu(g.conv2d(normed, g.param(f"a{k}", rand((16, c, 1, 1), 30 + k) / 4)))
        feats.append(g.conv2d(mid, g.param(f"b{k}", rand((8, 16, 3, 3), 40 + k) / 8), padding=1))
    g.set_outputs([g.max_pool2d(g.concat(feats, axis=1), 2, stride=2)])
    cg = compile_cpu(g)
    exe = cg._exe
    assert any(exe._nodes[nid].op is OpKind.CONCAT for seg in exe._segments for nid in seg.nodes)
    feeds = {"x": rand((3, 16, PLANE, PLANE), 5)}
    for _ in range(2):
        np.testing.assert_allclose(cg.run(feeds)[0], reference.evaluate(g, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_run_does_not_start_at_a_node_shrinking_its_input() -> None:
    """A stem's pool over a plane four times larger: its input would stay alive through
    the run beside the run's output. The run starts after it."""
    g = Graph("pooled stem")
    x = g.input("x", (8, 16, 2 * PLANE, 2 * PLANE))
    pooled = g.max_pool2d(x, 2, stride=2)
    a = g.relu(pooled)
    b = g.relu(g.conv2d(a, g.param("w", rand((16, 16, 1, 1), 1))))
    g.set_outputs([g.softmax(g.add(a, b), axis=1)])
    nodes = g.nodes
    found = images.segments(nodes, [n.op is OpKind.PARAM for n in nodes], [True] * len(nodes))
    assert [seg.nodes[0] for seg in found] == [a.id] and pooled.id not in found[0].nodes


def test_which_nodes_make_a_run() -> None:
    """Convolutions with resident weights, pools and elementwise ops over per-image or
    broadcast operands; a run starts and ends at large nodes; batch 1 makes none."""
    g = Graph("runs")
    x = g.input("x", (8, 16, PLANE, PLANE))
    w = g.input("w", (16, 16, 1, 1))  # weights known only at run time
    conv = g.conv2d(x, g.param("k", rand((16, 16, 1, 1), 1)))
    a = g.relu(conv)
    small = g.global_avg_pool2d(a)
    b = g.mul(a, small)
    c = g.conv2d(b, w)  # not per image: its weights are an input
    d = g.relu(c)
    e = g.add(d, g.param("bias", rand((16, 1, 1), 2)))
    g.set_outputs([g.softmax(e, axis=1)])
    nodes = g.nodes
    resident = [n.op in (OpKind.PARAM, OpKind.CONSTANT) for n in nodes]
    found = images.segments(nodes, resident, [True] * len(nodes))
    assert [seg.nodes for seg in found] == [(conv.id, a.id, small.id, b.id), (d.id, e.id)]
    assert [seg.chunk for seg in found] == [3, 4]  # 2 MiB over 256 KiB read twice and written (and 64 bytes)
    heavy = Graph("bound by products")  # 3x3 over 16 channels: 144 products an output, more than LIGHT_MACS
    z = heavy.input("x", (8, 16, PLANE, PLANE))
    for k in range(3):
        z = heavy.conv2d(z, heavy.param(f"w{k}", rand((16, 16, 3, 3), k)), padding=1)
    heavy.set_outputs([heavy.softmax(z, axis=1)])
    nodes = heavy.nodes
    assert images.segments(nodes, [n.op is OpKind.PARAM for n in nodes], [True] * len(nodes)) == []
    batched = Graph("a constant with a batch axis")
    y = batched.input("x", (8, 16, PLANE, PLANE))
    per_image = batched.param("per image", rand((8, 16, PLANE, PLANE), 3))  # (read whole by binding)
    batched.set_outputs([batched.relu(batched.add(batched.relu(y), per_image))])
    nodes = batched.nodes
    assert images.segments(nodes, [n.op is OpKind.PARAM for n in nodes], [True] * len(nodes)) == []
    one = Graph("one image")
    y = one.input("x", (1, 16, PLANE, PLANE))
    one.set_outputs([one.relu(one.relu(y))])
    assert images.segments(one.nodes, [False] * len(one.nodes), [True] * len(one.nodes)) == []


def test_the_setting_turns_runs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    g = Graph("off")
    y = g.input("x", (8, 16, PLANE, PLANE))
    g.set_outputs([g.relu(g.relu(y))])
    every = [True] * len(g.nodes)
    assert images.segments(g.nodes, [False] * len(g.nodes), every) != []
    monkeypatch.setenv("RLX_CPU_PER_IMAGE", "off")
    assert images.segments(g.nodes, [False] * len(g.nodes), every) == []
