"""Convolutions on oneDNN (the ``onednn`` extra), where they measured faster here.

Why: rlx's convolutions run as im2col + the BLAS's GEMM over NCHW planes, at about half
the rate of oneDNN's brgemm convolutions over channels-last (NHWC) data on a 2-core Zen 3,
where oneDNN ran a 64 -> 64 3x3 over 56x56, a 256 -> 1024 1x1 over 14x14 and a 7x7 first
layer from nearly twice to over three times as fast (measured: BENCHMARKS.md, sections
'CPU on untuned models (session 16)' and 'Figures behind design choices (moved from
docstrings, issue 32)'). oneDNN given NCHW itself runs the same im2col + GEMM rlx does, so
each convolution here reorders its input to NHWC, runs oneDNN's convolution, and reorders
the result back (each reorder a small part of a convolution's time on ResNet's planes).
The weights are reordered once into the layout the convolution chose (and again by
``set_param``).

Which library: oneDNN's OpenMP build (the ``onednn-cpu-gomp`` wheel), because its
threads are libgomp's, the team rlx's native kernels and oneMKL's GNU layer run on: the
current ``onednn`` wheel runs on TBB (a second pool spinning against the first on small
hosts) and pulls in the SYCL runtime (2 GB). Only oneDNN 3.x is used (the C API's
enums below are 3.x's). Loaded with ctypes on first use, never at import.

Whether: ``RLX_CPU_ONEDNN=auto`` (default) times oneDNN against rlx's own way once per
process for each kind of convolution, on one of that kind (``PROBES``): *spatial* ones
(64 -> 64 3x3 over 28x28; there im2col is rlx's cost: 1.65x on the Zen 3) and *pointwise*
ones are not timed: a 1x1 convolution at stride 1 is one GEMM for rlx in NCHW, and
oneDNN's needs a reorder to NHWC and back that grows with the image (16 -> 96 over
112x112 took about three times as long on oneDNN as on rlx's GEMM; measured:
BENCHMARKS.md, section 'Figures behind design choices (moved from docstrings, issue 32)').
A kind goes to oneDNN only where it was at least ``MARGIN`` (1.15x) faster; ``on`` forces
it for every convolution it takes (pointwise ones included), ``off`` never loads it.
Depthwise convolutions are a third kind, timed against rlx's native depthwise kernel
(96 channels, 3x3 over 56x56), and grouped ones (few channels a group: ResNeXt's, RegNet's)
a fourth, timed against rlx's grouped kernel (128 channels in 32 groups, 3x3 over 28x28),
and those of at most 8 channels a group whose output planes are 14x14 or smaller a fifth
(208 in 26 groups over 14x14: rlx's kernel keeps 16 outputs of a row in a vector, half
wasted on 7-wide rows).
Timed as spatial ones, they went wherever dense 3x3s went, on a probe against im2col; on
ResNeXt's and RegNet's shapes oneDNN and rlx's grouped kernel came within 0.6-1.6x of each
other on the 2-core Zen 3, so it is their own probe that decides. Anything not float32,
or whose weights are computed per run, stays on rlx. ``describe()`` (``rlx devices
--explain``) says which runs.

Reduced precision (``CompileOptions.precision="bf16"``, ``docs/precision.md``): on a CPU
with AMX or AVX512_BF16 (``precisions``) every convolution and dense layer's product that
oneDNN runs on a unit that makes bf16 pay here (``bf16_units``: AMX always, AVX512-BF16
where it measured faster on this host) takes bf16 operands, whatever the probes above
decided for float32; any other stays float32.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from . import bf16_units, openmp, verdicts

__all__ = ["Dnnl", "PROBES", "library", "find_library", "reason", "wanted", "use", "kind_of", "describe",
           "reset", "ELTWISE", "precisions", "reduced", "describe_precisions"]

log = logging.getLogger("rlx_cpu")

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_DIMS = _I64 * 12
# oneDNN 3.x C API constants (dnnl_types.h, dnnl_common_types.h)
_F32, _ANY, _TAG_A, _AB, _ABCD, _ABCDE, _ACDB = 3, 1, 2, 3, 5, 6, 22
_BF16 = 2  # dnnl_bf16
_CPU, _FORWARD_INFERENCE, _CONVOLUTION_DIRECT = 1, 96, 1
_ARG_SRC, _ARG_DST, _ARG_WEIGHTS, _ARG_BIAS, _ARG_SCRATCHPAD = 1, 17, 33, 41, 80
_QUERY_IMPL_INFO, _QUERY_WEIGHTS_MD, _QUERY_SCRATCHPAD_MD = 8, 131, 136
_SCRATCHPAD_USER = 1
_ARG_SRC_1, _ARG_POST_OP_BASE = 2, 32768  # DNNL_ARG_SRC_1; DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) = base * (i + 1)
#: oneDNN's elementwise algorithms a convolution's post-ops use (dnnl_alg_kind_t).
ELTWISE = {"relu": 0x20, "tanh": 0x21, "linear": 0x26, "logistic": 0x29, "gelu_tanh": 0x2B, "swish": 0x2C,
           "clip": 0x2E, "gelu_erf": 0x31, "hardswish": 0x34}
_BINARY_ADD = 0x1FFF0
_POOL_MAX, _POOL_AVG_INCLUDE, _POOL_AVG_EXCLUDE = 0x1FF, 0x2FF, 0x3FF
_STREAM_IN_ORDER = 1


class _Arg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _P)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]


class DnnlError(RuntimeError):
    """A oneDNN call returned a status other than success."""


def _dims(values: tuple[int, ...]) -> Any:
    d = _DIMS()
    for i, v in enumerate(values):
        d[i] = int(v)
    return d


class Dnnl:
    """The loaded library: one CPU engine; a stream per thread (a stream is not shared)."""

    def __init__(self, path: str) -> None:
        openmp.load()  # before the library that links it: rlx-cpu's spin count (openmp.py)
        lib = ctypes.CDLL(path)
        lib.dnnl_version.restype = ctypes.POINTER(_Version)
        lib.dnnl_primitive_desc_query_md.restype = _P
        lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        lib.dnnl_memory_desc_equal.argtypes = [_P, _P]
        v = lib.dnnl_version().contents
        if v.major != 3:
            raise DnnlError(f"oneDNN {v.major}.{v.minor}.{v.patch} at {path}: rlx-cpu reads oneDNN 3.x only")
        self.version = f"{v.major}.{v.minor}.{v.patch}"
        self.path = path
        self._lib = lib
        self.engine = _P()
        self._ok(lib.dnnl_engine_create(ctypes.byref(self.engine), _CPU, ctypes.c_size_t(0)), "engine_create")
        self._local = threading.local()
        self._layouts: dict[Any, list[Any]] = {}  # layout()'s descriptors, by the caller's hint
        self._layouts_lock = threading.Lock()
        self._conv_impls: dict[tuple[Any, ...], str] = {}  # conv_impl()'s answers, by geometry
        self.execute = lib.dnnl_primitive_execute
        self.execute.argtypes = [_P, _P, ctypes.c_int, ctypes.POINTER(_Arg)]
        self.wait = lib.dnnl_stream_wait
        self.wait.argtypes = [_P]
        self.set_handle = lib.dnnl_memory_set_data_handle
        self.set_handle.argtypes = [_P, _P]

    @staticmethod
    def _ok(status: int, what: str) -> None:
        if status != 0:
            raise DnnlError(f"oneDNN {what} failed (status {status})")

    def stream(self) -> Any:
        s = getattr(self._local, "stream", None)
        if s is None:
            s = _P()
            self._ok(self._lib.dnnl_stream_create(ctypes.byref(s), self.engine, ctypes.c_uint(_STREAM_IN_ORDER)),
                     "stream_create")
            self._local.stream = s
        return s

    # ------------------------------------------------------------------ objects
    def md(self, shape: tuple[int, ...], tag: int, dtype: int = _F32) -> Any:
        """A memory descriptor of ``shape`` in layout ``tag`` (float32, or ``dtype``:
        ``_BF16`` for a product's operands under ``precision="bf16"``)."""
        m = _P()
        self._ok(self._lib.dnnl_memory_desc_create_with_tag(ctypes.byref(m), len(shape), _dims(shape), dtype, tag),
                 "memory_desc_create_with_tag")
        return m

    def equal(self, a: Any, b: Any) -> bool:
        """Whether two memory descriptors describe the same layout and dtype."""
        return bool(self._lib.dnnl_memory_desc_equal(a, b))

    def md_strided(self, shape: tuple[int, ...], strides: tuple[int, ...], dtype: int = _F32) -> Any:
        """A memory descriptor of ``shape`` with ``strides`` in elements, float32 or
        ``dtype`` (a transposed view of a weight: the reorder reads it as it lies)."""
        m = _P()
        self._ok(self._lib.dnnl_memory_desc_create_with_strides(ctypes.byref(m), len(shape), _dims(shape), dtype,
                                                                _dims(strides)), "memory_desc_create_with_strides")
        return m

    def layout(self, md: Any, hint: Any) -> tuple[Any, int]:
        """A name for ``md``'s layout in this process: descriptors oneDNN calls equal
        (``dnnl_memory_desc_equal``) get the same name. Weights a primitive chose blocked
        for one size of a graph may be chosen otherwise for another; keyed by this name, a
        reordered weight is shared only where the layouts are the same. ``hint`` (the
        dims) keeps each search short."""
        with self._layouts_lock:
            known = self._layouts.setdefault(hint, [])
            for i, other in enumerate(known):
                if self._lib.dnnl_memory_desc_equal(other, md):
                    return hint, i
            known.append(self.clone_md(md))  # held for the process: a few per weight shape
            return hint, len(known) - 1

    def size(self, md: Any) -> int:
        return int(self._lib.dnnl_memory_desc_get_size(md))

    def memory(self, md: Any, handle: int) -> Any:
        m = _P()
        self._ok(self._lib.dnnl_memory_create(ctypes.byref(m), md, self.engine, _P(handle)), "memory_create")
        return m

    def primitive(self, pd: Any) -> Any:
        p = _P()
        self._ok(self._lib.dnnl_primitive_create(ctypes.byref(p), pd), "primitive_create")
        return p

    def reorder(self, src: Any, dst: Any) -> Any:
        pd = _P()
        self._ok(self._lib.dnnl_reorder_primitive_desc_create(ctypes.byref(pd), src, self.engine, dst, self.engine,
                                                              _P(0)), "reorder_primitive_desc_create")
        return self.primitive(pd)

    def conv_pd(self, src: Any, weights: Any, bias: Any, dst: Any, stride: tuple[int, int],
                dilation: tuple[int, int], pad_l: tuple[int, int], pad_r: tuple[int, int],
                post: tuple[tuple[Any, ...], ...] = ()) -> Any:
        """A convolution's primitive descriptor; ``post``: its post-ops in order, each
        ``("eltwise", algorithm, alpha, beta)`` or ``("add", memory_desc)`` (a binary add
        of a second tensor)."""
        pd = _P()
        with self._attr(post) as attr:
            self._ok(self._lib.dnnl_convolution_forward_primitive_desc_create(
                ctypes.byref(pd), self.engine, _FORWARD_INFERENCE, _CONVOLUTION_DIRECT, src, weights,
                bias if bias is not None else _P(0), dst, _dims(stride), _dims(tuple(d - 1 for d in dilation)),
                _dims(pad_l), _dims(pad_r), attr), "convolution_forward_primitive_desc_create")
        return pd

    def matmul_pd(self, src: Any, weights: Any, bias: Any, dst: Any, post: tuple[tuple[Any, ...], ...] = ()) -> Any:
        """A matrix product's primitive descriptor (``dst = src @ weights + bias``, then
        ``post`` as for ``conv_pd``)."""
        pd = _P()
        with self._attr(post) as attr:
            self._ok(self._lib.dnnl_matmul_primitive_desc_create(
                ctypes.byref(pd), self.engine, src, weights, bias if bias is not None else _P(0), dst, attr),
                "matmul_primitive_desc_create")
        return pd

    @contextlib.contextmanager
    def _attr(self, post: tuple[tuple[Any, ...], ...]) -> Iterator[Any]:
        """Primitive attributes for the length of a descriptor's creation: the scratchpad
        is the caller's (a plan buffer), and ``post`` are the post-ops."""
        attr = _P()
        self._ok(self._lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "primitive_attr_create")
        po = _P()
        try:
            self._ok(self._lib.dnnl_primitive_attr_set_scratchpad_mode(attr, _SCRATCHPAD_USER), "set_scratchpad_mode")
            if post:
                self._ok(self._lib.dnnl_post_ops_create(ctypes.byref(po)), "post_ops_create")
                for op in post:
                    if op[0] == "eltwise":
                        self._ok(self._lib.dnnl_post_ops_append_eltwise(po, op[1], ctypes.c_float(op[2]),
                                                                        ctypes.c_float(op[3])), "append_eltwise")
                    else:
                        self._ok(self._lib.dnnl_post_ops_append_binary(po, _BINARY_ADD, op[1]), "append_binary")
                self._ok(self._lib.dnnl_primitive_attr_set_post_ops(attr, po), "set_post_ops")
            yield attr
        finally:
            if po:
                self._lib.dnnl_post_ops_destroy(po)
            self._lib.dnnl_primitive_attr_destroy(attr)

    def pool_pd(self, alg: int, src: Any, dst: Any, stride: tuple[int, int], kernel: tuple[int, int],
                dilation: tuple[int, int], pad_l: tuple[int, int], pad_r: tuple[int, int]) -> Any:
        """A pooling primitive descriptor (``dilation`` as ONNX gives it: 1 is none)."""
        pd = _P()
        with self._attr(()) as attr:
            self._ok(self._lib.dnnl_pooling_forward_primitive_desc_create(
                ctypes.byref(pd), self.engine, _FORWARD_INFERENCE, alg, src, dst, _dims(stride), _dims(kernel),
                _dims(tuple(d - 1 for d in dilation)), _dims(pad_l), _dims(pad_r), attr),
                "pooling_forward_primitive_desc_create")
        return pd

    def concat_pd(self, dst: Any, axis: int, srcs: list[Any]) -> Any:
        """A concat primitive descriptor: ``srcs`` along ``axis`` (oneDNN's, NCHW order) into ``dst``."""
        pd = _P()
        self._ok(self._lib.dnnl_concat_primitive_desc_create(ctypes.byref(pd), self.engine, dst, len(srcs), axis,
                                                             (_P * len(srcs))(*srcs), _P(0)),
                 "concat_primitive_desc_create")
        return pd

    def query_md(self, pd: Any, what: int) -> Any:
        return _P(self._lib.dnnl_primitive_desc_query_md(pd, what, 0))

    def impl(self, pd: Any) -> str:
        text = ctypes.c_char_p()
        self._lib.dnnl_primitive_desc_query(pd, _QUERY_IMPL_INFO, 0, ctypes.byref(text))
        return (text.value or b"?").decode()

    def conv_impl(self, src: tuple[int, ...], weights: tuple[int, ...], dst: tuple[int, ...],
                  stride: tuple[int, int], dilation: tuple[int, int], pads: tuple[int, int, int, int],
                  groups: int) -> str:
        """The implementation oneDNN picks for a float32 convolution over channels-last
        data (``src`` and ``dst`` NCHW shapes, ``weights`` OIHW, ``pads`` top, left, bottom,
        right), without post-ops; ``""`` where it declines. Asked once a geometry (creating
        a primitive descriptor takes tens of microseconds; a model repeats its shapes)."""
        key = (src, weights, dst, tuple(stride), tuple(dilation), tuple(pads), groups)
        found = self._conv_impls.get(key)
        if found is not None:
            return found
        o, cg, kh, kw = weights
        wshape = (o, cg, kh, kw) if groups == 1 else (groups, o // groups, cg, kh, kw)
        descs = [self.md(src, _ACDB), self.md(wshape, _ANY), self.md(dst, _ACDB)]
        try:
            pd = self.conv_pd(descs[0], descs[1], None, descs[2], stride, dilation, pads[:2], pads[2:])
        except DnnlError:
            found = ""
        else:
            found = self.impl(pd)
            self.destroy(pds=(pd,))
        finally:
            self.destroy(descs=descs)
        self._conv_impls[key] = found
        return found

    def clone_md(self, md: Any) -> Any:
        """A memory descriptor of our own equal to ``md`` (one a query returned lives only
        as long as its primitive descriptor)."""
        m = _P()
        self._ok(self._lib.dnnl_memory_desc_clone(ctypes.byref(m), md), "memory_desc_clone")
        return m

    def destroy(self, memories: Any = (), primitives: Any = (), descs: Any = (), pds: Any = ()) -> None:
        """Free oneDNN objects this module created (never a descriptor a query returned).
        A primitive descriptor can go as soon as its primitive exists: the primitive keeps
        what it needs (each compile of a dynamic shape made them, so holding them grew a
        server's memory with every new size)."""
        for m in memories:
            self._lib.dnnl_memory_destroy(m)
        for p in primitives:
            self._lib.dnnl_primitive_destroy(p)
        for d in descs:
            self._lib.dnnl_memory_desc_destroy(d)
        for pd in pds:
            self._lib.dnnl_primitive_desc_destroy(pd)

    def run(self, prim: Any, args: Any, nargs: int) -> None:
        s = self.stream()
        self._ok(self.execute(prim, s, nargs, args), "primitive_execute")
        self.wait(s)


# --------------------------------------------------------------------- finding and choosing
_LOCK = threading.RLock()  # the measurement compiles, which asks use() again
_STATE: dict[str, Any] = {}


def wanted() -> str:
    """``RLX_CPU_ONEDNN``: ``auto``, ``on`` or ``off`` (``settings.ONEDNN``)."""
    from .settings import ONEDNN

    return str(ONEDNN.read())


def find_library() -> str | None:
    """``libdnnl.so.3`` of the ``onednn-cpu-gomp`` wheel (``<prefix>/lib``), else the loader's."""
    if sys.platform != "linux":
        return None
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        path = Path(prefix) / "lib" / "libdnnl.so.3"
        if path.is_file():
            return str(path)
    import ctypes.util

    found = ctypes.util.find_library("dnnl")
    return found


def library() -> Dnnl | None:
    """oneDNN, loaded once per process; None (``reason()`` says why) when off or missing."""
    if wanted() == "off":
        return None
    with _LOCK:
        if "lib" not in _STATE:
            path, lib, why = find_library(), None, ""
            if path is None:
                why = "not installed (pip install 'rlx-cpu[onednn]': the onednn-cpu-gomp wheel)"
            else:
                try:
                    lib = Dnnl(path)
                except (OSError, AttributeError, DnnlError) as exc:
                    why = f"{path}: {exc}"
            _STATE.update(lib=lib, reason=why)
        return _STATE["lib"]


def reason() -> str:
    if wanted() == "off":
        return "off (RLX_CPU_ONEDNN=off)"
    return str(_STATE.get("reason", ""))


def reset() -> None:
    """Forget the measured decisions, here and on disk (tests)."""
    with _LOCK:
        _STATE.pop("decision", None)
        for kind in KINDS:
            verdicts.VERDICTS.forget(f"onednn-{kind}")


#: The kinds of convolution timed apart, each on the convolution ``use`` times for it
#: (channels in, out, size, kernel; stride 1, same padding): spatial ones against im2col,
#: depthwise ones (one filter per channel: MobileNet's, EfficientNet's) against rlx's
#: native depthwise kernel, grouped ones (1 < groups < channels) against rlx's grouped
#: kernel. Pointwise ones are not timed (``NOT_TIMED``).
PROBES: dict[str, tuple[int, int, int, int]] = {"spatial": (64, 64, 28, 3), "depthwise": (96, 96, 56, 3),
                                                "grouped": (128, 128, 28, 3), "grouped-small": (208, 208, 14, 3)}
#: The probe's groups for each kind (1 where not named).
PROBE_GROUPS = {"depthwise": 96, "grouped": 32, "grouped-small": 26}
#: Output planes of at most this many outputs (14 x 14) make a grouped convolution
#: ``grouped-small``, a kind timed apart: rlx's grouped kernel keeps 16 outputs of a row in
#: a vector, so 7- and 14-wide rows waste half of it or more, where oneDNN blocks channels
#: instead. RegNet's shapes at batch 8 on the 2-core Zen 3: oneDNN ran the grouped layers
#: over 14x14 and 7x7 about twice as fast as rlx's kernel and the one over 28x28 a little
#: faster, but the 56x56 -> 28x28 one at half rlx's speed (measured: BENCHMARKS.md, section
#: 'GEMM stores, recycled outputs and kept verdicts (issue 35, session 19)').
#: Only for few channels a group (``SMALL_GROUP``, RegNet's 8): ResNeXt's 16 and 32 a group
#: over 14x14 and 7x7 ran as well or better on rlx's (the model at batch 8, same process:
#: 2.04x ORT's time with them on rlx's kernel, 2.22x on oneDNN; RegNet 2.03x -> 1.72x).
SMALL_PLANE = 196
SMALL_GROUP = 8
#: The product ``use("matmul")`` times (rows, inner, columns: a BERT-base layer over 128
#: tokens), a dense layer with its bias, oneDNN's matmul against rlx's way (oneMKL or rlx's
#: GEMM, ``gemm.py``). On the 2-core Xeon (AVX-512) oneDNN ran the bare products of
#: transformer layers 1.02-1.41x as fast as oneMKL's sgemm, most for few rows (32 x 768 x
#: 768: 1.41x; 128 x 768 x 3072: 1.02x): BENCHMARKS.md, section 'oneDNN's matmul for dense
#: layers (issue 35, session 24)'.
MATMUL_PROBE = (128, 768, 768)
#: Every kind ``use`` decides: the convolutions', and dense layers' products.
KINDS = (*PROBES, "matmul")
#: What ``auto`` says of the kinds it does not time (see the module doc).
NOT_TIMED = {"pointwise": "rlx (a 1x1 convolution is one GEMM in NCHW; oneDNN's adds reorders to NHWC and back)"}
#: How much faster oneDNN must be on a kind's probe to take it: the probe is one shape
#: and rlx's way needs no reorders, so a near tie goes to rlx. Timed with no margin, the
#: pointwise decision flipped from run to run on the 2-core Zen 3 (0.66x, 0.90x, 1.06x at
#: 256 -> 256 over 14x14, 0.80x to 1.56x at 64 -> 256 over 56x56).
MARGIN = 1.15
#: The same for products: no reorders on either side (the weights are reordered once), so
#: a smaller lead is real; a tie still goes to rlx.
MATMUL_MARGIN = 1.04


def kind_of(kernel: tuple[int, int], stride: tuple[int, int], groups: int = 1, channels: int = 0,
            out_channels: int = 0, plane: int = 0) -> str:
    """``depthwise`` for one filter per channel, ``grouped`` for other grouped ones
    (``grouped-small`` where the output plane, ``plane`` outputs, is at most
    ``SMALL_PLANE`` and a group has at most ``SMALL_GROUP`` input channels), ``pointwise``
    for a 1x1 convolution at stride 1, else ``spatial``."""
    if groups > 1 and groups == channels == out_channels:
        return "depthwise"
    if groups > 1:
        small = 0 < plane <= SMALL_PLANE and 0 < channels <= SMALL_GROUP * groups
        return "grouped-small" if small else "grouped"
    return "pointwise" if tuple(kernel) == (1, 1) and tuple(stride) == (1, 1) else "spatial"


def use(kind: str = "spatial") -> Dnnl | None:
    """oneDNN when convolutions of ``kind`` (or, for ``"matmul"``, dense layers' products)
    should run on it here: forced on, or measured faster once per process at the first
    one planned; else None."""
    mode = wanted()
    lib = library()
    if lib is None or mode == "off":
        return None
    if mode == "on":
        return lib
    if kind in NOT_TIMED:
        return None
    with _LOCK:
        decisions = _STATE.setdefault("decision", {})
        if kind not in decisions:
            decisions[kind] = (False, "probing")  # the probe's own rlx compile must not ask again
            decisions[kind] = verdicts.settled_answer(f"onednn-{kind}", lambda: _measure(lib, kind))
            log.info("rlx-cpu: %s %s (%s)", kind, "on oneDNN" if decisions[kind][0] else "on rlx's kernels",
                     decisions[kind][1])
        return lib if decisions[kind][0] else None


#: The reduced precisions oneDNN may compute faster than float32 here. bf16 needs a unit
#: that multiplies it (``bf16_units``: AMX, or AVX512_BF16 where it measures faster than
#: float32 on this host). fp16 is not declared: AVX512_FP16 ran oneDNN's products at
#: 0.5-1x float32's speed on the AMX host, and no AMX-FP16 CPU was at hand to measure
#: (BENCHMARKS.md, section "bf16 on AMX (issue 35, session 32)").
_PRECISION_TYPES = {"bf16": _BF16}


def precisions() -> frozenset[str]:
    """The reduced precisions this host takes (``Backend.precisions``): the CPU's flags
    and oneDNN installed and not off. Cheap: nothing is loaded."""
    found = frozenset({"bf16"}) if bf16_units.unit() is not None else frozenset()
    if not found or wanted() == "off" or find_library() is None:
        return frozenset()
    return found


def describe_precisions() -> str:
    """The probe's ``"precision"`` entry (``rlx devices --explain``): the reduced precisions
    ``CompileOptions.precision`` may select here, or why none. Loads nothing."""
    found = precisions()
    if found:
        return (f"{', '.join(sorted(found))} when allowed (precision='bf16': {bf16_units.describe()}; oneDNN): "
                "convolutions and dense layers' products with bf16 operands where that unit runs them; float32 "
                "otherwise")
    if bf16_units.unit() is None:
        return "float32 only: bf16 needs a CPU with AMX or AVX512_BF16 (this one has neither)"
    if wanted() == "off":
        return "float32 only: bf16 runs on oneDNN, off here (RLX_CPU_ONEDNN=off)"
    return "float32 only: bf16 runs on oneDNN (pip install 'rlx-cpu[onednn]')"


def reduced(precision: str) -> tuple[Dnnl, int] | None:
    """oneDNN and the dtype a product's operands take under ``precision``, where this host
    takes it (``precisions``) and its unit makes it pay (``bf16_units.pays``: timed at the
    first call on an AVX512-BF16 host); else None (float32, the probe's way: nothing is
    held reduced nor rounded)."""
    if precision not in _PRECISION_TYPES or precision not in precisions():
        return None
    lib = library()
    return (lib, _PRECISION_TYPES[precision]) if lib is not None and bf16_units.pays(lib)[0] else None


def describe(measured: bool = True) -> str:
    """The probe's ``"onednn"`` entry: which oneDNN, and whether convolutions run on it.
    ``measured=False`` leaves out what this process loaded and measured (see
    ``gemm.describe``)."""
    mode = wanted()
    if mode == "off":
        return "off (RLX_CPU_ONEDNN=off)"
    path = find_library()
    if path is None:
        return "not installed (pip install 'rlx-cpu[onednn]' for oneDNN's convolutions)"
    lib = _STATE.get("lib") if measured else None
    version = f"oneDNN {lib.version}" if lib is not None else f"oneDNN at {path}"
    if mode == "on":
        return f"{version}: every convolution and dense layer's product it takes (RLX_CPU_ONEDNN=on)"
    found = _STATE.get("decision", {}) if measured else {}
    parts = [f"{kind}: {'oneDNN' if found[kind][0] else 'rlx'} ({found[kind][1]})" if kind in found else
             f"{kind}: timed against rlx's at the first one" for kind in KINDS]
    parts.insert(1, "".join(f"{kind}: {why}" for kind, why in NOT_TIMED.items()))
    return f"{version} for convolutions and dense layers' products; " + "; ".join(parts)


def _measure(lib: Dnnl, kind: str) -> tuple[bool, str]:
    """Time one probe convolution through the whole cpu backend both ways (each the
    better of a few runs, alternating), on answers that agree."""
    from rlx_core.ir import Graph
    from rlx_core.plugin import CompileOptions, best_of

    from .backend import CpuBackend
    from .gemm import PROBE_REPEATS

    rng = np.random.default_rng(0)
    g = Graph("onednn-probe")
    if kind == "matmul":
        m, kk, n = MATMUL_PROBE
        x = g.input("x", (m, kk), "float32")
        w = g.param("w", (rng.random((kk, n), dtype=np.float32) - 0.5) / math.sqrt(kk))
        g.set_outputs([g.add(g.matmul(x, w), g.param("b", rng.random(n, dtype=np.float32)))])
        feeds = {"x": rng.random((m, kk), dtype=np.float32)}
        what, margin = f"a {m} x {kk} x {n} dense layer", MATMUL_MARGIN
    else:
        c, o, hw, k = PROBES[kind]
        groups = PROBE_GROUPS.get(kind, 1)
        x = g.input("x", (1, c, hw, hw), "float32")
        w = g.param("w", (rng.random((o, c // groups, k, k), dtype=np.float32) - 0.5) / math.sqrt(c // groups * k * k))
        g.set_outputs([g.conv2d(x, w, padding=k // 2, groups=groups)])
        feeds = {"x": rng.random((1, c, hw, hw), dtype=np.float32)}
        what = f"{c} -> {o} {k}x{k}{f' {kind} ({groups} groups)' if groups > 1 else ''} over {hw}x{hw}"
        margin = MARGIN
    g.freeze()
    times: dict[str, float] = {}
    outs: dict[str, np.ndarray] = {}
    decisions = _STATE["decision"]
    try:
        for mode in ("rlx", "onednn", "rlx", "onednn"):
            decisions[kind] = (mode == "onednn", "probing")
            exe = CpuBackend().compile(g, CompileOptions(device="cpu"))
            outs[mode] = exe.run(feeds)[0]
            times[mode] = min(times.get(mode, math.inf), best_of(lambda e=exe: e.run(feeds), PROBE_REPEATS))
    except Exception as exc:  # a probe never breaks the compile that asked: rlx's kernels then
        return False, f"oneDNN failed on the probe: {type(exc).__name__}: {exc}"
    if not np.allclose(outs["rlx"], outs["onednn"], rtol=1e-3, atol=1e-4):  # never trade a right answer
        return False, f"oneDNN disagreed with rlx at {what}"
    ratio = times["rlx"] / times["onednn"]
    return ratio >= margin, f"timed {ratio:.2f}x rlx's speed at {what}"


# --------------------------------------------------------------------- convolution steps
