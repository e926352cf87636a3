"""The core's layout rules, checked on the source (issue 32).

The rules live in ``rlx_core._layout`` (``python -m rlx_core._layout``, which ``nox -s
lint`` runs too): every package of rlx_core sits in one layer and imports none above it,
and only ``rlx_core.ir`` touches a graph's private state. These tests run that check, show
it can fail, and keep its table in step with import-linter's contract in pyproject.toml.
Modules that moved into the packages stay importable at their old paths (``_moved``).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from rlx_core import _layout, _moved
from rlx_core.ir import Graph

ROOT = Path(__file__).resolve().parents[1]


def test_the_layout_check_passes_on_the_tree():
    proc = subprocess.run([sys.executable, "-m", "rlx_core._layout"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "layer 11: ir" in proc.stdout and "    ops " in proc.stdout and "layout ok" in proc.stdout


def test_the_layers_are_import_linters_layers():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == "rlx_core's layers")
    assert [tuple(n.strip() for n in layer.split(":")) for layer in contract["layers"]] == list(_layout.LAYERS)
    assert contract["exhaustive"] is True


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "rlx_core"
    for name, text in {"__init__.py": "", "ir/__init__.py": "", "ir/graph.py": _GRAPH, **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


_GRAPH = ("class Graph:\n    _kind = 1\n    def __init__(self):\n        self._nodes = []\n"
          "    def _add(self):\n        pass\n")


def test_the_check_names_an_import_above_its_layer_and_an_unplaced_module(tmp_path):
    package = _package(tmp_path, {
        "errors.py": "",
        "run/__init__.py": "",
        "ir/ops.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..run import x\n"
                     "def f():\n    from ..run import session\n    from .. import errors\n",
        "newthing.py": "",
    })
    found = _layout.layer_violations(package)
    assert found == ["rlx_core.newthing: in no layer of rlx_core._layout.LAYERS",
                     "rlx_core/ir/ops.py:5: rlx_core.ir.ops (ir, layer 11) imports rlx_core.run "
                     "(run, layer 3, above it)"]


def test_the_check_names_private_graph_state_used_outside_ir(tmp_path):
    package = _package(tmp_path, {"run/__init__.py": "",
                                  "run/session.py": "def f(g, self):\n    self._nodes\n    g._nodes.append(1)\n"
                                                    "    g.self._kind\n    g._fine\n    g._add()\n"})
    assert _layout.graph_private_names(package) == {"_kind", "_nodes", "_add"}
    assert _layout.private_violations(package) == ["rlx_core/run/session.py:3: g._nodes",
                                                    "rlx_core/run/session.py:4: self._kind",
                                                    "rlx_core/run/session.py:6: g._add"]


def test_the_private_names_read_from_the_source_cover_the_class():
    """The check reads ``Graph``'s private names without importing it; every one the
    class and a new instance have is among them."""
    live = {k for cls in Graph.__mro__ if cls is not object for k in vars(cls)} | set(vars(Graph()))
    live = {k for k in live if k.startswith("_") and not k.startswith("__")}
    assert live <= _layout.graph_private_names()
    assert {"_nodes", "_values", "_origin", "_add_source", "_sessions"} <= live


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_a_moved_module_is_the_same_module_at_its_old_path(old):
    new = importlib.import_module(_moved.MOVED[old])
    assert importlib.import_module(old) is new
    assert getattr(importlib.import_module("rlx_core"), old.split(".", 1)[1]) is new
    assert new.__spec__.name == new.__name__  # its own spec, not the alias's: relative imports still resolve


def test_placements_names_are_still_importable_from_the_package():
    from rlx_core import placement
    from rlx_core.placement import Placement, device_report, ranking
    from rlx_core.placement.ranking import Placement as ranked

    assert Placement is ranked and callable(device_report)
    assert sorted(placement.__all__) == sorted(ranking.__all__)  # the package's list is ranking's, kept in step
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = importlib.import_module("rlx_core.placement").nothing


GUIDE = ROOT / "docs" / "writing-a-plugin.md"
#: The modules a plugin may import (the guide's "What a plugin may import").
CONTRACT = {"rlx_core", "rlx_core.plugin", "rlx_core.ir", "rlx_core.ir.ops", "rlx_core.errors", "rlx_core.reference",
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
