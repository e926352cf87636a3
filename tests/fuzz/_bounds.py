"""Forward error bounds: how far a correct backend may land from the float64 reference.

The reference computes every float in float64; a backend computes in the graph's dtypes
(float32, float16) and may fuse, reorder or approximate. A fixed tolerance is either too
loose to catch a real bug or too tight for an ill-conditioned chain (``log`` of a small
value after a subtraction). So the fuzzer carries, next to each node's reference value,
an elementwise bound on the error a correct implementation may have accumulated there:
first-order forward error analysis, with the values actually flowing through the graph
and the unit roundoff ``u`` of each node's dtype. A result is wrong when it is further
from the reference than twice that bound (the factor covers second-order terms).

Each rule is conservative (worst-case summation, a few ulps for transcendental
functions, one-pass variance allowed), so a reported disagreement is a real bug, and a
wrong axis, broadcast, slice or dtype (errors of order 1) is still far outside it.
Integer and bool values are exact (bound 0). The rules reuse the reference's kernels for
the linear ops (convolution, pooling, gather, slice) applied to |x| and to the bounds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_core import reference
from rlx_core.ir import Graph, Node
from rlx_core.ir.dtypes import FLOAT_DTYPES
from rlx_core.ir.ops import OpKind

#: Unit roundoff (half an ulp at 1) of each float dtype; ints and bool compute exactly.
UNIT = {"float16": 2.0**-11, "float32": 2.0**-24, "float64": 2.0**-53}
#: Ulps a backend's transcendental functions may be off by, before propagation.
TRANSCENDENTAL_ULPS = 4.0

_KERNELS = reference._KERNELS  # the reference's own op definitions (see module docstring)


def unit(dtype: str) -> float:
    return UNIT.get(dtype, 0.0)


def _compute(dtype: str) -> np.dtype:
    return np.dtype(np.float64) if dtype in FLOAT_DTYPES else np.dtype(dtype)


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _erf(x: np.ndarray) -> np.ndarray:
    return _KERNELS[OpKind.ERF](None, [np.asarray(x, np.float64)])  # type: ignore[arg-type]


_MONOTONE = {
    OpKind.EXP: np.exp,
    OpKind.LOG: np.log,
    OpKind.SQRT: np.sqrt,
    OpKind.RSQRT: lambda x: 1.0 / np.sqrt(x),
    OpKind.TANH: np.tanh,
    OpKind.ERF: _erf,
    OpKind.SIGMOID: lambda x: 1.0 / (1.0 + np.exp(-x)),
}


class Tracker:
    """Reference values and error bounds of every node of ``graph``, node by node.

    ``values[id]`` holds a node's value as the reference does (floats in float64, after
    rounding sources to their dtype); ``errors[id]`` the bound (float64, same shape).
    ``sync()`` processes nodes added since the last call, so the graph generator can look
    at the values it is building on.
    """

    def __init__(self, graph: Graph, inputs: Mapping[str, np.ndarray],
                 params: Mapping[str, np.ndarray] | None = None) -> None:
        self.graph = graph
        self.inputs = inputs
        self.params = dict(params or {})
        self.values: dict[int, np.ndarray] = {}
        self.errors: dict[int, np.ndarray] = {}

    def sync(self) -> None:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "mean of empty slice"
            for node in self.graph.nodes[len(self.values):]:
                self._add(node)

    def _add(self, node: Node) -> None:
        if node.op is OpKind.INPUT:
            value: Any = self.inputs[node.name]
        elif node.op is OpKind.PARAM:
            value = self.params.get(node.name, self.graph.value(node.id))
        elif node.op is OpKind.CONSTANT:
            value = self.graph.value(node.id)
        else:
            xs = [self.values[i] for i in node.inputs]
            out = np.asarray(_KERNELS[node.op](node, xs)).astype(_compute(node.dtype), copy=False)
            self.values[node.id] = out
            err = np.broadcast_to(_f64(self._bound(node, xs, [self.errors[i] for i in node.inputs], out)), out.shape)
            self.errors[node.id] = np.array(err, dtype=np.float64)
            return
        value = np.asarray(value).astype(node.dtype).astype(_compute(node.dtype))
        self.values[node.id] = value
        self.errors[node.id] = np.zeros(value.shape, np.float64)

    # ------------------------------------------------------------------ rules
    def _bound(self, node: Node, xs: list[np.ndarray], es: list[np.ndarray], out: np.ndarray) -> np.ndarray:
        op, u = node.op, unit(node.dtype)
        ax = [np.abs(_f64(x)) for x in xs]
        aout = np.abs(_f64(out))
        if op in (OpKind.ADD, OpKind.SUB):
            return es[0] + es[1] + u * (ax[0] + ax[1])
        if op is OpKind.MUL:
            return ax[1] * es[0] + ax[0] * es[1] + es[0] * es[1] + 2 * u * aout
        if op is OpKind.DIV:
            if u == 0.0:
                return np.zeros(out.shape)
            d = np.maximum(ax[1] - es[1], 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                return (es[0] + aout * es[1]) / d + 2 * u * aout
        if op is OpKind.POW:
            return self._pow(xs, es, out, u)
        if op in (OpKind.MAXIMUM, OpKind.MINIMUM):
            return np.maximum(es[0], es[1])
        if op in (OpKind.NEG, OpKind.ABS, OpKind.RELU):
            return es[0]
        if op in _MONOTONE:
            f = _MONOTONE[op]
            da = es[0] + TRANSCENDENTAL_ULPS * u * ax[0]
            hi, lo = f(_f64(xs[0]) + da), f(_f64(xs[0]) - da)
            return np.maximum(np.abs(hi - out), np.abs(lo - out)) + TRANSCENDENTAL_ULPS * u * aout
        if op is OpKind.GELU:  # Lipschitz 1.13; 0.5·x·(1 + erf) cancels for x << 0
            return 1.13 * es[0] + TRANSCENDENTAL_ULPS * u * (aout + ax[0])
        if op in (OpKind.REDUCE_SUM, OpKind.REDUCE_MEAN, OpKind.REDUCE_MAX):
            return self._reduce(node, xs, es, out, u)
        if op is OpKind.SOFTMAX:
            return softmax_bound(_f64(xs[0]), es[0], out, node.attrs["axis"], u)
        if op is OpKind.LAYER_NORM:
            return self._layer_norm(node, xs, es, u)
        if op is OpKind.MATMUL:
            return matmul_bound(xs[0], xs[1], es[0], es[1], u) + u * aout
        if op in (OpKind.RESHAPE, OpKind.TRANSPOSE, OpKind.SLICE, OpKind.CONCAT):
            return _KERNELS[op](node, es)
        if op is OpKind.GATHER:
            return _KERNELS[op](node, [es[0], xs[1]])
        if op is OpKind.WHERE:
            return np.where(xs[0], es[1], es[2])
        if op is OpKind.CAST:
            return self._cast(node, xs, es, out)
        if op is OpKind.CONV2D:
            return self._conv(node, xs, es, out, u)
        if op is OpKind.MAX_POOL2D:
            return _KERNELS[op](node, [es[0]])
        if op is OpKind.AVG_POOL2D:
            k = math.prod(node.attrs["kernel"])
            return _KERNELS[op](node, [es[0]]) + u * k * _KERNELS[op](node, [ax[0]]) + u * aout
        if op is OpKind.GLOBAL_AVG_POOL2D:
            hw = xs[0].shape[2] * xs[0].shape[3]
            mean = lambda a: np.mean(a, axis=(2, 3), keepdims=True)
            return mean(es[0]) + u * hw * mean(ax[0]) + u * aout
        if op is OpKind.ATTENTION:
            return self._attention(node, xs, es, u)
        raise AssertionError(f"no error rule for {op}")

    @staticmethod
    def _pow(xs: list[np.ndarray], es: list[np.ndarray], out: np.ndarray, u: float) -> np.ndarray:
        """pow(a, b) with a > 0 is monotone in each argument: the box's corners bound it."""
        a, b = _f64(xs[0]), _f64(xs[1])
        da = es[0] + TRANSCENDENTAL_ULPS * u * np.abs(a)
        db = es[1] + TRANSCENDENTAL_ULPS * u * np.abs(b)
        worst = np.zeros(np.broadcast_shapes(a.shape, b.shape))
        for sa in (-1, 1):
            for sb in (-1, 1):
                worst = np.maximum(worst, np.abs(np.power(a + sa * da, b + sb * db) - out))
        return worst + TRANSCENDENTAL_ULPS * u * np.abs(out) * (1 + np.abs(b * np.log(np.abs(a))))

    @staticmethod
    def _reduce(node: Node, xs: list[np.ndarray], es: list[np.ndarray], out: np.ndarray, u: float) -> np.ndarray:
        axes, keep = node.attrs["axes"], node.attrs["keepdims"]
        if node.op is OpKind.REDUCE_MAX:
            return np.max(es[0], axis=axes, keepdims=keep) if es[0].size else np.zeros(out.shape)
        k = math.prod(xs[0].shape[a] for a in axes)
        total = np.sum(es[0], axis=axes, keepdims=keep) + u * k * np.sum(np.abs(_f64(xs[0])), axis=axes, keepdims=keep)
        if node.op is OpKind.REDUCE_SUM:
            return total
        with np.errstate(divide="ignore", invalid="ignore"):
            return total / k + u * np.abs(_f64(out))

    @staticmethod
    def _layer_norm(node: Node, xs: list[np.ndarray], es: list[np.ndarray], u: float) -> np.ndarray:
        """y = (x - mean) / sqrt(var + eps) * scale + bias, with var perturbed by the
        input's bound and by a one-pass (E[x²] - mean²) summation error."""
        x, ex = _f64(xs[0]), es[0]
        axes = tuple(range(node.attrs["axis"], x.ndim))
        n = math.prod(x.shape[a] for a in axes)
        mean = lambda a: np.mean(a, axis=axes, keepdims=True)
        mu = mean(x)
        xc = x - mu
        var = mean(xc**2)
        eps = node.attrs["eps"]
        d = ex + mean(ex) + TRANSCENDENTAL_ULPS * u * (np.abs(x) + np.abs(mu))
        dvar = 2 * mean(np.abs(xc) * d) + mean(d**2) + TRANSCENDENTAL_ULPS * u * (n + 2) * mean(x**2)
        sig = np.sqrt(var + eps)
        sig_lo = np.sqrt(np.maximum(var - dvar, 0.0) + eps)
        z = xc / sig
        ez = (d + np.abs(z) * dvar / (sig + sig_lo)) / sig_lo + TRANSCENDENTAL_ULPS * u * np.abs(z)
        scale, escale = np.abs(_f64(xs[1])), es[1]
        err = scale * ez + np.abs(z) * escale + ez * escale + 2 * u * np.abs(z) * scale
        if len(xs) == 3:
            err = err + es[2] + 2 * u * np.abs(_f64(xs[2]))
        return err

    @staticmethod
    def _cast(node: Node, xs: list[np.ndarray], es: list[np.ndarray], out: np.ndarray) -> np.ndarray:
        target = node.attrs["dtype"]
        if target not in FLOAT_DTYPES:
            # Truncation is discontinuous: the generator casts to int/bool only exact values.
            return np.where(es[0] > 0, np.inf, 0.0)
        return es[0] + unit(target) * np.abs(_f64(out))

    @staticmethod
    def _conv(node: Node, xs: list[np.ndarray], es: list[np.ndarray], out: np.ndarray, u: float) -> np.ndarray:
        conv = lambda a, w: _KERNELS[OpKind.CONV2D](node, [a, w])
        x, w = np.abs(_f64(xs[0])), np.abs(_f64(xs[1]))
        k = w.shape[1] * w.shape[2] * w.shape[3]
        err = conv(es[0], w) + conv(x, es[1]) + conv(es[0], es[1]) + u * k * conv(x, w) + u * np.abs(_f64(out))
        if len(xs) == 3:
            err = err + es[2].reshape(1, -1, 1, 1)
        return err

    @staticmethod
    def _attention(node: Node, xs: list[np.ndarray], es: list[np.ndarray], u: float) -> np.ndarray:
        q, k, v = (_f64(x) for x in xs[:3])
        eq, ek, ev = es[:3]
        scale = node.attrs["scale"]
        kt, ekt = np.swapaxes(k, -1, -2), np.swapaxes(ek, -1, -2)
        s = np.matmul(q, kt) * scale
        es_ = abs(scale) * matmul_bound(q, kt, eq, ekt, u) + 2 * u * np.abs(s)
        valid = None
        if len(xs) == 4:
            mask = xs[3]
            if mask.dtype == np.bool_:
                valid = np.broadcast_to(mask, s.shape)
                s = np.where(valid, s, -np.inf)
            else:
                es_ = es_ + es[3] + u * (np.abs(s) + np.abs(_f64(mask)))
                s = s + mask
        p = reference._softmax_along(s, -1)
        ep = softmax_bound(s, np.broadcast_to(es_, s.shape), p, s.ndim - 1, u, valid)
        return matmul_bound(p, v, ep, ev, u) + u * np.abs(np.matmul(p, v))


