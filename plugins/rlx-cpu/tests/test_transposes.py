"""Transposes that move the last axis on the native kernels (``rlx_cpu/transposes.py``):
which permutations are batched matrix transposes, and every such one (4-byte dtypes,
edges of every size, a caller's strided array) against numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_cpu import native
from rlx_cpu.transposes import matrix_form

RNG = np.random.default_rng(5)


@pytest.mark.parametrize(("shape", "perm", "form"), [
    ((1, 3136, 128), (0, 2, 1), (1, 3136, 128)),   # tokens <-> channels
    ((2, 3, 4, 5), (0, 2, 3, 1), (2, 3, 20)),      # NCHW -> NHWC
    ((2, 3, 4, 5), (0, 3, 1, 2), (2, 12, 5)),      # NHWC -> NCHW
    ((4, 5), (1, 0), (1, 4, 5)),
    ((2, 1, 4, 5), (0, 3, 1, 2), (2, 4, 5)),       # a unit axis anywhere
    ((2, 3, 4, 5), (0, 2, 1, 3), None),            # the last axis stays: whole rows
    ((2, 3, 4, 5), (3, 2, 1, 0), None),            # not one matrix transpose
    ((1, 12, 128, 64), (0, 2, 1, 3), None),
])
def test_which_permutations_are_batched_matrix_transposes(shape: tuple[int, ...], perm: tuple[int, ...],
                                                          form: tuple[int, int, int] | None) -> None:
    assert matrix_form(shape, perm) == form


def spy(monkeypatch: pytest.MonkeyPatch, lib: native.Native) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    real = lib.transpose
    monkeypatch.setattr(lib, "transpose", lambda *a: (calls.append(a), real(*a))[1])
    return calls


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize(("shape", "perm"), [
    ((1, 67, 45), (0, 2, 1)),      # edges past every 8 x 8 tile and 32 x 32 block
    ((3, 8, 32), (0, 2, 1)),       # whole tiles only
    ((2, 5, 7, 9), (0, 2, 3, 1)),
    ((2, 9, 7, 5), (0, 3, 1, 2)),
    ((9, 2), (1, 0)),
    ((5, 3), (1, 0)),
])
def test_a_matrix_transpose_runs_natively_and_equals_numpys(native_lib: native.Native,
                                                           monkeypatch: pytest.MonkeyPatch, dtype: str,
                                                           shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
    calls = spy(monkeypatch, native_lib)
    g = rlx.Graph("transpose")
    x = g.input("x", shape, dtype)
    g.set_outputs([g.relu(g.transpose(g.relu(x), perm))] if dtype == "float32" else [g.transpose(x, perm)])
    cg = rlx.compile(g, device="cpu")
    xv = (RNG.standard_normal(shape) * 100).astype(dtype)
    want = np.maximum(xv, 0).transpose(perm) if dtype == "float32" else xv.transpose(perm)
    np.testing.assert_array_equal(cg.run({"x": xv})[0], want)
    if dtype == "int32":  # the caller's array itself, strided too: numpy's copy for that run
        np.testing.assert_array_equal(cg.run({"x": np.asfortranarray(xv)})[0], want)
    assert calls


def test_nan_payloads_and_signed_zeros_move_unchanged(native_lib: native.Native) -> None:
    bits = RNG.integers(0, 2**32, (20, 24), dtype=np.uint64).astype(np.uint32)
    bits[0, :4] = [0x7FA00001, 0xFFC00002, 0x80000000, 0x00000001]  # a signaling NaN, a quiet one, -0, a subnormal
    g = rlx.Graph("bits")
    x = g.input("x", (20, 24), "float32")
    g.set_outputs([g.transpose(g.reshape(x, (20, 24)), (1, 0))])
    cg = rlx.compile(g, device="cpu")
    got = cg.run({"x": bits.view(np.float32)})[0]
    np.testing.assert_array_equal(got.view(np.uint32), bits.T)
