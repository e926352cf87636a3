"""The memory limit: a graph too big for the machine fails at compile, naming the size,
before any buffer is allocated (rlx_core.memory)."""

from __future__ import annotations

import numpy as np
import pytest
from support import ToyBackend, registry_with

import rlx_core as rlx
from rlx_core.memory import format_bytes, memory_limit


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
    with pytest.raises(rlx.DeviceError, match=r"graph 'big' needs 256\.0 GiB on toy .*this host's memory"):
        rlx.compile(g, device="toy", policy=rlx.DevicePolicy(), registry=registry_with(Counting("toy")))


def test_rlx_memory_limit_sets_the_limit_and_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    g = big_graph(512)  # 2 MiB of buffers, 4 KiB of params
    monkeypatch.setenv("RLX_MEMORY_LIMIT", "1M")
    want = r"needs 2\.0 MiB on cpu .*4\.0 KiB of params .*1\.0 MiB \(RLX_MEMORY_LIMIT\)"
    with pytest.raises(rlx.DeviceError, match=want):
        rlx.compile(g, device="cpu", policy=rlx.DevicePolicy())
    monkeypatch.setenv("RLX_MEMORY_LIMIT", "64MiB")
    x = np.zeros((512, 1024), np.float32)
    np.testing.assert_allclose(rlx.compile(g, device="cpu", policy=rlx.DevicePolicy()).run({"x": x})[0], np.e,
                               rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize(("raw", "want"), [("1024", 1024), ("2k", 2048), ("1.5G", 3 << 29), ("8GiB", 8 << 30),
                                           ("none", None), ("0", None)])  # fmt: skip
def test_limit_values(raw: str, want: int | None) -> None:
    assert memory_limit({"RLX_MEMORY_LIMIT": raw}) == want


@pytest.mark.parametrize("raw", ["lots", "-1G", "1X", "G"])
def test_a_malformed_limit_is_a_config_error_naming_the_variable(raw: str) -> None:
    with pytest.raises(rlx.ConfigError, match=rf"RLX_MEMORY_LIMIT={raw!r}"):
        memory_limit({"RLX_MEMORY_LIMIT": raw})


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (512, 2048, 3 << 20, 5 << 30, 2 << 40)] == [
        "512 B", "2.0 KiB", "3.0 MiB", "5.0 GiB", "2.0 TiB"]  # fmt: skip


@pytest.mark.parametrize(("var", "raw"), [("RLX_MEMORY_LIMIT", "lots"), ("RLX_FUSION_REPORT", "maybe")])
def test_a_malformed_compile_setting_is_the_callers_error_not_a_device_failure(
        var: str, raw: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
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
                                  policy=rlx.DevicePolicy())  # fmt: skip
