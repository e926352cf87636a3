"""The cpu backend's thread policy (``rlx_cpu/threads.py``): native kernels stay on one
thread when a graph's products run on a BLAS pool that is not OpenMP's team."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_core
from rlx_core.ir.ops import OpKind
from rlx_cpu import blas, native, threads

OPENBLAS = {"user_api": "blas", "internal_api": "openblas", "threading_layer": "pthreads", "num_threads": 2}
MKL_GNU = {"user_api": "blas", "internal_api": "mkl", "threading_layer": "gnu", "num_threads": 2}
OMP = {"user_api": "openmp", "internal_api": "openmp", "num_threads": 2}


def test_pools_of_keeps_only_separate_multithreaded_blas_pools():
    assert threads._pools_of([OPENBLAS, MKL_GNU, OMP]) == ["openblas (pthreads threads, 2)"]
    assert threads._pools_of([{**OPENBLAS, "num_threads": 1}]) == []  # one thread: no pool to fight
    assert threads._pools_of([{**OPENBLAS, "threading_layer": "openmp"}]) == []  # on OpenMP's team
    assert threads._pools_of([{**MKL_GNU, "threading_layer": "intel"}]) == ["mkl (intel threads, 2)"]


def test_numpy_blas_guess_reads_numpys_build_when_threadpoolctl_cannot(monkeypatch):
    wheel = {"name": "scipy-openblas", "openblas configuration": "OpenBLAS 0.3.31 DYNAMIC_ARCH NO_AFFINITY Haswell"}
    for var in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    assert threads._numpy_blas_guess(wheel, cores=4) == [
        "openblas (numpy's scipy-openblas, own threads, 4: assumed from numpy's build)"]
    assert threads._numpy_blas_guess(wheel, cores=1) == []  # one core: no pool to fight
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert threads._numpy_blas_guess(wheel, cores=4) == []  # the user pinned it to one thread
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    omp = {**wheel, "openblas configuration": "OpenBLAS 0.3.21 DYNAMIC_ARCH USE_OPENMP Haswell"}
    assert threads._numpy_blas_guess(omp, cores=4) == []  # on OpenMP's team
    assert threads._numpy_blas_guess({"name": "accelerate"}, cores=4) == []


def test_unreadable_pools_fall_back_to_numpys_build(monkeypatch):
    import threadpoolctl

    def unreadable():
        raise OSError("no /proc here")

    monkeypatch.setattr(threadpoolctl, "threadpool_info", unreadable)
    monkeypatch.setattr(threads, "_numpy_blas_guess", lambda: ["openblas (numpy's, guessed)"])
    threads.separate_blas_pools.cache_clear()
    try:
        assert threads.separate_blas_pools() == ("openblas (numpy's, guessed)",)
    finally:
        threads.separate_blas_pools.cache_clear()


def test_cap_only_for_graphs_with_products_and_a_separate_pool():
    pools = ["openblas (pthreads threads, 2)"]
    cap, why = threads.native_thread_cap([OpKind.ADD, OpKind.MATMUL], pools)
    assert cap == 1 and "matmul" in why and "openblas" in why
    assert threads.native_thread_cap([OpKind.ADD, OpKind.EXP], pools) == (None, "")  # the pool sleeps
    assert threads.native_thread_cap([OpKind.CONV2D], []) == (None, "")  # BLAS on OpenMP's team


def test_native_threads_honour_the_cap(native_lib):
    lib = native_lib
    if not lib.openmp:
        pytest.skip("the native kernels were built without OpenMP here")
    with native.thread_cap(1):
        assert lib.threads() == 1
    assert lib.threads() >= 1


@pytest.mark.parametrize("cores", [1, 2, 16])
def test_kernels_take_threads_in_proportion_to_their_work(native_lib, monkeypatch, cores):
    """One thread below the work a fork-join is worth, then at least two (every core of a
    2-core host, as before), one more per ``per`` of work, never more than the cores: a
    small product on a 16-core host takes 3 threads, not 16."""
    monkeypatch.setattr(type(native_lib), "threads", lambda self: cores)
    assert native_lib.threads_for(999, 1000) == 1
    assert native_lib.threads_for(1000, 1000) == min(cores, 2)
    assert native_lib.threads_for(3500, 1000, 1000) == min(cores, 3)
    assert native_lib.threads_for(1e9, 1000) == cores
    assert native_lib.threads_for(1 << 16, 1 << 16, 1 << 19) == min(cores, 2)  # rlx_gemm's smallest split


@pytest.mark.parametrize("separate", [True, False])
def test_the_report_says_when_native_kernels_are_kept_on_one_thread(monkeypatch, separate):
    monkeypatch.setenv("RLX_CPU_GEMM", "blas")  # rlx's own GEMM runs on OpenMP's team: never a separate pool
    monkeypatch.setattr(threads, "separate_blas_pools", lambda: ("openblas (pthreads threads, 2)",) if separate else ())
    monkeypatch.setattr(blas, "mkl", lambda: None)
    g = rlx_core.Graph("dense")
    x = g.input("x", (8, 16))
    w = g.param("w", np.ones((16, 4), np.float32))
    g.set_outputs([g.relu(g.matmul(x, w))])
    cg = rlx_core.compile(g, device="cpu")
    noted = any("native kernels on one thread" in n for n in cg.report().notes)
    assert noted is separate
    np.testing.assert_allclose(cg.run({"x": np.ones((8, 16), np.float32)})[0], np.full((8, 4), 16.0))


def _drive(tuner: threads.ThreadTuner, cost: dict[str, float], runs: int) -> list[str]:
    """Run ``tuner`` for ``runs`` runs whose time is ``cost[mode]``; the modes it chose."""
    chosen = []
    for _ in range(runs):
        mode = tuner.next_mode()
        chosen.append(mode)
        tuner.observe(mode, cost[mode])
    return chosen


def _drive_times(tuner: threads.ThreadTuner, times: list[float], runs: int = 30) -> list[str]:
    """Run ``tuner`` for ``runs`` runs taking ``times`` in turn, whatever the mode; the modes it chose."""
    chosen = []
    for seconds in times[:runs]:
        mode = tuner.next_mode()
        chosen.append(mode)
        tuner.observe(mode, seconds)
    return chosen


def test_the_tuner_settles_on_the_faster_mode_after_comparing_both():
    tuner = threads.ThreadTuner(warmup=2, trials=3, block=2, probes=2, window=4, period=8, max_period=64)
    cost = {"wide": 1.00e-3, "narrow": 0.88e-3}  # narrow faster, by less than a clear win
    chosen = _drive(tuner, cost, 10)
    # warm-up, the opening (two of each, all counted), then a block of each (first run not counted)
    assert chosen[:2] == ["wide", "wide"] and chosen[2:6] == ["wide", "wide", "narrow", "narrow"]
    assert chosen[6:10] == ["wide", "wide", "narrow", "narrow"]
    assert tuner.mode == "narrow"
    steady = _drive(tuner, cost, 200)
    assert steady.count("wide") <= 12  # probes only, fewer and fewer (8, 16, 32, 64 runs apart)
    assert tuner.period == 64 and tuner.switches == 0


def test_the_tuner_follows_the_host_when_it_changes():
    """Another process takes a core: wide collapses, the next probe moves to narrow; the
    process leaves, a later probe moves back."""
    tuner = threads.ThreadTuner(warmup=0, trials=2, probes=2, window=4, period=8, max_period=16)
    _drive(tuner, {"wide": 1e-3, "narrow": 2e-3}, 30)
    assert tuner.mode == "wide"
    _drive(tuner, {"wide": 8e-3, "narrow": 2e-3}, 40)
    assert tuner.mode == "narrow" and tuner.switches == 1
    _drive(tuner, {"wide": 1e-3, "narrow": 2e-3}, 40)
    assert tuner.mode == "wide" and tuner.switches == 2


def test_a_slowdown_is_probed_at_once_not_a_period_later():
    """A quiet host: the probes have grown hundreds of runs apart. Another process starts
    spinning on a core and wide runs take 3.4x as long: narrow is tried within a window's
    runs and taken; the process leaves, and narrow's confirmations go back to wide."""
    tuner = threads.ThreadTuner(warmup=0, trials=2, probes=2, window=4, period=8, max_period=256)
    _drive(tuner, {"wide": 1e-3, "narrow": 2e-3}, 600)
    assert tuner.mode == "wide" and tuner.period == 512
    chosen = _drive(tuner, {"wide": 3.4e-3, "narrow": 2.5e-3}, 10)
    assert tuner.mode == "narrow" and tuner.switches == 1 and chosen.index("narrow") <= 4, chosen
    _drive(tuner, {"wide": 1e-3, "narrow": 2e-3}, 40)
    assert tuner.mode == "wide" and tuner.switches == 2


