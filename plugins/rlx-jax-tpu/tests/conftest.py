"""Fixtures of the rlx-jax-tpu suite. Every test module skips, with the reason, when jax is
not installed (``pytest.importorskip``), except the import-laziness test, which needs none.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlx_core.backends.registry import Registry

JAX_MISSING = "jax is not installed (pip install jax); the rlx-jax-tpu backends need it"


@pytest.fixture
def registry() -> Registry:
    """A registry holding only the ``jax`` backend: no discovery, no environment."""
    pytest.importorskip("jax", reason=JAX_MISSING)
    from rlx_jax_tpu import JaxBackend

    reg = Registry(entry_points=[], environ={})
    reg.register(JaxBackend())
    return reg


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)

