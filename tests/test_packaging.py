"""What the wheels ship: the bundled example graph, the ``rlx`` script, the entry points.

(``nox -s wheels`` goes further: it installs the wheels in a fresh venv and runs them.)
"""

from __future__ import annotations

import runpy
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def build_wheel(project: Path, out: Path) -> zipfile.ZipFile:
    pytest.importorskip("hatchling", reason="building wheels needs hatchling (nox installs it)")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out),
         str(project)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def test_core_wheel_ships_example_script_and_cli(tmp_path: Path) -> None:
    with build_wheel(ROOT, tmp_path) as whl:
        names = set(whl.namelist())
        assert {"rlx_core/examples/mlp.json", "rlx_core/cli.py", "rlx_core/__main__.py"} <= names
        assert not any(n.startswith(("tests/", "examples/", "bench/", "plugins/")) for n in names)
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "rlx = rlx_core.cli:main" in whl.read(entry_points).decode()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        assert "Requires-Dist: rlx-cpu" in whl.read(metadata).decode()


def test_cpu_wheel_registers_its_entry_point(tmp_path: Path) -> None:
    with build_wheel(ROOT / "plugins" / "rlx-cpu", tmp_path) as whl:
        (entry_points,) = [n for n in whl.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = whl.read(entry_points).decode()
        assert "[rlx.backends]" in text and "cpu = rlx_cpu" in text


def test_bundled_mlp_is_what_make_mlp_writes(tmp_path: Path) -> None:
    """rlx_core/examples/mlp.json is generated, not edited: regenerating changes nothing."""
    make = runpy.run_path(str(ROOT / "examples" / "make_mlp.py"))
    out = tmp_path / "mlp.json"
    assert make["main"](["make_mlp.py", str(out)]) == 0
    assert out.read_bytes() == (ROOT / "rlx_core" / "examples" / "mlp.json").read_bytes()
