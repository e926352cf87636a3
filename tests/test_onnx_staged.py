"""Models whose sizes depend on the data, run in stages (``rlx_core/onnx/_staged.py``):
NonZero, Unique and NonMaxSuppression on the host between compiled parts, and values
computed from data (a Range bound, an If condition) read between parts; against
onnxruntime and the numpy reference, on every device here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx
from onnx import TensorProto, helper
from test_onnx_support import init, make_model, ort_run, vi

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core import reference
from rlx_core.compiler.inputs import random_inputs
from rlx_core.compiler.staged import StagedCompiledGraph
from rlx_core.errors import GraphError, InputError
from rlx_core.ir.specialize import representative
from rlx_core.ir.staged import HostStep, StagedGraph

RNG = np.random.default_rng(33)
F = TensorProto.FLOAT


def _devices() -> list[str]:
    reg = rlx.default_registry()
    return [d for d in ("cpu", "jax", "opencl") if d in reg.names() and rlx.get_backend(d).probe().available]


def _same(got: list[np.ndarray], want: list[np.ndarray], what: str, atol: float = 1e-6) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: output {i} {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        if g.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=f"{what}: output {i}")
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol, err_msg=f"{what}: output {i}")


def _check(model: object, feeds: list[dict[str, np.ndarray]], device: str = "cpu",
           atol: float = 1e-6) -> rlx.CompiledGraph:
    graph = rlx_onnx.load(model)
    assert isinstance(graph, StagedGraph)
    cg = rlx.compile(graph, device=device)
    for feed in feeds:
        want = ort_run(model, feed)
        _same(cg.run(feed), want, f"{device}, inputs {[a.shape for a in feed.values()]}", atol)
        _same([r.astype(w.dtype) for r, w in zip(reference.evaluate(graph, feed), want)], want, "reference", atol)
    return cg


def _detector() -> object:
    """Boxes and scores computed by the model, NMS with constant thresholds, the kept boxes
    gathered: an SSD-style post-processing, with a symbolic box count."""
    nodes = [helper.make_node("Add", ["x", "offsets"], ["boxes"]), helper.make_node("Sigmoid", ["s"], ["scores"]),
             helper.make_node("Constant", [], ["most"], value=helper.make_tensor("v", TensorProto.INT64, [1], [5])),
             helper.make_node("Constant", [], ["iou"], value_float=0.5),
             helper.make_node("Constant", [], ["least"], value_floats=[0.3]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "least"], ["kept"], name="nms"),
             helper.make_node("Gather", ["kept", "two"], ["box_index"], axis=1),
             helper.make_node("Squeeze", ["boxes", "zero"], ["all_boxes"]),
             helper.make_node("Gather", ["all_boxes", "box_index"], ["picked"], axis=0),
             helper.make_node("ReduceSum", ["picked", "one"], ["total"], keepdims=0)]
    return make_model(nodes, [vi("x", "float32", [1, "n", 4]), vi("s", "float32", [1, 3, "n"])],
                      [vi("picked", "float32", None), vi("kept", "int64", None), vi("total", "float32", None)],
                      [init("offsets", np.array([0, 0, 1, 1], np.float32)), init("two", np.array(2, np.int64)),
                       init("zero", np.array([0], np.int64)), init("one", np.array([1], np.int64))], opset=17)


def _detector_feed(n: int, shift: float = 0.0) -> dict[str, np.ndarray]:
    return {"x": RNG.random((1, n, 4), dtype=np.float32) * 3,
            "s": RNG.standard_normal((1, 3, n)).astype(np.float32) + np.float32(shift)}


@pytest.mark.parametrize("device", _devices())
def test_nms_between_compiled_parts_matches_onnxruntime(device: str) -> None:
    """Any box count, and no box kept at all (every score under the threshold)."""
    cg = _check(_detector(), [_detector_feed(20), _detector_feed(7), _detector_feed(20, -10.0)], device)
    notes = "\n".join(cg.report().notes)
    assert "on the host (numpy): NonMaxSuppression 'nms'" in notes
    assert "the 3 node(s) after NonMaxSuppression 'nms': compiled" in notes
    assert cg.device == device


@pytest.mark.parametrize(("center", "count"), [(0, 400), (1, 400), (0, 2600)])
def test_nms_on_many_overlapping_boxes_matches_onnxruntime(center: int, count: int) -> None:
    """Hundreds of boxes in a small field (many overlaps, some tied scores, corners in
    either order), three classes, two images, no cap on the count; 2,600 boxes make one
    group too large for a matrix of IoUs (the windowed greedy pass)."""
    nms = helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "least"], ["kept"],
                           center_point_box=center)
    model = make_model([nms], [vi("boxes", "float32", [2, "n", 4]), vi("scores", "float32", [2, 3, "n"])],
                       [vi("kept", "int64", None)],
                       [init("most", np.array([10**9], np.int64)), init("iou", np.array([0.4], np.float32)),
                        init("least", np.array([0.1], np.float32))])
    boxes = RNG.random((2, count, 4), dtype=np.float32) * 10
    scores = np.round(RNG.random((2, 3, count)), 2).astype(np.float32)  # rounded: ties
    _check(model, [{"boxes": boxes, "scores": scores}])


def test_nonzero_on_computed_values_with_any_size_and_all_zeros() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"], name="where"),
             helper.make_node("Transpose", ["nz"], ["t"], perm=[1, 0]),
             helper.make_node("Cast", ["t"], ["tf"], to=F), helper.make_node("Mul", ["tf", "two"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", ["n", 4])], [vi("y", "float32", None), vi("r", "float32", None)],
                       [init("two", np.array(2.0, np.float32))])
    feeds = [{"x": RNG.standard_normal((n, 4)).astype(np.float32)} for n in (3, 5, 3)]
    cg = _check(model, [*feeds, {"x": -np.ones((2, 4), np.float32)}])
    assert cg.compiles >= 4  # the prefix once, the rest per count


def test_unique_in_order_of_first_occurrence_along_an_axis() -> None:
    nodes = [helper.make_node("Floor", ["x"], ["f"]),
             helper.make_node("Unique", ["f"], ["y", "first", "inverse", "counts"], axis=0, sorted=0),
             helper.make_node("ReduceSum", ["y", "one"], ["rows"], keepdims=0)]
    model = make_model(nodes, [vi("x", "float32", ["n", 2])],
                       [vi(n, "float32" if n in ("y", "rows") else "int64", None)
                        for n in ("y", "first", "inverse", "counts", "rows")],
                       [init("one", np.array([1], np.int64))])
    _check(model, [{"x": RNG.integers(0, 3, (n, 2)).astype(np.float32)} for n in (9, 4)])


def test_a_range_to_a_count_computed_from_a_mask_is_cut_there() -> None:
    """``Range(0, ReduceSum(mask))`` over a batch-sized mask: the count is data, so the model
    is cut at it (not built per value of the whole mask)."""
    nodes = [helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.INT64),
             helper.make_node("ReduceSum", ["m"], ["k"], keepdims=0),
             helper.make_node("Range", ["zero", "k", "one"], ["r"]), helper.make_node("Cast", ["r"], ["rf"], to=F),
             helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=0),
             helper.make_node("Add", ["rf", "mean"], ["y"])]
    model = make_model(nodes, [vi("mask", "bool", ["b", "s"]), vi("x", "float32", ["b", "s"])],
                       [vi("y", "float32", None)],
                       [init("zero", np.array(0, np.int64)), init("one", np.array(1, np.int64))])
    graph = rlx_onnx.load(model)
    assert not any(isinstance(s, HostStep) for s in graph.steps) and "'k'" in graph.summary()
    _check(model, [{"mask": RNG.random((b, s)) < 0.5, "x": RNG.random((b, s), dtype=np.float32)}
                   for b, s in ((2, 5), (3, 7), (2, 5))])


def test_an_if_on_data_picks_its_branch_per_run() -> None:
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["o"])], "then", [],
                             [helper.make_tensor_value_info("o", F, None)])
    other = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["o2"], keepdims=1)], "else", [],
                              [helper.make_tensor_value_info("o2", F, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = make_model(nodes, [vi("x", "float32", ["b", 3])], [vi("y", "float32", None)],
                       [init("zero", np.array(0, np.float32)), init("two", np.array(2, np.float32))])
    x = RNG.random((4, 3), dtype=np.float32)
    _check(model, [{"x": x}, {"x": -x[:2]}, {"x": x}])


def test_the_parts_built_later_go_where_the_first_build_of_their_stage_went() -> None:
    """A stage built per box count is placed once (its first build), then compiled on that
    device for every later count: no ranking per size, no device flicker."""
    placements: list[tuple[str, str | None]] = []

    def compile_graph(stage: rlx.Graph, placed: str | None) -> rlx.CompiledGraph:
        placements.append((stage.name, placed))
        return rlx.compile(stage, placed or "cpu")

    cg = StagedCompiledGraph(rlx_onnx.load(_detector()), compile_graph)
    for n in (20, 7, 9):
        cg.run(_detector_feed(n))
    assert placements == [("m", None), ("m.rest", None), ("m.rest", "cpu"), ("m.rest", "cpu")]
    assert cg.device == "cpu"


def test_a_staged_graph_has_no_body_before_it_runs() -> None:
    graph = rlx_onnx.load(_detector())
    assert graph.is_symbolic and "NonMaxSuppression 'nms' on the host" in graph.summary()
    with pytest.raises(GraphError, match="runs NonMaxSuppression 'nms' on the host"):
        representative(graph)
    with pytest.raises(GraphError, match="cannot be saved as JSON"):
        graph.to_json()
    with pytest.raises(GraphError, match="cannot be edited"):
        graph.relu(graph.inputs[0])
    made = random_inputs(graph, given={"x": (1, 6, 4)})
    assert made["x"].shape == (1, 6, 4) and made["s"].shape == (1, 3, 6)
    assert len(rlx.compile(graph).run(made)) == 3


def test_inputs_and_host_op_failures_are_named() -> None:
    cg = rlx.compile(rlx_onnx.load(_detector()), device="cpu")
    with pytest.raises(InputError, match="missing input"):
        cg.run({"x": np.zeros((1, 3, 4), np.float32)})
    with pytest.raises(InputError, match=r"input 's' dim 2 .'n'.: 4, but input 'x' gave n = 3"):
        cg.run({"x": np.zeros((1, 3, 4), np.float32), "s": np.zeros((1, 3, 4), np.float32)})
    # Straight from the inputs (no part before it), the op itself checks what it reads.
    nms = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["kept"], name="nms")
    model = make_model([nms], [vi("boxes", "float32", ["b", "n", 4]), vi("scores", "float32", ["b", "c", "m"])],
                       [vi("kept", "int64", None)])
    cg = rlx.compile(rlx_onnx.load(model), device="cpu")
    with pytest.raises(InputError, match=r"NonMaxSuppression 'nms', run on the host: scores must be"):
        cg.run({"boxes": np.zeros((1, 3, 4), np.float32), "scores": np.zeros((1, 2, 4), np.float32)})
    (kept,) = cg.run({"boxes": np.zeros((1, 3, 4), np.float32), "scores": np.zeros((1, 2, 3), np.float32)})
    assert kept.shape == (0, 3)  # max_output_boxes_per_class left out: 0


def test_graph_devices_and_set_param_reach_every_stage() -> None:
    graph = rlx_onnx.load(_detector())
    feed = _detector_feed(12)
    cg = rlx.GraphDevices(graph).compile("cpu")
    before = cg.run(feed)
    cg.set_param("offsets", np.array([1, 1, 2, 2], np.float32))
    after = cg.run(feed)
    np.testing.assert_allclose(after[0], before[0] + 1, rtol=1e-6)  # the same boxes kept (IoU moves with all)
    with pytest.raises(InputError, match="no param 'nope'"):
        cg.set_param("nope", np.zeros(1, np.float32))


def test_a_host_op_inside_a_branch_runs_when_the_branch_is_spliced_in() -> None:
    """An If on an input (or known at load) whose branch holds NonZero: built per value of
    the condition, the branch spliced into the graph, NonZero on the host."""
    nz = helper.make_graph([helper.make_node("NonZero", ["x"], ["u"])], "then", [],
                           [helper.make_tensor_value_info("u", TensorProto.INT64, None)])
    other = helper.make_graph([helper.make_node("Shape", ["x"], ["v0"]), helper.make_node("Unsqueeze", ["v0", "zero"],
                                                                                           ["v"])], "else", [],
                              [helper.make_tensor_value_info("v", TensorProto.INT64, None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=nz, else_branch=other)
    model = make_model([node], [vi("x", "float32", [3]), vi("c", "bool", [])], [vi("y", "int64", None)],
                       [init("zero", np.array([0], np.int64))])
    _check(model, [{"x": np.array([0, 2, 3], np.float32), "c": np.array(flag)} for flag in (True, False, True)])


def test_a_host_op_inside_a_loop_body_runs_with_the_loop_on_the_host() -> None:
    """NonZero in a Loop's body: the loop runs from the host, its body a staged part."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]), helper.make_node("NonZero", ["acc_out"], ["u"]),
         helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Shape", ["u"], ["count"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", 9, []),
         helper.make_tensor_value_info("acc_in", F, [4])],
        [helper.make_tensor_value_info("c_out", 9, []), helper.make_tensor_value_info("acc_out", F, [4]),
         helper.make_tensor_value_info("count", TensorProto.INT64, [2])])
    node = helper.make_node("Loop", ["M", "", "acc0"], ["acc", "counts"], body=body)
    model = make_model([node], [vi("x", "float32", [4])], [vi("acc", "float32", None), vi("counts", "int64", None)],
                       [init("M", np.array(3, np.int64)), init("acc0", np.array([-2, 0, -1, 1], np.float32))],
                       opset=16)
    _check(model, [{"x": np.array([1, 0, 1, 0], np.float32)}])


