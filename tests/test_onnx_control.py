"""If, Loop and Scan, converted at import into plain ops (``rlx_core/onnx/_ops_control.py``),
against onnxruntime; what cannot be unrolled is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx
from onnx import TensorProto, helper
from test_onnx_support import check_against_ort, init, make_model, vi

from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError
from rlx_core.onnx._ops_control import MAX_UNROLL

RNG = np.random.default_rng(9)
F = TensorProto.FLOAT


def _branch(name: str, op: str, out: str) -> object:
    """A branch reading ``x`` and ``w`` from the enclosing graph (implicit inputs)."""
    return helper.make_graph([helper.make_node(op, ["x", "w"], [out])], name, [],
                             [helper.make_tensor_value_info(out, F, [2, 3])])


def _if_model(cond_node: object, extra_inputs: list) -> object:
    node = helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "Add", "a"),
                            else_branch=_branch("else", "Mul", "b"))
    return make_model([helper.make_node("Relu", ["x0"], ["x"]), cond_node, node],
                      [vi("x0", "float32", [2, 3]), *extra_inputs], [vi("y", "float32", None)],
                      [init("w", np.full((2, 3), 3.0, np.float32))])


def test_if_on_a_shape_check_folds_to_its_branch() -> None:
    """cond = (Size(x) == 6): known at import, so only the then branch is converted."""
    cond = helper.make_node("Equal", ["six", "n"], ["c"])
    model = _if_model(cond, [])
    model.graph.node.insert(1, helper.make_node("Size", ["x"], ["n"]))
    model.graph.initializer.append(init("six", np.array(6, np.int64)))
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    graph = check_against_ort(model, {"x0": x})
    assert "mul" not in {n.op for n in graph.nodes}  # the else branch was never built


def test_if_on_an_input_is_built_per_value() -> None:
    model = _if_model(helper.make_node("Identity", ["flag"], ["c"]), [vi("flag", "bool", [])])
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    for flag in (True, False):
        check_against_ort(model, {"x0": x, "flag": np.array(flag)})


def _loop_body(with_exit: bool) -> object:
    """s += x * i; scan out s; the condition: stays true (a for loop) or s.sum() < 20."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F),
             helper.make_node("Mul", ["x", "fi"], ["xi"]),
             helper.make_node("Add", ["s_in", "xi"], ["s_out"]),
             helper.make_node("Identity", ["s_out"], ["scan"])]
    if with_exit:
        nodes += [helper.make_node("ReduceSum", ["s_out"], ["tot"], keepdims=0),
                  helper.make_node("Less", ["tot", "twenty"], ["c_out"])]
    else:
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", 9, []),
         helper.make_tensor_value_info("s_in", F, [3])],
        [helper.make_tensor_value_info("c_out", 9, []), helper.make_tensor_value_info("s_out", F, [3]),
         helper.make_tensor_value_info("scan", F, [3])],
        [init("twenty", np.array(20.0, np.float32))] if with_exit else [])


def test_a_for_loop_is_unrolled() -> None:
    node = helper.make_node("Loop", ["M", "cond", "s0"], ["s", "scans"], body=_loop_body(False))
    model = make_model([node], [vi("x", "float32", [3])], [vi("s", "float32", None), vi("scans", "float32", None)],
                       [init("M", np.array(5, np.int64)), init("cond", np.array(True)),
                        init("s0", np.zeros(3, np.float32))], opset=16)
    graph = check_against_ort(model, {"x": RNG.standard_normal(3).astype(np.float32)})
    assert graph.output_names() == ["s", "scans"]


def test_a_loop_that_exits_on_data_runs_from_the_host() -> None:
    """Its condition is computed from data: the body is compiled once and run per
    iteration from the host (``ir.staged.LoopStep``), scan outputs stacked."""
    node = helper.make_node("Loop", ["M", "", "s0"], ["s", "scans"], body=_loop_body(True))
    model = make_model([node], [vi("x", "float32", [3])], [vi("s", "float32", None), vi("scans", "float32", None)],
                       [init("M", np.array(5, np.int64)), init("s0", np.zeros(3, np.float32))], opset=16)
    graph = rlx_onnx.load(model)
    assert "Loop" in graph.summary()
    for x in (np.ones(3, np.float32), np.full(3, 4.0, np.float32), np.zeros(3, np.float32)):
        check_against_ort(model, {"x": x})


