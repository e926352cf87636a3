"""Differential fuzzing: random valid graphs on every available backend vs the reference.

Each graph runs on each device twice (its own fused kernels, and with composites
decomposed by the core), and after a ``set_param`` when the case swaps params; every
output must lie within the forward error bound of ``_bounds.py`` around the float64
reference. NaN and Inf inputs must come out as numpy makes them. Saved failures under
``regressions/`` are replayed as plain tests. See ``conftest.py`` for the profiles;
``RLX_FUZZ_DEVICES=cpu,jax`` restricts the devices (default: every available one).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from fuzz._graphs import FuzzCase, fuzz_cases
from fuzz._harness import REGRESSIONS, check, load_replay, replay_id, run_case
from fuzz.conftest import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

import rlx_core as rlx


def _devices() -> list[str]:
    """``RLX_FUZZ_DEVICES`` (comma-separated) or every available device."""
    chosen = [d.strip() for d in os.environ.get("RLX_FUZZ_DEVICES", "").split(",") if d.strip()]
    return chosen or rlx.available_devices()


DEVICES = _devices()
REPLAYS = sorted(REGRESSIONS.glob("*.json"))


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@fuzz_settings(quick_examples=30)
@given(case=fuzz_cases())
def test_random_graphs_match_the_reference(device: str, case: FuzzCase) -> None:
    check(case, device)


def _inject(case: FuzzCase, seed: int) -> FuzzCase:
    """Replace random elements of the float inputs by NaN, +Inf and -Inf."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, arr in case.inputs.items():
        arr = arr.copy()
        if arr.dtype.kind == "f" and arr.size:
            flat = arr.reshape(-1)
            hit = rng.random(flat.shape) < 0.3
            flat[hit] = rng.choice(np.array([np.nan, np.inf, -np.inf], arr.dtype), int(hit.sum()))
        inputs[name] = arr
    return FuzzCase(case.graph, inputs, {}, case.alive)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@fuzz_settings(quick_examples=20)
@given(case=fuzz_cases(allow_int_casts=False), seed=st.integers(0, 2**32 - 1))
def test_nan_and_inf_inputs_propagate_like_numpy(device: str, case: FuzzCase, seed: int) -> None:
    check(_inject(case, seed), device)


@pytest.mark.parametrize("path", REPLAYS, ids=[replay_id(p) for p in REPLAYS])
@pytest.mark.parametrize("device", DEVICES)
def test_saved_failures_replay(device: str, path) -> None:
    case, doc = load_replay(path)
    if doc.get("xfail"):
        pytest.xfail(doc["xfail"])
    problem = run_case(case, device)
    assert problem in (None, "declined"), f"{path.name}: {problem}"
