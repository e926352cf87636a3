"""int8 uint8 int16 uint16 uint32 uint64: exact in the reference and on the cpu backend
(numpy's fixed-width semantics: wrap-around, truncating division), through JSON, through
the ONNX importer, and in the conformance kit for backends that declare them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core import reference
from rlx_core.ir.dtypes import CONTRACT_DTYPES, EXTENDED_DTYPES, INT_DTYPES, is_int, itemsize, normalize_dtype

EXT = list(EXTENDED_DTYPES)


def test_dtype_facts() -> None:
    for d in EXT:
        assert normalize_dtype(np.dtype(d)) == d and is_int(d) and itemsize(d) == np.dtype(d).itemsize
    assert INT_DTYPES == {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
    for bad in ("float8_e8m0fnu", "complex64", "object"):  # (bfloat16, float8, int4: storage dtypes)
        with pytest.raises(rlx.GraphError, match="unsupported dtype"):
            normalize_dtype(bad)


def _edges(dtype: str) -> np.ndarray:
    """Values at both ends of the dtype's range, and some small ones of both signs."""
    info = np.iinfo(dtype)
    return np.array([info.min, info.max, info.max - 1, 0, 1, 7, info.min + 1, 100 if info.max > 100 else 3],
                    dtype=dtype)


def _all_ops_graph(dtype: str) -> rlx.Graph:
    g = rlx.Graph(f"ops_{dtype}")
    a, b = g.input("a", (8,), dtype), g.input("b", (8,), dtype)
    m = g.input("m", (2, 4), dtype)
    divisor = g.maximum(b, g.constant(np.ones((), dtype)))  # never 0
    signed = np.iinfo(dtype).min < 0
    outs = [
        g.add(a, b), g.sub(a, b), g.mul(a, b), g.div(a, divisor), g.div(a, g.constant(np.array(3, dtype))),
        g.maximum(a, b), g.minimum(a, b), g.neg(a), g.abs(a), g.relu(a),
        g.equal(a, b), g.less(a, b), g.greater(a, b),
        g.reduce_sum(m, axes=1), g.reduce_sum(m), g.reduce_max(m, axes=0, keepdims=True),
        g.matmul(m, g.transpose(m)),
        g.cast(a, "float64"), g.cast(a, "int64"), g.cast(a, "bool"), g.cast(a, "uint8"), g.cast(a, "int8"),
        g.cast(g.cast(a, "float32"), "float64"), g.cast(g.constant(np.array([1.9, 0.0, 42.7])), dtype),
        g.where(g.less(a, b), a, b), g.concat([a, b]), g.slice(a, [1], [7], steps=[2]),
        g.gather(m, g.constant(np.array([3, 0, -1], np.int64)), axis=1), g.reshape(m, (4, 2)),
        g.add(g.mul(a, a), g.neg(b)),  # an elementwise chain: the cpu fuses it
        g.relu(g.sub(g.abs(a), g.mul(b, 3))),
        g.cast(g.greater(a, b), dtype),
    ]
    if signed:
        outs.append(g.div(a, g.constant(np.array(-2, dtype))))
    g.set_outputs(outs)
    return g


@pytest.mark.parametrize("dtype", EXT)
def test_cpu_matches_the_reference_bit_for_bit(dtype: str) -> None:
    g = _all_ops_graph(dtype)
    rng = np.random.default_rng(len(dtype))
    info = np.iinfo(dtype)
    feeds = {"a": _edges(dtype), "b": rng.integers(info.min, info.max, size=8, dtype=dtype, endpoint=True),
             "m": rng.integers(info.min, info.max, size=(2, 4), dtype=dtype, endpoint=True)}
    want = reference.evaluate(g, feeds)
    got = rlx.compile(g, device="cpu").run(feeds)
    for i, (w, o) in enumerate(zip(want, got)):
        node = g.node(g.outputs[i])
        assert o.dtype == np.dtype(node.dtype), (i, node.op, o.dtype)
        np.testing.assert_array_equal(o, w.astype(node.dtype), err_msg=f"output {i}: {node.op} {node.dtype}")


