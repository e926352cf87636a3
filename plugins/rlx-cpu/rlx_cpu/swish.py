"""Whether a convolution's SiLU runs as oneDNN's swish post-op or as a native region after it.

Why ask: SiLU (``x * sigmoid(x)``: EfficientNet's and EfficientNetV2's activation, YOLO's)
maps onto one oneDNN post-op, applied as each output block is written, which saves a pass
over memory. On the 2-core Zen 4 EPYC that post-op cost more than the pass it saves: a
depthwise 3x3 over 32 x 112 x 112 took 0.063 ms plain, 0.18 with the swish post-op and
0.14 plain followed by rlx's native region (native.c's ``silu``, about 0.2 ns an element
on two threads); EfficientNet-B0 ran in 0.89-0.95x the time at batch 1 and 0.90x at batch
8 with every SiLU as a region (BENCHMARKS.md, "SiLU as a post-op or a region"). oneDNN's
eltwise injector and rlx's interpreter compute the exponential differently and each CPU
runs them at its own speed, so nothing is assumed: the first convolution with a SiLU
planned times both ways on two probes (``PROBES``: a depthwise 3x3 over 32 x 112 x 112 and
a 16 -> 96 1x1 over 112 x 112, the best of ``BLOCKS`` blocks each, alternating; smaller
probes timed the two ways alike here while the model did not), kept a day in the verdict
cache like the backend's other timed choices. ``RLX_CPU_SWISH=post-op`` or
``region`` forces it.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from rlx_core.ir.ops import OpKind
from rlx_core.plugin import Instruction

from . import verdicts
from .settings import SWISH

__all__ = ["post_op", "describe", "reset", "MARGIN"]

log = logging.getLogger("rlx_cpu")

#: The region must run the probes in at most 1 / MARGIN of the post-op's time to be taken.
MARGIN = 1.05
#: (kind, channels in, channels out, size): the probe convolutions, batch 1, 3x3 or 1x1.
PROBES = (("depthwise", 32, 32, 112), ("pointwise", 16, 96, 112))

#: Blocks of three runs each way, alternating (the best block counts).
BLOCKS = 6

VERDICT = verdicts.TimedAnswer(
    "onednn-swish-post-op",
    lambda yes, why: log.info("rlx-cpu: SiLU after a convolution %s (%s)",
                              "as oneDNN's post-op" if yes else "as a native region", why))


def post_op(lib: Any) -> tuple[bool, str]:
    """Whether a convolution's SiLU is oneDNN's swish post-op here (else a native region
    over its output after it), and why."""
    forced = SWISH.read()
    if forced != "auto":
        return forced == "post-op", f"RLX_CPU_SWISH={forced}"
    return VERDICT.answer(lambda: _measure(lib))


def describe() -> str:
    """The verdict where this process or rlx's cache has it (times nothing)."""
    forced = SWISH.read()
    if forced != "auto":
        return f"{forced} (RLX_CPU_SWISH)"
    verdict = VERDICT.known()
    if verdict is None:
        return "timed at the first convolution with a SiLU"
    return f"{'post-op' if verdict[0] else 'region'}: {verdict[1]}"


def reset() -> None:
    """Forget the verdict, here and on disk (tests)."""
    VERDICT.reset()


class _ProbeContext:
    """The little of a ``BuildContext`` the probe's steps ask for: float32, scratch and
    derived weights as plain arrays, kept alive with the context."""

    precision = "fp32"
    rounded = None

    def __init__(self) -> None:
        self.kept: list[np.ndarray] = []

    def scratch(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        self.kept.append(np.zeros(shape, dtype))
        return self.kept[-1]

    def derived(self, src: np.ndarray, key: Any, make: Any, also: Any = ()) -> np.ndarray:
        self.kept.append(make(src, None))
        return self.kept[-1]

    def constant(self, array: Any) -> bool:
        return False


def _ways(lib: Any, kind: str, c: int, o: int, size: int, ctx: _ProbeContext) -> tuple[list[Any], list[Any]]:
    """The probe convolution's steps both ways: with the swish post-op, and plain then the region."""
    from . import onednn
    from .onednn_steps import conv_steps
    from .regions import region_steps

    rng = np.random.default_rng(0)
    k, groups = (3, c) if kind == "depthwise" else (1, 1)
    x = rng.standard_normal((1, size, size, c)).astype(np.float32)
    w = rng.standard_normal((o, c // groups, k, k)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    out = np.empty((1, size, size, o), np.float32)
    ctx.kept += [x, w, bias, out]
    args = (lib, x, w, bias, out, (k // 2,) * 4, (1, 1), (1, 1), groups, ctx)
    swish = (("eltwise", onednn.ELTWISE["swish"], 1.0, 0.0),)
    fused = conv_steps(*args, src_cl=True, dst_cl=True, post=swish)
    plain = conv_steps(*args, src_cl=True, dst_cl=True)
    silu = [Instruction(OpKind.SIGMOID, (0,), {}, out.shape, "float32"),
            Instruction(OpKind.MUL, (0, 1), {}, out.shape, "float32")]
    region = region_steps(silu, [out], out)
    if fused is None or plain is None or region is None:
        raise RuntimeError(f"the {kind} probe did not build both ways")
    return fused, plain + region


def _measure(lib: Any) -> tuple[bool, str]:
    """Time the probes both ways, alternating, the best of a few blocks each; the region
    is taken where it ran the two in at most 1 / ``MARGIN`` of the post-op's time."""
    try:
        ctx = _ProbeContext()
        best = {"post-op": 0.0, "region": 0.0}
        for kind, c, o, size in PROBES:
            ways = dict(zip(("post-op", "region"), _ways(lib, kind, c, o, size, ctx), strict=True))
            times = {name: math.inf for name in ways}
            for _ in range(BLOCKS):
                for name, steps in ways.items():
                    for _ in range(2):
                        for s in steps:
                            s.fn(*s.args, **s.kwargs)
                    t0 = time.perf_counter()
                    for _ in range(3):
                        for s in steps:
                            s.fn(*s.args, **s.kwargs)
                    times[name] = min(times[name], (time.perf_counter() - t0) / 3)
            for name in best:
                best[name] += times[name]
    except Exception as exc:  # a probe never breaks the compile that asked: the post-op then
        return True, f"the probe failed: {type(exc).__name__}: {exc}"
    ratio = best["post-op"] / best["region"]
    what = f"the region ran {ratio:.2f}x the post-op's speed on a depthwise 3x3 and a 1x1 convolution"
    return ratio < MARGIN, what
