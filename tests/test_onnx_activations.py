"""The decomposed converters (``rlx_core.onnx._ops_activations``) against onnxruntime.

Activations, the composite reductions, LpNormalization, MeanVarianceNormalization and
Hardmax have no IR op of their own; these tests feed each one edge values (signed
zeros, large magnitudes, the infinities, NaN) and check the decomposition against
onnxruntime, or against ONNX's definition in numpy where onnxruntime has no kernel for a
dtype or answers differently from the spec (said so at each such test).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, vi

import rlx_core
from rlx_core import onnx as rlx_onnx

RNG = np.random.default_rng(2024)
#: Edge values every activation is fed: signed zeros, tiny, ordinary, large, +-inf, NaN.
EDGE = np.array([0.0, -0.0, 1e-6, -1e-6, 0.5, -0.5, 1.5, -1.5, 3.0, -3.0, 20.0, -20.0, 30.0, -30.0, 100.0, -100.0,
                 1e4, -1e4, np.inf, -np.inf, np.nan], np.float32)


def model_of(op: str, inputs: Mapping[str, np.ndarray], consts: Mapping[str, np.ndarray] | None = None,
             opset: int = 17, **attrs: Any) -> Any:
    """A one-node model: ``inputs`` fed at run time, then ``consts`` as initializers."""
    consts = dict(consts or {})
    node = helper.make_node(op, [*inputs, *consts], ["y"], **attrs)
    declared = [vi(k, v.dtype.name, v.shape) for k, v in inputs.items()]
    return make_model([node], declared, [helper.make_empty_tensor_value_info("y")],
                      [init(k, v) for k, v in consts.items()], opset=opset)


def run_rlx(model: Any, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    return rlx_core.compile(rlx_onnx.load(model), device="cpu").run(dict(feeds))[0]


def against_ort(op: str, x: np.ndarray, *, consts: Mapping[str, np.ndarray] | None = None, opset: int = 17,
                rtol: float = 1e-5, atol: float = 1e-6, **attrs: Any) -> None:
    with np.errstate(all="ignore"):
        check_against_ort(model_of(op, {"x": x}, consts, opset, **attrs), {"x": x}, rtol=rtol, atol=atol)


def mixed(*shape: int, scale: float = 3.0, dtype: str = "float32") -> np.ndarray:
    """Random values of ``shape`` with a few edge values spread in."""
    x = RNG.uniform(-scale, scale, size=shape)
    flat = x.reshape(-1)
    picks = RNG.choice(flat.size, size=min(flat.size, 6), replace=False)
    flat[picks] = np.array([0.0, -0.0, 40.0, -40.0, 1e-5, -1e-5])[: len(picks)]
    return x.astype(dtype)


# ---------------------------------------------------------------- activations
ACTIVATIONS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "Elu": ("Elu", 17, {}),
    "Elu-alpha": ("Elu", 17, {"alpha": 0.3}),
    "Selu": ("Selu", 17, {}),
    "Selu-attrs": ("Selu", 17, {"alpha": 2.0, "gamma": 0.5}),
    "Celu": ("Celu", 13, {}),
    "Celu-alpha": ("Celu", 13, {"alpha": 2.5}),
    "Celu-negative-alpha": ("Celu", 13, {"alpha": -1.0}),
    "Softplus": ("Softplus", 17, {}),
    "Softsign": ("Softsign", 17, {}),
    "Mish": ("Mish", 18, {}),
    "Swish": ("Swish", 24, {}),
    "Swish-alpha": ("Swish", 24, {"alpha": 2.0}),
    "ThresholdedRelu": ("ThresholdedRelu", 17, {}),
    "ThresholdedRelu-alpha": ("ThresholdedRelu", 17, {"alpha": 0.1}),
    "Shrink": ("Shrink", 17, {}),
    "Shrink-attrs": ("Shrink", 17, {"lambd": 1.5, "bias": 0.25}),
    "Sign": ("Sign", 17, {}),
}


@pytest.mark.parametrize("case", sorted(ACTIVATIONS))
def test_activation_matches_onnxruntime_on_edge_values(case: str) -> None:
    op, opset, attrs = ACTIVATIONS[case]
    against_ort(op, EDGE, opset=opset, **attrs)
    against_ort(op, mixed(3, 4, 5), opset=opset, **attrs)


#: ONNX's definitions in float64, for the dtypes onnxruntime has no kernel for.
def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


DEFINITIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Elu": lambda x: np.where(x < 0, np.expm1(x), x),
    "Selu": lambda x: 1.05070102214813232421875 * np.where(x > 0, x, 1.67326319217681884765625 * np.expm1(x)),
    "Softplus": _softplus,
    "Softsign": lambda x: x / (1 + np.abs(x)),
    "ThresholdedRelu": lambda x: np.where(x > 1.0, x, 0.0),
    "Hardmax": lambda x: (np.arange(x.shape[-1]) == np.argmax(x, axis=-1)[..., None]).astype(x.dtype),
    "MeanVarianceNormalization": lambda x: (
        (x - x.mean(axis=(0, 2, 3), keepdims=True)) / (x.std(axis=(0, 2, 3), keepdims=True) + 1e-9)
    ),
}


@pytest.mark.parametrize("op", sorted(DEFINITIONS))
def test_float64_matches_the_definition(op: str) -> None:
    """onnxruntime's cpu provider has no float64 kernel for these; ONNX admits double."""
    x = RNG.uniform(-5, 5, size=(2, 3, 4, 5))
    x.reshape(-1)[:4] = [0.0, -30.0, 30.0, 700.0]
    opset = 13 if op == "Hardmax" else 17
    got = run_rlx(model_of(op, {"x": x}, opset=opset), {"x": x})
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, DEFINITIONS[op](x), rtol=1e-10, atol=1e-300)


