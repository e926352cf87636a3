"""The benchmark suite's models: ONNX files written with ``onnx.helper``, deterministically.

Each model is built from a size preset and a fixed seed, so two runs (or two machines)
time exactly the same bytes on exactly the same inputs. A build gives a ``SuiteModel``:
the serialized ONNX model (what ONNX Runtime runs and ``rlx_core.onnx.load`` imports),
its inputs and weights by name, and the same math written by hand twice, once with plain
numpy calls and once for ``jax.jit`` (``bench/_numpy_models.py``, ``bench/_jax_models.py``).

The graphs are written the way exporters write them (torch's ``nn.Linear`` as ``Gemm``
with ``transB=1`` or ``MatMul`` + ``Add``, attention heads split with ``Reshape`` and
``Transpose``, gelu as ``x * 0.5 * (1 + erf(x / sqrt 2))``), because that is what users
feed a runtime, not the tidy graph one would build with the rlx builder.

Sizes: ``full`` is what the brief of the suite names (and what BENCHMARKS.md reports),
``quick`` is smaller for a check that the harness runs end to end, ``tiny`` is for the
test suite (milliseconds per model).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from rlx_core.errors import ConfigError
from rlx_core.run.verify import SUITE, SUITE_SIZES

from . import _jax_models, _numpy_models

__all__ = ["MODEL_NAMES", "SIZES", "SuiteModel", "build", "build_many"]

#: The default-domain opset the models declare (LayerNormalization needs 17).
OPSET = 17
SEED = 20240601

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class SuiteModel:
    """One model of the suite, ready for every contender."""

    name: str
    size: str
    summary: str
    onnx: bytes
    inputs: Arrays
    weights: Arrays
    #: ``(weights, inputs) -> ndarray``; float32 in, float32 out; float64 in, float64 out.
    numpy_fn: Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], np.ndarray]
    #: ``(weights, inputs) -> jax array``, traced by ``jax.jit`` (weights are arguments, not constants).
    jax_fn: Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
    output: str = "y"
    params: dict[str, int] = field(default_factory=dict)

    def reference64(self) -> np.ndarray:
        """The hand-written numpy math in float64: the yardstick for every tolerance."""
        w64 = {k: v.astype(np.float64) for k, v in self.weights.items()}
        x64 = {k: v.astype(np.float64) for k, v in self.inputs.items()}
        return np.asarray(self.numpy_fn(w64, x64), dtype=np.float64)


class _OnnxWriter:
    """Accumulates nodes and initializers; names intermediate values ``t0, t1, ...``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0

    def init(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(value), name=name))
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        if out is None:
            out, self._count = f"t{self._count}", self._count + 1
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def finish(self, inputs: Arrays, output: str, out_shape: tuple[int, ...]) -> bytes:
        import onnx
        from onnx import TensorProto, helper

        ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in inputs.items()]
        outs = [helper.make_tensor_value_info(output, TensorProto.FLOAT, list(out_shape))]
        graph = helper.make_graph(self.nodes, self.name, ins, outs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="rlx-bench")
        model.ir_version = 8  # what onnxruntime releases of the last years all read
        onnx.checker.check_model(model, full_check=True)
        return model.SerializeToString()


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """torch's default init for Linear/Conv: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), so activations stay O(1)."""
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------- the models
def _mlp(size: str, batch: int, dims: tuple[int, ...]) -> SuiteModel:
    rng = np.random.default_rng(SEED + 1)
    o = _OnnxWriter("mlp")
    w: Arrays = {}
    h = "x"
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims), start=1):
        w[f"fc{i}.weight"] = _uniform(rng, (d_out, d_in), d_in)  # torch layout [out, in]
        w[f"fc{i}.bias"] = _uniform(rng, (d_out,), d_in)
        h = o.op("Gemm", h, o.init(f"fc{i}.weight", w[f"fc{i}.weight"]), o.init(f"fc{i}.bias", w[f"fc{i}.bias"]),
                 transB=1)
        h = o.op("Relu", h) if i < len(dims) - 1 else h
    o.op("Softmax", h, out="y", axis=-1)
    x = {"x": _normal(rng, (batch, dims[0]))}
    arch = "-".join(map(str, dims))
    return SuiteModel("mlp", size, f"MLP {arch}, batch {batch} (Gemm, Relu, Softmax)",
                      o.finish(x, "y", (batch, dims[-1])), x, w, _numpy_models.mlp, _jax_models.mlp,
                      params={"batch": batch, "layers": len(dims) - 1})


