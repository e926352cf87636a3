"""rlx_backends raises."""

import rlx_core


@rlx_core.hookimpl
def rlx_backends():
    raise RuntimeError("driver table corrupt")
