"""The cpu executor's promises beyond correctness of single ops (the conformance kit's
job): compile once into a flat plan over preallocated, reused buffers; run without
walking the graph; hand out fresh outputs; never touch the inputs; share one compiled
graph between threads; replace params atomically.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.errors import InputError
from rlx_core.ir import Graph
from rlx_core.plugin import CompileOptions
from rlx_cpu import CpuBackend
from rlx_cpu.executor import CpuExecutable
from rlx_cpu.threads import ThreadTuner


@pytest.fixture
def registry() -> Registry:
    """A registry holding only the cpu backend: no discovery, no environment."""
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return reg


def compile_cpu(graph: Graph) -> CpuExecutable:
    exe = CpuBackend().compile(graph.freeze(), CompileOptions(device="cpu"))
    assert isinstance(exe, CpuExecutable)
    return exe


def wide_only(exe: CpuExecutable) -> CpuExecutable:
    """``exe`` with its thread tuner settled on wide (no narrow trial binding a second plan
    in the first runs: these tests follow one plan's memory and steps)."""
    if exe._tuner is not None:
        exe._tuner = ThreadTuner(known_wide=True)
    return exe


def chain_graph(length: int, size: int = 64) -> Graph:
    """x -> a long chain of elementwise ops (each one a node), with a few constants."""
    g = Graph(f"chain{length}")
    y = g.input("x", (size,), "float32")
    steps = ("add", "mul", "tanh", "neg", "abs", "maximum", "sub", "relu")
    for i in range(length):
        op = steps[i % len(steps)]
        if op in ("tanh", "neg", "abs", "relu"):
            y = getattr(g, op)(y)
        else:
            y = getattr(g, op)(y, np.full(size, 0.5 + i / length, np.float32))
    g.set_outputs([y])
    return g


def mlp_graph() -> Graph:
    """Two layers with a softmax, params feeding folded values (w1 * 2)."""
    rng = np.random.default_rng(3)
    g = Graph("mlp")
    x = g.input("x", (4, 8), "float32")
    w1 = g.param("w1", rng.standard_normal((8, 16)).astype(np.float32))
    b1 = g.param("b1", rng.standard_normal(16).astype(np.float32))
    w2 = g.param("w2", rng.standard_normal((16, 3)).astype(np.float32))
    h = g.relu(g.add(g.matmul(x, g.mul(w1, 2.0)), b1))  # w1 * 2 is folded at compile time
    g.set_outputs([g.softmax(g.matmul(h, w2), axis=-1), h])
    return g


def assert_matches_reference(graph: Graph, inputs: dict[str, np.ndarray], outs: list[np.ndarray],
                             params: dict[str, np.ndarray] | None = None) -> None:
    refs = reference.evaluate(graph, inputs, params=params)
    for got, ref in zip(outs, refs):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- the plan
def test_long_chain_reuses_few_buffers() -> None:
    graph = chain_graph(40)
    exe = compile_cpu(graph)
    stats = exe.plan_stats()
    assert stats["steps"] >= 40  # one step or more per node: a flat list
    assert stats["buffers"] < len(graph.nodes) // 4, stats  # reused by liveness and in place
    assert stats["reused"] + stats["inplace"] > 0, stats
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    assert_matches_reference(graph, {"x": x}, exe.run({"x": x}))


def test_run_does_not_walk_the_graph_or_build_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    """After compile, a run is the bound steps only: no shape inference, no reference,
    no kernel builders, no graph access, no new plan."""
    import rlx_core.ir.ops
    import rlx_core.reference
    import rlx_cpu.binding
    import rlx_cpu.executor
    import rlx_cpu.residents

    graph = mlp_graph()
    exe = wide_only(compile_cpu(graph))
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    want = [o.copy() for o in exe.run({"x": x})]

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("called during run")

    monkeypatch.setattr(rlx_core.ir.ops, "infer", forbidden)
    monkeypatch.setattr(rlx_core.reference, "evaluate", forbidden)
    monkeypatch.setattr(Graph, "nodes", property(forbidden))
    monkeypatch.setattr(Graph, "node", forbidden)
    for module in (rlx_cpu.executor, rlx_cpu.binding, rlx_cpu.residents):  # each looks the builders up
        monkeypatch.setattr(module, "_BUILDERS", {})
    monkeypatch.setattr(CpuExecutable, "_bind_plan", forbidden)
    for _ in range(3):
        got = exe.run({"x": x})
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert exe.plan_stats()["plans"] == 1


def test_reshape_of_a_buffer_is_a_view_and_folded_nodes_cost_no_step() -> None:
    g = Graph("views")
    x = g.input("x", (2, 6), "float32")
    c = g.mul(g.constant(np.arange(12, dtype=np.float32).reshape(3, 4)), 2.0)  # folded
    y = g.reshape(g.exp(x), (3, 4))
    g.set_outputs([g.add(y, c)])
    exe = compile_cpu(g)
    stats = exe.plan_stats()
    assert stats["views"] == 1 and stats["folded"] >= 1, stats
    xv = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    assert_matches_reference(g, {"x": xv}, exe.run({"x": xv}))


# ----------------------------------------------------------------------------- outputs and inputs
def test_outputs_are_fresh_arrays() -> None:
    graph = chain_graph(6, size=8)
    exe = compile_cpu(graph)
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    first = exe.run({"x": x})[0]
    want = first.copy()
    first[:] = 1e6  # the caller owns what it got
    second = exe.run({"x": x})[0]
    np.testing.assert_array_equal(second, want)
    assert not np.shares_memory(first, second)
    assert second.flags.writeable and second.flags.owndata


@pytest.mark.parametrize("build", ["identity_reshape", "transpose", "slice"])
def test_outputs_never_alias_inputs(build: str) -> None:
    g = Graph(build)
    x = g.input("x", (3, 4), "float32")
    if build == "identity_reshape":
        out = g.reshape(x, (4, 3))
    elif build == "transpose":
        out = g.transpose(x)
    else:
        out = g.slice(x, (0,), (2,))
    g.set_outputs([out, x])  # an input as a graph output, too
    exe = compile_cpu(g)
    xv = np.arange(12, dtype=np.float32).reshape(3, 4)
    for got in exe.run({"x": xv}):
        assert not np.shares_memory(got, xv)


def test_inputs_are_never_modified() -> None:
    """Ops that may work in place (elementwise over a dying value) never pick an input,
    even when the input dies at that op; padding conv copies, it does not write."""
    g = Graph("inplace_candidates")
    x = g.input("x", (1, 2, 5, 5), "float32")
    w = g.param("w", np.ones((3, 2, 3, 3), np.float32))
    a = g.input("a", (10,), "float32")
    b = g.input("b", (10,), "float32")
    conv = g.conv2d(g.neg(x), w, padding=1)
    s = g.relu(g.sub(g.exp(a), b))
    g.set_outputs([conv, g.tanh(s), g.abs(g.reshape(a, (2, 5)))])
    exe = compile_cpu(g)
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((1, 2, 5, 5)).astype(np.float32),
        "a": rng.standard_normal(10).astype(np.float32),
        "b": rng.standard_normal(10).astype(np.float32),
    }
    pristine = {k: v.copy() for k, v in feeds.items()}
    for _ in range(2):
        outs = exe.run(feeds)
    for k in feeds:
        np.testing.assert_array_equal(feeds[k], pristine[k], err_msg=f"input {k!r} was modified")
    assert_matches_reference(g, pristine, outs)


