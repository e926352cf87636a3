"""Smoke test of the benchmark suite (bench/suite.py) at tiny sizes: every model imports into
rlx, and every rlx device that can run it agrees with ONNX Runtime within the suite's
documented tolerance (bench/_checks.py). No timing is asserted: one round, no pause.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import bench_module

import rlx_core as rlx
import rlx_core.onnx
from rlx_core.errors import ConfigError, ModelError

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

models = bench_module("models")
suite = bench_module("suite")
markdown = bench_module("_markdown")
checks = bench_module("_checks")


@pytest.mark.slow
@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_every_rlx_device_matches_onnxruntime(name: str) -> None:
    model = models.build(name, "tiny")
    result = suite.bench_model(model, rounds=1, pause=0.0, target_s=1e-6, with_jax=False)
    assert result["import_error"] == "", f"rlx_core.onnx.load failed on {name}: {result['import_error']}"
    graph = rlx_core.onnx.load(model.onnx)
    expected = set(rlx.available_devices()) & set(rlx.devices_for(graph))
    rows = {r["name"]: r for r in result["contenders"]}
    assert {n for n, r in rows.items() if r["kind"] == "rlx"} == {f"rlx {d}" for d in expected}
    assert "rlx cpu" in rows, "the cpu backend claims every op and must run every suite model"
    tol = result["tolerance"]["tol"]
    for row in rows.values():
        if row["kind"] in ("rlx", "numpy"):
            assert row["status"] == "ok", f"{row['name']} on {name}: {row.get('error') or row['max_abs_diff']} > {tol}"


def test_models_are_deterministic() -> None:
    a, b = models.build("cnn", "tiny"), models.build("cnn", "tiny")
    assert a.onnx == b.onnx
    assert all(np.array_equal(a.inputs[k], b.inputs[k]) for k in a.inputs)


def test_unknown_model_or_size_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'resnet'.*known: mlp"):
        models.build_many(["mlp", "resnet"], "tiny")
    with pytest.raises(ConfigError, match="size 'huge'"):
        models.build("mlp", "huge")


def test_tolerance_refuses_a_wrong_reference_and_catches_nan() -> None:
    ref = np.linspace(-1, 1, 12).reshape(3, 4)
    with pytest.raises(ModelError, match=r"'m'.*float64 reference"):
        checks.derive_tolerance("m", (ref + 0.1).astype(np.float32), ref)
    tol = checks.derive_tolerance("m", ref.astype(np.float32), ref)
    good = ref.astype(np.float32)
    assert tol.check(good, good)[0]
    assert not tol.check(np.full_like(good, np.nan), good)[0]
    assert not tol.check(good[:2], good)[0]
    assert not tol.check(good + 10 * tol.tol, good)[0]


def test_markdown_sections_keep_the_others() -> None:
    old = "# rlx benchmarks\n\nintro\n\n## Dispatch overhead\n\ntable A\n\n### detail\n\nx\n\n## Suite\n\nold suite\n"
    new = markdown.replace_sections(old, {"Suite": "new suite", "Machine": "box"})
    assert "## Dispatch overhead\n\ntable A\n\n### detail\n\nx\n\n## Suite\n\nnew suite\n\n## Machine\n\nbox\n" in new
    assert "old suite" not in new and new.startswith("# rlx benchmarks\n\nintro\n")
    assert markdown.replace_sections(new, {"Suite": "new suite", "Machine": "box"}) == new
    assert markdown.replace_sections("", {"Suite": "s"}) == "# rlx benchmarks\n\n## Suite\n\ns\n"


def test_main_writes_json_and_only_its_markdown_sections(tmp_path: Path) -> None:
    md, out = tmp_path / "BENCHMARKS.md", tmp_path / "results" / "suite.json"
    md.write_text("# rlx benchmarks\n\n## Dispatch overhead\n\nkept as is\n", encoding="utf-8")
    rc = suite.main(["--size", "tiny", "--models", "mlp", "--rounds", "1", "--pause", "0", "--target-ms", "0.01",
                     "--no-jax", "--json", str(out), "--write", str(md)])
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert rc == 0 and doc["ok"], doc
    assert [m["name"] for m in doc["models"]] == ["mlp"]
    text = md.read_text(encoding="utf-8")
    assert "## Dispatch overhead\n\nkept as is\n" in text
    assert "## Suite" in text and "### mlp:" in text and "## Machine" in text and "| rlx cpu |" in text


def test_timing_warms_every_contender_up_before_any_sample() -> None:
    """measure() calls each contender ``warmup`` times before its first timed block (a
    runtime's first calls learn the host: rlx-cpu's thread tuner), then times blocks."""
    timing = bench_module("_timing")
    contenders_mod = bench_module("_contenders")
    calls: list[str] = []

    def contender(name: str) -> object:
        return contenders_mod.Contender(name, "numpy", lambda: calls.append(name), np.zeros(1), 0.0, 0.0)

    result = timing.measure([contender("a"), contender("b")], rounds=2, pause=0.0, target_s=1e-9, warmup=5)
    assert calls[:10] == ["a"] * 5 + ["b"] * 5
    assert set(result) == {"a", "b"} and all(len(t.times) == 2 for t in result.values())
    calls.clear()
    timing.measure([contender("a")], rounds=1, pause=0.0, target_s=1e-9, warmup=0)
    assert calls == ["a"] * 7  # one call for warmup=0, sizing (1 + 3), then the block's warm call and one timed call
    assert timing.warm_up(lambda: calls.append("c"), calls=50, budget=0.0) == 1  # at least once


def test_zoo_exporters_accept_both_and_name_an_unknown_one() -> None:
    zoo = bench_module("zoo")
    assert zoo.exporters_from("both") == ["classic", "dynamo"]
    assert zoo.exporters_from("dynamo,classic,dynamo") == ["dynamo", "classic"]
    with pytest.raises(ValueError, match="'onnxscript'"):
        zoo.exporters_from("classic,onnxscript")


def test_verify_and_the_bench_measure_one_suite() -> None:
    """``rlx verify`` builds the suite with the graph builder, ``bench/`` writes it as ONNX:
    the same models from one table, so at full size their inputs and outputs agree in shape
    (the exported transformer has a leading batch axis of 1, as exporters write it)."""
    from rlx_core.run.verify import SUITE, SUITE_SIZES, suite_graph

    def unbatched(shapes: list) -> list:
        return sorted(tuple(s[1:]) if len(s) > 2 and s[0] == 1 and name == "transformer" else tuple(s) for s in shapes)

    models = bench_module("models")
    assert set(models.MODEL_NAMES) == set(SUITE)
    for name in SUITE:
        assert models.SIZES[name]["full"] is SUITE_SIZES[name]
        onnx_model, graph = models.build(name, "full"), suite_graph(name)
        # bench's matmul takes both operands as inputs, verify's holds the second as a weight
        assert set(unbatched([graph.node(i).shape for i in graph.inputs])) <= set(
            unbatched([v.shape for v in onnx_model.inputs.values()])), name
        loaded = rlx_core.onnx.load(onnx_model.onnx)
        assert unbatched([loaded.node(o).shape for o in loaded.outputs]) == unbatched(
            [graph.node(o).shape for o in graph.outputs]), name


def test_every_script_nox_bench_runs_takes_quick() -> None:
    """``nox -s bench -- --quick`` runs each bench script with ``--quick``: each must take
    it (its --help says so), but for those the noxfile leaves out, by name."""
    import re
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    nox_text = (root / "noxfile.py").read_text(encoding="utf-8")
    left_out = set()
    for name in ("OWN_SESSION", "NEEDS_MODEL_FILES"):
        found = re.search(rf"^{name} = \(([^)]*)\)", nox_text, re.M)
        assert found, name
        left_out |= set(re.findall(r'"([\w.]+)"', found.group(1)))
    scripts = [p for p in sorted((root / "bench").glob("*.py"))
               if 'if __name__ == "__main__"' in p.read_text(encoding="utf-8") and p.name not in left_out]
    assert len(scripts) >= 5
    for script in scripts:
        proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                              cwd=root)
        assert proc.returncode == 0 and "--quick" in proc.stdout, (script.name, proc.stdout[-500:], proc.stderr[-500:])
