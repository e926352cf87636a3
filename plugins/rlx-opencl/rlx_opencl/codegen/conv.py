"""Convolution (im2col + the matmul kernel) and pooling.

conv2d with G groups is a batched product per image n and group g::

    out[n, g] (og x P) = W[g] (og x K) @ col[n, g] (K x P),   K = cg*kh*kw, P = oh*ow

``out[n, g]`` is exactly the slab of ``out[n, g*og:(g+1)*og]`` in NCHW order, and ``W[g]``
the slab of the weights, so only ``col`` needs building (a scratch buffer of the step),
and a 1x1, stride-1, unpadded convolution needs none: its ``col`` is the input itself.
The bias rides on the matmul as a per-row epilogue.
"""

from __future__ import annotations

import math

from rlx_core.ir import Node
from rlx_core.ir.ops import OpKind

from .common import COMPUTE, MAX_VECTOR_BITS, Arg, Kernel, coords, header, literal, load, param_decl, store
from .matmul import MatmulSpec, matmul_kernel

__all__ = ["conv2d_kernels", "pool_kernel"]


def conv2d_kernels(name: str, node: Node, x: Node, w: Node, b: Node | None,
                   vector_bits: int = MAX_VECTOR_BITS) -> tuple[list[Kernel], int]:
    """The kernels of one conv2d and the element count of its scratch (0: none)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    _, _, oh, ow = node.shape
    groups = node.attrs["groups"]
    og = o // groups
    (sh, sw), (dh, dw) = node.attrs["stride"], node.attrs["dilation"]
    top, left, _, _ = node.attrs["padding"]
    k, p = cg * kh * kw, oh * ow
    direct = (kh, kw, sh, sw) == (1, 1, 1, 1) and node.attrs["padding"] == (0, 0, 0, 0)
    spec = MatmulSpec(m=og, k=k, n=p, dtype=node.dtype, batch=(n, groups), a_strides=(0, og * k),
                      b_strides=(c * h * wd, cg * h * wd) if direct else (groups * k * p, k * p),
                      bias=b is not None, bias_groups=groups)
    mm = matmul_kernel(f"{name}_mm", spec, w.id, x.id, node.id, bias=b.id if b is not None else None,
                       b_scratch=not direct, vector_bits=vector_bits)
    if direct:
        return [mm], 0
    size = n * groups * k * p
    dt = x.dtype
    lines = coords("g", (n * groups, cg, kh, kw, oh, ow), "c")
    lines += [
        f"const int iy = c4 * {sh} - {top} + c2 * {dh};",
        f"const int ix = c5 * {sw} - {left} + c3 * {dw};",
        f"const int ch = (c0 % {groups}) * {cg} + c1;",
        f"const int img = c0 / {groups};",
        f"if (iy >= 0 && iy < {h} && ix >= 0 && ix < {wd}) col[g] = x[((img * {c} + ch) * {h} + iy) * {wd} + ix];",
        "else col[g] = 0;",
    ]
    params = [param_decl(dt, "x", const=True, raw=True), param_decl(dt, "col", const=False, raw=True)]
    src = [f"__kernel void {name}_im2col({', '.join(params)}) {{", "  const int g = get_global_id(0);",
           *("  " + s for s in lines), "}"]
    im2col = Kernel(f"{name}_im2col", "\n".join(src), (size,), (Arg(value=x.id), Arg(scratch=0)))
    return [im2col, mm], size


def pool_kernel(name: str, node: Node, x: Node) -> Kernel:
    """max_pool2d / avg_pool2d, one work-item per output, with the reference's padding,
    dilation, ceil_mode and count_include_pad semantics."""
    a = node.attrs
    _, _, h, w = x.shape
    kh, kw = a["kernel"]
    sh, sw = a["stride"]
    top, left, bottom, right = a["padding"]
    dh, dw = a.get("dilation", (1, 1))
    dt, ctype = x.dtype, COMPUTE[x.dtype]
    is_max = node.op is OpKind.MAX_POOL2D
    lines = coords("g", node.shape, "c")
    lines.append(f"const int plane = (c0 * {x.shape[1]} + c1) * {h * w};")
    if is_max:
        lines.append(f"{ctype} acc = {literal(float('-inf'), ctype)};")
    else:
        lines += [f"{ctype} acc = {literal(0.0, ctype)};", "int count = 0;"]
    lines += [f"for (int i = 0; i < {kh}; ++i) {{", f"  const int iy = c2 * {sh} - {top} + i * {dh};",
              f"  for (int j = 0; j < {kw}; ++j) {{", f"    const int ix = c3 * {sw} - {left} + j * {dw};"]
    inside = f"iy >= 0 && iy < {h} && ix >= 0 && ix < {w}"
    value = load(dt, "x", f"plane + iy * {w} + ix")
    if is_max:
        lines.append(f"    if ({inside}) {{ const {ctype} v = {value}; "
                     "acc = ((v > acc || isnan(v)) && !isnan(acc)) ? v : acc; }")
    else:
        lines.append(f"    if ({inside}) acc += {value};")
        if a["count_include_pad"]:
            lines.append(f"    if (iy >= -{top} && iy < {h + bottom} && ix >= -{left} && ix < {w + right}) ++count;")
        else:
            lines.append(f"    if ({inside}) ++count;")
    lines += ["  }", "}"]
    if not is_max:
        lines.append(f"acc = acc / ({ctype})count;")
    lines.append(store(node.dtype, "y", "g", "acc"))
    fp64 = dt == "float64"
    params = [param_decl(dt, "x", const=True), param_decl(node.dtype, "y", const=False)]
    src = [header(fp64), f"__kernel void {name}({', '.join(params)}) {{", "  const int g = get_global_id(0);",
           *("  " + s for s in lines), "}"]
    return Kernel(name, "\n".join(src), (max(math.prod(node.shape), 1),), (Arg(value=x.id), Arg(value=node.id)), fp64)
