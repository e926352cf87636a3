"""rlx-cuda: NVIDIA GPUs through CuPy (device ``cuda``, ``cuda:N``), registered through
the ``rlx.backends`` entry point. Importing this module and calling the hook never
import CuPy: that happens when the backend is probed or used."""

from __future__ import annotations

from typing import Any

import rlx_core

from .backend import CudaBackend

__all__ = ["CudaBackend", "rlx_backends"]


@rlx_core.hookimpl
def rlx_backends() -> list[rlx_core.Backend]:
    return [CudaBackend()]


def __getattr__(name: str) -> Any:
    if name == "__version__":  # looked up on demand: reading metadata is not free
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("rlx-cuda")
        except PackageNotFoundError:
            return "0.0.0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
