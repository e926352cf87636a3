"""``precision="bf16"`` on cpu (``onednn.precisions``, ``onednn_steps.operand_types``,
``bf16_units``): declared only where the CPU has AMX or AVX512_BF16 and oneDNN is
installed; then convolutions and dense layers' products that oneDNN runs on a unit that
pays here take bf16 operands (float32 accumulation) and nothing else changes.

Every product is held to the bound of bf16 operands with float32 accumulation
(``rlx_core.testing._precision.product_bound``) against the float64 reference, and must
differ from the float32 answer (it really ran in bf16). The tests that run bf16 skip on a
host without such a unit (those of AMX's own kernels on one without AMX); they hold what
bf16 computes, not whether it pays, so they take AVX512-BF16 untimed (``RLX_CPU_BF16=on``:
a timing beside the other pytest worker once said "not taken" and skipped them all). The
declaration's and the planning's logic is tested everywhere, on flags made up."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_core as rlx
from rlx_core.ir import Graph
from rlx_core.ir.ops import SOURCE_OPS, OpKind
from rlx_core.reference import evaluate
from rlx_core.testing import check_backend
from rlx_core.testing._precision import product_bound
from rlx_cpu import bf16_units, held, layout, native, onednn, verdicts

CPU = rlx.get_backend("cpu")
HAS_BF16 = "bf16" in CPU.precisions() and bf16_units.unit() is not None
UNIT = bf16_units.unit()
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="bf16 needs a CPU whose AMX or AVX512_BF16 makes it pay, and "
                                f"oneDNN (rlx-cpu[onednn]); this host declares {sorted(CPU.precisions()) or 'none'}"
                                f" ({bf16_units.describe()})")
needs_amx = pytest.mark.skipif(not HAS_BF16 or UNIT != bf16_units.AMX,
                               reason=f"AMX's own kernels; this host's bf16 unit: {bf16_units.describe()}")
AMX_FLAGS = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})


@pytest.fixture(autouse=True)
def _bf16_untimed(monkeypatch):
    monkeypatch.setenv("RLX_CPU_BF16", "on")


@pytest.fixture
def amx_flags(monkeypatch):
    """The CPU's flags made up as an AMX host's: what ``held``'s planning expects there."""
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: AMX_FLAGS)


def within_bf16(got: np.ndarray, graph: Graph, absolute: Graph, feeds: dict[str, np.ndarray], terms: int) -> None:
    exact = evaluate(graph, feeds)[0]
    magnitude = evaluate(absolute, {k: np.abs(v) for k, v in feeds.items()})[0]
    excess = np.abs(got.astype(np.float64) - exact) - product_bound("bf16", terms, magnitude)
    assert excess.max() <= 0, f"{excess.max()} beyond the bf16 bound"
    assert not np.allclose(got, exact, rtol=1e-5, atol=1e-6), "no rounding: the product ran in float32"


def conv_graphs(x_shape: tuple[int, ...], w: np.ndarray, bias: np.ndarray | None, **kw: object) -> tuple[Graph, Graph]:
    graphs = []
    for sign in (1, -1):
        weights = w if sign == 1 else np.abs(w)
        g = Graph("conv")
        b = None if bias is None else g.param("b", bias if sign == 1 else np.abs(bias))
        g.set_outputs([g.conv2d(g.input("x", x_shape), g.param("w", weights), b, **kw)])
        graphs.append(g)
    return graphs[0], graphs[1]


def test_bf16_is_declared_only_with_a_bf16_unit_and_onednn(monkeypatch):
    monkeypatch.setattr(onednn, "find_library", lambda: "/lib/libdnnl.so.3")
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: frozenset({"avx512f", "avx2"}))
    assert CPU.precisions() == frozenset()
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert CPU.precisions() == frozenset({"bf16"})  # which products take it: timed (bf16_units)
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: frozenset({"avx512f", "amx_bf16", "amx_tile"}))
    monkeypatch.setattr(onednn, "find_library", lambda: None)
    assert CPU.precisions() == frozenset()  # no oneDNN
    monkeypatch.setattr(onednn, "find_library", lambda: "/lib/libdnnl.so.3")
    assert CPU.precisions() == frozenset({"bf16"})
    monkeypatch.setenv("RLX_CPU_ONEDNN", "off")
    assert CPU.precisions() == frozenset()


