"""The reference interpreter against hand-computed values and independent formulas, and
the conformance kit (``rlx_core.testing``) against a loopback backend and broken ones."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import time

import numpy as np
import pytest

import rlx_core
from rlx_core import Graph, InputError
from rlx_core.reference import evaluate

RNG = np.random.default_rng(1234)


def run1(g: Graph, out, **inputs) -> np.ndarray:
    g.set_outputs([out])
    (result,) = evaluate(g, inputs)
    return result


def unary(op: str, x, **attrs) -> np.ndarray:
    x = np.asarray(x)
    g = Graph(op)
    return run1(g, getattr(g, op)(g.input("x", x.shape, x.dtype), **attrs), x=x)


def binary(op: str, a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    g = Graph(op)
    return run1(g, getattr(g, op)(g.input("a", a.shape, a.dtype), g.input("b", b.shape, b.dtype)), a=a, b=b)


# ----------------------------------------------------------------------------- elementwise
def test_float_results_are_float64_ints_and_bools_keep_their_dtype():
    assert binary("add", np.ones(3, np.float32), np.ones(3, np.float32)).dtype == np.float64
    assert binary("add", np.ones(3, np.float16), np.ones(3, np.float16)).dtype == np.float64
    assert binary("add", np.ones(3, np.int32), np.ones(3, np.int32)).dtype == np.int32
    assert binary("mul", np.ones(3, np.int64), np.ones(3, np.int64)).dtype == np.int64
    assert unary("cast", np.ones(3, np.int32), dtype="bool").dtype == np.bool_


def test_float32_values_are_computed_in_float64():
    a = np.full(4, 16777216.0, np.float32)  # 2**24: adding 1 in float32 is lost, not in float64
    assert binary("add", a, np.ones(4, np.float32))[0] == 16777217.0


@pytest.mark.parametrize("op, fn", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                    ("maximum", np.maximum), ("minimum", np.minimum)])
def test_binary_broadcasting_matches_numpy(op, fn):
    a = RNG.standard_normal((2, 1, 4)).astype(np.float32)
    b = RNG.standard_normal((3, 1)).astype(np.float32)
    np.testing.assert_array_equal(binary(op, a, b), fn(a.astype(np.float64), b.astype(np.float64)))


def test_int_div_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 0, 1, -1, 9], np.int32)
    b = np.array([2, 2, -2, -2, 3, 5, 5, -3], np.int32)
    got = binary("div", a, b)
    assert got.dtype == np.int32
    assert got.tolist() == [3, -3, -3, 3, 0, 0, 0, -3]
    assert got.tolist() == [int(x / y) for x, y in zip(a.tolist(), b.tolist())]


def test_int64_div_is_exact_beyond_float_precision():
    a = np.array([2**62 + 1, -(2**62) - 1], np.int64)
    got = binary("div", a, np.array([3, 3], np.int64))
    assert got.tolist() == [(2**62 + 1) // 3, -((2**62 + 1) // 3)]


def test_int_div_by_zero_is_an_input_error():
    with pytest.raises(InputError, match="division by zero"):
        binary("div", np.array([1, 2], np.int32), np.array([1, 0], np.int32))


def test_float_div_is_true_division():
    assert binary("div", np.array([7.0, -7.0], np.float32), np.array([2.0, 2.0], np.float32)).tolist() == [3.5, -3.5]


@pytest.mark.parametrize("op, fn", [
    ("exp", math.exp), ("log", math.log), ("sqrt", math.sqrt), ("tanh", math.tanh), ("erf", math.erf),
    ("rsqrt", lambda v: 1 / math.sqrt(v)), ("sigmoid", lambda v: 1 / (1 + math.exp(-v))), ("neg", lambda v: -v),
    ("abs", abs),
])
def test_unary_float_ops_match_math(op, fn):
    x = np.array([0.25, 0.5, 1.0, 2.0, 3.5], np.float64)
    np.testing.assert_allclose(unary(op, x), [fn(v) for v in x.tolist()], rtol=1e-15)


def test_pow_and_erf_known_values():
    np.testing.assert_allclose(binary("pow", np.array([2.0, 9.0, 4.0]), np.array([3.0, 0.5, -1.0])), [8.0, 3.0, 0.25])
    np.testing.assert_allclose(unary("erf", np.array([0.0, 1.0, -0.5])), [0.0, 0.8427007929497149, -0.5204998778130465])


def test_relu_on_floats_and_ints():
    assert unary("relu", np.array([-1.5, 0.0, 2.0], np.float32)).tolist() == [0.0, 0.0, 2.0]
    got = unary("relu", np.array([-3, 0, 4], np.int32))
    assert got.dtype == np.int32 and got.tolist() == [0, 0, 4]


def test_gelu_exact_and_tanh_forms():
    x = np.array([-2.0, -0.5, 0.0, 1.0, 3.0])
    exact = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()]
    approx = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x.tolist()]
    np.testing.assert_allclose(unary("gelu", x), exact, rtol=1e-14)
    np.testing.assert_allclose(unary("gelu", x, approximate="tanh"), approx, rtol=1e-14)
    assert unary("gelu", np.array([1.0]))[0] == pytest.approx(0.8413447460685429, rel=1e-14)
    assert unary("gelu", np.array([1.0]), approximate="tanh")[0] == pytest.approx(0.8411919906082768, rel=1e-14)


# ----------------------------------------------------------------------------- normalizations, reductions
def test_softmax_is_stable_and_right():
    got = unary("softmax", np.array([[1.0, 2.0, 3.0], [1000.0, 1001.0, 1002.0]]))
    e = np.exp([1.0, 2.0, 3.0])
    np.testing.assert_allclose(got, [e / e.sum(), e / e.sum()], rtol=1e-14)
    got0 = unary("softmax", np.array([[0.0, 1.0], [2.0, 3.0]]), axis=0)
    np.testing.assert_allclose(got0.sum(axis=0), [1.0, 1.0])


def test_layer_norm_hand_computed():
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    g = Graph("ln")
    out = g.layer_norm(g.input("x", (1, 4), "float64"), np.array([1.0, 2.0, 1.0, 1.0]), np.array([0.0, 0.0, 0.0, 1.0]),
                       eps=0.0)
    got = run1(g, out, x=x)
    sd = math.sqrt(1.25)  # population variance of 1..4 is 1.25
    np.testing.assert_allclose(got, [[-1.5 / sd, 2 * -0.5 / sd, 0.5 / sd, 1.5 / sd + 1]], rtol=1e-14)


def test_layer_norm_over_several_axes_with_eps():
    x = RNG.standard_normal((2, 3, 4))
    g = Graph("ln")
    got = run1(g, g.layer_norm(g.input("x", x.shape, "float64"), np.float64(1.5), axis=1, eps=0.1), x=x)
    for i in range(2):
        v = x[i]
        np.testing.assert_allclose(got[i], (v - v.mean()) / math.sqrt(v.var() + 0.1) * 1.5, rtol=1e-12)


@pytest.mark.parametrize("op, fn", [("reduce_sum", np.sum), ("reduce_mean", np.mean), ("reduce_max", np.max)])
@pytest.mark.parametrize("axes", [None, 0, (1, -1), ()])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_match_numpy(op, fn, axes, keepdims):
    x = RNG.standard_normal((2, 3, 4))
    got = unary(op, x, axes=axes, keepdims=keepdims)
    want = fn(x, axis=tuple(a % 3 for a in ((axes,) if isinstance(axes, int) else axes)) if axes is not None else None,
              keepdims=keepdims)
    np.testing.assert_allclose(got, want, rtol=1e-14)


def test_int_reduce_sum_keeps_int32():
    got = unary("reduce_sum", np.array([[2**30, 2**30 - 1], [1, 2]], np.int32), axes=1)
    assert got.dtype == np.int32 and got.tolist() == [2**31 - 1, 3]


# ----------------------------------------------------------------------------- shape ops
def test_reshape_transpose_concat():
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    np.testing.assert_array_equal(unary("reshape", x, shape=(4, -1)), x.reshape(4, 6))
    np.testing.assert_array_equal(unary("transpose", x), x.T)
    np.testing.assert_array_equal(unary("transpose", x, perm=(1, 0, 2)), x.transpose(1, 0, 2))
    g = Graph("cat")
    a, b = g.input("a", (2, 3, 4), "int64"), g.input("b", (2, 1, 4), "int64")
    np.testing.assert_array_equal(run1(g, g.concat([a, b, a], axis=-2), a=x, b=x[:, :1]),
                                  np.concatenate([x, x[:, :1], x], axis=1))


BIG = 2**31 - 1


@pytest.mark.parametrize("step", [1, 2, 3, -1, -2, -3])
def test_slice_matches_python_slicing(step):
    x = np.arange(5, dtype=np.int32)
    bounds = [*range(-7, 8), BIG, -BIG - 1]
    for start, end in itertools.product(bounds, bounds):
        g = Graph("slice")
        got = run1(g, g.slice(g.input("x", (5,), "int32"), [start], [end], steps=[step]), x=x)
        assert got.tolist() == x.tolist()[start:end:step], (start, end, step)


def test_slice_several_axes_negative_axis_and_steps():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    g = Graph("slice")
    got = run1(g, g.slice(g.input("x", x.shape), starts=[-1, 1], ends=[-BIG, 100], axes=[-1, 0], steps=[-2, 1]), x=x)
    np.testing.assert_array_equal(got, x[1:, :, ::-2])


def test_gather_negative_indices_and_axes():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = Graph("gather")
    idx = np.array([[0, -1], [-4, 2]], np.int32)
    got = run1(g, g.gather(g.input("x", x.shape), g.input("i", idx.shape, "int32"), axis=1), x=x, i=idx)
    assert got.shape == (3, 2, 2)
    np.testing.assert_array_equal(got, x[:, [[0, 3], [0, 2]]])


def test_gather_out_of_range_names_the_node():
    g = Graph("gather")
    out = g.gather(g.input("x", (3,), "float32"), g.input("i", (2,), "int64"), name="pick")
    with pytest.raises(InputError, match=r"'pick'.*index 3 is out of range for axis 0 of size 3"):
        run1(g, out, x=np.zeros(3, np.float32), i=np.array([0, 3]))
    with pytest.raises(InputError, match="index -4"):
        run1(g, out, x=np.zeros(3, np.float32), i=np.array([-4, 0]))


def test_cast_truncates_rounds_and_converts():
    f = np.array([-1.7, -0.2, 0.0, 2.9, 0.1], np.float32)
    assert unary("cast", f, dtype="int32").tolist() == [-1, 0, 0, 2, 0]
    assert unary("cast", f, dtype="bool").tolist() == [True, True, False, True, True]
    half = unary("cast", np.array([0.1, 1 / 3, 70000.0]), dtype="float16")
    assert half.dtype == np.float64 and half.tolist() == [0.0999755859375, 0.333251953125, math.inf]
    assert unary("cast", np.array([2**24 + 1], np.int64), dtype="float32").tolist() == [2.0**24]
    assert unary("cast", np.array([True, False]), dtype="float16").tolist() == [1.0, 0.0]
    assert unary("cast", np.array([2**31 + 5], np.int64), dtype="int32").dtype == np.int32


def test_where_broadcasts():
    g = Graph("where")
    c, x, y = g.input("c", (2, 1), "bool"), g.input("x", (3,), "int32"), g.input("y", (), "int32")
    got = run1(g, g.where(c, x, y), c=np.array([[True], [False]]), x=np.array([1, 2, 3], np.int32),
               y=np.array(9, np.int32))
    assert got.tolist() == [[1, 2, 3], [9, 9, 9]] and got.dtype == np.int32


# ----------------------------------------------------------------------------- conv and pools
def naive_conv2d(x, w, b, stride, padding, dilation, groups):
    n, _c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    top, left, bottom, right = padding
    oh = (h + top + bottom - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + left + right - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    for ni, oc, y, xx in itertools.product(range(n), range(o), range(oh), range(ow)):
        g = oc // (o // groups)
        acc = 0.0 if b is None else b[oc]
        for ci, i, j in itertools.product(range(cg), range(kh), range(kw)):
            iy, ix = y * stride[0] - top + i * dilation[0], xx * stride[1] - left + j * dilation[1]
            if 0 <= iy < h and 0 <= ix < wd:
                acc += x[ni, g * cg + ci, iy, ix] * w[oc, ci, i, j]
        out[ni, oc, y, xx] = acc
    return out


@pytest.mark.parametrize("groups, stride, padding, dilation, bias", [
    (1, (1, 1), (0, 0, 0, 0), (1, 1), False),
    (1, (2, 1), (1, 2, 0, 1), (1, 1), True),
    (2, (1, 2), (2, 1, 2, 1), (2, 1), True),
    (3, (2, 2), (0, 1, 1, 0), (1, 2), False),
])
def test_conv2d_matches_naive_loops(groups, stride, padding, dilation, bias):
    x = RNG.standard_normal((2, 3 * groups, 6, 7))
    w = RNG.standard_normal((2 * groups, 3, 3, 2))
    b = RNG.standard_normal(2 * groups) if bias else None
    g = Graph("conv")
    out = g.conv2d(g.input("x", x.shape, "float64"), g.param("w", w), None if b is None else g.param("b", b),
                   stride=stride, padding=padding, dilation=dilation, groups=groups)
    np.testing.assert_allclose(run1(g, out, x=x), naive_conv2d(x, w, b, stride, padding, dilation, groups),
                               rtol=1e-12, atol=1e-12)


def pool_out(size, k, s, p0, p1, d, ceil):
    """PyTorch's pooling_output_shape, written independently of ops.py."""
    n = (size + p0 + p1 - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (n - 1) * s >= size + p0:
        n -= 1
    return n


def naive_pool(x, kind, kernel, stride, padding, dilation, ceil, cip):
    """PyTorch's CPU pooling loops: avg divisor from the window clipped to [-pad, size+pad)."""
    n, c, h, w = x.shape
    top, left, bottom, right = padding
    oh = pool_out(h, kernel[0], stride[0], top, bottom, dilation[0], ceil)
    ow = pool_out(w, kernel[1], stride[1], left, right, dilation[1], ceil)
    out = np.zeros((n, c, oh, ow))
    for y, xx in itertools.product(range(oh), range(ow)):
        y0, x0 = y * stride[0] - top, xx * stride[1] - left
        if kind == "max":
            best = np.full((n, c), -np.inf)
            for i, j in itertools.product(range(kernel[0]), range(kernel[1])):
                iy, ix = y0 + i * dilation[0], x0 + j * dilation[1]
                if 0 <= iy < h and 0 <= ix < w:
                    best = np.maximum(best, x[:, :, iy, ix])
            out[:, :, y, xx] = best
        else:
            y1, x1 = min(y0 + kernel[0], h + bottom), min(x0 + kernel[1], w + right)
            pool_size = (y1 - y0) * (x1 - x0)
            ya, xa, yb, xb = max(y0, 0), max(x0, 0), min(y1, h), min(x1, w)
            total = x[:, :, ya:yb, xa:xb].sum(axis=(2, 3))
            out[:, :, y, xx] = total / (pool_size if cip else (yb - ya) * (xb - xa))
    return out


def _pool_configs():
    for h, k, s, pads, d, ceil in itertools.product((4, 5, 7), (1, 2, 3), (1, 2, 3), ((0, 0), (1, 0), (1, 1)), (1, 2),
                                                    (False, True)):
        if max(pads) * 2 <= d * (k - 1) + 1 and h + sum(pads) >= d * (k - 1) + 1:
            yield h, k, s, pads, d, ceil


def test_max_pool2d_matches_naive_loops():
    count = 0
    for h, k, s, (p0, p1), d, ceil in _pool_configs():
        x = RNG.standard_normal((1, 2, h, h + 1))
        g = Graph("pool")
        padding = (p0, p1, p1, p0)
        out = g.max_pool2d(g.input("x", x.shape, "float64"), (k, 2), (s, 1), padding, (d, 1), ceil)
        want = naive_pool(x, "max", (k, 2), (s, 1), padding, (d, 1), ceil, False)
        np.testing.assert_array_equal(run1(g, out, x=x), want, err_msg=str((h, k, s, padding, d, ceil)))
        count += 1
    assert count > 100


def test_avg_pool2d_matches_naive_loops():
    count = 0
    for h, k, s, (p0, p1), d, ceil in _pool_configs():
        if d != 1:
            continue
        for cip in (False, True):
            x = RNG.standard_normal((2, 1, h, h + 2))
            g = Graph("pool")
            padding = (p0, p1, p1, p0)
            out = g.avg_pool2d(g.input("x", x.shape, "float64"), (k, 3), (s, 2), padding, ceil, cip)
            want = naive_pool(x, "avg", (k, 3), (s, 2), padding, (1, 1), ceil, cip)
            # atol: float64 sums of up to 9 N(0, 1) values in another order can differ by a few
            # 1e-16 where they nearly cancel (an average of 4.6e-4 was off by 6e-17)
            np.testing.assert_allclose(run1(g, out, x=x), want, rtol=1e-13, atol=1e-14,
                                       err_msg=str((h, k, s, padding, ceil, cip)))
            count += 1
    assert count > 100


def test_avg_pool2d_hand_computed_pytorch_values():
    x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    g = Graph("pool")
    got = run1(g, g.avg_pool2d(g.input("x", x.shape), 3, 2, 1, ceil_mode=True, count_include_pad=True), x=x)
    np.testing.assert_allclose(got[0, 0], [[12 / 9, 3, 24 / 9], [7, 12, 9], [8, 13, 84 / 9]], rtol=1e-12)
    # ceil_mode adds a window past the input; positions beyond the declared padding never count.
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    for cip in (False, True):
        g = Graph("pool")
        got = run1(g, g.avg_pool2d(g.input("x", x.shape), 3, 2, 0, ceil_mode=True, count_include_pad=cip), x=x)
        assert got[0, 0].tolist() == [[5.0, 6.5], [11.0, 12.5]]


def test_max_pool2d_ceil_mode_window_ignores_padding():
    x = -np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)  # all <= 0: a zero pad would win
    g = Graph("pool")
    got = run1(g, g.max_pool2d(g.input("x", x.shape), 3, 2, 1, ceil_mode=True), x=x)
    # windows start at -1, 1, 3; the last reaches the declared pad (4) and ceil_mode's extra row (5)
    assert got[0, 0].tolist() == [[0.0, -1.0, -3.0], [-4.0, -5.0, -7.0], [-12.0, -13.0, -15.0]]


