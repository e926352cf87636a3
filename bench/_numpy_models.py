"""The suite's models written by hand with numpy: the baseline a user would write.

Plain and obvious on purpose (no ``out=`` buffers, no fused tricks): this is the code a
runtime has to beat to be worth installing. Every function is dtype-generic: float32
weights and inputs compute in float32 (what is timed), float64 ones in float64 (the
reference that tolerances are derived from, see ``bench/_checks.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

W = Mapping[str, np.ndarray]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def mlp(w: W, x: W) -> np.ndarray:
    h = x["x"]
    layers = len(w) // 2
    for i in range(1, layers + 1):
        h = h @ w[f"fc{i}.weight"].T + w[f"fc{i}.bias"]
        if i < layers:
            h = np.maximum(h, 0)
    return _softmax(h)


def _erf(x: np.ndarray) -> np.ndarray:
    """scipy's erf (numpy has none). Without scipy, only the float64 reference can go on,
    elementwise through ``math.erf`` (slow, but it runs once); the float32 contender
    would be timing a Python loop, so it is reported unavailable instead."""
    try:
        from scipy.special import erf
    except ImportError:
        if x.dtype != np.float64:
            raise
        return np.vectorize(math.erf, otypes=[np.float64])(x)
    return erf(x)


def transformer(w: W, x: W, *, heads: int) -> np.ndarray:
    h = x["x"][0]  # [seq, d], batch 1
    seq, d = h.shape
    dh = d // heads

    def split(t: np.ndarray) -> np.ndarray:  # [seq, d] -> [heads, seq, dh]
        return t.reshape(seq, heads, dh).transpose(1, 0, 2)

    q = split(h @ w["q.weight"] + w["q.bias"])
    k = split(h @ w["k.weight"] + w["k.bias"])
    v = split(h @ w["v.weight"] + w["v.bias"])
    probs = _softmax(q @ k.transpose(0, 2, 1) / np.sqrt(h.dtype.type(dh)))
    ctx = (probs @ v).transpose(1, 0, 2).reshape(seq, d)
    h1 = _layer_norm(h + ctx @ w["o.weight"] + w["o.bias"], w["ln1.scale"], w["ln1.bias"])
    f = h1 @ w["ff1.weight"] + w["ff1.bias"]
    f = f * 0.5 * (1 + _erf(f / np.sqrt(h.dtype.type(2))))
    out = _layer_norm(h1 + f @ w["ff2.weight"] + w["ff2.bias"], w["ln2.scale"], w["ln2.bias"])
    return out[None]


def elementwise(w: W, x: W) -> np.ndarray:
    t1 = x["x"] + w["bias"]
    t4 = np.tanh(t1 * w["half"]) + x["x"]
    t7 = 1 / (1 + np.exp(-t4)) * w["gamma"] - w["beta"]
    t11 = np.exp(-np.sqrt(np.abs(t7)))
    return np.log(np.maximum(t11, w["floor"])) / w["gamma"] + t4


def _conv3x3(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """3x3 convolution, stride 1, padding 1, as im2col + one BLAS product (tensordot)."""
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # [n, c, h, w, 3, 3]
    out = np.tensordot(windows, weight, axes=([1, 4, 5], [1, 2, 3]))  # [n, h, w, out]
    return out.transpose(0, 3, 1, 2) + bias[:, None, None]


def _pool2x2(x: np.ndarray, reduce: str) -> np.ndarray:
    n, c, h, w = x.shape
    blocks = x.reshape(n, c, h // 2, 2, w // 2, 2)
    return blocks.max(axis=(3, 5)) if reduce == "max" else blocks.mean(axis=(3, 5))


def cnn(w: W, x: W) -> np.ndarray:
    h = _pool2x2(np.maximum(_conv3x3(x["x"], w["conv1.weight"], w["conv1.bias"]), 0), "max")
    h = _pool2x2(np.maximum(_conv3x3(h, w["conv2.weight"], w["conv2.bias"]), 0), "mean")
    return h.reshape(h.shape[0], -1) @ w["fc.weight"].T + w["fc.bias"]


def matmul(w: W, x: W) -> np.ndarray:
    return x["a"] @ x["b"]
