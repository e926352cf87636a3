"""Falling back: try devices in turn, loudly. The one loop behind ``compile``'s auto
fallback, ``run_with_fallback``/``GraphDevices.run_chain`` and every ``Predictor`` worker.

The rules are the contract's (``ARCHITECTURE.md``, "Devices, policy and fallback"):

- a device that cannot run the graph is *skipped* and recorded with its blocker;
- a device that fails emits one ``FallbackWarning`` naming it and the error, and the next
  is tried; when none succeeds, ``DeviceFallbackError`` whose ``.attempts`` lists every
  ``(device, message)``;
- the caller's own errors (``InputError``, ``ConfigError``) are raised at once: every
  device would fail the same way;
- under ``strict`` the first failure raises ``DeviceError`` naming the device, with the
  cause chained and no warning.

What differs between the callers is only how they word it (``Wording``) and what they
remember of a failure (``on_failure``: a worker stops sending rows to a device that failed).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..errors import CALLER_ERRORS, DeviceError, DeviceFallbackError, FallbackWarning

__all__ = ["Wording", "try_in_turn"]

T = TypeVar("T")


@dataclass(frozen=True)
class Wording:
    """How one caller words its fallback: ``{device}``, ``{graph}``, ``{error}`` (the
    exception's type and message), ``{message}`` (its message), ``{next}`` and ``{detail}``
    (every attempt) are filled in."""

    failed: str = "rlx: device {device} failed on graph {graph!r} ({error}); "
    then: str = "falling back to {next}"
    last: str = "no device left"
    none: str = "no device could run graph {graph!r}: {detail}"
    strict: str = "device {device} failed (RLX_STRICT: no fallback): {message}"


def try_in_turn(devices: Sequence[str], action: Callable[[str], T], *, graph: str, wording: Wording = Wording(),
                strict: bool = False, skip: Callable[[str], str | None] | None = None,
                attempts: list[tuple[str, str]] | None = None,
                on_failure: Callable[[str, BaseException, str], None] | None = None,
                stacklevel: int = 3) -> tuple[str, T, list[tuple[str, str]]]:
    """``(device, action(device), attempts)`` for the first device of ``devices`` whose
    ``action`` succeeds (see the module doc). ``skip(device)`` is a blocker (the device is
    not tried) or ``None``; ``attempts`` may arrive with earlier entries (a worker's
    devices that failed before) and lists everything tried or skipped."""
    tried = list(attempts or [])
    blockers = {d: skip(d) for d in devices} if skip is not None else dict.fromkeys(devices)
    for i, device in enumerate(devices):
        if blockers[device] is not None:
            tried.append((device, f"skipped: {blockers[device]}"))
            continue
        try:
            return device, action(device), tried
        except CALLER_ERRORS:
            raise
        except Exception as exc:
            error, message = f"{type(exc).__name__}: {exc}", str(exc)
            fields = {"device": device, "graph": graph, "error": error, "message": message}
            if strict:
                raise DeviceError(wording.strict.format(**fields)) from exc
            tried.append((device, error))
            if on_failure is not None:
                on_failure(device, exc, error)
            rest = [d for d in devices[i + 1 :] if blockers[d] is None]
            then = wording.then.format(next=rest[0]) if rest else wording.last
            warnings.warn(wording.failed.format(**fields) + then, FallbackWarning, stacklevel=stacklevel)
    detail = "; ".join(f"{d}: {e}" for d, e in tried) or "no device to try"
    raise DeviceFallbackError(wording.none.format(graph=graph, detail=detail), tried)
