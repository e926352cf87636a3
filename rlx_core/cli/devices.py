"""``rlx devices [--json] [--explain] [--graph FILE | --example NAME]``: the doctor.

Every device is in one of three states, said the same way by the table and by
``--json``: *installed* (its plugin is here; rlx's own backends that are not get a row
saying ``not installed: pip install ...``), *available* (its probe ran a real
computation; if not, the probe's reason) and *usable* (the policy, and the graph when one
is given, let it run; if not, the blocker). The table shows the first state a device
misses (``not installed``, ``unavailable``, ``blocked``) or ``usable``, with the reason
as a numbered note under the table, so that it fits 80 columns whatever a driver says.
Kept out of ``cli.py``, which only registers it.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from ..placement.ranking import DeviceCandidate, Placement
    from ..run.settings import Setting

__all__ = ["register", "device_rows", "device_state"]

#: A device's state, from the first rung of installed / available / usable it misses.
STATES = ("not installed", "unavailable", "blocked", "usable")


def register(app: typer.Typer) -> None:
    """Add ``rlx devices`` to ``app``."""
    app.command("devices")(devices)


def _ops(row: DeviceCandidate) -> list[str]:
    return sorted(str(op) for op in row.ops)


def device_rows(placement: Placement) -> tuple[list[DeviceCandidate], set[str]]:
    """Every row ``rlx devices`` shows, and the names of those not installed.

    ``Placement.report()``'s rows (a backend per row, and a plugin that failed to load),
    then a row per backend of rlx's own whose plugin is not installed, saying which pip
    command adds it: a user who expects ``cuda`` learns what to install, not nothing.
    """
    from ..backends.registry import FIRST_PARTY, PLATFORM_PRIORITY
    from ..placement.ranking import DeviceCandidate

    rows = placement.report()
    missing = placement.registry.not_installed()
    shown = {r.device for r in rows}
    for device, how in sorted(missing.items(), key=lambda kv: (-PLATFORM_PRIORITY.get(kv[0], 0), kv[0])):
        if device in shown:
            continue
        reason = f"not installed: {how}"
        distribution = FIRST_PARTY[device].partition("[")[0]
        rows.append(DeviceCandidate(
            device=device, label="", available=False, reason=reason, registered=False, supports_graph=None,
            recommended=False, blocker=reason, est_seconds=None, priority=PLATFORM_PRIORITY.get(device, 0),
            distribution=distribution,
        ))
    return rows, set(missing)


def device_state(row: DeviceCandidate, missing: set[str]) -> tuple[str, str]:
    """``(state, why)``: the first of installed / available / usable that ``row`` misses
    (``STATES``) and the reason, or ``("usable", "")``."""
    if row.device in missing:
        return "not installed", row.reason
    if not row.registered:  # its plugin failed to load: installed, never available
        return "unavailable", row.blocker or row.reason
    if not row.available:
        return "unavailable", row.reason or "its probe says no"
    if not row.viable:
        return "blocked", row.blocker or "cannot run the graph"
    return "usable", ""


def _device_json(row: DeviceCandidate, missing: set[str]) -> dict[str, Any]:
    from .common import _jsonable

    state, _ = device_state(row, missing)
    d: dict[str, Any] = {
        "device": row.device,
        "label": row.label,
        "available": bool(row.available),
        "reason": row.reason or "",
        "distribution": row.distribution or None,
        "version": row.version or None,
        "ops": _ops(row),
        "calibrated": bool(row.calibrated),
        "recommended": bool(row.recommended),
        "blocker": row.blocker or None,
        # installed (its plugin is here, even if it failed to load) / available (its probe
        # says yes) / usable (and the policy, and the graph when one is given, let it run)
        "installed": state != "not installed",
        "usable": state == "usable",
        "state": state,
    }
    for extra in ("priority", "registered", "supports_graph", "est_seconds"):
        d[extra] = _jsonable(getattr(row, extra, None))
    return d


def _why_not(rows: Sequence[DeviceCandidate], missing: set[str]) -> dict[str, str]:
    """For a graph: why each device other than the recommended one is not the choice."""
    from .common import _seconds

    rec = next((r for r in rows if r.recommended), None)
    why_not = {}
    for r in rows:
        if r is rec:
            continue
        state, why = device_state(r, missing)
        if state != "usable":
            why_not[r.device] = why if state == "not installed" else r.blocker or why
        elif rec is not None and r.est_seconds is not None and rec.est_seconds is not None:
            if math.isclose(r.est_seconds, rec.est_seconds, rel_tol=1e-9):
                why_not[r.device] = (f"same estimated cost ({_seconds(r.est_seconds)}) as {rec.device}, "
                                     f"lower priority ({r.priority} vs {rec.priority})")
            else:
                why_not[r.device] = f"estimated {_seconds(r.est_seconds)} per run vs {_seconds(rec.est_seconds)}"
        else:
            why_not[r.device] = "usable, ranked below by the policy"
    return why_not


def devices(
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Show the policy, RLX_* variables and the why.")] = False,
    graph: Annotated[Path | None, typer.Option("--graph", help="Rank devices for this graph .json.")] = None,
    example: Annotated[str | None, typer.Option("--example", help="Rank devices for a bundled example.")] = None,
) -> None:
    """List every backend: installed, available and usable or why not, ops, cost model, recommended."""
    from ..errors import PluginWarning
    from .common import _load_graph, _user_errors, console, priced_at, priced_line

    with _user_errors():
        from ..backends.registry import default_registry
        from ..examples import REPRESENTATIVE
        from ..placement.policy import DevicePolicy
        from ..placement.ranking import Placement, example_pick
        from ..run.settings import all_settings

        g = _load_graph(graph, example)[0] if graph is not None or example is not None else None
        placement = Placement(g, DevicePolicy.from_env(), default_registry())
        with warnings.catch_warnings():  # broken plugins are listed below, not warned about
            warnings.simplefilter("ignore", PluginWarning)
            rows, missing = device_rows(placement)  # probes every backend; broken() is complete after it
        broken = [{"name": name, "error": str(error)} for name, error in placement.registry.broken()]
        settings = all_settings(placement.registry)  # rlx-core's table and the loaded plugins' rows
        disabled = sorted(placement.registry.disabled())
        if json_out:
            how = placement.registry.not_installed()
            doc = {
                "devices": [_device_json(r, missing) for r in rows],
                "broken_plugins": broken,
                "disabled_plugins": disabled,
                "not_installed": [{"device": d, "install": how[d]} for d in sorted(missing)],
                "policy": placement.policy.to_dict(),
                "environment": [{"variable": s.name, "value": os.environ.get(s.name), "meaning": s.doc,
                                 "owner": s.owner} for s in settings],
            }
            if g is not None:
                doc["graph"] = {"name": g.name, "symbols": list(g.symbols), "priced_at": priced_at(g)}
            if g is None:  # what a first run picks (recommended is by priority without a graph)
                device, why = example_pick(placement.policy, placement.registry)
                doc["example_pick"] = {"example": REPRESENTATIVE, "device": device, "why": why}
            print(json.dumps(doc, indent=2))
            return
        _print_devices(rows, missing, with_graph=g is not None)
        priced = priced_line(g) if g is not None else None
        if priced:
            console.print(priced)
        if g is None:
            device, why = example_pick(placement.policy, placement.registry)
            console.print(f"rec. (recommended) is the highest-priority usable device; `rlx run --example "
                          f"{REPRESENTATIVE}` runs on {device or 'no device'}: {why}", soft_wrap=False)
        if broken:
            console.print("Broken plugins (rlx works without them):")
            _print_prose((f"{b['name']}: {b['error']}" for b in broken), indent="  ")
        if disabled:
            console.print(f"Disabled by RLX_DISABLE_PLUGINS: {', '.join(disabled)}")
        if explain:
            _print_explain(placement, rows, missing, settings)


def _print_prose(lines: Any, indent: str = "") -> None:
    """Lines of plugin text, escaped and wrapped at the console's width."""
    from rich.markup import escape

    from .common import console

    for line in lines:
        console.print(f"{indent}{escape(line)}", soft_wrap=False)


