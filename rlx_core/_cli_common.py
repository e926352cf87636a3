"""What every ``rlx`` command shares: the console, the one-line ``error:``, the seconds
format, and loading the graph a command is given (a file or a bundled example). Its own
module so that ``cli.py`` and the commands kept in their own modules (``_cli_batch``,
``_cli_calibrate``, ``_cli_check``) import it without importing each other.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.console import Console

from .errors import RlxError
from .examples import EXAMPLES, example_text

if TYPE_CHECKING:
    from .ir import Graph

__all__ = ["console", "_print_error", "_fail", "_user_errors", "_seconds", "EXAMPLES", "_load_graph"]

console = Console(highlight=False)



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
