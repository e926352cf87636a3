"""The entry point names an object (not a module); its backend's cost_model raises."""

import rlx_core


class ObjBackend(rlx_core.Backend):
    name = "fakeobj"
    priority = 60

    def probe(self) -> rlx_core.Availability:
        return rlx_core.Availability(False, "no fake accelerator attached")

    def supported_ops(self) -> frozenset[str]:
        return frozenset({"add"})

    def cost_model(self) -> rlx_core.CostModel:
        raise RuntimeError("calibration table unreadable")


class _Plugin:
    @rlx_core.hookimpl
    def rlx_backends(self) -> list[rlx_core.Backend]:
        return [ObjBackend()]


plugin = _Plugin()
