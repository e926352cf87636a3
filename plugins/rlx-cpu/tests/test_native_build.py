"""How the cpu backend gets its native kernels: compiled when the package is built
(``rlx_cpu/_build.py``, run by the wheel's build hook and by ``pip install -e``), loaded
from the package by ``native.py`` or refused with a reason, and the numpy kernels when
there is no library. Also what the probe tells ``rlx devices`` about kernels and BLAS.

Tests that compile take a second or two (a small source) or a few (``native.c``); those
that need a compiler skip where none works, the others run everywhere.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_core.run.session import CompiledGraph
from rlx_cpu import CpuBackend, _build, native, regions
from rlx_cpu._build import ABI, INFO_NAME, library_name, read_info

F32 = np.float32
PACKAGE = Path(native.__file__).parent


@pytest.fixture(autouse=True)
def _empty_rlx_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling reads the calibrated cost model from ``RLX_CACHE_DIR``: an empty one here."""
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-cache"))
    monkeypatch.delenv("RLX_CPU_NATIVE", raising=False)


def working_compiler() -> list[str]:
    """The compiler the build would use here; skips the test where none runs."""
    cmd, why = _build.find_compiler()
    if cmd is None or not _build.compiler_version(cmd):
        pytest.skip(f"no working C compiler here ({why or 'it does not run'})")
    return cmd


def load_from(monkeypatch: pytest.MonkeyPatch, directory: Path) -> native.Native | None:
    """``native.library()`` as if the package were installed in ``directory``, in a fresh state."""
    monkeypatch.setattr(native, "_DIRECTORY", directory)
    monkeypatch.setattr(native, "_STATE", {})
    return native.library()


def without(key: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != key}


def compile_cpu(g: Graph) -> CompiledGraph:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


def rand(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def assert_numpy_path_runs(runs: list[regions._Runner]) -> None:
    """A float32 graph of regions, single ops, layer_norm and softmax compiles and runs
    right with no native region."""
    g = Graph("no-native")
    x = g.input("x", (16, 40))
    h = g.tanh(g.add(g.mul(x, g.param("w", rand((40,), 1))), 0.5))
    g.set_outputs([g.softmax(g.layer_norm(h, g.param("s", rand((40,), 2))), axis=-1), g.exp(x)])
    x_in = rand((16, 40), 3)
    got = compile_cpu(g).run({"x": x_in})
    assert not runs
    for a, r in zip(got, reference.evaluate(g, {"x": x_in})):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6)


def assert_a_region_runs_natively(runs: list[regions._Runner]) -> None:
    g = Graph("native-region")
    x = g.input("x", (512, 512))
    g.set_outputs([g.tanh(g.add(g.mul(x, 0.5), g.param("b", rand((512,), 1))))])
    feeds = {"x": rand((512, 512), 2)}
    runs.clear()
    (got,) = compile_cpu(g).run(feeds)
    assert runs, "no native region ran"
    np.testing.assert_allclose(got, reference.evaluate(g, feeds)[0], rtol=3e-6, atol=3e-7)


# ------------------------------------------------------------------- the packaged library
def test_the_abi_is_the_one_native_c_declares() -> None:
    (declared,) = re.findall(r"#define RLX_ABI (\d+)", _build.SOURCE.read_text())
    assert int(declared) == ABI == native.ABI


def test_the_install_built_the_library_where_a_compiler_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """``pip install -e`` (how nox installs rlx-cpu) ran the build hook: with a compiler
    here, the package holds a library that loads, else every native test would skip
    unnoticed (after an edit of native.c: ``python -m rlx_cpu._build``)."""
    working_compiler()
    info = read_info(PACKAGE)
    assert (PACKAGE / library_name()).is_file(), f"no {library_name()} in {PACKAGE}; the build's record: {info}"
    assert info.get("built") is True and info.get("abi") == ABI, info
    monkeypatch.setattr(native, "_STATE", {})
    assert native.library() is not None, native.reason()


def test_the_packaged_library_loads_and_its_abi_matches(native_lib: native.Native,
                                                       region_runs: list[regions._Runner]) -> None:
    """The library comes from the package's own directory, answers this module's ABI,
    was built from the native.c beside it, and the probe's entry says how it was built."""
    path = Path(native_lib.path)
    assert path == PACKAGE / library_name()
    assert native_lib._lib.rlx_abi() == ABI
    info = read_info(PACKAGE)
    assert info["built"] is True and info["abi"] == ABI
    assert info["source_sha256"] == hashlib.sha256((PACKAGE / "native.c").read_bytes()).hexdigest()
    assert native.reason() == ""
    described = native.describe()
    assert described.startswith("built at install (") and info["compiler_name"] in described
    assert ("OpenMP" in described) is native_lib.openmp
    assert_a_region_runs_natively(region_runs)


