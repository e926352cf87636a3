"""Matrix products: register-blocked, vectorized kernels, batched with broadcasting.

Naive and local-memory tiled kernels ran several times slower on PoCL than what runs well
on a CPU device: register blocking with explicit vectors (measured: BENCHMARKS.md,
sections 'OpenCL kernels (PoCL)' and 'Figures behind design choices (moved from
docstrings, issue 32)'). Each work-item of the ``NN`` form computes ``rows`` output rows
times ``width`` consecutive columns, holding one vector accumulator per row and streaming
one vector of B per step of k (a rows x float16 block: the form that met the sgemm target
at 1024^3). The ``NT`` form (B given transposed, ``[N, K]``, as ``matmul(q, transpose(k))``
in attention) vectorizes along k instead: a block of rows x cols dot products whose vector
partial sums are added up at the end.

Batches are a third grid dimension; each operand has its own per-batch-dimension
strides, 0 where it broadcasts, so ``[B, M, K] @ [K, N]`` reads one B for every batch,
and conv2d runs as ``weights [G, O, K] @ im2col [N, G, K, P]``. An optional per-row bias
is added on the way out (conv2d's bias).

Vectors are at most ``vector_bits`` wide (512: ``float16``), narrower where the device's
compiler cannot take 512-bit vectors (``runtime.max_vector_bits``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .common import (
    COMPUTE,
    CTYPE_BYTES,
    INT_CTYPES,
    MAX_VECTOR_BITS,
    STORAGE,
    Arg,
    Kernel,
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

__all__ = ["MatmulSpec", "matmul_kernel", "vector_width"]

_WIDTH = {"float": 16, "double": 8}  # every integer type: 8 lanes
_POINTER_BYTES = 8


def vector_width(dtype: str, vector_bits: int = MAX_VECTOR_BITS) -> int:
    """Lanes of one vector of ``dtype``'s compute type: 16 floats at 512 bits, 8 at 256."""
    ctype = COMPUTE[dtype]
    return vector_lanes(ctype, _WIDTH.get(ctype, 8), vector_bits)


@dataclass(frozen=True)
class MatmulSpec:
    """``C[b] = A[b] @ B[b]`` for every batch index ``b`` of ``batch``.

    Element ``(m, k)`` of A is at ``a_batch_offset + m * K + k``; element ``(k, n)`` of
    B at ``b_batch_offset + k * N + n`` (``NN``) or ``+ n * K + k`` (``trans_b``); C is
    contiguous ``[*batch, M, N]``. Batch offsets are ``sum(coord_d * stride_d)``.
    ``bias`` adds ``bias[(b % bias_groups) * M + m]`` to row m of batch b.
    """

    m: int
    k: int
    n: int
    dtype: str
    batch: tuple[int, ...] = ()
    a_strides: tuple[int, ...] = ()
    b_strides: tuple[int, ...] = ()
    trans_b: bool = False
    bias: bool = False
    bias_groups: int = 1


def _batch_offset(spec: MatmulSpec, strides: Sequence[int]) -> str:
    terms = [f"b{d} * {s}" for d, s in enumerate(strides) if s and spec.batch[d] != 1]
    return " + ".join(terms) or "0"


