"""ONNX ops read as compositions of existing IR ops: LpPool (a depthwise conv2d of |x|^p),
SpaceToDepth / DepthToSpace (reshape, transpose, reshape), Tile and Compress (gather),
EyeLike (a constant), and ReduceMax / ReduceMin on bool inputs and over empty sets. Against onnxruntime where it
has the form, else against a numpy reading of the spec."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper
from test_onnx_support import check_against_ort, init, make_model, vi

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

RNG = np.random.default_rng(31)


def _model(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None, opset: int = 18,
           **attrs: Any) -> Any:
    consts = consts or {}
    node = helper.make_node(op, [*feeds, *consts], ["y"], **attrs)
    return make_model([node], [vi(k, v.dtype.name, v.shape) for k, v in feeds.items()],
                      [helper.make_empty_tensor_value_info("y")], [init(k, v) for k, v in consts.items()],
                      opset=opset)


def _ops(graph: rlx.Graph) -> set[str]:
    return {n.op.value for n in graph.nodes} - {"input", "constant", "param"}


# ----------------------------------------------------------------------------- LpPool
LP_FORMS = [
    ({"kernel_shape": [3, 3]}, (1, 3, 7, 8)),
    ({"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 1, 2]}, (2, 2, 6, 5)),
    ({"kernel_shape": [3, 3], "pads": [2, 2, 2, 2]}, (1, 2, 5, 5)),  # more than half the window: conv allows it
    ({"kernel_shape": [2, 2], "dilations": [2, 2]}, (1, 1, 6, 6)),
    ({"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 2, 7, 6)),
    ({"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"}, (1, 2, 5, 6)),
    ({"kernel_shape": [4]}, (2, 3, 9)),  # 1-D
    ({"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, (1, 2, 10)),
]


@pytest.mark.parametrize(("p", "form"), list(itertools.product([1, 2, 3], range(len(LP_FORMS)))))
def test_lppool_against_onnxruntime(p: int, form: int) -> None:
    attrs, shape = LP_FORMS[form]
    x = RNG.uniform(-2, 2, shape).astype(np.float32)
    graph = check_against_ort(_model("LpPool", {"x": x}, p=p, **attrs), {"x": x}, rtol=1e-5, atol=1e-5)
    assert "conv2d" in _ops(graph)
    assert ("pow" in _ops(graph)) is (p == 3)  # p = 1 and 2 need no pow


def _lp_reference(x: np.ndarray, k: int, s: int, p: int, ceil: bool) -> np.ndarray:
    """LpPool over the last axis, zero padding on the right for ceil_mode's last window."""
    n = len(x[-1]) if x.ndim == 1 else x.shape[-1]
    span = n - k
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= n:
        out -= 1
    padded = np.concatenate([x, np.zeros((*x.shape[:-1], k + out * s), x.dtype)], axis=-1)
    return np.stack([(np.abs(padded[..., i * s : i * s + k]) ** p).sum(-1) ** (1 / p) for i in range(out)], -1)


@pytest.mark.parametrize("ceil", [0, 1])
@pytest.mark.parametrize("length", [7, 8, 9])
def test_lppool_18_ceil_mode_pads_the_last_window_with_zeros(ceil: int, length: int) -> None:
    x = RNG.uniform(-2, 2, (1, 2, length)).astype(np.float64)
    graph = rlx_onnx.load(_model("LpPool", {"x": x}, p=2, kernel_shape=[3], strides=[2], ceil_mode=ceil))
    got = rlx.compile(graph, device="cpu").run({"x": x})[0]
    np.testing.assert_allclose(got, _lp_reference(x, 3, 2, 2, bool(ceil)), rtol=1e-12)


def test_lppool_refusals_name_the_problem() -> None:
    x = np.zeros((1, 1, 2, 2, 2, 2), np.float32)
    with pytest.raises(ModelError, match=r"only 1-D, 2-D and 3-D LpPool are supported"):
        rlx_onnx.load(_model("LpPool", {"x": x}, kernel_shape=[1, 1, 1, 1]))
    with pytest.raises(ModelError, match=r"ceil_mode is not supported for a 3-D LpPool"):
        rlx_onnx.load(_model("LpPool", {"x": np.zeros((1, 1, 3, 3, 3), np.float32)}, kernel_shape=[2, 2, 2],
                             ceil_mode=1))
    with pytest.raises(ModelError, match=r"needs a float input, got int64"):
        rlx_onnx.load(_model("LpPool", {"x": np.zeros((1, 1, 4), np.int64)}, kernel_shape=[2]))
    with pytest.raises(ModelError, match=r"p must be >= 1, got 0"):
        rlx_onnx.load(_model("LpPool", {"x": np.zeros((1, 1, 4), np.float32)}, kernel_shape=[2], p=0))