def _print_devices(rows: Sequence[DeviceCandidate], missing: set[str], with_graph: bool) -> None:
    """The device table, narrow enough for an 80-column terminal: the state of each device
    in one word, its reason (a driver's message, a blocker, a pip command) as a numbered
    note under the table, where it wraps as prose instead of stretching a cell."""
    from rich.table import Table

    from .common import Notes, _seconds, console

    if not rows:
        console.print("No working rlx backend is installed. The cpu backend comes with `pip install rlx-core`.")
        return
    table = Table(title="rlx devices" + (" for this graph" if with_graph else ""), title_justify="left")
    columns = [("device", False), ("status", False), ("ops", False), ("model", False), ("rec.", False)]
    # with a graph, its estimate takes the place of where the backends came from
    columns += [("est. per run", False)] if with_graph else [("label", True), ("package", True)]
    for col, wraps in columns:
        table.add_column(col, overflow="fold", no_wrap=not wraps, min_width=None if wraps else len(col),
                         justify="right" if col == "est. per run" else "left")
    notes = Notes()
    colour = {"usable": "green", "blocked": "yellow", "unavailable": "red", "not installed": "dim"}
    for r in rows:
        state, why = device_state(r, missing)
        if state == "unavailable" and not r.registered:  # its error is said once, under Broken plugins
            why = "its plugin failed to load (see Broken plugins below)"
        status = f"[{colour[state]}]{state}[/]" + (f" {notes.add(f'{r.device}: {why}')}" if why else "")
        installed = state != "not installed" and r.registered
        model = ("calibrated" if r.calibrated else "default") if installed else "-"
        pick = "[bold]yes[/]" if r.recommended else ""
        cells = [r.device, status, str(len(r.ops)) if installed else "-", model, pick]
        if with_graph:
            cells.append(_seconds(r.est_seconds) if state == "usable" else "-")
        else:
            dist = " ".join(x for x in (r.distribution, r.version) if x)
            cells += [r.label or "-", dist or "-"]
        table.add_row(*cells)
    console.print(table)
    notes.print()


