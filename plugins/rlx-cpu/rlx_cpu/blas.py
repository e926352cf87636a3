"""float32 matrix products through oneMKL's ``cblas_sgemm``, and erf and the normal CDF
(gelu) through its vector math, when the ``mkl`` wheel is installed (``pip install
'rlx-cpu[mkl]'``); numpy's own BLAS and rlx's numpy programs otherwise.

Why: numpy's wheels carry OpenBLAS, which on the products inference makes (a batch of
64-128 rows against a few hundred to a thousand columns) spends most of its time waking
its second thread and repacking the weights: oneMKL through this module ran each such
product faster, and large squares as fast. Below about a million multiply-adds OpenBLAS
alone wins, since there MKL's fixed cost per call outweighs its faster arithmetic, yet
every product goes to MKL once it is loaded: a small product left to numpy's OpenBLAS
wakes its pthreads pool, whose worker then spins on a core while the next native kernel
or MKL product wants both for OpenMP's team. Batch-1 conv nets make hundreds of such products:
with every product on MKL, mobilenet_v3_small and resnet18 ran two to five times as fast
as with those under a million multiply-adds left to numpy, and the suite's mlp,
transformer and cnn were unchanged (measured: BENCHMARKS.md, sections 'With the `mkl`
extra, and with another process busy (session 8)' and 'Figures behind design choices
(moved from docstrings, issue 32)').

How: the library is found next to the interpreter (where the wheel puts it), loaded with
``ctypes`` on the first compile that wants it (never at import or in ``rlx devices``) and
bound once. A product becomes one ``cblas_sgemm`` (or ``cblas_sgemm_batch_strided`` for a
stack of matrices whose layout is one stride per operand) with every argument fixed when
the plan is bound: shapes, transposes, leading dimensions, and the addresses of plan
buffers and residents. Only a caller's array has its address read per run, a small fixed
cost beside the call's (measured: BENCHMARKS.md, section 'Figures behind design choices
(moved from docstrings, issue 32)'); a caller's array that is not C-contiguous and
writable runs through ``numpy.matmul`` instead, so every input layout stays correct. A
single product whose B is a resident (weights: a param, a constant, or folded from them)
reads B packed once in MKL's own layout (``cblas_sgemm_pack``, then
``cblas_sgemm_compute``): sgemm otherwise copies B into that layout on every call. The
packed copy belongs to the executable and set_param repacks it in place
(``BuildContext.derived``).

Vector math: numpy has no erf; ``mathfn.py``'s float32 program takes 15 passes where
``vmsErf`` takes one call at about 1 ulp (``VML_HA``), several times faster, and gelu
becomes ``x * vmsCdfNorm(x)``, which more than halved the suite transformer's
feed-forward region (measured: BENCHMARKS.md, section 'Figures behind design choices
(moved from docstrings, issue 32)').

``RLX_CPU_BLAS=numpy`` keeps every product and function in numpy (``mkl`` is the default when the
library loads). MKL's own variables apply as usual (``MKL_NUM_THREADS``,
``MKL_THREADING_LAYER``); unset, MKL's threads are GNU OpenMP's where libgomp loads (see
``Mkl._choose_threading``), and ``KMP_BLOCKTIME`` (Intel's OpenMP) defaults to
``BLOCKTIME_MS``.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import openmp
from .ccall import bound_call
from .steps import Dyn, Step, aligned_empty

__all__ = ["Mkl", "mkl", "describe", "numpy_blas", "find_library", "matmul_step", "matmul_now", "vml_step", "MIN_MACS",
           "BLOCKTIME_MS", "VML_MODE"]

log = logging.getLogger(__name__)

#: Products of fewer multiply-adds (per matrix) stay with numpy: none, see the module
#: docstring (numpy's OpenBLAS pool must not run beside OpenMP's team).
MIN_MACS = 0
#: How long MKL's OpenMP threads spin after a product before they sleep, unless the
#: environment says otherwise. Intel's default is 200 ms: two inference calls a
#: millisecond apart keep the threads awake either way, but a 200 ms spin holds a core
#: long after the last call, which on a small host slows whatever runs next (another
#: library's thread pool, a second process). 20 ms keeps back-to-back calls as fast.
BLOCKTIME_MS = 20

_F32 = np.dtype(np.float32)
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_MKL_THREADING_GNU = 3  # MKL_THREADING_INTEL 0, SEQUENTIAL 1, PGI 2, GNU 3, TBB 4
_INT_MAX = 2**31 - 1  # MKL_INT of the LP64 interface libmkl_rt starts with


def _library_names() -> list[str]:
    if sys.platform == "win32":
        return ["mkl_rt.2.dll", "mkl_rt.dll"]
    if sys.platform == "darwin":
        return ["libmkl_rt.2.dylib", "libmkl_rt.dylib"]
    return ["libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"]


def find_library() -> str | None:
    """Where ``libmkl_rt`` is: the ``mkl`` wheel's files under this interpreter's prefix
    (``<prefix>/lib`` or ``<prefix>\\Library\\bin``), else the loader's search path."""
    dirs = [Path(p) / sub for p in dict.fromkeys((sys.prefix, sys.base_prefix)) for sub in ("lib", "Library/bin")]
    for d in dirs:
        for name in _library_names():
            if (d / name).is_file():
                return str(d / name)
    import ctypes.util

    return ctypes.util.find_library("mkl_rt")


