"""The generic calibration measures through a backend's compile and caches per host."""

from __future__ import annotations

import warnings

from support import ToyBackend

import rlx_core as rlx
from rlx_core import calibration
from rlx_core.cache import JsonCache


def test_calibrate_measures_caches_and_cost_model_uses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    toy = ToyBackend("caltoy")
    toy.cost_model = lambda: rlx.Backend.cost_model(toy)  # use the base class's cache lookup
    assert not toy.cost_model().calibrated
    model = toy.calibrate(quick=True)
    assert model.calibrated and model.device == "caltoy" and len(model.sgemm_points) == 2
    assert model.sgemm_gflops > 0 and model.memory_bw_gbps > 0 and model.dispatch_overhead_ns > 0
    again = toy.cost_model()
    assert again.calibrated and again.sgemm_points == model.sgemm_points


def test_foreign_cache_entry_is_ignored_with_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    toy = ToyBackend("caltoy2")
    ident = dict(calibration.calibration_identity(toy), plugin_version="0.0.0-other")
    JsonCache("calibration", schema=calibration.CALIBRATION_SCHEMA).put(
        "caltoy2", ident, rlx.CostModel(device="caltoy2", calibrated=True).to_dict()
    )
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert calibration.cached_cost_model(toy) is None
    assert any(issubclass(w.category, rlx.CacheWarning) for w in rec)