def test_global_avg_pool2d():
    x = RNG.standard_normal((2, 3, 4, 5))
    np.testing.assert_allclose(unary("global_avg_pool2d", x), x.mean(axis=(2, 3), keepdims=True), rtol=1e-14)


# ----------------------------------------------------------------------------- attention
def naive_attention(q, k, v, mask, scale):
    q, k, v = np.broadcast_arrays(q[..., :, None, :, None], k[..., None, :, :, None], v[..., None, :, None, :])
    # q (..., Lq, 1, D, 1), k (..., 1, Lk, D, 1), v (..., 1, Lk, 1, Dv) broadcast to (..., Lq, Lk, D, Dv)
    s = (q[..., 0] * k[..., 0]).sum(axis=-1) * scale  # (..., Lq, Lk)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    out = np.zeros((*s.shape[:-1], v.shape[-1]))
    for idx in np.ndindex(*s.shape[:-1]):
        w = [math.exp(t - max(s[idx])) for t in s[idx]]
        out[idx] = sum(wi / sum(w) * v[idx][j, 0, :] for j, wi in enumerate(w))
    return out


@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
def test_attention_matches_naive(mask_kind):
    q, k, v = RNG.standard_normal((2, 1, 3, 4)), RNG.standard_normal((1, 2, 5, 4)), RNG.standard_normal((2, 2, 5, 6))
    mask = None
    if mask_kind == "bool":
        mask = RNG.random((3, 5)) < 0.5
        mask[:, 0] = True
    elif mask_kind == "float":
        mask = RNG.standard_normal((2, 1, 1, 5))
    g = Graph("attn")
    ins = [g.input(n, a.shape, a.dtype) for n, a in (("q", q), ("k", k), ("v", v))]
    if mask is not None:
        ins.append(g.input("m", mask.shape, mask.dtype))
    feeds = {"q": q, "k": k, "v": v, **({"m": mask} if mask is not None else {})}
    got = run1(g, g.attention(*ins), **feeds)
    np.testing.assert_allclose(got, naive_attention(q, k, v, mask, 0.5), rtol=1e-12)
    g2 = Graph("attn")
    got2 = run1(g2, g2.attention(*(g2.input(n, a.shape, "float64") for n, a in (("q", q), ("k", k), ("v", v))),
                                 scale=0.1), q=q, k=k, v=v)
    np.testing.assert_allclose(got2, naive_attention(q, k, v, None, 0.1), rtol=1e-12)


