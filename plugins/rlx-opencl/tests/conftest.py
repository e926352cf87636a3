"""The ``backend`` fixture every device test here shares: a probed ``OpenclBackend``, or
a skip that says why OpenCL cannot run on this host (no pyopencl, no device, a probe that
refused)."""

from __future__ import annotations

import pytest

from rlx_opencl import OpenclBackend


@pytest.fixture(scope="module")
def backend() -> OpenclBackend:
    pytest.importorskip("pyopencl", reason="pyopencl is not installed")
    b = OpenclBackend()
    got = b.probe()
    if not got.available:
        pytest.skip(f"OpenCL is unavailable here: {got.reason}")
    return b
