"""The cpu backend's compiled kernels: ``native.c``, built when rlx-cpu is installed.

Why: numpy runs an elementwise region one ufunc at a time, each a pass over memory and
about a microsecond of call overhead, single-threaded. A compiled block interpreter runs
the whole region in one call per thread with its intermediates in L1 and every loop
vectorized: on the suite's 15-op chain over 1024x1024 (2-core AVX-512 host) it took under
half numpy's time on two threads, less than ONNX Runtime's, and less again with MKL's
vector math for its tanh, exp and log (measured: BENCHMARKS.md, section 'Figures behind
design choices (moved from docstrings, issue 32)').

How: the wheel's build (``pip install``, ``pip wheel``, and ``pip install -e`` for a
checkout) compiles ``native.c`` into ``_rlx_native.so`` (``.dylib``, ``.dll``) inside this
package, beside a JSON record of the compiler, flags and source hash (``_build.py``, run
by ``hatch_build.py``). On x86-64 the library carries AVX-512, AVX2 and baseline clones
and the loader picks one, so a wheel built on one machine runs on any CPU of its
architecture. The first compile that wants it (and the probe, for ``rlx devices``) loads
it with ctypes; nothing is compiled at run time and no other directory is searched, so
the only native code rlx-cpu runs is what the installed package holds.

A library is not loaded when its ``rlx_abi()`` is not this module's ``ABI``, or when its
record says it was built from another ``native.c`` than the one beside it (a checkout
whose source changed since ``pip install -e``: rebuild with ``python -m rlx_cpu._build``).
Without a library (no compiler when the package was built, a failed build) the cpu
backend keeps its numpy kernels, and ``reason()`` (in the log and ``rlx devices``) says
why. ``RLX_CPU_NATIVE=0`` turns the native kernels off at run time.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import ccall, openmp
from ._build import ABI, describe_build, library_name, read_info

__all__ = ["ABI", "Native", "library", "reason", "describe", "wanted", "thread_cap", "REBUILD"]

log = logging.getLogger(__name__)

#: Where the build put the library: this package's own directory, nothing else.
_DIRECTORY = Path(__file__).parent
#: How to get a library where one is missing or refused, for the reasons below.
REBUILD = ("reinstall rlx-cpu where a C compiler works; in a checkout: pip install -e plugins/rlx-cpu, "
           "or python -m rlx_cpu._build")


def wanted() -> bool:
    """False when ``RLX_CPU_NATIVE`` turns the native kernels off (``settings.NATIVE``: a
    value outside its words is a ``ConfigError``)."""
    from .settings import NATIVE

    return bool(NATIVE.read())


class Native:
    """The loaded library: its entry points, typed once."""

    def __init__(self, path: str) -> None:
        self.path = path
        openmp.load()  # before the library that links it: rlx-cpu's spin count (openmp.py)
        self._lib = ctypes.CDLL(path)
        abi = self._lib.rlx_abi
        abi.restype = ctypes.c_int64
        if abi() != ABI:
            raise OSError(f"{path} has ABI {abi()} (rlx_abi()), this rlx-cpu needs ABI {ABI}")
        for name in ("rlx_block", "rlx_op_count", "rlx_vml_size"):
            getattr(self._lib, name).restype = ctypes.c_int64
        self.block = int(self._lib.rlx_block())
        self.op_count = int(self._lib.rlx_op_count())
        self.vml_size = int(self._lib.rlx_vml_size())
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self.region = self._lib.rlx_region
        self.region.argtypes = [p, p, p, i64, i64, i64]
        self.region.restype = ctypes.c_int
        f = ctypes.c_float
        self.softmax = self._lib.rlx_softmax  # (x, y, rows, len, stride, scale, flags, threads)
        self.softmax.argtypes = [p, p, i64, i64, i64, f, i64, i64]
        self.softmax.restype = None
        self.layer_norm = self._lib.rlx_layer_norm  # (x, scale, bias, y, rows, len, stride, eps, threads)
        self.layer_norm.argtypes = [p, p, p, p, i64, i64, i64, f, i64]
        self.layer_norm.restype = None
        # (x, cols, count, x_stride, cols_stride, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, threads)
        self.im2col = self._lib.rlx_im2col
        self.im2col.argtypes = [p, p, *[i64] * 17]
        self.im2col.restype = None
        # (x, w, bias, y, scratch, planes, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, threads)
        self.depthwise = self._lib.rlx_depthwise_conv
        self.depthwise.argtypes = [p, p, p, p, p, *[i64] * 15, p]  # ..., threads, epilogue
        self.depthwise.restype = None
        # (x, w, bias, y, scratch, n, groups, cg, og, h, w, kh, kw, sh, sw, pt, pl, oh, ow, threads, epilogue)
        self.group_conv = self._lib.rlx_group_conv
        self.group_conv.argtypes = [p, p, p, p, p, *[i64] * 15, p]
        self.group_conv.restype = None
        self.group_conv_scratch = self._lib.rlx_group_conv_scratch  # (cg, kh, kw, sh, sw, oh, ow) -> floats
        self.group_conv_scratch.argtypes = [i64] * 7
        self.group_conv_scratch.restype = i64
        # the same arguments, the weights packed by group_conv_lanes_pack (w, groups, og, cg, taps, dest)
        self.group_conv_lanes = self._lib.rlx_group_conv_lanes
        self.group_conv_lanes.argtypes = [p, p, p, p, p, *[i64] * 15, p]
        self.group_conv_lanes.restype = None
        self.group_conv_lanes_pack = self._lib.rlx_group_conv_lanes_pack
        self.group_conv_lanes_pack.argtypes = [p, *[i64] * 4, p]
        self.group_conv_lanes_pack.restype = None
        self.group_conv_lanes_scratch = self._lib.rlx_group_conv_lanes_scratch  # (cg, kh, kw, sh, sw, oh, ow)
        self.group_conv_lanes_scratch.argtypes = [i64] * 7
        self.group_conv_lanes_scratch.restype = i64
        # (x, packed filters and bias, y, scratch, n, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, threads, epi)
        self.depthwise_lanes = self._lib.rlx_depthwise_lanes
        self.depthwise_lanes.argtypes = [p, p, p, p, *[i64] * 15, p]
        self.depthwise_lanes.restype = None
        self.depthwise_lanes_pack = self._lib.rlx_depthwise_lanes_pack  # (w, bias, c, taps, dest)
        self.depthwise_lanes_pack.argtypes = [p, p, i64, i64, p]
        self.depthwise_lanes_pack.restype = None
        self.depthwise_lanes_pack_size = self._lib.rlx_depthwise_lanes_pack_size  # (c, taps)
        self.depthwise_lanes_pack_size.argtypes = [i64, i64]
        self.depthwise_lanes_pack_size.restype = i64
        self.depthwise_lanes_scratch = self._lib.rlx_depthwise_lanes_scratch
        self.depthwise_lanes_scratch.argtypes = [i64] * 8
        self.depthwise_lanes_scratch.restype = i64
        # the same arguments over NHWC images (x, packed filters and bias, y, scratch, n, c, h, w, ..., threads, epi)
        self.depthwise_nhwc = self._lib.rlx_depthwise_nhwc
        self.depthwise_nhwc.argtypes = [p, p, p, p, *[i64] * 15, p]
        self.depthwise_nhwc.restype = None
        self.depthwise_nhwc_scratch = self._lib.rlx_depthwise_nhwc_scratch  # (c, kh, kw, sh, sw, dh, dw, oh, ow)
        self.depthwise_nhwc_scratch.argtypes = [i64] * 9
        self.depthwise_nhwc_scratch.restype = i64
        self.pool2d = self._lib.rlx_pool2d  # (x, y, planes, h, w, kh, kw, sh, sw, dh, dw, oh, ow, is_max, threads)
        self.pool2d.argtypes = [p, p, *[i64] * 13]
        self.pool2d.restype = None
        # (x, y, planes, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind, threads); kind 0 max,
        # 1 average counting the padding, 2 average counting the image's positions
        self.pool2d_padded = self._lib.rlx_pool2d_padded
        self.pool2d_padded.argtypes = [p, p, *[i64] * 15]
        self.pool2d_padded.restype = None
        # (x, y, n, c, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind, threads): NCHW in, NHWC out
        self.pool_to_nhwc = self._lib.rlx_pool_to_nhwc
        self.pool_to_nhwc.argtypes = [p, p, *[i64] * 16]
        self.pool_to_nhwc.restype = None
        # (x, wpk, bias, y, xp, c, h, w, o, kh, kw, pt, pl, oh, ow, threads)
        self.conv_direct = self._lib.rlx_conv_direct
        self.conv_direct.argtypes = [p, p, p, p, p, *[i64] * 13]
        self.conv_direct.restype = None
        self.conv_direct_scratch = self._lib.rlx_conv_direct_scratch  # (c, kh, kw, sh, sw, oh, ow)
        self.conv_direct_scratch.argtypes = [i64] * 7
        self.conv_direct_scratch.restype = i64
        # (x, apk, toff, bias, y, xs, c, h, w, o, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, mr, images, threads, epi)
        self.conv_gemm = self._lib.rlx_conv_gemm
        self.conv_gemm.argtypes = [p, p, p, p, p, p, *[i64] * 17, p]
        self.conv_gemm.restype = None
        self.conv_gemm_scratch = self._lib.rlx_conv_gemm_scratch  # (c, kh, kw, sh, sw, dh, dw, oh, ow)
        self.conv_gemm_scratch.argtypes = [i64] * 9
        self.conv_gemm_scratch.restype = i64
        self.conv_gemm_offsets = self._lib.rlx_conv_gemm_offsets  # (toff, c, kh, kw, sh, sw, dh, dw, oh, ow)
        self.conv_gemm_offsets.argtypes = [p, *[i64] * 9]
        self.conv_gemm_offsets.restype = i64
        self.conv_gemm_pack = self._lib.rlx_conv_gemm_pack  # (w, o, k, mr, dst)
        self.conv_gemm_pack.argtypes = [p, i64, i64, i64, p]
        self.conv_gemm_pack.restype = None
        self.conv_gemm_pack_size = self._lib.rlx_conv_gemm_pack_size  # (o, k, mr) -> floats
        self.conv_gemm_pack_size.argtypes = [i64] * 3
        self.conv_gemm_pack_size.restype = i64
        # (x, wpk, bias, y, scratch, c, h, w, o, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, layout, images, threads, epi)
        self.conv_nhwc = self._lib.rlx_conv_nhwc
        self.conv_nhwc.argtypes = [p, p, p, p, p, *[i64] * 17, p]
        self.conv_nhwc.restype = None
        self.conv_nhwc_pack = self._lib.rlx_conv_nhwc_pack  # (w, o, c, kh, kw, dst)
        self.conv_nhwc_pack.argtypes = [p, i64, i64, i64, i64, p]
        self.conv_nhwc_pack.restype = None
        self.conv_nhwc_pack_size = self._lib.rlx_conv_nhwc_pack_size  # (o, c, kh, kw) -> floats
        self.conv_nhwc_pack_size.argtypes = [i64] * 4
        self.conv_nhwc_pack_size.restype = i64
        self.conv_nhwc_scratch = self._lib.rlx_conv_nhwc_scratch  # (c, h, w, o, oh, ow, layout) -> floats
        self.conv_nhwc_scratch.argtypes = [i64] * 7
        self.conv_nhwc_scratch.restype = i64
        # (x, y, n, h, w, c, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind, threads)
        self.pool_nhwc = self._lib.rlx_pool_nhwc
        self.pool_nhwc.argtypes = [p, p, *[i64] * 16]
        self.pool_nhwc.restype = None
        self.conv_pack = self._lib.rlx_conv_pack  # (w, wpk, o, c, kh, kw)
        self.conv_pack.argtypes = [p, p, i64, i64, i64, i64]
        self.conv_pack.restype = None
        # (m, n, k, a, a_rs, a_cs, a_bs, b, b_rs, b_cs, b_bs, c, ldc, c_bs, count, flags, threads)
        self.gemm = self._lib.rlx_gemm
        self.gemm.argtypes = [i64, i64, i64, p, i64, i64, i64, p, i64, i64, i64, p, i64, i64, i64, i64, i64, p, p]
        self.gemm.restype = None
        self.gemv = self._lib.rlx_gemv  # (mat, v, y, len, k, si, sk, sy, threads, bias)
        self.gemv.argtypes = [p, p, p, *[i64] * 6, p, p]  # ..., bias, epilogue
        self.gemv.restype = None
        self.gemm_pack_a = self._lib.rlx_gemm_pack_a  # (a, rs, cs, m, k, dst)
        self.gemm_pack_b = self._lib.rlx_gemm_pack_b  # (b, rs, cs, k, n, dst)
        for fn in (self.gemm_pack_a, self.gemm_pack_b):
            fn.argtypes = [p, i64, i64, i64, i64, p]
            fn.restype = None
        for name in ("rlx_gemm_pack_a_size", "rlx_gemm_pack_b_size"):  # (rows, k) -> floats
            getattr(self._lib, name).argtypes = [i64, i64]
            getattr(self._lib, name).restype = i64
        self.gemm_pack_a_size = self._lib.rlx_gemm_pack_a_size
        self.gemm_pack_b_size = self._lib.rlx_gemm_pack_b_size
        self._lib.rlx_gemm_avx512.restype = i64
        self.gemm_avx512 = bool(self._lib.rlx_gemm_avx512())
        self.gather_axis = self._lib.rlx_gather_axis  # (x, idx, y, outer, n_in, n_out, inner, itemsize, threads)
        self.gather_axis.argtypes = [p, p, p, *[i64] * 6]
        self.gather_axis.restype = None
        self.resize_taps = self._lib.rlx_resize_taps  # (x, idx, w, y, outer, n_in, n_out, inner, taps, threads)
        self.resize_taps.argtypes = [p, p, p, p, *[i64] * 6]
        self.resize_taps.restype = None
        self.transpose = self._lib.rlx_transpose  # (x, y, batch, rows, cols, threads): 4-byte elements
        self.transpose.argtypes = [p, p, *[i64] * 4]
        self.transpose.restype = None
        self.half_to_float = self._lib.rlx_half_to_float  # (x, y, n, threads)
        self.half_to_float.argtypes = [p, p, i64, i64]
        self.half_to_float.restype = None
        self.float_to_half = self._lib.rlx_float_to_half  # (x, y, n, threads): to nearest even
        self.float_to_half.argtypes = [p, p, i64, i64]
        self.float_to_half.restype = None
        self.plane_reduce = self._lib.rlx_plane_reduce  # (x, y, n, hw, c, kind, bf16, threads)
        self.plane_reduce.argtypes = [p, p, *[i64] * 6]
        self.plane_reduce.restype = None
        self.packed = self._lib.rlx_packed  # (int64 args[]): native.c's RLX_PK_* kernels
        self.packed.argtypes = [p]
        self.packed.restype = i64
        for kernel, fn in enumerate((self.gemm, self.gemv, self.softmax, self.layer_norm, self.im2col, self.pool2d,
                                     self.pool2d_padded, self.depthwise, self.depthwise_lanes, self.conv_direct,
                                     self.region, self.conv_gemm, self.group_conv, self.gather_axis,
                                     self.resize_taps, self.transpose, self.plane_reduce, self.group_conv_lanes,
                                     self.pool_to_nhwc, self.depthwise_nhwc),
                                    start=1):
            ccall.register_packed(fn, self.packed, kernel)
        self._lib.rlx_set_max_threads.argtypes = [i64]
        self._lib.rlx_set_max_threads.restype = None
        self._lib.rlx_openmp.restype = i64
        self.openmp = bool(self._lib.rlx_openmp())
        if self.openmp and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)
        self._lib.rlx_bind_team.argtypes = [i64]
        self._lib.rlx_bind_team.restype = i64
        self.team_check = self._lib.rlx_team_check  # () -> 1 where the workers were pinned again
        self.team_check.argtypes = []
        self.team_check.restype = i64
        self.bound: int | None = None  # OpenMP workers pinned to a CPU each (bind_team), once known

    def bind_team(self, threads: int) -> int:
        """Pins OpenMP's worker threads (not the caller's) one to a CPU, once per process
        (native.c's ``rlx_bind_team`` says why), unless ``RLX_CPU_BIND=0``; how many were
        pinned."""
        if self.bound is None:
            from .settings import BIND

            off = not BIND.read()
            self.bound = 0 if off or threads < 2 else int(self._lib.rlx_bind_team(threads))
            log.debug("rlx-cpu: %d OpenMP worker thread(s) pinned to a CPU each", self.bound)
        return self.bound

    def check_team(self) -> None:
        """Before a run: pin the workers again where the caller moved onto one's CPU
        (``rlx_team_check`` says why; a sched_getcpu where it has not)."""
        if self.bound:
            self.team_check()

    def threads(self) -> int:
        """Threads a region may use: the cores this process may run on (1 without OpenMP),
        at most the cap in force while an executable binds its steps (``thread_cap``)."""
        if not self.openmp:
            return 1
        try:
            cores = max(len(os.sched_getaffinity(0)), 1)
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        if self.bound is None and cores > 1:
            self.bind_team(cores)
        cap = _THREAD_CAP.get()
        return cores if cap is None else max(1, min(cores, cap))

    def threads_for(self, work: float, first: float, per: float | None = None) -> int:
        """Threads for a kernel of ``work`` (in the caller's units): one below ``first``
        (the work a fork-join is worth at all), else one for each ``per`` (default:
        ``first``) of it, at least two and at most ``threads()``. On 2 cores that is every
        core from ``first`` on; on 16 a small kernel takes a few threads instead of 16
        that mostly wait on each other (a 16-core Xeon ran squeezenet markedly faster with
        every kernel on 8 threads than on 16; measured: BENCHMARKS.md, sections 'Zoo on the
        H100 host: cuda, and rlx cpu on a 16-core Xeon (issue 17)' and 'Figures behind
        design choices (moved from docstrings, issue 32)')."""
        if work < first:
            return 1
        return max(1, min(self.threads(), max(2, int(work // (per or first)))))

    def _after_fork(self) -> None:
        self._lib.rlx_set_max_threads(1)


#: The cap on native threads while steps are bound (``threads.native_thread_cap``).
_THREAD_CAP: contextvars.ContextVar[int | None] = contextvars.ContextVar("rlx_cpu_thread_cap", default=None)


@contextlib.contextmanager
def thread_cap(cap: int | None) -> Iterator[None]:
    """Steps bound inside use at most ``cap`` native threads (``None``: every core)."""
    token = _THREAD_CAP.set(cap)
    try:
        yield
    finally:
        _THREAD_CAP.reset(token)


_STATE: dict[str, Any] = {}
_LOCK = threading.Lock()


def library() -> Native | None:
    """The native kernels, loaded on first call; None (and ``reason()`` says why) when they
    are off, were not built when the package was installed, or the library is refused.
    Asked per compile, so ``RLX_CPU_NATIVE`` can change; the library itself is loaded
    once per process."""
    if not wanted():
        return None
    with _LOCK:
        if "lib" not in _STATE:
            lib, why, info = _load(_DIRECTORY)
            _STATE.update(lib=lib, reason=why, info=info)
            if lib is None:
                log.warning("rlx-cpu: native kernels unavailable (%s); fused regions run with numpy", why)
            else:
                log.info("rlx-cpu: native kernels from %s (%s)", lib.path, describe_build(info))
        lib: Native | None = _STATE["lib"]
        return lib


def reason() -> str:
    """Why ``library()`` is None (``""`` when it is loaded or not asked for yet)."""
    if not wanted():
        return f"off: RLX_CPU_NATIVE={os.environ.get('RLX_CPU_NATIVE', '').strip()}"
    return str(_STATE.get("reason", ""))


def describe() -> str:
    """The probe's ``"native kernels"`` entry for ``rlx devices``: how the loaded library
    was built (``"built at install (gcc 12.2.0, AVX-512/AVX2/baseline clones, OpenMP)"``),
    or why the numpy kernels run instead. Loads the library (a dlopen, no compiler)."""
    if not wanted():
        return reason()
    lib = library()
    if lib is None:
        return f"{reason()}; numpy kernels"
    info = dict(_STATE.get("info") or {})
    info["openmp"] = lib.openmp  # what the library says, over the record
    return f"built at install ({describe_build(info)})"


def _load(directory: Path) -> tuple[Native | None, str, dict[str, Any]]:
    """The library in ``directory``, or None and why not, with the build's record."""
    info = read_info(directory)
    path = directory / library_name()
    if not path.is_file():
        if info.get("built") is False and info.get("error"):
            detail = f" ({info['detail']})" if info.get("detail") else ""
            return None, f"not built: {info['error']} when rlx-cpu was installed{detail}", info
        return None, f"not built: rlx-cpu was installed without {path.name} ({REBUILD})", info
    source = directory / "native.c"
    built_from = info.get("source_sha256")
    if built_from and source.is_file() and hashlib.sha256(source.read_bytes()).hexdigest() != built_from:
        return None, f"not loaded: {path.name} was built from another native.c than the one beside it ({REBUILD})", info
    try:
        return Native(str(path)), "", info
    except (OSError, AttributeError) as exc:  # AttributeError: a library without rlx's entry points
        return None, f"not loaded: {exc} ({REBUILD})", info
