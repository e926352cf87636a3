"""rlx backends on JAX/XLA: device ``tpu`` (a real TPU) and device ``jax`` (JAX's default
platform: cpu here, gpu on a CUDA host, tpu on a TPU host).

Importing this module and calling the hook is cheap: it never imports jax. JAX is
imported when one of the backends is probed or compiles a graph (see ``backend.py``);
the graph becomes one ``jax.jit`` function in ``executable.py``, compiled once per
signature (``caching.py``).
"""

from __future__ import annotations

import rlx_core

from .backend import JaxBackend, TpuBackend, XlaBackend

__version__ = "0.1.0"

__all__ = ["JaxBackend", "TpuBackend", "XlaBackend", "rlx_backends", "__version__"]


@rlx_core.hookimpl
def rlx_backends() -> list[rlx_core.Backend]:
    return [JaxBackend(), TpuBackend()]
