"""Every public name the documents name is importable where they name it (issue 32).

The contract (``../shared/ARCHITECTURE.md``, when it sits beside the checkout), the guides
in ``docs/`` and the README write names as ``rlx_core.a.b.c`` and point at source files
as ``rlx_core/a/b.py``. A module that moves, or a name that is renamed, must not leave a
document pointing at nothing: each dotted name resolves (the longest importable module,
then attributes), and each path exists.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                    *[p for p in [ROOT.parent / "shared" / "ARCHITECTURE.md"] if p.exists()]])
NAME = re.compile(r"\brlx_core(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"\brlx_core/[\w/]+\.py\b")


def _mentions(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    return sorted({(m, doc.name) for doc in DOCUMENTS for m in pattern.findall(doc.read_text(encoding="utf-8"))})


def _resolve(dotted: str) -> object:
    """The object ``dotted`` names: its longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_documents_name_something():
    assert len(_mentions(NAME)) > 20 and len(_mentions(PATH)) > 5


@pytest.mark.parametrize(("name", "document"), _mentions(NAME))
def test_a_documented_name_resolves(name, document):
    try:
        _resolve(name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{document} names {name}, which does not resolve: {exc}")


@pytest.mark.parametrize(("path", "document"), _mentions(PATH))
def test_a_documented_source_file_exists(path, document):
    assert (ROOT / path).is_file(), f"{document} points at {path}, which does not exist"
