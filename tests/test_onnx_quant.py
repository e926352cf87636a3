"""ONNX linear quantization, the QDQ form of quantized exports: DequantizeLinear and
QuantizeLinear per tensor and per axis, with and without a zero point, float32 and
float16 scales, ties to even and saturation at both ends; against onnxruntime. What is
not read (blocked quantization, ``precision``, 4-bit types) is refused by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper
from test_onnx_support import check_against_ort, init, make_model, vi

from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

RNG = np.random.default_rng(41)


def _model(op: str, x: np.ndarray, consts: dict[str, np.ndarray], opset: int = 13, out: int | None = None,
           **attrs: Any) -> Any:
    node = helper.make_node(op, ["x", *consts], ["y"], **attrs)
    y = helper.make_tensor_value_info("y", out, None) if out is not None else helper.make_empty_tensor_value_info("y")
    return make_model([node], [vi("x", x.dtype.name, x.shape)], [y], [init(k, v) for k, v in consts.items()],
                      opset=opset)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("per_axis", [False, True])
@pytest.mark.parametrize("opset", [13, 21])
def test_dequantize_linear(dtype: str, per_axis: bool, opset: int) -> None:
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, (2, 3, 4), endpoint=True).astype(dtype)
    n = 3 if per_axis else 1
    scale = RNG.uniform(0.01, 0.2, n).astype(np.float32)
    zero = RNG.integers(info.min, info.max, n, endpoint=True).astype(dtype)
    shape = (3,) if per_axis else ()
    consts = {"s": scale.reshape(shape), "z": zero.reshape(shape)}
    check_against_ort(_model("DequantizeLinear", x, consts, opset=opset, axis=1), {"x": x}, rtol=1e-6, atol=0)


def test_dequantize_linear_without_a_zero_point_and_a_float16_scale() -> None:
    x = RNG.integers(-128, 127, (5, 6), endpoint=True).astype(np.int8)
    scale = np.array([0.03125], np.float16).reshape(())
    check_against_ort(_model("DequantizeLinear", x, {"s": scale}, opset=19), {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "uint16"])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_linear_rounds_ties_to_even_and_saturates(dtype: str, per_axis: bool) -> None:
    info = np.iinfo(dtype)
    x = RNG.uniform(-300, 300, (2, 4, 5)).astype(np.float32)
    x[0, 0, :5] = [0.5, 1.5, 2.5, -0.5, -2.5]  # ties at scale 1, zero 0
    n = 4 if per_axis else 1
    scale = np.full(n, 1.0, np.float32) if not per_axis else np.array([1.0, 0.5, 2.0, 0.25], np.float32)
    zero = np.zeros(n, dtype) if not per_axis else np.array([0, info.min // 2 + 1, 3, info.max // 2], dtype)
    shape = (4,) if per_axis else ()
    consts = {"s": scale.reshape(shape), "z": zero.reshape(shape)}
    model = _model("QuantizeLinear", x, consts, opset=21 if dtype.endswith("16") else 13, axis=1)
    graph = check_against_ort(model, {"x": x})
    assert "round" in {n.op.value for n in graph.nodes}


def test_quantize_linear_without_a_zero_point_gives_uint8() -> None:
    x = RNG.uniform(-1, 400, (3, 7)).astype(np.float32)
    model = _model("QuantizeLinear", x, {"s": np.array(1.5, np.float32)}, out=TensorProto.UINT8)
    check_against_ort(model, {"x": x})


@pytest.mark.parametrize(("op", "attrs", "match"), [
    ("QuantizeLinear", {"block_size": 2, "axis": 1}, "blocked quantization"),
    ("DequantizeLinear", {"block_size": 2, "axis": 1}, "blocked quantization"),
    ("QuantizeLinear", {"precision": TensorProto.FLOAT}, "precision"),
])
def test_what_is_not_read_is_refused_by_name(op: str, attrs: dict, match: str) -> None:
    x = np.zeros((2, 4), np.float32 if op == "QuantizeLinear" else np.int8)
    scale = np.ones((2, 2), np.float32) if "block_size" in attrs else np.array(1.0, np.float32)
    consts = {"s": scale}
    with pytest.raises(ModelError, match=match):
        rlx_onnx.load(_model(op, x, consts, opset=23, **attrs))