def matmul_kernel(name: str, spec: MatmulSpec, a: int, b: int, out: int, bias: int | None = None,
                  a_scratch: bool = False, b_scratch: bool = False,
                  vector_bits: int = MAX_VECTOR_BITS) -> Kernel:
    """The kernel for ``spec`` reading values ``a``, ``b`` (and ``bias``), writing ``out``.
    ``a_scratch`` / ``b_scratch`` say that operand is the step's scratch buffer 0."""
    width = vector_width(spec.dtype, vector_bits)
    if spec.trans_b:
        lines, grid, private = _nt_body(spec, width)
    else:
        lines, grid, private = _nn_body(spec, width)
    dt = spec.dtype
    params = [param_decl(dt, "A", const=True), param_decl(dt, "B", const=True), param_decl(dt, "C", const=False)]
    args = [Arg(scratch=0) if a_scratch else Arg(value=a), Arg(scratch=0) if b_scratch else Arg(value=b),
            Arg(value=out)]
    if spec.bias:
        params.append(param_decl(dt, "bias", const=True))
        args.append(Arg(value=bias))
    batch = math.prod(spec.batch)
    src = [header(dt == "float64"), f"__kernel void {name}({', '.join(params)}) {{",
           "  const int bi = get_global_id(2);",
           *("  " + s for s in coords("bi", spec.batch, "b")),
           f"  const int offA = {_batch_offset(spec, spec.a_strides)};",
           f"  const int offB = {_batch_offset(spec, spec.b_strides)};",
           f"  const int offC = bi * {spec.m * spec.n};",
           *("  " + s for s in lines), "}"]
    return Kernel(name, "\n".join(src), (*grid, max(batch, 1)), tuple(args), dt == "float64", private_bytes=private)


def _epilogue(spec: MatmulSpec, value: str, ctype: str, row: str) -> str:
    if not spec.bias:
        return value
    idx = f"(bi % {spec.bias_groups}) * {spec.m} + {row}" if spec.bias_groups > 1 else row
    return f"({value} + ({load(spec.dtype, 'bias', idx)}))"


def _mac(ctype: str, acc: str, x: str, y: str) -> str:
    return f"{acc} = fma({x}, {y}, {acc});" if ctype in ("float", "double") else f"{acc} += {x} * {y};"


