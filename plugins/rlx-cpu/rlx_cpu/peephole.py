"""One interpreter instruction for each of the activation chains CNNs repeat.

The block interpreter (``native.c``'s ``region_blocks``) runs a program one instruction
at a time over a block of 1024 floats: each instruction loads its operands from memory
and stores its result. ONNX's HardSwish, HardSigmoid and SiLU arrive as chains of plain
ops (``x * sigmoid(x)``; ``max(min(x * a + b, 1), 0)``, times ``x`` for hard-swish), so
MobileNetV3's hard-swish made five passes over every output of its convolutions, and the
interpreter was 14% of the model's time on one core. Here such a chain becomes one
instruction (``silu``, ``hardsigmoid``, ``hardswish``) when its intermediate values are
read by nothing else:

* ``silu``: ``x * sigmoid(x)`` (either order), the same operations in one pass: equal bit
  for bit.
* ``hardsigmoid``: ``max(min(x * a + b, 1), 0)`` or ``min(max(x * a + b, 0), 1)`` with
  ``a``, ``b`` float32 scalars and the bounds constants (the two clamps are the same
  function, NaN included); ``x * a + b`` is one fused multiply-add, within an ulp of the two roundings
  of the separate ops.
* ``hardswish``: ``x * hardsigmoid(x)`` of the same ``x``.

And ``x ** e`` with ``e`` one float32 scalar becomes ``pows``, which reads ``e`` when it
runs and takes products for 2 and 3 (``x * x * x``, within an ulp or two of the power,
as the core's ``simplify`` does for a constant exponent): torch's dynamo exports give
GPT-2's tanh gelu its ``3.0`` as an initializer, a param, so the core could not fold it,
and ``powf`` over the MLP's activations was most of that model's elementwise time.

Programs are in the interpreter's numbering: values ``0 .. n_inputs - 1`` are inputs,
value ``n_inputs + k`` is instruction ``k``'s result; the last instruction is the output.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

__all__ = ["fuse_chains"]

Code = list[tuple[str, tuple[int, ...]]]


def fuse_chains(code: Code, n_inputs: int, scalar: Callable[[int], float | None],
                constant: Callable[[int], float | None]) -> Code:
    """``code`` with its activation chains as single instructions. ``scalar(v)`` is input
    ``v``'s value where it is one float (read by the instruction at run time: a param may
    change it), else None; ``constant(v)`` the same for a value no run can change (the
    clamp's bounds, which the fused instruction has built in)."""
    uses = Counter(a for _, args in code for a in args)
    out = n_inputs + len(code) - 1  # the program's result: never dropped

    def made(v: int, *ops: str) -> tuple[str, tuple[int, ...]] | None:
        """The instruction computing ``v`` if it is one of ``ops``, read once, and not the result."""
        if v < n_inputs or v == out or uses[v] != 1:
            return None
        found = fused.get(v - n_inputs, code[v - n_inputs])
        return found if found[0] in ops else None

    def split(args: tuple[int, ...], want: Callable[[int], bool]) -> tuple[int, int] | None:
        """``(other, matching)`` of a two-operand instruction whose one operand ``want``s."""
        for k in (1, 0):
            if len(args) == 2 and want(args[k]):
                return args[1 - k], args[k]
        return None

    def equals(value: float) -> Callable[[int], bool]:
        return lambda v: constant(v) == value

    def is_scalar(v: int) -> bool:
        return scalar(v) is not None

    fused: dict[int, tuple[str, tuple[int, ...]]] = {}
    dropped: set[int] = set()
    for k, (op, args) in enumerate(code):
        if op in ("max", "min"):  # a clamp to [0, 1] of x * a + b
            inner_op, bound = ("min", 1.0) if op == "max" else ("max", 0.0)
            outer = split(args, equals(0.0 if op == "max" else 1.0))
            inner = made(outer[0], inner_op) if outer else None
            clamp = split(inner[1], equals(bound)) if inner else None
            shift = made(clamp[0], "add") if clamp else None
            plus = split(shift[1], is_scalar) if shift else None
            scale = made(plus[0], "mul") if plus else None
            times = split(scale[1], is_scalar) if scale else None
            if outer and clamp and plus and times:
                fused[k] = ("hardsigmoid", (times[0], times[1], plus[1]))
                dropped |= {outer[0] - n_inputs, clamp[0] - n_inputs, plus[0] - n_inputs}
        elif op == "pow" and len(args) == 2 and scalar(args[1]) is not None:
            fused[k] = ("pows", args)
        elif op == "mul" and len(args) == 2:
            for x, other in (args, args[::-1]):
                gate = made(other, "sigmoid", "hardsigmoid")
                if gate is not None and gate[1][0] == x:
                    fused[k] = ("silu", (x,)) if gate[0] == "sigmoid" else ("hardswish", gate[1])
                    dropped.add(other - n_inputs)
                    break
    if not fused:
        return code
    renumbered: Code = []
    index: dict[int, int] = {}
    for k, instruction in enumerate(code):
        if k in dropped:
            continue
        op, args = fused.get(k, instruction)
        renumbered.append((op, tuple(a if a < n_inputs else index[a] for a in args)))
        index[n_inputs + k] = n_inputs + len(renumbered) - 1
    return renumbered
