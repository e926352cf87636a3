"""examples/rlx-example-plugin as a third party ships it: pip-installed into a venv from
outside the core's tree, discovered through its entry point, ranked, blocked, run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from support import other_plugins_disabled

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "rlx-example-plugin"
TOY_OPS = {"matmul", "add", "sub", "mul", "div", "maximum", "minimum", "neg", "exp", "tanh", "relu", "reshape",
           "transpose"}


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLX_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def plugin_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv's python that sees this environment's rlx-core and has the example plugin
    pip-installed (a real wheel build, not a path hack)."""
    pytest.importorskip("hatchling", reason="building the example plugin needs hatchling (nox installs it)")
    venv = tmp_path_factory.mktemp("example-plugin") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    # --system-site-packages reaches the *base* interpreter's packages. When the tests run
    # in a venv themselves (nox), rlx-core, pip and hatchling live in that venv: chain it.
    child_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    parents = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(child_site) / "_rlx_test_parent_env.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in parents) + "\n", encoding="utf-8"
    )
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", str(EXAMPLE)],
        capture_output=True, text=True, env=_clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"), cwd=venv,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python


def in_venv(python: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    # Only cpu and the example plugin: the in-repo jax/opencl plugins would change the ranking.
    env["RLX_DISABLE_PLUGINS"] = other_plugins_disabled(env.get("RLX_DISABLE_PLUGINS", ""))
    full = _clean_env(RLX_CACHE_DIR=str(cwd / "cache"), COLUMNS="200", **env)
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=cwd, env=full, timeout=180)


