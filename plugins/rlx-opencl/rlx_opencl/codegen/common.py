"""What every kernel generator shares: OpenCL C types per IR dtype, loads and stores,
index arithmetic with shapes baked in as constants, and the ``Kernel`` record.

Every shape is a compile-time constant in the generated source, so kernels take only
buffer arguments, the compiler folds the index arithmetic, and a launch needs no
per-run argument setting. Data on the device has exactly numpy's layout (C order,
``bool`` as one byte, ``float16`` as IEEE half), so inputs and outputs copy as raw bytes.

``float16`` is stored as ``half`` and computed in ``float`` through ``vload_half`` /
``vstore_half_rte``, which are core OpenCL C: no ``cl_khr_fp16`` needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "Kernel",
    "Arg",
    "STORAGE",
    "COMPUTE",
    "RAW",
    "INT_CTYPES",
    "INT_LOWEST",
    "SIGNED_CTYPES",
    "literal",
    "load",
    "store",
    "loadv",
    "storev",
    "strides",
    "coords",
    "broadcast_offset",
    "header",
    "param_decl",
    "MAX_INDEX",
    "MAX_VECTOR_BITS",
    "CTYPE_BYTES",
    "vector_lanes",
]

#: The fixed-width integers: OpenCL C's own types, held and computed as they are (C's
#: conversions to a narrower integer keep the low bits: numpy's wrap-around).
_INTS = {"int32": "int", "int64": "long", "int8": "char", "uint8": "uchar", "int16": "short", "uint16": "ushort",
         "uint32": "uint", "uint64": "ulong"}
#: How each IR dtype is held in a buffer.
STORAGE = {"float32": "float", "float64": "double", "float16": "half", **_INTS, "bool": "uchar"}
#: The type values of each IR dtype are computed in (half computes in float).
COMPUTE = {"float32": "float", "float64": "double", "float16": "float", **_INTS, "bool": "uchar"}
#: The integer C types, and the smallest value of each (what a max reduction starts from).
INT_CTYPES = frozenset(_INTS.values()) | {"uchar"}
INT_LOWEST = {"char": "CHAR_MIN", "uchar": "((uchar)0)", "short": "SHRT_MIN", "ushort": "((ushort)0)",
              "int": "INT_MIN", "uint": "0u", "long": "LONG_MIN", "ulong": "0ul"}
SIGNED_CTYPES = frozenset({"char", "short", "int", "long"})
#: Raw unsigned types by item size: data movement copies bits, never converts.
RAW = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}

#: Indices are 32-bit ints in the generated code; larger tensors are declined by ``claims``.
MAX_INDEX = 2**31 - 1
#: The widest vectors generated (``float16``, ``double8``: one AVX-512 register). A device
#: whose compiler cannot take them gets narrower ones (``runtime.max_vector_bits``).
MAX_VECTOR_BITS = 512
#: Bytes of one value of each compute type.
CTYPE_BYTES = {"float": 4, "double": 8, "int": 4, "long": 8, "uchar": 1, "char": 1, "short": 2, "ushort": 2,
               "uint": 4, "ulong": 8}


@dataclass(frozen=True)
class Arg:
    """A kernel argument: the buffer of graph value ``value`` (after aliasing), a scratch
    buffer of the step (``scratch`` index), or the executable's status buffer."""

    value: int | None = None
    scratch: int | None = None
    status: bool = False


@dataclass(frozen=True)
class Kernel:
    """One kernel launch: its OpenCL C source (one ``__kernel`` called ``name``), global
    size, and buffer arguments in order.

    ``private_bytes`` estimates what one work-item keeps live (its vector accumulators);
    the launch's work-group size is bounded by it (``launch.py``), since drivers report
    no useful figure of their own (PoCL says 1024 bytes for every kernel). 0: a few scalars.
    """

    name: str
    source: str
    global_size: tuple[int, ...]
    args: tuple[Arg, ...]
    uses_fp64: bool = False
    checks: tuple[str, ...] = field(default=())
    private_bytes: int = 0


