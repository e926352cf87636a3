"""Which of this CPU's units make bf16 operands pay, and which of oneDNN's kernels use them.

Why: under ``precision="bf16"`` a product pays only where the CPU multiplies bf16 faster
than float32, and the CPU's flags alone do not say where that is:

- AMX's tiles always do: oneDNN's AMX kernels ran convolutions and dense layers' products
  2-5x float32's speed on the 2-core AMX Xeon (BENCHMARKS.md, "bf16 on AMX (issue 35,
  session 32)"). A host with AMX takes them without timing; a product oneDNN runs there on
  AVX-512's bf16 instructions instead (a grouped convolution too narrow for the tiles)
  stays float32.
- AVX-512's bf16 dot product (``VDPBF16PS``) depends on the core. The AMX Xeon held to it
  (``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``) ran oneDNN's bf16 kernels 1.5-1.9x *slower*
  than float32, as OpenVINO's bf16 ran on the no-AMX Xeon of sessions 22-31; a 2-core
  Zen 4 EPYC ran the same primitives in 0.5-0.7x float32's time, and OpenVINO, which takes
  bf16 by default there, ran the zoo 1.4-2.3x faster than at float32 (BENCHMARKS.md,
  "bf16 on AVX512-BF16 without AMX (issue 35, session 35)"). So a host with AVX512_BF16
  and no AMX times one convolution and one dense layer's product both ways, once (kept
  like the backend's other verdicts: ``verdicts``), and takes oneDNN's AVX512-BF16 kernels
  for convolutions and dense layers' products where both ran clearly faster. Grouped
  convolutions too, as they are: through rlx, oneDNN's ``jit_bf16`` grouped kernel ran
  1.06-5.3x float32's speed on that EPYC (4 to 32 channels a group, batch 1 and 8).

Merging narrow groups into wide ones (``amx_groups``) is for AMX's tiles only (``merges``).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from . import verdicts
from .settings import BF16

__all__ = ["AMX", "AVX512_BF16", "MARGIN", "unit", "pays", "takes", "merges", "describe", "reset", "time_product"]

log = logging.getLogger("rlx_cpu")

#: The units, as the reports name them.
AMX = "AMX"
AVX512_BF16 = "AVX512-BF16"
#: How much faster than float32 both probes must run at bf16 for AVX512-BF16 to be taken.
MARGIN = 1.1
#: The probes: a ResNet 3x3 convolution (channels, size; batch 1) and a transformer's
#: dense layer (rows, k, n), each ~1-3 ms at float32 on a 2-core EPYC.
CONV_PROBE = (128, 28)
DENSE_PROBE = (128, 768, 3072)
VERDICT = verdicts.TimedAnswer(
    "onednn-bf16-avx512",
    lambda yes, why: log.info("rlx-cpu: bf16 on AVX512-BF16 %s (%s)", "taken" if yes else "not taken", why))


def unit() -> str | None:
    """The unit that multiplies bf16 here by the CPU's flags (``AMX`` first), or None.
    Cheap: reads the flags only."""
    flags = verdicts.cpu_flags()
    if "amx_bf16" in flags:
        return AMX
    return AVX512_BF16 if "avx512_bf16" in flags else None


def pays(lib: Any) -> tuple[bool, str]:
    """Whether bf16 products pay on this host's unit, and why: never under
    ``RLX_CPU_BF16=off``; AMX yes; AVX512-BF16 as ``RLX_CPU_BF16=on`` says, else as timed
    once on this host (``_measure``, kept across processes); no unit, no."""
    forced, found = BF16.read(), unit()
    if forced == "off":
        return False, "RLX_CPU_BF16=off"
    if found == AMX:
        return True, "AMX"
    if found is None:
        return False, "no bf16 unit on this CPU"
    if forced == "on":
        return True, "RLX_CPU_BF16=on"
    return VERDICT.answer(lambda: _measure(lib))


def takes(lib: Any, impl: str) -> bool:
    """Whether oneDNN's implementation ``impl`` of a product with bf16 operands runs on a
    unit that pays here (``pays``): an AMX kernel, or on a host without AMX where
    AVX512-BF16 measured faster, any of its bf16 kernels (``brg*:avx512_core_bf16``,
    ``jit_bf16:...``, and ``gemm:jit:bf16``, the product for a row count given per run,
    which ran 1.4-2.0x float32's ``gemm:jit:f32`` on the Zen 4 EPYC)."""
    if "amx" in impl:
        return True
    return "bf16" in impl and unit() == AVX512_BF16 and pays(lib)[0]


def merges() -> bool:
    """Whether grouped convolutions too narrow for bf16's kernels run as wider groups
    merged (``amx_groups``): on AMX only, whose tiles take 16 channels a group and more
    (narrower ones run on AVX-512 there, slower than float32, and stay float32). On
    AVX512-BF16 every grouped convolution takes bf16 as it is."""
    return unit() == AMX


def describe() -> str:
    """The unit, and on AVX512-BF16 the verdict where this process or rlx's cache has it
    (reads the cache's file, times nothing: ``rlx devices --explain`` asks)."""
    found, forced = unit(), BF16.read()
    if forced == "off":
        return f"{found or 'none'}, not taken (RLX_CPU_BF16=off)"
    if found != AVX512_BF16:
        return found or "none"
    if forced == "on":
        return f"{found}, taken (RLX_CPU_BF16=on)"
    verdict = VERDICT.known()
    if verdict is None:
        return f"{found}, timed against float32 at the first bf16 compile"
    return f"{found}, {'taken' if verdict[0] else 'not taken'}: {verdict[1]}"


def reset() -> None:
    """Forget the verdict, here and on disk (tests)."""
    VERDICT.reset()


def _measure(lib: Any) -> tuple[bool, str]:
    """Time oneDNN's probe convolution and dense product at float32 and at bf16 operands
    (float32 results), alternating, the best of a few blocks each; bf16 is taken where
    both ran ``MARGIN`` faster on an AVX512-BF16 kernel."""
    c, s = CONV_PROBE
    probes = {"convolution": ("conv", (1, c, c, s, 3, 1)), "dense layer": ("dense", DENSE_PROBE)}
    try:
        ratios, impls = {}, {}
        for name in probes:
            best = {}
            for dtype in ("f32", "bf16", "f32", "bf16"):
                t, impl = time_product(lib, *probes[name], dtype)
                best[dtype] = min(best.get(dtype, math.inf), t)
                impls[name] = impl if dtype == "bf16" else impls.get(name, "")
            ratios[name] = best["f32"] / best["bf16"]
    except Exception as exc:  # a probe never breaks the compile that asked: float32 then
        return False, f"the bf16 probe failed: {type(exc).__name__}: {exc}"
    off = [name for name, impl in impls.items() if "avx512_core_bf16" not in impl]
    if off:
        return False, f"oneDNN ran the {off[0]} probe's bf16 on {impls[off[0]]}, not AVX512-BF16"
    m, k, n = DENSE_PROBE
    what = (f"bf16 ran {ratios['convolution']:.2f}x float32's speed on a {c}-channel 3x3 over {s}x{s} and "
            f"{ratios['dense layer']:.2f}x on a {m} x {k} x {n} dense layer")
    return min(ratios.values()) >= MARGIN, what


def time_product(lib: Any, kind: str, shape: tuple[int, ...], dtype: str, blocks: int = 3, per_block: int = 3,
                 pause_s: float = 0.0) -> tuple[float, str]:
    """Seconds one run of oneDNN's product takes with ``dtype`` (``"f32"`` or ``"bf16"``)
    operands and float32 results, the best of ``blocks`` blocks of ``per_block`` runs
    after 2 to warm (``pause_s`` before each block), and the implementation oneDNN chose.
    ``kind``: ``"conv"``, channels-last, ``shape`` (batch, channels in, out, size, kernel,
    stride), same padding; or ``"dense"``, ``shape`` (rows, k, n). The probes here and
    ``bench/precision.py --primitives`` time with it."""
    from .onednn import (
        _AB,
        _ACDB,
        _ANY,
        _ARG_DST,
        _ARG_SCRATCHPAD,
        _ARG_SRC,
        _ARG_WEIGHTS,
        _BF16,
        _F32,
        _QUERY_SCRATCHPAD_MD,
        _QUERY_WEIGHTS_MD,
        _Arg,
    )

    typ = _BF16 if dtype == "bf16" else _F32
    if kind == "conv":
        n, c, o, size, k, s = shape
        out = (size + 2 * (k // 2) - k) // s + 1
        src, dst = lib.md((n, c, size, size), _ACDB, typ), lib.md((n, o, out, out), _ACDB)
        w = lib.md((o, c, k, k), _ANY, typ)
        pd = lib.conv_pd(src, w, None, dst, (s, s), (1, 1), (k // 2,) * 2, (k // 2,) * 2)
    else:
        m, k, n = shape
        src, dst, w = lib.md((m, k), _AB, typ), lib.md((m, n), _AB), lib.md((k, n), _ANY, typ)
        pd = lib.matmul_pd(src, w, None, dst)
    mds = (src, dst, lib.clone_md(lib.query_md(pd, _QUERY_WEIGHTS_MD)),
           lib.clone_md(lib.query_md(pd, _QUERY_SCRATCHPAD_MD)))
    prim, mems = None, []
    try:
        bufs = [np.full(lib.size(md) // 4 + 16, 0.25, np.float32) for md in mds]  # 0x3E80 twice as bf16
        mems = [lib.memory(md, b.ctypes.data) for md, b in zip(mds, bufs, strict=True)]
        prim = lib.primitive(pd)
        args = (_Arg * 4)(*(_Arg(a, mem) for a, mem in
                            zip((_ARG_SRC, _ARG_DST, _ARG_WEIGHTS, _ARG_SCRATCHPAD), mems, strict=True)))
        for _ in range(2):
            lib.run(prim, args, 4)
        best = math.inf
        for _ in range(blocks):
            time.sleep(pause_s)
            t0 = time.perf_counter()
            for _ in range(per_block):
                lib.run(prim, args, 4)
            best = min(best, (time.perf_counter() - t0) / per_block)
        return best, lib.impl(pd)
    finally:
        lib.destroy(tuple(mems), (prim,) if prim is not None else (), (*mds, w), (pd,))
