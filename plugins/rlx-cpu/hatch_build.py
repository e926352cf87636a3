"""Hatchling build hook: compiles the cpu backend's native kernels into the wheel.

Why a hatchling hook rather than scikit-build-core or meson-python (the issue's other
candidates): the library is one C file compiled by one compiler command, which the hook
runs through the same function developers use to rebuild in place
(``rlx_cpu/_build.py``). Staying on hatchling adds no build toolchain (no CMake, no
Meson or Ninja in every build environment), keeps the library a plain shared object
loaded with ctypes (the ABI ``native.py`` checks through ``rlx_abi()`` is unchanged: no
CPython extension, so the wheel does not depend on the Python version), and editable
installs keep working the way ``nox -s tests`` makes them: hatchling runs build hooks for
``pip install -e`` too, and this hook then builds into the checkout's ``rlx_cpu/``, where
the editable package is imported from.

What each build does:

- ``pip wheel`` / ``pip install`` (hatchling's ``standard`` wheel): compile into a
  temporary directory and add ``rlx_cpu/_rlx_native.so`` and its record
  ``rlx_cpu/_rlx_native.json`` to the wheel; the wheel is then platform-specific, tagged
  ``py3-none-<platform>`` (the library does not use Python's C API, so one wheel per
  platform serves every Python; cibuildwheel builds it once and tests it on each).
- ``pip install -e`` (``editable``): compile into ``rlx_cpu/`` of the checkout.
- Either way, a failed build (no compiler, a compiler error) never fails the
  installation: the wheel is pure Python with only the record, which says why, and the
  backend runs its numpy kernels (``rlx devices`` shows the reason). The message is
  printed through hatchling (``pip install -v`` shows it).

The in-place files are excluded from wheels and sdists in ``pyproject.toml``, so a
standard wheel only ever holds the library built for it.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def load_build_module(root: Path) -> ModuleType:
    """``rlx_cpu/_build.py`` loaded by its path: importing ``rlx_cpu`` would import
    rlx_core and numpy, which pip's isolated build environment does not have."""
    path = root / "rlx_cpu" / "_build.py"
    spec = importlib.util.spec_from_file_location("_rlx_cpu_native_build", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


class NativeKernelsHook(BuildHookInterface):
    """Builds ``_rlx_native`` for the wheel target (see the module docstring)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        try:
            self._build(version, build_data)
        except Exception as exc:  # the installation goes on without the library, whatever happened
            self.app.display_warning(f"rlx-cpu: native kernels not built ({type(exc).__name__}: {exc}); "
                                     "the cpu backend will run its numpy kernels")

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    def _build(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        builder = load_build_module(root)
        if version == "editable":
            result = builder.build(root / "rlx_cpu")
            self._report(result)
            return
        self._tmp = Path(tempfile.mkdtemp(prefix="rlx-cpu-native-"))
        atexit.register(shutil.rmtree, self._tmp, ignore_errors=True)  # in case the wheel build fails
        result = builder.build(self._tmp)
        self._report(result)
        record = self._tmp / builder.INFO_NAME
        if record.is_file():
            build_data["force_include"][str(record)] = f"rlx_cpu/{builder.INFO_NAME}"
        if not result.ok:
            return
        build_data["force_include"][str(result.library)] = f"rlx_cpu/{result.library.name}"
        build_data["pure_python"] = False
        platform_tag = self._platform_tag()
        if platform_tag:
            build_data["tag"] = f"py3-none-{platform_tag}"
        else:
            build_data["infer_tag"] = True

    def _platform_tag(self) -> str:
        """The platform part of the tag hatchling infers for this interpreter (with its
        macOS deployment-target handling); ``""`` when this hatchling does not say."""
        try:
            best = self.build_config.builder.get_best_matching_tag()
        except Exception:
            return ""
        parts = str(best).split("-")
        return parts[2] if len(parts) == 3 else ""

    def _report(self, result: Any) -> None:
        if result.ok:
            self.app.display_info(f"rlx-cpu: {result.summary()}")
        else:
            self.app.display_warning(f"rlx-cpu: {result.summary()}; the cpu backend will run its numpy kernels")
