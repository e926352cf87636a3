"""One ONNX node at a time, against onnxruntime: each converter, its attributes and its opset forms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, vi

from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

RNG = np.random.default_rng(1234)


def f32(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def node_case(
    op: str,
    inputs: Mapping[str, np.ndarray],
    *,
    consts: Mapping[str, np.ndarray] | None = None,
    outputs: int = 1,
    opset: int = 17,
    order: tuple[str, ...] | None = None,
    **attrs: Any,
) -> tuple:
    """A one-node model: ``inputs`` are fed at run time, ``consts`` are initializers.

    ``order`` names the node's inputs in order ("" for a left-out optional one); default:
    the run-time inputs, then the constants, as given.
    """
    consts = dict(consts or {})
    names = list(order) if order is not None else [*inputs, *consts]
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    declared = [vi(k, v.dtype.name, v.shape) for k, v in inputs.items()]
    model = make_model([node], declared, [helper.make_empty_tensor_value_info(o) for o in outs],
                       [init(k, v) for k, v in consts.items()], opset=opset)
    return model, dict(inputs)


special = np.array([0.0, -0.0, 1.5, -1.5, np.inf, -np.inf, np.nan, 2.0], np.float32)
special_b = np.array([-0.0, 0.0, 1.5, 2.0, np.inf, np.inf, 1.0, np.nan], np.float32)

CASES: dict[str, tuple] = {
    **{op: node_case(op, {"a": f32(3, 4), "b": f32(4, lo=0.5)}) for op in ("Add", "Sub", "Mul", "Div")},
    "Div-int": node_case("Div", {"a": i64(7, -7, 6, -9), "b": i64(2, 2, -4, 4)}),
    **{op: node_case(op, {"x": f32(2, 3, lo=0.1)}) for op in ("Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal",
                                                              "Erf", "Tanh", "Sigmoid", "Relu")},
    "Pow": node_case("Pow", {"a": f32(2, 3, lo=0.1), "b": f32(2, 3)}),
    "Pow-square": node_case("Pow", {"a": f32(2, 3)}, consts={"e": np.array(2.0, np.float32)}),
    "Pow-sqrt": node_case("Pow", {"a": f32(2, 3, lo=0.0)}, consts={"e": np.array(0.5, np.float32)}),
    "Pow-int-exponent": node_case("Pow", {"a": f32(2, 3, lo=0.1)}, consts={"e": i64(3)}),
    "LeakyRelu": node_case("LeakyRelu", {"x": f32(3, 5)}, alpha=0.1),
    "LeakyRelu-big": node_case("LeakyRelu", {"x": f32(3, 5)}, alpha=1.7),
    "LeakyRelu-neg": node_case("LeakyRelu", {"x": f32(3, 5)}, alpha=-0.3),
    "HardSigmoid": node_case("HardSigmoid", {"x": f32(4, 5, lo=-5, hi=5)}, alpha=0.3, beta=0.4),
    "HardSwish": node_case("HardSwish", {"x": f32(4, 5, lo=-5, hi=5)}),
    "Gelu": node_case("Gelu", {"x": f32(3, 4)}, opset=20),
    "Gelu-tanh": node_case("Gelu", {"x": f32(3, 4)}, opset=20, approximate="tanh"),
    "Clip": node_case("Clip", {"x": f32(3, 4)}, consts={"lo": np.array(-0.5, np.float32),
                                                         "hi": np.array(0.7, np.float32)}),
    "Clip-max-only": node_case("Clip", {"x": f32(3, 4)}, consts={"hi": np.array(0.2, np.float32)},
                               order=("x", "", "hi")),
    "Clip-runtime-bounds": node_case("Clip", {"x": f32(3, 4), "lo": np.array(-1.0, np.float32),
                                              "hi": np.array(0.1, np.float32)}),
    "Max": node_case("Max", {"a": f32(3, 1), "b": f32(4), "c": f32(3, 4)}),
    "Min": node_case("Min", {"a": f32(3, 4), "b": f32(1, 4)}),
    "Where": node_case("Where", {"c": RNG.random((2, 3)) < 0.5, "a": f32(2, 3), "b": f32(3)}),
    **{op: node_case(op, {"a": special, "b": special_b})
       for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")},
    "Equal-int-broadcast": node_case("Equal", {"a": i64(1, 2, 3).reshape(3, 1), "b": i64(3, 2)}),
    "Equal-bool": node_case("Equal", {"a": np.array([True, False, True]), "b": np.array([True, True, False])}),
    "Less-int32": node_case("Less", {"a": np.array([-5, 3, 2**31 - 1], np.int32),
                                     "b": np.array([2**31 - 1, 3, -(2**31)], np.int32)}),
    "Not": node_case("Not", {"x": np.array([[True, False], [False, False]])}),
    "IsNaN": node_case("IsNaN", {"x": special}),
    "IsNaN-float64": node_case("IsNaN", {"x": special.astype(np.float64)}),
    "IsInf": node_case("IsInf", {"x": special}),
    "IsInf-negative-only": node_case("IsInf", {"x": special}, detect_positive=0),
    "IsInf-positive-only": node_case("IsInf", {"x": special.astype(np.float16)}, opset=20, detect_negative=0),
    "IsInf-nothing": node_case("IsInf", {"x": special}, detect_positive=0, detect_negative=0),
    **{op: node_case(op, {"a": np.array([True, True, False, False]), "b": np.array([True, False, True, False])})
       for op in ("And", "Or", "Xor")},
    "Softmax": node_case("Softmax", {"x": f32(2, 3, 4)}, axis=1),
    "Softmax-opset11": node_case("Softmax", {"x": f32(2, 3, 4)}, opset=11, axis=1),
    "LogSoftmax": node_case("LogSoftmax", {"x": f32(2, 5, lo=-30, hi=30)}),
    "LogSoftmax-opset11": node_case("LogSoftmax", {"x": f32(2, 3, 4)}, opset=11),
    "LayerNormalization-axis1": node_case("LayerNormalization", {"x": f32(2, 3, 4)},
                                          consts={"g": f32(3, 4), "b": f32(3, 4)}, axis=1, epsilon=1e-3),
    "LayerNormalization-no-bias": node_case("LayerNormalization", {"x": f32(2, 5)}, consts={"g": f32(5)}),
    "RMSNormalization": node_case("RMSNormalization", {"x": f32(2, 3, 8)}, consts={"g": f32(8)}, opset=23),
    "RMSNormalization-axis1-eps": node_case("RMSNormalization", {"x": f32(2, 3, 4)}, consts={"g": f32(3, 4)},
                                            opset=23, axis=1, epsilon=0.1),
    "BatchNormalization-runtime-stats": node_case(
        "BatchNormalization", {"x": f32(2, 3, 4), "s": f32(3), "b": f32(3), "m": f32(3), "v": f32(3, lo=0.5)}),
    "ReduceMean-attr": node_case("ReduceMean", {"x": f32(2, 3, 4)}, opset=13, axes=[-1], keepdims=1),
    "ReduceMax-attr": node_case("ReduceMax", {"x": f32(2, 3, 4)}, opset=13, axes=[0, 2], keepdims=0),
    "ReduceSum-input": node_case("ReduceSum", {"x": f32(2, 3, 4)}, consts={"axes": i64(1)}, opset=13, keepdims=0),
    "ReduceSum-all": node_case("ReduceSum", {"x": f32(2, 3, 4)}, opset=13),
    "ReduceSum-noop": node_case("ReduceSum", {"x": f32(2, 3)}, opset=13, noop_with_empty_axes=1),
    "ReduceMean-input-opset18": node_case("ReduceMean", {"x": f32(2, 3, 4)}, consts={"axes": i64(0, -1)}, opset=18),
    "ReduceMax-input-opset18": node_case("ReduceMax", {"x": f32(2, 3, 4)}, consts={"axes": i64(1)}, opset=18,
                                         keepdims=0),
    "ReduceMin": node_case("ReduceMin", {"x": f32(3, 4)}, opset=13, axes=[1]),
    "Reshape": node_case("Reshape", {"x": f32(2, 3, 4)}, consts={"s": i64(0, -1, 2)}),
    "Transpose-default": node_case("Transpose", {"x": f32(2, 3, 4)}),
    "Transpose": node_case("Transpose", {"x": f32(2, 3, 4)}, perm=[1, 2, 0]),
    "Flatten-0": node_case("Flatten", {"x": f32(2, 3, 4)}, axis=0),
    "Flatten-neg": node_case("Flatten", {"x": f32(2, 3, 4)}, axis=-1),
    "Squeeze": node_case("Squeeze", {"x": f32(1, 3, 1, 2)}, consts={"axes": i64(-2)}),
    "Squeeze-all": node_case("Squeeze", {"x": f32(1, 3, 1, 2)}),
    "Squeeze-opset11": node_case("Squeeze", {"x": f32(1, 3, 1, 2)}, opset=11, axes=[0]),
    "Unsqueeze": node_case("Unsqueeze", {"x": f32(3, 2)}, consts={"axes": i64(0, -1)}),
    "Concat": node_case("Concat", {"a": f32(2, 3), "b": f32(2, 1), "c": f32(2, 2)}, axis=-1),
    "Split-sizes": node_case("Split", {"x": f32(2, 7)}, consts={"split": i64(3, 4)}, outputs=2, axis=1),
    "Split-equal": node_case("Split", {"x": f32(6, 2)}, outputs=3),
    "Split-uneven-opset18": node_case("Split", {"x": f32(7, 2)}, outputs=3, opset=18, num_outputs=3),
    "Slice": node_case("Slice", {"x": f32(5, 6)}, consts={"st": i64(1, -1), "en": i64(100, 0), "ax": i64(0, 1),
                                                         "sp": i64(2, -2)}),
    "Slice-default-axes": node_case("Slice", {"x": f32(5, 6)}, consts={"st": i64(-3), "en": i64(-1)}),
    "Gather-runtime-indices": node_case("Gather", {"x": f32(3, 5), "i": i64(0, -1, 2, 4).reshape(2, 2)}, axis=1),
    "Gather-const-indices": node_case("Gather", {"x": f32(4, 2)}, consts={"i": i64(3)}),
    "Expand": node_case("Expand", {"x": f32(3, 1)}, consts={"s": i64(2, 1, 4)}),
    "Expand-bool": node_case("Expand", {"x": np.array([True, False])}, consts={"s": i64(3, 2)}),
    "Cast-to-int": node_case("Cast", {"x": f32(3, 4, lo=-9, hi=9)}, to=6),
    "Cast-to-bool": node_case("Cast", {"x": np.array([0.0, 1.5, -0.0, 3.0], np.float32)}, to=9),
    "Cast-to-half": node_case("Cast", {"x": i64(1, 2, 3)}, to=10),
    "Identity": node_case("Identity", {"x": f32(2)}),
    "Dropout": node_case("Dropout", {"x": f32(2, 3)}, outputs=2),
    "Dropout-ratio": node_case("Dropout", {"x": f32(2, 3)}, consts={"r": np.array(0.3, np.float32)}),
    "MaxPool-ceil": node_case("MaxPool", {"x": f32(1, 2, 7, 6)}, kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1),
    "MaxPool-same": node_case("MaxPool", {"x": f32(1, 2, 5, 5)}, kernel_shape=[3, 3], strides=[2, 2],
                              auto_pad="SAME_UPPER"),
    "MaxPool-dilated": node_case("MaxPool", {"x": f32(1, 1, 6, 6)}, kernel_shape=[2, 2], dilations=[2, 2],
                                 pads=[1, 1, 1, 1]),
    "MaxPool-pads-wider-than-half-the-window": node_case("MaxPool", {"x": f32(1, 2, 5, 6)}, kernel_shape=[3, 3],
                                                         pads=[2, 1, 0, 2]),
    "MaxPool-int8-wide-pads": node_case("MaxPool", {"x": np.arange(-20, 20, dtype=np.int8).reshape(1, 1, 5, 8)},
                                        kernel_shape=[2, 3], strides=[1, 2], pads=[1, 2, 1, 0], opset=12),
    "AveragePool-dilated-ceil": node_case("AveragePool", {"x": f32(1, 2, 9, 8)}, kernel_shape=[3, 2], strides=[2, 2],
                                          dilations=[2, 3], pads=[1, 0, 1, 1], ceil_mode=1, opset=19),
    "AveragePool-dilated-include-pad": node_case("AveragePool", {"x": f32(2, 1, 7, 7)}, kernel_shape=[2, 3],
                                                 dilations=[3, 2], pads=[1, 1, 1, 2], count_include_pad=1, opset=19),
    "AveragePool-include-pad": node_case("AveragePool", {"x": f32(1, 2, 5, 4)}, kernel_shape=[3, 3],
                                         pads=[1, 1, 1, 1], count_include_pad=1),
    "GlobalAveragePool": node_case("GlobalAveragePool", {"x": f32(2, 3, 4, 5)}),
    "GlobalMaxPool": node_case("GlobalMaxPool", {"x": f32(2, 3, 4, 5)}),
    "Conv-same-lower": node_case("Conv", {"x": f32(1, 2, 7, 6)}, consts={"w": f32(4, 2, 3, 3)}, strides=[2, 2],
                                 auto_pad="SAME_LOWER"),
    "Conv-depthwise": node_case("Conv", {"x": f32(2, 3, 5, 5)}, consts={"w": f32(3, 1, 3, 3), "b": f32(3)},
                                group=3, pads=[1, 0, 1, 2]),
    "Conv-runtime-weight": node_case("Conv", {"x": f32(1, 2, 5, 5), "w": f32(2, 2, 2, 2)}, dilations=[2, 1]),
    "ConvTranspose-stride2 (a U-Net's upsample)": node_case("ConvTranspose", {"x": f32(1, 4, 5, 6)},
                                                            consts={"w": f32(4, 3, 2, 2), "b": f32(3)},
                                                            strides=[2, 2]),
    "ConvTranspose-pads-output_padding": node_case("ConvTranspose", {"x": f32(2, 2, 4, 4)},
                                                   consts={"w": f32(2, 3, 3, 3)}, strides=[2, 3], pads=[1, 0, 1, 2],
                                                   output_padding=[1, 2]),
    "ConvTranspose-groups-dilation": node_case("ConvTranspose", {"x": f32(1, 4, 5, 5)},
                                               consts={"w": f32(4, 1, 3, 2)}, group=2, dilations=[2, 1],
                                               strides=[1, 2]),
    "ConvTranspose-same-upper": node_case("ConvTranspose", {"x": f32(1, 1, 3, 3)}, consts={"w": f32(1, 2, 3, 3)},
                                          strides=[2, 2], auto_pad="SAME_UPPER"),
    "ConvTranspose-runtime-weight": node_case("ConvTranspose", {"x": f32(1, 2, 3, 3), "w": f32(2, 2, 3, 3)}),
    "NegativeLogLikelihoodLoss-weight-ignore": node_case(
        "NegativeLogLikelihoodLoss", {"x": f32(3, 5, 2), "t": np.array([[0, 4], [2, -1], [-1, 1]], np.int64)},
        consts={"w": f32(5, lo=0.5)}, ignore_index=-1),
    "NegativeLogLikelihoodLoss-sum": node_case("NegativeLogLikelihoodLoss", {"x": f32(4, 3),
                                                                            "t": np.array([0, 2, 1, 2], np.int64)},
                                               reduction="sum"),
    "SoftmaxCrossEntropyLoss-none-log_prob": node_case(
        "SoftmaxCrossEntropyLoss", {"s": f32(2, 4, 3), "t": np.array([[1, 3, 0], [2, 2, 1]], np.int64)},
        outputs=2, reduction="none"),
    "Conv-1d (audio, text)": node_case("Conv", {"x": f32(2, 3, 20)}, consts={"w": f32(4, 3, 5), "b": f32(4)},
                                       pads=[2, 1], strides=[2], dilations=[2]),
    "Conv-1d-depthwise-same": node_case("Conv", {"x": f32(1, 4, 9)}, consts={"w": f32(4, 1, 3)}, group=4,
                                        auto_pad="SAME_UPPER"),
    "MaxPool-1d": node_case("MaxPool", {"x": f32(2, 3, 11)}, kernel_shape=[3], strides=[2], pads=[1, 1]),
    "AveragePool-1d-ceil": node_case("AveragePool", {"x": f32(1, 2, 10)}, kernel_shape=[4], strides=[3],
                                     ceil_mode=1),
    "ConvTranspose-1d": node_case("ConvTranspose", {"x": f32(1, 2, 6)}, consts={"w": f32(2, 3, 4)}, strides=[2],
                                  pads=[1, 1]),
    "MatMul-batched": node_case("MatMul", {"a": f32(2, 1, 3, 4), "b": f32(3, 4, 5)}),
    "MatMul-vector": node_case("MatMul", {"a": f32(4), "b": f32(2, 4, 3)}),
    "Sum": node_case("Sum", {"a": f32(3), "b": f32(2, 3), "c": f32(3)}),
    "Mean": node_case("Mean", {"a": f32(3), "b": f32(2, 3)}),
}


def test_rms_normalization_float16_rounds_where_the_spec_says() -> None:
    """float16 is normalized in float32 and cast back, then scaled in float16 (the spec's
    order); onnxruntime scales before rounding, so the two differ by a float16 ulp."""
    model, feeds = node_case("RMSNormalization", {"x": f32(4, 6).astype(np.float16)},
                             consts={"g": f32(6).astype(np.float16)}, opset=23)
    check_against_ort(model, feeds, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("case", sorted(CASES))
def test_node_matches_onnxruntime(case: str) -> None:
    model, feeds = CASES[case]
    with np.errstate(invalid="ignore"):
        check_against_ort(model, feeds, rtol=2e-5, atol=2e-6)


def _model(nodes: list, inputs: list, outputs: list[str], inits: list | None = None, opset: int = 17) -> Any:
    return make_model(nodes, inputs, [helper.make_empty_tensor_value_info(o) for o in outputs], inits or [], opset)


def test_shape_arithmetic_folds_to_constants() -> None:
    """Shape/Size/Range/ConstantOfShape/Constant feed run-time ops as folded constants."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=1),  # opset 15: a slice of the shape
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=helper.make_tensor("", 1, [1], [1.5])),
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=1),
        helper.make_node("Constant", [], ["start"], value_float=0.0),
        helper.make_node("Constant", [], ["delta"], value_float=0.5),
        helper.make_node("Range", ["start", "nf", "delta"], ["r"]),  # 0, 0.5, ... < 24: 48 values
        helper.make_node("Constant", [], ["shape"], value_ints=[2, 3, 8]),
        helper.make_node("Reshape", ["r", "shape"], ["r3"]),
        helper.make_node("Add", ["x", "ones"], ["a"]),
        helper.make_node("Concat", ["a", "r3"], ["y"], axis=-1),
    ]
    model = _model(nodes, [vi("x", "float32", [2, 3, 4])], ["y"], opset=17)
    graph = check_against_ort(model, {"x": f32(2, 3, 4)})
    assert sorted(n.op.value for n in graph.nodes if n.op.value not in ("input", "constant")) == ["add", "concat"]


