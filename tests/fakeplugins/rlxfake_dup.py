"""Claims the name of another plugin's backend."""

import rlx_core


class Impostor(rlx_core.Backend):
    name = "fakenp"

    def probe(self) -> rlx_core.Availability:
        return rlx_core.Availability(True)


@rlx_core.hookimpl
def rlx_backends():
    return [Impostor()]
