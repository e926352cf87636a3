"""The internal ops' type rules and the fused program format (no graph, no passes).

Kept apart from ``passes/internal_ops.py`` (their meaning and expansion, which build
graphs) so that the IR can check an internal node without importing the passes, and
``ops.py`` need not know them: ``ops.infer`` types the user's ops, ``infer_any`` every op.

``gemm`` is ``activation(matmul(a, b) + bias)`` in one node, so that a backend can apply
the bias and the activation to the product while it is still in cache. Its attribute
``activation`` is one of ``GEMM_ACTIVATIONS``; the bias (optional third input) must
broadcast to the product's shape without growing it.

``fused_elementwise`` is a region of elementwise ops evaluated as one node. Its attribute
``program`` is a tuple of instructions ``(op, args, attrs)``: ``op`` an elementwise
``OpKind`` value, ``args`` indices into the node's inputs followed by earlier
instructions' results (index ``len(inputs) + k`` is instruction ``k``), ``attrs`` the
op's attributes as sorted ``(key, value)`` pairs. The last instruction is the result.
Programs are plain tuples of strings and ints so that they survive JSON unchanged.

``fused_conv`` is ``conv2d`` followed by an elementwise epilogue (an activation, a
residual add) in one node, so that a backend can apply the epilogue to each part of the
output while the convolution still has it in cache. Its inputs are the convolution's
(``x``, ``w``, then the bias when the attribute ``bias`` is true) followed by the
epilogue's other operands; its attributes are ``conv2d``'s, ``bias`` and ``program``: a
``fused_elementwise`` program whose value 0 is the convolution's result and values 1...
the epilogue's operands. The program's result has the convolution's shape.

None of them has a builder method: users do not write them, but a graph file may hold one,
so they are checked like any node (here), evaluated by the reference, and *expanded*
back into the ops they stand for when a backend does not claim them
(``passes/internal_ops.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import GraphError
from .ops import ELEMENTWISE_OPS, INTERNAL_OPS, OpKind, broadcast_shapes, infer

__all__ = [
    "CONV_ATTRS",
    "conv_inputs",
    "tap_reach",
    "GEMM_ACTIVATIONS",
    "ACTIVATION_OPS",
    "MAX_PROGRAM_LENGTH",
    "Instruction",
    "infer_any",
    "infer_internal",
    "program_types",
    "make_instruction",
    "live_instructions",
]

#: gemm activations and the elementwise op (with attributes) each one applies.
ACTIVATION_OPS: dict[str, tuple[OpKind, dict[str, Any]] | None] = {
    "none": None,
    "relu": (OpKind.RELU, {}),
    "gelu": (OpKind.GELU, {"approximate": "none"}),
    "gelu_tanh": (OpKind.GELU, {"approximate": "tanh"}),
    "sigmoid": (OpKind.SIGMOID, {}),
    "tanh": (OpKind.TANH, {}),
}
GEMM_ACTIVATIONS: tuple[str, ...] = tuple(ACTIVATION_OPS)
MAX_PROGRAM_LENGTH = 4096  # a bound on hostile files, far above any fusion limit


class Instruction(NamedTuple):
    """One normalized instruction of a ``fused_elementwise`` program."""

    op: OpKind
    args: tuple[int, ...]
    attrs: dict[str, Any]
    shape: tuple[int, ...]
    dtype: str


class _Type(NamedTuple):
    shape: tuple[int, ...]
    dtype: str


def make_instruction(op: OpKind | str, args: Sequence[int], attrs: Mapping[str, Any]) -> tuple:
    """The canonical (JSON-stable) form of one instruction."""
    return (OpKind(op).value, tuple(int(a) for a in args), tuple(sorted((str(k), v) for k, v in attrs.items())))


def _fail(op: OpKind, msg: str) -> GraphError:
    return GraphError(f"{op}: {msg}")


def _pairs(op: OpKind, k: int, raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        pairs = [tuple(p) for p in raw]
    except TypeError:
        raise _fail(op, f"instruction {k}: attrs must be (key, value) pairs, got {raw!r}") from None
    if not all(len(p) == 2 and isinstance(p[0], str) for p in pairs):
        raise _fail(op, f"instruction {k}: attrs must be (key, value) pairs, got {raw!r}")
    return dict(pairs)  # type: ignore[arg-type]


#: ``program_types``' answers by (op, input types, ``repr`` of the program): the fusion
#: passes type the same short program many times (mobilenet_v2: 160 programs typed, 29
#: distinct), and each typing runs every instruction's shape rule. ``repr`` tells ``1`` from
#: ``1.0`` and ``True`` where equality would not; a program whose ``repr`` is abridged (a
#: large array attribute) is typed afresh. Cleared when full.
_TYPED: dict[tuple, tuple[tuple, list[Instruction]]] = {}
_TYPED_MAX = 4096


def program_types(op: OpKind, ins: Sequence[Any], program: Any) -> tuple[tuple, list[Instruction]]:
    """Check ``program`` over inputs ``ins`` (anything with shape and dtype); return its
    canonical form and every instruction's normalized attrs, shape and dtype."""
    text = repr(program)
    if "..." in text:
        return _program_types(op, ins, program)
    key = (op, tuple((tuple(t.shape), t.dtype) for t in ins), text)
    found = _TYPED.get(key)
    if found is None:
        found = _program_types(op, ins, program)
        if len(_TYPED) >= _TYPED_MAX:
            _TYPED.clear()
        _TYPED[key] = found
    return found[0], [i._replace(attrs=dict(i.attrs)) for i in found[1]]  # (a caller may edit its attrs)


