"""The cost model of a CUDA device: defaults from its properties, and calibration.

``default_cost_model`` reads what the probe found (SM count, clocks, memory bus) and
turns it into rates a kernel can reach: the fp32 peak (SMs x fp32 lanes per SM x 2 x
clock) scaled by what cuBLAS sgemm attains, and the memory bus's peak (2 transfers per
memory clock) scaled by what a streaming kernel attains. CUDA 13 no longer reports the
clocks; then the figures for the compute capability's typical part are used, and the
source says so. ``calibrate_cuda`` runs the core's generic calibration (sgemm, memory
bandwidth, launch overhead through this backend's own executables) and adds the host
link: pinned host-to-device and device-to-host copies.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import rlx_core

from .probe import DeviceInfo

__all__ = ["cost_model_from_device", "generic_cost_model", "fp32_lanes_per_sm", "measure_transfer_gbps"]

SGEMM_EFFICIENCY = 0.75  # cuBLAS sgemm on large squares reaches 70-80% of the fp32 peak
STREAM_EFFICIENCY = 0.8  # a copy kernel reaches ~80-90% of the DRAM peak
# A kernel of a compiled graph: compiled graphs replay as one captured CUDA graph unless
# copying their inputs and outputs through it costs more, and a replayed kernel costs far
# less than a launch from Python: 2 µs stands for a replayed one. Pricing each kernel as a
# CuPy launch from Python made the uncalibrated GPU lose most zoo models to JAX on the same
# GPU, which ran them up to three times slower (measured: BENCHMARKS.md, sections 'CUDA on
# an NVIDIA H100 (issue 8)' and 'Zoo on the H100 host: cuda, and rlx cpu on a 16-core Xeon (issue 17)').
DISPATCH_NS = 2_000.0
ROUNDTRIP_NS = 30_000.0  # upload, sync, download of a small run
PCIE_GBPS = 12.0  # pinned copies over PCIe 4 x16 in practice (PCIe 5 and NVLink hosts: calibrate)
# Typical (SM clock kHz, memory GB/s) of a compute capability's flagship, for CUDA 13
# runtimes that report no clocks.
_TYPICAL = {"7.0": (1_530_000, 900.0), "7.5": (1_590_000, 320.0), "8.0": (1_410_000, 2_000.0),
            "8.6": (1_700_000, 900.0), "8.9": (2_500_000, 1_000.0), "9.0": (1_980_000, 3_350.0),
            "10.0": (1_965_000, 8_000.0), "12.0": (2_600_000, 1_800.0)}


def fp32_lanes_per_sm(compute_capability: str) -> int:
    """FP32 lanes per SM of an architecture (CUDA programming guide, throughput table)."""
    major, _, minor = compute_capability.partition(".")
    cc = (int(major or 0), int(minor or 0))
    if cc in ((6, 1), (6, 2)) or cc[0] >= 9 or cc in ((8, 6), (8, 7), (8, 9)):
        return 128
    return 64


def generic_cost_model(device: str = "cuda") -> rlx_core.CostModel:
    """Figures for an unknown current GPU, used before the probe has run."""
    return rlx_core.CostModel(device=device, sgemm_gflops=15_000.0, memory_bw_gbps=700.0,
                              dispatch_overhead_ns=DISPATCH_NS, roundtrip_overhead_ns=ROUNDTRIP_NS,
                              transfer_bw_gbps=PCIE_GBPS, num_threads=1, calibrated=False,
                              source="rlx-cuda defaults (device not probed yet)")


def cost_model_from_device(info: DeviceInfo, device: str = "cuda") -> rlx_core.CostModel:
    """Uncalibrated figures for ``info``'s GPU (no measurement)."""
    typical_clock, typical_bw = _TYPICAL.get(info.compute_capability, (1_500_000, 700.0))
    guessed = []
    clock = info.clock_khz
    if clock <= 0:
        clock = typical_clock
        guessed.append("SM clock")
    sms = info.sm_count if info.sm_count > 0 else 80
    if info.sm_count <= 0:
        guessed.append("SM count")
    peak_gflops = sms * fp32_lanes_per_sm(info.compute_capability) * 2 * clock * 1e3 / 1e9
    if info.memory_clock_khz > 0 and info.memory_bus_bits > 0:
        peak_bw = 2 * info.memory_clock_khz * 1e3 * info.memory_bus_bits / 8 / 1e9
    else:
        peak_bw = typical_bw
        guessed.append("memory bandwidth")
    source = f"rlx-cuda defaults from the properties of {info.name} (sm_{info.compute_capability}, {sms} SMs)"
    if guessed:
        source += f"; {', '.join(guessed)} typical for sm_{info.compute_capability} (not reported)"
    return rlx_core.CostModel(device=device, sgemm_gflops=peak_gflops * SGEMM_EFFICIENCY,
                              memory_bw_gbps=peak_bw * STREAM_EFFICIENCY, dispatch_overhead_ns=DISPATCH_NS,
                              roundtrip_overhead_ns=ROUNDTRIP_NS, transfer_bw_gbps=PCIE_GBPS, num_threads=sms,
                              calibrated=False, source=source)


def measure_transfer_gbps(cp: Any, device_index: int, quick: bool) -> float:
    """The slower of pinned host-to-device and device-to-host copy rates, in GB/s."""
    import cupyx

    nbytes = (8 if quick else 64) << 20
    rounds = 3 if quick else 10
    with cp.cuda.Device(device_index):
        host = cupyx.empty_pinned((nbytes,), dtype="uint8")
        host[:] = 1
        dev = cp.empty((nbytes,), dtype="uint8")
        stream = cp.cuda.Stream(non_blocking=True)
        best_up = best_down = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            dev.set(host, stream=stream)
            stream.synchronize()
            t1 = time.perf_counter()
            dev.get(stream=stream, out=host)
            stream.synchronize()
            t2 = time.perf_counter()
            best_up, best_down = min(best_up, t1 - t0), min(best_down, t2 - t1)
    return nbytes / max(best_up, best_down) / 1e9


def with_transfer(model: rlx_core.CostModel, gbps: float) -> rlx_core.CostModel:
    return replace(model, transfer_bw_gbps=gbps, source=f"{model.source}; host link {gbps:.1f} GB/s measured")
