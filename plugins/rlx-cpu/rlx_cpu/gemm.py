"""float32 matrix products on rlx's own GEMM (``rlx_gemm`` in ``native.c``) where it is
measurably faster than the BLAS the product would otherwise go to (``blas.py``).

Why: oneMKL and numpy's OpenBLAS choose their kernels by CPU vendor and model, and on
AMD's AVX-512 parts (Zen 4, Zen 5) both run AVX2 code: half the multiply-add rate of
the machine. On a 2-core Zen 5 (EPYC), OpenBLAS forced onto its AVX-512 kernels ran a
large square product about twice as fast as either library's own choice, and rlx's GEMM
about as fast as that, as fast or faster on the resnet18 and transformer shapes with
packed weights (measured: BENCHMARKS.md, sections 'On a 2-core AMD Zen 5, with rlx's own
GEMM (session 9)' and 'Figures behind design choices (moved from docstrings, issue 32)').
On an Intel AVX-512 part MKL runs its own AVX-512 kernels and wins or ties. Without
AVX-512 the GEMM runs its 12 x 32 tile as 6 x 16 sub-tiles that fit AVX2's 16 registers
(``native.c``, ``rlx_v8``); there a BLAS's tuned kernels are about as fast on big square
products, and the GEMM wins on a convolution's skinny ones and on few-k products
(BENCHMARKS.md, "rlx's kernels on AVX2"), besides adding the bias and running the
epilogue as it stores C.

So nothing is assumed: the first compile that plans a float32 product (``use_native``)
times the GEMM, its A packed as a graph's weights are, against the BLAS (MKL when it is
loaded, else ``numpy.matmul``) on two representative products, minimum of a few
repetitions each, every GEMM call before any BLAS call (a small cost paid once per
process, MKL's own start-up included), and the BLAS keeps the products only where it
wins both by more than ``MARGIN``: the probe times bare products, and in a graph the GEMM
also adds the bias and runs the activation as it stores C, a pass over the output the
BLAS leaves to a step of its own (on the 2-core Zen 3 the probe timed the two close to
each other, either one ahead from run to run, and ten torchvision models ran faster on
the GEMM, A/B in one process). Where that BLAS keeps a thread pool of its own (numpy's
OpenBLAS, on more than one core) it must win both by ``POOL_MARGIN`` (1.5x), since
running products on it leaves every native kernel of those graphs one thread
(``threads.py``). On a 16-core Xeon (AVX-512, numpy's OpenBLAS) the probe's ratio of the
two moved either side of a tie from process to process, and resnet18, efficientnet_b0 and
bert ran slower with the BLAS than with the GEMM, resnet18 more than twice as long
(measured: BENCHMARKS.md, sections 'Zoo on the H100 host: cuda, and rlx cpu on a 16-core
Xeon (issue 17)' and 'Figures behind design choices (moved from docstrings, issue 32)').
The decision is logged (logger ``rlx_cpu.gemm``) and reported by ``describe()`` (``rlx
devices``: the ``gemm`` entry).

``RLX_CPU_GEMM=native`` uses the GEMM for every float32 product it can take (tests, or a
host known to want it), ``RLX_CPU_GEMM=blas`` never; ``auto`` (the default) measures.

How a product runs: one ``rlx_gemm`` call bound when the plan is made, like the MKL
step (``ccall.bound_call``): every shape, stride and plan address fixed, only a caller's
array read per run. A resident operand (weights: B of a dense layer, A of a
convolution's ``W @ columns``) is packed once into the GEMM's panel layout through
``ctx.derived`` and refreshed in place by ``set_param``; the GEMM then skips packing it
on every call (7-25% of a product's time on the shapes above).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx_core.plugin import best_of

from . import blas, verdicts
from . import threads as thread_policy
from .ccall import bound_call
from .native import Native, library
from .steps import Dyn, Step, aligned_empty

if TYPE_CHECKING:
    from .regions import Epilogue

__all__ = ["Decision", "ProbeCase", "DEEP_K", "DEEP_PROBE", "MARGIN", "POOL_MARGIN", "SPLIT_MACS", "THREAD_MACS",
           "PROBE_SHAPES", "mode", "use_native", "decision", "describe", "native_step", "gemv_step", "matmul_step",
           "matmul_bias_step", "matmul_epilogue_step", "reset", "stacked_rows"]

log = logging.getLogger(__name__)

#: Past two threads, a product takes one more for each of this many multiply-adds (eight
#: times ``SPLIT_MACS``, the work that takes as long as a fork-join: with less work per
#: thread, more threads would mostly wait on each other; measured: BENCHMARKS.md, section
#: 'Figures behind design choices (moved from docstrings, issue 32)').
THREAD_MACS = 1 << 19
#: The BLAS must be this much faster than the GEMM on every probe shape to keep the
#: products (10%: below that, run-to-run noise on a shared host could pick the slower one,
#: and the GEMM's fused epilogue is worth a tie).
MARGIN = 1.10
#: Where the BLAS keeps a thread pool of its own (numpy's OpenBLAS), it must be this much
#: faster on every probe shape to take the products: taking them leaves every native kernel
#: of those graphs one thread, which the probe's products do not show. On a 16-core Xeon,
#: OpenBLAS timed a little faster than the GEMM in one process of three and took the
#: products, and resnet18 and efficientnet_b0 then ran about twice as long as on the GEMM
#: (measured: BENCHMARKS.md, sections 'Zoo on the H100 host: cuda, and rlx cpu on a 16-core
#: Xeon (issue 17)' and 'Figures behind design choices (moved from docstrings, issue 32)').
POOL_MARGIN = 1.5
#: Products (per call, all batches) of fewer multiply-adds run on one thread: OpenMP's
#: fork-join costs a few µs, as long as 64k multiply-adds take on one AVX-512 core.
SPLIT_MACS = 1 << 16
#: (M, K, N) of the timed products: a square one and a convolution's skinny one (resnet18's
#: first 3x3 stage, 64 channels over 56x56 columns).
PROBE_SHAPES: tuple[tuple[int, int, int], ...] = ((256, 256, 256), (64, 576, 3136))
#: Products of more than this many terms a sum get a decision of their own, timed on
#: ``DEEP_PROBE`` (M, K, N: resnet50's third-stage 3x3 through im2col) once the GEMM has
#: won the others: on the 2-core Zen 3 its AVX2 sub-tiles beat oneMKL on the probe shapes
#: and the 1x1 convolutions, and lost 0.74-0.9x on products of 1152 to 4608 terms (resnet50
#: without oneDNN ran 2.38x ORT's time on the GEMM against 2.05x on MKL).
DEEP_K = 1024
DEEP_PROBE = (256, 2304, 196)
#: Timed calls per contender of a probe; ``best_of`` keeps the shortest.
PROBE_REPEATS = 5
#: Seconds for a BLAS pool's workers to stop spinning (OpenBLAS: 2^28 cycles, ~0.1 s).
_SETTLE_S = 0.25

_PACKED_A, _PACKED_B = 1, 2
_F32 = np.dtype(np.float32)


def mode() -> str:
    """``RLX_CPU_GEMM``: ``native``, ``blas`` or ``auto`` (the default); anything else is a
    ``ConfigError`` naming the variable, the value and those words."""
    from .settings import GEMM

    return str(GEMM.read())


@dataclass(frozen=True)
class Decision:
    """Whether this process runs float32 products on rlx's GEMM, and why; ``deep``: the
    same for products of more than ``DEEP_K`` terms a sum (None: as ``native``)."""

    native: bool
    why: str
    deep: bool | None = None

    def for_depth(self, k: int | None) -> bool:
        """Whether a product of ``k`` terms a sum (None: any) runs on the GEMM."""
        if k is None or k <= DEEP_K or self.deep is None:
            return self.native
        return self.native and self.deep


_DECIDED: dict[str, Decision] = {}
_QUESTION = "gemm"  # the verdict's name on disk
_LOCK = threading.Lock()


def reset() -> None:
    """Forget the measured decision, here and on disk (tests; the next ``use_native``
    measures again)."""
    with _LOCK:
        _DECIDED.clear()
        verdicts.VERDICTS.forget(_QUESTION)


def _settled(lib: Native) -> Decision:
    """``_measure``'s decision, or the one an earlier process measured on this host
    (``verdicts``)."""

    def measure() -> dict[str, Any]:
        d = _measure(lib)
        return {"yes": d.native, "why": d.why, "deep": d.deep}

    found = verdicts.settled(_QUESTION, measure)
    deep = found.get("deep")
    return Decision(found["yes"], found["why"], deep if isinstance(deep, bool) else None)


def decision() -> Decision | None:
    """The decision in force now, without measuring: the forced mode's, the measured one,
    or None while ``auto`` has not measured yet."""
    lib = library()
    if lib is None:
        return Decision(False, "the native kernels are not loaded")
    forced = mode()
    if forced == "native":
        return Decision(True, "RLX_CPU_GEMM=native")
    if forced == "blas":
        return Decision(False, "RLX_CPU_GEMM=blas")
    return _DECIDED.get("auto")


def use_native(k: int | None = None) -> bool:
    """True when float32 products (of ``k`` terms a sum, where the caller knows) should
    run on rlx's GEMM: decided once per process (or kept from an earlier one: ``verdicts``),
    by timing it against the BLAS (see the module docstring), at the first call that needs
    to know."""
    found = decision()
    if found is not None:
        return found.for_depth(k)
    lib = library()
    assert lib is not None  # decision() answered for a missing library
    with _LOCK:
        if "auto" not in _DECIDED:
            _DECIDED["auto"] = _settled(lib)
            log.info("rlx-cpu: float32 products on %s (%s)",
                    "rlx's GEMM" if _DECIDED["auto"].native else "the BLAS", _DECIDED["auto"].why)
        return _DECIDED["auto"].for_depth(k)


def describe(measured: bool = True) -> str:
    """The probe's ``gemm`` entry for ``rlx devices``: which code runs float32 products
    and why. Cheap: never measures (before the first compile with products, ``auto``
    says it will). ``measured=False`` leaves out what this process measured, as the
    probe does: its answer is part of the host's calibration identity."""
    found = decision() if measured else None
    if found is None:
        return "auto: rlx's GEMM is timed against the BLAS at the first compile with products"
    return f"{'rlx GEMM' if found.native else 'BLAS'} for float32 products ({found.why})"


