"""rlx-cpu: the numpy backend (device ``cpu``), registered through the ``rlx.backends``
entry point. Importing this module is cheap: the executor loads on first compile."""

from __future__ import annotations

from typing import Any

import rlx_core

from .backend import CpuBackend

__all__ = ["CpuBackend", "rlx_backends"]


@rlx_core.hookimpl
def rlx_backends() -> list[rlx_core.Backend]:
    return [CpuBackend()]


def __getattr__(name: str) -> Any:
    if name == "__version__":  # looked up on demand: reading metadata is not free
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("rlx-cpu")
        except PackageNotFoundError:
            return "0.0.0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