def test_a_quiet_host_pays_few_narrow_probes_once_wide_clearly_won():
    """Narrow at twice wide's time, a quiet host: a clear first verdict of wide waits
    ``max_period`` runs for its first probe, and the probes grow ``wide_max_period`` apart
    (a load that arrives is the drift check's to notice). With wide's probes held to
    ``max_period``, 10,000 runs took 157 narrow runs (the opening's one, then 39 probes of 4); now 25."""
    tuner = threads.ThreadTuner(warmup=0, trials=2, probes=3)
    chosen = _drive(tuner, {"wide": 1e-3, "narrow": 2e-3}, 10_000)
    assert tuner.mode == "wide" and tuner.period == 2048 and tuner.switches == 0
    assert chosen[4:4 + 256].count("narrow") == 0, "the first probe waits max_period runs"
    assert chosen.count("narrow") <= 25, chosen.count("narrow")
    # a narrow pick that was not clear keeps the old cadence: its confirmations come soon
    tuner = threads.ThreadTuner(warmup=0, trials=2, probes=3, max_period=64)
    _drive(tuner, {"wide": 1e-3, "narrow": 0.8e-3}, 2_000)
    assert tuner.mode == "narrow" and tuner.period == 64


def test_a_host_slower_for_both_modes_is_not_probed_again_and_again():
    tuner = threads.ThreadTuner(warmup=0, trials=2, probes=2, window=4, period=8, max_period=256)
    _drive(tuner, {"wide": 1e-3, "narrow": 2e-3}, 600)
    chosen = _drive(tuner, {"wide": 2e-3, "narrow": 4e-3}, 200)  # half the speed, both ways
    assert tuner.mode == "wide" and tuner.switches == 0
    assert chosen.count("narrow") <= 3 + 2 * 3, chosen  # the drift's probe, and at most two periodic ones
    _drive(tuner, {"wide": 1e-3, "narrow": 2e-3}, 30)  # quiet again: the baseline follows it down
    chosen = _drive(tuner, {"wide": 1.45e-3, "narrow": 1.2e-3}, 12)  # a new load, 1.45x quiet: noticed at once
    assert tuner.mode == "narrow" and "narrow" in chosen[:6], chosen