def test_a_torchscript_export_of_a_torchvision_ssd() -> None:
    """``tests/data/ssd_tiny_torchscript.onnx``: torch 2.14's TorchScript exporter (opset 17)
    of torchvision 0.29's ``SSD`` with a two-conv backbone (3x64x64 images, 4 classes,
    ``score_thresh=0.7``, ``topk_candidates=50``, ``detections_per_img=20``): top-level
    NonZero and TopK, and batched NMS inside ``If(boxes.numel() == 0)``. Images with 11-17
    detections and one with none, against onnxruntime."""
    path = Path(__file__).parent / "data" / "ssd_tiny_torchscript.onnx"
    model = onnx.load(str(path))
    images = [np.random.default_rng(seed).random((3, 64, 64), dtype=np.float32) for seed in (1, 2, 3)]
    feeds = [{"images": image} for image in [*images, np.zeros((3, 64, 64), np.float32)]]
    cg = _check(model, feeds)
    counts = [cg.run(feed)[0].shape[0] for feed in feeds]
    assert min(counts[:3]) >= 10 and counts[3] == 0


@pytest.mark.parametrize(("mode", "ratio", "transform"), [("avg", 2, "half_pixel"), ("avg", 0, "output_half_pixel"),
                                                          ("max", 2, "half_pixel")])
