"""device_report, devices_for, resolve_device(_chain), fastest_device_for."""

from __future__ import annotations

import numpy as np
import pytest
from support import PRIMITIVES, ToyBackend, mlp, registry_with

import rlx_core as rlx


def test_report_without_graph_recommends_highest_priority_available():
    reg = registry_with(ToyBackend("low", priority=1), ToyBackend("high", priority=60),
                        ToyBackend("top", priority=99, available="no TPU here"))
    rows = rlx.device_report(policy=rlx.DevicePolicy(), registry=reg)
    by = {r.device: r for r in rows}
    assert [r.device for r in rows] == ["top", "high", "low"]  # priority orders the report
    assert by["high"].recommended and not by["low"].recommended and not by["top"].recommended
    assert by["top"].blocker == "unavailable: no TPU here"
    assert all(r.supports_graph is None and r.est_seconds is None for r in rows)


def test_report_with_graph_names_blocker_and_estimates():
    reg = registry_with(ToyBackend("partial", ops=PRIMITIVES - {"reduce_sum"}, gflops=1000), ToyBackend("full"))
    rows = {r.device: r for r in rlx.device_report(mlp(), rlx.DevicePolicy(), registry=reg)}
    assert rows["partial"].supports_graph is False
    assert rows["partial"].blocker == "reduce_sum, from softmax at node 6 'probs'"
    assert rows["full"].recommended and rows["full"].est_seconds > 0
    assert rlx.devices_for(mlp(), rlx.DevicePolicy(), registry=reg) == ["full"]


def test_cost_then_priority_breaks_ties():
    reg = registry_with(ToyBackend("a", priority=5), ToyBackend("b", priority=7))
    assert rlx.devices_for(mlp(), rlx.DevicePolicy(), registry=reg) == ["b", "a"]
    assert rlx.fastest_device_for(mlp(), rlx.DevicePolicy(), registry=reg) == "b"


def test_resolve_device_order_hint_env_then_cost():
    reg = registry_with(ToyBackend("a", gflops=1), ToyBackend("b", gflops=100))
    env = rlx.DevicePolicy.from_env(environ={"RLX_DEVICE": "a"})
    assert rlx.resolve_device(mlp(), policy=env, registry=reg) == "a"
    assert rlx.resolve_device(mlp(), "b", policy=env, registry=reg) == "b"
    assert rlx.resolve_device(mlp(), policy=rlx.DevicePolicy(), registry=reg) == "b"
    assert rlx.fastest_device_for(mlp(), env, registry=reg) == "b"  # ignores RLX_DEVICE


def test_explicit_device_errors_name_the_blocker():
    reg = registry_with(ToyBackend("a", available="driver 470 too old"), ToyBackend("b"))
    with pytest.raises(rlx.DeviceError, match="driver 470 too old"):
        rlx.resolve_device(mlp(), "a", policy=rlx.DevicePolicy(), registry=reg)
    with pytest.raises(rlx.DeviceError, match="denied"):
        rlx.resolve_device(mlp(), "b", policy=rlx.DevicePolicy(deny=("b",)), registry=reg)
    with pytest.raises(rlx.DeviceError, match="b:3"):
        rlx.resolve_device(mlp(), "b:3", policy=rlx.DevicePolicy(), registry=reg)


def test_resolve_device_chain_keeps_order_and_skips_blocked():
    reg = registry_with(ToyBackend("a"), ToyBackend("b", available="off"), ToyBackend("c"))
    assert rlx.resolve_device_chain(mlp(), ["c", "b", "a"], rlx.DevicePolicy(), registry=reg) == ["c", "a"]
    with pytest.raises(rlx.DeviceError, match="b: unavailable: off"):
        rlx.resolve_device_chain(mlp(), ["b"], rlx.DevicePolicy(), registry=reg)
    with pytest.raises(rlx.DeviceError, match="unknown device"):
        rlx.resolve_device_chain(mlp(), ["zzz"], rlx.DevicePolicy(), registry=reg)
    env = rlx.DevicePolicy.from_env(environ={"RLX_DEVICE_CHAIN": " c , a "})
    assert rlx.resolve_device_chain(mlp(), None, env, registry=reg) == ["c", "a"]


