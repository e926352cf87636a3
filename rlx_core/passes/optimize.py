"""Optimizations that keep results equal on every backend.

* ``fold_constants``: a node whose inputs are all constants is computed now, by the
  reference interpreter, and becomes a constant. Params are never folded (``set_param``
  replaces them), nodes that read a param are not either, and a fold that would make a
  constant much larger than its inputs (a broadcast) is skipped.
* ``simplify``: reshape of reshape, reshape to the same shape, transpose of transpose,
  the identity transpose, ``x * 1``, ``x + 0``, ``x - 0``, ``x / 1``, ``x ** 1``,
  ``neg(neg(x))`` and a cast to the dtype already held; ``x ** 2`` and ``x ** 3`` (a scalar
  constant exponent, float32 or float64) become products: a power is a libm call per
  element (GPT-2's tanh gelu spent a third of its time in ``x ** 3``), a product one
  vector instruction, equal to the power within an ulp or two and exact on zeros, signs,
  infinities and NaN. An identity applies only when the
  constant is exactly 1 (or 0) everywhere and the result has ``x``'s shape and dtype, so
  no broadcast or promotion is lost. For floats ``x + 0.0`` is not ``x`` when ``x`` is
  ``-0.0`` (the sum is ``+0.0``), so float addition drops only ``-0.0``; ``x - 0.0`` is
  always exact.
* ``cse``: two nodes with the same op, inputs and attributes are one; equal small
  constants are one.
* ``dce``: nodes no output depends on are dropped (inputs and params always stay).
* ``sink_relu``: ``max_pool2d(relu(x))`` becomes ``relu(max_pool2d(x))`` when the pool
  is the relu's only reader: relu is monotone, so it commutes with a max exactly, and it
  then runs on the pooled tensor (a quarter of the elements for a 2x2 pool). CNNs
  exported from PyTorch have this pattern after every convolution block.
* ``conv_scale``: ``conv2d(x * s, w, b)`` with ``s`` one factor per input channel
  (``(1, C, 1, 1)`` or ``(C, 1, 1)``: a squeeze-excitation block's gate) becomes
  ``conv2d(x, w * s, b)`` when the product is ``x``'s only reader and scaling the weights
  is less than half the work of scaling ``x`` (``O kh kw`` against ``N H W`` per
  channel, twice: a backend may pack run-time weights once more per run): the same sums,
  each term's factors in another order (equal within float rounding). MobileNetV3 and
  EfficientNet gate every block's expanded channels this way before the projection, at
  56x56 down to 14x14: one pass over a few thousand weights instead of hundreds of
  thousands of activations. Ungrouped convolutions only.
* ``conv_taps``: a ``conv2d`` some of whose kernel rows or columns meet only padding at
  every output position (a dilation as large as the feature map: DeepLabV3's atrous
  pyramid runs dilations 12, 24 and 36 over a 14x14 map at 224x224 input, where the
  outer taps of the last two never touch the image) gets a kernel of the taps that do
  (a ``slice`` of its weights: folded for constant weights; for a param, the backend's to
  compute, once per ``set_param`` on the cpu backend, whose kernels' weights are
  residents) and the padding
  that keeps every output where it was: a 3x3 convolution becomes a 1x1, a ninth of the
  work. The dropped terms were products with padding zeros: the sums are the same
  within float rounding (a non-finite weight times a padding zero, NaN, is what the
  crop drops). Only where the new padding is still non-negative.
* ``image_transposes`` (its own module): a sequence moved into an image by a 3-D
  transpose and a reshape, or back, becomes a reshape and the 4-D transpose it is.

A node the user named is never replaced by another (its name may be looked at), and a
graph output is never replaced by a source node (a backend then returns a computed
array, as it would without the pass).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import RlxError
from ..ir import Graph, Node
from ..ir.internal_types import tap_reach
from ..ir.ops import SOURCE_OPS, OpKind
from ..ir.sized import holds_array
from ..ir.symbolic import Sym, known_less
from ..reference import evaluate
from .image_transposes import image_transposes
from .rewrite import Emitter, attrs_key, is_scalar_constant, replace_planned

__all__ = ["fold_constants", "simplify", "cse", "dce", "sink_relu", "conv_taps", "conv_scale", "OPTIMIZE_PASSES"]

Pass = Callable[[Graph], "tuple[Graph, list[str]]"]
FOLD_MAX_ELEMENTS = 1 << 16  # never fold a result larger than this and larger than every input


def _replaceable(graph: Graph, node: Node, by: Node, outputs: frozenset[int]) -> bool:
    """Whether ``cse`` may read ``by`` wherever ``node`` is read. A name does not keep a
    node (an ONNX import names every node after its output: the exporters repeat a
    layer's mask arithmetic in every layer, each copy named), but an output stays a
    node that computes (not a source, which the caller's output list cannot hold) under
    its own name (the output's name is the caller's)."""
    return not (node.id in outputs and (by.op in SOURCE_OPS or by.name != node.name))


# ----------------------------------------------------------------------------- folding
def _fold_value(node: Node, values: list[np.ndarray]) -> np.ndarray | None:
    mini = Graph("fold")
    ids = [mini.constant(v).id for v in values]
    try:
        out = mini.add_node(node.op, ids, node.attrs)
        mini.set_outputs([out])
        with np.errstate(all="ignore"):
            result = evaluate(mini, {})[0]
    except RlxError:  # e.g. integer division by zero: leave it for run time to report
        return None
    return np.asarray(result).astype(node.dtype)


def _foldable(node: Node, ins: list[Node], outputs: frozenset[int]) -> bool:
    if not (ins and all(holds_array(n) for n in ins)) or node.id in outputs or isinstance(node.size, Sym):
        return False  # (a size known only at run time: a slice of a table to ``seq``)
    biggest = max((n.size for n in ins), default=0)
    return (node.size <= biggest or node.size <= 64) and node.size <= max(FOLD_MAX_ELEMENTS, biggest)


def _first_change(graph: Graph, changes: Callable[[Node, list[Node]], bool]) -> bool:
    """Whether a pass would change anything: it copies nodes unchanged up to its first
    change, so the graph as it is shows that first change (``changes(node, inputs)``).
    A pass that finds none returns its input instead of a copy of it."""
    return any(changes(node, [graph.node(i) for i in node.inputs]) for node in graph.nodes
               if node.op not in SOURCE_OPS)


def fold_constants(graph: Graph) -> tuple[Graph, list[str]]:
    outputs = frozenset(graph.outputs)
    if not _first_change(graph, lambda node, ins: _foldable(node, ins, outputs)):
        return graph, []
    em = Emitter(graph)
    notes: list[str] = []
    for node in graph.nodes:
        if node.op in SOURCE_OPS:
            em.copy(node)
            continue
        ins = [em.node(em.mapped[i]) for i in node.inputs]
        if _foldable(node, ins, outputs):
            value = _fold_value(node, [em.out.value(n.id) for n in ins])
            if value is not None:
                em.constant(node, value, name=node.name)
                notes.append(f"folded {node.op} at {node.describe()} into a constant {list(node.shape)}")
                continue
        em.copy(node)
    return em.finish(), notes


# ----------------------------------------------------------------------------- identities
def _compose_perm(inner: tuple[int, ...], outer: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(inner[p] for p in outer)


def _identity_operand(graph: Graph, node: Node, ins: list[Node]) -> Node | None:
    """The operand ``node`` equals exactly, if it is an identity like ``x * 1``."""
    op = node.op
    if op in (OpKind.MUL, OpKind.ADD, OpKind.SUB, OpKind.DIV, OpKind.POW):
        a, b = ins
        is_float = node.dtype.startswith("float")
        zero = -0.0 if is_float else 0  # -0.0 + x == x for every float x, -0.0 included
        candidates = []
        if op is OpKind.MUL:
            candidates = [(a, b, 1), (b, a, 1)]
        elif op is OpKind.ADD:
            candidates = [(a, b, zero), (b, a, zero)]
        elif op is OpKind.SUB:
            candidates = [(a, b, 0)]  # x - (+0.0) == x, and x - (-0.0) == x too
        elif op in (OpKind.DIV, OpKind.POW):
            candidates = [(a, b, 1)]
        for x, c, neutral in candidates:
            if x.shape == node.shape and x.dtype == node.dtype and _is_neutral(graph, c, neutral, op):
                return x
        return None
    if op is OpKind.NEG and ins[0].op is OpKind.NEG:
        return graph.node(ins[0].inputs[0])
    if op is OpKind.CAST and node.attrs["dtype"] == ins[0].dtype:
        return ins[0]
    if op is OpKind.RESHAPE and ins[0].shape == node.shape:
        return ins[0]
    if op is OpKind.TRANSPOSE and node.attrs["perm"] == tuple(range(len(node.shape))):
        return ins[0]
    return None


def _is_neutral(graph: Graph, c: Node, neutral: float, op: OpKind) -> bool:
    if not holds_array(c) or c.size == 0 or c.size > 4096:
        return False
    arr = graph.value(c.id)
    if arr.dtype == np.bool_:
        return False
    if op is OpKind.SUB or (op is OpKind.ADD and arr.dtype.kind != "f"):
        return bool(np.all(arr == 0))
    if op is OpKind.ADD:  # only -0.0 is neutral for float addition
        return bool(np.all(arr == 0) and np.all(np.signbit(arr)))
    return is_scalar_constant(graph, c, neutral)


def _small_power(graph: Graph, node: Node, ins: list[Node]) -> int:
    """2 or 3 when ``node`` is ``x ** 2`` or ``x ** 3`` of float32/float64 ``x`` with a
    scalar constant exponent and ``x``'s own shape (no broadcast to keep), else 0."""
    if node.op is not OpKind.POW or node.dtype not in ("float32", "float64"):
        return 0
    x, c = ins
    if x.shape != node.shape or not holds_array(c):
        return 0
    for power in (2, 3):
        if is_scalar_constant(graph, c, float(power)):
            return power
    return 0


def _simplifiable(graph: Graph, node: Node, ins: list[Node], outputs: frozenset[int]) -> bool:
    """Whether ``simplify`` rewrites ``node`` (its inputs ``ins`` as they stand)."""
    same = _identity_operand(graph, node, ins)
    if same is not None and _replaceable(graph, node, same, outputs):
        return True
    if _small_power(graph, node, ins):
        return True
    return bool(ins) and node.op in (OpKind.RESHAPE, OpKind.TRANSPOSE) and ins[0].op is node.op


def simplify(graph: Graph) -> tuple[Graph, list[str]]:
    outputs = frozenset(graph.outputs)
    if not _first_change(graph, lambda node, ins: _simplifiable(graph, node, ins, outputs)):
        return graph, []
    em = Emitter(graph)
    notes: list[str] = []
    for node in graph.nodes:
        if node.op in SOURCE_OPS:
            em.copy(node)
            continue
        ins = [em.node(em.mapped[i]) for i in node.inputs]
        same = _identity_operand(em.out, node, ins)
        if same is not None and _replaceable(graph, node, same, outputs):
            em.alias(node, same.id)
            notes.append(f"removed {node.op} at {node.describe()} (an identity)")
            continue
        power = _small_power(em.out, node, ins)
        if power:
            x = ins[0].id
            square = em.emit(node, OpKind.MUL, [x, x], {}, node.name if power == 2 else "")
            if power == 3:
                em.emit(node, OpKind.MUL, [square, x], {}, node.name)
            notes.append(f"rewrote pow at {node.describe()} as {power - 1} product(s) (exponent {power})")
            continue
        inner = ins[0] if ins else None
        if node.op is OpKind.RESHAPE and inner is not None and inner.op is OpKind.RESHAPE:
            em.emit(node, OpKind.RESHAPE, [inner.inputs[0]], {"shape": node.attrs["shape"]}, node.name)
            notes.append(f"merged reshape of reshape at {node.describe()}")
            continue
        if node.op is OpKind.TRANSPOSE and inner is not None and inner.op is OpKind.TRANSPOSE:
            perm = _compose_perm(inner.attrs["perm"], node.attrs["perm"])
            base = em.node(inner.inputs[0])
            if perm == tuple(range(len(perm))) and _replaceable(graph, node, base, outputs):
                em.alias(node, base.id)
                notes.append(f"removed transpose of transpose at {node.describe()} (they cancel)")
            else:
                em.emit(node, OpKind.TRANSPOSE, [base.id], {"perm": perm}, node.name)
                notes.append(f"merged transpose of transpose at {node.describe()}")
            continue
        em.copy(node)
    return em.finish(), notes


# ----------------------------------------------------------------------------- cse and dce
def _cse_key(graph: Graph, node: Node, mapped: Callable[[int], int]) -> tuple | None:
    if node.op is OpKind.CONSTANT and not holds_array(node):  # a sized constant: its recipe is its identity
        return ("sized", node.dtype, node.shape, attrs_key(node.attrs))
    if node.op is OpKind.CONSTANT:
        arr = graph.value(node.id)
        return ("constant", node.dtype, node.shape, arr.tobytes()) if node.size <= 4096 else None
    return (node.op.value, tuple(mapped(i) for i in node.inputs), attrs_key(node.attrs))


def _has_duplicate(graph: Graph, outputs: frozenset[int]) -> bool:
    """Whether ``cse`` merges anything: its first merge is of two nodes with the same
    inputs in the graph as it is (a deeper one needs a merge below it first)."""
    seen: dict[tuple, int] = {}
    for node in graph.nodes:
        if node.op in (OpKind.INPUT, OpKind.PARAM):
            continue
        key = _cse_key(graph, node, lambda i: i)
        if key is None:
            continue
        hit = seen.get(key)
        if hit is not None and _replaceable(graph, node, graph.node(hit), outputs):
            return True
        seen.setdefault(key, node.id)
    return False


def cse(graph: Graph) -> tuple[Graph, list[str]]:
    outputs = frozenset(graph.outputs)
    if not _has_duplicate(graph, outputs):
        return graph, []
    em = Emitter(graph)
    seen: dict[tuple, int] = {}
    notes: list[str] = []
    for node in graph.nodes:
        if node.op in (OpKind.INPUT, OpKind.PARAM):
            em.copy(node)
            continue
        key = _cse_key(graph, node, lambda i: em.mapped[i])
        hit = seen.get(key) if key is not None else None
        if hit is not None and _replaceable(graph, node, em.node(hit), outputs):
            em.alias(node, hit)
            if node.op is not OpKind.CONSTANT:
                notes.append(f"merged {node.op} at {node.describe()} with an identical node")
            continue
        new = em.copy(node)
        if key is not None and key not in seen:
            seen[key] = new
    return em.finish(), notes


def dce(graph: Graph) -> tuple[Graph, list[str]]:
    live = graph.live_nodes()
    if all(node.id in live or node.op in (OpKind.INPUT, OpKind.PARAM) for node in graph.nodes):
        return graph, []
    em = Emitter(graph)
    dropped = []
    for node in graph.nodes:
        if node.id in live or node.op in (OpKind.INPUT, OpKind.PARAM):
            em.copy(node)
        elif node.op is not OpKind.CONSTANT:
            dropped.append(node)
    notes = [f"dropped {len(dropped)} node(s) no output depends on: "
             + ", ".join(f"{n.op} at {n.describe()}" for n in dropped[:8])
             + (", ..." if len(dropped) > 8 else "")] if dropped else []
    return em.finish(), notes


def sink_relu(graph: Graph) -> tuple[Graph, list[str]]:
    uses = graph.use_counts()
    outputs = frozenset(graph.outputs)
    sunk = {node.inputs[0] for node in graph.nodes
            if node.op is OpKind.MAX_POOL2D and graph.node(node.inputs[0]).op is OpKind.RELU
            and uses[node.inputs[0]] == 1 and node.inputs[0] not in outputs
            and known_less(node.size, graph.node(node.inputs[0]).size)}
    if not sunk:
        return graph, []
    em = Emitter(graph)
    notes: list[str] = []
    for node in graph.nodes:
        if node.id in sunk:  # its only reader, the pool, reads its input instead
            em.alias(node, em.mapped[node.inputs[0]])
        elif node.op is OpKind.MAX_POOL2D and node.inputs[0] in sunk:
            pooled = em.emit(node, OpKind.MAX_POOL2D, [em.mapped[node.inputs[0]]], node.attrs)
            em.emit(node, OpKind.RELU, [pooled], {}, node.name)
            notes.append(f"moved relu at {graph.node(node.inputs[0]).describe()} after max_pool2d at "
                         f"{node.describe()} ({graph.node(node.inputs[0]).size} -> {node.size} elements)")
        else:
            em.copy(node)
    return em.finish(), notes


def _live_taps(n: int, out: int, taps: int, stride: int, dilation: int, before: int) -> tuple[int, int] | None:
    """``[k0, k1)``: the kernel taps along one axis that meet the image (``n`` positions,
    ``before`` of padding ahead) at some output position; None where they are not one
    run (or none do)."""
    live = [lo < hi for lo, hi in (tap_reach(n, out, k, stride, dilation, before) for k in range(taps))]
    if not any(live):
        return None
    k0 = live.index(True)
    k1 = taps - live[::-1].index(True)
    return (k0, k1) if all(live[k0:k1]) else None


def _cropped(graph: Graph, node: Node) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]] | None:
    """``((k0h, k0w, k1h, k1w), padding)`` for a convolution whose live taps are fewer
    than its kernel's (``conv_taps``), else None."""
    x, w = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    if not all(isinstance(d, int) for d in (*x.shape[2:], *w.shape[2:], *node.shape[2:])) or len(w.shape) != 4:
        return None
    (sh, sw), (dh, dw), pad = node.attrs["stride"], node.attrs["dilation"], node.attrs["padding"]
    bounds, padding = [], [0, 0, 0, 0]
    for axis, (s, d) in enumerate(((sh, dh), (sw, dw))):
        n, k, out = x.shape[2 + axis], w.shape[2 + axis], node.shape[2 + axis]
        live = _live_taps(n, out, k, s, d, pad[axis])
        if live is None:
            return None
        k0, k1 = live
        before = pad[axis] - k0 * d
        after = (out - 1) * s + d * (k1 - k0 - 1) + 1 - n - before
        if before < 0 or after < 0:
            return None
        bounds.append((k0, k1))
        padding[axis], padding[axis + 2] = before, after
    if all(b == (0, w.shape[2 + a]) for a, b in enumerate(bounds)):
        return None
    (k0h, k1h), (k0w, k1w) = bounds
    return (k0h, k0w, k1h, k1w), (padding[0], padding[1], padding[2], padding[3])


