"""OpenCL devices as rlx sees them: discovery, contexts, the program cache, the smoke test.

Device ``opencl:N`` is the N-th device counting over every platform in the order the ICD
loader lists them; bare ``opencl`` is the first GPU or accelerator if there is one, else
``opencl:0``. pyopencl is imported here, on first use, never when the plugin loads.

Programs are built once per (device, source hash) and kept by the ``DeviceRuntime``;
kernel objects are fetched once per launch with ``cl.Kernel(program, name)`` (a
``program.name`` lookup costs ~280 us per call on PoCL). Programs build with ``-w``: the
compiler's warnings (clang's, printed by PoCL straight to the process's stderr) are
about generated code the user cannot change, so they must not reach the terminal.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_core.errors import DeviceError

__all__ = ["import_pyopencl", "DeviceEntry", "list_devices", "default_index", "DeviceRuntime", "BuildError",
           "PROBE_SOURCE", "smoke_test", "short_platform", "build_log_head", "max_vector_bits",
           "BUILD_OPTIONS"]

#: The probe's kernel: small, but it exercises a vector type, a builtin and a store.
PROBE_SOURCE = """
__kernel void rlx_probe(__global const float* x, __global float* y) {
    const int i = get_global_id(0);
    const float4 v = (float4)(x[i], 1.0f, 2.0f, 3.0f);
    y[i] = dot(v, (float4)(2.0f, 0.0f, 0.0f, 0.0f)) + sqrt(4.0f);
}
"""

#: Options of every program build: ``-w``, a standard ``clBuildProgram`` option, inhibits warnings.
BUILD_OPTIONS = ("-w",)
#: LLVM CPU names without AVX-512 that an LLVM older than the CPU gives it: AMD's by
#: family (LLVM < 16 calls Zen 4 ``znver3``), and the generic fallbacks.
_CPUS_WITHOUT_AVX512 = ("znver1", "znver2", "znver3", "generic", "x86-64", "x86-64-v2", "x86-64-v3")


class BuildError(DeviceError):
    """An OpenCL program failed to build; the message carries the build log's first lines."""


def import_pyopencl() -> Any:
    """``pyopencl``, imported now (a separate function so tests can pretend it is missing)."""
    return importlib.import_module("pyopencl")


@dataclass(frozen=True)
class DeviceEntry:
    """One OpenCL device: its rlx index, the platform and device objects, and names."""

    index: int
    platform: Any
    device: Any

    @property
    def name(self) -> str:
        return str(self.device.name).strip()

    @property
    def is_gpu(self) -> bool:
        cl = import_pyopencl()
        return bool(self.device.type & (cl.device_type.GPU | cl.device_type.ACCELERATOR))

    def describe(self) -> str:
        """``pthread-Intel(R) Xeon(R) (PoCL, OpenCL 3.0 PoCL 3.0-rc2 ..., driver 3.0-rc2)``."""
        version = str(self.device.version).strip()
        return f"{self.name} ({short_platform(self.platform)}, {version}, driver {self.device.driver_version})"

    @property
    def has_fp64(self) -> bool:
        return "cl_khr_fp64" in str(self.device.extensions) or bool(getattr(self.device, "double_fp_config", 0))

    @property
    def vector_bits(self) -> int:
        """The widest vectors the generated kernels may use on this device (``max_vector_bits``)."""
        lanes = int(getattr(self.device, "native_vector_width_float", 0) or 0)
        return max_vector_bits(str(self.device.version), lanes)


def max_vector_bits(device_version: str, native_float_lanes: int) -> int:
    """512 (``float16`` vectors), or 256 where the device's compiler mishandles 512-bit ones.

    PoCL's CPU device takes its built-in library and its vector widths from the host's
    CPUID (AVX-512: ``native_vector_width_float`` 16) but compiles kernels for the CPU
    name its LLVM gives the host, shown at the end of the device version
    (``OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-znver3``). An LLVM older than
    the CPU names it without AVX-512 (LLVM 14 calls a Zen 4 EPYC ``znver3``); then every
    512-bit vector that crosses a builtin has two ABIs (clang warns "AVX vector return of
    type 'float16' without 'avx512f' enabled changes the ABI"), at the first launch
    PoCL's code generation aborts ("LLVM ERROR: Cannot select"), segfaults or hangs for
    minutes (issue 18), and PoCL's disk cache keeps such programs without their kernels
    (the next process gets INVALID_KERNEL_NAME). 256-bit vectors have one ABI there, and
    lose little: Zen 4 executes AVX-512 as two 256-bit halves.
    """
    if native_float_lanes < 16 or "HSTR:" not in device_version:
        return 512
    target = device_version.split("HSTR:", 1)[1].strip()
    if any(target.endswith("-" + cpu) for cpu in _CPUS_WITHOUT_AVX512):
        return 256
    return 512


