"""The one timer (``rlx_core.timer``): its rules, on a fake clock so that figures are exact."""

from __future__ import annotations

import gc
import types

import pytest

from rlx_core import timer
from rlx_core.timer import Entry, EntryFailed, best_of, first_quartile, interleave, loops_for, per_call, warm_up


class FakeClock:
    """``perf_counter`` that advances only when a timed call says how long it took."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timer, "time", types.SimpleNamespace(perf_counter=fake.perf_counter, sleep=fake.sleep))
    return fake


def taking(clock: FakeClock, durations: list[float], log: list[float] | None = None):
    """A callable whose k-th call lasts ``durations[k]`` (the last one repeats)."""
    calls = iter(durations)
    last = [durations[-1]]

    def call() -> None:
        d = next(calls, last[0])
        clock.now += d
        if log is not None:
            log.append(d)

    return call


def test_per_call_divides_a_block_and_keeps_the_collector_off_inside_it(clock):
    seen = []
    fn = taking(clock, [0.5])
    assert per_call(lambda: (seen.append(gc.isenabled()), fn()), 4) == 0.5
    assert seen == [False] * 4 and gc.isenabled()
    assert per_call(fn, 0) == 0.5  # at least one call


def test_best_of_warms_up_then_keeps_the_shortest_call(clock):
    log: list[float] = []
    assert best_of(taking(clock, [9.0, 3.0, 1.0, 2.0], log), 3) == 1.0
    assert log == [9.0, 3.0, 1.0, 2.0]  # the warm call is not among the timed ones


def test_loops_for_sizes_a_block_from_the_fastest_of_three_calls(clock):
    assert loops_for(taking(clock, [5.0, 0.25, 0.125, 0.5]), 1.0) == 8
    assert loops_for(taking(clock, [1.0]), 0.1) == 1  # never below one call
    assert loops_for(taking(clock, [1e-9]), 1.0, most=50) == 50
    loops_for(taking(clock, [1.0]), 0.1, pause=0.15)
    assert clock.slept == [0.15]


def test_warm_up_stops_at_its_call_count_or_its_budget(clock):
    assert warm_up(taking(clock, [0.01]), calls=20, budget=1.0) == 20
    assert warm_up(taking(clock, [0.4]), calls=20, budget=1.0) == 3
    assert warm_up(taking(clock, [5.0]), calls=20, budget=1.0) == 1


def test_first_quartile_of_the_calls_after_a_warm_one(clock):
    durations = [100.0, 1.0, 2.0, 3.0, 4.0, 50.0]
    assert first_quartile(taking(clock, durations), budget=0.0, most=50) == pytest.approx(1.5)


def test_entries_report_median_best_and_spread():
    e = Entry("x", times=[4.0, 1.0, 3.0, 2.0, 5.0])
    assert (e.median, e.best, e.iqr) == (3.0, 1.0, 3.0)
    assert Entry("y", times=[1.0, 3.0]).iqr == 2.0
    assert Entry("z").median is None and not Entry("z").runnable


def test_interleave_warms_up_then_times_each_round_in_a_shuffled_order(clock):
    order: list[str] = []

    def entry(name: str) -> Entry:
        return Entry(name, run=lambda: (order.append(name), setattr(clock, "now", clock.now + 0.125)))

    entries = [entry(n) for n in "abcd"]
    rounds: list[int] = []
    interleave(entries, 6, lambda e, r: 2, pause=0.15, warmup=3, on_round=rounds.append)
    assert order[:12] == [n for n in "abcd" for _ in range(3)]  # each warmed up, in turn
    timed = order[12:]
    assert all(timed[i:i + 3] == [timed[i]] * 3 for i in range(0, len(timed), 3))  # untimed call + 2 timed
    blocks = timed[::3]
    assert len(blocks) == 24 and all(sorted(blocks[i:i + 4]) == list("abcd") for i in range(0, 24, 4))
    assert len({tuple(blocks[i:i + 4]) for i in range(0, 24, 4)}) > 1  # shuffled, not a fixed rotation
    assert rounds == list(range(6)) and all(e.times == [0.125] * 6 and e.loops == 2 for e in entries)
    assert clock.slept == [0.15] * (4 + 24)  # before every warm-up and every block


def test_interleave_sizes_blocks_to_a_target_and_can_skip_the_settling_call(clock):
    calls: list[str] = []
    fast = Entry("fast", run=lambda: (calls.append("fast"), setattr(clock, "now", clock.now + 0.125)))
    interleave([fast], 2, 1.0, pause=0.0, settle=False)
    assert fast.loops == 8 and fast.times == [0.125] * 2
    assert len(calls) == 1 + 4 + 8 * 2  # warm-up, sizing (a warm call and three), two blocks of 10


def test_interleave_stops_a_failing_entry_with_its_reason_and_goes_on():
    def boom() -> None:
        raise RuntimeError("device lost")

    def crashed(n: int) -> float:
        raise EntryFailed("died with SIGSEGV while timing")

    ok, bad, remote = Entry("ok", run=lambda: None), Entry("bad", run=boom), Entry("remote", block=crashed)
    idle = Entry("idle", note="not installed")
    interleave([ok, bad, remote, idle], 3, lambda e, r: 1, pause=0.0)
    assert len(ok.times) == 3 and ok.note == ""
    assert bad.note == "failed: RuntimeError: device lost" and bad.run is None and bad.times == []
    assert remote.note == "died with SIGSEGV while timing" and remote.block is None
    assert idle.note == "not installed" and idle.times == []


def test_interleave_refuses_what_it_cannot_time():
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        interleave([Entry("a", run=lambda: None)], 0, lambda e, r: 1)
    with pytest.raises(ValueError, match="'remote' is timed elsewhere"):
        interleave([Entry("remote", block=lambda n: 1.0)], 1, 0.1, pause=0.0)
