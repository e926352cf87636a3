"""The Attention op (opset 23): against onnxruntime where it has a kernel, and the
pieces ONNX's node tests leave implicit (the report's fused attention, refusals)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnxruntime as ort
from onnx import helper
from test_onnx_support import check_against_ort, make_model, vi

import rlx_core
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

RNG = np.random.default_rng(9)


def attention(feeds: dict[str, np.ndarray], opset: int = 23, **attrs: Any) -> tuple[Any, dict]:
    names = [n for n in ("Q", "K", "V", "attn_mask") if n in feeds]
    node = helper.make_node("Attention", names, ["y"], **attrs)
    model = make_model([node], [vi(k, v.dtype.name, v.shape) for k, v in feeds.items()],
                       [helper.make_empty_tensor_value_info("y")], [], opset=opset)
    return model, feeds


def r(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CASES = {
    "4-D causal": ({"Q": r(2, 4, 6, 8), "K": r(2, 4, 6, 8), "V": r(2, 4, 6, 8)}, {"is_causal": 1}),
    "3-D grouped-query, bool mask": ({"Q": r(1, 5, 32), "K": r(1, 7, 16), "V": r(1, 7, 16),
                                      "attn_mask": RNG.random((5, 7)) > 0.3},
                                     {"q_num_heads": 4, "kv_num_heads": 2}),
    "4-D float mask, scale, softcap": ({"Q": r(1, 2, 3, 4), "K": r(1, 2, 5, 4), "V": r(1, 2, 5, 4),
                                        "attn_mask": r(3, 5)}, {"scale": 0.3, "softcap": 2.0}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_onnxruntime(case: str) -> None:
    feeds, attrs = CASES[case]
    model, feeds = attention(dict(feeds), **attrs)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # an onnxruntime without an Attention-23 kernel
        pytest.skip(f"onnxruntime cannot run Attention-23 here: {str(exc)[:120]}")
    check_against_ort(model, feeds, rtol=1e-5, atol=1e-5)


def test_a_fully_masked_row_is_zero_not_nan() -> None:
    mask = np.ones((3, 4), bool)
    mask[1] = False  # query 1 sees no key
    model, feeds = attention({"Q": r(1, 1, 3, 2), "K": r(1, 1, 4, 2), "V": r(1, 1, 4, 2), "attn_mask": mask})
    y = rlx_core.compile(rlx_onnx.load(model), device="cpu").run(feeds)[0]
    assert np.all(np.isfinite(y)) and np.all(y[0, 0, 1] == 0) and np.any(y[0, 0, 0] != 0)


def test_attention_refusals_name_the_problem() -> None:
    model, _ = attention({"Q": r(1, 5, 32), "K": r(1, 7, 16), "V": r(1, 7, 16)})
    with pytest.raises(ModelError, match="3-D inputs need q_num_heads and kv_num_heads"):
        rlx_onnx.load(model)
    model, _ = attention({"Q": r(1, 3, 2, 4), "K": r(1, 2, 2, 4), "V": r(1, 2, 2, 4)})
    with pytest.raises(ModelError, match="3 query heads cannot share 2 key/value heads"):
        rlx_onnx.load(model)
