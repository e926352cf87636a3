"""The cpu backend's compiled kernels: ``native.c``, built on this host by its C compiler.

Why: numpy runs an elementwise region one ufunc at a time, each a pass over memory and
about a microsecond of call overhead, single-threaded. A compiled block interpreter runs
the whole region in one call per thread with its intermediates in L1 and every loop
vectorized (measured on the suite's 15-op chain over 1024x1024, 2-core AVX-512 host:
numpy blocks 5.5 ms, this 2.5 ms on two threads and 1.7 ms with MKL's vector math for
its tanh, exp and log, ONNX Runtime 3.4 ms). Like
PyTorch Inductor's C++ backend, rlx compiles on the host rather than shipping binaries:
the wheel stays pure Python and the code is built for the CPU it runs on (on x86-64 the
library carries AVX-512, AVX2 and baseline clones, the loader picks one).

How: the first compile that wants it (never ``import rlx_cpu`` or ``rlx devices``) looks
for the library in the kernel directory, keyed by the source's hash, the compiler and its
version, the flags and the platform; a JSON manifest beside it records the library's
SHA-256, checked before every load, so a torn or corrupt file is rebuilt with a
``CacheWarning`` rather than loaded. A miss builds it (about 4 s with gcc 12 for its
three clones, once per host) into a temporary file that is renamed into place, so two
processes building at once never see half a library. Without a compiler, or when the
build fails, the cpu backend keeps its numpy kernels and says why in the log
(``reason()``).

The kernel directory is ``RLX_KERNEL_DIR``, else ``rlx-kernels`` in the platform's user
cache directory: not under ``RLX_CACHE_DIR``, whose contract is JSON entries only (a
shared library is code, not an entry; PoCL and Triton keep theirs apart the same way).
Deleting the directory is always safe.

``RLX_CPU_NATIVE=0`` turns the native kernels off; ``RLX_CPU_CC`` (else ``CC``) names the
compiler (a gcc or clang driver; default: ``cc``, then ``gcc``, then ``clang``).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

from rlx_core.errors import CacheWarning
from rlx_core.plugin import JsonCache

__all__ = ["Native", "library", "reason", "describe", "wanted", "find_compiler", "kernel_dir", "thread_cap", "SOURCE",
           "FLAGS"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native.c")
#: -ffp-contract=fast: a * b + c as one fused multiply-add (ISO C mode turns that off;
#: the polynomials and the convolution are 1.4-1.7x faster with it, and more accurate).
FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math", "-fvisibility=hidden",
         "-fopenmp-simd", "-ffp-contract=fast")
#: The C side's interface version (``rlx_abi()``); a library reporting another is rebuilt.
ABI = 3
_SCHEMA = 1
_NAMESPACE = "cpu"
_BUILD_TIMEOUT_S = 300


def kernel_dir() -> Path:
    """Where compiled kernels live: ``RLX_KERNEL_DIR``, else ``rlx-kernels`` in the user cache dir."""
    configured = os.environ.get("RLX_KERNEL_DIR", "").strip()
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("rlx-kernels", appauthor=False))


def wanted() -> bool:
    """False when ``RLX_CPU_NATIVE`` turns the native kernels off."""
    return os.environ.get("RLX_CPU_NATIVE", "1").strip().lower() not in ("0", "off", "false", "no", "numpy")


def find_compiler() -> list[str] | None:
    """The compiler command: ``RLX_CPU_CC``, else ``CC``, else the first of cc, gcc, clang
    on the path; None when there is none."""
    for var in ("RLX_CPU_CC", "CC"):
        value = os.environ.get(var, "").strip()
        if value:
            cmd = shlex.split(value)
            return cmd if shutil.which(cmd[0]) else None
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return [path]
    return None


_VERSIONS: dict[tuple[str, ...], str] = {}


def _compiler_version(cmd: list[str]) -> str:
    """The first line of ``cmd --version`` (``"gcc (Debian 12.2.0-14) 12.2.0"``), once per process."""
    key = tuple(cmd)
    if key not in _VERSIONS:
        try:
            done = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=30, check=False)
            first = (done.stdout or done.stderr).strip().splitlines()
            _VERSIONS[key] = first[0].strip() if done.returncode == 0 and first else ""
        except (OSError, subprocess.SubprocessError):
            _VERSIONS[key] = ""
    return _VERSIONS[key]


def describe() -> str:
    """What builds the native kernels, for the probe's versions (``"cc (Debian 12.2.0) 12.2.0"``),
    or ``""`` when they are off or there is no working compiler. Builds nothing."""
    if not wanted():
        return ""
    cmd = find_compiler()
    return _compiler_version(cmd) if cmd else ""


class Native:
    """The loaded library: its entry points, typed once."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lib = ctypes.CDLL(path)
        abi = self._lib.rlx_abi
        abi.restype = ctypes.c_int64
        if abi() != ABI:
            raise OSError(f"{path} has interface {abi()}, this rlx-cpu needs {ABI}")
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
        self.softmax = self._lib.rlx_softmax  # (x, y, rows, len, stride, scale, threads)
        self.softmax.argtypes = [p, p, i64, i64, i64, f, i64]
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
        self.depthwise.argtypes = [p, p, p, p, p, *[i64] * 15]
        self.depthwise.restype = None
        self.pool2d = self._lib.rlx_pool2d  # (x, y, planes, h, w, kh, kw, sh, sw, dh, dw, oh, ow, is_max, threads)
        self.pool2d.argtypes = [p, p, *[i64] * 13]
        self.pool2d.restype = None
        # (x, wpk, bias, y, xp, c, h, w, o, kh, kw, pt, pl, oh, ow, threads)
        self.conv_direct = self._lib.rlx_conv_direct
        self.conv_direct.argtypes = [p, p, p, p, p, *[i64] * 11]
        self.conv_direct.restype = None
        self.conv_pack = self._lib.rlx_conv_pack  # (w, wpk, o, c, kh, kw)
        self.conv_pack.argtypes = [p, p, i64, i64, i64, i64]
        self.conv_pack.restype = None
        self._lib.rlx_set_max_threads.argtypes = [i64]
        self._lib.rlx_set_max_threads.restype = None
        self._lib.rlx_openmp.restype = i64
        self.openmp = bool(self._lib.rlx_openmp())
        if self.openmp and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def threads(self) -> int:
        """Threads a region may use: the cores this process may run on (1 without OpenMP),
        at most the cap in force while an executable binds its steps (``thread_cap``)."""
        if not self.openmp:
            return 1
        try:
            cores = max(len(os.sched_getaffinity(0)), 1)
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        cap = _THREAD_CAP.get()
        return cores if cap is None else max(1, min(cores, cap))

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


