"""Proof that the cost ranking picks right: predicted vs measured time on a model suite.

``rlx calibrate --verify`` runs this. For each suite model and each viable device it
compares the cost model's own prediction (``device_report(...).model_seconds``: before
the correction for errors observed on this host, which would hide the very error this
measures) with the measured median run time, and reports the
device the ranking picks, the device that measured fastest, and the *regret*: picked
time / best time (1.0 = the pick was right). A prediction within 2x of the measurement
and a regret of at most 1.15x are the targets (see BENCHMARKS.md).

The suite is one table (``SUITE_SIZES``) built two ways: here with the graph builder (no
ONNX needed), so that every installation can verify itself; in ``bench/models.py`` as
ONNX models written the way exporters write them, timed against peers.
Timing is ``rlx_core.timer.interleave``: devices in blocks with a pause between blocks
(on a small host the BLAS threads of one device busy-wait after each call and would slow
the next device), the order shuffled per round, every block after an untimed run.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from ..compiler.inputs import random_inputs
from ..ir import Graph, Value
from ..placement.policy import DevicePolicy
from ..placement.ranking import device_report, fastest_device_for
from ..timer import Entry, interleave

__all__ = ["SUITE", "SUITE_SIZES", "VerifyRow", "suite_graph", "verify_cost_models"]

Progress = Callable[[str, float], None]
_PAUSE = 0.15  # seconds between timing blocks (see the module docstring)
_SAMPLE = 0.01  # seconds of back-to-back runs per timing sample: a serving loop's steady state


def _weights(rng: np.random.Generator, *shape: int) -> np.ndarray:
    fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)


#: The suite's models at full size: one table for ``rlx calibrate --verify``, which builds
#: them with the graph builder (below), and for ``bench/``, which writes the same models as
#: ONNX the way exporters do (``bench/models.py``'s ``full`` preset is this table).
SUITE_SIZES: dict[str, dict[str, Any]] = {
    "mlp": {"batch": 64, "dims": (784, 128, 64, 10)},
    "transformer": {"seq": 128, "d": 256, "heads": 4, "ff": 1024},
    "elementwise": {"rows": 1024, "cols": 1024},
    "cnn": {"hw": 64, "c1": 16, "c2": 32},
    "matmul": {"n": 2048},
}


def mlp(scale: float = 1.0) -> Graph:
    """784-128-64-10 with relu and softmax, batch 64 (``scale`` shrinks the batch)."""
    size = SUITE_SIZES["mlp"]
    rng = np.random.default_rng(1)
    g = Graph("mlp")
    dims = size["dims"]
    h = g.input("x", (max(1, int(size["batch"] * scale)), dims[0]))
    for i, (k, n) in enumerate(itertools.pairwise(dims)):
        h = g.add(g.matmul(h, g.param(f"w{i}", _weights(rng, k, n))), g.param(f"b{i}", np.zeros(n, np.float32)))
        h = g.relu(h) if i < len(dims) - 2 else h
    g.set_outputs([g.softmax(h, axis=-1, name="probs")])
    return g


def transformer(scale: float = 1.0) -> Graph:
    """One encoder layer: d=256, 4 heads, ff 1024, seq 128 (``scale`` shrinks seq)."""
    size = SUITE_SIZES["transformer"]
    rng = np.random.default_rng(2)
    seq, d, heads, ff = max(4, int(size["seq"] * scale)), size["d"], size["heads"], size["ff"]
    g = Graph("transformer")
    x = g.input("x", (seq, d))

    def dense(v: Value, name: str, k: int, n: int) -> Value:
        return g.add(g.matmul(v, g.param(f"{name}_w", _weights(rng, k, n))),
                     g.param(f"{name}_b", np.zeros(n, np.float32)))

    def split(v: Value) -> Value:
        return g.transpose(g.reshape(v, (seq, heads, d // heads)), (1, 0, 2))

    q, k, v = (split(dense(x, n, d, d)) for n in ("q", "k", "v"))
    att = g.reshape(g.transpose(g.attention(q, k, v), (1, 0, 2)), (seq, d))
    ones, zeros = np.ones(d, np.float32), np.zeros(d, np.float32)
    h = g.layer_norm(g.add(x, dense(att, "o", d, d)), g.param("ln1_s", ones), g.param("ln1_b", zeros))
    f = dense(g.gelu(dense(h, "ff1", d, ff)), "ff2", ff, d)
    g.set_outputs([g.layer_norm(g.add(h, f), g.param("ln2_s", ones), g.param("ln2_b", zeros), name="y")])
    return g


def elementwise(scale: float = 1.0) -> Graph:
    """15 elementwise ops on 1024x1024 with a broadcast bias, tanh and sigmoid."""
    size = SUITE_SIZES["elementwise"]
    rows = max(8, int(size["rows"] * math.sqrt(scale)))
    n = max(8, int(size["cols"] * math.sqrt(scale)))
    g = Graph("elementwise")
    x = g.input("x", (rows, n))
    bias = g.param("bias", np.linspace(-1, 1, n, dtype=np.float32))
    y = g.add(x, bias)
    y = g.mul(y, 0.5)
    y = g.tanh(y)
    y = g.add(y, x)
    y = g.sigmoid(y)
    y = g.mul(y, y)
    y = g.sub(y, bias)
    y = g.maximum(y, 0.0)
    y = g.add(y, 1.0)
    y = g.sqrt(y)
    y = g.mul(y, x)
    y = g.tanh(y)
    y = g.add(y, bias)
    y = g.abs(y)
    g.set_outputs([g.neg(y, name="y")])
    return g


def cnn(scale: float = 1.0) -> Graph:
    """Two 3x3 convolutions with relu and max pools, then a dense layer, on 1x3x64x64."""
    size = SUITE_SIZES["cnn"]
    rng = np.random.default_rng(3)
    side = max(8, int(size["hw"] * math.sqrt(scale))) // 4 * 4
    c2 = size["c2"]
    g = Graph("cnn")
    h = g.input("x", (1, 3, side, side))
    for i, (cin, cout) in enumerate(((3, size["c1"]), (size["c1"], c2))):
        w, b = g.param(f"c{i}_w", _weights(rng, cout, cin, 3, 3)), g.param(f"c{i}_b", np.zeros(cout, np.float32))
        h = g.conv2d(h, w, b, padding=1)
        h = g.max_pool2d(g.relu(h), 2)
    flat = g.reshape(h, (1, c2 * (side // 4) ** 2))
    g.set_outputs([g.add(g.matmul(flat, g.param("fc_w", _weights(rng, c2 * (side // 4) ** 2, 10))),
                         g.param("fc_b", np.zeros(10, np.float32)), name="logits")])
    return g


def matmul(scale: float = 1.0) -> Graph:
    """A square float32 matmul, 2048 on a side (``scale`` shrinks the side)."""
    n = max(16, int(SUITE_SIZES["matmul"]["n"] * scale ** (1 / 3)))
    rng = np.random.default_rng(4)
    g = Graph("matmul")
    g.set_outputs([g.matmul(g.input("a", (n, n)), g.param("b", _weights(rng, n, n)), name="c")])
    return g


SUITE: dict[str, Callable[[float], Graph]] = {
    "mlp": mlp, "transformer": transformer, "elementwise": elementwise, "cnn": cnn, "matmul": matmul,
}


def suite_graph(name: str, scale: float = 1.0) -> Graph:
    """One suite model by name (``KeyError`` lists the names)."""
    try:
        return SUITE[name](scale)
    except KeyError:
        raise KeyError(f"unknown suite model {name!r}; known: {', '.join(SUITE)}") from None


@dataclass(frozen=True)
class VerifyRow:
    """One model: per device the predicted and measured seconds, the pick and the regret."""

    model: str
    predicted: dict[str, float]
    measured: dict[str, float]
    picked: str
    best: str
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def regret(self) -> float:
        """Picked time / best measured time (1.0 when the pick was the fastest)."""
        return self.measured[self.picked] / self.measured[self.best]

    def prediction_ratio(self, device: str) -> float:
        """Predicted / measured for ``device`` (1.0 = exact; 2.0 = predicted twice as slow)."""
        return self.predicted[device] / self.measured[device]

    @property
    def worst_prediction_ratio(self) -> float:
        """The prediction furthest from its measurement, as a factor >= 1."""
        return max(max(r, 1 / r) for r in (self.prediction_ratio(d) for d in self.measured))


def _time_devices(compiled: dict[str, Any], inputs: dict[str, np.ndarray], rounds: int, seed: int,
                  on_round: Callable[[int], None]) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Seconds per run of each compiled graph, one figure per round (``timer.interleave``),
    and the devices that failed while timed, with why."""
    entries = [Entry(d, run=partial(cg.run, inputs)) for d, cg in compiled.items()]
    interleave(entries, rounds, _SAMPLE, pause=_PAUSE, seed=seed, on_round=on_round)
    return {e.name: e.times for e in entries if not e.note}, {e.name: e.note for e in entries if e.note}


