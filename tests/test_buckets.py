"""Shape buckets (``rlx_core.ir.padding``, ``rlx_core.buckets``): a symbolic graph run at
padded sizes gives the unpadded graph's values, every symbol that cannot be padded is
declined with the reason, and a bucketing backend compiles once per bucket."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_core as rlx
from rlx_core import reference
from rlx_core.buckets import BucketedExecutable, Ladder, bucketed
from rlx_core.compiler.dynamic import STATIC_AFTER
from rlx_core.ir import Graph
from rlx_core.ir.padding import pad_graph
from rlx_core.ir.symbolic import Sym

from .support import RefExecutable, ToyBackend, registry_with

RNG = np.random.default_rng(7)
B, S = Sym("b"), Sym("s")


def _w(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def encoder(table: int = 64) -> Graph:
    """Everything a transformer export does along a padded axis: an embedding gather, a
    position table sliced to the length, attention written out (softmax and two
    products) and fused, a merged reshape and back, layer norm over the features, mean
    and max over the sequence, and a log of the zero padding (garbage that is -inf)."""
    g = Graph("enc")
    x = g.input("x", ("b", "s", 16))
    ids = g.input("ids", ("b", "s"), "int64")
    pos = g.slice(g.param("pos", _w(table, 16)), [0], [S], [0])
    h = g.add(g.add(x, g.gather(g.param("emb", _w(50, 16)), ids)), pos)
    qkv = g.matmul(h, g.param("w", _w(16, 48)))

    def heads(i: int) -> int:
        part = g.slice(qkv, [16 * i], [16 * i + 16], [2])
        return g.transpose(g.reshape(part, ("b", "s", 2, 8)), (0, 2, 1, 3))

    q, k, v = heads(0), heads(1), heads(2)
    probs = g.softmax(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), -1)
    o = g.reshape(g.transpose(g.matmul(probs, v), (0, 2, 1, 3)), ("b", "s", 16))
    fused = g.attention(q, k, v)
    flat = g.reshape(o, (B * S, 16))
    back = g.reshape(g.matmul(flat, g.param("w2", _w(16, 4))), ("b", "s", 4))
    normed = g.layer_norm(o, g.param("ln", np.ones(16, np.float32)))
    garbage = g.log(g.abs(x))  # -inf where the padding is: a contraction must not see it
    gram = g.matmul(g.transpose(garbage, (0, 2, 1)), g.transpose(g.transpose(garbage, (0, 2, 1)), (0, 2, 1)))
    g.set_outputs([g.reduce_mean(normed, [1]), back, g.reduce_max(fused, [2]), flat, gram,
                   g.reduce_sum(g.exp(x), [1], keepdims=True)])
    return g


def feeds(b: int, s: int) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((b, s, 16)).astype(np.float32), "ids": RNG.integers(0, 50, (b, s))}


def _compile(graphs: list[Graph]):
    def compile_static(graph: Graph, options: rlx.CompileOptions) -> rlx.Executable:
        assert not graph.is_symbolic
        graphs.append(graph)
        return RefExecutable(graph, ToyBackend("ref"))
    return compile_static


def bucket_exe(g: Graph, buckets: object = None) -> tuple[BucketedExecutable, list[Graph]]:
    graphs: list[Graph] = []
    exe = bucketed(g, rlx.CompileOptions(extra={} if buckets is None else {"buckets": buckets}), _compile(graphs))
    assert isinstance(exe, BucketedExecutable)
    return exe, graphs


def assert_matches(g: Graph, outs: list[np.ndarray], inputs: Mapping[str, np.ndarray], tol: float = 1e-4) -> None:
    refs = reference.evaluate(g, inputs)
    assert len(outs) == len(refs)
    for i, (out, ref) in enumerate(zip(outs, refs)):
        assert out.shape == ref.shape, (i, out.shape, ref.shape)
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol, err_msg=f"output {i}")


# ------------------------------------------------------------------ exact at any padded size
@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 4), s=st.integers(1, 12), pad_b=st.integers(0, 3), pad_s=st.integers(0, 9))
def test_a_padded_graph_gives_the_unpadded_values_at_any_larger_size(b: int, s: int, pad_b: int, pad_s: int) -> None:
    g = ENCODER
    exe, graphs = bucket_exe(g, {"b": [b + pad_b], "s": [s + pad_s]})
    inputs = feeds(b, s)
    with np.errstate(divide="ignore", invalid="ignore"):
        assert_matches(g, exe.run(inputs), inputs)
    assert [gr.node(gr.inputs[0]).shape for gr in graphs] == [(b + pad_b, s + pad_s, 16)]


ENCODER = encoder()


def test_the_encoder_pads_both_symbols_and_cuts_a_merged_output() -> None:
    padded = pad_graph(ENCODER)
    assert padded.symbols == ("b", "s") and padded.declined == {}
    assert padded.outputs[3] == ((B, S), None)  # (b*s, 16): split, cut, merged again
    assert padded.outputs[1] == (B, S, None)
    assert set(padded.limit_dtypes.values()) == {"int32", "float32"}  # the lengths, and the mean's count


# ------------------------------------------------------------------ declined, and why
def _declines(build, symbol: str, why: str, shapes: dict[str, tuple]) -> None:
    g = Graph("g")
    outs = build(g)
    g.set_outputs(outs)
    padded = pad_graph(g)
    assert symbol in padded.declined and why in padded.declined[symbol], padded.declined
    assert symbol not in padded.symbols
    exe = bucketed(g, rlx.CompileOptions(), _compile([]))
    if exe is not None:  # the other symbols still padded: still exact
        inputs = {k: RNG.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
        assert_matches(g, exe.run(inputs), inputs)


def test_a_layer_norm_over_the_sequence_declines_it_and_keeps_the_batch() -> None:
    def build(g: Graph) -> list:
        x = g.input("x", ("b", "s"))
        return [g.layer_norm(x, g.param("ln", np.ones(1, np.float32)))]

    _declines(build, "s", "normalizes over a padded axis", {"x": (3, 5)})


def test_the_last_position_declines_the_sequence() -> None:
    def build(g: Graph) -> list:
        x = g.input("x", ("b", "s", 4))
        return [g.slice(x, [-1], [2**31], [1])]

    _declines(build, "s", "from its end", {"x": (3, 5, 4)})


def test_a_concat_after_a_padded_part_declines_it_one_before_does_not() -> None:
    def after(g: Graph) -> list:
        x = g.input("x", ("b", "s", 4))
        return [g.concat([x, g.mul(g.param("tail", _w(1, 1, 4)), g.reduce_sum(x, [1, 2], keepdims=True))], axis=1)]

    _declines(after, "s", "puts values after a padded part", {"x": (3, 5, 4)})
    g = Graph("vit")  # ViT's class token in front of the patches: padded
    x = g.input("x", ("b", "s", 4))
    cls = g.mul(g.param("cls", _w(1, 1, 4)), g.reduce_sum(g.mul(x, 0.0), [1], keepdims=True))
    g.set_outputs([g.softmax(g.concat([cls, x], axis=1), axis=1)])
    assert pad_graph(g).symbols == ("b", "s")
    exe, _ = bucket_exe(g)
    inputs = {"x": RNG.standard_normal((3, 5, 4)).astype(np.float32)}
    assert_matches(g, exe.run(inputs), inputs)


def test_a_size_read_as_data_declines_the_symbol() -> None:
    def build(g: Graph) -> list:
        x = g.input("x", ("b", "s"))
        n = g.cast(g.sized_constant("dims", (1,), "int64", values=(S,)), "float32")
        return [g.div(x, n)]

    _declines(build, "s", "reads a size as data", {"x": (2, 3)})


def test_a_reduction_over_a_merged_axis_declines() -> None:
    def build(g: Graph) -> list:
        x = g.input("x", ("b", "s", 4))
        return [g.reduce_sum(g.reshape(x, (B * S, 4)), [0])]

    g = Graph("g")
    g.set_outputs(build(g))
    padded = pad_graph(g)
    assert padded.symbols == () and all("merged" in why for why in padded.declined.values()), padded.declined
    assert bucketed(g, rlx.CompileOptions(), _compile([])) is None


def test_a_convolution_pads_its_batch() -> None:
    g = Graph("cnn")
    x = g.input("x", ("n", 3, 8, 8))
    g.set_outputs([g.global_avg_pool2d(g.relu(g.conv2d(x, g.param("w", _w(4, 3, 3, 3)), padding=1)))])
    assert pad_graph(g).symbols == ("n",)
    exe, graphs = bucket_exe(g)
    inputs = {"x": RNG.standard_normal((3, 3, 8, 8)).astype(np.float32)}
    assert_matches(g, exe.run(inputs), inputs)
    assert graphs[0].node(graphs[0].inputs[0]).shape == (4, 3, 8, 8)


def image_net() -> Graph:
    """An image of symbolic height and width through what CNNs stack: strided padded
    convolutions, a max pool with padding, an average pool that counts none, a dilated
    convolution, a global average, and the feature map itself as an output."""
    g = Graph("image")
    x = g.input("x", ("n", 3, "h", "w"))
    h = g.conv2d(x, g.param("w1", _w(4, 3, 3, 3)), g.param("b1", _w(4)), stride=2, padding=1)
    h = g.max_pool2d(h, 3, stride=2, padding=1)
    h = g.avg_pool2d(g.log(g.add(g.abs(h), 1.0)), 2, stride=1)
    h = g.conv2d(h, g.param("w2", _w(4, 4, 3, 3)), padding=2, dilation=2)
    g.set_outputs([h, g.global_avg_pool2d(h)])
    return g


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 3), hw=st.tuples(st.integers(6, 14), st.integers(6, 14)), pad=st.tuples(
    st.integers(0, 2), st.integers(0, 5), st.integers(0, 5)))
def test_an_image_of_any_size_runs_padded(n: int, hw: tuple[int, int], pad: tuple[int, int, int]) -> None:
    g = IMAGE_NET
    assert pad_graph(g).symbols == ("h", "n", "w")
    exe, _ = bucket_exe(g, {"n": [n + pad[0]], "h": [hw[0] + pad[1]], "w": [hw[1] + pad[2]]})
    inputs = {"x": RNG.standard_normal((n, 3, *hw)).astype(np.float32)}
    assert_matches(g, exe.run(inputs), inputs)


IMAGE_NET = image_net()


def test_an_average_that_skips_its_padding_declines_the_image() -> None:
    def build(g: Graph) -> list:
        x = g.input("x", (1, 2, "h", 8))
        return [g.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)]

    _declines(build, "h", "averages windows that may run past a padded axis's end", {"x": (1, 2, 5, 8)})


def test_an_input_dim_that_is_an_expression_declines_its_symbols() -> None:
    g = Graph("g")
    x = g.input("x", ("b", "s"))
    y = g.input("y", ("b", S * 2))
    g.set_outputs([g.reshape(g.add(g.reshape(y, (B, S, 2)), g.reshape(x, (B, S, 1))), (B, S * 2))])
    padded = pad_graph(g)
    assert padded.symbols == ("b",) and "input 'y' has the dim 2*s" in padded.declined["s"]


def test_garbage_indices_are_masked_before_a_gather() -> None:
    """Indices computed from the padding (here out of the table's range) are never read."""
    g = Graph("g")
    x = g.input("x", ("b", "s"))
    ids = g.input("ids", ("b", "s"), "int64")
    far = g.where(g.greater(x, 0.0), ids, g.constant(np.int64(10**6)))  # padding: x = 0, so 10**6
    g.set_outputs([g.gather(g.param("t", _w(10, 3)), g.where(g.less(x, 100.0), far, ids))])
    exe, _ = bucket_exe(g, {"s": [8]})
    inputs = {"x": np.abs(RNG.standard_normal((2, 5))).astype(np.float32) + 0.1, "ids": RNG.integers(0, 10, (2, 5))}
    assert_matches(g, exe.run(inputs), inputs)


def _mask_index(g: Graph, stacked: bool) -> int:
    """``keep[batch_idx, kv_idx]`` as exporters lower it: ``keep`` flattened to
    ``(batch*seq,)`` and read at ``batch_idx * seq + kv_idx``, ``seq`` a shape value; the
    dynamo form (rlx's GatherND) stacks the two index components and picks each again."""
    keep = g.input("keep", ("b", "s"), "bool")
    rows = g.reshape(g.sized_constant("arange", (B,), "int64", start=0, delta=1), (B, 1, 1, 1))
    cols = g.reshape(g.sized_constant("arange", (S,), "int64", start=0, delta=1), (1, 1, 1, S))
    if stacked:
        ones_s, ones_b = (g.sized_constant("fill", shape, "int64", value=1) for shape in ((1, 1, 1, S), (B, 1, 1, 1)))
        both = g.concat([g.reshape(g.mul(rows, ones_s), (B, 1, 1, S, 1)),
                         g.reshape(g.mul(cols, ones_b), (B, 1, 1, S, 1))], axis=4)
        table_b = g.sized_constant("arange", (B,), "int64", start=0, delta=1)
        table_s = g.sized_constant("arange", (S,), "int64", start=0, delta=1)
        rows = g.gather(table_b, g.gather(both, g.constant(np.int64(0)), axis=4))
        cols = g.gather(table_s, g.gather(both, g.constant(np.int64(1)), axis=4))
    seq = g.sized_constant("dims", (1,), "int64", values=(S,))
    return g.gather(g.reshape(keep, (B * S,)), g.add(g.mul(rows, seq), cols))


@pytest.mark.parametrize("stacked", [False, True], ids=["classic", "dynamo"])
def test_an_exporters_mask_index_reads_the_padded_layout(stacked: bool) -> None:
    g = Graph("mask")
    x = g.input("x", ("b", "s", 4))
    scores = g.matmul(x, g.transpose(x, (0, 2, 1)))  # (b, s, s)
    keep = g.reshape(_mask_index(g, stacked), (B, 1, S))
    g.set_outputs([g.softmax(g.where(keep, scores, g.constant(np.float32(-1e9))), -1)])
    assert pad_graph(g).symbols == ("b", "s")
    exe, _ = bucket_exe(g, {"b": [4], "s": [8]})
    keep_in = RNG.random((3, 6)) > 0.3
    keep_in[:, 0] = True
    inputs = {"x": RNG.standard_normal((3, 6, 4)).astype(np.float32), "keep": keep_in}
    assert_matches(g, exe.run(inputs), inputs)


def test_a_size_read_as_data_anywhere_else_declines_it() -> None:
    """Each row read backwards (``seq - 1 - kv_idx``: not the padded layout's position, it
    would read padding), or ``seq`` reaching an output: declined."""
    g = Graph("g")
    keep = g.input("keep", ("b", "s"), "bool")
    rows = g.reshape(g.sized_constant("arange", (B,), "int64", start=0, delta=1), (B, 1))
    cols = g.reshape(g.sized_constant("arange", (S,), "int64", start=0, delta=1), (1, S))
    seq = g.sized_constant("dims", (1,), "int64", values=(S,))
    backwards = g.sub(g.sub(seq, g.constant(np.int64(1))), cols)
    g.set_outputs([g.gather(g.reshape(keep, (B * S,)), g.add(g.mul(rows, seq), backwards))])
    padded = pad_graph(g)
    assert "gathers from a padded axis" in padded.declined["s"], padded.declined
    h = Graph("h")
    x = h.input("x", ("b", "s"))
    h.set_outputs([h.add(x, h.cast(h.sized_constant("dims", (1,), "int64", values=(S,)), "float32"))])
    assert "reads a size as data" in pad_graph(h).declined["s"]


def test_a_batch_merged_in_front_of_the_heads_is_split_again() -> None:
    """``(b, h, s, d) -> (b*h, s, d) -> (b, h, s, d)`` (dynamo's batched products)."""
    g = Graph("g")
    x = g.input("x", ("b", 4, "s", 8))
    folded = g.reshape(x, (B * 4, S, 8))
    scores = g.softmax(g.matmul(folded, g.transpose(folded, (0, 2, 1))), -1)
    g.set_outputs([g.reshape(g.matmul(scores, folded), (B, 4, S, 8)), scores])
    padded = pad_graph(g)
    assert padded.symbols == ("b", "s") and padded.outputs[1][0] == (B, 4)
    exe, _ = bucket_exe(g, {"b": [4], "s": [8]})
    inputs = {"x": RNG.standard_normal((3, 4, 5, 8)).astype(np.float32)}
    assert_matches(g, exe.run(inputs), inputs)


# ------------------------------------------------------------------ the executable
def test_buckets_are_powers_of_two_or_the_sizes_given() -> None:
    assert [Ladder().size("s", n) for n in (1, 2, 3, 5, 8, 9, 100)] == [1, 2, 4, 8, 8, 16, 128]
    ladder = Ladder({"s": [6, 12], "b": "exact", "c": "pow2"})
    assert [ladder.size("s", n) for n in (1, 6, 7, 12, 13)] == [6, 6, 12, 12, 16]
    assert ladder.size("b", 5) == 5 and ladder.size("c", 5) == 8 and ladder.exact() == {"b"}
    assert Ladder("off").off and not Ladder("pow2").off


@pytest.mark.parametrize("spec, match", [
    (3, "must be 'pow2', 'off' or a mapping"),
    ({"s": [0, 4]}, r"\['s'\] must be 'pow2', 'exact' or a list of sizes >= 1"),
    ({"s": "many"}, r"\['s'\] must be"),
    ({"1s": [4]}, "a key must be a symbol's name"),
])
def test_a_bad_bucket_spec_is_a_config_error_naming_the_option(spec: object, match: str) -> None:
    with pytest.raises(rlx.ConfigError, match=r"CompileOptions.extra\['buckets'\]" + ".*" + match):
        bucketed(ENCODER, rlx.CompileOptions(extra={"buckets": spec}), _compile([]))


def test_one_compile_per_bucket_and_exact_sizes_where_a_constraint_breaks() -> None:
    g = encoder(table=48)  # the position table caps s at 48: bucket 64 breaks it
    exe, graphs = bucket_exe(g)
    for b, s in ((1, 5), (1, 7), (2, 6), (1, 8), (3, 40)):
        inputs = feeds(b, s)
        with np.errstate(divide="ignore", invalid="ignore"):
            assert_matches(g, exe.run(inputs), inputs)
    assert exe.buckets() == [{"b": 2, "s": 8}, {"b": 1, "s": 8}, {"b": 3, "s": 40}]  # least recently used first
    assert exe.compiles == 3 == len(graphs)
    notes = exe.report_notes()
    assert "buckets: b padded to powers of two" in notes and any(n.startswith("bucket b=1, s=8: compiled in ")
                                                                 for n in notes)
    assert not exe.exact_compile_pays({"b": 1, "s": 7}) and exe.exact_compile_pays({"b": 3, "s": 5})


def test_zero_rows_run_at_their_exact_size() -> None:
    exe, _ = bucket_exe(ENCODER)
    inputs = feeds(0, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        outs = exe.run(inputs)
    assert [o.shape for o in outs][:2] == [(0, 16), (0, 3, 4)] and exe.buckets() == [{"b": 0, "s": 3}]


class BucketToy(ToyBackend):
    """A static-only toy made symbolic the documented way: ``compile_symbolic`` returns
    ``bucketed(graph, options, self.compile, self.claims)``."""

    def compile_symbolic(self, graph: rlx.Graph, options: rlx.CompileOptions) -> rlx.Executable | None:
        return bucketed(graph, options, self.compile, self.claims)


def test_a_bucketing_backend_serves_new_sizes_inside_a_bucket_with_no_compile() -> None:
    toy = BucketToy()
    g = encoder()
    cg = rlx.compile(g, device="toy", policy=rlx.DevicePolicy(), registry=registry_with(toy))
    for b, s in ((2, 5), (2, 6), (1, 7), (2, 8), (1, 3)):
        inputs = feeds(b, s)
        with np.errstate(divide="ignore", invalid="ignore"):
            assert_matches(g, cg.run(inputs), inputs)
    assert toy.compiles == 3 and cg.compiles == 4  # buckets (2, 8), (1, 8), (1, 4); the executable for every size
    notes = cg.report().notes
    assert any(n.startswith("bucket b=2, s=8: compiled in") for n in notes), notes
    for _ in range(STATIC_AFTER + 1):  # (2, 7) fills its bucket: never compiled on its own
        cg.run(feeds(2, 7))
    assert toy.compiles == 3
    for _ in range(STATIC_AFTER + 1):  # (1, 5) in (1, 8): a compile of its own pays
        cg.run(feeds(1, 5))
    assert toy.compiles == 4 and {"b": 1, "s": 5} in cg.shapes()
    w = _w(16, 48)
    cg.set_param("w", w)  # every bucket, kept and later
    g.replace_value(next(i for i in g.params if g.node(i).name == "w"), w)
    for b, s in ((2, 6), (4, 9)):
        inputs = feeds(b, s)
        with np.errstate(divide="ignore", invalid="ignore"):
            assert_matches(g, cg.run(inputs), inputs)


def test_buckets_off_or_a_backend_that_declines_a_mask_op_compiles_each_class() -> None:
    assert bucketed(ENCODER, rlx.CompileOptions(extra={"buckets": "off"}), _compile([])) is None
    no_less = ToyBackend("toy", ops=set(ToyBackend().ops) - {"less"})
    assert bucketed(ENCODER, rlx.CompileOptions(), _compile([]), no_less.claims) is None


# ------------------------------------------------------------------ random graphs
_STEPS = ("tanh", "dense", "softmax_s", "softmax_d", "sum_s", "max_s", "mean_s", "norm", "merge", "gram")


def _random_graph(steps: list[str]) -> Graph:
    """A chain over (b, s, 8) of the steps named: each keeps that shape (reductions keep
    their axis, a gram product (s, s) is brought back by a product with the input)."""
    g = Graph("random")
    x = g.input("x", ("b", "s", 8))
    h = x
    for i, step in enumerate(steps):
        if step == "tanh":
            h = g.tanh(h)
        elif step == "dense":
            h = g.add(g.matmul(h, g.param(f"w{i}", _w(8, 8))), g.param(f"b{i}", _w(8)))
        elif step in ("softmax_s", "softmax_d"):
            h = g.softmax(h, axis=1 if step == "softmax_s" else 2)
        elif step in ("sum_s", "max_s", "mean_s"):
            reduce = {"sum_s": g.reduce_sum, "max_s": g.reduce_max, "mean_s": g.reduce_mean}[step]
            h = g.add(h, reduce(h, [1], keepdims=True))
        elif step == "norm":
            h = g.layer_norm(h, g.param(f"ln{i}", np.ones(8, np.float32)))
        elif step == "merge":
            h = g.reshape(g.relu(g.reshape(h, (B * S, 8))), ("b", "s", 8))
        else:  # attention-like: (b, s, s) scores, then back to (b, s, 8)
            h = g.matmul(g.softmax(g.matmul(h, g.transpose(x, (0, 2, 1))), -1), h)
    g.set_outputs([h, g.reduce_mean(h, [1])])
    return g


@settings(max_examples=30, deadline=None)
@given(steps=st.lists(st.sampled_from(_STEPS), min_size=1, max_size=5), b=st.integers(1, 3), s=st.integers(1, 6),
       pad_b=st.integers(0, 2), pad_s=st.integers(0, 5))
def test_random_chains_give_the_unpadded_values(steps: list[str], b: int, s: int, pad_b: int, pad_s: int) -> None:
    g = _random_graph(steps)
    padded = pad_graph(g)
    assert padded.symbols == ("b", "s"), padded.declined  # every step here pads exactly
    exe, _ = bucket_exe(g, {"b": [b + pad_b], "s": [s + pad_s]})
    inputs = {"x": RNG.standard_normal((b, s, 8)).astype(np.float32)}
    assert_matches(g, exe.run(inputs), inputs, tol=2e-4)
