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
* ``gelu``: ``0.5 x (1 + erf(x / sqrt(2)))`` as torch's exporters write GELU below opset
  20 (``x / 1.4142135``, or ``x * 0.70710677``, then ``erf``, ``+ 1``, ``* x``, ``* 0.5``,
  in either order of the last two): one pass of native.c's ``gelu`` instead of five
  (SegFormer-B0's MLP activations at batch 8, 3.2M elements: 2.7 -> 1.1 ms on the Zen 4),
  within a few ulps of the chain (its own erf).

And ``x ** e`` with ``e`` one float32 scalar becomes ``pows``, which reads ``e`` when it
runs and takes products for 2 and 3 (``x * x * x``, within an ulp or two of the power,
as the core's ``simplify`` does for a constant exponent): torch's dynamo exports give
GPT-2's tanh gelu its ``3.0`` as an initializer, a param, so the core could not fold it,
and ``powf`` over the MLP's activations was most of that model's elementwise time.

Programs are in the interpreter's numbering: values ``0 .. n_inputs - 1`` are inputs,
value ``n_inputs + k`` is instruction ``k``'s result; the last instruction is the output.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

__all__ = ["fuse_chains"]

Code = list[tuple[str, tuple[int, ...]]]


class _Chains:
    """The matching of one program's chains: which instruction computes a value, its
    operands' constants; ``fused`` and ``dropped`` fill as ``fuse_chains`` walks it."""

    def __init__(self, code: Code, n_inputs: int, scalar: Callable[[int], float | None],
                 constant: Callable[[int], float | None]) -> None:
        self.code, self.n_inputs, self.scalar, self.constant = code, n_inputs, scalar, constant
        self.uses = Counter(a for _, args in code for a in args)
        self.out = n_inputs + len(code) - 1  # the program's result: never dropped
        self.fused: dict[int, tuple[str, tuple[int, ...]]] = {}
        self.dropped: set[int] = set()

    def made(self, v: int, *ops: str) -> tuple[str, tuple[int, ...]] | None:
        """The instruction computing ``v`` if it is one of ``ops``, read once, and not the result."""
        if v < self.n_inputs or v == self.out or self.uses[v] != 1:
            return None
        found = self.fused.get(v - self.n_inputs, self.code[v - self.n_inputs])
        return found if found[0] in ops else None

    @staticmethod
    def split(args: tuple[int, ...], want: Callable[[int], bool]) -> tuple[int, int] | None:
        """``(other, matching)`` of a two-operand instruction whose one operand ``want``s."""
        for k in (1, 0):
            if len(args) == 2 and want(args[k]):
                return args[1 - k], args[k]
        return None

    def equals(self, value: float) -> Callable[[int], bool]:
        return lambda v: self.constant(v) == value

    def near(self, value: float) -> Callable[[int], bool]:
        """A constant equal to ``value`` as an exporter wrote it in float32."""
        return lambda v: (c := self.constant(v)) is not None and abs(c - value) <= 1e-6 * value

    def drop(self, *values: int) -> None:
        self.dropped |= {v - self.n_inputs for v in values}

    def hardsigmoid(self, k: int, op: str, args: tuple[int, ...]) -> None:
        """A clamp to [0, 1] of ``x * a + b``, either clamp order."""
        inner_op, bound = ("min", 1.0) if op == "max" else ("max", 0.0)
        outer = self.split(args, self.equals(0.0 if op == "max" else 1.0))
        inner = self.made(outer[0], inner_op) if outer else None
        clamp = self.split(inner[1], self.equals(bound)) if inner else None
        shift = self.made(clamp[0], "add") if clamp else None
        plus = self.split(shift[1], lambda v: self.scalar(v) is not None) if shift else None
        scale = self.made(plus[0], "mul") if plus else None
        times = self.split(scale[1], lambda v: self.scalar(v) is not None) if scale else None
        if outer and clamp and plus and times:
            self.fused[k] = ("hardsigmoid", (times[0], times[1], plus[1]))
            self.drop(outer[0], clamp[0], plus[0])

    def gated(self, k: int, args: tuple[int, ...]) -> None:
        """``x * sigmoid(x)``, ``x * hardsigmoid(x)``, or GELU's erf form ending in a product."""
        for x, other in (args, args[::-1]):
            gate = self.made(other, "sigmoid", "hardsigmoid")
            if gate is not None and gate[1][0] == x:
                self.fused[k] = ("silu", (x,)) if gate[0] == "sigmoid" else ("hardswish", gate[1])
                self.drop(other)
                return
        gelu = self.erf_gelu(args)
        if gelu is not None:
            self.fused[k] = ("gelu", (gelu[0],))
            self.drop(*gelu[1])

    def erf_term(self, v: int) -> tuple[int, set[int]] | None:
        """``(x, values)`` where ``v`` is ``1 + erf(x / sqrt(2))`` (or ``x * (1 / sqrt(2))``)
        and ``values`` the instructions' results it takes, each read once."""
        plus = self.made(v, "add")
        one = self.split(plus[1], self.near(1.0)) if plus else None
        erf = self.made(one[0], "erf") if one else None
        scaled = self.made(erf[1][0], "div", "mul") if erf else None
        if scaled is None:
            return None
        if scaled[0] == "div":
            x = scaled[1][0] if self.near(math.sqrt(2.0))(scaled[1][1]) else None
        else:
            found = self.split(scaled[1], self.near(math.sqrt(0.5)))
            x = found[0] if found else None
        return None if x is None else (x, {v, one[0], erf[1][0]})

    def erf_gelu(self, args: tuple[int, ...]) -> tuple[int, set[int]] | None:
        """``(x, values)`` where ``mul(*args)`` is ``0.5 x (1 + erf(x / sqrt(2)))`` as the
        exporters write GELU: ``(x * term) * 0.5`` or ``(x * 0.5) * term``."""
        half = self.split(args, self.near(0.5))
        product = self.made(half[0], "mul") if half else None
        for x, term in ((product[1], product[1][::-1]) if product else ()):
            found = self.erf_term(term)
            if found is not None and found[0] == x:
                return x, {half[0], *found[1]}
        for a, b in (args, args[::-1]):
            scaled = self.made(a, "mul")
            x_half = self.split(scaled[1], self.near(0.5)) if scaled else None
            found = self.erf_term(b) if x_half else None
            if found is not None and x_half is not None and found[0] == x_half[0]:
                return found[0], {a, *found[1]}
        return None


def fuse_chains(code: Code, n_inputs: int, scalar: Callable[[int], float | None],
                constant: Callable[[int], float | None]) -> Code:
    """``code`` with its activation chains as single instructions. ``scalar(v)`` is input
    ``v``'s value where it is one float (read by the instruction at run time: a param may
    change it), else None; ``constant(v)`` the same for a value no run can change (the
    clamp's bounds, which the fused instruction has built in)."""
    m = _Chains(code, n_inputs, scalar, constant)
    for k, (op, args) in enumerate(code):
        if op in ("max", "min"):
            m.hardsigmoid(k, op, args)
        elif op == "pow" and len(args) == 2 and scalar(args[1]) is not None:
            m.fused[k] = ("pows", args)
        elif op == "mul" and len(args) == 2:
            m.gated(k, args)
    if not m.fused:
        return code
    renumbered: Code = []
    index: dict[int, int] = {}
    for k, instruction in enumerate(code):
        if k in m.dropped:
            continue
        op, args = m.fused.get(k, instruction)
        renumbered.append((op, tuple(a if a < n_inputs else index[a] for a in args)))
        index[n_inputs + k] = n_inputs + len(renumbered) - 1
    return renumbered
