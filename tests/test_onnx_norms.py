"""InstanceNormalization and GroupNormalization, against onnxruntime (and the spec's
formula where onnxruntime has no kernel for a version)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, rand, vi

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 4, 7), (2, 2, 3, 4, 2)])
def test_instance_normalization(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    c = shape[1]
    model = make_model([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)],
                       [vi("x", "float32", shape)], [vi("y", "float32", None)],
                       [init("s", rand(rng, c)), init("b", rand(rng, c))])
    check_against_ort(model, {"x": rand(rng, *shape, lo=-3, hi=5)}, rtol=1e-4, atol=1e-4)


def _group_norm_reference(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, groups: int, eps: float,
                          per_group: bool) -> np.ndarray:
    n, ch = x.shape[:2]
    g = x.astype(np.float64).reshape(n, groups, -1)
    y = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    if per_group:
        scale, bias = np.repeat(scale, ch // groups), np.repeat(bias, ch // groups)
    at = (ch,) + (1,) * (x.ndim - 2)
    return y * scale.reshape(at) + bias.reshape(at)


@pytest.mark.parametrize(("opset", "groups"), [(21, 2), (21, 6), (21, 1), (18, 3), (18, 2)])
def test_group_normalization_by_version(opset: int, groups: int) -> None:
    """Version 21: scale and bias per channel; version 18: per group."""
    rng = np.random.default_rng(1)
    shape, ch = (2, 6, 4, 3), 6
    k = ch if opset >= 21 else groups
    scale, bias = rand(rng, k), rand(rng, k)
    model = make_model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups,
                                         epsilon=1e-4)],
                       [vi("x", "float32", ["n", ch, 4, 3])], [vi("y", "float32", None)],
                       [init("s", scale), init("b", bias)], opset=opset)
    x = rand(rng, *shape, lo=-2, hi=4)
    got = rlx.compile(rlx_onnx.load(model), device="cpu").run({"x": x})[0]
    want = _group_norm_reference(x, scale, bias, groups, 1e-4, per_group=opset < 21)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if opset >= 21:
        check_against_ort(model, {"x": x}, dims={"n": 2}, rtol=1e-4, atol=1e-4)


def test_group_normalization_refuses_groups_that_do_not_divide() -> None:
    rng = np.random.default_rng(2)
    model = make_model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=4)],
                       [vi("x", "float32", (1, 6, 2, 2))], [vi("y", "float32", None)],
                       [init("s", rand(rng, 6)), init("b", rand(rng, 6))], opset=21)
    with pytest.raises(ModelError, match="num_groups 4 does not divide the 6 channels"):
        rlx_onnx.load(model)
