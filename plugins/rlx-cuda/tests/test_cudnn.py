"""The cuDNN convolution path without a GPU: which convolutions and epilogues it takes,
the descriptors and calls it makes (on a fake ``libcudnn`` that records them), the
library search and the report line. The real calls are checked in ``test_gpu_cudnn.py``."""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import rlx_core
from rlx_core.errors import ConfigError, DeviceError
from rlx_core.ir.ops import OpKind
from rlx_core.plugin import make_instruction
from rlx_cuda import cudnn
from rlx_cuda.backend import CudaBackend
from rlx_cuda.executable import conv_note

ATTRS = {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}


def _relu(i: int) -> tuple:
    return make_instruction(OpKind.RELU, (i,), {})


def _add(a: int, b: int) -> tuple:
    return make_instruction(OpKind.ADD, (a, b), {})


def test_conv_spec_takes_symmetric_float_convolutions():
    spec = cudnn.conv_spec((2, 8, 9, 9), (4, 2, 3, 3), (2, 4, 5, 5),
                           {"stride": (2, 2), "padding": (1, 0, 1, 0), "dilation": (1, 2), "groups": 4}, "float32")
    assert isinstance(spec, cudnn.ConvSpec)
    assert (spec.pad, spec.stride, spec.dilation, spec.groups) == ((1, 0), (2, 2), (1, 2), 4)


@pytest.mark.parametrize(("attrs", "dtype", "why"), [
    ({**ATTRS, "padding": (0, 0, 1, 1)}, "float32", "asymmetric padding (0, 0, 1, 1)"),
    (ATTRS, "int32", "int32"),
])
def test_conv_spec_says_why_not(attrs, dtype, why):
    got = cudnn.conv_spec((1, 2, 5, 5), (2, 2, 3, 3), (1, 2, 5, 5), attrs, dtype)
    assert isinstance(got, str) and why in got


def test_math_type_keeps_float32_off_tf32_unless_asked():
    assert cudnn.math_type("float32", tf32=False) == cudnn.FMA_MATH
    assert cudnn.math_type("float32", tf32=True) == cudnn.DEFAULT_MATH
    assert cudnn.math_type("float16", tf32=False) == cudnn.TENSOR_OP_MATH
    assert cudnn.math_type("float64", tf32=False) == cudnn.DEFAULT_MATH


Y = (2, 4, 5, 5)


@pytest.mark.parametrize(("program", "extras", "want"), [
    ((_relu(0),), [], -1),
    ((_add(0, 1), _relu(2)), [Y], 0),
    ((_add(1, 0), _relu(2)), [Y], 0),
    ((_add(0, 1), _relu(2)), [(1, 4, 1, 1)], None),  # a broadcast bias is not cuDNN's residual
    ((_add(0, 1),), [Y], None),  # no relu: identity runs on one algorithm only
    ((_relu(0), _add(1, 0)), [Y], None),
    ((make_instruction(OpKind.SIGMOID, (0,), {}),), [], None),
])
def test_fused_epilogue(program, extras, want):
    assert cudnn.fused_epilogue(program, extras, Y) == want


def test_conv_note_counts_each_way():
    note = conv_note(["cuDNN winograd", "cuDNN implicit_gemm + bias, relu", "cuDNN winograd",
                      "im2col + cuBLAS (cuDNN does not take asymmetric padding (0, 0, 1, 1))"])
    assert note.startswith("convolutions: 2 on cuDNN winograd, 1 on cuDNN implicit_gemm + bias, relu, 1 on im2col")


