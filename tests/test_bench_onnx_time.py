"""``bench/onnx_time.py``: one line per model, feeds from a saved ``.npz`` or made up,
pipeline passes switched off by name. No timing is asserted."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from support import bench_module

pytest.importorskip("onnx")

import onnx
from onnx import helper
from test_onnx_support import init, make_model, vi

onnx_time = bench_module("onnx_time")


def _conv_relu(path: Path) -> Path:
    w = np.linspace(-1, 1, 2 * 3 * 3 * 3, dtype=np.float32).reshape(2, 3, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", [1, 3, 5, 5])], [vi("y", "float32", [1, 2, 5, 5])], [init("w", w)])
    onnx.save(model, str(path))
    return path


def test_one_line_per_model_with_saved_or_made_up_feeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    made_up = _conv_relu(tmp_path / "a.onnx")
    saved = _conv_relu(tmp_path / "b.onnx")
    np.savez(tmp_path / "b.npz", x=np.ones((1, 3, 5, 5), np.float32))
    assert onnx_time.main([str(made_up), str(saved), "--disable", "conv", "--blocks", "1", "--runs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["a", "b"]
    assert all(re.fullmatch(r"\w+ \d+\.\d{3} ms", line) for line in lines), lines


def test_ab_compares_the_pipeline_with_and_without_a_pass_and_ort(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    model = _conv_relu(tmp_path / "a.onnx")
    assert onnx_time.main([str(model), "--ab", "--disable", "conv", "--blocks", "1", "--runs", "1"]) == 0
    first, last = capsys.readouterr().out.splitlines()
    assert first.startswith("a: nodes compiled before 4, after 3;"), first  # x, w, conv2d, relu; x, w, fused_conv
    assert re.fullmatch(r"a before [\d.]+ ms, after [\d.]+ ms, ORT [\d.]+ ms; after / before [\d.]+ "
                        r"\(block by block [\d.]+, quartiles [\d.]+-[\d.]+\), after / ORT [\d.]+", last), last
    with pytest.raises(SystemExit):
        onnx_time.main([str(model), "--ab"])  # nothing to compare


def test_ort_times_rlx_and_ort_in_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    model = _conv_relu(tmp_path / "a.onnx")
    assert onnx_time.main([str(model), "--ort", "--blocks", "2"]) == 0
    first, last = capsys.readouterr().out.splitlines()
    diff = float(first.removeprefix("a: max |rlx - ORT| "))
    assert diff < 1e-5, first
    assert re.fullmatch(r"a rlx [\d.]+ ms, ORT [\d.]+ ms; rlx / ORT [\d.]+", last), last


def test_ab_compiles_before_under_the_settings_of_before_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``--before-env NAME=VALUE``: the 'before' compile sees the setting, the 'after' one
    and the caller's environment do not."""
    pytest.importorskip("onnxruntime")
    import os

    import rlx_core as rlx

    seen: list[str | None] = []
    real = rlx.compile

    def compile_seen(*a: object, **k: object) -> object:
        seen.append(os.environ.get("RLX_CPU_LAYOUT"))
        return real(*a, **k)

    monkeypatch.setattr(rlx, "compile", compile_seen)
    monkeypatch.delenv("RLX_CPU_LAYOUT", raising=False)
    model = _conv_relu(tmp_path / "a.onnx")
    assert onnx_time.main([str(model), "--ab", "--before-env", "RLX_CPU_LAYOUT=nchw", "--blocks", "1",
                           "--runs", "1"]) == 0
    assert seen == ["nchw", None] and "RLX_CPU_LAYOUT" not in os.environ
    assert capsys.readouterr().out.splitlines()[0].startswith("a: nodes compiled before 3, after 3;")
    with pytest.raises(SystemExit):
        onnx_time.main([str(model), "--ab", "--before-env", "RLX_CPU_LAYOUT"])  # not NAME=VALUE


def test_ab_compiles_before_with_the_constants_of_before_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``--before-set MODULE:NAME=VALUE``: the 'before' compile sees the constant (a Python
    literal), the 'after' one sees it as it was, and it is as it was after."""
    pytest.importorskip("onnxruntime")
    import rlx_core as rlx

    seen: list[object] = []
    real = rlx.compile

    def compile_seen(*a: object, **k: object) -> object:
        seen.append(onnx_time.DIMS.get("probe"))
        return real(*a, **k)

    monkeypatch.setattr(rlx, "compile", compile_seen)
    monkeypatch.setattr(onnx_time, "DIMS", {"probe": 1})
    model = _conv_relu(tmp_path / "a.onnx")
    assert onnx_time.main([str(model), "--ab", "--before-set", "bench.onnx_time:DIMS={'probe': 7}", "--blocks", "1",
                           "--runs", "1"]) == 0
    assert seen == [7, 1] and onnx_time.DIMS == {"probe": 1}
    assert capsys.readouterr().out.splitlines()[0].startswith("a: nodes compiled before 3, after 3;")
    for bad in ("bench.onnx_time:DIMS", "DIMS=1", "bench.onnx_time:NO_SUCH=1"):
        with pytest.raises(SystemExit):
            onnx_time.main([str(model), "--ab", "--before-set", bad, "--blocks", "1", "--runs", "1"])


def test_made_up_feeds_bind_symbolic_dims_to_one_or_to_dim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model exported with dynamic axes and no saved feeds: its symbolic dims are 1, or
    the size ``--dim NAME=SIZE`` gives (the tool read them as ints and failed before)."""
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", "float32", ["batch", 3, "seq"])],
                       [vi("y", "float32", None)])
    path = tmp_path / "dyn.onnx"
    onnx.save(model, str(path))
    graph = onnx_time.rlx_onnx.load(str(path))
    assert onnx_time.feeds_for(path, graph)["x"].shape == (1, 3, 1)
    monkeypatch.setattr(onnx_time, "DIMS", {})
    assert onnx_time.main([str(path), "--dim", "seq=7", "--blocks", "1", "--runs", "1"]) == 0
    assert onnx_time.feeds_for(path, graph)["x"].shape == (1, 3, 7)
    with pytest.raises(SystemExit):
        onnx_time.main([str(path), "--dim", "seq=seven"])
