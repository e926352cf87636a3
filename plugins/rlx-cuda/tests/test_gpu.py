"""On a GPU: the conformance kit, whole models against the reference, set_param,
concurrent runs, DLPack, CUDA graphs and bad data. Every test skips with the probe's
reason on a host without a working GPU (the ``gpu_backend`` fixture)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import rlx_core
from rlx_core.compiler.inputs import random_inputs
from rlx_core.errors import InputError
from rlx_core.reference import evaluate
from rlx_core.testing import check_backend
from rlx_core.testing._compare import mismatch

pytestmark = pytest.mark.gpu


def _mlp() -> rlx_core.Graph:
    rng = np.random.default_rng(0)
    g = rlx_core.Graph("mlp")
    x = g.input("x", (64, 256))
    w1 = g.param("w1", rng.standard_normal((256, 128), dtype=np.float32) / 16)
    h = g.gelu(g.add(g.matmul(x, w1), g.constant(rng.standard_normal(128, dtype=np.float32))))
    w2 = g.param("w2", rng.standard_normal((128, 10), dtype=np.float32) / 11)
    g.set_outputs([g.softmax(g.matmul(h, w2), axis=-1)])
    return g


def _cnn() -> rlx_core.Graph:
    rng = np.random.default_rng(1)
    g = rlx_core.Graph("cnn")
    x = g.input("x", (4, 3, 32, 32))
    w = g.param("w", rng.standard_normal((16, 3, 3, 3), dtype=np.float32) / 5)
    b = g.param("b", rng.standard_normal(16, dtype=np.float32))
    y = g.relu(g.conv2d(x, w, b, stride=1, padding=1))
    y = g.max_pool2d(y, kernel=2)
    w2 = g.param("w2", rng.standard_normal((32, 4, 3, 3), dtype=np.float32) / 6)
    y = g.avg_pool2d(g.relu(g.conv2d(y, w2, stride=2, padding=1, groups=4)), kernel=3, stride=2, padding=1)
    g.set_outputs([g.reshape(g.global_avg_pool2d(y), (4, 32))])
    return g


def _attention() -> rlx_core.Graph:
    rng = np.random.default_rng(2)
    g = rlx_core.Graph("attention")
    x = g.input("x", (2, 16, 64))
    ids = g.input("ids", (2, 16), "int64")
    emb = g.param("emb", rng.standard_normal((100, 64), dtype=np.float32))
    x = g.add(x, g.gather(emb, ids, axis=0))
    x = g.layer_norm(x, g.param("s", np.ones(64, np.float32)), g.param("bias", np.zeros(64, np.float32)))
    heads = [g.reshape(g.matmul(x, g.param(f"w{n}", rng.standard_normal((64, 64), dtype=np.float32) / 8)),
                       (2, 16, 4, 16)) for n in "qkv"]
    q, k, v = (g.transpose(h, (0, 2, 1, 3)) for h in heads)
    mask = g.constant(np.tril(np.ones((16, 16), bool)))
    y = g.transpose(g.attention(q, k, v, mask=mask), (0, 2, 1, 3))
    g.set_outputs([g.reduce_mean(g.reshape(y, (2, 16, 64)), axes=(1,))])
    return g


def _inputs(g: rlx_core.Graph) -> dict[str, np.ndarray]:
    inputs = random_inputs(g, seed=3)
    if "ids" in inputs:
        inputs["ids"] = np.random.default_rng(4).integers(0, 100, inputs["ids"].shape)
    return inputs


def _same(g: rlx_core.Graph, got: list[np.ndarray], inputs: dict[str, np.ndarray], terms: int = 256) -> None:
    for out, ref in zip(got, evaluate(g, inputs)):
        why = mismatch(out.dtype.name, out, ref, terms=terms)
        assert why is None, why


def test_conformance_kit(gpu_backend):
    report = check_backend(gpu_backend)
    assert not report.failed, "\n".join(str(r) for r in report.failed)


@pytest.mark.parametrize("build", [_mlp, _cnn, _attention])
@pytest.mark.parametrize("graphs", [False, True])
def test_models_match_the_reference(gpu_backend, build, graphs):
    g = build()
    cg = rlx_core.compile(g, device="cuda", options=rlx_core.CompileOptions(extra={"cuda_graphs": graphs}))
    inputs = _inputs(g)
    for _ in range(3):  # eager, capture, replay
        _same(g, cg.run(inputs), inputs)
    assert cg._exe.uses_cuda_graph == graphs, cg.report().notes  # captured at compile, said in the report
    assert any(("CUDA graph captured" if graphs else "CUDA graphs off") in n for n in cg.report().notes)


def test_symbolic_sizes_run_by_buckets(gpu_backend):
    """A new length inside a bucket captures nothing: one program (and CUDA graph) per bucket."""
    rng = np.random.default_rng(5)
    g = rlx_core.Graph("sym")
    x = g.input("x", ("batch", "seq", 32))
    h = g.gelu(g.matmul(x, g.param("w", rng.standard_normal((32, 32), dtype=np.float32) * 0.2)))
    probs = g.softmax(g.matmul(h, g.transpose(h, (0, 2, 1))), -1)
    g.set_outputs([g.reduce_mean(g.matmul(probs, h), axes=(1,))])
    cg = rlx_core.compile(g, device="cuda")
    for batch, seq in ((2, 5), (2, 7), (1, 6), (2, 8)):
        inputs = {"x": rng.standard_normal((batch, seq, 32), dtype=np.float32)}
        _same(g, cg.run(inputs), inputs)
    assert [n.split(":")[0] for n in cg.report().notes if n.startswith("bucket ")] == [
        "bucket batch=2, seq=8", "bucket batch=1, seq=8"]


def test_set_param_and_concurrent_runs(gpu_backend):
    g = _mlp()
    cg = rlx_core.compile(g, device="cuda")
    inputs = _inputs(g)
    cg.run(inputs)
    cg.run(inputs)  # a captured graph must see the new weights too
    new = np.random.default_rng(9).standard_normal((256, 128), dtype=np.float32)
    cg.set_param("w1", new)
    got = cg.run(inputs)
    ref = evaluate(g, inputs, params={"w1": new})
    assert mismatch("float32", got[0], ref[0], terms=256) is None
    results: list = [None] * 8

    def worker(i: int) -> None:
        x = {"x": np.full((64, 256), i / 8, np.float32)}
        results[i] = (x, cg.run(x))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, out in results:
        assert mismatch("float32", out[0], evaluate(g, x, params={"w1": new})[0], terms=256) is None


def test_values_of_params_are_computed_once_and_follow_set_param(gpu_backend):
    rng = np.random.default_rng(5)
    g = rlx_core.Graph("transposed_weight")
    x = g.input("x", (8, 16))
    w = g.param("w", rng.standard_normal((4, 16), dtype=np.float32))  # nn.Linear's (out, in) layout
    g.set_outputs([g.relu(g.matmul(x, g.transpose(w, (1, 0))))])
    cg = rlx_core.compile(g, device="cuda")
    assert any("params only" in n for n in cg.report().notes), cg.report().notes
    assert cg._exe.uses_cuda_graph, cg.report().notes
    inputs = _inputs(g)
    _same(g, cg.run(inputs), inputs)
    new = rng.standard_normal((4, 16), dtype=np.float32)
    cg.set_param("w", new)
    got = cg.run(inputs)
    assert mismatch("float32", got[0], evaluate(g, inputs, params={"w": new})[0], terms=16) is None


def test_dlpack_out_and_device_inputs(gpu_backend):
    import cupy

    g = _mlp()
    cg = rlx_core.compile(g, device="cuda", options=rlx_core.CompileOptions(extra={"cuda_graphs": False}))
    inputs = _inputs(g)
    (out,) = cg.run(inputs, output="dlpack")
    assert isinstance(out, cupy.ndarray)
    _same(g, [cupy.asnumpy(out)], inputs)
    (dev_out,) = cg._exe.run_dlpack({"x": cupy.asarray(inputs["x"])})  # a device input, bound without a copy
    _same(g, [cupy.asnumpy(dev_out)], inputs)
    with pytest.raises(InputError, match="expected"):
        cg._exe.run({"x": cupy.zeros((64, 255), np.float32)})


def test_bad_data_raises_input_error(gpu_backend):
    g = rlx_core.Graph("div")
    a, b = g.input("a", (4,), "int32"), g.input("b", (4,), "int32")
    g.set_outputs([g.div(a, b)])
    cg = rlx_core.compile(g, device="cuda")
    ok = {"a": np.array([7, -7, 7, -7], np.int32), "b": np.array([2, 2, -2, -2], np.int32)}
    assert cg.run(ok)[0].tolist() == [3, -3, -3, 3]
    with pytest.raises(InputError, match="integer division by zero"):
        cg.run({"a": ok["a"], "b": np.array([1, 0, 1, 1], np.int32)})


def test_tf32_is_opt_in_and_reported(gpu_backend):
    g = _mlp()
    plain = rlx_core.compile(g, device="cuda")
    assert not any("TF32" in n for n in plain.report().notes)
    tf32 = rlx_core.compile(g, device="cuda", options=rlx_core.CompileOptions(extra={"tf32": True}))
    assert any("TF32" in n for n in tf32.report().notes)
    inputs = _inputs(g)
    np.testing.assert_allclose(tf32.run(inputs)[0], plain.run(inputs)[0], rtol=2e-2, atol=2e-3)