def test_without_a_library_numpy_runs_and_the_reason_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture,
                                                              region_runs: list[regions._Runner]) -> None:
    """A package installed without the library (and without a record of a build): no
    library, the reason names the file and how to get it, in ``reason()`` and the log."""
    with caplog.at_level("WARNING", logger="rlx_cpu.native"):
        assert load_from(monkeypatch, tmp_path) is None
    why = native.reason()
    assert why.startswith("not built:") and library_name() in why and "pip install -e plugins/rlx-cpu" in why
    assert why in caplog.text
    assert native.describe() == f"{why}; numpy kernels"
    assert_numpy_path_runs(region_runs)


def test_a_library_with_another_abi_is_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  region_runs: list[regions._Runner]) -> None:
    """A library whose ``rlx_abi()`` answers another number (an older build beside a newer
    native.py) is refused: the reason names both ABIs, and numpy runs."""
    working_compiler()
    if sys.platform == "win32":
        pytest.skip("the stand-in library exports with a GNU attribute")
    source = tmp_path / "native.c"
    export = '__attribute__((visibility("default")))'
    source.write_text(f"#include <stdint.h>\n{export} int64_t rlx_abi(void) {{ return {ABI - 1}; }}\n")
    result = _build.build(tmp_path, source=source)
    assert result.ok, result.summary()
    assert load_from(monkeypatch, tmp_path) is None
    why = native.reason()
    assert why.startswith("not loaded:") and f"has ABI {ABI - 1}" in why and f"needs ABI {ABI}" in why
    assert_numpy_path_runs(region_runs)


