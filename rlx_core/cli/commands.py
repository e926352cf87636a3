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
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import RlxError
from .batch import register as _register_batch  # its own module; imports nothing heavy
from .calibrate import register as _register_calibrate
from .check import register as _register_check
from .common import (
    EXAMPLES,
    Notes,
    _fail,
    _jsonable,
    _load_graph,
    _parse_dims,
    _print_error,
    _seconds,
    _user_errors,
    check_out_path,
    console,
    file_mode,
    phases,
    require_devices,
)
from .devices import register as _register_devices

if TYPE_CHECKING:
    import numpy as np

    from ..ir import Graph

__all__ = ["app", "main", "EXAMPLES"]

app = typer.Typer(
    name="rlx",
    help="rlx: run ML graphs on the fastest device installed here.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
cache_app = typer.Typer(help="Inspect or clear rlx's on-disk caches (cost models, faults, plugins' caches).",
                        no_args_is_help=True)
app.add_typer(cache_app, name="cache")

_DimsOption = Annotated[list[str] | None, typer.Option("--dim", help="Bind an ONNX symbolic dim: NAME=N (repeatable).")]
_DevicesOption = Annotated[list[str] | None, typer.Option(
    "--devices", help="Devices to time (comma-separated or repeated; default: every viable one).")]


def _seed(value: int) -> int:
    """``--seed`` is what numpy's generators take: an integer >= 0 (a negative one was a
    ValueError from deep inside numpy, as a traceback)."""
    if value < 0:
        raise typer.BadParameter(f"{value} is not a seed; expected an integer >= 0", param_hint="'--seed'")
    return value


def _make_inputs(graph: Graph, specs: Sequence[str], seed: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """Arrays for every graph input: from ``NAME=FILE.npy`` specs, the rest random (seeded)."""
    import numpy as np

    from ..compiler.inputs import random_inputs
    from ..errors import InputError

    names = [graph.node(i).name for i in graph.inputs]
    feeds: dict[str, np.ndarray] = {}
    notes: list[str] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise typer.BadParameter(f"expected NAME=FILE.npy, got {spec!r}", param_hint="'--input'")
        if name not in names:
            given = {spec.partition("=")[0].strip() for spec in specs}
            absent = [n for n in names if n not in given]
            known = ", ".join(names) or "none"
            raise InputError(f"--input {name}: the graph has no input {name!r}; its inputs: {known}"
                             + (f" (not given: {', '.join(absent)})" if absent else ""))
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"--input {name}: cannot read {path!r} as a .npy array: {exc}") from None
        if not isinstance(arr, np.ndarray):  # an .npz archive
            arr.close()
            raise InputError(f"--input {name}: {path!r} is an .npz archive; give one array as .npy")
        feeds[name] = arr
        notes.append(f"input {name}: {arr.dtype}{list(arr.shape)} from {path}")
    made = random_inputs(graph, seed, {n: a.shape for n, a in feeds.items()}) if len(feeds) < len(names) else {}
    for name, arr in made.items():
        if name not in feeds:
            feeds[name] = arr
            notes.append(f"input {name}: random {arr.dtype}{list(arr.shape)} (seed {seed}; "
                         f"give --input {name}=FILE.npy to choose)")
    return feeds, notes


# --------------------------------------------------------------------------- --version
def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import entry_points

    from .. import __version__
    from ..plugin import ENTRY_POINT_GROUP

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


_register_devices(app)  # first in `rlx --help`: the doctor comes before the runner


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
            os.fchmod(fh.fileno(), file_mode())  # mkstemp's 0600 is for secrets, not results
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
    seed: Annotated[int, typer.Option("--seed", callback=_seed, help="Seed for inputs not given (>= 0).")] = 0,
    precision: Annotated[str, typer.Option(
        "--precision", help="fp32 (default), or bf16/fp16: allow float32 products with operands in that format "
                            "where the device computes it (docs/precision.md).")] = "fp32",
) -> None:
    """Compile a graph (.json or .onnx), run it once, and summarize its outputs."""
    with _user_errors(), phases() as phase:
        from .. import compile as rlx_compile
        from ..options import precision_name

        precision = precision_name(precision, "--precision")
        require_devices([device])  # before any work, as --out is
        if out is not None:
            check_out_path(out)
        phase(f"loading {file or example}")
        g, origin = _load_graph(file, example, dims or [])
        feeds, notes = _make_inputs(g, inputs or [], seed)
        console.print(f"graph: {g.name} ({len(g)} nodes) from {origin}")
        for note in notes:
            console.print(note)
        phase(f"compiling {g.name}" + (f" for {device}" if device != "auto" else " (choosing a device)"))
        t0 = time.perf_counter()
        cg = rlx_compile(g, device=device, precision=precision)
        compile_s = time.perf_counter() - t0
        report = cg.report()
        phase(f"running {g.name} on {cg.device}")
        t0 = time.perf_counter()
        outputs = cg.run(feeds)
        run_s = time.perf_counter() - t0
        console.print(f"device: [bold]{cg.device}[/] — {getattr(report, 'reason', '') or 'chosen by the policy'}")
        console.print(f"compile: {_seconds(getattr(report, 'compile_seconds', None) or compile_s)}   "
                      f"run: {_seconds(run_s)} (first run)")
        for note in getattr(report, "notes", ()) if precision != "fp32" else ():
            if note.startswith("precision"):  # whether the device took the permission, and where
                console.print(note, markup=False)
        names = g.output_names()
        table = Table("output", "shape", "dtype", "min", "max", "mean", title_justify="left")
        for name, arr in zip(names, outputs):
            table.add_row(*_summary_row(name, arr))
        console.print(table)
        if out is not None:
            phase(f"writing {out}")
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
    seed: Annotated[int, typer.Option("--seed", callback=_seed, help="Seed for the random inputs (>= 0).")] = 0,
) -> None:
    """Time a graph on each viable device (and, with --peers, onnxruntime and numpy), interleaved.

    Each contender runs in a worker process of its own (``rlx_core.cli.bench_worker``), so a
    kernel or peer that crashes becomes a row saying how it died; ``RLX_ISOLATION=0`` keeps
    them all in this process.
    """
    with _user_errors():
        from .. import devices_for, resolve_device
        from ..backends.isolation import isolation_enabled
        from ..onnx._peers import numpy_peer, onnxruntime_peer, rlx_contender, time_interleaved

        if runs < 1:
            raise typer.BadParameter(f"must be >= 1, got {runs}", param_hint="'--runs'")
        require_devices(_split_names(devices or []))
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
                from .bench_worker import WorkerPool

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
                      title=f"rlx bench: {runs} runs each", title_justify="left")
        notes = Notes()  # a failure's message (a compile error, how a worker died) below the table
        for c in contenders:
            ratio = f"{c.median / base:.2f}x" if c.median is not None and base else ""
            note = "[bold]chosen[/]" if c.note == "chosen" else escape(notes.cell(c.note))
            table.add_row(c.name, _seconds(c.compile_seconds), _seconds(c.median), _seconds(c.best), ratio, note)
        console.print(table)
        notes.print()


