"""Fixtures shared by the rlx-cpu tests."""

from __future__ import annotations

import pytest

from rlx_cpu import load, native, regions


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """``RLX_CACHE_DIR`` is a fresh directory for every test: the timed verdicts
    (``verdicts.py``) and calibrations one test keeps never reach another, nor the user's
    cache."""
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.mktemp("rlx-cache")))


class QuietMeter(load.Meter):
    """``load.Meter`` as on a quiet host: other processes took nothing."""

    def __exit__(self, *exc: object) -> None:
        self.others = 0.0


@pytest.fixture(autouse=True)
def _quiet_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verdicts are kept as on a quiet host: the other pytest worker, busy beside every
    test, would otherwise decide whether a test's verdict is kept (``test_load.py`` and
    ``test_verdicts.py`` hold the load's own effect)."""
    monkeypatch.setattr(load, "Meter", QuietMeter)


@pytest.fixture(autouse=True)
def _rlx_convolutions(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Convolutions on rlx's own kernels (RLX_CPU_ONEDNN=off), which these tests spy on
    and which every host without the ``onednn`` extra runs; ``test_onednn.py`` sets its own,
    and ``test_layout.py``, ``test_precision.py``, ``test_bf16_units.py`` and ``test_swish.py`` run on oneDNN's
    (channels-last chains and bf16 need it)."""
    if request.node.module.__name__.rsplit(".", 1)[-1] not in ("test_onednn", "test_layout", "test_precision",
                                                               "test_bf16_units", "test_swish"):
        monkeypatch.setenv("RLX_CPU_ONEDNN", "off")


@pytest.fixture
def native_lib(monkeypatch: pytest.MonkeyPatch) -> native.Native:
    """The native kernels the package was installed with; skips (with the reason) where
    it was installed without them."""
    monkeypatch.delenv("RLX_CPU_NATIVE", raising=False)
    found = native.library()
    if found is None:
        pytest.skip(f"the native kernels are not available here: {native.reason()}")
    return found


@pytest.fixture
def region_runs(monkeypatch: pytest.MonkeyPatch) -> list[regions._Runner]:
    """Every native region run, as the ``_Runner`` that ran it (``__call__`` spied on).
    The process's one-time timing of MKL's vector math against native.c's (the first
    region planned, where MKL is loaded) is done first: its runs are not the test's."""
    lib = native.library()
    if lib is not None:
        regions._vml_table(lib)
    ran: list[regions._Runner] = []
    real = regions._Runner.__call__

    def spy(self: regions._Runner) -> None:
        ran.append(self)
        real(self)

    monkeypatch.setattr(regions._Runner, "__call__", spy)
    return ran