def vector_lanes(ctype: str, most: int, vector_bits: int) -> int:
    """``most`` lanes of ``ctype``, or as many as fit in ``vector_bits`` when that is fewer."""
    return max(1, min(most, vector_bits // (8 * CTYPE_BYTES[ctype])))


def literal(x: float, ctype: str) -> str:
    """A C literal of ``x`` typed as ``ctype`` (``1.0f`` for float, so that it mixes with
    float vectors; doubles unsuffixed; ints plain)."""
    if ctype in INT_CTYPES:
        return f"(({ctype}){int(x)})"
    if math.isnan(x):
        return "NAN" if ctype == "float" else "((double)NAN)"
    if math.isinf(x):
        inf = "INFINITY" if ctype == "float" else "((double)INFINITY)"
        return inf if x > 0 else f"(-{inf})"
    text = repr(float(x))
    return f"{text}f" if ctype == "float" else text


def load(dtype: str, ptr: str, idx: str) -> str:
    """An expression reading element ``idx`` of ``ptr`` as its compute type."""
    return f"vload_half({idx}, {ptr})" if dtype == "float16" else f"{ptr}[{idx}]"


def store(dtype: str, ptr: str, idx: str, value: str) -> str:
    """A statement writing ``value`` (compute type) to element ``idx`` of ``ptr``."""
    if dtype == "float16":
        return f"vstore_half_rte({value}, {idx}, {ptr});"
    return f"{ptr}[{idx}] = ({STORAGE[dtype]})({value});"


def loadv(dtype: str, ptr: str, idx: str, width: int) -> str:
    """``width`` consecutive elements from element ``idx`` as a compute-type vector."""
    if dtype == "float16":
        return f"vload_half{width}(0, {ptr} + ({idx}))"
    return f"vload{width}(0, {ptr} + ({idx}))"


def storev(dtype: str, ptr: str, idx: str, value: str, width: int) -> str:
    if dtype == "float16":
        return f"vstore_half{width}_rte({value}, 0, {ptr} + ({idx}));"
    return f"vstore{width}({value}, 0, {ptr} + ({idx}));"


def strides(shape: Sequence[int]) -> list[int]:
    """C-order element strides of ``shape``."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def coords(index: str, shape: Sequence[int], prefix: str) -> list[str]:
    """Lines declaring ``{prefix}{d}``, the coordinates of flat C-order ``index`` in
    ``shape`` (dimensions of size 1 are the constant 0, and no line is emitted)."""
    lines = []
    for d, (size, stride) in enumerate(zip(shape, strides(shape))):
        if size == 1:
            lines.append(f"const int {prefix}{d} = 0;")
        elif stride == 1:
            lines.append(f"const int {prefix}{d} = ({index}) % {size};")
        elif d == 0:
            lines.append(f"const int {prefix}{d} = ({index}) / {stride};")
        else:
            lines.append(f"const int {prefix}{d} = (({index}) / {stride}) % {size};")
    return lines


def broadcast_offset(out_shape: Sequence[int], in_shape: Sequence[int], prefix: str) -> str:
    """The flat offset into an operand of ``in_shape`` broadcast (numpy rules) to
    ``out_shape``, in terms of the output coordinates ``{prefix}{d}``."""
    lead = len(out_shape) - len(in_shape)
    terms = []
    for d, (size, stride) in enumerate(zip(in_shape, strides(in_shape))):
        if size == 1:
            continue
        c = f"{prefix}{d + lead}"
        terms.append(c if stride == 1 else f"{c} * {stride}")
    return " + ".join(terms) or "0"


def header(uses_fp64: bool) -> str:
    return "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if uses_fp64 else ""


def param_decl(dtype: str, name: str, *, const: bool, raw: bool = False) -> str:
    """A kernel parameter for a buffer of ``dtype`` (``raw``: unsigned bits of its size)."""
    from rlx_core.plugin import itemsize

    ctype = RAW[itemsize(dtype)] if raw else STORAGE[dtype]
    return f"__global {'const ' if const else ''}{ctype}* restrict {name}"