def _program_types(op: OpKind, ins: Sequence[Any], program: Any) -> tuple[tuple, list[Instruction]]:
    if isinstance(program, (str, bytes)) or not isinstance(program, Sequence) or not program:
        raise _fail(op, f"program must be a non-empty sequence of instructions, got {program!r}")
    if len(program) > MAX_PROGRAM_LENGTH:
        raise _fail(op, f"program has {len(program)} instructions, over the limit of {MAX_PROGRAM_LENGTH}")
    types: list[Any] = [_Type(tuple(t.shape), t.dtype) for t in ins]
    canonical, out = [], []
    for k, raw in enumerate(program):
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence) or len(raw) != 3:
            raise _fail(op, f"instruction {k} must be (op, args, attrs), got {raw!r}")
        name, args, attrs = raw
        try:
            sub = OpKind(name)
        except ValueError:
            raise _fail(op, f"instruction {k} has unknown op {name!r}") from None
        if sub not in ELEMENTWISE_OPS:
            raise _fail(op, f"instruction {k}: {sub} is not an elementwise op")
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise _fail(op, f"instruction {k}: args must be a sequence of ints, got {args!r}")
        for a in args:
            if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < len(types):
                raise _fail(op, f"instruction {k} ({sub}) refers to {a!r}; valid: 0..{len(types) - 1} "
                                f"({len(ins)} inputs, then earlier instructions)")
        try:
            norm, shape, dtype = infer(sub, [types[a] for a in args], _pairs(op, k, attrs))
        except GraphError as exc:
            raise _fail(op, f"instruction {k}: {exc}") from None
        types.append(_Type(tuple(shape), dtype))
        out.append(Instruction(sub, tuple(args), norm, tuple(shape), dtype))
        canonical.append(make_instruction(sub, args, norm))
    return tuple(canonical), out


def live_instructions(instructions: Sequence[Instruction], n_in: int) -> list[Instruction]:
    """The instructions a program's result depends on, renumbered (argument ``n_in + k``
    is the k-th kept instruction). Only these are sure to broadcast to the result's shape
    (a dead one may be larger), so a backend runs only these."""
    live = {n_in + len(instructions) - 1}
    for k in range(len(instructions) - 1, -1, -1):
        if n_in + k in live:
            live.update(instructions[k].args)
    if len(live) - sum(1 for v in live if v < n_in) == len(instructions):
        return list(instructions)
    remap = {i: i for i in range(n_in)}
    kept: list[Instruction] = []
    for k, instr in enumerate(instructions):
        if n_in + k in live:
            remap[n_in + k] = n_in + len(kept)
            kept.append(instr._replace(args=tuple(remap[a] for a in instr.args)))
    return kept


def _infer_gemm(op: OpKind, ins: Sequence[Any], attrs: dict[str, Any]) -> tuple[dict[str, Any], tuple, str]:
    if not 2 <= len(ins) <= 3:
        raise _fail(op, f"takes 2 or 3 inputs (a, b, bias), got {len(ins)}")
    extra = set(attrs) - {"activation"}
    if extra:
        raise _fail(op, f"unknown attribute(s) {sorted(extra)}; allowed: ['activation']")
    act = attrs.get("activation", "none")
    if act not in ACTIVATION_OPS:
        raise _fail(op, f"activation must be one of {list(GEMM_ACTIVATIONS)}, got {act!r}")
    _, shape, dtype = infer(OpKind.MATMUL, ins[:2], {})
    if len(ins) == 3:
        bias = ins[2]
        if bias.dtype != dtype:
            raise _fail(op, f"bias dtype {bias.dtype} differs from the product's {dtype}")
        if broadcast_shapes(op, shape, tuple(bias.shape)) != tuple(shape):
            raise _fail(op, f"bias shape {tuple(bias.shape)} does not broadcast to the product shape {tuple(shape)}")
    spec = ACTIVATION_OPS[act]
    if spec is not None:
        infer(spec[0], [_Type(tuple(shape), dtype)], spec[1])  # gelu/sigmoid/tanh need a float dtype
    return {"activation": act}, tuple(shape), dtype


