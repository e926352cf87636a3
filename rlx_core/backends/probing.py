"""One backend's probe, running or done: in a child process or in this one, watched by a
daemon thread.

The registry starts a ``ProbeRun`` on the first question about a backend and waits for
it at most ``RLX_PROBE_TIMEOUT`` seconds. A probe in a child (see ``isolation``) gets
that timeout from the moment the child starts probing, not from the moment Python starts
loading: the timeout is about the driver, and a cold interpreter on a busy host is not a
hung driver. A child's probe that does not answer in time is tried once more in a fresh
child before the device is called unavailable: on a loaded host the first one may lose
its time to other processes, and a second chance costs only a timeout more where a
driver really hangs. (A probe in this process cannot be tried again: its thread is
stuck.) The thread is a daemon, so a hung probe never delays interpreter exit; a child
whose parent exits sees its stdin close and leaves too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict

from ..plugin import Availability, Backend
from .isolation import STARTUP_SECONDS, ChildTarget, run_child
from .plugin_import import times

__all__ = ["ProbeRun", "describe_error"]

log = logging.getLogger("rlx.registry")
#: How much longer than the registry waits a child may live before it is killed: the
#: registry answers "did not answer" first, then the child goes.
_KILL_GRACE_S = 1.0
#: Tries a probe in a child gets when it does not answer in time.
PROBE_TRIES = 2
#: How long past a try's deadline the registry waits for the next try to begin (it
#: begins as soon as the killed child is reaped; this only bounds a reaping that hangs).
_RETRY_SLACK_S = 15.0


def _bytes(value: object) -> int | None:
    """A probe's ``memory_bytes`` as it came back from the child: a positive int, else ``None``
    (a foreign plugin's garbage there is no reason to lose its answer)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return int(value)
    return None


def describe_error(exc: BaseException) -> str:
    """``"TypeName: message"`` on one line (pluggy's validation errors span several), so a
    report row or a CLI warning stays one line."""
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ProbeRun:
    """A probe of ``backend``: in a child when ``target`` is given, else in this process.

    When ``done`` is set, exactly one of these says what happened: ``result`` (an
    ``Availability``), ``raised`` (the exception, described), ``garbage`` (the type
    name of what the probe returned instead), ``died`` (how the child ended without an
    answer), or ``timed_out``. ``attempt`` is the try under way (a child's probe gets
    ``PROBE_TRIES``); ``started`` is when the current try began probing (``None`` while
    its child is still starting).
    """

    def __init__(self, backend: Backend, target: ChildTarget | None = None, *, timeout: float = 10.0,
                 environ: Mapping[str, str] | None = None) -> None:
        self.done = threading.Event()
        self.result: Availability | None = None
        self.raised = ""
        self.garbage = ""
        self.died = ""
        self.timed_out = False
        self.isolated = target is not None
        self.attempt = 1
        self.attempts = PROBE_TRIES if target is not None else 1
        self.spawned = time.monotonic()
        self.started: float | None = None if target is not None else self.spawned
        self._changed = threading.Condition()
        run = (lambda: self._in_child(backend, target, timeout, environ)) if target is not None else (
            lambda: self._here(backend))
        self.thread = threading.Thread(target=run, name=f"rlx-probe-{backend.name}", daemon=True)
        self.thread.start()

    def wait(self, timeout: float) -> None:
        """Until the probe is done or ``timeout`` seconds after its last try started
        probing (a child gets ``STARTUP_SECONDS`` to get there first)."""
        with self._changed:
            while not self.done.is_set():
                start = self.started if self.started is not None else self.spawned + STARTUP_SECONDS
                slack = _RETRY_SLACK_S if self.attempt < self.attempts else 0.0
                remaining = start + timeout + slack - time.monotonic()
                if remaining <= 0:
                    return
                self._changed.wait(remaining)

    def reason(self, timeout: float) -> str:
        """Why the probe gave no usable answer ("" when it did), for the unavailable row."""
        if not self.done.is_set() and self.isolated and self.started is None:
            return (f"probe's child process did not get to probing within {STARTUP_SECONDS:g} s (starting Python "
                    "and importing the plugin): is the host overloaded?")
        if not self.done.is_set() or self.timed_out:
            tries = f", {times(self.attempt)}" if self.attempt > 1 else ""
            return f"probe did not answer within {timeout:g} s{tries} (RLX_PROBE_TIMEOUT)"
        if self.died:
            return f"probe {self.died} in its child process"
        if self.raised:
            return f"probe raised {self.raised}"
        if self.garbage or not isinstance(self.result, Availability):
            return f"probe returned {self.garbage or type(self.result).__name__}, expected rlx_core.Availability"
        return ""

    def _finish(self, **outcome: object) -> None:
        with self._changed:
            for key, value in outcome.items():
                setattr(self, key, value)
            self.done.set()
            self._changed.notify_all()

    def _mark_started(self) -> None:
        with self._changed:
            self.started = time.monotonic()
            self._changed.notify_all()

    def _next_attempt(self) -> None:
        with self._changed:
            self.attempt += 1
            self.spawned, self.started = time.monotonic(), None
            self._changed.notify_all()

    def _here(self, backend: Backend) -> None:
        try:
            answer = backend.probe()
        except BaseException as exc:  # a probe must not end its thread with a traceback on stderr
            self._finish(raised=describe_error(exc))
            return
        if isinstance(answer, Availability):
            self._finish(result=answer)
        else:
            self._finish(garbage=type(answer).__name__)

    def _in_child(self, backend: Backend, target: ChildTarget, timeout: float,
                  environ: Mapping[str, str] | None) -> None:
        task = {"task": "probe", "target": asdict(target)}
        kwargs = {} if environ is None else {"environ": environ}
        while True:
            last = self.attempt >= self.attempts  # only the last try outlives the registry's wait
            outcome = run_child(task, timeout=timeout + (_KILL_GRACE_S if last else 0.0),
                                on_started=self._mark_started, **kwargs)
            if last or not outcome.died.startswith("did not finish"):
                break
            log.info("rlx backend %r: the probe did not answer within %g s; trying once more in a fresh child",
                     backend.name, timeout)
            self._next_attempt()
        if outcome.error is not None:
            # The child could not load what this process loaded (a plugin that depends on
            # this process's state): probing here beats reporting a working device as broken.
            log.debug("rlx backend %r: the probe's child could not load it (%s: %s); probing in this process",
                      backend.name, outcome.error["type"], outcome.error["message"])
            self.isolated = False
            self._mark_started()
            self._here(backend)
            return
        if outcome.died:
            if outcome.died.startswith("did not finish"):
                self._finish(timed_out=True)
                return
            self._finish(died=outcome.died)
            return
        payload = outcome.result or {}
        kind = payload.get("outcome")
        if kind == "ok":
            self._finish(result=Availability(bool(payload.get("available")), str(payload.get("reason", "")),
                                             devices=[str(d) for d in payload.get("devices", [])],
                                             versions={str(k): str(v) for k, v in
                                                       dict(payload.get("versions", {})).items()},
                                             memory_bytes=_bytes(payload.get("memory_bytes"))))
        elif kind == "raised":
            self._finish(raised=str(payload.get("error", "")))
        else:
            self._finish(garbage=str(payload.get("type", "nothing")))