def test_a_concats_inputs_are_computed_into_its_buffer() -> None:
    """A batch-1 concat of channels takes its buffer at its first input: each input it
    reads is computed into its block (no copy step), one read elsewhere too (an output
    here: read from the block after the last step); a graph input, and a concat along an
    axis whose blocks are not contiguous, are copied as before."""
    g = Graph("fire")
    x = g.input("x", (1, 3, 6, 6), "float32")
    w = g.param("w", np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32))
    a = g.relu(g.conv2d(x, w, padding=1))  # the relu writes its block
    b = g.tanh(x)  # so does the tanh
    shared = g.exp(x)  # read by the concat and the output: computed into its block too
    cat = g.concat([a, b, shared, x], axis=1)  # x: a graph input, copied
    batched = g.input("y", (2, 3, 6, 6), "float32")
    cat2 = g.concat([g.neg(batched), g.abs(batched)], axis=1)  # two images: blocks not contiguous
    g.set_outputs([g.add(cat, 1.0), shared, cat2])
    exe = compile_cpu(g)
    assert sorted(g.node(i).op.value for i in exe._in_concat) == ["exp", "relu", "tanh"]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
             "y": rng.standard_normal((2, 3, 6, 6)).astype(np.float32)}
    for _ in range(2):
        assert_matches_reference(g, feeds, exe.run(feeds))


