"""TensorScatter, LinearAttention and CausalConvWithState (rlx_core/onnx/_ops_recurrent_llm.py)
against onnx's reference evaluator: each op's forms (cache write modes and axes, the four
linear-attention update rules with grouped heads, past state and decode steps, the causal
convolution's bias, state, activation and kernel sizes), and the forms refused by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx

_ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64,
         "bool": TensorProto.BOOL}


def _model(op: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], opset: int,
           initializers: Mapping[str, np.ndarray] | None = None, slots: Sequence[str] | None = None,
           shapes: Mapping[str, Sequence[int | str]] | None = None, **attrs: Any) -> Any:
    """A one-node model: ``inputs`` fed at run time, ``initializers`` stored in it;
    ``slots`` the node's input names in order ("" for a left-out optional one)."""
    initializers = dict(initializers or {})
    names = list(slots) if slots is not None else [*inputs, *initializers]
    node = helper.make_node(op, names, list(outputs), **attrs)
    decl = [helper.make_tensor_value_info(k, _ELEM[v.dtype.name], list((shapes or {}).get(k, v.shape)))
            for k, v in inputs.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    graph = helper.make_graph([node], "m", decl, outs,
                              [numpy_helper.from_array(v, k) for k, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(model: Any, feeds: Mapping[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """rlx's cpu result equals the reference evaluator's: dtype, shape and values."""
    want = ReferenceEvaluator(model).run(None, dict(feeds))
    got = rlx.compile(rlx_onnx.load(model), device="cpu").run(dict(feeds))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)


def _set_attr(model: Any, name: str, value: Any) -> None:
    """Replace (or add) attribute ``name`` of the model's one node."""
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


def _rand(rng: np.random.Generator, *shape: int, dtype: str = "float32", scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtype)


# ---------------------------------------------------------------------------- TensorScatter
SCATTER_CASES: dict[str, dict[str, Any]] = {
    "linear, 4-D cache, default axis -2": {"cache": (2, 3, 6, 4), "seq": 2, "idx": [0, 3]},
    "linear, one decode token": {"cache": (2, 1, 5, 3), "seq": 1, "idx": [4, 1]},
    "circular, wrapping past the end": {"cache": (2, 2, 4, 3), "seq": 3, "idx": [2, 3], "mode": "circular"},
    "circular, indices beyond the length and negative": {"cache": (3, 4, 2), "seq": 2, "idx": [9, -1, 4],
                                                         "mode": "circular", "axis": 1},
    "circular, the whole cache": {"cache": (2, 4, 3), "seq": 4, "idx": [1, 6], "mode": "circular", "axis": 1},
    "axis 1 of a 4-D cache (positions before the heads)": {"cache": (2, 5, 3, 2), "seq": 2, "idx": [1, 3],
                                                           "axis": 1},
    "no write_indices (prefill)": {"cache": (2, 2, 5, 3), "seq": 3, "idx": None},
    "no write_indices, circular, full length": {"cache": (2, 4, 3), "seq": 4, "idx": None, "mode": "circular",
                                                "axis": 1},
    "write_indices stored in the model": {"cache": (2, 3, 6, 4), "seq": 2, "idx": [5, 1], "stored": True,
                                          "mode": "circular"},
    "int64 cache": {"cache": (2, 6, 3), "seq": 2, "idx": [0, 4], "dtype": "int64", "axis": 1},
    "bool cache": {"cache": (2, 3, 4), "seq": 2, "idx": [1, 0], "dtype": "bool"},
}


def _scatter_model(cache: tuple[int, ...], seq: int, idx: list[int] | None, mode: str = "linear", axis: int = -2,
                   dtype: str = "float32", stored: bool = False) -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(sum(cache) + seq)
    upd_shape = list(cache)
    upd_shape[axis] = seq
    if dtype == "bool":
        past, upd = rng.random(cache) < 0.5, rng.random(upd_shape) < 0.5
    else:
        past, upd = _rand(rng, *cache, scale=10).astype(dtype), _rand(rng, *upd_shape, scale=10).astype(dtype)
    feeds: dict[str, np.ndarray] = {"past_cache": past, "update": upd}
    stored_inits: dict[str, np.ndarray] = {}
    slots = ["past_cache", "update"]
    if idx is not None:
        (stored_inits if stored else feeds)["write_indices"] = np.array(idx, dtype=np.int64)
        slots.append("write_indices")
    model = _model("TensorScatter", feeds, ["present_cache"], 24, stored_inits, slots=slots, mode=mode, axis=axis)
    return model, feeds


@pytest.mark.parametrize("name", list(SCATTER_CASES))
def test_tensor_scatter_matches_the_reference(name: str) -> None:
    model, feeds = _scatter_model(**SCATTER_CASES[name])
    _check(model, feeds, rtol=0, atol=0)


def test_tensor_scatter_loads_with_a_symbolic_batch() -> None:
    """A dynamic batch is converted at each size the graph is run at."""
    model, feeds = _scatter_model((2, 3, 6, 4), 2, [0, 3])
    for value in model.graph.input:
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    got = rlx.compile(rlx_onnx.load(model), device="cpu").run(feeds)
    np.testing.assert_array_equal(got[0], ReferenceEvaluator(model).run(None, feeds)[0])


# ---------------------------------------------------------------------------- LinearAttention
B, T, DK, DV = 2, 5, 4, 3

LINEAR_ATTENTION_CASES: dict[str, dict[str, Any]] = {
    "linear": {"rule": "linear"},
    "gated, per-key-dim decay": {"rule": "gated"},
    "gated, per-head decay": {"rule": "gated", "per_head_decay": True},
    "delta": {"rule": "delta"},
    "gated_delta (the default rule)": {"rule": None},
    "gated_delta, one beta for every head": {"rule": None, "beta_one": True},
    "gated_delta, grouped query heads": {"rule": None, "hq": 4, "hkv": 2},
    "gated_delta, multi-query": {"rule": None, "hq": 4, "hkv": 1},
    "gated_delta, past state": {"rule": None, "past": True},
    "gated_delta, decode step": {"rule": None, "past": True, "steps": 1},
    "gated_delta, empty sequence (the state passed on)": {"rule": None, "past": True, "steps": 0},
    "linear, past state, explicit scale": {"rule": "linear", "past": True, "scale": 0.3},
    "gated_delta, float16": {"rule": None, "hq": 4, "hkv": 2, "dtype": "float16"},
}


def _linear_attention_model(rule: str | None, hq: int = 2, hkv: int = 2, steps: int = T, past: bool = False,
                            per_head_decay: bool = False, beta_one: bool = False, scale: float | None = None,
                            dtype: str = "float32") -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(hq * 7 + hkv + steps + 3 * past + 5 * per_head_decay)
    feeds = {"query": _rand(rng, B, steps, hq * DK, dtype=dtype), "key": _rand(rng, B, steps, hkv * DK, dtype=dtype,
                                                                               scale=0.5),
             "value": _rand(rng, B, steps, hkv * DV, dtype=dtype)}
    slots = ["query", "key", "value", "", "", ""]
    if past:
        feeds["past_state"] = _rand(rng, B, hkv, DK, DV, dtype=dtype)
        slots[3] = "past_state"
    if rule in ("gated", None):
        width = hkv if per_head_decay else hkv * DK
        feeds["decay"] = (-rng.random((B, steps, width))).astype(dtype)  # log-space, <= 0
        slots[4] = "decay"
    if rule in ("delta", None):
        feeds["beta"] = rng.random((B, steps, 1 if beta_one else hkv)).astype(dtype)
        slots[5] = "beta"
    attrs: dict[str, Any] = {"q_num_heads": hq, "kv_num_heads": hkv}
    if rule is not None:
        attrs["update_rule"] = rule
    if scale is not None:
        attrs["scale"] = scale
    while slots[-1] == "":
        slots.pop()
    model = _model("LinearAttention", feeds, ["output", "present_state"], 27, slots=slots, **attrs)
    return model, feeds


@pytest.mark.parametrize("name", list(LINEAR_ATTENTION_CASES))
def test_linear_attention_matches_the_reference(name: str) -> None:
    kw = LINEAR_ATTENTION_CASES[name]
    model, feeds = _linear_attention_model(**kw)
    half = kw.get("dtype") == "float16"
    _check(model, feeds, rtol=1e-3 if half else 1e-4, atol=1e-3 if half else 1e-5)


def test_linear_attention_output_alone() -> None:
    """present_state left out of the node: the state is not made an output."""
    model, feeds = _linear_attention_model(None)
    del model.graph.node[0].output[1]
    del model.graph.output[1]
    _check(model, feeds, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- CausalConvWithState
CONV_CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "bias": {"bias": True},
    "past state": {"past": True},
    "bias, past state, silu": {"bias": True, "past": True, "activation": "silu"},
    "swish": {"activation": "swish"},
    "decode step": {"length": 1, "bias": True, "past": True},
    "input shorter than the state": {"length": 2, "k": 5},
    "kernel size 1": {"k": 1, "bias": True},
    "kernel size 1 with an empty past state": {"k": 1, "past": True},
    "weights and bias stored in the model": {"stored": True, "bias": True, "activation": "silu"},
    "float16, silu": {"dtype": "float16", "activation": "silu", "past": True},
}


def _conv_model(length: int = 7, k: int = 4, bias: bool = False, past: bool = False, activation: str | None = None,
                dtype: str = "float32", stored: bool = False) -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(length * 11 + k + 2 * bias + 3 * past)
    channels = 3
    feeds = {"input": _rand(rng, B, channels, length, dtype=dtype)}
    weights = {"weight": _rand(rng, channels, 1, k, dtype=dtype)}
    if bias:
        weights["bias"] = _rand(rng, channels, dtype=dtype)
    if past:
        feeds["past_state"] = _rand(rng, B, channels, k - 1, dtype=dtype)
    inits = weights if stored else {}
    if not stored:
        feeds.update(weights)
    slots = ["input", "weight", "bias" if bias else "", "past_state" if past else ""]
    while slots[-1] == "":
        slots.pop()
    attrs = {} if activation is None else {"activation": activation}
    return _model("CausalConvWithState", feeds, ["output", "present_state"], 27, inits, slots=slots, **attrs), feeds


@pytest.mark.parametrize("name", list(CONV_CASES))
def test_causal_conv_with_state_matches_the_reference(name: str) -> None:
    kw = CONV_CASES[name]
    model, feeds = _conv_model(**kw)
    half = kw.get("dtype") == "float16"
    _check(model, feeds, rtol=1e-3 if half else 1e-5, atol=1e-3 if half else 1e-6)


# ---------------------------------------------------------------------------- refusals
def test_what_is_not_read_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _scatter_model((2, 4, 3), 2, [0, 1], axis=1)
    _set_attr(model, "mode", "clamp")
    with pytest.raises(rlx.RlxError, match=r"TensorScatter.*mode 'clamp' is not 'linear' or 'circular'"):
        rlx_onnx.load(model)
    model, _ = _scatter_model((2, 4, 3), 2, [0, 1], axis=1)
    _set_attr(model, "axis", 0)  # the batch
    with pytest.raises(rlx.RlxError, match=r"TensorScatter.*axis 0"):
        rlx_onnx.load(model)

    model, _ = _linear_attention_model("linear")
    _set_attr(model, "update_rule", "mamba")
    with pytest.raises(rlx.RlxError, match=r"LinearAttention.*update_rule 'mamba' is not one of"):
        rlx_onnx.load(model)
    model, _ = _linear_attention_model("gated")
    _set_attr(model, "update_rule", "linear")  # with a decay input, which it does not take
    with pytest.raises(rlx.RlxError, match=r"LinearAttention.*takes no decay input"):
        rlx_onnx.load(model)
    from rlx_core.onnx import _ops_recurrent_llm

    monkeypatch.setattr(_ops_recurrent_llm, "MAX_STEPS", 4)
    model, _ = _linear_attention_model("linear")
    with pytest.raises(rlx.RlxError, match=r"LinearAttention.*5 steps .* more than the 4 supported"):
        rlx_onnx.load(model)

    model, _ = _conv_model(activation="relu")
    with pytest.raises(rlx.RlxError, match=r"CausalConvWithState.*activation 'relu' is not"):
        rlx_onnx.load(model)
    model, _ = _conv_model()
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 2  # weight (3, 2, 4): not depthwise
    with pytest.raises(rlx.RlxError, match=r"CausalConvWithState.*weight must be depthwise"):
        rlx_onnx.load(model)