_STATE: dict[str, object] = {}
_LOCK = threading.Lock()


def library() -> Native | None:
    """The native kernels, built or loaded on first call; None (and ``reason()`` says why)
    when they are off, there is no compiler, or the build fails. Asked per compile, so
    ``RLX_CPU_NATIVE`` can change; the library itself is loaded once per process."""
    if not wanted():
        return None
    with _LOCK:
        if "lib" not in _STATE:
            log.info("rlx-cpu: loading the native kernels (built on first use: a few seconds)")
            lib, why = _load()
            _STATE["lib"], _STATE["reason"] = lib, why
            if lib is None:
                log.warning("rlx-cpu: native kernels unavailable (%s); fused regions run with numpy", why)
            else:
                log.info("rlx-cpu: native kernels from %s", lib.path)
        return _STATE["lib"]  # type: ignore[return-value]


def reason() -> str:
    """Why ``library()`` is None (``""`` when it is loaded or not asked for yet)."""
    if not wanted():
        return "RLX_CPU_NATIVE turns them off"
    return str(_STATE.get("reason", ""))


def _suffix() -> str:
    return {"win32": ".dll", "darwin": ".dylib"}.get(sys.platform, ".so")


def _load() -> tuple[Native | None, str]:
    cmd = find_compiler()
    if cmd is None:
        return None, "no C compiler found (set RLX_CPU_CC, or install gcc or clang)"
    version = _compiler_version(cmd)
    if not version:
        return None, f"the C compiler {cmd[0]!r} does not run ({shlex.join([*cmd, '--version'])} failed)"
    source = SOURCE.read_bytes()
    identity = {"source": hashlib.sha256(source).hexdigest(), "compiler": version, "command": cmd[0],
                "flags": list(FLAGS), "machine": platform.machine(), "platform": sys.platform, "abi": ABI}  # fmt: skip
    key = "rlx-cpu-" + hashlib.sha256(repr(sorted(identity.items())).encode()).hexdigest()[:24]
    cache = JsonCache(_NAMESPACE, schema=_SCHEMA, root=kernel_dir())
    final = cache.directory / (key + _suffix())
    entry = cache.get(key, identity)
    if entry is not None and final.is_file():
        if _sha256(final) == entry.get("sha256"):
            try:
                return Native(str(final)), ""
            except OSError as exc:
                why = f"it does not load ({exc})"
        else:
            why = "its SHA-256 differs from the manifest's (a torn or altered file)"
        warnings.warn(f"rlx cache: ignoring {final} because {why}; it will be rebuilt", CacheWarning, stacklevel=3)
    try:
        cache.directory.mkdir(parents=True, exist_ok=True)
        directory = cache.directory
    except OSError:  # an unwritable cache: build for this process only
        directory = Path(tempfile.mkdtemp(prefix="rlx-cpu-kernels-"))
    tmp = directory / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        error = _build(cmd, tmp)
        if error:
            return None, error
        digest = _sha256(tmp)
        target = directory / final.name
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    if directory == cache.directory:
        cache.put(key, identity, {"library": final.name, "sha256": digest})
    try:
        return Native(str(target)), ""
    except OSError as exc:
        return None, f"the built library does not load ({exc})"


def _build(cmd: list[str], out: Path) -> str:
    """Compile ``native.c`` into ``out``; ``""`` on success, else why not. OpenMP (for
    threads) needs the compiler's runtime (libgomp comes with gcc; clang's libomp often
    is not installed): without it regions run on one thread. Function clones (x86-64
    only) need gcc >= 11 or clang >= 14: an older compiler builds without them."""
    error = ""
    for extra in (("-fopenmp",), ("-fopenmp", "-DRLX_NO_CLONES"), (), ("-DRLX_NO_CLONES",)):
        argv = [*cmd, *FLAGS, *extra, "-o", str(out), str(SOURCE), "-lm"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{shlex.join(argv)} did not run: {exc}"
        if done.returncode == 0:
            return ""
        lines = (done.stderr or done.stdout).strip().splitlines()
        error = f"{shlex.join(argv)} failed: " + " | ".join(lines[:3])
    return error


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
