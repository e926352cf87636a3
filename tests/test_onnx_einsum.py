"""Einsum against onnxruntime: transposes, sums, diagonals, outer and inner products,
batched and ellipsis matmuls, implicit outputs and three operands."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, make_model, vi

from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

RNG = np.random.default_rng(5)


def r(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CASES = {
    "ij->ji": [r(3, 4)],
    "ij->i": [r(3, 4)],
    "ii->i": [r(4, 4)],
    "ii": [r(4, 4)],  # implicit: the trace
    "i,j->ij (rotary tables)": [r(5), r(3)],
    "i,i": [r(6), r(6)],
    "bij,bjk->bik": [r(2, 3, 4), r(2, 4, 5)],
    "bhqd,bhkd->bhqk (attention scores)": [r(2, 3, 4, 8), r(2, 3, 5, 8)],
    "...ij,...jk": [r(2, 3, 4), r(2, 4, 2)],
    "ij,jk,kl->il": [r(2, 3), r(3, 4), r(4, 2)],
    "bij->bj": [r(2, 3, 4)],
    "abc,cd->abd": [r(2, 3, 4), r(4, 5)],
}


@pytest.mark.parametrize("equation", list(CASES))
def test_einsum_matches_onnxruntime(equation: str) -> None:
    operands = CASES[equation]
    eq = equation.split(" (")[0]
    names = [f"x{i}" for i in range(len(operands))]
    node = helper.make_node("Einsum", names, ["y"], equation=eq)
    model = make_model([node], [vi(n, "float32", a.shape) for n, a in zip(names, operands)],
                       [helper.make_empty_tensor_value_info("y")], [], opset=17)
    check_against_ort(model, dict(zip(names, operands)), rtol=1e-5, atol=1e-5)


def test_einsum_refusals_name_the_problem() -> None:
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik")
    model = make_model([node], [vi("a", "float32", (2, 3)), vi("b", "float32", (4, 5))],
                       [helper.make_empty_tensor_value_info("y")], [], opset=17)
    with pytest.raises(ModelError, match="letter 'j' is 3 in one operand and 4 in the other"):
        rlx_onnx.load(model)
