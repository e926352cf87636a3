"""Trilu, ArgMax/ArgMin, TopK, CumSum, GatherElements, GatherND, Pad and Mod against onnxruntime.

Each is a decomposition into existing IR ops (``rlx_core/onnx/_ops_indexing.py``), so the
cases aim at what a decomposition gets wrong: ties and NaNs for ArgMax, negative and
out-of-range indices for GatherElements, negative operands and overflow for Mod,
infinities for CumSum, ``k`` beyond the matrix for Trilu, crops and wraps for Pad.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, vi

import rlx_core
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import InputError, ModelError
from rlx_core.onnx import _versions

RNG = np.random.default_rng(2024)
I32, I64 = np.iinfo(np.int32), np.iinfo(np.int64)


def f32(*shape: int) -> np.ndarray:
    return RNG.uniform(-2.0, 2.0, size=shape).astype(np.float32)


def ties(*shape: int, dtype: str = "float32") -> np.ndarray:
    """Small integers, so that every row has repeated maxima and minima."""
    return RNG.integers(-2, 3, size=shape).astype(dtype)


def one_node(op: str, inputs: Mapping[str, np.ndarray], consts: Mapping[str, np.ndarray] | None = None, *,
             order: tuple[str, ...] | None = None, opset: int = 17, **attrs: Any) -> tuple[Any, dict]:
    """A one-node model: ``inputs`` fed at run time, ``consts`` as initializers;
    ``order`` names the node's inputs ("" leaves an optional one out)."""
    consts = dict(consts or {})
    node = helper.make_node(op, list(order) if order is not None else [*inputs, *consts], ["y"], **attrs)
    declared = [vi(k, v.dtype.name, v.shape) for k, v in inputs.items()]
    model = make_model([node], declared, [helper.make_empty_tensor_value_info("y")],
                       [init(k, v) for k, v in consts.items()], opset=opset)
    return model, dict(inputs)


def ops_of(graph: rlx_core.Graph) -> list[str]:
    return sorted(n.op.value for n in graph.nodes if n.op.value not in ("input", "constant", "param"))


# ---------------------------------------------------------------- Trilu
@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-9, -2, -1, 0, 1, 3, 9])
def test_trilu_every_diagonal_including_beyond_the_matrix(upper: int, k: int) -> None:
    model, feeds = one_node("Trilu", {"x": f32(2, 4, 5)}, {"k": np.array(k, np.int64)}, opset=14, upper=upper)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("dtype", ["int64", "int32", "float16", "float64", "bool"])
def test_trilu_dtypes_and_default_k(dtype: str) -> None:
    x = RNG.integers(0, 2, size=(3, 6)).astype(dtype)
    model, feeds = one_node("Trilu", {"x": x}, opset=14, upper=0)
    check_against_ort(model, feeds)


def test_trilu_that_keeps_everything_adds_no_op() -> None:
    model, feeds = one_node("Trilu", {"x": f32(3, 4)}, {"k": np.array(-3, np.int64)}, opset=14)
    graph = check_against_ort(model, feeds)
    assert ops_of(graph) == ["reshape"]  # only the reshape that names the output


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_with_k_known_only_at_run_time(upper: int) -> None:
    model, _ = one_node("Trilu", {"x": f32(2, 3, 4), "k": np.array(0, np.int64)}, opset=14, upper=upper)
    for k in (-5, -1, 0, 2, 7):
        check_against_ort(model, {"x": f32(2, 3, 4), "k": np.array(k, np.int64)})


# ---------------------------------------------------------------- ArgMax, ArgMin
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extreme_ties_axes_keepdims(op: str, axis: int, keepdims: int, last: int) -> None:
    model, feeds = one_node(op, {"x": ties(3, 4, 5)}, axis=axis, keepdims=keepdims, select_last_index=last)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", ["int32", "int64", "float16", "float64"])
def test_arg_extreme_dtypes_and_integer_extremes(op: str, dtype: str) -> None:
    x = ties(4, 6, dtype=dtype)
    if dtype.startswith("int"):  # ArgMin must not overflow negating the minimum
        info = np.iinfo(dtype)
        x[0, :3], x[1, 2:4], x[2, 0] = info.min, info.max, info.min
    for last in (0, 1):
        model, feeds = one_node(op, {"x": x}, axis=1, select_last_index=last)
        check_against_ort(model, feeds)


