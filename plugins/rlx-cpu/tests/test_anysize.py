"""The any-size executable (``anysize.py``): one compile of a symbolic graph runs every
size the graph accepts, with the reference's answers, never writing into an array the
caller still holds, from several threads at once, with params set after compiling."""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlx_core as rlx
from rlx_core import reference
from rlx_core.compiler.lowered_once import AnySizeGraph
from rlx_core.errors import InputError
from rlx_core.ir import Graph
from rlx_core.ir.ops import OpKind
from rlx_core.ir.symbolic import Sym
from rlx_core.plugin import Instruction
from rlx_cpu import anysize, anysize_kernels, onednn, regions
from rlx_cpu.backend import CpuBackend
from rlx_cpu.native import library as native_library

D, H, VOCAB, MAX_POS = 16, 2, 40, 64


def rand(shape: tuple[int, ...], seed: int, scale: float = 0.3) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def block() -> Graph:
    """A post-LN encoder layer over symbolic (batch, seq): token and position embeddings
    (a sized ``arange`` of the sequence), heads split and merged by reshapes naming the
    symbols, masked attention, a GELU MLP, and two outputs (the sequence and the first
    token's softmax, a slice)."""
    g = Graph("anysize-block")
    ids = g.input("ids", ("batch", "seq"), "int64")
    mask = g.input("mask", ("batch", "seq"), "int64")  # cast in the region that makes the additive mask
    positions = g.sized_constant("arange", ("seq",), "int64", start=0, delta=1)
    x = g.add(g.gather(g.param("emb", rand((VOCAB, D), 1)), ids, axis=0),
              g.gather(g.param("pos", rand((MAX_POS, D), 2)), positions, axis=0))
    x = g.layer_norm(x, g.param("ln0_s", 1 + rand((D,), 3)), g.param("ln0_b", rand((D,), 4)), axis=-1, eps=1e-5)

    def dense(t: Any, k: int, n: int, seed: int) -> Any:
        return g.add(g.matmul(t, g.param(f"w{seed}", rand((k, n), seed))), g.param(f"b{seed}", rand((n,), seed + 50)))

    def heads(t: Any) -> Any:
        return g.transpose(g.reshape(t, ("batch", "seq", H, D // H)), (0, 2, 1, 3))

    q, k, v = (heads(dense(x, D, D, s)) for s in (10, 11, 12))
    additive = g.mul(g.sub(g.constant(np.float32(1)), g.cast(g.reshape(mask, ("batch", 1, 1, "seq")), "float32")),
                     g.constant(np.float32(-1e4)))
    a = g.reshape(g.transpose(g.attention(q, k, v, additive), (0, 2, 1, 3)), ("batch", "seq", D))
    h = g.layer_norm(g.add(x, dense(a, D, D, 13)), g.param("ln1_s", 1 + rand((D,), 5)),
                     g.param("ln1_b", rand((D,), 6)), axis=-1, eps=1e-5)
    f = dense(g.gelu(dense(h, D, 4 * D, 14)), 4 * D, D, 15)
    out = g.layer_norm(g.add(h, f), g.param("ln2_s", 1 + rand((D,), 7)), g.param("ln2_b", rand((D,), 8)),
                       axis=-1, eps=1e-5)
    first = g.reshape(g.slice(out, (0,), (1,), axes=(1,)), ("batch", D))
    g.set_outputs([out, g.softmax(first, axis=-1)])
    return g


def feeds_of(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, seq + 1, batch)
    return {"ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64),
            "mask": (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)}


def assert_reference(g: Graph, outs: list[np.ndarray], feeds: dict[str, np.ndarray]) -> None:
    want = reference.evaluate(g, feeds)
    assert len(outs) == len(want)
    for got, ref in zip(outs, want):
        assert got.shape == ref.shape and got.dtype == (np.float32 if ref.dtype == np.float64 else ref.dtype)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


_MODES = ["off", pytest.param("on", marks=pytest.mark.skipif(onednn.find_library() is None,
                                                             reason="oneDNN is not installed"))]


@pytest.fixture(params=_MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Dense layers on rlx's kernels (``off``: every host without the extra) or on oneDNN's
    matmul for every row count (``on``)."""
    monkeypatch.setenv("RLX_CPU_ONEDNN", request.param)
    monkeypatch.setattr(anysize_kernels, "DENSE_MIN_MACS", _SPLIT)
    return str(request.param)


#: Products of 40 rows of a 16 x 16 layer or more on oneDNN, smaller ones on the BLAS
#: (``anysize_kernels.DENSE_MIN_MACS``, scaled to these widths): sizes here take both.
_SPLIT = 40 * D * D


@pytest.fixture(scope="module", params=_MODES)
def served(request: pytest.FixtureRequest) -> Any:
    """The block compiled on cpu, past its first size: every new size runs on the any-size
    executable (its dense layers as the mode says: chosen when it is compiled)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLX_CPU_ONEDNN", request.param)
        mp.setattr(anysize_kernels, "DENSE_MIN_MACS", _SPLIT)
        g = block()
        cg = rlx.compile(g, device="cpu")
        cg.run(feeds_of(1, 3))  # the first size: compiled for itself
        assert isinstance(cg.for_inputs(feeds_of(2, 5)), AnySizeGraph)
        dense = cg.for_inputs(feeds_of(2, 5))._exe._dense
        assert bool(dense) == (request.param == "on")  # 6 dense layers on oneDNN, or none
    return g, cg


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 6), seq=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_every_size_matches_the_reference(served: tuple[Graph, Any], batch: int, seq: int, seed: int) -> None:
    g, cg = served
    feeds = feeds_of(batch, seq, seed)
    assert_reference(g, cg.run(feeds), feeds)


def test_values_share_a_slot_only_when_their_lives_do_not_overlap() -> None:
    """Each value that holds run memory has a slot; two values share one only when the
    first's last reader (through its views) has run before the second is computed, or
    the second is computed over the first (in place). Slots are fewer than such values."""
    exe = CpuBackend().compile_symbolic(_lowered(mask_arithmetic()), rlx.CompileOptions(device="cpu"))
    assert exe is not None
    slot_of = {nid: cell[0] for nid, cell in exe._slot_cells.items()}
    for nid, src in exe._inplace.items():  # (in program order: a chain's first holder has its slot)
        slot_of[nid] = slot_of[src]
    assert len(set(slot_of.values())) == exe._slots < len(slot_of)
    assert [nid for nid, _ in exe._program] == sorted(nid for nid, _ in exe._program)
    for a in slot_of:
        for b in slot_of:
            if a < b and slot_of[a] == slot_of[b] and exe._inplace.get(b) != a and not _chained(exe, a, b):
                assert exe._ends[a] < b, (a, b)  # (the program runs in node order)


def _chained(exe: Any, a: int, b: int) -> bool:
    """Whether ``b`` is computed, through in-place steps, over ``a``."""
    while b in exe._inplace:
        b = exe._inplace[b]
        if b == a:
            return True
    return False


def test_a_causal_mask_expanded_by_ones_is_a_view_and_right(mode: str) -> None:
    """An exporter's ``Expand`` of a (seq, seq) causal mask to the batch, converted as a
    product with a sized constant of ones: the executable makes it a broadcast view (the
    mask is kept per length, nothing is written per request), and the answers hold."""
    g = Graph("causal")
    x = g.input("x", ("batch", "seq", D), "float32")
    positions = g.sized_constant("arange", ("seq",), "int64", start=0, delta=1)
    causal = g.where(g.less(g.reshape(positions, (1, "seq")), g.reshape(positions, ("seq", 1))),
                     g.constant(np.float32(-1e4)), g.constant(np.float32(0)))
    mask = g.mul(g.reshape(causal, (1, 1, "seq", "seq")), g.sized_constant("fill", ("batch", 1, 1, 1), "float32",
                                                                          value=1.0))
    h = g.reshape(x, ("batch", 1, "seq", D))
    g.set_outputs([g.add(g.attention(h, h, h, mask), h), mask])
    exe = CpuBackend().compile_symbolic(_lowered(g), rlx.CompileOptions(device="cpu"))
    assert exe is not None and exe._broadcasts  # (the product with ones became a view)
    for batch, seq in ((1, 1), (3, 7), (2, 7), (4, 19)):
        f = {"x": rand((batch, seq, D), batch * seq)}
        outs = exe.run(f)
        assert_reference(g, outs, f)
        assert outs[1].flags.owndata and outs[1].flags.writeable  # the mask output: a copy, not our view


def test_it_is_the_executable_for_every_size_that_ran(served: tuple[Graph, Any]) -> None:
    _, cg = served
    exe = cg.for_inputs(feeds_of(7, 45))._exe  # (a size no other test meets: one met STATIC_AFTER times gets its own)
    assert isinstance(exe, anysize.AnySizeExecutable)
    assert any(n.startswith("any size: one executable") for n in cg.report().notes)


def test_an_output_the_caller_holds_is_never_written_again_and_a_dropped_one_is_reused(mode: str) -> None:
    g = block()
    exe = CpuBackend().compile_symbolic(_lowered(g), rlx.CompileOptions(device="cpu"))
    assert exe is not None
    sizes = [(3, 17), (2, 9), (4, 30), (3, 17), (1, 1), (5, 12)]
    held = [(f, exe.run(f)) for f in (feeds_of(b, s, i) for i, (b, s) in enumerate(sizes))]
    for f, outs in held:  # after every later run: still the answers of their own inputs
        assert_reference(g, outs, f)
    f = feeds_of(3, 17, 99)
    first = exe.run(f)[0]
    address = first.__array_interface__["data"][0]
    del first, held
    again = exe.run(f)[0]  # the caller let the last one go: its memory serves again
    assert again.__array_interface__["data"][0] == address


def test_runs_from_several_threads_at_once_give_each_its_own_answers(served: tuple[Graph, Any]) -> None:
    g, cg = served
    sizes = [(b, s) for b in (1, 2, 5) for s in (4, 19, 33)] * 2
    feeds = [feeds_of(b, s, i) for i, (b, s) in enumerate(sizes)]
    barrier = threading.Barrier(3)

    def run(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            barrier.wait(timeout=2)
        except threading.BrokenBarrierError:
            pass
        return cg.run(f)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(run, feeds))
    for f, outs in zip(feeds, results):
        assert_reference(g, outs, f)


def test_set_param_reaches_dense_layers_folds_and_regions(mode: str) -> None:
    g = Graph("params")
    x = g.input("x", ("rows", 24), "float32")
    w = g.param("w", rand((24, 32), 1))
    scale = g.param("scale", np.float32(0.5))
    folded = g.transpose(g.mul(g.param("wt", rand((16, 32), 2)), g.constant(np.float32(2))), (1, 0))  # (32, 16)
    h = g.gelu(g.add(g.matmul(x, w), g.param("b", rand((32,), 3))))
    g.set_outputs([g.mul(g.matmul(h, folded), scale)])
    exe = CpuBackend().compile_symbolic(_lowered(g), rlx.CompileOptions(device="cpu"))
    assert exe is not None
    new = {"w": rand((24, 32), 11), "scale": np.float32(-1.5), "wt": rand((16, 32), 12), "b": rand((32,), 13)}
    for name, value in new.items():
        exe.set_param(name, value)
        g.replace_value(next(i for i in g.params if g.node(i).name == name), value)
        for rows in (1, 7, 130):
            f = {"x": rand((rows, 24), rows)}
            assert_reference(g, exe.run(f), f)
    with pytest.raises(InputError, match=r"set_param: graph 'params' has no param 'nope'"):
        exe.set_param("nope", np.zeros(1, np.float32))
    with pytest.raises(InputError, match=r"set_param 'w': expected float32\[24, 32\], got float32\[3\]"):
        exe.set_param("w", np.zeros(3, np.float32))


def test_set_param_reaches_values_kept_per_size() -> None:
    """The position embeddings gathered by a ``Range(0, seq)`` are kept per length; a new
    position table set afterwards is what the next run reads."""
    g = block()
    exe = CpuBackend().compile_symbolic(_lowered(g), rlx.CompileOptions(device="cpu"))
    assert exe is not None
    f = feeds_of(2, 9)
    assert_reference(g, exe.run(f), f)  # (kept for seq 9 now)
    table = rand((MAX_POS, D), 99)
    exe.set_param("pos", table)
    g.replace_value(next(i for i in g.params if g.node(i).name == "pos"), table)
    assert_reference(g, exe.run(f), f)


def test_a_bad_request_is_an_input_error_and_the_next_one_runs(mode: str) -> None:
    g = block()
    exe = CpuBackend().compile_symbolic(_lowered(g), rlx.CompileOptions(device="cpu"))
    assert exe is not None
    with pytest.raises(InputError, match=r"\(gather\): index 64 is out of range for axis 0 of size 64"):
        exe.run(feeds_of(2, 66))  # positions past the table's 64 rows
    f = feeds_of(2, 9)
    assert_reference(g, exe.run(f), f)


def test_zero_rows_run_and_give_empty_outputs(mode: str) -> None:
    g = Graph("rows")
    x = g.input("x", ("rows", 8), "float32")
    g.set_outputs([g.gelu(g.add(g.matmul(x, g.param("w", rand((8, 4), 1))), g.param("b", rand((4,), 2))))])
    exe = CpuBackend().compile_symbolic(_lowered(g), rlx.CompileOptions(device="cpu"))
    assert exe is not None
    (out,) = exe.run({"x": np.zeros((0, 8), np.float32)})
    assert out.shape == (0, 4)


def test_graphs_with_convolutions_are_compiled_per_shape_class() -> None:
    g = Graph("conv")
    x = g.input("x", ("batch", 3, 8, 8), "float32")
    g.set_outputs([g.relu(g.conv2d(x, g.param("w", rand((4, 3, 3, 3), 1)), padding=1))])
    assert CpuBackend().compile_symbolic(_lowered(g), rlx.CompileOptions(device="cpu")) is None
    cg = rlx.compile(g, device="cpu")
    for batch in (1, 2, 3):
        f = {"x": rand((batch, 3, 8, 8), batch)}
        np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-4, atol=1e-4)
    assert cg.compiles == 3 and not any(n.startswith("any size") for n in cg.report().notes)


def test_the_setting_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CPU_ANY_SIZE", "off")
    assert CpuBackend().compile_symbolic(_lowered(block()), rlx.CompileOptions(device="cpu")) is None
    monkeypatch.setenv("RLX_CPU_ANY_SIZE", "sometimes")
    with pytest.raises(rlx.ConfigError, match="RLX_CPU_ANY_SIZE"):
        CpuBackend().compile_symbolic(_lowered(block()), rlx.CompileOptions(device="cpu"))


# ---------------------------------------------------------------------- the kernels
@pytest.mark.skipif(native_library() is None, reason="the native kernels did not load")
@pytest.mark.parametrize(("shapes", "out_shape"), [
    (((5, 7), (5, 7)), (5, 7)),
    (((5, 7), (7,)), (5, 7)),
    (((5, 1, 7), (1, 3, 7)), (5, 3, 7)),
    (((1, 1), (4, 6)), (4, 6)),
    (((2, 1, 1, 9), (2, 3, 9, 9)), (2, 3, 9, 9)),
    (((1,), (1,)), (1,)),
])
def test_a_region_template_runs_any_shape_like_numpy(shapes: tuple[tuple[int, ...], ...],
                                                      out_shape: tuple[int, ...]) -> None:
    lib = native_library()
    program = [Instruction(OpKind.MUL, (0, 1), {}, out_shape, "float32"),
               Instruction(OpKind.TANH, (2,), {}, out_shape, "float32"),
               Instruction(OpKind.ADD, (3, 0), {}, out_shape, "float32")]
    template = regions.RegionTemplate(lib, program, 2, {})
    ins = [rand(s, k) for k, s in enumerate(shapes)]
    out = np.empty(out_shape, np.float32)
    template(ins, out)
    np.testing.assert_allclose(out, np.tanh(ins[0] * ins[1]) + ins[0], rtol=1e-6, atol=1e-6)
    a = rand((6, 4), 9)
    strided = [a.T, rand((4, 6), 10)]  # a transposed view: strided, read as it lies
    out2 = np.empty((4, 6), np.float32)
    template(strided, out2)
    np.testing.assert_allclose(out2, np.tanh(a.T * strided[1]) + a.T, rtol=1e-6, atol=1e-6)
    same = rand((4, 6), 11)  # in place: the output over its first operand
    want = np.tanh(same * strided[1]) + same
    template([same, strided[1]], same)
    np.testing.assert_allclose(same, want, rtol=1e-6, atol=1e-6)
    buf = rand((10,), 12)
    apart = np.empty(5, np.float32)
    template([buf[5:10], buf[0:5]], apart)  # these shapes and strides apart: their layout kept...
    np.testing.assert_allclose(apart, np.tanh(buf[5:10] * buf[0:5]) + buf[5:10], rtol=1e-6, atol=1e-6)
    with pytest.raises(regions.NoFit):  # ...the output overlapping an operand elsewhere: refused per call, not wrong
        template([buf[1:6], buf[0:5]], buf[0:5])
    backwards = rand((5,), 13)
    template([backwards[::-1], buf[0:5]], apart)  # a negative stride: read where it lies
    np.testing.assert_allclose(apart, np.tanh(backwards[::-1] * buf[0:5]) + backwards[::-1], rtol=1e-6, atol=1e-6)
    with pytest.raises(regions.NoFit):  # ... and refused where it overlaps the output
        template([buf[5:0:-1], buf[5:10]], buf[0:5])
    shifted = np.zeros(24, np.uint8)[1:21].view(np.float32)  # misaligned: refused per call (numpy's way runs)
    with pytest.raises(regions.NoFit):
        template([shifted, buf[0:5]], apart)
    with pytest.raises(regions.NoFit):  # a one-value operand inside the output: overwritten before all read it
        template([buf[2:3], buf[5:10]], buf[0:5])


@pytest.mark.skipif(native_library() is None, reason="the native kernels did not load")
def test_a_region_template_reads_bools_where_they_lie() -> None:
    """Bool operands (contiguous, a transposed view, broadcast, one element) read as 0/1
    floats from their bytes, at any address (no alignment to keep), and never written
    over (a bool operand sharing the output's memory is refused)."""
    lib = native_library()
    shape = (6, 9)
    program = [Instruction(OpKind.WHERE, (1, 2, 3), {}, shape, "bool"),  # not k, as an import writes it
               Instruction(OpKind.WHERE, (0, 6, 1), {}, shape, "bool"),  # m xor k
               Instruction(OpKind.EQUAL, (7, 0), {}, shape, "bool"),  # bools compared
               Instruction(OpKind.WHERE, (8, 4, 5), {}, shape, "float32")]
    template = regions.RegionTemplate(lib, program, 6, {}, ["bool"] * 4 + ["float32"] * 2)
    rng = np.random.default_rng(3)
    x, y = rand(shape, 1), rand(shape, 2)
    for m, k in ((rng.random(shape) > 0.5, rng.random(shape) > 0.5),
                 ((rng.random((9, 6)) > 0.5).T, rng.random((1, 9)) > 0.5),  # strided; broadcast rows
                 (np.zeros((*shape, 1), bool)[..., 0], np.array([True]))):  # one value
        out = np.empty(shape, np.float32)
        template([m, k, np.array(False), np.array(True), x, y], out)
        m_, k_ = np.broadcast_to(m, shape), np.broadcast_to(k, shape)
        want = np.where(np.where(m_, ~k_, k_) == m_, x, y)
        np.testing.assert_array_equal(out, want)
    raw = np.zeros(shape[0] * shape[1] * 4, np.uint8)
    with pytest.raises(regions.NoFit):  # a bool over the output's own bytes
        template([raw[:54].view(bool).reshape(shape), raw[1:55].view(bool).reshape(shape), np.array(False),
                  np.array(True), x, y], raw.view(np.float32).reshape(shape))


@pytest.mark.skipif(onednn.find_library() is None, reason="oneDNN is not installed (pip install 'rlx-cpu[onednn]')")
@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
def test_a_run_time_dense_layer_takes_any_row_count(activation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu.onednn_dense import RunTimeDense

    monkeypatch.setenv("RLX_CPU_ONEDNN", "on")
    lib = onednn.library()
    assert lib is not None
    w, bias = rand((24, 40), 1), rand((1, 40), 2)
    dense = RunTimeDense(lib, w, bias, activation)
    for rows in (1, 2, 17, 300):
        a = rand((rows, 24), rows)
        out = np.empty((rows, 40), np.float32)
        dense(a, out)
        y = a.astype(np.float64) @ w + bias
        want = {"none": y, "relu": np.maximum(y, 0),
                "gelu": 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))}[activation]
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    w[:] = rand((24, 40), 3)  # the weights changed in place (set_param): reordered again
    dense.refresh()
    a = rand((5, 24), 4)
    out = np.empty((5, 40), np.float32)
    dense(a, out)
    if activation == "none":
        np.testing.assert_allclose(out, a.astype(np.float64) @ w + bias, rtol=1e-4, atol=1e-4)


def _lowered(g: Graph) -> Graph:
    """``g`` lowered once for cpu (legalize, optimize, fuse on the symbolic graph)."""
    from rlx_core.backends.registry import default_registry
    from rlx_core.compiler.lowered_once import LoweredOnce
    from rlx_core.ir.specialize import representative

    g.freeze()
    result = LoweredOnce(g, "cpu", representative(g)[1], default_registry(), None)._lowered()
    assert result is not None
    return result.graph


def mask_arithmetic() -> Graph:
    """What exports compute around their products: int64 positions and a bool padding
    mask read at ``batch_idx * seq + kv_idx``, a causal comparison, ``where`` on bools,
    casts, rotary halves concatenated and a rotary table's cosines and sines, an RMS
    norm's mean, integer sums and maxima."""
    g = Graph("masks")
    x = g.input("x", ("batch", "seq", D), "float32")
    keep = g.input("keep", ("batch", "seq"), "int64")
    rows = g.reshape(g.sized_constant("arange", ("batch",), "int64", start=0, delta=1), ("batch", 1, 1))
    cols = g.sized_constant("arange", ("seq",), "int64", start=0, delta=1)
    seq = g.sized_constant("dims", (1,), "int64", values=("seq",))
    flat = g.reshape(g.cast(keep, "bool"), (Sym("batch") * Sym("seq"),))
    padding = g.gather(flat, g.add(g.mul(rows, seq), g.reshape(cols, (1, 1, "seq"))))  # (batch, 1, seq)
    causal = g.less(g.reshape(cols, (1, "seq", 1)), g.reshape(cols, (1, 1, "seq")))  # (1, seq, seq)
    allowed = g.where(causal, g.constant(False), padding)
    scores = g.matmul(x, g.transpose(x, (0, 2, 1)))
    probs = g.softmax(g.where(allowed, scores, g.constant(np.float32(-1e9))), axis=-1)
    half = D // 2
    rotated = g.concat([g.neg(g.slice(x, (half,), (D,), axes=(2,))), g.slice(x, (0,), (half,), axes=(2,))], axis=2)
    rms = g.reduce_mean(g.mul(x, x), axes=(2,), keepdims=True)
    angles = g.mul(x, g.constant(np.float32(3.0)))  # a rotary table's cosines and sines, per run
    g.set_outputs([g.matmul(probs, rotated), g.div(x, g.add(rms, g.constant(np.float32(1.0)))),
                   g.reduce_sum(keep, axes=(1,)), g.reduce_max(g.cast(allowed, "int32"), axes=(1, 2)),
                   g.cos(angles), g.sin(angles)])
    return g


def test_mask_arithmetic_runs_as_numpy_calls_with_the_reference_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No node of it but the products falls to the plan's kernel built per run (~50 µs
    each; a product may, by design, where this host's verdict is rlx's GEMM)."""
    built: list[str] = []
    plain = anysize.AnySizeExecutable._compute
    monkeypatch.setattr(anysize.AnySizeExecutable, "_compute",
                        staticmethod(lambda node, *a: (built.append(str(node.op)), plain(node, *a))[1]))
    g = mask_arithmetic()
    exe = CpuBackend().compile_symbolic(_lowered(g), rlx.CompileOptions(device="cpu"))
    assert exe is not None
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 1), (3, 7), (2, 12)):
        keep = (rng.random((batch, seq)) > 0.3).astype(np.int64)
        keep[:, 0] = 1
        f = {"x": rand((batch, seq, D), seq), "keep": keep}
        assert_reference(g, exe.run(f), f)
    assert set(built) <= {"matmul", "gemm"}, built


def test_a_softmax_nan_guard_runs_as_one_region_at_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exporter's guard after a masked softmax, ``where(isnan(p), 0, p)`` (``isnan`` as
    ``where(p == p, False, True)``, bool constants chosen between) and a padding mask
    chosen by ``where`` on bools: one region on the native interpreter at every size (it
    was numpy's passes, ~2 ms a call on a BERT request), never the plan's kernel or
    numpy's runner, and the reference's answers, NaN rows guarded to 0."""
    if native_library() is None:
        pytest.skip("the native library is not built here")
    built: list[str] = []
    plain = anysize.AnySizeExecutable._compute
    monkeypatch.setattr(anysize.AnySizeExecutable, "_compute",
                        staticmethod(lambda node, *a: (built.append(str(node.op)), plain(node, *a))[1]))
    numpy_ran: list[str] = []
    real_numpy_runner = anysize.numpy_runner

    def spied(node: Any, *a: Any) -> Any:
        fn = real_numpy_runner(node, *a)
        return None if fn is None else (lambda *b: (numpy_ran.append(str(node.op)), fn(*b))[1])
    monkeypatch.setattr(anysize, "numpy_runner", spied)
    g = Graph("guard")
    s = g.input("scores", ("batch", "seq", "seq"), "float32")
    keep = g.input("keep", ("batch", 1, "seq"), "bool")
    false, true = g.constant(np.bool_(False)), g.constant(np.bool_(True))
    allowed = g.where(keep, g.greater(s, -5.0), false)  # and
    p = g.softmax(g.where(allowed, s, g.constant(np.float32(-np.inf))), axis=-1)  # a fully masked row: NaN
    nan = g.where(g.equal(p, p), false, true)
    g.set_outputs([g.where(nan, g.constant(np.float32(0.0)), p)])
    exe = CpuBackend().compile_symbolic(_lowered(g), rlx.CompileOptions(device="cpu"))
    assert exe is not None
    rng = np.random.default_rng(1)
    for batch, seq in ((1, 1), (2, 9), (3, 40)):
        k = rng.random((batch, 1, seq)) > 0.3
        k[0] = False  # the first item's every key masked: its rows NaN before the guard
        f = {"scores": rand((batch, seq, seq), seq, 3.0), "keep": k}
        (got,) = exe.run(f)
        (want,) = reference.evaluate(g, f)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
        assert not np.isnan(got).any() and not got[0].any()
    assert not built and not numpy_ran, (built, numpy_ran)
