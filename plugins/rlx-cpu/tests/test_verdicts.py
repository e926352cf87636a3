"""The timed verdicts kept on disk (``rlx_cpu.verdicts``): reused while the host, code and
settings are the same and the entry is young, timed again otherwise, never a failure."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from rlx_cpu import conv_choice, gemm, load, verdicts


class Counter:
    def __init__(self, answer: tuple[bool, str] = (True, "timed 1.30x")) -> None:
        self.calls = 0
        self.answer = answer

    def __call__(self) -> dict[str, object]:
        self.calls += 1
        return {"yes": self.answer[0], "why": self.answer[1]}


def test_a_verdict_is_timed_once_then_recalled_by_a_later_process(tmp_path: Path) -> None:
    measure = Counter()
    first = verdicts.settled("q", measure, verdicts.HostVerdicts(tmp_path))
    assert first == {"yes": True, "why": "timed 1.30x"} and measure.calls == 1
    again = verdicts.settled("q", measure, verdicts.HostVerdicts(tmp_path))  # a new object: a new process
    assert measure.calls == 1
    assert again["yes"] is True and again["why"].startswith("timed 1.30x; timed ")
    assert "kept in rlx's cache" in again["why"]
    assert verdicts.settled("other", measure, verdicts.HostVerdicts(tmp_path))["why"] == "timed 1.30x"
    assert measure.calls == 2


def test_a_changed_setting_old_entry_or_forget_times_it_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    measure = Counter()
    store = verdicts.HostVerdicts(tmp_path)
    verdicts.settled("q", measure, store)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a verdict kept for other settings is no warning
        monkeypatch.setenv("RLX_CPU_BIND", "0")  # other settings: timed again, then kept for them
        verdicts.settled("q", measure, store)
        assert measure.calls == 2
        verdicts.settled("q", measure, store)
        monkeypatch.delenv("RLX_CPU_BIND")  # back: the first settings' verdict is still there
        verdicts.settled("q", measure, store)
        assert measure.calls == 2
        with monkeypatch.context() as patch:
            patch.setattr(verdicts, "_cpu", lambda: "another CPU")  # another host: replaced, silently
            verdicts.settled("q", measure, store)
            assert measure.calls == 3
            verdicts.settled("q", measure, store)
            assert measure.calls == 3
        verdicts.settled("q", measure, store)  # this CPU again: its entry was replaced
        assert measure.calls == 4
    verdicts.settled("q", measure, verdicts.HostVerdicts(tmp_path, ttl_s=0.0))  # too old
    assert measure.calls == 5
    store.forget("q")
    verdicts.settled("q", measure, store)
    assert measure.calls == 6


def busy_meter(shares: list[float]) -> type[load.Meter]:
    """A ``load.Meter`` that reads ``shares`` in turn, as other processes took them."""

    class Busy(load.Meter):
        def __exit__(self, *exc: object) -> None:
            self.others = shares.pop(0)
    return Busy


def test_a_verdict_timed_under_load_is_timed_again_and_kept_only_once_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([(False, "timed 0.71x"), (True, "timed 1.90x")])
    calls = []

    def measure() -> dict[str, object]:
        calls.append(1)
        yes, why = next(answers)
        return {"yes": yes, "why": why}
    monkeypatch.setattr(load, "Meter", busy_meter([0.55, 0.02]))
    found = verdicts.settled("q", measure, verdicts.HostVerdicts(tmp_path))
    assert found == {"yes": True, "why": "timed 1.90x"} and len(calls) == 2  # the quiet second timing
    monkeypatch.setattr(load, "Meter", busy_meter([]))  # a later process recalls it, times nothing
    assert verdicts.settled("q", measure, verdicts.HostVerdicts(tmp_path))["yes"] is True and len(calls) == 2


def test_a_verdict_timed_under_load_twice_serves_this_process_only(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    measure = Counter((False, "timed 0.71x"))
    monkeypatch.setattr(load, "Meter", busy_meter([0.60, 0.48]))
    found = verdicts.settled("q", measure, verdicts.HostVerdicts(tmp_path))
    assert measure.calls == 2 and found["yes"] is False
    assert found["why"] == ("timed 0.71x; timed while other processes took 48% of the CPUs: for this process only, "
                            "timed again by the next")
    monkeypatch.setattr(load, "Meter", busy_meter([0.0]))
    assert verdicts.settled("q", measure, verdicts.HostVerdicts(tmp_path)) == {"yes": False, "why": "timed 0.71x"}
    assert measure.calls == 3  # nothing was kept: timed again, quiet now, and kept
    assert verdicts.settled("q", measure, verdicts.HostVerdicts(tmp_path))["why"].startswith("timed 0.71x; timed ")


def test_a_timed_answer_is_asked_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdicts, "VERDICTS", verdicts.HostVerdicts(tmp_path))
    told, measure = [], Counter((True, "timed 1.50x"))
    answer = verdicts.TimedAnswer("q", lambda yes, why: told.append((yes, why)))
    assert answer.known() is None
    for _ in range(2):
        assert answer.answer(lambda: tuple(measure().values())) == (True, "timed 1.50x")
    assert measure.calls == 1 and told == [(True, "timed 1.50x")]
    later = verdicts.TimedAnswer("q", lambda yes, why: None)  # another process: the cache tells it
    assert later.known()[1].startswith("timed 1.50x; timed ")
    answer.reset()
    assert answer.known() is None and later.known() is None


def test_an_entry_from_the_future_or_for_another_question_is_not_used(tmp_path: Path) -> None:
    measure = Counter()
    store = verdicts.HostVerdicts(tmp_path)
    verdicts.settled("q", measure, store)
    path = next((tmp_path / "cpu-verdicts").glob("q-*.json"))
    entry = json.loads(path.read_text())
    entry["payload"]["at"] += 3600.0
    path.write_text(json.dumps(entry))
    verdicts.settled("q", measure, store)
    assert measure.calls == 2
    entry = json.loads(path.read_text())
    entry["payload"]["question"] = "another"
    path.write_text(json.dumps(entry))
    verdicts.settled("q", measure, store)
    assert measure.calls == 3


def test_a_cache_that_cannot_be_written_only_costs_the_probe(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"  # the cache's root is a file: nothing can be written under it
    blocker.write_text("not a directory")
    measure = Counter((False, "timed 0.80x"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing the user asked for: no warning
        for _ in range(2):
            found = verdicts.settled("q", measure, verdicts.HostVerdicts(blocker))
            assert found == {"yes": False, "why": "timed 0.80x"}
    assert measure.calls == 2


def test_the_gemm_decision_is_kept_with_its_deep_verdict(monkeypatch: pytest.MonkeyPatch, native_lib: object) -> None:
    calls = []

    def fake(lib: object) -> gemm.Decision:
        calls.append(lib)
        return gemm.Decision(True, "timed 1.2x", deep=False)

    monkeypatch.setattr(gemm, "_measure", fake)
    monkeypatch.delenv("RLX_CPU_GEMM", raising=False)
    gemm.reset()
    try:
        assert gemm.use_native(64) and not gemm.use_native(4096)
        gemm._DECIDED.clear()  # as a new process would start: only the disk remembers
        assert gemm.use_native(64) and not gemm.use_native(4096)
        assert len(calls) == 1
        assert "kept in rlx's cache" in gemm.describe()
    finally:
        gemm.reset()
    assert not list((Path(os.environ["RLX_CACHE_DIR"]) / "cpu-verdicts").glob("gemm-*.json"))


def test_conv_choice_reset_times_again(monkeypatch: pytest.MonkeyPatch, native_lib: object) -> None:
    calls = []
    monkeypatch.setattr(conv_choice, "_measure", lambda lib: calls.append(lib) or (True, "timed 1.5x"))
    monkeypatch.delenv("RLX_CPU_CONV", raising=False)
    conv_choice.reset()
    try:
        assert conv_choice.use_implicit()
        conv_choice._DECIDED.clear()
        assert conv_choice.use_implicit()
        assert len(calls) == 1
        conv_choice.reset()
        assert conv_choice.use_implicit()
        assert len(calls) == 2
    finally:
        conv_choice.reset()
