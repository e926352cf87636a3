"""Col2Im, MaxUnpool, MaxPool's Indices output and AveragePool padded wider than half its
window, against onnx's reference evaluator (``onnx.reference``), on the cpu backend.

One exception: the reference's MaxPool takes a second code path when every stride and
dilation is 1, whose Indices are wrong (the window's argmax decoded with the output's
shape, no channel offset: a 4x4 plane pooled 2x2 gives index 4 for the window whose
maximum is at 5). Those forms are checked against onnxruntime, whose Indices follow the
spec; the reference's other path (strides or dilations) is checked against directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import helper
from onnx.reference import ReferenceEvaluator
from test_onnx_support import check_against_ort, init, make_model, vi

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

RNG = np.random.default_rng(42)


def model_of(nodes: Sequence[Any], feeds: Mapping[str, np.ndarray], consts: Mapping[str, np.ndarray] | None = None,
             outputs: Sequence[str] = ("y",), opset: int = 18) -> Any:
    return make_model(list(nodes), [vi(k, v.dtype.name, v.shape) for k, v in feeds.items()],
                      [helper.make_empty_tensor_value_info(o) for o in outputs],
                      [init(k, v) for k, v in (consts or {}).items()], opset=opset)


def check_against_reference(nodes: Sequence[Any], feeds: Mapping[str, np.ndarray],
                            consts: Mapping[str, np.ndarray] | None = None, outputs: Sequence[str] = ("y",),
                            opset: int = 18) -> list[np.ndarray]:
    """Import and run on cpu, run onnx's reference evaluator, compare every output."""
    model = model_of(nodes, feeds, consts, outputs, opset)
    got = rlx.compile(rlx_onnx.load(model), device="cpu").run(dict(feeds))
    want = ReferenceEvaluator(model).run(None, dict(feeds))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, f"output {i}: {g.dtype}{g.shape}, want {w.dtype}{w.shape}"
        if g.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
    return got


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------- Col2Im
COL2IM = {
    "2-D, plain": ((2, 3, 4), (6, 5), (2, 3), {}),
    "2-D, strides": ((1, 2, 5), (5, 5), (3, 3), {"strides": [2, 2]}),
    "2-D, pads": ((1, 2, 5), (4, 3), (2, 2), {"pads": [1, 0, 2, 1]}),
    "2-D, dilations": ((2, 1, 6), (5, 6), (2, 2), {"dilations": [2, 3]}),
    "2-D, strides, pads and dilations": ((1, 3, 9), (7, 6), (3, 1), {"strides": [2, 3], "pads": [1, 2, 0, 1],
                                                                     "dilations": [2, 1]}),
    "2-D, blocks that skip pixels (stride > block)": ((1, 1, 4), (5, 5), (1, 1), {"strides": [3, 3]}),
    "3-D": ((1, 2, 8), (3, 4, 4), (2, 2, 2), {"strides": [1, 2, 2], "pads": [0, 1, 0, 0, 1, 0]}),
    "1-D": ((2, 3, 6), (8,), (3,), {"dilations": [2], "pads": [1, 1]}),
}


@pytest.mark.parametrize("case", list(COL2IM))
def test_col2im_matches_the_reference(case: str) -> None:
    (n, c, _), image, block, attrs = COL2IM[case]
    k = int(np.prod(block))
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)
    rank = len(image)
    pads = attrs.get("pads", [0] * 2 * rank)
    strides, dilations = attrs.get("strides", [1] * rank), attrs.get("dilations", [1] * rank)
    blocks = [(i + pads[a] + pads[a + rank] - d * (b - 1) - 1) // s + 1
              for a, (i, b, s, d) in enumerate(zip(image, block, strides, dilations))]
    x = f32(n, c * k, int(np.prod(blocks)))
    check_against_reference([node], {"x": x}, {"image": np.array(image, np.int64),
                                               "block": np.array(block, np.int64)})


def test_col2im_with_image_shape_fed_at_run_time() -> None:
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], strides=[2, 2])
    x, image, block = f32(1, 8, 4), np.array([4, 4], np.int64), np.array([2, 2], np.int64)
    check_against_reference([node], {"x": x, "image": image, "block": block})


