"""Window functions, LRN, Upsample, CenterCropPad and the trigonometric and hyperbolic
functions beyond sin and cos, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper
from test_onnx_support import check_against_ort, init, make_model, vi

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [1, 2, 10])
def test_windows(op: str, periodic: int, size: int) -> None:
    node = helper.make_node(op, ["n"], ["w"], periodic=periodic, output_datatype=TensorProto.DOUBLE)
    model = make_model([node], [], [vi("w", "float64", None)], [init("n", np.array(size, np.int64))])
    check_against_ort(model, {}, atol=1e-7)  # onnxruntime computes in float32 (Blackman: 1.5e-8 off float64)


def test_a_window_size_fed_at_run_time_builds_the_graph_from_it() -> None:
    model = make_model([helper.make_node("HannWindow", ["n"], ["w"])], [vi("n", "int32", [])],
                       [vi("w", "float32", None)])
    for n in (4, 7):
        check_against_ort(model, {"n": np.array(n, np.int32)})


@pytest.mark.parametrize(("size", "channels"), [(5, 8), (3, 3), (1, 4), (7, 5), (2, 3), (6, 5)])
def test_lrn(size: int, channels: int) -> None:
    x = RNG.standard_normal((2, channels, 3, 4)).astype(np.float32)
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=0.02, beta=0.6, bias=1.5)
    model = make_model([node], [vi("x", "float32", list(x.shape))], [vi("y", "float32", None)])
    if size % 2:
        check_against_ort(model, {"x": x})
        return
    # onnxruntime takes odd sizes only; the spec's window: floor((size-1)/2) before, ceil after
    lo, hi = (size - 1) // 2, size // 2
    padded = np.pad(x.astype(np.float64) ** 2, ((0, 0), (lo, hi), (0, 0), (0, 0)))
    sums = sum(padded[:, k:k + channels] for k in range(size))
    want = x / (1.5 + 0.02 / size * sums) ** 0.6
    got = rlx.compile(rlx_onnx.load(model), device="cpu").run({"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_upsample_nearest_opset_9() -> None:
    x = RNG.standard_normal((1, 2, 2, 3)).astype(np.float32)
    node = helper.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")
    for scales in ([1.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.5, 2.5]):
        model = make_model([node], [vi("x", "float32", [1, 2, 2, 3])], [vi("y", "float32", None)],
                           [init("s", np.array(scales, np.float32))], opset=9)
        check_against_ort(model, {"x": x})
    linear = make_model([helper.make_node("Upsample", ["x", "s"], ["y"], mode="linear")],
                        [vi("x", "float32", [1, 2, 2, 3])], [vi("y", "float32", None)],
                        [init("s", np.array([1, 1, 2, 2], np.float32))], opset=9)
    with pytest.raises(ModelError, match="mode 'linear' is not supported"):
        rlx_onnx.load(linear)


@pytest.mark.parametrize(("target", "axes"), [([4, 5], None), ([1, 2], None), ([3, 9], None), ([6], [1]),
                                               ([2], [-1])])
def test_center_crop_pad(target: list[int], axes: list[int] | None) -> None:
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    attrs = {} if axes is None else {"axes": axes}
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], **attrs)
    model = make_model([node], [vi("x", "float32", [3, 6])], [vi("y", "float32", None)],
                       [init("s", np.array(target, np.int64))], opset=18)
    want = _center_crop_pad(x, target, axes)
    got = rlx.compile(rlx_onnx.load(model), device="cpu").run({"x": x})[0]
    np.testing.assert_array_equal(got, want)


def _center_crop_pad(x: np.ndarray, target: list[int], axes: list[int] | None) -> np.ndarray:
    """The spec's centred crop or zero pad (the odd element at the end), for reference."""
    out = x
    for axis, size in zip(axes if axes is not None else range(x.ndim), target):
        axis %= x.ndim
        d = abs(size - out.shape[axis])
        lo, hi = d // 2, d - d // 2
        if size < out.shape[axis]:
            out = np.take(out, np.arange(lo, out.shape[axis] - hi), axis=axis)
        elif size > out.shape[axis]:
            widths = [(0, 0)] * out.ndim
            widths[axis] = (lo, hi)
            out = np.pad(out, widths)
    return out


@pytest.mark.parametrize(("op", "lo", "hi"), [("Tan", -1.4, 1.4), ("Asin", -0.99, 0.99), ("Acos", -0.99, 0.99),
                                               ("Atan", -9, 9), ("Sinh", -5, 5), ("Cosh", -5, 5),
                                               ("Asinh", -9, 9), ("Acosh", 1.0, 9), ("Atanh", -0.99, 0.99)])
def test_trigonometric_and_hyperbolic(op: str, lo: float, hi: float) -> None:
    x = RNG.uniform(lo, hi, (3, 7)).astype(np.float32)
    model = make_model([helper.make_node(op, ["x"], ["y"])], [vi("x", "float32", [3, 7])], [vi("y", "float32", None)])
    check_against_ort(model, {"x": x}, rtol=2e-6, atol=1e-6)
