"""Smoke test of bench/batch.py (``rlx batch`` against an ONNX Runtime loop) on a few
hundred rows: it runs end to end, reports rows/s for every contender, writes its
BENCHMARKS.md section, and its outputs are right (checked here against the suite's own
numpy math, not only against ORT). No timing is asserted. Ray is left out (``--no-ray``):
starting it costs more than this file's budget; tests/test_distributed_ray.py covers it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import bench_module

import rlx_core as rlx
from rlx_core.distributed import Predictor
from rlx_core.errors import RlxError

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

batch = bench_module("batch")
models = bench_module("models")


@pytest.mark.slow
def test_a_small_run_reports_rows_per_second_and_writes_its_section(tmp_path: Path) -> None:
    out, md = tmp_path / "batch.json", tmp_path / "BENCHMARKS.md"
    md.write_text("# rlx benchmarks\n\n## Dispatch overhead\n\nkept as it is\n", encoding="utf-8")
    argv = ["--quick", "--no-ray", "--rows", "512", "--blocks", "2", "--pause", "0", "--json", str(out),
            "--write", str(md)]
    assert batch.main(argv) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["rows"] == 512 and doc["batch"] == 64
    names = [r["contender"] for r in doc["results"]]
    assert names[0] == "onnxruntime loop" and "rlx batch stream (Predictor)" in names
    assert "rlx batch job (.npz → .npz)" in names and batch.READ in names and len(names) == 6
    for r in doc["results"]:
        assert r["rows_per_s"] > 0 and r["rows_per_s_q1"] <= r["rows_per_s_q3"], r
        if r["contender"] != batch.READ:  # reading alone has no output to compare
            assert r["max_abs_diff"] is not None and r["max_abs_diff"] <= batch.TOLERANCE, r
    assert doc["ray"] == {"skipped": "Ray skipped: --no-ray"}
    text = md.read_text(encoding="utf-8")
    assert "## Dispatch overhead\n\nkept as it is" in text  # the other sections are left alone
    section = text.split("## Batch inference", 1)[1]
    assert "| rlx batch stream (Predictor) |" in section and "target ≥ 0.9x" in section
    assert "Reproduce: `python bench/batch.py --quick --no-ray" in section


def test_every_contender_computes_the_model_and_a_wrong_output_is_caught(tmp_path: Path) -> None:
    s = batch.Setup(tmp_path, 128)
    suite = models.build("mlp", "full")
    want = np.asarray(suite.numpy_fn(suite.weights, {"x": s.x.astype(np.float64)}))
    np.testing.assert_allclose(s.expected, want, atol=1e-5)  # the yardstick itself is right
    found = batch.contenders(s)
    results = {name: fn() for name, fn in found.items()}
    for name, result in results.items():
        diff = batch.check(s, name, result)
        assert diff is None if name == batch.READ else diff <= batch.TOLERANCE
    with np.load(results["rlx batch job (.npz → .npz)"]) as job:
        np.testing.assert_allclose(job["y"], want, atol=1e-5)
        assert job["id"].tolist() == list(range(128)) and set(job["rlx_device"].tolist()) == {s.device}
    stream = results["rlx batch stream (Predictor)"]
    with pytest.raises(RlxError, match="reordered"):
        batch.check(s, "stream", stream[::-1])
    with pytest.raises(RlxError, match="differs from ONNX Runtime"):
        batch.check(s, "loop", [y + 1e-3 for y in results["onnxruntime loop"]])
    with pytest.raises(RlxError, match="lost, changed or reordered"):
        batch.check(s, batch.READ, results[batch.READ][1:])
    with pytest.raises(RlxError, match="multiple of the model's batch 64"):
        batch.Setup(tmp_path / "odd", 100)


def test_predictor_single_run_path_agrees_with_the_chunked_path() -> None:
    """A batch of exactly the model's rows takes the predictor's one-run path (no slicing,
    no concatenation); it must give what the chunked and padded paths give."""
    g = rlx.Graph("affine")
    x = g.input("x", (4, 3), "float32")
    g.set_outputs([g.tanh(g.add(g.mul(x, g.constant(np.float32(2.0))), g.constant(np.float32(0.5))))])
    predict = Predictor(g, device="cpu")
    rows = np.random.default_rng(3).standard_normal((10, 3)).astype(np.float32)
    ids = np.arange(10)
    whole = predict({"x": rows, "id": ids})  # chunks of 4, the last padded
    one = predict({"x": rows[:4], "id": ids[:4]})  # exactly one run
    y = predict.output_columns[0].name
    np.testing.assert_allclose(whole[y], np.tanh(rows * 2 + 0.5), rtol=1e-6)
    np.testing.assert_array_equal(one[y], whole[y][:4])
    assert one["rlx_device"].tolist() == ["cpu"] * 4 and one["rlx_device"].dtype == whole["rlx_device"].dtype
    assert one["id"].tolist() == [0, 1, 2, 3] and predict.rows_by_device["cpu"] == 14
