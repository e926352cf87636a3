"""The probe: can CUDA run here, on which devices, and if not, exactly why not.

Each way a host can fail gets its own reason, in the order a user fixes them:

1. CuPy is not installed (or fails to import, or several CuPy wheels share one ``cupy``);
2. no NVIDIA driver (``libcuda`` not found: CuPy reports driver version 0), or a driver
   older than the CUDA runtime CuPy was built for;
3. a driver but no device (``cudaErrorNoDevice``, a count of 0, an empty
   ``CUDA_VISIBLE_DEVICES``);
4. a device on which the smoke test fails: an elementwise kernel compiled by NVRTC and a
   cuBLAS sgemm, checked against numpy (a missing NVRTC or cuBLAS library is named).

CuPy is imported through ``import_cupy`` only, so ``import rlx_cuda`` and the plugin hook
never load it, and tests replace that one function to walk every path on any host.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ProbeResult", "DeviceInfo", "probe_cuda", "import_cupy", "format_cuda_version", "cupy_distributions"]

#: cudaError_t values the probe tells apart (stable across CUDA releases).
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_NOT_PERMITTED = 800
INSTALL_HINT = "pip install cupy-cuda12x (rlx-cuda depends on it; reinstall rlx-cuda)"
TOOLKIT_HINT = "install the CUDA 12 toolkit libraries, e.g. pip install 'rlx-cuda[ctk]'"


@dataclass(frozen=True)
class DeviceInfo:
    """What the cost model and the report need to know about one GPU."""

    index: int
    name: str
    compute_capability: str
    total_memory: int
    sm_count: int = 0
    clock_khz: int = 0
    memory_clock_khz: int = 0
    memory_bus_bits: int = 0


@dataclass(frozen=True)
class ProbeResult:
    """The probe's answer before it becomes an ``Availability``."""

    available: bool
    reason: str = ""
    kind: str = ""  # "", "not_installed", "import_failed", "no_driver", "old_driver", "no_device", "kernel_failed"
    devices: tuple[DeviceInfo, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)
    free_memory: int | None = None  # bytes free on cuda:0 after the test kernel (what a graph can have)


def import_cupy() -> Any:
    """``import cupy`` (the only place rlx-cuda does; tests replace this function)."""
    return importlib.import_module("cupy")


def format_cuda_version(v: int) -> str:
    """CUDA's integer versions (12090) as ``"12.9"``; 0 (no driver) as ``"none"``."""
    if not v:
        return "none"
    return f"{v // 1000}.{(v % 1000) // 10}"


def cupy_distributions() -> list[str]:
    """Installed distributions that provide the ``cupy`` package (``cupy-cuda12x`` ...)."""
    from importlib.metadata import distributions

    found = set()
    for dist in distributions():
        name = (dist.metadata.get("Name") or "").lower()
        if name == "cupy" or name.startswith(("cupy-cuda", "cupy-rocm")):
            found.add(name)
    return sorted(found)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _visible_devices_note() -> str:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return ""
    return f" (CUDA_VISIBLE_DEVICES={raw!r} hides the others)" if raw.strip() else " (CUDA_VISIBLE_DEVICES is empty)"


def _library_missing(exc: BaseException) -> str | None:
    """The CUDA library a failure says is missing (``nvrtc``, ``cublas``...), if any."""
    text = f"{type(exc).__name__} {exc}".lower()
    if "dynamiclibnotfound" in text or "cannot open shared object" in text or "failed to load" in text \
            or "no such file" in text:
        for lib in ("nvrtc", "cublaslt", "cublas", "cudart", "curand"):
            if lib in text:
                return lib
        return "a CUDA library"
    return None


def _device_info(cp: Any, index: int) -> DeviceInfo:
    props = cp.cuda.runtime.getDeviceProperties(index)
    name = props.get("name", b"")
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    return DeviceInfo(
        index=index,
        name=name or f"CUDA device {index}",
        compute_capability=f"{props.get('major', 0)}.{props.get('minor', 0)}",
        total_memory=int(props.get("totalGlobalMem", 0)),
        sm_count=int(props.get("multiProcessorCount", 0)),
        clock_khz=int(props.get("clockRate", 0) or 0),
        memory_clock_khz=int(props.get("memoryClockRate", 0) or 0),
        memory_bus_bits=int(props.get("memoryBusWidth", 0) or 0),
    )


