"""Convolutions on cuDNN, called through ctypes on a handle of the executable's own.

Why this binding: CuPy 14 no longer ships ``cupy.cuda.cudnn`` (its cuDNN module was
deprecated in 13 and removed), and NVIDIA's ``nvidia-cudnn-frontend`` Python package is a
second compiled extension with its own handle and stream plumbing for what, for plain
convolutions, is six C calls. cuDNN's convolution API (``cudnnConvolutionForward``,
``cudnnConvolutionBiasActivationForward``, the ``Find`` that times every algorithm) is a
stable C ABI from cuDNN 8 to 9, so it is called here the way ``cublas.py`` calls cuBLAS:
one handle per executable, bound once to its stream, every workspace allocated before
the first run. That keeps the convolutions capturable in the executable's CUDA graph and
costs a few microseconds of Python per call.

What runs: a ``conv2d`` (any groups, strides, dilations; symmetric padding) in float32,
float64 or float16, NCHW as the IR holds it. The algorithm is the fastest that
``cudnnFindConvolutionForwardAlgorithm`` timed on this GPU within the workspace limit,
once per process per shape. Float32 runs in plain FMA math unless the graph opted into
TF32 (``extra['tf32']``): cuDNN's default math would use TF32 tensor cores silently. A
convolution whose epilogue is ``relu``, or ``add`` of a same-shaped tensor then ``relu``
(a residual block), runs as one ``cudnnConvolutionBiasActivationForward``.

The library: the ``libcudnn`` already mapped into the process, else the one of the
``nvidia-cudnn-cu12``/``-cu13`` wheel (``pip install 'rlx-cuda[cudnn]'``), else the
loader's. cuDNN 9 loads its sub-libraries (graph, engines, cnn) by soname, so those
beside it are loaded first. ``RLX_CUDA_CUDNN`` (``auto``, ``on``, ``off``) says whether
to use it; where it does not load, convolutions run as im2col + cuBLAS and ``rlx devices
--explain`` says why.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from rlx_core.errors import DeviceError
from rlx_core.plugin import Setting

__all__ = ["CUDNN", "ConvSpec", "ConvPlan", "Cudnn", "conv_spec", "math_type", "fused_epilogue", "open_cudnn",
           "describe", "find_library", "load", "self_test", "fused_call_runs"]

CUDNN = Setting("RLX_CUDA_CUDNN", "convolutions on cuDNN: auto (default: where it loads), on (an error where it "
                "does not), or off (im2col + cuBLAS)",
                choices={"auto": "auto", "on": "on", "1": "on", "off": "off", "0": "off"}, default="auto")

#: cudnnDataType_t of the dtypes cuDNN convolves (the others stay on im2col + cuBLAS).
DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2}
TENSOR_NCHW = 0
CROSS_CORRELATION = 1  # what ONNX and the IR call a convolution
DEFAULT_MATH, TENSOR_OP_MATH, FMA_MATH = 0, 1, 3
ACTIVATION_RELU, ACTIVATION_IDENTITY = 1, 5
PROPAGATE_NAN = 1
ALGO_NAMES = ("implicit_gemm", "implicit_precomp_gemm", "gemm", "direct", "fft", "fft_tiling", "winograd",
              "winograd_nonfused")
#: The most workspace one convolution's algorithm may ask for (Find times the others too).
WORKSPACE_LIMIT = 1 << 30

_vp, _int, _sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_IP = ctypes.POINTER(ctypes.c_int)


class AlgoPerf(ctypes.Structure):
    """``cudnnConvolutionFwdAlgoPerf_t``."""

    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("mathType", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]


_SIGNATURES: dict[str, list[Any]] = {
    "cudnnCreate": [ctypes.POINTER(_vp)],
    "cudnnDestroy": [_vp],
    "cudnnSetStream": [_vp, _vp],
    "cudnnCreateTensorDescriptor": [ctypes.POINTER(_vp)],
    "cudnnSetTensorNdDescriptor": [_vp, _int, _int, _IP, _IP],
    "cudnnDestroyTensorDescriptor": [_vp],
    "cudnnCreateFilterDescriptor": [ctypes.POINTER(_vp)],
    "cudnnSetFilterNdDescriptor": [_vp, _int, _int, _int, _IP],
    "cudnnDestroyFilterDescriptor": [_vp],
    "cudnnCreateConvolutionDescriptor": [ctypes.POINTER(_vp)],
    "cudnnSetConvolutionNdDescriptor": [_vp, _int, _IP, _IP, _IP, _int, _int],
    "cudnnSetConvolutionGroupCount": [_vp, _int],
    "cudnnSetConvolutionMathType": [_vp, _int],
    "cudnnDestroyConvolutionDescriptor": [_vp],
    "cudnnGetConvolutionNdForwardOutputDim": [_vp, _vp, _vp, _int, _IP],
    "cudnnFindConvolutionForwardAlgorithm": [_vp, _vp, _vp, _vp, _vp, _int, _IP, ctypes.POINTER(AlgoPerf)],
    "cudnnGetConvolutionForwardWorkspaceSize": [_vp, _vp, _vp, _vp, _vp, _int, ctypes.POINTER(_sz)],
    "cudnnConvolutionForward": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _int, _vp, _sz, _vp, _vp, _vp],
    "cudnnConvolutionBiasActivationForward": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _int, _vp, _sz, _vp, _vp, _vp, _vp,
                                              _vp, _vp, _vp, _vp],
    "cudnnCreateActivationDescriptor": [ctypes.POINTER(_vp)],
    "cudnnSetActivationDescriptor": [_vp, _int, _int, ctypes.c_double],
    "cudnnDestroyActivationDescriptor": [_vp],
}
#: cuDNN 9 sub-libraries, loaded (by path, globally) before ``libcudnn`` so that its
#: loads by soname find them; dependencies first.
_SUBLIBRARIES = ("graph", "engines_precompiled", "engines_runtime_compiled", "heuristic", "ops", "cnn", "adv")
_SONAMES = ("libcudnn.so.9", "libcudnn.so.8", "libcudnn.so")
_DLLS = ("cudnn64_9.dll", "cudnn64_8.dll")

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "lib", "path", "error": the one load per process
_algos: dict[tuple, tuple[int, int]] = {}  # (device, spec, math, fused) -> (algo, workspace bytes)


@dataclass(frozen=True)
class ConvSpec:
    """One 2-D convolution as cuDNN is asked for it (NCHW, symmetric padding)."""

    x: tuple[int, int, int, int]
    w: tuple[int, int, int, int]
    y: tuple[int, int, int, int]
    pad: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    dtype: str


def conv_spec(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], attrs: dict[str, Any],
              dtype: str) -> ConvSpec | str:
    """The spec of a ``conv2d``, or why cuDNN does not take it (a reason string)."""
    if dtype not in DATA_TYPES:
        return f"{dtype} (cuDNN takes {', '.join(DATA_TYPES)})"
    top, left, bottom, right = attrs["padding"]
    if (top, left) != (bottom, right):
        return f"asymmetric padding {tuple(attrs['padding'])}"
    if 0 in x or 0 in w or 0 in y:
        return "an empty tensor"
    return ConvSpec(tuple(x), tuple(w), tuple(y), (top, left), tuple(attrs["stride"]), tuple(attrs["dilation"]),
                    int(attrs["groups"]), dtype)  # type: ignore[arg-type]


def math_type(dtype: str, tf32: bool) -> int:
    """cuDNN's math type: float32 in FMA math unless TF32 was opted into (cuDNN's default
    math takes TF32 tensor cores for float32 on Ampere and newer); float16 on tensor cores."""
    if dtype == "float32":
        return DEFAULT_MATH if tf32 else FMA_MATH
    return TENSOR_OP_MATH if dtype == "float16" else DEFAULT_MATH


def fused_epilogue(program: tuple, extra_shapes: list[tuple[int, ...]], y: tuple[int, ...]) -> int | None:
    """Which ``cudnnConvolutionBiasActivationForward`` computes a ``fused_conv``'s
    epilogue: ``None`` when none does, else the index among the extra inputs of the
    residual added before the ``relu`` (-1 for a plain ``relu``)."""
    ops = [(ins[0], tuple(ins[1])) for ins in program]
    if ops == [("relu", (0,))]:
        return -1
    if len(ops) == 2 and ops[0][0] == "add" and ops[1] == ("relu", (2,)) and sorted(ops[0][1]) == [0, 1] \
            and not program[0][2] and not program[1][2] and len(extra_shapes) == 1 and tuple(extra_shapes[0]) == y:
        return 0
    return None


def find_library() -> str | None:
    """The libcudnn to load: one already mapped here, else the ``nvidia-cudnn`` wheel's."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if "/libcudnn.so" in path and os.path.basename(path).startswith("libcudnn.so") and os.path.exists(path):
                    return path
    except OSError:
        pass
    for entry in sys.path:
        for pattern in ("nvidia/cudnn/lib/libcudnn.so.*", "nvidia/cu*/lib/libcudnn.so.*"):
            found = sorted(glob.glob(os.path.join(entry or ".", pattern)), reverse=True)
            if found:
                return found[0]
    return None


