"""A probe that hangs the first time only, as one on a host too loaded to answer in time
does: ``RLXFAKE_HANGONCE`` names a file; the probe that finds it missing creates it and
hangs, the next one answers. rlx must try a timed-out probe once more before it calls
the device unavailable."""

import os
import threading

import rlx_core


class HangsOnce(rlx_core.Backend):
    name = "fakehangonce"
    priority = 5

    def probe(self) -> rlx_core.Availability:
        flag = os.environ["RLXFAKE_HANGONCE"]
        if not os.path.exists(flag):
            open(flag, "w").close()
            threading.Event().wait()
        return rlx_core.Availability(True, "answered on the second try")

    def supported_ops(self) -> frozenset[str]:
        return frozenset({"add"})


@rlx_core.hookimpl
def rlx_backends():
    return [HangsOnce()]
