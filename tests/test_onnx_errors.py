"""Bad models: each is a clear ``ModelError`` naming what is at fault, raised before any large allocation."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto, helper
from test_onnx_support import init, make_model, vi

import rlx_core
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import InputError, ModelError, RlxError
from rlx_core.onnx._versions import newest_opset


def _relu_model(shape: tuple = (2, 3)) -> object:
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="act")], [vi("x", "float32", shape)],
                      [vi("y", "float32", None)])


def test_every_unsupported_op_is_listed_once_with_a_node() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("ImageDecoder", ["a"], ["b"], name="es1"),
        helper.make_node("ImageDecoder", ["b"], ["c"], name="es2"),
        helper.make_node("TfIdfVectorizer", ["c"], ["d"]),
        helper.make_node("FusedGemm", ["d"], ["y"], name="fg", domain="com.microsoft"),
    ]
    model = make_model(nodes, [vi("x", "float32", [2, 2])], [vi("y", "float32", None)])
    with pytest.raises(ModelError) as info:
        rlx_onnx.load(model)
    msg = str(info.value)
    assert "unsupported ONNX ops" in msg
    assert "ImageDecoder (node 'es1' and 1 more)" in msg
    assert "TfIdfVectorizer (node #3 -> 'd')" in msg
    assert "com.microsoft::FusedGemm (node 'fg')" in msg
    assert msg.count("ImageDecoder") == 1 and "Relu" not in msg


@pytest.mark.parametrize("data", [b"", b"hello, this is not a model", b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'}",
                                  bytes(range(256))])
def test_not_an_onnx_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    with pytest.raises(ModelError, match=r"bad.onnx"):
        rlx_onnx.load(path)


def test_truncated_file_at_every_cut(tmp_path: Path) -> None:
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", "float32", [2, 4])],
                       [vi("y", "float32", None)], [init("w", np.ones((4, 3), np.float32))])
    data = model.SerializeToString()
    path = tmp_path / "cut.onnx"
    for cut in range(0, len(data) - 1, 7):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelError, match=r"cut.onnx"):
            rlx_onnx.load(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_a_file_that_cannot_be_mapped_is_read(tmp_path: Path) -> None:
    """A named pipe (a model streamed in) cannot be memory-mapped: it is read instead."""
    data = _relu_model().SerializeToString()
    path = tmp_path / "piped.onnx"
    os.mkfifo(path)
    writer = threading.Thread(target=path.write_bytes, args=(data,))
    writer.start()
    try:
        g = rlx_onnx.load(path)
    finally:
        writer.join(10)
    assert [g.node(i).op.value for i in g.outputs] == ["relu"]


def test_missing_file_and_wrong_type(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        rlx_onnx.load(tmp_path / "nope.onnx")
    with pytest.raises(ModelError, match=r"expected a path, bytes or onnx.ModelProto"):
        rlx_onnx.load(12)  # type: ignore[arg-type]


@pytest.mark.parametrize("opset", [6, newest_opset() + 1])
def test_opset_out_of_range(opset: int) -> None:
    model = _relu_model()
    model.opset_import[0].version = opset
    with pytest.raises(ModelError, match=f"opset {opset} is not supported"):
        rlx_onnx.load(model)


def test_bad_dims_name_the_key_and_the_fault() -> None:
    model = _relu_model(("batch", 3))
    assert rlx_onnx.load(model).symbols == ("batch",)  # left unbound: symbolic (test_onnx_dynamic.py)
    with pytest.raises(ModelError, match="not a symbolic dim of the model"):
        rlx_onnx.load(model, dims={"batch": 2, "seq": 4})
    with pytest.raises(ModelError, match="must be an int >= 0"):
        rlx_onnx.load(model, dims={"batch": -1})
    with pytest.raises(ModelError, match="fixes axis 1 at 3"):
        rlx_onnx.load(model, dims={"batch": 1, "x:1": 4})


def _external_model(location: str) -> object:
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    return make_model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", "float32", [4])],
                      [vi("y", "float32", None)], [t])


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_outside_the_model_folder(tmp_path: Path, location: str) -> None:
    (tmp_path / "secret.bin").write_bytes(np.ones(4, np.float32).tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "m.onnx"
    path.write_bytes(_external_model(location).SerializeToString())
    with pytest.raises(ModelError, match="leaves the model's folder"):
        rlx_onnx.load(path)


@pytest.mark.skipif(not hasattr(os, "symlink") or sys.platform == "win32", reason="needs symlinks")
def test_external_data_symlink_out_of_the_folder(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(np.ones(4, np.float32).tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").symlink_to(tmp_path / "secret.bin")
    (folder / "m.onnx").write_bytes(_external_model("w.bin").SerializeToString())
    with pytest.raises(ModelError, match="outside the model's folder"):
        rlx_onnx.load(folder / "m.onnx")


def test_external_data_inside_the_folder_loads(tmp_path: Path) -> None:
    w = np.arange(4, dtype=np.float32)
    (tmp_path / "w.bin").write_bytes(w.tobytes())
    (tmp_path / "m.onnx").write_bytes(_external_model("w.bin").SerializeToString())
    g = rlx_onnx.load(tmp_path / "m.onnx")
    out = rlx_core.compile(g, device="cpu").run({"x": np.ones(4, np.float32)})[0]
    np.testing.assert_array_equal(out, w + 1)
    with pytest.raises(ModelError, match="load the model from its path"):
        rlx_onnx.load((tmp_path / "m.onnx").read_bytes())
    (tmp_path / "w.bin").write_bytes(w[:2].tobytes())
    with pytest.raises(ModelError, match="too few"):
        rlx_onnx.load(tmp_path / "m.onnx")


def test_declared_tensor_over_the_limit_fails_before_reading() -> None:
    huge = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 20, 1 << 20])  # 4 TiB, no data
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", "float32", [1])],
                       [vi("y", "float32", None)], [huge])
    with pytest.raises(ModelError, match=r"initializer 'w' declares shape \(1048576, 1048576\).*max_tensor_bytes"):
        rlx_onnx.load(model)
    small = _relu_model((64, 64))
    with pytest.raises(ModelError, match=r"input 'x' of shape \(64, 64\) float32 needs 16384 bytes"):
        rlx_onnx.load(small, max_tensor_bytes=1000)
    with pytest.raises(ModelError, match="max_tensor_bytes must be an int > 0"):
        rlx_onnx.load(small, max_tensor_bytes=0)


def test_made_at_import_over_the_limit() -> None:
    shape = helper.make_node("Constant", [], ["s"], value_ints=[1 << 16, 1 << 16])
    fill = helper.make_node("ConstantOfShape", ["s"], ["big"], name="cos")
    model = make_model([shape, fill, helper.make_node("Add", ["x", "big"], ["y"])], [vi("x", "float32", [1])],
                       [vi("y", "float32", None)])
    with pytest.raises(ModelError, match=r"node 'cos' \(ConstantOfShape\).*max_tensor_bytes=1048576"):
        rlx_onnx.load(model, max_tensor_bytes=1 << 20)


def test_bad_node_names_node_and_file() -> None:
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")]
    model = make_model(nodes, [vi("x", "float32", [2, 3])], [vi("y", "float32", None)], [init("s", np.array([4, 2]))])
    with pytest.raises(ModelError, match=r"node 'bad_reshape' \(Reshape\).*cannot reshape"):
        rlx_onnx.load(model)
    nodes = [helper.make_node("Reshape", ["x", "t"], ["y"], name="dyn")]
    model = make_model(nodes, [vi("x", "float32", [6]), vi("t", "int64", [2])], [vi("y", "float32", None)])
    cg = rlx_core.compile(rlx_onnx.load(model), device="cpu")  # a run-time shape: built at each run
    with pytest.raises(InputError, match=r"cannot be built for t=\[4, 2\].*node 'dyn'.*cannot reshape"):
        cg.run({"x": np.zeros(6, np.float32), "t": np.array([4, 2])})


def test_structural_errors() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]
    model = make_model(nodes, [vi("x", "float32", [2])], [vi("y", "float32", None)])
    with pytest.raises(ModelError, match="'y' is defined twice"):
        rlx_onnx.load(model)
    nodes = [helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Neg", ["a"], ["b"])]
    model = make_model(nodes, [vi("x", "float32", [2])], [vi("a", "float32", None)])
    with pytest.raises(ModelError, match="cycle"):
        rlx_onnx.load(model)
    model = make_model([helper.make_node("Relu", ["q"], ["y"])], [vi("x", "float32", [2])], [vi("y", "float32", None)])
    with pytest.raises(ModelError, match="uses 'q', which no node"):
        rlx_onnx.load(model)


def test_unsupported_dtype_is_named() -> None:
    model = make_model([helper.make_node("Identity", ["x"], ["y"])], [helper.make_tensor_value_info("x", 8, [2])],
                       [vi("y", "float32", None)])
    with pytest.raises(ModelError, match="input 'x' has ONNX dtype STRING"):
        rlx_onnx.load(model)


def test_without_the_onnx_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    with pytest.raises(RlxError, match=r"rlx-core\[onnx\]"):
        rlx_onnx.load(b"anything")


def test_import_rlx_core_does_not_import_onnx() -> None:
    code = "import sys, rlx_core, rlx_core.onnx; assert 'onnx' not in sys.modules, 'onnx imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
