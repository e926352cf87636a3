"""What every ``rlx`` command shares: the console, the one-line ``error:`` and the
seconds format. Its own module so that ``cli.py`` and the commands kept in their own
modules (``_cli_batch``, ``_cli_calibrate``) import it without importing each other.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console

from .errors import RlxError

__all__ = ["console", "_print_error", "_fail", "_user_errors", "_seconds"]

console = Console(highlight=False)


def _print_error(message: str) -> None:
    line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    print(f"error: {line}", file=sys.stderr, flush=True)


def _fail(message: str) -> NoReturn:
    """Print one ``error:`` line on stderr and exit 2 (usage-level failure)."""
    _print_error(message)
    raise typer.Exit(2)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn any ``RlxError`` into ``_fail``; anything else is a bug and keeps its traceback."""
    try:
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
