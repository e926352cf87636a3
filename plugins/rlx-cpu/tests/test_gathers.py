"""Gathers by constant indices on the native kernels, and the resizes they spell
(``rlx_cpu/gathers.py``): every dtype and axis against numpy's take, the regions of
weighted gathers computed in one pass without the gathers, the cases left alone, and
``set_param`` of an index table."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.errors import InputError
from rlx_cpu import gathers, native

RNG = np.random.default_rng(11)


def spy(monkeypatch: pytest.MonkeyPatch, lib: native.Native, name: str) -> list[tuple[Any, ...]]:
    """The calls of ``lib.name`` by plans bound from here on."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(lib, name)
    monkeypatch.setattr(lib, name, lambda *a: (calls.append(a), real(*a))[1])
    return calls


def data(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    if dtype.startswith("int"):
        return RNG.integers(-1000, 1000, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "int32", "bool"])
@pytest.mark.parametrize(("shape", "axis", "index"), [
    ((2, 3, 5, 4), 3, [0, 3, 3, 1, -1, 2, 0]),        # the last axis: elements
    ((2, 3, 5, 4), 2, [4, 0, -2, 1]),                 # rows of 4
    ((6, 7), 0, [[5, 0], [1, -6], [2, 2]]),           # a 2-d index table, whole rows
    ((1, 21, 8, 3), 2, list(range(8))[::-1] * 3),    # more outputs than inputs
])
def test_a_gather_by_constant_indices_runs_natively_and_equals_take(
        native_lib: native.Native, monkeypatch: pytest.MonkeyPatch, dtype: str, shape: tuple[int, ...], axis: int,
        index: list[Any]) -> None:
    calls = spy(monkeypatch, native_lib, "gather_axis")
    g = rlx.Graph("gather")
    x = g.input("x", shape, dtype)
    idx = np.array(index, np.int64)
    g.set_outputs([g.gather(x, g.constant(idx), axis=axis)])
    cg = rlx.compile(g, device="cpu")
    xv = data(shape, dtype)
    for arr in (xv, np.asfortranarray(xv)):  # a caller's strided array: numpy's take, same result
        np.testing.assert_array_equal(cg.run({"x": arr})[0], np.take(xv, idx, axis))
    assert calls, "the gather did not run on the native kernel"


