"""CUDA C for elementwise programs: one ``cupy.ElementwiseKernel`` body per program.

Pure Python (no CuPy), so that the generated source is tested on hosts without a GPU:
the tests compile it as host C++ with a few shims and compare it with the reference.

Every elementwise op is a program: a plain ``add`` node is the one-instruction program
``(("add", (0, 1), ()),)``, and a ``fused_elementwise`` node carries its program in
``attrs["program"]`` (``rlx_core.passes.internal_ops``). Each instruction becomes one
local variable of its declared dtype, so a float16 region rounds after every op exactly
as the unfused ops would; the arithmetic itself runs in float (double for float64).
CuPy's ``ElementwiseKernel`` does the indexing: it broadcasts the inputs (a bias row, a
scalar) to the output's shape and walks strided arrays, so the body is index-free.

Integer division by zero, undefined in C, sets ``rlx_err[0]`` (``ERR_INT_DIV_ZERO``) so
the executable can raise ``InputError`` after the run, as the reference does. The flag is
a raw *output* parameter: CuPy declares raw inputs ``const``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlx_core.ir.ops import MORE_TRIG_OPS, OpKind
from rlx_core.plugin import Instruction, live_instructions, make_instruction, program_types

__all__ = [
    "CTYPE",
    "PARAM_TYPE",
    "COMPUTE_TYPE",
    "ERR_INT_DIV_ZERO",
    "ERR_GATHER_RANGE",
    "ElementwiseSource",
    "elementwise_source",
    "single_op_program",
    "live_instructions",
]

#: C type holding each IR dtype (``float16`` is CuPy's class, converting to and from float).
CTYPE = {"float16": "float16", "float32": "float", "float64": "double", "int32": "int", "int64": "long long",
         "bool": "bool"}
#: Type names in ``ElementwiseKernel`` parameter lists.
PARAM_TYPE = {"float16": "float16", "float32": "float32", "float64": "float64", "int32": "int32", "int64": "int64",
              "bool": "bool"}
#: Arithmetic type of each dtype (float16 computes in float).
COMPUTE_TYPE = {"float16": "float", "float32": "float", "float64": "double", "int32": "int", "int64": "long long",
                "bool": "bool"}
ERR_INT_DIV_ZERO = 1
ERR_GATHER_RANGE = 2
_SQRT1_2 = 0.7071067811865476
_SQRT_2_PI = 0.7978845608028654


class _Type:
    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype


@dataclass(frozen=True)
class ElementwiseSource:
    """What ``cupy.ElementwiseKernel(in_params, out_params, body, name)`` needs."""

    in_params: str
    out_params: str
    body: str
    name: str
    uses_error_flag: bool
    input_dtypes: tuple[str, ...]
    out_dtype: str
    n_instructions: int


def single_op_program(op: OpKind | str, n_inputs: int, attrs: Any) -> tuple:
    """The one-instruction program of a plain elementwise node."""
    return (make_instruction(op, range(n_inputs), dict(attrs)),)


def _lit(value: float, ct: str) -> str:
    text = repr(float(value))
    return f"{text}f" if ct == "float" else text


def _fn(name: str, ct: str) -> str:
    """The float or double spelling of a C math function (``expf`` / ``exp``)."""
    return f"{name}f" if ct == "float" else name


def _render(ins: Instruction, args: list[str], arg_dtypes: list[str]) -> str:
    """The C expression of one instruction over compute-typed operand expressions."""
    op = ins.op
    src = arg_dtypes[0] if arg_dtypes else ins.dtype
    ct = COMPUTE_TYPE[src if op in (OpKind.CAST, OpKind.EQUAL, OpKind.LESS, OpKind.GREATER) else ins.dtype]
    is_float = ct in ("float", "double")
    a = args[0] if args else ""
    b = args[1] if len(args) > 1 else ""
    if op is OpKind.ADD:
        return f"({a} + {b})"
    if op is OpKind.SUB:
        return f"({a} - {b})"
    if op is OpKind.MUL:
        return f"({a} * {b})"
    if op is OpKind.DIV:
        if is_float:
            return f"({a} / {b})"
        return f"(({b}) == 0 ? (rlx_err[0] = {ERR_INT_DIV_ZERO}, ({ct})0) : ({ct})({a} / {b}))"
    if op is OpKind.POW:
        return f"{_fn('pow', ct)}({a}, {b})"
    if op in (OpKind.MAXIMUM, OpKind.MINIMUM):
        cmp = ">" if op is OpKind.MAXIMUM else "<"
        if is_float:  # numpy propagates NaN from either side
            return f"(({a} != {a} || {a} {cmp} {b}) ? {a} : {b})"
        return f"({a} {cmp} {b} ? {a} : {b})"
    if op is OpKind.NEG:
        return f"(-{a})"
    if op is OpKind.ABS:
        return f"{_fn('fabs', ct)}({a})" if is_float else f"({a} < 0 ? -{a} : {a})"
    if op in (OpKind.EXP, OpKind.LOG, OpKind.SQRT, OpKind.ERF, OpKind.TANH, OpKind.SIN, OpKind.COS, *MORE_TRIG_OPS):
        return f"{_fn(op.value, ct)}({a})"
    if op is OpKind.RSQRT:
        return f"{_fn('rsqrt', ct)}({a})"
    if op is OpKind.SIGMOID:
        one = _lit(1.0, ct)
        return f"({one} / ({one} + {_fn('exp', ct)}(-{a})))"
    if op is OpKind.RELU:
        zero = _lit(0.0, ct) if is_float else "0"
        if is_float:
            return f"(({a} != {a} || {a} > {zero}) ? {a} : {zero})"
        return f"({a} > 0 ? {a} : 0)"
    if op is OpKind.GELU:
        half, one = _lit(0.5, ct), _lit(1.0, ct)
        if ins.attrs.get("approximate", "none") == "tanh":
            inner = f"{_lit(_SQRT_2_PI, ct)} * ({a} + {_lit(0.044715, ct)} * {a} * {a} * {a})"
            return f"({half} * {a} * ({one} + {_fn('tanh', ct)}({inner})))"
        return f"({half} * {a} * ({one} + {_fn('erf', ct)}({a} * {_lit(_SQRT1_2, ct)})))"
    if op is OpKind.CAST:
        target = ins.dtype
        if target == "bool":
            return f"({a} != 0)"
        if src == "bool":
            return f"(({COMPUTE_TYPE[target]})({a} ? 1 : 0))"
        return f"(({COMPUTE_TYPE[target]})({a}))"
    if op is OpKind.WHERE:
        return f"({a} ? {b} : {args[2]})"
    if op is OpKind.EQUAL:
        return f"({a} == {b})"
    if op is OpKind.LESS:
        return f"({a} < {b})"
    if op is OpKind.GREATER:
        return f"({a} > {b})"
    raise NotImplementedError(f"no CUDA rendering for elementwise op {op}")  # pragma: no cover


def _read(name: str, dtype: str) -> str:
    return f"((float){name})" if dtype == "float16" else name


def _store(expr: str, dtype: str) -> str:
    if dtype == "float16":
        return f"float16((float)({expr}))"
    if dtype == "bool":
        return f"(bool)({expr})"
    return f"({CTYPE[dtype]})({expr})"


def elementwise_source(program: Sequence[Any], input_dtypes: Sequence[str],
                       input_shapes: Sequence[tuple[int, ...]] | None = None) -> ElementwiseSource:
    """The kernel for ``program`` over inputs of ``input_dtypes`` (shapes only matter for
    the type check; they default to scalars, which broadcast to anything).

    Inputs are ``x0, x1, ...``, the result ``out``, locals ``v0, v1, ...``; the name is a
    hash of the body, so equal programs share one compiled kernel.
    """
    shapes = list(input_shapes) if input_shapes is not None else [()] * len(input_dtypes)
    ins = [_Type(tuple(s), d) for s, d in zip(shapes, input_dtypes)]
    _, instructions = program_types(OpKind.FUSED_ELEMENTWISE, ins, program)
    n_in = len(ins)
    instructions = live_instructions(instructions, n_in)
    dtypes = list(input_dtypes) + [instr.dtype for instr in instructions]
    names = [f"x{i}" for i in range(n_in)] + [f"v{k}" for k in range(len(instructions))]
    lines = []
    uses_err = False
    for k, instr in enumerate(instructions):
        args = [_read(names[a], dtypes[a]) for a in instr.args]
        expr = _render(instr, args, [dtypes[a] for a in instr.args])
        uses_err = uses_err or "rlx_err" in expr
        lines.append(f"{CTYPE[instr.dtype]} v{k} = {_store(expr, instr.dtype)};")
    out_dtype = instructions[-1].dtype
    lines.append(f"out = v{len(instructions) - 1};")
    used = sorted({a for instr in instructions for a in instr.args if a < n_in})
    params = [f"{PARAM_TYPE[input_dtypes[i]]} x{i}" for i in range(n_in) if i in used]
    # The flag is an *output* (CuPy declares raw inputs const): it comes first, so a call
    # still reads kern(*inputs, flag, out).
    outs = ("raw int32 rlx_err, " if uses_err else "") + f"{PARAM_TYPE[out_dtype]} out"
    body = "\n".join(lines)
    digest = hashlib.sha1(f"{params}|{outs}|{body}".encode()).hexdigest()[:16]
    return ElementwiseSource(", ".join(params), outs, body, f"rlx_ew_{digest}", uses_err,
                             tuple(input_dtypes[i] for i in used), out_dtype, len(instructions))


def used_inputs(source: ElementwiseSource) -> list[int]:
    """Indices of the program inputs the kernel takes (dead instructions' inputs dropped)."""
    out = []
    for part in source.in_params.split(", "):
        name = part.split()[-1] if part else ""
        if name.startswith("x"):
            out.append(int(name[1:]))
    return out