def test_shape_of_a_weight_keeps_the_weight_replaceable() -> None:
    """A reshape target computed from a param's shape folds, but the param stays a param."""
    nodes = [
        helper.make_node("Shape", ["w"], ["ws"]),
        helper.make_node("Reshape", ["x", "ws"], ["xr"]),
        helper.make_node("Mul", ["xr", "w"], ["y"]),
    ]
    model = _model(nodes, [vi("x", "float32", [6])], ["y"], [init("w", f32(2, 3))])
    graph = check_against_ort(model, {"x": f32(6)})
    assert [graph.node(i).name for i in graph.params] == ["w"]


def test_unsorted_nodes_are_sorted() -> None:
    nodes = [helper.make_node("Relu", ["h"], ["y"]), helper.make_node("Neg", ["x"], ["h"])]
    model = _model(nodes, [vi("x", "float32", [3])], ["y"])
    graph = rlx_onnx.load(model)
    assert [n.op.value for n in graph.nodes] == ["input", "neg", "relu"]


def test_graph_output_that_is_an_input_or_listed_twice() -> None:
    nodes = [helper.make_node("Identity", ["x"], ["y"])]
    model = _model(nodes, [vi("x", "float32", [3])], ["y", "x"])
    graph = check_against_ort(model, {"x": f32(3)})
    assert graph.output_names() == ["y", "x"]