def _transformer(size: str, seq: int, d: int, heads: int, ff: int) -> SuiteModel:
    """A post-LN BERT encoder layer, batch 1, as torch.onnx exports it (opset 17)."""
    rng = np.random.default_rng(SEED + 2)
    o = _OnnxWriter("encoder_layer")
    dh = d // heads
    w: Arrays = {}
    for name, d_in, d_out in (("q", d, d), ("k", d, d), ("v", d, d), ("o", d, d), ("ff1", d, ff), ("ff2", ff, d)):
        w[f"{name}.weight"] = _uniform(rng, (d_in, d_out), d_in)  # MatMul layout [in, out], as exported
        w[f"{name}.bias"] = _uniform(rng, (d_out,), d_in)
    for ln in ("ln1", "ln2"):
        w[f"{ln}.scale"] = rng.uniform(0.8, 1.2, d).astype(np.float32)
        w[f"{ln}.bias"] = rng.uniform(-0.1, 0.1, d).astype(np.float32)
    for k, v in w.items():
        o.init(k, v)
    split = o.init("split_heads_shape", np.array([1, seq, heads, dh], np.int64))
    merge = o.init("merge_heads_shape", np.array([1, seq, d], np.int64))
    sqrt_dh = o.init("sqrt_head_dim", np.array(math.sqrt(dh), np.float32))
    sqrt2, one, half = (o.init(n, np.array(v, np.float32)) for n, v in (("sqrt2", math.sqrt(2)), ("one", 1.0),
                                                                         ("half", 0.5)))

    def linear(x: str, name: str) -> str:
        return o.op("Add", o.op("MatMul", x, f"{name}.weight"), f"{name}.bias")

    def heads_of(name: str, perm: list[int]) -> str:
        return o.op("Transpose", o.op("Reshape", linear("x", name), split), perm=perm)

    q, kt, v = heads_of("q", [0, 2, 1, 3]), heads_of("k", [0, 2, 3, 1]), heads_of("v", [0, 2, 1, 3])
    probs = o.op("Softmax", o.op("Div", o.op("MatMul", q, kt), sqrt_dh), axis=-1)
    ctx = o.op("Reshape", o.op("Transpose", o.op("MatMul", probs, v), perm=[0, 2, 1, 3]), merge)
    h1 = o.op("LayerNormalization", o.op("Add", "x", linear(ctx, "o")), "ln1.scale", "ln1.bias", axis=-1,
              epsilon=1e-5)
    f = linear(h1, "ff1")
    gelu = o.op("Mul", o.op("Mul", f, o.op("Add", o.op("Erf", o.op("Div", f, sqrt2)), one)), half)
    o.op("LayerNormalization", o.op("Add", h1, linear(gelu, "ff2")), "ln2.scale", "ln2.bias", out="y", axis=-1,
         epsilon=1e-5)
    x = {"x": _normal(rng, (1, seq, d))}
    summary = (f"Transformer encoder layer, d={d}, {heads} heads, ff {ff}, seq {seq} "
               "(MatMul, Softmax, LayerNorm, erf gelu)")
    return SuiteModel("transformer", size, summary, o.finish(x, "y", (1, seq, d)), x, w,
                      partial(_numpy_models.transformer, heads=heads), partial(_jax_models.transformer, heads=heads),
                      params={"seq": seq, "d": d, "heads": heads, "ff": ff})


def _elementwise(size: str, rows: int, cols: int) -> SuiteModel:
    """15 elementwise ops, a broadcast bias, tanh and sigmoid; every step well conditioned
    (no cancellation before sqrt or log), so float32 results stay close to float64."""
    rng = np.random.default_rng(SEED + 3)
    o = _OnnxWriter("elementwise")
    w = {"bias": rng.uniform(-0.5, 0.5, cols).astype(np.float32),
         "gamma": rng.uniform(0.5, 1.5, cols).astype(np.float32),
         "beta": rng.uniform(-1.5, -0.5, cols).astype(np.float32),
         "half": np.array(0.5, np.float32), "floor": np.array(0.25, np.float32)}
    for k, v in w.items():
        o.init(k, v)
    t1 = o.op("Add", "x", "bias")  # 1
    t4 = o.op("Add", o.op("Tanh", o.op("Mul", t1, "half")), "x")  # 2 3 4
    t7 = o.op("Sub", o.op("Mul", o.op("Sigmoid", t4), "gamma"), "beta")  # 5 6 7 (> 0.5: beta < -0.5)
    t11 = o.op("Exp", o.op("Neg", o.op("Sqrt", o.op("Abs", t7))))  # 8 9 10 11
    t14 = o.op("Div", o.op("Log", o.op("Max", t11, "floor")), "gamma")  # 12 13 14
    o.op("Add", t14, t4, out="y")  # 15
    x = {"x": _normal(rng, (rows, cols))}
    return SuiteModel("elementwise", size, f"15-op elementwise chain on {rows}x{cols} (broadcast bias, tanh, sigmoid)",
                      o.finish(x, "y", (rows, cols)), x, w, _numpy_models.elementwise, _jax_models.elementwise,
                      params={"rows": rows, "cols": cols, "ops": len(o.nodes)})


