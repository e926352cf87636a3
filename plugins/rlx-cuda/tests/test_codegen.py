"""The generated kernel bodies, compiled as host C++ and run against the reference.

What runs here is the exact text the GPU compiles (``ElementwiseKernel`` bodies), with
CuPy's indexing replaced by the harness's loop over pre-broadcast inputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_core.ir import Graph
from rlx_core.ir.ops import OpKind
from rlx_core.passes.internal_ops import make_instruction
from rlx_core.reference import evaluate
from rlx_core.testing._compare import mismatch
from rlx_cuda import nn_source as nn
from rlx_cuda.codegen import elementwise_source, single_op_program, used_inputs


def _kernel(host_cxx, name: str, src, dtypes: list[str]):
    used = used_inputs(src)
    return host_cxx.Kernel(name, src.body, [(f"x{i}", dtypes[i]) for i in used], out_dtype=src.out_dtype)


def _reference(program: tuple, arrays: list[np.ndarray]) -> np.ndarray:
    g = Graph("program")
    ins = [g.input(f"x{i}", a.shape, a.dtype.name) for i, a in enumerate(arrays)]
    node = g.add_node(OpKind.FUSED_ELEMENTWISE, [v.id for v in ins], {"program": program})
    g.set_outputs([node])
    return evaluate(g, {f"x{i}": a for i, a in enumerate(arrays)})[0]


def _check(host_cxx, cases: list[tuple[tuple, list[np.ndarray]]]) -> None:
    kernels = []
    for k, (program, arrays) in enumerate(cases):
        src = elementwise_source(program, [a.dtype.name for a in arrays], [a.shape for a in arrays])
        kernels.append((_kernel(host_cxx, f"case{k}", src, [a.dtype.name for a in arrays]), src))
    lib = host_cxx.build([k for k, _ in kernels])
    for (kernel, src), (program, arrays) in zip(kernels, cases):
        ref = _reference(program, arrays)
        got, err = host_cxx.run(lib, kernel, ref.shape, [arrays[i] for i in used_inputs(src)])
        assert err == 0, f"{program}: error flag {err}"
        assert got.dtype.name == src.out_dtype
        # the reference runs a region in float64; float16 intermediates bound the accuracy
        tol = "float16" if any(a.dtype == np.float16 for a in arrays) and got.dtype.kind == "f" else src.out_dtype
        why = mismatch(tol, got, ref)
        assert why is None, f"{program}:\n{src.body}\n{why}"


def _p(*instructions: tuple) -> tuple:
    return tuple(make_instruction(op, args, attrs) for op, args, attrs in instructions)


def test_every_single_op(host_cxx):
    rng = np.random.default_rng(0)
    pos = rng.uniform(0.2, 2.0, (3, 4)).astype(np.float32)
    x = rng.uniform(-2, 2, (3, 4)).astype(np.float32)
    row = rng.uniform(-2, 2, (4,)).astype(np.float32)
    x64 = x.astype(np.float64)
    cases = []
    for op in ("add", "sub", "mul", "div", "maximum", "minimum"):
        cases.append((single_op_program(op, 2, {}), [x, row]))
    cases.append((single_op_program("pow", 2, {}), [pos, row]))
    for op in ("neg", "abs", "tanh", "sigmoid", "relu", "erf", "exp"):
        cases.append((single_op_program(op, 1, {}), [x]))
        cases.append((single_op_program(op, 1, {}), [x64]))
    for op in ("log", "sqrt", "rsqrt"):
        cases.append((single_op_program(op, 1, {}), [pos]))
    for approx in ("none", "tanh"):
        cases.append((single_op_program("gelu", 1, {"approximate": approx}), [x]))
        cases.append((single_op_program("gelu", 1, {"approximate": approx}), [x.astype(np.float16)]))
    for op in ("equal", "less", "greater"):
        cases.append((single_op_program(op, 2, {}), [np.round(x), np.round(row)]))
    cond = rng.random((3, 4)) < 0.5
    cases.append((single_op_program("where", 3, {}), [cond, x, row]))
    for target in ("int32", "int64", "bool", "float16", "float64"):
        cases.append((single_op_program("cast", 1, {"dtype": target}), [np.where(cond, 0, x * 3).astype(np.float32)]))
    cases.append((single_op_program("cast", 1, {"dtype": "float32"}), [cond]))
    _check(host_cxx, cases)


def test_integers_and_nan(host_cxx):
    a = np.array([[7, -7, 7, -7, 0, 100]], np.int32)
    b = np.array([2, 2, -2, -2, 3, 7], np.int32)
    nan = np.array([np.nan, 1.0, -1.0, np.nan], np.float32)
    other = np.array([0.0, np.nan, 2.0, 5.0], np.float32)
    cases = [
        (single_op_program("div", 2, {}), [a, b]),  # truncation toward zero
        (single_op_program("div", 2, {}), [a.astype(np.int64), b.astype(np.int64)]),
        (single_op_program("abs", 1, {}), [a]),
        (single_op_program("neg", 1, {}), [a.astype(np.int64)]),
        (single_op_program("maximum", 2, {}), [a, b]),
        (single_op_program("relu", 1, {}), [a]),
        (single_op_program("maximum", 2, {}), [nan, other]),  # NaN from either side
        (single_op_program("minimum", 2, {}), [nan, other]),
        (single_op_program("relu", 1, {}), [nan]),
    ]
    _check(host_cxx, cases)


def test_integer_division_by_zero_sets_the_flag(host_cxx):
    src = elementwise_source(single_op_program("div", 2, {}), ["int32", "int32"])
    # CuPy declares raw *inputs* const: the flag it writes must be an output parameter.
    assert src.uses_error_flag and "rlx_err" not in src.in_params
    assert src.out_params == "raw int32 rlx_err, int32 out"
    kernel = _kernel(host_cxx, "div0", src, ["int32", "int32"])
    lib = host_cxx.build([kernel])
    _, err = host_cxx.run(lib, kernel, (3,), [np.array([1, 2, 3], np.int32), np.array([1, 0, 1], np.int32)])
    assert err == 1


def test_fused_programs_float16_rounds_per_instruction(host_cxx):
    rng = np.random.default_rng(1)
    h = rng.uniform(-3, 3, (2, 3, 4)).astype(np.float16)
    b = rng.uniform(-3, 3, (4,)).astype(np.float16)
    program = _p(("mul", (0, 1), {}), ("add", (2, 0), {}), ("tanh", (3,), {}), ("cast", (4,), {"dtype": "float32"}))
    dead = _p(("exp", (1,), {}), ("mul", (0, 1), {}), ("relu", (3,), {}))  # instruction 0 is dead
    _check(host_cxx, [(program, [h, b]), (dead, [h, b])])
    src = elementwise_source(dead, ["float16", "float16"], [h.shape, b.shape])
    assert src.n_instructions == 2 and "exp" not in src.body


def test_random_float32_programs(host_cxx):
    """Seeded random regions over broadcasting inputs: the structure (numbering, operand
    references, broadcasting) is what is under test."""
    rng = np.random.default_rng(7)
    unary = ["neg", "abs", "tanh", "sigmoid", "relu", "erf"]
    binary = ["add", "sub", "mul", "maximum", "minimum"]
    cases = []
    shapes = [(3, 5), (1, 5), (3, 1), ()]
    for _ in range(12):
        arrays = [rng.uniform(-2, 2, shapes[i]).astype(np.float32) for i in range(int(rng.integers(1, 5)))]
        n_in = len(arrays)
        program = []
        for k in range(int(rng.integers(2, 9))):
            avail = n_in + k
            if rng.random() < 0.5:
                program.append((str(rng.choice(unary)), (int(rng.integers(avail)),), {}))
            else:
                program.append((str(rng.choice(binary)), (int(rng.integers(avail)), int(rng.integers(avail))), {}))
        cases.append((_p(*program), arrays))
    _check(host_cxx, cases)


def _graph_ref(build, arrays: dict[str, np.ndarray]) -> np.ndarray:
    g = Graph("ref")
    ins = {k: g.input(k, v.shape, v.dtype.name) for k, v in arrays.items()}
    g.set_outputs([build(g, ins)])
    return evaluate(g, arrays)[0]


def test_gather(host_cxx):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    idx = np.array([[0, -1], [4, 2]], np.int64)
    src = nn.gather_source("float32", "int64", 5, idx.size, 3)
    kernel = host_cxx.Kernel("gather", src.body, raw_inputs=[("x", "float32"), ("idx", "int64")])
    bad = host_cxx.Kernel("gather_bad", src.body, raw_inputs=[("x", "float32"), ("idx", "int64")])
    assert "rlx_err" not in src.in_params and src.out_params == "raw int32 rlx_err, float32 out"  # not const
    lib = host_cxx.build([kernel, bad])
    ref = _graph_ref(lambda g, i: g.gather(i["x"], i["idx"], axis=1), {"x": x, "idx": idx})
    got, err = host_cxx.run(lib, kernel, ref.shape, raw=[x, idx])
    assert err == 0 and mismatch("float32", got, ref) is None
    _, err = host_cxx.run(lib, bad, ref.shape, raw=[x, np.array([[0, 5], [1, -6]], np.int64)])
    assert err == 2


POOL_CASES = [
    # kernel, stride, padding, dilation, ceil_mode, count_include_pad
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, False),
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True, True),
    ((2, 3), (2, 1), (0, 1, 0, 1), (2, 1), True, False),
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), True, True),
]


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pooling(host_cxx, kind):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    x[0, 0, 2, 2] = np.nan
    kernels, refs = [], []
    for k, (kern, stride, pad, dil, ceil, cip) in enumerate(POOL_CASES):
        if kind == "max":
            attrs = {"kernel": kern, "stride": stride, "padding": pad, "dilation": dil, "ceil_mode": ceil}
            ref = _graph_ref(lambda g, i, attrs=attrs: g.max_pool2d(i["x"], **attrs), {"x": x})
            src = nn.pool_source("max", "float32", (7, 6), ref.shape[2:], kern, stride, pad, dil)
        else:
            attrs = {"kernel": kern, "stride": stride, "padding": pad, "ceil_mode": ceil, "count_include_pad": cip}
            ref = _graph_ref(lambda g, i, attrs=attrs: g.avg_pool2d(i["x"], **attrs), {"x": x})
            src = nn.pool_source("avg", "float32", (7, 6), ref.shape[2:], kern, stride, pad, count_include_pad=cip)
        kernels.append(host_cxx.Kernel(f"pool{k}", src.body, raw_inputs=[("x", "float32")]))
        refs.append(ref)
    lib = host_cxx.build(kernels)
    for kernel, ref, case in zip(kernels, refs, POOL_CASES):
        got, _ = host_cxx.run(lib, kernel, ref.shape, raw=[x])
        assert mismatch("float32", got, ref) is None, (case, mismatch("float32", got, ref))


@pytest.mark.parametrize("groups,stride,padding,dilation", [(1, (1, 1), (1, 1, 1, 1), (1, 1)),
                                                            (2, (2, 1), (0, 1, 2, 0), (1, 2))])
def test_im2col_then_gemm_is_conv2d(host_cxx, groups, stride, padding, dilation):
    rng = np.random.default_rng(4)
    n, c, h, w, o, kh, kw = 2, 4, 6, 5, 6, 3, 2
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c // groups, kh, kw)).astype(np.float32)
    ref = _graph_ref(lambda g, i: g.conv2d(i["x"], i["w"], stride=stride, padding=padding, dilation=dilation,
                                           groups=groups), {"x": x, "w": wt})
    oh, ow = ref.shape[2:]
    src = nn.im2col_source("float32", c, (h, w), (oh, ow), (kh, kw), stride, padding, dilation, groups)
    kernel = host_cxx.Kernel("im2col", src.body, raw_inputs=[("x", "float32")])
    lib = host_cxx.build([kernel])
    k = c // groups * kh * kw
    cols, _ = host_cxx.run(lib, kernel, (n, groups, k, oh * ow), raw=[x])
    got = np.matmul(wt.reshape(groups, o // groups, k), cols).reshape(n, o, oh, ow)
    assert mismatch("float32", got, ref, terms=k) is None


def test_reduction_and_row_sources_are_well_formed():
    for dtype in ("float16", "float32", "float64"):
        for mask in ("none", "bool", "add"):
            src = nn.softmax_source(dtype, mask)
            assert src.code.count("{") == src.code.count("}") and f'void {src.name}(' in src.code
            assert ("#include <cupy/float16.cuh>" in src.code) == (dtype == "float16")
        assert "rlx_block_sum" in nn.layer_norm_source(dtype, True).code
        for kind in ("sum", "mean", "max"):
            r = nn.reduction_source(kind, dtype)
            assert r.reduce_type == ("double" if dtype == "float64" else "float")
    assert nn.reduction_source("max", "int32").identity == "(-2147483647 - 1)"
    assert nn.reduction_source("sum", "int64").reduce_type == "long long"
    with pytest.raises(ValueError, match="reduce_mean needs a float dtype"):
        nn.reduction_source("mean", "int32")
    assert [nn.row_threads(n) for n in (1, 32, 33, 1000, 10**6)] == [32, 32, 64, 1024, 1024]
    assert math.prod((2, 3)) == 6
