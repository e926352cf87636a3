"""Modules that moved into packages by concern (issue 32), importable at their old paths.

``rlx_core`` was flat until its modules were grouped into ``ir/``, ``backends/``,
``compiler/``, ``placement/`` and ``run/``. Code written against the old paths
(``import rlx_core.ops``, ``from rlx_core.registry import Registry``, a monkeypatch of
``"rlx_core.session.compile"``) keeps working: the old name is an alias of the same
module object, not a copy, so patches and ``isinstance`` checks see one module. No
warning: ``rlx_core.ops``, ``rlx_core.dtypes`` and ``rlx_core.symbolic`` are named in
older plugin guides and third-party plugins import them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: Old module path -> where the module lives now.
MOVED: dict[str, str] = {
    f"rlx_core.{old}": f"rlx_core.{new}"
    for old, new in {
        "ops": "ir.ops", "dtypes": "ir.dtypes", "symbolic": "ir.symbolic", "shape_rules": "ir.shape_rules",
        "internal_types": "ir.internal_types", "deferred": "ir.deferred", "composites": "passes.composites",
        "registry": "backends.registry", "probing": "backends.probing", "probe_verdicts": "backends.probe_verdicts",
        "plugin_import": "backends.plugin_import", "isolation": "backends.isolation",
        "_isolated_child": "backends._isolated_child", "faults": "backends.faults",
        "lowering": "compiler.lowering", "compiled": "compiler.compiled", "dynamic": "compiler.dynamic",
        "inputs": "compiler.inputs", "memory": "compiler.memory", "timing": "compiler.timing",
        "policy": "placement.policy", "partition": "placement.partition", "measured": "placement.measured",
        "corrections": "placement.corrections", "session": "run.session", "runtime": "run.runtime",
        "fallback": "run.fallback", "drift": "run.drift", "settings": "run.settings", "verify": "run.verify",
    }.items()
}


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and answers the module at its new one (imported on first use)."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # its own, given back in ``exec_module``
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran under its own name. The import system has just
        set its ``__spec__`` to the alias's; give it back its own, which its relative
        imports and ``importlib.reload`` read."""
        module.__spec__ = module.__spec__.loader_state


_FINDER = _Aliases()


def install() -> None:
    """Answer the old paths from now on (once per process; ``import rlx_core`` calls it)."""
    if not any(isinstance(f, _Aliases) for f in sys.meta_path):
        sys.meta_path.append(_FINDER)
