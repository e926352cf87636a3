"""The bad-input catalogue: every way a caller can get rlx wrong, one case per row.

Each row names the fault, the ``rlx_core.errors`` type it must raise and a pattern the
message must contain, so that the message names the thing at fault (the op and shapes,
the input, the variable and its bad token, the file and field). ``docs/errors.md`` lists
the same rows by id (checked below) beside those covered by other test modules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import PRIMITIVES, ToyBackend, registry_with

import rlx_core as rlx
from rlx_core.errors import ConfigError, DeviceError, GraphError, InputError, ModelError, RlxError

POLICY = rlx.DevicePolicy()  # explicit: the environment of the test run does not leak in
F32 = np.float32
DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


@dataclass(frozen=True)
class Case:
    """What a row's action may use: a scratch folder and the environment."""

    tmp: Path
    monkeypatch: pytest.MonkeyPatch


@dataclass(frozen=True)
class Row:
    id: str
    error: type[RlxError]
    match: str
    action: Callable[[Case], Any]


def _g(*shapes: tuple[int, ...], dtype: str = "float32") -> tuple[rlx.Graph, list[rlx.Value]]:
    g = rlx.Graph("cat")
    return g, [g.input(f"x{i}", s, dtype) for i, s in enumerate(shapes)]


def _model() -> rlx.Graph:
    g = rlx.Graph("model")
    x = g.input("x", (2, 3))
    w = g.param("w", np.ones((3, 4), F32))
    g.set_outputs([g.softmax(g.matmul(x, w), name="probs")])
    return g


def _compiled() -> rlx.CompiledGraph:
    return rlx.compile(_model(), device="cpu", policy=POLICY)


X = np.ones((2, 3), F32)


class _BadArray:
    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise RuntimeError("device lost")


def _graph_doc(**changes: Any) -> str:
    doc = json.loads(_model().to_json())
    doc.update(changes)
    return json.dumps(doc)


def _node_doc(i: int, **changes: Any) -> str:
    doc = json.loads(_model().to_json())
    doc["nodes"][i].update(changes)
    return json.dumps(doc)


def _env(name: str, value: str) -> Callable[[Case], Any]:
    def action(c: Case) -> Any:
        c.monkeypatch.setenv(name, value)
        return rlx.compile(_model())  # policy=None: the environment is read at this call

    return action


def _disable_plugins(c: Case) -> Any:
    c.monkeypatch.setenv("RLX_DISABLE_PLUGINS", "cuda, not a name")
    return rlx.Registry(entry_points=[]).names()


def _explicit_unclaimed(c: Case) -> Any:
    reg = registry_with(ToyBackend("partial", ops=PRIMITIVES - {"reduce_max"}))
    return rlx.compile(_model(), device="partial", policy=POLICY, registry=reg)


def _explicit_unavailable(c: Case) -> Any:
    reg = registry_with(ToyBackend("toy", available="no toy driver installed"))
    return rlx.compile(_model(), device="toy", policy=POLICY, registry=reg)


def _frozen(c: Case) -> Any:
    g = _model()
    rlx.compile(g, device="cpu", policy=POLICY)
    return g.relu(g.input_node("x").id)


def _foreign_value(c: Case) -> Any:
    _g1, (a,) = _g((2,))
    g2, _ = _g((2,))
    return g2.relu(a)


def _write(c: Case, text: str) -> Path:
    path = c.tmp / "g.json"
    path.write_text(text)
    return path