class FakeCudnn:
    """A stand-in for libcudnn: records what each call was given, answers like cuDNN."""

    def __init__(self, fail: dict[str, int] | None = None, algos: list[tuple[int, int, int]] | None = None) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.fail = fail or {}
        self.algos = algos if algos is not None else [(6, 0, 1 << 20), (1, 0, 0)]  # (algo, status, memory)
        self.next = 100
        self.tensors: dict[int, tuple] = {}
        self.conv: dict[str, tuple] = {}

    def __getattr__(self, name: str):
        if not name.startswith("cudnn"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, args))
            if name in self.fail:
                return self.fail[name]
            handler = getattr(self, "_" + name, None)
            return handler(*args) if handler else 0

        return call

    def _new(self, ptr) -> int:
        self.next += 1
        ptr._obj.value = self.next
        return 0

    _cudnnCreate = _cudnnCreateTensorDescriptor = _cudnnCreateFilterDescriptor = _new
    _cudnnCreateConvolutionDescriptor = _cudnnCreateActivationDescriptor = _new

    def _cudnnSetTensorNdDescriptor(self, desc, dt, n, dims, strides):
        self.tensors[desc.value] = (dt, tuple(dims[:n]), tuple(strides[:n]))
        return 0

    def _cudnnSetConvolutionNdDescriptor(self, desc, n, pad, stride, dil, mode, compute):
        self.conv.update(pad=tuple(pad[:n]), stride=tuple(stride[:n]), dilation=tuple(dil[:n]), mode=mode,
                         compute=compute)
        return 0

    def _cudnnGetConvolutionNdForwardOutputDim(self, conv, x, w, n, out):
        dims = self.out_dims
        for i in range(n):
            out[i] = dims[i]
        return 0

    def _cudnnFindConvolutionForwardAlgorithm(self, handle, x, w, conv, y, requested, count, results):
        for i, (algo, status, memory) in enumerate(self.algos):
            results[i].algo, results[i].status, results[i].memory = algo, status, memory
        count._obj.value = len(self.algos)
        return 0

    def _cudnnGetConvolutionForwardWorkspaceSize(self, handle, x, w, conv, y, algo, size):
        size._obj.value = dict((a, m) for a, _, m in self.algos)[algo]
        return 0

    def cudnnGetErrorString(self, status):
        return b"CUDNN_STATUS_BAD_PARAM"

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]

    def last(self, name: str) -> tuple:
        """The arguments of the latest call of ``name``."""
        return next(a for n, a in reversed(self.calls) if n == name)


SPEC = cudnn.ConvSpec((2, 8, 9, 9), (4, 2, 3, 3), (2, 4, 5, 5), (1, 0), (2, 2), (1, 2), 4, "float32")


def _handle(lib: FakeCudnn, monkeypatch) -> cudnn.Cudnn:
    monkeypatch.setattr(cudnn, "_algos", {})
    lib.out_dims = SPEC.y
    return cudnn.Cudnn(lib, stream_ptr=1234, device=0)


def test_handle_is_bound_to_the_stream_and_descriptors_say_the_convolution(monkeypatch):
    lib = FakeCudnn()
    dnn = _handle(lib, monkeypatch)
    assert lib.last("cudnnSetStream")[1].value == 1234
    plan = dnn.plan(SPEC, cudnn.FMA_MATH, fused=False)
    assert lib.conv == {"pad": (1, 0), "stride": (2, 2), "dilation": (1, 2), "mode": cudnn.CROSS_CORRELATION,
                        "compute": cudnn.DATA_TYPES["float32"]}
    assert lib.last("cudnnSetConvolutionGroupCount")[1] == 4
    assert lib.last("cudnnSetConvolutionMathType")[1] == cudnn.FMA_MATH
    x = lib.tensors[plan.desc.x.value]
    assert x == (cudnn.DATA_TYPES["float32"], (2, 8, 9, 9), (648, 81, 9, 1))
    assert (plan.algo, plan.workspace, plan.algo_name) == (6, 1 << 20, "winograd")  # Find's fastest


def test_find_skips_failed_and_oversized_algorithms_and_is_done_once(monkeypatch):
    lib = FakeCudnn(algos=[(4, 0, cudnn.WORKSPACE_LIMIT + 1), (6, 3, 0), (0, 0, 256)])
    dnn = _handle(lib, monkeypatch)
    assert dnn.plan(SPEC, cudnn.FMA_MATH, fused=False).algo == 0
    dnn.plan(SPEC, cudnn.FMA_MATH, fused=False)
    assert lib.names().count("cudnnFindConvolutionForwardAlgorithm") == 1  # remembered per shape
    dnn.plan(SPEC, cudnn.DEFAULT_MATH, fused=False)
    assert lib.names().count("cudnnFindConvolutionForwardAlgorithm") == 2  # another math type is timed again


