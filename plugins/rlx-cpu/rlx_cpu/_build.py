"""Compiles the cpu backend's native kernels (``native.c``) into the shared library the
package ships, and records how in a JSON file beside it.

One build function, two callers: the wheel's build hook (``plugins/rlx-cpu/hatch_build.py``,
run by ``pip install``, ``pip wheel`` and ``pip install -e``) and developers who changed
``native.c`` and want the library rebuilt in place without reinstalling::

    python -m rlx_cpu._build            # into the directory rlx_cpu is imported from

Why at build time and not on the user's host at run time (issue 20): a host without a
compiler silently lost the fast path, every fresh container or Ray node paid about 4 s on
its first compile, and the writable kernel directory the run-time build cached into let
anyone who could write there run code in every rlx process. Now the code comes from the
installed package only, and ``rlx devices`` can say which kernels run and why.

The flags are the ones the run-time build used, so the library stays portable across
CPUs of its architecture: no ``-march``; on x86-64 the hot functions carry AVX-512, AVX2
and baseline clones (``target_clones``) and the loader picks one. Each build tries, in
order: OpenMP with clones, OpenMP without clones (gcc < 11, clang < 14), then the same two
without OpenMP (clang without libomp, Apple's clang): a library without OpenMP runs every
kernel on the caller's thread, one without clones runs the baseline code.

Never raises: whatever goes wrong (no compiler, a compiler that fails, an unwritable
directory) is returned as a failed ``BuildResult`` and written into the JSON file, so
``pip install`` always succeeds (the backend then runs its numpy kernels, and
``rlx devices`` quotes the reason). The compiler is ``CC`` when set (a gcc or clang
driver, with arguments if needed), else the first of ``cc``, ``gcc``, ``clang`` on PATH.

Standard library only, and no import of ``rlx_cpu`` or ``rlx_core``: the build hook loads
this file by its path inside pip's isolated build environment, where neither is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ABI", "FLAGS", "INFO_NAME", "INFO_SCHEMA", "SOURCE", "BuildResult", "build", "compiler_name",
           "compiler_version", "describe_build", "find_compiler", "library_name", "read_info", "main"]

SOURCE = Path(__file__).with_name("native.c")
#: The C side's interface version: ``RLX_ABI`` in native.c, answered by ``rlx_abi()``. A
#: library reporting another number is never loaded (``native.py``).
ABI = 33
#: -ffp-contract=fast: a * b + c as one fused multiply-add (ISO C mode turns that off;
#: the polynomials and the convolution are 1.4-1.7x faster with it, and more accurate).
#: -fPIC is the default (and an error for clang) on Windows.
FLAGS: tuple[str, ...] = (
    "-O3", "-std=c11", *(() if sys.platform == "win32" else ("-fPIC",)), "-shared", "-fno-math-errno",
    "-fno-trapping-math", "-fvisibility=hidden", "-fopenmp-simd", "-ffp-contract=fast",
)
_LIBS: tuple[str, ...] = () if sys.platform == "win32" else ("-lm",)
#: Tried in order; the first that compiles is the library (see the module docstring).
_VARIANTS: tuple[tuple[str, ...], ...] = (("-fopenmp",), ("-fopenmp", "-DRLX_NO_CLONES"), (), ("-DRLX_NO_CLONES",))
#: native.c's clones (``RLX_CLONES``), named as ``rlx devices`` shows them.
_X86_CLONES = ("AVX-512", "AVX2", "baseline")
INFO_NAME = "_rlx_native.json"
INFO_SCHEMA = 1
#: Seconds one compiler run may take. The whole library with its three clones takes 4-5
#: minutes at -O3 on the 2-core Zen 5 (one clone alone ~40 s), and came within seconds of
#: the former 300 s twice in one afternoon, then past it; on a 2-core Zen 3 it took 575 s
#: (session 49), near the former 900. Past this bound the build gives up (no library:
#: numpy kernels), so it bounds a hung compiler, not a slow host.
_TIMEOUT_S = 1800.0


def library_name(platform_name: str = sys.platform) -> str:
    """The library's file name inside the package: ``_rlx_native.so`` (``.dylib``, ``.dll``)."""
    return "_rlx_native" + {"win32": ".dll", "darwin": ".dylib"}.get(platform_name, ".so")


