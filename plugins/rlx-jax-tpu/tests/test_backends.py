"""The two backends' metadata, probes and cost models: ``tpu`` only where JAX sees a TPU
(and why not, naming JAX's platforms and ``JAX_PLATFORMS``), ``jax`` on JAX's default
platform with that platform in its label; jax imported only when a backend is probed;
the conformance kit over every op the ``jax`` backend claims.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rlx_core import Availability, Graph, OpKind
from rlx_core.testing import BoundCheck, parametrize_checks
from rlx_jax_tpu import JaxBackend, TpuBackend, rlx_backends
from rlx_jax_tpu.backend import guess_default_platform

jax = pytest.importorskip("jax", reason="jax is not installed (pip install jax); the rlx-jax-tpu backends need it")

HAS_TPU = any(d.platform == "tpu" for d in jax.devices())


def _run_python(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (it prints one JSON line) and return that JSON."""
    full_env = {**os.environ, **(env or {})}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_hook_returns_both_backends_with_the_documented_priorities() -> None:
    backends = {b.name: b for b in rlx_backends()}
    assert set(backends) == {"jax", "tpu"}
    assert backends["tpu"].priority == 100 and backends["jax"].priority == 40
    assert backends["jax"].supported_ops() == backends["tpu"].supported_ops()
    assert OpKind.ATTENTION.value in backends["jax"].supported_ops()


@pytest.mark.slow
def test_listing_the_backends_does_not_import_jax_and_probing_respects_jax_platforms(tmp_path: Path) -> None:
    """One fresh interpreter (importing jax is the slow part): the hook and the metadata
    import no jax; probing does, and under ``JAX_PLATFORMS=cpu`` both answers say so."""
    got = _run_python("""
        import json, sys
        import rlx_jax_tpu
        backends = {b.name: b for b in rlx_jax_tpu.rlx_backends()}
        facts = [(b.label, b.priority, len(b.supported_ops()), b.default_cost_model().source)
                 for b in backends.values()]
        before = "jax" in sys.modules
        a, t = backends["jax"].probe(), backends["tpu"].probe()
        print(json.dumps({"before": before, "after": "jax" in sys.modules, "label": backends["jax"].label,
                          "jax": [a.available, a.reason, a.versions], "tpu": [t.available, t.reason, t.versions]}))
    """, {"JAX_PLATFORMS": "cpu", "RLX_CACHE_DIR": str(tmp_path)})
    assert got["before"] is False and got["after"] is True
    assert got["label"] == "JAX/XLA (cpu)"
    available, reason, versions = got["jax"]
    assert available and "platform cpu" in reason and "JAX_PLATFORMS=cpu" in reason
    assert versions["JAX_PLATFORMS"] == "cpu" and versions["platform"] == "cpu"
    available, reason, versions = got["tpu"]
    assert not available and "JAX platforms here: cpu (JAX_PLATFORMS=cpu)" in reason
    assert versions["JAX_PLATFORMS"] == "cpu"


@pytest.mark.skipif(HAS_TPU, reason="this host has a TPU: the unavailable answer cannot be seen here")
def test_tpu_is_unavailable_here_and_says_which_platforms_jax_has() -> None:
    answer = TpuBackend().probe()
    assert not answer.available
    assert "JAX sees no TPU" in answer.reason
    listed = answer.reason.split("JAX platforms here: ")[1].split(" (")[0].split(", ")
    assert "cpu" in listed and "tpu" not in listed
    for d in jax.devices():  # the default platform is named as a backend ("gpu" devices: "cuda" or "rocm")
        assert d.platform in listed or (d.platform == "gpu" and {"cuda", "rocm"} & set(listed)), listed
    assert "JAX_PLATFORMS" in answer.reason
    assert answer.versions["jax"] == jax.__version__


