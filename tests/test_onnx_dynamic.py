"""ONNX models loaded without ``dims``: symbolic inputs, any size at run time.

The models here are written the way torch's exporters write dynamic axes: shapes
computed at run time (``Shape -> Gather -> Concat -> Reshape`` head splits, ``Range``
position ids, ``ConstantOfShape`` masks, ``Expand`` to a computed shape), then run at
several sizes against onnxruntime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import helper
from test_onnx_support import init, make_model, ort_run, vi

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import GraphError, InputError, ModelError
from rlx_core.ir.deferred import DeferredGraph
from rlx_core.onnx._dynamic import symbol_names

V, D, H, P = 50, 8, 2, 40  # vocabulary, width, heads, position table


def _encoder() -> object:
    """Token and position embeddings, a head split and merge by Shape chains, a mask of
    ones made by ConstantOfShape and expanded to the heads: the exporter's patterns."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [
        n("Gather", ["emb", "ids"], ["tok"]),
        n("Shape", ["ids"], ["ids_shape"]),
        n("Gather", ["ids_shape", "one"], ["seq"], axis=0),
        n("Gather", ["ids_shape", "zero"], ["batch"], axis=0),
        n("Range", ["zero", "seq", "one"], ["positions"]),
        n("Gather", ["pos", "positions"], ["pos_emb"]),
        n("Add", ["tok", "pos_emb"], ["x"]),
        n("MatMul", ["x", "w"], ["h"]),
        n("Unsqueeze", ["batch", "zero_axis"], ["b1"]),
        n("Unsqueeze", ["seq", "zero_axis"], ["s1"]),
        n("Concat", ["b1", "s1", "heads", "head_dim"], ["split_shape"], axis=0),
        n("Reshape", ["h", "split_shape"], ["hs"]),
        n("Transpose", ["hs"], ["ht"], perm=[0, 2, 1, 3]),
        n("ConstantOfShape", ["ids_shape"], ["ones"], value=helper.make_tensor("v", 1, [1], [1.0])),
        n("Unsqueeze", ["ones", "mask_axes"], ["mask4"]),
        n("Concat", ["b1", "heads", "s1", "s1"], ["mask_shape"], axis=0),
        n("Expand", ["mask4", "mask_shape"], ["mask"]),
        n("MatMul", ["ht", "ht_t"], ["scores"]),
        n("Mul", ["scores", "mask"], ["masked"]),
        n("Softmax", ["masked"], ["probs"], axis=-1),
        n("MatMul", ["probs", "ht"], ["ctx"]),
        n("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
        n("Concat", ["b1", "s1", "width"], ["merge_shape"], axis=0),
        n("Reshape", ["ct", "merge_shape"], ["y"]),
    ]
    # scores = ht @ ht^T per head: ht_t is ht transposed on its last two axes
    nodes.insert(nodes.index(next(x for x in nodes if x.output == ["scores"])),
                 n("Transpose", ["ht"], ["ht_t"], perm=[0, 1, 3, 2]))
    inits = [init("emb", rng.standard_normal((V, D)).astype(np.float32)),
             init("pos", rng.standard_normal((P, D)).astype(np.float32)),
             init("w", rng.standard_normal((D, D)).astype(np.float32)),
             init("zero", np.array(0, np.int64)), init("one", np.array(1, np.int64)),
             init("zero_axis", np.array([0], np.int64)), init("mask_axes", np.array([1, 2], np.int64)),
             init("heads", np.array([H], np.int64)), init("head_dim", np.array([D // H], np.int64)),
             init("width", np.array([D], np.int64))]
    return make_model(nodes, [vi("ids", "int64", ["batch", "seq"])], [vi("y", "float32", None)], inits)


def _ids(batch: int, seq: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, (batch, seq)).astype(np.int64)


def test_loads_symbolic_and_runs_any_size_like_onnxruntime() -> None:
    model = _encoder()
    g = rlx_onnx.load(model)
    assert g.is_symbolic and not isinstance(g, DeferredGraph)  # converted once, its shape chains as dims
    assert g.symbols == ("batch", "seq")
    assert [str(d) for d in g.node(g.inputs[0]).shape] == ["batch", "seq"]
    cg = rlx.compile(g, device="cpu")
    for batch, seq in [(1, 1), (2, 7), (3, 5), (2, 7)]:
        ids = _ids(batch, seq)
        got = cg.run({"ids": ids})[0]
        want = ort_run(model, {"ids": ids})[0]
        assert got.shape == want.shape == (batch, seq, D)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # two symbols: the first size run made cpu's executable for every size, and every size ran on it
    assert cg.shapes() == [] and cg.compiles == 1
    text = str(cg.report())
    assert "symbolic dims (batch, seq)" in text and "shape class batch=" not in text
    assert "any size: one executable for every size" in text and "any size: 4 run(s) of new sizes" in text


def test_reference_and_static_load_agree() -> None:
    model = _encoder()
    g = rlx_onnx.load(model)
    ids = _ids(3, 6)
    static = rlx_onnx.load(model, dims={"batch": 3, "seq": 6})
    assert not static.is_symbolic
    np.testing.assert_allclose(rlx.reference.evaluate(g, {"ids": ids})[0],
                               rlx.reference.evaluate(static, {"ids": ids})[0])


def test_a_size_the_model_cannot_take_is_an_input_error_naming_it() -> None:
    cg = rlx.compile(rlx_onnx.load(_encoder()), device="cpu")
    with pytest.raises(InputError, match=r"'pos_emb'.*index 40 is out of range"):
        cg.run({"ids": _ids(1, P + 1)})  # the position table has P rows
    rows = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="to_rows")],
                      [vi("x", "float32", ["n"])], [vi("y", "float32", None)],
                      [init("shape", np.array([-1, 4], np.int64))])
    by_rows = rlx.compile(rlx_onnx.load(rows), device="cpu")
    assert by_rows.run({"x": np.ones(8, np.float32)})[0].shape == (2, 4)
    with pytest.raises(InputError, match=r"does not accept n=6: .*'to_rows' \(Reshape\)"):
        by_rows.run({"x": np.ones(6, np.float32)})
    with pytest.raises(InputError, match=r"input 'ids'.*rank|input 'ids'"):
        cg.run({"ids": np.zeros((2, 3, 4), np.int64)})


