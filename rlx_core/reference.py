"""The reference interpreter: the plain numpy meaning of every op.

``evaluate`` is the definition the backends are measured against (by the tests and by
``rlx_core.testing``), so it is written to be obviously right rather than fast: one
short function per op, floats computed in float64, no fusion, no caching. When a backend
and this module disagree, this module is the specification (``docs/ops.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .errors import InputError
from .ir.dtypes import FLOAT_DTYPES, STORAGE_DTYPES
from .ir.internal_types import ACTIVATION_OPS, CONV_ATTRS, conv_inputs
from .ir.ops import NUMPY_NAMES, OpKind
from .ir.staged import StagedGraph
from .ir.valued import ValueDependentGraph

if TYPE_CHECKING:
    from .ir import Graph, Node

__all__ = ["evaluate", "evaluate_node"]

Kernel = Callable[["Node", Sequence[np.ndarray]], np.ndarray]


#: Storage formats as the reference holds them: the floats as float64 (exactly), the 4-
#: and 2-bit integers as int8 and uint8.
_STORAGE_INTS = {"int4": "int8", "uint4": "uint8", "int2": "int8", "uint2": "uint8"}
_STORAGE_FLOATS = frozenset(STORAGE_DTYPES) - set(_STORAGE_INTS)


def _compute_dtype(dtype: str) -> np.dtype:
    """How the reference holds a value of IR dtype ``dtype``: floats as float64."""
    if dtype in FLOAT_DTYPES or dtype in _STORAGE_FLOATS:
        return np.dtype(np.float64)
    return np.dtype(_STORAGE_INTS.get(dtype, dtype))


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Kernel:
    return lambda node, xs: fn(xs[0], xs[1])


def _unary(fn: Callable[[np.ndarray], np.ndarray]) -> Kernel:
    return lambda node, xs: fn(xs[0])


def _pow(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    a, b = xs
    out = np.power(a, b)
    if out.dtype.kind != "f":
        return out
    # IEEE 754 pow (C, ONNX Runtime, XLA, OpenCL, CUDA, and numpy's own float32):
    # (-inf) ** y for a non-integer y is +inf (y > 0) or +0 (y < 0); numpy's float64
    # power alone says NaN there, and the reference computes in float64.
    odd = np.isneginf(a) & (np.floor(b) != b) & ~np.isnan(b)
    if np.any(odd):
        out = np.where(odd, np.where(b > 0, np.inf, 0.0), out)
    return out


def _div(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    a, b = xs
    if a.dtype.kind == "f":
        return a / b
    # Integers truncate toward zero (C, ONNX); computed exactly, never through floats, in
    # the operands' own dtype: numpy's floor quotient, moved one toward zero where the
    # division was inexact and the signs differ. (Through abs() instead, the most negative
    # value of a signed dtype has no absolute value: int8 -128 / 3 would give 43.) For
    # unsigned dtypes floor and truncation agree; MIN / -1 wraps to MIN, as in two's complement.
    if np.any(b == 0):
        raise InputError(f"{node.describe()} (div): integer division by zero")
    q = np.floor_divide(a, b)
    inexact = (a - q * b) != 0
    if a.dtype.kind == "i":
        q = q + (inexact & ((a < 0) != (b < 0))).astype(a.dtype)
    return q.astype(a.dtype, copy=False)


def _fmod(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    """C's ``fmod``: the remainder of truncating division, with the sign of the dividend.
    Floats follow IEEE/C (NaN for an infinite dividend or a zero divisor, the dividend for
    an infinite divisor; exact, so float64 gives every narrower float's answer); integers
    by zero are an error, as in ``div``."""
    a, b = xs
    if a.dtype.kind != "f" and np.any(b == 0):
        raise InputError(f"{node.describe()} (fmod): integer fmod by zero")
    return np.fmod(a, b)


def _bit_shift(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    """Shifts of two's complement bits (ONNX BitShift-28): a left shift drops the bits
    pushed past the top (it wraps), a right shift of a signed value copies the sign bit.
    A shift by a negative amount or by at least the bit width leaves only what the sign
    fill makes: -1 for a right shift of a negative value, 0 otherwise."""
    x, y = xs
    bits = np.iinfo(x.dtype).bits
    valid = (y >= 0) & (y < bits)
    amount = np.where(valid, y, 0).astype(x.dtype)
    if node.op is OpKind.BIT_SHIFT_LEFT:
        return np.where(valid, np.left_shift(x, amount), np.zeros((), x.dtype))
    fill = np.where(x < 0, -1, 0).astype(x.dtype) if np.iinfo(x.dtype).min < 0 else np.zeros((), x.dtype)
    return np.where(valid, np.right_shift(x, amount), fill)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _relu(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    x = xs[0]
    return np.maximum(x, np.zeros((), x.dtype))


def _gelu(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    x = xs[0]
    if node.attrs["approximate"] == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _lowest(dtype: np.dtype) -> Any:
    """The identity of max: what a max over no values is (ONNX ReduceMax: -inf, or the
    dtype's minimum where it has no infinity)."""
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min


def _max(x: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
    return np.max(x, axis=axis, keepdims=keepdims, initial=_lowest(x.dtype))


def _softmax_along(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - _max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _softmax(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    return _softmax_along(xs[0], node.attrs["axis"])


def _layer_norm(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    x = xs[0]
    axes = tuple(range(node.attrs["axis"], x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axes, keepdims=True)  # biased (population) variance
    y = (x - mean) / np.sqrt(var + node.attrs["eps"]) * xs[1]
    return y + xs[2] if len(xs) == 3 else y


def _reduce(fn: Callable[..., np.ndarray]) -> Kernel:
    def kernel(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
        x = xs[0]
        kwargs = {"dtype": x.dtype} if fn is np.sum else {}  # int32 sums stay int32
        return fn(x, axis=node.attrs["axes"], keepdims=node.attrs["keepdims"], **kwargs)

    return kernel


def _slice(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    # Normalized bounds are Python slice bounds: take exactly the indices they list.
    x, a = xs[0], node.attrs
    for axis, start, end, step in zip(a["axes"], a["starts"], a["ends"], a["steps"]):
        picked = range(*slice(start, end, step).indices(x.shape[axis]))
        x = np.take(x, np.asarray(picked, dtype=np.intp), axis=axis)
    return x


def _gather(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    x, idx = xs
    axis = node.attrs["axis"]
    n = x.shape[axis]
    bad = (idx < -n) | (idx >= n)
    if np.any(bad):
        raise InputError(
            f"{node.describe()} (gather): index {int(idx[bad].flat[0])} is out of range for axis {axis} of size {n}"
        )
    return np.take(x, np.where(idx < 0, idx + n, idx), axis=axis)


def _cast(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    target = node.attrs["dtype"]
    # Round through the target precision (float16 rounds like float16), then hold as float64.
    return xs[0].astype(target).astype(_compute_dtype(target))


def _where(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    return np.where(xs[0], xs[1], xs[2])


def _windows(x: np.ndarray, k: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
             out_hw: tuple[int, int]):
    """Yield ``(i, j, view)``: for kernel tap (i, j), the input pixel each output reads."""
    sh, sw = stride
    dh, dw = dilation
    oh, ow = out_hw
    for i in range(k[0]):
        for j in range(k[1]):
            yield i, j, x[:, :, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]


def _pad_to_windows(x: np.ndarray, node: Node, k: tuple[int, int], dilation: tuple[int, int],
                    fill: float) -> np.ndarray:
    """Pad by the declared (top, left, bottom, right) and, past that, by what ceil_mode's
    extra windows need on the bottom/right; every padded position holds ``fill``."""
    top, left, bottom, right = node.attrs["padding"]
    oh, ow = node.shape[2:]
    sh, sw = node.attrs["stride"]
    need_h = (oh - 1) * sh + dilation[0] * (k[0] - 1) + 1
    need_w = (ow - 1) * sw + dilation[1] * (k[1] - 1) + 1
    bottom += max(0, need_h - (x.shape[2] + top + bottom))
    right += max(0, need_w - (x.shape[3] + left + right))
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=fill)


def _conv2d(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    x, w = xs[0], xs[1]
    a = node.attrs
    top, left, bottom, right = a["padding"]
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, o, oh, ow = node.shape
    groups = a["groups"]
    cg, og = x.shape[1] // groups, o // groups
    out = np.zeros((n, o, oh, ow), dtype=np.result_type(x, w))
    for g in range(groups):
        xg = xp[:, g * cg : (g + 1) * cg]
        wg = w[g * og : (g + 1) * og]
        for i, j, patch in _windows(xg, wg.shape[2:], a["stride"], a["dilation"], (oh, ow)):
            out[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    if len(xs) == 3:
        out += xs[2].reshape(1, o, 1, 1)
    return out


def _max_pool2d(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    a = node.attrs
    xp = _pad_to_windows(xs[0], node, a["kernel"], a["dilation"], -np.inf)
    taps = [v for _, _, v in _windows(xp, a["kernel"], a["stride"], a["dilation"], node.shape[2:])]
    return np.maximum.reduce(taps)


def _avg_pool2d(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    """Sum of the window over its divisor. The divisor counts positions inside the input,
    or with ``count_include_pad`` inside the declared padding too; positions that only
    ceil_mode added never count (PyTorch semantics)."""
    x, a = xs[0], node.attrs
    k, (top, left, bottom, right) = a["kernel"], a["padding"]
    xp = _pad_to_windows(x, node, k, (1, 1), 0.0)
    if a["count_include_pad"]:
        declared = np.ones((1, 1, x.shape[2] + top + bottom, x.shape[3] + left + right))
        extra_h, extra_w = xp.shape[2] - declared.shape[2], xp.shape[3] - declared.shape[3]
        inside = np.pad(declared, ((0, 0), (0, 0), (0, extra_h), (0, extra_w)))
    else:
        inside = _pad_to_windows(np.ones((1, 1, *x.shape[2:])), node, k, (1, 1), 0.0)
    total = sum(v for _, _, v in _windows(xp, k, a["stride"], (1, 1), node.shape[2:]))
    count = sum(v for _, _, v in _windows(inside, k, a["stride"], (1, 1), node.shape[2:]))
    return total / count


def _global_avg_pool2d(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    return np.mean(xs[0], axis=(2, 3), keepdims=True)


def _attention(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    q, k, v = xs[:3]
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * node.attrs["scale"]
    if len(xs) == 4:
        mask = xs[3]
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask
    p = _softmax_along(s, -1)
    if node.attrs.get("nan_to_zero"):  # (see rlx_core.ir.ops.OP_EXTENSIONS)
        p = np.where(np.isnan(p), 0.0, p)
    return np.matmul(p, v)


_KERNELS: dict[OpKind, Kernel] = {
    OpKind.MATMUL: _binary(np.matmul),
    OpKind.ADD: _binary(np.add),
    OpKind.SUB: _binary(np.subtract),
    OpKind.MUL: _binary(np.multiply),
    OpKind.DIV: _div,
    OpKind.POW: _pow,
    OpKind.MAXIMUM: _binary(np.maximum),
    OpKind.MINIMUM: _binary(np.minimum),
    OpKind.NEG: _unary(np.negative),
    OpKind.ABS: _unary(np.abs),
    OpKind.EXP: _unary(np.exp),
    OpKind.LOG: _unary(np.log),
    OpKind.SQRT: _unary(np.sqrt),
    OpKind.RSQRT: _unary(lambda x: 1.0 / np.sqrt(x)),
    OpKind.ERF: _unary(_erf),
    OpKind.TANH: _unary(np.tanh),
    OpKind.SIN: _unary(np.sin),
    OpKind.COS: _unary(np.cos),
    **{op: _unary(getattr(np, name)) for op, name in NUMPY_NAMES.items()},
    OpKind.SIGMOID: _unary(lambda x: 1.0 / (1.0 + np.exp(-x))),
    OpKind.RELU: _relu,
    OpKind.GELU: _gelu,
    OpKind.SOFTMAX: _softmax,
    OpKind.LAYER_NORM: _layer_norm,
    OpKind.REDUCE_SUM: _reduce(np.sum),
    OpKind.REDUCE_MEAN: _reduce(np.mean),
    OpKind.REDUCE_MAX: _reduce(_max),
    OpKind.RESHAPE: lambda node, xs: xs[0].reshape(node.attrs["shape"]),
    OpKind.TRANSPOSE: lambda node, xs: np.transpose(xs[0], node.attrs["perm"]),
    OpKind.CONCAT: lambda node, xs: np.concatenate(xs, axis=node.attrs["axis"]),
    OpKind.SLICE: _slice,
    OpKind.GATHER: _gather,
    OpKind.CAST: _cast,
    OpKind.WHERE: _where,
    OpKind.EQUAL: _binary(np.equal),
    OpKind.LESS: _binary(np.less),
    OpKind.GREATER: _binary(np.greater),
    OpKind.FLOOR: _unary(np.floor),
    OpKind.CEIL: _unary(np.ceil),
    OpKind.ROUND: _unary(np.rint),  # half to even, like IEEE roundeven and ONNX Round
    OpKind.FMOD: _fmod,
    OpKind.BITWISE_AND: _binary(np.bitwise_and),
    OpKind.BITWISE_OR: _binary(np.bitwise_or),
    OpKind.BITWISE_XOR: _binary(np.bitwise_xor),
    OpKind.BITWISE_NOT: _unary(np.invert),
    OpKind.BIT_SHIFT_LEFT: _bit_shift,
    OpKind.BIT_SHIFT_RIGHT: _bit_shift,
    OpKind.CONV2D: _conv2d,
    OpKind.MAX_POOL2D: _max_pool2d,
    OpKind.AVG_POOL2D: _avg_pool2d,
    OpKind.GLOBAL_AVG_POOL2D: _global_avg_pool2d,
    OpKind.ATTENTION: _attention,
}


class _PseudoNode(NamedTuple):
    """What a kernel sees of a node: enough to evaluate one instruction."""

    id: int
    op: OpKind
    inputs: tuple[int, ...]
    attrs: dict[str, Any]
    shape: tuple[int, ...]
    dtype: str
    name: str

    def describe(self) -> str:
        return f"node {self.id} {self.name!r}" if self.name else f"node {self.id}"


def _as_compute(x: np.ndarray, dtype: str) -> np.ndarray:
    return x.astype(np.float64 if dtype.startswith("float") else dtype, copy=False)


def evaluate_internal(node: Node, xs: Sequence[np.ndarray], kernels: Mapping[OpKind, Callable[..., np.ndarray]]
                      ) -> np.ndarray:
    """The reference meaning of an internal node, through the reference's own ``kernels``
    (so a region computes exactly what its ops compute one by one)."""
    if node.op is OpKind.GEMM:
        y = kernels[OpKind.MATMUL](node, xs[:2])
        if len(xs) == 3:
            y = y + xs[2]
        spec = ACTIVATION_OPS[node.attrs["activation"]]
        if spec is not None:
            y = kernels[spec[0]](_PseudoNode(node.id, spec[0], (), spec[1], node.shape, node.dtype, node.name), [y])
        return _as_compute(np.asarray(y), node.dtype)
    values = list(xs)
    if node.op is OpKind.FUSED_CONV:  # the convolution, then its epilogue as a region over it
        n_conv = conv_inputs(node.attrs)
        conv_attrs = {k: node.attrs[k] for k in CONV_ATTRS}
        pseudo = _PseudoNode(node.id, OpKind.CONV2D, (), conv_attrs, node.shape, node.dtype, node.name)
        conv = np.asarray(kernels[OpKind.CONV2D](pseudo, list(xs[:n_conv])))
        values = [conv.astype(np.float64, copy=False) if conv.dtype.kind == "f" else conv, *xs[n_conv:]]
    for op, args, attrs in node.attrs["program"]:  # checked when the node was made: replay it
        kind = OpKind(op)
        pseudo = _PseudoNode(node.id, kind, tuple(args), dict(attrs), node.shape, node.dtype, node.name)
        y = np.asarray(kernels[kind](pseudo, [values[a] for a in args]))
        values.append(y.astype(np.float64, copy=False) if y.dtype.kind == "f" else y)
    return values[-1]


def _internal(node: Node, xs: Sequence[np.ndarray]) -> np.ndarray:
    """gemm and fused regions replay the kernels above, instruction by instruction."""
    return evaluate_internal(node, xs, _KERNELS)


_KERNELS[OpKind.GEMM] = _KERNELS[OpKind.FUSED_ELEMENTWISE] = _KERNELS[OpKind.FUSED_CONV] = _internal


def _feed(graph: Graph, inputs: Mapping[str, Any]) -> dict[int, np.ndarray]:
    nodes = graph.nodes
    names = {nodes[i].name: nodes[i] for i in graph.inputs}
    missing = sorted(set(names) - set(inputs))
    unknown = sorted(set(inputs) - set(names))
    if missing or unknown:
        parts = [f"missing {missing}" if missing else "", f"unknown {unknown}" if unknown else ""]
        raise InputError(
            f"graph {graph.name!r}: inputs {' and '.join(p for p in parts if p)}; it takes {sorted(names)}"
        )
    fed = {}
    for name, node in names.items():
        arr = np.asarray(inputs[name])
        if arr.shape != node.shape:
            raise InputError(f"input {name!r}: expected shape {node.shape} {node.dtype}, got {arr.shape} {arr.dtype}")
        if not np.can_cast(arr.dtype, node.dtype, casting="same_kind"):
            raise InputError(f"input {name!r}: expected dtype {node.dtype}, got {arr.dtype}")
        fed[node.id] = arr.astype(node.dtype).astype(_compute_dtype(node.dtype))
    return fed


def _param_overrides(graph: Graph, params: Mapping[str, Any]) -> dict[int, np.ndarray]:
    nodes = {graph.node(i).name: graph.node(i) for i in graph.params}
    unknown = sorted(set(params) - set(nodes))
    if unknown:
        raise InputError(f"graph {graph.name!r} has no param(s) {unknown}; it has {sorted(nodes)}")
    out = {}
    for name, value in params.items():
        node, arr = nodes[name], np.asarray(value)
        if arr.shape != node.shape or arr.dtype != np.dtype(node.dtype):
            raise InputError(f"param {name!r}: expected {node.shape} {node.dtype}, got {arr.shape} {arr.dtype}")
        out[node.id] = arr
    return out


def _static(graph: Graph, inputs: Mapping[str, Any]) -> tuple[Graph, Mapping[str, Any]]:
    """The static graph that runs ``inputs``, and what it takes of them: a
    ``ValueDependentGraph`` built from its value inputs, a symbolic graph specialized to
    the inputs' shapes (``Graph.bind``)."""
    if isinstance(graph, ValueDependentGraph):
        graph, inputs = graph.build(inputs)[1], graph.feed(inputs)
    if graph.is_symbolic:
        names = {graph.node(i).name for i in graph.inputs}
        if names != set(inputs):
            _feed(graph, inputs)  # raises, naming the missing and unknown inputs
        graph = graph.specialize(graph.bind({n: np.shape(inputs[n]) for n in names}))
    return graph, inputs


def _evaluate_stage(stage: Graph, feed: Mapping[str, Any], params: Mapping[str, Any] | None) -> list[np.ndarray]:
    """One stage of a staged graph, its outputs in their declared dtypes (the next stage,
    and a host op, read what a device would hand them), with the ``params`` it holds."""
    if isinstance(stage, StagedGraph):
        return evaluate(stage, feed, params)
    static, feed = _static(stage, feed)
    held = {static.node(i).name for i in static.params}
    outs = evaluate(static, feed, {k: v for k, v in (params or {}).items() if k in held})
    return [out.astype(static.node(i).dtype) for out, i in zip(outs, static.outputs)]


def evaluate_node(node: Node, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``node`` (a computational op, its shape and dtype inferred) on ``arrays``, computed
    exactly as ``evaluate`` computes it inside a graph, returned in the node's dtype.

    The importer folds shape arithmetic with it (``Shape -> Gather -> Concat``): a few
    dozen small folds per model, for which building and evaluating a one-node graph cost
    ~0.2 ms each (the BERT-style encoder of ``bench/dynamic.py``: 30 folds, 6 of the 20 ms
    its conversion took)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        out = _apply(node, [np.asarray(a).astype(_compute_dtype(a.dtype.name)) for a in arrays])
    return out.astype(node.dtype)


def _apply(node: Node, values: Sequence[np.ndarray]) -> np.ndarray:
    """``node``'s kernel on its inputs' values (held as ``_compute_dtype`` holds them)."""
    out = np.asarray(_KERNELS[node.op](node, values))
    if out.shape != node.shape:  # a disagreement between this module and ops.py
        raise AssertionError(f"reference bug: {node.describe()} ({node.op}) gave {out.shape}, not {node.shape}")
    return out


def evaluate(graph: Graph, inputs: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> list[np.ndarray]:
    """Run ``graph`` on ``inputs`` (name -> array-like) and return one array per output.

    Floats are computed and returned in float64 whatever their declared precision (an
    input is first rounded to its declared dtype); int and bool values keep their dtype.
    ``params`` (name -> array of the param's shape and dtype) replaces params' values for
    this call, as ``set_param`` would. A symbolic graph is first specialized to the inputs'
    shapes (``Graph.bind``). Inputs are not modified. Raises ``InputError`` for
    missing or unknown names, a wrong shape, integer division by zero or an out-of-range
    gather index, or integer fmod by zero.
    """
    if isinstance(graph, StagedGraph):  # each stage evaluated in turn, the host ops between
        return graph.run(inputs, lambda _index, stage, feed: _evaluate_stage(stage, feed, params))
    graph, inputs = _static(graph, inputs)
    values = _feed(graph, inputs)
    overrides = _param_overrides(graph, params or {})
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        for node in graph.nodes:
            if node.op is OpKind.INPUT:
                continue
            if node.op in (OpKind.PARAM, OpKind.CONSTANT):
                value = overrides[node.id] if node.id in overrides else graph.value(node.id)
                values[node.id] = np.asarray(value).astype(_compute_dtype(node.dtype))
                continue
            out = _apply(node, [values[i] for i in node.inputs])
            values[node.id] = out.astype(_compute_dtype(node.dtype), copy=False)
    return [np.array(values[i], copy=True) for i in graph.outputs]
