"""compile / CompiledGraph / GraphDevices / run_with_fallback through the real dispatch path."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from support import PRIMITIVES, ToyBackend, mlp, registry_with

import rlx_core as rlx
from rlx_core import reference

X = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)


def expected(g: rlx.Graph, x: np.ndarray = X) -> np.ndarray:
    return reference.evaluate(g, {"x": x})[0]


def test_compile_auto_picks_cheapest_and_explains():
    slow, fast = ToyBackend("slow", gflops=1), ToyBackend("fast", gflops=100)
    reg = registry_with(slow, fast)
    cg = rlx.compile(mlp(), policy=rlx.DevicePolicy(), registry=reg)
    assert cg.device == "fast"
    assert "lowest estimated cost" in cg.report().reason
    np.testing.assert_allclose(cg.run({"x": X})[0], expected(mlp()), rtol=1e-5, atol=1e-6)
    assert "slow" in str(cg.report())


def test_prefer_beats_cost_and_explicit_is_strict():
    slow, fast = ToyBackend("slow", gflops=1), ToyBackend("fast", gflops=100)
    reg = registry_with(slow, fast)
    cg = rlx.compile(mlp(), policy=rlx.DevicePolicy(prefer=("slow",)), registry=reg)
    assert cg.device == "slow" and "preferred" in cg.report().reason
    partial = ToyBackend("partial", ops=PRIMITIVES - {"reduce_max"})
    reg = registry_with(partial, ToyBackend("full", gflops=0.001))
    with pytest.raises(rlx.DeviceError, match=r"reduce_max, from softmax at node \d+ 'probs'"):
        rlx.compile(mlp(), device="partial", policy=rlx.DevicePolicy(), registry=reg)


def test_legalization_decomposes_unclaimed_composites():
    prim = ToyBackend("prim", ops=PRIMITIVES)
    reg = registry_with(prim)
    g = mlp()
    cg = rlx.compile(g, device="prim", policy=rlx.DevicePolicy(), registry=reg)
    assert any(d.startswith("softmax at node") for d in cg.report().decomposed)
    np.testing.assert_allclose(cg.run({"x": X})[0], expected(g), rtol=1e-5, atol=1e-6)


def test_deny_allow_and_unavailable_blockers():
    reg = registry_with(ToyBackend("a"), ToyBackend("b", available="no driver found"))
    rows = {r.device: r for r in rlx.device_report(mlp(), rlx.DevicePolicy(deny=("a",)), registry=reg)}
    assert "denied" in rows["a"].blocker
    assert rows["b"].blocker == "unavailable: no driver found" and not rows["b"].available
    with pytest.raises(rlx.DeviceError, match="no device can run"):
        rlx.compile(mlp(), policy=rlx.DevicePolicy(deny=("a",)), registry=reg)
    rows = {r.device: r for r in rlx.device_report(mlp(), rlx.DevicePolicy.only(["b"]), registry=reg)}
    assert "allowed" in rows["a"].blocker


def test_unknown_device_lists_known():
    reg = registry_with(ToyBackend("a"))
    with pytest.raises(rlx.DeviceError, match="unknown device 'nope'; known devices: a"):
        rlx.compile(mlp(), device="nope", policy=rlx.DevicePolicy(), registry=reg)


def test_run_with_fallback_warns_once_per_failure_and_records_attempts():
    bad = ToyBackend("bad", priority=50, fail_run=True, gflops=1000)
    good = ToyBackend("good", gflops=1)
    reg = registry_with(bad, good)
    with pytest.warns(rlx.FallbackWarning, match="bad") as rec:
        dev, outs = rlx.run_with_fallback(mlp(), {"x": X}, policy=rlx.DevicePolicy(), registry=reg)
    assert dev == "good" and len([w for w in rec if issubclass(w.category, rlx.FallbackWarning)]) == 1
    np.testing.assert_allclose(outs[0], expected(mlp()), rtol=1e-5, atol=1e-6)
    worse = ToyBackend("worse", wrong_output="shape")
    reg = registry_with(ToyBackend("bad", fail_run=True), worse)
    with pytest.raises(rlx.DeviceFallbackError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", rlx.FallbackWarning)
        rlx.run_with_fallback(mlp(), {"x": X}, chain=["bad", "worse"], policy=rlx.DevicePolicy(), registry=reg)
    assert [d for d, _ in info.value.attempts] == ["bad", "worse"]
    assert "worse" in info.value.attempts[1][1] and "declares" in info.value.attempts[1][1]


def test_strict_tries_only_first_and_never_warns():
    reg = registry_with(ToyBackend("bad", priority=50, fail_run=True, gflops=1000), ToyBackend("good"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(rlx.DeviceError, match="bad") as info:
            rlx.run_with_fallback(mlp(), {"x": X}, policy=rlx.DevicePolicy(strict=True), registry=reg)
    assert isinstance(info.value.__cause__, Exception)


def test_input_error_is_raised_at_once_not_fallen_back():
    reg = registry_with(ToyBackend("a"), ToyBackend("b"))
    for bad, match in [({}, "missing input"), ({"x": X, "y": X}, "unknown input"),
                       ({"y": X}, r"missing input\(s\) 'x' and unknown input\(s\) 'y'"),
                       ({"x": X.astype(np.float64)}, "dtype float32"), ({"x": X[:2]}, r"shape \(4, 8\)")]:
        with pytest.raises(rlx.InputError, match=match):
            rlx.run_with_fallback(mlp(), bad, policy=rlx.DevicePolicy(), registry=reg)


def test_backend_mistakes_become_errors_naming_backend():
    for wrong in ("shape", "dtype", "count"):
        reg = registry_with(ToyBackend("liar", wrong_output=wrong))
        cg = rlx.compile(mlp(), device="liar", policy=rlx.DevicePolicy(), registry=reg)
        with pytest.raises(rlx.PluginError, match="liar"):
            cg.run({"x": X})


def test_set_param_recompiles_and_is_atomic():
    toy = ToyBackend("toy")
    reg = registry_with(toy)
    g = mlp()
    cg = rlx.compile(g, device="toy", policy=rlx.DevicePolicy(), registry=reg)
    w = np.zeros((8, 6), np.float32)
    cg.set_param("w", w)
    b = np.maximum(g.value(g.input_node("b").id).astype(np.float64), 0)
    want = np.broadcast_to(np.exp(b - b.max()) / np.exp(b - b.max()).sum(), (4, 6))
    np.testing.assert_allclose(cg.run({"x": X})[0], want, rtol=1e-5)
    assert toy.compiles == 2  # the toy executable has no set_param: the core recompiled
    with pytest.raises(rlx.InputError, match=r"expected shape \(8, 6\)"):
        cg.set_param("w", np.zeros((6, 8), np.float32))
    with pytest.raises(rlx.InputError, match="no param 'nope'"):
        cg.set_param("nope", w)


def test_graph_devices_mirror_params_and_benchmark():
    a, b = ToyBackend("a", gflops=1), ToyBackend("b", gflops=50)
    reg = registry_with(a, b)
    gd = rlx.GraphDevices(mlp(), rlx.DevicePolicy(), registry=reg)
    assert gd.resolve() == "b"
    gd.compile("a")
    gd.set_param("b", np.full(6, 3.0, np.float32))
    out_a = gd.run({"x": X}, device="a")[0]
    out_b = gd.run({"x": X}, device="b")[0]  # compiled after set_param: mirrored
    np.testing.assert_allclose(out_a, out_b)
    times = gd.benchmark({"x": X}, runs=2)
    assert set(times) == {"a", "b"} and all(t > 0 for t in times.values())
    assert gd.resolve_with_inputs({"x": X}) in {"a", "b"}
    assert set(gd.warm_all()) == {"a", "b"}
    gd.invalidate_cache()
    assert gd.run_chain({"x": X}, ["a"]) and gd.last_device == "a"


class _DeviceArray:
    """Stands for a CuPy array or a torch CUDA tensor: shape, dtype and ``__dlpack__``, but
    numpy cannot view it (no ``__array__``, and its DLPack export refuses the host)."""

    def __init__(self, data: np.ndarray, dtype: object = None) -> None:
        self.data, self.shape, self.dtype = data, data.shape, data.dtype if dtype is None else dtype

    def __dlpack__(self, **kwargs: object) -> object:
        raise BufferError("this array lives on a device")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


class _DeviceExecutable(rlx.Executable):
    accepts_device_inputs = True

    def __init__(self, graph: rlx.Graph) -> None:
        self.graph = graph

    def run(self, inputs):  # type: ignore[no-untyped-def]
        host = {k: v.data if isinstance(v, _DeviceArray) else v for k, v in inputs.items()}
        return [o.astype(np.float32) for o in reference.evaluate(self.graph, host)]


class _DeviceBackend(ToyBackend):
    def compile(self, graph, options):  # type: ignore[no-untyped-def]
        return _DeviceExecutable(graph)


def test_device_arrays_reach_an_executable_that_accepts_them_unconverted():
    g = mlp()
    reg = registry_with(_DeviceBackend("dev"))
    cg = rlx.compile(g, device="dev", policy=rlx.DevicePolicy(), registry=reg)
    np.testing.assert_allclose(cg.run({"x": _DeviceArray(X)})[0], expected(g), rtol=1e-5)
    # torch-style dtype objects are read by their name; a wrong one is still an InputError
    np.testing.assert_allclose(cg.run({"x": _DeviceArray(X, "torch.float32")})[0], expected(g), rtol=1e-5)
    with pytest.raises(rlx.InputError, match=r"input 'x': expected dtype float32, got float64"):
        cg.run({"x": _DeviceArray(X.astype(np.float64))})
    with pytest.raises(rlx.InputError, match=r"input 'x': expected shape"):
        cg.run({"x": _DeviceArray(X[:1])})
    # an executable that did not ask for device arrays gets numpy or a clear error
    plain = rlx.compile(g, device="toy", policy=rlx.DevicePolicy(), registry=registry_with(ToyBackend("toy")))
    with pytest.raises(rlx.InputError, match="input 'x'"):
        plain.run({"x": _DeviceArray(X)})


@pytest.mark.parametrize(("var", "value"), [("RLX_FUSION_REPORT", "maybe"), ("RLX_MEMORY_LIMIT", "abc")])
@pytest.mark.parametrize("pick", [rlx.DevicePolicy(), rlx.DevicePolicy.with_benchmark_pick(2)], ids=["cost", "bench"])
def test_a_malformed_variable_is_one_config_error_never_a_fallback_per_device(monkeypatch, var, value, pick):
    # three devices that could each "fail" on it: the caller's mistake is raised once, at once
    monkeypatch.setenv(var, value)
    reg = registry_with(ToyBackend("a", gflops=1), ToyBackend("b", gflops=10), ToyBackend("c", gflops=100))
    with warnings.catch_warnings():
        warnings.simplefilter("error", rlx.FallbackWarning)
        with pytest.raises(rlx.ConfigError, match=var):
            rlx.compile(mlp(), policy=pick, registry=reg)
        with pytest.raises(rlx.ConfigError, match=var):
            rlx.run_with_fallback(mlp(), {"x": X}, policy=pick, registry=reg)
