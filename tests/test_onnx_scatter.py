"""ScatterElements, ScatterND and OneHot against onnxruntime: indices known at import
(negative ones, duplicates with every reduction), run-time data and updates."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, vi

RNG = np.random.default_rng(11)


def model(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray], order: list[str],
          opset: int = 18, **attrs: Any) -> tuple[Any, dict]:
    node = helper.make_node(op, order, ["y"], **attrs)
    m = make_model([node], [vi(k, v.dtype.name, v.shape) for k, v in feeds.items()],
                   [helper.make_empty_tensor_value_info("y")], [init(k, v) for k, v in consts.items()], opset=opset)
    return m, feeds


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_duplicates_and_negative_indices(reduction: str) -> None:
    data = RNG.standard_normal((3, 4)).astype(np.float32)
    updates = RNG.standard_normal((2, 3)).astype(np.float32)
    indices = np.array([[1, -1, 1], [1, 0, -4]], np.int64) if reduction != "none" else np.array([[1, -1, 2], [0, 3, 1]])
    m, feeds = model("ScatterElements", {"data": data, "updates": updates}, {"indices": indices},
                     ["data", "indices", "updates"], axis=1, reduction=reduction)
    check_against_ort(m, feeds)


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd_slices_and_elements(reduction: str) -> None:
    data = RNG.standard_normal((4, 3, 2)).astype(np.float32)
    rows = np.array([[2], [0], [2]] if reduction != "none" else [[2], [0]], np.int64)
    updates = RNG.standard_normal((rows.shape[0], 3, 2)).astype(np.float32)
    m, feeds = model("ScatterND", {"data": data, "updates": updates}, {"indices": rows},
                     ["data", "indices", "updates"], reduction=reduction)
    check_against_ort(m, feeds)
    points = np.array([[1, 2, 0], [-1, 0, 1]], np.int64)  # one element each
    m, feeds = model("ScatterND", {"data": data, "updates": RNG.standard_normal(2).astype(np.float32)},
                     {"indices": points}, ["data", "indices", "updates"], reduction=reduction)
    check_against_ort(m, feeds)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_axes_negative_and_out_of_range_indices(axis: int) -> None:
    indices = np.array([[0, -1, 3], [5, 2, -7]], np.int64)  # 5 and -7 are outside depth 5: all off
    m, feeds = model("OneHot", {"indices": indices}, {"depth": np.array(5, np.int64),
                                                      "values": np.array([-1.0, 2.0], np.float32)},
                     ["indices", "depth", "values"], opset=11, axis=axis)
    check_against_ort(m, feeds)


def test_run_time_scatter_indices_build_the_graph_from_their_values() -> None:
    data = np.zeros((3,), np.float32)
    feeds = {"data": data, "indices": np.array([0], np.int64), "updates": np.ones(1, np.float32)}
    m, _ = model("ScatterElements", feeds, {}, ["data", "indices", "updates"])
    check_against_ort(m, feeds)
    check_against_ort(m, {**feeds, "indices": np.array([2], np.int64)})
