"""rlx-opencl: the OpenCL backend (device ``opencl``), registered through the
``rlx.backends`` entry point.

Importing this module and calling the hook is cheap: pyopencl is imported when the
backend is probed or compiles a graph. A graph becomes one OpenCL program of generated
kernels (``codegen/``), planned once (``planner.py``) and run with one wait per run
(``executable.py``).
"""

from __future__ import annotations

from typing import Any

import rlx_core

from .backend import OpenclBackend

__all__ = ["OpenclBackend", "rlx_backends"]


@rlx_core.hookimpl
def rlx_backends() -> list[rlx_core.Backend]:
    return [OpenclBackend()]


def __getattr__(name: str) -> Any:
    if name == "__version__":  # looked up on demand: reading metadata is not free
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("rlx-opencl")
        except PackageNotFoundError:
            return "0.0.0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
