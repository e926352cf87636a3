"""``Runtime``: a registry and a policy, and the sessions kept for them; the module
functions answer through the default runtime (rlx_core/run/runtime.py)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from support import ToyBackend, mlp, registry_with

import rlx_core as rlx


def x() -> dict[str, np.ndarray]:
    return {"x": np.ones((4, 8), np.float32)}


def test_a_runtime_answers_with_its_own_registry_and_policy() -> None:
    reg = registry_with(ToyBackend("a", gflops=1000), ToyBackend("b"))
    rt = rlx.Runtime(registry=reg, policy=rlx.DevicePolicy(deny=("a",)))
    assert rt.registry is reg
    assert rt.compile(mlp()).device == "b"
    assert rt.devices_for(mlp()) == ["b"]
    assert [r.device for r in rt.device_report(mlp()) if r.recommended] == ["b"]
    assert rt.compile(mlp(), policy=rlx.DevicePolicy()).device == "a"  # a call's own policy wins
    device, outs = rt.run_with_fallback(mlp(), x())
    assert device == "b" and outs[0].shape == (4, 6)


def test_run_with_fallback_keeps_one_session_per_graph_and_drops_it_with_the_graph() -> None:
    toy = ToyBackend("toy")
    rt = rlx.Runtime(registry=registry_with(toy), policy=rlx.DevicePolicy())
    g = mlp()
    for _ in range(3):
        rt.run_with_fallback(g, x())
    assert toy.compiles == 1 and rt.session(g) is rt.session(g)
    gone = weakref.ref(g)
    del g
    gc.collect()
    assert gone() is None  # the session does not keep its graph alive


def test_the_module_function_uses_the_default_runtime_or_one_for_an_explicit_registry() -> None:
    toy = ToyBackend("toy")
    reg = registry_with(toy)
    g = mlp()
    rlx.run_with_fallback(g, x(), policy=rlx.DevicePolicy(), registry=reg)
    rlx.run_with_fallback(g, x(), policy=rlx.DevicePolicy(), registry=reg)
    assert toy.compiles == 2  # a runtime per call for an explicit registry: nothing kept between calls
    assert rlx.default_runtime() is rlx.default_runtime()
    assert rlx.default_runtime().registry is rlx.default_registry()


def test_a_runtime_falls_back_loudly_like_the_module_function() -> None:
    rt = rlx.Runtime(registry=registry_with(ToyBackend("bad", gflops=1000, fail_run=True), ToyBackend("ok")),
                     policy=rlx.DevicePolicy())
    with pytest.warns(rlx.FallbackWarning, match="device bad failed on graph 'mlp'.*falling back to ok"):
        device, _ = rt.run_with_fallback(mlp(), x())
    assert device == "ok"