def test_a_loop_longer_than_the_unroll_limit_runs_from_the_host() -> None:
    node = helper.make_node("Loop", ["M", "cond", "s0"], ["s", "scans"], body=_loop_body(False))
    model = make_model([node], [vi("x", "float32", [3])], [vi("s", "float32", None), vi("scans", "float32", None)],
                       [init("M", np.array(MAX_UNROLL + 76, np.int64)), init("cond", np.array(True)),
                        init("s0", np.zeros(3, np.float32))], opset=16)
    check_against_ort(model, {"x": RNG.standard_normal(3).astype(np.float32)}, rtol=1e-4)


def _scan_node(width: int, factor: str, in_dir: int, out_dir: int, out_axis: int) -> onnx.NodeProto:
    """A Scan over the columns of ``xs`` (width rows) carrying ``acc = acc + row`` and
    stacking ``y = acc * factor`` (``row``, or a tensor of the enclosing graph)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "row"], ["acc_out"]), helper.make_node("Mul", ["acc_out", factor], ["y"])],
        "body", [helper.make_tensor_value_info("acc", F, [width]), helper.make_tensor_value_info("row", F, [width])],
        [helper.make_tensor_value_info("acc_out", F, [width]), helper.make_tensor_value_info("y", F, [width])])
    return helper.make_node("Scan", ["init", "xs"], ["final", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[in_dir], scan_output_axes=[out_axis],
                            scan_output_directions=[out_dir])


@pytest.mark.parametrize(("in_dir", "out_dir", "out_axis"), [(0, 0, 0), (1, 0, 0), (0, 1, 1), (1, 1, -1)])
def test_scan_carries_states_and_stacks_outputs(in_dir: int, out_dir: int, out_axis: int) -> None:
    node = _scan_node(4, "row", in_dir, out_dir, out_axis)
    model = make_model([node], [vi("init", "float32", [4]), vi("xs", "float32", [4, 5])],
                       [vi("final", "float32", None), vi("ys", "float32", None)], opset=16)
    check_against_ort(model, {"init": RNG.standard_normal(4).astype(np.float32),
                              "xs": RNG.standard_normal((4, 5)).astype(np.float32)})


def test_a_subgraph_with_an_unsupported_op_names_it() -> None:
    bad = helper.make_graph([helper.make_node("TfIdfVectorizer", ["x"], ["u"])], "then", [],
                            [helper.make_tensor_value_info("u", F, None)])
    ok = helper.make_graph([helper.make_node("Identity", ["x"], ["v"])], "else", [],
                           [helper.make_tensor_value_info("v", F, None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=bad, else_branch=ok)
    model = make_model([node], [vi("x", "float32", [3])], [vi("y", "float32", None)], [init("c", np.array(True))])
    with pytest.raises(ModelError, match=r"then_branch 'then' of node #0 \(If\).*unsupported ONNX op: TfIdfVectorizer"):
        rlx_onnx.load(model)


def test_a_torchscript_export_with_a_loop_over_a_dynamic_dim_and_a_shape_check() -> None:
    """``tests/data/loop_if_torchscript.onnx``: torch 2.14's TorchScript exporter (opset 17,
    ``dynamic_axes={"x": {0: "n"}}``) of::

        class LoopIf(torch.nn.Module):  # self.lin = torch.nn.Linear(8, 8)
            def forward(self, x):
                h = x
                for i in range(x.shape[0]):  # a Loop whose trip count is the dynamic dim
                    h = torch.relu(self.lin(h)) + i
                if x.shape[1] > 4:  # an If on a shape
                    h = h * 2
                else:
                    h = h - 1
                return h

    loaded without dims, it is unrolled per size and matches onnxruntime at each."""
    model = onnx.load(Path(__file__).parent / "data" / "loop_if_torchscript.onnx")
    assert rlx_onnx.load(model).symbols == ("n",)
    for n in (1, 3, 7):
        check_against_ort(model, {"x": RNG.standard_normal((n, 8)).astype(np.float32)})


@pytest.mark.parametrize(("in_dir", "out_dir", "out_axis"), [(0, 0, 0), (1, 1, -1)])
def test_a_scan_longer_than_the_unroll_limit_runs_from_the_host(in_dir: int, out_dir: int, out_axis: int) -> None:
    """1,100 steps: the body is compiled once and run per step from the host."""
    node = _scan_node(2, "w", in_dir, out_dir, out_axis)
    steps = MAX_UNROLL + 76
    model = make_model([node], [vi("init", "float32", [2]), vi("xs", "float32", [2, steps])],
                       [vi("final", "float32", None), vi("ys", "float32", None)],
                       [init("w", np.array([0.5, -1.0], np.float32))], opset=16)
    assert "Scan" in rlx_onnx.load(model).summary()
    check_against_ort(model, {"init": RNG.standard_normal(2).astype(np.float32),
                              "xs": RNG.standard_normal((2, steps)).astype(np.float32) * 0.01}, rtol=1e-4, atol=1e-5)
