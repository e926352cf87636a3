"""A convolution whose product the BLAS runs cannot add its bias as it stores: the bias
then joins the epilogue's one pass (``fused._with_bias_first``) instead of a pass of its
own. Every epilogue shape against the reference: operand 0 read twice (swish), a residual,
clip constants, 1x1 and 3x3."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_core import compile as rlx_compile
from rlx_core.ir import Graph
from rlx_core.reference import evaluate

EPILOGUES = {
    "relu": lambda g, y, x: g.relu(y),
    "clip": lambda g, y, x: g.minimum(g.maximum(y, 0.0), 6.0),
    "swish": lambda g, y, x: g.mul(y, g.sigmoid(y)),
    "residual": lambda g, y, x: g.relu(g.add(y, x)),
}


@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("kernel", [1, 3])
def test_bias_joins_the_epilogue_pass(monkeypatch, epilogue, kernel):
    monkeypatch.setenv("RLX_CPU_GEMM", "blas")
    monkeypatch.setenv("RLX_CPU_ONEDNN", "off")
    rng = np.random.default_rng(kernel)
    g = Graph("conv_epilogue")
    x = g.input("x", (2, 8, 9, 9))
    w = g.param("w", rng.standard_normal((8, 8, kernel, kernel)).astype(np.float32) / 8)
    b = g.param("b", rng.standard_normal(8).astype(np.float32))
    g.set_outputs([EPILOGUES[epilogue](g, g.conv2d(x, w, b, padding=kernel // 2), x)])
    cg = rlx_compile(g, device="cpu")
    assert any("fused_conv" in line for line in cg.report().pipeline), cg.report()
    feeds = {"x": rng.standard_normal((2, 8, 9, 9)).astype(np.float32)}
    np.testing.assert_allclose(cg.run(feeds)[0], evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)
