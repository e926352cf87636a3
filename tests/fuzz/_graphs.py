"""A hypothesis strategy for random valid graphs, and the case it draws.

A graph is grown from one or two inputs by random ops: each op takes operands from the
values built so far (whose shapes broadcast, whose dtype it accepts) or from a fresh
input, param, constant or Python scalar of a compatible shape. The structure (op, shapes,
axes, attributes, which operand) is drawn by hypothesis, so a failure shrinks to a small
graph; array values come from a numpy generator seeded by a drawn integer.

The generator watches the reference values as it builds (``_bounds.Tracker``): ``log``
and friends get operands that are safely positive, divisors stay away from zero, and a
node whose value overflows its dtype or whose error bound is no longer small against its
value is left unused (it stays in the graph; nothing reads it). So every output is
well defined and well conditioned, and a disagreement is a bug, not a fragile
comparison. Non-finite inputs are injected afterwards, by the NaN/Inf property.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from rlx_core.errors import GraphError, InputError
from rlx_core.ir import Graph, Value
from rlx_core.ir.dtypes import FLOAT_DTYPES

from ._bounds import Tracker

GRAPH_DTYPES = ("float32", "float32", "float64", "float16", "int32", "int64")
#: Largest magnitude a value may reach and stay in play (well inside each dtype's range).
LIMIT = {"float16": 1e3, "float32": 1e12, "float64": 1e30, "int32": 2.0**24, "int64": 2.0**40, "bool": 1.0}
#: Patterns of open bugs (each reproduced in ``test_found.py``) the generator avoids, so
#: that fuzzing keeps finding new ones; remove an entry when its bug is fixed.
KNOWN_BUGS: frozenset[str] = frozenset()
#: The bound may be at most this fraction of (1 + |value|) for a value to stay in play.
CONDITION = 0.05

UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu")
BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")
FLOAT_ONLY = frozenset({"exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "gelu", "pow", "softmax",
                        "layer_norm", "reduce_mean", "conv2d", "max_pool2d", "avg_pool2d", "global_avg_pool2d",
                        "attention"})
ANY_DTYPE = frozenset({"reshape", "transpose", "concat", "slice", "gather", "cast", "where"})
OPS = (*UNARY, *BINARY, "matmul", "softmax", "layer_norm", "reduce_sum", "reduce_mean", "reduce_max", "reshape",
       "transpose", "concat", "slice", "gather", "cast", "where", "conv2d", "max_pool2d", "avg_pool2d",
       "global_avg_pool2d", "attention")


def accepts(op: str, dtype: str) -> bool:
    """Whether ``op`` takes a main operand of ``dtype`` (mirrors ``rlx_core.ir.ops``)."""
    if op in FLOAT_ONLY:
        return dtype in FLOAT_DTYPES
    return op in ANY_DTYPE or dtype != "bool"


@dataclass
class FuzzCase:
    """One drawn graph with its inputs; ``new_params`` are applied with ``set_param``
    after a first run (empty: none), ``alive`` are the nodes whose values are in play."""

    graph: Graph
    inputs: dict[str, np.ndarray]
    new_params: dict[str, np.ndarray] = field(default_factory=dict)
    alive: frozenset[int] = frozenset()

    def describe(self) -> str:
        ins = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.inputs.items())
        swaps = f"\nset_param: {sorted(self.new_params)}" if self.new_params else ""
        return f"{self.graph.summary()}\ninputs: {ins or 'none'}{swaps}"

    __repr__ = describe  # what hypothesis prints for a falsifying example


class _Builder:
    def __init__(self, draw: Callable[[Any], Any], seed: int, dtype: str, allow_int_casts: bool) -> None:
        self.draw = draw
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.allow_int_casts = allow_int_casts
        self.g = Graph("fuzz")
        self.inputs: dict[str, np.ndarray] = {}
        self.tracker = Tracker(self.g, self.inputs)
        self.pool: list[Value] = []
        self.alive: set[int] = set()
        self.count = 0

    # ------------------------------------------------------------------ values
    def value(self, v: Value) -> np.ndarray:
        self.tracker.sync()
        return self.tracker.values[v.id]

    def error(self, v: Value) -> np.ndarray:
        self.tracker.sync()
        return self.tracker.errors[v.id]

    def _array(self, shape: tuple[int, ...], dtype: str, domain: str) -> np.ndarray:
        rng = self.rng
        if dtype == "bool":
            return rng.random(shape) < 0.5
        sign = np.where(rng.random(shape) < 0.5, -1, 1)
        if dtype in ("int32", "int64"):
            raw = {"positive": rng.integers(1, 10, shape), "nonzero": sign * rng.integers(1, 10, shape),
                   "any": rng.integers(-20, 21, shape)}[domain]
        else:
            raw = {"positive": rng.uniform(0.25, 2.0, shape), "nonzero": sign * rng.uniform(0.5, 2.0, shape),
                   "any": rng.uniform(-2.0, 2.0, shape)}[domain]
        return np.asarray(raw).astype(dtype)

    def fresh(self, shape: tuple[int, ...], dtype: str, domain: str = "any", kind: str | None = None) -> Value:
        """A new input, param or constant of ``shape`` and ``dtype``."""
        kind = kind or self.draw(st.sampled_from(("input", "param", "constant")))
        arr = self._array(shape, dtype, domain)
        self.count += 1
        if kind == "input":
            name = f"x{self.count}"
            self.inputs[name] = arr
            v = self.g.input(name, shape, dtype)
        elif kind == "param":
            v = self.g.param(f"p{self.count}", arr)
        else:
            v = self.g.constant(arr)
        self.alive.add(v.id)
        return v

    def shape(self, min_rank: int = 0, max_rank: int = 3) -> tuple[int, ...]:
        return tuple(self.draw(st.lists(st.integers(1, 4), min_size=min_rank, max_size=max_rank)))

    def broadcastable(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape``: a suffix, some dims set to 1, maybe a new leading dim."""
        drop = self.draw(st.integers(0, len(shape)))
        out = [1 if self.draw(st.booleans()) and self.draw(st.booleans()) else d for d in shape[drop:]]
        if drop == 0 and len(shape) < 4 and self.draw(st.integers(0, 5)) == 0:
            out = [self.draw(st.integers(1, 3)), *out]
        return tuple(out)

    def pick(self, ok: Callable[[Value], bool], fallback: Callable[[], Value]) -> Value:
        """A value from the pool satisfying ``ok``, or ``fallback()`` (drawn, so it shrinks)."""
        found = [v for v in self.pool if ok(v)]
        i = self.draw(st.integers(0, len(found)))
        return found[i - 1] if i else fallback()

    def positive(self, v: Value, floor: float = 0.05) -> bool:
        return bool(np.all(self.value(v) - 8 * self.error(v) >= floor))

    def away_from_zero(self, v: Value, floor: float = 0.25) -> bool:
        return bool(np.all(np.abs(self.value(v)) - 8 * self.error(v) >= floor))

    def exact(self, v: Value) -> bool:
        return not np.any(self.error(v))

    def admit(self, v: Value) -> None:
        """Put ``v`` in play when its value is finite, in range and well conditioned."""
        val, err = self.value(v), self.error(v)
        fv = val.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            ok = (np.all(np.isfinite(fv)) and np.all(np.abs(fv) <= LIMIT[v.dtype]) and np.all(np.isfinite(err))
                  and np.all(err <= CONDITION * (1 + np.abs(fv))))
        if ok:
            self.pool.append(v)
            self.alive.add(v.id)

    # ------------------------------------------------------------------ ops
    def main_operand(self, op: str, extra: Callable[[Value], bool] = lambda v: True, min_rank: int = 0,
                     domain: str = "any", rank: int | None = None) -> Value:
        dtype = self.dtype if accepts(op, self.dtype) else "float32"

        def ok(v: Value) -> bool:
            in_rank = v.ndim >= min_rank if rank is None else v.ndim == rank
            return accepts(op, v.dtype) and in_rank and extra(v)

        shape = self.shape(min_rank=min_rank) if rank is None else tuple(self.draw(
            st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
        return self.pick(ok, lambda: self.fresh(shape, dtype, domain))

    def op_unary(self, op: str) -> Value:
        extra: Callable[[Value], bool] = lambda v: True
        domain = "any"
        if op in ("log", "sqrt", "rsqrt"):
            extra, domain = self.positive, "positive"
        elif op == "exp":
            extra = lambda v: bool(np.all(self.value(v) <= (6 if v.dtype == "float16" else 20)))
        a = self.main_operand(op, extra, domain=domain)
        if op == "gelu":
            return self.g.gelu(a, approximate=self.draw(st.sampled_from(("none", "tanh"))))
        return getattr(self.g, op)(a)

    def op_binary(self, op: str) -> Value:
        a = self.main_operand(op)
        how = self.draw(st.sampled_from(("fresh", "pool", "scalar")))
        domain = {"div": "nonzero", "pow": "positive"}.get(op, "any")
        if how == "scalar":
            choices = (0.5, -1.5, 2.0, 3.0) if a.dtype in FLOAT_DTYPES else (2, -3, 5)
            b: Any = self.draw(st.sampled_from(choices))
        elif how == "pool":
            b = self.pick(lambda v: v.dtype == a.dtype and _broadcasts(v.shape, a.shape),
                          lambda: self.fresh(self.broadcastable(a.shape), a.dtype, domain))
        else:
            b = self.fresh(self.broadcastable(a.shape), a.dtype, domain)
        if op == "pow":  # base safely positive, exponent small: pow stays finite and well conditioned
            if not self.positive(a, 0.1):
                a = self.fresh(a.shape, a.dtype, "positive")
            if isinstance(b, Value) and not np.all(np.abs(self.value(b)) <= 3):
                b = 2.0
        elif op == "div":
            if isinstance(b, Value) and not (self.away_from_zero(b) if b.dtype in FLOAT_DTYPES
                                             else bool(np.all(self.value(b) != 0))):
                b = self.fresh(self.broadcastable(a.shape), a.dtype, "nonzero")
        elif isinstance(b, Value) and self.draw(st.booleans()):
            a, b = b, a
        return getattr(self.g, op)(a, b)

    def op_matmul(self) -> Value:
        a = self.main_operand("matmul", min_rank=1)
        if "empty-gemm" in KNOWN_BUGS and 0 in a.shape:
            raise GraphError("empty matmul (a known bug: test_found.py)")
        k, n = a.shape[-1], self.draw(st.integers(1, 4))
        form = self.draw(st.sampled_from(("matrix", "vector", "batched")))
        if form == "vector":
            shape: tuple[int, ...] = (k,)
        elif form == "batched" and a.ndim >= 3:
            shape = (*self.broadcastable(a.shape[:-2]), k, n)
        else:
            shape = (k, n)
        b = self.fresh(shape, a.dtype)
        return self.g.matmul(a, b) if self.draw(st.booleans()) or a.ndim < 2 else self.g.matmul(
            self.fresh((n, a.shape[-2]) if a.ndim >= 2 else (n, k), a.dtype), a)

    def op_softmax(self) -> Value:
        a = self.main_operand("softmax", min_rank=1)
        return self.g.softmax(a, axis=self.draw(st.integers(-a.ndim, a.ndim - 1)))

    def op_layer_norm(self) -> Value:
        a = self.main_operand("layer_norm", min_rank=1)
        axis = self.draw(st.integers(-a.ndim, a.ndim - 1))
        norm = a.shape[axis:]
        scale = self.fresh(self.broadcastable(norm) or (1,), a.dtype)
        bias = self.fresh(self.broadcastable(norm), a.dtype) if self.draw(st.booleans()) else None
        eps = self.draw(st.sampled_from((1e-5, 1e-3, 0.1)))
        return self.g.layer_norm(a, scale, bias, axis=axis, eps=eps)

    def op_reduce(self, op: str) -> Value:
        a = self.main_operand(op)
        axes: Any = None
        if a.ndim and self.draw(st.booleans()):
            axes = self.draw(st.lists(st.integers(-a.ndim, a.ndim - 1), min_size=1, max_size=a.ndim,
                                      unique_by=lambda x: x % a.ndim))
            if len(axes) == 1 and self.draw(st.booleans()):
                axes = axes[0]
        return getattr(self.g, op)(a, axes, keepdims=self.draw(st.booleans()))

    def op_reshape(self) -> Value:
        a = self.main_operand("reshape")
        dims = _prime_factors(math.prod(a.shape))
        cut = sorted(self.draw(st.lists(st.integers(0, len(dims)), max_size=3)))
        groups = [math.prod(dims[i:j]) for i, j in zip([0, *cut], [*cut, len(dims)])]
        shape = [d for d in groups if d != 1 or self.draw(st.booleans())]
        if shape and self.draw(st.booleans()):
            shape[self.draw(st.integers(0, len(shape) - 1))] = -1
        return self.g.reshape(a, shape)

    def op_transpose(self) -> Value:
        a = self.main_operand("transpose", min_rank=1)
        perm = self.draw(st.none() | st.permutations(range(a.ndim)))
        return self.g.transpose(a, perm)

    def op_concat(self) -> Value:
        a = self.main_operand("concat", min_rank=1)
        axis = self.draw(st.integers(-a.ndim, a.ndim - 1))
        others: list[Any] = []
        for _ in range(self.draw(st.integers(1, 2))):
            if self.draw(st.booleans()):
                others.append(a)
            else:
                shape = list(a.shape)
                shape[axis] = self.draw(st.integers(1, 3))
                others.append(self.fresh(tuple(shape), a.dtype))
        return self.g.concat([a, *others], axis=axis)

    def op_slice(self) -> Value:
        a = self.main_operand("slice", min_rank=1)
        axes = self.draw(st.lists(st.integers(0, a.ndim - 1), min_size=1, max_size=a.ndim, unique=True))
        starts, ends, steps = [], [], []
        for ax in axes:
            d = a.shape[ax]
            starts.append(self.draw(st.integers(-d - 1, d + 1)))
            ends.append(self.draw(st.integers(-d - 1, d + 1) | st.just(2**62)))
            steps.append(self.draw(st.sampled_from((1, 1, 2, -1, -2, 3))))
        neg_axes = [ax - a.ndim if self.draw(st.booleans()) else ax for ax in axes]
        return self.g.slice(a, starts, ends, neg_axes, steps)

    def op_gather(self) -> Value:
        a = self.main_operand("gather", min_rank=1)
        axis = self.draw(st.integers(-a.ndim, a.ndim - 1))
        n = a.shape[axis]
        if n == 0:
            raise GraphError("gather: empty axis (skipped by the generator)")
        shape = self.shape(max_rank=2)
        idx = self.rng.integers(-n, n, shape).astype(self.draw(st.sampled_from(("int32", "int64"))))
        kind = self.draw(st.sampled_from(("input", "constant")))
        if kind == "input":
            self.count += 1
            name = f"i{self.count}"
            self.inputs[name] = idx
            indices: Any = self.g.input(name, idx.shape, idx.dtype.name)
        else:
            indices = self.g.constant(idx)
        return self.g.gather(a, indices, axis=axis)

    def op_cast(self) -> Value:
        a = self.main_operand("cast")
        targets = ["float32", "float16", "float64"]
        exact_small = self.exact(a) and bool(np.all(np.abs(self.value(a).astype(np.float64)) < 2**20))
        if a.dtype not in FLOAT_DTYPES or (self.allow_int_casts and exact_small):
            targets += ["int32", "int64", "bool"]
        return self.g.cast(a, self.draw(st.sampled_from(targets)))

    def op_where(self) -> Value:
        x = self.main_operand("where")
        y = self.fresh(self.broadcastable(x.shape), x.dtype)
        cond = self.fresh(self.broadcastable(x.shape), "bool", kind=self.draw(st.sampled_from(("input", "constant"))))
        return self.g.where(cond, x, y) if self.draw(st.booleans()) else self.g.where(cond, y, x)

    def op_conv2d(self) -> Value:
        x = self.main_operand("conv2d", rank=4)
        if "empty-gemm" in KNOWN_BUGS and 0 in x.shape:
            raise GraphError("empty conv2d (a known bug: test_found.py)")
        c = x.shape[1]
        groups = self.draw(st.sampled_from([g for g in (1, 2, 3, 4) if c % g == 0]))
        o = groups * self.draw(st.integers(1, 2))
        k = (self.draw(st.integers(1, 3)), self.draw(st.integers(1, 3)))
        w = self.fresh((o, c // groups, *k), x.dtype, kind=self.draw(st.sampled_from(("param", "constant"))))
        b = self.fresh((o,), x.dtype) if self.draw(st.booleans()) else None
        return self.g.conv2d(x, w, b, stride=self.draw(st.integers(1, 2)), padding=self.draw(st.integers(0, 1)),
                             dilation=self.draw(st.integers(1, 2)), groups=groups)

    def op_pool(self, op: str) -> Value:
        x = self.main_operand(op, rank=4)
        kernel = (self.draw(st.integers(1, 3)), self.draw(st.integers(1, 3)))
        kwargs: dict[str, Any] = {"stride": self.draw(st.sampled_from((None, 1, 2))),
                                  "padding": self.draw(st.integers(0, min(kernel) // 2)),
                                  "ceil_mode": self.draw(st.booleans())}
        if op == "avg_pool2d":
            kwargs["count_include_pad"] = self.draw(st.booleans())
        return getattr(self.g, op)(x, kernel, **kwargs)

    def op_global_avg_pool2d(self) -> Value:
        return self.g.global_avg_pool2d(self.main_operand("global_avg_pool2d", rank=4))

    def op_attention(self) -> Value:
        q = self.main_operand("attention", min_rank=2)
        if "empty-gemm" in KNOWN_BUGS and 0 in q.shape:
            raise GraphError("empty attention (a known bug: test_found.py)")
        lk, dv = self.draw(st.integers(1, 4)), self.draw(st.integers(1, 4))
        batch = self.broadcastable(q.shape[:-2]) if q.ndim > 2 else ()
        k = self.fresh((*batch, lk, q.shape[-1]), q.dtype)
        v = self.fresh((*batch, lk, dv), q.dtype)
        form = self.draw(st.sampled_from(("none", "bool", "float")))
        mask = None
        scores = (*np.broadcast_shapes(q.shape[:-2], batch), q.shape[-2], lk)
        if form == "bool":
            m = self.rng.random(scores[-2:]) < 0.6
            m[:, -1] = True  # every query keeps at least one key: no all-masked rows
            mask = self.g.constant(m)
        elif form == "float":
            mask = self.fresh(scores[-2:], q.dtype)
        return self.g.attention(q, k, v, mask, scale=self.draw(st.sampled_from((None, 0.5))))

    def step(self) -> None:
        op = OPS[self.draw(st.integers(0, 2**16 - 1)) % len(OPS)]  # uniform; sampled_from favours the first
        try:
            if op in UNARY:
                v = self.op_unary(op)
            elif op in BINARY:
                v = self.op_binary(op)
            elif op in ("reduce_sum", "reduce_mean", "reduce_max"):
                v = self.op_reduce(op)
            elif op in ("max_pool2d", "avg_pool2d"):
                v = self.op_pool(op)
            else:
                v = getattr(self, f"op_{op}")()
        except GraphError:
            return  # not valid here (e.g. a window larger than the input): draw another op
        self.admit(v)


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return [*out, n] if n > 1 else out


def _still_valid(case: FuzzCase, params: dict[str, np.ndarray]) -> bool:
    """Whether every value in play stays finite and well conditioned with ``params``."""
    tracker = Tracker(case.graph, case.inputs, params)
    try:
        tracker.sync()
    except InputError:  # e.g. an integer division by a permuted param that is now zero
        return False
    for i in case.alive:
        val, err = tracker.values[i].astype(np.float64), tracker.errors[i]
        with np.errstate(invalid="ignore"):
            if not (np.all(np.isfinite(val)) and np.all(np.isfinite(err))
                    and np.all(err <= CONDITION * (1 + np.abs(val)))):
                return False
    return True


@st.composite
def fuzz_cases(draw: Callable[[Any], Any], max_ops: int = 8, allow_int_casts: bool = True) -> FuzzCase:
    """A random valid graph of up to ``max_ops`` ops, its inputs and maybe new param values."""
    b = _Builder(draw, draw(st.integers(0, 2**32 - 1)), draw(st.sampled_from(GRAPH_DTYPES)), allow_int_casts)
    b.pool.append(b.fresh(b.shape(), b.dtype, kind="input"))
    for _ in range(draw(st.integers(1, max_ops))):
        b.step()
    computed = [v for v in b.pool if b.g.node(v.id).op.value not in ("input", "param", "constant")]
    last = computed[-1] if computed else b.pool[-1]
    extra = draw(st.lists(st.sampled_from(b.pool), max_size=2))
    b.g.set_outputs([last, *extra])
    case = FuzzCase(b.g, b.inputs, alive=frozenset(b.alive))
    params = [b.g.node(i) for i in b.g.params]
    if params and draw(st.integers(0, 3)) == 0:
        new = {p.name: b.rng.permutation(np.array(b.g.value(p.id)).reshape(-1)).reshape(p.shape) for p in params}
        if _still_valid(case, new):
            case.new_params = new
    return case
