"""What every ``rlx`` command shares: the console, the one-line ``error:``, the seconds
format, and loading the graph a command is given (a file or a bundled example). Its own
module so that ``cli.py`` and the commands kept in their own modules (``_cli_batch``,
``_cli_calibrate``, ``_cli_check``) import it without importing each other.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console

from .errors import RlxError
from .examples import EXAMPLES, example_text

if TYPE_CHECKING:
    from .ir import Graph

__all__ = ["console", "_print_error", "_fail", "_user_errors", "_seconds", "EXAMPLES", "_load_graph", "Notes",
           "_jsonable"]



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
            from .policy import check_environment as check

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
    from .ir import Graph

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
        from . import onnx as rlx_onnx

        return rlx_onnx.load(file, dims=bound), str(file)
    return Graph.load(file), str(file)
