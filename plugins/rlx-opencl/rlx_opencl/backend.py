"""The ``opencl`` backend: probe, claims, cost model and compile.

Cheap to create (the registry does so at discovery): pyopencl is imported by ``probe``,
``compile`` and the cost model. The label names the device once it is known: a probe
remembers it in rlx's cache, so the next process's discovery shows it without starting
OpenCL (``OpenCL: pthread-Intel(R) Xeon(R) Processor (PoCL)``).
"""

from __future__ import annotations

import logging
import math
import threading
import warnings
from typing import TYPE_CHECKING, Any

import rlx_core
from rlx_core.errors import CacheWarning, DeviceError
from rlx_core.ir.ops import OpKind
from rlx_core.plugin import CONTRACT_DTYPES, EXTENDED_DTYPES, JsonCache

from . import runtime as rt
from .codegen.common import MAX_INDEX

if TYPE_CHECKING:
    from rlx_core.ir import Graph, Node

    from .executable import OpenclExecutable

__all__ = ["OpenclBackend"]

log = logging.getLogger("rlx_opencl")

#: The ops with kernels here. Attention is left to the core, which decomposes it into
#: matmul (whose transposed form fuses k's transpose), softmax and elementwise ops.
_IMPLEMENTED = (
    "matmul add sub mul div pow maximum minimum neg abs exp log sqrt rsqrt erf tanh sin cos tan asin acos atan sinh "
    "cosh asinh acosh atanh floor ceil round sigmoid relu gelu softmax "
    "bitwise_and bitwise_or bitwise_xor bitwise_not bit_shift_left bit_shift_right "
    "layer_norm reduce_sum reduce_mean reduce_max reshape transpose concat slice gather cast where equal less "
    "greater conv2d max_pool2d avg_pool2d global_avg_pool2d"
).split()
_CLAIMED: frozenset[str] = frozenset(op for op in _IMPLEMENTED if op in {k.value for k in OpKind})
#: Ops whose result dtype does not tell their inputs' (a float64 input needs cl_khr_fp64 too).
_READS_ANY_DTYPE = frozenset({"cast", "equal", "less", "greater"})
_LABEL_CACHE = JsonCache("opencl-label", schema=1, what="the OpenCL device's name, for rlx devices (rlx-opencl)")
#: Which device bare ``opencl`` means, as the last probe found it for this set of devices:
#: the probe runs in a child process (rlx-core's isolation), and the process that then
#: compiles must take the device the probe found working, not the first listed.
_DEFAULT_CACHE = JsonCache("opencl-default", schema=1,
                           what="the OpenCL device bare 'opencl' means, as the probe found it (rlx-opencl)")


def _listing(entries: list[rt.DeviceEntry]) -> dict[str, Any]:
    return {"devices": [e.describe() for e in entries]}