def matmul_bound(a: np.ndarray, b: np.ndarray, ea: np.ndarray, eb: np.ndarray, u: float) -> np.ndarray:
    """|A|·eB + eA·|B| + eA·eB + K·u·|A|·|B| (worst-case K-term dot products)."""
    aa, ab = np.abs(_f64(a)), np.abs(_f64(b))
    k = a.shape[-1]
    return np.matmul(aa, eb) + np.matmul(ea, ab) + np.matmul(ea, eb) + u * k * np.matmul(aa, ab)


def softmax_bound(x: np.ndarray, ex: np.ndarray, s: np.ndarray, axis: int, u: float,
                  valid: np.ndarray | None = None) -> np.ndarray:
    """softmax(x + δ)/softmax(x) lies in [e^-2m, e^2m] when |δ| <= m along the axis; the
    exps' own rounding (relative u·|x - max|) and the K-term sum join δ."""
    n = x.shape[axis] if x.ndim else 1
    if x.size == 0:
        return np.zeros(s.shape)
    with np.errstate(invalid="ignore"):
        spread = np.abs(x - np.max(x, axis=axis, keepdims=True))
    delta = ex + TRANSCENDENTAL_ULPS * u * spread
    if valid is not None:
        delta = np.where(valid, delta, 0.0)
    m = np.max(delta, axis=axis, keepdims=True) + (n + 8) * u
    return np.abs(s) * np.expm1(2 * m)