def test_jax_is_available_on_the_default_platform_and_its_label_names_it() -> None:
    backend = JaxBackend()
    answer = backend.probe()
    platform = jax.devices()[0].platform
    assert answer.available, answer.reason
    assert answer.devices[0] == "jax:0"
    assert answer.versions["platform"] == platform
    assert f"platform {platform}" in answer.reason and "JAX_PLATFORMS" in answer.reason
    assert backend.target_platform() == platform
    if guess_default_platform() is not None:  # known before importing jax: the registry shows it
        assert backend.label == f"JAX/XLA ({platform})"


@pytest.mark.parametrize(("env", "expected"), [("tpu,cpu", "tpu"), (" CUDA ", "cuda"), ("", None)])
def test_the_default_platform_is_guessed_without_jax(monkeypatch: pytest.MonkeyPatch, env: str,
                                                      expected: str | None) -> None:
    monkeypatch.setenv("JAX_PLATFORMS", env)
    guess = guess_default_platform()
    if env:
        assert guess == expected
    else:  # unset: cpu unless a JAX plugin or libtpu is installed (then only the probe knows)
        assert guess in ("cpu", None)


def test_tpu_declines_float64_with_a_reason_and_claims_float32() -> None:
    g = Graph("wide")
    x = g.input("x", (2,), "float64")
    y = g.input("y", (2,), "float32")
    g.set_outputs([g.exp(x), g.exp(y)])
    nodes = {n.dtype: n for n in g.nodes if n.op is OpKind.EXP}
    assert TpuBackend().claims(nodes["float32"]) is True
    assert "float64" in str(TpuBackend().claims(nodes["float64"]))
    assert JaxBackend().claims(nodes["float64"]) is (JaxBackend().target_platform() != "tpu")


def test_default_cost_models_differ_per_platform(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    tpu, host = TpuBackend().default_cost_model(), JaxBackend().default_cost_model()
    assert tpu.device == "tpu" and host.device == "jax"
    assert not tpu.calibrated and not host.calibrated
    assert tpu.sgemm_gflops > host.sgemm_gflops
    assert f"JAX on {JaxBackend().target_platform() or 'cpu'}" in host.source


def test_the_probe_answer_from_the_child_sets_the_platform_here() -> None:
    """The core probes in a child process and hands the answer back (``Backend.probed``):
    a GPU host's jax device must not be priced with the cpu defaults."""
    backend = JaxBackend()
    backend.probed(Availability(True, "platform gpu", devices=["jax:0"], versions={"platform": "gpu"}))
    assert backend.target_platform() == "gpu"
    assert "JAX on gpu" in backend.default_cost_model().source
    backend.probed(Availability(False, "no platform"))  # an unavailable answer changes nothing
    assert backend.target_platform() == "gpu"


@pytest.mark.slow
def test_calibrate_measures_through_the_executable_and_is_cached(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    backend = JaxBackend()
    model = backend.calibrate(quick=True)
    assert model.calibrated and model.device == "jax"
    assert model.sgemm_gflops > 0 and model.memory_bw_gbps > 0 and model.dispatch_overhead_ns > 0
    cached = backend.cost_model()
    assert cached.calibrated and cached.sgemm_gflops == pytest.approx(model.sgemm_gflops)
    assert np.isfinite(cached.sgemm_gflops_at(64, 64, 64))


@parametrize_checks(JaxBackend(), max_examples=4, seed=0)
def test_conformance(check: BoundCheck) -> None:
    check()


@pytest.mark.slow
def test_probe_child_does_not_reserve_the_gpu() -> None:
    """rlx's probe child starts JAX without its 75% up-front GPU reservation (the parent
    and the other children share the GPU); the user's own process is never changed."""
    code = textwrap.dedent("""
        import os
        from rlx_jax_tpu import backend
        backend._no_preallocation_in_child()
        print(os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"))
    """)
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    here = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    child = subprocess.run([sys.executable, "-c", code], env={**env, "RLX_ISOLATION_CHILD": "1"},
                           capture_output=True, text=True, check=True)
    assert here.stdout.strip() == "None" and child.stdout.strip() == "false"