def test_a_narrow_pick_is_confirmed_soon():
    """The other core busy during the first comparison only: narrow is taken, and wide is
    tried again after ``confirm`` runs, not ``period``: back to wide within a few runs."""
    tuner = threads.ThreadTuner(warmup=0, trials=2, probes=2, window=4, period=64, max_period=256, confirm=4)
    _drive(tuner, {"wide": 8e-3, "narrow": 2e-3}, 6)  # the comparison, with the core away
    assert tuner.mode == "narrow" and tuner.period == 4
    chosen = _drive(tuner, {"wide": 1e-3, "narrow": 2e-3}, 12)
    assert tuner.mode == "wide" and tuner.switches == 1 and tuner.period == 64, chosen
    assert chosen[-3:] == ["wide"] * 3


def test_the_first_comparison_goes_to_wide_unless_narrow_wins_by_the_margin():
    """Wide and narrow nearly equal (the host's second core away for a while): wide, whose
    speed comes back with the core; narrow only when clearly faster."""
    tuner = threads.ThreadTuner(warmup=0, trials=3, probes=2, window=4, period=64, max_period=64, margin=0.9)
    _drive(tuner, {"wide": 1.00e-3, "narrow": 0.95e-3}, 12)
    assert tuner.mode == "wide"
    tuner = threads.ThreadTuner(warmup=0, trials=3, probes=2, window=4, period=64, max_period=64, margin=0.9)
    _drive(tuner, {"wide": 1.00e-3, "narrow": 0.85e-3}, 12)
    assert tuner.mode == "narrow"


