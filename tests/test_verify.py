"""rlx_core.run.verify: the suite models are valid graphs, and the proof table adds up."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.run.verify import SUITE, VerifyRow, suite_graph, verify_cost_models


@pytest.mark.parametrize("name", sorted(SUITE))
def test_suite_models_run_on_cpu_like_the_reference(name: str) -> None:
    g = suite_graph(name, scale=0.01)
    inputs = {g.node(i).name: np.random.default_rng(0).standard_normal(g.node(i).shape).astype(np.float32)
              for i in g.inputs}
    got = rlx.compile(g, device="cpu", policy=rlx.DevicePolicy()).run(inputs)
    want = reference.evaluate(g, inputs)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_unknown_suite_model_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="mlp"):
        suite_graph("resnet")


@pytest.mark.slow
def test_verify_rows_pick_best_and_regret() -> None:
    rows = verify_cost_models(["mlp", "elementwise"], devices=["cpu"], policy=rlx.DevicePolicy(), scale=0.01,
                              rounds=2)
    assert [r.model for r in rows] == ["mlp", "elementwise"]
    for r in rows:
        assert set(r.measured) == set(r.predicted) == {"cpu"}
        assert r.picked == r.best == "cpu" and r.regret == 1.0
        assert r.measured["cpu"] > 0 and r.predicted["cpu"] > 0 and r.worst_prediction_ratio >= 1.0


def test_regret_and_prediction_ratio_arithmetic() -> None:
    row = VerifyRow("m", predicted={"a": 2.0, "b": 1.0}, measured={"a": 1.0, "b": 4.0}, picked="b", best="a")
    assert row.regret == 4.0
    assert row.prediction_ratio("a") == 2.0 and row.prediction_ratio("b") == 0.25
    assert row.worst_prediction_ratio == 4.0