def conv_taps(graph: Graph) -> tuple[Graph, list[str]]:
    crops = {node.id: found for node in graph.nodes if node.op is OpKind.CONV2D
             and (found := _cropped(graph, node)) is not None}
    if not crops:
        return graph, []

    def emit(em: Emitter, node: Node, crop: tuple[tuple[int, int, int, int], tuple[int, int, int, int]]) -> str:
        (k0h, k0w, k1h, k1w), padding = crop
        weights = em.emit(node, OpKind.SLICE, [em.mapped[node.inputs[1]]],
                          {"starts": (k0h, k0w), "ends": (k1h, k1w), "axes": (2, 3), "steps": (1, 1)})
        em.emit(node, OpKind.CONV2D, [em.mapped[node.inputs[0]], weights, *(em.mapped[i] for i in node.inputs[2:])],
                {**node.attrs, "padding": padding}, node.name)
        kh, kw = graph.node(node.inputs[1]).shape[2:]
        return (f"cropped the {kh}x{kw} kernel of conv2d at {node.describe()} to its {k1h - k0h}x{k1w - k0w} taps "
                f"that meet the image (dilation {node.attrs['dilation']} on a {graph.node(node.inputs[0]).shape[2:]} "
                f"map; padding {node.attrs['padding']} -> {padding})")

    return replace_planned(graph, set(), crops, emit)


