"""Graphs on the real OpenCL device against the reference: a small MLP and CNN, the
vectorized and fused paths, set_param, concurrent runs, run-time checks, the memory plan."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import rlx_core
from rlx_core import reference
from rlx_core.errors import InputError
from rlx_core.plugin import CompileOptions
from rlx_opencl import runtime as rt

pytest.importorskip("pyopencl", reason="pyopencl is not installed")


def _compile(backend, g):
    return backend.compile(g.freeze(), CompileOptions(device="opencl"))


def _check(backend, g, inputs, rtol=1e-4, atol=1e-4):
    exe = _compile(backend, g)
    got = exe.run(inputs)
    want = reference.evaluate(g, inputs)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.astype(np.float64), b, rtol=rtol, atol=atol)
    return exe


def _rng():
    return np.random.default_rng(0)


def test_mlp(backend):
    rng = _rng()
    g = rlx_core.Graph("mlp")
    x = g.input("x", (24, 64))
    w1 = g.param("w1", rng.standard_normal((64, 48), dtype=np.float32) * 0.2)
    b1 = g.param("b1", rng.standard_normal(48, dtype=np.float32))
    h = g.gelu(g.add(g.matmul(x, w1), b1))
    h = g.layer_norm(h, g.param("s", np.ones(48, np.float32)), g.param("t", np.zeros(48, np.float32)))
    w2 = g.param("w2", rng.standard_normal((48, 10), dtype=np.float32) * 0.2)
    g.set_outputs([g.softmax(g.matmul(h, w2), axis=-1), h])
    exe = _check(backend, g, {"x": rng.standard_normal((24, 64), dtype=np.float32)})
    fused = sum(len(s.fused) for s in exe.plan.steps)
    assert fused >= 1  # the bias add is computed inside gelu's kernel


def test_cnn(backend):
    rng = _rng()
    g = rlx_core.Graph("cnn")
    x = g.input("x", (2, 3, 12, 12))
    c1 = g.conv2d(x, g.param("w1", rng.standard_normal((8, 3, 3, 3), dtype=np.float32) * 0.3),
                  g.param("b1", rng.standard_normal(8, dtype=np.float32)), padding=1)
    p1 = g.max_pool2d(g.relu(c1), 2)
    c2 = g.conv2d(p1, g.param("w2", rng.standard_normal((8, 4, 3, 3), dtype=np.float32) * 0.3), stride=2,
                  groups=2, padding=1)
    c3 = g.conv2d(c2, g.param("w3", rng.standard_normal((6, 8, 1, 1), dtype=np.float32) * 0.3))  # 1x1: no im2col
    a = g.avg_pool2d(g.relu(c3), 3, stride=1, padding=1, count_include_pad=False)
    pooled = g.reshape(g.global_avg_pool2d(a), (2, 6))
    logits = g.matmul(pooled, g.param("fc", rng.standard_normal((6, 5), dtype=np.float32)))
    g.set_outputs([logits])
    exe = _check(backend, g, {"x": rng.standard_normal((2, 3, 12, 12), dtype=np.float32)})
    assert len(exe.plan.slots) < len(exe.plan.steps)  # intermediates share memory


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_matmul_forms(backend, dtype):
    """Vector blocks plus column/row tails, broadcast batches, and the fused NT form."""
    rng = _rng()
    g = rlx_core.Graph(f"mm_{dtype}")
    a = g.input("a", (3, 13, 20), dtype)
    b = g.input("b", (20, 40), dtype)
    bt = g.input("bt", (3, 37, 20), dtype)
    nt = g.matmul(a, g.transpose(bt, (0, 2, 1)))
    g.set_outputs([g.matmul(a, b), nt])
    ins = {"a": rng.standard_normal((3, 13, 20)).astype(dtype), "b": rng.standard_normal((20, 40)).astype(dtype),
           "bt": rng.standard_normal((3, 37, 20)).astype(dtype)}
    tol = 3e-2 if dtype == "float16" else 1e-4
    exe = _check(backend, g, ins, rtol=tol, atol=tol)
    assert not any(s.node.op == "transpose" for s in exe.plan.steps)  # folded into the matmul


def test_vectorized_elementwise_with_broadcast_and_tail(backend):
    rng = _rng()
    g = rlx_core.Graph("ew")
    x = g.input("x", (6, 48))
    row = g.input("row", (48,))
    col = g.input("col", (6, 1))
    y = g.tanh(g.mul(g.add(x, row), col))
    z = g.sigmoid(g.input("z", (5, 7)))  # 35 elements: vectors of 16 (or 8) and a scalar tail
    g.set_outputs([y, z, g.exp(g.cast(g.input("h", (40,), "float16"), "float32"))])
    ins = {"x": rng.standard_normal((6, 48), dtype=np.float32), "row": rng.standard_normal(48, dtype=np.float32),
           "col": rng.standard_normal((6, 1), dtype=np.float32), "z": rng.standard_normal((5, 7), dtype=np.float32),
           "h": rng.standard_normal(40).astype(np.float16)}
    exe = _check(backend, g, ins)
    lanes = 16 if exe.runtime.vector_bits >= 512 else 8  # 256 bits where the device cannot take 512
    assert f"float{lanes}" in exe.source and f"vload{lanes}" in exe.source


def test_runtime_checks_raise_input_error(backend):
    g = rlx_core.Graph("checks")
    a = g.input("a", (4,), "int32")
    b = g.input("b", (4,), "int32")
    g.set_outputs([g.div(a, b)])
    exe = _compile(backend, g)
    ok = exe.run({"a": np.array([7, -7, 9, -9], np.int32), "b": np.array([2, 2, -4, -4], np.int32)})[0]
    np.testing.assert_array_equal(ok, [3, -3, -2, 2])  # truncation toward zero
    with pytest.raises(InputError, match=r"\(div\): integer division by zero"):
        exe.run({"a": np.ones(4, np.int32), "b": np.array([1, 0, 1, 1], np.int32)})

    g = rlx_core.Graph("gather")
    x = g.input("x", (5, 3))
    i = g.input("i", (2,), "int64")
    g.set_outputs([g.gather(x, i, axis=0)])
    exe = _compile(backend, g)
    x_np = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(exe.run({"x": x_np, "i": np.array([-1, 2])})[0], x_np[[4, 2]])
    with pytest.raises(InputError, match=r"index 7 is out of range for axis 0 of size 5"):
        exe.run({"x": x_np, "i": np.array([0, 7])})


def test_set_param(backend):
    rng = _rng()
    g = rlx_core.Graph("sp")
    x = g.input("x", (4, 8))
    g.set_outputs([g.relu(g.matmul(x, g.param("w", rng.standard_normal((8, 16), dtype=np.float32))))])
    exe = _compile(backend, g)
    x_np = rng.standard_normal((4, 8), dtype=np.float32)
    new = rng.standard_normal((8, 16), dtype=np.float32)
    exe.set_param("w", new)
    want = reference.evaluate(g, {"x": x_np}, params={"w": new})[0]
    np.testing.assert_allclose(exe.run({"x": x_np})[0], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match=r"param 'w': expected \(8, 16\) float32, got \(8, 15\) float32"):
        exe.set_param("w", new[:, :15])
    with pytest.raises(InputError, match="'x' is an input of graph 'sp', not a param"):
        exe.set_param("x", x_np)


def test_concurrent_runs(backend):
    g = rlx_core.Graph("conc")
    x = g.input("x", (32, 32))
    g.set_outputs([g.reduce_sum(g.exp(g.matmul(x, x)), axes=1)])
    exe = _compile(backend, g)
    errors: list[str] = []

    def worker(k: int) -> None:
        x_np = np.full((32, 32), 0.01 * k, np.float32)
        want = reference.evaluate(g, {"x": x_np})[0]
        for _ in range(10):
            got = exe.run({"x": x_np})[0]
            if not np.allclose(got, want, rtol=1e-4):
                errors.append(f"thread {k}: {got[:3]} != {want[:3]}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_programs_are_built_once_per_source(backend, monkeypatch):
    g = rlx_core.Graph("twice")
    x = g.input("x", (8,))
    g.set_outputs([g.neg(x)])
    g.freeze()
    runtime = backend.runtime()
    builds = []
    real = rt.DeviceRuntime.build
    monkeypatch.setattr(rt.DeviceRuntime, "build", lambda self, src: builds.append(src) or real(self, src))
    for _ in range(2):
        backend.compile(g, CompileOptions(device="opencl"))
    assert len(builds) <= 1 and runtime is backend.runtime()
