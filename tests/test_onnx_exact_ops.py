"""ONNX Floor, Ceil, Round, BitwiseAnd/Or/Xor/Not and BitShift: the converters onto the
IR's exact ops, against onnxruntime or, where onnxruntime has no kernel (signed
BitShift-28), the spec's own examples.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper, numpy_helper  # noqa: E402
from test_onnx_support import check_against_ort, make_model, vi  # noqa: E402

import rlx_core as rlx  # noqa: E402
from rlx_core import onnx as rlx_onnx  # noqa: E402
from rlx_core.errors import ModelError  # noqa: E402

I32 = np.iinfo(np.int32)


def _node(op: str, feeds: dict[str, np.ndarray], opset: int = 18, **attrs: object):
    node = helper.make_node(op, list(feeds), ["y"], **attrs)
    model = make_model([node], [vi(k, v.dtype.name, v.shape) for k, v in feeds.items()],
                       [helper.make_empty_tensor_value_info("y")], opset=opset)
    return model, feeds


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_onnx_rounding_against_onnxruntime(op: str, dtype: str) -> None:
    x = np.array([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5], [3.7, -3.7, 0.0, -0.0, 1000.5, -7.25]], dtype)
    graph = check_against_ort(*_node(op, {"x": x}), rtol=0, atol=0)
    assert [n.op.value for n in graph.nodes if n.op.value != "input"] == [op.lower()]


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_onnx_bitwise_against_onnxruntime(op: str, dtype: str) -> None:
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(3, 4), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, size=(4,), dtype=dtype, endpoint=True)  # broadcast
    check_against_ort(*_node(op, {"a": a, "b": b}))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_onnx_bitwise_not_against_onnxruntime(dtype: str) -> None:
    x = np.array([[0, -1, 5], [np.iinfo(dtype).min, np.iinfo(dtype).max, -77]], dtype)
    check_against_ort(*_node("BitwiseNot", {"x": x}))


def test_onnx_bitshift_28_signed_examples() -> None:
    """onnxruntime shifts unsigned types only; BitShift-28's signed rules are checked
    against the values the spec's own test cases hold."""
    cases = [
        ("RIGHT", [-8, -1, I32.min], [1, 1, 1], [-4, -1, -1073741824]),
        ("LEFT", [1073741824, 1, -1073741824], [1, 31, 1], [I32.min, I32.min, I32.min]),
        ("RIGHT", [-8, 4, -1], [32, 33, 100], [-1, 0, -1]),
        ("LEFT", [-8, 4, -1], [-1, -32, -64], [0, 0, 0]),
    ]
    for direction, x, s, want in cases:
        model, _ = _node("BitShift", {"x": np.array(x, np.int32), "s": np.array(s, np.int32)}, opset=28,
                         direction=direction)
        model.ir_version = 11
        graph = rlx_onnx.load(model)
        got = rlx.compile(graph, device="cpu").run({"x": np.array(x, np.int32), "s": np.array(s, np.int32)})[0]
        np.testing.assert_array_equal(got, want, err_msg=f"{direction} {x} by {s}")


def test_onnx_bitshift_refuses_a_bad_direction_and_folds_known_operands() -> None:
    model, _ = _node("BitShift", {"x": np.array([1], np.int64), "s": np.array([1], np.int64)}, direction="UP")
    with pytest.raises(ModelError, match="direction must be 'LEFT' or 'RIGHT', got 'UP'"):
        rlx_onnx.load(model)
    consts = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64), name))
              for name, v in (("c", [3, -3]), ("k", [2, 70]))]
    node = helper.make_node("BitShift", ["c", "k"], ["s"], direction="LEFT")
    add = helper.make_node("Add", ["x", "s"], ["y"])
    model = make_model([*consts, node, add], [vi("x", "int64", [2])], [vi("y", "int64", [2])], opset=18)
    graph = rlx_onnx.load(model)
    assert [n.op.value for n in graph.nodes if n.op.value not in ("input", "constant")] == ["add"]
    got = rlx.compile(graph, device="cpu").run({"x": np.array([1, 1], np.int64)})[0]
    np.testing.assert_array_equal(got, [13, 1])  # 3 << 2, and a shift of 70 >= 64 gives 0