@dataclass(frozen=True)
class BuildResult:
    """What ``build`` did. ``error`` is short ("no C compiler"), ``detail`` says more (the
    compiler's own message); ``info`` is what was written to the JSON file."""

    ok: bool
    library: Path | None
    info: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    detail: str = ""
    seconds: float = 0.0

    def summary(self) -> str:
        """One line for a build log: what was built with what, or why nothing was."""
        if not self.ok:
            return f"native kernels not built: {self.error}" + (f" ({self.detail})" if self.detail else "")
        return f"built {self.library} with {describe_build(self.info)} in {self.seconds:.1f} s"


def describe_build(info: Mapping[str, Any]) -> str:
    """``"gcc 12.2.0, AVX-512/AVX2/baseline clones, OpenMP"`` from a build's JSON record."""
    parts = [str(info.get("compiler_name") or "an unknown compiler")]
    clones = info.get("clones") or []
    parts.append(f"{'/'.join(clones)} clones" if clones else "no CPU clones")
    parts.append("OpenMP" if info.get("openmp") else "one thread (no OpenMP)")
    return ", ".join(parts)


def find_compiler(environ: Mapping[str, str] | None = None) -> tuple[list[str] | None, str]:
    """The compiler command (``CC``, else the first of cc, gcc, clang on PATH) and, when
    there is none, why not."""
    env = os.environ if environ is None else environ
    value = env.get("CC", "").strip()
    if value:
        cmd = shlex.split(value, posix=os.name != "nt")
        found = shutil.which(cmd[0], path=env.get("PATH"))
        return ([found, *cmd[1:]], "") if found else (None, f"CC={value!r} is not a program on PATH")
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return [found], ""
    return None, "CC is not set and none of cc, gcc, clang is on PATH"


def compiler_version(cmd: Sequence[str], environ: Mapping[str, str] | None = None) -> str:
    """The first line of ``cmd --version`` (``"gcc (Debian 12.2.0-14) 12.2.0"``); ``""``
    when the compiler does not run."""
    try:
        done = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60, check=False,
                              env=None if environ is None else dict(environ))
    except (OSError, subprocess.SubprocessError, ValueError):
        return ""
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else ""


def compiler_name(version_line: str) -> str:
    """``"gcc 12.2.0"``, ``"clang 16.0.6"``, ``"Apple clang 15.0.0"`` from a ``--version``
    line (gcc's ``cc (Debian 12.2.0-14) 12.2.0`` included); the line itself otherwise."""
    clang = re.search(r"((?:Apple )?clang) version (\S+)", version_line)
    if clang:
        return f"{clang.group(1)} {clang.group(2)}"
    gcc = re.match(r"(?:\S*gcc\S*|cc) \([^)]*\) (\d+(?:\.\d+)+)\b", version_line)  # "<driver> (<package>) <version>"
    if gcc:
        return f"gcc {gcc.group(1)}"
    return version_line[:60]


