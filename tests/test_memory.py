"""The memory limit: a graph too big for the machine fails at compile, naming the size,
before any buffer is allocated (rlx_core.compiler.memory)."""

from __future__ import annotations

import numpy as np
import pytest
from support import ToyBackend, registry_with

import rlx_core as rlx
from rlx_core.compiler.memory import (
    device_memory_limit,
    fits_unplanned,
    format_bytes,
    memory_limit,
    parse_memory_limits,
)


def big_graph(rows: int) -> rlx.Graph:
    g = rlx.Graph("big")
    x = g.input("x", (rows, 1024), "float32")
    g.set_outputs([g.exp(g.add(x, g.param("b", np.ones(1024, np.float32))))])
    return g


def test_a_graph_past_the_host_memory_fails_before_allocating() -> None:
    class Counting(ToyBackend):
        def compile(self, graph, options):  # type: ignore[no-untyped-def]
            raise AssertionError("the backend must not be asked to compile (and allocate)")

    g = big_graph(1 << 26)  # 256 GiB of float32
    with pytest.raises(rlx.DeviceError, match=r"cannot run graph 'big': needs 256\.0 GiB on toy .*this host's memory"):
        rlx.compile(g, device="toy", policy=rlx.DevicePolicy(), registry=registry_with(Counting("toy")))


def test_rlx_memory_limit_sets_the_limit_and_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    g = big_graph(512)  # 2 MiB of buffers, 4 KiB of params
    monkeypatch.setenv("RLX_MEMORY_LIMIT", "1M")
    want = r"needs 2\.0 MiB on cpu .*4\.0 KiB of params .*1\.0 MiB it can give \(RLX_MEMORY_LIMIT\)"
    with pytest.raises(rlx.DeviceError, match=want):
        rlx.compile(g, device="cpu", policy=rlx.DevicePolicy())
    monkeypatch.setenv("RLX_MEMORY_LIMIT", "64MiB")
    x = np.zeros((512, 1024), np.float32)
    np.testing.assert_allclose(rlx.compile(g, device="cpu", policy=rlx.DevicePolicy()).run({"x": x})[0], np.e,
                               rtol=1e-6)


def test_a_graph_that_surely_fits_is_not_planned_to_be_checked() -> None:
    """Every value in a buffer of its own, params included, at most half the limit: it
    fits as any plan would lay it out; past that, or symbolic, the caller plans it."""
    g = big_graph(512)  # x, add, exp: 2 MiB each; b: 4 KiB
    total = 3 * 512 * 1024 * 4 + 1024 * 4
    assert fits_unplanned(g, "cpu", environ={"RLX_MEMORY_LIMIT": str(2 * total)})
    assert not fits_unplanned(g, "cpu", environ={"RLX_MEMORY_LIMIT": str(2 * total - 1)})
    assert fits_unplanned(g, "cpu", environ={"RLX_MEMORY_LIMIT": "none"})  # nothing is checked
    sym = rlx.Graph("sym")
    sym.set_outputs([sym.exp(sym.input("x", ("n", 4), "float32"))])
    assert not fits_unplanned(sym, "cpu", environ={"RLX_MEMORY_LIMIT": "1G"})