def _print_explain(placement: Placement, rows: Sequence[DeviceCandidate], missing: set[str],
                   variables: Sequence[Setting]) -> None:
    from dataclasses import replace

    from rich.table import Table

    from ..errors import DeviceError
    from .common import console

    settings = placement.policy.to_dict()
    sources = settings.pop("sources")
    table = Table("setting", "value", "from", title="Effective device policy", title_justify="left")
    for name, value in settings.items():
        table.add_row(name, json.dumps(value), str(sources.get(name, "default")))
    console.print(table)
    console.print("RLX_* environment (rlx-core's, then each plugin's, named in brackets):")  # prose: a sentence each
    lines = []
    for s in variables:
        value = os.environ.get(s.name)
        owner = f" [{s.owner}]" if s.owner != "rlx-core" else ""
        lines.append(f"{s.name}={value!r}{owner} — {s.doc}" if value is not None else
                     f"{s.name} (unset){owner} — {s.doc}")
    _print_prose(lines, indent="  ")
    _print_probes(placement, rows)
    if placement.graph is not None and _print_split(placement, rows):
        return
    if placement.graph is None:  # the question the no-graph pick answered (see Placement.report)
        from ..examples import REPRESENTATIVE, representative_graph
        from ..placement.ranking import Placement

        placement = Placement(representative_graph(), replace(placement.policy, pick="cost"), placement.registry)
        by_name = {r.device: r for r in placement.report()}
        rows = [by_name.get(r.device, r) for r in rows]
        console.print(f"Without --graph, rlx has no graph of yours to price: rec. marks the highest-priority usable "
                      f"device, and what follows is for `rlx run --example {REPRESENTATIVE}`; pass --graph FILE "
                      "for yours.")
    try:
        device, why, _ = placement.choose()
        console.print(f"Why {device}: {why}")
    except DeviceError as exc:
        console.print(f"No device: {exc}")
    _print_prose(f"Why not {name}: {reason}" for name, reason in _why_not(rows, missing).items())


def _print_split(placement: Placement, rows: Sequence[DeviceCandidate]) -> bool:
    """The segments, devices and transfers of the split ``rlx.compile`` would take for the
    graph (``docs/partition.md``); False, after saying why, when it runs whole."""
    from ..placement.partition import split_for
    from .common import console

    split = split_for(placement, [r for r in rows if r.registered])
    if isinstance(split, str):
        _print_prose([f"No split: {split}"])
        return False
    console.print(f"Split across {' + '.join(split.devices)}:")
    _print_prose(split.describe(), indent="  ")
    return True


def _print_probes(placement: Placement, rows: Sequence[DeviceCandidate]) -> None:
    """What each backend's probe said, available ones included, with the versions it found
    (e.g. the jax backend's platform and ``JAX_PLATFORMS``), as prose: a driver's message
    does not fit a cell."""
    from .common import console

    console.print("Backend probes:")
    for r in rows:
        if not r.registered:
            continue
        try:
            versions: Mapping[str, str] = placement.registry.availability(r.device).versions
        except Exception:  # a broken backend: its row already says why
            versions = {}
        said = ("available" if r.available else "unavailable") + (f": {r.reason}" if r.reason else "")
        found = ", ".join(f"{k} {v}" for k, v in versions.items())
        line = f"{r.device}: {said}" + (f"; versions: {found}" if found else "")
        _print_prose([line + _shapes_line(placement, r.device)], indent="  ")


def _shapes_line(placement: Placement, device: str) -> str:
    """How the backend serves a new set of sizes of a symbolic graph (``compile_symbolic``)."""
    from ..plugin import runs_symbolic

    try:
        backend = placement.registry.get(device)
    except Exception:  # a broken backend: its row already says why
        return ""
    if runs_symbolic(backend):
        doc = " ".join((type(backend).compile_symbolic.__doc__ or "").split())
        how = doc.split(": ", 1)[0].split(". ", 1)[0].replace("``", "") if doc else "one executable for every size"
        return (f"; symbolic dims: {how[:1].lower()}{how[1:]}, through compile_symbolic; a size met often may be "
                "compiled for itself")
    return "; symbolic dims: compiled per set of sizes"