def test_attention_bool_mask_excludes_keys():
    q, k = np.zeros((1, 2), np.float32), np.zeros((3, 2), np.float32)
    v = np.array([[1.0], [10.0], [100.0]], np.float32)
    g = Graph("attn")
    ins = [g.input("q", (1, 2)), g.input("k", (3, 2)), g.input("v", (3, 1)), g.input("m", (1, 3), "bool")]
    got = run1(g, g.attention(*ins), q=q, k=k, v=v, m=np.array([[True, False, True]]))
    assert got.tolist() == [[50.5]]


# ----------------------------------------------------------------------------- evaluate's contract
def _mlp() -> Graph:
    g = Graph("mlp")
    x = g.input("x", (2, 3), "float32")
    w = g.param("w", np.arange(6, dtype=np.float32).reshape(3, 2))
    g.set_outputs([g.relu(g.add(g.matmul(x, w), g.constant(np.array([1.0, -100.0], np.float32)))),
                   g.reduce_sum(g.cast(x, "int32"))])
    return g


def test_evaluate_names_missing_and_unknown_inputs():
    with pytest.raises(InputError, match=r"missing \['x'\]"):
        evaluate(_mlp(), {})
    with pytest.raises(InputError, match=r"unknown \['y'\]"):
        evaluate(_mlp(), {"x": np.zeros((2, 3), np.float32), "y": 1})
    with pytest.raises(InputError, match=r"input 'x': expected shape \(2, 3\)"):
        evaluate(_mlp(), {"x": np.zeros((3, 2), np.float32)})
    with pytest.raises(InputError, match="expected dtype int32"):
        g = Graph("i")
        g.set_outputs([g.neg(g.input("i", (2,), "int32"))])
        evaluate(g, {"i": np.zeros(2, np.float32)})


