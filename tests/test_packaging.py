"""What the wheels ship: the bundled example graph, the ``rlx`` script, the entry points,
and the cpu backend's native kernels (compiled when its wheel is built).

(``nox -s wheels`` goes further: it installs the wheels in a fresh venv and runs them.)
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def build_wheel(project: Path, out: Path, environ: Mapping[str, str] | None = None) -> zipfile.ZipFile:
    pytest.importorskip("hatchling", reason="building wheels needs hatchling (nox installs it)")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out),
         str(project)],
        capture_output=True, text=True, env=None if environ is None else dict(environ),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


@pytest.mark.slow
def test_core_wheel_ships_example_script_and_cli(tmp_path: Path) -> None:
    with build_wheel(ROOT, tmp_path) as whl:
        names = set(whl.namelist())
        assert {"rlx_core/examples/mlp.json", "rlx_core/cli/__init__.py", "rlx_core/cli/commands.py",
                "rlx_core/ir/graph.py", "rlx_core/__main__.py"} <= names
        assert not any(n.startswith(("tests/", "examples/", "bench/", "plugins/")) for n in names)
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "rlx = rlx_core.cli:main" in whl.read(entry_points).decode()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        assert "Requires-Dist: rlx-cpu" in whl.read(metadata).decode()


@pytest.mark.slow  # builds rlx-cpu's wheel, native kernels included
def test_cpu_wheel_registers_its_entry_point_and_ships_the_native_kernels(tmp_path: Path) -> None:
    """The build hook compiled the library into the wheel (where a compiler works), which
    makes the wheel platform-specific but not Python-specific (``py3-none-<platform>``);
    the record says how it was built. Nothing compiled into the checkout comes along."""
    from rlx_cpu import _build

    environ = dict(os.environ)
    real, _ = _build.find_compiler()
    if real is not None and os.name == "posix":  # the last -O wins: packaging is tested here, not speed
        cc = tmp_path / "cc-O0"
        cc.write_text(f'#!/bin/sh\nexec {" ".join(real)} "$@" -O0\n')
        cc.chmod(0o755)
        environ["CC"] = str(cc)
    with build_wheel(ROOT / "plugins" / "rlx-cpu", tmp_path / "wheel", environ) as whl:
        names = set(whl.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = whl.read(entry_points).decode()
        assert "[rlx.backends]" in text and "cpu = rlx_cpu" in text
        info = json.loads(whl.read(f"rlx_cpu/{_build.INFO_NAME}"))
        (wheel_meta,) = [n for n in names if n.endswith(".dist-info/WHEEL")]
        tags = whl.read(wheel_meta).decode()
        assert not any("/._rlx_native" in n for n in names)
        cmd, _ = _build.find_compiler()
        if cmd is None or not _build.compiler_version(cmd):
            assert not info["built"] and "Root-Is-Purelib: true" in tags
            pytest.skip(f"no C compiler here: the wheel is pure Python ({info['error']})")
        assert info["built"] and info["abi"] == _build.ABI, info
        assert f"rlx_cpu/{_build.library_name()}" in names
        assert "Root-Is-Purelib: false" in tags and "Tag: py3-none-" in tags and "-any" not in tags
        assert Path(whl.filename or "").name.startswith("rlx_cpu-0.1.0-py3-none-")


@pytest.mark.slow
def test_cpu_wheel_without_a_compiler_is_pure_python_and_says_why(tmp_path: Path) -> None:
    """No compiler (CC names none): the build still succeeds, with a pure-Python wheel whose
    record tells the installed backend why it runs numpy kernels."""
    from rlx_cpu import _build

    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    with build_wheel(ROOT / "plugins" / "rlx-cpu", tmp_path / "out", environ=env) as whl:
        names = set(whl.namelist())
        assert Path(whl.filename or "").name == "rlx_cpu-0.1.0-py3-none-any.whl"
        assert f"rlx_cpu/{_build.library_name()}" not in names
        info = json.loads(whl.read(f"rlx_cpu/{_build.INFO_NAME}"))
        assert info["built"] is False and info["error"] == "no C compiler" and "no-such-cc" in info["detail"]


def test_bundled_mlp_is_what_make_mlp_writes(tmp_path: Path) -> None:
    """rlx_core/examples/mlp.json is generated, not edited: regenerating changes nothing."""
    make = runpy.run_path(str(ROOT / "examples" / "make_mlp.py"))
    out = tmp_path / "mlp.json"
    assert make["main"](["make_mlp.py", str(out)]) == 0
    assert out.read_bytes() == (ROOT / "rlx_core" / "examples" / "mlp.json").read_bytes()