def test_the_probe_says_which_precisions_this_host_takes_and_why_not(monkeypatch):
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: frozenset({"avx512f", "avx2"}))
    assert CPU.probe().versions["precision"] == ("float32 only: bf16 needs a CPU with AMX or AVX512_BF16 (this one "
                                                 "has neither)")
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setattr(onednn, "find_library", lambda: None)
    assert CPU.probe().versions["precision"] == "float32 only: bf16 runs on oneDNN (pip install 'rlx-cpu[onednn]')"
    monkeypatch.setattr(onednn, "find_library", lambda: "/lib/libdnnl.so.3")
    assert CPU.probe().versions["precision"].startswith("bf16 when allowed (precision='bf16': AMX; oneDNN)")
    monkeypatch.setenv("RLX_CPU_ONEDNN", "off")
    assert CPU.probe().versions["precision"] == "float32 only: bf16 runs on oneDNN, off here (RLX_CPU_ONEDNN=off)"


def test_a_host_without_it_says_float32_throughout(monkeypatch):
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: frozenset())
    rng = np.random.default_rng(0)
    g = Graph("mm")
    g.set_outputs([g.matmul(g.input("x", (4, 32)), g.param("w", rng.standard_normal((32, 8)).astype(np.float32)))])
    cg = rlx.compile(g, device="cpu", precision="bf16")
    assert any("cpu does not compute in bf16 on this host: float32 throughout" in n for n in cg.report().notes)
    feeds = {"x": rng.standard_normal((4, 32)).astype(np.float32)}
    np.testing.assert_allclose(cg.run(feeds)[0], evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)


@needs_bf16
def test_the_conformance_kit_holds_cpu_to_the_bf16_bound():
    report = check_backend(CPU, ops=["matmul", "conv2d"], max_examples=3)
    assert report["precisions"].outcome == "passed", report.summary()


@needs_bf16
def test_convolutions_take_bf16_operands():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    g, absolute = conv_graphs((2, 16, 14, 14), w, b, padding=1)
    feeds = {"x": rng.standard_normal((2, 16, 14, 14)).astype(np.float32)}
    cg = rlx.compile(g, device="cpu", precision="bf16")
    notes = " ".join(cg.report().notes)
    assert f"precision: 1 convolution with bf16 operands on {UNIT}" in notes, notes
    within_bf16(cg.run(feeds)[0], g, absolute, feeds, 16 * 9)


@needs_bf16
@pytest.mark.parametrize(("channels", "groups", "taken"),
                         [(128, 4, True), (64, 8, True), (24, 3, False), (32, 8, False), (16, 16, False)],
                         ids=["32 a group: AMX", "8 a group, merged in pairs: AMX", "8 a group, 3 groups: float32",
                              "4 a group: float32", "depthwise: float32"])
