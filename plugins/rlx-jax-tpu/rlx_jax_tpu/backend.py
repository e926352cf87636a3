"""The two backends, ``tpu`` and ``jax``: one implementation, two targets.

Names, priorities, labels and op claims come without importing jax. ``probe`` imports
it, asks for the target platform's devices and runs a tiny jitted computation on the
first one, the way JAX's own ``xla_bridge`` starts a backend on first use: a platform
that is missing is a normal "unavailable, because ..." answer, never an exception.
``compile`` hands the graph to ``executable.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from typing import Any, ClassVar

import numpy as np

from rlx_core import Availability, Backend, CompileOptions, CostModel, DeviceError, Executable
from rlx_core.ir import Graph, Node
from rlx_core.plugin import DTYPES, OP_EXTENSIONS

__all__ = ["XlaBackend", "JaxBackend", "TpuBackend", "CLAIMED_OPS", "guess_default_platform"]

#: The ops ``lowering.py`` has a rule for (a test keeps the two equal), composites included:
#: XLA expresses each exactly. Listed by name so that claiming costs no jax import. The
#: core's internal ops (``gemm``, ``fused_elementwise``) are not claimed: XLA fuses on its
#: own, so legalization hands this backend the plain ops.
CLAIMED_OPS: frozenset[str] = frozenset(
    """matmul add sub mul div pow maximum minimum neg abs exp log sqrt rsqrt erf tanh sin cos tan asin acos atan sinh
    cosh asinh acosh atanh sigmoid relu gelu
    softmax layer_norm reduce_sum reduce_mean reduce_max reshape transpose concat slice gather cast where
    equal less greater conv2d max_pool2d avg_pool2d global_avg_pool2d attention floor ceil round fmod bitwise_and
    bitwise_or bitwise_xor bitwise_not bit_shift_left bit_shift_right""".split()
)
_CLAIMED = CLAIMED_OPS


def _jax_platforms_env() -> str:
    return os.environ.get("JAX_PLATFORMS", "").strip()


def guess_default_platform() -> str | None:
    """JAX's default platform as far as it can be told without importing jax, else ``None``.

    ``JAX_PLATFORMS`` names it when set; with no JAX plugin (``jax_plugins``, which is how
    the CUDA, ROCm and Metal plugins install) and no ``libtpu``, jax has only its cpu
    platform. Anything else is known only once jax is started (``probe`` says it).
    """
    env = _jax_platforms_env()
    if env:
        return env.split(",")[0].strip().lower() or None
    if importlib.util.find_spec("jax_plugins") is None and importlib.util.find_spec("libtpu") is None:
        return "cpu"
    return None


def _no_preallocation_in_child() -> None:
    """In rlx's probe/calibration child, JAX must not reserve 75% of the GPU's memory up
    front (its default): the parent process and the other devices' children share that
    GPU, and a second reservation fails. Never changed in the user's own process."""
    from rlx_core.plugin import in_isolation_child

    if in_isolation_child() and "jax" not in sys.modules:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _env_note() -> str:
    env = _jax_platforms_env()
    return f"JAX_PLATFORMS={env}" if env else "JAX_PLATFORMS unset"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _versions(jax: Any) -> dict[str, str]:
    versions = {"jax": str(jax.__version__)}
    try:
        import jaxlib

        versions["jaxlib"] = str(jaxlib.__version__)
    except (ImportError, AttributeError):
        versions["jaxlib"] = "unknown"
    env = _jax_platforms_env()
    if env:
        versions["JAX_PLATFORMS"] = env
    return versions


def _platforms_here(jax: Any) -> list[str]:
    """The platforms JAX started here (``cpu``, ``gpu``, ``tpu`` ...), for reasons."""
    try:
        from jax.extend import backend as jex_backend

        return sorted(jex_backend.backends())
    except Exception:
        try:
            return sorted({d.platform for d in jax.devices()})
        except Exception:
            return []


def _free_memory(device: Any) -> int | None:
    """Bytes XLA's allocator can still give on an accelerator (``memory_stats``: its limit
    less what is in use), ``None`` on the cpu platform (host memory, checked by the core)
    or when the runtime does not say."""
    if getattr(device, "platform", "cpu") == "cpu":
        return None
    try:
        stats = device.memory_stats() or {}
        free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    except Exception:
        return None
    return free if free > 0 else None


