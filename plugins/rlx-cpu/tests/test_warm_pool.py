"""The warm pool: a dead plan's buffers serve the next plans (a new shape class faults in
no fresh memory), bounded, never handed out while a plan that holds them lives."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core.errors import ConfigError
from rlx_cpu import settings
from rlx_cpu.warm_pool import MIN_BYTES, WarmPool, warm_pool


def _raw(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, np.uint8)


def test_take_gives_the_smallest_fit_within_twice_the_need_and_the_limit_drops_the_oldest() -> None:
    pool = WarmPool(4 * MIN_BYTES)
    a, b, c = _raw(MIN_BYTES), _raw(2 * MIN_BYTES), _raw(3 * MIN_BYTES)
    pool.give([c, b, a, _raw(MIN_BYTES // 2)])  # the small one goes back to the allocator
    assert pool.held_bytes == 3 * MIN_BYTES  # c (the oldest) was dropped to stay within the limit
    assert pool.take(4 * MIN_BYTES) is None  # nothing that large
    assert pool.take(MIN_BYTES // 2) is None  # small needs come from the allocator
    assert pool.take(MIN_BYTES + 1) is b  # a is too small; b is within twice the need
    assert pool.take(MIN_BYTES) is a and pool.held_bytes == 0
    assert (pool.hits, pool.misses) == (2, 1)


def test_a_limit_of_zero_keeps_nothing() -> None:
    pool = WarmPool(0)
    pool.give([_raw(MIN_BYTES)])
    assert pool.take(MIN_BYTES) is None and pool.held_bytes == 0


@pytest.mark.parametrize("text,want", [("0", 0), (" 64 ", 64)])
def test_the_limit_is_read_from_rlx_cpu_pool_mb(text: str, want: int) -> None:
    assert settings.POOL_MB.read({"RLX_CPU_POOL_MB": text}) == want
    assert settings.POOL_MB.read({}) == 256


@pytest.mark.parametrize("text", ["-1", "lots", "1.5"])
def test_a_bad_limit_is_a_config_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigError, match=r"RLX_CPU_POOL_MB: .* whole number of megabytes"):
        settings.POOL_MB.read({"RLX_CPU_POOL_MB": text})


def test_a_dropped_shape_class_hands_its_buffers_to_the_next_and_results_stay_right(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two shape classes of a symbolic graph, the first dropped (an LRU of one): the second
    class's plan takes the first's buffers, and every result matches the reference. Each
    class compiled on its own (``RLX_CPU_ANY_SIZE=0``): else whether one executable runs
    every size follows this process's timed GEMM verdict (rlx's GEMM: one executable, no
    class dropped), and the test with it."""
    monkeypatch.setenv("RLX_CPU_ANY_SIZE", "0")
    g = rlx.Graph("pooled")
    x = g.input("x", ("n", 256), "float32")
    w = g.param("w", np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32))
    g.set_outputs([g.relu(g.matmul(g.tanh(g.matmul(x, w)), w))])
    pool = warm_pool()
    cg = rlx.compile(g, device="cpu")
    cg._max_shapes = 1
    rng = np.random.default_rng(1)
    hits = pool.hits
    for n in (512, 500, 511, 512):
        feeds = {"x": rng.standard_normal((n, 256)).astype(np.float32)}
        np.testing.assert_allclose(cg.run(feeds)[0], rlx.reference.evaluate(g, feeds)[0], rtol=2e-4, atol=2e-4)
        gc.collect()
    assert pool.hits > hits
