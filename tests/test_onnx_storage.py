"""ONNX's storage formats: Cast to float8 (saturating or not), QuantizeLinear and
DequantizeLinear with 4-bit ints and float8, on rlx-cpu."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ml_dtypes")
pytest.importorskip("onnx")

import ml_dtypes
from onnx import TensorProto, helper
from test_onnx_support import init, make_model

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx

RNG = np.random.default_rng(4)


def _vi(name: str, elem: int, shape: list | None) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize(("to", "dtype"), [(TensorProto.FLOAT8E4M3FN, "float8_e4m3fn"),
                                           (TensorProto.FLOAT8E5M2, "float8_e5m2"),
                                           (TensorProto.FLOAT8E4M3FNUZ, "float8_e4m3fnuz")])
def test_onnx_cast_to_float8_saturates_unless_told_not_to(to: int, dtype: str, saturate: int) -> None:
    x = np.array([0.3, -1e6, 1e6, np.inf, -np.inf, np.nan, 500.0, -3.2], np.float32)
    model = make_model([helper.make_node("Cast", ["x"], ["y"], to=to, saturate=saturate)],
                       [_vi("x", TensorProto.FLOAT, [8])], [_vi("y", to, None)], opset=21)
    (y,) = rlx.compile(rlx_onnx.load(model), device="cpu").run({"x": x})
    top = float(ml_dtypes.finfo(dtype).max)
    want = (np.clip(x, -top, top) if saturate else x).astype(dtype)
    np.testing.assert_array_equal(y.astype(np.float64), want.astype(np.float64))


def test_onnx_quantize_and_dequantize_int4() -> None:
    """QuantizeLinear to int4 per axis and DequantizeLinear of uint4, against the spec's
    formulas (onnxruntime cannot pass 4-bit arrays to or from numpy)."""
    x = RNG.uniform(-3, 3, (4, 6)).astype(np.float32)
    scale, zero = np.array([0.2, 0.5, 0.3, 0.9], np.float32), np.array([1, -2, 0, 3])
    q = make_model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=0)],
                   [_vi("x", TensorProto.FLOAT, [4, 6])], [_vi("y", TensorProto.INT4, None)],
                   [init("s", scale), helper.make_tensor("z", TensorProto.INT4, [4], zero.tolist())], opset=21)
    (y,) = rlx.compile(rlx_onnx.load(q), device="cpu").run({"x": x})
    want = np.clip(np.rint(x / scale[:, None]) + zero[:, None], -8, 7)
    assert y.dtype == np.dtype("int4")
    np.testing.assert_array_equal(y.astype(np.int64), want.astype(np.int64))
    d = make_model([helper.make_node("DequantizeLinear", ["q", "s"], ["y"])],
                   [_vi("q", TensorProto.UINT4, [5])], [_vi("y", TensorProto.FLOAT, None)],
                   [init("s", np.array(0.25, np.float32))], opset=21)
    (y,) = rlx.compile(rlx_onnx.load(d), device="cpu").run({"q": np.array([0, 1, 7, 8, 15], dtype=ml_dtypes.uint4)})
    np.testing.assert_array_equal(y, np.array([0, 1, 7, 8, 15], np.float32) * 0.25)


def test_onnx_quantize_to_float8_is_not_rounded_to_integers() -> None:
    x = np.array([0.1, 1.3, -7.7, 1000.0], np.float32)
    model = make_model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
                       [_vi("x", TensorProto.FLOAT, [4])], [_vi("y", TensorProto.FLOAT8E4M3FN, None)],
                       [init("s", np.array(0.5, np.float32)),
                        helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0])], opset=21)
    (y,) = rlx.compile(rlx_onnx.load(model), device="cpu").run({"x": x})
    np.testing.assert_array_equal(y.astype(np.float32), np.clip(x / 0.5, -448, 448).astype("float8_e4m3fn")
                                  .astype(np.float32))
