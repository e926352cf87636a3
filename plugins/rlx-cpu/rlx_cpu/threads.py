"""One thread policy for the cpu backend: BLAS and the native kernels share the cores.

The native kernels run their parallel regions on OpenMP's team (libgomp). A BLAS with an
OpenMP threading layer (MKL's GNU layer, an OpenMP build of OpenBLAS) runs on that same
team, so the two take turns on the same threads. numpy's wheels ship OpenBLAS with its
*own* pthreads pool: after each product its workers keep spinning for a while, and an
OpenMP region started meanwhile puts a second team on the same cores. On a 2-core host
that made an exported resnet18 take well over twice as long, and mobilenet_v3_small over
three times (measured: BENCHMARKS.md, section 'Figures behind design choices (moved from
docstrings, issue 32)').

So a graph that calls products (matmul, gemm, conv2d, attention) while the BLAS has a
pool of its own with more than one thread runs its native kernels on the caller's
thread; graphs without products (elementwise chains: the BLAS pool sleeps) and hosts
whose BLAS shares OpenMP's team keep the native kernels parallel. Nothing is written to
the environment and no library's thread count is changed: what the libraries report is
read once per process with threadpoolctl.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import statistics
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rlx_core.ir.ops import OpKind

__all__ = ["PRODUCT_OPS", "ThreadTuner", "blas_pools", "family_tuner", "separate_blas_pools", "native_thread_cap"]

log = logging.getLogger("rlx_cpu")

#: Ops whose kernels call the BLAS.
PRODUCT_OPS = frozenset({OpKind.MATMUL, OpKind.GEMM, OpKind.CONV2D, OpKind.FUSED_CONV, OpKind.ATTENTION})


def _pools_of(info: Sequence[Mapping[str, Any]]) -> list[str]:
    """The BLAS libraries in ``info`` (threadpoolctl's ``threadpool_info()``) that keep a
    thread pool of their own with more than one thread."""
    found = []
    for lib in info:
        if lib.get("user_api") != "blas" or int(lib.get("num_threads") or 1) <= 1:
            continue
        layer = str(lib.get("threading_layer") or "").lower()
        if layer in ("openmp", "gnu", "sequential", "disabled"):
            continue  # on OpenMP's team (or none): it takes turns with the native kernels
        found.append(f"{lib.get('internal_api', 'blas')} ({layer or 'own'} threads, {lib.get('num_threads')})")
    return found


@functools.lru_cache(maxsize=1)
def separate_blas_pools() -> tuple[str, ...]:
    """The loaded BLAS pools that are not OpenMP's team, read once per process."""
    import numpy as np  # noqa: F401  (numpy's BLAS must be loaded to be seen)

    try:
        from threadpoolctl import threadpool_info

        info = threadpool_info()
    except Exception as exc:  # unreadable (or threadpoolctl broken): what numpy was built with
        guess = _numpy_blas_guess()
        log.warning("rlx-cpu: threadpoolctl could not read the thread pools (%s); %s", exc,
                    f"assuming {guess[0]}" if guess else "assuming no BLAS pool of its own")
        return tuple(guess)
    return tuple(_pools_of(info))


def _numpy_blas_guess(config: Mapping[str, Any] | None = None, cores: int | None = None) -> list[str]:
    """The pool numpy's BLAS keeps by its build configuration (``numpy.__config__``), for
    when threadpoolctl cannot say: numpy's wheels bundle OpenBLAS on a pthreads pool of its
    own, one thread a core (``OPENBLAS_NUM_THREADS`` and the like aside). Guessing none
    instead is the expensive mistake: with threadpoolctl missing, a 2-core AMX Xeon timed
    numpy's OpenBLAS ahead of rlx's GEMM by the margin meant for a BLAS without a pool, and
    exported CNNs without the extras then ran at 2.3-3.0x ORT's time instead of 1.4-1.9x
    (measured: BENCHMARKS.md, section 'Without the extras on an AMX Xeon (issue 35, session
    34)')."""
    if config is None:
        import numpy as np

        try:
            config = np.__config__.CONFIG["Build Dependencies"]["blas"]
        except (AttributeError, KeyError, TypeError):
            return []
    name = str(config.get("name", ""))
    built = str(config.get("openblas configuration", "")).upper()
    if "openblas" not in name.lower() or "USE_OPENMP" in built:
        return []  # another BLAS, or OpenBLAS on OpenMP's team: nothing of its own
    threads = 0
    for var in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        try:
            threads = int(os.environ.get(var, "").split(",")[0])
        except ValueError:
            continue
        break
    if threads <= 0 and cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if threads <= 0:
        threads = cores or 1
    if threads <= 1:
        return []
    return [f"openblas (numpy's {name}, own threads, {threads}: assumed from numpy's build)"]


def blas_pools() -> list[str]:
    """The separate pools of the BLAS that runs float32 products when rlx's GEMM does not:
    with oneMKL loaded (``blas.py``) every float32 product is MKL's, so only MKL's own pool
    counts (numpy's OpenBLAS then runs the other dtypes' products, rare in inference)."""
    from . import blas

    pools = list(separate_blas_pools())
    if blas.mkl() is not None:
        pools = [p for p in pools if not p.startswith("openblas")]
    return pools


def _products_pools() -> list[str]:
    """The separate pools that run rlx's products: none when rlx's own GEMM runs them
    (``gemm.py``: OpenMP's team, the native kernels' own), else ``blas_pools()``."""
    from . import gemm

    return [] if gemm.use_native() else blas_pools()


def native_thread_cap(ops: Iterable[OpKind], pools: Sequence[str] | None = None) -> tuple[int | None, str]:
    """The cap on the native kernels' threads for a graph of ``ops`` (``None``: no cap)
    and the reason, for the compile report."""
    ops = list(ops)
    if not any(op in PRODUCT_OPS for op in ops):
        return None, ""
    pools = _products_pools() if pools is None else pools
    products = sorted({op.value for op in ops if op in PRODUCT_OPS})
    if not products or not pools:
        return None, ""
    return 1, (f"native kernels on one thread: the graph's products ({', '.join(products)}) run on "
               f"{pools[0]}, a pool that would fight OpenMP's for the cores")


class ThreadTuner:
    """Which of two ways to run a graph is faster *here, now*: ``wide`` (the thread policy
    above: every core for the native kernels and the BLAS) or ``narrow`` (one thread for
    both), chosen by timing the executable's own runs.

    Why measure: whether threads pay depends on the graph, the BLAS, the host and what
    else runs on it, in ways no static rule captures. A 2048-square product runs twice as
    fast wide; a batch-1 conv net's hundreds of small kernels gain little. And another
    process holding a core turns every fork-join region into a wait for the descheduled
    thread: wide collapses, narrow only loses the core (2-core EPYC, oneMKL: with another
    process busy, mobilenet_v3_small and resnet18 took about three times as long wide as
    narrow; quiet, both keep wide; measured: BENCHMARKS.md, section 'With the `mkl` extra,
    and with another process busy (session 8)').

    How: after ``warmup`` runs (wide), an opening of two wide runs and two narrow, all
    counted, then blocks of ``block`` runs of each mode, alternating, until each has
    ``trials`` samples: a block's first run is not counted (why below); narrow wins only
    when its median beats wide's by ``margin``, as a later switch must. The comparison
    ends early where one mode clearly loses (below). Then, every ``period`` runs, a block
    of ``probes`` (+ 1 not counted) runs of the other mode: it takes over when its median
    beats the last ``window`` runs of the current one by ``margin``; a probe that loses
    doubles ``period`` (up to ``max_period`` in narrow, ``wide_max_period`` in wide), and a
    host whose load changed is noticed within a period, or within ``window`` runs where the
    current mode slowed down (below).

    Why wide probes so seldom: a load that arrives slows wide's runs, and the drift check
    below probes narrow within ``window`` runs, so wide's periodic probes only guard
    against a slow change that stays under ``drift``; each costs a narrow run or four,
    up to twice wide's time. At ``max_period`` they cost a quiet host ~1.6% of a model's
    time for good, and 4% over its first 500 runs (regnet_y_800mf at batch 4 on the
    2-core Zen 5, narrow 2x wide; BENCHMARKS.md, section 'The thread tuner's periodic
    probes on a quiet host (issue 35, session 38)'). So a clear first verdict of wide
    waits ``max_period`` runs for its first probe, and wide's probes grow to
    ``wide_max_period`` apart. Narrow keeps ``max_period``: a load that leaves does not
    slow narrow down, so only a probe notices that wide pays again.

    Why a block's first run is not counted: the first wide run after narrow ones finds the
    worker threads' CPU idle (on a VM, a halted vCPU the hypervisor must schedule again)
    and ran at narrow's speed: squeezenet's wide trials right after a narrow run took up to
    twice as long as in a row, so alternating single runs compared narrow with a cold wide
    and could pick narrow on a quiet host (the zoo caught it, squeezenet at about twice
    ORT's time; measured: BENCHMARKS.md, section 'On the same 2-core Zen 5, session 14').

    Why narrow is confirmed soon: a pick of narrow made while the other core was busy for
    a moment (another runtime's pool spinning down, the hypervisor) would hold a model at
    half speed until the first probe, ``period`` runs later: 64 runs are six seconds of a
    100 ms model, longer than a benchmark's blocks or a short batch. So whenever narrow is
    taken, the first probe of wide comes after ``confirm`` runs (then doubling as any
    losing probe does).

    Why the comparison may stop early: each narrow trial of a model that threads speed up
    costs up to a whole extra run (distilbert at batch 8: 120 ms wide, 220 ms narrow), and
    the first comparison once took 9 of the first 21 runs narrow, so a short benchmark or
    batch measured the model at up to 1.7x its time. Once each mode has two counted runs
    and every run of one took ``clear`` times the slowest of the other (narrow: wide's
    fastest, see ``_clear_loser``), that one has lost.
    ``clear`` is 1.15: at 1.4, densenet121 at batch 8 (193 ms wide, 243 ms narrow on the
    2-core Xeon) still ran the whole comparison, and a benchmark that warms a model up for
    a second (5 runs) timed it at 1.26x (the zoo: 240 ms against ORT's 188; BENCHMARKS.md,
    section 'The thread tuner's first comparison (issue 35, session 24)'). Two counted runs
    of each, every one of the loser's past the other's slowest by 15%, is not noise on a
    host whose runs agree within a few percent; on one that does not, the periodic probes
    still correct a wrong pick. Sooner still, the opening's first narrow run settles it
    when it is ``sure`` times wide's fastest (or wide's fastest is ``sure`` times it): a
    transformer whose threads halve its time then pays one narrow run, not three, inside
    the first runs a benchmark times (a BERT export at batch 1 on 2 cores: 16 ms wide, 28
    narrow; BENCHMARKS.md, section 'The first runs of a model (issues 33 and 35, session
    30)'). The opening counts its narrow runs because a narrow run after wide ones finds
    its one thread's CPU awake (the cold start below is wide's after narrow), and the
    executable binds a mode's first plan before the run it times.

    Why a slowdown is probed at once: on a quiet host the probes grow ``max_period`` runs
    apart, so another process that starts spinning on a core was noticed only up to 256
    runs later, and meanwhile every wide run waited on its descheduled thread (the 2-core
    Zen 5, swin_t under bf16 beside a busy process: 59 ms wide, 44 narrow, 17.5 wide
    alone). So the current mode's time is remembered when it is chosen (``_baseline``), and
    when the median of the last ``window`` runs passes ``drift`` times it, the other mode is
    probed at the next run. A probe that loses makes the slower time the new baseline (a
    host that is slower for both modes is not probed again and again), and a window faster
    than the baseline lowers it (so a load that left and came back is noticed again).

    Why a tie goes to wide: a 2-vCPU VM sometimes runs a process as if it had one core
    for seconds at a time (the other vCPU not scheduled: wide and narrow then take the
    same time, mobilenet_v3_small about one and a half times as long as wide takes once the
    core is back; measured: BENCHMARKS.md, section 'Figures behind design choices (moved
    from docstrings, issue 32)'). A first comparison made then was a coin flip, and narrow
    kept until a probe noticed, up to max_period runs later.
    """

    MODES = ("wide", "narrow")

    def __init__(self, *, warmup: int = 1, trials: int = 6, block: int = 3, probes: int = 3, window: int = 8,
                 period: int = 64, max_period: int = 256, wide_max_period: int = 2048, margin: float = 0.9,
                 confirm: int = 8,
                 clear: float = 1.15, sure: float = 1.4, drift: float = 1.3, known_wide: bool = False,
                 on_settle: Callable[[str, bool], None] | None = None) -> None:
        if block < 2:
            raise ValueError(f"ThreadTuner: block must be at least 2 (its first run is not counted), got {block}")
        self.warmup, self.trials, self.block, self.probes, self.window = warmup, trials, block, probes, window
        self.base_period, self.max_period, self.margin, self.confirm = period, max_period, margin, confirm
        self.wide_max_period = max(wide_max_period, max_period)
        self.clear, self.sure, self.drift = clear, sure, drift
        self._baseline: float | None = None  # the current mode's time when it was chosen (see the class doc)
        # The first comparison is over (its schedule ran out, or one mode clearly lost); skipped
        # when threads are known to pay (``known_wide``: see ``family_tuner``).
        self._compared = self.known_wide = known_wide
        self._on_settle = on_settle  # told the first comparison's mode, and whether it was a clear win
        self.period = period
        self.mode = "wide"
        self._seen = 0
        #: the trial phase: (mode, counted) per run: the opening, then wide and narrow blocks alternating
        opening = min(2, trials)
        blocks = -(-(trials - opening) // (block - 1))  # per mode, after the opening
        self._schedule = [(m, True) for m in self.MODES for _ in range(opening)]
        self._schedule += [(self.MODES[b % 2], i > 0) for b in range(2 * blocks) for i in range(block)]
        self._samples: dict[str, list[float]] = {"wide": [], "narrow": []}
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._probing: list[float] | None = None
        self._probe_runs = 0
        self._skip_next = False
        self._since = 0
        self._lock = threading.Lock()
        self.switches = 0

    def comparing(self) -> bool:
        """Whether the first comparison is still to come or under way (the executable asks
        ``narrow_next`` when to bind the narrow plan; this is for reports and tests)."""
        with self._lock:
            return not self._compared

    def narrow_next(self) -> bool:
        """Whether the run after the one about to start is one of the first comparison's
        narrow runs: the executable binds the narrow plan in the wide run before it
        (outside the runs the tuner times), not in the first run a caller waits for. A
        narrow plan's oneDNN primitives are made for one thread, new kernels, not the
        wide plan's from oneDNN's cache: bound in the first run they made it 3-16 ms
        slower (resnet18, mobilenet_v2, efficientnet_b0 at batch 1 on the 2-core Zen 5)."""
        with self._lock:
            k = self._seen + 1 - self.warmup  # the next run's place in the schedule
            return not self._compared and 0 <= k < len(self._schedule) and self._schedule[k][0] == "narrow"

    def next_mode(self) -> str:
        """The mode the next run should use."""
        with self._lock:
            if self._seen < self.warmup:
                return "wide"
            k = self._seen - self.warmup
            if k < len(self._schedule) and not self._compared:  # the first comparison: blocks of each
                return self._schedule[k][0]
            if self._probing is not None:
                return self._other()
            return self.mode

    def observe(self, mode: str, seconds: float) -> None:
        """Record one run's time in ``mode``."""
        with self._lock:
            self._seen += 1
            if self._seen <= self.warmup:
                return
            k = self._seen - self.warmup - 1
            if k < len(self._schedule) and not self._compared:
                planned, counted = self._schedule[k]
                if counted and mode == planned:
                    self._samples[mode].append(seconds)
                loser = self._clear_loser()
                if loser is not None:
                    self._settle("narrow" if loser == "wide" else "wide", planned, clearly=True)
                elif k == len(self._schedule) - 1:
                    if not all(self._samples[m] for m in self.MODES):
                        # Runs from several threads at once took each other's planned slots, so a
                        # mode has no sample: stay wide; the periodic probes compare them later.
                        self.mode, self._skip_next, self._compared = "wide", planned != "wide", True
                        return
                    wide, narrow = (statistics.median(self._samples[m]) for m in self.MODES)
                    self._settle("narrow" if narrow < self.margin * wide else "wide", planned, clearly=False)
                return
            if self._probing is not None and mode != self.mode:
                self._probe_runs += 1
                if self._probe_runs > 1:  # the block's first run is not counted
                    self._probing.append(seconds)
                if len(self._probing) >= self.probes:
                    self._decide()
                return
            if self._skip_next:  # the first run back in this mode after the other's
                self._skip_next = False
                return
            self._recent.append(seconds)
            self._since += 1
            if len(self._recent) < self.window:
                return
            if self._since >= self.period:
                self._probing, self._probe_runs, self._since = [], 0, 0
                return
            now = statistics.median(self._recent)
            if self._baseline is None or now < self._baseline:  # (faster again: the load left)
                self._baseline = now
            elif now > self.drift * self._baseline:
                log.debug("rlx-cpu: threads: %s runs take %.0f µs, %.2fx their %.0f µs: probing %s now", self.mode,
                          now * 1e6, now / self._baseline, self._baseline * 1e6, self._other())
                self._probing, self._probe_runs, self._since = [], 0, 0

    def _clear_loser(self) -> str | None:
        """The mode whose every counted run took ``clear`` times the other's slowest, once
        each has two, or ``sure`` times after the opening's first narrow run (see the
        class doc), else None. Narrow is held to wide's *fastest* run, not its slowest: a
        wide run right after another runtime's call shares the cores with that runtime's
        spinning pool (vgg11_bn beside ORT on the 2-core Zen 5: 74 ms against 45 in a
        row), and one such run held the comparison open, so six more narrow runs at 1.8x
        wide's time fell into the first 30 runs (a benchmark's warm-up of five then timed
        the model at 1.25x ORT instead of 1.08x). Slow runs are what noise makes; a
        falsely fast wide run is not, and a tie goes to wide anyway."""
        wide, narrow = self._samples["wide"], self._samples["narrow"]
        if len(wide) >= 2 and len(narrow) == 1:
            if narrow[0] > self.sure * min(wide):
                return "narrow"
            if min(wide) > self.sure * narrow[0]:
                return "wide"
            return None
        if len(wide) < 2 or len(narrow) < 2:
            return None
        if min(narrow) > self.clear * min(wide):
            return "narrow"
        if min(wide) > self.clear * max(narrow):
            return "wide"
        return None

    def _settle(self, mode: str, planned: str, clearly: bool) -> None:
        """End the first comparison with ``mode`` (the run just observed was ``planned``;
        ``clearly``: the other mode clearly lost)."""
        self.mode, self._compared = mode, True
        if mode == "narrow":
            self.period = self.confirm
        elif clearly:  # (see the class doc: why wide probes so seldom)
            self.period = max(self.period, self.max_period)
        self._skip_next = mode != planned
        wide, narrow = (statistics.median(self._samples[m]) for m in self.MODES)
        self._baseline = wide if mode == "wide" else narrow
        log.debug("rlx-cpu: threads: wide %.0f µs, narrow %.0f µs: %s", wide * 1e6, narrow * 1e6, mode)
        if self._on_settle is not None:
            self._on_settle(mode, clearly)

    def _other(self) -> str:
        return "narrow" if self.mode == "wide" else "wide"

    def _decide(self) -> None:
        assert self._probing is not None
        theirs, ours = statistics.median(self._probing), statistics.median(self._recent)
        self._probing = None
        if theirs < self.margin * ours:
            log.info("rlx-cpu: threads: %s (%.0f µs) beats %s (%.0f µs) now: switching", self._other(),
                     theirs * 1e6, self.mode, ours * 1e6)
            self.mode = self._other()
            self.period = self.confirm if self.mode == "narrow" else self.base_period
            self._recent.clear()
            self._baseline = theirs
            self.switches += 1
        else:
            cap = self.wide_max_period if self.mode == "wide" else self.max_period
            self.period = min(2 * self.period, cap)
            self._skip_next = True  # back to this mode after a block of the other
            self._baseline = ours  # slower for both modes: the new normal, until runs speed up again


#: ``ShapeFamily.shared`` key: the least work (elements over the graph's nodes) of a
#: compile of the family whose first comparison found wide clearly faster.
_WIDE_AT = "rlx_cpu.threads.wide_at"


def family_tuner(family: Any, work: int) -> ThreadTuner:
    """A ``ThreadTuner`` for one compile of a symbolic graph's ``family`` (``None``: a
    compile of its own) whose graph does ``work`` (elements over its nodes).

    Why: every shape class of a symbolic graph is compiled on its own and compared
    again, and a benchmark or a server meeting three sizes paid three narrow trials, each
    a run at up to twice its time (a BERT export at batch 8, sequence 128, on 2 cores: 205
    ms narrow against 110 wide). Threads pay more as a kernel's work grows, so once one
    class of the family found wide clearly faster, a class of at least its work starts
    wide with the comparison done (the periodic probes still check it). A narrow verdict
    is never lent: it most often means another process held a core for a while.
    """
    if family is None:
        return ThreadTuner()
    with family.lock:
        wide_at = family.shared.get(_WIDE_AT)
    if wide_at is not None and work >= wide_at:
        return ThreadTuner(known_wide=True)

    def settled(mode: str, clearly: bool) -> None:
        if mode == "wide" and clearly:
            with family.lock:
                known = family.shared.get(_WIDE_AT)
                family.shared[_WIDE_AT] = work if known is None else min(known, work)

    return ThreadTuner(on_settle=settled)