def _persistent_cache_note() -> str:
    """Where JAX's persistent compilation cache is, or why there is none (``rlx devices
    --explain`` shows it with the probe's answer), deciding it as a compile would."""
    from .persistent_cache import persistent_cache_reason

    return persistent_cache_reason()


def _smoke_test(jax: Any, device: Any) -> None:
    """A tiny jitted computation on ``device``; raises if it fails or computes nonsense."""
    x = np.arange(8, dtype=np.float32)
    got = np.asarray(jax.jit(lambda a: a * 2.0 + 1.0)(jax.device_put(x, device)))
    if not np.array_equal(got, x * 2.0 + 1.0):
        raise RuntimeError(f"a tiny jitted computation returned {got.tolist()}, expected {(x * 2 + 1).tolist()}")


class XlaBackend(Backend):
    """A backend on one JAX platform: ``platform`` names it, ``None`` is JAX's default.

    Subclasses set ``name``, ``label``, ``priority`` and ``platform``; everything else is
    shared. Instances are cheap (no jax import); ``probe`` and ``compile`` start jax.
    """

    platform: ClassVar[str | None] = None
    fuses_elementwise = True  # XLA fuses elementwise chains itself: the ranking prices them so
    #: Every dtype of the IR: XLA has the fixed-width integers, and bfloat16, float8 and the
    #: 4-bit ints as its own types (jax reads ml_dtypes arrays as they are).
    dtypes = frozenset(DTYPES)
    #: attention's ``nan_to_zero`` (torch's guarded SDPA softmax): one ``where`` XLA fuses.
    op_extensions = OP_EXTENSIONS

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._probed_platform: str | None = None

    # ------------------------------------------------------------------ facts
    def target_platform(self) -> str | None:
        """The platform graphs run on: the probe's answer once probed, else the best
        guess without importing jax (``None``: unknown until probed)."""
        return self.platform or self._probed_platform or guess_default_platform()

    def devices(self) -> list[Any]:
        """JAX's devices of the target platform (imports jax; raises when there are none)."""
        import jax

        return list(jax.devices(self.platform) if self.platform else jax.devices())

    def device(self, index: int | None) -> Any:
        devices = self.devices()
        i = 0 if index is None else index
        if not 0 <= i < len(devices):
            raise DeviceError(f"device {self.name}:{i} does not exist; JAX sees {len(devices)} "
                              f"{devices[0].platform} device(s) ({self.name}:0 to {self.name}:{len(devices) - 1})")
        return devices[i]

    # ------------------------------------------------------------------ contract
    def probe(self) -> Availability:
        _no_preallocation_in_child()
        try:
            jax = importlib.import_module("jax")
        except ImportError as exc:
            return Availability(False, f"jax is not installed: pip install jax ({exc})")
        versions = _versions(jax)
        try:
            devices = self.devices()
        except Exception as exc:
            return Availability(False, self._why_no_devices(jax, exc), versions=versions)
        platform = devices[0].platform
        versions["platform"] = platform
        try:
            _smoke_test(jax, devices[0])
        except Exception as exc:
            return Availability(False, f"a tiny jitted computation failed on {devices[0]} ({platform}, "
                                       f"{_env_note()}): {_first_line(exc)}", versions=versions)
        self._probed_platform = platform
        kind = getattr(devices[0], "device_kind", platform)
        reason = f"platform {platform}: {len(devices)} x {kind} ({_env_note()}); {_persistent_cache_note()}"
        return Availability(True, reason, devices=[f"{self.name}:{i}" for i in range(len(devices))],
                            versions=versions, memory_bytes=_free_memory(devices[0]))

    def probed(self, answer: Availability) -> None:
        """The platform JAX started in the probe's child process, for ``claims`` and the
        default cost model here (a GPU host is not priced as a cpu)."""
        platform = answer.versions.get("platform") if answer.available else None
        if platform:
            self._probed_platform = platform

    def _why_no_devices(self, jax: Any, exc: BaseException) -> str:
        here = ", ".join(_platforms_here(jax)) or "none"
        if self.platform is None:
            return f"JAX could not start its default platform ({_env_note()}): {_first_line(exc)}"
        reason = f"JAX sees no {self.platform.upper()}; JAX platforms here: {here} ({_env_note()})"
        if self.platform == "tpu" and importlib.util.find_spec("libtpu") is None:
            reason += "; libtpu is not installed (on a TPU VM: pip install -U jax libtpu)"
        return reason

    def supported_ops(self) -> frozenset[str]:
        return _CLAIMED

    def claims(self, node: Node) -> bool | str:
        if node.op.value not in _CLAIMED:
            return False
        if node.dtype == "float64" and self.target_platform() == "tpu":
            return "float64 is not supported by XLA on TPU (cast to float32)"
        return True

    def default_cost_model(self) -> CostModel:
        """Figures per platform, for ranking before calibration. The whole graph is one
        XLA executable, so a node costs little dispatch (fused kernels), while a run pays
        one jit call; elementwise chains fuse, which the higher effective bandwidth on
        cpu stands for. On a GPU that call, with numpy in and out, costs far more: 250 µs
        stands for it, about what a calibrated H100 measured (jax 0.11), where the previous
        default of 30 µs ranked JAX above rlx-cuda on most zoo models, which rlx-cuda ran up
        to three times faster (measured: BENCHMARKS.md, section 'Zoo on the H100 host: cuda,
        and rlx cpu on a 16-core Xeon (issue 17)')."""
        platform = self.target_platform()
        if platform in ("gpu", "cuda", "rocm"):
            return CostModel(device=self.name, sgemm_gflops=15_000.0, memory_bw_gbps=900.0,
                             dispatch_overhead_ns=1_000.0, roundtrip_overhead_ns=250_000.0, transfer_bw_gbps=12.0,
                             source="rlx-jax-tpu defaults for JAX on gpu")
        if platform == "tpu":
            return CostModel(device=self.name, sgemm_gflops=40_000.0, memory_bw_gbps=1_200.0,
                             dispatch_overhead_ns=500.0, roundtrip_overhead_ns=60_000.0, transfer_bw_gbps=8.0,
                             source="rlx-jax-tpu defaults for JAX on tpu")
        threads = os.cpu_count() or 1
        return CostModel(device=self.name, sgemm_gflops=20.0 * min(threads, 8), memory_bw_gbps=25.0,
                         dispatch_overhead_ns=200.0, roundtrip_overhead_ns=20_000.0, transfer_bw_gbps=0.0,
                         num_threads=threads,
                         source=f"rlx-jax-tpu defaults for JAX on {platform or 'cpu'}")

    def calibrate(self, quick: bool = False) -> CostModel:
        _no_preallocation_in_child()
        return super().calibrate(quick=quick)

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        from .executable import JaxExecutable

        return JaxExecutable(graph, self.device(options.device_index), backend=self.name, options=options)

    def compile_symbolic(self, graph: Graph, options: CompileOptions) -> Executable | None:
        """Shape buckets (``rlx_core.buckets``): XLA compiles for static shapes, so a new
        size runs on the program compiled for its bucket (powers of two, or the sizes in
        ``options.extra["buckets"]``), padded and masked where that is exact; a new length
        inside a bucket never compiles."""
        from rlx_core.buckets import bucketed

        return bucketed(graph, options, self.compile, self.claims)


class JaxBackend(XlaBackend):
    """Device ``jax``: JAX's default platform, whatever it is (cpu here, gpu on a CUDA
    host), so that the XLA path is useful and tested everywhere."""

    name = "jax"
    label = "JAX/XLA (default platform)"
    priority = 40
    platform = None

    def __init__(self) -> None:
        super().__init__()
        guess = guess_default_platform()
        if guess:  # an instance attribute: the registry reads it once, at discovery
            self.label = f"JAX/XLA ({guess})"  # type: ignore[misc]


class TpuBackend(XlaBackend):
    """Device ``tpu``: Cloud TPU through JAX; available only where JAX sees TPU devices."""

    name = "tpu"
    label = "Google TPU (JAX/XLA)"
    priority = 100
    platform = "tpu"
