"""Regenerate ``rlx_core/examples/mlp.json``, the graph behind ``rlx run --example mlp``.

A two-layer perceptron with softmax, weights drawn from a fixed seed so the file is
byte-for-byte reproducible::

    python examples/make_mlp.py            # rewrites rlx_core/examples/mlp.json
    python examples/make_mlp.py out.json   # writes elsewhere
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import rlx_core as rlx

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "rlx_core" / "examples" / "mlp.json"


def build_mlp(batch: int = 8, features: int = 64, hidden: int = 128, classes: int = 10, seed: int = 0) -> rlx.Graph:
    """x[batch, features] -> relu(x @ w1 + b1) @ w2 + b2 -> softmax, float32."""
    rng = np.random.default_rng(seed)
    g = rlx.Graph("mlp")
    x = g.input("x", (batch, features), "float32")
    w1 = g.param("w1", (rng.standard_normal((features, hidden)) / np.sqrt(features)).astype(np.float32))
    b1 = g.param("b1", np.zeros(hidden, np.float32))
    w2 = g.param("w2", (rng.standard_normal((hidden, classes)) / np.sqrt(hidden)).astype(np.float32))
    b2 = g.param("b2", np.zeros(classes, np.float32))
    h = g.relu(g.add(g.matmul(x, w1), b1), name="hidden")
    logits = g.add(g.matmul(h, w2), b2, name="logits")
    g.set_outputs([g.softmax(logits, axis=-1, name="probs")])
    return g


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build_mlp().to_json() + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
