"""rlx_cpu.openmp: libgomp loaded once, with rlx-cpu's spin count unless the user or an
earlier library chose, and the environment left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rlx_cpu import openmp


class _FakeCDLL:
    """Records the environment each load saw; fails where told."""

    def __init__(self, fail: bool = False) -> None:
        self.seen: list[dict[str, str | None]] = []
        self.fail = fail

    def __call__(self, name: str, mode: int = 0) -> object:
        self.seen.append({k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")})
        if self.fail:
            raise OSError(f"{name}: cannot open shared object file")
        return object()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> _FakeCDLL:
    cdll = _FakeCDLL()
    monkeypatch.setattr(openmp.ctypes, "CDLL", cdll)
    monkeypatch.setattr(openmp, "_loaded_already", lambda name: False)
    monkeypatch.setattr(openmp.sys, "platform", "linux")
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    return cdll


def test_spin_count_is_set_for_the_load_only(fake: _FakeCDLL) -> None:
    ok, how = openmp._load()
    assert ok
    assert fake.seen == [{"GOMP_SPINCOUNT": str(openmp.SPIN), "OMP_WAIT_POLICY": None}]
    assert "GOMP_SPINCOUNT" not in os.environ
    assert f"spin {openmp.SPIN:,}" in how


@pytest.mark.parametrize("var,value", [("GOMP_SPINCOUNT", "123"), ("OMP_WAIT_POLICY", "passive")])
def test_the_users_choice_is_kept(fake: _FakeCDLL, monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    ok, how = openmp._load()
    assert ok
    assert fake.seen[0][var] == value
    assert fake.seen[0]["GOMP_SPINCOUNT"] == (value if var == "GOMP_SPINCOUNT" else None)
    assert os.environ[var] == value
    assert f"{var}={value}" in how


def test_a_library_loaded_before_is_left_alone(fake: _FakeCDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openmp, "_loaded_already", lambda name: True)
    ok, how = openmp._load()
    assert ok
    assert fake.seen == []
    assert "loaded before rlx-cpu" in how


def test_a_missing_library_says_so_and_restores_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                                fake: _FakeCDLL) -> None:
    fake.fail = True
    ok, how = openmp._load()
    assert not ok
    assert how.startswith("libgomp not loaded") and "cannot open" in how
    assert "GOMP_SPINCOUNT" not in os.environ


@pytest.mark.skipif(sys.platform != "linux", reason="libgomp's spin count is read on Linux")
def test_every_loader_goes_through_openmp_first() -> None:
    """In a fresh process, compiling and running a graph (the native kernels, and oneMKL and
    oneDNN where installed) finds libgomp not yet loaded by anything else, so rlx-cpu's
    spin count is the one in force; the environment carries no trace of it."""
    code = textwrap.dedent("""
        import json, os
        import numpy as np
        import rlx_core
        from rlx_cpu import openmp
        g = rlx_core.Graph("spin")
        x = g.input("x", (4096,))
        g.set_outputs([g.tanh(g.exp(x))])
        rlx_core.compile(g, device="cpu").run({"x": np.ones(4096, np.float32)})
        maps = open("/proc/self/maps").read()
        print(json.dumps({"how": openmp.describe(), "env": "GOMP_SPINCOUNT" in os.environ,
                          "gomp": "libgomp" in maps}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if not got["gomp"]:
        pytest.skip(f"libgomp is not on this host: {got['how']}")
    assert got["how"].startswith(f"libgomp, spin {openmp.SPIN:,}"), got
    assert not got["env"]


def test_the_probe_says_the_policy_and_loads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's entry is part of the calibration's identity: it must not depend on what
    this process loaded first (torch's libgomp), only on the environment's choice."""
    monkeypatch.setattr(openmp, "load", lambda: pytest.fail("the probe loaded libgomp"))
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert openmp.describe(measured=False).startswith(f"libgomp, spin {openmp.SPIN:,} where rlx-cpu loads it first")
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert openmp.describe(measured=False) == "libgomp, as the environment chooses (OMP_WAIT_POLICY=passive)"