# ----------------------------------------------------------------------------- measuring
def _cores() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class ProbeCase:
    """One timed product ``c = a @ b`` of shape (M, K, N): uniform operands (a third of
    normal's cost to draw), A packed as a graph's weights are, ``args``, the ``rlx_gemm``
    call on ``threads`` threads writing ``c_native``, and ``blas``, the BLAS's name and its
    call writing ``c_blas``. The object holds the arrays the calls' addresses point into."""

    def __init__(self, lib: Native, shape: tuple[int, int, int], threads: int, rng: np.random.Generator) -> None:
        self.shape = shape
        m, k, n = shape
        self.a = rng.random((m, k), dtype=np.float32) - 0.5
        self.b = rng.random((k, n), dtype=np.float32) - 0.5
        self.c_native, self.c_blas = aligned_empty((m, n), np.float32), aligned_empty((m, n), np.float32)
        self.packed = aligned_empty(max(int(lib.gemm_pack_a_size(m, k)), 1), np.float32)
        lib.gemm_pack_a(self.a.ctypes.data, k, 1, m, k, self.packed.ctypes.data)
        self.args = (m, n, k, self.packed.ctypes.data, k, 1, 0, self.b.ctypes.data, n, 1, 0,
                     self.c_native.ctypes.data, n, 0, 1, _PACKED_A, threads, 0, 0)
        self.blas = _blas_runner(self.a, self.b, self.c_blas)


