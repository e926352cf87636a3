"""``precision="bf16"`` against float32 on cpu, product by product (``docs/precision.md``).

Each row is one product as a one-node graph (a convolution of a CNN's shapes, a dense
layer of a transformer's), compiled on cpu at ``fp32`` and at ``bf16`` and timed
interleaved (``bench/_timing.measure``: blocks, 150 ms pauses, medians), with the bf16
result's largest error relative to the float32 one. Where the host does not take bf16
(no AMX or AVX512_BF16 that pays, or oneDNN missing or off) both compile the same float32
product and the report says so.

``--primitives`` times oneDNN's own primitives instead, at float32 operands and at bf16
operands whatever unit oneDNN runs them on, with the implementation it chose: what
``onednn.precisions`` rests on (run it under ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`` on
an AMX host to see bf16 without AMX).

    python bench/precision.py
    python bench/precision.py --primitives
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

#: (name, kind, shape): a convolution's (batch, channels in, out, size, kernel, stride), a
#: dense layer's (rows, k, n).
PRODUCTS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("resnet 3x3, 64 ch, 56x56, b1", "conv", (1, 64, 64, 56, 3, 1)),
    ("resnet 3x3, 256 ch, 14x14, b8", "conv", (8, 256, 256, 14, 3, 1)),
    ("resnet 1x1, 256 -> 1024, 14x14, b8", "conv", (8, 256, 1024, 14, 1, 1)),
    ("stem 7x7/2, 3 -> 64, 224x224, b1", "conv", (1, 3, 64, 224, 7, 2)),
    ("bert ffn 128 x 768 -> 3072", "dense", (128, 768, 3072)),
    ("bert qkv 1024 x 768 -> 768", "dense", (1024, 768, 768)),
)


def _graph(kind: str, shape: tuple[int, ...]) -> tuple[Any, dict[str, np.ndarray]]:
    from rlx_core.ir import Graph

    rng = np.random.default_rng(0)
    g = Graph(kind)
    if kind == "conv":
        n, c, o, size, k, s = shape
        x = rng.standard_normal((n, c, size, size)).astype(np.float32)
        w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        g.set_outputs([g.conv2d(g.input("x", x.shape), g.param("w", w), stride=s, padding=k // 2)])
    else:
        m, k, n = shape
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        g.set_outputs([g.matmul(g.input("x", x.shape), g.param("w", w))])
    return g, {"x": x}


def products(rounds: int, target_s: float, which: Sequence[tuple[str, str, tuple[int, ...]]] = PRODUCTS
             ) -> list[dict[str, Any]]:
    """Each of ``which`` at fp32 and bf16 through ``rlx_core.compile``, interleaved."""
    import rlx_core
    from bench._contenders import Contender
    from bench._timing import measure

    rows = []
    for name, kind, shape in which:
        g, feeds = _graph(kind, shape)
        contenders, outs, notes = [], {}, []
        for precision in ("fp32", "bf16"):
            cg = rlx_core.compile(g, device="cpu", precision=precision)
            outs[precision] = cg.run(feeds)[0]
            notes += [n for n in cg.report().notes if n.startswith("precision")]
            run = (lambda cg=cg, feeds=feeds: cg.run(feeds)[0])
            contenders.append(Contender(precision, "rlx", run, outs[precision], 0.0, 0.0))
        t = measure(contenders, rounds, 0.15, target_s)
        ref = outs["fp32"].astype(np.float64)
        err = float(np.max(np.abs(outs["bf16"] - ref)) / (np.max(np.abs(ref)) or 1.0))
        rows.append({"product": name, "fp32_ms": t["fp32"].median * 1e3, "bf16_ms": t["bf16"].median * 1e3,
                     "speedup": t["fp32"].median / t["bf16"].median, "bf16_rel_err": err,
                     "taken": any(" with bf16 operands on " in n for n in notes)})  # rlx-cpu's own line
    return rows


def primitives(repeats: int = 7, which: Sequence[tuple[str, str, tuple[int, ...]]] = PRODUCTS
               ) -> list[dict[str, Any]]:
    """oneDNN's convolution and matmul primitives at float32 and at bf16 operands (float32
    results), whatever unit runs the bf16 ones: best of ``repeats`` blocks each
    (``rlx_cpu.bf16_units.time_product``, which times the host's own bf16 probes)."""
    from rlx_cpu import bf16_units, onednn

    lib = onednn.library()
    if lib is None:
        raise SystemExit(f"bench/precision.py --primitives needs oneDNN: {onednn.reason()}")
    rows = []
    for name, kind, shape in which:
        if kind == "conv":
            n, c, o, size, k, s = shape
            out = (size + 2 * (k // 2) - k) // s + 1
            flops = 2 * n * o * out * out * c * k * k
        else:
            m, k, n = shape
            flops = 2 * m * k * n
        for label, dtype in (("fp32", "f32"), ("bf16", "bf16")):
            best, impl = bf16_units.time_product(lib, kind, shape, dtype, repeats, 5, 0.05)
            rows.append({"product": name, "operands": label, "ms": best * 1e3, "gflops": flops / best / 1e9,
                         "impl": impl})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--primitives", action="store_true", help="time oneDNN's primitives themselves")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--target-ms", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="only check that it runs: two products, one round")
    args = parser.parse_args(argv)
    which = PRODUCTS
    if args.quick:
        which = PRODUCTS[:1] + PRODUCTS[4:5]
        args.rounds, args.target_ms = 1, 5.0
    import rlx_core

    print(f"cpu precisions here: {sorted(rlx_core.get_backend('cpu').precisions()) or 'none'} "
          f"({rlx_core.get_backend('cpu').probe().versions.get('precision', '')})")
    if args.primitives:
        print("| product | operands | ms | GFLOP/s | oneDNN implementation |\n|---|---|--:|--:|---|")
        for r in primitives(2 if args.quick else 7, which):
            print(f"| {r['product']} | {r['operands']} | {r['ms']:.3f} | {r['gflops']:.0f} | {r['impl']} |")
        return 0
    print("| product | fp32 ms | bf16 ms | fp32 / bf16 | bf16 rel. error | bf16 taken |\n|---|--:|--:|--:|--:|---|")
    for r in products(args.rounds, args.target_ms / 1e3, which):
        print(f"| {r['product']} | {r['fp32_ms']:.3f} | {r['bf16_ms']:.3f} | {r['speedup']:.2f}x | "
              f"{r['bf16_rel_err']:.1e} | {'yes' if r['taken'] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
