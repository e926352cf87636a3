"""LSTM, GRU and RNN, unrolled over the sequence, against onnxruntime: every direction,
both layouts, biases, initial states, peepholes, clip, GRU's linear_before_reset; and
loaded without dims, at several sequence lengths."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, ort_run, rand, vi

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6


def _model(op: str, *, direction: str = "forward", layout: int = 0, bias: bool = True, initial: bool = False,
           peepholes: bool = False, outputs: tuple[str, ...] = ("Y", "Y_h"), symbolic: bool = False,
           **attrs: Any) -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(sum(map(ord, op + direction)) + 2 * bias + 3 * initial + 5 * peepholes)
    dirs, g = (2 if direction == "bidirectional" else 1), GATES[op]
    x_shape = (SEQ, BATCH, INPUT) if layout == 0 else (BATCH, SEQ, INPUT)
    state_shape = (dirs, BATCH, HIDDEN) if layout == 0 else (BATCH, dirs, HIDDEN)
    inits = [init("W", rand(rng, dirs, g * HIDDEN, INPUT)), init("R", rand(rng, dirs, g * HIDDEN, HIDDEN))]
    names = ["X", "W", "R", "B" if bias else "", "", "h0" if initial else ""]
    if bias:
        inits.append(init("B", rand(rng, dirs, 2 * g * HIDDEN)))
    feeds = {"X": rand(rng, *x_shape, lo=-2, hi=2)}
    inputs = [vi("X", "float32", (["seq", "batch", INPUT] if layout == 0 else ["batch", "seq", INPUT])
                  if symbolic else x_shape)]
    if initial:
        feeds["h0"] = rand(rng, *state_shape)
        inputs.append(vi("h0", "float32", state_shape))
        if op == "LSTM":
            names.append("c0")
            feeds["c0"] = rand(rng, *state_shape)
            inputs.append(vi("c0", "float32", state_shape))
    if peepholes:
        names += [""] * (7 - len(names)) + ["P"]
        inits.append(init("P", rand(rng, dirs, 3 * HIDDEN)))
    slots = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    node = helper.make_node(op, names, [o if o in outputs else "" for o in slots], hidden_size=HIDDEN,
                            direction=direction, layout=layout, **attrs)
    return make_model([node], inputs, [vi(o, "float32", None) for o in outputs], inits, opset=14), feeds


CASES = {
    "LSTM forward": ("LSTM", {}),
    "LSTM reverse, initial states, Y_c": ("LSTM", {"direction": "reverse", "initial": True,
                                                   "outputs": ("Y", "Y_h", "Y_c")}),
    "LSTM bidirectional, batch first": ("LSTM", {"direction": "bidirectional", "layout": 1, "initial": True,
                                                 "outputs": ("Y", "Y_h", "Y_c")}),
    "LSTM peepholes, no bias": ("LSTM", {"peepholes": True, "bias": False}),
    "LSTM clip": ("LSTM", {"clip": 0.5}),
    "GRU forward (linear_before_reset=1, as torch exports)": ("GRU", {"linear_before_reset": 1}),
    "GRU bidirectional, linear_before_reset=0": ("GRU", {"direction": "bidirectional", "initial": True}),
    "GRU batch first, reverse": ("GRU", {"layout": 1, "direction": "reverse", "linear_before_reset": 1}),
    "RNN forward": ("RNN", {}),
    "RNN bidirectional, relu, initial": ("RNN", {"direction": "bidirectional", "initial": True,
                                                 "activations": ["Relu", "Relu"]}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_recurrent_layers_match_onnxruntime(name: str) -> None:
    op, kw = CASES[name]
    model, feeds = _model(op, **kw)
    if kw.get("layout", 0) == 0:
        check_against_ort(model, feeds, rtol=1e-5, atol=1e-5)
        return
    # onnxruntime runs layout 0 only: the same weights at layout 0, inputs and outputs transposed
    twin, _ = _model(op, **{**kw, "layout": 0})
    seq_first = {k: np.ascontiguousarray(v.swapaxes(0, 1)) for k, v in feeds.items()}
    got = rlx.compile(rlx_onnx.load(model), device="cpu").run(feeds)
    want = ort_run(twin, seq_first)
    perms = [(2, 0, 1, 3)] + [(1, 0, 2)] * (len(want) - 1)  # Y (seq, dirs, batch, H) -> (batch, seq, dirs, H)
    for g, w, perm in zip(got, want, perms):
        np.testing.assert_allclose(g, w.transpose(perm), rtol=1e-5, atol=1e-5)


def test_loaded_without_dims_at_several_lengths() -> None:
    model, _ = _model("LSTM", direction="bidirectional", symbolic=True)
    g = rlx_onnx.load(model)
    assert g.symbols == ("batch", "seq")
    cg = rlx.compile(g, device="cpu")
    for seq, batch in [(1, 1), (9, 2), (3, 5)]:
        x = np.random.default_rng(seq).uniform(-2, 2, (seq, batch, INPUT)).astype(np.float32)
        for got, want in zip(cg.run({"X": x}), ort_run(model, {"X": x})):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_what_is_not_read_is_refused_by_name() -> None:
    model, _ = _model("RNN", activations=["LeakyRelu"])
    with pytest.raises(ModelError, match="activation 'LeakyRelu' is not supported"):
        rlx_onnx.load(model)
    model, _ = _model("GRU")
    node = model.graph.node[0]
    while len(node.input) < 5:
        node.input.append("")
    node.input[4] = "lens"
    model.graph.initializer.append(init("lens", np.array([5, 2, 5], np.int32)))
    with pytest.raises(ModelError, match="sequence_lens other than the full sequence length"):
        rlx_onnx.load(model)