def test_no_usable_algorithm_is_a_device_error(monkeypatch):
    dnn = _handle(FakeCudnn(algos=[(6, 3, 0)]), monkeypatch)
    with pytest.raises(DeviceError, match=r"no algorithm .*\(2, 8, 9, 9\)"):
        dnn.plan(SPEC, cudnn.FMA_MATH, fused=False)


def test_a_shape_cudnn_computes_otherwise_is_refused(monkeypatch):
    lib = FakeCudnn()
    dnn = _handle(lib, monkeypatch)
    lib.out_dims = (2, 4, 4, 4)
    with pytest.raises(DeviceError, match=r"as \(2, 4, 4, 4\), rlx as \(2, 4, 5, 5\)"):
        dnn.plan(SPEC, cudnn.FMA_MATH, fused=False)


def test_failed_calls_name_the_function_and_status(monkeypatch):
    lib = FakeCudnn(fail={"cudnnConvolutionForward": 3})
    dnn = _handle(lib, monkeypatch)
    plan = dnn.plan(SPEC, cudnn.FMA_MATH, fused=False)
    with pytest.raises(DeviceError, match=r"cudnnConvolutionForward failed with cuDNN status 3 \(CUDNN_STATUS_BAD"):
        dnn.forward(plan, 1, 2, 3, 4, 5)


def test_forward_calls_pass_pointers_scalars_and_the_residual(monkeypatch):
    lib = FakeCudnn()
    dnn = _handle(lib, monkeypatch)
    plan = dnn.plan(SPEC, cudnn.FMA_MATH, fused=True)
    dnn.forward(plan, 11, 12, 13, 14, 15)
    args = lib.last("cudnnConvolutionForward")
    assert [a.value for a in (args[3], args[5], args[8], args[12])] == [11, 12, 14, 13]
    assert (args[7], args[9]) == (6, 15)
    assert ctypes.cast(args[1], ctypes.POINTER(ctypes.c_float))[0] == 1.0  # alpha
    assert ctypes.cast(args[10], ctypes.POINTER(ctypes.c_float))[0] == 0.0  # beta
    dnn.forward_bias_relu(plan, 11, 12, 16, 17, 13, 14, 15)
    args = lib.last("cudnnConvolutionBiasActivationForward")
    assert ctypes.cast(args[10], ctypes.POINTER(ctypes.c_float))[0] == 1.0  # alpha2: the residual is added
    assert [args[12].value, args[14].value, args[17].value] == [17, 16, 13]
    dnn.forward_bias_relu(plan, 11, 12, 16, None, 13, 14, 15)
    args = lib.last("cudnnConvolutionBiasActivationForward")
    assert ctypes.cast(args[10], ctypes.POINTER(ctypes.c_float))[0] == 0.0  # no residual: z is y, times 0
    act = lib.last("cudnnSetActivationDescriptor")
    assert act[1:3] == (cudnn.ACTIVATION_RELU, cudnn.PROPAGATE_NAN)


def test_float64_scalars_are_doubles(monkeypatch):
    lib = FakeCudnn()
    dnn = _handle(lib, monkeypatch)
    spec = cudnn.ConvSpec(SPEC.x, SPEC.w, SPEC.y, SPEC.pad, SPEC.stride, SPEC.dilation, SPEC.groups, "float64")
    dnn.forward(dnn.plan(spec, cudnn.DEFAULT_MATH, fused=False), 1, 2, 3, 4, 5)
    assert ctypes.cast(lib.last("cudnnConvolutionForward")[1], ctypes.POINTER(ctypes.c_double))[0] == 1.0
    assert lib.conv["compute"] == cudnn.DATA_TYPES["float64"]


