"""``bench/node_profile.py``: rlx's steps timed node by node, ORT's profile beside them.
No timing is asserted: what each line names, and that the builders it wraps are put back."""

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

node_profile = bench_module("node_profile")


def _conv_relu(path: Path) -> Path:
    w = np.linspace(-1, 1, 4 * 3 * 3 * 3, dtype=np.float32).reshape(4, 3, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"]),
             helper.make_node("Sigmoid", ["y"], ["z"])]
    model = make_model(nodes, [vi("x", "float32", [2, 3, 8, 8])], [vi("z", "float32", [2, 4, 8, 8])], [init("w", w)])
    onnx.save(model, str(path))
    return path


def test_time_by_op_then_the_slowest_nodes_with_their_shapes(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    model = _conv_relu(tmp_path / "m.onnx")
    assert node_profile.main([str(model), "--runs", "2", "--top", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"m: [\d.]+ ms a run, steps [\d.]+ ms", lines[0]), lines[0]
    ops = [line.split()[0] for line in lines[1:] if not line.lstrip().startswith("node ")]
    assert "fused_conv" in ops, lines  # the Relu went into the convolution's epilogue
    conv = next(line for line in lines if line.lstrip().startswith("node ") and " fused_conv " in line)
    assert "GFLOP/s" in conv and "(2, 3, 8, 8), (4, 3, 3, 3)" in conv and "-> (2, 4, 8, 8)" in conv, conv
    assert re.search(r"\[\w+(, \w+)*\]$", conv), conv  # the kinds of step that ran


def test_the_builders_are_put_back() -> None:
    from rlx_cpu import binding, held, layout

    before = (binding._build_steps, layout.steps, held.dense_steps)
    with node_profile.wrapped(node_profile.Recorder()):
        assert (binding._build_steps, layout.steps, held.dense_steps) != before
    assert (binding._build_steps, layout.steps, held.dense_steps) == before


def test_ort_adds_its_own_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where ORT writes its trace
    model = _conv_relu(tmp_path / "m.onnx")
    np.savez(tmp_path / "m.npz", x=np.ones((2, 3, 8, 8), np.float32))
    assert node_profile.main([str(model), "--runs", "2", "--top", "0", "--ort"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ort_at = next(i for i, line in enumerate(lines) if " ORT " in line)
    assert re.fullmatch(r"m: ORT [\d.]+ ms a run, kernels [\d.]+ ms", lines[ort_at]), lines[ort_at]
    assert any(line.split()[0] == "Conv" for line in lines[ort_at + 1:]), lines
    assert not list(tmp_path.glob("*.json"))  # ORT's trace removed


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        node_profile.main([str(_conv_relu(tmp_path / "m.onnx")), "--runs", "0"])
