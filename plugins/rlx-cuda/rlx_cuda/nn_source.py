"""CUDA C for the indexed and row-wise kernels: gather, pooling, im2col, softmax,
layer_norm, the attention softmax and the reductions.

Pure Python, like ``codegen``. The indexed kernels are ``ElementwiseKernel`` bodies over
the output's flat index ``i`` with raw (C-contiguous) inputs: the tests compile them as
host C++ and compare them with the reference. The row kernels are ``RawKernel`` sources
(one thread block per row, warp-shuffle reductions); the tests compile them with nvcc
when it is installed. Every shape constant is written into the source, so a kernel is
compiled once per configuration and cached by its text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .codegen import COMPUTE_TYPE, CTYPE, ERR_GATHER_RANGE, PARAM_TYPE

__all__ = [
    "IndexedSource",
    "RowSource",
    "ReductionSource",
    "gather_source",
    "pool_source",
    "im2col_source",
    "softmax_source",
    "layer_norm_source",
    "reduction_source",
    "row_threads",
]


@dataclass(frozen=True)
class IndexedSource:
    """``cupy.ElementwiseKernel(in_params, out_params, body, name)``; scalars in the body."""

    in_params: str
    out_params: str
    body: str
    name: str


@dataclass(frozen=True)
class RowSource:
    """``cupy.RawKernel(code, name)``, launched with one block of ``threads`` per row."""

    code: str
    name: str


@dataclass(frozen=True)
class ReductionSource:
    """``cupy.ReductionKernel(in_params, out_params, map_expr, reduce_expr, post_map_expr,
    identity, name, reduce_type)``."""

    in_params: str
    out_params: str
    map_expr: str
    reduce_expr: str
    post_map_expr: str
    identity: str
    name: str
    reduce_type: str


def _name(prefix: str, *parts: object) -> str:
    return f"{prefix}_{hashlib.sha1(repr(parts).encode()).hexdigest()[:16]}"


def _inf(ct: str) -> str:
    return "__int_as_float(0x7f800000)" if ct == "float" else "__longlong_as_double(0x7ff0000000000000LL)"


def _store(expr: str, dtype: str) -> str:
    return f"float16((float)({expr}))" if dtype == "float16" else f"({CTYPE[dtype]})({expr})"


def gather_source(dtype: str, index_dtype: str, n_axis: int, n_idx: int, inner: int) -> IndexedSource:
    """``out[outer, j, k] = x[outer, idx[j], k]`` over the flattened ``(outer, n_idx, inner)``
    output; a negative index counts from the end, one out of range sets ``rlx_err[0]``."""
    body = (
        f"const long long inner_i = i % {inner}LL;\n"
        f"const long long rest = i / {inner}LL;\n"
        f"const long long j = rest % {n_idx}LL;\n"
        f"const long long outer = rest / {n_idx}LL;\n"
        f"long long k = (long long)idx[j];\n"
        f"if (k < 0) k += {n_axis}LL;\n"
        f"if (k < 0 || k >= {n_axis}LL) {{ rlx_err[0] = {ERR_GATHER_RANGE}; out = {_store('0', dtype)}; }}\n"
        f"else {{ out = x[(outer * {n_axis}LL + k) * {inner}LL + inner_i]; }}"
    )
    name = _name("rlx_gather", dtype, index_dtype, body)
    in_params = f"raw {PARAM_TYPE[dtype]} x, raw {PARAM_TYPE[index_dtype]} idx"
    # The flag is a raw output (CuPy declares raw inputs const); the call is kern(x, idx, flag, out).
    return IndexedSource(in_params, f"raw int32 rlx_err, {PARAM_TYPE[dtype]} out", body, name)


def _decompose_nchw(oh: int, ow: int) -> str:
    return (
        f"const long long ow_ = i % {ow}LL;\n"
        f"const long long t_ = i / {ow}LL;\n"
        f"const long long oh_ = t_ % {oh}LL;\n"
        f"const long long nc_ = t_ / {oh}LL;\n"
    )


def pool_source(kind: str, dtype: str, hw: tuple[int, int], out_hw: tuple[int, int], kernel: tuple[int, int],
                stride: tuple[int, int], padding: tuple[int, int, int, int], dilation: tuple[int, int] = (1, 1),
                count_include_pad: bool = False) -> IndexedSource:
    """Max or average pooling of NCHW ``x`` into NCHW ``out``, one thread per output.

    Padded positions never hold data: max skips them (a window of padding only gives
    -inf, as the reference's -inf padding does) and propagates NaN like ``np.maximum``;
    the average divides the window's sum over the input by the positions inside the input
    or, with ``count_include_pad``, inside the declared padding (ceil_mode's extra
    positions never count), as ``rlx_core.reference`` defines it.
    """
    ct = COMPUTE_TYPE[dtype]
    (h, w), (oh, ow), (kh, kw), (sh, sw) = hw, out_hw, kernel, stride
    top, left, bottom, right = padding
    dh, dw = dilation
    lines = [_decompose_nchw(oh, ow), f"const long long plane_ = nc_ * {h * w}LL;\n"]
    if kind == "max":
        lines.append(f"{ct} acc = -{_inf(ct)};\n")
        lines.append(f"for (int ki = 0; ki < {kh}; ++ki) {{\n"
                     f"  const long long h = oh_ * {sh}LL - {top}LL + ki * {dh}LL;\n"
                     f"  if (h < 0 || h >= {h}LL) continue;\n"
                     f"  for (int kj = 0; kj < {kw}; ++kj) {{\n"
                     f"    const long long w = ow_ * {sw}LL - {left}LL + kj * {dw}LL;\n"
                     f"    if (w < 0 || w >= {w}LL) continue;\n"
                     f"    const {ct} v = ({ct})x[plane_ + h * {w}LL + w];\n"
                     f"    if (acc == acc && (v != v || v > acc)) acc = v;\n"
                     f"  }}\n}}\n")
        lines.append(f"out = {_store('acc', dtype)};")
    elif kind == "avg":
        lo_h, hi_h = (-top, h + bottom) if count_include_pad else (0, h)
        lo_w, hi_w = (-left, w + right) if count_include_pad else (0, w)
        lines.append(f"{ct} acc = 0; long long count = 0;\n")
        lines.append(f"for (int ki = 0; ki < {kh}; ++ki) {{\n"
                     f"  const long long h = oh_ * {sh}LL - {top}LL + ki;\n"
                     f"  for (int kj = 0; kj < {kw}; ++kj) {{\n"
                     f"    const long long w = ow_ * {sw}LL - {left}LL + kj;\n"
                     f"    if (h >= {lo_h}LL && h < {hi_h}LL && w >= {lo_w}LL && w < {hi_w}LL) ++count;\n"
                     f"    if (h >= 0 && h < {h}LL && w >= 0 && w < {w}LL) acc += ({ct})x[plane_ + h * {w}LL + w];\n"
                     f"  }}\n}}\n")
        lines.append(f"out = {_store(f'acc / ({ct})count', dtype)};")
    else:
        raise ValueError(f"pool kind must be 'max' or 'avg', got {kind!r}")
    body = "".join(lines)
    return IndexedSource(f"raw {PARAM_TYPE[dtype]} x", f"{PARAM_TYPE[dtype]} out", body,
                         _name(f"rlx_{kind}pool", dtype, body))


def im2col_source(dtype: str, channels: int, hw: tuple[int, int], out_hw: tuple[int, int], kernel: tuple[int, int],
                  stride: tuple[int, int], padding: tuple[int, int, int, int], dilation: tuple[int, int],
                  groups: int) -> IndexedSource:
    """Columns ``(N, groups, C/groups * kH * kW, OH * OW)`` of NCHW ``x`` (zeros where the
    window reads padding), so that conv2d is one batched gemm per group."""
    (h, w), (oh, ow), (kh, kw), (sh, sw), (dh, dw) = hw, out_hw, kernel, stride, dilation
    top, left = padding[0], padding[1]
    cg = channels // groups
    k = cg * kh * kw
    p = oh * ow
    body = (
        f"const long long p_ = i % {p}LL;\n"
        f"const long long t_ = i / {p}LL;\n"
        f"const long long r_ = t_ % {k}LL;\n"
        f"const long long t2_ = t_ / {k}LL;\n"
        f"const long long g_ = t2_ % {groups}LL;\n"
        f"const long long n_ = t2_ / {groups}LL;\n"
        f"const long long c_ = g_ * {cg}LL + r_ / {kh * kw}LL;\n"
        f"const long long kk_ = r_ % {kh * kw}LL;\n"
        f"const long long h = (p_ / {ow}LL) * {sh}LL - {top}LL + (kk_ / {kw}LL) * {dh}LL;\n"
        f"const long long w = (p_ % {ow}LL) * {sw}LL - {left}LL + (kk_ % {kw}LL) * {dw}LL;\n"
        f"if (h >= 0 && h < {h}LL && w >= 0 && w < {w}LL)\n"
        f"  out = x[((n_ * {channels}LL + c_) * {h}LL + h) * {w}LL + w];\n"
        f"else out = {_store('0', dtype)};"
    )
    return IndexedSource(f"raw {PARAM_TYPE[dtype]} x", f"{PARAM_TYPE[dtype]} out", body,
                         _name("rlx_im2col", dtype, body))


def row_threads(n: int) -> int:
    """Threads per row block: a power of two from 32 to 1024, about one per element."""
    t = 32
    while t < n and t < 1024:
        t *= 2
    return t


_BLOCK_REDUCE = """
__device__ __forceinline__ CT rlx_max2(CT a, CT b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ CT rlx_block_sum(CT v, CT* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) red[wid] = v;
  __syncthreads();
  v = (threadIdx.x < nw) ? red[threadIdx.x] : (CT)0;
  if (wid == 0) { for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o); }
  if (threadIdx.x == 0) red[0] = v;
  __syncthreads();
  v = red[0];
  __syncthreads();
  return v;
}
__device__ __forceinline__ CT rlx_block_max(CT v, CT* red) {
  for (int o = 16; o > 0; o >>= 1) v = rlx_max2(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) red[wid] = v;
  __syncthreads();
  v = (threadIdx.x < nw) ? red[threadIdx.x] : -RLX_INF;
  if (wid == 0) { for (int o = 16; o > 0; o >>= 1) v = rlx_max2(v, __shfl_xor_sync(0xffffffffu, v, o)); }
  if (threadIdx.x == 0) red[0] = v;
  __syncthreads();
  v = red[0];
  __syncthreads();
  return v;
}
"""


def _prelude(dtype: str) -> str:
    ct = COMPUTE_TYPE[dtype]
    head = "#include <cupy/float16.cuh>\n" if dtype == "float16" else ""  # CuPy's float16 class
    return (f"{head}typedef {CTYPE[dtype]} T;\ntypedef {ct} CT;\n#undef RLX_INF\n#define RLX_INF {_inf(ct)}\n"
            + _BLOCK_REDUCE)


def softmax_source(dtype: str, mask: str = "none") -> RowSource:
    """Softmax of each row of ``x`` viewed as ``(outer, n, inner)`` along ``n``.

    ``x * scale`` first, then with ``mask`` ``"bool"`` the positions where the mask is false
    become -inf, with ``"add"`` the mask is added: the attention softmax, its mask already
    broadcast to the scores' layout. Arguments: ``x, mask, y, n, inner, rows, scale``.
    ``y`` may be ``x`` (no ``__restrict__``): each thread reads an element before it
    writes the same one.
    """
    if mask not in ("none", "bool", "add"):
        raise ValueError(f"mask must be 'none', 'bool' or 'add', got {mask!r}")
    mask_type = "bool" if mask == "bool" else "T"
    if mask == "bool":
        load = "(m_[idx] ? (CT)x[idx] * scale : -RLX_INF)"
    elif mask == "add":
        load = "((CT)x[idx] * scale + (CT)m_[idx])"
    else:
        load = "((CT)x[idx] * scale)"
    name = _name("rlx_softmax", dtype, mask)
    code = _prelude(dtype) + f"""