# ----------------------------------------------------------------------------- SpaceToDepth / DepthToSpace
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
@pytest.mark.parametrize("b", [1, 2, 3])
def test_space_to_depth_against_onnxruntime(dtype: str, b: int) -> None:
    x = (RNG.uniform(-5, 5, (2, 3, 2 * 3, 3 * b)) > 0) if dtype == "bool" else RNG.uniform(-5, 5, (2, 3, 6, 3 * b))
    x = np.asarray(x).astype(dtype)
    if dtype != "float32":  # onnxruntime's SpaceToDepth has float kernels only: the spec's index formula
        graph = rlx_onnx.load(_model("SpaceToDepth", {"x": x}, blocksize=b))
        got = rlx.compile(graph, device="cpu").run({"x": x})[0]
        n, c, h, w = x.shape
        want = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4).reshape(n, c * b * b, h // b, w // b)
        np.testing.assert_array_equal(got, want)
        return
    graph = check_against_ort(_model("SpaceToDepth", {"x": x}, opset=13, blocksize=b), {"x": x}, rtol=0, atol=0)
    assert _ops(graph) <= {"reshape", "transpose"}


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_inverts_space_to_depth(mode: str) -> None:
    x = RNG.uniform(-5, 5, (2, 12, 3, 4)).astype(np.float32)
    check_against_ort(_model("DepthToSpace", {"x": x}, opset=13, blocksize=2, mode=mode), {"x": x}, rtol=0, atol=0)
    nodes = [helper.make_node("DepthToSpace", ["x"], ["d"], blocksize=2, mode=mode),
             helper.make_node("SpaceToDepth", ["d"], ["y"], blocksize=2, mode=mode)]
    model = make_model(nodes, [vi("x", "float32", x.shape)], [vi("y", "float32", x.shape)], opset=28)
    model.ir_version = 11
    got = rlx.compile(rlx_onnx.load(model), device="cpu").run({"x": x})[0]
    np.testing.assert_array_equal(got, x)


def test_space_to_depth_refusals() -> None:
    with pytest.raises(ModelError, match=r"must be multiples of blocksize 2"):
        rlx_onnx.load(_model("SpaceToDepth", {"x": np.zeros((1, 1, 3, 4), np.float32)}, blocksize=2))
    with pytest.raises(ModelError, match=r"must be a multiple of blocksize² = 4"):
        rlx_onnx.load(_model("DepthToSpace", {"x": np.zeros((1, 6, 3, 4), np.float32)}, blocksize=2))
    with pytest.raises(ModelError, match=r"mode must be 'DCR' or 'CRD', got 'XYZ'"):
        rlx_onnx.load(_model("DepthToSpace", {"x": np.zeros((1, 4, 3, 4), np.float32)}, blocksize=2, mode="XYZ"))
    with pytest.raises(ModelError, match=r"needs an input \(N, C, H, W\)"):
        rlx_onnx.load(_model("SpaceToDepth", {"x": np.zeros((4, 4), np.float32)}, blocksize=2))


# ----------------------------------------------------------------------------- EyeLike
@pytest.mark.parametrize(("shape", "k"), [((3, 3), 0), ((3, 5), 1), ((5, 3), -2), ((2, 4), 7)])
@pytest.mark.parametrize("dtype", [None, TensorProto.INT32, TensorProto.DOUBLE])
def test_eye_like_against_onnxruntime(shape: tuple[int, int], k: int, dtype: int | None) -> None:
    x = RNG.uniform(-1, 1, shape).astype(np.float32)
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    graph = check_against_ort(_model("EyeLike", {"x": x}, **attrs), {"x": x}, rtol=0, atol=0)
    assert not _ops(graph)  # a constant


def test_eye_like_refuses_other_ranks() -> None:
    with pytest.raises(ModelError, match=r"needs a 2-D input, got shape \(2, 2, 2\)"):
        rlx_onnx.load(_model("EyeLike", {"x": np.zeros((2, 2, 2), np.float32)}))


# ----------------------------------------------------------------------------- ReduceMax / ReduceMin
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 1), ([0], 0), (None, 0), ([0, 1], 1)])
def test_reduce_extremes_of_bool_are_any_and_all(op: str, axes: list[int] | None, keepdims: int) -> None:
    x = np.array([[True, False, True], [True, True, True], [False, False, False], [False, True, False]])
    consts = {} if axes is None else {"axes": np.array(axes, np.int64)}
    graph = rlx_onnx.load(_model(op, {"x": x}, consts, keepdims=keepdims))
    got = rlx.compile(graph, device="cpu").run({"x": x})[0]
    fn = np.any if op == "ReduceMax" else np.all
    want = fn(x, axis=None if axes is None else tuple(axes), keepdims=bool(keepdims))
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "bool"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_extremes_over_an_empty_set_give_the_identity(op: str, dtype: str, keepdims: int) -> None:
    x = np.zeros((2, 0, 4), dtype)
    graph = rlx_onnx.load(_model(op, {"x": x}, {"axes": np.array([1], np.int64)}, keepdims=keepdims))
    got = rlx.compile(graph, device="cpu").run({"x": x})[0]
    largest = op == "ReduceMax"
    if dtype == "bool":
        fill: Any = not largest
    elif dtype.startswith("int"):
        fill = np.iinfo(dtype).min if largest else np.iinfo(dtype).max
    else:
        fill = -np.inf if largest else np.inf
    want = np.full((2, 1, 4) if keepdims else (2, 4), fill, dtype)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    if dtype == "float32":
        check_against_ort(_model(op, {"x": x}, {"axes": np.array([1], np.int64)}, keepdims=keepdims), {"x": x})


