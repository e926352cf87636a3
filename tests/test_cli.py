"""The ``rlx`` command as users meet it: stdout, stderr and the exit code. Every
``RlxError`` must come out as one ``error:`` line and exit code 2.

Most tests run ``rlx`` in this process (``run_rlx``: ``rlx_core.cli.main`` with its own
environment, working directory and a fresh default registry, output captured), which
takes a fraction of a second where a new interpreter took several. The few marked
``slow`` start the real ``rlx`` (``run_rlx_process``): the console script, what a fresh
interpreter imports, plugins probed in child processes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from support import other_plugins_disabled

import rlx_core as rlx
from rlx_core import reference

ENV_VARS = ("RLX_DEVICE", "RLX_DEVICES", "RLX_DENY_DEVICES", "RLX_PREFER_DEVICES", "RLX_DEVICE_CHAIN",
            "RLX_BENCHMARK_PICK", "RLX_STRICT", "RLX_PROBE_TIMEOUT", "RLX_DISABLE_PLUGINS", "RLX_CACHE_DIR")
HEAVY_MODULES = ("cupy", "jax", "pyopencl", "onnx", "onnxruntime", "ray", "torch")


def rlx_environment(cwd: Path, env: dict[str, str] | None = None, *, in_process: bool = False) -> dict[str, str]:
    """The environment ``rlx`` runs with in these tests: this one without its ``RLX_*``
    variables, a private cache under ``cwd``, 200 columns, only cpu among this
    repository's plugins (the in-repo jax/opencl plugins would outrank it) and the fakes
    a test brings, then ``env``. In this process, probes and calibration run in it too
    (``RLX_ISOLATION=0``, unless ``env`` says otherwise): a child per probe would cost
    what running in-process saves, and isolation has its own tests."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLX_")}
    base.update({"RLX_CACHE_DIR": str(cwd / "cache"), "COLUMNS": "200", "PYTHONWARNINGS": "default"})
    if in_process:
        base["RLX_ISOLATION"] = "0"
    env = dict(env or {})
    base["RLX_DISABLE_PLUGINS"] = other_plugins_disabled(env.pop("RLX_DISABLE_PLUGINS", ""))
    base.update(env)
    return base


