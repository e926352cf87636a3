"""Symbolic graphs through compile and run: any sizes that satisfy the graph, one compiled
copy per shape class on the device picked once, errors naming the dim (dynamic.py)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from support import RefExecutable, ToyBackend, registry_with

import rlx_core as rlx
from rlx_core import reference
from rlx_core.compiler.dynamic import REPRESENTATIVE_SIZES, STATIC_AFTER, DynamicCompiledGraph, representative

RNG = np.random.default_rng(7)
W = RNG.standard_normal((16, 8)).astype(np.float32)


def mlp() -> rlx.Graph:
    """x[batch, 16] @ w -> relu -> softmax: every op keeps the batch symbolic."""
    g = rlx.Graph("dyn-mlp")
    x = g.input("x", ("batch", 16), "float32")
    w = g.param("w", W)
    g.set_outputs([g.softmax(g.relu(g.matmul(x, w)), axis=-1)])
    return g


def encoder() -> rlx.Graph:
    """x[batch, seq, 32]: layer norm, a product, a reshape over both symbols and a sum."""
    g = rlx.Graph("dyn-enc")
    x = g.input("x", ("batch", "seq", 32), "float32")
    scale, bias = g.constant(np.ones(32, np.float32)), g.constant(np.zeros(32, np.float32))
    h = g.layer_norm(x, scale, bias, axis=-1, eps=1e-5)
    h = g.matmul(h, g.param("w", RNG.standard_normal((32, 32)).astype(np.float32)))
    flat = g.reshape(h, (-1, 32))
    g.set_outputs([g.reduce_sum(flat, axes=(1,), keepdims=False), g.gelu(h)])
    return g


def x_of(batch: int, width: int = 16) -> np.ndarray:
    return RNG.standard_normal((batch, width)).astype(np.float32)


def assert_matches(g: rlx.Graph, outs: list[np.ndarray], feeds: dict[str, np.ndarray]) -> None:
    want = reference.evaluate(g, feeds)
    assert len(outs) == len(want)
    for got, ref in zip(outs, want):
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


def test_a_symbolic_graph_runs_every_batch_on_cpu() -> None:
    g = mlp()
    cg = rlx.compile(g, device="cpu")
    assert isinstance(cg, rlx.CompiledGraph) and isinstance(cg, DynamicCompiledGraph)
    for batch in (1, 3, 8, 17, 3):
        feeds = {"x": x_of(batch)}
        (out,) = cg.run(feeds)
        assert out.shape == (batch, 8)
        assert_matches(g, [out], feeds)
    # an explicit device: placed at the representative size (nothing compiled at 16, which no run
    # asked for), the first size run compiled for itself, and every later new size run on the one
    # executable cpu compiled for every size (it runs symbolic graphs itself): no compile
    assert [d["batch"] for d in cg.shapes()] == [1] and cg.compiles == 2  # batch 1's, then the one for every size
    assert any(n.startswith("any size: one executable for every size") for n in cg.report().notes)
    # a size met STATIC_AFTER times there is compiled for itself at its next run
    for _ in range(STATIC_AFTER - 1):
        feeds = {"x": x_of(3)}
        assert_matches(g, cg.run(feeds), feeds)
    assert [d["batch"] for d in cg.shapes()] == [1, 3] and cg.compiles == 3


def test_each_class_compiled_on_its_own_where_cpu_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CPU_ANY_SIZE", "0")
    g = mlp()
    cg = rlx.compile(g, device="cpu")
    for batch in (1, 3, 8, 17, 3):
        feeds = {"x": x_of(batch)}
        assert_matches(g, cg.run(feeds), feeds)
    assert sorted(d["batch"] for d in cg.shapes()) == [1, 3, 8, 17] and cg.compiles == 4
    assert not any(n.startswith("any size") for n in cg.report().notes)


def test_two_symbols_and_a_reshape_across_them() -> None:
    g = encoder()
    cg = rlx.compile(g, device="cpu")
    for batch, seq in ((1, 7), (3, 64), (2, 1)):
        feeds = {"x": RNG.standard_normal((batch, seq, 32)).astype(np.float32)}
        outs = cg.run(feeds)
        assert outs[0].shape == (batch * seq,) and outs[1].shape == (batch, seq, 32)
        assert_matches(g, outs, feeds)


@pytest.mark.slow  # probes and compiles on every real backend
def test_auto_places_at_a_representative_size_and_says_so() -> None:
    g = mlp()
    cg = rlx.compile(g)
    text = str(cg.report())
    assert f"batch={REPRESENTATIVE_SIZES[0]}" in text and "per shape class" in text, text
    cg.run({"x": x_of(5)})
    assert "shape class batch=5: compiled in" in str(cg.report())
    rows = rlx.device_report(g)
    assert any(r.device == "cpu" and r.supports_graph for r in rows)
    assert rlx.devices_for(g)[0] in rlx.available_devices()


def test_sizes_that_conflict_name_the_dim_and_both_sizes() -> None:
    g = rlx.Graph("two")
    x = g.input("x", ("batch", 4), "float32")
    m = g.input("m", ("batch", 4), "float32")
    g.set_outputs([g.add(x, m)])
    cg = rlx.compile(g, device="cpu")
    with pytest.raises(rlx.InputError, match=r"batch") as info:
        cg.run({"x": np.zeros((3, 4), np.float32), "m": np.zeros((5, 4), np.float32)})
    assert "3" in str(info.value) and "5" in str(info.value)
    with pytest.raises(rlx.InputError, match=r"'x'"):  # a fixed dim still has to match
        cg.run({"x": np.zeros((3, 5), np.float32), "m": np.zeros((3, 5), np.float32)})
    with pytest.raises(rlx.InputError, match=r"missing input\(s\) 'm'"):
        cg.run({"x": np.zeros((3, 4), np.float32)})
    with pytest.raises(rlx.InputError, match=r"unknown input\(s\) 'y'"):
        cg.run({"x": np.zeros((3, 4), np.float32), "m": np.zeros((3, 4), np.float32), "y": 1})
    with pytest.raises(rlx.InputError, match=r"dtype"):
        cg.run({"x": np.zeros((3, 4), np.float64), "m": np.zeros((3, 4), np.float64)})


def test_shape_classes_are_bounded_least_recently_used_first() -> None:
    g = mlp()
    compiled: list[int] = []
    first = rlx.compile(representative(g)[0], device="cpu")
    cg = DynamicCompiledGraph(g.freeze(), first, representative(g)[1],
                              lambda spec: compiled.append(1) or rlx.compile(spec, device="cpu"),  # type: ignore[func-returns-value]
                              max_shapes=2)
    for batch in (1, 2, 1, 3):
        cg.run({"x": x_of(batch)})
    assert [d["batch"] for d in cg.shapes()] == [1, 3]  # 2 was the least recently used
    cg.run({"x": x_of(2)})
    assert len(compiled) == 3 + 1  # batch 2 compiled again after it was dropped
    with pytest.raises(ValueError, match="max_shapes"):
        DynamicCompiledGraph(g, first, {}, lambda spec: first, max_shapes=0)


def test_set_param_reaches_every_copy_kept_and_later() -> None:
    g = mlp()
    cg = rlx.compile(g, device="cpu")
    cg.run({"x": x_of(2)})
    new_w = (W * -1.0).astype(np.float32)
    cg.set_param("w", new_w)
    for batch in (2, 9):  # a kept copy and a new one
        feeds = {"x": x_of(batch)}
        (out,) = cg.run(feeds)
        h = np.maximum(feeds["x"].astype(np.float64) @ new_w.astype(np.float64), 0)
        want = np.exp(h - h.max(-1, keepdims=True))
        np.testing.assert_allclose(out, want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    with pytest.raises(rlx.InputError, match="'w'"):
        cg.set_param("w", np.zeros((3, 3), np.float32))


def test_shape_classes_share_the_weights_and_stay_apart_from_another_compile() -> None:
    g = mlp()
    cg = rlx.compile(g, device="cpu")
    other = rlx.compile(g, device="cpu")  # a compile of its own: its own weights
    copies = [cg.for_inputs({"x": x_of(b)}) for b in (2, 5)]
    held = [c._exe._params["w"] for c in copies]  # (rlx-cpu's: the graph's own array until a set_param)
    assert held[0] is held[1], "two shape classes of one graph hold the weight once"
    cg.set_param("w", np.zeros_like(W))
    for batch in (2, 5, 7):  # kept copies and a new one see the new weight
        np.testing.assert_array_equal(cg.run({"x": x_of(batch)})[0], np.full((batch, 8), 1 / 8, np.float32))
    owned = [cg.for_inputs({"x": x_of(b)})._exe._params["w"] for b in (2, 5, 7)]
    assert owned[0] is owned[1] is owned[2], "and once after it"
    assert not np.shares_memory(other.for_inputs({"x": x_of(2)})._exe._params["w"], owned[0])
    feeds = {"x": x_of(3)}
    assert_matches(g, other.run(feeds), feeds)  # the other compile still has the old one


def test_the_family_is_what_a_backend_sees_during_each_compile() -> None:
    from rlx_core.plugin import ShapeFamily, shape_family

    seen: list[object] = []

    class Recording(ToyBackend):
        def compile(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable:
            seen.append(shape_family())
            return super().compile(graph, options)

    reg = registry_with(Recording("toy"))
    cg = rlx.compile(mlp(), device="toy", policy=rlx.DevicePolicy(), registry=reg)
    cg.run({"x": x_of(3)})
    cg.run({"x": x_of(5)})
    assert len(seen) == 2 and isinstance(seen[0], ShapeFamily) and seen[0] is seen[1]
    assert shape_family() is None, "outside a compile no family is active"
    static = rlx.Graph("static")
    static.set_outputs([static.relu(static.input("x", (2, 3), "float32"))])
    rlx.compile(static, device="toy", policy=rlx.DevicePolicy(), registry=reg)
    assert seen[-1] is None, "a static graph's compile has no family"


def test_graph_devices_and_fallback_take_symbolic_graphs() -> None:
    g = mlp()
    gd = rlx.GraphDevices(g)
    for batch in (1, 6):
        feeds = {"x": x_of(batch)}
        assert_matches(g, gd.run(feeds, device="cpu"), feeds)
        assert_matches(g, gd.run(feeds), feeds)
    device, outs = rlx.run_with_fallback(g, {"x": x_of(4)})
    assert outs[0].shape == (4, 8) and device in rlx.available_devices()
    for batch in (2, 9):  # later sizes of GraphDevices' copy run on cpu's executable for every size
        feeds = {"x": x_of(batch)}
        assert_matches(g, gd.run(feeds, device="cpu"), feeds)
    notes = gd.compile("cpu").report().notes
    assert any(n.startswith("any size: one executable for every size") for n in notes), notes


def test_a_toy_backend_is_handed_static_graphs_only() -> None:
    seen: list[tuple] = []

    class Recording(ToyBackend):
        def compile(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable:
            seen.append(tuple(graph.node(i).shape for i in graph.inputs))
            assert not graph.is_symbolic
            return super().compile(graph, options)

    reg = registry_with(Recording("toy"))
    cg = rlx.compile(mlp(), device="toy", policy=rlx.DevicePolicy(), registry=reg)
    cg.run({"x": x_of(3)})
    assert seen == [((3, 16),)]  # placed at the representative size, compiled only at the size run
    cg_auto = rlx.compile(mlp(), policy=rlx.DevicePolicy(), registry=reg)  # auto: compiled there, for fallback
    cg_auto.run({"x": x_of(3)})
    assert seen[1:] == [((REPRESENTATIVE_SIZES[0], 16),), ((3, 16),)]


def test_a_graph_no_representative_size_fits_is_a_clear_error() -> None:
    g = rlx.Graph("pinned")
    x = g.input("x", ("n", 4), "float32")
    g.set_outputs([g.add(x, g.constant(np.ones((5, 4), np.float32)))])  # n can only be 5: why a symbol?
    with pytest.raises(rlx.GraphError, match=r"graph 'pinned' has symbolic dims \(n\) and no representative size"):
        rlx.compile(g, device="cpu")


def test_a_symbolic_graph_no_device_runs_alone_is_split_for_every_shape_class() -> None:
    from support import ALL_OPS

    reg = registry_with(ToyBackend("mm", ops={"matmul"}), ToyBackend("rest", ops=set(ALL_OPS) - {"matmul"}))
    g = mlp()
    cg = rlx.compile(g, policy=rlx.DevicePolicy(), registry=reg)
    assert isinstance(cg, DynamicCompiledGraph) and "+" in cg.device
    for batch in (2, 5):
        feeds = {"x": x_of(batch)}
        assert_matches(g, cg.run(feeds), feeds)
    assert len(cg.shapes()) == 3


# ------------------------------------------------------------- the pipeline run once
def _class_notes(cg: DynamicCompiledGraph) -> list[str]:
    return [n for n in cg.report().notes if n.startswith("shape class ")]


def test_later_shape_classes_compile_from_the_graph_lowered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first class after the representative one takes the old road (the pipeline on
    one specialization is cheaper than on the symbolic graph); every later one comes from
    the graph lowered once (cpu told to compile each class, not to run any size)."""
    monkeypatch.setenv("RLX_CPU_ANY_SIZE", "0")
    g = encoder()
    cg = rlx.compile(g, device="cpu")
    for batch, seq in [(2, 3), (1, 9), (4, 5), (3, 3)]:
        feeds = {"x": RNG.standard_normal((batch, seq, 32)).astype(np.float32)}
        assert_matches(g, cg.run(feeds), feeds)
    notes = _class_notes(cg)  # (an explicit device: nothing compiled at the representative size)
    assert len(notes) == 4 and "lowered once" not in notes[0]
    assert all("from the graph lowered once" in n for n in notes[1:]), notes