def _channel_scale(graph: Graph, product: Node, conv: Node) -> tuple[int, int] | None:
    """``(x, s)`` where ``product`` (read only by ``conv``, as its input) is ``x * s`` with
    ``s`` one factor per channel of ``x`` and scaling ``conv``'s weights instead is less
    than half the work; else None."""
    if product.op is not OpKind.MUL or conv.attrs.get("groups", 1) != 1 or len(product.shape) != 4:
        return None
    n, c, h, w = product.shape
    weights = graph.node(conv.inputs[1])
    if len(weights.shape) != 4 or weights.shape[1] != c or weights.dtype != product.dtype:
        return None
    o, _, kh, kw = weights.shape
    if 2 * o * kh * kw >= n * h * w:
        return None
    for x_id, s_id in (product.inputs, product.inputs[::-1]):
        x, scale = graph.node(x_id), graph.node(s_id)
        shape = (1,) * (4 - len(scale.shape)) + tuple(scale.shape)
        if x.shape == product.shape and x.dtype == scale.dtype == product.dtype and shape == (1, c, 1, 1):
            return x_id, s_id
    return None


def conv_scale(graph: Graph) -> tuple[Graph, list[str]]:
    uses = graph.use_counts()
    outputs = frozenset(graph.outputs)
    folds: dict[int, tuple[int, int]] = {}  # conv id -> (x, s) of its input product
    for node in graph.nodes:
        if node.op is OpKind.CONV2D and node.inputs[0] not in outputs and uses[node.inputs[0]] == 1:
            found = _channel_scale(graph, graph.node(node.inputs[0]), node)
            if found is not None:
                folds[node.id] = found
    if not folds:
        return graph, []

    def emit(em: Emitter, node: Node, fold: tuple[int, int]) -> str:
        x, s = fold
        scale = em.mapped[s]
        if len(graph.node(s).shape) != 4:
            scale = em.emit(node, OpKind.RESHAPE, [scale], {"shape": (1, graph.node(s).shape[-3], 1, 1)})
        weights = em.emit(node, OpKind.MUL, [em.mapped[node.inputs[1]], scale], {})
        em.emit(node, OpKind.CONV2D, [em.mapped[x], weights, *(em.mapped[i] for i in node.inputs[2:])], node.attrs,
                node.name)
        product = graph.node(node.inputs[0])
        return (f"scaled the weights of conv2d at {node.describe()} by the per-channel factors of mul at "
                f"{product.describe()} ({graph.node(node.inputs[1]).size} instead of {product.size} elements)")

    # each product's only reader, its convolution, scales its weights instead
    return replace_planned(graph, {graph.node(c).inputs[0] for c in folds}, folds, emit)


#: The optimize stage's passes, in order; ``CompileOptions.disable`` names any of them.
OPTIMIZE_PASSES: dict[str, Pass] = {"fold": fold_constants, "simplify": simplify, "cse": cse, "dce": dce,
                                     "sink_relu": sink_relu, "conv_taps": conv_taps, "conv_scale": conv_scale,
                                     "image_transposes": image_transposes}