def test_evaluate_params_constants_and_overrides():
    g = _mlp()
    x = np.ones((2, 3), np.float32) * 1.6
    before = x.copy()
    out, total = evaluate(g, {"x": x})
    np.testing.assert_allclose(out, [[1.6 * 6 + 1, 0], [1.6 * 6 + 1, 0]], rtol=1e-6)
    assert total.dtype == np.int32 and int(total) == 6 and total.shape == ()
    np.testing.assert_array_equal(x, before)
    out2, _ = evaluate(g, {"x": x}, params={"w": np.ones((3, 2), np.float32)})
    np.testing.assert_allclose(out2[:, 0], 1.6 * 3 + 1, rtol=1e-6)
    with pytest.raises(InputError, match="no param"):
        evaluate(g, {"x": x}, params={"nope": 1})
    with pytest.raises(InputError, match="param 'w'"):
        evaluate(g, {"x": x}, params={"w": np.ones((3, 2), np.float64)})


def test_evaluate_rounds_inputs_to_the_declared_dtype_and_returns_fresh_arrays():
    g = Graph("id")
    x = g.input("x", (2,), "float16")
    g.set_outputs([g.reshape(x, (2,))])
    (out,) = evaluate(g, {"x": np.array([0.1, 1 / 3])})
    assert out.tolist() == [0.0999755859375, 0.333251953125]
    feed = np.array([1.0, 2.0], np.float64)
    g2 = Graph("id64")
    g2.set_outputs([g2.reshape(g2.input("x", (2,), "float64"), (2,))])
    (out,) = evaluate(g2, {"x": feed})
    out[0] = 99.0
    assert feed[0] == 1.0


