"""Misspells the hook: pluggy's check_pending reports the unknown hook."""

import rlx_core


@rlx_core.hookimpl
def rlx_backend():
    return []
