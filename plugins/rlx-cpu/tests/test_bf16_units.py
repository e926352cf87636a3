"""Which unit makes bf16 pay (``rlx_cpu.bf16_units``): AMX by its flag; AVX512-BF16 by a
verdict timed once on the host and kept; which of oneDNN's kernels each takes. The
logic runs everywhere on made-up flags and verdicts; the timing itself where the CPU has
AVX512_BF16 and oneDNN is installed."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core.ir import Graph
from rlx_cpu import bf16_units, onednn, verdicts

AVX512 = frozenset({"avx512f", "avx512_bf16"})
AMX = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A verdict store of this test's own, and no verdict in this process."""
    monkeypatch.setattr(verdicts, "VERDICTS", verdicts.HostVerdicts(tmp_path))
    monkeypatch.setattr(bf16_units, "VERDICT", new_process())
    monkeypatch.delenv("RLX_CPU_BF16", raising=False)


def new_process() -> verdicts.TimedAnswer:
    """The bf16 verdict as a new process starts with it: none yet."""
    return verdicts.TimedAnswer(bf16_units.VERDICT.question, lambda yes, why: None)


def test_the_unit_is_read_off_the_flags(monkeypatch):
    for flags, want in ((AMX, bf16_units.AMX), (AVX512, bf16_units.AVX512_BF16), (frozenset({"avx2"}), None)):
        monkeypatch.setattr(verdicts, "cpu_flags", lambda flags=flags: flags)
        assert bf16_units.unit() == want
    assert bf16_units.describe() == "none"


def test_amx_takes_its_own_kernels_without_timing(monkeypatch, fresh):
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: AMX)
    monkeypatch.setattr(bf16_units, "_measure", lambda lib: pytest.fail("AMX is never timed"))
    assert bf16_units.pays(None) == (True, "AMX")
    assert bf16_units.takes(None, "brgconv:avx512_core_amx")
    # A product oneDNN runs on AVX-512's bf16 instructions on an AMX host: too narrow for
    # the tiles, slower than float32 there.
    assert not bf16_units.takes(None, "jit_bf16:avx512_core_bf16")
    assert bf16_units.merges()


@pytest.mark.parametrize("verdict", [True, False], ids=["measured faster", "measured slower"])
def test_avx512_bf16_takes_its_kernels_as_the_host_measured(monkeypatch, fresh, verdict):
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: AVX512)
    calls = []

    def measure(lib):
        calls.append(lib)
        return verdict, "made up"
    monkeypatch.setattr(bf16_units, "_measure", measure)
    assert bf16_units.describe() == "AVX512-BF16, timed against float32 at the first bf16 compile"
    for impl in ("brgconv:avx512_core_bf16", "brg:avx512_core_bf16", "gemm:jit:bf16", "jit_bf16:avx512_core_bf16"):
        assert bf16_units.takes("lib", impl) is verdict
    assert not bf16_units.takes("lib", "brgconv:avx512_core")  # a float32 kernel is no bf16 one
    assert not bf16_units.merges()  # narrow groups merged for AMX's tiles only
    assert calls == ["lib"]  # timed once in the process
    assert bf16_units.describe() == f"AVX512-BF16, {'taken' if verdict else 'not taken'}: made up"
    monkeypatch.setattr(bf16_units, "VERDICT", new_process())  # a new process: the verdict told from the cache, untimed
    kept = f"AVX512-BF16, {'taken' if verdict else 'not taken'}: made up; timed 0 s ago, kept in rlx's cache"
    assert bf16_units.describe() == kept
    assert bf16_units.pays("lib") == (verdict, "made up; timed 0 s ago, kept in rlx's cache")
    assert calls == ["lib"]  # kept for the next process


def test_a_probe_that_fails_leaves_bf16_off(monkeypatch, fresh):
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: AVX512)

    class Broken:
        def md(self, *args):
            raise RuntimeError("no such primitive")
    yes, why = bf16_units.pays(Broken())
    assert not yes and why == "the bf16 probe failed: RuntimeError: no such primitive"


def test_products_stay_float32_where_the_host_measured_bf16_slower(monkeypatch, fresh):
    if onednn.library() is None:
        pytest.skip(f"needs oneDNN: {onednn.reason()}")
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: AVX512)
    monkeypatch.setattr(bf16_units, "_measure", lambda lib: (False, "bf16 ran 0.55x float32's speed"))
    rng = np.random.default_rng(0)
    g = Graph("chain")  # two convolutions: their value between would be held bf16 where it paid
    w1 = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((8, 32, 1, 1)).astype(np.float32)
    y = g.relu(g.conv2d(g.input("x", (2, 16, 14, 14)), g.param("w1", w1), padding=1))
    g.set_outputs([g.conv2d(y, g.param("w2", w2))])
    cg = rlx.compile(g, device="cpu", precision="bf16")
    notes = " ".join(cg.report().notes)
    assert ("no product here took it (oneDNN runs none of them on a unit that makes it pay here: AVX512-BF16, not "
            "taken: bf16 ran 0.55x float32's speed" in notes), notes
    assert "held" not in notes  # nothing planned around products that stay float32
    feeds = {"x": rng.standard_normal((2, 16, 14, 14)).astype(np.float32)}
    np.testing.assert_allclose(cg.run(feeds)[0], rlx.compile(g, device="cpu").run(feeds)[0], rtol=1e-5, atol=1e-5)


def test_the_timing_on_this_host_names_what_it_measured(fresh):
    if "avx512_bf16" not in verdicts.cpu_flags() or onednn.library() is None:
        pytest.skip("needs a CPU with AVX512_BF16 and oneDNN (rlx-cpu[onednn])")
    yes, why = bf16_units._measure(onednn.library())
    if "amx_bf16" in verdicts.cpu_flags():  # oneDNN takes AMX's kernels there: never timed in use
        assert not yes and why.startswith("oneDNN ran the convolution probe's bf16 on brgconv:avx512_core_amx"), why
        return
    assert why.startswith("bf16 ran ") and "float32's speed on a 128-channel 3x3 over 28x28 and " in why, why
    assert why.endswith("x on a 128 x 768 x 3072 dense layer")
    ratios = [float(part.split("x ")[0]) for part in why.removeprefix("bf16 ran ").split(" and ")]
    assert yes == (min(ratios) >= bf16_units.MARGIN)
