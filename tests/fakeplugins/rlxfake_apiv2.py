"""Written for a future plugin API."""

import rlx_core


class FutureBackend(rlx_core.Backend):
    name = "fakev2"
    api_version = 2

    def probe(self) -> rlx_core.Availability:
        return rlx_core.Availability(True)


@rlx_core.hookimpl
def rlx_backends():
    return [FutureBackend()]