extern "C" __global__ void {name}(const T* x, const {mask_type}* m_, T* y,
    long long n, long long inner, long long rows, CT scale) {{
  __shared__ CT red[32];
  const long long r = blockIdx.x;
  if (r >= rows) return;
  const long long base = (r / inner) * n * inner + (r % inner);
  CT mx = -RLX_INF;
  for (long long j = threadIdx.x; j < n; j += blockDim.x) {{
    const long long idx = base + j * inner;
    mx = rlx_max2(mx, {load});
  }}
  mx = rlx_block_max(mx, red);
  CT s = 0;
  for (long long j = threadIdx.x; j < n; j += blockDim.x) {{
    const long long idx = base + j * inner;
    s += exp({load} - mx);
  }}
  s = rlx_block_sum(s, red);
  for (long long j = threadIdx.x; j < n; j += blockDim.x) {{
    const long long idx = base + j * inner;
    y[idx] = {_store("exp(" + load + " - mx) / s", dtype)};
  }}
}}
"""
    return RowSource(code, name)


def layer_norm_source(dtype: str, has_bias: bool) -> RowSource:
    """Layer norm of each contiguous row of ``n`` elements: ``(x - mean) / sqrt(var + eps)
    * scale + bias`` with the biased variance, two passes for accuracy. ``scale`` and
    ``bias`` are rows of ``n`` (already broadcast). Arguments: ``x, scale, bias, y, n,
    rows, eps`` (``bias`` may be any pointer when there is none)."""
    name = _name("rlx_layer_norm", dtype, has_bias)
    bias = " + (CT)b_[j]" if has_bias else ""
    code = _prelude(dtype) + f"""
