"""Work-group sizes: chosen once per kernel, when an executable is built, never by the driver.

Left to the driver (``local_size=None``), PoCL takes the largest group it may: 64 x 64 x 1
= 4096 work-items for the 1024^3 matmul on an AMD EPYC whose limits are 4096 (issue 18).
PoCL runs one work-group as one task on one thread, and whatever it keeps per work-item
for a group (context arrays, spilled accumulators: the matmul holds rows x 16 floats per
item) grows with the group's item count; a GPU driver's limits are per kernel. So the
size is ours, from the device's limits and the kernel's per-item state:

- Every dimension divides the global size (OpenCL 1.2: no non-uniform groups) and stays
  within ``max_work_item_sizes``; the item count within ``max_work_group_size`` and the
  kernel's own ``CL_KERNEL_WORK_GROUP_SIZE``.
- CPU: items x private bytes within ``CPU_GROUP_BYTES``, and ``GROUPS_PER_UNIT`` groups
  per compute unit where there are items enough, so that every core gets work. On PoCL
  (2-core EPYC) throughput was flat from 16 to 512 items for matmul, elementwise,
  softmax and reductions; one group for all items ran on one core, at half speed.
- GPU: up to ``GPU_GROUP_ITEMS``, a multiple of the kernel's preferred multiple (the
  warp or wavefront) where the global size allows; the driver's per-kernel limit
  already counts registers.
- Among the sizes allowed, the most items. Then, on a CPU, the squarest first two
  dimensions: a matmul's group then covers a square of the output, whose rows of A and
  columns of B stay in cache while its items run (2048^3 on PoCL: 8 x 8 ran 1.5x faster
  than 64 x 1 or the driver's choice). Then the longest first dimension (GPUs
  coalesce the loads of consecutive work-items).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceLimits", "KernelLimits", "local_size", "device_limits", "kernel_limits", "CPU_GROUP_BYTES",
           "GPU_GROUP_ITEMS", "GROUPS_PER_UNIT", "MIN_ITEM_BYTES"]

#: Per work-group bytes of per-item state on a CPU device: 64 items at PoCL's 1 KiB figure.
CPU_GROUP_BYTES = 64 * 1024
#: The least state assumed per CPU work-item (a few spilled registers and pointers), so that
#: a driver reporting 0 bytes still gets groups within the measured flat range (<= 256 items).
MIN_ITEM_BYTES = 256
#: Work-items per GPU group: enough warps to hide latency, few enough for several groups per unit.
GPU_GROUP_ITEMS = 256
#: Groups per compute unit a CPU launch is split into where it has items enough.
GROUPS_PER_UNIT = 4


@dataclass(frozen=True)
class DeviceLimits:
    """What the device allows and has: ``max_work_group_size``, ``max_work_item_sizes``
    (per dimension), ``compute_units``, and whether it is a GPU (or accelerator)."""

    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    compute_units: int = 1
    is_gpu: bool = False


@dataclass(frozen=True)
class KernelLimits:
    """What the driver says of one kernel on the device: the most items per group
    (``CL_KERNEL_WORK_GROUP_SIZE``), bytes of private memory per item, and the preferred
    multiple of the item count (0 or 1: none)."""

    max_items: int
    private_bytes: int = 0
    multiple: int = 1


def device_limits(cl: Any, device: Any) -> DeviceLimits:
    """The ``DeviceLimits`` of a pyopencl device."""
    gpu = bool(device.type & (cl.device_type.GPU | cl.device_type.ACCELERATOR))
    return DeviceLimits(max_work_group_size=int(device.max_work_group_size),
                        max_work_item_sizes=tuple(int(s) for s in device.max_work_item_sizes),
                        compute_units=max(int(device.max_compute_units), 1), is_gpu=gpu)


def kernel_limits(cl: Any, kernel: Any, device: Any) -> KernelLimits:
    """The ``KernelLimits`` of a pyopencl kernel object on ``device``."""
    info = cl.kernel_work_group_info

    def query(what: Any) -> int:
        return int(kernel.get_work_group_info(what, device))

    return KernelLimits(max_items=query(info.WORK_GROUP_SIZE), private_bytes=query(info.PRIVATE_MEM_SIZE),
                        multiple=query(info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE))


def local_size(global_size: tuple[int, ...], limits: DeviceLimits, private_bytes: int = 0,
               kernel: KernelLimits | None = None) -> tuple[int, ...]:
    """The work-group size of a launch over ``global_size`` (see the module doc).

    ``private_bytes`` is the caller's estimate of one work-item's state; the larger of it
    and the driver's figure (``kernel.private_bytes``) bounds a CPU group.
    """
    cap = _max_items(global_size, limits, private_bytes, kernel)
    multiple = max(kernel.multiple, 1) if kernel is not None and limits.is_gpu else 1
    square = not limits.is_gpu
    per_dim = [_divisors(g, min(cap, _dim_limit(limits, d))) for d, g in enumerate(global_size)]
    best: tuple[int, ...] = tuple(1 for _ in global_size)
    best_key = _rank(best, multiple, square)
    for candidate in _products_within(per_dim, cap):
        key = _rank(candidate, multiple, square)
        if key > best_key:
            best, best_key = candidate, key
    return best


def _max_items(global_size: tuple[int, ...], limits: DeviceLimits, private_bytes: int,
               kernel: KernelLimits | None) -> int:
    """The most work-items a group of this launch may have."""
    cap = limits.max_work_group_size
    if kernel is not None and kernel.max_items > 0:
        cap = min(cap, kernel.max_items)
    if limits.is_gpu:
        return max(min(cap, GPU_GROUP_ITEMS), 1)
    per_item = max(private_bytes, kernel.private_bytes if kernel is not None else 0, MIN_ITEM_BYTES)
    cap = min(cap, CPU_GROUP_BYTES // per_item)
    spread = math.prod(global_size) // (GROUPS_PER_UNIT * limits.compute_units)
    return max(min(cap, spread), 1)


def _dim_limit(limits: DeviceLimits, dim: int) -> int:
    sizes = limits.max_work_item_sizes
    return sizes[dim] if dim < len(sizes) else 1


def _divisors(n: int, most: int) -> list[int]:
    """The divisors of ``n`` that are at most ``most``, ascending (``[1]`` at least)."""
    found = {1}
    for i in range(1, math.isqrt(n) + 1):
        if i > most:
            break
        if n % i == 0:
            found.add(i)
            if n // i <= most:
                found.add(n // i)
    return sorted(found)


def _products_within(per_dim: list[list[int]], cap: int) -> list[tuple[int, ...]]:
    """Every choice of one divisor per dimension whose product is at most ``cap``."""
    out: list[tuple[int, ...]] = [()]
    for options in per_dim:
        out = [(*head, d) for head in out for d in options if math.prod(head) * d <= cap]
    return out


def _rank(local: tuple[int, ...], multiple: int, square: bool) -> tuple[bool, int, int, int]:
    """Sort key of a candidate: a multiple of ``multiple``, most items, then (``square``)
    the larger of the first two dimensions' minimum, then the longest dimension 0."""
    items = math.prod(local)
    squareness = min(local[:2]) if square and len(local) >= 2 else 0
    return items % multiple == 0, items, squareness, local[0]