def test_list_inputs_names_symbolic_dims() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", "float32", ["batch", None, 4])], ["y"])
    model.graph.input[0].type.tensor_type.shape.dim[1].Clear()  # a dim with neither value nor name
    (spec,) = rlx_onnx.list_inputs(model)
    assert spec.name == "x" and spec.shape == ("batch", "x:1", 4) and spec.dtype == "float32"
    g = rlx_onnx.load(model, dims={"batch": 2, "x:1": 3})
    assert g.node(g.inputs[0]).shape == (2, 3, 4)


@pytest.mark.parametrize(("op", "x", "opset", "attrs"), [
    ("ReduceMin", np.array([[-2**31, 5, 3]], np.int32), 17, {"axes": [1]}),  # -x overflowed at INT_MIN
    ("ReduceMin", np.array([[-2**63, 5, 3]], np.int64), 17, {"axes": [1]}),
    ("ReduceSumSquare", np.array([[1.0, -2.0]], np.float32), 18, {"noop_with_empty_axes": 1}),  # x², not x
    ("ReduceL2", np.array([[1.0, -2.0]], np.float32), 18, {"noop_with_empty_axes": 1}),  # |x|, not x
    ("Softmax", np.arange(6, dtype=np.float32).reshape(1, 2, 3), 11, {"axis": -1}),  # -1 meant rank, not rank-1
    ("LogSoftmax", np.arange(6, dtype=np.float32).reshape(1, 2, 3), 11, {"axis": -1}),
])
def test_reduction_and_softmax_edge_forms_match_onnxruntime(op: str, x: np.ndarray, opset: int, attrs: dict) -> None:
    """Wrong answers found while widening the importer, each against onnxruntime."""
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [vi("x", x.dtype.name, x.shape)],
                       [vi("y", x.dtype.name, None)], opset=opset)
    check_against_ort(model, {"x": x})


def test_conv_transpose_weights_follow_set_param() -> None:
    """The weight rearrangement (swap channels, reverse the window) is computed from the
    param, so replacing the param replaces what the convolution uses."""
    import rlx_core
    from rlx_core.reference import evaluate

    model, feeds = node_case("ConvTranspose", {"x": f32(1, 2, 4, 4)}, consts={"w": f32(2, 3, 3, 3)}, strides=[2, 2])
    graph = rlx_onnx.load(model)
    compiled = rlx_core.compile(graph, device="cpu")
    new = f32(2, 3, 3, 3)
    compiled.set_param("w", new)
    got = compiled.run(feeds)[0]
    np.testing.assert_allclose(got, evaluate(graph, feeds, params={"w": new})[0], rtol=1e-5, atol=1e-5)


def test_max_pool_windows_of_padding_only_are_refused_by_name() -> None:
    model, _ = node_case("MaxPool", {"x": f32(1, 1, 4, 4)}, kernel_shape=[2, 2], pads=[2, 0, 0, 0])
    with pytest.raises(ModelError, match=r"hold only padding"):
        rlx_onnx.load(model)