extern "C" __global__ void {name}(const T* __restrict__ x, const T* __restrict__ s_, const T* __restrict__ b_,
    T* __restrict__ y, long long n, long long rows, CT eps) {{
  __shared__ CT red[32];
  const long long r = blockIdx.x;
  if (r >= rows) return;
  const T* xr = x + r * n;
  T* yr = y + r * n;
  CT sum = 0;
  for (long long j = threadIdx.x; j < n; j += blockDim.x) sum += (CT)xr[j];
  const CT mean = rlx_block_sum(sum, red) / (CT)n;
  CT sq = 0;
  for (long long j = threadIdx.x; j < n; j += blockDim.x) {{ const CT d = (CT)xr[j] - mean; sq += d * d; }}
  const CT inv = (CT)1 / sqrt(rlx_block_sum(sq, red) / (CT)n + eps);
  for (long long j = threadIdx.x; j < n; j += blockDim.x) {{
    yr[j] = {_store("((CT)xr[j] - mean) * inv * (CT)s_[j]" + bias, dtype)};
  }}
}}
"""
    return RowSource(code, name)


def reduction_source(kind: str, dtype: str) -> ReductionSource:
    """``reduce_sum`` (ints stay in their dtype, as the reference's ``np.sum(dtype=x.dtype)``),
    ``reduce_max`` (NaN propagates) or ``reduce_mean`` (floats only), accumulated in the
    compute type (float for float16)."""
    ct = COMPUTE_TYPE[dtype]
    is_float = ct in ("float", "double")
    read = "(float)x" if dtype == "float16" else "x"
    if kind == "sum":
        reduce_expr, identity, post = "a + b", "0", _store("a", dtype)
    elif kind == "mean":
        if not is_float:
            raise ValueError(f"reduce_mean needs a float dtype, got {dtype}")
        reduce_expr, identity = "a + b", "0"
        post = _store(f"a / ({ct})(_in_ind.size() / _out_ind.size())", dtype)
    elif kind == "max":
        if is_float:
            reduce_expr, identity = "(a != a) ? a : ((b != b) ? b : (a > b ? a : b))", f"-{_inf(ct)}"
        else:
            low = "(-2147483647 - 1)" if dtype == "int32" else "(-9223372036854775807LL - 1)"
            reduce_expr, identity = "(a > b ? a : b)", low
        post = _store("a", dtype)
    else:
        raise ValueError(f"reduction kind must be 'sum', 'mean' or 'max', got {kind!r}")
    return ReductionSource(f"{PARAM_TYPE[dtype]} x", f"{PARAM_TYPE[dtype]} y", read, reduce_expr, f"y = {post}",
                           identity, f"rlx_reduce_{kind}_{dtype}", ct)