def test_library_search_finds_the_wheel(tmp_path, monkeypatch):
    lib_dir = tmp_path / "nvidia" / "cudnn" / "lib"
    lib_dir.mkdir(parents=True)
    (lib_dir / "libcudnn.so.9").write_bytes(b"")
    monkeypatch.setattr("sys.path", [str(tmp_path)])
    monkeypatch.setattr("builtins.open", _no_maps(open))
    assert Path(cudnn.find_library()) == lib_dir / "libcudnn.so.9"


def _no_maps(real_open):
    def fake(path, *args, **kwargs):
        if str(path) == "/proc/self/maps":
            raise OSError("not here")
        return real_open(path, *args, **kwargs)

    return fake


def test_a_library_that_does_not_load_is_named_once(monkeypatch):
    monkeypatch.setattr(cudnn, "_state", {})
    monkeypatch.setattr(cudnn, "find_library", lambda: None)
    monkeypatch.setattr(cudnn, "_SONAMES", ("libcudnn-that-is-not-here.so.9",))
    with pytest.raises(OSError, match=r"no loadable libcudnn .*rlx-cuda\[cudnn\]"):
        cudnn.load()
    monkeypatch.setenv("RLX_CUDA_CUDNN", "auto")
    assert "no loadable libcudnn" in cudnn.describe()
    reason = cudnn.open_cudnn(0, 0)
    assert isinstance(reason, str) and "no loadable libcudnn" in reason
    monkeypatch.setenv("RLX_CUDA_CUDNN", "on")
    with pytest.raises(DeviceError, match="RLX_CUDA_CUDNN=on but cuDNN cannot run here"):
        cudnn.open_cudnn(0, 0)


def test_off_never_loads(monkeypatch):
    monkeypatch.setattr(cudnn, "_state", {})
    monkeypatch.setattr(cudnn, "load", lambda: pytest.fail("loaded with RLX_CUDA_CUDNN=off"))
    monkeypatch.setenv("RLX_CUDA_CUDNN", "off")
    assert cudnn.open_cudnn(0, 0) == "RLX_CUDA_CUDNN=off"
    assert cudnn.describe().startswith("off (RLX_CUDA_CUDNN=off)")


def test_setting_is_declared_and_checked(monkeypatch):
    assert cudnn.CUDNN in CudaBackend().settings()
    monkeypatch.setenv("RLX_CUDA_CUDNN", "maybe")
    with pytest.raises(ConfigError, match="RLX_CUDA_CUDNN"):
        cudnn.CUDNN.read()


def _fused_conv(program: tuple, extra_shapes: list[tuple[int, ...]], dtype: str = "float32") -> rlx_core.ir.Node:
    g = rlx_core.Graph("fc")
    x = g.input("x", (1, 2, 5, 5))
    w = g.param("w", np.ones((4, 2, 3, 3), np.float32))
    extras = [g.input(f"e{i}", s, dtype) for i, s in enumerate(extra_shapes)]
    y = g.add_node(OpKind.FUSED_CONV, [x.id, w.id, *(e.id for e in extras)],
                    {**ATTRS, "bias": False, "program": program})
    return g.node(y.id)


def test_claims_fused_conv_unless_the_epilogue_changes_dtype():
    backend = CudaBackend()
    assert backend.claims(_fused_conv((_add(0, 1), _relu(2)), [(1, 4, 5, 5)])) is True
    cast = (make_instruction(OpKind.CAST, (0,), {"dtype": "float16"}),)
    why = backend.claims(_fused_conv(cast, []))
    assert isinstance(why, str) and "cast changes the dtype" in why


class HostArrays:
    """A stand-in for CuPy in the self-test: host arrays known by a fake device pointer."""

    def __init__(self) -> None:
        self.by_ptr: dict[int, np.ndarray] = {}

    def _wrap(self, a: np.ndarray) -> SimpleNamespace:
        self.by_ptr[id(a)] = a
        return SimpleNamespace(arr=a, data=SimpleNamespace(ptr=id(a)))

    def asarray(self, v) -> SimpleNamespace:
        return self._wrap(np.array(v, copy=True))

    def empty(self, shape, dtype=np.float32) -> SimpleNamespace:
        return self._wrap(np.zeros(shape, dtype))

    def asnumpy(self, obj) -> np.ndarray:
        return obj.arr.copy()