def numpy_blas() -> str:
    """The BLAS numpy was built with (``"scipy-openblas 0.3.27"``), or ``""`` when unknown."""
    try:
        config = np.show_config(mode="dicts")  # numpy >= 1.26
    except Exception:  # older numpy, or a build without the information: not a reason to fail
        return ""
    deps = (config or {}).get("Build Dependencies", {})
    blas = deps.get("blas") or {}
    name, version = blas.get("name", ""), blas.get("version", "")
    return f"{name} {version}".strip()


def describe() -> str:
    """Which BLAS runs the products, and why not oneMKL, for the probe's versions:
    ``"oneMKL 2026.2.0 for float32 products; scipy-openblas 0.3.27 (numpy) for the rest"``,
    or numpy's BLAS with the reason oneMKL is not used. Cheap: nothing is loaded."""
    own = f"{numpy_blas() or 'its BLAS'} (numpy)"
    if not wanted():
        return f"{own}; oneMKL off: RLX_CPU_BLAS={os.environ.get('RLX_CPU_BLAS', '').strip()}"
    if find_library() is None:
        return f"{own}; oneMKL not installed (the rlx-cpu[mkl] extra, x86-64 Linux and Windows)"
    from importlib.metadata import PackageNotFoundError, version

    try:
        mkl_name = f"oneMKL {version('mkl')}"
    except PackageNotFoundError:  # a system MKL, not the wheel
        mkl_name = "oneMKL"
    return f"{mkl_name} for float32 products; {own} for the rest"


