"""Whether other processes held this process's CPUs over a span (``rlx_cpu.load``): read
off ``/proc/stat`` and this process's CPU time, so that a verdict timed under load is not
kept (``verdicts.settled``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlx_cpu import load

REAL_METER = load.Meter  # conftest makes every other test's host quiet


def stat(busy_ticks: tuple[int, int], idle_ticks: tuple[int, int]) -> str:
    """``/proc/stat``'s first lines for two CPUs: user and idle ticks, the rest zero."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for n, (b, i) in enumerate(zip(busy_ticks, idle_ticks, strict=True)):
        lines.append(f"cpu{n} {b} 0 0 {i} 0 0 0 0 0 0")
    return "\n".join([*lines, "intr 0", "ctxt 0"]) + "\n"


def test_the_share_is_what_the_cpus_spent_busy_less_this_process(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "stat"
    monkeypatch.setattr(load, "_STAT", path)
    monkeypatch.setattr(load, "_cpus", lambda: frozenset({0, 1}))
    monkeypatch.setattr(load.os, "sysconf", lambda name: 100)
    own = iter([10.0, 10.3])  # this process: 0.3 s of CPU over the span
    monkeypatch.setattr(load.time, "process_time", lambda: next(own))
    path.write_text(stat((1000, 1000), (5000, 5000)))
    with REAL_METER() as meter:
        # 1 s of wall on each CPU: 80 + 50 ticks busy (1.3 s), 0.3 s of it this process's
        path.write_text(stat((1080, 1050), (5020, 5050)))
    assert meter.others == pytest.approx(1.0 / 2.0) and meter.busy


def test_a_span_it_cannot_read_is_unknown_and_not_busy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load, "_STAT", tmp_path / "absent")
    with REAL_METER() as meter:
        pass
    assert meter.others is None and not meter.busy


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the share is read off Linux's /proc/stat")
def test_a_busy_process_beside_this_one_is_seen() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # started and spinning
        with REAL_METER() as meter:
            time.sleep(0.3)
    finally:
        child.kill()
        child.wait()
    # one busy thread on this process's CPUs takes a whole one of them (half of two, all
    # of one): the other pytest worker can only add to it
    assert meter.others is not None and meter.others >= 1.0 / len(load._cpus() or {0, 1}) - 0.1
    assert meter.busy