def _drive_cold(tuner: threads.ThreadTuner, warm: dict[str, float], cold_wide: float, runs: int) -> list[str]:
    """Like _drive, but a wide run right after a narrow one costs ``cold_wide`` (the worker
    threads' idle CPU woken first: on a VM, as slow as narrow)."""
    chosen: list[str] = []
    for _ in range(runs):
        mode = tuner.next_mode()
        cold = mode == "wide" and chosen and chosen[-1] == "narrow"
        chosen.append(mode)
        tuner.observe(mode, cold_wide if cold else warm[mode])
    return chosen


def test_a_cold_first_wide_run_does_not_count():
    """Wide at half narrow's time once awake, but as slow as narrow right after a narrow
    run: alternating single runs compared a cold wide with narrow; blocks whose first run
    is not counted keep wide."""
    tuner = threads.ThreadTuner(warmup=0, trials=4, block=3, probes=3, window=4, period=8, max_period=16)
    _drive_cold(tuner, {"wide": 2e-3, "narrow": 4e-3}, 4.5e-3, 400)
    assert tuner.mode == "wide" and tuner.switches == 0
    # and a host whose wide is really slower still moves to narrow
    tuner = threads.ThreadTuner(warmup=0, trials=4, block=3, probes=3, window=4, period=8, max_period=16)
    _drive_cold(tuner, {"wide": 6e-3, "narrow": 4e-3}, 6e-3, 40)
    assert tuner.mode == "narrow"


def test_the_tuner_rejects_a_block_without_a_counted_run():
    with pytest.raises(ValueError, match="block"):
        threads.ThreadTuner(block=1)


def test_a_probe_within_the_margin_does_not_switch():
    tuner = threads.ThreadTuner(warmup=0, trials=2, probes=2, window=4, period=4, max_period=8, margin=0.9)
    _drive(tuner, {"wide": 1.00e-3, "narrow": 1.05e-3}, 10)
    assert tuner.mode == "wide"
    _drive(tuner, {"wide": 1.00e-3, "narrow": 0.95e-3}, 40)  # 5% faster: noise, not a reason to move
    assert tuner.mode == "wide" and tuner.switches == 0


def _conv_net() -> rlx_core.Graph:
    rng = np.random.default_rng(0)
    g = rlx_core.Graph("convs")
    x = g.input("x", (1, 8, 32, 32))
    h = x
    for i in range(3):
        w = g.param(f"w{i}", (rng.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32))
        h = g.relu(g.conv2d(h, w, None, stride=(1, 1), padding=(1, 1, 1, 1)))
    g.set_outputs([g.softmax(g.reshape(h, (1, 8 * 32 * 32)))])
    return g


