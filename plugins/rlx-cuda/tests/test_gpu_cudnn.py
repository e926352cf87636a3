"""On a GPU: convolutions on cuDNN against the float64 reference, every way they run
(plain, bias, fused bias + relu, a residual, groups, depthwise, strides, dilations,
float64, asymmetric padding on im2col), captured in a CUDA graph, and the report line
saying which way each ran. Skips without a working GPU, or without cuDNN (the reason)."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core
from rlx_core.compiler.inputs import random_inputs
from rlx_core.reference import evaluate
from rlx_core.testing._compare import mismatch

pytestmark = pytest.mark.gpu

CASES = {
    # name: (x shape, w shape, attrs, bias, epilogue)
    "3x3 + bias + relu": ((4, 16, 14, 14), (32, 16, 3, 3), {"padding": 1}, True, "relu"),
    "1x1 plain": ((8, 32, 7, 7), (64, 32, 1, 1), {}, False, None),
    "stride 2 + bias": ((2, 8, 15, 15), (16, 8, 3, 3), {"stride": 2, "padding": 1}, True, None),
    "grouped, dilated": ((2, 8, 12, 12), (8, 2, 3, 3), {"groups": 4, "dilation": 2, "padding": 2}, True, "relu"),
    "depthwise": ((2, 24, 10, 10), (24, 1, 3, 3), {"groups": 24, "padding": 1}, True, "relu"),
    "residual + relu": ((2, 16, 8, 8), (16, 16, 3, 3), {"padding": 1}, True, "residual"),
    "7x7 stem": ((2, 3, 32, 32), (16, 3, 7, 7), {"stride": 2, "padding": 3}, True, "relu"),
    "asymmetric padding (im2col)": ((1, 4, 9, 9), (8, 4, 3, 3), {"padding": (0, 0, 1, 1)}, False, "relu"),
    "sigmoid epilogue": ((2, 8, 6, 6), (8, 8, 3, 3), {"padding": 1}, True, "sigmoid"),
}


def _graph(name: str, dtype: str = "float32") -> rlx_core.Graph:
    xs, ws, attrs, bias, epilogue = CASES[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    g = rlx_core.Graph(name.replace(" ", "_"))
    x = g.input("x", xs, dtype)
    w = g.param("w", (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype))
    b = g.param("b", rng.standard_normal(ws[0]).astype(dtype)) if bias else None
    y = g.conv2d(x, w, b, **attrs)
    if epilogue == "relu":
        y = g.relu(y)
    elif epilogue == "sigmoid":
        y = g.sigmoid(y)
    elif epilogue == "residual":
        y = g.relu(g.add(y, x))
    g.set_outputs([y])
    return g


def _check(g: rlx_core.Graph, cg: rlx_core.CompiledGraph) -> None:
    inputs = random_inputs(g, seed=5)
    want = evaluate(g, inputs)
    for _ in range(3):  # eager, capture, replay
        got = cg.run(inputs)
        why = mismatch(got[0].dtype.name, got[0], want[0], terms=256)
        assert why is None, why


@pytest.fixture
def cudnn_backend(gpu_backend):
    from rlx_cuda import cudnn

    try:
        cudnn.load()
    except OSError as exc:
        pytest.skip(f"no cuDNN here: {exc}")
    return gpu_backend


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_convolutions_match_the_reference(cudnn_backend, name, dtype):
    g = _graph(name, dtype)
    cg = rlx_core.compile(g, device="cuda")
    _check(g, cg)
    notes = " ".join(cg.report().notes)
    want = "im2col + cuBLAS" if "asymmetric" in name else "cuDNN"
    assert f"convolutions: 1 on {want}" in notes, notes
    if name in ("3x3 + bias + relu", "residual + relu") and dtype == "float32":
        assert "+ bias, relu" in notes, notes  # one fused cuDNN call


def test_off_runs_im2col_and_agrees(cudnn_backend, monkeypatch):
    monkeypatch.setenv("RLX_CUDA_CUDNN", "off")
    g = _graph("3x3 + bias + relu")
    cg = rlx_core.compile(g, device="cuda")
    _check(g, cg)
    assert any("im2col + cuBLAS (no cuDNN: RLX_CUDA_CUDNN=off)" in n for n in cg.report().notes)


def test_tf32_convolutions_are_close(cudnn_backend):
    g = _graph("3x3 + bias + relu")
    plain = rlx_core.compile(g, device="cuda")
    tf32 = rlx_core.compile(g, device="cuda", options=rlx_core.CompileOptions(extra={"tf32": True}))
    inputs = random_inputs(g, seed=6)
    np.testing.assert_allclose(tf32.run(inputs)[0], plain.run(inputs)[0], rtol=2e-2, atol=5e-3)


def test_the_explain_line_names_cudnn(cudnn_backend):
    versions = cudnn_backend.probe().versions
    assert versions["cudnn"].startswith("cuDNN "), versions
