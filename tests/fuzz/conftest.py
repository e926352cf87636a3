"""Fuzz profiles and the per-device count printed at the end of the run.

``RLX_FUZZ_PROFILE=fuzz`` (set by ``nox -s fuzz``) runs ``RLX_FUZZ_EXAMPLES`` graphs per
device (default 10,000), randomized, with hypothesis's example database under
``tests/fuzz/.hypothesis`` so a failure found once is replayed first next time. The
default, ``quick``, is what ``nox -s tests`` runs: a few dozen derandomized graphs per
device, the same ones every run.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILE = os.environ.get("RLX_FUZZ_PROFILE", "quick").strip() or "quick"
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
             HealthCheck.function_scoped_fixture]


def fuzz_settings(quick_examples: int) -> settings:
    """The settings of one fuzz property under the active profile."""
    if PROFILE == "fuzz":
        examples = int(os.environ.get("RLX_FUZZ_EXAMPLES", "10000"))
        db = DirectoryBasedExampleDatabase(str(Path(__file__).parent / ".hypothesis"))
        return settings(max_examples=examples, deadline=None, database=db, suppress_health_check=_SUPPRESS,
                        print_blob=True)
    if PROFILE != "quick":
        raise ValueError(f"RLX_FUZZ_PROFILE: {PROFILE!r} is not 'quick' or 'fuzz'")
    return settings(max_examples=quick_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=_SUPPRESS)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    from fuzz._harness import CHECKED, DECLINED

    if not CHECKED and not DECLINED:
        return
    terminalreporter.section(f"rlx fuzz ({PROFILE} profile)")
    for device in sorted(set(CHECKED) | set(DECLINED)):
        declined = f", {DECLINED[device]} declined by its claims" if DECLINED[device] else ""
        terminalreporter.write_line(f"{device}: {CHECKED[device]} graphs checked against the reference, "
                                    f"fused and unfused{declined}")
