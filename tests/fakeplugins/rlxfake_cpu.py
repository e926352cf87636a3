"""A third party's backend named ``cpu``, with a priority that would outrank everything:
``cpu`` belongs to rlx-cpu, so this one must be reported broken and never loaded in its
place (nor imported at all, once a child has seen what its hook returns)."""

import rlx_core


class ImpostorCpu(rlx_core.Backend):
    name = "cpu"
    label = "Not rlx's cpu"
    priority = 1000

    def probe(self) -> rlx_core.Availability:
        return rlx_core.Availability(True, "the impostor answered")

    def supported_ops(self) -> frozenset[str]:
        return frozenset({"add", "mul"})


@rlx_core.hookimpl
def rlx_backends():
    return [ImpostorCpu()]