def _nn_body(spec: MatmulSpec, width: int) -> tuple[list[str], tuple[int, int], int]:
    """Lines, grid and per-work-item bytes (rows vector accumulators, one B vector, row pointers)."""
    dt, ctype = spec.dtype, COMPUTE[spec.dtype]
    m, k, n = spec.m, spec.k, spec.n
    rows = min(8, m)
    vtype = f"{ctype}{width}"
    zero = literal(0, ctype) if ctype in INT_CTYPES else literal(0.0, ctype)
    lines = [f"const int n0 = get_global_id(0) * {width};", f"const int m0 = get_global_id(1) * {rows};"]
    for r in range(rows):  # rows past M read row M-1 (valid memory) and are not stored
        lines.append(f"const __global {STORAGE[dt]}* a{r} = A + offA + min(m0 + {r}, {m - 1}) * {k};")
    lines.append(f"if (n0 + {width} <= {n}) {{")
    lines += [f"  {vtype} acc{r} = ({vtype})({zero});" for r in range(rows)]
    lines.append(f"  for (int kk = 0; kk < {k}; ++kk) {{")
    lines.append(f"    const {vtype} bv = {loadv(dt, 'B', f'offB + kk * {n} + n0', width)};")
    for r in range(rows):
        lines.append("    " + _mac(ctype, f"acc{r}", f"({vtype})({load(dt, f'a{r}', 'kk')})", "bv"))
    lines.append("  }")
    for r in range(rows):
        value = _epilogue(spec, f"acc{r}", ctype, f"m0 + {r}")
        lines.append(f"  if (m0 + {r} < {m}) {storev(dt, 'C', f'offC + (m0 + {r}) * {n} + n0', value, width)}")
    lines.append("} else {")
    lines.append(f"  for (int nn = n0; nn < {n}; ++nn) {{")
    lines += [f"    {ctype} s{r} = {zero};" for r in range(rows)]
    lines.append(f"    for (int kk = 0; kk < {k}; ++kk) {{")
    lines.append(f"      const {ctype} bs = {load(dt, 'B', f'offB + kk * {n} + nn')};")
    for r in range(rows):
        lines.append("      " + _mac(ctype, f"s{r}", load(dt, f"a{r}", "kk"), "bs"))
    lines.append("    }")
    for r in range(rows):
        value = _epilogue(spec, f"s{r}", ctype, f"m0 + {r}")
        lines.append(f"    if (m0 + {r} < {m}) {store(dt, 'C', f'offC + (m0 + {r}) * {n} + nn', value)}")
    lines += ["  }", "}"]
    private = (rows + 1) * width * CTYPE_BYTES[ctype] + rows * _POINTER_BYTES
    return lines, (-(-n // width), -(-m // rows)), private


def _hsum(v: str, width: int) -> str:
    """Sum of the lanes of vector expression ``v`` (as a tree: lo + hi, repeatedly)."""
    parts = [f"({v}).s{i:x}" for i in range(width)]
    while len(parts) > 1:
        parts = [f"({parts[i]} + {parts[i + 1]})" for i in range(0, len(parts), 2)]
    return parts[0]


def _nt_body(spec: MatmulSpec, width: int) -> tuple[list[str], tuple[int, int], int]:
    """Lines, grid and per-work-item bytes (rows x cols vector and scalar sums, one vector
    of each row and column, their pointers)."""
    dt, ctype = spec.dtype, COMPUTE[spec.dtype]
    m, k, n = spec.m, spec.k, spec.n
    rows, cols = min(4, m), min(4, n)
    vtype = f"{ctype}{width}"
    zero = literal(0, ctype) if ctype in INT_CTYPES else literal(0.0, ctype)
    kv = k // width * width
    lines = [f"const int n0 = get_global_id(0) * {cols};", f"const int m0 = get_global_id(1) * {rows};"]
    for r in range(rows):
        lines.append(f"const __global {STORAGE[dt]}* a{r} = A + offA + min(m0 + {r}, {m - 1}) * {k};")
    for c in range(cols):
        lines.append(f"const __global {STORAGE[dt]}* bp{c} = B + offB + min(n0 + {c}, {n - 1}) * {k};")
    pairs = [(r, c) for r in range(rows) for c in range(cols)]
    lines += [f"{ctype} s{r}_{c} = {zero};" for r, c in pairs]
    if kv:
        lines += [f"{vtype} acc{r}_{c} = ({vtype})({zero});" for r, c in pairs]
        lines.append(f"for (int kk = 0; kk < {kv}; kk += {width}) {{")
        lines += [f"  const {vtype} av{r} = {loadv(dt, f'a{r}', 'kk', width)};" for r in range(rows)]
        lines += [f"  const {vtype} bv{c} = {loadv(dt, f'bp{c}', 'kk', width)};" for c in range(cols)]
        lines += ["  " + _mac(ctype, f"acc{r}_{c}", f"av{r}", f"bv{c}") for r, c in pairs]
        lines.append("}")
        lines += [f"s{r}_{c} = {_hsum(f'acc{r}_{c}', width)};" for r, c in pairs]
    if kv < k:
        lines.append(f"for (int kk = {kv}; kk < {k}; ++kk) {{")
        lines += [f"  const {ctype} as{r} = {load(dt, f'a{r}', 'kk')};" for r in range(rows)]
        lines += [f"  const {ctype} bs{c} = {load(dt, f'bp{c}', 'kk')};" for c in range(cols)]
        lines += ["  " + _mac(ctype, f"s{r}_{c}", f"as{r}", f"bs{c}") for r, c in pairs]
        lines.append("}")
    for r, c in pairs:
        value = _epilogue(spec, f"s{r}_{c}", ctype, f"m0 + {r}")
        idx = f"offC + (m0 + {r}) * {n} + n0 + {c}"
        lines.append(f"if (m0 + {r} < {m} && n0 + {c} < {n}) {store(dt, 'C', idx, value)}")
    size = CTYPE_BYTES[ctype]
    private = len(pairs) * (width + 1) * size + (rows + cols) * (width * size + _POINTER_BYTES)
    return lines, (-(-n // cols), -(-m // rows)), private
