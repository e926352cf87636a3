"""The two models of ``bench/dynamic.py``: a BERT-style encoder and a GPT-2-style decoder,
written with ``onnx.helper`` with symbolic ``(batch, seq)`` inputs and every size computed at
run time the way torch's exporter writes dynamic axes (see that script's docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.models import OPSET, _OnnxWriter, _uniform

__all__ = ["DynamicModel", "build_encoder", "build_decoder", "build_models", "WIDTH", "HEADS", "LAYERS", "VOCAB",
           "POSITIONS", "MODEL_SEED"]

MODEL_SEED = 20261127
VOCAB = 1000
POSITIONS = 512
WIDTH, HEADS, LAYERS = 256, 4, 2


@dataclass(frozen=True)
class DynamicModel:
    """One model: its ONNX bytes, its int64 ``(batch, seq)`` inputs, its one output."""

    name: str
    summary: str
    onnx: bytes
    inputs: tuple[str, ...]
    output: str
    width: int


class _Writer(_OnnxWriter):
    """``bench/models.py``'s writer plus constants shared by value, nodes with several
    outputs, and the exporter's run-time shape idioms."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._consts: dict[tuple[str, tuple[int, ...], bytes], str] = {}

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        """An initializer holding ``value`` (one per distinct value)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(f"const_{len(self._consts)}", arr)
        return self._consts[key]

    def ops(self, op_type: str, *inputs: str, outputs: int, **attrs: Any) -> list[str]:
        from onnx import helper

        names = [f"{op_type.lower()}{len(self.nodes)}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names

    def dim(self, x: str, axis: int) -> str:
        """``x.size(axis)`` as torch exports it: ``Shape -> Gather``, a 0-d int64."""
        return self.op("Gather", self.op("Shape", x), self.const(axis), axis=0)

    def unsqueeze(self, x: str, *axes: int) -> str:
        return self.op("Unsqueeze", x, self.const(list(axes)))

    def shape(self, *parts: str | int) -> str:
        """A shape computed at run time: each 0-d dim ``Unsqueeze``-d, each int a constant, ``Concat``-ed."""
        pieces = [self.const([p]) if isinstance(p, int) else self.unsqueeze(p, 0) for p in parts]
        return self.op("Concat", *pieces, axis=0)

    def linear(self, rng: np.random.Generator, x: str, name: str, d_in: int, d_out: int) -> str:
        """``nn.Linear`` as exported: ``MatMul`` by a ``[in, out]`` weight, ``Add`` the bias."""
        w = self.init(f"{name}.weight", _uniform(rng, (d_in, d_out), d_in))
        b = self.init(f"{name}.bias", _uniform(rng, (d_out,), d_in))
        return self.op("Add", self.op("MatMul", x, w), b)

    def layer_norm(self, rng: np.random.Generator, x: str, name: str, width: int, eps: float,
                   out: str | None = None) -> str:
        scale = self.init(f"{name}.weight", rng.uniform(0.8, 1.2, width).astype(np.float32))
        bias = self.init(f"{name}.bias", rng.uniform(-0.1, 0.1, width).astype(np.float32))
        return self.op("LayerNormalization", x, scale, bias, out=out, axis=-1, epsilon=eps)

    def finish_dynamic(self, inputs: tuple[str, ...], output: str, width: int) -> bytes:
        """The model, its inputs int64 ``(batch, seq)`` and its output float ``(batch, seq, width)``,
        checked with ``onnx.checker`` (full check)."""
        import onnx
        from onnx import TensorProto, helper

        ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in inputs]
        outs = [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", "seq", width])]
        graph = helper.make_graph(self.nodes, self.name, ins, outs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="rlx-bench")
        model.ir_version = 8  # what onnxruntime releases of the last years all read
        onnx.checker.check_model(model, full_check=True)
        return model.SerializeToString()


def _table(rng: np.random.Generator, rows: int, width: int, scale: float) -> np.ndarray:
    return (scale * rng.standard_normal((rows, width))).astype(np.float32)


def _split_heads(o: _Writer, x: str, batch: str, seq: str, heads: int, head_dim: int, perm: list[int]) -> str:
    """``x.view(batch, seq, heads, head_dim).permute(perm)``, the shape computed at run time."""
    return o.op("Transpose", o.op("Reshape", x, o.shape(batch, seq, heads, head_dim)), perm=perm)


def _attention(o: _Writer, q: str, k: str, v: str, x: str, mask: str, heads: int, width: int) -> str:
    """Scaled dot-product attention over heads split from ``x``'s run-time sizes, plus the
    additive ``mask``; the heads merged back to ``(batch, seq, width)``."""
    batch, seq, dh = o.dim(x, 0), o.dim(x, 1), width // heads
    qh = _split_heads(o, q, batch, seq, heads, dh, [0, 2, 1, 3])
    kt = _split_heads(o, k, batch, seq, heads, dh, [0, 2, 3, 1])
    vh = _split_heads(o, v, batch, seq, heads, dh, [0, 2, 1, 3])
    scores = o.op("Div", o.op("MatMul", qh, kt), o.const(math.sqrt(dh), np.float32))
    probs = o.op("Softmax", o.op("Add", scores, mask), axis=-1)
    ctx = o.op("Transpose", o.op("MatMul", probs, vh), perm=[0, 2, 1, 3])
    return o.op("Reshape", ctx, o.shape(batch, seq, width))


def _erf_gelu(o: _Writer, x: str) -> str:
    """``x * 0.5 * (1 + erf(x / sqrt 2))``, as torch exports ``nn.GELU()``."""
    inner = o.op("Add", o.op("Erf", o.op("Div", x, o.const(math.sqrt(2.0), np.float32))), o.const(1.0, np.float32))
    return o.op("Mul", o.op("Mul", x, inner), o.const(0.5, np.float32))


def _tanh_gelu(o: _Writer, x: str) -> str:
    """GPT-2's ``gelu_new``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    f32 = np.float32
    cube = o.op("Mul", o.op("Pow", x, o.const(3.0, f32)), o.const(0.044715, f32))
    t = o.op("Tanh", o.op("Mul", o.op("Add", x, cube), o.const(math.sqrt(2.0 / math.pi), f32)))
    return o.op("Mul", o.op("Mul", x, o.const(0.5, f32)), o.op("Add", t, o.const(1.0, f32)))