def test_a_library_built_from_another_source_is_not_loaded(native_lib: native.Native, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout whose native.c changed after ``pip install -e``: its library would run
    the old code, so it is refused with the way to rebuild; the same library beside the
    source it was built from loads. (A link, not a copy: a repaired wheel's library finds
    its bundled libgomp relative to where it is installed.)"""
    try:
        (tmp_path / library_name()).symlink_to(native_lib.path)
    except OSError:  # no symlinks (Windows without the privilege)
        shutil.copyfile(native_lib.path, tmp_path / library_name())
    shutil.copyfile(PACKAGE / INFO_NAME, tmp_path / INFO_NAME)
    source = (PACKAGE / "native.c").read_text()
    (tmp_path / "native.c").write_text(source + "\n/* edited since the build */\n")
    assert load_from(monkeypatch, tmp_path) is None
    why = native.reason()
    assert "built from another native.c" in why and "python -m rlx_cpu._build" in why
    (tmp_path / "native.c").write_text(source)
    again = load_from(monkeypatch, tmp_path)
    assert again is not None and native.reason() == "" and Path(again.path) == tmp_path / library_name()


# ------------------------------------------------------------------------------ building
def test_a_build_without_a_compiler_fails_cleanly_and_the_run_time_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, region_runs: list[regions._Runner]
) -> None:
    """CC naming a program that does not exist (what the build hook meets on a host
    without a compiler): ``build`` returns a failure instead of raising, writes only its
    record, and the run time quotes that record."""
    result = _build.build(tmp_path, environ={**without("CC"), "CC": "/nonexistent/cc"})
    assert not result.ok and result.library is None
    assert result.error == "no C compiler" and "/nonexistent/cc" in result.detail
    assert sorted(p.name for p in tmp_path.iterdir()) == [INFO_NAME]
    assert read_info(tmp_path)["built"] is False
    assert load_from(monkeypatch, tmp_path) is None
    assert native.reason() == ("not built: no C compiler when rlx-cpu was installed "
                               "(CC='/nonexistent/cc' is not a program on PATH)")
    assert native.describe().endswith("; numpy kernels")
    assert_numpy_path_runs(region_runs)


@pytest.mark.skipif(shutil.which("false") is None, reason="needs a `false` program")
def test_a_compiler_that_does_not_run_fails_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CC=false: found, but even ``--version`` fails; the record and the reason say so."""
    result = _build.build(tmp_path, environ={**without("CC"), "CC": "false"})
    assert not result.ok and result.error == "the C compiler does not run" and "false --version" in result.detail
    assert load_from(monkeypatch, tmp_path) is None
    assert native.reason().startswith("not built: the C compiler does not run when rlx-cpu was installed")


@pytest.mark.skipif(os.name != "posix", reason="the fake compiler is a shell script")
def test_a_failing_build_leaves_no_half_library_and_removes_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler that answers ``--version`` but fails every attempt (with and without
    OpenMP and clones), leaving half an output behind: the error quotes it, no temporary
    is left, and a library from an earlier build is removed (it is not what this build
    made, and its record is replaced)."""
    cc = tmp_path / "fake-cc"
    cc.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo "fake-cc 1.0"; exit 0; fi\n'
        'prev=""; for a in "$@"; do [ "$prev" = -o ] && printf "half a library" > "$a"; prev="$a"; done\n'
        'echo "fake-cc: error: cannot compile today" >&2\nexit 1\n'
    )
    cc.chmod(0o755)
    out = tmp_path / "pkg"
    out.mkdir()
    (out / library_name()).write_bytes(b"an earlier build")
    result = _build.build(out, environ={**without("CC"), "CC": str(cc)})
    assert not result.ok and result.error == "the C compiler failed" and "cannot compile today" in result.detail
    assert sorted(p.name for p in out.iterdir()) == [INFO_NAME]
    info = read_info(out)
    assert info["compiler"] == "fake-cc 1.0" and "command_line" in info
    assert load_from(monkeypatch, out) is None
    assert "the C compiler failed" in native.reason() and "cannot compile today" in native.reason()


@pytest.mark.parametrize("line, name", [
    ("gcc (Debian 12.2.0-14+deb12u1) 12.2.0", "gcc 12.2.0"),
    ("cc (GCC) 14.2.1 20240912 (Red Hat 14.2.1-3)", "gcc 14.2.1"),
    ("fake-cc (Fake 1.0) 1.0.0", "fake-cc (Fake 1.0) 1.0.0"),
    ("x86_64-linux-gnu-gcc-12 (Debian 12.2.0-14) 12.2.0", "gcc 12.2.0"),
    ("Debian clang version 16.0.6 (15)", "clang 16.0.6"),
    ("Apple clang version 15.0.0 (clang-1500.3.9.4)", "Apple clang 15.0.0"),
])
def test_the_compiler_is_named_by_its_family_and_version(line: str, name: str) -> None:
    """What ``rlx devices`` shows of the ``--version`` line; an unfamiliar one as it is."""
    assert _build.compiler_name(line) == name


def test_the_build_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever goes wrong inside, the build hook gets a failed result, never an exception
    (an exception would fail ``pip install``)."""

    def broken(environ: Any = None) -> Any:
        raise RuntimeError("something unforeseen")

    monkeypatch.setattr(_build, "find_compiler", broken)
    result = _build.build(tmp_path)
    assert not result.ok and result.error == "the build raised" and "something unforeseen" in result.detail
    assert read_info(tmp_path)["error"] == "the build raised"


def test_rebuilding_in_place_reports_a_failure_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m rlx_cpu._build DIR``: exit status 1 and the reason when nothing was built."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert _build.main([str(tmp_path / "pkg")]) == 1
    assert "not built: no C compiler" in capsys.readouterr().err
    assert read_info(tmp_path / "pkg")["error"] == "no C compiler"  # the directory is made for the record


@pytest.mark.slow  # two builds of native.c (at -O0: about 10 s each on 2 cores)
@pytest.mark.skipif(os.name != "posix", reason="the compiler wrapper is a shell script")
@pytest.mark.parametrize("refuses", ["-fopenmp", "target_clones"])
def test_a_compiler_without_openmp_or_clones_still_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          region_runs: list[regions._Runner], refuses: str) -> None:
    """A compiler without OpenMP's runtime (clang without libomp, Apple's clang) builds a
    one-thread library; one without function clones (gcc < 11) builds without them; both
    run regions right. The real compiler stands behind a wrapper that refuses one feature."""
    real = working_compiler()
    cc = tmp_path / "picky-cc"
    if refuses == "-fopenmp":
        body = 'for a in "$@"; do if [ "$a" = -fopenmp ]; then echo "picky: no OpenMP here" >&2; exit 1; fi; done\n'
    else:
        body = ('clones=1; for a in "$@"; do [ "$a" = -DRLX_NO_CLONES ] && clones=0; done\n'
                'if [ $clones = 1 ]; then echo "picky: no target_clones here" >&2; exit 1; fi\n')
    run = f'exec {" ".join(real)} "$@" -O0\n'  # the last -O wins: what is tested is the fallback, not speed
    cc.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {run}{body}{run}')
    cc.chmod(0o755)
    out = tmp_path / "pkg"
    result = _build.build(out, environ={**without("CC"), "CC": str(cc)})
    assert result.ok, result.summary()
    built = load_from(monkeypatch, out)
    assert built is not None, native.reason()
    assert built.openmp is result.info["openmp"]
    if refuses == "-fopenmp":
        assert not built.openmp and built.threads() == 1 and "one thread (no OpenMP)" in native.describe()
    else:  # with OpenMP where the real compiler has it (Apple's clang has not)
        assert result.info["clones"] == [] and "no CPU clones" in native.describe()
    assert_a_region_runs_natively(region_runs)