# ----------------------------------------------------------------------------- Tile / Compress
TILES = [((2, 3), (2, 1)), ((2, 3, 4), (1, 3, 2)), ((3,), (0,)), ((2, 2), (1, 1))]


@pytest.mark.parametrize(("shape", "repeats"), TILES)
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_tile_against_numpy_and_onnxruntime(shape: tuple[int, ...], repeats: tuple[int, ...], dtype: str) -> None:
    x = (RNG.uniform(-5, 5, shape) > 0 if dtype == "bool" else RNG.uniform(-5, 5, shape)).astype(dtype)
    model = _model("Tile", {"x": x}, {"r": np.array(repeats, np.int64)})
    graph = check_against_ort(model, {"x": x}, rtol=0, atol=0)
    assert _ops(graph) <= {"gather", "reshape"}  # a graph output that is its input is a reshape of it
    np.testing.assert_array_equal(rlx.compile(graph, device="cpu").run({"x": x})[0], np.tile(x, repeats))


@pytest.mark.parametrize(("cond", "axis"), [([0, 1, 1], 0), ([0, 1], 1), ([1, 0, 0, 1, 1], None), ([0, 1], -1),
                                            ([0, 0, 0], 0), ([1], None)])
def test_compress_with_a_known_condition_against_onnxruntime(cond: list[int], axis: int | None) -> None:
    x = RNG.uniform(-5, 5, (3, 2)).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    model = _model("Compress", {"x": x}, {"c": np.array(cond, bool)}, **attrs)
    graph = check_against_ort(model, {"x": x}, rtol=0, atol=0)
    assert _ops(graph) <= {"gather", "reshape"}


def test_tile_and_compress_refusals() -> None:
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(ModelError, match=r"repeats must hold one count >= 0 per axis"):
        rlx_onnx.load(_model("Tile", {"x": x}, {"r": np.array([2], np.int64)}))
    with pytest.raises(ModelError, match=r"condition has 4 entries, more than the 3 along axis 0"):
        rlx_onnx.load(_model("Compress", {"x": x}, {"c": np.ones(4, bool)}, axis=0))
    node = helper.make_node("Compress", ["x", "c"], ["y"], axis=0)
    model = make_model([node], [vi("x", "float32", [3, 2]), vi("c", "bool", [3])],
                       [helper.make_empty_tensor_value_info("y")])
    graph = rlx_onnx.load(model)  # a run-time condition: the graph is built from its value at each run
    cg = rlx.compile(graph, device="cpu")
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    for c in ([True, False, True], [False, True, False]):
        np.testing.assert_array_equal(cg.run({"x": x, "c": np.array(c)})[0], np.compress(c, x, axis=0))


# ----------------------------------------------------------------------------- ReverseSequence
@pytest.mark.parametrize(("batch_axis", "time_axis"), [(1, 0), (0, 1)])
@pytest.mark.parametrize("fed", [False, True], ids=["lengths known", "lengths fed at run time"])
def test_reverse_sequence_against_onnxruntime(batch_axis: int, time_axis: int, fed: bool) -> None:
    shape = [0, 0, 3]
    shape[batch_axis], shape[time_axis] = 4, 5
    x = RNG.uniform(-5, 5, shape).astype(np.float32)
    lens = np.array([5, 1, 3, 0], np.int64)
    model = _model("ReverseSequence", {"x": x, "lens": lens} if fed else {"x": x},
                   None if fed else {"lens": lens}, batch_axis=batch_axis, time_axis=time_axis)
    check_against_ort(model, {"x": x, "lens": lens} if fed else {"x": x}, rtol=0, atol=0)


def test_reverse_sequence_refusals_name_the_problem() -> None:
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(ModelError, match=r"sequence_lens \[1, 4\] must give 2 lengths of 0 to 3"):
        rlx_onnx.load(_model("ReverseSequence", {"x": x}, {"lens": np.array([1, 4], np.int64)}))
    with pytest.raises(ModelError, match=r"batch_axis 1 and time_axis 1 must be 0 and 1"):
        rlx_onnx.load(_model("ReverseSequence", {"x": x}, {"lens": np.array([1, 1], np.int64)}, time_axis=1))