def test_a_chain_of_concats_is_one_buffer_every_block_computed_in_place() -> None:
    """DenseNet's growing features: ``cat_k = concat(cat_k-1, f_k)``, each ``cat_k`` also
    read by the layer that computes ``f_k+1`` (and by a later output). Every ``f_k`` and
    every inner ``cat_k`` lie in the last concat's buffer at their offsets, no concat
    copies anything, the buffer lives as long as its last reader, and a relu after a
    concat never overwrites it in place."""
    g = Graph("dense")
    rng = np.random.default_rng(3)
    cat = g.relu(g.conv2d(g.input("x", (1, 2, 5, 5), "float32"),
                          g.param("w0", rng.standard_normal((4, 2, 3, 3)).astype(np.float32)), padding=1))
    cats, grown = [cat], []
    for k in range(3):
        grow = g.relu(g.conv2d(g.relu(cat), g.param(f"w{k + 1}", rng.standard_normal((2, 4 + 2 * k, 3, 3))
                                                      .astype(np.float32)), padding=1))
        cat = g.concat([cat, grow], axis=1)
        cats.append(cat)
        grown.append(grow)
    g.set_outputs([g.neg(g.relu(cat)), g.tanh(cats[1])])  # cats[1] also read after the last concat
    exe = compile_cpu(g)
    root = cats[-1].id
    want = {cats[0].id: 0, cats[1].id: 0, cats[2].id: 0}
    want |= {grow.id: (4 + 2 * k) * 25 for k, grow in enumerate(grown)}
    assert exe._in_concat == {i: (root, at) for i, at in want.items()}
    assert exe._concat_ends[root] == max(exe._ends[i] for i in (*want, root)) > exe._ends[root]
    feeds = {"x": rng.standard_normal((1, 2, 5, 5)).astype(np.float32)}
    for _ in range(3):
        assert_matches_reference(g, feeds, exe.run(feeds))


