"""What every ``rlx`` command shares: the console, the one-line ``error:``, the seconds
format, and loading the graph a command is given (a file or a bundled example). Its own
module so that ``cli.py`` and the commands kept in their own modules (``_cli_batch``,
``_cli_calibrate``, ``_cli_check``) import it without importing each other.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console

from ..errors import RlxError
from ..examples import EXAMPLES, example_text

if TYPE_CHECKING:
    from ..ir import Graph

__all__ = ["console", "_print_error", "_fail", "_user_errors", "_seconds", "EXAMPLES", "_load_graph", "Notes",
           "_jsonable", "check_out_path", "file_mode", "require_devices", "phases"]



def _default_width() -> int | None:
    """80 columns when stdout is not a terminal and ``COLUMNS`` is unset, else rich's own
    choice. Rich measures any standard stream that is a terminal, stdin included, so
    ``rlx devices > report.txt`` typed in a wide terminal would write wide tables; a file
    or a pipe gets the width every table is made to fit instead."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        tty = False
    return None if tty or os.environ.get("COLUMNS", "").strip() else 80


console = Console(highlight=False, width=_default_width())



def _print_error(message: str) -> None:
    line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    print(f"error: {line}", file=sys.stderr, flush=True)


def _fail(message: str) -> NoReturn:
    """Print one ``error:`` line on stderr and exit 2 (usage-level failure)."""
    _print_error(message)
    raise typer.Exit(2)


@contextmanager
def _user_errors(check_environment: bool = True) -> Iterator[None]:
    """Turn any ``RlxError`` into ``_fail``; anything else is a bug and keeps its traceback.

    First, unless told not to (``rlx cache`` needs no policy), every ``RLX_*`` variable is
    parsed: a malformed one is one ``error:`` line naming it before any work, whichever
    command meets it, instead of, say, a failure per device from ``rlx bench``.
    """
    try:
        if check_environment:
            from ..run.settings import check_environment as check

            check()
        yield
    except RlxError as exc:
        _fail(str(exc))


