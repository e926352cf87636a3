"""The ``rlx`` command: a doctor for devices and a runner for graphs.

``rlx devices`` answers "what can run here, and why (not)?"; ``rlx run`` and ``rlx bench``
run a graph file or a bundled example; ``rlx calibrate`` and ``rlx cache`` manage the
measured cost models. Every ``RlxError`` becomes one ``error: ...`` line on stderr and
exit code 2. Imports of the runtime happen inside the commands, so ``rlx --help`` and
``rlx --version`` stay quick and no backend library is imported before it is needed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from ._cli_batch import register as _register_batch  # its own module; imports nothing heavy
from ._cli_calibrate import register as _register_calibrate
from ._cli_check import register as _register_check
from ._cli_common import EXAMPLES, _fail, _load_graph, _parse_dims, _print_error, _seconds, _user_errors, console
from .errors import PluginWarning, RlxError

if TYPE_CHECKING:
    import numpy as np

    from .ir import Graph

__all__ = ["app", "main", "EXAMPLES"]

app = typer.Typer(
    name="rlx",
    help="rlx: run ML graphs on the fastest device installed here.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
cache_app = typer.Typer(help="Inspect or clear the on-disk cache (calibrated cost models).", no_args_is_help=True)
app.add_typer(cache_app, name="cache")

_DimsOption = Annotated[list[str] | None, typer.Option("--dim", help="Bind an ONNX symbolic dim: NAME=N (repeatable).")]
_DevicesOption = Annotated[list[str] | None, typer.Option(
    "--devices", help="Devices to time (comma-separated or repeated; default: every viable one).")]


def _make_inputs(graph: Graph, specs: Sequence[str], seed: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """Arrays for every graph input: from ``NAME=FILE.npy`` specs, the rest random (seeded)."""
    import numpy as np

    from .errors import InputError
    from .inputs import random_inputs

    names = [graph.node(i).name for i in graph.inputs]
    feeds: dict[str, np.ndarray] = {}
    notes: list[str] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise typer.BadParameter(f"expected NAME=FILE.npy, got {spec!r}", param_hint="'--input'")
        if name not in names:
            known = ", ".join(names) or "none"
            raise InputError(f"--input {name}: the graph has no input {name!r}; its inputs: {known}")
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"--input {name}: cannot read {path!r} as a .npy array: {exc}") from None
        if not isinstance(arr, np.ndarray):  # an .npz archive
            arr.close()
            raise InputError(f"--input {name}: {path!r} is an .npz archive; give one array as .npy")
        feeds[name] = arr
        notes.append(f"input {name}: {arr.dtype}{list(arr.shape)} from {path}")
    for name, arr in random_inputs(graph, seed).items():
        if name not in feeds:
            feeds[name] = arr
            notes.append(f"input {name}: random {arr.dtype}{list(arr.shape)} (seed {seed}; "
                         f"give --input {name}=FILE.npy to choose)")  # fmt: skip
    return feeds, notes


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    return str(value)


def _ops(row: Any) -> list[str]:
    ops = getattr(row, "ops", None) or ()
    return sorted(str(op) for op in ops)


# --------------------------------------------------------------------------- --version
def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import entry_points

    from . import __version__
    from .plugin import ENTRY_POINT_GROUP

    print(f"rlx-core {__version__}")
    # Read from package metadata: no plugin module is imported to answer this.
    plugins: dict[tuple[str, str], set[str]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        key = (dist.metadata["Name"], dist.version) if dist is not None else ("(unknown distribution)", "")
        plugins.setdefault(key, set()).add(ep.name)
    for (name, version), eps in sorted(plugins.items()):
        print(f"{name} {version} (backends: {', '.join(sorted(eps))})")
    raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Show rlx-core and plugin versions."),
    ] = False,
) -> None:
    """rlx: run ML graphs on the fastest device installed here."""


# --------------------------------------------------------------------------- devices
def _device_json(row: Any) -> dict[str, Any]:
    d = {
        "device": row.device,
        "label": row.label,
        "available": bool(row.available),
        "reason": row.reason or "",
        "distribution": getattr(row, "distribution", None),
        "version": getattr(row, "version", None),
        "ops": _ops(row),
        "calibrated": bool(getattr(row, "calibrated", False)),
        "recommended": bool(row.recommended),
        "blocker": row.blocker or None,
        # installed (its plugin loaded) / available (its probe says yes) / usable (and the
        # policy, and the graph when one is given, let it run)
        "installed": bool(getattr(row, "registered", True)),
        "usable": bool(getattr(row, "viable", False)),
    }
    for extra in ("priority", "registered", "supports_graph", "est_seconds"):
        d[extra] = _jsonable(getattr(row, extra, None))
    return d


def _why_not(rows: Sequence[Any]) -> dict[str, str]:
    """For a graph: why each device other than the recommended one is not the choice."""
    rec = next((r for r in rows if r.recommended), None)
    why_not = {}
    for r in rows:
        if r is rec:
            continue
        if r.blocker or not r.available:
            why_not[r.device] = r.blocker or r.reason or "unavailable"
        elif rec is not None and r.est_seconds is not None and rec.est_seconds is not None:
            if math.isclose(r.est_seconds, rec.est_seconds, rel_tol=1e-9):
                why_not[r.device] = (f"same estimated cost ({_seconds(r.est_seconds)}) as {rec.device}, "
                                     f"lower priority ({r.priority} vs {rec.priority})")  # fmt: skip
            else:
                why_not[r.device] = f"estimated {_seconds(r.est_seconds)} per run vs {_seconds(rec.est_seconds)}"
        else:
            why_not[r.device] = "viable, ranked below by the policy"
    return why_not


@app.command()
def devices(
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Show the policy, RLX_* variables and the why.")] = False,
    graph: Annotated[Path | None, typer.Option("--graph", help="Rank devices for this graph .json.")] = None,
    example: Annotated[str | None, typer.Option("--example", help="Rank devices for a bundled example.")] = None,
) -> None:
    """List every discovered backend: available or why not, ops, cost model, recommended."""
    with _user_errors():
        from .placement import Placement
        from .policy import DevicePolicy, environment_settings
        from .registry import default_registry

        g = _load_graph(graph, example)[0] if graph is not None or example is not None else None
        placement = Placement(g, DevicePolicy.from_env(), default_registry())
        with warnings.catch_warnings():  # broken plugins are listed below, not warned about
            warnings.simplefilter("ignore", PluginWarning)
            rows = placement.report()  # probes every backend concurrently; broken() is complete after it
        broken = [{"name": name, "error": str(error)} for name, error in placement.registry.broken()]
        disabled = sorted(placement.registry.disabled())
        missing = placement.registry.not_installed()
        if json_out:
            doc = {
                "devices": [_device_json(r) for r in rows],
                "broken_plugins": broken,
                "disabled_plugins": disabled,
                "not_installed": [{"device": d, "install": how} for d, how in missing.items()],
                "policy": placement.policy.to_dict(),
                "environment": [{"variable": k, "value": v, "meaning": m} for k, v, m in environment_settings()],
            }
            print(json.dumps(doc, indent=2))
            return
        _print_devices([r for r in rows if r.registered], with_graph=g is not None)
        if broken:
            table = Table("plugin (entry point)", "error", title="Broken plugins", title_justify="left")
            for b in broken:
                table.add_row(b["name"], b["error"])
            console.print(table)
        if disabled:
            console.print(f"Disabled by RLX_DISABLE_PLUGINS: {', '.join(disabled)}")
        if missing:
            console.print("Not installed: " + "; ".join(f"{d} ({how})" for d, how in missing.items()))
        if explain:
            _print_explain(placement, rows, environment_settings())


def _print_devices(rows: Sequence[Any], with_graph: bool) -> None:
    """The device table, narrow enough for an 80-column terminal: a long reason or blocker
    (a driver's message, a pip command) goes under the table, numbered from its row, where
    it wraps as prose instead of stretching one cell down the screen."""
    from rich.markup import escape  # reasons are plugin text: "pip install jax[tpu]" is not markup

    if not rows:
        console.print("No working rlx backend is installed. The cpu backend comes with `pip install rlx-core`.")
        return
    table = Table(title="rlx devices" + (" for this graph" if with_graph else ""), title_justify="left")
    columns = [("device", False), ("status", False), ("ops", False), ("model", False), ("pick", False)]
    if with_graph:  # the graph's columns take the place of where the backends came from
        columns += [("est. per run", False), ("blocker", False)]
    else:
        columns += [("label", True), ("distribution", True)]
    for col, wraps in columns:
        table.add_column(col, overflow="fold", no_wrap=not wraps, justify="right" if col == "est. per run" else "left")
    notes: list[str] = []

    def note(text: str) -> str:
        notes.append(text)
        return f"({len(notes)})"

    for r in rows:
        dist = " ".join(str(x) for x in (getattr(r, "distribution", None), getattr(r, "version", None)) if x)
        status = "[green]available[/]" if r.available else (
            f"[red]unavailable[/] {note(f'{r.device}: {r.reason}')}" if r.reason else "[red]unavailable[/]")
        model = "calibrated" if getattr(r, "calibrated", False) else "default"
        cells = [r.device, status, str(len(_ops(r))), model, "[bold]yes[/]" if r.recommended else ""]
        if with_graph:  # the blocker, when it is more than the unavailable reason, as a note
            blocker = r.blocker or ""
            same = blocker and not r.available and r.reason and r.reason in blocker
            cells += [_seconds(r.est_seconds), "" if not blocker or same else note(f"{r.device}: {blocker}")]
        else:
            cells += [r.label or "", dist or "-"]
        table.add_row(*cells)
    console.print(table)
    for i, text in enumerate(notes, 1):
        console.print(f"({i}) {escape(text)}", soft_wrap=False)


def _print_explain(placement: Any, rows: Sequence[Any], env: Sequence[tuple[str, str | None, str]]) -> None:
    from .errors import DeviceError

    settings = placement.policy.to_dict()
    sources = settings.pop("sources")
    table = Table("setting", "value", "from", title="Effective device policy", title_justify="left")
    for name, value in settings.items():
        table.add_row(name, json.dumps(value), str(sources.get(name, "default")))
    console.print(table)
    table = Table("variable", "value", "meaning", title="RLX_* environment", title_justify="left")
    for var, value, meaning in env:
        table.add_row(var, "[dim](unset)[/]" if value is None else value, meaning)
    console.print(table)
    _print_probes(placement, rows)
    if placement.graph is None:
        console.print("Without --graph, [bold]recommended[/] marks the highest-priority available device; "
                      "pass --graph FILE to see the choice for a graph.")  # fmt: skip
        return
    if _print_split(placement, rows):
        return
    try:
        device, why, _ = placement.choose()
        console.print(f"Why {device}: {why}")
    except DeviceError as exc:
        console.print(f"No device: {exc}")
    for name, reason in _why_not(rows).items():
        console.print(f"Why not {name}: {reason}")


def _print_split(placement: Any, rows: Sequence[Any]) -> bool:
    """The segments, devices and transfers of the split ``rlx.compile`` would take for the
    graph (``docs/partition.md``); False, after saying why, when it runs whole."""
    from rich.markup import escape

    from .partition import split_for

    split = split_for(placement, [r for r in rows if r.registered])
    if isinstance(split, str):
        console.print(f"No split: {escape(split)}", soft_wrap=False)
        return False
    console.print(f"Split across {' + '.join(split.devices)}:")
    for line in split.describe():
        console.print(f"  {escape(line)}", soft_wrap=False)
    return True


def _print_probes(placement: Any, rows: Sequence[Any]) -> None:
    """What each backend's probe said, available ones included, with the versions it found
    (e.g. the jax backend's platform and ``JAX_PLATFORMS``): the table shows only failures."""
    from rich.markup import escape

    table = Table("device", "probe said", "versions", title="Backend probes", title_justify="left")
    for r in rows:
        if not r.registered:
            continue
        try:
            versions = placement.registry.availability(r.device).versions
        except Exception:  # a broken backend: its row already says why
            versions = {}
        said = ("available" if r.available else "unavailable") + (f": {r.reason}" if r.reason else "")
        table.add_row(r.device, escape(said), escape(", ".join(f"{k} {v}" for k, v in versions.items()) or "-"))
    console.print(table)


# --------------------------------------------------------------------------- run
def _summary_row(name: str, arr: np.ndarray) -> list[str]:
    import numpy as np

    if arr.size == 0:
        stats = ["-", "-", "-"]
    else:
        a = arr.astype(np.float64) if arr.dtype == np.bool_ else arr
        stats = [f"{a.min():.6g}", f"{a.max():.6g}", f"{float(np.mean(a, dtype=np.float64)):.6g}"]
    return [name, str(list(arr.shape)), str(arr.dtype), *stats]


def _save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write an .npz atomically: a temp file beside it, then rename over the target."""
    import numpy as np

    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        _fail(f"cannot write {str(path)!r}: {exc.strerror or exc}")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@app.command()
def run(
    file: Annotated[Path | None, typer.Argument(help="Graph .json or ONNX model .onnx.")] = None,
    example: Annotated[str | None, typer.Option("--example", help="Run a bundled example (mlp).")] = None,
    device: Annotated[str, typer.Option("--device", "-d", help="Device, or 'auto' for the policy's pick.")] = "auto",
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE.npy (repeatable).")] = None,
    dims: _DimsOption = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the outputs to this .npz.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for inputs not given.")] = 0,
) -> None:
    """Compile a graph (.json or .onnx), run it once, and summarize its outputs."""
    with _user_errors():
        from . import compile as rlx_compile

        g, origin = _load_graph(file, example, dims or [])
        feeds, notes = _make_inputs(g, inputs or [], seed)
        console.print(f"graph: {g.name} ({len(g)} nodes) from {origin}")
        for note in notes:
            console.print(note)
        t0 = time.perf_counter()
        cg = rlx_compile(g, device=device)
        compile_s = time.perf_counter() - t0
        report = cg.report()
        t0 = time.perf_counter()
        outputs = cg.run(feeds)
        run_s = time.perf_counter() - t0
        console.print(f"device: [bold]{cg.device}[/] — {getattr(report, 'reason', '') or 'chosen by the policy'}")
        console.print(f"compile: {_seconds(getattr(report, 'compile_seconds', None) or compile_s)}   "
                      f"run: {_seconds(run_s)} (first run)")  # fmt: skip
        names = g.output_names()
        table = Table("output", "shape", "dtype", "min", "max", "mean", title_justify="left")
        for name, arr in zip(names, outputs):
            table.add_row(*_summary_row(name, arr))
        console.print(table)
        if out is not None:
            _save_npz(out, dict(zip(names, outputs)))
            console.print(f"wrote {out} ({', '.join(names)})")


# --------------------------------------------------------------------------- bench
def _split_names(values: Sequence[str]) -> list[str]:
    """``--devices cpu,jax --devices opencl`` as ``["cpu", "jax", "opencl"]``."""
    return [part.strip() for v in values for part in v.split(",") if part.strip()]


@app.command()
def bench(
    file: Annotated[Path | None, typer.Argument(help="Graph .json or ONNX model .onnx to time.")] = None,
    example: Annotated[str | None, typer.Option("--example", help="Time a bundled example.")] = None,
    devices: _DevicesOption = None,
    peers: Annotated[bool, typer.Option("--peers", help="Also time onnxruntime (for .onnx) and plain numpy.")] = False,
    runs: Annotated[int, typer.Option("--runs", "-n", help="Timed runs per contender, in up to 5 blocks.")] = 20,
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE.npy (repeatable).")] = None,
    dims: _DimsOption = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for the random inputs.")] = 0,
) -> None:
    """Time a graph on each viable device (and, with --peers, onnxruntime and numpy), interleaved.

    Each contender runs in a worker process of its own (``rlx_core._bench_worker``), so a
    kernel or peer that crashes becomes a row saying how it died; ``RLX_ISOLATION=0`` keeps
    them all in this process.
    """
    with _user_errors():
        from . import devices_for, resolve_device
        from .isolation import isolation_enabled
        from .onnx._peers import numpy_peer, onnxruntime_peer, rlx_contender, time_interleaved

        if runs < 1:
            raise typer.BadParameter(f"must be >= 1, got {runs}", param_hint="'--runs'")
        g, origin = _load_graph(file, example, dims or [])
        feeds, notes = _make_inputs(g, inputs or [], seed)
        chosen = resolve_device(g)
        targets = _split_names(devices or []) or list(dict.fromkeys([chosen, *devices_for(g)]))
        is_onnx = file is not None and file.suffix.lower() == ".onnx"
        console.print(f"graph: {g.name} ({len(g)} nodes) from {origin}")
        for note in notes:
            console.print(note)
        with contextlib.ExitStack() as workers:
            if isolation_enabled(os.environ):
                from ._bench_worker import WorkerPool

                pool = workers.enter_context(WorkerPool(g, feeds, file, _parse_dims(dims or [])))
                contenders = [pool.rlx(d, "chosen" if d == chosen else "") for d in targets]
                if peers:
                    contenders += [pool.onnxruntime()] if is_onnx else []
                    contenders.append(pool.numpy())
            else:
                contenders = [rlx_contender(g, d, feeds, "chosen" if d == chosen else "") for d in targets]
                if peers:
                    contenders += [onnxruntime_peer(file, feeds)] if file is not None and is_onnx else []
                    contenders.append(numpy_peer(g, feeds))
            with console.status("timing (interleaved blocks, 150 ms apart)"):
                time_interleaved(contenders, runs)
        # The ratios are to the device rlx would pick; when --devices left it out, to the
        # first rlx device that ran (a column of blanks would say nothing).
        timed = [c for c in contenders if c.kind == "rlx" and c.median]
        ref = next((c for c in timed if c.note == "chosen"), timed[0] if timed else None)
        base = ref.median if ref is not None else None
        table = Table("contender", "compile", "median / run", "best / run", f"vs {ref.name if ref else 'rlx'}", "note",
                      title=f"rlx bench: {runs} runs each", title_justify="left")  # fmt: skip
        for c in contenders:
            ratio = f"{c.median / base:.2f}x" if c.median is not None and base else ""
            note = f"[bold]{c.note}[/]" if c.note == "chosen" else c.note
            table.add_row(c.name, _seconds(c.compile_seconds), _seconds(c.median), _seconds(c.best), ratio, note)
        console.print(table)


# --------------------------------------------------------------------------- cache
@cache_app.command("info")
def cache_info_command(
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
) -> None:
    """Where the cache lives and what it holds."""
    with _user_errors():
        from .cache import cache_info

        info = cache_info()
        if json_out:
            print(json.dumps(_jsonable(info), indent=2))
            return
        table = Table("", "", show_header=False, title="rlx cache", title_justify="left")
        for key, value in info.items():
            table.add_row(str(key), str(value))
        console.print(table)


@cache_app.command("clear")
def cache_clear_command() -> None:
    """Delete every cached entry (they are recomputed when needed)."""
    with _user_errors():
        from .cache import cache_dir, clear_cache

        removed = clear_cache()
        console.print(f"removed {removed} file{'s' if removed != 1 else ''} from {cache_dir()}")


# --------------------------------------------------------------------------- calibrate, batch
_register_calibrate(app)
_register_check(app)
_register_batch(app)


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:  # fmt: skip
    """Warnings as one ``warning:`` line each: the source line means nothing to a CLI user."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


# Typer raises click's exceptions from its own copy of click: found through a public class.
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``rlx`` script and ``python -m rlx_core``."""
    warnings.showwarning = _show_warning
    args = list(argv) if argv is not None else sys.argv[1:]
    try:
        code = app(args=args, prog_name="rlx", standalone_mode=False)
    except RlxError as exc:  # raised outside a command body (e.g. while parsing)
        _print_error(str(exc))
        sys.exit(2)
    except _CLICK_ERROR as exc:  # a usage mistake: like every other one, a single error line and exit 2
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `rlx` or `rlx cache`: the help, as before
            with contextlib.suppress(SystemExit):
                app(args=[*args, "--help"], prog_name="rlx")
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        where = f" (see '{ctx.command_path} --help')" if ctx is not None and isinstance(exc, _USAGE_ERROR) else ""
        _print_error(f"{exc.format_message()}{where}")
        sys.exit(int(getattr(exc, "exit_code", 2)))
    if isinstance(code, int) and code:
        sys.exit(code)