def test_col2im_with_the_wrong_block_count_is_refused_by_name() -> None:
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], name="fold")
    model = model_of([node], {"x": f32(1, 4, 7)}, {"image": np.array([4, 4], np.int64),
                                                  "block": np.array([2, 2], np.int64)})
    with pytest.raises(ModelError, match=r"'fold' \(Col2Im\).*L must be 9"):
        rlx_onnx.load(model)


# ---------------------------------------------------------------- MaxUnpool
def test_max_unpool_without_output_shape() -> None:
    x = f32(2, 3, 2, 3)
    plane = np.arange(2 * 3 * 4 * 6).reshape(2, 3, 4, 6)
    i = plane[:, :, 1::2, ::2].astype(np.int64)  # one element of each 2x2 window
    node = helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    check_against_reference([node], {"x": x, "i": i})


def test_max_unpool_with_output_shape_pads_the_end() -> None:
    x, i = f32(1, 2, 2, 2), np.array([[[[0, 3], [9, 14]], [[17, 19], [24, 31]]]], np.int64)
    node = helper.make_node("MaxUnpool", ["x", "i", "shape"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    check_against_reference([node], {"x": x, "i": i}, {"shape": np.array([1, 2, 5, 6], np.int64)})


def test_max_unpool_with_constant_indices_duplicates_and_negatives() -> None:
    """Indices known at import: a constant table; a duplicate index keeps the last value
    (as the reference's loop does), a negative one counts from the end."""
    i = np.array([[[1, 1, 5, -1]]], np.int64)
    node = helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[2], strides=[2])
    check_against_reference([node], {"x": f32(1, 1, 4)}, {"i": i})


def test_max_unpool_run_time_duplicates_keep_the_last_value() -> None:
    i = np.array([[[2, 2, 0]]], np.int64)
    node = helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[3], strides=[1])
    check_against_reference([node], {"x": np.array([[[1.0, 2.0, 3.0]]], np.float32), "i": i})


@pytest.mark.parametrize(("size", "attrs"), [
    (6, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    (5, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    (6, {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 0]}),
], ids=["2x2 stride 2", "3x3 stride 2 padded (overlapping windows)", "3x2 stride (1, 2)"])
def test_max_pool_then_max_unpool_round_trip(size: int, attrs: dict[str, Any]) -> None:
    """A pool whose input is the size MaxUnpool infers back (the reference counts the
    indices over that size: for another size it and onnxruntime disagree)."""
    pool = helper.make_node("MaxPool", ["x"], ["p", "i"], **attrs)
    unpool = helper.make_node("MaxUnpool", ["p", "i", "shape"], ["y"], **attrs)
    x = f32(2, 2, size, size)
    got = check_against_reference([pool, unpool], {"x": x}, {"shape": np.array(x.shape, np.int64)},
                                  outputs=("y",))
    kept = got[0] != 0
    np.testing.assert_array_equal(got[0][kept], x[kept])  # every value is back where it was


def test_max_unpool_3d() -> None:
    x = f32(1, 2, 2, 2, 2)
    i = np.random.default_rng(3).permutation(2 * 4 * 4 * 4)[:16].reshape(1, 2, 2, 2, 2).astype(np.int64)
    node = helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[2, 2, 2], strides=[2, 2, 2])
    check_against_reference([node], {"x": x, "i": i})


def test_max_unpool_too_large_for_run_time_indices_is_refused_by_name() -> None:
    node = helper.make_node("MaxUnpool", ["x", "i"], ["y"], name="unpool", kernel_shape=[2, 2], strides=[2, 2])
    model = model_of([node], {"x": f32(1, 64, 64, 64), "i": np.zeros((1, 64, 64, 64), np.int64)})
    with pytest.raises(ModelError, match=r"'unpool' \(MaxUnpool\).*pairs"):
        rlx_onnx.load(model)