def _cnn(size: str, hw: int, c1: int, c2: int, classes: int = 10) -> SuiteModel:
    """Conv-Relu-MaxPool, Conv-Relu-AveragePool, Flatten, Gemm on a 1x3xHxW image."""
    rng = np.random.default_rng(SEED + 4)
    o = _OnnxWriter("cnn")
    flat = c2 * (hw // 4) ** 2
    w = {"conv1.weight": _uniform(rng, (c1, 3, 3, 3), 27), "conv1.bias": _uniform(rng, (c1,), 27),
         "conv2.weight": _uniform(rng, (c2, c1, 3, 3), 9 * c1), "conv2.bias": _uniform(rng, (c2,), 9 * c1),
         "fc.weight": _uniform(rng, (classes, flat), flat), "fc.bias": _uniform(rng, (classes,), flat)}
    for k, v in w.items():
        o.init(k, v)
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    pool = dict(kernel_shape=[2, 2], strides=[2, 2])
    h = o.op("MaxPool", o.op("Relu", o.op("Conv", "x", "conv1.weight", "conv1.bias", **conv)), **pool)
    h = o.op("AveragePool", o.op("Relu", o.op("Conv", h, "conv2.weight", "conv2.bias", **conv)), **pool)
    o.op("Gemm", o.op("Flatten", h, axis=1), "fc.weight", "fc.bias", out="y", transB=1)
    x = {"x": _normal(rng, (1, 3, hw, hw))}
    return SuiteModel("cnn", size, f"CNN 1x3x{hw}x{hw}: 2 Conv 3x3 ({c1}, {c2} ch) + Relu + pools, Gemm",
                      o.finish(x, "y", (1, classes)), x, w, _numpy_models.cnn, _jax_models.cnn,
                      params={"hw": hw, "c1": c1, "c2": c2})


def _matmul(size: str, n: int) -> SuiteModel:
    rng = np.random.default_rng(SEED + 5)
    o = _OnnxWriter("matmul")
    o.op("MatMul", "a", "b", out="y")
    x = {"a": _normal(rng, (n, n)), "b": _normal(rng, (n, n))}
    return SuiteModel("matmul", size, f"MatMul {n}x{n} @ {n}x{n} (float32)", o.finish(x, "y", (n, n)), x, {},
                      _numpy_models.matmul, _jax_models.matmul, params={"n": n})


_BUILDERS: dict[str, Callable[..., SuiteModel]] = {
    "mlp": _mlp, "transformer": _transformer, "elementwise": _elementwise, "cnn": _cnn, "matmul": _matmul,
}

#: model -> size preset -> builder arguments; ``full`` is rlx verify's suite table, so that
#: the two measure the same models.
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "mlp": {"full": SUITE_SIZES["mlp"], "quick": {"batch": 64, "dims": (784, 128, 64, 10)},
            "tiny": {"batch": 4, "dims": (32, 16, 8, 10)}},
    "transformer": {"full": SUITE_SIZES["transformer"], "quick": {"seq": 64, "d": 128, "heads": 4, "ff": 512},
                    "tiny": {"seq": 8, "d": 16, "heads": 2, "ff": 32}},
    "elementwise": {"full": SUITE_SIZES["elementwise"], "quick": {"rows": 256, "cols": 256},
                    "tiny": {"rows": 8, "cols": 16}},
    "cnn": {"full": SUITE_SIZES["cnn"], "quick": {"hw": 32, "c1": 16, "c2": 32}, "tiny": {"hw": 8, "c1": 4, "c2": 8}},
    "matmul": {"full": SUITE_SIZES["matmul"], "quick": {"n": 512}, "tiny": {"n": 32}},
}

MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)
if set(MODEL_NAMES) != set(SUITE) or set(SIZES) != set(SUITE):  # one suite, written twice: kept in step
    raise ImportError(f"bench/models.py's models {sorted(MODEL_NAMES)} are not rlx verify's {sorted(SUITE)}")


def build(name: str, size: str = "full") -> SuiteModel:
    """Build one model of the suite; ``ConfigError`` names an unknown model or size."""
    if name not in _BUILDERS:
        raise ConfigError(f"unknown benchmark model {name!r}; known: {', '.join(MODEL_NAMES)}")
    if size not in SIZES[name]:
        raise ConfigError(f"unknown size {size!r} for benchmark model {name!r}; known: {', '.join(SIZES[name])}")
    return _BUILDERS[name](size, **SIZES[name][size])


def build_many(names: list[str] | tuple[str, ...], size: str = "full") -> list[SuiteModel]:
    """Build several models, all names checked first (a typo fails before any work)."""
    for name in names:
        if name not in _BUILDERS:
            raise ConfigError(f"unknown benchmark model {name!r}; known: {', '.join(MODEL_NAMES)}")
    return [build(name, size) for name in names]
