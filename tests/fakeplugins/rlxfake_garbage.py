"""rlx_backends returns something that is not a list of backends."""

import rlx_core


@rlx_core.hookimpl
def rlx_backends():
    return {"fakegarbage": "not a backend"}
