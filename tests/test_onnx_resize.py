"""Resize against onnxruntime: every mode and coordinate transformation a model may use,
scales or sizes, axes, aspect-ratio policies, antialiasing, float16 and integer data.
(ONNX's own node tests of Resize run in ``test_onnx_node_conformance.py``.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, vi

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

RNG = np.random.default_rng(7)


def resize(x: np.ndarray, *, scales: list[float] | None = None, sizes: list[int] | None = None,
           roi: list[float] | None = None, opset: int = 19, **attrs: Any) -> tuple[Any, dict]:
    consts = {"roi": np.array(roi or [], np.float32), "scales": np.array(scales or [], np.float32)}
    names = ["x", "roi", "scales"]
    if sizes is not None:
        consts["sizes"] = np.array(sizes, np.int64)
        names.append("sizes")
        consts["scales"] = np.array([], np.float32)
    node = helper.make_node("Resize", names, ["y"], **attrs)
    model = make_model([node], [vi("x", x.dtype.name, x.shape)], [helper.make_empty_tensor_value_info("y")],
                       [init(k, v) for k, v in consts.items()], opset=opset)
    return model, {"x": x}


def img(*shape: int, dtype: str = "float32") -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


CASES = {
    "nearest 2x (a U-Net's upsample)": (img(1, 3, 4, 5), {"scales": [1, 1, 2, 2]}),
    "nearest sizes, asymmetric floor (torch's classic export)": (
        img(1, 2, 5, 4), {"sizes": [1, 2, 9, 7], "mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                          "nearest_mode": "floor"}),
    "nearest downsample, round_prefer_ceil": (img(1, 2, 8, 8), {"scales": [1, 1, 0.6, 0.5],
                                                                "nearest_mode": "round_prefer_ceil"}),
    "linear half_pixel upsample": (img(2, 3, 4, 6), {"scales": [1, 1, 1.5, 2], "mode": "linear"}),
    "linear pytorch_half_pixel downsample": (img(1, 2, 9, 7), {"sizes": [1, 2, 4, 3], "mode": "linear",
                                                               "coordinate_transformation_mode": "pytorch_half_pixel"}),
    "linear align_corners": (img(1, 1, 5, 5), {"sizes": [1, 1, 8, 3], "mode": "linear",
                                               "coordinate_transformation_mode": "align_corners"}),
    "linear antialias downsample": (img(1, 2, 12, 10), {"scales": [1, 1, 0.5, 0.4], "mode": "linear",
                                                        "antialias": 1}),
    "cubic half_pixel": (img(1, 2, 6, 6), {"scales": [1, 1, 1.7, 0.8], "mode": "cubic"}),
    "cubic exclude_outside, A=-0.5": (img(1, 1, 7, 5), {"scales": [1, 1, 2, 2], "mode": "cubic",
                                                        "exclude_outside": 1, "cubic_coeff_a": -0.5}),
    "axes: the last two only": (img(2, 3, 4, 4), {"scales": [3, 2], "axes": [3, 2], "mode": "linear"}),
    "sizes not_larger": (img(1, 1, 4, 6), {"sizes": [7, 7], "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}),
    "tf_crop_and_resize with extrapolation": (img(1, 1, 6, 6), {"sizes": [1, 1, 5, 5], "mode": "linear",
                                                                "coordinate_transformation_mode": "tf_crop_and_resize",
                                                                "roi": [0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3],
                                                                "extrapolation_value": 9.0}),
    "nearest on int32 data": (RNG.integers(-9, 9, (1, 2, 3, 3)).astype(np.int32), {"scales": [1, 1, 2, 3]}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_resize_matches_onnxruntime(case: str) -> None:
    x, kwargs = CASES[case]
    model, feeds = resize(x, **kwargs)
    check_against_ort(model, feeds, rtol=1e-5, atol=1e-5)


def test_resize_float16_is_interpolated_in_float32() -> None:
    model, feeds = resize(img(1, 2, 4, 4, dtype="float16"), scales=[1, 1, 2, 2], mode="linear")
    check_against_ort(model, feeds, rtol=2e-3, atol=2e-3)


def test_resize_refusals_name_the_problem() -> None:
    with pytest.raises(ModelError, match="exactly one of scales and sizes"):
        rlx_onnx.load(resize(img(1, 1, 2, 2))[0])
    with pytest.raises(ModelError, match="linear interpolation needs a float input"):
        rlx_onnx.load(resize(np.ones((1, 1, 2, 2), np.int64), scales=[1, 1, 2, 2], mode="linear")[0])
    with pytest.raises(ModelError, match="mode 'area' is not one of"):
        rlx_onnx.load(resize(img(1, 1, 2, 2), scales=[1, 1, 2, 2], mode="area")[0])


#: (size, align_corners); an axis of one pixel with align_corners: test_a_unit_axis_sits_at_the_center
AFFINE_GRIDS = [((2, 3, 4, 5), 0), ((2, 3, 4, 5), 1), ((1, 2, 3, 4, 2), 0), ((1, 2, 3, 4, 2), 1), ((2, 1, 1, 3), 0)]


@pytest.mark.parametrize(("size", "align"), AFFINE_GRIDS)
def test_affine_grid_and_the_sampling_it_feeds_match_onnxruntime(size: tuple[int, ...], align: int) -> None:
    """A spatial transformer: AffineGrid's grid, then GridSample reading the image there."""
    nd = len(size) - 2
    rng = np.random.default_rng(sum(size) + align)
    theta = (np.eye(nd, nd + 1) + rng.uniform(-0.3, 0.3, (size[0], nd, nd + 1))).astype(np.float32)
    image = rng.uniform(-1, 1, size).astype(np.float32)
    nodes = [helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align),
             helper.make_node("GridSample", ["image", "grid"], ["y"], align_corners=align)]
    model = make_model(nodes, [vi("theta", "float32", theta.shape), vi("image", "float32", size)],
                       [vi("grid", "float32", None), vi("y", "float32", None)],
                       [init("size", np.array(size, np.int64))], opset=20)
    check_against_ort(model, {"theta": theta, "image": image}, rtol=1e-5, atol=1e-5)


def test_affine_grid_refusals_name_the_problem() -> None:
    model = make_model([helper.make_node("AffineGrid", ["theta", "size"], ["grid"])],
                       [vi("theta", "float32", (2, 2, 3))], [vi("grid", "float32", None)],
                       [init("size", np.array([3, 1, 4, 4], np.int64))], opset=20)
    with pytest.raises(ModelError, match=r"theta must have shape \(3, 2, 3\) for size \(3, 1, 4, 4\)"):
        rlx_onnx.load(model)


def test_a_unit_axis_sits_at_the_center() -> None:
    """An axis of one pixel with align_corners has no corners to align: torch places it at 0
    (what the model was trained with, since torch 1.3); onnxruntime 1.32 answers 1 and ONNX's
    reference -1. rlx follows torch."""
    model = make_model([helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=1)],
                       [vi("theta", "float32", (1, 2, 3))], [vi("grid", "float32", None)],
                       [init("size", np.array([1, 1, 1, 3], np.int64))], opset=20)
    theta = np.array([[[1, 0, 0], [0, 1, 0]]], np.float32)
    grid = rlx.compile(rlx_onnx.load(model), device="cpu").run({"theta": theta})[0]
    np.testing.assert_array_equal(grid.reshape(-1, 2), [[-1, 0], [0, 0], [1, 0]])
