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
from test_onnx_support import check_against_ort, init, make_model, ort_run, vi

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


# ----------------------------------------------------- dynamic quantization's integer ops
def test_dynamic_quantize_linear_matches_onnxruntime() -> None:
    for x in (RNG.uniform(-3, 5, (4, 7)).astype(np.float32), RNG.uniform(0.5, 2, (3, 5)).astype(np.float32),
              RNG.uniform(-2, -0.1, (6,)).astype(np.float32)):  # both signs, all positive (min 0), all negative
        node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
        outs = [helper.make_tensor_value_info("y", TensorProto.UINT8, None),
                helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("z", TensorProto.UINT8, None)]
        check_against_ort(make_model([node], [vi("x", "float32", x.shape)], outs, [], opset=13), {"x": x},
                          rtol=0, atol=0)


@pytest.mark.parametrize("zero_points", ["none", "scalar", "per row and column"])
@pytest.mark.parametrize(("a_dtype", "b_dtype"), [("uint8", "int8"), ("uint8", "uint8"), ("int8", "int8")])
def test_matmul_integer_matches_onnxruntime(zero_points: str, a_dtype: str, b_dtype: str) -> None:
    a = RNG.integers(np.iinfo(a_dtype).min, np.iinfo(a_dtype).max, (5, 24), endpoint=True).astype(a_dtype)
    b = RNG.integers(np.iinfo(b_dtype).min, np.iinfo(b_dtype).max, (24, 6), endpoint=True).astype(b_dtype)
    consts: dict[str, np.ndarray] = {"b": b}
    if zero_points != "none":
        rows, cols = (5, 6) if zero_points != "scalar" else (1, 1)
        consts["az"] = RNG.integers(0, 100, rows).astype(a_dtype).reshape(() if rows == 1 else (rows,))
        consts["bz"] = RNG.integers(0, 100, cols).astype(b_dtype).reshape(() if cols == 1 else (cols,))
    node = helper.make_node("MatMulInteger", ["a", *consts], ["y"])
    model = make_model([node], [vi("a", a_dtype, a.shape)], [helper.make_tensor_value_info("y", TensorProto.INT32,
                                                                                             None)],
                       [init(k, v) for k, v in consts.items()], opset=13)
    az = consts["az"].astype(np.int32).reshape(-1, 1) if "az" in consts else 0
    bz = consts["bz"].astype(np.int32) if "bz" in consts else 0
    exact = (a.astype(np.int64) - az) @ (b.astype(np.int64) - bz)  # the integer product, no overflow
    from rlx_core import compile as rlx_compile
    np.testing.assert_array_equal(rlx_compile(rlx_onnx.load(model), device="cpu").run({"a": a})[0], exact)
    if zero_points == "per row and column":  # ORT's CPU kernel takes a scalar zero point for A only
        return
    # ORT's uint8 x int8 kernel on AVX2 without VNNI (a Zen 3) sums pairs of products in
    # int16 and saturates them (vpmaddubsw): its answer there is not the product, and
    # rlx's is held to the product above. Where ORT's is exact, the two agree.
    if np.array_equal(ort_run(model, {"a": a})[0], exact):
        check_against_ort(model, {"a": a}, rtol=0, atol=0)


@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (1, 1, 1, 1)])
def test_conv_integer_matches_onnxruntime(pads: tuple[int, ...]) -> None:
    x = RNG.integers(0, 255, (2, 3, 6, 6), endpoint=True).astype(np.uint8)
    w = RNG.integers(0, 255, (4, 3, 3, 3), endpoint=True).astype(np.uint8)
    consts = {"w": w, "xz": np.array(128, np.uint8), "wz": np.array(7, np.uint8)}
    node = helper.make_node("ConvInteger", ["x", *consts], ["y"], pads=list(pads))
    model = make_model([node], [vi("x", "uint8", x.shape)], [helper.make_tensor_value_info("y", TensorProto.INT32,
                                                                                             None)],
                       [init(k, v) for k, v in consts.items()], opset=13)
    check_against_ort(model, {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize(("channels", "k", "path"), [(8, 3, "float32"), (40, 3, "float32, split"),
                                                      (480, 3, "float64")])
def test_conv_integer_is_exact_on_every_path(channels: int, k: int, path: str) -> None:
    """The extreme sums each path takes (``_ops_nn.integer_conv``): 72 terms in one float32
    convolution, 360 split into sixteens and units, 4,320 in float64. Products of 255 by
    -255 (uint8 x at 255, uint8 w at 0 with its zero point 255), most of them odd, so a
    float32 sum past 2**24 would lose them; the int32 onnxruntime computes, and numpy's
    int64 sum."""
    from rlx_core import compile as rlx_compile
    from rlx_core.onnx._ops_nn import F32_EXACT_TERMS, F32_SPLIT_TERMS

    terms = channels * k * k
    assert {"float32": terms <= F32_EXACT_TERMS, "float32, split": F32_EXACT_TERMS < terms <= F32_SPLIT_TERMS,
            "float64": terms > F32_SPLIT_TERMS}[path]
    x = np.where(RNG.random((1, channels, 5, 5)) < 0.9, 255, RNG.integers(0, 255, (1, channels, 5, 5))).astype(np.uint8)
    w = np.where(RNG.random((3, channels, k, k)) < 0.9, 0, RNG.integers(0, 255, (3, channels, k, k))).astype(np.uint8)
    consts = {"w": w, "xz": np.array(0, np.uint8), "wz": np.array(255, np.uint8)}
    node = helper.make_node("ConvInteger", ["x", *consts], ["y"], pads=[1, 1, 1, 1])
    model = make_model([node], [vi("x", "uint8", x.shape)], [helper.make_tensor_value_info("y", TensorProto.INT32,
                                                                                             None)],
                       [init(name, v) for name, v in consts.items()], opset=13)
    check_against_ort(model, {"x": x}, rtol=0, atol=0)
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 3, 5, 5), np.int64)
    for i in range(k):
        for j in range(k):
            want += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 5, j:j + 5], w[:, :, i, j].astype(np.int64) - 255)
    assert np.abs(want).max() > 1 << 24 or path == "float32"
    np.testing.assert_array_equal(rlx_compile(rlx_onnx.load(model), device="cpu").run({"x": x})[0], want)


def test_a_model_quantized_by_onnxruntime_quantize_dynamic_loads_and_matches(tmp_path) -> None:
    """ORT's ``quantize_dynamic`` rewrites a float model's MatMuls and Convs into
    DynamicQuantizeLinear, MatMulInteger / ConvInteger and float rescaling: the file a user
    of ORT's quantization tool has."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    import onnx

    w1 = RNG.standard_normal((3 * 8 * 8, 16)).astype(np.float32) / 8
    wc = RNG.standard_normal((3, 3, 3, 3)).astype(np.float32) / 3
    nodes = [helper.make_node("Conv", ["x", "wc"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "w1"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", (2, 3, 8, 8))], [vi("y", "float32", (2, 16))],
                       [init("wc", wc), init("w1", w1), init("shape", np.array([2, -1], np.int64))], opset=13)
    src, dst = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(model, src)
    quantization.quantize_dynamic(str(src), str(dst), op_types_to_quantize=["MatMul", "Conv"])
    quantized = onnx.load(str(dst))
    ops = {n.op_type for n in quantized.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"} <= ops, ops
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    check_against_ort(quantized, {"x": x}, rtol=1e-5, atol=1e-5)
