"""``rlx run`` and ``rlx bench`` on ONNX models, and ``CompiledGraph.run(output=...)``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx
from onnx import helper
from test_onnx_support import init, make_model, ort_run, vi
from typer.testing import CliRunner

import rlx_core
from rlx_core import onnx as rlx_onnx
from rlx_core.cli import app
from rlx_core.errors import ConfigError

W = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)


def _model() -> object:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return make_model(nodes, [vi("x", "float32", ["batch", 8])], [vi("y", "float32", ["batch", 4])], [init("w", W)])


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    return path


class _Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def rlx(*args: str, cwd: Path) -> _Result:
    """``rlx ARGS`` in this process (no interpreter start-up per call), run from ``cwd``."""
    old = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)
    return _Result(result.exit_code, result.stdout, result.stderr)


def test_run_with_input_dim_and_out(tmp_path: Path, model_file: Path) -> None:
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(3, 8)
    np.save(tmp_path / "x.npy", x)
    proc = rlx("run", str(model_file), "--input", "x=x.npy", "--dim", "batch=3", "--device", "cpu", "--out",
               "out.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "device: cpu" in proc.stdout and "compile:" in proc.stdout and "run:" in proc.stdout
    with np.load(tmp_path / "out.npz") as f:
        np.testing.assert_allclose(f["y"], ort_run(_model(), {"x": x})[0], rtol=1e-6)


def test_run_with_random_inputs_says_so(tmp_path: Path, model_file: Path) -> None:
    proc = rlx("run", str(model_file), "--dim", "batch=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "random float32[2, 8] (seed 0" in proc.stdout


def test_run_without_dim_takes_the_sizes_of_the_inputs(tmp_path: Path, model_file: Path) -> None:
    proc = rlx("run", str(model_file), "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "random float32[16, 8] (seed 0" in proc.stdout  # the representative size
    np.save(tmp_path / "x.npy", np.ones((5, 8), np.float32))
    proc = rlx("run", str(model_file), "--input", "x=x.npy", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 0 and "[5, " in proc.stdout, proc.stderr


@pytest.mark.parametrize(("args", "fragment"), [(["--dim", "batch=-1"], "NAME=N"),
                                                (["--dim", "seq=4"], "not a symbolic dim"),
                                                (["--dim", "batch"], "NAME=N")])
def test_run_errors_exit_2(tmp_path: Path, model_file: Path, args: list[str], fragment: str) -> None:
    proc = rlx("run", str(model_file), *args, cwd=tmp_path)
    assert proc.returncode == 2 and fragment in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_bad_onnx_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage")
    proc = rlx("run", "bad.onnx", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: bad.onnx"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_bench_with_peers(tmp_path: Path, model_file: Path) -> None:
    proc = rlx("bench", str(model_file), "--dim", "batch=4", "--devices", "cpu", "--peers", "--runs", "2",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for row in ("rlx cpu", "onnxruntime", "numpy"):
        assert row in proc.stdout
    assert "chosen" in proc.stdout or "1.00x" in proc.stdout


def test_interleaved_timing_records_failures() -> None:
    from rlx_core.onnx._peers import Contender, time_interleaved

    calls: list[str] = []

    def boom() -> None:
        raise RuntimeError("device lost")

    ok = Contender("ok", run=lambda: calls.append("ok"))
    bad = Contender("bad", run=boom)
    time_interleaved([ok, bad], runs=3, pause=0.0)
    assert len(ok.times) == 3 and len(calls) == 1 + 3 * 2  # warm-up, then 3 blocks of an untimed call and 1
    assert bad.run is None and bad.times == [] and "device lost" in bad.note


class _DLPackOnly:
    """A producer that offers nothing but DLPack (like a framework tensor)."""

    def __init__(self, arr: np.ndarray) -> None:
        self._arr = arr

    def __dlpack__(self, **kwargs: object) -> object:
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple:
        return self._arr.__dlpack_device__()


def test_dlpack_inputs_and_outputs() -> None:
    g = rlx_onnx.load(_model(), dims={"batch": 2})
    cg = rlx_core.compile(g, device="cpu")
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    want = np.maximum(x @ W, 0)
    (y,) = cg.run({"x": _DLPackOnly(x)})
    np.testing.assert_allclose(y, want, rtol=1e-6)
    (d,) = cg.run({"x": x}, output="dlpack")
    assert hasattr(d, "__dlpack__")
    np.testing.assert_allclose(np.from_dlpack(d), want, rtol=1e-6)
    with pytest.raises(ConfigError, match="'numpy' or 'dlpack'"):
        cg.run({"x": x}, output="torch")


def test_dlpack_from_an_executable_that_offers_run_dlpack() -> None:
    """A backend's optional ``run_dlpack`` is used for output="dlpack", and checked like ``run``."""
    g = rlx_onnx.load(_model(), dims={"batch": 1})
    cg = rlx_core.compile(g, device="cpu")
    x = np.ones((1, 8), np.float32)
    marker = np.full((1, 4), 7.0, np.float32)
    exe = cg._exe

    class WithDLPack:
        def run(self, inputs: dict) -> list:
            return exe.run(inputs)

        def run_dlpack(self, inputs: dict) -> list:
            return [_Shaped(marker)]

    class _Shaped(_DLPackOnly):
        shape, dtype = marker.shape, marker.dtype

    cg._exe = WithDLPack()
    (out,) = cg.run({"x": x}, output="dlpack")
    assert isinstance(out, _Shaped)
    np.testing.assert_array_equal(np.from_dlpack(out), marker)


def test_devices_and_check_price_a_staged_models_first_part(tmp_path: Path) -> None:
    """A detector (NonZero, NMS on the host): ``rlx devices --graph`` and ``rlx check`` rank
    the devices by the part compiled before the first host op, and say so."""
    path = Path(__file__).parent / "data" / "ssd_tiny_torchscript.onnx"
    for command in (["devices", "--graph", str(path)], ["check", str(path)]):
        proc = rlx(*command, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        text = " ".join(proc.stdout.split())
        assert "estimates are for its first part (305 node(s) up to NonZero" in text
        assert "built and compiled at run time" in text


def test_devices_says_a_graph_built_from_values_has_no_estimate_yet(tmp_path: Path) -> None:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    path = tmp_path / "reshape.onnx"
    onnx.save(make_model(nodes, [vi("x", "float32", [2, 6]), vi("shape", "int64", [2])], [vi("y", "float32", None)]),
              path)
    proc = rlx("devices", "--graph", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no estimate before its first run" in " ".join(proc.stdout.split())
