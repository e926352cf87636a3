"""Fixtures shared by the rlx-cpu tests."""

from __future__ import annotations

import pytest

from rlx_cpu import native


@pytest.fixture
def native_lib(monkeypatch: pytest.MonkeyPatch) -> native.Native:
    """The native kernels, built or loaded; skips (with the reason) where they are not."""
    monkeypatch.delenv("RLX_CPU_NATIVE", raising=False)
    found = native.library()
    if found is None:
        pytest.skip(f"the native kernels are not available here: {native.reason()}")
    return found
