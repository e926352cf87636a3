"""The core's layout rules, checked on the source (issue 32).

Only ``rlx_core.ir`` touches a graph's private state: passes, runners and backends edit
graphs through the public API (``add_node``, ``origin``, ``copy``, ``replace_value``,
``attachments``), so the graph's representation can change without breaking them. A
subclass of ``Graph`` reaching its own state through ``self`` is the one exception.
"""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
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


def _parse(path: Path) -> ast.Module:
    """``ast.parse`` on a fresh thread: CPython 3.11 can fail with "AST constructor
    recursion depth mismatch" on a thread whose recursion count an earlier test disturbed."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(ast.parse, path.read_text(encoding="utf-8"), str(path)).result()


def test_no_module_outside_ir_uses_a_private_name_of_graph():
    private = _graph_private_names()
    found = []
    for path in _sources():
        tree = _parse(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "private Graph state used outside rlx_core.ir (use the edit API):\n" + "\n".join(found)


GUIDE = ROOT / "docs" / "writing-a-plugin.md"
#: The modules a plugin may import (the guide's "What a plugin may import").
CONTRACT = {"rlx_core", "rlx_core.plugin", "rlx_core.ir", "rlx_core.ops", "rlx_core.errors", "rlx_core.reference",
            "rlx_core.testing"}  # fmt: skip


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
