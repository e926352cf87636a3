"""The cyclic collector is held off while rlx loads and compiles (``rlx_core._gc``)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import _gc
from rlx_core.run import session


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_blocks_nest_and_restore(collector_on):
    with _gc.paused():
        assert not gc.isenabled()
        with _gc.paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "an inner block must not turn the collector on early"
    assert gc.isenabled()


def test_a_caller_who_switched_it_off_keeps_it_off(collector_on):
    gc.disable()
    with _gc.paused():
        pass
    assert not gc.isenabled()


def test_restored_after_an_exception(collector_on):
    with pytest.raises(ValueError), _gc.paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_threads_share_the_pause(collector_on):
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with _gc.paused():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert entered.wait(10)
    with _gc.paused():
        pass
    assert not gc.isenabled(), "the other thread's block is still open"
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_compile_and_per_shape_compiles_run_paused(collector_on, monkeypatch):
    seen: list[bool] = []
    real = session.compile_on

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(session, "compile_on", spy)
    g = rlx.Graph("g")
    x = g.input("x", ("n", 4), "float32")
    g.set_outputs([g.relu(x)])
    cg = rlx.compile(g, device="cpu")
    out = cg.run({"x": -np.ones((3, 4), np.float32)})[0]  # a new size: compiled again, paused too
    np.testing.assert_array_equal(out, np.zeros((3, 4), np.float32))
    assert len(seen) >= 2 and not any(seen), seen
    assert gc.isenabled()
