"""rlx's ``jax`` device against the same model written by hand for ``jax.jit``.

What it answers: how much does going through rlx (input validation, the compiled
executable, output checks, numpy results) cost over a JAX user's own ``jax.jit``? The
target is a ratio of at most 1.05.

Models (each built twice: with the rlx graph builder and as a plain JAX function):

- ``mlp``: 784-512-512-10 with relu, softmax at the end (batch 64);
- ``elementwise``: a chain of 14 elementwise ops over a (256, 1024) tensor;
- ``attention``: a transformer block: 4-head self-attention (reshape/transpose heads),
  residual, layer norm, gelu MLP (batch 4, sequence 128, width 256).

Contenders, all given the same numpy inputs and returning numpy arrays:

- ``rlx jax``: ``rlx.compile(g, device="jax")`` and ``cg.run({...})``, what a user pays;
- ``jax.jit``: ``np.asarray(f(weights, x))``, the weights already on the device as
  arguments (as rlx's params are; XLA folds neither), matmuls at the same precision as
  rlx's lowering (``HIGHEST``, so float32 stays float32 on TPUs and GPUs);
- with ``--dlpack``, also both leaving the result on the device (``output="dlpack"`` vs
  ``f(...).block_until_ready()``).

Method: every contender's result is checked against the other's first. Each sample times
a loop sized to ~20 ms; contenders are interleaved in blocks with a rotating order and a
short sleep between blocks, so none owns a warm or a throttled stretch; the figure is the
median per-run time over the blocks, and the ratio is rlx's median over jit's.

    python plugins/rlx-jax-tpu/bench_vs_jit.py              # 25 blocks per model
    python plugins/rlx-jax-tpu/bench_vs_jit.py --quick      # small sizes, 3 blocks: checks it runs
    python plugins/rlx-jax-tpu/bench_vs_jit.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import rlx_core as rlx

Arrays = dict[str, np.ndarray]


@dataclass
class Model:
    name: str
    summary: str
    graph: rlx.Graph
    inputs: Arrays
    weights: Arrays
    jax_fn: Callable[[dict[str, Any], dict[str, Any]], Any]


def _dot(a: Any, b: Any) -> Any:
    import jax.numpy as jnp
    from jax import lax

    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


def mlp(rng: np.random.Generator, batch: int, sizes: tuple[int, ...]) -> Model:
    g = rlx.Graph("mlp")
    h = g.input("x", (batch, sizes[0]))
    weights: Arrays = {}
    layers = len(sizes) - 1
    for i in range(layers):
        weights[f"w{i}"] = (rng.standard_normal((sizes[i], sizes[i + 1])) / np.sqrt(sizes[i])).astype(np.float32)
        weights[f"b{i}"] = rng.standard_normal(sizes[i + 1]).astype(np.float32) * 0.1
        h = g.add(g.matmul(h, g.param(f"w{i}", weights[f"w{i}"])), g.param(f"b{i}", weights[f"b{i}"]))
        if i < layers - 1:
            h = g.relu(h)
    g.set_outputs([g.softmax(h, axis=-1)])

    def fn(w: dict[str, Any], x: dict[str, Any]) -> Any:
        import jax

        h = x["x"]
        for i in range(layers):
            h = _dot(h, w[f"w{i}"]) + w[f"b{i}"]
            if i < layers - 1:
                h = jax.nn.relu(h)
        return jax.nn.softmax(h, axis=-1)

    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    return Model("mlp", f"{'-'.join(map(str, sizes))}, batch {batch}", g, {"x": x}, weights, fn)


def elementwise(rng: np.random.Generator, shape: tuple[int, int]) -> Model:
    g = rlx.Graph("elementwise")
    x = g.input("x", shape)
    weights = {"scale": rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32),
               "shift": rng.uniform(-0.5, 0.5, shape[-1]).astype(np.float32)}
    scale, shift = g.param("scale", weights["scale"]), g.param("shift", weights["shift"])
    y = g.add(g.mul(x, scale), shift)
    y = g.tanh(y)
    y = g.mul(y, g.constant(np.float32(0.5)))
    y = g.add(g.exp(y), g.neg(x))
    y = g.maximum(y, g.constant(np.float32(-1.0)))
    y = g.sigmoid(g.sub(y, shift))
    y = g.mul(g.sqrt(g.add(g.abs(y), g.constant(np.float32(1.0)))), scale)
    g.set_outputs([y])

    def fn(w: dict[str, Any], xs: dict[str, Any]) -> Any:
        import jax
        import jax.numpy as jnp

        x = xs["x"]
        y = jnp.tanh(x * w["scale"] + w["shift"]) * 0.5
        y = jnp.maximum(jnp.exp(y) - x, -1.0)
        y = jax.nn.sigmoid(y - w["shift"])
        return jnp.sqrt(jnp.abs(y) + 1.0) * w["scale"]

    inputs = {"x": rng.standard_normal(shape).astype(np.float32)}
    ops = sum(n.op.value not in ("input", "param", "constant") for n in g.nodes)
    return Model("elementwise", f"{ops} ops on {shape[0]}x{shape[1]}", g, inputs, weights, fn)


def attention(rng: np.random.Generator, batch: int, seq: int, dim: int, heads: int) -> Model:
    hd = dim // heads
    g = rlx.Graph("attention")
    x = g.input("x", (batch, seq, dim))
    weights: Arrays = {}

    def param(name: str, shape: tuple[int, ...], scale: float) -> Any:
        weights[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
        return g.param(name, weights[name])

    def split(t: Any) -> Any:  # (b, s, d) -> (b, h, s, hd)
        return g.transpose(g.reshape(t, (batch, seq, heads, hd)), (0, 2, 1, 3))

    s = 1 / np.sqrt(dim)
    q, k, v = (split(g.matmul(x, param(n, (dim, dim), s))) for n in ("wq", "wk", "wv"))
    a = g.reshape(g.transpose(g.attention(q, k, v), (0, 2, 1, 3)), (batch, seq, dim))
    r = g.add(x, g.matmul(a, param("wo", (dim, dim), s)))
    weights["ln_scale"], weights["ln_bias"] = np.ones(dim, np.float32), np.zeros(dim, np.float32)
    n = g.layer_norm(r, g.param("ln_scale", weights["ln_scale"]), g.param("ln_bias", weights["ln_bias"]))
    h = g.gelu(g.add(g.matmul(n, param("w1", (dim, 4 * dim), s)), param("b1", (4 * dim,), 0.1)))
    g.set_outputs([g.add(n, g.matmul(h, param("w2", (4 * dim, dim), s / 2)))])

    def fn(w: dict[str, Any], xs: dict[str, Any]) -> Any:
        import jax
        import jax.numpy as jnp

        x = xs["x"]

        def heads_of(t: Any) -> Any:
            return t.reshape(batch, seq, heads, hd).transpose(0, 2, 1, 3)

        q, k, v = (heads_of(_dot(x, w[n])) for n in ("wq", "wk", "wv"))
        p = jax.nn.softmax(_dot(q, jnp.swapaxes(k, -1, -2)) / np.sqrt(hd), axis=-1)
        a = _dot(p, v).transpose(0, 2, 1, 3).reshape(batch, seq, dim)
        r = x + _dot(a, w["wo"])
        mean = jnp.mean(r, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(r - mean), axis=-1, keepdims=True)
        n = (r - mean) / jnp.sqrt(var + 1e-5) * w["ln_scale"] + w["ln_bias"]
        h = jax.nn.gelu(_dot(n, w["w1"]) + w["b1"], approximate=False)
        return n + _dot(h, w["w2"])

    inputs = {"x": rng.standard_normal((batch, seq, dim)).astype(np.float32)}
    return Model("attention", f"{heads} heads, batch {batch}, seq {seq}, width {dim}", g, inputs, weights, fn)


def build_models(quick: bool) -> list[Model]:
    rng = np.random.default_rng(20240601)
    if quick:
        return [mlp(rng, 8, (64, 32, 10)), elementwise(rng, (16, 64)), attention(rng, 2, 16, 32, 4)]
    return [mlp(rng, 64, (784, 512, 512, 10)), elementwise(rng, (256, 1024)), attention(rng, 4, 128, 256, 4)]


def contenders(model: Model, dlpack: bool) -> dict[str, Callable[[], Any]]:
    """The callables to time, each returning its result (checked before timing)."""
    import jax

    cg = rlx.compile(model.graph, device="jax")
    device = cg._exe.device if hasattr(cg._exe, "device") else jax.devices()[0]
    weights = {k: jax.device_put(v, device) for k, v in model.weights.items()}
    fn = jax.jit(model.jax_fn)
    inputs = model.inputs
    found: dict[str, Callable[[], Any]] = {
        "rlx jax": lambda: cg.run(inputs)[0],
        "jax.jit": lambda: np.asarray(fn(weights, inputs)),
    }
    if dlpack:
        found["rlx jax, dlpack"] = lambda: cg.run(inputs, output="dlpack")[0].block_until_ready()
        found["jax.jit, on device"] = lambda: fn(weights, inputs).block_until_ready()
    return found


def check(model: Model, fns: dict[str, Callable[[], Any]]) -> None:
    results = {name: np.asarray(f()) for name, f in fns.items()}
    want = results["jax.jit"]
    for name, got in results.items():
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5):
            err = float(np.max(np.abs(got.astype(np.float64) - want))) if got.shape == want.shape else "shape"
            raise SystemExit(f"{model.name}: {name} disagrees with jax.jit (max abs error {err})")


def time_interleaved(fns: dict[str, Callable[[], Any]], blocks: int, sample_s: float,
                     pause_s: float) -> dict[str, float]:
    """Median seconds per call of each function, over interleaved blocks (see the module doc)."""
    loops: dict[str, int] = {}
    for name, f in fns.items():  # size each loop to ~sample_s (and warm up)
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < sample_s / 4 or n < 3:
            f()
            n += 1
        per = (time.perf_counter() - t0) / n
        loops[name] = max(1, int(sample_s / per))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for b in range(blocks):
        order = names[b % len(names):] + names[: b % len(names)]
        for name in order:
            f, n = fns[name], loops[name]
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            samples[name].append((time.perf_counter() - t0) / n)
        time.sleep(pause_s)
    return {name: statistics.median(s) for name, s in samples.items()}


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:9.3f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and 3 blocks: check that it runs")
    parser.add_argument("--blocks", type=int, default=None, help="interleaved blocks per model (default 25)")
    parser.add_argument("--dlpack", action="store_true", help="also time results left on the device")
    parser.add_argument("--models", default="mlp,elementwise,attention", help="comma-separated subset")
    parser.add_argument("--json", default=None, help="write the figures to this file ('-': stdout)")
    args = parser.parse_args(argv)
    blocks = args.blocks or (3 if args.quick else 25)
    sample_s, pause_s = (0.005, 0.0) if args.quick else (0.02, 0.15)
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]

    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.devices()[0].device_kind}); "
          f"{blocks} blocks, medians", file=sys.stderr)
    figures = []
    for model in build_models(args.quick):
        if model.name not in wanted:
            continue
        fns = contenders(model, args.dlpack)
        check(model, fns)
        medians = time_interleaved(fns, blocks, sample_s, pause_s)
        row = {"model": model.name, "summary": model.summary, "seconds": medians,
               "ratio": medians["rlx jax"] / medians["jax.jit"]}
        if args.dlpack:
            row["ratio_on_device"] = medians["rlx jax, dlpack"] / medians["jax.jit, on device"]
        figures.append(row)
        print(f"{model.name:12} ({model.summary})", file=sys.stderr)
        for name, s in medians.items():
            print(f"  {name:22} {_fmt(s)}", file=sys.stderr)
        extra = f", on device {row['ratio_on_device']:.3f}x" if args.dlpack else ""
        print(f"  rlx / jit: {row['ratio']:.3f}x{extra}  (target <= 1.05x)", file=sys.stderr)
    doc = {"jax": jax.__version__, "platform": jax.devices()[0].platform, "blocks": blocks, "models": figures}
    if args.json == "-":
        print(json.dumps(doc, indent=2))
    elif args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
