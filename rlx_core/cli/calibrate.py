"""``rlx calibrate [DEVICE...] [--quick] [--verify]``: measure each device's cost model.

Kept out of ``cli.py`` (which only registers it) because calibrating is its own story:
each device is measured in a child process by ``Registry.calibrate`` (a crash there is a
recorded fault and a line here, never the end of the command), with its steps on a
progress bar, then optionally checked against the model suite (``rlx_core.run.verify``).

Nothing measured is lost in silence: the cache is checked for writing before any work
(exit 2, like any error in what was asked), and the model each device reports is saved
here, whichever process measured it, so that a save that fails (a read-only or full
disk) is a line naming the path and the reason and exit code 1, like a device whose
calibration failed; the table still shows what was measured.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``rlx calibrate`` to ``app``."""
    app.command("calibrate")(calibrate)


def calibrate(
    devices: Annotated[list[str] | None, typer.Argument(help="Devices (default: every available one).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer, smaller measurements.")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Then time the model suite: predicted vs measured, "
                                         "the pick and its regret per model.")] = False,
) -> None:
    """Measure each device's cost model on this host and cache it."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .common import Notes, _seconds, _user_errors, console, require_devices

    with _user_errors():
        from .. import available_devices, device_report
        from ..backends.registry import default_registry
        from ..calibration import check_calibration_writable
        from ..errors import DeviceError, PluginError

        registry = default_registry()
        targets = list(devices or available_devices())
        require_devices(targets)  # unknown or uninstalled names fail before any work
        rows = {r.device: r for r in device_report()}
        for d in targets:
            row = rows.get(d.split(":")[0])
            # A device disabled by its own crashed calibration may be calibrated again: that is the retry.
            if row is not None and not row.available and registry.fault(d) is None:
                raise DeviceError(f"cannot calibrate {d}: unavailable here ({row.reason})")
        if targets:
            check_calibration_writable()  # minutes per device: not for a cache that cannot keep them
        results: dict[str, Any] = {}
        problems: dict[str, str] = {}  # measured but not saved: said under the table
        failed: list[str] = []
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            task = progress.add_task("calibrating", total=len(targets))
            if targets:
                console.print(f"calibrating {', '.join(targets)}: about {len(targets) * (15 if quick else 60)} s")
            for i, d in enumerate(targets):
                progress.update(task, description=f"calibrating {d}")

                def step(what: str, frac: float, d: str = d, i: int = i) -> None:
                    progress.update(task, description=f"calibrating {d}: {what}", completed=i + min(frac, 1.0))

                try:
                    results[d] = _calibrate_and_save(registry, d, quick, step)
                except NotSaved as exc:
                    results[d], problems[d] = exc.model, str(exc)
                    failed.append(d)
                except NotImplementedError as exc:
                    results[d] = f"{d}: this backend cannot calibrate ({exc or 'not implemented'})"
                except ModuleNotFoundError as exc:
                    if not (exc.name or "").startswith("rlx_core.calibration"):
                        raise
                    results[d] = f"{d}: calibration is not available in this rlx-core yet"
                except (PluginError, DeviceError) as exc:  # raised, or its child died: the others go on
                    results[d] = f"{d}: calibration failed: {exc}" if isinstance(exc, PluginError) else str(exc)
                    failed.append(d)
                progress.update(task, completed=i + 1)
        table = Table("device", "sgemm GFLOP/s", "memory GB/s", "dispatch", "round trip", "source",
                      title="Calibrated cost models", title_justify="left")
        notes = Notes()  # a long source (a date, a plugin's own words) below the table
        for d, m in results.items():
            if isinstance(m, str):
                console.print(m, soft_wrap=False)
                continue
            dispatch, roundtrip = _seconds(m.dispatch_overhead_ns * 1e-9), _seconds(m.roundtrip_overhead_ns * 1e-9)
            source = escape(notes.cell(m.source, short=14))
            table.add_row(d, f"{m.sgemm_gflops:.1f}", f"{m.memory_bw_gbps:.1f}", dispatch, roundtrip, source)
        if table.row_count:
            console.print(table)
            notes.print()
        for problem in problems.values():
            console.print(escape(problem), soft_wrap=False)
        if verify:
            _verify_table([d for d in targets if d not in failed], quick)
        if failed:
            raise typer.Exit(1)


class NotSaved(Exception):
    """A device was measured but its model could not be saved (``model``: what was measured)."""

    def __init__(self, message: str, model: Any) -> None:
        super().__init__(message)
        self.model = model


def _calibrate_and_save(registry: Any, device: str, quick: bool, step: Any) -> Any:
    """Calibrate ``device`` and save the model it reports; ``NotSaved`` naming the path
    and the reason when the save fails.

    The registry hands back only the model, measured in a child process (or here, with
    ``RLX_ISOLATION=0``); a warning about a cache the child could not write died with
    it. Saving here (the same entry again, atomically) makes the outcome known the same
    way wherever the calibration ran, and keeps what the table shows (``recording_saves``
    turns the warnings of both saves into outcomes)."""
    from ..calibration import recording_saves, save_calibration

    with recording_saves():
        model = registry.calibrate(device, quick=quick, progress=step)
        outcome = save_calibration(registry.get(device), model)
    if not outcome.saved:
        why = outcome.error if outcome.path in outcome.error else f"{outcome.path}: {outcome.error}"
        raise NotSaved(f"{device}: measured but not saved ({why}); the default cost model stays in use: make the "
                       "cache writable (see `rlx cache info`) and calibrate again", model)
    return model


def _verify_table(devices: list[str], quick: bool) -> None:
    """``rlx calibrate --verify``: the suite's predicted vs measured times (rlx_core.run.verify)."""
    from rich.progress import BarColumn, Progress, TextColumn

    from ..run.verify import verify_cost_models
    from .common import Notes, _seconds, console

    with Progress(TextColumn("{task.description}"), BarColumn(), console=console, transient=True) as progress:
        task = progress.add_task("verifying", total=1.0)
        rows = verify_cost_models(devices=devices, scale=0.1 if quick else 1.0, rounds=5 if quick else 20,
                                  progress=lambda what, frac: progress.update(task, description=what, completed=frac))
    table = Table("model", "device", "predicted", "measured", "pred/meas", "", title="Cost model check",
                  title_justify="left")
    notes = Notes()  # a device's failure on a model, below the table
    for row in rows:
        for d in sorted(row.measured, key=row.measured.__getitem__):
            mark = "picked, best" if d == row.picked == row.best else "picked" if d == row.picked else (
                "best" if d == row.best else "")
            table.add_row(row.model, d, _seconds(row.predicted[d]), _seconds(row.measured[d]),
                          f"{row.prediction_ratio(d):.2f}x", mark)
        for d, err in row.errors.items():
            table.add_row(row.model, d, "", "", "", f"failed {notes.add(f'{row.model} on {d}: {err}')}")
    console.print(table)
    notes.print()
    for row in rows:
        console.print(f"{row.model}: picked {row.picked}, best {row.best}, regret {row.regret:.2f}x, "
                      f"worst prediction off by {row.worst_prediction_ratio:.2f}x")