def verify_cost_models(models: Sequence[str] | None = None, *, devices: Sequence[str] | None = None,
                       policy: DevicePolicy | None = None, scale: float = 1.0, rounds: int = 10,
                       progress: Progress | None = None) -> list[VerifyRow]:
    """Predict, pick and measure each suite model on each viable device (see module doc).

    ``devices`` limits the contenders (default: every device that can run the model under
    ``policy``); ``rounds`` timing blocks per device, medians reported.
    """
    from .session import GraphDevices

    report = progress or (lambda what, frac: None)
    pol = replace(policy if policy is not None else DevicePolicy.from_env(), pick="cost", prefer=())
    names = list(models or SUITE)
    rows: list[VerifyRow] = []
    for i, name in enumerate(names):
        g = suite_graph(name, scale)
        viable = {r.device: r for r in device_report(g, pol)
                  if r.viable and r.est_seconds is not None and (not devices or r.device in devices)}
        if not viable:
            continue
        gd = GraphDevices(g, pol)
        inputs = random_inputs(g, seed=0)
        compiled, errors = {}, {}
        for d in viable:
            report(f"{name}: compiling on {d}", (i + 0.1) / len(names))
            try:
                compiled[d] = gd.compile(d)
                compiled[d].run(inputs)  # first run: lazy compilation, caches, page faults
            except Exception as exc:  # a device that fails is reported, not fatal to the proof
                errors[d] = f"{type(exc).__name__}: {exc}"
        times, failed = _time_devices(compiled, inputs, rounds, i, lambda r, name=name, i=i: report(
            f"{name}: timed round {r + 1}/{rounds}", (i + 0.2 + 0.8 * (r + 1) / rounds) / len(names)))
        errors.update(failed)
        if not times:
            continue
        measured = {d: statistics.median(ts) for d, ts in times.items()}
        predicted = {d: float(viable[d].model_seconds or viable[d].est_seconds) for d in measured}  # type: ignore[arg-type]
        picked = fastest_device_for(g, replace(pol, allow=tuple(measured)))
        best = min(measured, key=measured.__getitem__)
        rows.append(VerifyRow(name, predicted, measured, picked, best, errors))
    report("done", 1.0)
    return rows
