"""``bench/dynamic.py``: its two models (symbolic batch and seq, sizes computed at run time
as torch's exporter writes them) pass the ONNX checker, load in rlx without ``dims`` and
agree with ONNX Runtime at several sizes; the request stream is deterministic; a run of
the script exits 0 and prints its tables, and a mismatch makes it exit 1. No timing is
asserted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import bench_module

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx
import onnxruntime as ort

dynamic = bench_module("dynamic")
models = bench_module("_dynamic_models")

TINY = 16  # width; 4 heads of 4


def _ort(model: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # the test machine's cores are shared
    sess = ort.InferenceSession(model.onnx, options, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


@pytest.mark.slow
@pytest.mark.parametrize("build", ["build_encoder", "build_decoder"])
def test_models_check_load_symbolic_and_match_onnxruntime_at_two_sizes(build: str) -> None:
    model = getattr(models, build)(TINY)
    proto = onnx.load_from_string(model.onnx)
    onnx.checker.check_model(proto, full_check=True)
    assert proto.ir_version == 8
    for value in proto.graph.input:
        assert [d.dim_param for d in value.type.tensor_type.shape.dim] == ["batch", "seq"]
    ops = {n.op_type for n in proto.graph.node}
    assert {"Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "LayerNormalization", "Softmax"} <= ops
    assert ({"Slice", "ConstantOfShape", "Erf", "Cast"} if model.name == "encoder"
            else {"Range", "Less", "Where", "Expand", "Split", "Tanh"}) <= ops
    graph = rlx_onnx.load(model.onnx)
    assert graph.is_symbolic and graph.symbols == ("batch", "seq")
    cg = rlx.compile(graph, device="cpu")
    rng = np.random.default_rng(5)
    for batch, seq in [(2, 5), (3, 17)]:
        feeds = dynamic.make_request(0, batch, seq, rng).feeds(model)
        got, want = cg.run(feeds)[0], _ort(model, feeds)
        assert got.shape == want.shape == (batch, seq, TINY)
        assert dynamic.relative_diff(got, want) <= dynamic.TOLERANCE
    # an explicit device: rlx_core.compile placed it and compiled nothing; the first size run made
    # cpu's executable for every size (two symbols: a new size on most requests), and both ran on it
    assert cg.compiles == 1 and cg.shapes() == []
    assert any(n.startswith("any size: one executable") for n in cg.report().notes)


def test_the_stream_is_the_same_every_run_and_within_its_ranges() -> None:
    a, b = dynamic.request_stream(60), dynamic.request_stream(60)
    assert [(r.batch, r.seq) for r in a] == [(r.batch, r.seq) for r in b]
    assert all(np.array_equal(x.input_ids, y.input_ids) and np.array_equal(x.attention_mask, y.attention_mask)
               for x, y in zip(a, b))
    for r in a:
        assert 1 <= r.batch <= dynamic.MAX_BATCH and 1 <= r.seq <= dynamic.MAX_SEQ
        assert r.input_ids.shape == r.attention_mask.shape == (r.batch, r.seq)
        assert r.input_ids.dtype == r.attention_mask.dtype == np.int64
        assert (r.attention_mask[:, 0] == 1).all()  # every row keeps at least its first token
    assert len({(r.batch, r.seq) for r in a}) > 30


def test_relative_diff_flags_shapes_and_nans() -> None:
    want = np.array([[1.0, -4.0]], np.float32)
    assert dynamic.relative_diff(want + np.float32(0.004), want) == pytest.approx(0.001, rel=1e-3)
    assert dynamic.relative_diff(want[0], want) == float("inf")
    assert not dynamic.relative_diff(np.full_like(want, np.nan), want) <= dynamic.TOLERANCE


def test_failures_and_mismatches_are_named() -> None:
    doc = {"name": "encoder", "stream": {"mismatches": [{"index": 4, "batch": 2, "seq": 9, "diff": 0.5}]},
           "steady": {"diffs": {"rlx cpu, dynamic": 0.0, "rlx cpu, static": float("nan")}}}
    found = dynamic.problems(doc)
    assert "MISMATCH at request #4 (batch 2, seq 9)" in found[0]
    assert "rlx cpu, static" in found[1] and len(found) == 2
    assert dynamic.problems({"name": "decoder", "error": "ModelError: no"}) == ["decoder: rlx failed: ModelError: no"]


@pytest.mark.slow
def test_a_quick_run_prints_its_tables_and_never_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich: one line per table row
    out, md = tmp_path / "dynamic.json", tmp_path / "BENCHMARKS.md"
    md.write_text("# rlx benchmarks\n\n## Suite\n\nkept as it is\n", encoding="utf-8")
    argv = ["--quick", "--requests", "3", "--rounds", "1", "--width", str(TINY), "--json", str(out),
            "--write", str(md)]
    assert dynamic.main(argv) == 0
    text = capsys.readouterr().out
    assert "stream of 3 requests, total" in text and "≤ 1.1x" in text and "≤ 3x" in text and "≤ 1.05x" in text
    assert "--quick never writes" in text
    assert md.read_text(encoding="utf-8") == "# rlx benchmarks\n\n## Suite\n\nkept as it is\n"
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert [m["name"] for m in doc["models"]] == ["encoder", "decoder"]
    for model in doc["models"]:
        assert "error" not in model, model.get("error")
        s = model["stream"]
        assert s["requests"] == 3 and not s["mismatches"] and s["max_diff"] <= dynamic.TOLERANCE
        assert model["compiles"] >= 1 + s["compiled"]
        assert set(model["steady"]["median_s"]) == {"rlx cpu, dynamic", "rlx cpu, static", "onnxruntime"}
    section = dynamic.markdown_section(doc)  # what --write puts in BENCHMARKS.md, rendered from the same figures
    assert section.count("| stream of 3 requests, total |") == 2
    assert "Command: `python bench/dynamic.py --quick --requests 3" in section
