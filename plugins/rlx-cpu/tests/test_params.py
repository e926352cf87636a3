"""Params borrowed from the graph at compile, owned at the first ``set_param`` (``rlx_cpu/params.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir import Graph
from rlx_core.ir.ops import OpKind
from rlx_cpu import params


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _mlp(batch: int | str = 8) -> Graph:
    g = Graph("mlp")
    x = g.input("x", (batch, 32))
    h = g.relu(g.add(g.matmul(x, g.param("w1", rand((32, 64), 1))), g.param("b1", rand((64,), 2))))
    g.set_outputs([g.add(g.matmul(h, g.param("w2", rand((64, 16), 3))), g.param("b2", rand((16,), 4)))])
    return g


def _values(g: Graph) -> dict[str, np.ndarray]:
    return {n.name: g.value(n.id) for n in g.nodes if n.op is OpKind.PARAM}


def test_a_compile_reads_the_graphs_own_weights_without_copying_them() -> None:
    g = _mlp()
    cg = rlx.compile(g, device="cpu")
    values = _values(g)
    held = cg._exe._params
    assert set(held) == set(values)
    for name, value in values.items():
        assert held[name] is value and params.borrowed(held[name])
    x = rand((8, 32), 5)
    np.testing.assert_allclose(cg.run({"x": x})[0], reference.evaluate(g, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_value_the_kernels_cannot_read_as_it_is_is_copied() -> None:
    """A misaligned value (read from an immutable ``bytes`` one float in, as an ONNX
    tensor's raw data may lie) is copied, aligned and writable."""
    g = Graph("odd")
    x = g.input("x", (4, 8))
    raw = bytes(4) + rand((64,), 1).tobytes()
    w = g.param("w", np.frombuffer(raw, np.float32, offset=4).reshape(8, 8))
    g.set_outputs([g.matmul(x, w)])
    value = g.value(w.id)
    if value.ctypes.data % 16 == 0:
        pytest.skip("the graph copied the view into an aligned array of its own")
    held = rlx.compile(g, device="cpu")._exe._params["w"]
    assert held is not value and not params.borrowed(held) and held.ctypes.data % 16 == 0
    np.testing.assert_array_equal(held, value)


def test_the_first_set_param_owns_every_param_and_leaves_the_graph_alone() -> None:
    g = _mlp()
    before = {k: v.copy() for k, v in _values(g).items()}
    cg = rlx.compile(g, device="cpu")
    other = rlx.compile(g, device="cpu")  # a second compile of the same graph: its weights must not move
    x = rand((8, 32), 5)
    w2 = rand((64, 16), 9)
    cg.set_param("w2", w2)
    held = cg._exe._params
    assert not any(params.borrowed(a) for a in held.values())  # all owned at once: one re-binding
    assert not any(np.shares_memory(held[k], v) for k, v in _values(g).items())
    for k, v in _values(g).items():
        np.testing.assert_array_equal(v, before[k])
    want = reference.evaluate(g, {"x": x})[0]
    h = np.maximum(x @ before["w1"] + before["b1"], 0)
    np.testing.assert_allclose(cg.run({"x": x})[0], h @ w2 + before["b2"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(other.run({"x": x})[0], want, rtol=1e-4, atol=1e-4)
    # owned now: later set_params refill in place, no re-binding
    exe = cg._exe
    kept = exe._params["w1"]
    cg.set_param("w1", before["w1"] * 2)
    assert exe._params["w1"] is kept
    np.testing.assert_allclose(cg.run({"x": x})[0], np.maximum(x @ (2 * before["w1"]) + before["b1"], 0) @ w2
                               + before["b2"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("any_size", ["1", "0"])
def test_shape_classes_own_one_copy_and_a_later_class_starts_on_it(any_size: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A symbolic graph: its classes borrow the same weights; the first set_param owns
    them once for the whole family, and a class compiled after it starts on the owned
    copies (the new value, no copy of its own)."""
    monkeypatch.setenv("RLX_CPU_ANY_SIZE", any_size)
    g = _mlp("batch")
    cg = rlx.compile(g, device="cpu")
    feeds = [{"x": rand((n, 32), 10 + n)} for n in (2, 5, 7)]
    for f in feeds[:2]:
        for _ in range(2):
            cg.run(f)
    w1 = rand((32, 64), 11)
    cg.set_param("w1", w1)
    values = _values(g)
    for f in feeds:  # the third class compiled now, after the set_param
        x = f["x"]
        want = np.maximum(x @ w1 + values["b1"], 0) @ values["w2"] + values["b2"]
        np.testing.assert_allclose(cg.run(f)[0], want, rtol=1e-4, atol=1e-4)
    copies = [c._exe._params["w1"] for c in cg._classes.values() if hasattr(c, "_exe")]
    assert copies and all(c is copies[0] for c in copies) and not params.borrowed(copies[0])
    np.testing.assert_array_equal(values["w1"], rand((32, 64), 1))  # the graph's own value untouched


def test_the_family_lets_go_of_weights_derived_from_borrowed_arrays() -> None:
    from rlx_core.plugin import ShapeFamily

    family = ShapeFamily()
    g = Graph("p")
    w = g.param("w", rand((4, 4), 1))
    node = g.node(w.id)
    with family.compiling():
        held = params.param_array(node, g.value(w.id))
    assert held is g.value(w.id)
    family.shared[("rlx_cpu.derived", ("k",))] = [held, None, held.T.copy(), frozenset({"w"})]
    family.shared[("rlx_cpu.derived", ("c",))] = [held, None, held.copy(), frozenset()]  # from constants only
    owned = params.own_params({"w": held}, family)
    assert not params.borrowed(owned["w"]) and ("rlx_cpu.derived", ("k",)) not in family.shared
    assert ("rlx_cpu.derived", ("c",)) in family.shared
    with family.compiling():  # a compile after it starts on the owned copy
        assert params.param_array(node, g.value(w.id)) is owned["w"]
    assert params.own_params({"w": held}, family)["w"] is owned["w"]  # the family's one copy


def test_a_plan_of_the_borrowed_weights_given_back_after_set_param_is_dropped() -> None:
    """A run in another thread holds a plan bound over the borrowed weights while
    ``set_param`` owns them: given back after, that plan is not pooled again (it reads
    the old arrays); the next run reads the new weight."""
    g = _mlp()
    cg = rlx.compile(g, device="cpu")
    exe = cg._exe
    x = rand((8, 32), 5)
    held = exe._pool.pop()  # the other thread's run, in flight
    w2 = rand((64, 16), 9)
    cg.set_param("w2", w2)
    exe = cg._exe
    exe._run_plan(held, held, {"x": x})  # that run ends
    assert all(p is not held for p in exe._pool)
    values = _values(g)
    want = np.maximum(x @ values["w1"] + values["b1"], 0) @ w2 + values["b2"]
    np.testing.assert_allclose(cg.run({"x": x})[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("symbolic", [False, True])
def test_folding_a_constant_subgraph_with_ieee_results_warns_nothing(symbolic: bool) -> None:
    """T5's relative-position buckets take log(0) and cast the -inf before a where drops
    it: folded at compile (and again by set_param), that is the graph's arithmetic, not a
    RuntimeWarning for the user; the answer is the reference's."""
    import warnings

    g = Graph("buckets")
    x = g.input("x", ("n", 3) if symbolic else (2, 3))
    d = g.param("d", np.array([0.0, 1.0, 4.0], np.float32))
    bucket = g.cast(g.log(d), "int32")  # log(0) = -inf, cast: numpy warns where unmasked
    safe = g.where(g.greater(d, 0.0), g.cast(bucket, "float32"), 0.0)
    g.set_outputs([g.add(x, safe)])
    feeds = {"x": np.ones((2, 3), np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        cg = rlx.compile(g, device="cpu")
        np.testing.assert_array_equal(cg.run(feeds)[0], reference.evaluate(g, feeds)[0])
        cg.set_param("d", np.array([1.0, 0.0, 8.0], np.float32))
        np.testing.assert_array_equal(cg.run(feeds)[0], [[1.0, 1.0, 3.0]] * 2)
