"""Whether this process runs convolutions as implicit GEMMs (``rlx_conv_gemm``) or as
im2col + rlx's GEMM, where rlx's GEMM runs the products (``gemm.use_native``).

Why measure: the implicit GEMM loads each tap's columns from a shifted copy of the input
at whatever offset the tap has, so nearly every 64-byte vector load straddles two cache
lines, and the copy it reads is kh times the input. AMD's Zen 5 takes split loads at full
speed: there one core ran resnet18's 64 -> 64 3x3 over 56x56 faster that way than through
im2col, and resnet18 on two cores took about a quarter less time. A 16-core Xeon
(AVX-512, numpy's OpenBLAS) ran the same resnet18 nearly three times as long that way as
through im2col in the session before (measured: BENCHMARKS.md, sections 'On the same
2-core Zen 5, session 11' and 'Figures behind design choices (moved from docstrings,
issue 32)'). So nothing is assumed: the first convolution planned times both on one 3x3
convolution (64 -> 64 channels over 28x28, every core, the better of a few calls each,
alternating: both are rlx's own kernels on OpenMP's team, no foreign pool to wait for; a
small cost, once per process) and keeps the implicit GEMM only if it is at least as fast.
The decision is logged (``rlx_cpu``) and shown by ``describe()`` (``rlx devices``: the
``gemm`` entry). ``RLX_CPU_CONV=implicit`` or ``im2col`` forces it.

The same holds for the *direct* kernel (``rlx_conv_direct``), which convolutions with few
taps per output (a first layer's 3 channels, SqueezeNet's 16) run instead of im2col and
the BLAS: on the 2-core AVX-512 host it was written on it beat im2col on the suite's CNN
(64x64 planes), while a 2-core Zen 3 (AVX2, oneMKL) ran it several times slower than
im2col + the BLAS over 56x56 and 112x112 planes, and squeezenet in twice ORT's time
(measured: BENCHMARKS.md, sections 'CPU on untuned models (session 16)' and 'Figures
behind design choices (moved from docstrings, issue 32)'). So ``use_direct`` times both
once per process on two such convolutions (16 -> 32 3x3 over 56x56, and a first layer:
3 -> 32 3x3, stride 2, over 224x224) and keeps the direct kernel only where it wins both
by ``DIRECT_MARGIN`` (it leaves a fused convolution's epilogue to a pass of its own). Its
register blocking (8 output channels x 16 floats) spilled on AVX2's 16 registers, the
cause of that slowdown; off AVX-512 it now keeps 4 channels x 16 outputs in 8-float
vectors, and timed faster than im2col on both probes there (2-core Zen 3, oneMKL).
``RLX_CPU_CONV=direct`` forces it; ``im2col`` turns it off too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from rlx_core.plugin import best_of

from . import gemm, verdicts
from .gemm import PROBE_REPEATS
from .native import Native, library

__all__ = ["DIRECT_MARGIN", "mode", "use_implicit", "use_direct", "describe", "reset"]

log = logging.getLogger("rlx_cpu")

#: (channels in and out, height and width) of the timed convolution: a 3x3, padding 1.
PROBE: tuple[int, int] = (64, 28)

_DECIDED: dict[str, tuple[bool, str]] = {}
_LOCK = threading.Lock()


def mode() -> str:
    """``RLX_CPU_CONV``: ``implicit``, ``im2col`` or ``auto`` (the default); anything else is
    a ``ConfigError`` naming the variable, the value and those words."""
    from .settings import CONV

    return str(CONV.read())


def reset() -> None:
    """Forget the measured decisions, here and on disk (tests; the next ``use_implicit``
    measures again)."""
    with _LOCK:
        _DECIDED.clear()
        for key in ("auto", "direct"):
            verdicts.VERDICTS.forget(f"conv-{key}")


def use_implicit() -> bool:
    """True when convolutions should run as implicit GEMMs here: forced, or measured
    once per process at the first call that asks."""
    return _decided("auto", ("implicit", "im2col"), _measure, "convolutions", "as implicit GEMMs", "through im2col")


def use_direct() -> bool:
    """True when convolutions with few taps should run on the direct kernel here: forced
    (``RLX_CPU_CONV=direct``), or measured once per process at the first one planned."""
    return _decided("direct", ("direct", "im2col"), _measure_direct, "few-tap convolutions", "on the direct kernel",
                    "through im2col")


def _decided(key: str, forcing: tuple[str, str], measure: Callable[[Native], tuple[bool, str]], what: str,
             yes: str, no: str) -> bool:
    """One of this module's questions: ``RLX_CPU_CONV`` answers it when set to one of
    ``forcing`` (the first means yes), else ``measure`` does, once per process (logged) or
    once a day for this host (``verdicts``)."""
    forced = mode()
    if forced in forcing:
        return forced == forcing[0]
    lib = library()
    if lib is None:
        return False
    with _LOCK:
        if key not in _DECIDED:
            _DECIDED[key] = verdicts.settled_answer(f"conv-{key}", lambda: measure(lib))
            log.info("rlx-cpu: %s %s (%s)", what, yes if _DECIDED[key][0] else no, _DECIDED[key][1])
        return _DECIDED[key][0]


def describe(measured: bool = True) -> str:
    """Which way convolutions run and why; never measures. ``measured=False`` leaves out
    what this process measured (see ``gemm.describe``)."""
    forced = mode()
    if forced != "auto":
        return {"implicit": "implicit GEMM", "im2col": "im2col", "direct": "the direct kernel for few taps"}[
            forced] + f" (RLX_CPU_CONV={forced})"
    found, direct = (_DECIDED.get("auto"), _DECIDED.get("direct")) if measured else (None, None)
    text = ("auto: the implicit GEMM is timed against im2col at the first convolution on rlx's GEMM" if found is None
            else f"{'implicit GEMM' if found[0] else 'im2col'} ({found[1]})")
    if direct is None:
        return text + "; few-tap ones: the direct kernel is timed against im2col at the first one"
    return text + f"; few-tap ones: {'the direct kernel' if direct[0] else 'im2col'} ({direct[1]})"


def _measure(lib: Native) -> tuple[bool, str]:
    c, hw = PROBE
    k, n = c * 9, hw * hw
    rng = np.random.default_rng(0)
    x = rng.random((c, hw, hw), dtype=np.float32) - 0.5
    w = rng.random((c, k), dtype=np.float32) - 0.5
    threads = gemm._cores() if lib.openmp else 1
    # the implicit GEMM, 8-channel panels (64 channels: what conv_gemm_panel picks)
    apk8 = np.empty(lib.conv_gemm_pack_size(c, k, 8), np.float32)
    lib.conv_gemm_pack(w.ctypes.data, c, k, 8, apk8.ctypes.data)
    toff = np.empty(k, np.int32)
    lib.conv_gemm_offsets(toff.ctypes.data, c, 3, 3, 1, 1, 1, 1, hw, hw)
    xs = np.empty(lib.conv_gemm_scratch(c, 3, 3, 1, 1, 1, 1, hw, hw), np.float32)
    y_implicit, y_im2col = np.empty((c, n), np.float32), np.empty((c, n), np.float32)
    implicit_args = (x.ctypes.data, apk8.ctypes.data, toff.ctypes.data, 0, y_implicit.ctypes.data, xs.ctypes.data,
                     c, hw, hw, c, 3, 3, 1, 1, 1, 1, 1, 1, hw, hw, 8, 1, threads, 0)
    # im2col, then rlx_gemm with the weights packed
    apk = np.empty(lib.gemm_pack_a_size(c, k), np.float32)
    lib.gemm_pack_a(w.ctypes.data, k, 1, c, k, apk.ctypes.data)
    cols = np.empty((k, n), np.float32)
    im2col_args = (x.ctypes.data, cols.ctypes.data, 1, c * n, k * n, c, hw, hw, 3, 3, 1, 1, 1, 1, 1, 1, hw, hw,
                   threads)
    gemm_args = (c, n, k, apk.ctypes.data, k, 1, 0, cols.ctypes.data, n, 1, 0, y_im2col.ctypes.data, n, 0, 1,
                 gemm._PACKED_A, threads, 0, 0)

    def run_im2col() -> None:
        lib.im2col(*im2col_args)
        lib.gemm(*gemm_args)

    t_implicit = t_im2col = float("inf")
    for _ in range(2):  # alternating, each the better of a few calls
        t_implicit = min(t_implicit, best_of(lambda: lib.conv_gemm(*implicit_args), PROBE_REPEATS))
        t_im2col = min(t_im2col, best_of(run_im2col, PROBE_REPEATS))
    if not np.allclose(y_implicit, y_im2col, rtol=1e-3, atol=1e-3 * np.sqrt(k)):  # never trade a right answer
        return False, f"the implicit GEMM disagreed with im2col at {c}x3x3 over {hw}x{hw}"
    ratio = t_im2col / t_implicit
    return ratio >= 1.0, f"timed {ratio:.2f}x im2col's speed at {c} -> {c} 3x3 over {hw}x{hw}, {threads} threads"


#: The few-tap convolutions ``use_direct`` times: (channels in, out, input size, stride), 3x3, padding 1.
DIRECT_PROBES: tuple[tuple[int, int, int, int], ...] = ((16, 32, 56, 1), (3, 32, 224, 2))
#: How much faster than im2col the direct kernel must be on both probes: it runs a fused
#: convolution's epilogue as a pass of its own, where im2col's product on rlx's GEMM applies
#: it as it stores. Kept at a near tie on the Zen 3 (1.02x and 1.65x on the probes),
#: squeezenet without oneDNN ran 2.40x ORT's time against 1.89x through im2col.
DIRECT_MARGIN = 1.15
#: The pause before each timed block of ``use_direct``'s probe. Alternating back to back,
#: each side ran while the other's threads still spun for the cores (OpenBLAS's pool after
#: the product, OpenMP's team after the direct kernel): on the 2-core Zen 3 the direct
#: kernel then timed faster than im2col on both probes, yet ran squeezenet in about three
#: times im2col's time (measured: BENCHMARKS.md, section 'Figures behind design choices
#: (moved from docstrings, issue 32)').
PAUSE_S = 0.05


def _measure_direct(lib: Native) -> tuple[bool, str]:
    rng = np.random.default_rng(0)
    ratios = []
    for c, o, hw, stride in DIRECT_PROBES:
        ratio = _direct_ratio(lib, rng, c, o, hw, stride)
        if ratio is None:  # never trade a right answer
            return False, f"the direct kernel disagreed with im2col at {c} -> {o} 3x3 over {hw}x{hw}"
        ratios.append((ratio, f"{c} -> {o} over {hw}x{hw}"))
    return min(ratios)[0] > DIRECT_MARGIN, "timed " + ", ".join(f"{r:.2f}x im2col's speed at {what}"
                                                                for r, what in ratios)


def _direct_ratio(lib: Native, rng: np.random.Generator, c: int, o: int, hw: int, stride: int) -> float | None:
    """im2col + the BLAS's time over the direct kernel's on one 3x3 convolution (padding
    1), each the better of a few calls, alternating; None when their answers differ."""
    from .native_nn import _DIRECT_CONV_THREADED_MACS

    oh = (hw + 2 - 3) // stride + 1
    k, n = c * 9, oh * oh
    x = rng.random((c, hw, hw), dtype=np.float32) - 0.5
    w = rng.random((o, c, 3, 3), dtype=np.float32) - 0.5
    threads = lib.threads_for(o * k * n, _DIRECT_CONV_THREADED_MACS, gemm.THREAD_MACS) if lib.openmp else 1
    wpk = np.empty(-(-o // 8) * k * 8, np.float32)
    lib.conv_pack(w.ctypes.data, wpk.ctypes.data, o, c, 3, 3)
    xp = np.empty(lib.conv_direct_scratch(c, 3, 3, stride, stride, oh, oh), np.float32)
    y_direct, y_im2col = np.empty((o, n), np.float32), np.empty((o, n), np.float32)
    direct_args = (x.ctypes.data, wpk.ctypes.data, 0, y_direct.ctypes.data, xp.ctypes.data, c, hw, hw, o, 3, 3,
                   stride, stride, 1, 1, oh, oh, threads)
    cols = np.empty((k, n), np.float32)
    im2col_args = (x.ctypes.data, cols.ctypes.data, 1, c * hw * hw, k * n, c, hw, hw, 3, 3, stride, stride, 1, 1,
                   1, 1, oh, oh, gemm._cores() if lib.openmp else 1)
    _, product = gemm._blas_runner(w.reshape(o, k), cols, y_im2col)

    def run_direct() -> None:
        lib.conv_direct(*direct_args)

    def run_im2col() -> None:
        lib.im2col(*im2col_args)
        product()

    t_direct = t_im2col = float("inf")
    for _ in range(2):  # each block after a pause: the BLAS's pool and OpenMP's team spin after a call
        time.sleep(PAUSE_S)
        t_direct = min(t_direct, best_of(run_direct, PROBE_REPEATS))
        time.sleep(PAUSE_S)
        t_im2col = min(t_im2col, best_of(run_im2col, PROBE_REPEATS))
    if not np.allclose(y_direct, y_im2col, rtol=1e-3, atol=1e-3 * np.sqrt(k)):
        return None
    return t_im2col / t_direct
