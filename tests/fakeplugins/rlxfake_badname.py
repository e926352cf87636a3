"""A backend whose name could never be parsed as a device string."""

import rlx_core


class BadName(rlx_core.Backend):
    name = "bad name:0"


@rlx_core.hookimpl
def rlx_backends():
    return [BadName()]
