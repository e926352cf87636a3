"""Every developer and CI command: ``nox -s tests``, ``lint``, ``wheels``, ``bench``.

Sessions run on the interpreter nox itself runs on (no version pinned), so the same
file works on any Python 3.10+ a developer or CI machine has.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"

#: What a plugin needs beyond its own dependencies to be useful on a host without its
#: hardware (PoCL gives OpenCL a CPU device). Plugins not listed need nothing extra.
PLUGIN_EXTRAS = {
    "rlx-opencl": ["pyopencl[pocl]"],
}
#: A plugin's own optional extras that the sessions install with it (``-e dir[extra]``):
#: rlx-cpu's ``mkl`` puts float32 products on oneMKL where its wheel exists (x86-64), and
#: ``onednn`` convolutions on oneDNN (x86-64 Linux), so the tests exercise those paths and
#: the benchmarks measure what users install.
PLUGIN_OWN_EXTRAS = {
    "rlx-cpu": "mkl,onednn",
}
TEST_DEPS = ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6.80", "hatchling>=1.18", "onnx>=1.14", "onnxruntime"]
#: pytest-xdist workers: the suite is mostly single-threaded Python and child processes
#: (8.6 min serial, 6.1 min on two workers on a 2-core host); more than four would
#: each import JAX, ONNX Runtime and CuPy for little more.
WORKERS = str(max(1, min(4, os.cpu_count() or 1)))


def plugin_dirs() -> list[Path]:
    """Every plugin in the tree (``plugins/*/pyproject.toml``), cpu first; later plugins
    join the sessions as soon as their directory exists."""
    dirs = sorted(p.parent for p in ROOT.glob("plugins/*/pyproject.toml"))
    return sorted(dirs, key=lambda d: d.name != "rlx-cpu")


def plugin_requirements() -> list[str]:
    """pip arguments installing core and every plugin editable, with their extras."""
    args = ["-e", str(ROOT)]
    for d in plugin_dirs():
        extra = PLUGIN_OWN_EXTRAS.get(d.name)
        args += ["-e", f"{d}[{extra}]" if extra else str(d), *PLUGIN_EXTRAS.get(d.name, [])]
    return args


def test_paths() -> list[str]:
    """tests/ plus each plugin's and example's tests/ that exists."""
    found = [ROOT / "tests", *(d / "tests" for d in plugin_dirs()), *sorted(ROOT.glob("examples/*/tests"))]
    return [str(p) for p in found if p.is_dir() and any(p.glob("test_*.py"))]


#: What an editable install depends on beyond the requirements themselves: the projects'
#: metadata and rlx-cpu's build hook and native kernels (compiled at install, 4-10 minutes at
#: -O3 on 2 cores with the three CPU clones). Python sources are not listed: an editable install sees their edits.
INSTALL_INPUTS = ("pyproject.toml", "plugins/*/pyproject.toml", "plugins/*/hatch_build.py",
                  "plugins/rlx-cpu/rlx_cpu/native.c", "plugins/rlx-cpu/rlx_cpu/_build.py")


def _install_stamp(args: tuple[str, ...]) -> str:
    h = hashlib.sha256(repr(args).encode())
    for pattern in INSTALL_INPUTS:
        for path in sorted(ROOT.glob(pattern)):
            h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _install(session: nox.Session, what: str, *args: str) -> None:
    """``pip install`` with its progress shown: a first install downloads CuPy, ONNX
    Runtime, JAX and Ray (hundreds of MB, minutes on a slow link), and a silent pip
    looked hung. A reused venv whose last install had the same requirements and the same
    ``INSTALL_INPUTS`` skips pip (it would rebuild every editable package and recompile
    rlx-cpu's kernels: about two minutes of a quick edit-test loop)."""
    venv = getattr(session.virtualenv, "location", None)
    stamp_file = Path(venv) / f".rlx-install-{hashlib.sha256(what.encode()).hexdigest()[:12]}" if venv else None
    stamp = _install_stamp(args)
    if stamp_file is not None and stamp_file.is_file() and stamp_file.read_text() == stamp:
        session.log(f"{what}: installed already, unchanged (remove {stamp_file} to force)")
        return
    session.log(f"installing {what}")
    session.install(*args, silent=False)
    if stamp_file is not None:
        stamp_file.write_text(stamp)


def _pytest(session: nox.Session, *default_args: str) -> None:
    """pytest over the default suites, or over the paths among the posargs
    (``nox -s tests -- tests/test_cli.py -x``), which then replace them."""
    chosen = any(Path(a.split("::")[0]).exists() for a in session.posargs if not a.startswith("-"))
    paths = [] if chosen else test_paths()
    if not chosen and not paths:  # pytest would exit 5 ("no tests collected"); say why instead
        session.error("no test directories found")
    # importlib mode: several suites have a tests/ directory with the same file names.
    # Workers only for the default set: a chosen file or -x debugging reads better serially.
    workers = [] if chosen or "-n" in session.posargs else ["-n", WORKERS]
    session.run("pytest", "--import-mode=importlib", *workers, *default_args, *paths, *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Install core + every plugin editable (one pip command) and run all test suites,
    the ``slow`` ones (wheel and compiler builds, many processes) included."""
    _install(session, "rlx-core and every plugin (editable) with the test tools", *plugin_requirements(),
             *TEST_DEPS)
    try:  # rlx-core[ray], for the batch-inference tests; a reused venv keeps it (installed once)
        _install(session, "ray[data], for the batch-inference tests", "ray[data]>=2.9")
    except nox.command.CommandFailed:
        session.warn("ray[data] could not be installed here: the Ray tests (-m ray) will be skipped")
    _pytest(session)


@nox.session
def quick(session: nox.Session) -> None:
    """The edit-test loop: every suite except the tests marked ``slow`` (builds, many
    processes) or ``ray``, stopping at the first failure. Installs what ``tests`` does
    minus Ray; about a minute and a half of tests on a 2-core host."""
    _install(session, "rlx-core and every plugin (editable) with the test tools", *plugin_requirements(),
             *TEST_DEPS)
    _pytest(session, "-x", "-q", "-m", "not slow and not ray")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check over the whole tree (formatting is not enforced), then import-linter
    (``[tool.importlinter]`` in pyproject.toml): backends import the plugin contract only,
    and no import circle joins rlx_core's modules (``acyclic_siblings``, since 2.13);
    then ``rlx_core/_layout.py --check`` (the layers, and Graph's private state).
    Nothing is installed: import-linter reads source (it imports nothing: no cupy, jax or
    pyopencl needed), found through ``PYTHONPATH``. An editable install compiled
    rlx-cpu's native kernels for nothing (4-11 minutes of CI on 2 cores)."""
    session.install("ruff", "import-linter>=2.13")
    session.run("ruff", "check", str(ROOT), *session.posargs)
    roots = os.pathsep.join(str(d) for d in [ROOT, *plugin_dirs()])
    session.run("lint-imports", "--config", str(ROOT / "pyproject.toml"), env={"PYTHONPATH": roots})
    # The same layers checked by rlx's own script, with the rule import-linter cannot
    # express: no private Graph state outside rlx_core.ir. Standard library only.
    session.run("python", str(ROOT / "rlx_core" / "_layout.py"), "--check")


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every distribution, install rlx-core from the wheels in a fresh venv, and
    check that the cpu backend came with it and runs the bundled example."""
    session.install("build", "hatchling>=1.18")
    tmp = Path(session.create_tmp()).resolve()
    dist, venv = tmp / "wheels", tmp / "fresh-venv"
    for p in (dist, venv):
        shutil.rmtree(p, ignore_errors=True)
    for project in (ROOT, *plugin_dirs()):
        session.run("python", "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(project))
    built = sorted(p.name for p in dist.glob("*.whl"))
    session.log(f"built: {', '.join(built)}")

    session.run("python", "-m", "venv", str(venv))
    bin_dir = venv / ("Scripts" if (venv / "Scripts").is_dir() else "bin")
    py, rlx = str(bin_dir / "python"), str(bin_dir / "rlx")
    # Only rlx-core is named: rlx-cpu must arrive as its dependency, from our wheel.
    session.run(py, "-m", "pip", "install", "--quiet", "--find-links", str(dist), "rlx-core", external=True)
    session.chdir(tmp)  # away from the checkout, so the installed package is what runs
    versions = session.run(py, "-c", _PRINT_VERSIONS, external=True, silent=True, stderr=None)
    installed = json.loads(str(versions))
    for name in ("rlx-core", "rlx-cpu"):
        wheel = next((w for w in built if w.startswith(name.replace("-", "_") + "-")), None)
        if wheel is None or installed.get(name) != wheel.split("-")[1]:
            session.error(f"{name}: installed {installed.get(name)!r}, but the built wheel is {wheel!r}")

    out = session.run(rlx, "devices", "--json", external=True, silent=True, stderr=None)
    report = json.loads(str(out))
    cpu = next((d for d in report["devices"] if d["device"] == "cpu"), None)
    if not cpu or not cpu["available"] or not cpu["recommended"]:
        session.error(f"cpu is not available and recommended in the fresh venv: {cpu}")
    session.log(f"rlx devices --json: cpu available and recommended ({len(cpu['ops'])} ops)")
    session.run(rlx, "--version", external=True)
    session.run(rlx, "run", "--example", "mlp", external=True)


_PRINT_VERSIONS = (
    "import json, importlib.metadata as m; "
    "print(json.dumps({d: m.version(d) for d in ('rlx-core', 'rlx-cpu')}))"
)


#: Benchmark scripts that rewrite their own sections of BENCHMARKS.md when given ``--write``.
WRITES_BENCHMARKS_MD = ("overhead.py", "suite.py", "batch.py", "dynamic.py")
#: Scripts with a session of their own (heavy extras: torch): ``nox -s zoo``.
OWN_SESSION = ("zoo.py", "detector.py", "dynamic_exports.py", "exports_stream.py", "layout.py", "neighbours.py")
#: Tools that time the files they are given: ONNX files (``python bench/compile_time.py
#: a.onnx``), or two builds of the native library (``bench/native_ab.py old.so new.so``):
#: there is nothing of theirs to run here.
NEEDS_MODEL_FILES = ("compile_time.py", "first_runs.py", "onnx_time.py", "native_ab.py", "node_profile.py")


def bench_scripts() -> list[Path]:
    """``bench/*.py`` files that run as scripts (they have a ``__main__`` guard), but for
    those with a session of their own and the tools that time files they are given; the
    suite's modules (``models.py``, ``_*.py``) have no guard and are not run."""
    found = sorted(ROOT.glob("bench/*.py"))
    return [p for p in found if 'if __name__ == "__main__"' in p.read_text(encoding="utf-8")
            and p.name not in OWN_SESSION + NEEDS_MODEL_FILES]


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark script: dispatch overhead (bench/overhead.py), the model suite
    (bench/suite.py: every rlx device against ONNX Runtime, numpy and jax.jit), and any
    other bench/*.py script; the first two rewrite their sections of BENCHMARKS.md.
    ``nox -s bench -- --quick`` only checks that they all run (smaller, fewer rounds,
    BENCHMARKS.md untouched); other posargs go to bench/suite.py (``-- --models mlp,cnn``)."""
    # ray: bench/batch.py's Ray-vs-in-process figure
    session.install(*plugin_requirements(), "onnx", "onnxruntime", "rich", "scipy", "ray[data]")
    try:  # the hand-written jax.jit contender; jax has no wheel on some platforms
        session.install("jax")
    except nox.command.CommandFailed:
        session.warn("jax could not be installed: the suite runs without the jax.jit contender")
    quick = "--quick" in session.posargs
    for script in bench_scripts():
        args = ["--quick"] if quick else []
        if script.name in WRITES_BENCHMARKS_MD and not quick:
            args.append("--write")
        if script.name == "suite.py":
            args = [a for a in args if a != "--quick"] + list(session.posargs)
        session.run("python", str(script), *args)



@nox.session
def zoo(session: nox.Session) -> None:
    """Real architectures (bench/zoo.py): torchvision and transformers models with random
    weights, exported by both torch exporters, compared with ONNX Runtime on every rlx
    device and timed against it; then torchvision detectors (bench/detector.py), exports
    with dynamic axes checked at many sizes (bench/dynamic_exports.py) and served a stream
    of new sizes (bench/exports_stream.py), and rlx beside
    torch, ONNX Runtime and OpenVINO in one process (bench/neighbours.py).
    Installs torch, torchvision and transformers (several GB: bench extras, never rlx
    dependencies). Posargs go to bench/zoo.py (default: every model, both exporters,
    batch 1, timed; the detector runs only then)."""
    session.install(*plugin_requirements(), "onnx", "onnxruntime", "onnxscript", "torch", "torchvision",
                    "transformers")
    args = list(session.posargs) or ["--time", "--json", str(ROOT / "bench" / "results" / "zoo.json")]
    session.run("python", str(ROOT / "bench" / "zoo.py"), *args)
    if not session.posargs:  # the detectors (host ops between compiled parts) and dynamic axes
        session.run("python", str(ROOT / "bench" / "detector.py"))
        session.run("python", str(ROOT / "bench" / "dynamic_exports.py"))
        session.run("python", str(ROOT / "bench" / "exports_stream.py"), "--devices", "cpu,jax")
        try:  # a neighbour of bench/neighbours.py's; skipped there where it does not install
            session.install("openvino")
        except nox.command.CommandFailed:
            session.warn("openvino could not be installed: bench/neighbours.py runs without it")
        session.run("python", str(ROOT / "bench" / "neighbours.py"))


@nox.session
def fuzz(session: nox.Session) -> None:
    """Differential fuzzing (tests/fuzz): ``RLX_FUZZ_EXAMPLES`` random graphs per device
    and property (default 10,000) against the reference, randomized, with hypothesis's
    example database in tests/fuzz/.hypothesis; a failing case is also written to
    tests/fuzz/regressions/found-<device>.json, which ``nox -s tests`` then replays.
    The count of graphs checked per device is printed at the end.
    ``nox -s fuzz -- -k random_graphs`` passes pytest arguments through."""
    session.install(*plugin_requirements(), *TEST_DEPS)
    env = {"RLX_FUZZ_PROFILE": "fuzz", "RLX_FUZZ_SAVE_DIR": str(ROOT / "tests" / "fuzz" / "regressions")}
    env["RLX_FUZZ_EXAMPLES"] = session.env.get("RLX_FUZZ_EXAMPLES") or "10000"
    session.run("pytest", "--import-mode=importlib", "-p", "no:cacheprovider", str(ROOT / "tests" / "fuzz"),
                *session.posargs, env=env)


@nox.session
def soak(session: nox.Session) -> None:
    """10,000 runs of a compiled graph per available device with the RSS figures printed
    (bench/soak.py); fails when memory grows past the limit. Posargs go to the script."""
    session.install(*plugin_requirements())
    session.run("python", str(ROOT / "bench" / "soak.py"), *session.posargs)
