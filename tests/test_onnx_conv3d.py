"""3-D Conv, ConvTranspose and pools (video CNNs: r3d, r2plus1d, C3D; 3-D U-Nets) as 2-D ones per
depth, against onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, rand, vi

from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

#: name -> (x shape, w shape, bias, attributes)
CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool, dict[str, Any]]] = {
    "3x3x3 same, bias": ((2, 3, 5, 6, 7), (4, 3, 3, 3, 3), True, {"pads": [1, 1, 1, 1, 1, 1]}),
    "stride 2 in depth and space": ((1, 2, 8, 9, 9), (3, 2, 3, 3, 3), False,
                                    {"strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}),
    "asymmetric pads, dilation": ((1, 2, 7, 6, 6), (2, 2, 2, 3, 2), True,
                                  {"pads": [0, 1, 2, 2, 0, 1], "dilations": [2, 1, 2]}),
    "(1, 7, 7) stem, stride (1, 2, 2)": ((1, 3, 4, 16, 16), (8, 3, 1, 7, 7), False,
                                         {"strides": [1, 2, 2], "pads": [0, 3, 3, 0, 3, 3]}),
    "(3, 1, 1) temporal, groups 2": ((1, 4, 6, 5, 5), (4, 2, 3, 1, 1), True,
                                     {"pads": [1, 0, 0, 1, 0, 0], "group": 2}),
    "auto_pad SAME_UPPER": ((1, 2, 5, 5, 5), (2, 2, 2, 3, 3), False, {"auto_pad": "SAME_UPPER"}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_conv3d_matches_onnxruntime(name: str) -> None:
    xs, ws, bias, attrs = CASES[name]
    rng = np.random.default_rng(len(name))
    inits = [init("w", rand(rng, *ws))] + ([init("b", rand(rng, ws[0]))] if bias else [])
    model = make_model([helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["y"], **attrs)],
                       [vi("x", "float32", xs)], [vi("y", "float32", None)], inits)
    check_against_ort(model, {"x": rand(rng, *xs)}, rtol=1e-4, atol=1e-4)


def test_a_kernel_deeper_than_the_input_is_refused() -> None:
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [vi("x", "float32", (1, 1, 2, 4, 4))],
                       [vi("y", "float32", None)], [init("w", np.ones((1, 1, 3, 1, 1), np.float32))])
    with pytest.raises(ModelError, match=r"kernel depth 3 .* does not fit the padded depth 2"):
        rlx_onnx.load(model)


#: name -> (x shape, w shape (C_in, C_out / group, kd, kh, kw), bias, attributes)
TRANSPOSED: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool, dict[str, Any]]] = {
    "2x2x2 stride 2 (a 3-D U-Net's upsample), bias": ((1, 4, 3, 4, 5), (4, 3, 2, 2, 2), True,
                                                      {"strides": [2, 2, 2]}),
    "3x3x3 pads, output_padding": ((2, 2, 3, 3, 4), (2, 2, 3, 3, 3), False,
                                   {"strides": [2, 1, 2], "pads": [1, 1, 1, 1, 0, 1], "output_padding": [1, 0, 1]}),
    "groups 2, dilation (2, 1, 1)": ((1, 4, 3, 5, 4), (4, 1, 2, 3, 3), True,
                                     {"group": 2, "dilations": [2, 1, 1]}),
    "output_shape": ((1, 2, 3, 3, 3), (2, 2, 3, 3, 3), False, {"strides": [2, 2, 2], "output_shape": [6, 6, 6]}),
    "auto_pad SAME_UPPER": ((1, 1, 2, 3, 3), (1, 2, 3, 3, 3), True, {"strides": [2, 2, 2], "auto_pad": "SAME_UPPER"}),
}


@pytest.mark.parametrize("name", list(TRANSPOSED))
def test_conv_transpose3d_matches_onnxruntime(name: str) -> None:
    xs, ws, bias, attrs = TRANSPOSED[name]
    rng = np.random.default_rng(len(name))
    out_channels = ws[1] * attrs.get("group", 1)
    inits = [init("w", rand(rng, *ws))] + ([init("b", rand(rng, out_channels))] if bias else [])
    model = make_model([helper.make_node("ConvTranspose", ["x", "w", "b"] if bias else ["x", "w"], ["y"], **attrs)],
                       [vi("x", "float32", xs)], [vi("y", "float32", None)], inits)
    check_against_ort(model, {"x": rand(rng, *xs)}, rtol=1e-4, atol=1e-4)


def test_conv_transpose3d_with_a_wrong_pads_count_names_it() -> None:
    model = make_model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       [vi("x", "float32", (1, 1, 2, 2, 2))], [vi("y", "float32", None)],
                       [init("w", np.ones((1, 1, 2, 2, 2), np.float32))])
    with pytest.raises(ModelError, match=r"pads must have 6 entries for a 3-D ConvTranspose"):
        rlx_onnx.load(model)


#: name -> (op, x shape, attributes)
POOLS: dict[str, tuple[str, tuple[int, ...], dict[str, Any]]] = {
    "max 2x2x2 stride 2": ("MaxPool", (2, 3, 6, 6, 6), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
    "max 3x3x3 padded": ("MaxPool", (1, 2, 5, 7, 6), {"kernel_shape": [3, 3, 3], "strides": [2, 1, 2],
                                                       "pads": [1, 1, 1, 1, 0, 1]}),
    "max (1, 3, 3) (C3D's first)": ("MaxPool", (1, 2, 4, 8, 8), {"kernel_shape": [1, 3, 3], "strides": [1, 2, 2],
                                                                 "pads": [0, 1, 1, 0, 1, 1]}),
    "avg 2x2x2": ("AveragePool", (1, 3, 4, 6, 6), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
    "avg padded, pads not counted": ("AveragePool", (1, 2, 5, 5, 5), {"kernel_shape": [3, 3, 3],
                                                                      "pads": [1, 1, 1, 1, 1, 1]}),
    "avg padded, pads counted": ("AveragePool", (1, 2, 5, 6, 5), {"kernel_shape": [3, 2, 3], "strides": [2, 2, 1],
                                                                  "pads": [1, 0, 1, 1, 1, 0], "count_include_pad": 1}),
    "max ceil_mode": ("MaxPool", (1, 2, 6, 7, 6), {"kernel_shape": [3, 2, 3], "strides": [2, 2, 2], "ceil_mode": 1}),
    "max ceil_mode, dilation, pads": ("MaxPool", (1, 1, 7, 6, 7), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 3],
                                                                   "dilations": [2, 1, 1], "pads": [1, 0, 1, 0, 1, 0],
                                                                   "ceil_mode": 1}),
    "avg ceil_mode, pads not counted": ("AveragePool", (1, 2, 6, 5, 7), {"kernel_shape": [3, 3, 2],
                                                                         "strides": [2, 2, 2], "ceil_mode": 1,
                                                                         "pads": [1, 1, 0, 0, 1, 1]}),
    "avg dilation (2, 1, 2), pads counted": ("AveragePool", (1, 2, 7, 6, 7), {"kernel_shape": [2, 3, 2],
                                                                              "dilations": [2, 1, 2],
                                                                              "count_include_pad": 1,
                                                                              "pads": [1, 1, 0, 1, 0, 1]}),
    "avg dilation 2, ceil_mode": ("AveragePool", (1, 1, 8, 7, 6), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2],
                                                                   "dilations": [2, 2, 2], "ceil_mode": 1}),
    "avg ceil_mode, pads counted": ("AveragePool", (2, 1, 7, 6, 5), {"kernel_shape": [2, 3, 3], "strides": [2, 2, 2],
                                                                     "pads": [1, 0, 1, 1, 1, 1], "ceil_mode": 1,
                                                                     "count_include_pad": 1}),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pool3d_matches_onnxruntime(name: str) -> None:
    op, xs, attrs = POOLS[name]
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [vi("x", "float32", xs)],
                       [vi("y", "float32", None)], opset=19)  # (AveragePool's dilations: opset 19)
    check_against_ort(model, {"x": rand(np.random.default_rng(len(name)), *xs, lo=-3, hi=3)}, rtol=1e-5, atol=1e-5)


#: name -> (x shape, attributes)
LP_POOLS: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {
    "p 2, 2x2x2 stride 2": ((1, 3, 4, 6, 6), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
    "p 1, padded": ((2, 2, 3, 5, 4), {"p": 1, "kernel_shape": [3, 3, 2], "pads": [1, 1, 0, 1, 1, 1]}),
    "p 3, SAME_UPPER": ((1, 2, 5, 5, 6), {"p": 3, "kernel_shape": [2, 2, 3], "strides": [2, 1, 2],
                                                    "auto_pad": "SAME_UPPER"}),
}


@pytest.mark.parametrize("name", list(LP_POOLS))
def test_lp_pool3d_matches_onnxruntime(name: str) -> None:
    xs, attrs = LP_POOLS[name]
    model = make_model([helper.make_node("LpPool", ["x"], ["y"], **attrs)], [vi("x", "float32", xs)],
                       [vi("y", "float32", None)])
    check_against_ort(model, {"x": rand(np.random.default_rng(len(name)), *xs, lo=-2, hi=2)}, rtol=1e-4, atol=1e-5)
