"""Rewriting one ``## Section`` of BENCHMARKS.md and leaving every other section alone.

Several scripts share BENCHMARKS.md (``bench/overhead.py`` owns ``## Dispatch
overhead``, ``bench/suite.py`` owns ``## Suite`` and ``## Machine``), so each replaces
only its own level-2 sections, in place, and appends one that is not there yet. A
section runs from its ``## `` heading to the next ``## `` heading (deeper headings
belong to it). The file is written atomically, so an interrupted run never leaves a
half-written file behind.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

TITLE = "# rlx benchmarks\n"
_HEADING = re.compile(r"^## (.+?)\s*$", re.MULTILINE)


def replace_sections(text: str, sections: Mapping[str, str]) -> str:
    """``text`` with each ``## <heading>`` section's body replaced by ``sections[heading]``.

    Headings are matched exactly (``"Suite"`` matches ``## Suite``); new sections are
    appended in the order given. Bodies are stripped and end with one blank line.
    """
    if not text.strip():
        text = TITLE
    starts = [(m.start(), m.group(1)) for m in _HEADING.finditer(text)]
    head = text[: starts[0][0]] if starts else text
    chunks: list[tuple[str | None, str]] = [(None, head)]
    for i, (pos, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        chunks.append((name, text[pos:end]))
    done = set()
    out = []
    for name, chunk in chunks:
        if name is not None and name in sections:
            out.append(_section(name, sections[name]))
            done.add(name)
        else:
            out.append(chunk if chunk.endswith("\n\n") or not chunk.strip() else chunk.rstrip("\n") + "\n\n")
    for name, body in sections.items():
        if name not in done:
            out.append(_section(name, body))
    return "".join(out).rstrip("\n") + "\n"


def _section(name: str, body: str) -> str:
    return f"## {name}\n\n{body.strip()}\n\n"


def update_file(path: str | os.PathLike[str], sections: Mapping[str, str]) -> None:
    """Replace ``sections`` in the markdown file at ``path`` (created when missing)."""
    target = Path(path)
    old = target.read_text(encoding="utf-8") if target.exists() else ""
    write_atomic(target, replace_sections(old, sections))


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
