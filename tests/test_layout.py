"""The core's layout rules, checked on the source (issue 32).

Only ``rlx_core.ir`` touches a graph's private state: passes, runners and backends edit
graphs through the public API (``add_node``, ``origin``, ``copy``, ``replace_value``,
``attachments``), so the graph's representation can change without breaking them. A
subclass of ``Graph`` reaching its own state through ``self`` is the one exception.
"""

from __future__ import annotations

import sys
import tokenize
from pathlib import Path

from rlx_core.ir import Graph

ROOT = Path(__file__).resolve().parents[1]


def _graph_private_names() -> set[str]:
    names = {k for cls in Graph.__mro__ for k in vars(cls) if k.startswith("_") and not k.startswith("__")}
    names |= {k for k in vars(Graph()) if k.startswith("_")}
    return names


def _sources() -> list[Path]:
    core = [p for p in (ROOT / "rlx_core").rglob("*.py") if (ROOT / "rlx_core" / "ir") not in p.parents]
    plugins = [p for p in (ROOT / "plugins").glob("*/rlx_*/**/*.py")]
    return sorted(core + plugins)


def test_the_private_names_are_found():
    names = _graph_private_names()
    assert {"_nodes", "_values", "_origin", "_add_source", "_sessions"} <= names


def _private_uses(path: Path, private: set[str]) -> list[str]:
    """``owner._name`` attribute uses in ``path`` where ``_name`` is private ``Graph`` state
    and ``owner`` is not a bare ``self``/``cls``. Read with ``tokenize``, not ``ast``: CPython
    3.11's ``ast.parse`` can fail with "AST constructor recursion depth mismatch" in a
    process whose earlier tests left its per-interpreter AST state disturbed (seen in CI)."""
    with path.open("rb") as f:
        toks = [t for t in tokenize.tokenize(f.readline) if t.type not in _SKIP]
    found = []
    for i in range(1, len(toks) - 1):
        dot, name, owner = toks[i], toks[i + 1], toks[i - 1]
        if not (dot.type == tokenize.OP and dot.string == "." and name.type == tokenize.NAME):
            continue
        if name.string not in private:
            continue
        bare = i < 2 or not (toks[i - 2].type == tokenize.OP and toks[i - 2].string == ".")
        if owner.type == tokenize.NAME and owner.string in ("self", "cls") and bare:
            continue
        found.append(f"{path.relative_to(ROOT)}:{name.start[0]}: {owner.string}.{name.string}")
    return found


_SKIP = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


def test_the_scan_finds_a_private_use(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    src = tmp_path / "m.py"
    src.write_text("def f(g, self):\n    self._nodes\n    g._nodes.append(1)\n    g.self._values\n    g._fine\n")
    assert _private_uses(src, {"_nodes", "_values"}) == ["m.py:3: g._nodes", "m.py:4: self._values"]


def test_no_module_outside_ir_uses_a_private_name_of_graph():
    private = _graph_private_names()
    found = [hit for path in _sources() for hit in _private_uses(path, private)]
    assert not found, "private Graph state used outside rlx_core.ir (use the edit API):\n" + "\n".join(found)


GUIDE = ROOT / "docs" / "writing-a-plugin.md"
#: The modules a plugin may import (the guide's "What a plugin may import").
CONTRACT = {"rlx_core", "rlx_core.plugin", "rlx_core.ir", "rlx_core.ops", "rlx_core.errors", "rlx_core.reference",
            "rlx_core.testing"}


def test_the_plugin_guide_documents_the_whole_kit():
    import rlx_core.plugin

    text = GUIDE.read_text(encoding="utf-8")
    missing = [name for name in rlx_core.plugin.__all__ if f"`{name}`" not in text and f"{name}(" not in text]
    assert not missing, f"rlx_core.plugin exports {missing}, which docs/writing-a-plugin.md never names"


def test_the_plugin_guide_imports_the_contract_only():
    import re

    text = GUIDE.read_text(encoding="utf-8")
    used = set(re.findall(r"from (rlx_core[\w.]*) import", text)) | set(re.findall(r"import (rlx_core[\w.]*)", text))
    used |= {m.rsplit(".", 1)[0] for m in re.findall(r"`(rlx_core\.[\w.]+)\(\)`", text)}
    packages = CONTRACT - {"rlx_core"}
    outside = sorted(m for m in used if m not in CONTRACT and not any(m.startswith(c + ".") for c in packages))
    assert not outside, f"docs/writing-a-plugin.md uses {outside}, outside the plugin contract {sorted(CONTRACT)}"
