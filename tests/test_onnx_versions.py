"""Which op versions the importer reads (``rlx_core.onnx._versions``): every version in
effect at opsets 11-21, older opsets whose ops did not change since, newer versions that
ONNX's schemas show changed only the types they admit, and the few reviewed by hand.
Everything else is refused naming the op, its version and the versions read."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper
from test_onnx_support import check_against_ort, init, make_model, vi

from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError
from rlx_core.onnx._versions import INTRODUCED_LATER, REVIEWED, WRITTEN_FOR, newest_opset, readable_versions

X = np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32)


def _conv(opset: int):  # type: ignore[no-untyped-def]
    w = np.random.default_rng(1).standard_normal((3, 2, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [vi("x", "float32", X.shape)], [vi("y", "float32", None)], [init("w", w)], opset=opset)


@pytest.mark.parametrize("opset", sorted({22, newest_opset()}))
def test_a_newer_opset_whose_ops_changed_only_their_types_is_read(opset: int) -> None:
    """Conv 22 added bfloat16 and nothing else: read, and it computes what ORT does
    (ORT is given the same model at opset 21: what it reads may lag the spec)."""
    graph = rlx_onnx.load(_conv(opset))
    assert len(graph.nodes) > 2
    check_against_ort(_conv(21), {"x": X}, rtol=1e-4, atol=1e-5)
    import rlx_core

    got = rlx_core.compile(graph, device="cpu").run({"x": X})[0]
    want = rlx_core.compile(rlx_onnx.load(_conv(21)), device="cpu").run({"x": X})[0]
    np.testing.assert_array_equal(got, want)


def test_an_older_opset_is_read_where_its_ops_did_not_change() -> None:
    model = make_model([helper.make_node("Abs", ["x"], ["y"])], [vi("x", "float32", (2, 3))],
                       [vi("y", "float32", None)], opset=7)
    check_against_ort(model, {"x": -np.arange(6, dtype=np.float32).reshape(2, 3)})


def test_an_op_version_with_another_meaning_is_refused_by_name() -> None:
    """Softmax 1 (opset 7) flattens to 2-D; Softmax 13 does not: never read one as the other."""
    model = make_model([helper.make_node("Softmax", ["x"], ["y"])], [vi("x", "float32", (2, 3, 4))],
                       [vi("y", "float32", None)], opset=7)
    with pytest.raises(ModelError, match=r"at opset 7: node #0 \(Softmax\) -> 'y' is Softmax version 1, older "
                                         r"than the versions rlx reads \(11, 13\)"):
        rlx_onnx.load(model)


@pytest.mark.skipif(newest_opset() < 27, reason="Range 27 (stash_type) is newer than the installed onnx")
def test_a_newer_version_whose_text_changed_is_refused_unless_reviewed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Range 27's text changed (stash_type): read because it is in REVIEWED; without that
    entry it is refused by name (the cache of readable versions cleared around it)."""
    from rlx_core.onnx import _versions

    nodes = [helper.make_node("Range", ["a", "b", "c"], ["y"])]
    model = make_model(nodes, [], [vi("y", "float32", None)],
                       [init("a", np.float32(0)), init("b", np.float32(4)), init("c", np.float32(1))], opset=27)
    assert 27 in readable_versions("Range")
    rlx_onnx.load(model)
    monkeypatch.setattr(_versions, "REVIEWED", {k: v for k, v in REVIEWED.items() if k != ("Range", 27)})
    readable_versions.cache_clear()
    try:
        assert 27 not in _versions.readable_versions("Range") and 11 in _versions.readable_versions("Range")
        with pytest.raises(ModelError, match=r"is Range version 27, newer than the versions rlx reads \(11\)"):
            rlx_onnx.load(model)
    finally:
        monkeypatch.undo()
        readable_versions.cache_clear()


def test_reviewed_versions_are_read_and_every_read_version_is_known_to_onnx() -> None:
    for (op, version), why in REVIEWED.items():
        assert why
        if version <= newest_opset():
            assert version in readable_versions(op), (op, version)
    # the written-for range itself is always read
    assert {13, 21} <= readable_versions("Cast") and readable_versions("Relu") >= {14}
    assert readable_versions("NoSuchOp") == frozenset() and WRITTEN_FOR.stop - 1 == 21


def test_ops_introduced_after_the_written_range_are_pinned_to_their_tested_versions() -> None:
    assert readable_versions("RMSNormalization") >= {23}
    assert 23 in INTRODUCED_LATER["RMSNormalization"]