def test_roi_align_on_the_host_matches_onnxruntime(mode: str, ratio: int, transform: str) -> None:
    """RoiAlign as a two-stage detector uses it (boxes from the model, some past the map's
    edge, one region on the second image), adaptive and fixed sampling grids."""
    nodes = [helper.make_node("Relu", ["x"], ["features"]),
             helper.make_node("RoiAlign", ["features", "rois", "index"], ["pooled"], mode=mode, output_height=3,
                              output_width=4, sampling_ratio=ratio, spatial_scale=0.5,
                              coordinate_transformation_mode=transform),
             helper.make_node("ReduceMean", ["pooled", "axes"], ["y"], keepdims=0)]
    model = make_model(nodes, [vi("x", "float32", [2, 3, 10, 12]), vi("rois", "float32", ["r", 4]),
                               vi("index", "int64", ["r"])], [vi("y", "float32", None)],
                       [init("axes", np.array([2, 3], np.int64))], opset=18)
    corners = RNG.random((9, 2), dtype=np.float32) * 18
    rois = np.concatenate([corners, corners + RNG.random((9, 2), dtype=np.float32) * 12], axis=1)
    index = np.array([0] * 8 + [1], np.int64)
    _check(model, [{"x": RNG.standard_normal((2, 3, 10, 12)).astype(np.float32), "rois": rois, "index": index}])


