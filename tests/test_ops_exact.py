"""The exact elementwise ops: floor, ceil, round, fmod, the bitwise ops and the shifts.

Their reference meaning (edge cases spelled out by hand, not recomputed with the same
numpy call) and their type rules; the ONNX converters that use them are in
``test_onnx_exact_ops.py``, the cpu kernels in the rlx-cpu plugin's ``test_exact_ops.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.errors import GraphError, InputError
from rlx_core.ir.dtypes import SIGNED_INT_DTYPES, UNSIGNED_INT_DTYPES

I32 = np.iinfo(np.int32)


def _run(build, *arrays: np.ndarray) -> np.ndarray:
    g = rlx.Graph("exact")
    ins = [g.input(f"x{i}", a.shape, a.dtype.name) for i, a in enumerate(arrays)]
    g.set_outputs([build(g, *ins)])
    return reference.evaluate(g, {f"x{i}": a for i, a in enumerate(arrays)})[0]


# ----------------------------------------------------------------------------- reference
def test_rounding_ops_by_hand() -> None:
    x = np.array([-2.5, -1.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, 2.7, -2.7, np.inf, -np.inf, np.nan], np.float32)
    floor = [-3, -2, -1, -0.0, 0, 0, 1, 2, 2, -3, np.inf, -np.inf, np.nan]
    ceil = [-2, -1, -0.0, -0.0, 0, 1, 2, 3, 3, -2, np.inf, -np.inf, np.nan]
    rnd = [-2, -2, -0.0, -0.0, 0, 0, 2, 2, 3, -3, np.inf, -np.inf, np.nan]  # halves to even
    for op, want in (("floor", floor), ("ceil", ceil), ("round", rnd)):
        got = _run(lambda g, a, op=op: getattr(g, op)(a), x)
        np.testing.assert_array_equal(got, want, err_msg=op)
        assert np.array_equal(np.signbit(got), np.signbit(np.array(want))), f"{op}: signed zeros"


def test_fmod_floats_follow_c() -> None:
    a = np.array([7.5, -7.5, 7.5, -7.5, -0.0, np.inf, 1.0, 3.0, np.nan, 5.0], np.float64)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, 2.0, 0.0, np.inf, 1.0, 2.5], np.float64)
    got = _run(lambda g, x, y: g.fmod(x, y), a, b)
    np.testing.assert_array_equal(got, [1.5, -1.5, 1.5, -1.5, -0.0, np.nan, np.nan, 3.0, np.nan, 0.0])
    assert np.signbit(got[4]) and np.signbit(got[1]) and not np.signbit(got[9])


@pytest.mark.parametrize("dtype", sorted(SIGNED_INT_DTYPES))
def test_fmod_integers_truncate_and_refuse_zero(dtype: str) -> None:
    a = np.array([7, -7, 7, -7, 0, np.iinfo(dtype).min], dtype)
    b = np.array([2, 2, -2, -2, 5, -1], dtype)
    np.testing.assert_array_equal(_run(lambda g, x, y: g.fmod(x, y), a, b), [1, -1, 1, -1, 0, 0])
    with pytest.raises(InputError, match=r"fmod\): integer fmod by zero"):
        _run(lambda g, x, y: g.fmod(x, y), a, np.array([1, 1, 0, 1, 1, 1], dtype))


@pytest.mark.parametrize("dtype", sorted(UNSIGNED_INT_DTYPES))
def test_fmod_unsigned_integers_over_the_whole_range(dtype: str) -> None:
    top = np.iinfo(dtype).max
    a = np.array([7, top, top, 0, 5], dtype)
    b = np.array([2, 2, top, 3, top], dtype)
    np.testing.assert_array_equal(_run(lambda g, x, y: g.fmod(x, y), a, b), np.array([1, 1, 0, 0, 5], dtype))
    with pytest.raises(InputError, match=r"fmod\): integer fmod by zero"):
        _run(lambda g, x, y: g.fmod(x, y), a, np.array([1, 1, 0, 1, 1], dtype))


def test_bitwise_ops_by_hand() -> None:
    a = np.array([12, -1, I32.min, 0x0F0F], np.int32)
    b = np.array([10, 5, -1, 0x00FF], np.int32)
    np.testing.assert_array_equal(_run(lambda g, x, y: g.bitwise_and(x, y), a, b), [8, 5, I32.min, 0x000F])
    np.testing.assert_array_equal(_run(lambda g, x, y: g.bitwise_or(x, y), a, b), [14, -1, -1, 0x0FFF])
    np.testing.assert_array_equal(_run(lambda g, x, y: g.bitwise_xor(x, y), a, b), [6, -6, I32.max, 0x0FF0])
    np.testing.assert_array_equal(_run(lambda g, x: g.bitwise_not(x), a), [-13, 0, I32.max, -0x0F10])


def test_shifts_wrap_fill_with_the_sign_and_define_out_of_range_amounts() -> None:
    """ONNX BitShift-28's own examples (int32), and the same rule at int64's width."""
    x = np.array([16, 1, 1073741824, -1073741824, -8, -1, I32.min, 4, -8, -8, 4], np.int32)
    s = np.array([1, 31, 1, 1, 1, 1, 1, 32, 33, -1, -32], np.int32)
    left = _run(lambda g, a, b: g.bit_shift_left(a, b), x, s)
    right = _run(lambda g, a, b: g.bit_shift_right(a, b), x, s)
    np.testing.assert_array_equal(left, [32, I32.min, I32.min, I32.min, -16, -2, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(right, [8, 0, 536870912, -536870912, -4, -1, -1073741824, 0, -1, -1, 0])
    big = np.array([-5, 5, 1], np.int64)
    amounts = np.array([64, 64, 63], np.int64)
    np.testing.assert_array_equal(_run(lambda g, a, b: g.bit_shift_right(a, b), big, amounts), [-1, 0, 0])
    np.testing.assert_array_equal(_run(lambda g, a, b: g.bit_shift_left(a, b), big, amounts),
                                  [0, 0, np.iinfo(np.int64).min])


# ----------------------------------------------------------------------------- type rules
def test_type_rules_name_the_op_and_the_dtype() -> None:
    g = rlx.Graph("types")
    f, i, b = g.input("f", (3,), "float32"), g.input("i", (3,), "int64"), g.input("b", (3,), "bool")
    for op in ("floor", "ceil", "round"):
        with pytest.raises(GraphError, match=rf"{op}: needs a float dtype, got \(3,\) int64"):
            getattr(g, op)(i)
    for op in ("bitwise_and", "bitwise_or", "bitwise_xor", "bit_shift_left", "bit_shift_right"):
        with pytest.raises(GraphError, match=rf"{op}: needs an integer dtype"):
            getattr(g, op)(f, f)
        with pytest.raises(GraphError, match=rf"{op}: needs an integer dtype"):
            getattr(g, op)(b, b)
    with pytest.raises(GraphError, match="bitwise_not: needs an integer dtype"):
        g.bitwise_not(b)
    with pytest.raises(GraphError, match="fmod: does not take bool"):
        g.fmod(b, b)
    with pytest.raises(GraphError, match="fmod: inputs have different dtypes"):
        g.fmod(f, i)
    shifted = g.bit_shift_left(g.input("m", (2, 1), "int64"), i)  # numpy broadcasting, like every binary op
    assert (shifted.shape, shifted.dtype) == ((2, 3), "int64")
    assert g.fmod(f, 2).dtype == "float32"  # a Python scalar takes the array operand's dtype