# --------------------------------------------------------- MaxPool's Indices
INDICES = {
    "strides 2": ((2, 3, 7, 6), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "strides, pads": ((1, 2, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "wide pads": ((1, 2, 5, 5), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [2, 2, 2, 2]}),
    "storage_order 1": ((2, 2, 5, 7), {"kernel_shape": [2, 3], "strides": [2, 2], "storage_order": 1}),
    "storage_order 1, pads": ((1, 3, 6, 5), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1],
                                             "storage_order": 1}),
    "dilations": ((1, 2, 7, 7), {"kernel_shape": [2, 2], "dilations": [2, 3]}),
    "ceil_mode": ((1, 2, 6, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "same_upper": ((1, 1, 7, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "1-D": ((2, 3, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    "3-D": ((1, 2, 5, 4, 6), {"kernel_shape": [2, 2, 3], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 0, 0]}),
    "3-D, storage_order 1": ((1, 2, 4, 5, 3), {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1],
                                               "storage_order": 1}),
}


@pytest.mark.parametrize("case", list(INDICES))
def test_max_pool_indices_match_the_reference(case: str) -> None:
    shape, attrs = INDICES[case]
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    check_against_reference([node], {"x": f32(*shape)}, outputs=("y", "i"))


def test_max_pool_indices_ties_take_the_first_tap_in_scan_order() -> None:
    x = RNG.integers(0, 3, (2, 2, 7, 7)).astype(np.float32)  # many ties in each window
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    check_against_reference([node], {"x": x}, outputs=("y", "i"))
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3, 3], strides=[2, 2], storage_order=1)
    check_against_reference([node], {"x": x}, outputs=("y", "i"))


def test_max_pool_indices_nan_as_the_reference() -> None:
    """The reference compares ``v > best``: a NaN first in its window stays (the window's
    maximum is NaN, at its index); a NaN later is never taken."""
    x = np.arange(36, dtype=np.float32).reshape(1, 1, 6, 6)
    x[0, 0, 0, 0] = x[0, 0, 2, 3] = x[0, 0, 5, 5] = np.nan
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2])
    y, i = check_against_reference([node], {"x": x}, outputs=("y", "i"))
    assert np.isnan(y[0, 0, 0, 0]) and i[0, 0, 0, 0] == 0
    assert y[0, 0, 1, 1] == 21 and i[0, 0, 1, 1] == 21 and y[0, 0, 2, 2] == 34 and i[0, 0, 2, 2] == 34


def test_max_pool_indices_of_int8_and_uint8() -> None:
    for dtype in ("int8", "uint8"):
        x = RNG.integers(0, 100, (1, 2, 6, 6)).astype(dtype)
        node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 0, 0])
        check_against_reference([node], {"x": x}, outputs=("y", "i"), opset=12)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "storage_order": 1},
    {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]},
], ids=["2x2 stride 1", "3x3 stride 1 padded, storage_order 1", "5x5 stride 1 padded"])
def test_max_pool_indices_with_unit_strides_match_onnxruntime(attrs: dict[str, Any]) -> None:
    pytest.importorskip("onnxruntime")
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    check_against_ort(model_of([node], {"x": f32(2, 3, 6, 5)}, outputs=("y", "i"), opset=12), {"x": f32(2, 3, 6, 5)})


def test_max_pool_indices_of_a_window_of_padding_only_is_refused_by_name() -> None:
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="mp", kernel_shape=[2, 2], pads=[2, 0, 0, 0])
    with pytest.raises(ModelError, match=r"'mp' \(MaxPool\).*only padding"):
        rlx_onnx.load(model_of([node], {"x": f32(1, 1, 4, 4)}, outputs=("y", "i")))


# ------------------------------------------------------ AveragePool, wide pads
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2]},
    {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [2, 0, 1, 1]},
    {"kernel_shape": [3], "pads": [2, 0]},
], ids=["2-D", "2-D count_include_pad", "asymmetric", "1-D"])
def test_average_pool_padded_wider_than_half_its_window(attrs: dict[str, Any]) -> None:
    shape = (1, 2, 7) if len(attrs["kernel_shape"]) == 1 else (2, 2, 5, 6)
    check_against_reference([helper.make_node("AveragePool", ["x"], ["y"], **attrs)], {"x": f32(*shape)})