# --------------------------------------------------------------------------- cache
def _size(n: int) -> str:
    from ..compiler.memory import format_bytes

    return format_bytes(n)


@cache_app.command("info")
def cache_info_command(
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
) -> None:
    """Where the cache lives and what it holds, by namespace."""
    with _user_errors(check_environment=False):  # cleaning up needs no policy
        from ..cache import cache_info

        info = cache_info()
        if json_out:
            print(json.dumps(_jsonable(info), indent=2))
            return
        where = "RLX_CACHE_DIR" if os.environ.get("RLX_CACHE_DIR", "").strip() else "the user cache dir"
        console.print(f"rlx cache: {escape(info['path'])} ({where})", soft_wrap=False)
        if not info["namespaces"]:
            console.print("no entries yet (they are written when needed: rlx calibrate, a probe, a compile)")
            return
        table = Table("namespace", "entries", "size", "what", title_justify="left")
        for ns in info["namespaces"]:
            table.add_row(ns["name"], str(ns["entries"]), _size(ns["bytes"]), escape(ns["what"] or "-"))
        table.add_row("[bold]total[/]", str(info["total_entries"]), _size(info["bytes"]), "")
        console.print(table)
        for ns in info["namespaces"]:  # files rlx did not write: neither counted above nor cleared
            if ns["other"]:
                console.print(f"{escape(ns['name'])}: also {ns['other']} file{'s' if ns['other'] != 1 else ''} rlx did "
                              "not write (rlx cache clear leaves them)", soft_wrap=False)


@cache_app.command("clear")
def cache_clear_command(
    namespaces: Annotated[list[str] | None, typer.Argument(
        metavar="[NAMESPACE]...", help="Only these namespaces (see rlx cache info); default: all.")] = None,
) -> None:
    """Delete cached entries, every namespace or those named (they are recomputed when needed)."""
    with _user_errors(check_environment=False):
        from ..cache import cache_dir, clear_cache

        cleared = clear_cache(namespaces=namespaces or None)
        n = cleared.removed
        which = f" ({', '.join(namespaces)})" if namespaces else ""
        console.print(f"removed {n} file{'s' if n != 1 else ''}{which} from {escape(str(cache_dir()))}",
                      soft_wrap=False)
        for files, why in ((cleared.left, "rlx did not write"), (cleared.failed, "rlx could not remove")):
            if files:  # only what rlx wrote is deleted
                console.print(f"left {len(files)} file{'s' if len(files) != 1 else ''} {why} (e.g. "
                              f"{escape(str(files[0]))})", soft_wrap=False)


# --------------------------------------------------------------------------- the commands in their own modules
_register_calibrate(app)
_register_check(app)
_register_batch(app)


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
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
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `rlx` or `rlx cache`: the help, once
            # Typer's rich help prints itself while the error is made (its text is then
            # empty); a plain click's help is the error's text, printed here.
            text = exc.format_message()
            if text.strip():
                print(text)
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        where = f" (see '{ctx.command_path} --help')" if ctx is not None and isinstance(exc, _USAGE_ERROR) else ""
        _print_error(f"{exc.format_message()}{where}")
        sys.exit(int(getattr(exc, "exit_code", 2)))
    if isinstance(code, int) and code:
        sys.exit(code)
