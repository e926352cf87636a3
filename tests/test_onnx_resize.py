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
