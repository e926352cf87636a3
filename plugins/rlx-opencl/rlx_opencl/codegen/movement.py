"""Data movement: transpose, slice, concat, gather. One work-item per output element.

These kernels copy bits (``uint`` for a 4-byte dtype, ``ushort`` for float16, ...), never
values, so every dtype moves exactly, bool and NaN payloads included.
"""

from __future__ import annotations

import math

from rlx_core.ir import Node
from rlx_core.plugin import itemsize

from .common import RAW, Arg, Kernel, coords, param_decl, strides

__all__ = ["transpose_kernel", "slice_kernel", "concat_kernel", "gather_kernel"]


def _kernel(name: str, node: Node, ins: list[Node], lines: list[str], status: bool = False) -> Kernel:
    params = [param_decl(n.dtype, f"x{k}", const=True, raw=True) for k, n in enumerate(ins)]
    params.append(param_decl(node.dtype, "y", const=False, raw=True))
    args = [Arg(value=n.id) for n in ins] + [Arg(value=node.id)]
    if status:
        params.append("__global long* restrict status")
        args.append(Arg(status=True))
    src = [f"__kernel void {name}({', '.join(params)}) {{", "  const int g = get_global_id(0);",
           *("  " + s for s in lines), "}"]
    return Kernel(name, "\n".join(src), (max(node.size, 1),), tuple(args))


def transpose_kernel(name: str, node: Node, x: Node) -> Kernel:
    perm = node.attrs["perm"]
    in_strides = strides(x.shape)
    lines = coords("g", node.shape, "c")
    off = " + ".join(f"c{d} * {in_strides[p]}" for d, p in enumerate(perm) if x.shape[p] != 1) or "0"
    lines.append(f"y[g] = x0[{off}];")
    return _kernel(name, node, [x], lines)


def slice_kernel(name: str, node: Node, x: Node) -> Kernel:
    """Input coordinate = first picked index + output coordinate * step, per sliced axis."""
    a = node.attrs
    first = {d: 0 for d in range(len(x.shape))}
    step = {d: 1 for d in range(len(x.shape))}
    for axis, s, e, st in zip(a["axes"], a["starts"], a["ends"], a["steps"]):
        picked = range(*slice(s, e, st).indices(x.shape[axis]))
        first[axis], step[axis] = (picked.start if len(picked) else 0), st
    in_strides = strides(x.shape)
    lines = coords("g", node.shape, "c")
    terms = []
    for d, stride in enumerate(in_strides):
        if x.shape[d] == 1:
            continue
        coord = f"({first[d]} + c{d} * {step[d]})" if (first[d], step[d]) != (0, 1) else f"c{d}"
        terms.append(f"{coord} * {stride}")
    lines.append(f"y[g] = x0[{' + '.join(terms) or '0'}];")
    return _kernel(name, node, [x], lines)


def concat_kernel(name: str, node: Node, ins: list[Node]) -> Kernel:
    """Output ``(outer, a, inner)`` comes from the input whose slab along the axis holds ``a``."""
    axis = node.attrs["axis"]
    inner = math.prod(node.shape[axis + 1 :])
    total = node.shape[axis]
    lines = [f"const int inner = g % {inner};", f"const int a = (g / {inner}) % {total};",
             f"const int outer = g / {inner * total};"]
    start = 0
    for k, n in enumerate(ins):
        width = n.shape[axis]
        cond = f"a < {start + width}" if k < len(ins) - 1 else ""
        read = f"y[g] = x{k}[(outer * {width} + (a - {start})) * {inner} + inner];"
        if k == 0:
            lines.append(f"if ({cond}) {read}" if cond else read)
        else:
            lines.append(f"else if ({cond}) {read}" if cond else f"else {read}")
        start += width
    return _kernel(name, node, ins, lines)


def gather_kernel(name: str, node: Node, x: Node, idx: Node, status_slot: int) -> Kernel:
    """``y[p, j, q] = x[p, indices[j], q]``; an index outside ``[-n, n)`` sets the status
    flag (with the index) and writes zeros, and the run raises ``InputError``."""
    axis = node.attrs["axis"]
    n = x.shape[axis]
    inner = math.prod(x.shape[axis + 1 :])
    count = idx.size
    itype = "long" if idx.dtype == "int64" else "int"
    params_idx = f"__global const {itype}* restrict ix"
    lines = [f"const int q = g % {inner};", f"const int j = (g / {inner}) % {count};",
             f"const int p = g / {inner * count};", f"{itype} v = ix[j];",
             f"if (v < -{n} || v >= {n}) {{ status[{2 * status_slot}] = 1; status[{2 * status_slot + 1}] = v; "
             "y[g] = 0; return; }",
             f"if (v < 0) v += {n};",
             f"y[g] = x0[(p * {n} + (int)v) * {inner} + q];"]
    raw = RAW[itemsize(x.dtype)]
    params = [f"__global const {raw}* restrict x0", params_idx, param_decl(node.dtype, "y", const=False, raw=True),
              "__global long* restrict status"]
    src = [f"__kernel void {name}({', '.join(params)}) {{", "  const int g = get_global_id(0);",
           *("  " + s for s in lines), "}"]
    args = (Arg(value=x.id), Arg(value=idx.id), Arg(value=node.id), Arg(status=True))
    return Kernel(name, "\n".join(src), (max(node.size, 1),), args)