@pytest.mark.slow
def test_rlx_devices_discovers_the_installed_plugin(plugin_python: Path, tmp_path: Path) -> None:
    proc = in_venv(plugin_python, "-m", "rlx_core", "devices", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["device"]: r for r in doc["devices"]}
    toy = rows["toy"]
    assert toy["available"] and toy["reason"] == ""
    assert toy["distribution"] == "rlx-example-plugin" and toy["version"] == "0.1.0"
    assert set(toy["ops"]) == TOY_OPS
    assert toy["priority"] == 10 and toy["label"].startswith("Toy numpy backend")
    assert rows["cpu"]["available"] and not doc["broken_plugins"]
    assert toy["recommended"]  # without a graph: the highest-priority available device (the contract)
    # ... and example_pick says where `rlx run --example mlp` runs (priced, not by priority)
    ran = in_venv(plugin_python, "-m", "rlx_core", "run", "--example", "mlp", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert [f"device: {doc['example_pick']['device']} "] == [
        line[: line.index("—")] for line in ran.stdout.splitlines() if line.startswith("device: ")]

    assert "rlx-example-plugin 0.1.0 (backends: toy)" in in_venv(plugin_python, "-m", "rlx_core", "--version",
                                                                  cwd=tmp_path).stdout


CHECKS = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    import rlx_core as rlx

    rng = np.random.default_rng(0)
    g = rlx.Graph("toyable")
    x = g.input("x", (4, 6), "float32")
    w = g.param("w", rng.standard_normal((6, 8)).astype(np.float32))
    h = g.tanh(g.add(g.matmul(x, w), 0.5))
    h = g.div(g.maximum(h, g.neg(h)), 2.0)
    g.set_outputs([g.transpose(g.reshape(g.relu(h), (2, 16)), (1, 0), name="y")])

    soft = rlx.Graph("soft")
    s = soft.input("x", (3, 5), "float32")
    soft.set_outputs([soft.softmax(soft.exp(s), name="probs")])

    ints = rlx.Graph("ints")
    i = ints.input("i", (4,), "int32")
    ints.set_outputs([ints.div(i, ints.constant(np.array([1, 2, 3, 4], np.int32)))])

    xv = rng.standard_normal((4, 6)).astype(np.float32)
    free = rlx.DevicePolicy()  # explicit: ignores RLX_DENY_DEVICES, which only `denied` reads
    out = {}
    cg = rlx.compile(g, device="toy", policy=free)
    got = cg.run({"x": xv})[0]
    want = rlx.reference.evaluate(g, {"x": xv})[0]
    out["toy_matches_reference"] = bool(np.allclose(got, want, rtol=1e-5, atol=1e-6)) and got.dtype == np.float32
    rows = {r.device: r for r in rlx.device_report(g, free)}
    out["est"] = {d: r.est_seconds for d, r in rows.items()}
    out["devices_for"] = rlx.devices_for(g, free)
    out["auto"] = rlx.compile(g, policy=free).device

    soft_rows = {r.device: r for r in rlx.device_report(soft, free)}
    out["soft_toy_blocker"] = soft_rows["toy"].blocker
    out["soft_auto"] = rlx.compile(soft, policy=free).device
    try:
        rlx.compile(soft, device="toy", policy=free)
        out["soft_explicit"] = "compiled"
    except rlx.DeviceError as exc:
        out["soft_explicit"] = str(exc)
    out["int_div_blocker"] = {r.device: r.blocker for r in rlx.device_report(ints, free)}["toy"]

    denied = rlx.DevicePolicy.from_env()  # RLX_DENY_DEVICES=toy in this process's environment
    out["denied_devices_for"] = rlx.devices_for(g, denied)
    out["denied_blocker"] = {r.device: r.blocker for r in rlx.device_report(g, denied)}["toy"]
    out["allow_cpu_devices_for"] = rlx.devices_for(g, rlx.DevicePolicy.only(["cpu"]))
    out["prefer_toy"] = rlx.resolve_device(g, policy=rlx.DevicePolicy.with_prefer(["toy"]))
    g.save("toyable.json")
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_ranking_blockers_and_policy_through_the_installed_plugin(plugin_python: Path, tmp_path: Path) -> None:
    proc = in_venv(plugin_python, "-c", CHECKS, cwd=tmp_path, RLX_DENY_DEVICES="toy")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["toy_matches_reference"]
    # Ranked by the cost models: the order of devices_for follows the estimates.
    est = out["est"]
    assert set(out["devices_for"]) == {"toy", "cpu"}
    assert est[out["devices_for"][0]] <= est[out["devices_for"][1]]
    assert out["auto"] == out["devices_for"][0]
    # No reductions claimed: softmax is blocked on reduce_max, naming the user's node.
    assert "reduce_max" in out["soft_toy_blocker"] and "softmax" in out["soft_toy_blocker"]
    assert out["soft_auto"] == "cpu"
    assert "toy" in out["soft_explicit"] and "reduce_max" in out["soft_explicit"]
    # A claims() refusal carries the plugin's reason into the blocker.
    assert "toy divides floats only" in out["int_div_blocker"]
    # Deny and allow skip it.
    assert out["denied_devices_for"] == ["cpu"] and "denied" in out["denied_blocker"]
    assert out["allow_cpu_devices_for"] == ["cpu"]
    assert out["prefer_toy"] == "toy"

    run = in_venv(plugin_python, "-m", "rlx_core", "run", "toyable.json", "--device", "toy", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "device: toy" in run.stdout and "[16, 2]" in run.stdout
    blocked = in_venv(plugin_python, "-m", "rlx_core", "devices", "--json", "--graph", "toyable.json", cwd=tmp_path,
                      RLX_DISABLE_PLUGINS="toy")
    doc = json.loads(blocked.stdout)
    assert "toy" not in {r["device"] for r in doc["devices"]} and "toy" in doc["disabled_plugins"]


def test_example_backend_passes_the_conformance_kit(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("hypothesis")
    from rlx_core.testing import check_backend

    monkeypatch.syspath_prepend(str(EXAMPLE))
    from rlx_example_plugin import ToyBackend

    report = check_backend(ToyBackend())
    claimed = {f"op:{op}" for op in TOY_OPS}
    assert claimed <= {r.name for r in report.passed}, report.summary()


def test_example_plugin_stays_small() -> None:
    source = (EXAMPLE / "rlx_example_plugin" / "__init__.py").read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 100