def test_grouped_convolutions_take_bf16_where_a_unit_runs_them_faster(channels, groups, taken):
    """On AMX where oneDNN runs them on the tiles (``taken``: 16 channels a group, or 8
    merged in pairs); on AVX512-BF16 every grouped one but a depthwise one."""
    if UNIT == bf16_units.AVX512_BF16:
        taken = groups != channels
    rng = np.random.default_rng(6)
    w = rng.standard_normal((channels, channels // groups, 3, 3)).astype(np.float32)
    g, absolute = conv_graphs((2, channels, 7, 7), w, None, padding=1, groups=groups)
    feeds = {"x": rng.standard_normal((2, channels, 7, 7)).astype(np.float32)}
    cg = rlx.compile(g, device="cpu", precision="bf16")
    notes = " ".join(cg.report().notes)
    got = cg.run(feeds)[0]
    if taken:
        assert f"1 convolution with bf16 operands on {UNIT}" in notes, notes
        within_bf16(got, g, absolute, feeds, channels // groups * 9)
    else:
        assert "no product here took it" in notes, notes
        np.testing.assert_allclose(got, evaluate(g, feeds)[0], rtol=1e-4, atol=1e-4)


@needs_bf16
def test_a_channels_last_chain_holds_the_value_between_its_convolutions_in_bf16():
    rng = np.random.default_rng(5)
    g = Graph("chain")
    x = g.input("x", (2, 16, 14, 14))
    y = g.relu(g.conv2d(x, g.param("w1", rng.standard_normal((32, 16, 3, 3)).astype(np.float32) / 12), padding=1))
    g.set_outputs([g.conv2d(y, g.param("w2", rng.standard_normal((8, 32, 1, 1)).astype(np.float32) / 6))])
    feeds = {"x": rng.standard_normal((2, 16, 14, 14)).astype(np.float32)}
    cg = rlx.compile(g, device="cpu", precision="bf16")
    notes = " ".join(cg.report().notes)
    assert "precision: 2 convolutions with bf16 operands" in notes, notes
    assert "1 value held bf16 between the steps that write and read it" in notes, notes
    exact = evaluate(g, feeds)[0]
    err = np.abs(cg.run(feeds)[0] - exact).max() / np.abs(exact).max()
    assert 1e-5 < err < 2e-2  # rounded, as bf16 is: two products deep through a relu


@needs_bf16
def test_dense_layers_take_bf16_operands_and_set_param_reorders_them_again():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((96, 40)).astype(np.float32)
    graphs = []
    for weights in (w, np.abs(w)):
        g = Graph("dense")
        g.set_outputs([g.matmul(g.input("x", (12, 96)), g.param("w", weights))])
        graphs.append(g)
    feeds = {"x": rng.standard_normal((12, 96)).astype(np.float32)}
    cg = rlx.compile(graphs[0], device="cpu", precision="bf16")
    assert any("1 product with bf16 operands" in n for n in cg.report().notes), cg.report().notes
    within_bf16(cg.run(feeds)[0], graphs[0], graphs[1], feeds, 96)
    w2 = rng.standard_normal((96, 40)).astype(np.float32)
    cg.set_param("w", w2)
    for graph, weights in zip(graphs, (w2, np.abs(w2))):
        graph.replace_value(graph.params[0], weights)
    within_bf16(cg.run(feeds)[0], graphs[0], graphs[1], feeds, 96)


@needs_bf16
def test_a_symbolic_graph_rounds_on_the_executable_for_every_size():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((256, 512)).astype(np.float32)
    graphs = []
    for weights in (w, np.abs(w)):
        g = Graph("dense_any")
        g.set_outputs([g.matmul(g.input("x", ("rows", 256)), g.param("w", weights))])
        graphs.append(g)
    cg = rlx.compile(graphs[0], device="cpu", precision="bf16")
    # Rows enough for oneDNN's product (``anysize_kernels.DENSE_MIN_MACS``; below it the
    # BLAS's float32 product is the faster), at sizes the any-size executable serves.
    for rows in (40, 77, 130):
        feeds = {"x": rng.standard_normal((rows, 256)).astype(np.float32)}
        sized = [gr.specialize({"rows": rows}) for gr in graphs]
        within_bf16(cg.run(feeds)[0], sized[0], sized[1], feeds, 256)
    assert any("precision: 1 dense layer with bf16 operands" in n for n in cg.report().notes), cg.report().notes


@needs_bf16
def test_float32_stays_exact_beside_a_bf16_copy():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    g, _ = conv_graphs((1, 8, 10, 10), w, None, padding=1)
    feeds = {"x": rng.standard_normal((1, 8, 10, 10)).astype(np.float32)}
    rounded = rlx.compile(g, device="cpu", precision="bf16").run(feeds)[0]
    exact = rlx.compile(g, device="cpu").run(feeds)[0]
    np.testing.assert_allclose(exact, evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)
    assert not np.array_equal(rounded, exact)


@needs_bf16
@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.integers(1, 3), st.sampled_from([3, 8, 17]), st.sampled_from([4, 16, 33]), st.sampled_from([1, 3, 5]),
       st.sampled_from([1, 2]), st.integers(5, 16), st.integers(0, 2**16))
def test_any_convolution_at_bf16_is_within_the_bound(n, c, o, k, stride, size, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((o, c, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    g, absolute = conv_graphs((n, c, size, size), w, b, padding=k // 2, stride=stride)
    feeds = {"x": rng.standard_normal((n, c, size, size)).astype(np.float32)}
    got = rlx.compile(g, device="cpu", precision="bf16").run(feeds)[0]
    exact = evaluate(g, feeds)[0]
    magnitude = evaluate(absolute, {"x": np.abs(feeds["x"])})[0]
    assert np.all(np.abs(got - exact) <= product_bound("bf16", c * k * k, magnitude))


def _conv(g: Graph, x: object, rng: np.random.Generator, o: int, c: int, k: int = 1, groups: int = 1) -> object:
    w = (rng.standard_normal((o, c // groups, k, k)) / np.sqrt(c // groups * k * k)).astype(np.float32)
    return g.conv2d(x, g.param(f"w{len(g.nodes)}", w), padding=k // 2, groups=groups)


def test_values_are_held_reduced_only_where_every_reader_reads_that_format(amx_flags):
    rng = np.random.default_rng(7)
    g = Graph("plan")
    x = g.input("x", (1, 32, 8, 8))
    a = _conv(g, x, rng, 32, 32)                  # read by a depthwise convolution that is held: held
    b = _conv(g, a, rng, 32, 32, 3, 32)           # depthwise, reads a held value, read by a dense one: held
    c = _conv(g, b, rng, 64, 32)                  # read by a held pool: held
    p = g.max_pool2d(c, 3, 1, 1)                  # reads a held value, read by convolutions: held
    q, q2 = _conv(g, p, rng, 32, 64), _conv(g, p, rng, 32, 64, 3)  # read by a held concat: held
    k = g.concat([q, q2], axis=1)                 # every input held, read by a convolution: held
    r = _conv(g, k, rng, 64, 64)                  # read by a depthwise one that is not held: held all the same
    t = _conv(g, r, rng, 64, 64, 3, 64)           # read by a relu (the native interpreter reads it): held
    e = _conv(g, g.relu(t), rng, 64, 64)          # read by a grouped one of 4 channels a group (AVX-512's): not
    h = _conv(g, e, rng, 64, 64, 3, 16)           # read by a pool that is not held: not
    v = g.avg_pool2d(h, 3, 1, 1)                  # reads a value not held: not
    f = _conv(g, g.relu(v), rng, 64, 64, 3)       # read by one of 32 channels a group (AMX's): held
    s = g.add(_conv(g, f, rng, 64, 64, 3, 2), f)  # (and by an add: held)
    out = _conv(g, g.relu(s), rng, 16, 64)        # a graph output: not
    g.set_outputs([out])
    kinds = [n.op for n in g.nodes]
    buffered = [k not in SOURCE_OPS for k in kinds]
    fixed = [k in (OpKind.PARAM, OpKind.CONSTANT) for k in kinds]
    planned = layout.plan(g, buffered, fixed)
    kept = held.plan(g, planned.cl)
    names = {v.id: k for k, v in dict(a=a, b=b, c=c, p=p, q=q, q2=q2, k=k, r=r, t=t, e=e, h=h, v=v, f=f).items()}
    assert {names[i] for i in kept if i in names} == {"a", "b", "c", "p", "q", "q2", "k", "r", "t", "f"}
    assert all(i in planned.cl for i in kept) and out.id not in kept


def _squeeze_excitation(rng: np.random.Generator) -> tuple[Graph, dict[str, object]]:
    """EfficientNet's block: an expansion, a depthwise convolution, its mean over the
    planes into a gate, the gate's product with the depthwise result, a projection."""
    g = Graph("se")
    x = g.input("x", (2, 16, 12, 12))
    a = g.relu(_conv(g, x, rng, 32, 16))
    d = g.relu(_conv(g, a, rng, 32, 32, 3, 32))
    gate = g.sigmoid(_conv(g, g.global_avg_pool2d(d), rng, 32, 32))
    m = g.mul(d, gate)
    g.set_outputs([_conv(g, m, rng, 8, 32)])
    return g, {"x": x, "a": a, "d": d, "m": m}


@pytest.mark.skipif(native.library() is None, reason=f"native.c reads the planes bf16: {native.reason()}")
def test_a_squeeze_excitations_planes_are_held_for_its_mean_and_its_scale(amx_flags):
    """The depthwise result a squeeze-excitation averages and scales is held bf16 (its
    global pool reads bf16 on native.c), and so is the scaled value."""
    g, v = _squeeze_excitation(np.random.default_rng(3))
    kinds = [n.op for n in g.nodes]
    fixed = [k in (OpKind.PARAM, OpKind.CONSTANT) for k in kinds]
    planned = layout.plan(g, [k not in SOURCE_OPS for k in kinds], fixed)
    kept = held.plan(g, planned.cl)
    assert {v["a"].id, v["d"].id, v["m"].id} <= kept


@needs_bf16
@pytest.mark.parametrize("pool", ["reads bf16", "reads float32"])
def test_a_squeeze_excitation_runs_on_held_values_with_no_conversion(monkeypatch, pool):
    """Nothing of the block runs between conversions: the pool reads the held planes, or
    (where native.c's reductions are not there: planes left float32) the scale writes
    bf16 beside its float32 input, never over it (``binding``'s in-place rule: the
    interpreter's threads would write where another still reads)."""
    g, _ = _squeeze_excitation(np.random.default_rng(4))
    if pool == "reads float32":
        monkeypatch.setattr(held, "native", SimpleNamespace(library=lambda: None))  # (held's view only)
    widened = []
    real = held._widened
    monkeypatch.setattr(held, "_widened",
                        lambda lib, node, *a, **k: widened.append(node.op) or real(lib, node, *a, **k))
    cg = rlx.compile(g, device="cpu", precision="bf16")
    assert "held bf16 between the steps" in " ".join(cg.report().notes)
    assert widened == []
    feeds = {"x": np.random.default_rng(5).standard_normal((2, 16, 12, 12)).astype(np.float32)}
    exact = evaluate(g, feeds)[0]
    assert 1e-5 < np.abs(cg.run(feeds)[0] - exact).max() / np.abs(exact).max() < 3e-2


@needs_bf16
@pytest.mark.parametrize("route", ["in place", "through float32 scratch"])
def test_values_held_bf16_answer_as_rounding_each_input_does(monkeypatch, route):
    """A value a convolution reads held bf16 is the value its rounding reorder made; a
    depthwise convolution reading one reads it rounded where it read float32 before (a
    bf16 rounding more, within bf16's error). Where oneDNN cannot write or read a held
    value as planned (an epilogue it has no post-op for: ``exp``), the node runs in
    float32 scratch between conversions."""
    rng = np.random.default_rng(8)
    g = Graph("held")
    x = g.input("x", (2, 16, 12, 12))
    a = g.max_pool2d(g.relu(_conv(g, x, rng, 32, 16, 3)), 3, 1, 1)
    b = g.exp(g.mul(_conv(g, _conv(g, a, rng, 32, 32, 3, 32), rng, 32, 32), np.float32(0.1)))
    c = _conv(g, b, rng, 48, 32, 3)
    d = g.concat([_conv(g, c, rng, 16, 48), _conv(g, c, rng, 16, 48, 3)], axis=1)
    g.set_outputs([_conv(g, g.add(_conv(g, d, rng, 32, 32), _conv(g, b, rng, 32, 32)), rng, 8, 32)])
    feeds = {"x": rng.standard_normal((2, 16, 12, 12)).astype(np.float32)}
    if route != "in place":
        monkeypatch.setattr(held, "_direct", lambda *args: None)
    cg = rlx.compile(g, device="cpu", precision="bf16")
    notes = " ".join(cg.report().notes)
    assert "10 values held bf16 between the steps" in notes, notes
    got = cg.run(feeds)[0]
    monkeypatch.setattr(held, "plan", lambda *args: frozenset())
    rounded = rlx.compile(g, device="cpu", precision="bf16")
    assert "held" not in " ".join(rounded.report().notes)
    base = rounded.run(feeds)[0]
    np.testing.assert_allclose(got, base, rtol=0, atol=2e-2 * np.abs(base).max())
    exact = evaluate(g, feeds)[0]
    assert 1e-5 < np.abs(got - exact).max() / np.abs(exact).max() < 3e-2


def _mlp(rng: np.random.Generator, rows: int = 24, width: int = 64) -> tuple[Graph, dict[str, object]]:
    g = Graph("mlp")
    x = g.input("x", (2, rows, width))
    w1 = g.param("w1", (rng.standard_normal((width, 4 * width)) / np.sqrt(width)).astype(np.float32))
    w2 = g.param("w2", (rng.standard_normal((4 * width, width)) / np.sqrt(4 * width)).astype(np.float32))
    h = g.matmul(x, w1)
    act = g.gelu(h)
    y = g.matmul(act, w2)
    return g, {"x": x, "h": h, "act": act, "y": y}


def test_an_mlps_hidden_values_are_planned_reduced_outside_chains():
    rng = np.random.default_rng(12)
    g, v = _mlp(rng)
    side = g.reshape(v["h"], (2 * 24, 256))  # read by a reshape too: not held
    g.set_outputs([v["y"], side])

    def planned(graph: Graph, cl: frozenset[int] = frozenset()) -> frozenset[int]:
        kinds = [n.op for n in graph.nodes]
        return held.plan_dense(graph, cl, [k not in SOURCE_OPS for k in kinds],
                               [k in (OpKind.PARAM, OpKind.CONSTANT) for k in kinds])

    assert planned(g) == {v["act"].id}  # (y: a graph output)
    g, v = _mlp(rng)
    g.set_outputs([v["y"]])
    assert planned(g) == {v["h"].id, v["act"].id}
    assert planned(g, frozenset({v["h"].id})) == {v["act"].id}  # (chains' values are held.plan's)


@needs_bf16
@pytest.mark.parametrize("route", ["in place", "through float32 scratch"])
def test_an_mlps_hidden_values_held_bf16_answer_within_bf16s_error(monkeypatch, route):
    rng = np.random.default_rng(13)
    g, v = _mlp(rng)
    g.set_outputs([v["y"]])
    feeds = {"x": rng.standard_normal((2, 24, 64)).astype(np.float32)}
    if route != "in place":
        monkeypatch.setattr(held.onednn_matmul, "dense_steps", lambda *args: None)
        monkeypatch.setattr(held, "native_region", lambda *args: None)
    cg = rlx.compile(g, device="cpu", precision="bf16")
    notes = " ".join(cg.report().notes)
    assert "1 value held bf16 between the steps" in notes, notes  # (the GELU is the first product's activation)
    got = cg.run(feeds)[0]
    monkeypatch.undo()
    monkeypatch.setattr(held, "plan_dense", lambda *args: frozenset())
    base = rlx.compile(g, device="cpu", precision="bf16").run(feeds)[0]
    np.testing.assert_allclose(got, base, rtol=0, atol=2e-2 * np.abs(base).max())
    exact = evaluate(g, feeds)[0]
    assert 1e-5 < np.abs(got - exact).max() / np.abs(exact).max() < 3e-2


@needs_amx
def test_merged_groups_take_new_weights_from_set_param():
    """A grouped convolution run as merged groups (``amx_groups``): its block-diagonal
    weights are derived from the param, so ``set_param`` refills them, and oneDNN's
    reordered copy after them."""
    rng = np.random.default_rng(9)
    w = rng.standard_normal((64, 8, 3, 3)).astype(np.float32)
    g, absolute = conv_graphs((2, 64, 7, 7), w, None, padding=1, groups=8)
    feeds = {"x": rng.standard_normal((2, 64, 7, 7)).astype(np.float32)}
    cg = rlx.compile(g, device="cpu", precision="bf16")
    assert "1 convolution with bf16 operands on AMX" in " ".join(cg.report().notes)
    within_bf16(cg.run(feeds)[0], g, absolute, feeds, 8 * 9)
    w2 = rng.standard_normal((64, 8, 3, 3)).astype(np.float32)
    cg.set_param("w", w2)
    g.replace_value(g.params[0], w2)
    absolute.replace_value(absolute.params[0], np.abs(w2))
    within_bf16(cg.run(feeds)[0], g, absolute, feeds, 8 * 9)


def _attention_graph(shape: tuple[int, int, int, int], lk: int, masked: bool) -> Graph:
    """Attention over q, k, v (and a mask) computed in the graph (plan arrays, as in an
    export: ``onednn_attention`` rounds those)."""
    b, h, lq, d = shape
    g = Graph("attention")
    q, k, v = (g.input(name, (b, h, n, d)) for name, n in (("q", lq), ("k", lk), ("v", lk)))
    mask = g.add(g.input("m", (lq, lk)), g.input("m2", (lq, lk))) if masked else None
    g.set_outputs([g.attention(g.add(q, q), g.add(k, k), g.add(v, v), mask, scale=0.125)])
    return g


@needs_bf16
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("lq", [96, 700], ids=["whole", "in blocks"])
def test_attentions_products_take_bf16_operands(masked, lq):
    rng = np.random.default_rng(14)
    g = _attention_graph((1, 4, lq, 32), 100 + lq // 2, masked)
    lk = 100 + lq // 2
    feeds = {n: rng.standard_normal((1, 4, s, 32)).astype(np.float32) for n, s in (("q", lq), ("k", lk), ("v", lk))}
    if masked:
        feeds["m"] = np.where(rng.random((lq, lk)) < 0.3, -1e4, 0.0).astype(np.float32)
        feeds["m2"] = rng.standard_normal((lq, lk)).astype(np.float32)
    cg = rlx.compile(g, device="cpu", precision="bf16")
    notes = " ".join(cg.report().notes)
    exact = evaluate(g, feeds)[0]
    got = cg.run(feeds)[0]
    err = np.abs(got - exact).max() / np.abs(exact).max()
    if UNIT == bf16_units.AMX:  # float32 there (``onednn_attention``: no faster on AMX)
        assert "no product here took it" in notes and err < 1e-5, (notes, err)
        return
    assert f"precision: 1 attention with bf16 operands on {UNIT}" in notes, notes
    assert 1e-5 < err < 3e-2, err  # rounded, as bf16 is, through a softmax
    np.testing.assert_allclose(rlx.compile(g, device="cpu").run(feeds)[0], exact, rtol=1e-4, atol=1e-5)


@needs_bf16
def test_small_attention_and_one_onednn_declines_stay_float32(monkeypatch):
    from rlx_cpu import onednn_attention

    rng = np.random.default_rng(15)
    small = _attention_graph((1, 4, 7, 16), 9, False)
    feeds = {n: rng.standard_normal((1, 4, s, 16)).astype(np.float32) for n, s in (("q", 7), ("k", 9), ("v", 9))}
    cg = rlx.compile(small, device="cpu", precision="bf16")
    assert "no product here took it" in " ".join(cg.report().notes)  # below MIN_MACS: oneDNN's calls cost more
    np.testing.assert_allclose(cg.run(feeds)[0], evaluate(small, feeds)[0], rtol=1e-4, atol=1e-5)

    def declines(lib, pd, dtype=None, paying=True):
        raise onednn.DnnlError("declined")
    monkeypatch.setattr(onednn_attention, "_jit_impl", declines)
    g = _attention_graph((1, 4, 96, 32), 148, False)
    feeds = {n: rng.standard_normal((1, 4, s, 32)).astype(np.float32) for n, s in (("q", 96), ("k", 148), ("v", 148))}
    cg = rlx.compile(g, device="cpu", precision="bf16")
    assert "no product here took it" in " ".join(cg.report().notes)
    np.testing.assert_allclose(cg.run(feeds)[0], evaluate(g, feeds)[0], rtol=1e-4, atol=1e-5)
