"""``rlx_core.distributed.Predictor`` on its own (no Ray): rows, columns, chunks, devices, errors."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import ToyBackend, mlp, registry_with

import rlx_core as rlx
from rlx_core import reference
from rlx_core.distributed import BatchModel, Predictor, map_batches


@pytest.fixture
def toy_registry() -> Iterator[dict[str, ToyBackend]]:
    """The process default registry holds two toy devices: ``flaky`` (ranked first) and ``toy``."""
    from rlx_core.backends import registry

    backends = {"flaky": ToyBackend("flaky", priority=60, gflops=1000.0), "toy": ToyBackend("toy", priority=10)}
    saved = registry._default
    registry.set_default_registry(registry_with(*backends.values()))
    try:
        yield backends
    finally:
        registry.set_default_registry(saved)


def rows_of(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


def expected_rows(x: np.ndarray) -> np.ndarray:
    """The reference, one row at a time: a model with batch 1 and the same weights."""
    one = mlp(1)
    return np.stack([reference.evaluate(one, {"x": row[None]})[0][0] for row in x]) if len(x) else np.empty((0, 6))


# ---------------------------------------------------------------- rows and chunks
@settings(max_examples=12, derandomize=True, deadline=None)
@given(n=st.integers(0, 13))
def test_any_number_of_rows_matches_the_reference_row_by_row(n: int) -> None:
    from rlx_core.backends import registry

    saved = registry._default
    registry.set_default_registry(registry_with(ToyBackend("toy")))
    try:
        p = Predictor(mlp(4))
        x = rows_of(n, seed=n)
        out = p({"x": x, "id": np.arange(n) + 100})
    finally:
        registry.set_default_registry(saved)
    assert sorted(out) == ["id", "probs", "rlx_device"]
    assert out["probs"].shape == (n, 6) and out["probs"].dtype == np.float32
    np.testing.assert_allclose(out["probs"], expected_rows(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["id"], np.arange(n) + 100)
    assert list(out["rlx_device"]) == ["toy"] * n


def test_pass_through_columns_survive_unchanged_and_inputs_are_consumed(toy_registry) -> None:
    x = rows_of(6)
    names = np.array([f"row{i}" for i in range(6)])
    embed = np.arange(12).reshape(6, 2)
    out = Predictor(mlp(4), device_column="where")({"x": x, "name": names, "embed": embed})
    assert set(out) == {"probs", "name", "embed", "where"}
    assert out["name"] is names and out["embed"] is embed
    assert list(out["where"]) == ["flaky"] * 6


def test_the_device_column_is_a_cheap_read_only_column_like_any_other(toy_registry, tmp_path: Path) -> None:
    """One string broadcast over the rows (no per-row memory, built once per size), which
    compares, concatenates, converts and saves as ``rows`` values, and cannot be changed
    in place (it is shared by the batches of a size)."""
    p = Predictor(mlp(4))
    first, second = p({"x": rows_of(4)})["rlx_device"], p({"x": rows_of(4, seed=1)})["rlx_device"]
    assert first is second and first.strides == (0,) and not first.flags.writeable
    assert first.dtype == np.full(4, "flaky").dtype and first.tolist() == ["flaky"] * 4
    with pytest.raises(ValueError):
        first[0] = "toy"
    chunked = p({"x": rows_of(10)})["rlx_device"]  # three runs on one device: one value again
    assert chunked.strides == (0,) and chunked.tolist() == ["flaky"] * 10
    np.savez(tmp_path / "d.npz", d=np.concatenate([first, chunked]))
    with np.load(tmp_path / "d.npz") as f:
        assert f["d"].tolist() == ["flaky"] * 14


def test_a_checked_schema_does_not_let_a_different_batch_through(toy_registry) -> None:
    """Columns are checked once per batch schema (names, shapes, dtypes): every batch
    with another schema is checked again, whatever came before."""
    p = Predictor(mlp(4))
    p({"x": rows_of(4), "id": np.arange(4)})
    with pytest.raises(rlx.InputError, match="expected dtype float32, got float64"):
        p({"x": rows_of(4).astype(np.float64), "id": np.arange(4)})
    with pytest.raises(rlx.InputError, match="expected rows of shape"):
        p({"x": np.zeros((4, 7), np.float32), "id": np.arange(4)})
    with pytest.raises(rlx.InputError, match="different numbers of rows"):
        p({"x": rows_of(4), "id": np.arange(5)})
    with pytest.raises(rlx.InputError, match="'rlx_device' would be overwritten"):
        p({"x": rows_of(4), "rlx_device": np.arange(4)})
    with pytest.raises(rlx.InputError, match="column 'x' is missing"):
        p({"id": np.arange(4)})
    out = p({"x": list(rows_of(4)), "id": list(range(4))})  # lists: converted, then the same schema
    np.testing.assert_allclose(out["probs"], expected_rows(rows_of(4)), rtol=1e-5, atol=1e-6)
    for n in range(1, 40):  # many sizes: the cache of checked schemas stays bounded
        assert p({"x": rows_of(n)})["probs"].shape == (n, 6)
    assert len(p._checked) <= 16 and len(p._device_cols) <= 16


def test_no_device_column_when_none(toy_registry) -> None:
    out = Predictor(mlp(4), device_column=None)({"x": rows_of(3)})
    assert set(out) == {"probs"}


def test_a_batch_of_exactly_B_rows_is_not_padded(toy_registry) -> None:
    p = Predictor(mlp(4))
    p({"x": rows_of(8)})
    assert toy_registry["flaky"].runs == 2 and p.rows_by_device == {"flaky": 8}


def test_unnamed_and_duplicate_outputs_get_distinct_columns(toy_registry) -> None:
    g = rlx.Graph("two")
    x = g.input("x", (2, 3))
    y = g.relu(x)
    g.set_outputs([g.neg(x), y, y])
    out = Predictor(g)({"x": np.ones((5, 3), np.float32)})
    assert set(out) == {"output_0", "output_1", "output_2", "rlx_device"}
    np.testing.assert_array_equal(out["output_0"], -np.ones((5, 3)))
    assert BatchModel(g).outputs[0].row_shape == (3,)

    g2 = rlx.Graph("dup")
    x2 = g2.input("x", (2, 3))
    r = g2.relu(x2, name="r")
    g2.set_outputs([r, r])
    assert [c.name for c in BatchModel(g2).outputs] == ["r", "r_1"]


def test_several_inputs_and_int_dtypes(toy_registry) -> None:
    g = rlx.Graph("two-in")
    a = g.input("a", (3, 2), "int32")
    b = g.input("b", (3, 2), "int32")
    g.set_outputs([g.add(a, b, name="sum")])
    a_rows = np.arange(14, dtype=np.int32).reshape(7, 2)
    out = Predictor(g)({"a": a_rows, "b": a_rows * 10, "id": np.arange(7)})
    np.testing.assert_array_equal(out["sum"], a_rows * 11)


def test_empty_batch_gives_empty_columns(toy_registry) -> None:
    out = Predictor(mlp(4))({"x": np.empty((0, 8), np.float32), "id": np.empty(0, np.int64)})
    assert out["probs"].shape == (0, 6) and out["probs"].dtype == np.float32
    assert out["rlx_device"].shape == (0,) and out["id"].shape == (0,)


def test_model_from_json_path_and_bytes(toy_registry, tmp_path: Path) -> None:
    g = mlp(4)
    g.save(tmp_path / "m.json")
    x = rows_of(5)
    want = expected_rows(x)
    for model in (tmp_path / "m.json", str(tmp_path / "m.json"), g.to_json().encode()):
        np.testing.assert_allclose(Predictor(model)({"x": x})["probs"], want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- devices and policies
def test_policy_none_reads_this_process_environment(toy_registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_DEVICES", "toy")
    assert Predictor(mlp(4)).device == "toy"
    monkeypatch.setenv("RLX_DEVICES", "flaky,toy")
    assert Predictor(mlp(4)).device == "flaky"
    assert Predictor(mlp(4), policy=rlx.DevicePolicy(deny=["flaky"])).device == "toy"  # explicit: env ignored


def test_explicit_device_argument(toy_registry) -> None:
    out = Predictor(mlp(4), device="toy")({"x": rows_of(2)})
    assert list(out["rlx_device"]) == ["toy", "toy"]
    with pytest.raises(rlx.DeviceError, match="nosuch"):
        Predictor(mlp(4), device="nosuch")


def test_failing_device_falls_back_once_per_worker_and_rows_say_where_they_ran(toy_registry) -> None:
    p = Predictor(mlp(4))
    assert p.device == "flaky"
    toy_registry["flaky"].fail_run = True
    with pytest.warns(rlx.FallbackWarning, match=r"device flaky failed .*exploded.*its rows go to toy"):
        out = p({"x": rows_of(6)})
    assert list(out["rlx_device"]) == ["toy"] * 6
    np.testing.assert_allclose(out["probs"], expected_rows(rows_of(6)), rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the failed device is not retried on every batch
        assert list(p({"x": rows_of(3)})["rlx_device"]) == ["toy"] * 3
    assert p.device == "toy" and p.rows_by_device == {"toy": 9}


def test_a_device_that_fails_mid_batch_only_moves_the_rest(toy_registry) -> None:
    flaky = toy_registry["flaky"]
    original = flaky.compile

    def compile_then_fail_second_run(graph, options):
        exe = original(graph, options)
        run = exe.run

        def sometimes(inputs):
            if flaky.runs >= 1:
                raise RuntimeError("flaky ran out of memory")
            return run(inputs)

        exe.run = sometimes
        return exe

    flaky.compile = compile_then_fail_second_run
    p = Predictor(mlp(4))
    with pytest.warns(rlx.FallbackWarning):
        out = p({"x": rows_of(10)})
    assert list(out["rlx_device"]) == ["flaky"] * 4 + ["toy"] * 6
    assert not out["rlx_device"].flags.writeable  # read-only, as when one device ran every row


def test_every_device_failing_is_a_fallback_error_listing_attempts(toy_registry) -> None:
    for b in toy_registry.values():
        b.fail_run = True
    p = Predictor(mlp(4))
    with pytest.warns(rlx.FallbackWarning), pytest.raises(rlx.DeviceFallbackError) as info:
        p({"x": rows_of(1)})
    assert [d for d, _ in info.value.attempts] == ["flaky", "toy"]


def test_strict_policy_raises_device_error_naming_host_and_device(toy_registry) -> None:
    toy_registry["flaky"].fail_run = True
    p = Predictor(mlp(4), policy=rlx.DevicePolicy(strict=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(rlx.DeviceError, match=r"host .* device flaky failed .*RLX_STRICT.*no fallback"):
            p({"x": rows_of(2)})
    with pytest.raises(rlx.DeviceError, match=r"device flaky failed .*explicit device"):
        Predictor(mlp(4), device="flaky")({"x": rows_of(2)})


def test_strict_from_environment(toy_registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_STRICT", "1")
    toy_registry["flaky"].fail_run = True
    with pytest.raises(rlx.DeviceError, match="flaky"):
        Predictor(mlp(4))({"x": rows_of(1)})


def test_a_device_that_cannot_compile_fails_over_at_construction(toy_registry) -> None:
    toy_registry["flaky"].fail_compile = True
    with pytest.warns(rlx.FallbackWarning, match="flaky"):
        p = Predictor(mlp(4))
    assert p.device == "toy"


def test_policy_chain_orders_the_devices(toy_registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_DEVICE_CHAIN", "toy,flaky")
    assert Predictor(mlp(4)).device == "toy"


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("batch", "match"),
    [
        ({"id": np.arange(3)}, r"column 'x' is missing.*'id'"),
        ({"x": np.zeros((3, 8), np.float64)}, r"column 'x': expected dtype float32, got float64"),
        ({"x": np.zeros((3, 7), np.float32)}, r"column 'x': expected rows of shape \[8\], got \[7\]"),
        ({"x": np.zeros((3, 8), np.float32), "id": np.arange(4)}, r"different numbers of rows.*'id': 4"),
        ({"x": np.zeros((3, 8), np.float32), "probs": np.arange(3)}, r"column 'probs' would be overwritten"),
        ({"x": np.zeros((3, 8), np.float32), "rlx_device": np.arange(3)}, r"column 'rlx_device' would be"),
        ({"x": np.float32(1.0)}, r"column 'x' is a scalar"),
    ],
)
def test_bad_batches_raise_input_error_naming_the_column(toy_registry, batch, match) -> None:
    with pytest.raises(rlx.InputError, match=match):
        Predictor(mlp(4))(batch)


def test_a_batch_must_be_a_mapping(toy_registry) -> None:
    with pytest.raises(rlx.InputError, match="batch_format='numpy'"):
        Predictor(mlp(4))([1, 2, 3])  # type: ignore[arg-type]


def test_models_without_a_shared_batch_dimension_are_refused(tmp_path: Path) -> None:
    g = rlx.Graph("reduces")
    x = g.input("x", (4, 3))
    g.set_outputs([g.reduce_sum(x, axes=0, name="total")])
    with pytest.raises(rlx.ModelError, match=r"output 'total' .*batch dimension 4"):
        BatchModel(g)
    g = rlx.Graph("two")
    a, b = g.input("a", (4, 3)), g.input("b", (2, 3))
    g.set_outputs([g.add(a, a), g.add(b, b)])
    with pytest.raises(rlx.ModelError, match=r"input 'b' has shape \(2, 3\)"):
        BatchModel(g)
    g = rlx.Graph("scalar")
    s = g.input("s", ())
    g.set_outputs([g.neg(s)])
    with pytest.raises(rlx.ModelError, match="input 's' is a scalar"):
        BatchModel(g)
    with pytest.raises(rlx.ModelError, match="cannot read model file"):
        BatchModel(tmp_path / "missing.json")
    with pytest.raises(rlx.ModelError, match="got int"):
        BatchModel(3)
    with pytest.raises(rlx.ModelError, match="empty"):
        BatchModel(b"")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"device": ""}, "device"),
        ({"policy": "cpu"}, "policy"),
        ({"device_column": "probs"}, "column 'probs'"),
    ],
)
def test_bad_arguments_are_config_errors(toy_registry, kwargs, match) -> None:
    with pytest.raises(rlx.ConfigError, match=match):
        Predictor(mlp(4), **kwargs)


# ---------------------------------------------------------------- ONNX: symbolic and fixed batch
def _onnx_mlp(batch: int | str) -> tuple[bytes, np.ndarray]:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString(), w


def test_symbolic_onnx_batch_is_bound_per_size_and_cached(toy_registry, tmp_path: Path) -> None:
    data, w = _onnx_mlp("batch")
    (tmp_path / "m.onnx").write_bytes(data)
    for model in (data, tmp_path / "m.onnx"):
        p = Predictor(model, batch_size=4)
        assert p.model.symbolic and p.model.inputs[0].row_shape == (8,)
        for n in (4, 7, 4, 3, 0):
            x = rows_of(n, seed=n)
            out = p({"x": x})
            np.testing.assert_allclose(out["y"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
            assert list(out["rlx_device"]) == ["flaky"] * n
        assert sorted(p.model._bound) == [1, 3, 4]  # 7 rows ran as 4 + 3: no size-7 graph
    unbounded = Predictor(data)
    unbounded({"x": rows_of(9)})
    assert 9 in unbounded.model._bound


def test_fixed_onnx_batch_runs_in_chunks(toy_registry) -> None:
    data, w = _onnx_mlp(2)
    p = Predictor(data)
    assert p.model.rows_per_run == 2
    x = rows_of(5)
    np.testing.assert_allclose(p({"x": x})["y"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- no ray needed, none imported
@pytest.mark.slow
def test_import_and_devices_never_import_ray() -> None:
    code = ("import sys, rlx_core, rlx_core.distributed, rlx_core.cli; "
            "from rlx_core.cli import main\n"
            "try:\n    main(['devices', '--json'])\nexcept SystemExit:\n    pass\n"
            "assert 'ray' not in sys.modules, 'ray imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_map_batches_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(rlx.RlxError, match=r"pip install 'rlx-core\[ray\]'"):
        map_batches(object(), mlp(4))


def test_rlx_errors_are_recovered_from_ray_error_text() -> None:
    from rlx_core.distributed._ray import rlx_error_from

    class RayLike(Exception):
        pass

    text = ("UDF failed\nTraceback (most recent call last):\n  File x\nrlx_core.errors.DeviceError: node 12ab "
            "(h, pid 1): device cuda failed running graph 'g' (RLX_STRICT: no fallback): boom")
    found = rlx_error_from(RayLike(text))
    assert type(found) is rlx.DeviceError and str(found).startswith("node 12ab") and "cuda" in str(found)
    original = rlx.InputError("column 'x' is missing")
    wrapped = RayLike("wrapper")
    wrapped.__cause__ = original
    assert rlx_error_from(wrapped) is original
    assert rlx_error_from(RayLike("ValueError: not ours")) is None
