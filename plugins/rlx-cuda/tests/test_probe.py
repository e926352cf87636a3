"""The unavailable paths, each with its own reason, on any host (CuPy faked where needed),
the real one of this host, and the pieces of the backend that need no GPU."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest

import rlx_core
from rlx_core.errors import ConfigError, DeviceError
from rlx_core.ir.ops import OpKind
from rlx_cuda import CudaBackend, rlx_backends
from rlx_cuda import probe as probing
from rlx_cuda.costmodel import cost_model_from_device, fp32_lanes_per_sm
from rlx_cuda.executable import parse_extra
from rlx_cuda.kernels_claims import CLAIMED_OPS


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int, msg: str) -> None:
        super().__init__(msg)
        self.status = status


def fake_cupy(*, driver: int = 12040, runtime: int = 12090, count: int | BaseException = 1,
              kernel_error: BaseException | None = None, wrong: bool = False) -> types.SimpleNamespace:
    """A numpy-backed stand-in for the parts of CuPy the probe touches."""

    def get_count() -> int:
        if isinstance(count, BaseException):
            raise count
        return count

    props = {"name": b"NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "totalGlobalMem": 80 * 2**30,
             "multiProcessorCount": 132, "clockRate": 1_980_000, "memoryClockRate": 2_619_000,
             "memoryBusWidth": 5120}
    rt = types.SimpleNamespace(runtimeGetVersion=lambda: runtime, driverGetVersion=lambda: driver,
                               getDeviceCount=get_count, getDeviceProperties=lambda i: props,
                               memGetInfo=lambda: (79 * 2**30, 80 * 2**30))

    class Device:
        def __init__(self, i: int) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def synchronize(self) -> None:
            pass

    def elementwise_kernel(in_params, out_params, body, name):
        if kernel_error is not None:
            raise kernel_error
        return lambda x, s: np.maximum(x * s + (1 if wrong else 0), np.float32(1.0)).astype(np.float32)

    return types.SimpleNamespace(
        __version__="14.2.0", cuda=types.SimpleNamespace(runtime=rt, Device=Device), asarray=np.asarray,
        asnumpy=np.asarray, matmul=np.matmul, ElementwiseKernel=elementwise_kernel,
    )


@pytest.fixture(autouse=True)
def _one_cupy(monkeypatch):
    monkeypatch.setattr(probing, "cupy_distributions", lambda: ["cupy-cuda12x"])


def test_import_and_hook_never_import_cupy():
    code = ("import sys, rlx_core, rlx_cuda; (b,) = rlx_cuda.rlx_backends(); b.supported_ops(); "
            "b.default_cost_model(); import rlx_cuda.kernels, rlx_cuda.executable, rlx_cuda.codegen; "
            "assert 'cupy' not in sys.modules, sorted(m for m in sys.modules if 'cupy' in m)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_hook_declares_the_backend():
    (backend,) = rlx_backends()
    assert backend.name == "cuda" and backend.priority == 90
    assert backend.api_version == rlx_core.PLUGIN_API_VERSION
    ops = backend.supported_ops()
    assert ops == CLAIMED_OPS
    assert {"matmul", "gemm", "fused_elementwise", "softmax", "layer_norm", "attention", "conv2d", "gather"} <= ops
    assert all(op in {k.value for k in OpKind} for op in ops)


def test_cupy_not_installed():
    def missing():
        raise ImportError("No module named 'cupy'")

    got = probing.probe_cuda(missing)
    assert (got.available, got.kind) == (False, "not_installed")
    assert got.reason.startswith("CuPy is not installed: pip install cupy-cuda12x")
    assert "No module named 'cupy'" in got.reason


def test_cupy_import_failure():
    def broken():
        raise OSError("libcudart.so.12: cannot open shared object file")

    got = probing.probe_cuda(broken)
    assert got.kind == "import_failed" and "CuPy failed to import: OSError: libcudart.so.12" in got.reason


def test_several_cupy_wheels(monkeypatch):
    monkeypatch.setattr(probing, "cupy_distributions", lambda: ["cupy-cuda12x", "cupy-cuda13x"])
    got = probing.probe_cuda(lambda: fake_cupy())
    assert got.kind == "import_failed" and "cupy-cuda12x, cupy-cuda13x" in got.reason


def test_no_driver():
    err = CUDARuntimeError(35, "cudaErrorInsufficientDriver: CUDA driver version is insufficient")
    got = probing.probe_cuda(lambda: fake_cupy(driver=0, count=err))
    assert got.kind == "no_driver"
    assert got.reason.startswith("no NVIDIA driver: libcuda.so.1 was not found (CuPy 14.2.0 for CUDA 12.9")
    assert got.versions["cuda_driver"] == "none"


def test_driver_too_old():
    err = CUDARuntimeError(35, "cudaErrorInsufficientDriver: CUDA driver version is insufficient")
    got = probing.probe_cuda(lambda: fake_cupy(driver=11080, count=err))
    assert got.kind == "old_driver"
    assert got.reason.startswith("the NVIDIA driver is too old: it supports CUDA 11.8, CuPy 14.2.0 for CUDA 12.9")


@pytest.mark.parametrize("count", [0, CUDARuntimeError(100, "cudaErrorNoDevice: no CUDA-capable device")])
def test_no_device(count, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    got = probing.probe_cuda(lambda: fake_cupy(count=count))
    assert got.kind == "no_device"
    assert got.reason == "no CUDA device: the driver (CUDA 12.4) found no GPU (CUDA_VISIBLE_DEVICES is empty)"


def test_kernel_failure_names_a_missing_library():
    err = type("DynamicLibNotFoundError", (RuntimeError,), {})('Failure finding "libnvrtc.so.12"')
    got = probing.probe_cuda(lambda: fake_cupy(kernel_error=err))
    assert got.kind == "kernel_failed"
    assert got.reason.startswith("cannot load nvrtc for the test kernel on cuda:0 (NVIDIA H100 80GB HBM3)")
    assert "rlx-cuda[ctk]" in got.reason


def test_kernel_failure_and_wrong_result():
    got = probing.probe_cuda(lambda: fake_cupy(kernel_error=RuntimeError("cudaErrorLaunchFailure")))
    assert got.kind == "kernel_failed"
    assert got.reason == ("a test kernel failed on cuda:0 (NVIDIA H100 80GB HBM3, sm_9.0): "
                          "RuntimeError: cudaErrorLaunchFailure")
    got = probing.probe_cuda(lambda: fake_cupy(wrong=True))
    assert got.kind == "kernel_failed" and "computed [[" in got.reason


def test_available_with_a_working_fake():
    got = probing.probe_cuda(lambda: fake_cupy())
    assert got.available and got.devices[0].name == "NVIDIA H100 80GB HBM3"
    assert got.versions["compute_capability"] == "9.0" and got.versions["cuda_driver"] == "12.4"
    assert got.free_memory == 79 * 2**30  # placement's memory check reads it (Availability.memory_bytes)


def test_this_host_reason():
    """The real path: here CuPy is installed and there is no driver (skips elsewhere)."""
    try:
        import cupy
    except ImportError:
        pytest.skip("CuPy is not installed here")
    if cupy.cuda.runtime.driverGetVersion() != 0:
        pytest.skip("this host has an NVIDIA driver")
    got = CudaBackend().probe()
    assert not got.available
    assert got.reason.startswith("no NVIDIA driver: libcuda.so.1 was not found (CuPy ")
    with pytest.raises(DeviceError, match="cuda is unavailable here: no NVIDIA driver"):
        CudaBackend().compile(rlx_core.Graph("g"), rlx_core.CompileOptions(device="cuda"))


def test_unavailable_backend_refuses_to_compile(monkeypatch):
    monkeypatch.setattr(probing, "import_cupy", lambda: fake_cupy(count=0))
    backend = CudaBackend()
    assert backend.probe().reason.startswith("no CUDA device")
    with pytest.raises(DeviceError, match="cuda is unavailable here: no CUDA device"):
        backend.compile(rlx_core.Graph("g"), rlx_core.CompileOptions(device="cuda"))
    g = rlx_core.Graph("g")  # nor a symbolic graph by buckets (the core then compiles per class, and says why)
    g.set_outputs([g.relu(g.input("x", ("rows", 4)))])
    assert rlx_core.plugin.runs_symbolic(backend)
    with pytest.raises(DeviceError, match="cuda is unavailable here: no CUDA device"):
        backend.compile_symbolic(g, rlx_core.CompileOptions(device="cuda"))


def test_device_index_out_of_range(monkeypatch):
    monkeypatch.setattr(probing, "import_cupy", lambda: fake_cupy())
    backend = CudaBackend()
    assert backend.probe().devices == ["cuda:0"]
    with pytest.raises(DeviceError, match=r"no CUDA device 'cuda:3' here; devices: cuda:0 \(NVIDIA H100"):
        backend.compile(rlx_core.Graph("g"), rlx_core.CompileOptions(device="cuda:3", device_index=3))


def test_cost_model_from_properties(monkeypatch):
    monkeypatch.setattr(probing, "import_cupy", lambda: fake_cupy())
    backend = CudaBackend()
    backend.probe()
    model = backend.default_cost_model()
    assert 45_000 < model.sgemm_gflops < 55_000  # 132 SMs x 128 lanes x 2 x 1.98 GHz x 0.75
    assert 2_500 < model.memory_bw_gbps < 2_800  # 5120-bit HBM3 at 2.619 GHz, x 0.8
    assert not model.calibrated and "NVIDIA H100" in model.source
    info = probing.DeviceInfo(0, "GPU", "9.0", 1, sm_count=132)  # CUDA 13: no clocks reported
    guessed = cost_model_from_device(info)
    assert "SM clock, memory bandwidth typical for sm_9.0" in guessed.source
    assert fp32_lanes_per_sm("8.0") == 64 and fp32_lanes_per_sm("8.6") == 128


def test_probe_answer_prices_the_gpu_in_the_parent(monkeypatch):
    """The core probes in a child process; the parent's backend rebuilds the device from
    the answer (``Backend.probed``) instead of pricing an unknown GPU."""
    monkeypatch.setattr(probing, "import_cupy", lambda: fake_cupy())
    answer = CudaBackend().probe()  # as the child computes it
    parent = CudaBackend()
    assert "not probed" in parent.default_cost_model().source
    parent.probed(answer)
    model = parent.default_cost_model()
    assert "NVIDIA H100" in model.source and 45_000 < model.sgemm_gflops < 55_000
    other = CudaBackend()
    other.probed(rlx_core.Availability(False, "no driver"))
    other.probed(rlx_core.Availability(True, versions={"device": "GPU", "sm_count": "many"}))
    assert "not probed" in other.default_cost_model().source  # unusable answers change nothing


def test_compile_options_extra():
    assert parse_extra({}) == {"tf32": False, "cuda_graphs": "auto", "warmup": True}
    assert parse_extra({"tf32": True, "cuda_graphs": False})["tf32"] is True
    with pytest.raises(ConfigError, match=r"extra\['tf32'\] must be True or False, got 'yes'"):
        parse_extra({"tf32": "yes"})
    with pytest.raises(ConfigError, match=r"extra\['cuda_graphs'\] must be 'auto', True or False, got 2"):
        parse_extra({"cuda_graphs": 2})
    with pytest.raises(ConfigError, match=r"unknown rlx-cuda option\(s\) \['cuda_graph'\]"):
        parse_extra({"cuda_graph": True})


def test_device_report_shows_the_reason():
    rows = {r.device: r for r in rlx_core.device_report()}
    if "cuda" not in rows:
        pytest.skip("rlx-cuda is not installed as a distribution here")
    row = rows["cuda"]
    if row.available:
        pytest.skip("a GPU works here")
    assert row.reason and not row.recommended and row.priority == 90
    assert np.isscalar(row.priority)


def test_conformance_kit_without_a_gpu():
    """The kit's metadata checks pass here; every device check skips with the probe's reason."""
    from rlx_core.testing import check_backend

    report = check_backend(CudaBackend())
    assert not report.failed, "\n".join(str(r) for r in report.failed)


def test_claims_exactly_the_elementwise_ops_codegen_renders_and_declines_other_regions():
    """The IR's elementwise ops without a CUDA rendering (floor, fmod, the bit ops...)
    are not claimed, and a fused region holding one is declined with the reason, so the
    fusion pass keeps such ops out of cuda's regions (and a graph using them names them
    as its blocker)."""
    from rlx_core.ir import Graph
    from rlx_core.ir.ops import ELEMENTWISE_OPS
    from rlx_cuda.kernels_claims import RENDERED_ELEMENTWISE

    (backend,) = rlx_backends()
    claimed = backend.supported_ops()
    assert RENDERED_ELEMENTWISE <= ELEMENTWISE_OPS
    for op in ELEMENTWISE_OPS - RENDERED_ELEMENTWISE:
        assert op.value not in claimed
    assert {"floor", "fmod", "bitwise_and", "bit_shift_left"} <= {op.value for op in ELEMENTWISE_OPS} - claimed
    g = Graph("regions")
    x, i = g.input("x", (4,), "float32"), g.input("i", (4,), "int32")
    plain = g.add_node("fused_elementwise", [x.id], {"program": [["tanh", [0], []], ["add", [1, 0], []]]})
    floor = g.add_node("fused_elementwise", [x.id], {"program": [["floor", [0], []], ["add", [1, 0], []]]})
    bits = g.add_node("fused_elementwise", [i.id], {"program": [["bitwise_not", [0], []], ["fmod", [1, 0], []]]})
    assert backend.claims(g.node(plain.id)) is True
    assert backend.claims(g.node(floor.id)) == "rlx-cuda has no CUDA rendering of floor for a fused region"
    assert backend.claims(g.node(bits.id)) == "rlx-cuda has no CUDA rendering of bitwise_not, fmod for a fused region"
    assert backend.claims(g.node(g.floor(x).id)) is False