def short_platform(platform: Any) -> str:
    name = str(platform.name).strip()
    return "PoCL" if name == "Portable Computing Language" else name


def list_devices(cl: Any) -> list[DeviceEntry]:
    """Every device of every platform, numbered in order. Raises what pyopencl raises when
    there is no ICD or no platform; a platform whose device query fails is skipped."""
    entries: list[DeviceEntry] = []
    for platform in cl.get_platforms():
        try:
            devices = platform.get_devices()
        except Exception:  # a platform with no devices raises DEVICE_NOT_FOUND: not fatal
            continue
        for device in devices:
            entries.append(DeviceEntry(len(entries), platform, device))
    return entries


def default_index(entries: list[DeviceEntry]) -> int:
    """The device bare ``opencl`` means: the first GPU or accelerator, else the first."""
    for e in entries:
        if e.is_gpu:
            return e.index
    return 0


def build_log_head(exc: BaseException, lines: int = 5) -> str:
    """The first non-empty lines of a build failure's message (the compiler's log)."""
    text = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    interesting = [ln for ln in text if "error" in ln.lower()] or text
    return " | ".join(interesting[:lines])


class DeviceRuntime:
    """One device's context and its cache of built programs (thread-safe).

    Executables create their own command queue on the shared context, so concurrent
    runs of different executables never wait on each other's ``finish``.
    """

    def __init__(self, entry: DeviceEntry) -> None:
        self.cl = import_pyopencl()
        self.entry = entry
        self.device = entry.device
        self.context = self.cl.Context([entry.device])
        self._programs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.has_fp64 = entry.has_fp64
        self.vector_bits = entry.vector_bits

    def program(self, source: str) -> Any:
        """The built program for ``source``, built once per (device, source hash)."""
        key = hashlib.sha256(source.encode()).hexdigest()
        with self._lock:
            prg = self._programs.get(key)
        if prg is not None:
            return prg
        prg = self.build(source)
        with self._lock:
            return self._programs.setdefault(key, prg)

    def build(self, source: str) -> Any:
        """Build ``source`` for this device (``BUILD_OPTIONS``); ``BuildError`` with the log's head."""
        cl = self.cl
        with warnings.catch_warnings():  # pyopencl's "non-empty compiler output" warning
            warnings.simplefilter("ignore", getattr(cl, "CompilerWarning", Warning))
            try:
                return cl.Program(self.context, source).build(options=list(BUILD_OPTIONS))
            except cl.Error as exc:
                log = build_log_head(exc)
                if "unknown target CPU" in log:
                    log += (" (this driver's LLVM does not know this CPU; a driver built on a newer LLVM runs "
                            "here: Debian's and Ubuntu's pocl-opencl-icd names a Zen 5 EPYC skylake-avx512)")
                raise BuildError(f"OpenCL build failed on {self.entry.describe()}: {log}") from exc

    def queue(self) -> Any:
        return self.cl.CommandQueue(self.context)


def smoke_test(runtime: DeviceRuntime, source: str | None = None) -> None:
    """Build and run the probe kernel (``PROBE_SOURCE`` unless ``source``); raise
    ``BuildError`` or ``RuntimeError`` on failure."""
    cl = runtime.cl
    prg = runtime.build(PROBE_SOURCE if source is None else source)
    x = np.arange(8, dtype=np.float32)
    y = np.empty_like(x)
    mf = cl.mem_flags
    xb = cl.Buffer(runtime.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    yb = cl.Buffer(runtime.context, mf.WRITE_ONLY, y.nbytes)
    queue = runtime.queue()
    kernel = cl.Kernel(prg, "rlx_probe")
    kernel.set_args(xb, yb)
    cl.enqueue_nd_range_kernel(queue, kernel, (8,), None)
    cl.enqueue_copy(queue, y, yb)
    queue.finish()
    want = x * 2 + 2
    if not np.allclose(y, want):
        raise RuntimeError(f"the probe kernel computed {y.tolist()}, expected {want.tolist()}")
