"""The suite's models written by hand for ``jax.jit``: what a JAX user would write.

Idiomatic JAX (``jax.nn``, ``lax.conv_general_dilated``), traced once by ``jax.jit``
with the weights as arguments (so XLA cannot fold them into constants, as no runtime
can for replaceable params). jax is imported when a function is traced, never when the
suite merely imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

W = Mapping[str, Any]


def _layer_norm(x: Any, scale: Any, bias: Any, eps: float = 1e-5) -> Any:
    import jax.numpy as jnp

    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * (scale / jnp.sqrt(var + eps)) + bias


def mlp(w: W, x: W) -> Any:
    import jax

    h = x["x"]
    layers = len(w) // 2
    for i in range(1, layers + 1):
        h = h @ w[f"fc{i}.weight"].T + w[f"fc{i}.bias"]
        if i < layers:
            h = jax.nn.relu(h)
    return jax.nn.softmax(h, axis=-1)


def transformer(w: W, x: W, *, heads: int) -> Any:
    import jax
    import jax.numpy as jnp

    h = x["x"][0]
    seq, d = h.shape
    dh = d // heads

    def split(t: Any) -> Any:
        return t.reshape(seq, heads, dh).transpose(1, 0, 2)

    q = split(h @ w["q.weight"] + w["q.bias"])
    k = split(h @ w["k.weight"] + w["k.bias"])
    v = split(h @ w["v.weight"] + w["v.bias"])
    probs = jax.nn.softmax(jnp.einsum("hqd,hkd->hqk", q, k) / jnp.sqrt(jnp.float32(dh)), axis=-1)
    ctx = jnp.einsum("hqk,hkd->qhd", probs, v).reshape(seq, d)
    h1 = _layer_norm(h + ctx @ w["o.weight"] + w["o.bias"], w["ln1.scale"], w["ln1.bias"])
    f = jax.nn.gelu(h1 @ w["ff1.weight"] + w["ff1.bias"], approximate=False)
    return _layer_norm(h1 + f @ w["ff2.weight"] + w["ff2.bias"], w["ln2.scale"], w["ln2.bias"])[None]


def elementwise(w: W, x: W) -> Any:
    import jax
    import jax.numpy as jnp

    t1 = x["x"] + w["bias"]
    t4 = jnp.tanh(t1 * w["half"]) + x["x"]
    t7 = jax.nn.sigmoid(t4) * w["gamma"] - w["beta"]
    t11 = jnp.exp(-jnp.sqrt(jnp.abs(t7)))
    return jnp.log(jnp.maximum(t11, w["floor"])) / w["gamma"] + t4


def _pool2x2(x: Any, reduce: str) -> Any:
    n, c, h, w = x.shape
    blocks = x.reshape(n, c, h // 2, 2, w // 2, 2)
    return blocks.max(axis=(3, 5)) if reduce == "max" else blocks.mean(axis=(3, 5))


def cnn(w: W, x: W) -> Any:
    import jax
    from jax import lax

    def conv(t: Any, name: str) -> Any:
        out = lax.conv_general_dilated(t, w[f"{name}.weight"], (1, 1), ((1, 1), (1, 1)))  # NCHW, OIHW
        return jax.nn.relu(out + w[f"{name}.bias"][:, None, None])

    h = _pool2x2(conv(x["x"], "conv1"), "max")
    h = _pool2x2(conv(h, "conv2"), "mean")
    return h.reshape(h.shape[0], -1) @ w["fc.weight"].T + w["fc.bias"]


def matmul(w: W, x: W) -> Any:
    return x["a"] @ x["b"]
