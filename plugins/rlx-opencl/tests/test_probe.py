"""Probe answers without a working OpenCL stack, with precise reasons, and device indexing.

The unavailable paths are monkeypatched (pyopencl missing, no platform, no device, a
probe kernel that fails to build), so they run on any host; the rest needs a device.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import rlx_core
from rlx_core.errors import DeviceError
from rlx_core.plugin import CompileOptions
from rlx_opencl import OpenclBackend, rlx_backends
from rlx_opencl import runtime as rt


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))


def _pyopencl_or_skip():
    cl = pytest.importorskip("pyopencl", reason="pyopencl is not installed")
    try:
        if not rt.list_devices(cl):
            pytest.skip("no OpenCL device here (install pyopencl[pocl])")
    except Exception as exc:
        pytest.skip(f"no OpenCL platform here: {exc}")
    return cl


def _working_device_or_skip():
    """A device whose driver builds and runs rlx's kernels, else a skip with the probe's
    reason: a listed device is not always a working one (PoCL 3.0's LLVM does not know a
    Zen 5 host, calls it 'generic' and then refuses that name: "unknown target CPU")."""
    cl = _pyopencl_or_skip()
    got = OpenclBackend().probe()
    if not got.available:
        pytest.skip(f"OpenCL is unavailable here: {got.reason}")
    return cl


def test_hook_is_cheap_and_declares_the_backend():
    (backend,) = rlx_backends()
    assert backend.name == "opencl" and backend.priority == 50
    assert backend.api_version == rlx_core.PLUGIN_API_VERSION
    assert "matmul" in backend.supported_ops() and "attention" not in backend.supported_ops()


def test_pyopencl_missing(monkeypatch):
    def missing():
        raise ImportError("No module named 'pyopencl'")

    monkeypatch.setattr(rt, "import_pyopencl", missing)
    got = OpenclBackend().probe()
    assert not got.available
    assert got.reason.startswith("pyopencl is not installed: pip install 'pyopencl[pocl]'")
    assert "No module named 'pyopencl'" in got.reason


def test_no_platform(monkeypatch):
    class PlatformNotFound(Exception):
        pass

    def get_platforms():
        raise PlatformNotFound("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    fake = types.SimpleNamespace(get_platforms=get_platforms, VERSION_TEXT="9.9")
    monkeypatch.setattr(rt, "import_pyopencl", lambda: fake)
    got = OpenclBackend().probe()
    assert not got.available
    assert "no OpenCL platform" in got.reason and "PLATFORM_NOT_FOUND_KHR" in got.reason
    assert got.versions == {"pyopencl": "9.9"}


def test_platform_without_devices(monkeypatch):
    class DeviceNotFound(Exception):
        pass

    def get_devices():
        raise DeviceNotFound("clGetDeviceIDs failed: DEVICE_NOT_FOUND")

    platform = types.SimpleNamespace(name="Portable Computing Language", get_devices=get_devices)
    fake = types.SimpleNamespace(get_platforms=lambda: [platform], VERSION_TEXT="9.9")
    monkeypatch.setattr(rt, "import_pyopencl", lambda: fake)
    got = OpenclBackend().probe()
    assert not got.available
    assert got.reason == "no OpenCL device: platforms PoCL list no devices"


def test_probe_kernel_build_failure(monkeypatch):
    _working_device_or_skip()
    monkeypatch.setattr(rt, "PROBE_SOURCE", "__kernel void rlx_probe(__global float* y) { y[0] = undefined_thing; }")
    got = OpenclBackend().probe()
    assert not got.available
    assert "the probe kernel failed to build on opencl:0" in got.reason
    assert "undefined_thing" in got.reason  # the build log's first lines name the fault


def test_generated_kernels_that_fail_make_the_device_unavailable(monkeypatch):
    """A driver that runs the tiny probe kernel but not rlx's generated ones (PoCL on a Zen 4
    host with an LLVM that calls it znver3, issue 18) is unavailable, with the reason."""
    _working_device_or_skip()
    from rlx_opencl import executable

    real = executable.OpenclExecutable.run

    def wrong(self, inputs):  # type: ignore[no-untyped-def]
        return [out + 1.0 for out in real(self, inputs)]

    monkeypatch.setattr(executable.OpenclExecutable, "run", wrong)
    got = OpenclBackend().probe()
    assert not got.available
    assert got.reason.startswith("rlx's generated kernels failed on opencl:0")
    assert "a dense layer with softmax computed wrong values" in got.reason


def test_available_lists_devices_and_versions():
    _working_device_or_skip()
    backend = OpenclBackend()
    got = backend.probe()
    assert got.available, got.reason
    assert got.devices and all(d.startswith("opencl:") for d in got.devices)
    assert got.devices[0] == "opencl:0"
    assert "pyopencl" in got.versions and "opencl:0" in got.versions
    default = backend.entry(None)  # the first device that works (opencl:0 unless it does not)
    assert default.name in got.reason and default.name in got.versions[f"opencl:{default.index}"]
    assert backend.label == f"OpenCL: {default.name} ({rt.short_platform(default.platform)})"
    assert OpenclBackend().label == backend.label  # remembered for the next discovery


class FakeEntry:
    """A listed device, as ``runtime.list_devices`` gives one, for the probe's choice."""

    def __init__(self, index: int, driver: str) -> None:
        self.index, self.name, self.is_gpu, self.driver = index, "pthread-AMD EPYC", False, driver
        self.platform = types.SimpleNamespace(name="Portable Computing Language")

    def describe(self) -> str:
        return f"{self.name} (PoCL, driver {self.driver})"


