"""Work-group sizes (``rlx_opencl.launch``) and vector widths (``runtime.max_vector_bits``).

Issue 18: a 1024^3 float32 matmul killed the process on a 2-core AMD EPYC (PoCL 3.0).
Two things met there, both covered here with fake device figures, so on any host:
PoCL chose a 64 x 64 x 1 work-group when the local size was left to it, and its LLVM
could not compile the 512-bit vectors of the generated kernels for that CPU. The last
tests run the chosen configuration for real on the OpenCL device.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_core
from rlx_core.plugin import CompileOptions
from rlx_opencl.codegen.matmul import MatmulSpec, matmul_kernel
from rlx_opencl.launch import (
    CPU_GROUP_BYTES,
    GPU_GROUP_ITEMS,
    MIN_ITEM_BYTES,
    DeviceLimits,
    KernelLimits,
    local_size,
)
from rlx_opencl.runtime import max_vector_bits

#: PoCL 3.0's CPU device on the 2-core AMD EPYC of issue 18, and what it says of every kernel.
AMD_POCL = DeviceLimits(max_work_group_size=4096, max_work_item_sizes=(4096, 4096, 4096), compute_units=2)
POCL_KERNEL = KernelLimits(max_items=4096, private_bytes=1024, multiple=8)
#: What PoCL's own choice was there for the matmul (``local_size=None``).
POCL_CHOICE_ON_AMD = (64, 64, 1)
A_GPU = DeviceLimits(max_work_group_size=1024, max_work_item_sizes=(1024, 1024, 64), compute_units=80, is_gpu=True)
WARP_KERNEL = KernelLimits(max_items=1024, private_bytes=0, multiple=32)


def _assert_valid(global_size: tuple[int, ...], local: tuple[int, ...], limits: DeviceLimits) -> None:
    assert len(local) == len(global_size)
    assert all(g % n == 0 for g, n in zip(global_size, local)), (global_size, local)
    assert all(n <= m for n, m in zip(local, limits.max_work_item_sizes))
    assert math.prod(local) <= limits.max_work_group_size


def test_the_1024_matmul_of_issue_18_never_gets_pocls_64x64_group():
    kernel = matmul_kernel("k0_matmul", MatmulSpec(1024, 1024, 1024, "float32"), 0, 1, 2, vector_bits=512)
    assert kernel.global_size == (64, 128, 1)  # 16 columns x 8 rows per work-item
    assert kernel.private_bytes >= 8 * 16 * 4  # eight float16 accumulators
    assert all(g % n == 0 for g, n in zip(kernel.global_size, POCL_CHOICE_ON_AMD))  # a legal size PoCL may take
    for reported in (POCL_KERNEL, KernelLimits(max_items=4096)):  # PoCL's 1 KiB figure, or none at all
        local = local_size(kernel.global_size, AMD_POCL, kernel.private_bytes, reported)
        _assert_valid(kernel.global_size, local, AMD_POCL)
        assert local != POCL_CHOICE_ON_AMD
        assert math.prod(local) * max(kernel.private_bytes, reported.private_bytes) <= CPU_GROUP_BYTES


def test_cpu_matmul_groups_are_square():
    """A group covering a square of C keeps its rows of A and columns of B in cache (2048^3: 1.5x)."""
    assert local_size((256, 256, 1), AMD_POCL, 0, POCL_KERNEL) == (8, 8, 1)
    assert local_size((2097152,), AMD_POCL, 0, POCL_KERNEL) == (64,)


def test_cpu_groups_spread_over_the_compute_units():
    """A launch with few work-items still makes several groups: one group runs on one core."""
    local = local_size((32, 8, 1), AMD_POCL, 0, POCL_KERNEL)  # a small matmul grid, long k
    assert 256 // math.prod(local) >= 4 * AMD_POCL.compute_units
    assert local_size((1,), AMD_POCL, 0, POCL_KERNEL) == (1,)
    assert local_size((127,), AMD_POCL, 0, POCL_KERNEL) == (1,)  # prime: only 1 divides it below 127


def test_cpu_kernel_limit_and_item_dimensions_are_respected():
    tight = DeviceLimits(max_work_group_size=4096, max_work_item_sizes=(4, 4096, 4096), compute_units=1)
    local = local_size((1 << 20, 64, 1), tight, 0, KernelLimits(max_items=16))
    assert local[0] <= 4 and math.prod(local) <= 16
    _assert_valid((1 << 20, 64, 1), local, tight)


def test_gpu_groups_are_a_multiple_of_the_warp():
    assert local_size((4096,), A_GPU, 0, WARP_KERNEL) == (GPU_GROUP_ITEMS,)
    local = local_size((10, 64, 1), A_GPU, 0, WARP_KERNEL)
    assert math.prod(local) % 32 == 0 and math.prod(local) <= GPU_GROUP_ITEMS
    assert local_size((4096, 4, 1), A_GPU, 0, KernelLimits(max_items=64, multiple=32)) == (64, 1, 1)
    assert local_size((1000,), A_GPU, 0, WARP_KERNEL) == (250,)  # no multiple of 32 divides 1000: still legal


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(global_size=st.lists(st.integers(1, 5000), min_size=1, max_size=3).map(tuple),
       private=st.integers(0, 20_000), max_group=st.sampled_from([1, 64, 256, 1024, 4096]),
       gpu=st.booleans(), kernel_max=st.integers(1, 4096))
def test_every_choice_is_a_legal_uniform_launch(global_size, private, max_group, gpu, kernel_max):
    limits = DeviceLimits(max_group, (max_group, max_group, 64), compute_units=2, is_gpu=gpu)
    local = local_size(global_size, limits, private, KernelLimits(kernel_max, 0, 32))
    _assert_valid(global_size, local, limits)
    assert math.prod(local) <= kernel_max
    if not gpu and math.prod(local) > 1:
        assert math.prod(local) * max(private, MIN_ITEM_BYTES) <= CPU_GROUP_BYTES


@pytest.mark.parametrize(("version", "lanes", "bits"), [
    ("OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-znver3", 16, 256),  # Zen 4 seen by LLVM 14
    ("OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-generic", 16, 256),
    ("OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-x86-64-v3", 16, 256),
    ("OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-znver3", 8, 512),  # a real Zen 3: no AVX-512
    ("OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-znver4", 16, 512),
    ("OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-skylake-avx512", 16, 512),
    ("OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-x86-64-v4", 16, 512),
    ("OpenCL 3.0 CUDA", 1, 512),
])
def test_vector_bits(version, lanes, bits):
    assert max_vector_bits(version, lanes) == bits


def test_narrow_vectors_in_the_generated_code():
    kernel = matmul_kernel("mm", MatmulSpec(64, 64, 64, "float32"), 0, 1, 2, vector_bits=256)
    assert "float8" in kernel.source and "float16" not in kernel.source
    assert kernel.global_size == (8, 8, 1)


# ---------------------------------------------------------------------- on the device
@pytest.mark.slow
def test_the_chosen_launches_run_the_1024_matmul(backend):
    rng = np.random.default_rng(18)
    g = rlx_core.Graph("issue18")
    a, b = g.input("a", (1024, 1024)), g.input("b", (1024, 1024))
    g.set_outputs([g.matmul(a, b), g.matmul(a, g.transpose(b))])
    exe = backend.compile(g.freeze(), CompileOptions(device="opencl"))
    runtime = exe.runtime
    limits = DeviceLimits(int(runtime.device.max_work_group_size),
                          tuple(int(s) for s in runtime.device.max_work_item_sizes))
    kernels = [k for step in exe.plan.steps for k in step.kernels]
    for kernel, (name, size, local) in zip(kernels, exe.launch_sizes):
        assert name == kernel.name and size == kernel.global_size
        _assert_valid(size, local, limits)
        if not runtime.entry.is_gpu:
            assert math.prod(local) * max(kernel.private_bytes, MIN_ITEM_BYTES) <= CPU_GROUP_BYTES
    ins = {"a": rng.standard_normal((1024, 1024), dtype=np.float32),
           "b": rng.standard_normal((1024, 1024), dtype=np.float32)}
    nn, nt = exe.run(ins)
    a64, b64 = ins["a"].astype(np.float64), ins["b"].astype(np.float64)
    np.testing.assert_allclose(nn, a64 @ b64, rtol=1e-4, atol=2e-3)
    np.testing.assert_allclose(nt, a64 @ b64.T, rtol=1e-4, atol=2e-3)


def test_kernels_use_the_devices_vector_width(backend):
    g = rlx_core.Graph("lanes")
    x = g.input("x", (4, 64))
    g.set_outputs([g.exp(x), g.matmul(x, g.input("w", (64, 64)))])
    exe = backend.compile(g.freeze(), CompileOptions(device="opencl"))
    widest = "float16" if exe.runtime.vector_bits >= 512 else "float8"
    assert widest in exe.source
    if exe.runtime.vector_bits < 512:
        assert "float16" not in exe.source