@pytest.mark.parametrize("op", ["Elu", "Selu", "Softplus", "Softsign", "ThresholdedRelu", "Sign", "Shrink"])
def test_float16_matches_onnxruntime(op: str) -> None:
    x = np.array([0.0, -0.0, 0.1, -0.1, 1.0, -1.0, 1.5, -1.5, 7.0, -7.0, 20.0, -20.0, 1000.0, -1000.0,
                  np.inf, -np.inf], np.float16)
    against_ort(op, x, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
@pytest.mark.parametrize("op", ["Mish", "Swish", "Celu"])
def test_other_float_dtypes_match_onnxruntime(op: str, dtype: str) -> None:
    opset = {"Mish": 18, "Swish": 24, "Celu": 28}[op]  # Celu admits float16 and double from opset 28 on
    x = EDGE[np.isfinite(EDGE)].astype(dtype)
    tol = 1e-3 if dtype == "float16" else 1e-12
    against_ort(op, x, opset=opset, rtol=tol, atol=tol)


def test_softplus_keeps_relative_precision_far_below_zero() -> None:
    """``log(1 + exp(x))`` computed naively is 0 below about -17 in float32; the
    decomposition keeps ``exp(x)``'s digits, and never overflows above."""
    x = np.array([-100.0, -80.0, -40.0, -17.0, -1e-3, 0.0, 1e-3, 17.0, 40.0, 88.0, 89.0, 1e30], np.float32)
    got = run_rlx(model_of("Softplus", {"x": x}), {"x": x})
    np.testing.assert_allclose(got, _softplus(x.astype(np.float64)), rtol=2e-6, atol=1e-44)  # -100: subnormal


def test_sign_of_ints_and_nan() -> None:
    """ints are exact; NaN stays NaN (numpy, ONNX's reference, onnxruntime in float32)."""
    for dtype in ("int32", "int64"):
        info = np.iinfo(dtype)
        against_ort("Sign", np.array([0, 1, -1, 7, -7, info.max, info.min], dtype))
    got = run_rlx(model_of("Sign", {"x": EDGE}), {"x": EDGE})
    np.testing.assert_array_equal(got, np.sign(EDGE))


def test_shrink_of_ints_truncates_like_the_reference() -> None:
    x = np.array([-9, -2, -1, 0, 1, 2, 9, 2**31 - 1, -(2**31)], np.int32)
    got = run_rlx(model_of("Shrink", {"x": x}, lambd=1.5, bias=0.5), {"x": x})
    want = np.where(x < -1.5, x + 0.5, np.where(x > 1.5, x - 0.5, 0)).astype(np.int32)
    np.testing.assert_array_equal(got, want)
    against_ort("Shrink", x[:-2], lambd=1.5, bias=0.5)


def test_thresholded_relu_float16_compares_with_the_float32_threshold() -> None:
    """0.1 is not a float16: the float16 0.1 (0.0999755859375) is not above alpha."""
    x = np.array([np.float16(0.1), 0.09985, 0.1001], np.float16)
    got = run_rlx(model_of("ThresholdedRelu", {"x": x}, alpha=0.1), {"x": x})
    np.testing.assert_array_equal(got, np.where(x.astype(np.float32) > np.float32(0.1), x, 0))


# ---------------------------------------------------------------- PRelu
PRELU_SLOPES: dict[str, np.ndarray] = {
    "scalar": np.array(0.25, np.float32),
    "one": np.array([0.25], np.float32),
    "channel": RNG.uniform(-1, 1, (3, 1, 1)).astype(np.float32),
    "trailing": RNG.uniform(-1, 1, (5,)).astype(np.float32),
    "full": RNG.uniform(-1, 1, (2, 3, 4, 5)).astype(np.float32),
}


@pytest.mark.parametrize("slope", sorted(PRELU_SLOPES))
@pytest.mark.parametrize("opset", [9, 16])
def test_prelu_broadcasts_the_slope_to_x(slope: str, opset: int) -> None:
    against_ort("PRelu", mixed(2, 3, 4, 5), consts={"slope": PRELU_SLOPES[slope]}, opset=opset)


def test_prelu_runtime_slope_and_ints() -> None:
    x, s = mixed(4, 3), RNG.uniform(-2, 2, (3,)).astype(np.float32)
    with np.errstate(all="ignore"):
        check_against_ort(model_of("PRelu", {"x": x, "s": s}), {"x": x, "s": s})
    against_ort("PRelu", np.array([-5, 0, 5, -(2**30)], np.int32), consts={"s": np.array([3], np.int32)}, opset=16)
    against_ort("PRelu", EDGE, consts={"s": np.array([-0.5], np.float32)})


def test_prelu_refuses_a_slope_that_would_grow_x() -> None:
    x = mixed(2, 3, 4, 5)
    for bad in (np.ones((3,), np.float32), np.ones((1, 2, 3, 4, 5), np.float32), np.ones((2, 3), np.float32)):
        with pytest.raises(rlx_core.ModelError, match=r"PRelu.*unidirectional"):
            rlx_onnx.load(model_of("PRelu", {"x": x}, {"slope": bad}))


# ---------------------------------------------------------------- reductions
def reduce_case(op: str, x: np.ndarray, axes: list[int] | None, opset: int, **attrs: Any) -> Any:
    """A ReduceX model with ``axes`` as an attribute (opset < 18) or a constant input."""
    if axes is None:
        return model_of(op, {"x": x}, opset=opset, **attrs)
    if opset < 18:
        return model_of(op, {"x": x}, opset=opset, axes=axes, **attrs)
    return model_of(op, {"x": x}, {"axes": np.array(axes, np.int64)}, opset=opset, **attrs)


REDUCTIONS = ["ReduceL1", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd"]
AXES_FORMS: list[tuple[list[int] | None, int]] = [([1], 1), ([0, 2], 0), ([-1], 1), (None, 1), ([2, 0, 1], 0)]


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("axes, keepdims", AXES_FORMS)
@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduction_matches_onnxruntime(op: str, axes: list[int] | None, keepdims: int, opset: int) -> None:
    lo = 0.1 if op == "ReduceLogSum" else -2.0  # a log of a positive sum
    x = RNG.uniform(lo, 2.0, (3, 7, 5)).astype(np.float32)
    model = reduce_case(op, x, axes, opset, keepdims=keepdims)
    check_against_ort(model, {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", REDUCTIONS)
def test_noop_reduction_still_applies_the_elementwise_steps(op: str) -> None:
    """``noop_with_empty_axes``: no reduction, but ReduceL1 is still |x| and ReduceLogSum
    still log(x) (ONNX's text; onnxruntime agrees)."""
    x = np.array([[1.0, -2.0], [3.0, 0.5]], np.float32)
    if op == "ReduceLogSum":
        x = np.abs(x)
    check_against_ort(reduce_case(op, x, None, 18, noop_with_empty_axes=1), {"x": x})
    check_against_ort(reduce_case(op, x, [], 18, noop_with_empty_axes=1), {"x": x})


@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduction_over_an_empty_set(op: str) -> None:
    """ONNX: the sum and L1 of nothing are 0, the product 1, the log-sums -inf."""
    x = np.zeros((2, 0, 3), np.float32)
    got = run_rlx(reduce_case(op, x, [1], 18, keepdims=0), {"x": x})
    want = {"ReduceL1": 0.0, "ReduceProd": 1.0, "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf}[op]
    np.testing.assert_array_equal(got, np.full((2, 3), want, np.float32))


def test_reduce_log_sum_exp_is_stable_at_the_extremes() -> None:
    """Large magnitudes do not overflow; all -inf rows give -inf, a +inf gives +inf, NaN
    stays NaN (onnxruntime agrees row for row)."""
    x = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -1000.0], [-np.inf, -np.inf, -np.inf],
                  [np.inf, 1.0, -np.inf], [np.nan, 1.0, 2.0], [88.0, 89.0, 90.0]], np.float32)
    for keepdims in (0, 1):
        with np.errstate(all="ignore"):
            check_against_ort(reduce_case("ReduceLogSumExp", x, [1], 18, keepdims=keepdims), {"x": x})
    got = run_rlx(reduce_case("ReduceLogSumExp", x, [1], 18, keepdims=0), {"x": x})
    wide = x[:2].astype(np.float64)
    np.testing.assert_allclose(got[:2], np.logaddexp.reduce(wide, axis=1), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32", "int64"])
@pytest.mark.parametrize("op", ["ReduceL1", "ReduceProd"])
def test_l1_and_product_in_every_dtype(op: str, dtype: str) -> None:
    """ints stay ints (exact, wrapping like the reference); odd lengths exercise the
    pairwise product's carried element."""
    hi = 4 if op == "ReduceProd" else 50
    x = RNG.integers(-hi, hi + 1, size=(3, 5, 7)).astype(dtype)
    for axes in ([2], [0, 1], None):
        model = reduce_case(op, x, axes, 18, keepdims=0)
        tol = 2e-3 if dtype == "float16" else 1e-6
        with np.errstate(over="ignore"):  # float16 products of 15 values up to 4 overflow, as in onnxruntime
            check_against_ort(model, {"x": x}, rtol=tol, atol=tol)


def test_reduce_prod_of_a_long_axis() -> None:
    """ceil(log2(n)) levels of pairwise products, exact for ints of every length."""
    for n in (1, 2, 3, 31, 64, 100):
        x = RNG.choice(np.array([-1, 1, 1, 2], np.int64), size=(2, n))
        got = run_rlx(reduce_case("ReduceProd", x, [1], 18, keepdims=1), {"x": x})
        np.testing.assert_array_equal(got, np.prod(x, axis=1, keepdims=True))


@pytest.mark.parametrize("op", ["ReduceLogSum", "ReduceLogSumExp"])
def test_log_reductions_refuse_ints(op: str) -> None:
    x = np.ones((2, 3), np.int32)
    with pytest.raises(rlx_core.ModelError, match=rf"{op}.*needs a float"):
        rlx_onnx.load(reduce_case(op, x, [1], 18))


# ---------------------------------------------------------------- normalizations
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_lp_normalization_matches_onnxruntime(p: int, axis: int) -> None:
    x = mixed(4, 5, 3)
    x[1, :, :] = 0.0  # a zero norm along every axis: 0, not NaN
    x[:, 1, :] = 0.0
    x[:, :, 1] = 0.0
    against_ort("LpNormalization", x, p=p, axis=axis)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_lp_normalization_other_dtypes(dtype: str) -> None:
    """float16 is normalized in float32: squares of 300 would overflow float16."""
    x = np.array([[300.0, -400.0, 0.0], [0.0, 0.0, 0.0], [1e-3, 2e-3, -2e-3]], dtype)
    against_ort("LpNormalization", x, rtol=1e-3 if dtype == "float16" else 1e-12, atol=1e-4)


def test_lp_normalization_refuses_other_p() -> None:
    with pytest.raises(rlx_core.ModelError, match=r"LpNormalization.*p must be 1 or 2"):
        rlx_onnx.load(model_of("LpNormalization", {"x": mixed(2, 3)}, p=3))


@pytest.mark.parametrize("axes", [None, [1], [2, 3], [0, -1], [0, 1, 2, 3]])
def test_mean_variance_normalization_matches_onnxruntime(axes: list[int] | None) -> None:
    x = RNG.normal(5.0, 3.0, (2, 3, 4, 5)).astype(np.float32)
    attrs = {} if axes is None else {"axes": axes}
    against_ort("MeanVarianceNormalization", x, rtol=1e-4, atol=1e-5, **attrs)
    against_ort("MeanVarianceNormalization", x.astype(np.float16), rtol=1e-2, atol=1e-2, **attrs)


def test_mean_variance_normalization_of_a_constant_slice_is_zero() -> None:
    """ONNX's function body adds 1e-9 to the deviation: a constant slice gives 0.
    (onnxruntime's kernel has no epsilon and answers NaN; the spec is followed.)"""
    x = np.ones((1, 2, 3, 3), np.float32)
    x[:, 1] = RNG.normal(size=(1, 3, 3))
    got = run_rlx(model_of("MeanVarianceNormalization", {"x": x}), {"x": x})
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    want = (x - mean) / (np.sqrt(((x - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True)) + 1e-9)
    assert np.all(got[:, 0] == 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- Hardmax
def test_hardmax_matches_onnxruntime_with_ties() -> None:
    x = RNG.integers(-2, 3, size=(3, 4, 6)).astype(np.float32)  # many ties: the first maximum wins
    x[0, 0] = -np.inf
    x[0, 1] = [-np.inf, 5, np.inf, np.inf, 1, 2]
    x[0, 2] = [-0.0, 0.0, -1, -1, -1, -1]
    for axis in (0, 1, 2, -1):
        against_ort("Hardmax", x, opset=13, axis=axis)
    against_ort("Hardmax", x, opset=13)
    against_ort("Hardmax", x.astype(np.float16), opset=13)


@pytest.mark.parametrize("axis", [None, 0, 1, 2, -2])
def test_hardmax_before_opset_13_flattens_the_trailing_axes(axis: int | None) -> None:
    x = RNG.integers(-3, 4, size=(2, 3, 4)).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    against_ort("Hardmax", x, opset=11, **attrs)


def test_hardmax_takes_the_first_nan_as_the_maximum() -> None:
    """ONNX's reference (numpy.argmax) counts NaN as the maximum; onnxruntime answers
    rows with a NaN inconsistently (Eigen's visitor), so the reference is the oracle."""
    x = np.array([[1.0, np.nan, 3.0, np.nan], [np.nan, np.nan, np.nan, np.nan], [2.0, np.inf, np.nan, 1.0],
                  [-np.inf, -np.inf, -np.inf, -np.inf], [np.inf, np.inf, 0.0, 1.0]], np.float32)
    got = run_rlx(model_of("Hardmax", {"x": x}, opset=13), {"x": x})
    np.testing.assert_array_equal(got, DEFINITIONS["Hardmax"](x))


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("op", ["Elu", "Softplus", "Mish", "Hardmax", "LpNormalization", "ThresholdedRelu"])
def test_float_only_ops_refuse_ints_by_name(op: str) -> None:
    x = np.ones((2, 3), np.int32)
    opset = 18 if op == "Mish" else 17
    with pytest.raises(rlx_core.ModelError, match=rf"node #0 \({op}\).*needs a float16 or float32 or float64"):
        rlx_onnx.load(model_of(op, {"x": x}, opset=opset))


def test_celu_refuses_alpha_zero() -> None:
    with pytest.raises(rlx_core.ModelError, match=r"Celu.*alpha must not be 0"):
        rlx_onnx.load(model_of("Celu", {"x": mixed(2, 3)}, opset=13, alpha=0.0))