def test_partly_bound_dims_and_unnamed_dims() -> None:
    model = _encoder()
    g = rlx_onnx.load(model, dims={"batch": 2})
    assert g.symbols == ("seq",)
    assert rlx.compile(g, device="cpu").run({"ids": _ids(2, 9)})[0].shape == (2, 9, D)
    relu = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", "float32", ["", 3, "n"])],
                      [vi("y", "float32", None)])
    g2 = rlx_onnx.load(relu)
    assert g2.symbols == ("n", "x_0")
    x = np.random.default_rng(0).standard_normal((4, 3, 2)).astype(np.float32)
    np.testing.assert_array_equal(rlx.compile(g2, device="cpu").run({"x": x})[0], np.maximum(x, 0))
    assert symbol_names(["x:0", "2d size", "x_0", "batch"]) == {"x:0": "x_0", "2d size": "_2d_size",
                                                                 "x_0": "x_0_2", "batch": "batch"}


def test_shared_dims_must_agree() -> None:
    add = make_model([helper.make_node("Add", ["a", "b"], ["y"])],
                     [vi("a", "float32", ["batch", 4]), vi("b", "float32", ["batch", 4])],
                     [vi("y", "float32", None)])
    cg = rlx.compile(rlx_onnx.load(add), device="cpu")
    ones = np.ones((2, 4), np.float32)
    assert cg.run({"a": ones, "b": ones})[0].shape == (2, 4)
    with pytest.raises(InputError, match=r"batch.*2.*3|batch.*3.*2"):
        cg.run({"a": ones, "b": np.ones((3, 4), np.float32)})


def test_weights_are_read_once_and_shared_by_every_size() -> None:
    g = rlx_onnx.load(_encoder())
    emb = g.value(g.input_node("emb").id)
    for batch, seq in [(1, 3), (4, 2)]:
        spec = g.specialize({"batch": batch, "seq": seq})
        assert spec.value(spec.input_node("emb").id) is emb
        assert spec.node(spec.inputs[0]).shape == (batch, seq)


def test_set_param_reaches_sizes_compiled_later() -> None:
    model = _encoder()
    cg = rlx.compile(rlx_onnx.load(model), device="cpu")
    w = np.eye(D, dtype=np.float32)
    cg.set_param("w", w)
    ids = _ids(2, 5)
    patched = model.__deepcopy__()
    for t in patched.graph.initializer:
        if t.name == "w":
            t.CopyFrom(init("w", w))
    np.testing.assert_allclose(cg.run({"ids": ids})[0], ort_run(patched, {"ids": ids})[0], rtol=1e-5, atol=1e-5)


def test_converted_once_its_sized_constants_round_trip_through_json() -> None:
    g = rlx_onnx.load(_encoder())
    sized = [n for n in g.nodes if n.op == "constant" and "sized" in n.attrs]
    assert sized, "the encoder's Range and Expand are computed from the sizes"
    with pytest.raises(GraphError, match="computed from the sizes"):
        g.value(sized[0].id)
    again = rlx.Graph.from_json(g.to_json())
    assert again.symbols == g.symbols
    ids = _ids(2, 5)
    np.testing.assert_array_equal(rlx.reference.evaluate(again, {"ids": ids})[0],
                                  rlx.reference.evaluate(g, {"ids": ids})[0])


