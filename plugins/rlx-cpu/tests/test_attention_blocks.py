"""Attention over long sequences a block of heads and rows at a time
(``attention_kernels._attention_blocks``): equal to the reference with and without masks of
every shape a model passes, across partial blocks, and left to whole scores where the
operands do not allow blocks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_cpu import attention_kernels, native

RNG = np.random.default_rng(21)


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch, native_lib: native.Native) -> list[Any]:
    """Blocks past any size of scores, of 32 rows of 40 keys (5 KB): every test shape
    splits into several blocks of heads and rows, the last ones partial. The calls of
    ``_attention_blocks`` that built steps are recorded."""
    monkeypatch.setattr(attention_kernels, "ATTENTION_BLOCKED_BYTES", 0)
    monkeypatch.setattr(attention_kernels, "ATTENTION_BLOCK_BYTES", 2 * 32 * 40 * 4)
    built: list[Any] = []
    real = attention_kernels._attention_blocks
    monkeypatch.setattr(attention_kernels, "_attention_blocks",
                        lambda *a: (lambda r: (built.append(r is not None), r)[1])(real(*a)))
    return built


def attention_graph(heads: int, lq: int, lk: int, mask: str) -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    g = rlx.Graph("attention")
    q = g.input("q", (2, heads, lq, 16))
    k = g.input("k", (2, heads, lk, 16))
    v = g.input("v", (2, heads, lk, 8))
    feeds = {"q": RNG.standard_normal((2, heads, lq, 16)).astype(np.float32),
             "k": RNG.standard_normal((2, heads, lk, 16)).astype(np.float32),
             "v": RNG.standard_normal((2, heads, lk, 8)).astype(np.float32)}
    m = None
    if mask == "causal":  # (Lq, Lk): one row each
        m = g.constant(np.triu(np.full((lq, lk), -1e9, np.float32), 1))
    elif mask == "padding":  # (1, 1, 1, Lk): the same row for all
        pad = np.zeros((1, 1, 1, lk), np.float32)
        pad[..., -3:] = -1e9
        m = g.constant(pad)
    elif mask == "bool":
        m = g.constant(RNG.random((lq, lk)) < 0.8)
    elif mask == "per image":  # (2, 1, Lq, Lk): differs between images, so no blocks
        m = g.constant(RNG.standard_normal((2, 1, lq, lk)).astype(np.float32))
    # relu keeps q, k, v plan arrays (a caller's array is not one contiguous plan array)
    g.set_outputs([g.attention(g.relu(q), g.relu(k), g.relu(v), m, scale=0.25)])
    return g, feeds


@pytest.mark.parametrize("mask", ["none", "causal", "padding", "bool"])
@pytest.mark.parametrize(("heads", "lq", "lk"), [(3, 70, 40), (1, 32, 40), (5, 33, 40)])
def test_blocks_of_heads_and_rows_equal_the_reference(small_blocks: list[Any], mask: str, heads: int, lq: int,
                                                      lk: int) -> None:
    g, feeds = attention_graph(heads, lq, lk, mask)
    cg = rlx.compile(g, device="cpu")
    want = reference.evaluate(g, {k: v.astype(np.float64) for k, v in feeds.items()})[0]
    np.testing.assert_allclose(cg.run(feeds)[0], want, rtol=2e-5, atol=2e-5)
    assert small_blocks and all(small_blocks)


def test_a_mask_that_differs_between_heads_keeps_whole_scores(small_blocks: list[Any]) -> None:
    g, feeds = attention_graph(3, 40, 40, "per image")
    cg = rlx.compile(g, device="cpu")
    want = reference.evaluate(g, {k: v.astype(np.float64) for k, v in feeds.items()})[0]
    np.testing.assert_allclose(cg.run(feeds)[0], want, rtol=2e-5, atol=2e-5)
    assert small_blocks and not any(small_blocks)


@pytest.mark.parametrize("symbolic", [False, True])
def test_heads_only_v_has_broadcast_in_the_second_product(native_lib: native.Native, symbolic: bool) -> None:
    """Batch dims only v has: the scores are computed once over q's and k's (and the
    mask's) and broadcast in the product with v. Writing scores over v's batch dims, which
    the first product's operands lack, filled the first of them only (found by the
    conformance kit: q (1, 1, 1, 1), k (2, 1), v (2, 1, 2, 1)). ``symbolic``: q's length
    is a symbol (the executable for every size, after the first class)."""
    for qs, ks, vs, ms in [((1, 1, 1, 1), (2, 1), (2, 1, 2, 1), None), ((1, 4, 8), (5, 8), (3, 2, 5, 6), None),
                           ((1, 4, 8), (5, 8), (3, 2, 5, 6), (2, 1, 5))]:
        g = rlx.Graph("broadcast")
        q = g.input("q", (*qs[:-2], "lq" if symbolic else qs[-2], qs[-1]))
        k, v = g.input("k", ks), g.input("v", vs)
        m = None if ms is None else g.input("m", ms)
        g.set_outputs([g.attention(q, k, v, m, scale=0.5)])
        cg = rlx.compile(g, device="cpu")
        for lq in (qs[-2], 3, 6, 7, 9) if symbolic else (qs[-2],):
            f = {n: RNG.standard_normal(s).astype(np.float32)
                 for n, s in (("q", (*qs[:-2], lq, qs[-1])), ("k", ks), ("v", vs))}
            if ms is not None:
                f["m"] = RNG.standard_normal(ms).astype(np.float32)
            np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask", ["bool", "float"])
@pytest.mark.parametrize("blocks", [False, True])
def test_rows_masked_everywhere_give_zeros_with_nan_to_zero(monkeypatch: pytest.MonkeyPatch,
                                                            native_lib: native.Native, mask: str, blocks: bool) -> None:
    """``nan_to_zero`` on the native softmax (whole scores and blocks) and numpy's: a query
    row masked everywhere gives zeros; without it, NaN (the reference's softmax)."""
    if blocks:
        monkeypatch.setattr(attention_kernels, "ATTENTION_BLOCKED_BYTES", 0)
        monkeypatch.setattr(attention_kernels, "ATTENTION_BLOCK_BYTES", 2 * 32 * 40 * 4)
    lq, lk = 40, 40
    m = RNG.random((lq, lk)) < 0.7 if mask == "bool" else np.where(RNG.random((lq, lk)) < 0.7, 0, -np.inf)
    m[3] = False if mask == "bool" else -np.inf
    for guard in (True, False):
        g = rlx.Graph("guard")
        q, k, v = (g.input(n, (2, 3, lq if n == "q" else lk, 16)) for n in "qkv")
        mk = g.constant(m.astype(np.float32) if mask == "float" else m)
        g.set_outputs([g.attention(g.relu(q), g.relu(k), g.relu(v), mk, scale=0.25, nan_to_zero=guard)])
        f = {n: RNG.standard_normal((2, 3, lq if n == "q" else lk, 16)).astype(np.float32) for n in "qkv"}
        got, want = rlx.compile(g, device="cpu").run(f)[0], reference.evaluate(g, f)[0]
        assert np.all(np.isnan(want[:, :, 3])) is not guard and (not guard or np.all(got[:, :, 3] == 0))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
