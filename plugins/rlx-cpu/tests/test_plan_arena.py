"""A plan's buffers laid out in one block from a recording of its requests (``rlx_cpu/plan_arena.py``)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_core import reference
from rlx_core.ir import Graph
from rlx_core.plugin import CompileOptions
from rlx_cpu import CpuBackend, plan_arena
from rlx_cpu.executor import CpuExecutable


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[int], list[int], list[float]]:
    n = draw(st.integers(1, 40))
    sizes = [64 * draw(st.integers(1, 64)) for _ in range(n)]
    starts, ends = [], []
    for k in range(n):
        start = 2 * k
        starts.append(start)
        ends.append(draw(st.one_of(st.just(float("inf")), st.integers(start + 1, 2 * n + 1))))
    return sizes, starts, ends


@settings(max_examples=200, deadline=None)
@given(requests())
def test_no_two_live_requests_share_a_byte_and_the_block_is_no_larger_than_need_be(
        case: tuple[list[int], list[int], list[float]]) -> None:
    sizes, starts, ends = case
    offsets, total, _ = plan_arena.plan_layout(sizes, starts, ends)
    for a in range(len(sizes)):
        assert offsets[a] % plan_arena.ALIGN == 0 and offsets[a] + sizes[a] <= total
        for b in range(a):
            alive_together = starts[a] < ends[b] and starts[b] < ends[a]
            apart = offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a]
            assert apart or not alive_together, (a, b)
    assert total <= sum(sizes)
    peak = max(sum(s for s, a, e in zip(sizes, starts, ends) if a <= t < e) for t in range(2 * len(sizes) + 2))
    assert total >= peak


def _dense_block(layers: int = 6) -> Graph:
    """DenseNet's pattern: each layer reads the concat of every earlier feature map (a new,
    larger concat each time), which a best-fit free list can never serve from the smaller
    buffers given back."""
    rng = np.random.default_rng(0)
    g = Graph("dense-block")
    x = g.input("x", (2, 8, 24, 24))
    feats = [x]
    for i in range(layers):
        cat = g.concat(feats, axis=1) if len(feats) > 1 else feats[0]
        channels = 8 * (i + 1)
        w = g.param(f"w{i}", (rng.standard_normal((8, channels, 3, 3)) / (3 * channels ** 0.5)).astype(np.float32))
        feats.append(g.relu(g.conv2d(g.relu(cat), w, padding=1)))
    g.set_outputs([g.concat(feats, axis=1)])
    return g


def _compile(g: Graph) -> CpuExecutable:
    exe = CpuBackend().compile(g.freeze(), CompileOptions(device="cpu"))
    assert isinstance(exe, CpuExecutable)
    return exe


def test_growing_concats_fit_in_much_less_memory_than_a_free_list_gives_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the block pays (here: always), the first plan is bound again on it, and so is
    every later plan; the block is a fraction of the free list. (The kernels a conv takes
    are measured on the host, so the exact bytes vary from run to run.)"""
    from rlx_cpu import binding

    monkeypatch.setattr(binding, "block_pays", lambda free, block: True)
    g = _dense_block()
    exe = _compile(g)
    planned = exe.plan_stats()
    layout = exe._layouts[False]
    assert layout and planned["buffers"] == 1 and planned["buffer_bytes"] == layout.total
    assert exe._bind_plan().stats.buffer_bytes == layout.total  # (as a concurrent run would)
    monkeypatch.setattr(binding, "block_pays", lambda free, block: False)
    free = _compile(g)
    assert free._layouts[False] is False
    x = np.random.default_rng(1).standard_normal((2, 8, 24, 24)).astype(np.float32)
    want = reference.evaluate(g, {"x": x})[0]
    np.testing.assert_allclose(free.run({"x": x})[0], want, rtol=1e-4, atol=1e-5)
    listed = free.plan_stats()
    assert listed["buffers"] > 1 and planned["buffer_bytes"] < 0.75 * listed["buffer_bytes"], (planned, listed)
    np.testing.assert_allclose(exe.run({"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_the_twin_of_a_plan_in_one_block_lies_in_that_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread tuner's narrow twin of a plan laid out in one block is laid out in the
    same block (its pages faulted in already), even where a block of its own would not
    pay; a free list took the whole block for its first buffer and fresh memory for the
    rest, faulted in during the narrow run the tuner timed."""
    from rlx_cpu import binding

    monkeypatch.setattr(binding, "block_pays", lambda free, block: True)
    g = _dense_block()
    exe = _compile(g)
    plan = exe._pool[0]
    monkeypatch.setattr(binding, "block_pays", lambda free, block: False)  # not for the twin on its own
    twin = exe._bind_plan(narrow=True, over=plan)
    assert len(plan.buffers) == 1 and [id(b) for b in twin.buffers] == [id(plan.buffers[0])]
    assert exe._layouts[True] and twin.stats.buffer_bytes <= plan.buffers[0].nbytes and twin.outputs is plan.outputs
    x = np.random.default_rng(2).standard_normal((2, 8, 24, 24)).astype(np.float32)
    want = reference.evaluate(g, {"x": x})[0]
    np.testing.assert_allclose(twin.run({"x": x})[0], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(plan.run({"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_a_twin_that_does_not_fit_its_plans_block_stays_on_a_free_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the twin's buffers would not fit the lent block and a block of its own would
    not pay, the narrow mode stays on free lists (no block of its own is made)."""
    from rlx_cpu import binding

    monkeypatch.setattr(binding, "block_pays", lambda free, block: False)
    g = _dense_block()
    exe = _compile(g)
    small = np.empty(64, np.uint8)  # a "block" far smaller than the plan needs
    with binding.thread_cap(1):
        twin = exe._bind_in_arena(True, [small], None)
    assert exe._layouts[True] is False and len(twin.buffers) > 1
    x = np.random.default_rng(3).standard_normal((2, 8, 24, 24)).astype(np.float32)
    np.testing.assert_allclose(twin.run({"x": x})[0], reference.evaluate(g, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_a_block_pays_where_it_saves_enough_and_is_a_fraction_of_the_free_list() -> None:
    mb = 1 << 20
    assert plan_arena.block_pays(266 * mb, 61 * mb)  # densenet121 at batch 8
    assert not plan_arena.block_pays(83 * mb, 48 * mb)  # mobilenet_v2 at batch 8: slower when runs come apart
    assert not plan_arena.block_pays(12 * mb, 5 * mb)  # saves less than REPLAN_BYTES


def test_a_binding_that_differs_from_its_recording_falls_back_to_the_free_list(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import binding

    monkeypatch.setattr(binding, "block_pays", lambda free, block: True)
    g = _dense_block(3)
    exe = _compile(g)
    layout = exe._layouts[False]
    assert layout
    events = list(layout.events)
    k = next(i for i, e in enumerate(events) if e[0] == "take")
    events[k] = ("take", events[k][1] + plan_arena.ALIGN)  # the recording says another size
    exe._layouts[False] = plan_arena.Layout(tuple(events), layout.offsets, layout.sizes, layout.total, layout.reused)
    exe._pool.clear()
    x = np.random.default_rng(2).standard_normal((2, 8, 24, 24)).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="rlx_cpu"):
        got = exe.run({"x": x})[0]
    assert "did not replay their recording" in caplog.text and exe._layouts[False] is False
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_the_replay_refuses_any_other_order() -> None:
    stats = plan_arena.PlanStats()
    rec = plan_arena.Recorder(plan_arena.FreeListArena(plan_arena.PlanStats()))
    a = rec.take(100)
    rec.take(200)
    rec.give(a)
    layout = rec.layout()
    arena = plan_arena.PlannedArena(layout, stats)
    first = arena.take(100)
    with pytest.raises(plan_arena.Diverged):
        arena.give(first)  # the recording took a second request first
    arena = plan_arena.PlannedArena(layout, stats)
    arena.take(100)
    with pytest.raises(plan_arena.Diverged):
        arena.take(1000)  # another size
    arena = plan_arena.PlannedArena(layout, stats)
    arena.take(100)
    with pytest.raises(plan_arena.Diverged):
        arena.finish()  # events never came
