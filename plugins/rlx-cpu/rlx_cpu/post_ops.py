"""A fused convolution's epilogue program as oneDNN post-ops (``post_ops``), for the
convolutions oneDNN runs in channels-last chains (``layout``) and for the values held
in bf16 between them (``held``).

Why: a post-op is applied by oneDNN's kernel to each output tile while it is still in
registers; the same epilogue as a region after the primitive is one more pass over the
output. Only chains of steps oneDNN has (clamps, scalar affine steps, a residual add,
ReLU, SiLU, hard-swish, GELU, sigmoid, tanh) map; anything else stays a region.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import onednn, swish

__all__ = ["post_ops"]

#: IR ops that are one of oneDNN's elementwise post-ops on their own: (algorithm, alpha, beta).
_UNARY_POST = {"relu": ("relu", 0.0, 0.0), "sigmoid": ("logistic", 0.0, 0.0), "tanh": ("tanh", 0.0, 0.0)}
_BIG = float(np.finfo(np.float32).max)


def post_ops(program: Sequence[Any], operands: Sequence[Any],
             constant: Callable[[Any], bool] | None = None) -> tuple[tuple[Any, ...], ...] | None:
    """A fused convolution's epilogue as oneDNN post-ops, or None where it is not a chain
    of them: each instruction must read the one before it (the first: the convolution's
    result) and at most one other operand, a scalar fixed at compile time (clamps, scales,
    shifts: ReLU6 is two) or, for an add, an array of the output's shape (a residual).
    ``constant(array)`` says whether a step may hold an operand's value as a number (the
    build context's: a resident, whose params the executable then watches: ``set_param``
    of one binds its plans again); without it only read-only arrays count. A product of
    an earlier value of the chain and a sigmoid or a hard sigmoid of it is SiLU or
    hard-swish (EfficientNet's, MobileNetV3's): one post-op (SiLU only where that timed
    faster than a region after the convolution: ``swish``)."""
    m = len(operands)
    prev, found = 0, []
    at = {0: 0}  # a value of the chain -> how many post-ops had been found when it was the result
    for k, (op, args, attrs) in enumerate(program):
        others = [a for a in args if a != prev]
        if len(args) - len(others) != 1:
            return None
        attrs = dict(attrs)
        if op == "mul" and len(others) == 1 and others[0] in at and others[0] != prev:
            gate = _gate(_merged(found[at[others[0]]:]))
            if gate is None:
                return None
            found[at[others[0]]:] = [gate]
        elif any(a >= m for a in others):
            return None
        elif op in _UNARY_POST and not others:
            alg, alpha, beta = _UNARY_POST[op]
            found.append(("eltwise", onednn.ELTWISE[alg], alpha, beta))
        elif op == "gelu" and not others:
            alg = "gelu_tanh" if attrs.get("approximate") == "tanh" else "gelu_erf"
            found.append(("eltwise", onednn.ELTWISE[alg], 0.0, 0.0))
        elif len(others) == 1 and op in ("maximum", "minimum", "add", "mul", "sub"):
            other = operands[others[0]]
            c = _fixed_scalar(other, constant)
            if c is None:
                if op != "add" or tuple(other.shape) != tuple(operands[0].shape):
                    return None
                found.append(("add", other))
            elif op == "maximum":
                found.append(("eltwise", onednn.ELTWISE["clip"], c, _BIG))
            elif op == "minimum":
                found.append(("eltwise", onednn.ELTWISE["clip"], -_BIG, c))
            elif op == "add":
                found.append(("eltwise", onednn.ELTWISE["linear"], 1.0, c))
            elif op == "mul":
                found.append(("eltwise", onednn.ELTWISE["linear"], c, 0.0))
            else:  # sub: x - c, or c - x
                found.append(("eltwise", onednn.ELTWISE["linear"], *((1.0, -c) if args[0] == prev else (-1.0, c))))
        else:
            return None
        prev = m + k
        at[prev] = len(found)
    return tuple(_merged(found))


def _gate(ops: list[tuple[Any, ...]]) -> tuple[Any, ...] | None:
    """``x * g(x)`` as one post-op, where ``ops`` compute ``g``: SiLU for a sigmoid,
    hard-swish for a clamp of ``a * x + b`` to [0, 1]; else None."""
    e = onednn.ELTWISE
    if len(ops) == 1 and ops[0] == ("eltwise", e["logistic"], 0.0, 0.0):  # (a region where that is faster)
        return ("eltwise", e["swish"], 1.0, 0.0) if swish.post_op(onednn.library())[0] else None
    if (len(ops) == 2 and ops[0][:2] == ("eltwise", e["linear"]) and ops[1] == ("eltwise", e["clip"], 0.0, 1.0)
            and ops[0][2] > 0):
        return ("eltwise", e["hardswish"], ops[0][2], ops[0][3])
    return None


def _merged(ops: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Consecutive affine steps as one (``x * a + b``), and ``max(x, lo)`` then
    ``min(x, hi)`` as one clip (ReLU6)."""
    clip, linear = onednn.ELTWISE["clip"], onednn.ELTWISE["linear"]
    out: list[tuple[Any, ...]] = []
    for op in ops:
        last = out[-1] if out else None
        if last is not None and op[:2] == ("eltwise", clip) and last[:2] == ("eltwise", clip):
            lo, hi = max(last[2], op[2]), min(last[3], op[3])
            if lo <= hi:
                out[-1] = ("eltwise", clip, lo, hi)
                continue
        if last is not None and op[:2] == ("eltwise", linear) and last[:2] == ("eltwise", linear):
            out[-1] = ("eltwise", linear, op[2] * last[2], op[2] * last[3] + op[3])
            continue
        out.append(op)
    return out


def _fixed_scalar(x: Any, constant: Callable[[Any], bool] | None) -> float | None:
    """The value of a one-element float32 operand fixed for good, else None."""
    if not isinstance(x, np.ndarray) or x.size != 1 or x.dtype != np.float32:
        return None
    if not (constant(x) if constant is not None else not x.flags.writeable):
        return None
    value = float(x.reshape(()))
    return value if np.isfinite(value) else None