class Mkl:
    """A loaded ``libmkl_rt``: the two sgemm entry points, typed once."""

    def __init__(self, path: str) -> None:
        if "KMP_BLOCKTIME" not in os.environ:  # read by the OpenMP runtime when it starts
            os.environ["KMP_BLOCKTIME"] = str(BLOCKTIME_MS)
        self.path = path
        self._lib = ctypes.CDLL(path)
        i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
        self.sgemm = self._lib.cblas_sgemm
        self.sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
        self.sgemm.restype = None
        self.pack_size = self._lib.cblas_sgemm_pack_get_size  # (identifier, m, n, k) -> bytes
        self.pack_size.argtypes = [i, i, i, i]
        self.pack_size.restype = ctypes.c_size_t
        self.pack = self._lib.cblas_sgemm_pack  # (layout, identifier, trans, m, n, k, alpha, src, ld, dest)
        self.pack.argtypes = [i, i, i, i, i, i, f, p, i, p]
        self.pack.restype = None
        self.compute = self._lib.cblas_sgemm_compute  # (layout, transa, transb, m, n, k, a, lda, b, ldb, beta, c, ldc)
        self.compute.argtypes = [i, i, i, i, i, i, p, i, p, i, f, p, i]
        self.compute.restype = None
        self.sgemm_batch_strided = self._lib.cblas_sgemm_batch_strided
        self.sgemm_batch_strided.argtypes = [i, i, i, i, i, i, f, p, i, i, p, i, i, f, p, i, i, i]
        self.sgemm_batch_strided.restype = None
        self._vml: dict[str, Any] = {}
        self.threading = self._choose_threading()
        self.version = self._version()

    def _choose_threading(self) -> str:
        """GNU OpenMP (libgomp) for MKL's threads where it loads, unless the user chose.

        In the suite's process (ONNX Runtime, XLA and OpenBLAS pools beside it, on 2 cores),
        the MLP's time with Intel's OpenMP swung more than fourfold from run to run, while
        with libgomp it held steady (measured: BENCHMARKS.md, section 'Figures behind design
        choices (moved from docstrings, issue 32)'). libgomp cannot run a parallel region in
        a forked child of a process that ran one, so a forked child runs MKL on one thread
        (``_after_fork``) instead of hanging."""
        if "MKL_THREADING_LAYER" in os.environ or sys.platform != "linux":
            return os.environ.get("MKL_THREADING_LAYER", "intel").lower()
        if not openmp.loaded():
            return "intel"
        self._lib.MKL_Set_Threading_Layer(_MKL_THREADING_GNU)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)
        return "gnu"

    def _after_fork(self) -> None:
        self._lib.MKL_Set_Num_Threads(1)

    def max_threads(self) -> int:
        """Threads MKL's products may use now (``mkl_get_max_threads``)."""
        return int(self._lib.MKL_Get_Max_Threads())

    def local_threads(self, n: int) -> int:
        """Cap MKL to ``n`` threads for calls from this thread (``0``: MKL's global setting
        again); returns the previous local setting, to restore it. Cheap: no library walk."""
        return int(self._lib.MKL_Set_Num_Threads_Local(int(n)))

    def vml(self, name: str) -> Callable[..., None]:
        """``vms<name>(n, x, r, mode)``, the float32 vector-math function, typed on first use."""
        fn = self._vml.get(name)
        if fn is None:
            fn = getattr(self._lib, f"vms{name}")
            fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
            fn.restype = None
            self._vml[name] = fn
        return fn

    def _version(self) -> str:
        buf = ctypes.create_string_buffer(256)
        try:
            self._lib.MKL_Get_Version_String(buf, len(buf))
        except AttributeError:  # pragma: no cover - every oneMKL has it
            return "oneMKL"
        return buf.value.decode(errors="replace").strip()


_LOADED: dict[str, Mkl | None] = {}
_LOCK = threading.Lock()


def wanted() -> bool:
    """False when ``RLX_CPU_BLAS=numpy`` (or ``openblas``, ``off``, ``0``) keeps every
    product and vector function in numpy, MKL installed or not."""
    from .settings import BLAS

    return bool(BLAS.read())


def mkl() -> Mkl | None:
    """The process's oneMKL, loaded on first call; None when it is not installed, does not
    load, or ``RLX_CPU_BLAS=numpy``. Checked per compile, so the variable can change."""
    if not wanted():
        return None
    with _LOCK:
        if "lib" not in _LOADED:
            path = find_library()
            lib = None
            if path is not None:
                try:
                    lib = Mkl(path)
                    log.info("rlx-cpu: float32 products through %s (%s)", lib.version, path)
                except (OSError, AttributeError) as exc:  # a broken install: numpy still works
                    log.warning("rlx-cpu: %s did not load (%s); products stay with numpy", path, exc)
            _LOADED["lib"] = lib
        return _LOADED["lib"]