NAN_ANSWERS = {("ArgMax", 0): [1, 0, 0, 0], ("ArgMax", 1): [3, 0, 1, 0],
               ("ArgMin", 0): [1, 0, 2, 2], ("ArgMin", 1): [3, 0, 3, 2]}


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_extreme_takes_nan_as_the_extreme_like_the_onnx_reference(op: str) -> None:
    """onnxruntime's answer with a NaN depends on where the NaN is (a NaN in the first
    position wins, a later one is skipped); rlx answers as numpy and ONNX's reference."""
    from onnx.reference import ReferenceEvaluator

    x = np.array([[1, np.nan, 3, np.nan], [np.nan, 5, 5, 1], [2, 2, -1, -1], [np.inf, 0, -np.inf, 1]], np.float32)
    for last in (0, 1):
        model, feeds = one_node(op, {"x": x}, axis=1, keepdims=0, select_last_index=last)
        got = rlx_core.compile(rlx_onnx.load(model), device="cpu").run(feeds)[0]
        want = ReferenceEvaluator(model).run(None, feeds)[0]
        np.testing.assert_array_equal(got, want)
        assert got.tolist() == NAN_ANSWERS[op, last]


def test_arg_extreme_of_a_constant_folds() -> None:
    table = helper.make_tensor("t", 1, [5, 3], ties(5, 3).reshape(-1).tolist())
    nodes = [
        helper.make_node("Constant", [], ["w"], value=table),
        helper.make_node("ArgMin", ["w"], ["i"], axis=0, keepdims=0, select_last_index=1),
        helper.make_node("Add", ["x", "i"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", "int64", [3])], [vi("y", "int64", [3])])
    graph = check_against_ort(model, {"x": np.arange(3, dtype=np.int64)})
    assert ops_of(graph) == ["add"]


def test_arg_extreme_refuses_bool_and_empty_axes() -> None:
    model, _ = one_node("ArgMax", {"x": np.zeros((2, 3), bool)})
    with pytest.raises(ModelError, match="numeric"):
        rlx_onnx.load(model)
    model, _ = one_node("ArgMax", {"x": np.zeros((2, 0), np.float32)}, axis=1)
    with pytest.raises(ModelError, match="empty"):
        rlx_onnx.load(model)


# ---------------------------------------------------------------- CumSum
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_every_direction(exclusive: int, reverse: int, axis: int) -> None:
    model, feeds = one_node("CumSum", {"x": f32(5, 7, 3)}, {"axis": np.array(axis, np.int64)},
                            exclusive=exclusive, reverse=reverse)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("dtype", ["int32", "int64", "float64", "float16"])
@pytest.mark.parametrize("n", [1, 2, 33])
def test_cumsum_dtypes_and_lengths(dtype: str, n: int) -> None:
    x = RNG.integers(-50, 50, size=(2, n)).astype(dtype)
    for exclusive, reverse in ((0, 0), (1, 1)):
        model, feeds = one_node("CumSum", {"x": x}, {"axis": np.array([1], np.int32)}, opset=14,
                                exclusive=exclusive, reverse=reverse)
        check_against_ort(model, feeds, rtol=1e-3 if dtype == "float16" else 1e-5)


def test_cumsum_integers_wrap_exactly() -> None:
    x = np.array([I64.max, 1, I64.max, 5, -3], np.int64)
    model, feeds = one_node("CumSum", {"x": x}, {"axis": np.array(0, np.int64)})
    check_against_ort(model, feeds)


def test_cumsum_keeps_infinities_and_nans_where_they_belong() -> None:
    x = np.array([[1, np.inf, 2, -np.inf, 3], [np.nan, 1, 2, 3, 4], [1, 2, 3, 4, -np.inf]], np.float32)
    for exclusive, reverse in ((0, 0), (1, 0), (0, 1), (1, 1)):
        model, feeds = one_node("CumSum", {"x": x}, {"axis": np.array(1, np.int64)},
                                exclusive=exclusive, reverse=reverse)
        with np.errstate(invalid="ignore"):  # inf - inf
            check_against_ort(model, feeds)


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_every_direction_against_numpy(exclusive: int, reverse: int) -> None:
    """CumProd (opset 26; onnxruntime 1.32 has no kernel for it): numpy's cumprod, with
    ones shifted in for ``exclusive`` and the axis flipped for ``reverse``; ints wrap."""
    for x in (RNG.uniform(0.5, 1.5, size=(3, 5)).astype(np.float32), RNG.integers(-3, 4, size=(3, 5)).astype(np.int64)):
        model, feeds = one_node("CumProd", {"x": x}, {"axis": np.array(1, np.int64)}, opset=26, exclusive=exclusive,
                                reverse=reverse)
        got = rlx_core.compile(rlx_onnx.load(model), device="cpu").run(feeds)[0]
        v = x[:, ::-1] if reverse else x
        want = np.cumprod(v, axis=1)
        if exclusive:
            want = np.concatenate([np.ones_like(want[:, :1]), want[:, :-1]], axis=1)
        want = want[:, ::-1] if reverse else want
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cumsum_with_axis_known_only_at_run_time_runs() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    model, _ = one_node("CumSum", {"x": x, "axis": np.array(0, np.int64)})
    cg = rlx_core.compile(rlx_onnx.load(model), device="cpu")  # built from the axis given at each run
    for axis in (0, 1, -1):
        np.testing.assert_array_equal(cg.run({"x": x, "axis": np.array(axis)})[0], np.cumsum(x, axis=axis))


# ---------------------------------------------------------------- TopK
@pytest.mark.parametrize(("largest", "axis", "k"), [(1, -1, 3), (0, -1, 2), (1, 0, 2), (0, 1, 4)])
def test_topk_ties_go_to_the_lower_index(largest: int, axis: int, k: int) -> None:
    check_against_ort(*topk(ties(4, 5), k, largest=largest, axis=axis))  # repeated values in every row and column


def topk(x: np.ndarray, k: int, **attrs: Any) -> tuple[Any, dict]:
    """A TopK model with both outputs (values, indices)."""
    model, feeds = one_node("TopK", {"x": x}, {"k": np.array([k], np.int64)}, order=("x", "k"), **attrs)
    model.graph.node[0].output.append("i")
    model.graph.output.append(helper.make_empty_tensor_value_info("i"))
    return model, feeds


def test_topk_integers_at_their_extremes() -> None:
    x = np.array([[I64.min, 3, I64.max, -1, I64.min]], np.int64)
    for largest in (0, 1):
        check_against_ort(*topk(x, 3, largest=largest))


def test_topk_refuses_k_out_of_range() -> None:
    model, _ = one_node("TopK", {"x": f32(2, 3)}, {"k": np.array([4], np.int64)}, order=("x", "k"))
    with pytest.raises(ModelError, match=r"K = 4 must be in 0\.\.3"):
        rlx_onnx.load(model)


# ---------------------------------------------------------------- GatherElements
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_elements_run_time_indices_with_negatives(axis: int) -> None:
    data = f32(3, 4, 5)
    n = data.shape[axis]
    shape = list(data.shape)
    shape[axis] = 6  # longer than the data on the gathered axis
    shape[(axis + 1) % 3] -= 1  # shorter on another
    index = RNG.integers(-n, n, size=shape).astype(np.int64)
    model, feeds = one_node("GatherElements", {"data": data, "index": index}, axis=axis)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("dtype", ["int64", "bool", "float16"])
def test_gather_elements_data_dtypes_and_int32_indices(dtype: str) -> None:
    data = RNG.integers(0, 2, size=(4, 3)).astype(dtype)
    index = np.array([[0, -1, 2], [-4, 3, 1]], np.int32)
    model, feeds = one_node("GatherElements", {"data": data, "index": index})
    check_against_ort(model, feeds)


def test_gather_elements_with_constant_indices_is_one_gather() -> None:
    index = np.array([[1, -1], [0, 2]], np.int64)
    model, feeds = one_node("GatherElements", {"data": f32(3, 3)}, {"index": index}, axis=1)
    graph = check_against_ort(model, feeds)
    assert ops_of(graph) == ["gather", "reshape"]


def test_gather_elements_out_of_range_index() -> None:
    model, feeds = one_node("GatherElements", {"data": f32(3, 2), "index": np.array([[3, 0]], np.int64)})
    compiled = rlx_core.compile(rlx_onnx.load(model), device="cpu")
    with pytest.raises(InputError, match="out of range"):
        compiled.run(feeds)
    model, _ = one_node("GatherElements", {"data": f32(3, 2)}, {"index": np.array([[-4, 0]], np.int64)})
    with pytest.raises(ModelError, match="index -4 is out of range"):
        rlx_onnx.load(model)


# ---------------------------------------------------------------- GatherND
GATHER_ND_CASES = {  # data shape, indices shape, batch_dims
    "points": ((2, 3, 4), (5, 3), 0),
    "rows": ((2, 3, 4), (5, 2), 0),
    "slabs": ((2, 3, 4), (2, 2, 1), 0),
    "batched": ((2, 3, 4), (2, 1), 1),
    "batched-2-deep": ((2, 3, 4, 5), (2, 3, 2), 1),
    "two-batch-dims": ((2, 3, 4), (2, 3, 1), 2),
}


@pytest.mark.parametrize("case", sorted(GATHER_ND_CASES))
@pytest.mark.parametrize("known", [False, True])
def test_gather_nd_run_time_and_constant_indices_with_negatives(case: str, known: bool) -> None:
    dshape, ishape, b = GATHER_ND_CASES[case]
    k = ishape[-1]
    cols = [RNG.integers(-dshape[b + j], dshape[b + j], size=ishape[:-1]) for j in range(k)]
    index = np.stack(cols, axis=-1).astype(np.int64)
    data = f32(*dshape)
    if known:
        model, feeds = one_node("GatherND", {"data": data}, {"index": index}, batch_dims=b)
    else:
        model, feeds = one_node("GatherND", {"data": data, "index": index}, batch_dims=b)
    graph = check_against_ort(model, feeds)
    if known:
        assert ops_of(graph) == ["gather", "reshape"]  # the flat rows fold at import


def test_gather_nd_of_a_bool_mask_and_bad_indices() -> None:
    """What the dynamo exporter emits for transformers' padding masks: a bool tensor."""
    mask = RNG.integers(0, 2, size=(2, 8)).astype(bool)
    index = np.array([[[0, 1], [1, 7], [1, -1]]], np.int64)
    model, feeds = one_node("GatherND", {"data": mask}, {"index": index})
    check_against_ort(model, feeds)
    model, feeds = one_node("GatherND", {"data": f32(2, 3), "index": np.array([[0, 3]], np.int64)})
    with pytest.raises(InputError, match="out of range"):
        rlx_core.compile(rlx_onnx.load(model), device="cpu").run(feeds)
    model, _ = one_node("GatherND", {"data": f32(2, 3)}, {"index": np.array([[2, 0]], np.int64)})
    with pytest.raises(ModelError, match="index 2 is out of range for axis 0"):
        rlx_onnx.load(model)
    model, _ = one_node("GatherND", {"data": f32(2, 3)}, {"index": np.array([[0, 0, 0]], np.int64)})
    with pytest.raises(ModelError, match=r"last dimension 3 must be in 1\.\.2"):
        rlx_onnx.load(model)


# ---------------------------------------------------------------- Pad
PAD_CASES: dict[str, tuple[np.ndarray, list[int], dict[str, Any]]] = {
    "constant": (f32(2, 3, 4), [0, 1, 2, 0, 2, 1], {}),
    "constant-crop": (f32(3, 4), [-1, 2, 1, -3], {}),
    "reflect": (f32(2, 3, 4), [0, 2, 3, 0, 1, 1], {"mode": "reflect"}),
    "reflect-crop": (f32(5, 4), [-1, 2, 2, -1], {"mode": "reflect"}),
    "edge": (f32(2, 3), [3, 0, 1, 4], {"mode": "edge"}),
    "edge-crop": (f32(4, 3), [-2, 2, 1, -1], {"mode": "edge"}),
    "int": (RNG.integers(-9, 9, size=(2, 3)).astype(np.int64), [1, 1, 1, 1], {"mode": "reflect"}),
}


@pytest.mark.parametrize("case", sorted(PAD_CASES))
def test_pad_modes_and_negative_pads(case: str) -> None:
    x, pads, attrs = PAD_CASES[case]
    model, feeds = one_node("Pad", {"x": x}, {"pads": np.array(pads, np.int64)}, opset=13, **attrs)
    check_against_ort(model, feeds)


def test_pad_wrap_beyond_the_axis_opset_19() -> None:
    model, feeds = one_node("Pad", {"x": f32(2, 3)}, {"pads": np.array([1, 7, 2, -1], np.int64)}, opset=19,
                            mode="wrap")
    check_against_ort(model, feeds)


def test_pad_constant_value_known_or_at_run_time_and_axes() -> None:
    x = f32(2, 3, 4)
    pads, axes = np.array([1, 2, 0, 3], np.int64), np.array([-1, 0], np.int64)
    known = one_node("Pad", {"x": x}, {"pads": pads, "value": np.array(-7.5, np.float32), "axes": axes}, opset=18)
    check_against_ort(*known)
    late = one_node("Pad", {"x": x, "value": np.array(np.inf, np.float32)}, {"pads": pads, "axes": axes},
                    order=("x", "pads", "value", "axes"), opset=18)
    check_against_ort(*late)
    flags = one_node("Pad", {"x": np.array([[True, False]])}, {"pads": np.array([1, 0, 0, 2], np.int64)}, opset=13)
    check_against_ort(*flags)


def test_pad_of_an_empty_axis_and_several_axes_in_one_model() -> None:
    empty = one_node("Pad", {"x": np.zeros((2, 0), np.float32)}, {"pads": np.array([1, 2, 0, 3], np.int64),
                     "value": np.array(4.0, np.float32)}, opset=13)
    check_against_ort(*empty)
    edges = one_node("Pad", {"x": f32(2, 3, 4)}, {"pads": np.array([1, 0, 2, 2, 1, 0], np.int64)}, mode="edge")
    graph = check_against_ort(*edges)
    assert ops_of(graph) == ["gather", "gather", "gather"]  # the last one carries the output's name


def test_pad_refusals() -> None:
    run_time_pads = one_node("Pad", {"x": f32(3), "pads": np.array([1, 1], np.int64)})[0]
    cg = rlx_core.compile(rlx_onnx.load(run_time_pads), device="cpu")  # pads read at each run
    with pytest.raises(InputError, match=r"cannot be built for pads=\[-4, 0\]"):
        cg.run({"x": f32(3), "pads": np.array([-4, 0])})
    too_far = one_node("Pad", {"x": f32(3)}, {"pads": np.array([3, 0], np.int64)}, mode="reflect")[0]
    with pytest.raises(ModelError, match="reflect pads"):
        rlx_onnx.load(too_far)
    wrap_too_early = one_node("Pad", {"x": f32(3)}, {"pads": np.array([1, 0], np.int64)}, opset=18, mode="wrap")[0]
    with pytest.raises(ModelError, match="mode 'wrap'"):
        rlx_onnx.load(wrap_too_early)


# ---------------------------------------------------------------- Mod
def _signed(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Every sign combination, zero dividends, and the one quotient that overflows."""
    info = np.iinfo(dtype)
    a = np.array([7, -7, 7, -7, 6, -6, 0, 0, 1, -1, info.max, info.min, info.min, info.min, 5], dtype)
    b = np.array([3, 3, -3, -3, 3, -3, 5, -5, info.min, info.max, -1, -1, info.max, 7, info.min], dtype)
    return a, b


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_integers_all_signs_at_run_time(dtype: str, fmod: int) -> None:
    a, b = _signed(dtype)
    with np.errstate(over="ignore"):
        check_against_ort(*one_node("Mod", {"a": a, "b": b}, fmod=fmod))


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_integers_broadcast_against_a_constant(fmod: int) -> None:
    a = RNG.integers(-100, 100, size=(4, 5)).astype(np.int64)
    check_against_ort(*one_node("Mod", {"a": a}, {"b": np.array([3, -4, 7, -1, 64], np.int64)}, fmod=fmod))


def test_mod_float16_at_run_time_is_exact_with_special_cases() -> None:
    fin = np.finfo(np.float16)
    a = np.array([5.5, -5.5, 5.5, -5.5, 4, -4, 0, -0.0, np.inf, 1, 1, 3, -3, np.nan, 1, fin.max, fin.smallest_subnormal,
                  fin.max, -fin.max], np.float16)
    b = np.array([2, 2, -2, -2, 2, 2, 3, 3, 2, 0, np.inf, -np.inf, np.inf, 1, np.nan, fin.smallest_subnormal, fin.max,
                  3.3, 0.1], np.float16)
    graph = rlx_onnx.load(one_node("Mod", {"a": a, "b": b}, fmod=1)[0])
    with np.errstate(invalid="ignore", divide="ignore"):
        got = rlx_core.compile(graph, device="cpu").run({"a": a, "b": b})[0]
        want = np.fmod(a.astype(np.float64), b.astype(np.float64)).astype(np.float16)  # exact: the C fmod
        check_against_ort(*one_node("Mod", {"a": a, "b": b}, fmod=1))
    np.testing.assert_array_equal(got, want)
    numbers = ~np.isnan(want)
    assert np.array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))


def test_mod_of_known_floats_folds_and_run_time_floats_use_the_fmod_op() -> None:
    a, b = np.array([-4.3, 7.2, 5.0], np.float32), np.array([2.1, -3.4, 8.0], np.float32)
    nodes = [helper.make_node("Mod", ["a", "b"], ["m"], fmod=1), helper.make_node("Add", ["x", "m"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", [3])], [vi("y", "float32", [3])], [init("a", a), init("b", b)])
    assert ops_of(check_against_ort(model, {"x": f32(3)})) == ["add"]
    for dtype in ("float32", "float64"):
        x, y = a.astype(dtype), b.astype(dtype)
        assert ops_of(check_against_ort(*one_node("Mod", {"a": x, "b": y}, fmod=1))) == ["fmod"]
    model, _ = one_node("Mod", {"a": a}, {"b": b}, fmod=0)
    with pytest.raises(ModelError, match="fmod=0 needs integer operands before Mod-28"):
        rlx_onnx.load(model)


def test_mod_by_a_known_zero_is_refused_at_import() -> None:
    model, _ = one_node("Mod", {}, {"a": np.array([3], np.int64), "b": np.array([0], np.int64)})
    with pytest.raises(ModelError, match="Mod by zero"):
        rlx_onnx.load(model)


def test_mod_on_shape_arithmetic_loads_and_folds() -> None:
    """torch's classic exporter writes ``dim % k`` with Shape/Gather/Mod; it must fold to
    a static reshape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["d"], axis=0),  # 12
        helper.make_node("Mod", ["d", "five"], ["r"]),  # 12 % 5 = 2
        helper.make_node("Sub", ["d", "r"], ["whole"]),  # 10
        helper.make_node("Div", ["d", "r"], ["half"]),  # 6
        helper.make_node("Unsqueeze", ["half", "zero"], ["h"]),
        helper.make_node("Concat", ["h", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    values = {"one": 1, "five": 5, "zero": [0], "minus_one": [-1]}
    consts = [init(name, np.array(v, np.int64)) for name, v in values.items()]
    model = make_model(nodes, [vi("x", "float32", [2, 12])], [vi("y", "float32", None)], consts, opset=13)
    graph = check_against_ort(model, {"x": f32(2, 12)})
    assert ops_of(graph) == ["reshape"]
    assert graph.node(graph.outputs[0]).shape == (6, 4)


def _float_mod_operands(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Every sign pairing, signed zeros, infinities, NaN, a zero divisor, extremes of the dtype."""
    fin = np.finfo(dtype)
    a = np.array([5.5, -5.5, 5.5, -5.5, 4, -4, 0, -0.0, np.inf, 1, 3, -3, 0, -0.0, np.nan, -1e-3, fin.max,
                  fin.smallest_subnormal, -fin.max, 7.25, -7.25], dtype)
    b = np.array([2, 2, -2, -2, 2, 2, -3, 3, 2, 0, -np.inf, np.inf, -np.inf, np.inf, 1, 1, fin.smallest_subnormal,
                  -fin.max, 0.1, -0.5, 0.5], dtype)
    return a, b


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mod_fmod_1_of_float32_and_float64_at_run_time_is_c_fmod(dtype: str) -> None:
    a, b = _float_mod_operands(dtype)
    graph = rlx_onnx.load(one_node("Mod", {"a": a, "b": b}, fmod=1)[0])
    with np.errstate(invalid="ignore", divide="ignore"):
        got = rlx_core.compile(graph, device="cpu").run({"a": a, "b": b})[0]
        want = np.fmod(a, b)
        check_against_ort(*one_node("Mod", {"a": a, "b": b}, fmod=1))
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_mod_28_float_floor_mod(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """Mod-28 defines fmod=0 for floats (Python's rule); the converter reads it once the
    version table admits Mod-28 (here patched in; ``_versions.REVIEWED``)."""
    monkeypatch.setitem(_versions.REVIEWED, ("Mod", 28), "fmod=0 for floats: Python's rule, as the converter reads")
    _versions.readable_versions.cache_clear()
    try:
        a, b = _float_mod_operands(dtype)
        model, feeds = one_node("Mod", {"a": a, "b": b}, opset=28)
        model.ir_version = 11
        with np.errstate(invalid="ignore", divide="ignore"):
            got = rlx_core.compile(rlx_onnx.load(model), device="cpu").run(feeds)[0]
            want = np.mod(a.astype(np.float64), b.astype(np.float64)).astype(dtype)  # Python's %, exact
            if dtype == "float16":  # onnxruntime has no float32/float64 Mod-28 kernel with these rules
                check_against_ort(model, feeds)
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]))
    finally:
        monkeypatch.undo()
        _versions.readable_versions.cache_clear()