def test_benchmark_pick_times_candidates():
    reg = registry_with(ToyBackend("a"), ToyBackend("b"))
    cg = rlx.compile(mlp(), policy=rlx.DevicePolicy().with_benchmark_pick(2), registry=reg)
    assert cg.device in {"a", "b"} and "benchmark" in cg.report().reason


def test_available_devices_ignores_policy_and_lists_available():
    reg = registry_with(ToyBackend("a"), ToyBackend("b", available="nope"))
    assert rlx.available_devices(registry=reg) == ["a"]


def test_auto_compile_falls_back_loudly_when_a_device_fails_to_compile():
    reg = registry_with(ToyBackend("flaky", gflops=1000, fail_compile=True), ToyBackend("ok"))
    with pytest.warns(rlx.FallbackWarning, match="flaky"):
        cg = rlx.compile(mlp(), policy=rlx.DevicePolicy(), registry=reg)
    assert cg.device == "ok" and "flaky" in " ".join(cg.report().notes)
    with pytest.raises(rlx.DeviceError, match="flaky"):
        rlx.compile(mlp(), device="flaky", policy=rlx.DevicePolicy(), registry=reg)
    x = np.zeros((4, 8), np.float32)
    assert cg.run({"x": x})[0].shape == (4, 6)


@pytest.mark.parametrize(("policy", "want"), [
    (rlx.DevicePolicy(), "cheap"),
    (rlx.DevicePolicy(prefer=("dear",)), "dear"),
    (rlx.DevicePolicy(deny=("cheap",)), "dear"),
    (rlx.DevicePolicy(device="dear"), "dear"),
    (rlx.DevicePolicy(allow=("dear",)), "dear"),
    (rlx.DevicePolicy.with_benchmark_pick(2), "cheap"),
], ids=["cost", "prefer", "deny", "device", "allow", "benchmark"])
def test_example_pick_is_the_device_the_example_runs_on(policy, want):
    """Without a graph, ``recommended`` marks the highest-priority device (the contract);
    ``example_pick`` says where ``rlx run --example mlp`` will run, by the same policy and
    cost ranking as the run, priced and never compiled."""
    from rlx_core.examples import example_graph
    from rlx_core.placement.ranking import example_pick

    # the higher priority is the slower device: priority must not decide, the ranking must
    dear, cheap = ToyBackend("dear", priority=90, gflops=1), ToyBackend("cheap", priority=10, gflops=500)
    reg = registry_with(dear, cheap)
    assert example_pick(policy, reg)[0] == want
    rows = rlx.device_report(policy=policy, registry=reg)
    usable = [r.device for r in rows if r.viable]
    by_priority = policy.device if policy.device else max(usable, key=lambda d: reg.info(d).priority)
    assert [r.device for r in rows if r.recommended] == [by_priority]
    assert all(r.est_seconds is None and r.supports_graph is None for r in rows)  # still a report without graph
    assert dear.compiles == cheap.compiles == 0  # priced, never compiled (not even to benchmark)
    if policy.pick == "cost":  # a benchmark pick times the toys, which run at the same speed
        assert rlx.compile(example_graph("mlp"), policy=policy, registry=reg).device == want


def test_recommended_without_graph_is_none_when_the_default_device_cannot_run():
    reg = registry_with(ToyBackend("a"), ToyBackend("b", available="unplugged"))
    rows = rlx.device_report(policy=rlx.DevicePolicy(device="b"), registry=reg)
    # RLX_DEVICE=b is not usable: recommended falls back to the highest-priority usable device,
    # while the example run (an explicit default device never moves) cannot run at all
    assert [r.device for r in rows if r.recommended] == ["a"]
    from rlx_core.placement.ranking import example_pick

    assert example_pick(rlx.DevicePolicy(device="b"), reg)[0] is None