# ------------------------------------------------------------------------ layouts
def _matrix_layout(rows: int, cols: int, s_rows: int, s_cols: int) -> tuple[int, int] | None:
    """``(transpose flag, leading dimension)`` of a (rows, cols) float32 matrix with these
    byte strides: row-major (``NoTrans``) or column-major (``Trans``), else None."""
    if (cols == 1 or s_cols == 4) and (rows == 1 or (s_rows % 4 == 0 and s_rows // 4 >= cols)):
        return _NO_TRANS, s_rows // 4 if rows > 1 else max(cols, 1)
    if (rows == 1 or s_rows == 4) and (cols == 1 or (s_cols % 4 == 0 and s_cols // 4 >= rows)):
        return _TRANS, s_cols // 4 if cols > 1 else max(rows, 1)
    return None


def _batch_stride(shape: tuple[int, ...], strides: tuple[int, ...], batch: tuple[int, ...]) -> int | None:
    """The one element stride between consecutive matrices of ``batch`` (row-major order)
    in an operand of ``shape`` broadcast to it, or None if there is no single stride."""
    lead = len(batch) - (len(shape) - 2)
    step: int | None = None
    span = 1  # matrices per step of the axis being looked at
    for axis in range(len(batch) - 1, -1, -1):
        k = axis - lead
        d = batch[axis]
        s = strides[k] if k >= 0 and shape[k] > 1 else 0
        if d > 1:
            if s % 4:
                return None
            if step is None:
                step = s // 4 // span if span else 0
                if step * span * 4 != s:
                    return None
            elif s != step * span * 4:
                return None
        span *= d
    return step or 0


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 4
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


class _Operand:
    """How one operand enters the call: layout and batch stride (its address is filled in
    by ``bound_call``)."""

    __slots__ = ("batch_stride", "ld", "trans")

    def __init__(self, x: Any, rows: int, cols: int, batch: tuple[int, ...]) -> None:
        if isinstance(x, Dyn):  # laid out C-contiguously, checked every run
            strides = _contiguous_strides(tuple(x.shape))
        else:
            if not x.flags.aligned or any(s < 0 for s in x.strides):
                raise _NoFit
            strides = x.strides
        shape = tuple(x.shape)
        layout = _matrix_layout(rows, cols, strides[-2], strides[-1])
        stride = _batch_stride(shape, strides, batch)
        if layout is None or stride is None or layout[1] > _INT_MAX or stride > _INT_MAX:
            raise _NoFit
        self.trans, self.ld = layout
        self.batch_stride = stride


class _NoFit(Exception):
    """An operand layout cblas cannot take as it is: the product stays with numpy."""


def _numpy_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.matmul(a, b, out=out)


def _numpy_matmul_b(b: np.ndarray) -> Callable[[np.ndarray, np.ndarray], None]:
    """The numpy fallback of a product whose B is packed (the call's operands are a, out)."""
    def run(a: np.ndarray, out: np.ndarray) -> None:
        np.matmul(a, b, out=out)

    return run


#: Vector-math accuracy: VML_HA (about 1 ulp), errors ignored (no errno traffic; NaN and
#: inf come out as IEEE says, as numpy's do).
VML_MODE = 0x2 | 0x100


def vml_step(name: str, x: Any, out: Any, fallback: Callable[[np.ndarray, np.ndarray], None]) -> Step | None:
    """``out = <name>(x)`` elementwise through MKL's vector math (``vmsErf``,
    ``vmsCdfNorm``...) for float32 arrays of one shape, laid out contiguously; None when
    MKL is not here or the arrays do not fit (the caller builds numpy steps instead).
    ``fallback(x, out)`` computes the same with numpy, for a caller's array MKL cannot
    take on some run."""
    lib = mkl()
    if lib is None or x.dtype != _F32 or out.dtype != _F32 or tuple(x.shape) != tuple(out.shape):
        return None
    n = math.prod(out.shape)
    if n > _INT_MAX or any(not isinstance(v, Dyn) and not (v.flags.c_contiguous and v.flags.aligned) for v in (x, out)):
        return None
    return bound_call(lib.vml(name), [n, 0, 0, VML_MODE], (x, out), (1, 2), fallback)


def matmul_step(a: Any, b: Any, out: Any, ctx: Any = None) -> Step:
    """``out = a @ b`` as one step: an MKL sgemm when the library is there and the product
    fits (float32, big enough, layouts cblas takes), else ``numpy.matmul``. With ``ctx``
    (a ``BuildContext``) and ``b`` a resident (weights), ``b`` is packed once into MKL's
    own layout and the product reads that (see ``_packed``)."""
    lib = mkl()
    if lib is not None:
        try:
            return _mkl_step(lib, a, b, out, ctx)
        except _NoFit:
            pass
    return Step(np.matmul, (a, b, out))


#: An identifier for ``cblas_sgemm_pack``: the operand packed is B.
_PACK_B, _PACKED = 162, 151


#: Pack B only for products of at most this many rows: there the copy sgemm makes of B on
#: every call is a large share of the work (an 8-row product ran markedly faster packed,
#: on the 2-core Zen 3), while from 64 rows on the packed call ran no faster than the
#: plain one (measured: BENCHMARKS.md, sections 'Load + compile time against ORT's session
#: creation (issue 35 item 5, session 17)' and 'Figures behind design choices (moved from
#: docstrings, issue 32)').
PACK_MAX_M = 32
#: ...and only when the packed copy is not much bigger than B: oneMKL 2026.2 packs a 1 MB
#: B into 7.1 MB, and spends compile time doing it (about 6 MB more than B at every size
#: measured), so packing every weight of a 2-layer BERT took 110 MB more. A 1024 x 1024 B
#: packs into 2.3x its size (measured: BENCHMARKS.md, section 'Load + compile time against
#: ORT's session creation (issue 35 item 5, session 17)').
PACK_MAX_GROWTH = 2.5


def _packed(lib: Mkl, b: np.ndarray, pb: _Operand, m: int, n: int, k: int, ctx: Any) -> np.ndarray | None:
    """``b`` packed by ``cblas_sgemm_pack`` for products with ``m`` rows, as an array the
    executable owns and refreshes when ``set_param`` changes ``b`` (``ctx.derived``); None
    when ``b`` is not a resident, or packing would not pay (``PACK_MAX_M``,
    ``PACK_MAX_GROWTH``): packing saves the copy sgemm makes of its B operand on every
    call, which matters for few rows only (ONNX Runtime prepacks the same way)."""
    derived = getattr(ctx, "derived", None)
    if derived is None or m > PACK_MAX_M:
        return None
    size = int(lib.pack_size(_PACK_B, m, n, k))
    if size > PACK_MAX_GROWTH * b.nbytes:
        return None

    def make(src: np.ndarray, dest: np.ndarray | None) -> np.ndarray:
        if dest is None:
            dest = aligned_empty(-(-size // 4), np.float32)
        lib.pack(_ROW_MAJOR, _PACK_B, pb.trans, m, n, k, 1.0, src.ctypes.data, pb.ld, dest.ctypes.data)
        return dest

    return derived(b, ("sgemm_pack_b", m, n, k, pb.trans, pb.ld), make)


#: Products of at most this many multiply-adds in all that ``matmul_now`` leaves to numpy:
#: every matrix of them under OpenBLAS's threshold for a second thread (its ``m * n * k``
#: below 4 x 65536), and small enough that a call's overhead is most of its time.
SMALL_MACS = 1 << 18


def matmul_now(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ b`` now, float32 (batched alike, a transposed view taken as it lies):
    oneMKL's sgemm or strided batch sgemm where it is loaded and takes the operands, else
    numpy. For products whose sizes are known only at run time (``anysize.py``): no step
    is built, nothing is packed. Small ones go to numpy: an attention's per-head products
    over a few tokens (16 of 9 x 64 @ 64 x 9) took 4.6 µs there and 17 µs through oneMKL's
    batch call (its Python and its threads' start), below the size where OpenBLAS, under
    numpy, starts threads of its own (``SMALL_MACS``: one thread each, nothing to spin)."""
    if out.ndim >= 2 and a.ndim >= 2 and out.size * a.shape[-1] <= SMALL_MACS:
        np.matmul(a, b, out=out)
        return
    lib = mkl()
    if lib is not None:
        try:
            m, n, k, count, pa, pb, pc = _product(a, b, out)
            if 0 in (m, n, k, count):
                raise _NoFit
        except _NoFit:
            pass
        else:
            if count == 1:
                lib.sgemm(_ROW_MAJOR, pa.trans, pb.trans, m, n, k, 1.0, a.ctypes.data, pa.ld, b.ctypes.data, pb.ld,
                          0.0, out.ctypes.data, pc.ld)
            else:
                lib.sgemm_batch_strided(_ROW_MAJOR, pa.trans, pb.trans, m, n, k, 1.0, a.ctypes.data, pa.ld,
                                        pa.batch_stride, b.ctypes.data, pb.ld, pb.batch_stride, 0.0, out.ctypes.data,
                                        pc.ld, pc.batch_stride, count)
            return
    np.matmul(a, b, out=out)


def _product(a: Any, b: Any, out: Any) -> tuple[int, int, int, int, _Operand, _Operand, _Operand]:
    """``(m, n, k, batch count, A, B, C)`` of a float32 ``out = a @ b`` as cblas takes it;
    ``_NoFit`` where it does not (another dtype, sizes past its ints, a C not row-major,
    every matrix written to one place)."""
    if a.dtype != _F32 or b.dtype != _F32 or out.dtype != _F32 or a.ndim < 2 or b.ndim < 2:
        raise _NoFit
    m, n = out.shape[-2:]
    k = a.shape[-1]
    batch = tuple(out.shape[:-2])
    if m * n * k < MIN_MACS or max(m, n, k) > _INT_MAX or math.prod(batch) > _INT_MAX:
        raise _NoFit
    ops = (_Operand(a, m, k, batch), _Operand(b, k, n, batch), _Operand(out, m, n, batch))
    c = ops[2]
    if c.trans != _NO_TRANS:  # cblas writes C row-major only
        raise _NoFit
    count = math.prod(batch)
    if count > 1 and c.batch_stride == 0:  # every matrix written to one place: not a product
        raise _NoFit
    return m, n, k, count, ops[0], ops[1], c


def _mkl_step(lib: Mkl, a: Any, b: Any, out: Any, ctx: Any = None) -> Step:
    m, n, k, count, pa, pb, c = _product(a, b, out)
    packed = _packed(lib, b, pb, m, n, k, ctx) if count == 1 and not isinstance(b, Dyn) else None
    if packed is not None:
        args = [_ROW_MAJOR, pa.trans, _PACKED, m, n, k, 0, pa.ld, packed.ctypes.data, pb.ld, 0.0, 0, c.ld]
        return bound_call(lib.compute, args, (a, out), (6, 11), _numpy_matmul_b(b), keep=(packed, b))
    if count == 1:
        fn = lib.sgemm
        args: list[Any] = [_ROW_MAJOR, pa.trans, pb.trans, m, n, k, 1.0, 0, pa.ld, 0, pb.ld, 0.0, 0,
                           c.ld]
        positions = (7, 9, 12)
    else:
        fn = lib.sgemm_batch_strided
        args = [_ROW_MAJOR, pa.trans, pb.trans, m, n, k, 1.0, 0, pa.ld, pa.batch_stride, 0, pb.ld,
                pb.batch_stride, 0.0, 0, c.ld, c.batch_stride, count]
        positions = (7, 10, 14)
    return bound_call(fn, args, (a, b, out), positions, _numpy_matmul)
