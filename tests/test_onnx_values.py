"""Run-time shape inputs: models whose shapes depend on the values of small inputs.

Such a model loads as a ``ValueDependentGraph`` (``rlx_core/ir/valued.py``): it is built,
placed and compiled at its first run, and again for each new set of those values, kept
in an LRU. ``load(values=...)`` binds them at load instead. Every answer is checked
against onnxruntime or numpy; every bad value is an error naming the input.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, vi

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import GraphError, InputError, ModelError
from rlx_core.ir.specialize import representative
from rlx_core.ir.valued import MAX_VALUE_ELEMENTS, ValueDependentGraph


def _reshape_model(x_shape: list, shape_len: int = 2) -> object:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["t"], name="reshape"), helper.make_node("Relu", ["t"], ["y"])]
    return make_model(nodes, [vi("x", "float32", x_shape), vi("shape", "int64", [shape_len])],
                      [vi("y", "float32", None)])


def test_a_run_time_reshape_target_is_read_at_each_run_and_kept_per_value() -> None:
    graph = rlx_onnx.load(_reshape_model([2, 3, 4]))
    assert isinstance(graph, ValueDependentGraph) and graph.value_inputs == ("shape",)
    assert graph.output_names() == ["y"]
    cg = rlx.compile(graph, device="cpu")
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    for target in ([6, 4], [4, -1], [24, 1], [6, 4]):
        (y,) = cg.run({"x": x, "shape": np.array(target)})
        np.testing.assert_array_equal(y, np.maximum(x.reshape(target), 0))
    assert cg.compiles == 3  # [6, 4] again compiled nothing
    assert cg.device == "cpu"
    notes = "\n".join(cg.report().notes)
    assert "values shape=[6, 4]: built and compiled" in notes and "shape=[4, -1]" in notes


def test_auto_places_at_the_first_run() -> None:
    cg = rlx.compile(rlx_onnx.load(_reshape_model([2, 6])))
    assert cg.device == "auto" and "not compiled yet" in cg.report().reason
    (y,) = cg.run({"x": np.ones((2, 6), np.float32), "shape": np.array([3, 4])})
    assert y.shape == (3, 4) and cg.device != "auto"


def test_symbolic_dims_and_values_together() -> None:
    graph = rlx_onnx.load(_reshape_model(["n", 6]))
    assert graph.symbols == ("n",)
    cg = rlx.compile(graph, device="cpu")
    for n, target in ((2, [3, 4]), (3, [9, 2]), (3, [2, 9])):
        x = np.arange(n * 6, dtype=np.float32).reshape(n, 6) - 5
        np.testing.assert_array_equal(cg.run({"x": x, "shape": np.array(target)})[0], np.maximum(x.reshape(target), 0))
    assert sorted(s["n"] for s in cg.shapes()) == [2, 3, 3]


def test_values_at_load_give_a_static_graph_without_that_input() -> None:
    graph = rlx_onnx.load(_reshape_model([2, 6]), values={"shape": [4, 3]})
    assert not graph.is_symbolic and [graph.node(i).name for i in graph.inputs] == ["x"]
    (y,) = rlx.compile(graph, device="cpu").run({"x": np.full((2, 6), -1.0, np.float32)})
    assert y.shape == (4, 3)
    with pytest.raises(ModelError, match=r"values names 'nope'"):
        rlx_onnx.load(_reshape_model([2, 6]), values={"nope": [1]})
    with pytest.raises(ModelError, match=r"values\['shape'\] has rank 2"):
        rlx_onnx.load(_reshape_model([2, 6]), values={"shape": [[4, 3]]})
    with pytest.raises(ModelError, match=r"values\['shape'\] is 3 long on axis 0, where the model .*fixes 2"):
        rlx_onnx.load(_reshape_model([2, 6]), values={"shape": [4, 3, 1]})
    with pytest.raises(ModelError, match=r"not exactly representable as int64"):
        rlx_onnx.load(_reshape_model([2, 6]), values={"shape": [4.5, 3]})


def test_a_value_computed_from_inputs_follows_them_but_not_through_shape() -> None:
    """TopK's k = kk + 1 (an input, then an op); Shape(x) only reads x's shape, so x is
    not a value input."""
    nodes = [helper.make_node("Add", ["kk", "one"], ["k"]),
             helper.make_node("Shape", ["x"], ["sx"]),
             helper.make_node("Slice", ["sx", "zero", "one"], ["n"]),
             helper.make_node("Min", ["k", "n"], ["k2"]),
             helper.make_node("TopK", ["x", "k2"], ["v", "i"])]
    model = make_model(nodes, [vi("x", "float32", [6]), vi("kk", "int64", [1])],
                       [vi("v", "float32", None), vi("i", "int64", None)],
                       [init("one", np.array([1], np.int64)), init("zero", np.array([0], np.int64))])
    graph = rlx_onnx.load(model)
    assert graph.value_inputs == ("kk",)
    x = np.array([3, 1, 4, 1, 5, 9], np.float32)
    for kk in (0, 2, 7):
        check_against_ort(model, {"x": x, "kk": np.array([kk], np.int64)})


def test_value_inputs_found_only_once_the_first_are_known() -> None:
    """Reshape needs ``s1``; only with it converted does Expand reveal it needs ``s2``. A
    second value of ``s2`` must build again, not reuse the graph built for the first."""
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["t"]), helper.make_node("Expand", ["t", "s2"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", [3]), vi("s1", "int64", [2]), vi("s2", "int64", [2])],
                       [vi("y", "float32", None)])
    graph = rlx_onnx.load(model)
    assert graph.value_inputs == ("s1",)
    cg = rlx.compile(graph, device="cpu")
    x = np.arange(3, dtype=np.float32)
    (y,) = cg.run({"x": x, "s1": np.array([3, 1]), "s2": np.array([3, 2])})
    np.testing.assert_array_equal(y, np.broadcast_to(x.reshape(3, 1), (3, 2)))
    assert graph.value_inputs == ("s1", "s2")
    (y,) = cg.run({"x": x, "s1": np.array([3, 1]), "s2": np.array([3, 4])})
    np.testing.assert_array_equal(y, np.broadcast_to(x.reshape(3, 1), (3, 4)))


def test_run_time_axes_pads_sizes_and_counts_against_onnxruntime() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    reduce_ = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                         [vi("x", "float32", [2, 3, 4]), vi("axes", "int64", [1])], [vi("y", "float32", None)])
    for axis in (0, 2, -2):
        check_against_ort(reduce_, {"x": x, "axes": np.array([axis], np.int64)})
    pad = make_model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")],
                     [vi("x", "float32", [2, 3, 4]), vi("pads", "int64", [6])], [vi("y", "float32", None)])
    check_against_ort(pad, {"x": x, "pads": np.array([0, 1, 2, 0, 2, 1], np.int64)})
    resize = make_model([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear")],
                        [vi("x", "float32", [1, 2, 3, 4]), vi("sizes", "int64", [4])], [vi("y", "float32", None)])
    for sizes in ([1, 2, 6, 8], [1, 2, 2, 3]):
        check_against_ort(resize, {"x": x.reshape(1, 2, 3, 4), "sizes": np.array(sizes, np.int64)})
    rng_model = make_model([helper.make_node("Range", ["a", "b", "d"], ["y"])],
                           [vi("a", "float32", []), vi("b", "float32", []), vi("d", "float32", [])],
                           [vi("y", "float32", None)])
    check_against_ort(rng_model, {"a": np.array(1.0, np.float32), "b": np.array(4.5, np.float32),
                                  "d": np.array(0.5, np.float32)})


def test_bad_values_are_input_errors_naming_the_input() -> None:
    cg = rlx.compile(rlx_onnx.load(_reshape_model([2, 6])), device="cpu")
    x = np.ones((2, 6), np.float32)
    with pytest.raises(InputError, match=r"cannot be built for shape=\[5, 4\].*node 'reshape'.*cannot reshape"):
        cg.run({"x": x, "shape": np.array([5, 4])})
    with pytest.raises(InputError, match=r"input 'shape': got float64 values \[3.5, 4.0\]"):
        cg.run({"x": x, "shape": np.array([3.5, 4.0])})
    with pytest.raises(InputError, match=r"missing input\(s\) 'shape'"):
        cg.run({"x": x})
    with pytest.raises(InputError, match=r"input 'shape' dim 0: expected 2"):
        cg.run({"x": x, "shape": np.array([3, 4, 1])})
    (y,) = cg.run({"x": x, "shape": np.array([3, 4], np.int32)})  # another int dtype holding the values: fine
    assert y.shape == (3, 4)


def test_too_large_value_inputs_are_refused_by_name() -> None:
    with pytest.raises(ModelError, match=rf"from input 'shape' \({MAX_VALUE_ELEMENTS + 1} elements\)"):
        rlx_onnx.load(_reshape_model([2, 6], shape_len=MAX_VALUE_ELEMENTS + 1))
    cg = rlx.compile(rlx_onnx.load(_reshape_model([2, 6], shape_len="k")), device="cpu")  # symbolic: checked per run
    with pytest.raises(InputError, match=rf"input 'shape' holds {MAX_VALUE_ELEMENTS + 1} elements"):
        cg.run({"x": np.ones((2, 6), np.float32), "shape": np.ones(MAX_VALUE_ELEMENTS + 1, np.int64)})


def test_what_needs_a_body_says_it_waits_for_the_values() -> None:
    graph = rlx_onnx.load(_reshape_model([2, 6]))
    for call in (lambda: representative(graph), lambda: graph.specialize({}), graph.to_json,
                 lambda: graph.input("z", (1,), "float32")):
        with pytest.raises(GraphError, match=r"computes its shapes from the values of input\(s\) 'shape'"):
            call()
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    (y,) = rlx.reference.evaluate(graph, {"x": x, "shape": np.array([4, 3])})
    np.testing.assert_array_equal(y, x.reshape(4, 3))


def test_the_kept_copies_are_bounded() -> None:
    cg = rlx.compile(rlx_onnx.load(_reshape_model([2, 12])), device="cpu")
    x = np.ones((2, 12), np.float32)
    targets = [[a, 24 // a] for a in (1, 2, 3, 4, 6, 8, 12, 24)] + [[-1, 24], [1, 24]]
    for target in targets:
        cg.run({"x": x, "shape": np.array(target)})
    assert len(cg.shapes()) == 8 and cg.compiles == 10  # [1, 24] was dropped by the ninth, then built again


def test_made_up_inputs_ask_for_the_values_and_fit_the_given_shapes() -> None:
    from rlx_core.compiler.inputs import random_inputs

    graph = rlx_onnx.load(_reshape_model(["n", 6]))
    with pytest.raises(InputError, match=r"give the values of 'shape' \(--input shape=FILE.npy\)"):
        random_inputs(graph)
    made = random_inputs(graph, given={"shape": (2,), "x": (3, 6)})
    assert made["x"].shape == (3, 6) and made["x"].dtype == np.float32