def _smoke_test(cp: Any, index: int) -> str | None:
    """Run an NVRTC-compiled elementwise kernel and a cuBLAS sgemm on device ``index``;
    ``None`` when both are right, else what went wrong."""
    a_host = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = np.maximum(a_host @ a_host.T * 0.5, 1.0).astype(np.float32)
    with cp.cuda.Device(index):
        a = cp.asarray(a_host)
        scale = cp.ElementwiseKernel("float32 x, float32 s", "float32 y", "y = max(x * s, 1.0f)", "rlx_probe_scale")
        got = cp.asnumpy(scale(cp.matmul(a, a.T), np.float32(0.5)))
        cp.cuda.Device(index).synchronize()
    if not np.array_equal(got, want):
        return f"computed {got.tolist()} instead of {want.tolist()}"
    return None


def probe_cuda(importer: Any = None) -> ProbeResult:
    """Probe CUDA through CuPy; every failure becomes a reason (nothing is raised)."""
    try:
        cp = (importer or import_cupy)()
    except ImportError as exc:
        return ProbeResult(False, f"CuPy is not installed: {INSTALL_HINT} ({_first_line(exc)})", "not_installed")
    except Exception as exc:  # a broken install: CuPy itself raised while importing
        return ProbeResult(False, f"CuPy failed to import: {_first_line(exc)}", "import_failed")
    versions = {"cupy": str(getattr(cp, "__version__", "unknown"))}
    try:
        dists = cupy_distributions()
    except Exception:
        dists = []
    if len(dists) > 1:
        why = f"several CuPy wheels are installed ({', '.join(dists)}) into one 'cupy' package: keep one of them"
        return ProbeResult(False, why, "import_failed", versions=versions)
    runtime = cp.cuda.runtime
    try:
        runtime_version = int(runtime.runtimeGetVersion())
    except Exception:
        runtime_version = 0
    try:
        driver_version = int(runtime.driverGetVersion())
    except Exception:
        driver_version = 0
    versions["cuda_runtime"] = format_cuda_version(runtime_version)
    versions["cuda_driver"] = format_cuda_version(driver_version)
    built = f"CuPy {versions['cupy']} for CUDA {versions['cuda_runtime']}"
    try:
        count = int(runtime.getDeviceCount())
    except Exception as exc:
        status = _status(exc)
        if driver_version == 0:
            why = f"no NVIDIA driver: libcuda.so.1 was not found ({built}; {_first_line(exc)})"
            return ProbeResult(False, why, "no_driver", versions=versions)
        if status == CUDA_ERROR_INSUFFICIENT_DRIVER:
            why = (f"the NVIDIA driver is too old: it supports CUDA {versions['cuda_driver']}, {built} needs "
                   f"a newer one ({_first_line(exc)})")
            return ProbeResult(False, why, "old_driver", versions=versions)
        if status == CUDA_ERROR_NO_DEVICE:
            why = f"no CUDA device: the driver (CUDA {versions['cuda_driver']}) found no GPU{_visible_devices_note()}"
            return ProbeResult(False, why, "no_device", versions=versions)
        why = f"the CUDA driver failed to list devices: {_first_line(exc)} ({built})"
        return ProbeResult(False, why, "no_device" if status == CUDA_ERROR_NOT_PERMITTED else "no_driver",
                           versions=versions)
    if count <= 0:
        why = f"no CUDA device: the driver (CUDA {versions['cuda_driver']}) found no GPU{_visible_devices_note()}"
        return ProbeResult(False, why, "no_device", versions=versions)
    try:
        devices = tuple(_device_info(cp, i) for i in range(count))
    except Exception as exc:
        return ProbeResult(False, f"cannot read the properties of the CUDA devices: {_first_line(exc)}",
                           "kernel_failed", versions=versions)
    first = devices[0]
    versions["device"] = first.name
    versions["compute_capability"] = first.compute_capability
    try:
        wrong = _smoke_test(cp, 0)
    except Exception as exc:
        lib = _library_missing(exc)
        if lib is not None:
            why = (f"cannot load {lib} for the test kernel on cuda:0 ({first.name}): {TOOLKIT_HINT} "
                   f"({_first_line(exc)})")
        else:
            why = f"a test kernel failed on cuda:0 ({first.name}, sm_{first.compute_capability}): {_first_line(exc)}"
        return ProbeResult(False, why, "kernel_failed", devices, versions)
    if wrong is not None:
        why = f"a test kernel on cuda:0 ({first.name}) {wrong}: the device or driver is not working"
        return ProbeResult(False, why, "kernel_failed", devices, versions)
    from .cudnn import describe as describe_cudnn

    versions["cudnn"] = describe_cudnn()  # which way convolutions run (rlx devices --explain)
    try:
        with cp.cuda.Device(0):
            free = int(runtime.memGetInfo()[0])
    except Exception:  # the figure is a nicety: placement then assumes the whole device
        free = None
    return ProbeResult(True, "", "", devices, versions, free)