@dataclass
class Ran:
    """What a run of ``rlx`` left: like ``subprocess.CompletedProcess``."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def run_rlx(*args: str, cwd: Path, env: dict[str, str] | None = None, registry: rlx.Registry | None = None,
            columns: int | None = None) -> Ran:
    """``rlx ARGS`` in this process, as ``run_rlx_process`` runs it in a child: the
    environment of ``rlx_environment`` (put back afterwards), ``cwd`` as the working
    directory, a fresh default registry (or ``registry``), stdout and stderr captured,
    warnings shown as ``main`` shows them."""
    from rlx_core.backends import registry as registries
    from rlx_core.cli import main
    from rlx_core.cli.common import console

    environ = rlx_environment(cwd, env, in_process=True)
    saved_environ, saved_cwd, saved_registry, saved_width = dict(os.environ), os.getcwd(), registries._default, \
        console._width
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        registries.set_default_registry(registry)
        console.width = columns or int(environ.get("COLUMNS", "80"))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("default")  # as PYTHONWARNINGS=default does for a child
            try:
                main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        os.environ.clear()
        os.environ.update(saved_environ)
        os.chdir(saved_cwd)
        registries.set_default_registry(saved_registry)
        console._width = saved_width
    return Ran(list(args), code, out.getvalue(), err.getvalue())


def run_rlx_process(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 180,
                    ) -> subprocess.CompletedProcess:
    """``python -m rlx_core ARGS`` in a child process, environment as ``run_rlx``'s
    (probes in child processes of their own, as by default)."""
    return subprocess.run([sys.executable, "-m", "rlx_core", *args], cwd=cwd, env=rlx_environment(cwd, env),
                          capture_output=True, text=True, timeout=timeout)


def assert_user_error(proc: Ran | subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2, no traceback, exactly one ``error:`` line on stderr naming ``fragments``."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def mlp_graph() -> rlx.Graph:
    text = (Path(rlx.__file__).parent / "examples" / "mlp.json").read_text(encoding="utf-8")
    return rlx.Graph.from_json(text)


@pytest.fixture
def graphs(tmp_path: Path) -> dict[str, Path]:
    """Small graph files: an elementwise one, a softmax one, and a malformed file."""
    add = rlx.Graph("addmul")
    x = add.input("x", (2, 3), "float32")
    add.set_outputs([add.mul(add.add(x, x, name="twice"), x, name="y")])
    soft = rlx.Graph("soft")
    s = soft.input("x", (4, 5), "float32")
    soft.set_outputs([soft.softmax(soft.mul(s, s), axis=-1, name="probs")])
    paths = {"add": tmp_path / "add.json", "softmax": tmp_path / "softmax.json", "bad": tmp_path / "bad.json"}
    add.save(paths["add"])
    soft.save(paths["softmax"])
    paths["bad"].write_text('{"format": "rlx.graph", "version": 1, "nodes": [{"id": 0}]}')
    return paths


# ----------------------------------------------------------------------------- basics
def test_version_lists_core_and_plugins(tmp_path: Path) -> None:
    proc = run_rlx("--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"rlx-core {rlx.__version__}"
    assert any(line.startswith("rlx-cpu ") and "cpu" in line for line in lines[1:]), proc.stdout


def test_help_lists_the_commands(tmp_path: Path) -> None:
    proc = run_rlx("--help", cwd=tmp_path)
    assert proc.returncode == 0
    for command in ("devices", "run", "bench", "calibrate", "cache"):
        assert command in proc.stdout


@pytest.mark.slow
def test_the_console_script_and_python_m(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / ("rlx.exe" if os.name == "nt" else "rlx")
    if script.exists():  # installed with the distribution's [project.scripts]
        out = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("rlx-core "), out.stderr
    proc = run_rlx_process("run", "--example", "mlp", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "device: cpu" in proc.stdout and "[8, 10]" in proc.stdout


@pytest.mark.slow
def test_startup_imports_no_heavy_library(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from rlx_core.cli import main\n"
        "import os\n"
        "for argv in (['--version'], ['devices', '--json']):\n"
        "    if argv[0] == 'devices':  # probing jax or opencl imports them, by design: only cpu\n"
        f"        os.environ['RLX_DISABLE_PLUGINS'] = {other_plugins_disabled()!r}\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, None), e.code\n"
        f"print([m for m in {HEAVY_MODULES!r} if m in sys.modules])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLX_")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# ----------------------------------------------------------------------------- devices
def test_devices_json_schema_and_cpu_recommended(tmp_path: Path) -> None:
    proc = run_rlx("devices", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"devices", "broken_plugins", "policy"} <= set(doc)
    keys = {"device", "label", "available", "reason", "distribution", "version", "ops", "calibrated",
            "recommended", "blocker"}
    for row in doc["devices"]:
        assert keys <= set(row), row
        assert row["ops"] == sorted(row["ops"])
    cpu = next(r for r in doc["devices"] if r["device"] == "cpu")
    assert cpu["available"] and cpu["recommended"], cpu
    assert cpu["distribution"] == "rlx-cpu" and cpu["version"]
    assert {"matmul", "add", "reduce_max", "conv2d"} <= set(cpu["ops"])
    assert cpu["blocker"] is None
    assert [r["device"] for r in doc["devices"] if r["recommended"]] == ["cpu"]
    assert doc["policy"]["pick"] == "cost" and doc["policy"]["sources"]["pick"] == "default"


def test_devices_table_for_people(tmp_path: Path) -> None:
    proc = run_rlx("devices", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "cpu" in out and "rlx-cpu" in out and "usable" in out and "yes" in out


def test_devices_explain_shows_policy_sources_and_every_variable(tmp_path: Path, graphs: dict[str, Path]) -> None:
    env = {"RLX_PREFER_DEVICES": " cpu ", "RLX_BENCHMARK_PICK": "0"}
    proc = run_rlx("devices", "--explain", "--graph", str(graphs["softmax"]), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "env RLX_PREFER_DEVICES" in out
    for var in ENV_VARS:
        assert var in out, var
    assert "Why cpu:" in out


def test_devices_json_policy_from_env(tmp_path: Path) -> None:
    env = {"RLX_DENY_DEVICES": "cpu", "RLX_STRICT": "1"}
    doc = json.loads(run_rlx("devices", "--json", cwd=tmp_path, env=env).stdout)
    assert doc["policy"]["deny"] == ["cpu"] and doc["policy"]["strict"] is True
    assert doc["policy"]["sources"]["deny"] == "env RLX_DENY_DEVICES"
    cpu = next(r for r in doc["devices"] if r["device"] == "cpu")
    assert cpu["available"] and not cpu["recommended"]
    assert "denied" in cpu["blocker"] and "RLX_DENY_DEVICES" in cpu["blocker"]
    # three states: installed (loaded), available (its probe), usable (and the policy lets it)
    assert (cpu["installed"], cpu["available"], cpu["usable"]) == (True, True, False)
    assert isinstance(doc["not_installed"], list)  # rlx's own backends missing here, with the pip command


@pytest.mark.parametrize("runner", [run_rlx, pytest.param(run_rlx_process, marks=pytest.mark.slow)],
                         ids=["in-process", "process"])
def test_devices_with_broken_and_good_fake_plugins(tmp_path: Path, fake_site, graphs: dict[str, Path],
                                                   runner) -> None:
    """In a process of its own, with probes in children (the subprocess's timeout bounds
    it: the hung probe neither blocks the report nor the exit), and in this one."""
    env = {"PYTHONPATH": os.pathsep.join([str(fake_site.path), os.environ.get("PYTHONPATH", "")]),
           "RLX_PROBE_TIMEOUT": "1"}
    proc = runner("devices", "--json", "--graph", str(graphs["softmax"]), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["device"]: r for r in doc["devices"]}
    broken = {b["name"]: b["error"] for b in doc["broken_plugins"]}
    assert "fakeimport" in broken and "fakev2" in broken, broken
    assert "rlxfake-fakeimport" in broken["fakeimport"]  # the error names the distribution
    assert not rows["fakehang"]["available"] and "did not answer" in rows["fakehang"]["reason"]
    assert rows["cpu"]["available"] and rows["cpu"]["recommended"]
    # fakenp claims add and mul only: softmax's decomposition stops it at reduce_max.
    assert rows["fakenp"]["available"] and "reduce_max" in rows["fakenp"]["blocker"]
    assert "softmax" in rows["fakenp"]["blocker"]

    people = runner("devices", "--explain", "--graph", str(graphs["add"]), cwd=tmp_path, env=env)
    assert people.returncode == 0, people.stderr
    assert "Broken plugins" in people.stdout and "fakeimport" in people.stdout
    assert "Why not fakehang: unavailable" in people.stdout
    assert "Traceback" not in people.stderr


@pytest.mark.slow
def test_devices_table_fits_80_columns_with_reasons_below_it(tmp_path: Path, fake_site,
                                                             graphs: dict[str, Path]) -> None:
    env = {"PYTHONPATH": str(fake_site.path), "RLX_PROBE_TIMEOUT": "1", "COLUMNS": "80"}
    for args in (("devices",), ("devices", "--graph", str(graphs["softmax"]))):
        proc = run_rlx(*args, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert max(len(line.rstrip()) for line in lines) <= 80, proc.stdout
        end = min(i for i, line in enumerate(lines) if line.startswith("└"))  # the device table's
        below = "\n".join(lines[end + 1:])
        # the unavailable fakehang's reason is a numbered note under the table, named by device
        assert "fakehang: probe did not answer" in below.replace("\n", " "), proc.stdout
        assert "did not answer" not in "\n".join(lines[:end])


def test_devices_lists_disabled_plugins(tmp_path: Path, fake_site) -> None:
    env = {"PYTHONPATH": str(fake_site.path), "RLX_DISABLE_PLUGINS": "fakehang,fakeimport"}
    doc = json.loads(run_rlx("devices", "--json", cwd=tmp_path, env=env).stdout)
    assert set(doc["disabled_plugins"]) >= {"fakehang", "fakeimport"}
    assert "fakehang" not in {r["device"] for r in doc["devices"]}


# ----------------------------------------------------------------------------- run
def test_run_bundled_example(tmp_path: Path) -> None:
    proc = run_rlx("run", "--example", "mlp", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "device: cpu" in out
    assert "input x: random float32[8, 64] (seed 0" in out
    assert "compile:" in out and "run:" in out
    assert "probs" in out and "[8, 10]" in out and "float32" in out


def test_run_with_a_precision_says_whether_the_device_took_it(tmp_path: Path) -> None:
    proc = run_rlx("run", "--example", "mlp", "--device", "cpu", "--precision", "bfloat16", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    taken = "bf16" in rlx.get_backend("cpu").precisions()
    line = ("precision bf16 allowed: cpu declares bf16 on this host and may compute float32" if taken else
            "precision bf16 allowed, but cpu does not compute in bf16 on this host: float32 throughout")
    assert line in proc.stdout, proc.stdout
    bad = run_rlx("run", "--example", "mlp", "--precision", "int4", cwd=tmp_path)
    assert bad.returncode != 0
    assert "--precision must be one of fp32, bf16, fp16, got 'int4'" in bad.stderr + bad.stdout


def test_run_file_with_inputs_writes_npz(tmp_path: Path) -> None:
    g = mlp_graph()
    path = tmp_path / "mlp.json"
    g.save(path)
    x = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = run_rlx("run", str(path), "--input", "x=x.npy", "--device", "cpu", "--out", "out.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "random" not in proc.stdout and "from x.npy" in proc.stdout
    with np.load(tmp_path / "out.npz") as saved:
        assert list(saved.keys()) == ["probs"]
        got = saved["probs"]
    want = reference.evaluate(g, {"x": x})[0]
    assert got.dtype == np.float32 and got.shape == (8, 10)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_run_random_inputs_are_seeded(tmp_path: Path) -> None:
    outs = []
    for i, seed in enumerate(("7", "7", "8")):
        proc = run_rlx("run", "--example", "mlp", "--seed", seed, "--out", f"o{i}.npz", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        with np.load(tmp_path / f"o{i}.npz") as f:
            outs.append(f["probs"])
    assert np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["run", "missing.json"], ["missing.json"]),
        (["run", "bad.json"], ["bad.json", "node 0"]),
        (["run", "--example", "nosuch"], ["nosuch", "mlp"]),
        (["run", "add.json", "--device", "nosuchdevice"], ["nosuchdevice", "cpu"]),
        (["run", "add.json", "--input", "nope=x.npy"], ["nope", "x"]),
        (["run", "add.json", "--input", "x=missing.npy"], ["missing.npy"]),
        (["run", "add.json", "--input", "x=wrong.npy"], ["'x'", "(2, 3)"]),
        (["run", "add.json", "--input", "x=int.npy"], ["'x'", "float32", "int64"]),
        (["devices", "--graph", "missing.json"], ["missing.json"]),
        (["bench", "missing.json"], ["missing.json"]),
        (["calibrate", "nosuchdevice"], ["nosuchdevice"]),
    ],
)
def test_user_errors_are_one_line_exit_2(tmp_path: Path, graphs: dict[str, Path], args: list[str],
                                         fragments: list[str]) -> None:
    np.save(tmp_path / "wrong.npy", np.zeros((3, 2), np.float32))
    np.save(tmp_path / "int.npy", np.zeros((2, 3), np.int64))
    assert_user_error(run_rlx(*args, cwd=tmp_path), *fragments)


def test_explicit_device_that_cannot_run_names_the_blocker(tmp_path: Path, fake_site, graphs: dict[str, Path]) -> None:
    env = {"PYTHONPATH": str(fake_site.path), "RLX_DISABLE_PLUGINS": "fakehang"}
    proc = run_rlx("run", str(graphs["softmax"]), "--device", "fakenp", cwd=tmp_path, env=env)
    assert_user_error(proc, "fakenp", "reduce_max", "softmax")


@pytest.mark.parametrize(
    ("env", "var"),
    [({"RLX_STRICT": "maybe"}, "RLX_STRICT"), ({"RLX_BENCHMARK_PICK": "lots"}, "RLX_BENCHMARK_PICK"),
     ({"RLX_PROBE_TIMEOUT": "-3"}, "RLX_PROBE_TIMEOUT")],
)
def test_malformed_environment_is_a_user_error(tmp_path: Path, env: dict[str, str], var: str) -> None:
    assert_user_error(run_rlx("devices", cwd=tmp_path, env=env), var)
    assert_user_error(run_rlx("run", "--example", "mlp", cwd=tmp_path, env=env), var)


def test_usage_errors_exit_2(tmp_path: Path, graphs: dict[str, Path]) -> None:
    for args in (["run"], ["run", str(graphs["add"]), "--example", "mlp"], ["run", str(graphs["add"]), "-i", "x"],
                 ["nosuchcommand"]):
        proc = run_rlx(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        # one line, like every other mistake, naming the command's help
        assert_user_error(proc, "--help")




# ----------------------------------------------------------------------------- bench, calibrate, cache
def test_bench_times_every_viable_device(tmp_path: Path) -> None:
    proc = run_rlx("bench", "--example", "mlp", "--runs", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "cpu" in proc.stdout and "chosen" in proc.stdout
    assert re.search(r"\d (µs|ms|s)\b", proc.stdout), proc.stdout  # a time in its unit (ms on a busy host)


@pytest.mark.slow
def test_calibrate_then_devices_shows_calibrated_and_cache_lists_it(tmp_path: Path) -> None:
    proc = run_rlx("calibrate", "cpu", "--quick", "--verify", cwd=tmp_path, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert "cpu" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80, proc.stdout  # its tables too
    for model in ("mlp", "transformer", "elementwise", "cnn", "matmul"):  # the --verify table and summary
        assert f"{model}: picked cpu, best cpu, regret 1.00x" in proc.stdout
    calibrated = "GFLOP/s" in proc.stdout  # a backend may say in one line that it cannot calibrate
    doc = json.loads(run_rlx("devices", "--json", cwd=tmp_path).stdout)
    cpu = next(r for r in doc["devices"] if r["device"] == "cpu")
    assert cpu["calibrated"] is calibrated

    info = json.loads(run_rlx("cache", "info", "--json", cwd=tmp_path).stdout)
    assert Path(info["path"]) == tmp_path / "cache"
    assert info["entries"].get("calibration", 0) == (1 if calibrated else 0)
    # besides: what the backends timed on this host (rlx-cpu's verdicts), each an entry too
    assert info["total_entries"] == sum(info["entries"].values()) >= (1 if calibrated else 0)
    cleared = run_rlx("cache", "clear", cwd=tmp_path)
    removed = info["total_entries"]
    assert cleared.returncode == 0 and f"removed {removed} file" in cleared.stdout, cleared.stdout
    assert json.loads(run_rlx("cache", "info", "--json", cwd=tmp_path).stdout)["total_entries"] == 0


def test_cache_info_for_people(tmp_path: Path) -> None:
    proc = run_rlx("cache", "info", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"rlx cache: {tmp_path / 'cache'} (RLX_CACHE_DIR)" in proc.stdout and "no entries yet" in proc.stdout
