"""Two backends whose probes misbehave: one raises, one answers garbage."""

import rlx_core


class RaisingProbe(rlx_core.Backend):
    name = "fakeraise"

    def probe(self) -> rlx_core.Availability:
        raise ValueError("no device 0")


class GarbageProbe(rlx_core.Backend):
    name = "fakegarbageprobe"

    def probe(self):
        return "yes, probably"


@rlx_core.hookimpl
def rlx_backends():
    return [RaisingProbe(), GarbageProbe()]