def test_a_scatter_with_no_update_leaves_its_data() -> None:
    """ScatterElements with empty indices (a pyramid level that got no region), the indices
    a value read between parts."""
    nodes = [helper.make_node("NonZero", ["flags"], ["nz"]), helper.make_node("Reshape", ["nz", "col"], ["idx"]),
             helper.make_node("Expand", ["idx", "wide"], ["where"]),
             helper.make_node("Gather", ["updates_all", "nz_flat"], ["picked"], axis=0),
             helper.make_node("Reshape", ["nz", "flat"], ["nz_flat"]),
             helper.make_node("ScatterElements", ["data", "where", "picked"], ["y"], axis=0)]
    model = make_model(nodes, [vi("flags", "bool", [4]), vi("data", "float32", [4, 3]),
                               vi("updates_all", "float32", [4, 3])], [vi("y", "float32", None)],
                       [init("col", np.array([-1, 1], np.int64)), init("wide", np.array([1, 3], np.int64)),
                        init("flat", np.array([-1], np.int64))])
    data, updates = RNG.standard_normal((4, 3)).astype(np.float32), RNG.standard_normal((4, 3)).astype(np.float32)
    _check(model, [{"flags": np.array(f), "data": data, "updates_all": updates}
                   for f in ([False, True, False, True], [False] * 4)])


