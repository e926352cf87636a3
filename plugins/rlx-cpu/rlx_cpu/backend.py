"""The cpu backend: numpy on the host, every op claimed, the universal fallback."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

import rlx_core
from rlx_core.errors import DeviceError
from rlx_core.plugin import DTYPES, OP_EXTENSIONS

if TYPE_CHECKING:
    from rlx_core.ir import Graph

    from .executor import CpuExecutable

__all__ = ["CpuBackend"]


class CpuBackend(rlx_core.Backend):
    """numpy on the host CPU, with float32 products on oneMKL and elementwise regions,
    softmax, norms and pools on the native kernels built with the package (``native.c``)
    when those are there. Claims every op, composites included: softmax, layer_norm, gelu,
    sigmoid, rsqrt, reduce_mean, global_avg_pool2d and attention run fused."""

    name = "cpu"
    label = "CPU (numpy)"
    priority = 0
    api_version = rlx_core.PLUGIN_API_VERSION
    dtypes = frozenset(DTYPES)
    op_extensions = OP_EXTENSIONS

    def probe(self) -> rlx_core.Availability:
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        b = np.arange(6, dtype=np.float32).reshape(3, 2)
        got = a @ b
        if not np.array_equal(got, np.array([[10, 13], [28, 40]], np.float32)):
            why = f"numpy {np.__version__} computed a wrong 2x3 @ 3x2 matmul: {got.tolist()}"
            return rlx_core.Availability(False, why)
        # Which kernels and which BLAS run, and why not the faster ones (``rlx devices
        # --explain``; also part of the calibration's identity, so a change recalibrates:
        # never what this process measured, which a probe in this process would see and
        # one in a child would not).
        from . import blas, conv_choice, gemm, layout, native, onednn, openmp  # numpy and ctypes only: times nothing

        versions = {"numpy": np.__version__, "blas": blas.describe(), "native kernels": native.describe(),
                    "gemm": gemm.describe(measured=False), "convolutions": conv_choice.describe(measured=False),
                    "onednn": onednn.describe(measured=False), "layout": layout.describe(),
                    "precision": onednn.describe_precisions(),
                    "openmp": openmp.describe(measured=False)}
        return rlx_core.Availability(True, devices=["cpu"], versions=versions)

    def supported_ops(self) -> frozenset[str]:
        """Every op the executor has a kernel for: all the IR's ops, composites included.
        An op the core adds later (an internal op of a new pass) is claimed only once a
        kernel exists; until then legalization expands it into ops that have one."""
        from .executor import kernel_ops  # numpy-only modules; asked when devices are listed, not at import

        return kernel_ops()

    def skipped_passes(self) -> frozenset[str]:
        """``conv_scale`` where chains of convolutions go channels-last on oneDNN here
        (``layout.chains_planned``): the core moves a squeeze-excitation gate into the
        projection's weights, which then change per run, so that convolution falls back
        to NCHW and breaks its block's chain twice (reorders out and back in).
        efficientnet_b0 at batch 1 ran 7.3 ms with the pass and 6.3-6.5 ms without it
        (batch 8: the same, 48-50 ms; efficientnet_b1 and mobilenet_v3_large at batch 1:
        a tie; BENCHMARKS.md, section 'Squeeze-excitation gates on channels-last chains
        (issue 35, session 24)', with its 'Outside the zoo' figures)."""
        from . import layout  # numpy and ctypes only; loads nothing

        return frozenset({"conv_scale"}) if layout.chains_planned() else frozenset()

    def settings(self) -> tuple[rlx_core.plugin.Setting, ...]:
        """``RLX_CPU_BLAS``, ``RLX_CPU_NATIVE``, ``RLX_CPU_GEMM``, ``RLX_CPU_CONV`` and
        ``RLX_CPU_BIND`` (``settings.py``): parsed by every ``rlx`` command up front."""
        from .settings import SETTINGS

        return SETTINGS

    def default_cost_model(self) -> rlx_core.CostModel:
        cores = os.cpu_count() or 1
        return rlx_core.CostModel(
            device=self.name,
            sgemm_gflops=30.0 * cores,
            # Activations of inference-sized layers mostly live in cache; and the same
            # host memory must not be ranked slower here than under another CPU backend's
            # defaults (JAX on cpu: 25): at 10, efficientnet_b0 was priced within 10% of
            # JAX on cpu, which ran it 3x slower (the zoo, 2-core Zen 4).
            memory_bw_gbps=25.0,
            dispatch_overhead_ns=1_500.0,
            roundtrip_overhead_ns=3_000.0,
            transfer_bw_gbps=0.0,  # host memory: nothing to copy in or out
            num_threads=cores,
            calibrated=False,
            source="rlx-cpu defaults",
        )

    def compile(self, graph: Graph, options: rlx_core.CompileOptions) -> CpuExecutable:
        if options.device_index not in (None, 0):
            raise DeviceError(f"cpu has one device (cpu or cpu:0), not {options.device!r}")
        from .executor import CpuExecutable

        return CpuExecutable(graph, precision=self._precision(options))

    def compile_symbolic(self, graph: Graph, options: rlx_core.CompileOptions) -> rlx_core.Executable | None:
        """One executable for every size (``anysize.py``): kernels that read their sizes per
        run, so a new sequence length costs no compile; ``None`` for graphs with
        convolutions or pools, which a plan per shape class serves better."""
        if options.device_index not in (None, 0):
            raise DeviceError(f"cpu has one device (cpu or cpu:0), not {options.device!r}")
        from .anysize import any_size_executable

        return any_size_executable(graph, self._precision(options))

    def precisions(self) -> frozenset[str]:
        """``bf16`` where the CPU has AMX or AVX512_BF16 and oneDNN is installed
        (``onednn.precisions``): convolutions and dense layers' products then take bf16
        operands where oneDNN runs them on a unit that pays here (``bf16_units``),
        accumulating in float32; nothing else changes."""
        from . import onednn  # ctypes and numpy only; loads nothing

        return onednn.precisions()

    def _precision(self, options: rlx_core.CompileOptions) -> str:
        """``options.precision`` where this host takes it, else fp32."""
        wanted = getattr(options, "precision", "fp32")
        if wanted == "fp32":  # every default compile: no question about the host asked
            return "fp32"
        return wanted if wanted in self.precisions() else "fp32"