@pytest.mark.parametrize("dtype", EXT)
def test_reference_semantics_are_numpys_fixed_width_ones(dtype: str) -> None:
    """Wrap-around add/mul/neg, truncating division (also at the signed minimum), sums that
    stay in the dtype; integers keep their dtype in the reference (no float64 detour)."""
    info = np.iinfo(dtype)
    g = rlx.Graph("sem")
    a, b = g.input("a", (3,), dtype), g.input("b", (3,), dtype)
    g.set_outputs([g.add(a, b), g.mul(a, b), g.neg(a), g.div(a, b), g.reduce_sum(a)])
    av = np.array([info.max, info.min, 7], dtype)
    bv = np.array([1, 3, 2], dtype)
    add, mul, neg, div, total = reference.evaluate(g, {"a": av, "b": bv})
    assert all(o.dtype == np.dtype(dtype) for o in (add, mul, neg, div, total))
    assert add[0] == info.min  # MAX + 1 wraps to MIN (0 for unsigned)
    assert mul[1] == np.array(info.min, dtype) * np.array(3, dtype)
    assert neg[2] == np.array(-7).astype(dtype)  # 2**bits - 7 for unsigned
    assert div.tolist() == [info.max, -(abs(info.min) // 3) if info.min else 0, 3]  # toward zero, not floor
    assert total == np.sum(av, dtype=dtype)


def test_json_round_trip_keeps_every_extended_dtype() -> None:
    g = rlx.Graph("json")
    x = g.input("x", (2, 3), "int8")
    p = g.param("p", np.array([[1, 2, 65535]] * 2, np.uint16))
    c = g.constant(np.array([2**64 - 1, 5, 0], np.uint64))
    y = g.add(g.cast(x, "int16"), g.cast(p, "int16"))
    g.set_outputs([y, g.add(c, g.constant(np.array(1, np.uint64))), g.cast(p, "uint32")])
    back = rlx.Graph.from_json(g.to_json())
    assert [n.dtype for n in back.nodes] == [n.dtype for n in g.nodes]
    feeds = {"x": np.array([[-128, 127, 0], [1, -1, 5]], np.int8)}
    for w, o in zip(reference.evaluate(g, feeds), reference.evaluate(back, feeds)):
        np.testing.assert_array_equal(w, o)
        assert w.dtype == o.dtype
    assert reference.evaluate(back, feeds)[1].tolist() == [0, 6, 1]  # uint64 MAX + 1 wraps, exactly


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "ext", inputs, outputs, initializer=inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_onnx_model_with_uint8_and_int8_inputs_imports_and_runs_like_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    nodes = [
        helper.make_node("Add", ["img", "bias"], ["wrapped"]),  # uint8 + uint8 wraps
        helper.make_node("Cast", ["wrapped"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["delta"], ["df"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "df"], ["scaled"]),
        helper.make_node("Mod", ["img", "seven"], ["rem"]),
        helper.make_node("ArgMin", ["delta"], ["where_min"], axis=1, keepdims=0),
        helper.make_node("ReduceMin", ["img"], ["lowest"], keepdims=0),
        helper.make_node("Cast", ["scaled"], ["back"], to=TensorProto.INT16),
    ]
    inputs = [helper.make_tensor_value_info("img", TensorProto.UINT8, [2, 4]),
              helper.make_tensor_value_info("delta", TensorProto.INT8, [2, 4])]
    outputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in
               [("scaled", TensorProto.FLOAT, [2, 4]), ("rem", TensorProto.UINT8, [2, 4]),
                ("where_min", TensorProto.INT64, [2]), ("lowest", TensorProto.UINT8, []),
                ("back", TensorProto.INT16, [2, 4]), ("wrapped", TensorProto.UINT8, [2, 4])]]
    inits = [helper.make_tensor("bias", TensorProto.UINT8, [4], [250, 6, 0, 128]),
             helper.make_tensor("seven", TensorProto.UINT8, [], [7])]
    model = _model(nodes, inputs, outputs, inits)
    onnx.checker.check_model(model)
    feeds = {"img": np.array([[10, 250, 0, 255], [128, 3, 77, 1]], np.uint8),
             "delta": np.array([[-128, 127, -1, 0], [5, -7, -7, 100]], np.int8)}
    graph = rlx_onnx.load(model)
    assert {graph.node(i).dtype for i in graph.inputs} == {"uint8", "int8"}
    got = rlx.compile(graph, device="cpu").run(feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for o, w in zip(got, want):
        assert o.dtype == w.dtype
        np.testing.assert_array_equal(o, w)


@pytest.mark.parametrize("code", [TensorProto.FLOAT8E8M0, TensorProto.STRING, TensorProto.COMPLEX64])
def test_onnx_dtypes_outside_the_ir_stay_refused_by_name(code: int) -> None:
    model = _model([helper.make_node("Identity", ["x"], ["y"])], [helper.make_tensor_value_info("x", code, [2])],
                   [helper.make_tensor_value_info("y", code, [2])])
    with pytest.raises(rlx.ModelError, match=rf"input 'x' has ONNX dtype {TensorProto.DataType.Name(code)}, which"):
        rlx_onnx.load(model)


# ----------------------------------------------------------------------------- the conformance kit
def _drawn(dtypes: frozenset[str] | None, op: str = "add", n: int = 80) -> set[str]:
    from hypothesis import HealthCheck, given, settings

    from rlx_core.testing._cases import op_cases

    seen: set[str] = set()

    @settings(max_examples=n, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(op_cases(op, 0, dtypes))
    def collect(case) -> None:  # type: ignore[no-untyped-def]
        seen.add(case.operands[0].array.dtype.name)

    collect()
    return seen


def test_the_kit_draws_extended_dtypes_only_for_a_backend_that_declares_them() -> None:
    assert _drawn(None) <= CONTRACT_DTYPES and _drawn(CONTRACT_DTYPES) <= CONTRACT_DTYPES
    wide = _drawn(rlx.get_backend("cpu").dtypes)
    assert wide & set(EXT), f"a backend declaring the extended dtypes was tested on {sorted(wide)} only"
    assert _drawn(rlx.get_backend("cpu").dtypes, "exp") <= {"float16", "float32", "float64"}  # float-only ops


def test_the_kit_fails_a_backend_that_declares_a_dtype_it_gets_wrong() -> None:
    """A backend that declares the extended integers but answers them in int64 fails the
    kit; the same backend declaring only the six passes (it never sees them)."""
    from rlx_core.testing import LoopbackBackend, LoopbackExecutable, check_backend

    class Widening(LoopbackExecutable):
        def run(self, inputs):  # type: ignore[no-untyped-def]
            outs = LoopbackExecutable.run(self, inputs)
            return [o.astype(np.int64) if o.dtype.name in EXTENDED_DTYPES else o for o in outs]

    def make(dtypes: frozenset[str]) -> rlx.Backend:
        attrs = {"name": "widening", "dtypes": dtypes, "compile": lambda self, graph, options: Widening(graph)}
        return type("WideningBackend", (LoopbackBackend,), attrs)()

    narrow = check_backend(make(CONTRACT_DTYPES), ["add"], max_examples=30, raise_on_failure=False)
    assert narrow["op:add"].outcome == "passed", narrow.summary()
    wide = check_backend(make(frozenset(rlx.dtypes.DTYPES)), ["add"], max_examples=30, raise_on_failure=False)
    assert wide["op:add"].outcome == "failed" and "expected " in wide["op:add"].message, wide.summary()
