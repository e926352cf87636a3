"""The cpu kernels of the exact elementwise ops (floor, ceil, round, fmod, the bitwise
ops, the shifts) where the conformance kit's small cases do not reach: inside fused
regions (numpy's blocked path: the native interpreter declines these ops), over many
blocks with broadcast operands, written over a dying input, on float16, and the run-time
error of an integer fmod by zero. Everything is held bit for bit to the reference."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.errors import InputError
from rlx_core.ir.ops import OpKind
from rlx_cpu import regions
from rlx_cpu.kernels import inplace_positions

RNG = np.random.default_rng(11)


def _check(g: rlx.Graph, feeds: dict[str, np.ndarray], fused: bool) -> rlx.CompiledGraph:
    cg = rlx.compile(g, "cpu")
    ops = {n.op for n in cg._legal.nodes}
    assert (OpKind.FUSED_ELEMENTWISE in ops) is fused, cg.report()
    with np.errstate(invalid="ignore"):
        refs = reference.evaluate(g, feeds)
    for i, (got, ref) in enumerate(zip(cg.run(feeds), refs)):
        want = ref.astype(g.node(g.outputs[i]).dtype)
        np.testing.assert_array_equal(got, want, err_msg=f"output {i}")
        finite = ~np.isnan(want) if want.dtype.kind == "f" else np.ones(want.shape, bool)
        assert np.array_equal(np.signbit(got[finite]), np.signbit(want[finite])), f"output {i}: signed zeros"
    return cg


@pytest.mark.parametrize("shape", [(37, 1000), (3, 5, 7)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_rounding_and_fmod_in_a_region_with_broadcast_operands(shape: tuple[int, ...], dtype: str) -> None:
    g = rlx.Graph("rounding")
    x = g.input("x", shape, dtype)
    row = g.input("row", shape[-1:], dtype)
    h = g.add(g.round(g.mul(x, 4.0)), g.floor(row))
    h = g.sub(g.ceil(h), g.fmod(x, row))
    g.set_outputs([g.mul(h, 0.5)])
    x_val = (RNG.integers(-400, 400, shape) / 8).astype(dtype)  # many exact halves for round
    row_val = RNG.choice(np.array([-2.5, -0.75, 1.25, 3.0, np.inf, 0.0], dtype), shape[-1:])
    _check(g, {"x": x_val, "row": row_val}, fused=True)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_bit_ops_in_a_region_over_many_blocks(dtype: str) -> None:
    shape = (60, 900)
    info = np.iinfo(dtype)
    g = rlx.Graph("bits")
    x = g.input("x", shape, dtype)
    s = g.input("s", shape[-1:], dtype)
    h = g.bitwise_xor(g.bit_shift_left(x, s), g.bitwise_not(x))
    h = g.bitwise_or(g.bit_shift_right(h, g.bitwise_and(s, 7)), g.fmod(x, 5))
    g.set_outputs([g.add(h, 1)])
    feeds = {"x": RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True),
             "s": RNG.integers(-info.bits, 2 * info.bits, shape[-1:]).astype(dtype)}
    _check(g, feeds, fused=True)


def test_native_interpreter_declines_the_new_ops_and_numpy_runs_them(region_runs: list) -> None:
    """A float32 region with floor goes through numpy's blocked path, never the C
    interpreter (which has no such opcode)."""
    g = rlx.Graph("declined")
    x = g.input("x", (8, 8), "float32")
    g.set_outputs([g.mul(g.floor(g.add(x, 0.5)), 2.0)])
    _check(g, {"x": RNG.uniform(-4, 4, (8, 8)).astype(np.float32)}, fused=True)
    assert not region_runs


def test_ops_alone_and_written_over_a_dying_input() -> None:
    """Single nodes (not fusable: each feeds a graph output) of every new op, some over a
    matmul's buffer that dies at them."""
    g = rlx.Graph("alone")
    x = g.input("x", (16, 24), "float32")
    t = g.matmul(x, g.param("w", RNG.standard_normal((24, 24)).astype(np.float32)))
    i = g.input("i", (16, 24), "int64")
    j = g.input("j", (24,), "int64")
    outs = [g.floor(t), g.ceil(x), g.round(x), g.fmod(x, 0.75), g.fmod(i, j), g.bitwise_not(i)]
    outs += [getattr(g, op)(i, j) for op in ("bitwise_and", "bitwise_or", "bitwise_xor", "bit_shift_left",
                                             "bit_shift_right")]
    g.set_outputs(outs)
    feeds = {"x": RNG.uniform(-3, 3, (16, 24)).astype(np.float32),
             "i": RNG.integers(-(2**62), 2**62, (16, 24)), "j": RNG.integers(1, 70, (24,))}
    _check(g, feeds, fused=False)


@pytest.mark.parametrize("fused", [False, True])
def test_integer_fmod_by_zero_is_an_input_error_naming_the_node(fused: bool) -> None:
    g = rlx.Graph("zero")
    a, b = g.input("a", (4,), "int32"), g.input("b", (4,), "int32")
    r = g.fmod(a, b, name="rem")
    g.set_outputs([g.add(r, 1) if fused else r])
    cg = rlx.compile(g, "cpu")
    assert (OpKind.FUSED_ELEMENTWISE in {n.op for n in cg._legal.nodes}) is fused, cg.report()
    ok = cg.run({"a": np.array([7, -7, 3, 0], np.int32), "b": np.array([2, 2, -2, 5], np.int32)})[0]
    np.testing.assert_array_equal(ok, np.array([1, -1, 1, 0]) + (1 if fused else 0))
    with pytest.raises(InputError, match=r"integer fmod by zero"):
        cg.run({"a": np.array([7, -7, 3, 0], np.int32), "b": np.array([2, 0, -2, 5], np.int32)})


def test_which_kernels_may_write_over_their_inputs() -> None:
    """Elementwise ufuncs and fmod (its divisor is checked before anything is written)
    may; the shifts read their operands again after writing, so they may not."""
    g = rlx.Graph("inplace")
    i = g.input("i", (3,), "int32")
    f = g.input("f", (3,), "float32")
    assert inplace_positions(g.node(g.fmod(i, i).id)) == (0, 1)
    assert inplace_positions(g.node(g.bitwise_and(i, i).id)) == (0, 1)
    assert inplace_positions(g.node(g.floor(f).id)) == (0,)
    assert inplace_positions(g.node(g.bit_shift_left(i, i).id)) == ()
    assert "floor" not in {name for name in regions.OPCODES}