ROWS: list[Row] = [
    # -- building a graph (GraphError at the line that made the mistake)
    Row("build-broadcast", GraphError, r"add: shapes \(2, 3\) and \(4,\) do not broadcast",
        lambda c: (lambda g, v: g.add(v[0], v[1]))(*_g((2, 3), (4,)))),
    Row("build-matmul-inner", GraphError, r"matmul: inner dimensions differ: shapes \(2, 3\) and \(4, 5\)",
        lambda c: (lambda g, v: g.matmul(v[0], v[1]))(*_g((2, 3), (4, 5)))),
    Row("build-mixed-dtypes", GraphError, r"add: inputs have different dtypes: \(2,\) float32 and \(2,\) int32",
        lambda c: (lambda g, v: g.add(v[0], g.input("i", (2,), "int32")))(*_g((2,)))),
    Row("build-float-only-op", GraphError, r"exp: needs a float dtype, got \(2,\) int64",
        lambda c: (lambda g, v: g.exp(v[0]))(*_g((2,), dtype="int64"))),
    Row("build-bool-arithmetic", GraphError, r"add: does not take bool",
        lambda c: (lambda g, v: g.add(v[0], v[0]))(*_g((2,), dtype="bool"))),
    Row("build-unsupported-dtype", GraphError, r"input 'x': unsupported dtype 'complex64'",
        lambda c: rlx.Graph().input("x", (2,), "complex64")),
    Row("build-negative-dim", GraphError, r"input 'x': shape must hold ints >= 0, got \(-1, 2\)",
        lambda c: rlx.Graph().input("x", (-1, 2))),
    Row("build-non-int-dim", GraphError, r"input 'x': shape must .*ints.*2\.5",
        lambda c: rlx.Graph().input("x", (2.5,))),
    Row("build-duplicate-name", GraphError, r"input: name 'x0' is already used by node 0 'x0'",
        lambda c: (lambda g, v: g.input("x0", (2,)))(*_g((2,)))),
    Row("build-empty-name", GraphError, r"param: name must be a non-empty string, got ''",
        lambda c: rlx.Graph().param("", np.ones(2, F32))),
    Row("build-axis-range", GraphError, r"softmax: axis 5 is out of range for rank 2",
        lambda c: (lambda g, v: g.softmax(v[0], axis=5))(*_g((2, 3)))),
    Row("build-repeated-axes", GraphError, r"reduce_sum: axes \[0, -2\] repeat an axis",
        lambda c: (lambda g, v: g.reduce_sum(v[0], [0, -2]))(*_g((2, 3)))),
    Row("build-reduce-empty", GraphError, r"reduce_max: cannot reduce an empty axis of shape \(0, 3\)",
        lambda c: (lambda g, v: g.reduce_max(v[0], 0))(*_g((0, 3)))),
    Row("build-reshape-size", GraphError, r"reshape: cannot reshape \(2, 3\) \(6 elements\) to \(4, 2\)",
        lambda c: (lambda g, v: g.reshape(v[0], (4, 2)))(*_g((2, 3)))),
    Row("build-transpose-perm", GraphError, r"transpose: perm \(0, 0\) is not a permutation of the 2 axes",
        lambda c: (lambda g, v: g.transpose(v[0], (0, 0)))(*_g((2, 3)))),
    Row("build-concat-shapes", GraphError, r"concat: shapes \(2, 3\) and \(2, 4\) differ outside axis 0",
        lambda c: (lambda g, v: g.concat([v[0], v[1]], axis=0))(*_g((2, 3), (2, 4)))),
    Row("build-slice-step", GraphError, r"slice: steps must not be 0",
        lambda c: (lambda g, v: g.slice(v[0], [0], [2], steps=[0]))(*_g((2, 3)))),
    Row("build-gather-indices", GraphError, r"gather: indices must be int32 or int64, got float32",
        lambda c: (lambda g, v: g.gather(v[0], v[1]))(*_g((3,), (2,)))),
    Row("build-where-condition", GraphError, r"where: condition must be bool, got float32",
        lambda c: (lambda g, v: g.where(v[0], v[0], v[0]))(*_g((3,)))),
    Row("build-conv-channels", GraphError, r"conv2d: channels do not match: x \(1, 3, 5, 5\), w \(2, 2, 3, 3\)",
        lambda c: (lambda g, v: g.conv2d(v[0], v[1]))(*_g((1, 3, 5, 5), (2, 2, 3, 3)))),
    Row("build-pool-window", GraphError, r"max_pool2d: window 9 .* is larger than the padded input 5",
        lambda c: (lambda g, v: g.max_pool2d(v[0], 9))(*_g((1, 1, 5, 5)))),
    Row("build-bad-attribute", GraphError, r"gelu: approximate must be 'none' or 'tanh', got 'fast'",
        lambda c: (lambda g, v: g.gelu(v[0], approximate="fast"))(*_g((3,)))),
    Row("build-negative-eps", GraphError, r"layer_norm: eps must be a number >= 0, got -1.0",
        lambda c: (lambda g, v: g.layer_norm(v[0], np.ones(3, F32), eps=-1.0))(*_g((2, 3)))),
    Row("build-attention-shapes", GraphError, r"attention: needs q .*; got \(2, 3\), \(2, 4\), \(2, 3\)",
        lambda c: (lambda g, v: g.attention(*v))(*_g((2, 3), (2, 4), (2, 3)))),
    Row("build-foreign-value", GraphError, r"relu: value 0 belongs to graph 'cat', not 'cat'", _foreign_value),
    Row("build-bad-handle", GraphError, r"relu: expected a Value, node id, array or scalar, got str",
        lambda c: (lambda g, v: g.relu("x0"))(*_g((2,)))),
    Row("build-unknown-node", GraphError, r"graph 'cat' has no node 7 \(it has 1\)",
        lambda c: (lambda g, v: g.relu(7))(*_g((2,)))),
    Row("build-non-array-param", GraphError, r"param 'w': unsupported dtype dtype\('O'\)",
        lambda c: rlx.Graph().param("w", object())),
    Row("build-frozen", GraphError, r"relu: graph 'model' is frozen \(it was compiled\)", _frozen),
    Row("build-no-outputs", GraphError, r"set_outputs: a graph needs at least one output",
        lambda c: rlx.Graph().set_outputs([])),
    Row("compile-no-outputs", GraphError, r"needs at least one output",
        lambda c: (lambda g, v: rlx.compile(g, device="cpu", policy=POLICY))(*_g((2,)))),
    # -- run-time inputs (InputError before any work, naming the input)
    Row("run-missing-input", InputError, r"missing input\(s\) 'x'; the graph takes 'x' \(2, 3\) float32",
        lambda c: _compiled().run({})),
    Row("run-unknown-input", InputError, r"unknown input\(s\) 'y'; the graph takes 'x'",
        lambda c: _compiled().run({"x": X, "y": X})),
    Row("run-wrong-shape", InputError, r"input 'x': expected shape \(2, 3\), got \(3, 2\)",
        lambda c: _compiled().run({"x": X.T.copy()})),
    Row("run-wrong-dtype", InputError, r"input 'x': expected dtype float32, got float64 \(rlx never casts",
        lambda c: _compiled().run({"x": X.astype(np.float64)})),
    Row("run-python-list", InputError, r"input 'x': expected dtype float32, got float64",
        lambda c: _compiled().run({"x": X.tolist()})),
    Row("run-not-a-mapping", InputError, r"inputs must be a mapping of input name to array, got list",
        lambda c: _compiled().run([X])),
    Row("run-not-an-array", InputError, r"input 'x': expected an array \(numpy, __array__ or __dlpack__\), got str",
        lambda c: _compiled().run({"x": "abc"})),
    Row("run-ragged-list", InputError, r"input 'x': cannot convert list to an array",
        lambda c: _compiled().run({"x": [[1.0], [1.0, 2.0]]})),
    Row("run-array-conversion-fails", InputError, r"input 'x': cannot convert _BadArray to an array: device lost",
        lambda c: _compiled().run({"x": _BadArray()})),
    Row("run-int-division-by-zero", InputError, r"node 2 \(div\): integer division by zero",
        lambda c: (lambda g, v: (g.set_outputs([g.div(v[0], v[1])]), rlx.compile(g, device="cpu", policy=POLICY)
                                 .run({"x0": np.ones(2, np.int32), "x1": np.array([1, 0], np.int32)})))(
            *_g((2,), (2,), dtype="int32"))),
    Row("run-gather-out-of-range", InputError, r"node 2 \(gather\): index 7 is out of range for axis 0 of size 3",
        lambda c: (lambda g: (g.set_outputs([g.gather(g.input("x", (3,)), g.input("i", (2,), "int64"))]),
                              rlx.compile(g, device="cpu", policy=POLICY)
                              .run({"x": np.zeros(3, F32), "i": np.array([0, 7])})))(rlx.Graph())),
    # -- set_param (InputError naming the param, atomic)
    Row("set-param-unknown", InputError, r"set_param: graph 'model' has no param 'nope'; its params: 'w'",
        lambda c: _compiled().set_param("nope", np.ones((3, 4), F32))),
    Row("set-param-shape", InputError, r"set_param 'w': expected shape \(3, 4\), got \(4, 3\)",
        lambda c: _compiled().set_param("w", np.ones((4, 3), F32))),
    Row("set-param-dtype", InputError, r"set_param 'w': expected dtype float32, got float64 \(no silent casts\)",
        lambda c: _compiled().set_param("w", np.ones((3, 4)))),
    Row("set-param-not-an-array", InputError, r"param 'w': expected an array .*got str",
        lambda c: _compiled().set_param("w", "weights")),
    Row("set-param-graph-devices", InputError, r"set_param: graph 'model' has no param 'nope'",
        lambda c: rlx.GraphDevices(_model(), POLICY).set_param("nope", np.ones(2, F32))),
    # -- devices (DeviceError naming the device and the blocker)
    Row("device-unknown", DeviceError, r"unknown device 'nope'; known devices: .*cpu",
        lambda c: rlx.compile(_model(), device="nope", policy=POLICY)),
    Row("device-malformed", DeviceError, r"malformed device 'cpu:x': expected a backend name with an optional index",
        lambda c: rlx.compile(_model(), device="cpu:x", policy=POLICY)),
    Row("device-not-a-string", DeviceError, r"device must be a string like 'cpu' or 'cuda:1', got 3",
        lambda c: rlx.compile(_model(), device=3, policy=POLICY)),  # type: ignore[arg-type]
    Row("device-index-missing", DeviceError, r"cpu:1",
        lambda c: rlx.compile(_model(), device="cpu:1", policy=POLICY)),
    Row("device-explicit-unclaimed", DeviceError, r"cannot run graph 'model': .*reduce_max, from softmax at node \d+ "
        r"'probs'", _explicit_unclaimed),
    Row("device-explicit-unavailable", DeviceError, r"toy.*no toy driver installed", _explicit_unavailable),
    Row("device-explicit-denied", DeviceError, r"'cpu'.*cannot run graph 'model': denied by policy",
        lambda c: rlx.compile(_model(), device="cpu", policy=rlx.DevicePolicy(deny=["cpu"]))),
    Row("device-env-unknown", ConfigError, r"RLX_DEVICE: unknown device 'nope'; known devices: .*cpu",
        _env("RLX_DEVICE", "nope")),
    Row("device-chain-unknown", DeviceError, r"unknown device 'nope'",
        lambda c: rlx.run_with_fallback(_model(), {"x": X}, chain=["nope"], policy=POLICY)),
    Row("device-graph-devices-unknown", DeviceError, r"unknown device 'nope'",
        lambda c: rlx.GraphDevices(_model(), POLICY).run({"x": X}, device="nope")),
    # -- environment and options (ConfigError naming the variable and the bad token)
    Row("env-strict", ConfigError, r"RLX_STRICT: 'maybe' is not a boolean", _env("RLX_STRICT", "maybe")),
    Row("env-benchmark-negative", ConfigError, r"RLX_BENCHMARK_PICK: '-1' is not a number of runs",
        _env("RLX_BENCHMARK_PICK", "-1")),
    Row("env-benchmark-text", ConfigError, r"RLX_BENCHMARK_PICK: 'abc'", _env("RLX_BENCHMARK_PICK", "abc")),
    Row("env-devices", ConfigError, r"RLX_DEVICES: 'cu da' is not a device name", _env("RLX_DEVICES", "cpu, cu da")),
    Row("env-deny", ConfigError, r"RLX_DENY_DEVICES: 'c d' is not a device name", _env("RLX_DENY_DEVICES", "c d")),
    Row("env-prefer", ConfigError, r"RLX_PREFER_DEVICES: 'a=b' is not a device name",
        _env("RLX_PREFER_DEVICES", "a=b")),
    Row("env-chain", ConfigError, r"RLX_DEVICE_CHAIN: ':1' is not a device name", _env("RLX_DEVICE_CHAIN", "cpu,:1")),
    Row("env-device", ConfigError, r"RLX_DEVICE: 'cpu:x' is not a device name", _env("RLX_DEVICE", "cpu:x")),
    Row("env-devices-empty-entry", ConfigError, r"RLX_DEVICES: 'cpu,,' has an empty entry",
        _env("RLX_DEVICES", "cpu,,")),
    Row("env-deny-unknown", ConfigError, r"RLX_DENY_DEVICES: unknown device 'foo'; known devices: .*cpu",
        _env("RLX_DENY_DEVICES", "foo")),
    Row("env-disable-plugins", ConfigError, r"RLX_DISABLE_PLUGINS: 'not a name' is not an entry point name",
        _disable_plugins),
    Row("option-pick", ConfigError, r"pick: 'fastest' is not one of cost, benchmark",
        lambda c: rlx.DevicePolicy(pick="fastest")),
    # -- graph files (ModelError naming the file, node and field)
    Row("json-not-json", ModelError, r"graph JSON: not valid JSON", lambda c: rlx.Graph.from_json("{nope")),
    Row("json-truncated", ModelError, r"g\.json: graph JSON: not valid JSON",
        lambda c: rlx.Graph.load(_write(c, _model().to_json()[:100]))),
    Row("json-not-a-graph", ModelError, r"not an rlx graph \(missing \"format\": \"rlx.graph\"\)",
        lambda c: rlx.Graph.from_json('{"nodes": []}')),
    Row("json-future-version", ModelError, r"format version 99 is newer than this rlx-core reads \(1\); upgrade",
        lambda c: rlx.Graph.from_json(_graph_doc(version=99))),
    Row("json-unknown-op", ModelError, r"node 3 has unknown op 'frobnicate'",
        lambda c: rlx.Graph.from_json(_node_doc(3, op="frobnicate"))),
    Row("json-cycle", ModelError, r"node 2 \(matmul\) refers to inputs \[3, 1\] not defined before it",
        lambda c: rlx.Graph.from_json(_node_doc(2, inputs=[3, 1]))),
    Row("json-bad-base64", ModelError, r"node 1 data is not valid base64",
        lambda c: rlx.Graph.from_json(_node_doc(1, value={"dtype": "float32", "shape": [3, 4], "data": "@@"}))),
    Row("json-absurd-size", ModelError, r"node 1 declares \d+ bytes, over the limit",
        lambda c: rlx.Graph.from_json(_node_doc(1, value={"dtype": "float32", "shape": [1 << 20, 1 << 20],
                                                          "data": ""}))),
    Row("json-short-data", ModelError, r"node 1 holds 4 bytes, its shape \[3, 4\] float32 needs 48",
        lambda c: rlx.Graph.from_json(_node_doc(1, value={"dtype": "float32", "shape": [3, 4], "data": "AAAAAA=="}))),
    Row("json-bad-node", ModelError, r"node 2 \(matmul\): matmul: inner dimensions differ",
        lambda c: rlx.Graph.from_json(_node_doc(0, shape=[2, 5]))),
    Row("json-bad-outputs", ModelError, r"outputs \[\] must be a non-empty list of node ids",
        lambda c: rlx.Graph.from_json(_graph_doc(outputs=[]))),
    Row("json-missing-file", ModelError, r"cannot read graph file '.*missing\.json'",
        lambda c: rlx.Graph.load(c.tmp / "missing.json")),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_catalogue(row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RLX_DEVICE", "RLX_DEVICES", "RLX_DENY_DEVICES", "RLX_PREFER_DEVICES", "RLX_DEVICE_CHAIN",
                 "RLX_STRICT", "RLX_BENCHMARK_PICK", "RLX_DISABLE_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(row.error) as info:
        row.action(Case(tmp_path, monkeypatch))
    assert re.search(row.match, str(info.value)), f"{row.id}: message {str(info.value)!r} does not match {row.match!r}"
    assert "\n" not in str(info.value).strip(), "an error message is one line (the CLI prints it as is)"


def test_ids_are_unique_and_documented() -> None:
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids))
    documented = set(re.findall(r"`([a-z0-9-]+)`", DOC.read_text()))
    assert set(ids) <= documented, f"rows missing from docs/errors.md: {sorted(set(ids) - documented)}"
