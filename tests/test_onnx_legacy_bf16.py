"""bfloat16 Einsum and Celu (computed in float32, rounded to bfloat16 once), the legacy op
versions Scatter 9 and Scan 8, and BatchNormalization's training mode, against onnx's
reference evaluator (``rlx_core/onnx/_ops_einsum.py``, ``_ops_activations.py``,
``_ops_scatter.py``, ``_ops_control.py``, ``_ops_nn.py``, ``_versions.py``); bfloat16
outputs compared exactly, as float64. What stays refused is refused by name: bfloat16
Attention (ONNX rounds each of its steps to bfloat16), variable-length Scan 8 sequences."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("ml_dtypes")

import ml_dtypes
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError
from rlx_core.onnx._versions import readable_versions

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(42)
_ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "float64": TensorProto.DOUBLE,
         "bfloat16": TensorProto.BFLOAT16, "int64": TensorProto.INT64}


def _model(op: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], opset: int,
           initializers: Mapping[str, np.ndarray] | None = None, slots: Sequence[str] | None = None,
           **attrs: Any) -> Any:
    """A one-node model: ``inputs`` fed at run time, ``initializers`` stored in it;
    ``slots`` the node's input names in order ("" for a left-out optional one)."""
    initializers = dict(initializers or {})
    names = list(slots) if slots is not None else [*inputs, *initializers]
    node = helper.make_node(op, names, list(outputs), **attrs)
    decl = [helper.make_tensor_value_info(k, _ELEM[v.dtype.name], list(v.shape)) for k, v in inputs.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs if o]
    graph = helper.make_graph([node], "m", decl, outs,
                              [numpy_helper.from_array(v, k) for k, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return rlx.compile(rlx_onnx.load(model), device="cpu").run(dict(feeds))


def _reference(model: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return list(ReferenceEvaluator(model).run(None, dict(feeds)))


def _same(got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Dtype, shape and values: bfloat16 exactly (as float64, NaN equal to NaN), other
    floats to ``rtol``/``atol``."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype == BF16:
            np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64))
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def _check(model: Any, feeds: Mapping[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    _same(_run(model, feeds), _reference(model, feeds), rtol, atol)


def _small_ints(*shape: int) -> np.ndarray:
    """bfloat16 integers in [-4, 4]: their float32 products and sums are exact, so the
    order in which a matmul accumulates them cannot change the one rounding."""
    return RNG.integers(-4, 5, size=shape).astype(BF16)


# ---------------------------------------------------------------- bfloat16 Einsum
@pytest.mark.parametrize(("equation", "shapes"), [
    ("bij,bjk->bik", [(3, 2, 5), (3, 5, 4)]),
    ("ij->", [(6, 7)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(5, 5)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk", [(2, 3, 4), (2, 4, 2)]),
])
def test_bfloat16_einsum_computes_in_float32_and_rounds_once(equation: str, shapes: list[tuple[int, ...]]) -> None:
    feeds = {f"x{k}": _small_ints(*s) for k, s in enumerate(shapes)}
    model = _model("Einsum", feeds, ["y"], 28, equation=equation)
    _check(model, feeds)
    assert _run(model, feeds)[0].dtype == BF16


def test_bfloat16_einsum_rounds_the_float32_result_to_nearest_even() -> None:
    """A sum whose float32 value lies between two bfloat16 values: the one rounding picks
    the nearest (ties to even), as the reference's ``astype`` does."""
    x = np.array([[256.0, 1.0, 1.0, 0.5], [256.0, 1.0, 0.0, 0.0], [256.0, 3.0, 0.0, 0.0]], BF16)
    model = _model("Einsum", {"x": x}, ["y"], 28, equation="ij->i")
    got = _run(model, {"x": x})[0]
    np.testing.assert_array_equal(got.astype(np.float64), [258.0, 256.0, 260.0])  # 258.5 -> 258, 257 -> 256, 259 -> 260
    _check(model, {"x": x})


def test_bfloat16_einsum_with_another_dtype_is_refused_by_name() -> None:
    feeds = {"a": _small_ints(2, 3), "b": np.ones((3, 2), np.float32)}
    with pytest.raises(ModelError, match="one numeric dtype"):
        rlx_onnx.load(_model("Einsum", feeds, ["y"], 28, equation="ij,jk->ik"))


# ---------------------------------------------------------------- bfloat16 Celu
@pytest.mark.parametrize("alpha", [1.0, 2.0, 0.7, 3.3, -1.5])
def test_bfloat16_celu_matches_the_reference_on_every_bfloat16_value(alpha: float) -> None:
    """All 65,536 bfloat16 bit patterns (subnormals, infinities and NaNs included): the
    float32 ``expm1`` is accurate near 0, where ``exp(u) - 1`` would round differently."""
    x = np.arange(1 << 16, dtype=np.uint16).view(BF16)
    _check(_model("Celu", {"x": x}, ["y"], 28, alpha=alpha), {"x": x})


def test_float_celu_is_unchanged() -> None:
    x = RNG.uniform(-4, 4, size=(3, 5)).astype(np.float32)
    _check(_model("Celu", {"x": x}, ["y"], 12, alpha=1.3), {"x": x})


# ---------------------------------------------------------------- bfloat16 Attention: refused
def test_bfloat16_attention_is_refused_by_name() -> None:
    """ONNX's reference rounds every step of Attention to bfloat16 (the softmax's partial
    sums included); float32 rounded once differs from it, so rlx refuses."""
    feeds = {k: RNG.random((1, 2, 3, 4)).astype(BF16) for k in ("q", "k", "v")}
    with pytest.raises(ModelError, match="bfloat16 Q, K and V are not supported"):
        rlx_onnx.load(_model("Attention", feeds, ["y"], 23, is_causal=1))


# ---------------------------------------------------------------- Scatter 9
def _scatter_cases() -> list[tuple[np.ndarray, np.ndarray, np.ndarray, int | None]]:
    data = RNG.standard_normal((3, 4)).astype(np.float32)
    return [
        (data, np.array([[1, 0, 2, 0], [0, 2, 1, 1]], np.int64), RNG.standard_normal((2, 4)).astype(np.float32), None),
        (data, np.array([[1, 3], [0, 2], [3, 3]], np.int64), RNG.standard_normal((3, 2)).astype(np.float32), 1),
        (data, np.array([[2], [1]], np.int64), RNG.standard_normal((2, 1)).astype(np.float32), -1),
        (np.arange(6, dtype=np.int64).reshape(2, 3), np.array([[1, 1, 0]], np.int64),
         np.array([[7, 8, 9]], np.int64), 0),
    ]


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("opset", [9, 10])
def test_scatter_9_is_read_as_scatter_elements(case: int, opset: int) -> None:
    """Scatter 9 (opsets 9 and 10) against the reference's ScatterElements 11 on the same
    node: the same writes (the reference has no Scatter)."""
    data, indices, updates, axis = _scatter_cases()[case]
    feeds = {"data": data, "updates": updates}
    attrs = {} if axis is None else {"axis": axis}
    model = _model("Scatter", feeds, ["y"], opset, {"indices": indices}, slots=["data", "indices", "updates"],
                   **attrs)
    twin = _model("ScatterElements", feeds, ["y"], 11, {"indices": indices}, slots=["data", "indices", "updates"],
                  **attrs)
    _same(_run(model, feeds), _reference(twin, feeds))


def test_scatter_with_a_reduction_is_refused_by_name() -> None:
    feeds = {"data": np.zeros((2, 2), np.float32), "updates": np.ones((1, 2), np.float32)}
    model = _model("Scatter", feeds, ["y"], 10, {"indices": np.array([[1, 0]], np.int64)},
                   slots=["data", "indices", "updates"], reduction="add")
    with pytest.raises(ModelError, match="no reduction attribute"):
        rlx_onnx.load(model)


# ---------------------------------------------------------------- Scan 8
def _scan8_body(n_state: int, n_in: int) -> Any:
    """States s_i (2,), scan elements x_j (2,): s_i += x_(i % n_in) * (i + 1); the scan
    outputs: s_0 after the update, and x_0 * s_0 (the order in which the steps ran)."""
    nodes, outs = [], []
    consts = [numpy_helper.from_array(np.full(2, i + 1, np.float32), f"k{i}") for i in range(n_state)]
    for i in range(n_state):
        nodes += [helper.make_node("Mul", [f"x{i % n_in}", f"k{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"s{i}", f"m{i}"], [f"s{i}_out"])]
        outs.append(f"s{i}_out")
    nodes += [helper.make_node("Identity", ["s0_out"], ["o0"]), helper.make_node("Mul", ["x0", "s0_out"], ["o1"])]
    f32 = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info(f"s{i}", f32, [2]) for i in range(n_state)]
    ins += [helper.make_tensor_value_info(f"x{j}", f32, [2]) for j in range(n_in)]
    outputs = [helper.make_tensor_value_info(o, f32, [2]) for o in [*outs, "o0", "o1"]]
    return helper.make_graph(nodes, "body", ins, outputs, consts)


def _scan8_expected(states: list[np.ndarray], xs: list[np.ndarray], directions: list[int]
                    ) -> list[np.ndarray]:
    """Scan 8 as its specification's pseudo-code says: per batch item, the steps in order,
    each scan input read forward or from its end."""
    batch, steps = xs[0].shape[:2]
    finals = [np.empty_like(s) for s in states]
    o0 = np.empty((batch, steps, 2), np.float32)
    o1 = np.empty((batch, steps, 2), np.float32)
    for b in range(batch):
        st = [s[b].copy() for s in states]
        for t in range(steps):
            el = [x[b, steps - 1 - t if d else t] for x, d in zip(xs, directions)]
            st = [s + el[i % len(xs)] * np.float32(i + 1) for i, s in enumerate(st)]
            o0[b, t], o1[b, t] = st[0], el[0] * st[0]
        for i, s in enumerate(st):
            finals[i][b] = s
    return [*finals, o0, o1]


@pytest.mark.parametrize(("n_state", "n_in", "directions", "lens"), [
    (1, 1, None, False),
    (2, 1, None, True),
    (2, 2, [0, 1], False),
    (3, 2, [1, 0], True),
])
def test_scan_8_unrolls_each_batch_item(n_state: int, n_in: int, directions: list[int] | None, lens: bool) -> None:
    batch, steps = 3, 4
    states = [RNG.standard_normal((batch, 2)).astype(np.float32) for _ in range(n_state)]
    xs = [RNG.standard_normal((batch, steps, 2)).astype(np.float32) for _ in range(n_in)]
    feeds = {**{f"init{i}": s for i, s in enumerate(states)}, **{f"scan{j}": x for j, x in enumerate(xs)}}
    inits = {"lens": np.full(batch, steps, np.int64)} if lens else {}
    attrs: dict[str, Any] = {"body": _scan8_body(n_state, n_in), "num_scan_inputs": n_in}
    if directions is not None:
        attrs["directions"] = directions
    outputs = [*(f"final{i}" for i in range(n_state)), "out0", "out1"]
    model = _model("Scan", feeds, outputs, 8, inits, slots=["lens" if lens else "", *feeds], **attrs)
    _same(_run(model, feeds), _scan8_expected(states, xs, directions or [0] * n_in))


def test_scan_8_sum_is_the_onnx_example() -> None:
    """ONNX's own Scan 8 example (``test_scan_sum``): running sums over a batch of one."""
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "next"], ["sum_out"]),
         helper.make_node("Identity", ["sum_out"], ["scan_out"])], "scan_body",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("sum_in", "next")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("sum_out", "scan_out")])
    feeds = {"initial": np.zeros((1, 2), np.float32), "x": np.arange(1, 7, dtype=np.float32).reshape(1, 3, 2)}
    model = _model("Scan", feeds, ["y", "z"], 8, slots=["", "initial", "x"], body=body, num_scan_inputs=1)
    y, z = _run(model, feeds)
    np.testing.assert_array_equal(y, [[9, 12]])
    np.testing.assert_array_equal(z, [[[1, 2], [4, 6], [9, 12]]])


def test_scan_8_with_shorter_sequences_is_refused_by_name() -> None:
    feeds = {"init0": np.zeros((2, 2), np.float32), "scan0": np.ones((2, 3, 2), np.float32)}
    model = _model("Scan", feeds, ["final0", "out0", "out1"], 8, {"lens": np.array([3, 2], np.int64)},
                   slots=["lens", "init0", "scan0"], body=_scan8_body(1, 1), num_scan_inputs=1)
    with pytest.raises(ModelError, match="sequence_lens"):
        rlx_onnx.load(model)


def test_scan_8_too_long_to_unroll_is_refused_not_run_from_the_host() -> None:
    """The host's Scan step reads Scan 9 and later: a Scan 8 past MAX_UNROLL is refused."""
    from rlx_core.onnx._ops_control import MAX_UNROLL

    feeds = {"init0": np.zeros((2, 2), np.float32), "scan0": np.ones((2, MAX_UNROLL // 2 + 1, 2), np.float32)}
    model = _model("Scan", feeds, ["final0", "out0", "out1"], 8, slots=["", "init0", "scan0"],
                   body=_scan8_body(1, 1), num_scan_inputs=1)
    with pytest.raises(ModelError, match="Scan 8 is not run from the host"):
        rlx_onnx.load(model)


def test_the_legacy_versions_are_read() -> None:
    assert {8, 9} <= readable_versions("Scan")
    assert 9 in readable_versions("Scatter")
    assert 7 not in readable_versions("Scatter")  # no such version: Scatter 9 is the first


# ---------------------------------------------------------------- BatchNormalization training mode
def _batch_norm(shape: tuple[int, ...], dtype: str, outputs: Sequence[str], **attrs: Any) -> tuple[Any, dict]:
    c = shape[1]
    feeds = {"x": RNG.standard_normal(shape).astype(dtype),
             "scale": RNG.standard_normal(c).astype(dtype), "bias": RNG.standard_normal(c).astype(dtype),
             "mean": RNG.standard_normal(c).astype(dtype), "var": RNG.uniform(0.5, 2.0, c).astype(dtype)}
    return _model("BatchNormalization", feeds, outputs, 15, training_mode=1, **attrs), feeds


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (6, 4), (2, 3, 7), (1, 2, 2, 3, 2)])
@pytest.mark.parametrize("attrs", [{}, {"epsilon": 1e-2, "momentum": 0.7}])
def test_batch_norm_training_mode_uses_the_batch_statistics(shape: tuple[int, ...], attrs: dict) -> None:
    model, feeds = _batch_norm(shape, "float32", ["y", "running_mean", "running_var"], **attrs)
    _check(model, feeds, rtol=1e-4, atol=1e-5)


def test_batch_norm_training_mode_with_only_y() -> None:
    model, feeds = _batch_norm((2, 3, 4), "float32", ["y"])
    _check(model, feeds, rtol=1e-4, atol=1e-5)


def test_batch_norm_training_mode_in_float64_and_float16() -> None:
    model, feeds = _batch_norm((4, 3, 5), "float64", ["y", "running_mean", "running_var"], momentum=0.5)
    _check(model, feeds, rtol=1e-10, atol=1e-12)
    model, feeds = _batch_norm((4, 3, 5), "float16", ["y", "running_mean", "running_var"])
    _check(model, feeds, rtol=5e-3, atol=5e-3)


def test_batch_norm_training_mode_with_mixed_dtypes_is_refused_by_name() -> None:
    _, feeds = _batch_norm((2, 3, 4), "float32", ["y", "running_mean", "running_var"])
    feeds["mean"] = feeds["mean"].astype(np.float64)
    model = _model("BatchNormalization", feeds, ["y", "running_mean", "running_var"], 15, training_mode=1)
    with pytest.raises(ModelError, match="one float dtype"):
        rlx_onnx.load(model)


def test_batch_norm_statistics_outputs_without_training_mode_stay_refused() -> None:
    """BatchNormalization 9's training outputs (opsets 9-13), and running statistics asked
    of an inference-mode node, are refused by name as before."""
    model, _ = _batch_norm((2, 3, 4), "float32", ["y", "mean_out", "var_out"])
    model.opset_import[0].version = 12
    del model.graph.node[0].attribute[:]
    with pytest.raises(ModelError, match="statistics outputs without training_mode=1"):
        rlx_onnx.load(model)
    model, _ = _batch_norm((2, 3, 4), "float32", ["y", "running_mean", "running_var"])
    del model.graph.node[0].attribute[:]
    with pytest.raises(ModelError, match="statistics outputs without training_mode=1"):
        rlx_onnx.load(model)
