"""Fused float32 elementwise regions on the native block interpreter (``native.c``).

A region qualifies when its output is float32, every input it reads is float32 or bool
(bytes, read as 0/1 floats: an exporter's masks), and each instruction is one the
interpreter has (every elementwise op; comparisons, ``where`` and the ``where`` an ONNX
import writes for ``And``/``Or``/``Not`` through 0/1 floats; casts only between float32
and bool). Anything else keeps the numpy path of ``fused.py``, which computes the same
function.

The plan fixes everything but the caller's addresses: the output's shape with adjacent
axes merged where every operand allows it, each input's kind (contiguous like the output,
a scalar, or strided/broadcast, with element strides per merged axis), the program with
registers reused once their value is dead, all in one int64 array; the addresses of plan
buffers and residents go into a pointer array once. A run is then one C call, on every
core (OpenMP threads taking chunks of blocks as they come free) when the region is long
enough to pay for the fork-join (``SPLIT_NS``). A caller's array has its address read
per run; one that is not C-contiguous float32 is copied to one first. Where oneMKL is
loaded, exp, log, tanh and erf run through its vector math (``VML_FUNCTIONS``), each only
where it measured faster than the interpreter's own function in this process.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from rlx_core.ir import Node
from rlx_core.ir.ops import OpKind
from rlx_core.plugin import Instruction, live_instructions

from . import ccall
from .blas import VML_MODE, mkl
from .ccall import address_of
from .native import Native, library
from .peephole import fuse_chains
from .steps import HELD16, Dyn, Step

__all__ = ["region_steps", "node_steps", "epilogue", "Epilogue", "OPCODES", "SPLIT_NS", "RegionTemplate",
           "NoFit"]

log = logging.getLogger("rlx_cpu")
_F32 = "float32"
#: The interpreter's opcodes (``native.c``'s enum).
OPCODES = {name: code for code, name in enumerate(
    ("copy", "add", "sub", "mul", "div", "pow", "max", "min", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf",
     "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "eq", "lt", "gt", "where", "nonzero", "silu", "hardsigmoid",
     "hardswish", "pows"))}
_BY_OP = {
    OpKind.ADD: "add", OpKind.SUB: "sub", OpKind.MUL: "mul", OpKind.DIV: "div", OpKind.POW: "pow",
    OpKind.MAXIMUM: "max", OpKind.MINIMUM: "min", OpKind.NEG: "neg", OpKind.ABS: "abs", OpKind.EXP: "exp",
    OpKind.LOG: "log", OpKind.SQRT: "sqrt", OpKind.RSQRT: "rsqrt", OpKind.ERF: "erf", OpKind.TANH: "tanh",
    OpKind.SIGMOID: "sigmoid", OpKind.RELU: "relu", OpKind.EQUAL: "eq", OpKind.LESS: "lt", OpKind.GREATER: "gt",
    OpKind.WHERE: "where",
}
_OP_OF = {name: op for op, name in _BY_OP.items()}
_COMPARISONS = frozenset({OpKind.EQUAL, OpKind.LESS, OpKind.GREATER})
#: Rough single-thread cost per element of each opcode, ns (2-core AVX-512 host), used
#: only to decide whether a region is long enough to split over two threads.
_COST_NS = {"pow": 4.0, "exp": 0.5, "log": 0.7, "tanh": 0.9, "sigmoid": 0.7, "erf": 1.1, "gelu": 0.9,
            "gelu_tanh": 1.0, "div": 0.25, "silu": 0.75, "hardsigmoid": 0.15, "hardswish": 0.2,
            "pows": 0.15}
_COST_OTHER_NS = 0.1
_COST_GATHER_NS = 0.3
#: A region whose estimated single-thread time is at least this runs on two threads or
#: more, one per SPLIT_NS of it (``Native.threads_for``; an OpenMP fork-join costs a few µs
#: while the team spins, tens of µs once it sleeps).
SPLIT_NS = 20_000.0
_MAX_DIMS = 8
_MAX_VALUES = 64 + 256
_IN_FULL, _IN_SCALAR, _IN_STRIDED = 0, 1, 2
_IN_BYTES = 8  # (or-ed into a kind: the operand holds bools, native.c's IN_BYTES)
_IN_BF16 = 16  # (or-ed into a full operand's kind: it is held bf16, native.c's IN_BF16; ``held.py``)
_OUT_F32, _OUT_BF16 = 1, 2  # meta[0]: the output's format (native.c's OUT_BF16)


class _NoFit(Exception):
    """The region is not one the interpreter runs: numpy's path takes it."""