def test_a_gather_by_run_time_indices_keeps_numpy_and_names_a_bad_index(native_lib: native.Native,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy(monkeypatch, native_lib, "gather_axis")
    g = rlx.Graph("lookup")
    table = g.param("table", RNG.standard_normal((10, 4)).astype(np.float32))
    ids = g.input("ids", (3,), "int64")
    g.set_outputs([g.gather(table, ids, axis=0)])
    cg = rlx.compile(g, device="cpu")
    np.testing.assert_array_equal(cg.run({"ids": np.array([9, 0, -1])})[0], np.asarray(g.value(table.id))[[9, 0, -1]])
    with pytest.raises(InputError, match="index 10 is out of range for axis 0 of size 10"):
        cg.run({"ids": np.array([1, 10, 2])})
    assert not calls


def test_an_index_table_that_is_a_param_follows_set_param(native_lib: native.Native) -> None:
    g = rlx.Graph("param index")
    x = g.input("x", (3, 6), "float32")
    idx = g.param("idx", np.array([5, 4, 3], np.int64))
    g.set_outputs([g.gather(x, idx, axis=1)])
    cg = rlx.compile(g, device="cpu")
    xv = data((3, 6), "float32")
    np.testing.assert_array_equal(cg.run({"x": xv})[0], xv[:, [5, 4, 3]])
    cg.set_param("idx", np.array([0, -1, 1], np.int64))
    np.testing.assert_array_equal(cg.run({"x": xv})[0], xv[:, [0, 5, 1]])
    cg.set_param("idx", np.array([0, 6, 1], np.int64))
    with pytest.raises(InputError, match="index 6 is out of range"):
        cg.run({"x": xv})


def resize_graph(shape: tuple[int, ...], axis: int, taps: int, n_out: int, *, one_weight: bool = False,
                 also_output: bool = False, through: str = "relu") -> tuple[rlx.Graph, np.ndarray, np.ndarray]:
    """``relu(x)`` resized along ``axis`` as the ONNX importer writes it: ``taps`` gathers
    by constant index columns, each times a constant weight along the axis, summed in
    order. ``one_weight``: the first tap has weight 1 (no product); ``also_output``: the
    first gather is an output too (then it must be made)."""
    n_in = shape[axis]
    index = RNG.integers(0, n_in, (n_out, taps))
    weights = RNG.standard_normal((n_out, taps)).astype(np.float32)
    if one_weight:
        weights[:, 0] = 1.0
    g = rlx.Graph("resize")
    x = g.input("x", shape, "float32")
    src = g.relu(x) if through == "relu" else x
    along = (n_out,) + (1,) * (len(shape) - axis - 1)
    total = first = None
    for t in range(taps):
        term = g.gather(src, g.constant(index[:, t].copy()), axis=axis)
        first = first or term
        if not (one_weight and t == 0):
            term = g.mul(term, g.constant(weights[:, t].reshape(along).copy()))
        total = term if total is None else g.add(total, term)
    g.set_outputs([total, first] if also_output else [total])
    return g, index, weights


def run_both(g: rlx.Graph, shape: tuple[int, ...]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    cg = rlx.compile(g, device="cpu")
    xv = RNG.standard_normal(shape).astype(np.float32)
    return cg.run({"x": xv}), reference.evaluate(g, {"x": xv.astype(np.float64)})


@pytest.mark.parametrize(("shape", "axis", "taps", "n_out", "one_weight"), [
    ((1, 3, 7, 5), 3, 2, 12, False),   # linear along the last axis
    ((2, 3, 7, 5), 2, 2, 16, False),   # linear along rows
    ((2, 3, 7, 5), 2, 4, 9, False),    # cubic
    ((1, 2, 6, 6), 3, 3, 5, True),     # a tap of weight 1
    ((4, 5), 0, 2, 3, False),          # rank 2, the first axis
])
def test_a_region_of_weighted_gathers_runs_as_one_resize_without_the_gathers(
        native_lib: native.Native, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], axis: int, taps: int,
        n_out: int, one_weight: bool) -> None:
    resizes, gathered = spy(monkeypatch, native_lib, "resize_taps"), spy(monkeypatch, native_lib, "gather_axis")
    g, _, _ = resize_graph(shape, axis, taps, n_out, one_weight=one_weight)
    got, want = run_both(g, shape)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert len(resizes) == 1 and not gathered


def test_the_resize_reads_a_callers_array_directly_and_any_layout_of_it(native_lib: native.Native) -> None:
    g, _, _ = resize_graph((2, 3, 4, 5), 2, 2, 7, through="none")
    cg = rlx.compile(g, device="cpu")
    assert cg._exe._taps  # the plan's own record of what it fused
    xv = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    want = reference.evaluate(g, {"x": xv.astype(np.float64)})[0]
    for arr in (xv, np.asfortranarray(xv), xv.copy()[..., ::1]):
        np.testing.assert_allclose(cg.run({"x": arr})[0], want, rtol=1e-5, atol=1e-5)


def test_a_gather_read_elsewhere_is_made_and_the_region_left_alone(native_lib: native.Native,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    resizes = spy(monkeypatch, native_lib, "resize_taps")
    g, _, _ = resize_graph((1, 2, 5, 5), 3, 2, 8, also_output=True)
    got, want = run_both(g, (1, 2, 5, 5))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert not resizes


def test_without_the_native_kernels_the_resize_is_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CPU_NATIVE", "0")
    g, _, _ = resize_graph((2, 3, 7, 5), 2, 4, 9)
    got, want = run_both(g, (2, 3, 7, 5))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_the_matcher_reads_only_the_importers_chains() -> None:
    """Programs in the interpreter's numbering (inputs first, then each instruction's
    result): a chain of weighted terms is taken in the order it adds them; a sum of two
    sums, a result read twice, or any other op is not."""
    chain = [("mul", (0, 1), ()), ("mul", (2, 3), ()), ("add", (8, 9), ()), ("mul", (7, 6), ()),
             ("add", (11, 10), ())]
    assert gathers._terms(chain, 8) == [(0, 1), (2, 3), (7, 6)]
    assert gathers._terms([("add", (0, 1), ())], 2) == [(0, None), (1, None)]  # weights of 1
    sums = [("mul", (0, 1), ()), ("mul", (2, 3), ()), ("add", (8, 9), ()), ("mul", (4, 5), ()),
            ("mul", (6, 7), ()), ("add", (11, 12), ()), ("add", (10, 13), ())]
    assert gathers._terms(sums, 8) is None
    assert gathers._terms([("mul", (0, 1), ()), ("add", (4, 4), ())], 4) is None
    assert gathers._terms([("sub", (0, 1), ())], 2) is None
    assert gathers._terms([("mul", (0, 1), ())], 2) == [(0, 1)]