# ============================================================================= the conformance kit
from rlx_core import testing as kit  # noqa: E402 - kept next to its tests
from rlx_core.testing import LoopbackBackend, LoopbackExecutable  # noqa: E402


def test_importing_rlx_core_imports_neither_hypothesis_nor_the_kit():
    code = ("import sys, rlx_core; assert 'hypothesis' not in sys.modules, 'hypothesis'; "
            "assert 'rlx_core.testing' not in sys.modules, 'testing'; rlx_core.testing.check_backend")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_kit_passes_on_the_loopback_backend():
    report = kit.check_backend(LoopbackBackend())
    assert report.ok and not report.skipped, report.summary()
    assert "any_size" not in {r.name for r in report.results}  # (no compile_symbolic: not its business)
    claimed = {r.name for r in report.results if r.name.startswith("op:")}
    assert claimed == {f"op:{op}" for op in LoopbackBackend().supported_ops()}
    n_ops = len(set(rlx_core.OpKind) - rlx_core.ir.ops.SOURCE_OPS)  # every op, the internal ones included
    assert len(claimed) == n_ops
    assert f"{n_ops} known ops claimed" in report["supported_ops"].message


def test_kit_passes_with_other_seeds():
    assert kit.check_backend(LoopbackBackend(), ["add", "conv2d", "attention"], max_examples=10, seed=7).ok


