"""ONNX Runtime's QOperator ops (QLinearMatMul, QLinearConv), SwiGLU and Det, against
ONNX's reference implementation: the quantized outputs bit for bit (the requantization
factor rounded in the scales' dtype, as the reference rounds it), per tensor and per
column / output channel, with a bias, padding, strides and groups; the forms not read
refused by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from test_onnx_support import init, make_model, vi

import rlx_core
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import InputError, ModelError

RNG = np.random.default_rng(42)


def _model(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray], order: list[str], opset: int,
           **attrs: Any) -> Any:
    """One ``op`` node reading ``order`` ("" for an input left out), ``feeds`` as graph
    inputs and ``consts`` as initializers."""
    node = helper.make_node(op, order, ["y"], **attrs)
    inputs = [vi(k, v.dtype.name, v.shape) for k, v in feeds.items()]
    return make_model([node], inputs, [helper.make_empty_tensor_value_info("y")],
                      [init(k, v) for k, v in consts.items()], opset=opset)


def _check(model: Any, feeds: dict[str, np.ndarray], rtol: float = 0.0) -> np.ndarray:
    """rlx's cpu output against ONNX's reference: equal (integers), or within ``rtol``."""
    graph = rlx_onnx.load(model)
    got = rlx_core.compile(graph, device="cpu").run(dict(feeds))[0]
    want = np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, got.shape, want.dtype, want.shape)
    if rtol:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(got, want)
    return got


def _ints(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _scale(n: int | None = None, dtype: str = "float32") -> np.ndarray:
    return RNG.uniform(0.001, 0.05, n).astype(dtype) if n else np.array(RNG.uniform(0.001, 0.05), dtype)


_MATMUL_INPUTS = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]


def _zero(dtype: str, n: int | None = None) -> np.ndarray:
    """Zero points near the middle of the type's range (the data's, as a calibrator picks)."""
    mid = 0 if dtype == "int8" else 128
    return RNG.integers(mid - 12, mid + 12, n).astype(dtype) if n else np.array(mid + RNG.integers(-12, 12), dtype)


def _y_scale(spread: float, factor: np.ndarray, dtype: str) -> np.ndarray:
    """An output scale that spreads an accumulator of standard deviation ``spread`` over
    most of 8 bits."""
    return np.array(float(np.max(factor)) * (spread + 1) / 40, dtype)


def _matmul_consts(a: np.ndarray, b: np.ndarray, dtype: str, scale_dtype: str = "float32", per_column: bool = False,
                   y_dtype: str | None = None) -> dict[str, np.ndarray]:
    n = b.shape[-1] if per_column else None
    consts = {"a_scale": _scale(dtype=scale_dtype), "a_zero_point": _zero(a.dtype.name), "b": b,
              "b_scale": _scale(n, scale_dtype), "b_zero_point": _zero(dtype, n)}
    acc = (a.astype(np.int64) - consts["a_zero_point"]) @ (b.astype(np.int64) - consts["b_zero_point"])
    factor = consts["a_scale"].astype(np.float64) * consts["b_scale"]
    y_scale = _y_scale(float(np.std(acc)), factor, scale_dtype)
    return {**consts, "y_scale": y_scale, "y_zero_point": _zero(y_dtype or dtype)}


# --------------------------------------------------------------------------- QLinearMatMul
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize(("a_shape", "b_shape"), [((5, 24), (24, 7)), ((3, 4, 16), (3, 16, 6)), ((2, 3, 8), (8, 5))])
def test_qlinear_matmul_per_tensor_is_bit_exact(dtype: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    a = _ints(dtype, a_shape)
    consts = _matmul_consts(a, _ints(dtype, b_shape), dtype)
    got = _check(_model("QLinearMatMul", {"a": a}, consts, _MATMUL_INPUTS, 10), {"a": a})
    assert len(np.unique(got)) > 10  # not all saturated


@pytest.mark.parametrize("scale_dtype", ["float32", "float16"])
def test_qlinear_matmul_rounds_the_factor_in_the_scales_dtype(scale_dtype: str) -> None:
    """Scales drawn until a factor rounded in float64, instead of the scales' dtype, moves
    some output by one: equality with the reference then shows its rounding is kept."""
    a = _ints("uint8", (64, 32))
    consts = _matmul_consts(a, _ints("uint8", (32, 48)), "uint8", scale_dtype)
    acc = (a.astype(np.int64) - consts["a_zero_point"]) @ (consts["b"].astype(np.int64) - consts["b_zero_point"])
    for _ in range(1000):
        scales = [_scale(dtype=scale_dtype), _scale(dtype=scale_dtype)]
        scales.append(_y_scale(float(np.std(acc)) * RNG.uniform(0.5, 1.5), scales[0] * scales[1], scale_dtype))
        kept = (scales[0] * scales[1] / scales[2]).astype(np.float64)
        wide = scales[0].astype(np.float64) * scales[1] / scales[2]
        if not np.array_equal(*(np.clip(np.rint(acc * f + 128), 0, 255) for f in (kept, wide))):
            break
    else:
        pytest.fail("no scales found where the factor's rounding shows")
    consts.update(a_scale=scales[0], b_scale=scales[1], y_scale=scales[2], y_zero_point=np.array(128, np.uint8))
    got = _check(_model("QLinearMatMul", {"a": a}, consts, _MATMUL_INPUTS, 21), {"a": a})
    np.testing.assert_array_equal(got, np.clip(np.rint(acc * kept + 128), 0, 255))


def test_qlinear_matmul_per_column_b_and_uint8_a_int8_b() -> None:
    a = _ints("uint8", (6, 20))
    consts = _matmul_consts(a, _ints("int8", (20, 9)), "int8", per_column=True, y_dtype="uint8")
    _check(_model("QLinearMatMul", {"a": a}, consts, _MATMUL_INPUTS, 10), {"a": a})


def test_qlinear_matmul_scales_as_run_time_inputs() -> None:
    a, b = _ints("int8", (2, 3, 10)), _ints("int8", (2, 10, 4))
    consts = _matmul_consts(a, b, "int8")
    feeds = {"a": a, **{k: v.reshape(1) for k, v in consts.items() if k != "b"}, "b": b}
    _check(_model("QLinearMatMul", feeds, {}, _MATMUL_INPUTS, 21), feeds)


# --------------------------------------------------------------------------- QLinearConv
_CONV_INPUTS = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point"]


@pytest.mark.parametrize(("dtype", "attrs", "bias"), [
    ("uint8", {}, False),
    ("uint8", {"pads": [1, 1, 1, 1]}, True),
    ("int8", {"pads": [1, 0, 2, 1], "strides": [2, 1]}, True),
    ("uint8", {"group": 2, "pads": [1, 1, 1, 1], "dilations": [2, 1]}, True),
    ("int8", {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, False),
])
def test_qlinear_conv_per_channel_is_bit_exact(dtype: str, attrs: dict, bias: bool) -> None:
    group = attrs.get("group", 1)
    x = _ints(dtype, (2, 4, 7, 6))
    w = _ints(dtype, (6, 4 // group, 3, 3))
    consts = {"x_scale": _scale(), "x_zero_point": _zero(dtype), "w": w, "w_scale": _scale(6),
              "w_zero_point": _zero(dtype, 6)}
    spread = float(np.std(x.astype(np.int64) - consts["x_zero_point"]) * np.std(w.astype(np.int64)))
    spread *= np.sqrt(w[0].size)
    consts["y_scale"] = _y_scale(spread, consts["x_scale"] * consts["w_scale"], "float32")
    consts["y_zero_point"] = _zero(dtype)
    order = list(_CONV_INPUTS)
    if bias:
        consts["B"] = RNG.integers(-5000, 5000, 6).astype(np.int32)
        order.append("B")
    got = _check(_model("QLinearConv", {"x": x}, consts, order, 10, **attrs), {"x": x})
    assert len(np.unique(got)) > 10


def test_qlinear_conv_per_tensor_1d() -> None:
    x = _ints("uint8", (1, 3, 12))
    consts = {"x_scale": _scale(), "x_zero_point": _ints("uint8", ()), "w": _ints("uint8", (5, 3, 3)),
              "w_scale": _scale(), "w_zero_point": _ints("uint8", ()), "y_scale": np.array(0.5, np.float32),
              "y_zero_point": np.array(100, np.uint8)}
    graph = rlx_onnx.load(_model("QLinearConv", {"x": x}, consts, _CONV_INPUTS, 10, pads=[1, 1]))
    got = rlx_core.compile(graph, device="cpu").run({"x": x})[0]
    xs = x.astype(np.int64) - consts["x_zero_point"]
    ws = consts["w"].astype(np.int64) - consts["w_zero_point"]
    xp = np.pad(xs, ((0, 0), (0, 0), (1, 1)))
    acc = np.stack([np.einsum("nck,ock->no", xp[:, :, i:i + 3], ws) for i in range(12)], -1)
    factor = consts["x_scale"] * consts["w_scale"] / consts["y_scale"]  # float32, as the reference
    np.testing.assert_array_equal(got, np.clip(np.rint(acc * factor.astype(np.float64) + 100), 0, 255))


# --------------------------------------------------------------------------- SwiGLU, Det
@pytest.mark.parametrize(("dtype", "alpha"), [("float32", None), ("float32", 1.702), ("float64", 0.5),
                                              ("float16", None)])
def test_swiglu(dtype: str, alpha: float | None) -> None:
    a, b = (RNG.uniform(-6, 6, (3, 4, 8)).astype(dtype) for _ in range(2))
    attrs = {} if alpha is None else {"alpha": alpha}
    _check(_model("SwiGLU", {"a": a, "b": b}, {}, ["a", "b"], 28, **attrs), {"a": a, "b": b},
           rtol=2e-3 if dtype == "float16" else 1e-6)


@pytest.mark.parametrize("shape", [(2, 2), (3, 3), (5, 5), (2, 3, 4, 4), (4, 1, 1)])
def test_det(shape: tuple[int, ...]) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    _check(_model("Det", {"x": x}, {}, ["x"], 22), {"x": x}, rtol=1e-6)


def test_det_of_a_singular_matrix_and_float64() -> None:
    x = np.array([[[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.5, 1.0, 7.0]], [[0.0] * 3] * 3, np.eye(3) * 2])
    got = _check(_model("Det", {"x": x}, {}, ["x"], 22), {"x": x}, rtol=1e-12)
    np.testing.assert_allclose(got, [0.0, 0.0, 8.0], atol=1e-12)


def test_det_of_a_non_square_input_is_refused_by_name() -> None:
    x = np.ones((2, 3), np.float32)
    graph = rlx_onnx.load(_model("Det", {"x": x}, {}, ["x"], 22))
    with pytest.raises(InputError, match="Det"):
        rlx_core.compile(graph, device="cpu").run({"x": x})


# --------------------------------------------------------------------------- refused forms
def _refused_matmul(change: str) -> Any:
    a = _ints("uint8", (4, 6))
    consts = _matmul_consts(a, _ints("uint8", (6, 3)), "uint8")
    if change == "per-row a":
        consts["a_scale"] = _scale(4)
    elif change == "bfloat16 scales":
        for k in ("a_scale", "b_scale", "y_scale"):
            consts[k] = np.array(0.5, np.float32)
        return make_model([helper.make_node("Cast", [k], [k + "_bf"], to=TensorProto.BFLOAT16)
                           for k in ("a_scale", "b_scale", "y_scale")]
                          + [helper.make_node("QLinearMatMul", ["a", "a_scale_bf", "a_zero_point", "b", "b_scale_bf",
                                                               "b_zero_point", "y_scale_bf", "y_zero_point"], ["y"])],
                          [vi("a", "uint8", a.shape)], [helper.make_empty_tensor_value_info("y")],
                          [init(k, v) for k, v in consts.items()], opset=21)
    elif change == "int16 a":
        return _model("QLinearMatMul", {"a": a.astype(np.int16)},
                      {**consts, "a_zero_point": np.array(0, np.int16)}, _MATMUL_INPUTS, 21)
    return _model("QLinearMatMul", {"a": a}, consts, _MATMUL_INPUTS, 21)


@pytest.mark.parametrize(("change", "match"), [("per-row a", "a_scale must hold one value"),
                                               ("bfloat16 scales", "scales must share one dtype"),
                                               ("int16 a", "a must be int8 or uint8")])
def test_qlinear_matmul_forms_not_read_are_refused_by_name(change: str, match: str) -> None:
    with pytest.raises(ModelError, match=match):
        rlx_onnx.load(_refused_matmul(change))


def test_qlinear_conv_with_a_bias_of_the_wrong_dtype_is_refused_by_name() -> None:
    x = _ints("uint8", (1, 2, 5, 5))
    consts = {"x_scale": _scale(), "x_zero_point": _ints("uint8", ()), "w": _ints("uint8", (3, 2, 3, 3)),
              "w_scale": _scale(), "w_zero_point": _ints("uint8", ()), "y_scale": _scale(),
              "y_zero_point": _ints("uint8", ()), "B": np.zeros(3, np.int64)}
    with pytest.raises(ModelError, match="B must be int32"):
        rlx_onnx.load(_model("QLinearConv", {"x": x}, consts, [*_CONV_INPUTS, "B"], 10))


def test_swiglu_of_two_shapes_is_refused_by_name() -> None:
    a, b = np.ones((2, 4), np.float32), np.ones((1, 4), np.float32)
    with pytest.raises(ModelError, match="one shape and dtype"):
        rlx_onnx.load(_model("SwiGLU", {"a": a, "b": b}, {}, ["a", "b"], 28))
