"""One good backend and one non-Backend item: the good one still loads."""

import rlx_core


class MixedBackend(rlx_core.Backend):
    name = "fakemixed"

    def probe(self) -> rlx_core.Availability:
        return rlx_core.Availability(True)

    def supported_ops(self) -> frozenset[str]:
        return frozenset()


@rlx_core.hookimpl
def rlx_backends():
    return [MixedBackend(), 42]
