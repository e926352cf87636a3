"""A convolution's SiLU as oneDNN's swish post-op or as a native region after it
(``rlx_cpu.swish``): a verdict timed once on the host and kept, or forced by
``RLX_CPU_SWISH``; either way the answer is the float32 reference's, and under bf16 a
region after a convolution writing a held value reads and writes it as it lies."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core.ir import Graph
from rlx_core.reference import evaluate
from rlx_cpu import bf16_units, held, onednn, swish, verdicts

HAS_ONEDNN = onednn.library() is not None
needs_onednn = pytest.mark.skipif(not HAS_ONEDNN, reason="oneDNN (rlx-cpu[onednn]) runs the post-op")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A verdict store of this test's own, and no verdict in this process."""
    monkeypatch.setattr(verdicts, "VERDICTS", verdicts.HostVerdicts(tmp_path))
    monkeypatch.setattr(swish, "VERDICT", verdicts.TimedAnswer(swish.VERDICT.question, lambda yes, why: None))
    monkeypatch.delenv("RLX_CPU_SWISH", raising=False)


def _silu_chain(rng: np.random.Generator) -> Graph:
    """A 1x1 expansion and a depthwise 3x3, each followed by SiLU as EfficientNet exports it."""
    g = Graph("silu")
    x = g.input("x", (2, 8, 10, 10))
    a = g.conv2d(x, g.param("w1", (rng.standard_normal((24, 8, 1, 1)) / 3).astype(np.float32)),
                 g.param("b1", rng.standard_normal(24).astype(np.float32)))
    a = g.mul(a, g.sigmoid(a))
    d = g.conv2d(a, g.param("w2", (rng.standard_normal((24, 1, 3, 3)) / 3).astype(np.float32)), padding=1, groups=24)
    d = g.mul(d, g.sigmoid(d))
    g.set_outputs([g.conv2d(d, g.param("w3", (rng.standard_normal((8, 24, 1, 1)) / 5).astype(np.float32)))])
    return g


def test_the_setting_forces_either_way_without_timing(monkeypatch, fresh):
    monkeypatch.setattr(swish, "_measure", lambda lib: pytest.fail("a forced way is never timed"))
    monkeypatch.setenv("RLX_CPU_SWISH", "post-op")
    assert swish.post_op(None) == (True, "RLX_CPU_SWISH=post-op")
    monkeypatch.setenv("RLX_CPU_SWISH", "region")
    assert swish.post_op(None) == (False, "RLX_CPU_SWISH=region")
    assert swish.describe() == "region (RLX_CPU_SWISH)"


def test_the_verdict_is_timed_once_and_kept_across_processes(monkeypatch, fresh):
    calls = []
    monkeypatch.setattr(swish, "_measure", lambda lib: calls.append(lib) or (False, "made up: the region won"))
    assert swish.describe() == "timed at the first convolution with a SiLU"
    assert swish.post_op("lib") == (False, "made up: the region won")
    assert swish.post_op("lib")[0] is False and calls == ["lib"]
    monkeypatch.setattr(swish, "VERDICT", verdicts.TimedAnswer(swish.VERDICT.question, lambda yes, why: None))
    # ^ a new process: the cache answers
    assert "made up: the region won; timed" in swish.describe()
    assert swish.post_op("lib")[0] is False and calls == ["lib"]


def test_a_failing_probe_keeps_the_post_op(monkeypatch, fresh):
    def broken(*args):
        raise RuntimeError("no convolution for you")

    monkeypatch.setattr(swish, "_ways", broken)
    yes, why = swish._measure(None)
    assert yes and "RuntimeError: no convolution for you" in why


@needs_onednn
def test_the_probe_times_both_ways_here(fresh):
    yes, why = swish._measure(onednn.library())
    assert isinstance(yes, bool) and "the region ran" in why and "x the post-op's speed" in why


@needs_onednn
@pytest.mark.parametrize("way", ["post-op", "region"])
def test_either_way_answers_as_the_reference(monkeypatch, way):
    monkeypatch.setenv("RLX_CPU_SWISH", way)
    g = _silu_chain(np.random.default_rng(1))
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 8, 10, 10)).astype(np.float32)}
    got = rlx.compile(g, device="cpu").run(feeds)[0]
    np.testing.assert_allclose(got, evaluate(g, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not HAS_ONEDNN or "bf16" not in rlx.get_backend("cpu").precisions()
                    or bf16_units.unit() is None, reason="bf16 needs a CPU with a bf16 unit")
def test_a_region_after_a_convolution_writing_bf16_reads_it_as_it_lies(monkeypatch):
    """Under bf16 the convolutions write their held results bf16 and the SiLU runs over
    them in place on the native interpreter: nothing between conversions."""
    monkeypatch.setenv("RLX_CPU_BF16", "on")  # what bf16 computes, not whether it pays here
    monkeypatch.setenv("RLX_CPU_SWISH", "region")
    widened = []
    real = held._widened
    monkeypatch.setattr(held, "_widened",
                        lambda lib, node, *a, **k: widened.append(node.op) or real(lib, node, *a, **k))
    g = _silu_chain(np.random.default_rng(3))
    cg = rlx.compile(g, device="cpu", precision="bf16")
    assert "2 values held bf16" in " ".join(cg.report().notes)
    assert widened == []
    feeds = {"x": np.random.default_rng(4).standard_normal((2, 8, 10, 10)).astype(np.float32)}
    exact = evaluate(g, feeds)[0]
    monkeypatch.setenv("RLX_CPU_SWISH", "post-op")
    fused = rlx.compile(g, device="cpu", precision="bf16").run(feeds)[0]
    got = cg.run(feeds)[0]
    assert 1e-5 < np.abs(got - exact).max() / np.abs(exact).max() < 3e-2
    np.testing.assert_allclose(got, fused, rtol=0, atol=3e-2 * np.abs(exact).max())