def _blas_runner(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[str, Callable[[], None]]:
    """The BLAS call a product ``c = a @ b`` would otherwise make, and the BLAS's name."""
    mkl = blas.mkl()
    m, k = a.shape
    n = b.shape[1]
    if mkl is not None:
        args = (blas._ROW_MAJOR, blas._NO_TRANS, blas._NO_TRANS, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n,
                0.0, c.ctypes.data, n)
        return "oneMKL", lambda: mkl.sgemm(*args)
    return "numpy", lambda: np.matmul(a, b, out=c)


def _measure(lib: Native) -> Decision:
    """Time the GEMM and the BLAS on ``PROBE_SHAPES``, the minimum of ``PROBE_REPEATS`` runs
    each; the BLAS keeps the products where it beats the GEMM by ``MARGIN`` on every shape. Threads:
    every core for both (what an unconstrained product gets).

    Every GEMM timing comes before every BLAS one: numpy's OpenBLAS keeps its pthreads
    spinning after a call, so a GEMM timed right after it shared the cores with them
    (alternating the two, the Zen 5 host picked OpenBLAS in a third of fresh processes,
    timing the GEMM at 0.2-0.3x its speed). The caller's own work just before has the
    same effect: a 16-core Xeon timed the GEMM at 0.01-0.03x right after numpy's OpenBLAS
    ran, and the zoo benchmark, which runs ONNX Runtime (its threads spin too) before rlx's
    first compile, gave a process MKL's products in one run of three (resnet18 then ran
    about a third slower). So unless the GEMM clearly won, both are timed again after
    ``_SETTLE_S``, once other pools' workers have stopped spinning, and each one's better
    time counts. If the GEMM still did not clearly win, both are also timed on one thread
    each, and each shape counts the GEMM's better ratio of the two: a process holding a
    core makes every multi-threaded timing wait on the thread sharing that core (with a
    busy loop on the other vCPU of the 2-core host the GEMM timed at a few hundredths of
    MKL's speed, where it otherwise runs about twice MKL's; MKL's products then made
    resnet18 take over twice as long as on rlx's GEMM, narrow both), and the ThreadTuner,
    not this choice, copes with a busy core (measured: BENCHMARKS.md, sections 'On the same
    2-core Zen 5, session 13' and 'Figures behind design choices (moved from docstrings,
    issue 32)')."""
    rng = np.random.default_rng(0)
    threads_used = _cores() if lib.openmp else 1
    # the cases stay in the list: the calls hold only their arrays' addresses
    cases = [ProbeCase(lib, shape, threads_used, rng) for shape in PROBE_SHAPES]
    native_times = [best_of(lambda case=case: lib.gemm(*case.args), PROBE_REPEATS) for case in cases]
    blas_times = [best_of(case.blas[1], PROBE_REPEATS) for case in cases]
    pools = thread_policy.blas_pools() if threads_used > 1 else []
    if threads_used > 1 and not all(t_blas > MARGIN * t_native for t_native, t_blas in zip(native_times, blas_times)):
        time.sleep(_SETTLE_S)  # whatever pool was spinning has gone to sleep: both again
        native_times = [min(t, best_of(lambda case=case: lib.gemm(*case.args), PROBE_REPEATS))
                        for t, case in zip(native_times, cases)]
        blas_times = [min(t, best_of(case.blas[1], PROBE_REPEATS)) for t, case in zip(blas_times, cases)]
    name = cases[-1].blas[0] if cases else "the BLAS"
    for case in cases:  # never trade a right answer
        m, k, n = case.shape
        if not np.allclose(case.c_native, case.c_blas, rtol=1e-3, atol=1e-3 * math.sqrt(k)):
            return Decision(False, f"rlx's GEMM disagreed with {name} at {m}x{k}x{n}")
    ratios = [t_blas / t_native for t_native, t_blas in zip(native_times, blas_times)]
    single = ""
    if threads_used > 1 and not all(r > MARGIN for r in ratios):
        one = _single_thread_ratios(lib, cases)
        if one is not None:
            ratios = [max(r, r1) for r, r1 in zip(ratios, one)]
            single = " (one thread each: " + "/".join(f"{r:.2f}x" for r in one) + ")"
    shapes = ", ".join(f"{m}x{k}x{n}" for m, k, n in PROBE_SHAPES)
    speed = "/".join(f"{r:.2f}x" for r in ratios)
    tile = "AVX-512 tile" if lib.gemm_avx512 else "6x16 sub-tiles"
    if pools:  # ties go to the GEMM: the BLAS would cost the native kernels their threads
        native = all(r > 1 / POOL_MARGIN for r in ratios)
        return Decision(native, f"timed {speed} {name}'s speed at {shapes}{single}, {tile}; the BLAS only where "
                                f"{POOL_MARGIN:.2f}x faster: its own pool ({pools[0]}) leaves the native kernels one "
                                "thread")
    # ties go to the GEMM: it adds the bias and runs the epilogue as it stores C, a pass
    # over the output the BLAS leaves to a step of its own (the probe times bare products)
    native = all(r > 1 / MARGIN for r in ratios)
    why = (f"timed {speed} {name}'s speed at {shapes}{single}, {tile}; the BLAS only where {MARGIN:.2f}x faster: "
           "the GEMM runs the epilogue as it stores")
    if not native:
        return Decision(False, why)
    deep, at = _deep_ratio(lib, threads_used), "x".join(map(str, DEEP_PROBE))
    if deep is None:  # never trade a right answer
        return Decision(True, f"{why}; over {DEEP_K} terms a sum {name} (rlx's GEMM disagreed at {at})", deep=False)
    keep = deep > 1 / MARGIN
    return Decision(True, f"{why}; over {DEEP_K} terms a sum {'the GEMM' if keep else name} (timed {deep:.2f}x at "
                          f"{at})", deep=keep)


def _deep_ratio(lib: Native, threads: int) -> float | None:
    """The BLAS's time over the GEMM's on ``DEEP_PROBE`` (A packed for the GEMM, the GEMM
    timed first), or None where they disagree."""
    case = ProbeCase(lib, DEEP_PROBE, threads, np.random.default_rng(1))
    t_native = best_of(lambda: lib.gemm(*case.args), PROBE_REPEATS)
    t_blas = best_of(case.blas[1], PROBE_REPEATS)
    if not np.allclose(case.c_native, case.c_blas, rtol=1e-3, atol=1e-3 * math.sqrt(DEEP_PROBE[1])):
        return None
    return t_blas / t_native


def _single_thread_ratios(lib: Native, cases: list[ProbeCase]) -> list[float] | None:
    """The BLAS's time over the GEMM's on each case, both on the caller's thread only
    (oneMKL capped for this thread, numpy's BLAS through threadpoolctl); None where the
    BLAS cannot be held to one thread."""
    mkl = blas.mkl()
    limit: Any = contextlib.nullcontext()
    previous = 0
    if mkl is None:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            return None
        limit = threadpool_limits(limits=1, user_api="blas")
    else:
        previous = mkl.local_threads(1)
    try:
        with limit:
            ratios = []
            for case in cases:
                one = (*case.args[:16], 1, *case.args[17:])  # the threads argument
                t_blas = best_of(case.blas[1], PROBE_REPEATS)
                ratios.append(t_blas / best_of(lambda one=one: lib.gemm(*one), PROBE_REPEATS))
    finally:
        if mkl is not None:
            mkl.local_threads(previous)
    return ratios


# ----------------------------------------------------------------------------- steps
def _strides(op: Any) -> tuple[int, int]:
    """(row stride, column stride) in elements of an operand laid out as ``blas._Operand``."""
    return (op.ld, 1) if op.trans == blas._NO_TRANS else (1, op.ld)


def _pack(lib: Native, x: Any, rs: int, cs: int, rows: int, k: int, is_a: bool, ctx: Any) -> np.ndarray | None:
    """Resident operand ``x`` packed once for the GEMM (``rlx_gemm_pack_a`` / ``_b``) as an
    array the executable keeps and ``set_param`` refills; None when ``x`` is not a
    resident or the context keeps nothing."""
    derived = getattr(ctx, "derived", None)
    if derived is None or isinstance(x, Dyn):
        return None
    size = int((lib.gemm_pack_a_size if is_a else lib.gemm_pack_b_size)(rows, k))
    pack = lib.gemm_pack_a if is_a else lib.gemm_pack_b

    def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            dest = aligned_empty(max(size, 1), np.float32)
        if is_a:
            pack(src.ctypes.data, rs, cs, rows, k, dest.ctypes.data)
        else:
            pack(src.ctypes.data, rs, cs, k, rows, dest.ctypes.data)
        return dest

    return derived(x, ("rlx_gemm_pack_a" if is_a else "rlx_gemm_pack_b", rows, k, rs, cs), make)


def _fallback(a: Any, b: Any, live: tuple[bool, bool], row_bias: np.ndarray | None = None,
              epilogue: Epilogue | None = None) -> Callable[..., None]:
    """``numpy.matmul`` over the step's operands (those not packed, then ``out``), with the
    packed ones' own arrays filled in, plus the row bias and the epilogue: a caller's
    array the GEMM cannot take on some run."""
    def run(*ops: np.ndarray) -> None:
        it = iter(ops)
        x = next(it) if live[0] else a
        y = next(it) if live[1] else b
        out = next(it)
        np.matmul(x, y, out=out)
        if row_bias is not None:
            np.add(out, row_bias[:, None], out=out)
        if epilogue is not None:  # its output is `out`, a plan buffer (regions.epilogue)
            epilogue.run()

    return run


def matmul_bias_step(a: Any, b: Any, row_bias: Any, out: Any, ctx: Any = None) -> Step | None:
    """``out = a @ b + row_bias[:, None]`` as one GEMM call where rlx's GEMM runs the
    products, else None (the caller adds the bias in a pass of its own). A 1x1
    convolution's bias then costs nothing: the GEMM adds it as it stores C."""
    if not (isinstance(row_bias, np.ndarray) and use_native(a.shape[-1])):
        return None
    if min(out.shape[-2:]) <= 1:  # a matrix-vector product: rlx_gemv's, for one value per output
        return gemv_step(a, b, out, bias=row_bias) if out.shape[-1] == 1 else None
    return native_step(a, b, out, ctx, row_bias=row_bias)


def matmul_epilogue_step(a: Any, b: Any, out: Any, epilogue: Callable[[], Epilogue | None],
                         ctx: Any = None) -> Step | None:
    """``out = a @ b`` then ``epilogue()`` (made only if needed; a region over ``out``) as
    one GEMM call that applies it to each block of C as it is final, where rlx's GEMM runs
    the float32 product, else None (the caller runs the product and the epilogue apart).
    Not for a matrix-vector product: rlx_gemv's, which takes no epilogue."""
    a, b, out2 = stacked_rows(a, b, out)
    if not (a.dtype == b.dtype == out2.dtype == _F32 and use_native(a.shape[-1])):
        return None
    if out2.ndim < 2 or min(out2.shape[-2:]) <= 1:
        return None
    made = epilogue()
    return None if made is None else native_step(a, b, out2, ctx, epilogue=made)


def _planned(a: Any, b: Any, out: Any) -> tuple[int, int, int, int, Any, Any, Any] | None:
    """``(m, n, k, batch count, A, B, C as blas._Operand)`` of a float32 product ``out = a @
    b`` whose every matrix has one stride per axis and batch and whose C is row-major, or
    None (the BLAS then takes it)."""
    if a.dtype != _F32 or b.dtype != _F32 or out.dtype != _F32 or a.ndim < 2 or b.ndim < 2:
        return None
    m, n = out.shape[-2:]
    k = a.shape[-1]
    batch = tuple(out.shape[:-2])
    try:
        pa, pb, pc = (blas._Operand(a, m, k, batch), blas._Operand(b, k, n, batch), blas._Operand(out, m, n, batch))
    except blas._NoFit:
        return None
    if pc.trans != blas._NO_TRANS:
        return None
    return m, n, k, math.prod(batch), pa, pb, pc


def native_step(a: Any, b: Any, out: Any, ctx: Any = None, row_bias: np.ndarray | None = None,
                epilogue: Epilogue | None = None) -> Step | None:
    """``out = a @ b`` (``+ row_bias[:, None]``: one value per row of each product, a
    convolution's channels; then ``epilogue``, a region over ``out`` applied block by
    block as the GEMM finishes them) as one ``rlx_gemm`` call, or None when the native
    library is not here or the product does not fit (not float32, a layout without one
    stride per matrix axis and batch, a bias that is not a contiguous float32 array of the
    rows). Does not ask whether the GEMM is wanted (``matmul_step`` does)."""
    lib, planned = library(), _planned(a, b, out)
    if lib is None or planned is None:
        return None
    m, n, k, count, pa, pb, pc = planned
    if count > 1 and pc.batch_stride == 0:
        return None
    if row_bias is not None and not (isinstance(row_bias, np.ndarray) and row_bias.dtype == _F32
                                     and row_bias.shape == (m,) and row_bias.flags.c_contiguous):
        return None
    (a_rs, a_cs), (b_rs, b_cs) = _strides(pa), _strides(pb)
    a_bs, b_bs, flags = pa.batch_stride, pb.batch_stride, 0
    packed_a = _pack(lib, a, a_rs, a_cs, m, k, True, ctx) if count == 1 or a_bs == 0 else None
    packed_b = _pack(lib, b, b_rs, b_cs, n, k, False, ctx) if count == 1 or b_bs == 0 else None
    if packed_a is not None:
        flags |= _PACKED_A
    if packed_b is not None:
        flags |= _PACKED_B
    threads = lib.threads_for(m * n * k * count, SPLIT_MACS, THREAD_MACS)
    args: list[Any] = [m, n, k, 0, a_rs, a_cs, a_bs, 0, b_rs, b_cs, b_bs, 0, pc.ld, pc.batch_stride, count, flags,
                       threads, 0 if row_bias is None else row_bias.ctypes.data,
                       0 if epilogue is None else epilogue.address(threads)]
    if packed_a is not None:
        args[3] = packed_a.ctypes.data
    if packed_b is not None:
        args[7] = packed_b.ctypes.data
    live = (packed_a is None, packed_b is None)
    operands = tuple(x for x, keep in zip((a, b, out), (*live, True)) if keep)
    positions = tuple(p for p, keep in zip((3, 7, 11), (*live, True)) if keep)
    kept = tuple(x for x in (packed_a, packed_b, row_bias, epilogue) if x is not None)
    return bound_call(lib.gemm, args, operands, positions, _fallback(a, b, live, row_bias, epilogue), keep=kept)


def gemv_step(a: Any, b: Any, out: Any, bias: np.ndarray | None = None,
              epilogue: Epilogue | None = None) -> Step | None:
    """``out = a @ b`` (``+ bias``, one value per output: a convolution's channels on a 1x1
    plane; then ``epilogue`` over each thread's outputs) with one row of ``a`` or one
    column of ``b`` as one ``rlx_gemv`` call (OpenMP's team), or None when it does not
    fit: not float32, batched, a vector or matrix without a unit stride (the BLAS then
    takes it), a bias that is not a contiguous float32 array of the outputs, an epilogue
    over outputs that are not contiguous."""
    lib, planned = library(), _planned(a, b, out)
    if lib is None or planned is None:
        return None
    m, n, k, count, pa, pb, pc = planned
    if count != 1 or k == 0 or m * n == 0:
        return None
    (a_rs, a_cs), (b_rs, b_cs), (y_rs, y_cs) = _strides(pa), _strides(pb), _strides(pc)
    if m == 1:  # y[j] = sum_k a[0, k] b[k, j]: the matrix is b, read as (j, k)
        mat, vec, length, si, sk, sv, sy, flip = b, a, n, b_cs, b_rs, a_cs, y_cs, False
    else:  # n == 1: y[i] = sum_k a[i, k] b[k, 0]
        mat, vec, length, si, sk, sv, sy, flip = a, b, m, a_rs, a_cs, b_rs, y_rs, True
    if sv != 1 or 1 not in (si, sk):
        return None
    if bias is not None and not (isinstance(bias, np.ndarray) and bias.dtype == _F32 and bias.size == length
                                 and bias.flags.c_contiguous):
        return None
    if epilogue is not None and sy != 1:
        return None
    threads = lib.threads_for(length * k, SPLIT_MACS, THREAD_MACS)
    args: list[Any] = [0, 0, 0, length, k, si, sk, sy, threads, 0 if bias is None else bias.ctypes.data,
                       0 if epilogue is None else epilogue.address(threads)]

    def fallback(mat_: np.ndarray, vec_: np.ndarray, y_: np.ndarray) -> None:
        np.matmul(mat_, vec_, out=y_) if flip else np.matmul(vec_, mat_, out=y_)
        if bias is not None:
            np.add(y_, bias.reshape(y_.shape), out=y_)
        if epilogue is not None:  # its output is `out`, a plan buffer (regions.epilogue)
            epilogue.run()

    keep = tuple(x for x in (bias, epilogue) if x is not None)
    return bound_call(lib.gemv, args, (mat, vec, out), (0, 1, 2), fallback, keep=keep)


def _contiguous(x: Any) -> bool:
    """Whether ``x`` is laid out C-contiguously: an array that says so, or a caller's
    array (``Dyn``) seen only through reshapes (the caller's array is checked each run;
    one that is not contiguous takes the call's numpy fallback)."""
    if isinstance(x, Dyn):
        return all(op == "reshape" for op, _ in x.chain)
    return bool(x.flags.c_contiguous)


def stacked_rows(a: Any, b: Any, out: Any) -> tuple[Any, Any, Any]:
    """``a (..., m, k) @ b (k, n)`` as one ``(rows, k) @ (k, n)`` product when ``a`` and
    ``out`` are contiguous, else the operands as they are.

    Why: a batched product with one shared B runs as one GEMM per leading index, each
    reading all of B. A ConvNeXt block's Linear layers see ``(1, 7, 7, 768) @ (768, 3072)``:
    seven 7-row products, each streaming all 9.4 MB of weights, took more than twice as
    long as one 49-row product (2-core Zen 3, oneMKL; measured: BENCHMARKS.md, section 'CPU
    on untuned models (session 16)'); and only a single product has its B packed once
    (``blas._packed``)."""
    if a.ndim <= 2 or out.ndim != a.ndim or b.ndim < 2 or any(d != 1 for d in b.shape[:-2]):
        return a, b, out
    if not (_contiguous(a) and _contiguous(out)):
        return a, b, out
    b2 = b if b.ndim == 2 else b.reshape(b.shape[-2:])
    return a.reshape(-1, a.shape[-1]), b2, out.reshape(-1, out.shape[-1])


def matmul_step(a: Any, b: Any, out: Any, ctx: Any = None) -> Step:
    """``out = a @ b`` as one step: rlx's GEMM where this process measured it faster
    (``use_native``) and the product fits, else ``blas.matmul_step`` (MKL or numpy).

    A matrix-vector product (one row of A or one column of B) is ``rlx_gemv``, not the
    GEMM, whose 12x32 tile would do 12 or 32 times its work (256x512 @ 512x1 ran at about a
    third of MKL's speed): a memory-bound pass over the matrix on OpenMP's team, about twice
    as fast as MKL's gemv on the Zen 5 host. Without MKL it also keeps numpy's OpenBLAS pool
    asleep, which otherwise spins against the native kernels (without the ``mkl`` extra,
    one process, interleaved: efficientnet_b0, through its squeeze-excitation blocks, and
    resnet18, through its classifier alone, ran nearly twice as fast; measured:
    BENCHMARKS.md, sections 'On a 2-core AMD Zen 5, with rlx's own GEMM (session 9)' and
    'Figures behind design choices (moved from docstrings, issue 32)')."""
    a, b, out = stacked_rows(a, b, out)
    gemv = min(out.shape[-2:]) <= 1 if out.ndim >= 2 else True
    if a.dtype == _F32 and b.dtype == _F32 and out.dtype == _F32 and use_native(a.shape[-1]):
        step = gemv_step(a, b, out) if gemv else native_step(a, b, out, ctx)
        if step is not None:
            return step
    return blas.matmul_step(a, b, out, ctx)
