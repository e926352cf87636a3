"""The storage formats (bfloat16, float8, float4, 4- and 2-bit ints): cast and moved,
never computed in; run where declared (rlx-cpu), refused by name elsewhere; read from
ONNX's Cast, CastLike, QuantizeLinear and DequantizeLinear."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ml_dtypes")

import ml_dtypes

import rlx_core as rlx
from rlx_core.errors import GraphError, RlxError
from rlx_core.ir.dtypes import STORAGE_DTYPES, normalize_dtype

FLOATS = [d for d in STORAGE_DTYPES if not d.startswith(("int", "uint"))]
INTS = [d for d in STORAGE_DTYPES if d.startswith(("int", "uint"))]
RNG = np.random.default_rng(3)


def _values(dtype: str, n: int = 24) -> np.ndarray:
    """Values the format holds, its extremes and (floats) a NaN where it has one."""
    if dtype in INTS:
        info = ml_dtypes.iinfo(dtype)
        return np.resize(np.arange(info.min, info.max + 1), n).astype(dtype)
    info = ml_dtypes.finfo(dtype)
    x = np.concatenate([[float(info.max), float(info.min), 0.0], RNG.uniform(-4, 4, n - 3)]).astype(dtype)
    return x


@pytest.mark.parametrize("dtype", STORAGE_DTYPES)
def test_cast_both_ways_and_moves_on_cpu_as_ml_dtypes_does(dtype: str) -> None:
    g = rlx.Graph("s")
    x = g.input("x", (4, 6), dtype)
    f = g.input("f", (4, 6), "float32")
    moved = g.concat([g.transpose(g.reshape(x, (6, 4))), g.slice(x, starts=(1,), ends=(3,), axes=(0,))], axis=0)
    picked = g.gather(moved, g.constant(np.array([5, 0, 2], np.int64)), axis=0)
    chosen = g.where(g.constant(np.arange(6) % 2 == 0), picked, g.cast(g.slice(f, starts=(0,), ends=(3,), axes=(0,)),
                                                                        dtype))
    g.set_outputs([g.cast(x, "float32"), g.cast(f, dtype), chosen])
    xv = _values(dtype).reshape(4, 6)
    fv = RNG.uniform(-8, 8, (4, 6)).astype(np.float32)
    up, down, mixed = rlx.compile(g, device="cpu").run({"x": xv, "f": fv})
    assert up.dtype == np.float32 and down.dtype == np.dtype(dtype) and mixed.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(up, xv.astype(np.float32))
    np.testing.assert_array_equal(down.astype(np.float64), fv.astype(dtype).astype(np.float64))
    moved_np = np.concatenate([xv.reshape(6, 4).T, xv[1:3]], axis=0)[[5, 0, 2]]
    want = np.where(np.arange(6) % 2 == 0, moved_np, fv[:3].astype(dtype))
    np.testing.assert_array_equal(mixed.astype(np.float64), want.astype(np.float64))
    ref = rlx.reference.evaluate(g, {"x": xv, "f": fv})
    for got, r in zip((up, down, mixed), ref):
        np.testing.assert_array_equal(got.astype(np.float64), np.asarray(r, np.float64))


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "int4"])
def test_computing_in_a_storage_dtype_is_refused_by_name(dtype: str) -> None:
    g = rlx.Graph("s")
    x = g.input("x", (3,), dtype)
    for build in (lambda: g.add(x, x), lambda: g.exp(x), lambda: g.reduce_sum(x), lambda: g.matmul(x, x)):
        with pytest.raises(GraphError, match=rf"computes nothing in {dtype}, a storage dtype .*cast it to float32"):
            build()


def test_names_json_and_other_devices() -> None:
    assert normalize_dtype(ml_dtypes.bfloat16) == "bfloat16" == normalize_dtype(np.dtype("bfloat16"))
    g = rlx.Graph("s")
    w = g.param("w", np.array([1.5, -2.0, 3.0], dtype=ml_dtypes.bfloat16))
    g.set_outputs([g.cast(g.reshape(w, (3, 1)), "float32")])
    h = rlx.Graph.from_json(g.to_json())
    assert h.value(h.params[0]).dtype == np.dtype("bfloat16")
    (y,) = rlx.compile(h).run({})  # auto: only a backend that declares bfloat16 may run it
    np.testing.assert_array_equal(y.ravel(), [1.5, -2.0, 3.0])
    if "opencl" in rlx.default_registry().names() and rlx.get_backend("opencl").probe().available:
        with pytest.raises(RlxError, match="bfloat16"):
            rlx.compile(g, device="opencl")