def test_both_modes_compute_the_same_and_tiny_graphs_are_not_tuned():
    lib = native.library()
    if lib is None or lib.threads() < 2:
        if blas.mkl() is None or blas.mkl().max_threads() < 2:
            pytest.skip("one thread here: wide and narrow are the same run")
    g = _conv_net()
    cg = rlx_core.compile(g, device="cpu")
    exe = cg._exe
    if not exe._tunable():  # e.g. no MKL and the products on numpy's pool: native kernels capped at one
        pytest.skip(f"wide and narrow are the same run here (native thread cap {exe._thread_cap})")
    assert exe._tuner is not None and any("ThreadTuner" in n for n in cg.report().notes)
    x = np.random.default_rng(1).standard_normal((1, 8, 32, 32)).astype(np.float32)
    want = rlx_core.reference.evaluate(g, {"x": x})[0]
    modes = set()
    for _ in range(16):  # warm-up and trials: both modes run
        modes.add(exe._tuner.next_mode())
        np.testing.assert_allclose(cg.run({"x": x})[0], want, rtol=1e-4, atol=1e-6)
    assert modes == {"wide", "narrow"} and exe.plan_stats()["narrow"]  # a narrow plan was bound and pooled
    (plan,) = exe._pool
    twin = plan.twin
    assert twin is not None and twin.stats.buffers > 0  # it took buffers: its plan's, none of its own
    assert all(any(b is a for a in plan.buffers) for b in twin.buffers), "the twin holds no buffer of its own"
    assert twin.outputs is plan.outputs  # nor output arrays: the plan's, faulted in already
    tiny = rlx_core.Graph("tiny")
    t = tiny.input("t", (4, 4))
    tiny.set_outputs([tiny.exp(t)])
    assert rlx_core.compile(tiny, device="cpu")._exe._tuner is None



def test_a_modes_first_plan_is_bound_before_its_run_is_timed(monkeypatch):
    """The tuner compares runs: binding narrow's first plan (its kernels set up for one
    thread) inside the timed run made the first narrow run look up to half again slower."""
    g = _conv_net()
    exe = rlx_core.compile(g, device="cpu")._exe
    if exe._tuner is None:
        pytest.skip("the graph is not tuned here (one thread)")
    exe._tuner = threads.ThreadTuner(warmup=0, trials=2, block=2, sure=1e9, clear=1e9)  # no early verdict
    seen: list[tuple[str, float]] = []
    observe = exe._tuner.observe
    monkeypatch.setattr(exe._tuner, "observe", lambda mode, seconds: (seen.append((mode, seconds)),
                                                                      observe(mode, seconds)))
    bind = exe._bind_plan

    def slow_bind(narrow=False, over=None):
        import time

        time.sleep(0.25)
        return bind(narrow, over)

    monkeypatch.setattr(exe, "_bind_plan", slow_bind)
    x = np.zeros((1, 8, 32, 32), np.float32)
    for _ in range(4):
        exe.run({"x": x})
    assert [m for m, _ in seen] == ["wide", "wide", "narrow", "narrow"] and exe.plan_stats()["narrow"]
    assert all(seconds < 0.25 for _, seconds in seen), seen


_AFFINITIES = """
import json, os, sys
from rlx_cpu import native
lib = native.library()
threads = lib.threads()
tasks = {}
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/status") as f:
        tasks[tid] = next(line.split(":")[1].strip() for line in f if line.startswith("Cpus_allowed_list"))
print(json.dumps({"threads": threads, "bound": lib.bound, "main": tasks.pop(str(os.getpid())),
                  "workers": sorted(tasks.values())}))
"""


