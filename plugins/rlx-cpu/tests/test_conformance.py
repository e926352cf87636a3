"""The cpu backend against the conformance kit: every op it claims (all of them, the
composites included) on random shapes, dtypes and attributes, held to the float64
reference; its probe, claims and cost model; set_param and concurrent runs.

One pytest test per check, so a failure names the op.
"""

from __future__ import annotations

from rlx_core.testing import BoundCheck, check_backend, parametrize_checks
from rlx_cpu import CpuBackend


@parametrize_checks(CpuBackend(), max_examples=25, seed=0)
def test_conformance(check: BoundCheck) -> None:
    check()


def test_every_check_passes_and_none_is_skipped() -> None:
    """The universal fallback claims every op, so no op check may be skipped."""
    report = check_backend(CpuBackend(), ops=["add", "softmax", "conv2d"], max_examples=3)
    assert report.ok, report.summary()
    # ``precisions`` skips on a host without a reduced precision (no AMX, or oneDNN off as
    # here: test_precision.py runs it with oneDNN where the host has it).
    skipped = [r for r in report.skipped if r.name != "precisions" or CpuBackend().precisions()]
    assert not skipped, report.summary()
    assert {"api", "probe", "op:softmax", "set_param", "concurrent_runs"} <= {r.name for r in report.passed}
