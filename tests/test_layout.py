"""The core's layout rules, checked on the source (issue 32).

Only ``rlx_core.ir`` touches a graph's private state: passes, runners and backends edit
graphs through the public API (``add_node``, ``origin``, ``copy``, ``replace_value``,
``attachments``), so the graph's representation can change without breaking them. A
subclass of ``Graph`` reaching its own state through ``self`` is the one exception.
"""

from __future__ import annotations

import ast
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


def test_no_module_outside_ir_uses_a_private_name_of_graph():
    private = _graph_private_names()
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "private Graph state used outside rlx_core.ir (use the edit API):\n" + "\n".join(found)