def read_info(directory: Path) -> dict[str, Any]:
    """The JSON record a build left in ``directory``; ``{}`` when there is none, or it is
    not one this version writes (another schema, unreadable, not an object)."""
    try:
        data = json.loads((Path(directory) / INFO_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == INFO_SCHEMA else {}


def build(directory: Path, *, source: Path | None = None, environ: Mapping[str, str] | None = None,
          timeout_s: float = _TIMEOUT_S) -> BuildResult:
    """Compile ``source`` (``native.c``) into ``directory / library_name()`` and write
    ``directory / INFO_NAME``, the record ``rlx devices`` reports from. Never raises.

    The library is compiled into a temporary file and renamed into place, so a process
    that has the old one loaded keeps it and no process ever sees half a library. When
    every attempt fails, an old library in ``directory`` is removed: what is installed is
    then what the last build made (nothing), and the record says why."""
    directory = Path(directory)
    source = SOURCE if source is None else Path(source)
    start = time.perf_counter()
    info: dict[str, Any] = {"schema": INFO_SCHEMA, "built": False, "library": library_name(), "abi": ABI,
                            "platform": sys.platform, "machine": platform.machine()}
    try:
        result = _compile(directory, source, environ, timeout_s, info)
    except Exception as exc:  # the wheel's build must go on without the library, whatever happened
        result = BuildResult(False, None, info, "the build raised", f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - start
    info["build_seconds"] = round(seconds, 2)
    if not result.ok:
        info.update(built=False, error=result.error, detail=result.detail)
        try:
            (directory / library_name()).unlink(missing_ok=True)
        except OSError:
            pass
    try:
        _write_json(directory / INFO_NAME, info)
    except OSError as exc:
        if result.ok:  # a library without its record still loads; say what was lost
            result = BuildResult(True, result.library, info, "", f"{INFO_NAME} not written: {exc}")
    return BuildResult(result.ok, result.library, info, result.error, result.detail, seconds)


def _compile(directory: Path, source: Path, environ: Mapping[str, str] | None, timeout_s: float,
             info: dict[str, Any]) -> BuildResult:
    try:
        info["source_sha256"] = hashlib.sha256(source.read_bytes()).hexdigest()
    except OSError as exc:
        return BuildResult(False, None, info, "the source is missing", str(exc))
    cmd, why = find_compiler(environ)
    if cmd is None:
        return BuildResult(False, None, info, "no C compiler", why)
    info["command"] = cmd[0]
    version = compiler_version(cmd, environ)
    if not version:
        failed = f"{shlex.join([*cmd, '--version'])} failed"
        return BuildResult(False, None, info, "the C compiler does not run", failed)
    info.update(compiler=version, compiler_name=compiler_name(version))
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return BuildResult(False, None, info, "the output directory cannot be made", str(exc))
    final = directory / library_name()
    tmp = directory / f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    errors: list[str] = []
    try:
        for extra in _VARIANTS:
            argv = [*cmd, *FLAGS, *extra, "-o", str(tmp), str(source), *_LIBS]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                                      env=None if environ is None else dict(environ))
            except (OSError, subprocess.SubprocessError) as exc:
                return BuildResult(False, None, info, "the C compiler did not run", f"{shlex.join(argv)}: {exc}")
            if done.returncode == 0 and tmp.is_file():
                os.replace(tmp, final)
                x86 = platform.machine().lower() in ("x86_64", "amd64")
                info.update(built=True, flags=[*FLAGS, *extra, *_LIBS], openmp="-fopenmp" in extra,
                            clones=list(_X86_CLONES) if x86 and "-DRLX_NO_CLONES" not in extra else [])
                return BuildResult(True, final, info)
            lines = (done.stderr or done.stdout).strip().splitlines()
            errors.append(" | ".join(line.strip() for line in lines[:3]) or f"exit status {done.returncode}")
    finally:
        tmp.unlink(missing_ok=True)
    info["command_line"] = shlex.join([*cmd, *FLAGS, "-o", final.name, source.name, *_LIBS])
    return BuildResult(False, None, info, "the C compiler failed", errors[-1] if errors else "")


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlx_cpu._build [DIRECTORY]``: rebuild the library in place (default: the
    directory this file is in, i.e. the installed or checked-out ``rlx_cpu``). Exit status
    1 when nothing was built."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(main.__doc__)
        return 0
    directory = Path(args[0]) if args else SOURCE.parent
    result = build(directory)
    print(result.summary(), file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
