"""The conformance kit (``rlx_core.testing``) on the real OpenCL device, one test per check.

Skips with the probe's reason where pyopencl or an OpenCL device is missing. The example
count is modest so that the suite fits its time budget (each case builds a program);
``RLX_OPENCL_KIT_EXAMPLES=25`` runs the kit's default depth.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("hypothesis", reason="the conformance kit needs hypothesis")

from rlx_core.testing import parametrize_checks
from rlx_opencl import OpenclBackend

EXAMPLES = int(os.environ.get("RLX_OPENCL_KIT_EXAMPLES", "3"))


@parametrize_checks(OpenclBackend(), max_examples=EXAMPLES, seed=0)
def test_conformance(check):
    check()
