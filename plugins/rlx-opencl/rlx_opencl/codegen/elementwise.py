"""Fused elementwise regions: a tree of elementwise nodes becomes one kernel.

The planner picks the region (a root plus the producers only it consumes, all of the
root's shape); this module writes the kernel. Operands from outside the region are read
with numpy broadcasting, the index arithmetic folded from constant shapes.

Float regions are vectorized: each work-item computes ``width`` consecutive outputs as
one OpenCL vector (``float16``: 16 floats), since PoCL runs scalar transcendental kernels
about 15x slower than the same math on vectors. A vector covers lanes that differ only in
the last coordinate, so it applies when every operand is full-size, a single element, or
(when the last dimension is a multiple of the width) broadcast over leading dimensions
only; other regions, and integer or bool ones, run one element per work-item. Vectors
are at most ``vector_bits`` wide (``float8`` where the device cannot take 512 bits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlx_core.ir import Node
from rlx_core.ir.ops import BITWISE_OPS, MORE_TRIG_OPS, OpKind

from .common import (
    COMPUTE,
    CTYPE_BYTES,
    MAX_VECTOR_BITS,
    SIGNED_CTYPES,
    Arg,
    Kernel,
    broadcast_offset,
    coords,
    header,
    literal,
    load,
    loadv,
    param_decl,
    store,
    storev,
    vector_lanes,
)

__all__ = ["elementwise_kernel", "op_expression", "region_inputs", "VECTOR_WIDTH"]

#: Lanes per work-item for vectorized regions, by compute type (at most: see vector_bits).
VECTOR_WIDTH = {"float": 16, "double": 8}
_FLOAT_FAMILIES = ({"float32", "float16"}, {"float64"})
_COMPARE = {"equal": "==", "less": "<", "greater": ">"}


def _int_div(a: str, b: str, ctype: str, status: str | None) -> str:
    """C's integer division, which truncates toward zero like the reference, guarded: a
    zero divisor records ``status`` and gives 0, and a signed MIN / -1 (a CPU trap) wraps
    to MIN as two's complement does. Narrow types divide promoted to int: the cast back
    keeps the low bits."""
    zero = f"({status}, ({ctype})0)" if status else f"(({ctype})0)"
    if ctype not in SIGNED_CTYPES:
        return f"(({b}) == 0 ? {zero} : ({ctype})(({a}) / ({b})))"
    return f"(({b}) == 0 ? {zero} : ({b}) == -1 ? ({ctype})(-({a})) : ({ctype})(({a}) / ({b})))"


_BITWISE = {OpKind.BITWISE_AND: "&", OpKind.BITWISE_OR: "|", OpKind.BITWISE_XOR: "^"}
#: OpenCL C's function for an op of another name: round to nearest, ties to even, is
#: ``rint`` in the default rounding mode (as numpy's ``round``; OpenCL's ``round`` takes
#: ties away from zero).
_C_NAMES = {OpKind.ROUND: "rint"}


def _bitwise(op: OpKind, a: str, b: str, ctype: str) -> str:
    """The bitwise ops on integers (promoted as C does, then narrowed back), and ONNX's
    BitShift on two's complement bits as the reference (``reference._bit_shift``): a left
    shift wraps (done unsigned: a signed one past the top is undefined in C), a right shift
    of a signed value copies the sign bit, and a shift by a negative amount or by the width
    or more leaves only the sign fill (OpenCL C would take the amount modulo the width)."""
    if op in _BITWISE:
        return f"(({ctype})({a} {_BITWISE[op]} {b}))"
    if op is OpKind.BITWISE_NOT:
        return f"(({ctype})(~{a}))"
    bits = 8 * CTYPE_BYTES[ctype]
    valid = f"(({b}) >= 0 && ({b}) < {bits})" if ctype in SIGNED_CTYPES else f"(({b}) < {bits})"
    if op is OpKind.BIT_SHIFT_LEFT:
        unsigned = ctype if ctype.startswith("u") else f"u{ctype}"
        return f"({valid} ? ({ctype})(({unsigned})({a}) << ({b})) : ({ctype})0)"
    fill = f"(({a}) < 0 ? ({ctype})-1 : ({ctype})0)" if ctype in SIGNED_CTYPES else f"({ctype})0"
    return f"({valid} ? ({ctype})(({a}) >> ({b})) : {fill})"


def op_expression(node: Node, xs: Sequence[str], ctype: str, *, vector: bool = False,
                  status: str | None = None) -> str:
    """The OpenCL C expression of elementwise ``node`` on operand expressions ``xs``
    (compute types; float vectors when ``vector``). ``status`` is the expression that
    records an integer division by zero (``None``: unchecked)."""
    op = node.op
    one = literal(1.0, ctype)
    half = literal(0.5, ctype)
    a = xs[0]
    b = xs[1] if len(xs) > 1 else ""
    is_float = ctype in ("float", "double")
    if op is OpKind.ADD:
        return f"({a} + {b})"
    if op is OpKind.SUB:
        return f"({a} - {b})"
    if op is OpKind.MUL:
        return f"({a} * {b})"
    if op is OpKind.DIV:
        return f"({a} / {b})" if is_float else _int_div(a, b, ctype, status)
    if op is OpKind.POW:
        return f"pow({a}, {b})"
    if op in (OpKind.MAXIMUM, OpKind.MINIMUM):
        fn = "max" if op is OpKind.MAXIMUM else "min"
        if not is_float:
            return f"{fn}({a}, {b})"
        if vector:  # NaN propagates, as numpy's
            return f"select(f{fn}({a}, {b}), {a} + {b}, isnan({a}) | isnan({b}))"
        return f"((isnan({a}) || isnan({b})) ? {a} + {b} : f{fn}({a}, {b}))"
    if op is OpKind.NEG:
        return f"(-{a})"
    if op is OpKind.ABS:
        return f"fabs({a})" if is_float else f"(({a}) < 0 ? -({a}) : ({a}))"
    if op is OpKind.TANH:  # PoCL's tanh(+-inf) is not exactly +-1 (then -inf * (1 + tanh) is -inf, not NaN)
        return f"select(tanh({a}), copysign({one}, {a}), isinf({a}))" if vector else \
            f"(isinf({a}) ? copysign({one}, {a}) : tanh({a}))"
    if op in (OpKind.EXP, OpKind.LOG, OpKind.SQRT, OpKind.RSQRT, OpKind.ERF, OpKind.SIN, OpKind.COS, *MORE_TRIG_OPS,
              OpKind.FLOOR, OpKind.CEIL, OpKind.ROUND):
        return f"{_C_NAMES.get(op, op.value)}({a})"
    if op is OpKind.SIGMOID:
        return f"({one} / ({one} + exp(-{a})))"
    if op is OpKind.RELU:
        if not is_float:
            return f"max({a}, ({ctype})0)"
        if vector:
            return f"select(fmax({a}, {literal(0.0, ctype)}), {a}, isnan({a}))"
        return f"(isnan({a}) ? {a} : fmax({a}, {literal(0.0, ctype)}))"
    if op is OpKind.GELU:
        if node.attrs["approximate"] == "tanh":
            c, k = literal(math.sqrt(2.0 / math.pi), ctype), literal(0.044715, ctype)
            body = f"({half} * {a} * ({one} + tanh({c} * ({a} + {k} * {a} * {a} * {a}))))"
            # -inf * (1 + tanh(-inf)) is -inf * 0 = NaN in the reference (see TANH above)
            if vector:
                return f"select({body}, ({a}) * NAN, isinf({a}) & (({a}) < 0))"
            return f"((isinf({a}) && ({a}) < 0) ? NAN : {body})"
        return f"({half} * {a} * ({one} + erf({a} * {literal(math.sqrt(0.5), ctype)})))"
    if op in BITWISE_OPS:
        return _bitwise(op, a, b, ctype)
    if op is OpKind.CAST:
        if node.dtype == "bool":
            return f"((uchar)(({a}) != 0))"
        return f"(({ctype})({a}))"
    if op.value in _COMPARE:
        return f"((uchar)(({a}) {_COMPARE[op.value]} ({b})))"
    if op is OpKind.WHERE:
        return f"(({a}) ? ({xs[1]}) : ({xs[2]}))"
    raise NotImplementedError(f"rlx-opencl: {op} is not an elementwise op")


def _vector_width(region: Sequence[Node], externals: Sequence[Node], vector_bits: int) -> int:
    dtypes = {n.dtype for n in region} | {n.dtype for n in externals}
    if any(n.op is OpKind.WHERE for n in region):
        return 1
    if any(n.op is OpKind.POW and n.dtype == "float64" for n in region):
        return 1  # PoCL's double-vector pow mixes up lanes (tests/fuzz/test_found.py): scalar pow

    for family in _FLOAT_FAMILIES:
        if dtypes <= family:
            ctype = COMPUTE[next(iter(family))]
            return vector_lanes(ctype, VECTOR_WIDTH[ctype], vector_bits)
    return 1


def _vector_ok(out_shape: tuple[int, ...], ext_shapes: Sequence[tuple[int, ...]], width: int) -> bool:
    """Whether ``width`` consecutive outputs can read every operand as a vector or a splat."""
    size = math.prod(out_shape)
    if size < width:
        return False
    full_or_one = all(math.prod(s) in (1, size) for s in ext_shapes)
    if full_or_one:
        return True
    last = out_shape[-1] if out_shape else 1
    return last % width == 0


def elementwise_kernel(name: str, region: Sequence[Node], externals: Sequence[Node],
                       status_slot: int | None = None, vector_bits: int = MAX_VECTOR_BITS) -> Kernel:
    """The kernel computing ``region[-1]`` (the root) from ``externals``.

    ``region`` holds the fused nodes in topological order; every input of a region node
    is either an earlier region node or one of ``externals`` (read by node id).
    """
    root = region[-1]
    shape = root.shape
    size = math.prod(shape)
    ext_index = {n.id: k for k, n in enumerate(externals)}
    width = _vector_width(region, externals, vector_bits)
    ext_shapes = [n.shape for n in externals]
    if width > 1 and not _vector_ok(shape, ext_shapes, width):
        width = 1
    uses_fp64 = any(n.dtype == "float64" for n in (*region, *externals))
    status = f"(status[{2 * status_slot}] = 1)" if status_slot is not None else None

    def body(vector: bool, idx: str) -> list[str]:
        """Statements computing and storing the root for flat output index ``idx``."""
        lines = coords(idx, shape, "c")
        for n in externals:
            k = ext_index[n.id]
            full = math.prod(n.shape) == size  # broadcastable with as many elements: the same layout
            off = idx if full else broadcast_offset(shape, n.shape, "c")
            ctype = COMPUTE[n.dtype]
            along_last = bool(n.shape) and n.shape[-1] == shape[-1] != 1
            if vector and (full or along_last):
                value = loadv(n.dtype, f"x{k}", off, width)
                lines.append(f"const {ctype}{width} v{n.id} = {value};")
            elif vector:
                lines.append(f"const {ctype}{width} v{n.id} = ({ctype}{width})({load(n.dtype, f'x{k}', off)});")
            else:
                lines.append(f"const {ctype} v{n.id} = {load(n.dtype, f'x{k}', off)};")
        for n in region:
            ctype = COMPUTE[n.dtype]
            expr = op_expression(n, [f"v{i}" for i in n.inputs], ctype, vector=vector, status=status)
            if vector and n.op is OpKind.CAST:
                expr = f"convert_{ctype}{width}(v{n.inputs[0]})"
            decl = f"{ctype}{width}" if vector else ctype
            lines.append(f"const {decl} v{n.id} = {expr};")
        if vector:
            lines.append(storev(root.dtype, "y", idx, f"v{root.id}", width))
        else:
            lines.append(store(root.dtype, "y", idx, f"v{root.id}"))
        return lines

    params = [param_decl(n.dtype, f"x{k}", const=True) for k, n in enumerate(externals)]
    params.append(param_decl(root.dtype, "y", const=False))
    if status_slot is not None:
        params.append("__global long* restrict status")
    src = [header(uses_fp64), f"__kernel void {name}({', '.join(params)}) {{"]
    if width == 1:
        src += ["  const int g = get_global_id(0);", *("  " + s for s in body(False, "g"))]
        global_size = (max(size, 1),)
    else:
        src += [f"  const int base = get_global_id(0) * {width};", f"  if (base + {width} <= {size}) {{"]
        src += ["    " + s for s in body(True, "base")]
        src += ["  } else {", f"    for (int e = base; e < {size}; ++e) {{"]
        src += ["      " + s for s in body(False, "e")]
        src += ["    }", "  }"]
        global_size = (-(-size // width),)
    src.append("}")
    args = [Arg(value=n.id) for n in externals] + [Arg(value=root.id)]
    if status_slot is not None:
        args.append(Arg(status=True))
    return Kernel(name, "\n".join(src), global_size, tuple(args), uses_fp64)


def region_inputs(region: Sequence[Node]) -> list[int]:
    """Ids read by ``region`` from outside it, in first-use order."""
    inside = {n.id for n in region}
    seen: dict[int, None] = {}
    for n in region:
        for i in n.inputs:
            if i not in inside:
                seen.setdefault(i, None)
    return list(seen)

