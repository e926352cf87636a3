"""``rlx check MODEL [--dim NAME=N] [--device D] [--json]``: can this model run here?

For CI pipelines: it loads the model (a graph .json or an ONNX model), asks every device
(or the one named) whether it can run it under the current policy, with its blocker and
estimated cost, and says which device ``rlx run`` would pick. Nothing is compiled or run.
Exit status: 0 when some device can run the model, 1 when none can, 2 for bad input (an
unreadable model, an unknown device, a bad ``--dim``). When ``rlx.compile`` would split
the graph across devices (none runs it alone, or a split is predicted clearly faster:
``docs/partition.md``), the pick is the split and ``"partition"`` lists its segments;
otherwise ``"partition"`` is null and ``"partition_note"`` says why there is none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``rlx check`` to ``app``."""
    app.command("check")(check)


def check(
    model: Annotated[Path, typer.Argument(help="Graph .json or ONNX model .onnx.")],
    dims: Annotated[list[str] | None, typer.Option("--dim", help="NAME=N: an ONNX symbolic dim (repeatable).")] = None,
    device: Annotated[str | None, typer.Option("--device", "-d", help="Check this device only.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
) -> None:
    """Which devices can run MODEL here, why not, and which one auto would pick (exit 1 if none)."""
    from rich.table import Table

    from .common import (
        Notes,
        _load_graph,
        _seconds,
        _user_errors,
        console,
        priced_at,
        priced_line,
        require_devices,
    )

    with _user_errors():
        from ..backends.registry import default_registry, parse_device
        from ..errors import DeviceError
        from ..placement.partition import split_for
        from ..placement.policy import DevicePolicy
        from ..placement.ranking import Placement

        if device is not None:
            require_devices([device])  # an unknown or uninstalled device is bad input (exit 2), before any work
        graph, origin = _load_graph(model, None, dims or [])
        placement = Placement(graph, DevicePolicy.from_env(), default_registry())
        rows = placement.report()
        if device is not None:
            rows = [r for r in rows if r.device == parse_device(device)[0]]
        rows = [r for r in rows if r.registered]
        pick: str | None = None
        why = ""
        try:
            pick, why, _ = placement.choose(device)
        except DeviceError as exc:
            why = str(exc)
        split = split_for(placement, rows) if device is None else "an explicit device never splits"
        if not isinstance(split, str):
            pick, why = "+".join(split.devices), split.why()
        runnable = [r.device for r in rows if r.viable] or ([pick] if pick else [])
        if json_out:
            doc: dict[str, Any] = {
                "model": str(model), "graph": graph.name, "nodes": len(graph), "runnable": bool(runnable),
                "symbols": list(graph.symbols), "priced_at": priced_at(graph),
                "devices": [{"device": r.device, "can_run": r.viable, "available": r.available,
                             "blocker": r.blocker, "est_seconds": r.est_seconds} for r in rows],
                "pick": pick, "why": why, "partition": None if isinstance(split, str) else split.to_dict(),
                "partition_note": split if isinstance(split, str) else "",
            }
            print(json.dumps(doc, indent=2))
        else:
            console.print(f"graph: {graph.name} ({len(graph)} nodes) from {origin}")
            priced = priced_line(graph)
            if priced:
                console.print(priced)
            table = Table("device", "can run", "estimate", title_justify="left")
            notes = Notes()  # each blocker below the table, numbered from its row
            for r in rows:
                blocker = r.blocker or r.reason or "unavailable"
                can = "yes" if r.viable else f"no {notes.add(f'{r.device}: {blocker}')}"
                table.add_row(r.device, can, _seconds(r.est_seconds) if r.viable else "-")
            console.print(table)
            notes.print()
            if not isinstance(split, str):
                console.print(f"pick: {pick}, split into {len(split.segments)} segments")
                for line in split.describe():
                    console.print(f"  {line}", soft_wrap=False)
            elif pick:
                console.print(f"pick: {pick} ({why})")
            else:
                detail = f": {why}" if device is not None else " (each device's reason is above)"
                console.print(f"no device can run it{detail}")
    if not runnable:
        raise typer.Exit(1)
