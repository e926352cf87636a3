"""Fails at import, like a plugin whose dependency is missing."""

import rlx_fake_missing_dependency  # noqa: F401
