"""Conformance cases for the compile pipeline's internal ops, ``gemm``,
``fused_elementwise`` and ``fused_conv``.

A backend that claims them must compute what the reference does: the matmul, bias and
activation of a gemm; the program of a region, instruction by instruction; a
convolution, then its epilogue program over the result. Programs are drawn from
well-conditioned ops on values in [-2, 2] so that float tolerances hold.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from ..ir.internal_types import CONV_ATTRS, make_instruction
from ..ir.ops import OpKind
from ._case_base import FLOATS, Dtypes, OpCase, Operand, _broadcastable, _rng, _shape, _values

_INT_PROGRAM_OPS = ("add", "sub", "mul", "maximum", "minimum", "neg", "abs", "relu")
_FLOAT_PROGRAM_OPS = (*_INT_PROGRAM_OPS, "tanh", "sigmoid")
_UNARY = frozenset({"neg", "abs", "relu", "tanh", "sigmoid"})

def gemm_cases(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        batch = _shape(draw, 0, 2, 3)
        m, k, n = (draw(st.integers(1, 6)) for _ in range(3))
        rng = _rng(draw, seed)
        operands = [Operand("a", _values(rng, (*batch, m, k), dtype)),
                    Operand("b", _values(rng, (k, n), dtype), param=draw(st.booleans()))]
        if draw(st.booleans()):
            operands.append(Operand("bias", _values(rng, _broadcastable(draw, (*batch, m, n)), dtype)))
        acts = ("none", "relu", "tanh", "sigmoid", "gelu", "gelu_tanh") if dtype in FLOATS else ("none", "relu")
        return OpCase(OpKind.GEMM, tuple(operands), {"activation": draw(st.sampled_from(acts))}, terms=k)

    return case()

def _program(draw: Callable, dtype: str, n_in: int, chain: bool = False) -> tuple:
    """A program of 1 to 4 instructions over ``n_in`` values; the first binary one reads
    value 0 (of the result's full shape). With ``chain`` every instruction reads the one
    before (the first, value 0), so the result has value 0's shape and depends on it."""
    pool = _FLOAT_PROGRAM_OPS if dtype in FLOATS else _INT_PROGRAM_OPS
    program = []
    for k in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(pool))
        refs = st.integers(0, n_in + k - 1)
        args = [draw(refs)] if op in _UNARY else [draw(refs), draw(refs)]
        if chain:
            args[0] = n_in + k - 1 if k else 0
        elif k == 0 and op not in _UNARY:
            args[0] = 0  # the first input (full shape) reaches the result
        program.append(make_instruction(op, args, {}))
    return tuple(program)


def fused_cases(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        base = _shape(draw, 1, 3, 6)
        n_in = draw(st.integers(1, 3))
        rng = _rng(draw, seed)
        shapes = [base] + [_broadcastable(draw, base) for _ in range(n_in - 1)]
        operands = tuple(Operand(f"x{i}", _values(rng, s, dtype), param=i > 0 and draw(st.booleans()))
                         for i, s in enumerate(shapes))
        program = _program(draw, dtype, n_in)
        return OpCase(OpKind.FUSED_ELEMENTWISE, operands, {"program": program}, terms=len(program))

    return case()


def fused_conv_cases(conv_cases: Callable[[int, Dtypes], st.SearchStrategy[OpCase]]
                     ) -> Callable[[int, Dtypes], st.SearchStrategy[OpCase]]:
    """Cases of ``fused_conv`` from the kit's ``conv2d`` cases: each convolution gets an
    epilogue program over its result and up to two more operands, of its full shape or
    broadcasting to it (a residual, a per-channel scale)."""

    def factory(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
        @st.composite
        def case(draw: Callable) -> OpCase:
            conv = draw(conv_cases(seed, dtypes))
            conv_ops = conv.operands
            dtype = conv_ops[0].array.dtype.name
            shape = conv.build()[1].shape
            rng = _rng(draw, seed)
            extra = tuple(Operand(f"e{i}", _values(rng, _broadcastable(draw, tuple(shape)), dtype),
                                  param=draw(st.booleans())) for i in range(draw(st.integers(0, 2))))
            program = _program(draw, dtype, 1 + len(extra), chain=True)
            attrs = {**{k: conv.attrs[k] for k in CONV_ATTRS}, "bias": len(conv_ops) == 3, "program": program}
            return OpCase(OpKind.FUSED_CONV, (*conv_ops, *extra), attrs, terms=conv.terms * (1 + len(program)))

        return case()

    return factory

__all__ = ["gemm_cases", "fused_cases", "fused_conv_cases"]