def test_a_value_cut_refuses_a_value_too_large_to_build_from() -> None:
    """``Range(0, k)`` where ``k`` is a whole computed vector (more than MAX_VALUE_ELEMENTS
    elements read as a value): an InputError naming it, at run time."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Cast", ["r"], ["shape"], to=TensorProto.INT64),
             helper.make_node("ConstantOfShape", ["shape"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", ["n"])], [vi("y", "float32", None)])
    cg = rlx.compile(rlx_onnx.load(model), device="cpu")
    (y,) = cg.run({"x": np.array([2.0, 3.0], np.float32)})
    assert y.shape == (2, 3)
    with pytest.raises(InputError, match=r"'shape' holds 5000 elements"):
        cg.run({"x": np.zeros(5000, np.float32)})


def test_host_outputs_as_graph_outputs_and_dlpack_and_threads() -> None:
    """NonZero's output is the graph's output; ``output="dlpack"`` gives host arrays; runs
    from several threads at once, each its own size, agree with the reference."""
    import threading

    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"])],
                       [vi("x", "float32", ["n"])], [vi("nz", "int64", None)])
    graph = rlx_onnx.load(model)
    cg = rlx.compile(graph, device="cpu")
    xs = [RNG.standard_normal(n).astype(np.float32) for n in (5, 9, 13, 17, 5, 9)]
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        results[i] = cg.run({"x": xs[i]}, output="dlpack")[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(np.from_dlpack(results[i]), np.array(np.nonzero(np.maximum(x, 0)), np.int64))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("corners", [0, 1])
def test_grid_sample_on_the_host_matches_onnxruntime(mode: str, padding: str, corners: int) -> None:
    """A grid computed by the model (reaching past the borders: every padding matters).
    onnxruntime sums the taps in float32, rlx in float64: ~2e-6 apart where they cancel."""
    nodes = [helper.make_node("Tanh", ["g"], ["t"]), helper.make_node("Mul", ["t", "reach"], ["grid"]),
             helper.make_node("GridSample", ["x", "grid"], ["s"], mode=mode, padding_mode=padding,
                              align_corners=corners),
             helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", [2, 3, 5, 7]), vi("g", "float32", [2, 4, 6, 2])],
                       [vi("y", "float32", None)], [init("reach", np.array(1.4, np.float32))], opset=16)
    rng = np.random.default_rng(5)
    _check(model, [{"x": rng.standard_normal((2, 3, 5, 7)).astype(np.float32),
                    "g": rng.standard_normal((2, 4, 6, 2)).astype(np.float32) * 2}], atol=1e-5)


def test_set_param_reaches_a_part_staged_again() -> None:
    """A weight read after a second NonZero lives in a part staged inside the first part's
    rest: set_param reaches it before and after that part is built."""
    nodes = [helper.make_node("NonZero", ["x"], ["a"]), helper.make_node("Cast", ["a"], ["af"], to=F),
             helper.make_node("Mul", ["af", "w1"], ["b"]), helper.make_node("NonZero", ["b"], ["c"]),
             helper.make_node("Cast", ["c"], ["cf"], to=F), helper.make_node("Add", ["cf", "w2"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", [6])], [vi("y", "float32", None)],
                       [init("w1", np.array(1.0, np.float32)), init("w2", np.array(0.5, np.float32))])
    x = np.array([0, 1, 0, 2, 3, 0], np.float32)
    cg = rlx.compile(rlx_onnx.load(model), device="cpu")
    cg.set_param("w2", np.array(10.0, np.float32))  # before the nested part exists
    (y,) = cg.run({"x": x})
    np.testing.assert_array_equal(y, np.array(np.nonzero(np.array(np.nonzero(x), np.float32)), np.float32) + 10)
    cg.set_param("w2", np.array(20.0, np.float32))  # after
    np.testing.assert_array_equal(cg.run({"x": x})[0], y + 10)
    with pytest.raises(InputError, match="no param 'w3'"):
        cg.set_param("w3", np.array(0.0, np.float32))


def test_sizes_are_checked_before_any_step() -> None:
    """A host op reading an input straight: the input's declared size is still checked."""
    model = make_model([helper.make_node("NonZero", ["x"], ["nz"])], [vi("x", "float32", [3])],
                       [vi("nz", "int64", None)])
    cg = rlx.compile(rlx_onnx.load(model), device="cpu")
    with pytest.raises(InputError, match="'x'"):
        cg.run({"x": np.ones(5, np.float32)})


def test_a_host_op_inside_a_scan_body_runs_with_the_scan_on_the_host() -> None:
    """NonZero in a Scan's body (the count of positive entries of each row)."""
    body = helper.make_graph(
        [helper.make_node("Relu", ["row"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"]),
         helper.make_node("Shape", ["nz"], ["count"]), helper.make_node("Add", ["acc", "count"], ["acc_out"])],
        "body", [helper.make_tensor_value_info("acc", TensorProto.INT64, [2]),
                 helper.make_tensor_value_info("row", F, [5])],
        [helper.make_tensor_value_info("acc_out", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("count", TensorProto.INT64, [2])])
    node = helper.make_node("Scan", ["acc0", "xs"], ["total", "counts"], body=body, num_scan_inputs=1)
    model = make_model([node], [vi("xs", "float32", [4, 5])], [vi("total", "int64", None), vi("counts", "int64", None)],
                       [init("acc0", np.zeros(2, np.int64))], opset=16)
    _check(model, [{"xs": RNG.standard_normal((4, 5)).astype(np.float32)}])
