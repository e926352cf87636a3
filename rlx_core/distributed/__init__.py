"""Batch inference, in-process or scaled out on Ray (extra ``rlx-core[ray]``).

``Predictor`` turns a model into a function on columns of rows that picks its device on
the host it runs on; ``map_batches`` runs it as a pool of Ray Data actors, so every node
of a cluster uses its own fastest device under its own ``RLX_*`` policy. Importing this
package does not import Ray: ``Predictor`` works without it, and ``map_batches`` raises
an ``RlxError`` naming the extra when Ray is missing. See ``docs/distributed.md``.
"""

from __future__ import annotations

from ._model import BatchModel, ColumnSpec
from ._ray import DEFAULT_SYMBOLIC_BATCH_SIZE, RAY_EXTRA, map_batches, require_ray
from .predictor import DEFAULT_DEVICE_COLUMN, Predictor

__all__ = [
    "DEFAULT_DEVICE_COLUMN",
    "DEFAULT_SYMBOLIC_BATCH_SIZE",
    "RAY_EXTRA",
    "BatchModel",
    "ColumnSpec",
    "Predictor",
    "map_batches",
    "require_ray",
]
