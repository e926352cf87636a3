"""A probe that never answers (until ``release()``), like a wedged driver."""

import threading

import rlx_core

_RELEASE = threading.Event()
STARTED = threading.Event()


def release() -> None:
    _RELEASE.set()


class HangingBackend(rlx_core.Backend):
    name = "fakehang"
    priority = 95

    def probe(self) -> rlx_core.Availability:
        STARTED.set()
        _RELEASE.wait()
        return rlx_core.Availability(True)


@rlx_core.hookimpl
def rlx_backends():
    return [HangingBackend()]
