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
    """A first plan is bound again on the block where that saves ``REPLAN_BYTES`` (here
    any saving: the graph is small); later plans are always on the block."""
    from rlx_cpu import executor

    monkeypatch.setattr(executor, "REPLAN_BYTES", 0)
    g = _dense_block()
    exe = _compile(g)
    planned = exe.plan_stats()
    free = _compile(g)
    free._layouts[False] = False  # this executable's plans bound with the free list
    free._pool.clear()
    x = np.random.default_rng(1).standard_normal((2, 8, 24, 24)).astype(np.float32)
    want = reference.evaluate(g, {"x": x})[0]
    np.testing.assert_allclose(free.run({"x": x})[0], want, rtol=1e-4, atol=1e-5)
    listed = free._pool[0].stats
    assert planned["buffers"] == 1 and planned["buffer_bytes"] < 0.75 * listed.buffer_bytes, (planned, listed)
    np.testing.assert_allclose(exe.run({"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_a_small_gain_keeps_the_first_binding_and_later_plans_take_the_block() -> None:
    g = _dense_block(3)
    exe = _compile(g)
    first = exe.plan_stats()
    layout = exe._layouts[False]
    assert layout and first["buffer_bytes"] - layout.total < plan_arena.REPLAN_BYTES and first["buffers"] > 1
    second = exe._bind_plan()  # (as a concurrent run would)
    assert second.stats.buffers == 1 and second.stats.buffer_bytes == layout.total
    x = np.random.default_rng(3).standard_normal((2, 8, 24, 24)).astype(np.float32)
    np.testing.assert_allclose(second.run({"x": x})[0], reference.evaluate(g, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_a_binding_that_differs_from_its_recording_falls_back_to_the_free_list(
        caplog: pytest.LogCaptureFixture) -> None:
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
