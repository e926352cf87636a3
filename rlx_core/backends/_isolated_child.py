"""The child side of isolation (``python -m rlx_core.backends._isolated_child``): load one backend
as the parent's registry did, run one task (probe or calibrate), answer in JSON lines;
or (task ``import``) import entry points and call their hooks, for ``plugin_import``.

Apart from ``isolation.py`` (the parent side, which the registry imports) because these
tasks import the registry, the probing and calibration code: the parent's modules must
not import them back.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.metadata
import json
import os
import sys
import threading
from typing import Any

from ..calibration import progress_sink
from ..cost import CostModel
from ..plugin import ENTRY_POINT_GROUP, Availability
from .isolation import ChildChannel, ChildTarget
from .plugin_import import call_hook
from .probing import describe_error
from .registry import Registry, set_default_registry


def _exit_when_parent_goes() -> None:
    """Block on stdin until the parent closes it (done, or gone), then leave at once."""
    with contextlib.suppress(Exception):
        sys.stdin.read()
    os._exit(0)


def _load(target: ChildTarget) -> Any:
    """Load the backend as the parent's registry did (same validation), in-process here."""
    ep = importlib.metadata.EntryPoint(name=target.entry_point, value=target.value, group=ENTRY_POINT_GROUP)
    registry = Registry(entry_points=[ep])
    set_default_registry(registry)  # code that asks the default registry sees this backend
    return registry.get(target.backend)


def _probe_task(backend: Any, channel: ChildChannel) -> None:
    channel.send("started")
    try:
        answer = backend.probe()
    except BaseException as exc:
        channel.send("result", payload={"outcome": "raised", "error": describe_error(exc)})
        return
    if not isinstance(answer, Availability):
        channel.send("result", payload={"outcome": "garbage", "type": type(answer).__name__})
        return
    try:  # JSON carries plain ints only (a numpy integer from a plugin is not one)
        memory = int(answer.memory_bytes) if answer.memory_bytes is not None else None
    except (TypeError, ValueError):
        memory = None
    channel.send("result", payload={"outcome": "ok", "available": bool(answer.available), "reason": answer.reason,
                                    "devices": list(answer.devices), "versions": dict(answer.versions),
                                    "memory_bytes": memory})


def _calibrate_task(backend: Any, quick: bool, channel: ChildChannel) -> None:
    """Calibrate, and answer the model with where it was saved or why it was not
    (``saved``: the last save's ``SaveOutcome``, ``None`` for a backend that saved
    nothing): a warning about a cache it could not write would die with this process."""
    from ..calibration import recording_saves

    channel.send("started")
    with progress_sink(lambda step, frac: channel.send("step", step=step, frac=frac)), recording_saves() as saves:
        model = backend.calibrate(quick=quick)
    if not isinstance(model, CostModel):
        raise TypeError(f"calibrate() returned {type(model).__name__}, expected rlx_core.CostModel")
    channel.send("result", payload={"model": model.to_dict(), "saved": saves[-1].to_dict() if saves else None})


def _import_task(entry_points: list[dict[str, str]], channel: ChildChannel) -> None:
    """Import each entry point and call its hook, in order, saying which one it is at
    (``importing``) so that the parent can name the one that kills or hangs this process.
    An exception is an answer like any other: the parent imports that one itself and
    reports it; only a death or a hang here is a verdict against the plugin."""
    channel.send("started")  # the parent's timeout counts from here: the imports, not Python starting
    for index, item in enumerate(entry_points):
        channel.send("importing", index=index)
        names: list[str] = []
        try:
            ep = importlib.metadata.EntryPoint(name=item["name"], value=item["value"], group=ENTRY_POINT_GROUP)
            returned = call_hook(ep.load(), ep.name, ep.value)
            if isinstance(returned, (list, tuple)):
                names = [b.name for b in returned if isinstance(getattr(b, "name", None), str)]
        except BaseException:  # the parent imports it again and reports what it raised
            pass
        channel.send("imported", index=index, backends=names)
    channel.send("result", payload={})


def _child_main() -> None:
    faulthandler.enable()  # a crash prints the Python stack to stderr, which the parent logs
    channel = ChildChannel()
    request = json.loads(sys.stdin.readline() or "{}")
    threading.Thread(target=_exit_when_parent_goes, daemon=True).start()
    try:
        if request.get("task") == "import":  # no backend to load first: loading is the task
            _import_task(list(request.get("entry_points") or []), channel)
        elif request.get("task") in ("probe", "calibrate"):
            backend = _load(ChildTarget(**request["target"]))
            if request.get("task") == "probe":
                _probe_task(backend, channel)
            else:
                _calibrate_task(backend, bool(request.get("quick")), channel)
        else:
            raise ValueError(f"unknown task {request.get('task')!r}")
    except BaseException as exc:  # the parent re-raises it with this type's name and message
        channel.send("error", type=type(exc).__name__, message=str(exc))
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: a driver's atexit handlers are where some crash


if __name__ == "__main__":
    _child_main()