def _kept_default(entries: list[rt.DeviceEntry]) -> int | None:
    """The default device the last probe found working for exactly these devices, or None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)  # another set of devices: the probe answers anew
        try:
            found = _DEFAULT_CACHE.get("default", _listing(entries))
        except Exception:
            return None
    index = found.get("index") if found else None
    return index if isinstance(index, int) and 0 <= index < len(entries) else None


def _keep_default(entries: list[rt.DeviceEntry], index: int) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWarning)
            _DEFAULT_CACHE.put("default", _listing(entries), {"index": index})
    except Exception as exc:  # then bare 'opencl' in another process means the first listed
        log.debug("rlx-opencl: cannot keep the default device: %s", exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class OpenclBackend(rlx_core.Backend):
    """OpenCL through pyopencl: one generated program per graph, on any OpenCL device
    (PoCL's CPU device where there is no GPU driver)."""

    name = "opencl"
    label = "OpenCL"
    priority = 50
    api_version = rlx_core.PLUGIN_API_VERSION
    #: The contract's six and the extended integers (OpenCL C's char ... ulong); not the
    #: storage formats, which would need conversions written by hand.
    dtypes = CONTRACT_DTYPES | frozenset(EXTENDED_DTYPES)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[rt.DeviceEntry] | None = None
        self._default: int = 0
        self._runtimes: dict[int, rt.DeviceRuntime] = {}
        cached = _LABEL_CACHE.get("label", {"backend": self.name})
        if cached and isinstance(cached.get("label"), str):
            self.label = cached["label"]  # type: ignore[misc]

    # ------------------------------------------------------------------ devices
    def devices(self) -> list[rt.DeviceEntry]:
        """Every OpenCL device here (imports pyopencl; raises what it raises)."""
        with self._lock:
            if self._entries is None:
                entries = rt.list_devices(rt.import_pyopencl())
                self._default = rt.default_index(entries) if entries else 0
                kept = _kept_default(entries)
                if kept is not None:
                    self._default = kept
                self._entries = entries
            return self._entries

    def entry(self, index: int | None) -> rt.DeviceEntry:
        entries = self.devices()
        if not entries:
            raise DeviceError("opencl: no OpenCL device here (the ICD loader lists no device on any platform)")
        i = self._default if index is None else index
        if not 0 <= i < len(entries):
            listing = ", ".join(f"opencl:{e.index} ({e.name})" for e in entries)
            raise DeviceError(f"device opencl:{i} does not exist; OpenCL devices here: {listing}")
        return entries[i]

    def runtime(self, index: int | None = None) -> rt.DeviceRuntime:
        """The context and program cache of device ``opencl:index`` (created once)."""
        entry = self.entry(index)
        with self._lock:
            found = self._runtimes.get(entry.index)
            if found is None:
                found = self._runtimes[entry.index] = rt.DeviceRuntime(entry)
            return found

    # ------------------------------------------------------------------ contract
    def probe(self) -> rlx_core.Availability:
        try:
            cl = rt.import_pyopencl()
        except ImportError as exc:
            return rlx_core.Availability(False, f"pyopencl is not installed: pip install 'pyopencl[pocl]' ({exc})")
        versions = {"pyopencl": str(getattr(cl, "VERSION_TEXT", "unknown"))}
        try:
            entries = self.devices()
        except Exception as exc:
            return rlx_core.Availability(False, f"no OpenCL platform: the ICD loader found none ({_first_line(exc)}); "
                                                "install a driver, or pip install 'pyopencl[pocl]' for a CPU device",
                                         versions=versions)
        if not entries:
            try:
                platforms = ", ".join(rt.short_platform(p) for p in cl.get_platforms()) or "none"
            except Exception:
                platforms = "none"
            return rlx_core.Availability(False, f"no OpenCL device: platforms {platforms} list no devices",
                                         versions=versions)
        for e in entries:
            versions[f"opencl:{e.index}"] = e.describe()
        default = self.entry(None)
        failed = self._first_failure(default)
        skipped: list[str] = []
        if failed is not None:
            # Another device may work where the default cannot: PoCL 3.0's LLVM refuses a
            # Zen 5 host ("unknown target CPU 'generic'") while Debian's PoCL 3.1, listed
            # beside it, runs there. Bare ``opencl`` then means the first that works.
            for other in sorted(entries, key=lambda e: (not e.is_gpu, e.index)):
                if other.index != default.index and self._first_failure(other) is None:
                    skipped.append(f"opencl:{default.index} skipped: {failed}")
                    with self._lock:
                        self._default = other.index
                    default, failed = other, None
                    break
        if failed is not None:
            return rlx_core.Availability(False, failed, versions=versions)
        _keep_default(entries, default.index)
        self._remember_label(default)
        devices = [f"opencl:{e.index}" for e in entries]
        listing = "; ".join(f"opencl:{e.index} = {e.name} ({rt.short_platform(e.platform)})" for e in entries)
        # A GPU's own memory bounds what a graph may need there (OpenCL tells the total, not
        # what is free); a CPU device computes in host memory, which the core checks itself.
        memory = int(default.device.global_mem_size) if default.is_gpu else None
        return rlx_core.Availability(True, "; ".join([listing, f"default opencl:{default.index}", *skipped]),
                                     devices=devices, versions=versions, memory_bytes=memory)

    def _first_failure(self, entry: rt.DeviceEntry) -> str | None:
        """Why ``entry`` cannot run rlx's kernels (the probe kernel, then a generated dense
        layer with softmax), or None where it can."""
        try:
            rt.smoke_test(self.runtime(entry.index))
        except rt.BuildError as exc:
            return f"the probe kernel failed to build on opencl:{entry.index}: {exc}"
        except Exception as exc:
            return f"the probe kernel failed on opencl:{entry.index} ({entry.name}): {_first_line(exc)}"
        try:
            self._check_generated_kernels(entry.index)
        except Exception as exc:
            return f"rlx's generated kernels failed on opencl:{entry.index} ({entry.name}): {_first_line(exc)}"
        return None

    def _check_generated_kernels(self, index: int) -> None:
        """Compile and run a dense layer with softmax through the real code generator
        (register-blocked vector matmul, elementwise, row reduction) and check it against
        numpy. A driver can run the tiny probe kernel yet fail on rlx's own kernels: PoCL
        on a Zen 4 host with an LLVM that calls it ``znver3`` aborted in code generation
        on every 512-bit vector (issue 18). The core runs this probe in a child process,
        so such a crash costs this device, not the caller's process; it costs ~0.1 s
        once PoCL has the program in its kernel cache."""
        import numpy as np

        from .executable import OpenclExecutable

        rng = np.random.default_rng(0)
        g = rlx_core.Graph("rlx_opencl_probe")
        x = g.input("x", (4, 24), "float32")
        w = g.constant(rng.standard_normal((24, 16)).astype(np.float32))
        b = g.constant(rng.standard_normal(16).astype(np.float32))
        g.set_outputs([g.softmax(g.relu(g.add(g.matmul(x, w), b)), axis=-1)])  # every op one it claims
        xv = rng.standard_normal((4, 24)).astype(np.float32)
        got = OpenclExecutable(g.freeze(), self.runtime(index)).run({"x": xv})[0]
        want = rlx_core.reference.evaluate(g, {"x": xv})[0]
        if not np.allclose(got, want, rtol=1e-4, atol=1e-6):
            raise DeviceError(f"a dense layer with softmax computed wrong values (max error "
                              f"{float(np.max(np.abs(got - want))):.3g})")

    def _remember_label(self, entry: rt.DeviceEntry) -> None:
        label = f"OpenCL: {entry.name} ({rt.short_platform(entry.platform)})"
        if label == self.label:
            return
        self.label = label  # type: ignore[misc]
        try:
            _LABEL_CACHE.put("label", {"backend": self.name}, {"label": label})
        except Exception as exc:  # a read-only cache only costs the nicer label next time
            log.debug("rlx-opencl: cannot cache the label: %s", exc)

    def supported_ops(self) -> frozenset[str]:
        return _CLAIMED

    def claims(self, node: Node) -> bool | str:
        if node.op.value not in _CLAIMED:
            return False
        if node.size > MAX_INDEX:
            return f"{node.size} elements is beyond the 32-bit indexing of rlx-opencl's kernels"
        reads_any = node.op.value in _READS_ANY_DTYPE  # its inputs' dtype is not on the node
        if (node.dtype == "float64" or reads_any) and not self._fp64():
            if node.dtype == "float64":
                return "float64 needs cl_khr_fp64, which the default OpenCL device does not offer"
            return (f"{node.op.value} may read float64, which needs cl_khr_fp64, and the default OpenCL device "
                    "does not offer it")
        return True

    def _fp64(self) -> bool:
        try:
            return self.entry(None).has_fp64
        except Exception:
            return False

    def default_cost_model(self) -> rlx_core.CostModel:
        """Figures from the device's compute units and clock: a CPU device (PoCL) does
        about 8 float32 flops per cycle per core with vectors, a GPU ~64 per unit."""
        try:
            entry = self.entry(None)
            units = max(int(entry.device.max_compute_units), 1)
            ghz = max(float(entry.device.max_clock_frequency), 100.0) / 1000.0
            gpu = entry.is_gpu
        except Exception:
            units, ghz, gpu = 1, 1.0, False
        if gpu:
            return rlx_core.CostModel(device=self.name, sgemm_gflops=64.0 * units * ghz, memory_bw_gbps=100.0,
                                      dispatch_overhead_ns=8_000.0, roundtrip_overhead_ns=40_000.0,
                                      transfer_bw_gbps=8.0, num_threads=units,
                                      source=f"rlx-opencl defaults: GPU, {units} units at {ghz:.2f} GHz")
        return rlx_core.CostModel(device=self.name, sgemm_gflops=max(8.0 * units * ghz, 1.0),
                                  memory_bw_gbps=math.sqrt(units) * 5.0, dispatch_overhead_ns=4_000.0,
                                  roundtrip_overhead_ns=40_000.0, transfer_bw_gbps=5.0, num_threads=units,
                                  source=f"rlx-opencl defaults: CPU, {units} units at {ghz:.2f} GHz")

    def compile(self, graph: Graph, options: rlx_core.CompileOptions) -> OpenclExecutable:
        from .executable import OpenclExecutable

        return OpenclExecutable(graph, self.runtime(options.device_index))

    def compile_symbolic(self, graph: Graph, options: rlx_core.CompileOptions) -> rlx_core.Executable | None:
        """Shape buckets (``rlx_core.buckets``): a new size runs on the kernels compiled
        for its bucket (powers of two, or the sizes in ``options.extra["buckets"]``),
        padded and masked where that is exact; a new length inside a bucket builds no
        program."""
        from rlx_core.buckets import bucketed

        return bucketed(graph, options, self.compile, self.claims)

    def describe_devices(self) -> list[dict[str, Any]]:
        """One dict per device (index, name, platform, version, default) for tools."""
        entries = self.devices()
        return [{"device": f"opencl:{e.index}", "name": e.name, "platform": rt.short_platform(e.platform),
                 "version": str(e.device.version).strip(), "default": e.index == self._default}
                for e in entries]