def test_iter_checks_yields_named_callables():
    checks = dict(kit.iter_checks(LoopbackBackend(), ops=["relu", "myop"], max_examples=5))
    assert list(checks) == ["api", "probe", "supported_ops", "claims", "cost_model", "op:relu", "op:myop",
                            "set_param", "concurrent_runs"]
    assert checks["op:relu"]().outcome == "passed"
    with pytest.raises(kit.CheckSkipped, match="no generator for op 'myop'"):
        checks["op:myop"]()


class _AnySizeLoopback(LoopbackBackend):
    """Runs symbolic graphs itself: the reference interpreter binds the sizes per run."""

    def __init__(self, rows_wrong: bool = False) -> None:
        self.rows_wrong = rows_wrong

    def compile_symbolic(self, graph, options):
        exe = LoopbackExecutable(graph)
        if self.rows_wrong:  # one row too few at every size
            exe.run = lambda inputs: [o[:-1] for o in LoopbackExecutable.run(exe, inputs)]
        return exe


def test_the_any_size_check_holds_a_backend_that_runs_symbolic_graphs_to_every_size():
    assert kit.check_backend(_AnySizeLoopback(), ops=["add"])["any_size"].outcome == "passed"
    check = dict(kit.iter_checks(_AnySizeLoopback(rows_wrong=True), ops=["add"]))["any_size"]
    with pytest.raises(AssertionError, match=r"add at 1 row\(s\) on the executable for every size: output 0 has "
                                             r"shape \(0, 4\), expected \(1, 4\)"):
        check()


@kit.parametrize_checks(LoopbackBackend(), ops=["add", "softmax", "slice"], max_examples=5)
def test_parametrize_checks_on_loopback(check):
    check()


# ----------------------------------------------------------------------------- broken backends
def _broken(run=None, **overrides):
    """A loopback backend whose executable's run is ``run(self, inputs)`` and whose other
    attributes are ``overrides``."""
    exe_cls = type("BrokenExecutable", (LoopbackExecutable,), {"run": run} if run else {})
    attrs = {"name": "broken", "compile": lambda self, graph, options: exe_cls(graph), **overrides}
    return type("BrokenBackend", (LoopbackBackend,), attrs)()


def _failure(backend, name, ops=("add",), **kwargs) -> str:
    report = kit.check_backend(backend, ops, max_examples=10, raise_on_failure=False, **kwargs)
    result = report[name]
    assert result.outcome == "failed", report.summary()
    return result.message


def test_kit_catches_a_wrong_output_dtype():
    def run(self, inputs):
        return [np.asarray(o, np.float64) for o in LoopbackExecutable.run(self, inputs)]

    msg = _failure(_broken(run), "op:exp", ops=["exp"])
    assert "backend 'broken'" in msg and "exp(" in msg and "dtype float64, expected float" in msg


