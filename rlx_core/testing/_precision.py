"""The conformance check of a backend's declared reduced precisions (``Backend.precisions``).

A backend that declares ``bf16`` or ``fp16`` promises that, when ``CompileOptions.precision``
allows it, a float32 product it computes is the exact sum of the products of operands each
rounded to that format, accumulated in float32. That promise has a bound the check can hold
every output to, whatever the kernel: with ``u`` the format's unit roundoff (``2**-8`` for
bfloat16, ``2**-11`` for IEEE half) and ``k`` terms per output,

    |got - exact| <= ((1 + u)**2 - 1 + k * 2**-23) * (|a| @ |b|)

elementwise (each operand off by at most ``u`` relative; float32 accumulation off by at most
``k`` of its own roundoffs of the running sum, itself bounded by ``|a| @ |b|``). The check runs
a dense product and, where claimed, a convolution, at each declared precision, against the
float64 reference. A backend that declares nothing is not checked (it computes float32).
"""

from __future__ import annotations

import numpy as np

from .. import reference
from ..ir import Graph
from ..ir.ops import OpKind
from ..options import PRECISIONS
from ..plugin import CompileOptions
from ._checks import CheckSkipped, _Context

__all__ = ["check_precisions", "UNIT_ROUNDOFF", "product_bound"]

#: The unit roundoff of each reduced format (half its machine epsilon).
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}


def product_bound(precision: str, terms: int, magnitude: np.ndarray) -> np.ndarray:
    """The largest error a product of ``terms`` terms per output may have at ``precision``,
    given ``magnitude`` (the same product over the operands' absolute values)."""
    u = UNIT_ROUNDOFF[precision]
    return ((1 + u) ** 2 - 1 + terms * 2.0**-23) * magnitude + 1e-30


def _cases(claimed: frozenset[str]) -> list[tuple[str, Graph, Graph, dict[str, np.ndarray], int]]:
    """(what, graph, the same graph over absolute values, inputs, terms per output)."""
    rng = np.random.default_rng(7)
    cases = []
    if OpKind.MATMUL.value in claimed:
        a = rng.standard_normal((16, 96)).astype(np.float32)
        w = rng.standard_normal((96, 24)).astype(np.float32)
        graphs = []
        for weights in (w, np.abs(w)):
            g = Graph("check_precision_matmul")
            g.set_outputs([g.matmul(g.input("a", a.shape), g.param("w", weights))])
            graphs.append(g.freeze())
        cases.append(("a 16x96 @ 96x24 product", graphs[0], graphs[1], {"a": a}, 96))
    if OpKind.CONV2D.value in claimed:
        x = rng.standard_normal((2, 16, 9, 9)).astype(np.float32)
        w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
        graphs = []
        for weights in (w, np.abs(w)):
            g = Graph("check_precision_conv2d")
            g.set_outputs([g.conv2d(g.input("x", x.shape), g.param("w", weights), padding=1)])
            graphs.append(g.freeze())
        cases.append(("a 16 -> 24 channel 3x3 convolution over 9x9", graphs[0], graphs[1], {"x": x}, 16 * 9))
    return cases


def check_precisions(ctx: _Context) -> str | None:
    """``precisions()`` is a frozenset of reduced formats rlx names, and at each of them a
    product (and a convolution, where claimed) stays within that format's bound of the
    float64 reference (see the module)."""
    declared = ctx.backend.precisions()
    assert isinstance(declared, frozenset), (
        f"{ctx.who}: precisions() must return a frozenset, got {type(declared).__name__}")
    unknown = sorted(repr(p) for p in declared if p not in PRECISIONS or p == "fp32")
    assert not unknown, (f"{ctx.who}: precisions() names {', '.join(unknown)}; reduced precisions are "
                         f"{', '.join(p for p in PRECISIONS if p != 'fp32')}")
    if not declared:
        raise CheckSkipped(f"{ctx.who} declares no reduced precision here: it computes float32")
    ctx.require_available()
    cases = _cases(frozenset(str(o) for o in ctx.backend.supported_ops()))
    if not cases:
        raise CheckSkipped(f"{ctx.who} claims neither matmul nor conv2d: no product to hold to a bound")
    for precision in sorted(declared):
        for what, graph, absolute, inputs, terms in cases:
            where = f"{ctx.who}, {what} at precision {precision}"
            try:
                exe = ctx.backend.compile(graph, CompileOptions(device=ctx.backend.name, precision=precision))
                got = np.asarray(exe.run({k: v.copy() for k, v in inputs.items()})[0])
            except Exception as exc:
                raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from None
            exact = reference.evaluate(graph, inputs)[0]
            magnitude = reference.evaluate(absolute, {k: np.abs(v) for k, v in inputs.items()})[0]
            assert got.shape == exact.shape and got.dtype == np.float32, (
                f"{where}: output {got.dtype}{list(got.shape)}, expected float32{list(exact.shape)}")
            excess = np.abs(got.astype(np.float64) - exact) - product_bound(precision, terms, magnitude)
            worst = int(np.argmax(excess))
            assert excess.flat[worst] <= 0, (
                f"{where}: output {np.unravel_index(worst, got.shape)} is {got.flat[worst]!r}, the exact value "
                f"{exact.flat[worst]!r}: further off than {precision} operands with float32 accumulation allow")
    return f"within bounds at {', '.join(sorted(declared))}"
