"""The ``cuda`` backend: probe, claims, cost model, calibration and compile.

Cheap to create (the registry does so at discovery): CuPy is imported by ``probe``,
``compile`` and ``calibrate`` only, through ``probe.import_cupy``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import rlx_core
from rlx_core.errors import DeviceError
from rlx_core.ir.ops import OpKind

from . import probe as probing
from .costmodel import cost_model_from_device, generic_cost_model
from .kernels_claims import CLAIMED_OPS, EPILOGUE_DTYPE_CHANGES, unrendered_ops

if TYPE_CHECKING:
    from rlx_core.ir import Graph, Node

    from .executable import CudaExecutable

__all__ = ["CudaBackend"]

#: DeviceInfo fields the probe's answer carries (as strings) for the default cost model.
_COST_PROPERTIES = ("total_memory", "sm_count", "clock_khz", "memory_clock_khz", "memory_bus_bits")


class CudaBackend(rlx_core.Backend):
    """NVIDIA GPUs through CuPy: cuBLAS for matmul and attention, cuDNN for conv2d (with
    its bias and relu fused where it can; im2col + cuBLAS without cuDNN), generated CUDA
    kernels for elementwise regions, reductions, softmax, layer_norm, pooling and gather."""

    name = "cuda"
    label = "NVIDIA CUDA (CuPy)"
    priority = 90
    api_version = rlx_core.PLUGIN_API_VERSION

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._probe: probing.ProbeResult | None = None
        self._caches: dict[int, Any] = {}
        self._probed_device: probing.DeviceInfo | None = None

    # ------------------------------------------------------------------ probe
    def probe_result(self) -> probing.ProbeResult:
        """The probe's full answer (devices and their properties), computed once."""
        with self._lock:
            if self._probe is None:
                self._probe = probing.probe_cuda()
            return self._probe

    def probe(self) -> rlx_core.Availability:
        result = self.probe_result()
        if not result.available:
            return rlx_core.Availability(False, result.reason, versions=dict(result.versions))
        devices = [f"cuda:{d.index}" for d in result.devices]
        versions = dict(result.versions)
        first = result.devices[0]
        versions["memory"] = f"{first.total_memory / 2**30:.1f} GiB"
        # What default_cost_model needs, for the process the probe's child reports to (probed).
        versions.update({key: str(getattr(first, key)) for key in _COST_PROPERTIES})
        return rlx_core.Availability(True, devices=devices, versions=versions, memory_bytes=result.free_memory)

    def probed(self, answer: rlx_core.Availability) -> None:
        """The device properties found by a probe in a child process: the default cost
        model here prices this GPU, not an unknown one."""
        v = answer.versions
        if not answer.available or "device" not in v:
            return
        try:
            props = {key: int(v[key]) for key in _COST_PROPERTIES}
        except (KeyError, ValueError):
            return
        self._probed_device = probing.DeviceInfo(0, v["device"], v.get("compute_capability", "0.0"), **props)

    def settings(self) -> tuple[rlx_core.plugin.Setting, ...]:
        """``RLX_CUDA_CUDNN`` (``cudnn.py``): parsed by every ``rlx`` command up front."""
        from .cudnn import CUDNN

        return (CUDNN,)

    # ------------------------------------------------------------------ claims
    def supported_ops(self) -> frozenset[str]:
        """Exactly the ops with a kernel in ``kernels.py`` (``kernels_claims.CLAIMED_OPS``)."""
        return CLAIMED_OPS

    def claims(self, node: Node) -> bool | str:
        """The claimed ops, except a fused region holding an op ``codegen`` cannot write
        (the fusion pass asks before it builds one, so such ops keep their own nodes)."""
        if node.op.value not in CLAIMED_OPS:
            return False
        if node.op in (OpKind.FUSED_ELEMENTWISE, OpKind.FUSED_CONV):
            missing = unrendered_ops(node.attrs["program"])
            if missing:
                return f"rlx-cuda has no CUDA rendering of {', '.join(missing)} for a fused region"
        if node.op is OpKind.FUSED_CONV:
            changing = sorted({ins[0] for ins in node.attrs["program"]} & EPILOGUE_DTYPE_CHANGES)
            if changing:
                return f"rlx-cuda computes a convolution's epilogue in its output buffer; {', '.join(changing)} " \
                       "changes the dtype"
        return True

    # ------------------------------------------------------------------ cost
    def default_cost_model(self) -> rlx_core.CostModel:
        result = self._probe
        if result is not None and result.devices:
            return cost_model_from_device(result.devices[0], self.name)
        if self._probed_device is not None:
            return cost_model_from_device(self._probed_device, self.name)
        return generic_cost_model(self.name)

    def calibrate(self, quick: bool = False) -> rlx_core.CostModel:
        """The core's measurements (sgemm, bandwidth, launches) plus pinned host<->device copies."""
        from rlx_core.plugin import calibrate_backend, save_calibration

        from .costmodel import measure_transfer_gbps, with_transfer

        self._require()
        model = calibrate_backend(self, quick=quick)
        cp = probing.import_cupy()
        model = with_transfer(model, measure_transfer_gbps(cp, 0, quick))
        save_calibration(self, model)
        return model

    # ------------------------------------------------------------------ compile
    def _require(self) -> probing.ProbeResult:
        result = self.probe_result()
        if not result.available:
            raise DeviceError(f"cuda is unavailable here: {result.reason}")
        return result

    def compile(self, graph: Graph, options: rlx_core.CompileOptions) -> CudaExecutable:
        result = self._require()
        index = 0 if options.device_index is None else options.device_index
        if not 0 <= index < len(result.devices):
            known = ", ".join(f"cuda:{d.index} ({d.name})" for d in result.devices)
            raise DeviceError(f"no CUDA device {options.device or f'cuda:{index}'!r} here; devices: {known}")
        from .executable import CudaExecutable
        from .kernels import KernelCache

        cp = probing.import_cupy()
        with self._lock:
            cache = self._caches.get(index)
            if cache is None:
                cache = self._caches[index] = KernelCache(cp)
        return CudaExecutable(cp, graph, index, cache, options.extra, options.memory_plan)

    def compile_symbolic(self, graph: Graph, options: rlx_core.CompileOptions) -> rlx_core.Executable | None:
        """Shape buckets (``rlx_core.buckets``): a new size runs on the program compiled
        for its bucket (its kernels and CUDA graph; powers of two, or the sizes in
        ``options.extra["buckets"]``), padded and masked where that is exact; a new length
        inside a bucket captures nothing."""
        self._require()
        from rlx_core.buckets import bucketed

        return bucketed(graph, options, self.compile, self.claims)