def _split_rows() -> Any:
    """Halves of a symbolic axis: how many rows each gets is known only with the size."""
    nodes = [helper.make_node("Split", ["x"], ["a", "b"], axis=0), helper.make_node("Sub", ["a", "b"], ["y"])]
    return make_model(nodes, [vi("x", "float32", ["n", 3])], [vi("y", "float32", None)], opset=13)


def test_a_model_converted_per_size_is_frozen_and_not_saved_as_json() -> None:
    g = rlx_onnx.load(_split_rows())
    assert isinstance(g, DeferredGraph)
    with pytest.raises(GraphError, match=r"rebuilt from .* load it with its dims bound"):
        g.relu(g.inputs[0])
    with pytest.raises(GraphError, match="cannot be saved as JSON"):
        g.to_json()
    assert "symbolic dims; rebuilt from" in g.summary() and "n=16" in g.summary()
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(rlx.compile(g, device="cpu").run({"x": x})[0], x[:2] - x[2:])


def test_a_model_that_converts_at_no_representative_size_says_bind_it() -> None:
    fixed = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])], [vi("x", "float32", ["n"])],
                       [vi("y", "float32", None)], [init("shape", np.array([5], np.int64))])
    with pytest.raises(ModelError, match=r"symbolic dims \('n'\) were left unbound, and converting it failed at "
                                         r"every size tried \(at each of 16, 64, 224: .*cannot reshape.*bind them "
                                         r"with dims="):
        rlx_onnx.load(fixed)
    assert rlx_onnx.load(fixed, dims={"n": 5}).node(0).shape == (5,)


@pytest.mark.slow
def test_cli_runs_a_symbolic_model_without_dims(tmp_path: Path) -> None:
    from test_cli import run_rlx

    path = tmp_path / "enc.onnx"
    path.write_bytes(_encoder().SerializeToString())
    ran = run_rlx("run", str(path), "--device", "cpu", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "random int64[16, 16]" in ran.stdout and "[16, 16, 8]" in ran.stdout
    np.save(tmp_path / "ids.npy", _ids(2, 3))
    ran = run_rlx("run", str(path), "--device", "cpu", "--input", f"ids={tmp_path / 'ids.npy'}", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "[2, 3, 8]" in ran.stdout
    ran = run_rlx("check", str(path), cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "symbolic dims (batch, seq): estimates at batch=16, seq=16" in ran.stdout


def test_a_fault_at_every_size_is_named_once() -> None:
    pool = make_model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2, 2, 2])],
                      [vi("x", "float32", ["n", 2, 4, 4, 4, 4])], [vi("y", "float32", None)])
    with pytest.raises(ModelError, match=r"at each of 16, 64, 224: .*only 1-D, 2-D and 3-D AveragePool are supported"):
        rlx_onnx.load(pool)


