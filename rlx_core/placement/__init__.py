"""Placement: which devices may run a graph, which is fastest, and across several.

``policy.py`` is the user's allow/deny/prefer policy; ``ranking.py`` asks every backend
(probe, policy, op claims, cost) and ranks the devices, with a reason for each refusal;
``partition.py`` splits one graph across devices; ``measured.py`` times the candidates
when the ranking cannot tell them apart; ``corrections.py`` remembers how far each
device's cost model was off on this host.

The names of ``ranking.py`` stay importable from here (``from rlx_core.placement import
Placement``), as they were when placement was one module.
"""

from __future__ import annotations

import importlib

_RANKING = ("Decision", "DeviceCandidate", "Placement", "available_devices", "devices_for", "fastest_device_for",
            "resolve_device", "resolve_device_chain", "device_report", "legalize_for", "pipeline_for")


def __getattr__(name: str) -> object:
    # Lazily, so that importing ``placement.policy`` does not load the ranking and all it needs.
    if name in _RANKING:
        return getattr(importlib.import_module(".ranking", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_RANKING)