@pytest.mark.slow
def test_kit_catches_a_wrong_output_shape_and_count():
    def run(self, inputs):
        return [o.reshape(1, *o.shape) for o in LoopbackExecutable.run(self, inputs)]

    assert "has shape (1," in _failure(_broken(run), "op:add")

    def run_two(self, inputs):
        return LoopbackExecutable.run(self, inputs) * 2

    assert "returned 2 outputs for 1" in _failure(_broken(run_two), "op:add")


def test_kit_catches_wrong_values_for_one_op_only():
    def run(self, inputs):
        outs = LoopbackExecutable.run(self, inputs)
        node = self.graph.node(self.graph.outputs[0])
        if node.op == "exp":
            outs = [np.asarray(o * 1.001, o.dtype) for o in outs]
        return outs

    report = kit.check_backend(_broken(run), ["add", "exp", "tanh"], max_examples=10, raise_on_failure=False)
    assert [r.name for r in report.failed] == ["op:exp"]
    msg = report["op:exp"].message
    assert "out of tolerance" in msg and "max error" in msg and "exp(x: (" in msg
    with pytest.raises(AssertionError, match=r"failed 1 of .*\n  - op:exp: backend 'broken', exp\(x: "):
        kit.check_backend(_broken(run), ["add", "exp", "tanh"], max_examples=10)


def test_kit_catches_integer_division_that_floors():
    def run(self, inputs):
        node = self.graph.node(self.graph.outputs[0])
        outs = LoopbackExecutable.run(self, inputs)
        if node.op == "div" and node.dtype.startswith("int"):
            a, b = (inputs[n] if n in inputs else self.graph.value(self.graph.input_node(n).id) for n in "ab")
            outs = [np.asarray(np.floor_divide(a, b), node.dtype)]
        return outs

    assert "exact comparison" in _failure(_broken(run), "op:div", ops=["div"])


def test_kit_catches_a_backend_that_modifies_its_inputs():
    def run(self, inputs):
        outs = LoopbackExecutable.run(self, inputs)
        for v in inputs.values():
            v[...] = 0
        return outs

    assert "modified its input array(s)" in _failure(_broken(run), "op:add")


@pytest.mark.slow
def test_kit_reports_exceptions_from_compile_and_run():
    def compile_fails(self, graph, options):
        raise RuntimeError("no kernel for you")

    msg = _failure(_broken(compile=compile_fails), "op:add")
    assert "compile raised RuntimeError: no kernel for you" in msg

    def run(self, inputs):
        raise ValueError("device lost")

    assert "run raised ValueError: device lost" in _failure(_broken(run), "op:reshape", ops=["reshape"])


def test_kit_fails_a_raising_probe_and_skips_the_op_checks():
    def probe(self):
        raise OSError("driver exploded")

    report = kit.check_backend(_broken(probe=probe), ["add"], raise_on_failure=False)
    assert "probe() raised OSError: driver exploded" in report["probe"].message
    assert report["op:add"].outcome == "skipped" and "probe() failed" in report["op:add"].message
    with pytest.raises(AssertionError, match="probe"):
        kit.check_backend(_broken(probe=probe), ["add"])


def test_kit_fails_a_hanging_probe():
    def probe(self):
        time.sleep(5)

    report = kit.check_backend(_broken(probe=probe), ["add"], probe_timeout=0.2, raise_on_failure=False)
    assert "did not return in 0.2 s" in report["probe"].message


def test_kit_skips_op_checks_of_an_unavailable_backend():
    def probe(self):
        return rlx_core.Availability(False, "no such device here")

    report = kit.check_backend(_broken(probe=probe))  # does not raise: unavailable is a normal answer
    ops = [r for r in report.results if r.name.startswith("op:")]
    assert ops and all(r.outcome == "skipped" and "no such device here" in r.message for r in ops)
    assert report["probe"].outcome == "passed" and report["set_param"].outcome == "skipped"


@pytest.mark.slow
def test_kit_checks_metadata():
    assert "declares plugin API version 2" in _failure(_broken(api_version=2), "api")
    assert "invalid name" in _failure(_broken(name="bad name"), "api")
    assert "frozenset" in _failure(_broken(supported_ops=lambda self: {"add"}), "supported_ops")
    assert "returned None" in _failure(_broken(claims=lambda self, node: None), "claims")
    only_add = _broken(supported_ops=lambda self: frozenset({"add"}), claims=lambda self, node: True)
    assert "does not list" in _failure(only_add, "claims", ops=["add"])
    assert "without a reason" in _failure(_broken(probe=lambda self: rlx_core.Availability(False)), "probe")


