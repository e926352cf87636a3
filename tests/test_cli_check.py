"""``rlx check MODEL``: which devices can run a model, why not, the pick; exit 0 / 1 / 2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import assert_user_error, mlp_graph, run_rlx


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.json"
    mlp_graph().save(path)
    return path


def test_a_runnable_model_exits_0_with_the_pick(model: Path, tmp_path: Path) -> None:
    proc = run_rlx("check", str(model), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "can run" in proc.stdout and "pick: cpu" in proc.stdout
    doc = json.loads(run_rlx("check", str(model), "--json", cwd=tmp_path).stdout)
    assert doc["runnable"] is True and doc["pick"] == "cpu" and doc["partition"] is None
    cpu = next(d for d in doc["devices"] if d["device"] == "cpu")
    assert cpu["can_run"] and cpu["blocker"] is None and cpu["est_seconds"] > 0


def test_no_device_that_can_run_it_exits_1_with_every_reason(model: Path, tmp_path: Path) -> None:
    proc = run_rlx("check", str(model), "--json", cwd=tmp_path, env={"RLX_DENY_DEVICES": "cpu"})
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["runnable"] is False and doc["pick"] is None
    cpu = next(d for d in doc["devices"] if d["device"] == "cpu")
    assert not cpu["can_run"] and "RLX_DENY_DEVICES" in cpu["blocker"]
    text = run_rlx("check", str(model), cwd=tmp_path, env={"RLX_DENY_DEVICES": "cpu"})
    assert text.returncode == 1 and "no device can run it" in text.stdout and "cpu: " in text.stdout


def test_one_device_and_bad_input(model: Path, tmp_path: Path) -> None:
    doc = json.loads(run_rlx("check", str(model), "--device", "cpu", "--json", cwd=tmp_path).stdout)
    assert [d["device"] for d in doc["devices"]] == ["cpu"] and doc["pick"] == "cpu"
    assert_user_error(run_rlx("check", str(model), "--device", "nosuch", cwd=tmp_path), "unknown device 'nosuch'")
    assert_user_error(run_rlx("check", str(tmp_path / "missing.json"), cwd=tmp_path), "missing.json")
    assert_user_error(run_rlx("check", str(model), "--dim", "batch=2", cwd=tmp_path), "symbolic dims")


@pytest.fixture
def split_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The environment of a host whose only devices are fakemm (products) and fakerest
    (everything else): no single device runs the mlp example. On ``sys.path`` for ``rlx``
    in this process, on ``PYTHONPATH`` for one in a child."""
    import importlib
    import sys

    from conftest import SPLIT_PLUGIN, FakeSite

    site = tmp_path / "site"
    site.mkdir()
    FakeSite(site, SPLIT_PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield {"PYTHONPATH": str(site), "RLX_DISABLE_PLUGINS": "cpu"}
    for name in [m for m in sys.modules if m.startswith("rlxfake_")]:
        del sys.modules[name]


def test_a_model_only_a_split_runs_exits_0_with_the_segments(model: Path, tmp_path: Path,
                                                             split_site: dict[str, str]) -> None:
    proc = run_rlx("check", str(model), "--json", cwd=tmp_path, env=dict(split_site))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["runnable"] is True and doc["pick"] == "fakemm+fakerest"
    assert not any(d["can_run"] for d in doc["devices"])
    part = doc["partition"]
    assert part["needed"] is True and part["devices"] == ["fakemm", "fakerest"]
    assert [s["device"] for s in part["segments"]] == ["fakemm", "fakerest", "fakemm", "fakerest"]
    assert "only fakemm runs matmul" in part["segments"][0]["reason"]
    text = run_rlx("check", str(model), cwd=tmp_path, env=dict(split_site))
    assert text.returncode == 0 and "pick: fakemm+fakerest, split into 4 segments" in text.stdout
    explain = run_rlx("devices", "--graph", str(model), "--explain", cwd=tmp_path, env=dict(split_site))
    assert explain.returncode == 0, explain.stderr
    assert "Split across fakemm + fakerest:" in explain.stdout and "segment 3 on fakerest" in explain.stdout
    run = run_rlx("run", str(model), cwd=tmp_path, env=dict(split_site))
    assert run.returncode == 0, run.stderr
    assert "device: fakemm+fakerest" in run.stdout


def test_check_says_why_a_graph_is_not_split(model: Path, tmp_path: Path) -> None:
    doc = json.loads(run_rlx("check", str(model), "--json", cwd=tmp_path).stdout)
    assert doc["partition"] is None and doc["partition_note"] == "only one device can take part"
