"""The sealed plugin contract: ``rlx_core.plugin`` re-exports the backend kit (issue 20),
lazily, and names nothing it cannot deliver."""

from __future__ import annotations

import pytest

import rlx_core.plugin as plugin


def test_every_exported_name_resolves():
    missing = [name for name in plugin.__all__ if getattr(plugin, name, None) is None]
    assert not missing


def test_the_kit_is_the_core_objects_themselves():
    from rlx_core.cache import JsonCache
    from rlx_core.calibration import save_calibration
    from rlx_core.passes.internal_ops import make_instruction

    assert plugin.JsonCache is JsonCache and plugin.make_instruction is make_instruction
    assert plugin.save_calibration is save_calibration


def test_unknown_names_fail_like_any_module():
    with pytest.raises(AttributeError, match=r"module 'rlx_core\.plugin' has no attribute 'registry'"):
        plugin.registry  # noqa: B018
    with pytest.raises(ImportError):
        from rlx_core.plugin import default_registry  # noqa: F401