class HostDnn:
    """Computes what cuDNN would (through the reference), or a wrong answer, or fails."""

    def __init__(self, arrays: HostArrays, mode: str = "right") -> None:
        self.a, self.mode = arrays, mode

    def plan(self, spec, math, fused):
        return SimpleNamespace(spec=spec, workspace=0)

    def _conv(self, spec, x, w) -> np.ndarray:
        from rlx_core.reference import evaluate

        g = rlx_core.Graph("c")
        xi = g.input("x", spec.x)
        dilation = (1, 1) if self.mode == "ignores dilation" else spec.dilation
        y = g.conv2d(xi, g.param("w", self.a.by_ptr[w]), stride=spec.stride, padding=spec.pad, dilation=dilation,
                     groups=spec.groups)
        g.set_outputs([y])
        return evaluate(g, {"x": self.a.by_ptr[x]})[0]

    def forward(self, plan, x, w, y, ws, n):
        if self.mode == "fails":
            raise DeviceError("cudnnConvolutionForward failed with cuDNN status 3")
        self.a.by_ptr[y][...] = self._conv(plan.spec, x, w)

    def forward_bias_relu(self, plan, x, w, b, z, y, ws, n):
        if self.mode == "refuses fusion":
            raise DeviceError("cudnnConvolutionBiasActivationForward failed with cuDNN status 9")
        out = self._conv(plan.spec, x, w) + self.a.by_ptr[b].reshape(1, -1, 1, 1) + self.a.by_ptr[z]
        self.a.by_ptr[y][...] = np.maximum(out, 0)


@pytest.mark.parametrize(("mode", "want"), [
    ("right", None),
    ("refuses fusion", None),  # plain convolutions still take cuDNN; fusion is asked per algorithm
    ("ignores dilation", "cuDNN's convolution disagreed with the reference on its self-test"),
    ("fails", "cuDNN failed its self-test (DeviceError: cudnnConvolutionForward failed"),
])
def test_self_test_keeps_a_wrong_or_failing_library_out(mode, want, monkeypatch):
    if mode == "ignores dilation":  # a dilated 3x3 and a plain one give different output sizes: keep the spec's
        monkeypatch.setattr(HostDnn, "_conv", _padded(HostDnn._conv))
    monkeypatch.setattr(cudnn, "_self_tests", {})
    arrays = HostArrays()
    why = cudnn.self_test(arrays, HostDnn(arrays, mode), device=0)
    assert why == want if want is None else why.startswith(want), why
    assert cudnn.self_test(arrays, HostDnn(arrays, "fails"), device=0) == why  # once per process and device


def _padded(conv):
    def wrapped(self, spec, x, w):
        got = conv(self, spec, x, w)
        out = np.zeros(spec.y)
        h, ww = min(got.shape[2], spec.y[2]), min(got.shape[3], spec.y[3])
        out[:, :, :h, :ww] = got[:, :, :h, :ww]
        return out

    return wrapped


def test_describe_never_loads_the_library(tmp_path, monkeypatch):
    """The probe asks for this line: it names the file found, loading nothing (cuDNN 9
    with its engines is over a gigabyte of shared objects)."""
    monkeypatch.setattr(cudnn, "_state", {})
    monkeypatch.setattr(cudnn, "_open", lambda path: pytest.fail("describe() loaded the library"))
    monkeypatch.setenv("RLX_CUDA_CUDNN", "auto")
    monkeypatch.setattr(cudnn, "find_library", lambda: "/opt/nvidia/cudnn/lib/libcudnn.so.9")
    assert cudnn.describe() == ("cuDNN at /opt/nvidia/cudnn/lib/libcudnn.so.9 for convolutions (loaded and "
                                "self-tested at the first one)")
    monkeypatch.setattr(cudnn, "find_library", lambda: None)
    assert cudnn.describe().endswith("else im2col + cuBLAS (pip install 'rlx-cuda[cudnn]')")