def test_bare_opencl_means_the_first_device_that_works_in_every_process(monkeypatch):
    """Two PoCLs on a Zen 5 host: the one pyopencl bundles (3.0, LLVM 14: "unknown target CPU
    'generic'") listed first, Debian's (3.1) second. The probe runs in a child process; the
    process that compiles must mean the same device by bare ``opencl``."""
    entries = [FakeEntry(0, "3.0-rc2"), FakeEntry(1, "3.1+debian")]
    monkeypatch.setattr(rt, "import_pyopencl", lambda: types.SimpleNamespace(VERSION_TEXT="fake"))
    monkeypatch.setattr(rt, "list_devices", lambda cl: entries)
    broken = "the probe kernel failed to build on opencl:0: ... unknown target CPU 'generic'"
    monkeypatch.setattr(OpenclBackend, "_first_failure", lambda self, e: broken if e.index == 0 else None)
    monkeypatch.setattr(OpenclBackend, "_remember_label", lambda self, e: None)
    child = OpenclBackend()
    got = child.probe()
    assert got.available and got.devices == ["opencl:0", "opencl:1"]
    assert f"default opencl:1; opencl:0 skipped: {broken}" in got.reason
    assert child.entry(None).index == 1
    assert OpenclBackend().entry(None).index == 1  # another process, same devices: the probe's choice
    entries.append(FakeEntry(2, "a GPU's"))
    assert OpenclBackend().entry(None).index == 0  # other devices: the first until probed again


def test_device_index(monkeypatch):
    _working_device_or_skip()
    backend = OpenclBackend()
    g = rlx_core.Graph("index")
    x = g.input("x", (4,))
    g.set_outputs([g.mul(x, 2.0)])
    g.freeze()
    n = len(backend.devices())
    last = max(e.index for e in backend.devices() if backend._first_failure(e) is None)
    exe = backend.compile(g, CompileOptions(device=f"opencl:{last}", device_index=last))
    np.testing.assert_array_equal(exe.run({"x": np.arange(4, dtype=np.float32)})[0], [0, 2, 4, 6])
    with pytest.raises(DeviceError, match=rf"device opencl:{n} does not exist; OpenCL devices here: opencl:0 \("):
        backend.compile(g, CompileOptions(device=f"opencl:{n}", device_index=n))


def test_explicit_device_through_the_core():
    _working_device_or_skip()
    g = rlx_core.Graph("core")
    x = g.input("x", (3, 4))
    g.set_outputs([g.relu(x)])
    cg = rlx_core.compile(g, device="opencl:0")
    x_np = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(cg.run({"x": x_np})[0], np.maximum(x_np, 0))


def test_claims_decline_float64_without_fp64(monkeypatch):
    backend = OpenclBackend()
    monkeypatch.setattr(backend, "_fp64", lambda: False)
    g = rlx_core.Graph("f64")
    x = g.input("x", (2,), "float64")
    y = g.add(x, 1.0)
    z = g.add(g.input("z", (2,)), 1.0)
    assert backend.claims(g.node(y)) == "float64 needs cl_khr_fp64, which the default OpenCL device does not offer"
    assert backend.claims(g.node(z)) is True
    assert backend.claims(g.node(g.attention(g.input("q", (2, 2)), g.input("k", (2, 2)),
                                             g.input("v", (2, 2))))) is False