def _clang() -> str | None:
    """A clang driver on PATH (``clang``, else a versioned one), or None."""
    import shutil

    for name in ("clang", *(f"clang-{v}" for v in range(20, 13, -1))):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.mark.slow  # a build of native.c at -O0 (about 20 s on 2 cores)
@pytest.mark.skipif(os.name != "posix" or _clang() is None, reason="needs clang on PATH (CC=clang builds)")
def test_clang_builds_a_library_that_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          region_runs: list[regions._Runner]) -> None:
    """``CC=clang`` (macOS's compiler, and Linux users who set it) builds native.c: gcc's
    vector extensions it uses are ones clang takes too (the integer vector types once
    existed only in gcc's branch, and every clang build failed over to numpy)."""
    cc = tmp_path / "clang-O0"
    cc.write_text(f'#!/bin/sh\n[ "$1" = --version ] && exec {_clang()} "$@"\nexec {_clang()} "$@" -O0\n')
    cc.chmod(0o755)
    out = tmp_path / "pkg"
    result = _build.build(out, environ={**without("CC"), "CC": str(cc)})
    assert result.ok, result.summary()
    assert load_from(monkeypatch, out) is not None, native.reason()
    assert_a_region_runs_natively(region_runs)


# -------------------------------------------------------------------- switches and probe
@pytest.mark.parametrize("value", ["0", "off", "numpy"])
def test_rlx_cpu_native_off_keeps_every_op_on_numpy(monkeypatch: pytest.MonkeyPatch, value: str,
                                                    region_runs: list[regions._Runner]) -> None:
    """RLX_CPU_NATIVE=0 (or off, numpy): nothing is loaded, no native step is in a plan (no
    region, softmax, layer_norm, im2col or pool call), and the answers are right."""
    loaded = native.library()  # to spy on, where there is one
    calls: list[str] = []
    if loaded is not None:
        for name in ("softmax", "layer_norm", "im2col", "pool2d"):
            monkeypatch.setattr(loaded, name, lambda *args, _name=name: calls.append(_name))
    monkeypatch.setenv("RLX_CPU_NATIVE", value)
    monkeypatch.setattr(native, "_load", lambda directory: pytest.fail("loaded with RLX_CPU_NATIVE off"))
    monkeypatch.setattr(native, "_STATE", {})
    assert native.library() is None and not native.wanted()
    assert native.reason() == native.describe() == f"off: RLX_CPU_NATIVE={value}"
    assert_numpy_path_runs(region_runs)
    g = Graph("windows")
    x = g.input("x", (1, 2, 8, 8))
    g.set_outputs([g.max_pool2d(g.conv2d(x, g.param("w", rand((3, 2, 3, 3), 1)), padding=1), 2)])
    x_in = rand((1, 2, 8, 8), 2)
    (got,) = compile_cpu(g).run({"x": x_in})
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x_in})[0], rtol=1e-5, atol=1e-5)
    assert not calls, calls


def test_the_probe_says_which_kernels_and_blas_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``rlx devices --explain`` shows the probe's versions: which kernels run (or why the
    numpy ones do) and which BLAS runs the products (and why not oneMKL)."""
    monkeypatch.delenv("RLX_CPU_BLAS", raising=False)
    monkeypatch.setattr(native, "_STATE", {})
    versions = CpuBackend().probe().versions
    assert versions["native kernels"] == native.describe()
    expected = "built at install (" if native.library() is not None else "not "
    assert versions["native kernels"].startswith(expected)
    assert versions["blas"].startswith("oneMKL ") or "(numpy); oneMKL not installed" in versions["blas"]

    monkeypatch.setenv("RLX_CPU_NATIVE", "0")
    monkeypatch.setenv("RLX_CPU_BLAS", "numpy")
    versions = CpuBackend().probe().versions
    assert versions["native kernels"] == "off: RLX_CPU_NATIVE=0"
    assert versions["blas"].endswith("(numpy); oneMKL off: RLX_CPU_BLAS=numpy")

    monkeypatch.delenv("RLX_CPU_NATIVE")
    monkeypatch.setattr(native, "_DIRECTORY", tmp_path)  # a package installed without the library
    monkeypatch.setattr(native, "_STATE", {})
    got = CpuBackend().probe()
    assert got.available and got.versions["native kernels"].startswith("not built: ")
    assert got.versions["native kernels"].endswith("; numpy kernels")
