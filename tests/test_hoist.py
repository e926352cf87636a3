"""An activation read through reshapes and transposes is applied before them
(``passes/hoist.py``): exactly the same values, and a convolution or a dense layer can then
take it as its epilogue; never where a moved node has another reader, is an output, or
the producer is an input."""

from __future__ import annotations

import numpy as np
import pytest
from support import registry_with

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir.ops import OpKind
from rlx_core.passes.hoist import hoist_activations
from rlx_cpu import CpuBackend

RNG = np.random.default_rng(17)


def mix_ffn(case: str = "moved") -> rlx.Graph:
    """SegFormer's Mix-FFN middle: a depthwise convolution's image moved back into a
    sequence (transpose + reshape), then the activation."""
    g = rlx.Graph("mixffn")
    x = g.input("x", (1, 8, 6, 6), "float32")
    conv = g.conv2d(x, g.param("w", RNG.standard_normal((8, 1, 3, 3)).astype(np.float32)), padding=1, groups=8)
    seq = g.reshape(g.transpose(conv, (0, 2, 3, 1)), (1, 36, 8))
    act = g.gelu(seq) if case != "relu" else g.relu(seq)
    outs = [g.matmul(act, g.param("w2", RNG.standard_normal((8, 4)).astype(np.float32)))]
    outs += [seq] if case == "layout read elsewhere" else []
    outs += [act] if case == "activation an output" else []
    g.set_outputs(outs)
    return g


@pytest.mark.parametrize("case", ["moved", "relu"])
def test_the_activation_moves_above_the_layout_and_the_values_stay_the_same(case: str) -> None:
    g = mix_ffn(case)
    h, notes = hoist_activations(g)
    assert len(notes) == 1 and "above the transpose" in notes[0]
    act = next(n for n in h.nodes if n.op in (OpKind.GELU, OpKind.RELU))
    assert h.node(act.inputs[0]).op is OpKind.CONV2D
    f = {"x": RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    np.testing.assert_array_equal(reference.evaluate(h, f)[0], reference.evaluate(g, f)[0])


@pytest.mark.parametrize("case", ["layout read elsewhere", "activation an output"])
def test_nothing_moves_where_it_is_not_free(case: str) -> None:
    g = mix_ffn(case)
    h, notes = hoist_activations(g)
    assert h is g and not notes


def test_an_activation_of_a_reshaped_input_stays() -> None:
    g = rlx.Graph("input")
    g.set_outputs([g.tanh(g.reshape(g.input("x", (2, 6), "float32"), (3, 4)))])
    h, notes = hoist_activations(g)
    assert h is g and not notes


def test_cpu_takes_the_moved_activation_as_the_convolutions_epilogue() -> None:
    g = mix_ffn()
    cg = rlx.compile(g, device="cpu", registry=registry_with(CpuBackend()))
    report = str(cg.report())
    assert "moved gelu at node 5 above the transpose" in report and "fused conv2d + gelu" in report
    f = {"x": RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    np.testing.assert_allclose(cg.run(f)[0], reference.evaluate(g, f)[0], rtol=1e-5, atol=1e-5)
    off = rlx.compile(g, device="cpu", registry=registry_with(CpuBackend()),
                      options=rlx.CompileOptions(disable=("hoist",)))
    assert "moved gelu" not in str(off.report()) and "fused conv2d + gelu" not in str(off.report())