def test_flattened_concats_that_extend_each_other_are_one_buffer() -> None:
    """DenseNet as exported: each layer's concat lists every earlier feature map,
    ``cat_k = concat(x, f_1, ..., f_k)``: each ``cat_k`` is the start of ``cat_k+1``, a
    view there, and every ``f_k`` is computed once into its block of the last one, though
    every later concat reads it too. A concat along the same axis that does not begin
    with another's inputs keeps a buffer of its own."""
    g = Graph("flat")
    rng = np.random.default_rng(4)
    x = g.relu(g.input("x", (1, 3, 4, 4), "float32"))
    feats, cats = [x], []
    for k in range(3):
        src = cats[-1] if cats else x
        w = g.param(f"w{k}", rng.standard_normal((2, src.shape[1], 1, 1)).astype(np.float32))
        feats.append(g.tanh(g.conv2d(g.relu(src), w)))
        cats.append(g.concat(list(feats), axis=1))
    other = g.concat([feats[2], feats[1]], axis=1)  # not the start of any: its own buffer
    g.set_outputs([g.neg(cats[-1]), g.abs(cats[0]), g.exp(other)])
    exe = compile_cpu(g)
    root = cats[-1].id
    assert exe._in_concat[cats[0].id] == (root, 0) and exe._in_concat[cats[1].id] == (root, 0)
    assert [exe._in_concat[f.id] for f in feats] == [(root, 0), (root, 48), (root, 80), (root, 112)]
    assert other.id not in exe._in_concat and other.id not in exe._concat_ends
    feeds = {"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32)}
    for _ in range(3):
        assert_matches_reference(g, feeds, exe.run(feeds))


def test_read_only_and_non_contiguous_inputs(registry: Registry) -> None:
    g = Graph("strided")
    x = g.input("x", (3, 4), "float32")
    g.set_outputs([g.add(g.transpose(x), 1.0)])
    cg = rlx.compile(g, device="cpu", registry=registry)
    base = np.arange(24, dtype=np.float32).reshape(3, 8)
    strided = base[:, ::2]
    strided.flags.writeable = False
    (got,) = cg.run({"x": strided})
    np.testing.assert_array_equal(got, strided.T + 1)


# ----------------------------------------------------------------------------- threads
def test_eight_threads_share_one_compiled_graph(registry: Registry) -> None:
    graph = mlp_graph()
    cg = rlx.compile(graph, device="cpu", registry=registry)
    rng = np.random.default_rng(7)
    feeds = [{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(8)]
    expected = [reference.evaluate(graph, f) for f in feeds]
    start = threading.Barrier(8)
    errors: list[str] = []

    def worker(i: int) -> None:
        start.wait()
        for n in range(40):
            outs = cg.run(feeds[i])
            for got, ref in zip(outs, expected[i]):
                if not np.allclose(got, ref, rtol=1e-4, atol=1e-5):
                    errors.append(f"thread {i}, run {n}: wrong result")
                    return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    stats = cg._exe.plan_stats()
    # at most one plan per concurrent run, each with at most one twin (narrow: threads.ThreadTuner), all pooled
    assert 1 <= stats["pooled"] <= 8 and stats["plans"] == stats["pooled"] + stats["narrow"], stats


def test_a_failed_run_returns_its_plan_to_the_pool() -> None:
    g = Graph("intdiv")
    a = g.input("a", (3,), "int32")
    b = g.input("b", (3,), "int32")
    g.set_outputs([g.div(a, b)])
    exe = compile_cpu(g)
    with pytest.raises(InputError, match="division by zero"):
        exe.run({"a": np.ones(3, np.int32), "b": np.array([1, 0, 2], np.int32)})
    assert exe.plan_stats()["pooled"] == 1
    (got,) = exe.run({"a": np.array([7, -7, 9], np.int32), "b": np.array([2, 2, -4], np.int32)})
    np.testing.assert_array_equal(got, [3, -3, -2])  # truncation toward zero


# ----------------------------------------------------------------------------- set_param
def test_set_param_updates_params_and_folded_values(registry: Registry) -> None:
    graph = mlp_graph()
    cg = rlx.compile(graph, device="cpu", registry=registry)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    new_w1 = np.linspace(-0.5, 0.5, 128, dtype=np.float32).reshape(8, 16)
    cg.set_param("w1", new_w1)
    new_w1[:] = 0  # set_param copied the value: later changes to the caller's array do not leak in
    want = np.linspace(-0.5, 0.5, 128, dtype=np.float32).reshape(8, 16)
    assert_matches_reference(graph, {"x": x}, cg.run({"x": x}), params={"w1": want})


def test_one_row_dense_head_reads_transposed_weights_in_place(registry: Registry) -> None:
    """``x @ transpose(w)`` with one row of x keeps the transpose a view of the param
    (gemv over the (N, K) rows); with more rows it is folded into a contiguous copy.
    Either way set_param reaches it."""
    for rows, view in ((1, True), (3, False)):
        g = Graph("head")
        x = g.input("x", (rows, 64))
        w = g.param("w", np.arange(640, dtype=np.float32).reshape(10, 64) / 640)
        g.set_outputs([g.matmul(x, g.transpose(w, (1, 0)))])
        exe = compile_cpu(g)
        folded = [exe._residents[n.id] for n in g.nodes if n.op.value == "transpose"]
        assert np.shares_memory(folded[0], exe._params["w"]) is view
        cg = rlx.compile(g, device="cpu", registry=registry)
        xv = np.linspace(-1, 1, rows * 64, dtype=np.float32).reshape(rows, 64)
        new_w = np.linspace(2, -2, 640, dtype=np.float32).reshape(10, 64)
        cg.set_param("w", new_w)
        assert_matches_reference(g, {"x": xv}, cg.run({"x": xv}), params={"w": new_w})


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("w1", np.zeros((8, 15), np.float32), "shape"),
        ("w1", np.zeros((8, 16), np.float64), "dtype"),
        ("w1", "not an array", "w1"),
        ("nope", np.zeros((8, 16), np.float32), "no param 'nope'"),
    ],
)
def test_set_param_is_atomic_on_a_bad_value(registry: Registry, name: str, value: object, match: str) -> None:
    graph = mlp_graph()
    cg = rlx.compile(graph, device="cpu", registry=registry)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    before = [o.copy() for o in cg.run({"x": x})]
    with pytest.raises(InputError, match=match):
        cg.set_param(name, value)
    with pytest.raises(InputError, match=match):
        cg._exe.set_param(name, value)  # the executable checks too, before copying anything
    for got, want in zip(cg.run({"x": x}), before):
        np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- large outputs
_UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu")
_BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("last", ["matmul", "gemm", *_UNARY, *_BINARY])
def test_large_outputs_are_handed_over_fresh_and_right(registry: Registry, fuse: bool, last: str) -> None:
    """Outputs past ``HANDOFF_BYTES`` are written into a fresh array each run (no copy out):
    every op that can end a graph there computes the same as the reference, twice."""
    from rlx_cpu.executor import HANDOFF_BYTES

    n = 192  # 192 x 192 float32 = 144 KiB, past the hand-off size
    assert n * n * 4 >= HANDOFF_BYTES
    rng = np.random.default_rng(7)
    g = Graph(f"big_{last}")
    x = g.input("x", (n, n), "float32")
    w = g.param("w", (rng.standard_normal((n, n)) / n).astype(np.float32))
    h = g.add(g.mul(x, 0.5), 1.5)  # positive, for log/sqrt/pow
    if last == "matmul":
        y = g.matmul(h, w)
    elif last == "gemm":
        y = g.relu(g.add(g.matmul(h, w), g.param("b", rng.standard_normal(n).astype(np.float32))))
    elif last in _UNARY:
        y = getattr(g, last)(h)
    else:
        y = getattr(g, last)(h, g.add(x, 2.0))
    g.set_outputs([y, g.mul(y, 2.0)])
    opts = CompileOptions() if fuse else CompileOptions(optimize=False, fuse=False)
    cg = rlx.compile(g, device="cpu", policy=rlx.DevicePolicy(), registry=registry, options=opts)
    xv = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    first = cg.run({"x": xv})
    second = cg.run({"x": xv})
    for a, b, ref in zip(first, second, reference.evaluate(g, {"x": xv})):
        np.testing.assert_allclose(a, ref, rtol=2e-4, atol=2e-5)
        np.testing.assert_array_equal(a, b)
        assert not np.shares_memory(a, b) and a.flags.writeable


def _big_output_graph(n: int, last: str) -> Graph:
    g = Graph(f"recycled_{last}")
    x = g.input("x", (n, n), "float32")
    if last == "matmul":  # handed over fresh (no copy out)
        y = g.matmul(x, g.param("w", np.eye(n, dtype=np.float32) * 2))
    else:  # a transpose's output is copied out
        y = g.transpose(g.mul(x, 2.0), (1, 0))
    g.set_outputs([y])
    return g


@pytest.mark.parametrize("last", ["matmul", "transpose"])
def test_large_outputs_reuse_memory_only_once_the_caller_lets_go(registry: Registry, last: str) -> None:
    """A large output's array is written again by a later run only when nothing refers to
    it any more: a held array, or a view of it, keeps its values; a dropped one's memory
    serves the next run (no fresh pages to fault in)."""
    from rlx_cpu.steps import RECYCLE_BYTES

    n = 160
    assert n * n * 4 >= RECYCLE_BYTES
    cg = rlx.compile(_big_output_graph(n, last), device="cpu", registry=registry)
    wide_only(cg._exe)
    xs = [np.full((n, n), float(v), np.float32) for v in range(4)]
    held = cg.run({"x": xs[1]})[0]
    again = cg.run({"x": xs[2]})[0]
    assert not np.shares_memory(held, again)
    np.testing.assert_array_equal(held, 2.0)  # held: never overwritten
    view = again[::2]
    del again
    third = cg.run({"x": xs[3]})[0]
    np.testing.assert_array_equal(view, 4.0)  # a view keeps its base from being reused
    np.testing.assert_array_equal(third, 6.0)
    address = third.ctypes.data
    del third
    fourth = cg.run({"x": xs[0]})[0]
    assert fourth.ctypes.data == address  # dropped: the same memory, rewritten
    np.testing.assert_array_equal(fourth, 0.0)
    assert fourth.flags.writeable and fourth.flags.owndata


def test_small_outputs_are_fresh_copies(registry: Registry) -> None:
    cg = rlx.compile(_big_output_graph(8, "transpose"), device="cpu", registry=registry)
    b = cg.run({"x": np.ones((8, 8), np.float32)})[0]
    c = cg.run({"x": np.zeros((8, 8), np.float32)})[0]
    assert not np.shares_memory(b, c)
    np.testing.assert_array_equal(b, 2.0)


# ----------------------------------------------------------------------------- big regions on two threads
def _big_region_graph(rows: int, cols: int, dtype: str = "float32", lead: tuple[int, ...] = ()) -> Graph:
    g = Graph("big")
    x = g.input("x", (*lead, rows, cols), dtype)
    row = g.param("row", np.linspace(-1, 1, cols).astype(dtype))  # broadcast along the split axis
    col = g.input("col", (rows, 1), dtype)  # split along with the output
    y = g.mul(g.add(x, row), col)
    if dtype.startswith("float"):
        y = g.tanh(g.sub(g.exp(g.neg(g.abs(y))), g.erf(y)))
    else:
        y = g.div(g.add(y, row), col)
    g.set_outputs([y, g.add(y, x)])  # the second region reads the first's result
    return g