class Notes:
    """Numbered notes under a table: a long reason (a driver's message, a blocker, a pip
    command, an error) is referenced from its cell as ``(N)`` and printed below the table,
    where it wraps as prose. Whatever a plugin says, the table keeps to 80 columns and a
    cell to one line."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def add(self, text: str) -> str:
        """Keep ``text`` as the next note and return its marker, ``(N)``."""
        self.texts.append(text)
        return f"({len(self.texts)})"

    def cell(self, text: str, short: int = 20) -> str:
        """``text`` itself when it is at most ``short`` characters, else a note's marker
        (prefixed with ``text``'s first word when that names a state, e.g. ``failed (2)``)."""
        if len(text) <= short:
            return text
        word = text.split(":", 1)[0]
        return f"{word} {self.add(text)}" if word != text and len(word) <= 12 and " " not in word else self.add(text)

    def print(self, out: Console | None = None) -> None:
        """Print the notes, one paragraph each, plugin text escaped (``pip install jax[tpu]``
        is not rich markup)."""
        from rich.markup import escape

        for i, text in enumerate(self.texts, 1):
            (out or console).print(f"({i}) {escape(text)}", soft_wrap=False)


def _jsonable(value: Any) -> Any:
    """``value`` with every mapping, sequence and set made JSON-ready (sets sorted)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    return str(value)


def _seconds(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _parse_dims(specs: Sequence[str]) -> dict[str, int]:
    """``--dim NAME=N`` options as ``{NAME: N}`` (an ONNX model's symbolic dims)."""
    dims: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value.isdigit():
            raise typer.BadParameter(f"expected NAME=N with N an int >= 0, got {spec!r}", param_hint="'--dim'")
        dims[name] = int(value)
    return dims


def _load_graph(file: Path | None, example: str | None, dims: Sequence[str] = ()) -> tuple[Graph, str]:
    """The graph named by FILE or ``--example`` (exactly one), and where it came from."""
    from ..ir import Graph

    if (file is None) == (example is None):
        raise typer.BadParameter("give a graph FILE or --example NAME (one of them)")
    bound = _parse_dims(dims)
    is_onnx = file is not None and file.suffix.lower() == ".onnx"
    if bound and not is_onnx:
        raise typer.BadParameter("only ONNX models have symbolic dims to bind", param_hint="'--dim'")
    if example is not None:
        return Graph.from_json(example_text(example)), f"bundled example {example!r}"
    assert file is not None
    if is_onnx:
        from .. import onnx as rlx_onnx

        return rlx_onnx.load(file, dims=bound), str(file)
    return Graph.load(file), str(file)


def _priced(graph: Graph) -> Graph | None:
    """The graph estimates are for: ``graph``, a staged graph's first part (built at load),
    or none for a graph with no body before it runs."""
    from ..ir.valued import RunTimeGraph

    return graph.priced() if isinstance(graph, RunTimeGraph) else graph


def priced_at(graph: Graph) -> dict[str, int] | None:
    """The sizes a symbolic graph is placed and priced at (``None`` for a static graph, or
    one with no body before it runs): what ``rlx check`` and ``rlx devices --graph`` say
    their estimates are for."""
    priced = _priced(graph)
    if priced is None or not priced.is_symbolic:
        return None
    from ..ir.specialize import representative

    return representative(priced)[1]


def priced_line(graph: Graph) -> str | None:
    """``symbolic dims (batch, seq): estimates at batch=16, seq=16``; for a staged graph,
    which part the estimates are for; for one with no body yet, why there are none."""
    from ..ir.staged import StagedGraph
    from ..ir.valued import RunTimeGraph

    lines = []
    priced = _priced(graph)
    if isinstance(graph, StagedGraph) and priced is not None:
        part = graph.priced_part()
        lines.append(f"runs in steps: estimates are for its first part ({part.what if part else ''}); what "
                     "follows is built and compiled at run time for the sizes the data makes")
    elif isinstance(graph, RunTimeGraph):
        return f"{graph.needs()}; no estimate before its first run"
    sizes = priced_at(graph)
    if sizes is not None and priced is not None:
        at = ", ".join(f"{k}={v}" for k, v in sorted(sizes.items()))
        lines.append(f"symbolic dims ({', '.join(priced.symbols)}): estimates at {at}; runs at any sizes the "
                     "model accepts")
    return "; ".join(lines) or None


# --------------------------------------------------------------------------- checked before any work
def check_out_path(path: Path, option: str = "--out") -> None:
    """``ConfigError`` naming ``option`` and ``path`` when an output could not be written
    there: its folder is missing, not a folder or not writable, or the path is a folder.
    Checked before any work, so that a long run's results are not lost at the end."""
    from ..errors import ConfigError

    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ConfigError(f"{option} {str(path)!r} is a folder; give a file name, e.g. {str(path / 'out.npz')!r}")
    if not folder.exists():
        raise ConfigError(f"{option} {str(path)!r}: the folder {str(folder)!r} does not exist; create it first")
    if not folder.is_dir():
        raise ConfigError(f"{option} {str(path)!r}: {str(folder)!r} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ConfigError(f"{option} {str(path)!r}: cannot write in {str(folder)!r} "
                          f"({exc.strerror or type(exc).__name__})") from None


def file_mode() -> int:
    """The mode a new file gets from this process's umask (``0o666 & ~umask``): what
    ``open(path, "w")`` would give, which an atomic write's temp file (``mkstemp``:
    always 0600) does not."""
    try:  # Linux says it without changing it
        with open("/proc/self/status", encoding="ascii") as status:
            umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)  # elsewhere the only way to read it is to set it; put back at once
        os.umask(umask)
    return 0o666 & ~umask


def require_devices(devices: Sequence[str]) -> None:
    """Each of ``devices`` (``auto`` and blanks aside) is a backend here, checked before
    any work: ``DeviceError`` saying what to install for one of rlx's own backends
    whose plugin is missing (``device 'cuda' is not installed: pip install rlx-cuda``),
    else the registry's own message (the known devices; a disabled or broken plugin);
    an empty name is an error too, never ``auto``."""
    from ..backends.registry import default_registry, parse_device
    from ..errors import DeviceError

    registry = default_registry()
    for device in devices:
        if device == "auto":
            continue
        if not device.strip():
            raise DeviceError(f"device {device!r} is empty; give a device name such as 'cpu' or 'cuda:1', or 'auto'")
        name = parse_device(device)[0]
        install = registry.not_installed().get(name)
        if install is not None and name not in registry.names():
            raise DeviceError(f"device {device.strip()!r} is not installed: {install}")
        registry.info(device)


#: How long a command runs before its phase is shown (``phases``): a quick one shows none.
PHASE_DELAY_S = 1.0


class _Phases:
    """The current phase of a long command (``loading``, ``compiling on cpu``, ``running``)
    on a rich spinner, shown only once the command has taken ``delay`` seconds and only
    on a terminal: a quick command, a pipe or a log gets nothing extra. A timer thread
    starts it, so that the command's own thread pays nothing but a lock per phase."""

    def __init__(self, out: Any, delay: float) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._phase = ""
        self._status: Any = None
        self._closed = False
        self._timer: threading.Timer | None = None
        if out.is_terminal:
            self._timer = threading.Timer(delay, self._show)
            self._timer.daemon = True
            self._timer.start()

    def __call__(self, phase: str) -> None:
        with self._lock:
            self._phase = phase
            if self._status is not None:
                self._status.update(phase)

    def _show(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._status = self._out.status(self._phase or "working")
            self._status.start()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._status is not None:
                self._status.stop()  # transient: the spinner's line goes away


@contextmanager
def phases(out: Any = None, delay: float | None = None) -> Iterator[Callable[[str], None]]:
    """``with phases() as phase: phase("compiling"); ...``: see ``_Phases`` (``delay``:
    ``PHASE_DELAY_S``)."""
    tracker = _Phases(out or console, PHASE_DELAY_S if delay is None else delay)
    try:
        yield tracker
    finally:
        tracker.close()