def test_a_symbolic_graph_on_a_named_device_is_not_lowered_until_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Placed on a named device, a symbolic graph is compiled per shape class at its first
    run: its compile checks claims and memory without the compile pipeline (pricing it at
    a representative size was a third of a small CNN's load and compile), and a graph
    that may not fit is still planned and blocked at compile."""
    import rlx_core.compiler.lowering as lowering

    runs: list[object] = []
    real = lowering.run_pipeline
    monkeypatch.setattr(lowering, "run_pipeline", lambda *a, **k: runs.append(a) or real(*a, **k))
    g = rlx.Graph("sym")
    x = g.input("x", ("rows", 1024), "float32")
    g.set_outputs([g.exp(g.add(x, g.param("b", np.ones(1024, np.float32))))])
    cg = rlx.compile(g, device="cpu", policy=rlx.DevicePolicy())
    assert not runs
    np.testing.assert_allclose(cg.run({"x": np.zeros((3, 1024), np.float32)})[0], np.e, rtol=1e-6)
    assert runs
    monkeypatch.setenv("RLX_MEMORY_LIMIT", "40K")  # the representative size (16 rows: 64 KiB a value) does not fit
    with pytest.raises(rlx.DeviceError, match=r"cannot run graph 'sym': needs .* more than the 40\.0 KiB"):
        rlx.compile(g, device="cpu", policy=rlx.DevicePolicy())


@pytest.mark.parametrize(("raw", "want"), [("1024", 1024), ("2k", 2048), ("1.5G", 3 << 29), ("8GiB", 8 << 30),
                                           ("none", None), ("0", None)])
def test_limit_values(raw: str, want: int | None) -> None:
    assert memory_limit({"RLX_MEMORY_LIMIT": raw}) == want


@pytest.mark.parametrize("raw", ["lots", "-1G", "1X", "G"])
def test_a_malformed_limit_is_a_config_error_naming_the_variable(raw: str) -> None:
    with pytest.raises(rlx.ConfigError, match=rf"RLX_MEMORY_LIMIT={raw!r}"):
        memory_limit({"RLX_MEMORY_LIMIT": raw})


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (512, 2048, 3 << 20, 5 << 30, 2 << 40)] == [
        "512 B", "2.0 KiB", "3.0 MiB", "5.0 GiB", "2.0 TiB"]


@pytest.mark.parametrize(("var", "raw"), [("RLX_MEMORY_LIMIT", "lots"), ("RLX_FUSION_REPORT", "maybe")])
def test_a_malformed_compile_setting_is_the_callers_error_not_a_device_failure(
        var: str, raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every device would fail the same way: no fallback, no FallbackWarning per device,
    the ConfigError itself, naming the variable (auto, and GraphDevices' chain alike)."""
    import warnings

    monkeypatch.setenv(var, raw)
    g = big_graph(4)
    registry = registry_with(ToyBackend("toya", priority=20), ToyBackend("toyb", priority=10))
    with warnings.catch_warnings():
        warnings.simplefilter("error", rlx.FallbackWarning)
        with pytest.raises(rlx.ConfigError, match=var):
            rlx.compile(g, policy=rlx.DevicePolicy(), registry=registry)
        with pytest.raises(rlx.ConfigError, match=var):
            rlx.run_with_fallback(g, {"x": np.zeros((4, 1024), np.float32)}, chain=["cpu", "cpu"],
                                  policy=rlx.DevicePolicy())


class SmallDevice(ToyBackend):
    """A device whose probe reports how much memory it can give a graph (a GPU's free memory)."""

    def __init__(self, name: str, memory: int | None, **kw: object) -> None:
        super().__init__(name, **kw)  # type: ignore[arg-type]
        self.memory = memory

    def probe(self) -> rlx.Availability:
        return rlx.Availability(True, devices=[self.name], memory_bytes=self.memory)


def test_a_device_that_cannot_hold_the_graph_is_blocked_naming_both_sizes_and_skipped_quietly() -> None:
    import warnings

    g = big_graph(512)  # 2 MiB of buffers
    reg = registry_with(SmallDevice("tiny", 1 << 20, gflops=10_000), SmallDevice("roomy", 1 << 30, gflops=1))
    rows = {r.device: r for r in rlx.device_report(g, rlx.DevicePolicy(), registry=reg)}
    assert rows["tiny"].supports_graph is True and not rows["tiny"].viable
    assert rows["tiny"].blocker == ("needs 2.0 MiB on tiny (2.0 MiB of buffers after reuse, 4.0 KiB of params and "
                                    "constants), more than the 1.0 MiB it can give (free memory of tiny when probed)")
    assert rows["roomy"].viable and rows["roomy"].recommended
    with warnings.catch_warnings():
        warnings.simplefilter("error", rlx.FallbackWarning)  # known in advance: skipped, not tried and failed
        cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=reg)
    assert cg.device == "roomy"
    assert reg.get("tiny").compiles == 0
    with pytest.raises(rlx.DeviceError, match=r"device 'tiny' .*needs 2\.0 MiB on tiny .*1\.0 MiB it can give"):
        rlx.compile(g, device="tiny", policy=rlx.DevicePolicy(), registry=reg)


def test_rlx_memory_limit_per_device_overrides_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    g = big_graph(512)
    reg = registry_with(SmallDevice("tiny", 1 << 20, gflops=10_000), SmallDevice("roomy", 1 << 30, gflops=1))
    monkeypatch.setenv("RLX_MEMORY_LIMIT", "tiny=64M,roomy=1M")
    rows = {r.device: r for r in rlx.device_report(g, rlx.DevicePolicy(), registry=reg)}
    assert rows["tiny"].viable
    assert rows["roomy"].blocker is not None and "(RLX_MEMORY_LIMIT for roomy)" in rows["roomy"].blocker
    assert rlx.compile(g, policy=rlx.DevicePolicy(), registry=reg).device == "tiny"
    monkeypatch.setenv("RLX_MEMORY_LIMIT", "1M")  # one limit for every device
    with pytest.raises(rlx.DeviceError, match=r"no device can run graph 'big': roomy: needs .*tiny: needs"):
        rlx.compile(g, policy=rlx.DevicePolicy(), registry=reg)


@pytest.mark.parametrize(("raw", "device", "want"), [
    ("cuda=2G,cpu=16G", "cuda", (2 << 30, "RLX_MEMORY_LIMIT for cuda")),
    ("cuda=2G,cpu=16G", "cuda:1", (2 << 30, "RLX_MEMORY_LIMIT for cuda")),
    ("cuda:1=1G,cuda=2G", "cuda:1", (1 << 30, "RLX_MEMORY_LIMIT for cuda:1")),
    ("16G,cuda=2G", "opencl", (16 << 30, "RLX_MEMORY_LIMIT")),
    ("16G,cuda=none", "cuda", (None, "RLX_MEMORY_LIMIT for cuda")),
    ("cuda=2G", "cpu", (777, "free memory of cpu when probed")),
])
def test_per_device_limits(raw: str, device: str, want: tuple[int | None, str]) -> None:
    assert device_memory_limit(device, 777, {"RLX_MEMORY_LIMIT": raw}) == want


@pytest.mark.parametrize("raw", ["cuda=2G,,cpu=1G", "cuda=lots", "1G,2G", "cuda=1G,cuda=2G", "=1G", "a b=1G"])
def test_malformed_per_device_limits_name_the_variable(raw: str) -> None:
    with pytest.raises(rlx.ConfigError, match=r"RLX_MEMORY_LIMIT="):
        parse_memory_limits(raw)


def test_a_probe_reports_memory_through_the_isolated_child() -> None:
    """memory_bytes survives the trip from a probe run in a child process (JSON)."""
    from rlx_core.backends.probing import _bytes

    assert [_bytes(v) for v in (1024, 0, -5, "12", None, True, 2.5e9)] == [1024, None, None, None, None, None,
                                                                             2_500_000_000]
