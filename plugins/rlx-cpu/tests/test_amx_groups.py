"""Grouped convolutions merged into wider groups (``rlx_cpu.amx_groups``): which merge,
and that the merged weights compute the same convolution."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core.ir import Graph
from rlx_cpu import amx_groups


@pytest.mark.parametrize(("groups", "per_group", "want"),
                         [(8, 8, 2), (26, 8, 2), (13, 8, 1), (32, 4, 1), (6, 12, 2), (4, 16, 1), (4, 32, 1),
                          (16, 1, 1), (1, 8, 1)],
                         ids=["8x8", "26x8", "13x8: odd", "32x4: would need 4", "6x12", "wide already", "32 a group",
                              "depthwise", "one group"])
def test_factor_merges_pairs_only_where_they_reach_a_wide_group(groups, per_group, want):
    assert amx_groups.factor(groups, per_group) == want


def test_merged_weights_are_block_diagonal_and_refill_in_place():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((12, 2, 3, 3)).astype(np.float32)  # 6 groups of 2 outputs, 2 inputs each
    m = amx_groups.merged_weights(w, 6, 2)
    assert m.shape == (12, 4, 3, 3)
    for g in range(6):
        a = g % 2
        rows = slice(g * 2, g * 2 + 2)
        np.testing.assert_array_equal(m[rows, a * 2:a * 2 + 2], w[rows])
        np.testing.assert_array_equal(m[rows, (1 - a) * 2:(1 - a) * 2 + 2], 0.0)
    dest = np.full_like(m, 7.0)
    assert amx_groups.merged_weights(w * 2, 6, 2, dest) is dest
    np.testing.assert_array_equal(dest, 2 * m)
    with pytest.raises(ValueError, match="cannot merge 6 groups"):
        amx_groups.merged_weights(w, 6, 4)


def _conv(w: np.ndarray, groups: int) -> Graph:
    g = Graph("grouped")
    g.set_outputs([g.conv2d(g.input("x", (2, 16, 9, 9)), g.param("w", w), padding=1, groups=groups)])
    return g


def test_a_convolution_with_merged_groups_computes_the_same_one():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 4, 3, 3)).astype(np.float32)  # 4 groups of 4
    x = {"x": rng.standard_normal((2, 16, 9, 9)).astype(np.float32)}
    want = rlx.compile(_conv(w, 4), device="cpu").run(x)[0]
    got = rlx.compile(_conv(amx_groups.merged_weights(w, 4, 2), 2), device="cpu").run(x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_held_values_expect_merged_groups_on_amx(monkeypatch):
    from rlx_cpu import held, verdicts

    monkeypatch.setattr(verdicts, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16", "amx_tile"}))
    g = Graph("plan")
    x = g.input("x", (1, 64, 8, 8))
    rng = np.random.default_rng(2)
    pairs = g.conv2d(x, g.param("w8", rng.standard_normal((64, 8, 3, 3)).astype(np.float32)), padding=1, groups=8)
    odd = g.conv2d(g.input("y", (1, 24, 8, 8)), g.param("w3", rng.standard_normal((24, 8, 3, 3)).astype(np.float32)),
                   padding=1, groups=3)
    g.set_outputs([pairs, odd])
    assert held.tiled(g.node(pairs.id), g) and not held.tiled(g.node(odd.id), g)
    monkeypatch.setattr(verdicts, "cpu_flags", lambda: frozenset({"avx512_bf16"}))  # no AMX: nothing merged, and
    assert held.tiled(g.node(pairs.id), g) and held.tiled(g.node(odd.id), g)  # every grouped one takes bf16 as it is