def test_kit_checks_the_cost_model():
    assert "not an rlx_core.CostModel" in _failure(_broken(cost_model=lambda self: {"gflops": 1}), "cost_model")
    wrong_device = _broken(cost_model=lambda self: rlx_core.CostModel("cpu"))
    assert "expected 'broken'" in _failure(wrong_device, "cost_model")
    falling = rlx_core.CostModel("broken", sgemm_points=((8, 8, 8, 100.0), (1024, 1024, 1024, 1.0)), calibrated=True)
    assert "falls as problems grow" in _failure(_broken(cost_model=lambda self: falling), "cost_model")


def test_kit_checks_set_param():
    class IgnoresSetParam(LoopbackExecutable):
        def set_param(self, name, value):
            pass

    backend = _broken(compile=lambda self, graph, options: IgnoresSetParam(graph))
    assert "after set_param('w')" in _failure(backend, "set_param")
    report = kit.check_backend(_broken(compile=lambda self, graph, options: rlx_core.Executable()), ["add"],
                               raise_on_failure=False)
    assert report["op:add"].outcome == "failed"


def test_kit_skips_what_it_cannot_or_need_not_test():
    add_only = _broken(supported_ops=lambda self: frozenset({"add", "vendor_fused_thing"}))
    report = kit.check_backend(add_only, ["add", "softmax", "vendor_fused_thing"], max_examples=5)
    assert "does not claim 'softmax'" in report["op:softmax"].message
    assert "no generator for op 'vendor_fused_thing'" in report["op:vendor_fused_thing"].message
    decline_all = _broken(claims=lambda self, node: "float64 only")
    report = kit.check_backend(decline_all, ["add"], max_examples=5, raise_on_failure=False)
    assert report["op:add"].outcome == "skipped" and "declined every generated add node" in report["op:add"].message
    report = kit.check_backend(_broken(api_version=2), ["add"], expected_failures={"api": "v2 port in progress"},
                               max_examples=5)
    assert report["api"].message == "expected to fail: v2 port in progress"


# ----------------------------------------------------------------------------- the kit's generators
@pytest.mark.slow
def test_generated_dtypes_are_exactly_those_ops_accepts():
    """The kit tests every dtype ops.py accepts for an op, and only those: the contract's
    six by default (``OP_DTYPES``), the extended integers too for a backend declaring them."""
    from hypothesis import HealthCheck, given, settings

    from rlx_core.errors import GraphError
    from rlx_core.ir.dtypes import CONTRACT_DTYPES, DTYPES
    from rlx_core.testing._case_base import ALL_OP_DTYPES, OP_DTYPES
    from rlx_core.testing._cases import GENERATED_OPS, OpCase, Operand, op_cases

    assert set(OP_DTYPES) == set(GENERATED_OPS) == {op for op in rlx_core.OpKind} - rlx_core.ir.ops.SOURCE_OPS

    def draw(op) -> tuple[set[str], OpCase]:
        seen: set[str] = set()
        first: list[OpCase] = []

        @settings(max_examples=20, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
        @given(op_cases(op))
        def collect(case):
            seen.add(case.operands[op == "where"].array.dtype.name)  # where's operand 0 is its condition
            first[:] = first or [case]

        collect()
        return seen, first[0]

    for op in sorted(GENERATED_OPS):
        seen, case = draw(op)
        assert seen <= set(OP_DTYPES[op]), f"{op}: kit drew {sorted(seen)} outside its table {OP_DTYPES[op]}"
        accepted = set()
        main = case.operands[op == "where"].array.dtype
        for dtype in DTYPES:
            swap = [o.array.dtype == main and o.name not in ("cond", "indices") for o in case.operands]
            swapped = tuple(Operand(o.name, o.array.astype(dtype) if sw else o.array, o.param)
                            for o, sw in zip(case.operands, swap))
            try:
                OpCase(case.op, swapped, case.attrs).build()
                accepted.add(dtype)
            except GraphError:
                pass
        assert set(ALL_OP_DTYPES[op]) == accepted, (
            f"{op}: kit draws {ALL_OP_DTYPES[op]}, ops.py accepts {sorted(accepted)}")
        assert set(OP_DTYPES[op]) == accepted & set(CONTRACT_DTYPES), f"{op}: the contract table {OP_DTYPES[op]}"


def test_slice_index_helper_agrees_with_the_reference():
    from rlx_core.ir.ops import slice_index

    x = np.arange(5, dtype=np.int32)
    for start, end, step in itertools.product([*range(-7, 8), BIG, -BIG - 1], [-7, 0, 3, BIG], [-2, -1, 1, 2]):
        g = Graph("slice")
        out = g.slice(g.input("x", (5,), "int32"), [start], [end], steps=[step])
        assert x[slice_index(1, g.node(out).attrs)].tolist() == x.tolist()[start:end:step], (start, end, step)