@pytest.mark.parametrize(("lead", "rows", "cols"), [
    ((), 1024, None),  # split along axis 0, blocks along it too
    ((), 1, None),  # axis 0 is 1: split along axis 1
    ((1,), 128, 1024),  # split along axis 1 into halves of one block each, blocked along axis 0
])
def test_big_regions_run_as_two_halves_and_agree(registry: Registry, lead: tuple[int, ...], rows: int,
                                                  cols: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import fused, steps

    monkeypatch.setenv("RLX_CPU_NATIVE", "0")  # numpy's path for regions (native.c's is tested in test_native.py)
    bound = []
    real = steps._bind_parallel
    monkeypatch.setattr(steps, "_bind_parallel", lambda step, slots: bound.append(step) or real(step, slots))
    if cols is None:
        cols = fused.PARALLEL_ELEMENTS // rows + 3
    else:
        monkeypatch.setattr(fused, "PARALLEL_ELEMENTS", rows * cols)
    g = _big_region_graph(rows, cols, lead=lead)
    cg = rlx.compile(g, device="cpu", registry=registry)
    if steps.helper_threads() > 0:
        assert len(bound) == 1 and bound[0].first and bound[0].second  # the region (the last add is one op)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((*lead, rows, cols)).astype(np.float32),
             "col": rng.standard_normal((rows, 1)).astype(np.float32)}
    got = cg.run(feeds)
    for a, b in zip(got, reference.evaluate(g, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    plain = rlx.compile(g, device="cpu", registry=registry, options=CompileOptions(fuse=False))
    for a, b in zip(got, plain.run(feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_an_error_in_the_second_half_surfaces_and_the_plan_still_works(registry: Registry) -> None:
    rows, cols = 1024, 600
    g = _big_region_graph(rows, cols, "int32")
    cg = rlx.compile(g, device="cpu", registry=registry)
    x = np.ones((rows, cols), np.int32)
    col = np.ones((rows, 1), np.int32)
    col[-1] = 0  # a division by zero in the last row: the helper thread's half
    with pytest.raises(InputError, match="division by zero"):
        cg.run({"x": x, "col": col})
    col[-1] = 1
    want = reference.evaluate(g, {"x": x, "col": col})
    for a, b in zip(cg.run({"x": x, "col": col}), want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_big_regions_on_threads_of_its_own(registry: Registry) -> None:
    """The helper threads do not survive a fork; the child makes its own (no hang)."""
    rows, cols = 1024, 600
    g = _big_region_graph(rows, cols)
    cg = rlx.compile(g, device="cpu", registry=registry)
    feeds = {"x": np.ones((rows, cols), np.float32), "col": np.ones((rows, 1), np.float32)}
    want = cg.run(feeds)[0]  # the parent's pool exists now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report, and leave without pytest's teardown
        ok = b"0"
        try:
            ok = b"1" if np.array_equal(cg.run(feeds)[0], want) else b"0"
        finally:
            os.write(write, ok)
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung running a big region")
    assert os.read(read, 1) == b"1"
    os.close(read)


def test_a_dropped_executable_frees_its_plans_without_the_collector() -> None:
    """The generated run and step functions sit in no reference cycle (an exec'd function
    is taken out of its own globals): a compiled graph dropped by its last owner, as a
    shape class an LRU evicts, frees its steps, kernels and plan buffers at once."""
    import gc
    import weakref

    from rlx_cpu.steps import Step, bind

    g = Graph("freed")
    x = g.input("x", (2, 3, 8, 8), "float32")
    h = g.relu(g.conv2d(x, g.param("w", np.ones((4, 3, 3, 3), np.float32)), padding=1))
    g.set_outputs([g.softmax(g.reshape(h, (2, -1)), axis=-1)])
    exe = CpuBackend().compile(g, CompileOptions(device="cpu"))
    exe.run({"x": np.ones((2, 3, 8, 8), np.float32)})
    run = weakref.ref(exe._pool[0].run)
    step = bind(Step(np.copyto, (np.zeros(3), np.ones(3))), [])
    stepped = weakref.ref(step)
    was = gc.isenabled()
    gc.disable()
    try:
        del exe, step
        assert run() is None, "the plan's run function outlived its executable: a reference cycle"
        assert stepped() is None, "a bound step outlived its last owner: a reference cycle"
    finally:
        if was:
            gc.enable()