def test_claims_never_see_a_symbol_and_a_declined_class_takes_the_old_road() -> None:
    """The backend is asked about each node at the representative size, and again about
    every specialization; a class whose softmax it declines (batch 5) is lowered on its
    own (the softmax decomposed), right all the same."""
    asked: list[tuple] = []

    class Picky(ToyBackend):
        def claims(self, node: rlx.Node) -> bool | str:
            assert all(isinstance(d, int) for d in node.shape), node
            asked.append(node.shape)
            if node.op == "softmax" and node.shape[0] == 5:
                return "no softmax of 5 rows today"
            return super().claims(node)

    toy = Picky("toy")
    g = mlp()
    cg = rlx.compile(g, device="toy", policy=rlx.DevicePolicy(), registry=registry_with(toy))
    for batch in (2, 3, 5, 7):
        feeds = {"x": x_of(batch)}
        assert_matches(g, cg.run(feeds), feeds)
    notes = _class_notes(cg)
    by_batch = {n.split(",")[0].split("=")[1].split(":")[0]: n for n in notes}
    assert "lowered once" in by_batch["3"] and "lowered once" in by_batch["7"]
    assert "lowered once" not in by_batch["5"] and "lowered once" not in by_batch["2"]
    assert asked


def test_a_symbolic_pipeline_that_fails_leaves_every_class_to_the_old_road(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_core.compiler import lowered_once

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a pass that cannot take symbols")

    monkeypatch.setattr(lowered_once, "run_pipeline", broken)
    g = mlp()
    cg = rlx.compile(g, device="cpu")
    for batch in (2, 6, 9):
        feeds = {"x": x_of(batch)}
        assert_matches(g, cg.run(feeds), feeds)
    assert not any("lowered once" in n for n in _class_notes(cg))


def test_an_explicit_device_places_at_compile_and_compiles_on_the_first_run() -> None:
    """Placed (and a blocker named) by ``compile``; nothing compiled until a run needs a class."""
    toy = ToyBackend("toy")
    reg = registry_with(toy)
    cg = rlx.compile(mlp(), device="toy", policy=rlx.DevicePolicy(), registry=reg)
    assert cg.device == "toy" and cg.shapes() == [] and toy.compiles == 0
    assert "placed and priced at batch=16" in str(cg.report())
    feeds = {"x": x_of(2)}
    assert_matches(mlp(), cg.run(feeds), feeds)
    assert toy.compiles == 1 and cg.shapes() == [{"batch": 2}]
    no_matmul = registry_with(ToyBackend("toy", ops=[op for op in ToyBackend().ops if op != "matmul"]))
    with pytest.raises(rlx.DeviceError, match="matmul"):
        rlx.compile(mlp(), device="toy", policy=rlx.DevicePolicy(), registry=no_matmul)


# ------------------------------------------------------------- backends that run any size
class AnySizeToy(ToyBackend):
    """A toy that runs symbolic graphs itself: ``compile_symbolic`` returns the reference
    interpreter over the symbolic graph (it binds the sizes from its inputs)."""

    def __init__(self, name: str = "toy", *, misbehave: str | None = None) -> None:
        super().__init__(name)
        self.symbolic: list[rlx.Graph] = []
        self.misbehave = misbehave

    def compile_symbolic(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable | None:
        assert graph.is_symbolic and options.device == self.name
        self.symbolic.append(graph)
        if self.misbehave == "raise":
            raise RuntimeError("no symbols today")
        if self.misbehave == "decline":
            return None
        if self.misbehave == "not an executable":
            return "a string"  # type: ignore[return-value]
        return SymbolicRef(graph, self)


class SymbolicRef(RefExecutable):
    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if self.owner.misbehave == "fail at 5" and next(iter(inputs.values())).shape[0] == 5:
            raise RuntimeError("no batch of 5")
        outs = super().run(inputs)
        if self.owner.misbehave == "wrong shape":
            outs[0] = outs[0][:1]
        return outs


def test_a_backend_that_runs_any_size_serves_new_sizes_with_no_compile() -> None:
    toy = AnySizeToy()
    g = mlp()
    cg = rlx.compile(g, device="toy", policy=rlx.DevicePolicy(), registry=registry_with(toy))
    for batch in (2, 3, 5, 7, 3):
        feeds = {"x": x_of(batch)}
        assert_matches(g, cg.run(feeds), feeds)
    # batch 2 compiled for itself (one more size may be all a graph meets), then one
    # executable for every size, compiled once, ran 3, 5, 7 and 3 again
    assert len(toy.symbolic) == 1 and toy.compiles == 1 and cg.compiles == 2
    assert [d["batch"] for d in cg.shapes()] == [2]
    notes = cg.report().notes
    assert any(n.startswith("any size: one executable for every size compiled in") for n in notes), notes
    assert "any size: 4 run(s) of new sizes served with no compile" in notes
    for _ in range(STATIC_AFTER - 1):  # batch 3's third run there; the next compiles it for itself
        cg.run({"x": x_of(3)})
    assert [d["batch"] for d in cg.shapes()] == [2, 3] and toy.compiles == 2
    w2 = RNG.standard_normal(W.shape).astype(np.float32)  # set_param reaches it, and the classes
    cg.set_param("w", w2)
    g2 = mlp()
    g2.replace_value(g2.params[0], w2)
    for batch in (3, 11):
        feeds = {"x": x_of(batch)}
        assert_matches(g2, cg.run(feeds), feeds)


@pytest.mark.parametrize("misbehave", ["raise", "decline", "not an executable"])
def test_a_backend_that_cannot_run_this_graph_at_any_size_gets_each_class(misbehave: str) -> None:
    toy = AnySizeToy(misbehave=misbehave)
    g = mlp()
    cg = rlx.compile(g, device="toy", policy=rlx.DevicePolicy(), registry=registry_with(toy))
    for batch in (2, 3, 5, 3):
        feeds = {"x": x_of(batch)}
        assert_matches(g, cg.run(feeds), feeds)
    assert len(toy.symbolic) == 1 and toy.compiles == 3 and cg.compiles == 3  # asked once, then the old way
    assert not any(n.startswith("any size") for n in cg.report().notes)


def test_an_output_of_the_wrong_size_from_the_executable_for_every_size_names_the_backend() -> None:
    toy = AnySizeToy(misbehave="wrong shape")
    cg = rlx.compile(mlp(), device="toy", policy=rlx.DevicePolicy(), registry=registry_with(toy))
    cg.run({"x": x_of(2)})
    with pytest.raises(rlx.PluginError, match=r"backend 'toy' returned output 0 .* at \{'batch': 3\} the graph "
                                              r"declares float32\[3, 8\]"):
        cg.run({"x": x_of(3)})


def test_a_size_dropped_from_the_lru_is_not_compiled_again() -> None:
    """A class compiled after STATIC_AFTER runs and later dropped by the LRU runs on the
    executable for every size again: a server cycling through more sizes than the LRU
    keeps does not compile one every few requests."""
    toy = AnySizeToy()
    cg = rlx.compile(mlp(), device="toy", policy=rlx.DevicePolicy(), registry=registry_with(toy))
    cg._max_shapes = 1  # (an LRU of one: the next class compiled drops the last)
    cg.run({"x": x_of(2)})  # compiled for itself (one symbol: the first new size)
    for batch in (3, 4):
        for _ in range(STATIC_AFTER + 1):  # the last of these compiles it
            cg.run({"x": x_of(batch)})
    assert toy.compiles == 3 and [d["batch"] for d in cg.shapes()] == [4]  # batch 3 compiled, then dropped
    for _ in range(2 * STATIC_AFTER):
        cg.run({"x": x_of(3)})
    assert toy.compiles == 3 and [d["batch"] for d in cg.shapes()] == [4]


def test_an_executable_for_every_size_that_fails_leaves_that_size_compiled_on_its_own() -> None:
    toy = AnySizeToy(misbehave="fail at 5")
    g = mlp()
    cg = rlx.compile(g, device="toy", policy=rlx.DevicePolicy(), registry=registry_with(toy))
    for batch in (2, 3):
        feeds = {"x": x_of(batch)}
        assert_matches(g, cg.run(feeds), feeds)
    feeds = {"x": x_of(5)}
    with pytest.warns(rlx.FallbackWarning, match=r"every size of graph 'dyn-mlp' failed at batch=5 .*RuntimeError: "
                                                  r"no batch of 5.*compiling that size on its own"):
        assert_matches(g, cg.run(feeds), feeds)
    assert [d["batch"] for d in cg.shapes()] == [2, 5]
    cg._classes.clear()  # (as if the LRU had dropped them both)
    assert_matches(g, cg.run(feeds), feeds)  # compiled again, not tried there again: no warning
    with pytest.raises(rlx.InputError):  # a size the graph refuses is the caller's error, not a fallback
        cg.run({"x": np.zeros((3, 7), np.float32)})
