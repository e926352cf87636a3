"""Conformance cases for the compile pipeline's internal ops, ``gemm`` and ``fused_elementwise``.

A backend that claims them must compute what the reference does: the matmul, bias and
activation of a gemm; the program of a region, instruction by instruction. Programs are
drawn from well-conditioned ops on values in [-2, 2] so that float tolerances hold.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from ..internal_types import make_instruction
from ..ops import OpKind
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
                    Operand("b", _values(rng, (k, n), dtype), param=draw(st.booleans()))]  # fmt: skip
        if draw(st.booleans()):
            operands.append(Operand("bias", _values(rng, _broadcastable(draw, (*batch, m, n)), dtype)))
        acts = ("none", "relu", "tanh", "sigmoid", "gelu", "gelu_tanh") if dtype in FLOATS else ("none", "relu")
        return OpCase(OpKind.GEMM, tuple(operands), {"activation": draw(st.sampled_from(acts))}, terms=k)

    return case()

def fused_cases(seed: int, dtypes: Dtypes) -> st.SearchStrategy[OpCase]:
    @st.composite
    def case(draw: Callable) -> OpCase:
        dtype = draw(st.sampled_from(dtypes))
        base = _shape(draw, 1, 3, 6)
        n_in = draw(st.integers(1, 3))
        rng = _rng(draw, seed)
        shapes = [base] + [_broadcastable(draw, base) for _ in range(n_in - 1)]
        operands = tuple(Operand(f"x{i}", _values(rng, s, dtype), param=i > 0 and draw(st.booleans()))
                         for i, s in enumerate(shapes))  # fmt: skip
        pool = _FLOAT_PROGRAM_OPS if dtype in FLOATS else _INT_PROGRAM_OPS
        program = []
        for k in range(draw(st.integers(1, 4))):
            op = draw(st.sampled_from(pool))
            refs = st.integers(0, n_in + k - 1)
            args = [draw(refs)] if op in _UNARY else [draw(refs), draw(refs)]
            if k == 0 and op not in _UNARY:
                args[0] = 0  # the first input (full shape) reaches the result
            program.append(make_instruction(op, args, {}))
        return OpCase(OpKind.FUSED_ELEMENTWISE, operands, {"program": tuple(program)}, terms=len(program))

    return case()

__all__ = ["gemm_cases", "fused_cases"]
