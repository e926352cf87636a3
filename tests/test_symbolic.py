"""Symbolic dims: the expression type, shape inference with symbols, bind and specialize.

The yardstick throughout: a graph built with symbols and specialized to some sizes must
be exactly the graph built with those sizes (same ops, attrs, shapes), and must compute
the same numbers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_core as rlx
from rlx_core import reference
from rlx_core.errors import GraphError, InputError, ModelError
from rlx_core.ir.symbolic import (
    Sym,
    ceildiv,
    dim_eq,
    evaluate,
    exact_div,
    floordiv,
    free_symbols,
    from_obj,
    is_static,
    sym_max,
    sym_min,
    to_obj,
)

a, b, h = Sym("a"), Sym("b"), Sym("h")


# --------------------------------------------------------------------- the expression type
def test_canonical_forms_compare_equal():
    assert a * b == b * a and hash(a * b) == hash(b * a)
    assert a + a == 2 * a
    assert (a + 1) - 1 == a
    assert (a + 1) - a == 1 and type((a + 1) - a) is int
    assert a * 0 == 0 and type(a * 0) is int
    assert (2 * a) // 2 == a
    assert (2 * a + 3) // 2 == a + 1
    assert (a * b * 768) // (b * 12) == 64 * a
    assert sym_min(a, a) == a and sym_max(a, 1) == a and sym_min(a, 1) == 1
    assert sym_min(h, h + 1) == h and sym_max(h - 1, 0) == h - 1
    assert sym_max(a, sym_max(b, 3)) == sym_max(3, b, a)
    assert a != b and a != 1 and Sym("a") == a


def test_str_is_readable():
    assert str(a * b) == "a*b"
    assert str(3 * a * a - 2 * b + 1) == "3*a**2 - 2*b + 1"
    assert str(floordiv(h + 2, 2) + 1) == "h//2 + 2"
    assert str(floordiv(h - 1, 2) + 1) == "(h + 1)//2"
    assert str(floordiv(h, 3) * a) == "a*(h//3)"
    assert str(sym_max(a, b, 3)) == "max(3, a, b)"
    assert repr((a, 4)) == "(a, 4)"


def test_evaluate_free_symbols_and_helpers():
    e = floordiv(h - 3, 2) + 1
    assert evaluate(e, {"h": 10}) == (10 - 3) // 2 + 1 and evaluate(7, {}) == 7
    assert e.free_symbols == {"h"} and free_symbols((a * b, 3)) == {"a", "b"}
    assert is_static(3) and not is_static(a)
    assert dim_eq(a, a) is True and dim_eq(a + 1, a) is False and dim_eq(a, b) is None and dim_eq(a, 4) is None
    assert exact_div(a * b, 5) is None and exact_div(a * b, a) == b
    with pytest.raises(LookupError):
        evaluate(a + b, {"a": 1})
    with pytest.raises(TypeError):
        bool(a)
    with pytest.raises(ValueError):
        Sym("not a name")


def test_json_form_round_trips():
    for e in (a, 3, a * b + 2, floordiv(h - 1, 2) + 1, sym_min(h, 5), ceildiv(a * b, 4), sym_max(a, b) * a):
        obj = to_obj(e)
        assert from_obj(json.loads(json.dumps(obj))) == e
    assert to_obj(a) == "a"


_ops = st.sampled_from(["+", "-", "*", "//", "min", "max", "ceil"])


@st.composite
def _expressions(draw, depth=3):
    if depth == 0 or draw(st.booleans()):
        return draw(st.one_of(st.sampled_from([a, b, h]), st.integers(-5, 9)))
    op = draw(_ops)
    x, y = draw(_expressions(depth - 1)), draw(_expressions(depth - 1))
    if op in ("//", "ceil"):
        return op, x, draw(st.integers(1, 5))
    return op, x, y


def _build(tree):
    if not isinstance(tree, tuple):
        return tree, (lambda env, t=tree: evaluate(t, env))
    op, x, y = tree
    bx, fx = _build(x)
    if op == "//":
        return floordiv(bx, y), (lambda env: fx(env) // y)
    if op == "ceil":
        return ceildiv(bx, y), (lambda env: -(-fx(env) // y))
    by, fy = _build(y)
    table = {"+": (lambda p, q: p + q), "-": (lambda p, q: p - q), "*": (lambda p, q: p * q)}
    if op in table:
        return table[op](bx, by), (lambda env: table[op](fx(env), fy(env)))
    sym = sym_min if op == "min" else sym_max
    py = min if op == "min" else max
    return sym(bx, by), (lambda env: py(fx(env), fy(env)))


@settings(max_examples=300, deadline=None)
@given(_expressions(), st.integers(1, 40), st.integers(1, 40), st.integers(1, 40))
def test_expressions_evaluate_like_python_ints(tree, va, vb, vh):
    expr, direct = _build(tree)
    env = {"a": va, "b": vb, "h": vh}
    assert evaluate(expr, env) == direct(env)
    assert from_obj(to_obj(expr)) == expr


@settings(max_examples=300, deadline=None)
@given(_expressions(), _expressions(), st.integers(1, 40), st.integers(1, 40), st.integers(1, 40))
def test_lower_bounds_and_quotients_hold_for_every_size(tree, other, va, vb, vh):
    """``lower_bound`` (now through min, max and floor-division atoms) is a true bound, and
    ``exact_div`` (now by a divisor of several terms) is exact, at every size."""
    from rlx_core.ir.symbolic import lower_bound

    expr, _ = _build(tree)
    den, _ = _build(other)
    env = {"a": va, "b": vb, "h": vh}
    lo = lower_bound(expr)
    if lo is not None:
        assert evaluate(expr, env) >= lo
    q = exact_div(expr * den, den) if den != 0 else None
    if q is not None:
        assert evaluate(q, env) * evaluate(den, env) == evaluate(expr, env) * evaluate(den, env)


def test_lower_bound_reads_min_max_and_floor_atoms_and_division_by_a_sum():
    from rlx_core.ir.symbolic import lower_bound

    assert lower_bound(sym_min(a, 256)) == 1 and lower_bound(sym_max(a - 5, 2)) == 2
    assert lower_bound(floordiv(a, 5)) == 0 and lower_bound(3 * sym_min(a, b) - 2) == 1
    assert lower_bound(-sym_min(a, 4)) is None
    assert sym_max(sym_min(a, 256), 0) == sym_min(a, 256)  # max(., 0) of a positive min drops
    n = floordiv(a, 5)
    assert exact_div(32 * b * n - 32 * b, 16 * b * n - 16 * b) == 2
    assert exact_div(a + 1, a + 2) is None
    assert floordiv(floordiv(a, 5), 2) == floordiv(a, 10)  # one canonical form for nested floors


# --------------------------------------------------------------------- sized constants
def test_sized_constants_specialize_to_their_arrays_and_round_trip_json():
    g = rlx.Graph("sized")
    x = g.input("x", ("batch", "seq"), "int64")
    pos = g.sized_constant("arange", (Sym("seq"),), "int64", start=Sym("seq") - 1, delta=-1)
    fill = g.sized_constant("fill", (Sym("batch"), 1), "float32", value=0.5)
    dims = g.sized_constant("dims", (2,), "int64", values=(Sym("batch") * 2, 7))
    g.set_outputs([g.add(x, pos), g.add(g.cast(x, "float32"), fill), dims])
    with pytest.raises(GraphError, match=r"computed from the sizes \(arange, shape \[seq\]\)"):
        g.value(pos)
    spec = g.specialize({"batch": 2, "seq": 3})
    consts = [spec.value(n.id) for n in spec.nodes if n.op == "constant"]
    np.testing.assert_array_equal(consts[0], [2, 1, 0])
    np.testing.assert_array_equal(consts[1], np.full((2, 1), 0.5, np.float32))
    np.testing.assert_array_equal(consts[2], [4, 7])
    assert not consts[0].flags.writeable
    again = rlx.Graph.from_json(g.to_json())
    ids = np.arange(6).reshape(2, 3)
    for got, want in zip(reference.evaluate(again, {"x": ids}), reference.evaluate(g, {"x": ids})):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind,shape,dtype,params,message", [
    ("fill", (Sym("n"),), "float32", {"value": "x"}, "value must be a number"),
    ("fill", (Sym("n"),), "int64", {"value": 0.5}, "not exactly a int64"),
    ("fill", (Sym("n"),), "float32", {}, "takes value"),
    ("arange", (Sym("n"), 2), "int64", {"start": 0, "delta": 1}, "is 1-D"),
    ("arange", (Sym("n"),), "int64", {"start": 0, "delta": 0}, "delta is 0"),
    ("arange", (Sym("n"),), "float32", {"start": Sym("n"), "delta": 1.0}, "needs a number start"),
    ("dims", (2,), "float32", {"values": (1, 2)}, "holds int64 or int32"),
    ("dims", (3,), "int64", {"values": (Sym("n"), 2)}, "2 values for shape"),
    ("dims", (Sym("n"),), "int64", {"values": ()}, "static shape"),
    ("ramp", (2,), "int64", {}, "unknown sized constant 'ramp'"),
    ("fill", ("n m",), "int64", {"value": 1}, "must be an int or a symbolic dim"),
])
def test_sized_constants_refuse_bad_recipes_by_name(kind, shape, dtype, params, message):
    g = rlx.Graph("bad")
    g.input("x", ("n",), "float32")
    with pytest.raises(GraphError, match=message):
        g.sized_constant(kind, shape, dtype, **params)


# --------------------------------------------------------------------- building symbolically
def test_input_accepts_names_and_syms():
    g = rlx.Graph()
    x = g.input("x", ("batch", Sym("seq"), 64), "float32")
    assert x.shape == (Sym("batch"), Sym("seq"), 64)
    assert g.is_symbolic and g.symbols == ("batch", "seq")
    with pytest.raises(GraphError, match="sequence of ints"):
        g.input("y", ("not a name", 3))
    s = rlx.Graph()
    s.input("x", (2, 3))
    assert not s.is_symbolic and s.symbols == ()


def _rand(shape, dtype="float32", rng=None):
    rng = rng or np.random.default_rng(0)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith("int"):
        return rng.integers(0, 3, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _same_graph(got: rlx.Graph, want: rlx.Graph) -> None:
    assert len(got) == len(want)
    for gn, wn in zip(got.nodes, want.nodes):
        assert (gn.op, gn.inputs, gn.shape, gn.dtype, gn.name) == (wn.op, wn.inputs, wn.shape, wn.dtype, wn.name), gn
        assert dict(gn.attrs) == dict(wn.attrs), gn
    assert got.outputs == want.outputs and got.inputs == want.inputs and got.params == want.params


def _check(build, inputs, sizes_list):
    """``build(g, d)`` with ``d`` mapping a symbol name to itself (symbolic) or to a size."""
    names = sorted({n for spec in inputs.values() for n in spec[0] if isinstance(n, str)})
    sym = rlx.Graph("s")
    ins = {k: sym.input(k, shape, dtype) for k, (shape, dtype) in inputs.items()}
    sym.set_outputs(build(sym, ins, {n: Sym(n) for n in names}))
    assert sym.is_symbolic
    for sizes in sizes_list:
        static = rlx.Graph("s")
        sins = {k: static.input(k, tuple(sizes.get(d, d) for d in shape), dtype)
                for k, (shape, dtype) in inputs.items()}
        static.set_outputs(build(static, sins, sizes))
        spec = sym.specialize(sizes)
        _same_graph(spec, static)
        rng = np.random.default_rng(1)
        feed = {k: _rand(static.node(v.id).shape, v.dtype, rng) for k, v in sins.items()}
        assert sym.bind({k: v.shape for k, v in feed.items()}) == {k: v for k, v in sizes.items() if k in names}
        for got, want in zip(reference.evaluate(sym, feed), reference.evaluate(static, feed)):
            np.testing.assert_array_equal(got, want)
    return sym


SIZES = [{"n": 1, "m": 3}, {"n": 4, "m": 5}, {"n": 7, "m": 2}]


def test_elementwise_and_broadcasting():
    def build(g, x, d):
        y = g.add(x["x"], g.constant(np.ones((1, 3), np.float32)))
        z = g.mul(g.relu(y), x["v"])  # (n, 3) * (3,)
        return [g.maximum(z, 0.5), g.less(z, y), g.where(g.greater(z, 0.0), z, y)]

    _check(build, {"x": (("n", 3), "float32"), "v": ((3,), "float32")}, SIZES)


def test_matmul_transpose_and_reductions():
    def build(g, x, d):
        y = g.matmul(x["x"], x["w"])  # (n, m, 4) @ (4, 6)
        t = g.transpose(y, (1, 0, 2))
        return [g.reduce_sum(t, axes=1), g.reduce_max(y, axes=(0, 2), keepdims=True), g.reduce_mean(y),
                g.softmax(y, axis=1), g.matmul(y, g.transpose(y, (0, 2, 1)))]

    _check(build, {"x": (("n", "m", 4), "float32"), "w": ((4, 6), "float32")}, SIZES)


def test_layer_norm_gelu_cast_gather():
    def build(g, x, d):
        y = g.layer_norm(x["x"], np.ones(8, np.float32), np.zeros(8, np.float32))
        idx = g.constant(np.array([0, 0], np.int64))
        return [g.gelu(y, "tanh"), g.cast(y, "float16"), g.gather(y, idx, axis=0), g.gather(y, x["i"], axis=1)]

    _check(build, {"x": (("n", 8), "float32"), "i": (("m",), "int64")}, SIZES)


def test_concat_and_reshape():
    def build(g, x, d):
        c = g.concat([x["x"], x["y"], x["x"]], axis=0)  # (2n + m, 4)
        r = g.reshape(x["z"], (d["n"], d["m"], -1))  # (n, m, 12, 64) -> (n, m, 768)
        f = g.reshape(r, (d["n"] * d["m"], 768))
        back = g.reshape(f, (-1, 12, 64))
        return [c, r, f, back, g.reshape(x["z"], (-1,))]

    ins = {"x": (("n", 4), "float32"), "y": (("m", 4), "float32"), "z": (("n", "m", 12, 64), "float32")}
    g = _check(build, ins, SIZES)
    assert g.node(g.outputs[1]).shape == (Sym("n"), Sym("m"), 768)
    assert g.node(g.outputs[2]).shape == (Sym("n") * Sym("m"), 768)


@pytest.mark.parametrize("starts,ends,steps", [
    ((1,), (-1,), (1,)), ((0,), (2,), (1,)), ((-3,), (2**63 - 1,), (1,)), ((-1,), (-2**63,), (-1,)),
    ((2,), (0,), (-1,)), ((0,), (100,), (3,)), ((-2,), (-9,), (-2,)), ((5,), (1,), (1,)),
])
def test_slice_on_symbolic_dims(starts, ends, steps):
    def build(g, x, d):
        return [g.slice(x["x"], starts, ends, (0,), steps), g.slice(x["x"], (1,), (-1,), (1,))]

    _check(build, {"x": (("n", 5), "float32")}, [{"n": v} for v in (1, 2, 3, 6, 11)])


def test_conv_and_pools():
    def build(g, x, d):
        w = np.ones((4, 2, 3, 3), np.float32)
        c = g.conv2d(x["x"], w, np.zeros(4, np.float32), stride=2, padding=1)
        return [c, g.max_pool2d(x["x"], 3, 2, padding=1, ceil_mode=True), g.avg_pool2d(x["x"], 2, ceil_mode=True),
                g.max_pool2d(c, 2), g.global_avg_pool2d(c), g.conv2d(x["x"], w, dilation=2)]

    _check(build, {"x": (("n", 2, "h", "w"), "float32")},
           [{"n": 1, "h": 5, "w": 5}, {"n": 2, "h": 8, "w": 6}, {"n": 1, "h": 9, "w": 12}])


def test_conv_window_must_fit():
    g = rlx.Graph()
    x = g.input("x", (1, 1, "h", 4))
    g.set_outputs(g.conv2d(x, np.ones((1, 1, 3, 3), np.float32)))
    assert [str(c) for c in g.constraints] == ["h >= 3"]
    with pytest.raises(InputError, match="h >= 3"):
        g.bind({"x": (1, 1, 2, 4)})


def test_attention():
    def build(g, x, d):
        return [g.attention(x["q"], x["k"], x["k"]), g.attention(x["q"], x["k"], x["k"], mask=x["mask"])]

    ins = {"q": (("n", 2, "m", 8), "float32"), "k": (("n", 2, "l", 8), "float32"), "mask": (("m", "l"), "bool")}
    _check(build, ins, [{"n": 1, "m": 3, "l": 5}, {"n": 2, "m": 1, "l": 2}])


# --------------------------------------------------------------------- constraints and bind
def _add_graph():
    g = rlx.Graph()
    g.set_outputs(g.add(g.input("x", ("batch", 4)), g.input("y", ("n", 4))))
    return g


def test_broadcasting_two_symbols_records_a_constraint():
    g = _add_graph()
    assert [str(c) for c in g.constraints] == ["n == batch"]
    assert g.node(g.outputs[0]).shape == (Sym("batch"), 4)
    assert g.bind({"x": (3, 4), "y": (3, 4)}) == {"batch": 3, "n": 3}
    with pytest.raises(InputError, match=r"constraint n == batch \(from add node 2: broadcasting .*batch = 3, n = 5"):
        g.bind({"x": (3, 4), "y": (5, 4)})
    with pytest.raises(GraphError, match="n == batch"):
        g.specialize({"batch": 3, "n": 5})


def test_symbol_against_int_records_equality_not_broadcast():
    g = rlx.Graph()
    y = g.add(g.input("x", ("n", 4)), g.constant(np.ones((3, 1), np.float32)))
    assert y.shape == (3, 4) and [str(c) for c in g.constraints] == ["n == 3"]
    with pytest.raises(GraphError, match="do not broadcast"):
        g.add(g.input("z", ("n", 4)), g.constant(np.ones((3, 5), np.float32)))


def test_bind_names_the_conflict():
    g = rlx.Graph()
    x = g.input("x", ("batch", 4))
    m = g.input("mask", ("batch",), "bool")
    g.set_outputs([x, m])
    with pytest.raises(InputError, match=r"input 'mask' dim 0 \('batch'\): 3, but input 'x' gave batch = 8"):
        g.bind({"x": (8, 4), "mask": (3,)})
    with pytest.raises(InputError, match="input 'x': expected rank 2"):
        g.bind({"x": (8, 4, 1), "mask": (8,)})
    with pytest.raises(InputError, match="input 'x' dim 1: expected 4"):
        g.bind({"x": (8, 5), "mask": (8,)})
    with pytest.raises(InputError, match=r"missing \['mask'\]"):
        g.bind({"x": (8, 4)})
    with pytest.raises(GraphError, match="needs a value for symbol"):
        g.specialize({})


def test_reshape_records_element_count_and_refuses_inexact_division():
    g = rlx.Graph()
    x = g.input("x", ("n", 6))
    y = g.reshape(x, ("k", 2, 3))
    assert [str(c) for c in g.constraints] == ["6*k == 6*n"]
    g.set_outputs(y)
    with pytest.raises(InputError, match="symbol 'k'"):
        g.bind({"x": (2, 6)})
    with pytest.raises(GraphError, match=r"reshape: cannot reshape \(n, 6\) \(6\*n elements\) to \(4, -1\)"):
        g.reshape(x, (4, -1))
    assert g.reshape(x, (3, -1)).shape == (3, 2 * Sym("n"))


def test_expression_dims_in_inputs_are_checked():
    g = rlx.Graph()
    x = g.input("x", ("n", 4))
    y = g.input("y", (Sym("n") * 2, 4))
    g.set_outputs(g.concat([x, x, y], axis=0))
    assert g.bind({"x": (3, 4), "y": (6, 4)}) == {"n": 3}
    with pytest.raises(InputError, match=r"input 'y' dim 0 \(2\*n\): 5, but the other inputs give 2\*n = 6"):
        g.bind({"x": (3, 4), "y": (5, 4)})
    assert g.node(g.outputs[0]).shape == (4 * Sym("n"), 4)


# --------------------------------------------------------------------- JSON, summary, evaluate
def _symbolic_graph():
    g = rlx.Graph("sym")
    x = g.input("x", ("batch", "seq", 768))
    r = g.reshape(x, ("batch", "seq", 12, -1))
    s = g.slice(g.reshape(r, (Sym("batch") * Sym("seq"), 768)), (1,), (-1,), (0,))
    y = g.add(s, g.input("y", ("n", 768)))
    g.set_outputs([y, g.max_pool2d(r, 2, ceil_mode=True)])
    return g


def test_json_round_trip_keeps_symbols_and_constraints():
    g = _symbolic_graph()
    text = g.to_json()
    doc = json.loads(text)
    assert doc["nodes"][0]["shape"] == ["batch", "seq", 768]
    back = rlx.Graph.from_json(text)
    assert back.to_json() == text and back.summary() == g.summary()
    assert [str(c) for c in back.constraints] == [str(c) for c in g.constraints]
    _same_graph(back.specialize({"batch": 2, "seq": 3, "n": 4}), g.specialize({"batch": 2, "seq": 3, "n": 4}))


def test_json_of_static_graphs_is_unchanged_and_bad_dims_refused():
    g = rlx.Graph("st")
    g.set_outputs(g.reshape(g.input("x", (2, 3)), (3, 2)))
    assert json.loads(g.to_json())["nodes"][0]["shape"] == [2, 3]
    assert '"shape": [3, 2]' in g.to_json()
    doc = json.loads(g.to_json())
    doc["nodes"][0]["shape"] = [{"poly": "bad"}, 3]
    with pytest.raises(ModelError, match="node 0"):
        rlx.Graph.from_json(json.dumps(doc))


def test_summary_prints_symbolic_dims():
    text = _symbolic_graph().summary()
    assert "input() 'x' : float32[batch, seq, 768]" in text
    assert "shape=(batch, seq, 12, 64)" in text
    assert "float32[batch*seq, 768]" in text


def test_reference_evaluates_a_symbolic_graph():
    g = _symbolic_graph()
    x, y = np.random.default_rng(0).standard_normal((2, 3, 768)), np.ones((4, 768))
    out = reference.evaluate(g, {"x": x, "y": y})
    np.testing.assert_allclose(out[0], x.reshape(6, 768).astype(np.float32)[1:-1] + 1)
    with pytest.raises(InputError, match="n == "):
        reference.evaluate(g, {"x": x, "y": np.ones((5, 768))})
    with pytest.raises(InputError, match="missing"):
        reference.evaluate(g, {"x": x})


def test_specialize_shares_params_and_keeps_ids():
    g = rlx.Graph()
    w = g.param("w", np.ones((4, 2), np.float32))
    g.set_outputs(g.matmul(g.input("x", ("n", 4)), w))
    s = g.specialize({"n": 3})
    assert s.value(w.id) is g.value(w.id) and not s.frozen and not s.is_symbolic
    assert s.node(g.outputs[0]).shape == (3, 2)


# --------------------------------------------------------------------- random chains
@st.composite
def _chain(draw):
    steps = draw(st.lists(st.sampled_from(["add", "mul", "matmul", "reshape", "transpose", "relu"]),
                          min_size=1, max_size=6))
    return steps


@settings(max_examples=40, deadline=None)
@given(_chain(), st.integers(1, 5), st.integers(1, 5))
def test_random_chains_agree_with_the_static_build(steps, n, m):
    def build(g, x, d):
        y = x["x"]  # (n, m, 4): keeps rank 3, last dim 4
        for step in steps:
            if step == "add":
                y = g.add(y, x["x"])
            elif step == "mul":
                y = g.mul(y, g.constant(np.full((1, 1, 4), 0.5, np.float32)))
            elif step == "matmul":
                y = g.matmul(y, g.constant(np.eye(4, dtype=np.float32)[::-1].copy()))
            elif step == "reshape":
                y = g.reshape(g.reshape(y, (-1, 2)), (d["n"], d["m"], -1))
            elif step == "transpose":
                y = g.transpose(g.transpose(y, (1, 0, 2)), (1, 0, 2))
            else:
                y = g.relu(y)
        return [y]

    _check(build, {"x": (("n", "m", 4), "float32")}, [{"n": n, "m": m}])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(0, 2), st.integers(0, 2), st.integers(1, 3), st.booleans())
def test_window_arithmetic_matches_the_static_rule(k, s, p0, p1, d, ceil):
    from rlx_core.ir.ops import OpKind, _window_out
    from rlx_core.ir.shape_rules import recording, window_out

    if ceil and 2 * max(p0, p1) > (k - 1) * d + 1:  # pools (the ceil mode) keep padding within half the window
        return
    with recording():
        out = window_out(OpKind.MAX_POOL2D, h, k, s, p0, p1, d, ceil)
    for size in range(1, 25):
        if size + p0 + p1 - d * (k - 1) - 1 >= 0:
            assert evaluate(out, {"h": size}) == _window_out(OpKind.MAX_POOL2D, size, k, s, p0, p1, d, ceil)
