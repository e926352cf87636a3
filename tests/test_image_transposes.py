"""``image_transposes``: a sequence moved into an image (``transpose(0, 2, 1)`` then a
reshape) or back becomes a reshape and the 4-D transpose it is, the same values, so a
channels-last backend runs it as a view (SegFormer's Mix-FFN)."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir.ops import OpKind
from rlx_core.passes import run_pipeline
from rlx_core.passes.image_transposes import image_transposes


def _mix_ffn(batch: int = 2, h: int = 6, w: int = 5, c: int = 8) -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    """A linear layer, the sequence into an image, a depthwise 3x3, back into a sequence."""
    rng = np.random.default_rng(0)
    g = rlx.Graph("mixffn")
    x = g.input("x", (batch, h * w, c))
    seq = g.matmul(x, g.param("w1", rng.standard_normal((c, c)).astype(np.float32)))
    image = g.reshape(g.transpose(seq, (0, 2, 1)), (batch, c, h, w))
    conv = g.conv2d(image, g.param("dw", rng.standard_normal((c, 1, 3, 3)).astype(np.float32)), padding=1, groups=c)
    back = g.transpose(g.reshape(conv, (batch, c, h * w)), (0, 2, 1))
    g.set_outputs([g.gelu(back)])
    return g, {"x": rng.standard_normal((batch, h * w, c)).astype(np.float32)}


def _perms(g: rlx.Graph) -> list[tuple[int, ...]]:
    return [tuple(n.attrs["perm"]) for n in g.nodes if n.op is OpKind.TRANSPOSE]


def test_both_ways_become_4d_transposes_with_the_same_values() -> None:
    g, feeds = _mix_ffn()
    h, notes = image_transposes(g)
    assert _perms(h) == [(0, 3, 1, 2), (0, 2, 3, 1)]
    assert len(notes) == 2 and "sequence into an image" in notes[0] and "image into a sequence" in notes[1]
    np.testing.assert_array_equal(reference.evaluate(h, feeds)[0], reference.evaluate(g, feeds)[0])


@pytest.mark.parametrize("case", ["the transpose read elsewhere", "the flat image an output", "another perm",
                                  "another grouping of pixels"])
def test_it_leaves_what_is_not_that_movement(case: str) -> None:
    """Each case leaves one way as it is (read elsewhere, an output, not that
    movement) and rewrites the other."""
    rng = np.random.default_rng(1)
    g = rlx.Graph("left")
    x = g.input("x", (2, 12, 8))
    swap = g.transpose(x, (0, 2, 1) if case != "another perm" else (1, 0, 2))
    image = g.reshape(swap, (2, 8, 3, 4) if case != "another perm" else (12, 2, 2, 4))
    y = g.input("y", (2, 8, 3, 4))
    flat = g.reshape(y, (2, 8, 12) if case != "another grouping of pixels" else (2, 4, 24))
    back = g.transpose(flat, (0, 2, 1))
    outs = [image, back]
    if case == "the transpose read elsewhere":
        outs.append(g.exp(swap))
    elif case == "the flat image an output":
        outs.append(flat)
    g.set_outputs(outs)
    h, notes = image_transposes(g)
    left_in = case in ("the transpose read elsewhere", "another perm")  # (the other way is rewritten)
    assert len(notes) == 1 and notes[0].startswith("image into" if left_in else "sequence into"), notes
    feeds = {"x": rng.standard_normal((2, 12, 8)).astype(np.float32),
             "y": rng.standard_normal((2, 8, 3, 4)).astype(np.float32)}
    for got, want in zip(reference.evaluate(h, feeds), reference.evaluate(g, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def test_it_runs_in_the_pipeline_can_be_disabled_and_runs_the_same_on_cpu() -> None:
    g, feeds = _mix_ffn()
    on = run_pipeline(g, lambda node: True)
    assert (0, 3, 1, 2) in _perms(on.graph)
    off = run_pipeline(g, lambda node: True, rlx.CompileOptions(disable=("image_transposes",)))
    assert (0, 3, 1, 2) not in _perms(off.graph)
    got = rlx.compile(g, device="cpu").run(feeds)[0]
    np.testing.assert_allclose(got, reference.evaluate(g, feeds)[0], rtol=1e-5, atol=1e-5)
