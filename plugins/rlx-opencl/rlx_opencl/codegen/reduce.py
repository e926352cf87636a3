"""Reductions and the row-wise ops built on them: reduce_sum/mean/max, softmax, layer_norm.

One work-item per output element (per row for softmax and layer_norm) walks its reduced
elements; on a CPU device the work-items of a group are spread over the cores, and the
rows are independent, so this needs no local memory or barriers. Sums accumulate in the
compute type (float for float16 and float32, double for float64), max keeps NaN like
numpy. When the reduced axes are the trailing ones the inner walk is a contiguous run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlx_core.ir import Node
from rlx_core.ir.ops import OpKind

from .common import (
    COMPUTE,
    INT_CTYPES,
    INT_LOWEST,
    Arg,
    Kernel,
    broadcast_offset,
    coords,
    header,
    literal,
    load,
    param_decl,
    store,
    strides,
)

__all__ = ["reduce_kernel", "softmax_kernel", "layer_norm_kernel"]


def _zero(ctype: str) -> str:
    return literal(0, ctype) if ctype in INT_CTYPES else literal(0.0, ctype)


def _max_step(ctype: str, acc: str, v: str) -> str:
    if ctype in ("float", "double"):
        return f"{acc} = ({v} > {acc} || isnan({v})) && !isnan({acc}) ? {v} : {acc};"
    return f"{acc} = max({acc}, {v});"


def reduce_kernel(name: str, node: Node, x: Node) -> Kernel:
    """reduce_sum / reduce_mean / reduce_max (``global_avg_pool2d`` is a mean over (2, 3))."""
    op = node.op
    axes = (2, 3) if op is OpKind.GLOBAL_AVG_POOL2D else tuple(node.attrs["axes"])
    shape = x.shape
    kept = [d for d in range(len(shape)) if d not in axes]
    kept_shape = [shape[d] for d in kept]
    red_shape = [shape[d] for d in axes]
    in_strides = strides(shape)
    total = math.prod(red_shape)
    outs = math.prod(kept_shape)
    dt, ctype = x.dtype, COMPUTE[x.dtype]
    lines = coords("g", kept_shape, "k")
    base = " + ".join(f"k{i} * {in_strides[d]}" for i, d in enumerate(kept) if shape[d] != 1) or "0"
    lines.append(f"const int base = {base};")
    trailing = tuple(axes) == tuple(range(len(shape) - len(axes), len(shape)))
    is_max = op is OpKind.REDUCE_MAX
    init = "-INFINITY" if is_max and ctype == "float" else "-(double)INFINITY" if is_max and ctype == "double" else (
        INT_LOWEST[ctype] if is_max else _zero(ctype))
    lines.append(f"{ctype} acc = {init};")
    lines.append(f"for (int r = 0; r < {total}; ++r) {{")
    if trailing:
        off = "base + r"
    else:
        lines += ["  " + s for s in coords("r", red_shape, "q")]
        off = "base + " + (" + ".join(f"q{i} * {in_strides[d]}" for i, d in enumerate(axes) if shape[d] != 1) or "0")
    lines.append(f"  const {ctype} v = {load(dt, 'x', off)};")
    lines.append("  " + (_max_step(ctype, "acc", "v") if is_max else "acc += v;"))
    lines.append("}")
    if op in (OpKind.REDUCE_MEAN, OpKind.GLOBAL_AVG_POOL2D):
        lines.append(f"acc = acc / {literal(float(total), ctype)};")
    lines.append(store(node.dtype, "y", "g", "acc"))
    return _kernel(name, [(x, "x")], node, lines, outs)


def _kernel(name: str, ins: Sequence[tuple[Node, str]], node: Node, lines: list[str], size: int) -> Kernel:
    fp64 = node.dtype == "float64" or any(n.dtype == "float64" for n, _ in ins)
    params = [param_decl(n.dtype, p, const=True) for n, p in ins] + [param_decl(node.dtype, "y", const=False)]
    src = [header(fp64), f"__kernel void {name}({', '.join(params)}) {{", "  const int g = get_global_id(0);",
           *("  " + s for s in lines), "}"]
    args = (*(Arg(value=n.id) for n, _ in ins), Arg(value=node.id))
    return Kernel(name, "\n".join(src), (max(size, 1),), args, fp64)


def softmax_kernel(name: str, node: Node, x: Node) -> Kernel:
    """One work-item per row along ``axis``: max, sum of exp(x - max), then the quotients."""
    shape, axis = x.shape, node.attrs["axis"]
    length, inner = shape[axis], math.prod(shape[axis + 1 :])
    rows = math.prod(shape) // max(length, 1)
    dt, ctype = x.dtype, COMPUTE[x.dtype]
    ninf = "-INFINITY" if ctype == "float" else "-(double)INFINITY"
    at = f"base + i * {inner}" if inner != 1 else "base + i"
    quotient = f"exp({load(dt, 'x', at)} - mx) * inv"
    base = f"(g / {inner}) * {length * inner} + g % {inner}" if inner != 1 else f"g * {length}"
    lines = [
        f"const int base = {base};",
        f"{ctype} mx = {ninf};",
        f"for (int i = 0; i < {length}; ++i) {{",
        f"  const {ctype} v = {load(dt, 'x', at)}; {_max_step(ctype, 'mx', 'v')}",
        "}",
        f"{ctype} sum = {_zero(ctype)};",
        f"for (int i = 0; i < {length}; ++i) sum += exp({load(dt, 'x', at)} - mx);",
        f"const {ctype} inv = {literal(1.0, ctype)} / sum;",
        f"for (int i = 0; i < {length}; ++i) {{ {store(dt, 'y', at, quotient)} }}",
    ]
    return _kernel(name, [(x, "x")], node, lines, rows)


def layer_norm_kernel(name: str, node: Node, x: Node, scale: Node, bias: Node | None) -> Kernel:
    """One work-item per row (the dims before ``axis``): mean, biased variance, then
    ``(x - mean) / sqrt(var + eps) * scale + bias`` with scale and bias broadcast."""
    shape, axis = x.shape, node.attrs["axis"]
    norm = shape[axis:]
    length = math.prod(norm)
    rows = math.prod(shape[:axis])
    dt, ctype = x.dtype, COMPUTE[x.dtype]
    zero = _zero(ctype)
    lines = [
        f"const int base = g * {length};",
        f"{ctype} mean = {zero};",
        f"for (int i = 0; i < {length}; ++i) mean += {load(dt, 'x', 'base + i')};",
        f"mean = mean / {literal(float(length), ctype)};",
        f"{ctype} var = {zero};",
        f"for (int i = 0; i < {length}; ++i) {{ const {ctype} d = {load(dt, 'x', 'base + i')} - mean; var += d * d; }}",
        f"var = var / {literal(float(length), ctype)};",
        f"const {ctype} inv = {literal(1.0, ctype)} / sqrt(var + {literal(node.attrs['eps'], ctype)});",
        f"for (int i = 0; i < {length}; ++i) {{",
        *("  " + s for s in coords("i", norm, "n")),
        f"  {ctype} v = ({load(dt, 'x', 'base + i')} - mean) * inv * {load(dt, 's', _off(norm, scale.shape))};",
    ]
    ins = [(x, "x"), (scale, "s")]
    if bias is not None:
        lines.append(f"  v += {load(dt, 'b', _off(norm, bias.shape))};")
        ins.append((bias, "b"))
    lines += ["  " + store(dt, "y", "base + i", "v"), "}"]
    return _kernel(name, ins, node, lines, rows)


def _off(norm: tuple[int, ...], shape: tuple[int, ...]) -> str:
    return "i" if math.prod(shape) == math.prod(norm) else broadcast_offset(norm, shape, "n")