@pytest.mark.parametrize("setting", ["1", "0"])
def test_openmp_workers_are_pinned_one_to_a_cpu_unless_told_not_to(setting: str):
    """The first question about threads pins OpenMP's workers (one here on two CPUs) to
    a CPU each, never the caller's thread; ``RLX_CPU_BIND=0`` leaves them as they were."""
    import json
    import os
    import subprocess
    import sys

    lib = native.library()
    if lib is None or not lib.openmp or not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs the native kernels with OpenMP on Linux with two CPUs or more")
    env = {**os.environ, "RLX_CPU_BIND": setting}
    out = subprocess.run([sys.executable, "-c", _AFFINITIES], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    allowed = found["main"]
    assert "-" in allowed or "," in allowed  # the caller keeps every CPU
    single = [w for w in found["workers"] if w.isdigit()]
    if setting == "1":
        assert found["bound"] == found["threads"] - 1 >= 1 and len(single) >= found["bound"]
    else:
        assert found["bound"] == 0  # (another library's pool may pin threads of its own)


def test_the_tuner_stays_wide_when_concurrent_runs_leave_a_mode_unsampled():
    """Eight threads running one executable take each other's planned slots: a trial can
    end with no run of one mode. The tuner then stays wide (the probes compare later)
    instead of failing the run that ended the trial."""
    tuner = threads.ThreadTuner(warmup=0, trials=2, block=2, probes=2, window=4, period=8, max_period=64)
    for _ in range(len(tuner._schedule)):
        tuner.next_mode()
        tuner.observe("wide", 1e-3)  # every run came back in the other mode than planned, or wide
    assert tuner.mode == "wide"
    for _ in range(20):  # and it keeps answering
        tuner.observe(tuner.next_mode(), 1e-3)


def test_a_mode_that_clearly_loses_is_dropped_after_two_counted_runs():
    """distilbert at batch 8 on 2 cores: 120 ms wide, 220 ms narrow. The full comparison
    once ran 9 of the first 21 runs narrow; the opening's first narrow run settles it now."""
    tuner = threads.ThreadTuner()
    chosen = _drive(tuner, {"wide": 0.120, "narrow": 0.220}, 30)
    assert chosen.count("narrow") == 1 and chosen[:4] == ["wide"] * 3 + ["narrow"]
    assert tuner.mode == "wide" and chosen[4:] == ["wide"] * 26
    # a busy core the other way round: narrow clearly faster, taken as soon (and confirmed soon)
    tuner = threads.ThreadTuner()
    chosen = _drive(tuner, {"wide": 0.300, "narrow": 0.150}, 5)
    assert tuner.mode == "narrow" and tuner.period == tuner.confirm and chosen == ["wide"] * 3 + ["narrow"] * 2
    # densenet121 at batch 8: 193 ms wide, 243 ms narrow (1.26x): not sure after one narrow
    # run, past the clear factor after two
    tuner = threads.ThreadTuner()
    chosen = _drive(tuner, {"wide": 0.193, "narrow": 0.243}, 24)
    assert chosen.count("narrow") == 2 and tuner.mode == "wide"
    # within the clear factor: the whole comparison runs
    tuner = threads.ThreadTuner()
    chosen = _drive(tuner, {"wide": 0.120, "narrow": 0.130}, 24)
    assert chosen.count("narrow") == 8 and tuner.mode == "wide"


def test_a_noisy_first_narrow_run_does_not_settle_by_itself():
    """One narrow run between the sure and the clear factor is not a verdict: the second
    narrow run decides, and a pair of narrow runs that do not clearly lose runs the rest."""
    tuner = threads.ThreadTuner()
    chosen = _drive_times(tuner, [0.100, 0.100, 0.100, 0.130, 0.105] + [0.100] * 40)  # one slow narrow run
    assert chosen.count("narrow") == 8 and tuner.mode == "wide"


def test_a_clear_wide_verdict_is_lent_to_larger_sizes_of_the_same_graph():
    """Shape classes of one symbolic graph (a ``ShapeFamily``): once one found wide clearly
    faster, a class of at least its work starts wide (no narrow trial); a smaller one, or
    any class after a narrow or a close verdict, compares for itself."""
    from rlx_core.plugin import ShapeFamily

    family = ShapeFamily()
    first = threads.family_tuner(family, 1000)
    assert not first.known_wide
    _drive(first, {"wide": 0.1, "narrow": 0.2}, 6)
    assert first.mode == "wide"
    bigger = threads.family_tuner(family, 4000)
    assert bigger.known_wide and _drive(bigger, {"wide": 0.1, "narrow": 0.2}, 30).count("narrow") == 0
    smaller = threads.family_tuner(family, 500)
    assert not smaller.known_wide and "narrow" in _drive(smaller, {"wide": 0.1, "narrow": 0.2}, 6)
    # not lent: a narrow verdict, a close one, or outside a family
    for cost in ({"wide": 0.3, "narrow": 0.15}, {"wide": 0.120, "narrow": 0.130}):
        family = ShapeFamily()
        _drive(threads.family_tuner(family, 1000), cost, 30)
        assert not threads.family_tuner(family, 4000).known_wide, cost
    assert not threads.family_tuner(None, 4000).known_wide


def test_a_symbolic_graphs_larger_class_runs_no_narrow_trial(monkeypatch):
    """End to end: a graph with a symbolic batch, its executables compiled per class in
    one family, the tuner of a larger batch starting wide after a smaller one's clear win."""
    import rlx_cpu.executor as executor

    lib = native.library()
    if lib is None or lib.threads() < 2:
        pytest.skip("one thread here: nothing to tune")
    rng = np.random.default_rng(0)
    g = rlx_core.Graph("dense")
    x = g.input("x", ("batch", 256))
    w = g.param("w", (rng.standard_normal((256, 256)) / 16).astype(np.float32))
    g.set_outputs([g.relu(g.matmul(g.relu(g.matmul(x, w)), w))])
    made = []
    real = executor.family_tuner

    def spy(family, work):
        tuner = real(family, work)
        made.append(tuner)
        return tuner

    monkeypatch.setattr(executor, "family_tuner", spy)
    cg = rlx_core.compile(g, device="cpu")
    for batch in (4, 4, 64):
        cg._compiled({"batch": batch}, (("batch", batch),))  # each class compiled on its own
    if not made:
        pytest.skip("the graph is not tuned here")
    first = made[0]
    _drive(first, {"wide": 0.1, "narrow": 0.2}, 6)  # its first comparison: wide clearly
    cg._classes.clear()
    cg._compiled({"batch": 64}, (("batch", 64),))
    assert made[-1].known_wide
    assert any("wide from the start" in n for n in cg._classes[(("batch", 64),)].report().notes)


def test_the_narrow_plan_is_bound_after_the_warm_up_run_not_inside_a_narrow_one():
    """While the first comparison is pending, the plan the narrow runs will use is bound
    in the wide run just before the first narrow one: not in the first run (the first
    result a caller waits for; a narrow plan's oneDNN primitives are new kernels), not
    inside a run the tuner times nor the narrow run a caller times."""
    lib = native.library()
    if lib is None or lib.threads() < 2:
        pytest.skip("one thread here: no narrow runs")
    g = _conv_net()
    cg = rlx_core.compile(g, device="cpu")
    exe = cg._exe
    if exe._tuner is None:
        pytest.skip(f"not tuned here (native thread cap {exe._thread_cap})")
    x = np.random.default_rng(2).standard_normal((1, 8, 32, 32)).astype(np.float32)
    assert exe._tuner.comparing() and exe._pool[0].twin is None
    cg.run({"x": x})  # the warm-up run, wide: the first result, no narrow plan bound in it
    (plan,) = exe._pool
    assert plan.twin is None and exe._tuner.next_mode() == "wide"
    while exe._tuner.next_mode() != "narrow":
        cg.run({"x": x})
    (plan,) = exe._pool
    assert plan.twin is not None  # bound in the wide run before the first narrow one
    built = exe.plan_stats()["narrow"]
    while exe._tuner.comparing():
        cg.run({"x": x})
    assert exe.plan_stats()["narrow"] == built  # the narrow runs found their plan bound


def test_a_wide_run_slowed_by_a_neighbour_does_not_hold_the_comparison_open():
    """vgg11_bn beside ORT on 2 cores: the first counted wide run came right after ORT's
    call (its pool still spinning) and took 74 ms against 45; narrow takes 82. Held to
    wide's slowest run, narrow's first run was no verdict and six more narrow runs
    followed; held to wide's fastest, that first narrow run settles it."""
    tuner = threads.ThreadTuner()
    times = iter([0.090, 0.074, 0.045] + [0.082] + [0.045] * 40)  # warm-up, wide, wide, narrow, ...
    chosen = []
    for _ in range(30):
        mode = tuner.next_mode()
        chosen.append(mode)
        tuner.observe(mode, next(times) if mode == "wide" or chosen.count("narrow") == 1 else 0.082)
    assert chosen.count("narrow") == 1 and tuner.mode == "wide"
    # both narrow runs of the opening past wide's fastest by the clear factor (not its slowest)
    tuner = threads.ThreadTuner()
    chosen = _drive_times(tuner, [0.090, 0.074, 0.045, 0.060, 0.058] + [0.045] * 40)
    assert chosen.count("narrow") == 2 and tuner.mode == "wide"