def _infer_fused(op: OpKind, ins: Sequence[Any], attrs: dict[str, Any]) -> tuple[dict[str, Any], tuple, str]:
    extra = set(attrs) - {"program"}
    if extra:
        raise _fail(op, f"unknown attribute(s) {sorted(extra)}; allowed: ['program']")
    if "program" not in attrs:
        raise _fail(op, "needs a program")
    if not ins:
        raise _fail(op, "needs at least one input")
    canonical, instructions = program_types(op, ins, attrs["program"])
    last = instructions[-1]
    return {"program": canonical}, last.shape, last.dtype


#: conv2d's attributes, which fused_conv carries as they are.
CONV_ATTRS: tuple[str, ...] = ("stride", "padding", "dilation", "groups")


def conv_inputs(attrs: Mapping[str, Any]) -> int:
    """How many of a ``fused_conv`` node's inputs are the convolution's (2, or 3 with its bias)."""
    return 3 if attrs.get("bias") else 2


def tap_reach(size: int, out: int, tap: int, stride: int, dilation: int, before: int) -> tuple[int, int]:
    """The outputs ``[lo, hi)`` (of ``out`` along one axis) whose window's ``tap`` reads
    inside an input of ``size`` positions with ``before`` of padding ahead; ``lo == hi``
    where none does. What the core's tap cropping and a backend's border-only taps (an
    atrous convolution's) both ask."""
    offset = tap * dilation - before  # output q reads input q * stride + offset
    lo = min(out, max(0, -(offset // stride)))  # the first q with q * stride + offset >= 0
    hi = min(out, (size - 1 - offset) // stride + 1) if offset <= size - 1 else 0
    return lo, max(lo, hi)


def _infer_fused_conv(op: OpKind, ins: Sequence[Any], attrs: dict[str, Any]) -> tuple[dict[str, Any], tuple, str]:
    extra = set(attrs) - {*CONV_ATTRS, "bias", "program"}
    if extra:
        raise _fail(op, f"unknown attribute(s) {sorted(extra)}; allowed: {[*CONV_ATTRS, 'bias', 'program']}")
    if not isinstance(attrs.get("bias", False), bool):
        raise _fail(op, f"bias must be a bool, got {attrs['bias']!r}")
    if "program" not in attrs:
        raise _fail(op, "needs a program")
    n_conv = conv_inputs(attrs)
    if len(ins) < n_conv:
        raise _fail(op, f"needs x, w{' and the bias' if n_conv == 3 else ''} first, got {len(ins)} input(s)")
    try:
        conv_attrs, shape, dtype = infer(OpKind.CONV2D, ins[:n_conv], {k: attrs[k] for k in CONV_ATTRS if k in attrs})
    except GraphError as exc:
        raise _fail(op, str(exc)) from None
    canonical, instructions = program_types(op, [_Type(tuple(shape), dtype), *ins[n_conv:]], attrs["program"])
    last = instructions[-1]
    if tuple(last.shape) != tuple(shape):
        raise _fail(op, f"the epilogue's result has shape {tuple(last.shape)}, not the convolution's {tuple(shape)}")
    return {**conv_attrs, "bias": n_conv == 3, "program": canonical}, tuple(shape), last.dtype


def infer_internal(op: OpKind, ins: Sequence[Any], attrs: Mapping[str, Any]) -> tuple[dict[str, Any], tuple, str]:
    """``ops.infer`` for the internal ops (``infer_any`` takes every op)."""
    if op is OpKind.GEMM:
        return _infer_gemm(op, ins, dict(attrs))
    if op is OpKind.FUSED_ELEMENTWISE:
        return _infer_fused(op, ins, dict(attrs))
    if op is OpKind.FUSED_CONV:
        return _infer_fused_conv(op, ins, dict(attrs))
    raise _fail(op, "not an internal op")


def infer_any(op: OpKind, ins: Sequence[Any], attrs: Mapping[str, Any]) -> tuple[Mapping[str, Any], tuple, str]:
    """The type rule of any computational op, internal ones included: the graph's single
    door (``Graph.add_node``) asks this."""
    return infer_internal(op, ins, attrs) if op in INTERNAL_OPS else infer(op, ins, attrs)
