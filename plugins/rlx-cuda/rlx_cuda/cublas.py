"""A cuBLAS handle of the executable's own, called through ctypes.

CuPy refuses every cuBLAS call while a stream is being captured ("calling cuBLAS API
during stream capture is currently unsupported": it cannot vouch for the workspace
cuBLAS would use), which would keep every graph with a product out of CUDA graphs. A
handle of our own, bound once to the executable's stream, with a workspace allocated up
front (``cublasSetWorkspace``), is safe to capture, and a call through it costs a few
microseconds of Python instead of CuPy's wrapper.

The library is the ``libcublas`` CuPy already loaded (found in ``/proc/self/maps``), else
the usual sonames. When none loads, ``CupyBlas`` issues the same calls through CuPy's
wrapper (the graph then runs without CUDA graphs, and the report says why).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import weakref
from typing import Any

__all__ = ["Blas", "CtypesBlas", "CupyBlas", "open_blas", "workspace_bytes"]

_c_int, _vp, _ll = ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong
_SIGNATURES: dict[str, list[Any]] = {
    "cublasCreate_v2": [ctypes.POINTER(_vp)],
    "cublasDestroy_v2": [_vp],
    "cublasSetStream_v2": [_vp, _vp],
    "cublasSetWorkspace_v2": [_vp, _vp, ctypes.c_size_t],
    "cublasGemmEx": [_vp, _c_int, _c_int, _c_int, _c_int, _c_int, _vp, _vp, _c_int, _c_int, _vp, _c_int, _c_int,
                     _vp, _vp, _c_int, _c_int, _c_int, _c_int],
    "cublasGemmStridedBatchedEx": [_vp, _c_int, _c_int, _c_int, _c_int, _c_int, _vp, _vp, _c_int, _c_int, _ll,
                                   _vp, _c_int, _c_int, _ll, _vp, _vp, _c_int, _c_int, _ll, _c_int, _c_int, _c_int],
}
_SONAMES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so")
_DLLS = ("cublas64_13.dll", "cublas64_12.dll", "cublas64_11.dll")
_lib: ctypes.CDLL | None = None
_lib_error: str | None = None
_lib_lock = threading.Lock()


def workspace_bytes(major: int) -> int:
    """cuBLAS's recommended workspace for a compute capability's major version: 32 MiB on
    Hopper and newer, 4 MiB before."""
    return (32 if major >= 9 else 4) << 20


def _loaded_cublas() -> str | None:
    """The path of the libcublas already mapped into this process (Linux), if any."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if "/libcublas.so" in path and os.path.exists(path):
                    return path
    except OSError:
        return None
    return None


def _load(cp: Any) -> ctypes.CDLL:
    global _lib, _lib_error
    with _lib_lock:
        if _lib is not None:
            return _lib
        if _lib_error is not None:
            raise OSError(_lib_error)
        cp.cuda.device.get_cublas_handle()  # CuPy loads its libcublas: use that same one
        names = [p for p in (_loaded_cublas(),) if p] + list(_DLLS if sys.platform == "win32" else _SONAMES)
        errors = []
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                for fn, args in _SIGNATURES.items():
                    getattr(lib, fn).argtypes = args
                    getattr(lib, fn).restype = ctypes.c_int
            except (OSError, AttributeError) as exc:
                errors.append(f"{name}: {exc}")
                continue
            _lib = lib
            return lib
        _lib_error = "no loadable libcublas (" + "; ".join(errors[:3]) + ")"
        raise OSError(_lib_error)


class Blas:
    """The two GEMM entry points the planned products use (cuBLAS's argument order)."""

    capturable = False
    why_not = ""

    def gemm_ex(self, *args: Any) -> None:
        raise NotImplementedError

    def gemm_strided_batched_ex(self, *args: Any) -> None:
        raise NotImplementedError


class CtypesBlas(Blas):
    """An owned cuBLAS handle bound to one stream, with its own workspace (capturable)."""

    capturable = True

    def __init__(self, lib: ctypes.CDLL, stream_ptr: int, workspace: Any) -> None:
        self._lib = lib
        handle = _vp()
        self._check("cublasCreate_v2", lib.cublasCreate_v2(ctypes.byref(handle)))
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.cublasDestroy_v2, handle)
        self._workspace = workspace  # kept alive as long as the handle
        self._check("cublasSetStream_v2", lib.cublasSetStream_v2(handle, _vp(stream_ptr)))
        self._check("cublasSetWorkspace_v2",
                    lib.cublasSetWorkspace_v2(handle, _vp(workspace.data.ptr), workspace.nbytes))

    @staticmethod
    def _check(name: str, status: int) -> None:
        if status != 0:
            raise RuntimeError(f"{name} failed with cuBLAS status {status}")

    def gemm_ex(self, *args: Any) -> None:
        self._check("cublasGemmEx", self._lib.cublasGemmEx(self._handle, *args))

    def gemm_strided_batched_ex(self, *args: Any) -> None:
        self._check("cublasGemmStridedBatchedEx", self._lib.cublasGemmStridedBatchedEx(self._handle, *args))


class CupyBlas(Blas):
    """The same calls through CuPy's wrapper and handle (not capturable)."""

    def __init__(self, cp: Any, why_not: str) -> None:
        from cupy_backends.cuda.libs import cublas

        self._cublas = cublas
        self._handle_of = cp.cuda.device.get_cublas_handle
        self.why_not = why_not

    def gemm_ex(self, *args: Any) -> None:
        self._cublas.gemmEx(self._handle_of(), *args)

    def gemm_strided_batched_ex(self, *args: Any) -> None:
        self._cublas.gemmStridedBatchedEx(self._handle_of(), *args)


def open_blas(cp: Any, stream_ptr: int, workspace: Any) -> Blas:
    """A capturable handle on ``stream_ptr`` when libcublas loads through ctypes, else CuPy's."""
    try:
        return CtypesBlas(_load(cp), stream_ptr, workspace)
    except (OSError, RuntimeError) as exc:
        return CupyBlas(cp, f"cuBLAS through CuPy, which refuses it during CUDA graph capture ({exc})")
