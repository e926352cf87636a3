"""Helpers for the ONNX tests: small models made with ``onnx.helper``, checked against ONNX Runtime.

Every model in these tests is built in the test itself (no model files in git) and every
numerical check compares rlx's cpu backend with onnxruntime on the same inputs. The one
test here checks that the importer covers the op list the project promises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import rlx_core
from rlx_core import onnx as rlx_onnx

_ELEM = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "float64": TensorProto.DOUBLE,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "bool": TensorProto.BOOL,
    "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8,
    "int16": TensorProto.INT16,
    "uint16": TensorProto.UINT16,
    "uint32": TensorProto.UINT32,
    "uint64": TensorProto.UINT64,
}

#: The ops the project promises to import (the issue's list).
PROMISED_OPS = """Gemm MatMul Add Sub Mul Div Pow Neg Abs Exp Log Sqrt Reciprocal Erf Tanh Sigmoid Relu LeakyRelu
Gelu HardSigmoid Clip Max Min Where Equal Less Greater Not Softmax LogSoftmax LayerNormalization BatchNormalization
ReduceMean ReduceSum ReduceMax Reshape Transpose Flatten Squeeze Unsqueeze Concat Split Slice Gather Expand Cast
Identity Dropout Constant ConstantOfShape Shape Size Range Conv MaxPool AveragePool GlobalAveragePool""".split()


def vi(name: str, dtype: str, shape: Sequence[int | str] | None) -> Any:
    """A graph input or output declaration (``shape=None``: unknown, allowed for outputs)."""
    return helper.make_tensor_value_info(name, _ELEM[dtype], None if shape is None else list(shape))


def init(name: str, array: Any) -> Any:
    return numpy_helper.from_array(np.asarray(array), name)


def make_model(nodes: Sequence[Any], inputs: Sequence[Any], outputs: Sequence[Any], initializers: Sequence[Any] = (),
               opset: int = 17, name: str = "m") -> Any:
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 8)  # what the installed onnxruntime reads
    return model


def ort_run(model: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # the test machine's cores are shared
    options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # an onnxruntime older than the model's IR or opset: no peer
        if "IR version" in str(exc) or "under development" in str(exc):
            pytest.skip(f"onnxruntime {ort.__version__} cannot load this model: {str(exc).splitlines()[0][-160:]}")
        raise
    return session.run(None, dict(feeds))


def check_against_ort(model: Any, feeds: Mapping[str, np.ndarray], *, dims: Mapping[str, int] | None = None,
                      rtol: float = 1e-5, atol: float = 1e-5) -> rlx_core.Graph:
    """Import ``model``, run it on rlx's cpu backend and on onnxruntime, and compare."""
    graph = rlx_onnx.load(model, dims=dims)
    got = rlx_core.compile(graph, device="cpu").run(dict(feeds))
    want = ort_run(model, feeds)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"output {i}: shape {g.shape} != onnxruntime's {w.shape}"
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype} != onnxruntime's {w.dtype}"
        if g.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"output {i}")
    return graph


def rand(rng: np.random.Generator, *shape: int, dtype: str = "float32", lo: float = -1.0,
         hi: float = 1.0) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def test_every_promised_op_has_a_converter() -> None:
    missing = sorted(set(PROMISED_OPS) - set(rlx_onnx.supported_ops()))
    assert not missing, f"no converter for {missing}"