def _opcode(ins: Instruction, types: list[str]) -> str:
    op = ins.op
    if op is OpKind.CAST:
        src = types[ins.args[0]]
        if ins.dtype == _F32 and src in (_F32, "bool"):
            return "copy"
        if ins.dtype == "bool" and src == _F32:
            return "nonzero"
        raise _NoFit
    if op is OpKind.GELU:
        return "gelu_tanh" if ins.attrs.get("approximate") == "tanh" else "gelu"
    args = [types[a] for a in ins.args]
    name = _BY_OP.get(op)
    if name is None:
        raise _NoFit
    if op is OpKind.WHERE:  # between floats, or between bools (0/1 floats: an import's and, or, not)
        if args[0] != "bool" or args[1] != args[2] or args[1] != ins.dtype:
            raise _NoFit
    elif op in _COMPARISONS:  # of floats, or of bools (0 < 1 as False < True)
        if args[0] != args[1] or ins.dtype != "bool":
            raise _NoFit
    elif any(t != _F32 for t in args):
        raise _NoFit
    if ins.dtype not in (_F32, "bool"):
        raise _NoFit
    return name


def _element_strides(x: Any, out_shape: tuple[int, ...]) -> list[int]:
    """``x``'s element strides along each output axis (0 where it broadcasts): float32
    elements, or bools (bytes, read as 0/1 floats)."""
    size = _itemsize(x)
    if isinstance(x, Dyn):  # (a caller's array is made C-contiguous per run where it is not)
        byte_strides, acc = [], size
        for d in reversed(x.shape):
            byte_strides.append(acc)
            acc *= max(d, 1)
        byte_strides.reverse()
    else:
        if not x.flags.aligned:
            raise _NoFit
        byte_strides = list(x.strides)
    lead = len(out_shape) - x.ndim
    strides = []
    for k in range(len(out_shape)):
        j = k - lead
        if j < 0 or x.shape[j] == 1:
            strides.append(0)
        elif byte_strides[j] % size:
            raise _NoFit
        else:
            strides.append(byte_strides[j] // size)
    return strides


def _itemsize(x: Any) -> int:
    """The bytes of one of ``x``'s elements as the interpreter reads them; ``_NoFit`` for a
    dtype it does not read (float32, and bools as 0/1 floats)."""
    if x.dtype == np.float32:
        return 4
    if x.dtype == np.bool_:
        return 1
    if x.dtype == HELD16:
        return 2
    raise _NoFit


def _with_dtype(kind: int, x: Any) -> int:
    """``kind`` as the interpreter's meta holds it: with ``_IN_BYTES`` for a bool operand,
    ``_IN_BF16`` for one held bf16 (read whole only: ``_NoFit`` else)."""
    if x.dtype == HELD16:
        if kind != _IN_FULL:
            raise _NoFit
        return kind | _IN_BF16
    return kind | _IN_BYTES if x.dtype == np.bool_ else kind


def _merge(shape: tuple[int, ...], operands: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop unit axes and merge neighbours every operand walks as one."""
    keep = [k for k, d in enumerate(shape) if d != 1]
    dims = [shape[k] for k in keep] or [1]
    strides = [[s[k] for k in keep] or [0] for s in operands]
    k = len(dims) - 1
    while k > 0:
        if all(s[k - 1] == s[k] * dims[k] for s in strides):
            dims[k - 1] *= dims[k]
            del dims[k]
            for s in strides:
                s[k - 1] = s[k]
                del s[k]
        k -= 1
    return dims, strides


def _registers(code: list[tuple[str, tuple[int, ...]]], n_in: int) -> list[int]:
    """A register per instruction (-1: the output, for the last), reusing dead ones: every
    op reads element i of its operands before it writes element i, so an instruction may
    write over an operand that dies there."""
    last: dict[int, int] = {}
    for k, (_, args) in enumerate(code):
        for a in args:
            last[a] = k
    regs: list[int] = []
    free: list[int] = []
    count = 0
    for k, (_, args) in enumerate(code):
        for a in sorted(set(args)):
            if a >= n_in and last[a] == k and regs[a - n_in] >= 0:
                free.append(regs[a - n_in])
        if k == len(code) - 1:
            regs.append(-1)
            break
        if free:
            regs.append(free.pop())
        else:
            regs.append(count)
            count += 1
    return regs


#: Opcodes that may run through oneMKL's vector math when MKL is loaded (``native.c``'s vml
#: table): each only where it measured faster than native.c's own function in this process.
VML_FUNCTIONS = {"exp": "Exp", "log": "Ln", "tanh": "Tanh", "erf": "Erf"}
#: MKL's function must beat native.c's by this much to be used.
VML_MARGIN = 1.10
_VML_TABLES: dict[int, np.ndarray | None] = {}
_VML_PROBE_ELEMENTS = 16 * 1024


def _vml_table(lib: Native) -> np.ndarray | None:
    """The table of MKL vector-math entry points by opcode for the functions where MKL is
    faster here, or None (then every op runs on native.c's own functions). Made once per
    process. Why measure: MKL picks its kernels by CPU vendor, and on a 2-core Zen 5 its
    VML_HA functions ran 1.4-5x slower than native.c's (1.2M elements, 2 threads: exp 783
    against 180 µs, tanh 2503 against 544, erf 1264 against 926)."""
    mkl_lib = mkl()
    if mkl_lib is None:
        return None
    key = id(mkl_lib)
    if key not in _VML_TABLES:
        if lib.vml_size != 8 * (len(OPCODES) + 1):  # pragma: no cover - a library out of step with this module
            return None
        table = np.zeros(len(OPCODES) + 1, np.uint64)
        table[-1] = VML_MODE
        for op, name in VML_FUNCTIONS.items():
            entry = ctypes.cast(mkl_lib.vml(name), ctypes.c_void_p).value or 0
            if entry and _vml_wins(lib, op, entry):
                table[OPCODES[op]] = entry
        _VML_TABLES[key] = table if table[:-1].any() else None
        chosen = [op for op in VML_FUNCTIONS if table[OPCODES[op]]]
        log.info("rlx-cpu: MKL vector math for %s", ", ".join(chosen) or "nothing (native.c is faster)")
    return _VML_TABLES[key]


def _vml_wins(lib: Native, op: str, entry: int) -> bool:
    """Whether MKL's ``op`` beats native.c's by ``VML_MARGIN`` on one thread over
    ``_VML_PROBE_ELEMENTS`` floats (the best of 5 calls of each, after one)."""
    x = np.linspace(0.1, 4.0, _VML_PROBE_ELEMENTS, dtype=np.float32)
    out = np.empty_like(x)
    (step,) = _plan(lib, [Instruction(_OP_OF[op], (0,), {}, x.shape, _F32)], [x], out, vml=None)
    runner = step.fn
    assert isinstance(runner, _Runner)
    table = np.zeros(len(OPCODES) + 1, np.uint64)
    table[OPCODES[op]], table[-1] = entry, VML_MODE
    native = _Runner(runner.fn, runner.meta, runner.ptrs, None, runner.n, 1, [x, out])
    vml = _Runner(runner.fn, runner.meta, runner.ptrs, table, runner.n, 1, [x, out])
    best = {}
    for name, run in (("native", native), ("vml", vml)):
        times = []
        for k in range(6):
            start = time.perf_counter()
            run()
            if k:
                times.append(time.perf_counter() - start)
        best[name] = min(times)
    return best["native"] > VML_MARGIN * best["vml"]


def region_steps(instructions: list[Instruction], ins: list[Any], out: Any) -> list[Step] | None:
    """The steps running a float32 region on the native interpreter, or None when it does
    not fit (no library, another dtype, an op it lacks, an aliasing it cannot take)."""
    lib = library()
    if lib is None or out.dtype not in (np.float32, HELD16) or out.size == 0:
        return None
    try:
        return _plan(lib, live_instructions(instructions, len(ins)), ins, out)
    except _NoFit:
        return None


def node_steps(node: Node, ins: list[Any], out: Any) -> list[Step] | None:
    """One elementwise op as a one-instruction region (None: numpy's kernel runs it)."""
    ins_ = Instruction(node.op, tuple(range(len(ins))), dict(node.attrs), tuple(node.shape), node.dtype)
    return region_steps([ins_], ins, out)


_AUTO: Any = object()


class _Compiled(NamedTuple):
    meta: np.ndarray
    ptrs: np.ndarray
    values: list[Any]  # out, then the inputs the program reads (their addresses in ptrs)
    ops: list[str]
    kinds: list[int]
    n: int


def _compile(instructions: list[Instruction], ins: list[Any], out: Any) -> _Compiled:
    """The interpreter's plan of a region: its int64 program and pointer array."""
    n_in = len(ins)
    types = [_F32 if x.dtype == HELD16 else np.dtype(x.dtype).name for x in ins] + [i.dtype for i in instructions]
    if instructions[-1].dtype != _F32:
        raise _NoFit
    ops = [_opcode(i, types) for i in instructions]
    read = sorted({a for i in instructions for a in i.args if a < n_in})
    order = {a: j for j, a in enumerate(read)}  # inputs the program reads, renumbered
    if len(read) + len(instructions) > _MAX_VALUES:
        raise _NoFit
    if not isinstance(out, Dyn) and not (out.flags.c_contiguous and out.flags.writeable and out.flags.aligned):
        raise _NoFit
    shape = tuple(out.shape)
    operands = [ins[a] for a in read]
    dims, strides = _merge(shape, [_element_strides(x, shape) for x in operands])
    if len(dims) > _MAX_DIMS:
        raise _NoFit
    kinds = _kinds(operands, dims, strides, out)
    n = math.prod(shape)
    code = [(op, tuple(order.get(a, a - n_in + len(read)) for a in i.args)) for op, i in zip(ops, instructions)]
    code = fuse_chains(code, len(read), lambda v: _scalar_value(operands, v, len(read)),
                       lambda v: _scalar_value(operands, v, len(read), constant=True))
    ops = [op for op, _ in code]
    program = _program_meta(code, len(read))
    meta = [_OUT_BF16 if out.dtype == HELD16 else _OUT_F32, len(read), program[0], program[1], len(dims), n, *dims]
    for kind, s in zip(kinds, strides):
        meta += [kind, *s]
    meta += program[2:]
    values = [out, *operands]
    ptrs = np.zeros(len(values), np.uint64)
    for k, x in enumerate(values):
        if not isinstance(x, Dyn):
            ptrs[k] = x.ctypes.data
    return _Compiled(np.array(meta, np.int64), ptrs, values, ops, kinds, n)


def _kinds(operands: list[Any], dims: list[int], strides: list[list[int]], out: Any) -> list[int]:
    """Each operand's kind over the merged ``dims`` (contiguous like the output, a scalar,
    or strided); ``_NoFit`` where one shares memory with the output other than as the
    output itself (the region would read behind or ahead of where it writes)."""
    kinds = []
    contiguous = _contiguous(dims)
    for x, s in zip(operands, strides):
        kind = _with_dtype(_kind(contiguous, s), x)
        if not isinstance(x, Dyn) and not isinstance(out, Dyn) and np.may_share_memory(x, out):
            # (bools never: another dtype; a value held bf16 only into itself, held so)
            if _with_dtype(_IN_FULL, out) != kind or x.ctypes.data != out.ctypes.data:
                raise _NoFit
        kinds.append(kind)
    return kinds


def _program_meta(code: list[tuple[str, tuple[int, ...]]], n_read: int) -> list[int]:
    """The program part of a region's meta: its length, its registers' count, then each
    instruction as (opcode, destination register, three operands), registers reused."""
    regs = _registers(code, n_read)
    meta = [len(code), max(regs) + 1 if len(regs) > 1 else 0]
    for (op, args), dst in zip(code, regs):
        padded = [(a if a < n_read else n_read + regs[a - n_read]) for a in args] + [-1] * (3 - len(args))
        meta += [OPCODES[op], dst, *padded]
    return meta


def _scalar_value(operands: list[Any], v: int, n_read: int, constant: bool = False) -> float | None:
    """Value ``v``'s value where it is an input holding one float32 known at plan time
    (and read-only, a graph constant, if ``constant``), else None."""
    x = operands[v] if v < n_read else None
    if x is None or isinstance(x, Dyn) or x.size != 1 or x.dtype != np.float32 or (constant and x.flags.writeable):
        return None
    return float(x.reshape(-1)[0])


def _plan(lib: Native, instructions: list[Instruction], ins: list[Any], out: Any, *,
          vml: np.ndarray | None = _AUTO) -> list[Step]:
    meta_arr, ptrs, values, ops, kinds, n = _compile(instructions, ins, out)
    cost = n * (sum(_COST_NS.get(op, _COST_OTHER_NS) for op in ops) + _COST_GATHER_NS * kinds.count(_IN_STRIDED))
    threads = lib.threads_for(cost, SPLIT_NS)
    run = _Runner(lib.region, meta_arr, ptrs, _vml_table(lib) if vml is _AUTO else vml, n, threads, values)
    dyn = [(k, x) for k, x in enumerate(values) if isinstance(x, Dyn)]
    if not dyn:
        return [Step(run)]
    return [Step(_DynRunner(run, tuple(k for k, _ in dyn)), tuple(x for _, x in dyn))]


class _Runner:
    """One run of a planned region: ``rlx_region(meta, ptrs, vml, 0, n, threads)``. Holds
    the arrays whose addresses are in ``ptrs``."""

    __slots__ = ("_call", "_meta_p", "_ptrs_p", "_vml_p", "fn", "keep", "meta", "n", "ptrs", "threads", "vml")

    def __init__(self, fn: Callable[..., int], meta: np.ndarray, ptrs: np.ndarray, vml: np.ndarray | None, n: int,
                 threads: int, keep: list[Any]) -> None:
        self.fn, self.meta, self.ptrs, self.vml, self.n, self.threads = fn, meta, ptrs, vml, n, threads
        self.keep = tuple(x for x in keep if not isinstance(x, Dyn))
        self._meta_p, self._ptrs_p = meta.ctypes.data, ptrs.ctypes.data
        self._vml_p = None if vml is None else vml.ctypes.data
        args = [self._meta_p, self._ptrs_p, self._vml_p, 0, n, threads]
        self._call: Callable[[], int] = functools.partial(fn, *args)
        found = ccall.packed_call(fn, args)
        if found is not None:  # one packed argument instead of six (ccall.register_packed)
            entry, packed = found
            self.keep = (*self.keep, packed)
            self._call = functools.partial(entry, packed.ctypes.data)

    def __call__(self) -> None:
        if self._call():
            raise MemoryError(f"rlx-cpu: no memory for the registers of a {self.n}-element region")


def _address(x: Any) -> tuple[int, Any]:
    """The address of ``x`` as a C-contiguous float32 (or bool) array, and the array that
    holds it (``x`` itself, or a contiguous copy of it)."""
    if x.dtype == np.bool_:
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
    elif x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.aligned:
        x = np.ascontiguousarray(x, np.float32)
    return address_of(x), x  # (read-only: same memory, the slower way to its address)


class _DynRunner:
    """A region with caller arrays among its operands: their addresses go into the
    pointer array each run. The output is a plan buffer or a fresh array (contiguous,
    writable); an input that is not contiguous float32 is copied to one for this run."""

    __slots__ = ("positions", "run")

    def __init__(self, run: _Runner, positions: tuple[int, ...]) -> None:
        self.run, self.positions = run, positions

    def __call__(self, *arrays: np.ndarray) -> None:
        ptrs = self.run.ptrs
        held = []
        for k, x in zip(self.positions, arrays):
            if k == 0 and not (x.flags.c_contiguous and x.flags.writeable):
                raise ValueError("rlx-cpu: a region's output must be a contiguous writable array")  # pragma: no cover
            ptrs[k], kept = _address(x)
            held.append(kept)
        self.run()
        del held


class Epilogue:
    """A region a native kernel runs over its own output part by part, as each part is
    finished and still in cache (``native.c``'s ``rlx_epilogue``): the output is the
    region's value 0 and its result. ``address(threads)`` is what the kernel takes, with
    work memory for that many threads; ``run(start, stop)`` applies it to a flat range
    of the output after the fact, for a kernel's numpy fallback."""

    def __init__(self, lib: Native, compiled: _Compiled, vml: np.ndarray | None,
                 scratch: Callable[[tuple[int, ...], Any], np.ndarray],
                 clamp: tuple[float, float] | None = None) -> None:
        self._lib, self._compiled, self._vml, self._scratch = lib, compiled, vml, scratch
        #: (lo, hi) when the whole program is min(max(x, lo), hi): a kernel that clamps its
        #: sums in registers as it stores them (rlx's GEMM) skips the program.
        self.clamp = clamp
        self.per_thread = int(compiled.meta[1] + compiled.meta[3] + (compiled.meta[0] == _OUT_BF16)) * lib.block
        # (native.c's region_work_floats)
        self.keep: list[Any] = [compiled.meta, compiled.ptrs, *compiled.values]
        if vml is not None:
            self.keep.append(vml)

    def address(self, threads: int) -> int:
        """The address of the kernel's ``rlx_epilogue`` with work for ``threads`` threads."""
        work = self._scratch((max(threads, 1) * self.per_thread,), np.float32)
        c = self._compiled
        vml = 0 if self._vml is None else self._vml.ctypes.data
        lo, hi = self.clamp if self.clamp is not None else (0.0, 0.0)
        bounds = int(np.array([lo, hi], np.float32).view(np.uint64)[0])  # the struct's two floats, in order
        struct = np.array([c.meta.ctypes.data, c.ptrs.ctypes.data, vml, work.ctypes.data, self.per_thread,
                           int(self.clamp is not None), bounds], np.uint64)
        self.keep += [struct, work]
        return int(struct.ctypes.data)

    def run(self, start: int = 0, stop: int | None = None) -> None:
        """The epilogue over output elements [start, stop) (default: all), on one thread."""
        c = self._compiled
        vml = None if self._vml is None else self._vml.ctypes.data
        if self._lib.region(c.meta.ctypes.data, c.ptrs.ctypes.data, vml, start, c.n if stop is None else stop, 1):
            raise MemoryError(f"rlx-cpu: no memory for the registers of a {c.n}-element epilogue")


def epilogue(instructions: list[Instruction], operands: list[Any], out: np.ndarray,
             scratch: Callable[[tuple[int, ...], Any], np.ndarray]) -> Epilogue | None:
    """The epilogue running ``instructions`` (a program over ``operands``, of which the
    first is ``out`` itself) in place over ``out`` inside a native kernel, or None where
    it does not fit: no library, an output or operand known only at run time (its address
    would change per run), another dtype, an op the interpreter lacks."""
    lib = library()
    if (lib is None or isinstance(out, Dyn) or any(isinstance(x, Dyn) for x in operands) or out.dtype != np.float32
            or out.size == 0 or operands[0] is not out):
        return None
    try:
        compiled = _compile(live_instructions(instructions, len(operands)), operands, out)
    except _NoFit:
        return None
    if len(compiled.values) < 2 or compiled.values[1] is not out:  # it must read the kernel's output (value 0)
        return None
    return Epilogue(lib, compiled, _vml_table(lib), scratch, clamp_bounds(instructions, operands))


#: What each op of a clamp does to the bounds (lo, hi) of y = min(max(x, lo), hi), given
#: its constant c: max(y, c) is y clamped to [max(lo, c), max(hi, c)], min(y, c) to
#: [min(lo, c), min(hi, c)]; ReLU is max(y, 0).
_CLAMPS: dict[str, Callable[[float, float, float], tuple[float, float]]] = {
    "maximum": lambda lo, hi, c: (max(lo, c), max(hi, c)),
    "minimum": lambda lo, hi, c: (min(lo, c), min(hi, c)),
}


def clamp_bounds(instructions: list[Instruction], operands: list[Any]) -> tuple[float, float] | None:
    """``(lo, hi)`` when the program over ``operands`` (value 0 the kernel's output) is, as a
    whole, ``min(max(x, lo), hi)``: a chain of ``relu``, and ``maximum``/``minimum`` with a
    float32 constant (a ReLU, ReLU6, ONNX ``Clip``), each reading the one before; else None.
    The bounds compose exactly (``_CLAMPS``) and NaN stays NaN either way."""
    lo, hi = -math.inf, math.inf
    current = 0
    for k, ins in enumerate(instructions):
        op, args = OpKind(ins.op).value, tuple(ins.args)
        if ins.dtype != "float32":
            return None
        if op == "relu" and args == (current,):
            lo, hi = max(lo, 0.0), max(hi, 0.0)
        elif op in _CLAMPS and len(args) == 2 and current in args:
            other = args[1] if args[0] == current else args[0]
            c = operands[other] if 0 < other < len(operands) else None
            if not (isinstance(c, np.ndarray) and c.size == 1 and c.dtype == np.float32):
                return None
            lo, hi = _CLAMPS[op](lo, hi, float(c.reshape(-1)[0]))
        else:
            return None
        current = len(operands) + k
    return (lo, hi) if instructions else None


class RegionTemplate:
    """A region planned once for every size (the any-size executable's, ``anysize.py``):
    the program and its registers are made once per pattern of operand kinds (contiguous,
    scalar or strided: a size of 1 changes it), and each call fills in only the merged
    dims, the strides and the addresses before its one C call. A plan's ``_compile`` does
    all of it again for each new size (~80 µs of Python for a five-instruction GELU).
    ``known`` holds the operands whose values are fixed (residents): a one-float one may
    be folded into a fused activation, as in a plan; ``forget`` drops what was made from
    them (``set_param``). ``in_types`` says which inputs the program reads as bools (all
    float32 by default): the caller hands those as bool arrays. A call raises ``NoFit``
    where the interpreter cannot take the operands (another dtype, misaligned or
    overlapping memory): the caller's way runs."""

    def __init__(self, lib: Native, instructions: list[Instruction], n_in: int, known: dict[int, np.ndarray],
                 in_types: list[str] | None = None) -> None:
        instructions = live_instructions(instructions, n_in)
        if not instructions or instructions[-1].dtype != _F32:
            raise _NoFit
        types = (in_types or [_F32] * n_in) + [i.dtype for i in instructions]
        self._ops = [_opcode(i, types) for i in instructions]  # _NoFit for an op the interpreter lacks
        self._read = sorted({a for i in instructions for a in i.args if a < n_in})
        if len(self._read) + len(instructions) > _MAX_VALUES:
            raise _NoFit
        order = {a: j for j, a in enumerate(self._read)}
        nr = len(self._read)
        self._code = [(op, tuple(order.get(a, a - n_in + nr) for a in i.args))
                      for op, i in zip(self._ops, instructions)]
        self._known = {order[a]: x for a, x in known.items() if a in order}
        #: each operand's address where it is a resident (fixed: set_param refills in place), else None
        self._fixed_at = [address_of(self._known[j]) if j in self._known else None for j in range(len(self._read))]
        self._lib, self._vml = lib, _vml_table(lib)
        self._vml_p = None if self._vml is None else self._vml.ctypes.data
        self._made: dict[tuple[int, ...], tuple[list[int], float]] = {}
        self._layouts: dict[tuple[Any, ...], _Layout] = {}

    def forget(self) -> None:
        self._made.clear()
        self._layouts.clear()

    def _program(self, kinds: tuple[int, ...]) -> tuple[list[int], float]:
        """The code part of the interpreter's plan (``_compile``'s) and its cost per element."""
        nr = len(self._read)
        operands = [self._known.get(j) for j in range(nr)]

        def value(v: int, constant: bool = False) -> float | None:
            x = operands[v] if v < nr else None
            return None if x is None else _scalar_value(operands, v, nr, constant)

        code = fuse_chains(list(self._code), nr, value, lambda v: value(v, True))
        cost = sum(_COST_NS.get(op, _COST_OTHER_NS) for op, _ in code) + _COST_GATHER_NS * kinds.count(_IN_STRIDED)
        return _program_meta(code, nr), cost

    def __call__(self, ins: list[np.ndarray], out: np.ndarray) -> None:
        operands = [ins[a] for a in self._read]
        key = (out.shape, out.strides, out.dtype, *[(x.shape, x.strides, x.dtype) for x in operands])
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layout(operands, out)
            if len(self._layouts) >= _MAX_LAYOUTS:  # a stream of new sizes: start again
                self._layouts.clear()
            self._layouts[key] = layout
        if not out.flags.writeable:
            raise _NoFit
        out_at = address_of(out)
        out_end = out_at + layout.out_bytes
        addrs = [out_at]
        for x, fixed, kind, (lo, hi, align) in zip(operands, self._fixed_at, layout.kinds, layout.spans):
            at = address_of(x) if fixed is None else fixed
            if at & align or (at + lo < out_end and out_at < at + hi and (kind != _IN_FULL or at != out_at)):
                raise _NoFit  # misaligned, or read behind or ahead of where the output is written
            addrs.append(at)
        if out_at & 3:
            raise _NoFit
        n = layout.n
        threads = self._lib.threads_for(layout.work_ns, SPLIT_NS)
        if self._lib.region(layout.meta_p, (ctypes.c_uint64 * len(addrs))(*addrs), self._vml_p, 0, n, threads):
            raise MemoryError(f"rlx-cpu: no memory for the registers of a {n}-element region")

    def _layout(self, operands: list[np.ndarray], out: np.ndarray) -> _Layout:
        """What a call of these shapes and strides runs: the interpreter's meta (the dims
        merged, each operand's kind and strides, the program), and each operand's byte
        extent from its address (for the overlap check every call makes)."""
        if not (out.flags.c_contiguous and out.dtype == np.float32):
            raise _NoFit
        shape = out.shape
        flat = self._flat(operands, shape)
        if flat is not None:  # every operand the output's shape, or one value: one flat axis
            dims, strides = [out.size], [[1] if k == _IN_FULL else [0] for k in flat]
            kinds = [_with_dtype(k, x) for k, x in zip(flat, operands)]
        else:
            dims, strides = _merge(shape, [_element_strides(x, shape) for x in operands])
            if len(dims) > _MAX_DIMS:
                raise _NoFit
            contiguous = _contiguous(dims)
            kinds = [_with_dtype(_kind(contiguous, s), x) for s, x in zip(strides, operands)]
        made = self._made.get(tuple(kinds))
        if made is None:
            made = self._made[tuple(kinds)] = self._program(tuple(kinds))
        program, cost = made
        n = out.size
        meta = [1, len(operands), program[0], program[1], len(dims), n, *dims]
        for kind, s in zip(kinds, strides):
            meta += [kind, *s]
        meta_arr = np.array(meta + program[2:], np.int64)
        return _Layout(meta_arr, meta_arr.ctypes.data, n, n * cost, tuple(kinds), [_extent(x) for x in operands],
                       out.nbytes)

    @staticmethod
    def _flat(operands: list[np.ndarray], shape: tuple[int, ...]) -> list[int] | None:
        """Each operand's kind where every one is a contiguous array of the output's shape
        or a single value; else None (then axes are merged)."""
        kinds = []
        for x in operands:
            _itemsize(x)  # (_NoFit for a dtype the interpreter does not read)
            if not x.flags.aligned:
                raise _NoFit
            if x.size == 1 and x.ndim <= len(shape):
                kinds.append(_IN_SCALAR)
            elif x.shape == shape and x.flags.c_contiguous:
                kinds.append(_IN_FULL)
            else:
                return None
        return kinds


#: Layouts a ``RegionTemplate`` keeps (one per set of operand shapes and strides met).
_MAX_LAYOUTS = 256


class _Layout(NamedTuple):
    meta: np.ndarray  # held: ``meta_p`` points into it
    meta_p: int
    n: int
    work_ns: float  # single-thread estimate, for the thread count (read per call: a run may cap threads)
    kinds: tuple[int, ...]
    spans: list[tuple[int, int, int]]  # each operand's bytes (lowest, past the highest) from its address; its
    #: alignment mask (3 for float32, 0 for bools)
    out_bytes: int


def _contiguous(dims: list[int]) -> list[int]:
    """The element strides of a C-contiguous array of ``dims``."""
    return [math.prod(dims[k + 1:]) for k in range(len(dims))]


def _kind(contiguous: list[int], strides: list[int]) -> int:
    """An operand's kind over merged dims whose contiguous strides are ``contiguous``: like
    the output, a scalar, or strided."""
    if strides == contiguous:
        return _IN_FULL
    return _IN_SCALAR if not any(strides) else _IN_STRIDED


def _extent(x: np.ndarray) -> tuple[int, int, int]:
    """The bytes ``x`` spans from its address (lowest offset, one past the highest), and
    the mask its address must clear (its elements' alignment)."""
    align = x.itemsize - 1
    if x.flags.c_contiguous:  # (most operands: no walk over the axes)
        return 0, x.nbytes, align
    if x.size == 0:
        return 0, 0, align
    lo = sum((d - 1) * s for d, s in zip(x.shape, x.strides) if s < 0)
    hi = sum((d - 1) * s for d, s in zip(x.shape, x.strides) if s > 0)
    return lo, hi + x.itemsize, align


#: The public name of the interpreter's refusal (``RegionTemplate`` raises it per call).
NoFit = _NoFit