def build_encoder(width: int = WIDTH, heads: int = HEADS, layers: int = LAYERS, vocab: int = VOCAB,
                  positions: int = POSITIONS) -> DynamicModel:
    """A BERT-style post-LN encoder with inputs ``input_ids`` and ``attention_mask``."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(MODEL_SEED + 1)
    o = _Writer("bert_encoder")
    ids, mask = "input_ids", "attention_mask"
    words = o.init("embeddings.word", _table(rng, vocab, width, 0.5))
    types = o.init("embeddings.token_type", _table(rng, 2, width, 0.5))
    places = o.init("embeddings.position", _table(rng, positions, width, 0.5))
    # position_ids = self.position_ids[:, :seq] (a registered buffer), token_type_ids = zeros(input_shape)
    arange = o.init("embeddings.position_ids", np.arange(positions, dtype=np.int64)[None, :])
    position_ids = o.op("Slice", arange, o.const([0]), o.unsqueeze(o.dim(ids, 1), 0), o.const([1]))
    zeros = helper.make_tensor("value", TensorProto.INT64, [1], [0])
    type_ids = o.op("ConstantOfShape", o.op("Shape", ids), value=zeros)
    summed = o.op("Add", o.op("Add", o.op("Gather", words, ids), o.op("Gather", types, type_ids)),
                  o.op("Gather", places, position_ids))
    h = o.layer_norm(rng, summed, "embeddings.norm", width, 1e-12)
    # extended mask: (1 - mask[:, None, None, :].float()) * -10000
    ext = o.op("Cast", o.unsqueeze(mask, 1, 2), to=TensorProto.FLOAT)
    bias = o.op("Mul", o.op("Sub", o.const(1.0, np.float32), ext), o.const(-10000.0, np.float32))
    for i in range(layers):
        p = f"layer{i}"
        q, k, v = (o.linear(rng, h, f"{p}.{n}", width, width) for n in ("query", "key", "value"))
        ctx = o.linear(rng, _attention(o, q, k, v, h, bias, heads, width), f"{p}.attn_out", width, width)
        h = o.layer_norm(rng, o.op("Add", ctx, h), f"{p}.attn_norm", width, 1e-12)
        ff = o.linear(rng, _erf_gelu(o, o.linear(rng, h, f"{p}.ffn_in", width, 4 * width)), f"{p}.ffn_out",
                      4 * width, width)
        out = "last_hidden_state" if i == layers - 1 else None
        h = o.layer_norm(rng, o.op("Add", ff, h), f"{p}.ffn_norm", width, 1e-12, out=out)
    summary = (f"BERT-style encoder, {layers} post-LN layers, width {width}, {heads} heads, FFN {4 * width}, "
               "erf GELU, padding mask")
    return DynamicModel("encoder", summary, o.finish_dynamic((ids, mask), h, width), (ids, mask), h, width)


def build_decoder(width: int = WIDTH, heads: int = HEADS, layers: int = LAYERS, vocab: int = VOCAB,
                  positions: int = POSITIONS) -> DynamicModel:
    """A GPT-2-style pre-LN decoder with input ``input_ids``; the output is the last hidden state."""
    rng = np.random.default_rng(MODEL_SEED + 2)
    o = _Writer("gpt2_decoder")
    ids = "input_ids"
    wte = o.init("wte", _table(rng, vocab, width, 0.5))
    wpe = o.init("wpe", _table(rng, positions, width, 0.5))
    batch, seq = o.dim(ids, 0), o.dim(ids, 1)
    pos = o.op("Range", o.const(0), seq, o.const(1))  # torch.arange(seq)
    h = o.op("Add", o.op("Gather", wte, ids), o.op("Gather", wpe, o.unsqueeze(pos, 0)))
    # causal mask: key position > query position gets float32's min, expanded to (batch, 1, seq, seq)
    future = o.op("Less", o.unsqueeze(pos, 1), o.unsqueeze(pos, 0))
    additive = o.op("Where", future, o.const(np.finfo(np.float32).min, np.float32), o.const(0.0, np.float32))
    mask = o.op("Expand", o.unsqueeze(additive, 0, 1), o.shape(batch, 1, seq, seq))
    split = o.const([width, width, width])
    for i in range(layers):
        p = f"h{i}"
        a = o.layer_norm(rng, h, f"{p}.ln_1", width, 1e-5)
        q, k, v = o.ops("Split", o.linear(rng, a, f"{p}.attn.c_attn", width, 3 * width), split, outputs=3, axis=2)
        h = o.op("Add", h, o.linear(rng, _attention(o, q, k, v, a, mask, heads, width), f"{p}.attn.c_proj",
                                    width, width))
        m = o.layer_norm(rng, h, f"{p}.ln_2", width, 1e-5)
        ff = o.linear(rng, _tanh_gelu(o, o.linear(rng, m, f"{p}.mlp.c_fc", width, 4 * width)), f"{p}.mlp.c_proj",
                      4 * width, width)
        h = o.op("Add", h, ff)
    out = o.layer_norm(rng, h, "ln_f", width, 1e-5, out="last_hidden_state")
    summary = (f"GPT-2-style decoder, {layers} pre-LN layers, width {width}, {heads} heads, FFN {4 * width}, "
               "tanh GELU, causal mask")
    return DynamicModel("decoder", summary, o.finish_dynamic((ids,), out, width), (ids,), out, width)


def build_models(width: int = WIDTH) -> list[DynamicModel]:
    return [build_encoder(width), build_decoder(width)]