def mismatch(dtype: str, got: np.ndarray, ref: np.ndarray, err: np.ndarray) -> str | None:
    """``None`` when ``got`` is within twice the bound of ``ref`` (NaN must meet NaN and an
    infinity the same infinity; ints and bools exactly), else a sentence naming the worst
    element."""
    got = np.asarray(got)
    if dtype not in FLOAT_DTYPES:
        bad = got != ref
        if not bad.any():
            return None
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        return f"{int(bad.sum())} of {bad.size} elements differ; first at {at}: got {got[at]!r}, expected {ref[at]!r}"
    g = got.astype(np.float64)
    floor = 4 * float(np.finfo(dtype).smallest_subnormal) if hasattr(np.finfo(dtype), "smallest_subnormal") else 0.0
    with np.errstate(invalid="ignore"):
        special = ~np.isfinite(ref)
        special_ok = (np.isnan(g) & np.isnan(ref)) | (np.isinf(ref) & (g == ref))
        tol = np.where(np.isfinite(err), 2 * err + floor, np.inf)
        finite_ok = np.isfinite(g) & (np.abs(g - ref) <= tol)
    ok = np.where(special, special_ok, finite_ok)
    if ok.all():
        return None
    bad = ~ok
    excess = np.where(bad, np.nan_to_num(np.abs(g - ref), nan=np.inf, posinf=np.inf) - np.nan_to_num(tol), -np.inf)
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), excess.shape)) if excess.ndim else ()
    return (f"{int(bad.sum())} of {bad.size} elements outside the error bound; worst at {at}: "
            f"got {g[at]!r}, expected {ref[at]!r}, allowed error {tol[at]:.3g}")