def test_a_dim_that_is_the_sum_of_two_others_loads_without_dims() -> None:
    """A decoder step with a KV cache: the mask spans past and new tokens (``tp = t + p``)
    and the new positions are the mask sliced after the past (OPT's export). With every
    symbol one size, ``tp - p`` is 0 and no size converted; a sum of two others does, and
    the graph is placed and run at any sizes that fit."""
    nodes = [helper.make_node("Shape", ["pk"], ["ps"]),
             helper.make_node("Slice", ["m", "ps", "big", "ax"], ["ms"]),
             helper.make_node("Add", ["x", "ms"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", ["t"]), vi("m", "float32", ["tp"]), vi("pk", "float32", ["p"])],
                       [vi("y", "float32", None)],
                       [init("big", np.array([1 << 30], np.int64)), init("ax", np.array([0], np.int64))])
    g = rlx_onnx.load(model)
    assert isinstance(g, DeferredGraph) and set(g.symbols) == {"p", "t", "tp"}
    assert g.body_sizes["tp"] == g.body_sizes["t"] + g.body_sizes["p"]
    cg = rlx.compile(g, device="cpu")
    for t, p in [(3, 5), (1, 9), (4, 0)]:
        feeds = {"x": np.linspace(-1, 1, t, dtype=np.float32), "m": np.arange(t + p, dtype=np.float32),
                 "pk": np.zeros(p, np.float32)}
        np.testing.assert_array_equal(cg.run(feeds)[0], ort_run(model, feeds)[0])


# ------------------------------------------------------------- converted once, symbolically
def _static_twin(model: Any, sizes: dict[str, int], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return rlx.reference.evaluate(rlx_onnx.load(model, dims=sizes), inputs)


@pytest.mark.parametrize("which", [0, 1])
def test_bench_models_convert_once_and_match_the_static_load_at_every_size(which: int) -> None:
    """The exporter's idioms (Shape chains, Range, ConstantOfShape, an Expand-ed mask, a
    slice of the position table to ``seq``) convert once, as dims and sized constants; each
    size's specialization computes what loading at that size computes, to the bit."""
    from bench._dynamic_models import build_models

    model = build_models()[which]
    g = rlx_onnx.load(model.onnx)
    assert g.is_symbolic and not isinstance(g, DeferredGraph)
    rng = np.random.default_rng(which)
    for batch, seq in [(1, 1), (3, 7), (2, 64), (5, 2)]:
        feeds = {"input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64),
                 "attention_mask": np.ones((batch, seq), np.int64)}
        feeds = {k: v for k, v in feeds.items() if k in model.inputs}
        np.testing.assert_array_equal(rlx.reference.evaluate(g, feeds)[0],
                                      _static_twin(model.onnx, {"batch": batch, "seq": seq}, feeds)[0])


def test_a_shape_test_that_depends_on_the_size_is_converted_per_size() -> None:
    """``Where(Equal(seq, 1), ...)`` on a shape value is decided only with the size: the
    model is converted at each size (a ``DeferredGraph``), right at 1 and at 3."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Equal", ["n", "one"], ["is_one"]),
             helper.make_node("Where", ["is_one", "ten", "two"], ["k"]),
             helper.make_node("Cast", ["k"], ["kf"], to=1),
             helper.make_node("Mul", ["x", "kf"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", [2, "n"])], [vi("y", "float32", None)],
                       [init("one", np.array(1, np.int64)), init("ten", np.array(10, np.int64)),
                        init("two", np.array(2, np.int64))])
    g = rlx_onnx.load(model)
    assert isinstance(g, DeferredGraph)
    cg = rlx.compile(g, device="cpu")
    for n in (1, 3):
        x = np.ones((2, n), np.float32)
        np.testing.assert_array_equal(cg.run({"x": x})[0], x * (10 if n == 1 else 2))


def test_squeeze_without_axes_of_a_symbolic_shape_is_converted_per_size() -> None:
    model = make_model([helper.make_node("Squeeze", ["x"], ["y"])], [vi("x", "float32", ["n", 1, 3])],
                       [vi("y", "float32", None)])
    g = rlx_onnx.load(model)
    assert isinstance(g, DeferredGraph)  # n == 1 would be squeezed too
    assert rlx.compile(g, device="cpu").run({"x": np.ones((1, 1, 3), np.float32)})[0].shape == (3,)


def test_an_expand_whose_sizes_must_agree_records_it_and_names_it_at_run_time() -> None:
    """Expanding ``min(20, n)`` rows (a slice of a 20-row table) to ``n``: equal only while
    n <= 20; the load records the constraint and a run past it is an ``InputError``."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["table", "zero", "s", "zero"], ["rows"]),
             helper.make_node("Expand", ["rows", "s"], ["e"]),
             helper.make_node("Add", ["x", "e"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", ["n"])], [vi("y", "float32", None)],
                       [init("table", np.arange(20, dtype=np.float32)), init("zero", np.array([0], np.int64))])
    g = rlx_onnx.load(model)
    assert not isinstance(g, DeferredGraph)
    cg = rlx.compile(g, device="cpu")
    np.testing.assert_array_equal(cg.run({"x": np.ones(3, np.float32)})[0], [1, 2, 3])
    with pytest.raises(InputError, match=r"n == min\(20, n\) \(from mul node \d+ 'e'.*does not hold: n = 21"):
        cg.run({"x": np.ones(21, np.float32)})


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_and_gather_elements_on_symbolic_rows_match_onnxruntime(batch_dims: int) -> None:
    nodes = [helper.make_node("GatherND", ["data", "nd_index"], ["a"], batch_dims=batch_dims),
             helper.make_node("GatherElements", ["data", "el_index"], ["b"], axis=1)]
    model = make_model(nodes, [vi("data", "float32", ["n", 5]), vi("nd_index", "int64", ["n", 1]),
                               vi("el_index", "int64", ["n", 2])],
                       [vi("a", "float32", None), vi("b", "float32", None)], opset=13)
    g = rlx_onnx.load(model)
    assert not isinstance(g, DeferredGraph)
    cg = rlx.compile(g, device="cpu")
    rng = np.random.default_rng(batch_dims)
    for n in (1, 4):
        feeds = {"data": rng.standard_normal((n, 5)).astype(np.float32),
                 "nd_index": rng.integers(0, n if batch_dims == 0 else 5, (n, 1)).astype(np.int64),
                 "el_index": rng.integers(-5, 5, (n, 2)).astype(np.int64)}
        for got, want in zip(cg.run(feeds), ort_run(model, feeds)):
            np.testing.assert_array_equal(got, want)