def _open(path: str) -> ctypes.CDLL:
    folder = os.path.dirname(path)
    if folder:
        suffix = path.rsplit(".so", 1)[-1]  # ".9"
        for name in _SUBLIBRARIES:
            sub = os.path.join(folder, f"libcudnn_{name}.so{suffix}")
            if os.path.exists(sub):
                try:
                    ctypes.CDLL(sub, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass  # cuDNN names the missing one when a call needs it
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    for fn, args in _SIGNATURES.items():
        getattr(lib, fn).argtypes = args
        getattr(lib, fn).restype = ctypes.c_int
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    lib.cudnnGetVersion.argtypes = []
    lib.cudnnGetErrorString.restype = ctypes.c_char_p
    lib.cudnnGetErrorString.argtypes = [ctypes.c_int]
    return lib


def load() -> ctypes.CDLL:
    """libcudnn with its signatures set (once per process); ``OSError`` says why not."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        if "error" in _state:
            raise OSError(_state["error"])
        found = find_library()
        names = ([found] if found else []) + list(_DLLS if sys.platform == "win32" else _SONAMES)
        errors = []
        for name in names:
            try:
                lib = _open(name)
            except (OSError, AttributeError) as exc:
                errors.append(f"{name}: {exc}")
                continue
            _state.update(lib=lib, path=name)
            return lib
        _state["error"] = "no loadable libcudnn (" + "; ".join(errors[:2]) + "); pip install 'rlx-cuda[cudnn]'"
        raise OSError(_state["error"])


def version_string(lib: ctypes.CDLL) -> str:
    v = int(lib.cudnnGetVersion())
    major = v // 10000 if v >= 90000 else v // 1000
    minor = (v % 10000) // 100 if v >= 90000 else (v % 1000) // 100
    return f"{major}.{minor}.{v % 100}"


def describe() -> str:
    """What ``rlx devices --explain`` says about convolutions. Cheap: it never loads the
    library (cuDNN 9 with its engines is over a gigabyte of shared objects; the probe
    should not pay for them), so before the first convolution it names the file found."""
    mode = str(CUDNN.read())
    if mode == "off":
        return "off (RLX_CUDA_CUDNN=off): convolutions as im2col + cuBLAS"
    with _lock:
        lib, error, path = _state.get("lib"), _state.get("error"), _state.get("path")
    if lib is not None:
        return f"cuDNN {version_string(lib)} ({path}) for convolutions"
    if error is not None:
        return f"not loaded ({error}): convolutions as im2col + cuBLAS"
    found = find_library()
    if found is not None:
        return f"cuDNN at {found} for convolutions (loaded and self-tested at the first one)"
    return ("cuDNN for convolutions if the loader finds libcudnn at the first one, else im2col + cuBLAS "
            "(pip install 'rlx-cuda[cudnn]')")


class Descriptors:
    """The cuDNN descriptors of one convolution, destroyed with this object."""

    def __init__(self, lib: ctypes.CDLL, spec: ConvSpec, math: int) -> None:
        self._lib = lib
        dt = DATA_TYPES[spec.dtype]
        self.x = self._create("Tensor")
        self.y = self._create("Tensor")
        self.w = self._create("Filter")
        self.conv = self._create("Convolution")
        self._set_tensor(self.x, dt, spec.x)
        self._set_tensor(self.y, dt, spec.y)
        _check(lib, "cudnnSetFilterNdDescriptor", lib.cudnnSetFilterNdDescriptor(self.w, dt, TENSOR_NCHW, 4,
                                                                                   _ints(spec.w)))
        compute = DATA_TYPES["float64"] if spec.dtype == "float64" else DATA_TYPES["float32"]
        _check(lib, "cudnnSetConvolutionNdDescriptor", lib.cudnnSetConvolutionNdDescriptor(
            self.conv, 2, _ints(spec.pad), _ints(spec.stride), _ints(spec.dilation), CROSS_CORRELATION, compute))
        _check(lib, "cudnnSetConvolutionGroupCount", lib.cudnnSetConvolutionGroupCount(self.conv, spec.groups))
        _check(lib, "cudnnSetConvolutionMathType", lib.cudnnSetConvolutionMathType(self.conv, math))
        out = (ctypes.c_int * 4)()
        _check(lib, "cudnnGetConvolutionNdForwardOutputDim",
               lib.cudnnGetConvolutionNdForwardOutputDim(self.conv, self.x, self.w, 4, out))
        if tuple(out) != spec.y:
            raise DeviceError(f"cuDNN computes a convolution of {spec.x} by {spec.w} as {tuple(out)}, rlx as {spec.y}")
        self.bias: Any = None
        self.act: Any = None

    def _create(self, kind: str) -> Any:
        handle = _vp()
        _check(self._lib, f"cudnnCreate{kind}Descriptor", getattr(self._lib, f"cudnnCreate{kind}Descriptor")(
            ctypes.byref(handle)))
        weakref.finalize(self, getattr(self._lib, f"cudnnDestroy{kind}Descriptor"), handle)
        return handle

    def _set_tensor(self, desc: Any, dt: int, shape: tuple[int, ...]) -> None:
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= d
        _check(self._lib, "cudnnSetTensorNdDescriptor", self._lib.cudnnSetTensorNdDescriptor(
            desc, dt, len(shape), _ints(shape), _ints(tuple(reversed(strides)))))

    def add_fusion(self, spec: ConvSpec) -> None:
        """The bias (1, K, 1, 1) and relu descriptors of the fused call."""
        self.bias = self._create("Tensor")
        self._set_tensor(self.bias, DATA_TYPES[spec.dtype], (1, spec.w[0], 1, 1))
        self.act = self._create("Activation")
        _check(self._lib, "cudnnSetActivationDescriptor",
               self._lib.cudnnSetActivationDescriptor(self.act, ACTIVATION_RELU, PROPAGATE_NAN, 0.0))


@dataclass
class ConvPlan:
    """A convolution ready to run: its descriptors, algorithm and workspace need."""

    spec: ConvSpec
    desc: Descriptors
    algo: int
    workspace: int
    fused: bool

    @property
    def algo_name(self) -> str:
        return ALGO_NAMES[self.algo] if 0 <= self.algo < len(ALGO_NAMES) else f"algo {self.algo}"


class Cudnn:
    """An owned cuDNN handle bound to one stream (capturable calls)."""

    def __init__(self, lib: ctypes.CDLL, stream_ptr: int, device: int) -> None:
        self._lib = lib
        self._device = device
        handle = _vp()
        _check(lib, "cudnnCreate", lib.cudnnCreate(ctypes.byref(handle)))
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.cudnnDestroy, handle)
        _check(lib, "cudnnSetStream", lib.cudnnSetStream(handle, _vp(stream_ptr)))

    def plan(self, spec: ConvSpec, math: int, fused: bool) -> ConvPlan:
        """Descriptors and the fastest algorithm (``Find``, once per process per shape)."""
        desc = Descriptors(self._lib, spec, math)
        if fused:
            desc.add_fusion(spec)
        key = (self._device, spec, math)
        with _lock:
            chosen = _algos.get(key)
        if chosen is None:
            chosen = self._find(desc, spec)
            with _lock:
                _algos[key] = chosen
        return ConvPlan(spec, desc, chosen[0], chosen[1], fused)

    def _find(self, desc: Descriptors, spec: ConvSpec) -> tuple[int, int]:
        lib = self._lib
        results = (AlgoPerf * len(ALGO_NAMES))()
        count = ctypes.c_int(0)
        _check(lib, "cudnnFindConvolutionForwardAlgorithm", lib.cudnnFindConvolutionForwardAlgorithm(
            self._handle, desc.x, desc.w, desc.conv, desc.y, len(ALGO_NAMES), ctypes.byref(count), results))
        for r in results[: count.value]:  # fastest first
            if r.status == 0 and r.memory <= WORKSPACE_LIMIT:
                size = _sz(0)
                status = lib.cudnnGetConvolutionForwardWorkspaceSize(self._handle, desc.x, desc.w, desc.conv, desc.y,
                                                                     r.algo, ctypes.byref(size))
                if status == 0:
                    return int(r.algo), max(int(size.value), int(r.memory))
        raise DeviceError(f"cuDNN found no algorithm for a convolution of {spec.x} by {spec.w} ({spec.dtype}, "
                          f"groups {spec.groups}, stride {spec.stride}, dilation {spec.dilation})")

    def forward(self, plan: ConvPlan, x: int, w: int, y: int, workspace: int, workspace_bytes: int) -> None:
        """``y = conv(x, w)`` (device pointers)."""
        one, zero = _scalars(plan.spec.dtype)
        d = plan.desc
        _check(self._lib, "cudnnConvolutionForward", self._lib.cudnnConvolutionForward(
            self._handle, one, d.x, _vp(x), d.w, _vp(w), d.conv, plan.algo, _vp(workspace), workspace_bytes, zero,
            d.y, _vp(y)))

    def forward_bias_relu(self, plan: ConvPlan, x: int, w: int, bias: int, residual: int | None, y: int,
                          workspace: int, workspace_bytes: int) -> None:
        """``y = relu(conv(x, w) + bias [+ residual])`` in one call (device pointers)."""
        one, zero = _scalars(plan.spec.dtype)
        d = plan.desc
        z, alpha2 = (y, zero) if residual is None else (residual, one)
        _check(self._lib, "cudnnConvolutionBiasActivationForward", self._lib.cudnnConvolutionBiasActivationForward(
            self._handle, one, d.x, _vp(x), d.w, _vp(w), d.conv, plan.algo, _vp(workspace), workspace_bytes, alpha2,
            d.y, _vp(z), d.bias, _vp(bias), d.act, d.y, _vp(y)))


_fused_runs: dict[tuple, bool] = {}


def fused_call_runs(cp: Any, dnn: Cudnn, plan: ConvPlan, device: int) -> bool:
    """Whether cuDNN runs the fused conv + bias + relu with the algorithm Find chose
    (it may refuse some): tried once per process on zeros, at build."""
    key = (device, plan.spec, plan.algo)
    if key not in _fused_runs:
        s = plan.spec
        x, w, y = (cp.zeros(shape, dtype=s.dtype) for shape in (s.x, s.w, s.y))
        bias, ws = cp.zeros((s.w[0],), dtype=s.dtype), cp.empty((max(plan.workspace, 1),), dtype="uint8")
        try:
            dnn.forward_bias_relu(plan, x.data.ptr, w.data.ptr, bias.data.ptr, y.data.ptr, y.data.ptr, ws.data.ptr,
                                  plan.workspace)
            cp.cuda.get_current_stream().synchronize()
            _fused_runs[key] = True
        except DeviceError:
            _fused_runs[key] = False
    return _fused_runs[key]


_self_tests: dict[int, str | None] = {}  # device -> None when cuDNN agreed with the reference, else why not


def self_test(cp: Any, dnn: Cudnn, device: int) -> str | None:
    """Run both cuDNN calls rlx makes on a small grouped, strided, dilated convolution and
    compare them with the float64 reference: a library that loads but answers wrongly
    (or fails) leaves convolutions on im2col + cuBLAS, said in the report, instead of
    giving wrong results. Once per process and device; returns why not, or None."""
    with _lock:
        if device in _self_tests:
            return _self_tests[device]
    why = _self_test(cp, dnn)
    with _lock:
        _self_tests[device] = why
    return why


def _self_test(cp: Any, dnn: Cudnn) -> str | None:
    import numpy as np

    from rlx_core.ir import Graph
    from rlx_core.reference import evaluate

    rng = np.random.default_rng(0)
    g = Graph("cudnn_self_test")
    x, z = g.input("x", (2, 4, 7, 7)), g.input("z", (2, 6, 4, 5))
    w = g.param("w", rng.standard_normal((6, 2, 3, 3), dtype=np.float32))
    b = g.param("b", rng.standard_normal(6, dtype=np.float32))
    conv = g.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    g.set_outputs([conv, g.relu(g.add(conv, z))])
    feeds = {"x": rng.standard_normal((2, 4, 7, 7), dtype=np.float32),
             "z": rng.standard_normal((2, 6, 4, 5), dtype=np.float32)}
    want = evaluate(g, feeds)
    try:
        spec = conv_spec((2, 4, 7, 7), (6, 2, 3, 3), (2, 6, 4, 5), g.node(conv.id).attrs, "float32")
        assert isinstance(spec, ConvSpec)
        plan = dnn.plan(spec, FMA_MATH, fused=True)
        dev = {k: cp.asarray(v) for k, v in {**feeds, "w": g.value(w.id), "b": g.value(b.id)}.items()}
        ws = cp.empty((max(plan.workspace, 1),), dtype=np.uint8)
        y, fused = cp.empty((2, 6, 4, 5), np.float32), cp.empty((2, 6, 4, 5), np.float32)
        ptr = {k: v.data.ptr for k, v in dev.items()}
        dnn.forward(plan, ptr["x"], ptr["w"], y.data.ptr, ws.data.ptr, plan.workspace)
        got = [cp.asnumpy(y) + g.value(b.id).reshape(1, 6, 1, 1)]
    except Exception as exc:  # any failure keeps convolutions on the path that works
        return f"cuDNN failed its self-test ({type(exc).__name__}: {exc})"
    try:  # a refused fused call is no fault (fused_call_runs asks per algorithm); a wrong answer is
        dnn.forward_bias_relu(plan, ptr["x"], ptr["w"], ptr["b"], ptr["z"], fused.data.ptr, ws.data.ptr,
                              plan.workspace)
        got.append(cp.asnumpy(fused))
    except DeviceError:
        want = want[:1]
    for what, a, ref in zip(("convolution", "fused bias, residual and relu"), got, want):
        err = float(np.max(np.abs(a - ref)))
        if not err <= 1e-4 * max(1.0, float(np.max(np.abs(ref)))):
            return f"cuDNN's {what} disagreed with the reference on its self-test (max error {err:.3g})"
    return None


def open_cudnn(stream_ptr: int, device: int) -> Cudnn | str:
    """A handle on ``stream_ptr``, or why convolutions stay on im2col + cuBLAS. With
    ``RLX_CUDA_CUDNN=on`` a library that does not load is a ``DeviceError``."""
    mode = str(CUDNN.read())
    if mode == "off":
        return "RLX_CUDA_CUDNN=off"
    try:
        return Cudnn(load(), stream_ptr, device)
    except (OSError, DeviceError) as exc:
        if mode == "on":
            raise DeviceError(f"RLX_CUDA_CUDNN=on but cuDNN cannot run here: {exc}") from None
        return str(exc)


def _ints(values: tuple[int, ...]) -> Any:
    return (ctypes.c_int * len(values))(*values)


_ONE = {"float": ctypes.c_float(1.0), "double": ctypes.c_double(1.0)}
_ZERO = {"float": ctypes.c_float(0.0), "double": ctypes.c_double(0.0)}


def _scalars(dtype: str) -> tuple[Any, Any]:
    """alpha = 1 and beta = 0 as cuDNN reads them: doubles for float64 data, else floats."""
    kind = "double" if dtype == "float64" else "float"
    return ctypes.byref(_ONE[kind]), ctypes.byref(_ZERO[kind])


def _check(lib: ctypes.CDLL, name: str, status: int) -> None:
    if status != 0:
        try:
            text = lib.cudnnGetErrorString(status).decode()
        except Exception:  # the message is a courtesy: the status still says it
            text = ""
        raise DeviceError(f"{name} failed with cuDNN status {status}{f' ({text})' if text else ''}")
