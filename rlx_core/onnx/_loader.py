"""Reading an ONNX model into a ``Graph``: parsing, checks, tensors, inputs, outputs.

Everything that can be checked without allocating is checked first, in this order, so
that a bad model fails fast and names its fault: the protobuf and its opset, every
unsupported op at once, the graph's structure (each value defined once, no cycle), each
tensor's dtype, declared size and external location, and each input's dims. Only then
are tensors read and nodes converted, in topological order.
"""

from __future__ import annotations

import heapq
import math
import mmap
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, numpy_helper

from ..errors import ModelError, RlxError
from ..ir import Graph, Value
from ..ir.symbolic import Dim, Sym
from . import (  # noqa: F401  (they register the converters)
    _ops,
    _ops_activations,
    _ops_attention,
    _ops_control,
    _ops_conv_transpose,
    _ops_einsum,
    _ops_indexing,
    _ops_layout,
    _ops_losses,
    _ops_nn,
    _ops_pool,
    _ops_qlinear,
    _ops_quant,
    _ops_recurrent_llm,
    _ops_resize,
    _ops_rnn,
    _ops_scatter,
    _ops_signal,
    _ops_spectral,
    _ops_tensor,
    _ops_unfold,
)
from ._context import CONVERTERS, NeedsHost, NeedsValue, NodeContext, SpliceIf, describe_node, onnx_dtype
from ._host_ops import HOST_OPS
from ._shapes import Emitter, Operand, frozen
from ._subgraphs import node_reads
from ._versions import check_versions, newest_opset

__all__ = ["MIN_OPSET", "MAX_OPSET", "InputSpec", "Model", "prepare", "list_inputs", "onnx_dtype", "check_dims",
           "free_dims", "resolve_dims"]

#: The oldest default-domain opset read at all; which op versions are read is decided
#: node by node (``_versions``), up to the newest opset the installed onnx knows.
MIN_OPSET = 7
#: The newest opset the converters were written against; newer ones are read where the
#: ONNX spec shows the op unchanged (``_versions.readable_versions``).
MAX_OPSET = 21

class InputSpec(tuple):
    """``(name, shape, dtype)`` of a model input; symbolic dims are the ``dims`` key that binds them."""

    __slots__ = ()

    def __new__(cls, name: str, shape: tuple[int | str, ...], dtype: str) -> InputSpec:
        return super().__new__(cls, (name, shape, dtype))

    name = property(lambda self: self[0])
    shape = property(lambda self: self[1])
    dtype = property(lambda self: self[2])

    def __repr__(self) -> str:
        return f"InputSpec(name={self[0]!r}, shape={self[1]!r}, dtype={self[2]!r})"


# ---------------------------------------------------------------- reading the file
def _read(model: Any) -> tuple[ModelProto, str, Path | None]:
    """Parse ``model``; return it, how messages name it, and its folder (for external data)."""
    if isinstance(model, ModelProto):
        return model, f"ONNX model {model.graph.name or '<unnamed>'!r}", None
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _parse(bytes(model), "ONNX bytes"), "ONNX bytes", None
    if isinstance(model, (str, os.PathLike)):
        path = Path(os.fspath(model))
        try:
            proto = _parse_file(path)
        except FileNotFoundError:
            raise ModelError(f"ONNX file {str(path)!r} does not exist") from None
        except OSError as exc:
            raise ModelError(f"cannot read ONNX file {str(path)!r}: {exc.strerror or exc}") from None
        return proto, str(path), path.resolve().parent
    raise ModelError(f"load: expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def _parse_file(path: Path) -> ModelProto:
    """The file parsed from a read-only memory map of it: protobuf copies what it keeps,
    so the file is never also read into a buffer of its own (in a new process, reading a
    60 MB model into fresh memory and parsing it took 64 ms; parsing the map, 34 ms).
    A file that cannot be mapped (a pipe, a special file) is read. (A file truncated in
    place while it is parsed would fault the map; one replaced by a rename, as tools
    save models, is not: the map holds the old file.)"""
    with open(path, "rb") as fh:
        try:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):  # empty (ValueError), or not a mappable file
            return _parse(fh.read(), str(path))
    try:
        with memoryview(mapped) as view:
            return _parse(view, str(path))
    finally:
        try:
            mapped.close()
        except BufferError:  # protobuf kept a view of it: the map lives as long as that does
            pass


def _parse(data: bytes | memoryview, where: str) -> ModelProto:
    if not len(data):
        raise ModelError(f"{where}: empty, not an ONNX model")
    proto = ModelProto()
    try:
        decoded = proto.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning-ish errors, ...
        raise ModelError(f"{where}: not an ONNX model, or truncated (protobuf: {exc})") from None
    if decoded is not None and decoded != len(data):
        raise ModelError(f"{where}: not an ONNX model, or truncated (protobuf read {decoded} of {len(data)} bytes)")
    return proto


def _onnx_version() -> str:
    return str(getattr(onnx, "__version__", "?"))


def _check_header(proto: ModelProto, where: str) -> int:
    """Check the model is ONNX at all and its default-domain opset is one rlx reads."""
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelError(f"{where}: not an ONNX model, or truncated (no ir_version or no graph)")
    versions = {imp.domain: imp.version for imp in proto.opset_import}
    opset = versions.get("", versions.get("ai.onnx"))
    if opset is None:
        raise ModelError(f"{where}: not an ONNX model, or truncated (it imports no default-domain opset)")
    newest = newest_opset()
    if not MIN_OPSET <= opset <= newest:
        raise ModelError(
            f"{where}: opset {opset} is not supported; rlx reads opsets {MIN_OPSET}-{newest} (the newest this onnx "
            f"{_onnx_version()} knows; convert it with onnx.version_converter.convert_version(model, "
            f"{min(max(opset, MIN_OPSET), MAX_OPSET)}))"
        )
    if not proto.graph.output:
        raise ModelError(f"{where}: the graph declares no outputs")
    return opset


def _inline_functions(proto: ModelProto, where: str) -> ModelProto:
    if not proto.functions:
        return proto
    try:
        from onnx import inliner
    except ImportError:  # onnx < 1.16: its ops will be reported as unsupported
        return proto
    try:
        return inliner.inline_local_functions(proto)
    except Exception as exc:
        raise ModelError(f"{where}: cannot inline the model's local functions: {exc}") from None


# ---------------------------------------------------------------- structure
def _check_supported(nodes: Sequence[NodeProto], where: str, also: Collection[str] = ()) -> None:
    """One ``ModelError`` listing every unsupported op type, with a node of each; ``also``
    names op types accepted besides the converters' (the host ops, in a top-level graph)."""
    missing: dict[str, list[str]] = {}
    for i, node in enumerate(nodes):
        if node.domain not in ("", "ai.onnx") or (node.op_type not in CONVERTERS and node.op_type not in also):
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            outs = ", ".join(repr(o) for o in node.output if o)
            missing.setdefault(key, []).append(repr(node.name) if node.name else f"#{i} -> {outs}")
    if missing:
        parts = []
        for op, names in sorted(missing.items()):
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            parts.append(f"{op} (node {names[0]}{more})")
        raise ModelError(f"{where}: unsupported ONNX op{'s' if len(parts) > 1 else ''}: {', '.join(parts)}")


def _toposort(graph: GraphProto, sources: set[str], where: str) -> list[int]:
    """Node indices in an order where every value is defined before use.

    Nodes are normally stored sorted (then this returns them as they are); an unsorted
    but acyclic graph is sorted like ONNX Runtime does, stably. A value defined twice, a
    value nothing defines and a cycle are ``ModelError``s naming the nodes at fault.
    """
    nodes = graph.node
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.output:
            if not out:
                continue
            if out in sources:
                raise ModelError(f"{where}: {describe_node(node, i)} redefines {out!r}, a graph input or initializer")
            if out in producer:
                first = describe_node(nodes[producer[out]], producer[out])
                raise ModelError(f"{where}: value {out!r} is defined twice, by {first} and {describe_node(node, i)}")
            producer[out] = i
    deps: list[set[int]] = []
    for i, node in enumerate(nodes):
        need = set()
        for name in node_reads(node):
            if name in sources:
                continue
            if name not in producer:
                raise ModelError(f"{where}: {describe_node(node, i)} uses {name!r}, which no node, input or "
                                 "initializer defines")
            need.add(producer[name])
        deps.append(need)
    for out in graph.output:
        if out.name not in sources and out.name not in producer:
            raise ModelError(f"{where}: graph output {out.name!r} is not defined by any node, input or initializer")
    if all(d < i for i, need in enumerate(deps) for d in need):
        return list(range(len(nodes)))
    users: list[list[int]] = [[] for _ in nodes]
    pending = [len(need) for need in deps]
    for i, need in enumerate(deps):
        for d in need:
            users[d].append(i)
    ready = [i for i, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):
        stuck = [describe_node(nodes[i], i) for i, n in enumerate(pending) if n > 0]
        raise ModelError(f"{where}: the graph has a cycle through {', '.join(stuck[:5])}"
                         f"{f' and {len(stuck) - 5} more' if len(stuck) > 5 else ''}")
    return order


def _live(graph: GraphProto, order: Sequence[int]) -> set[int]:
    """The nodes the outputs depend on; the others are not converted (nor their weights read)."""
    needed = {o.name for o in graph.output}
    live: set[int] = set()
    for i in reversed(order):
        node = graph.node[i]
        if any(out in needed for out in node.output if out):
            live.add(i)
            needed.update(node_reads(node))
    return live


# ---------------------------------------------------------------- tensors
class _TensorReader:
    """Reads ``TensorProto``s after checking dtype, declared size and external location."""

    def __init__(self, where: str, base_dir: Path | None, max_bytes: int) -> None:
        self.where, self.base_dir, self.max_bytes = where, base_dir, max_bytes

    def check(self, t: TensorProto, what: str) -> tuple[str, tuple[int, ...]]:
        """Dtype and dims of ``t``, refusing unsupported dtypes and tensors over the limit."""
        dtype = onnx_dtype(t.data_type, what)
        dims = tuple(int(d) for d in t.dims)
        if any(d < 0 for d in dims):
            raise ModelError(f"{what} declares negative dims {dims}")
        nbytes = math.prod(dims) * np.dtype(dtype).itemsize
        if nbytes > self.max_bytes:
            raise ModelError(f"{what} declares shape {dims} {dtype} ({nbytes} bytes), more than the limit "
                             f"max_tensor_bytes={self.max_bytes}")
        if t.data_location == TensorProto.EXTERNAL:
            self._external_path(t, what)
        return dtype, dims

    def _external_path(self, t: TensorProto, what: str) -> tuple[Path, int, int | None]:
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        if not location:
            raise ModelError(f"{what} is stored externally but names no location")
        if self.base_dir is None:
            raise ModelError(f"{what} is stored in external file {location!r}; load the model from its path "
                             "so that the file can be found next to it")
        rel = Path(location)
        if rel.is_absolute() or rel.drive or location.startswith(("/", "\\")) or ".." in rel.parts or "\0" in location:
            raise ModelError(f"{what}: external data location {location!r} leaves the model's folder "
                             f"{str(self.base_dir)!r} (it must be a relative path inside it)")
        path = Path(os.path.realpath(self.base_dir / rel))
        base = Path(os.path.realpath(self.base_dir))
        if os.path.commonpath([str(path), str(base)]) != str(base):
            raise ModelError(f"{what}: external data location {location!r} resolves to {str(path)!r}, outside "
                             f"the model's folder {str(base)!r} (a symlink?)")
        if not path.is_file():
            raise ModelError(f"{what}: external data file {location!r} does not exist in {str(base)!r}")
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise ModelError(f"{what}: external data offset/length are not integers: {info}") from None
        return path, offset, length

    def read(self, t: TensorProto, what: str) -> np.ndarray:
        dtype, dims = self.check(t, what)
        if t.data_location == TensorProto.EXTERNAL:
            path, offset, length = self._external_path(t, what)
            nbytes = math.prod(dims) * np.dtype(dtype).itemsize
            if length is not None and length != nbytes:
                raise ModelError(f"{what}: external data length {length} does not match its shape {dims} {dtype} "
                                 f"({nbytes} bytes)")
            size = path.stat().st_size
            if offset < 0 or offset + nbytes > size:
                raise ModelError(f"{what}: external file {path.name!r} holds {size} bytes, too few for {nbytes} "
                                 f"bytes at offset {offset}")
            with open(path, "rb") as fh:
                fh.seek(offset)
                raw = fh.read(nbytes)
            arr = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(dims)
        else:
            try:
                arr = numpy_helper.to_array(t)
            except Exception as exc:
                raise ModelError(f"{what}: its data does not match its shape {dims} {dtype}: {exc}") from None
            if arr.shape != dims:
                raise ModelError(f"{what}: its data has shape {arr.shape}, but it declares {dims}")
        return frozen(arr.astype(dtype, copy=False))


# ---------------------------------------------------------------- inputs and dims
def _input_dims(value: onnx.ValueInfoProto, where: str) -> tuple[str, list[int | str]]:
    """An input's dtype and dims, each an int or the ``dims`` key that binds it."""
    name = value.name
    if not value.type.HasField("tensor_type"):
        raise ModelError(f"{where}: input {name!r} is not a tensor ({value.type.WhichOneof('value')}); "
                         "rlx reads tensor inputs only")
    tt = value.type.tensor_type
    dtype = onnx_dtype(tt.elem_type, f"{where}: input {name!r}")
    if not tt.HasField("shape"):
        raise ModelError(f"{where}: input {name!r} declares no shape (not even its rank); rlx needs one")
    dims: list[int | str] = []
    for axis, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or f"{name}:{axis}")
    return dtype, dims


def check_dims(specs: Sequence[tuple[str, str, list[int | str]]], dims: Mapping[str, int], where: str) -> None:
    """Every ``dims`` key names a symbolic dim (or ``input:axis``) and binds it to an int >= 0."""
    symbolic = {d for _, _, shape in specs for d in shape if isinstance(d, str)}
    axis_keys = {f"{name}:{axis}" for name, _, shape in specs for axis in range(len(shape))}
    for key, value in dims.items():
        if key not in symbolic and key not in axis_keys:
            known = ", ".join(repr(s) for s in sorted(symbolic)) or "none"
            raise ModelError(f"{where}: dims names {key!r}, which is not a symbolic dim of the model "
                             f"(its symbolic dims: {known}; or use 'input:axis')")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ModelError(f"{where}: dims[{key!r}] must be an int >= 0, got {value!r}")


def resolve_dims(specs: Sequence[tuple[str, str, list[int | str]]], dims: Mapping[str, int],
                 where: str) -> list[tuple[str, list[int | str]]]:
    """Each input's name and dims as ``dims`` binds them: an int where the model fixes the
    dim or ``dims`` binds it (``"<input>:<axis>"`` first, then the ``dim_param``), else the
    key that would bind it (the dim left free). ``ModelError`` when an ``input:axis`` key
    contradicts a dim the model fixes."""
    out = []
    for name, _, shape in specs:
        resolved: list[int | str] = []
        for axis, d in enumerate(shape):
            key = f"{name}:{axis}"
            if key in dims:
                if isinstance(d, int) and d != dims[key]:
                    raise ModelError(f"{where}: dims[{key!r}] = {dims[key]}, but input {name!r} fixes axis {axis} "
                                     f"at {d}")
                resolved.append(_dim_value(dims[key]))
            elif isinstance(d, int):
                resolved.append(d)
            else:
                resolved.append(_dim_value(dims[d]) if d in dims else d)
        out.append((name, resolved))
    return out


def _dim_value(value: Any) -> Dim:
    """A ``dims`` value: an int, or the ``Sym`` a symbolic load binds a dim to."""
    return value if isinstance(value, Sym) else int(value)


def free_dims(specs: Sequence[tuple[str, str, list[int | str]]], dims: Mapping[str, int], where: str) -> list[str]:
    """The ``dims`` keys of the symbolic dims that ``dims`` leaves unbound, in input order."""
    free = [d for _, shape in resolve_dims(specs, dims, where) for d in shape if isinstance(d, str)]
    return list(dict.fromkeys(free))


def _bind_dims(specs: Sequence[tuple[str, str, list[int | str]]], dims: Mapping[str, int], where: str,
               max_bytes: int) -> list[tuple[str, tuple[int, ...], str]]:
    """Each input's ``(name, shape, dtype)`` with every dim bound by ``dims`` (all are: to
    an int, or to a ``Sym`` in a symbolic load)."""
    out = []
    for (name, shape), (_, dtype, _) in zip(resolve_dims(specs, dims, where), specs):
        assert all(isinstance(d, (int, Sym)) for d in shape), f"unbound dims of input {name!r}: {shape}"
        out.append((name, tuple(shape), dtype))
    for name, shape, dtype in out:
        if any(isinstance(d, Sym) for d in shape):
            continue
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if nbytes > max_bytes:
            raise ModelError(f"{where}: input {name!r} of shape {shape} {dtype} needs {nbytes} bytes, more than the "
                             f"limit max_tensor_bytes={max_bytes}")
    return out


def _input_specs(proto: ModelProto, where: str) -> list[tuple[str, str, list[int | str]]]:
    init_names = {t.name for t in proto.graph.initializer}
    specs = []
    for value in proto.graph.input:
        if value.name in init_names:
            continue  # an initializer listed as input (opset < 9 style): a param
        dtype, dims = _input_dims(value, where)
        specs.append((value.name, dtype, dims))
    return specs


def list_inputs(model: Any) -> list[InputSpec]:
    proto, where, _ = _read(model)
    _check_header(proto, where)
    return [InputSpec(name, tuple(shape), dtype) for name, dtype, shape in _input_specs(proto, where)]


# ---------------------------------------------------------------- the whole load
def prepare(model: Any, *, dims: Mapping[str, int] | None, max_tensor_bytes: int,
            name: str | None, values: Mapping[str, Any] | None = None) -> tuple[Model, dict[str, int], list[str]]:
    """Read and check ``model``: the ``Model`` ready to convert, ``dims`` checked, and the
    symbolic dims it leaves unbound (``dims`` keys, in input order). ``values`` binds
    inputs to constants (their dims bound by the values' shapes)."""
    if isinstance(max_tensor_bytes, bool) or not isinstance(max_tensor_bytes, int) or max_tensor_bytes <= 0:
        raise ModelError(f"load: max_tensor_bytes must be an int > 0, got {max_tensor_bytes!r}")
    proto, where, base_dir = _read(model)
    opset = _check_header(proto, where)
    proto = _inline_functions(proto, where)
    gp = proto.graph
    if gp.sparse_initializer:
        raise ModelError(f"{where}: sparse initializers are not supported "
                         f"({', '.join(repr(t.values.name) for t in gp.sparse_initializer[:3])})")
    _check_supported(gp.node, where, also=HOST_OPS)
    check_versions(gp.node, opset, where)
    specs = _input_specs(proto, where)
    dims = dict(dims or {})
    check_dims(specs, dims, where)
    bound = _check_values(specs, values or {}, dims, where)
    checked = Model(gp, where, base_dir, opset, specs, max_tensor_bytes,
                    name or gp.name or (Path(where).stem if base_dir is not None else "onnx"), bound)
    return checked, dims, free_dims(specs, dims, where)


def _check_values(specs: Sequence[tuple[str, str, list[int | str]]], values: Mapping[str, Any],
                  dims: dict[str, int], where: str) -> dict[str, np.ndarray]:
    """``load``'s ``values`` as arrays of each input's dtype, their dims added to ``dims``
    (``ModelError`` naming an unknown input, a wrong rank or size, or a value the dtype
    does not hold)."""
    if not isinstance(values, Mapping):
        raise ModelError(f"load: values must be a mapping of input name to array, got {type(values).__name__}")
    by_name = {name: (dtype, shape) for name, dtype, shape in specs}
    out: dict[str, np.ndarray] = {}
    for name, value in values.items():
        if name not in by_name:
            raise ModelError(f"{where}: values names {name!r}, which is not an input of the model (its inputs: "
                             f"{', '.join(repr(n) for n in by_name) or 'none'})")
        dtype, shape = by_name[name]
        arr = np.asarray(value)
        cast = arr.astype(dtype)
        if arr.dtype.kind not in "biuf" or not np.array_equal(cast, arr):
            raise ModelError(f"{where}: values[{name!r}] ({arr.dtype}) is not exactly representable as {dtype}, the "
                             "input's dtype")
        if arr.ndim != len(shape):
            raise ModelError(f"{where}: values[{name!r}] has rank {arr.ndim}; input {name!r} has rank {len(shape)}")
        for axis, (want, got) in enumerate(zip(shape, arr.shape)):
            key = want if isinstance(want, str) else f"{name}:{axis}"
            have = want if isinstance(want, int) else dims.get(key)
            if have is not None and have != got:
                raise ModelError(f"{where}: values[{name!r}] is {got} long on axis {axis}, where the model (or "
                                 f"dims) fixes {have}")
            if isinstance(want, str):
                dims[key] = int(got)
        out[name] = frozen(cast)
    return out


class Model:
    """A checked model ready to convert, for one set of dim bindings or several (``_dynamic``)."""

    def __init__(self, gp: GraphProto, where: str, base_dir: Path | None, opset: int,
                 specs: list[tuple[str, str, list[int | str]]], max_bytes: int, name: str,
                 values: Mapping[str, np.ndarray] | None = None, params: Mapping[str, np.ndarray] | None = None
                 ) -> None:
        self.gp, self.where, self.base_dir, self.opset = gp, where, base_dir, opset
        self.specs, self.max_bytes, self.name = specs, max_bytes, name
        self.values = dict(values or {})  # inputs bound to constants at load (load's values=)
        # Initializers read already (a staged model's parts share one read of the weights):
        # each conversion takes these arrays, as it takes ``convert``'s ``preloaded``.
        self.params = dict(params or {})

    def with_graph(self, gp: GraphProto) -> Model:
        """This model with ``gp`` for its graph (the same inputs, limits, bound values and
        weights read)."""
        return Model(gp, self.where, self.base_dir, self.opset, self.specs, self.max_bytes, self.name, self.values,
                     self.params)

    def convert(self, dims: Mapping[str, int], preloaded: Mapping[str, np.ndarray] | None = None,
                values: Mapping[str, np.ndarray] | None = None) -> Graph:
        """The static graph with every symbolic dim bound by ``dims``; initializers named in
        ``preloaded`` take that array (same shape and dtype) instead of being read again;
        inputs named in ``values`` (or in the model's own ``values``) are those constants,
        not inputs of the graph."""
        gp, where, preloaded = self.gp, self.where, {**self.params, **(preloaded or {})}
        values = {**self.values, **(values or {})}
        initializers = {t.name: t for t in gp.initializer}
        sources = set(initializers) | {v.name for v in gp.input}
        order = _toposort(gp, sources, where)

        live = _live(gp, order)
        used_names = {name for i in live for name in node_reads(gp.node[i])} | {o.name for o in gp.output}
        reader = _TensorReader(where, self.base_dir, self.max_bytes)
        for init_name, t in initializers.items():
            if init_name in used_names and init_name not in preloaded:
                reader.check(t, f"{where}: initializer {init_name!r}")
        inputs = _bind_dims(self.specs, dims, where, self.max_bytes)

        g = Graph(self.name)
        f = Emitter(g, self.max_bytes)
        env: dict[str, Operand] = {}
        for in_name, shape, dtype in inputs:
            if in_name in values:
                value = values[in_name]
                if value.shape != shape or value.dtype != dtype:
                    raise ModelError(f"{where}: input {in_name!r} is {dtype}{list(shape)}, its value "
                                     f"{value.dtype}{list(value.shape)}")
                env[in_name] = frozen(value)
            else:
                env[in_name] = g.input(in_name, shape, dtype)
        for init_name, t in initializers.items():
            if init_name in used_names:
                arr = preloaded.get(init_name)
                env[init_name] = f.param(init_name, reader.read(t, f"{where}: initializer {init_name!r}")
                                         if arr is None else arr)

        hosted: list[NeedsHost] = []  # nodes the host runs: the conversion goes on past them, to find them all
        unmade: set[str] = set()
        for index in (i for i in order if i in live):
            node = gp.node[index]
            if hosted and unmade.intersection(node_reads(node)):
                unmade.update(out for out in node.output if out)
                continue
            try:
                _convert_node(node, index, env, f, self.opset, used_names, reader, where)
            except NeedsHost as exc:
                hosted.append(exc)
                unmade.update(out for out in node.output if out)
            except ModelError:
                if hosted:
                    break
                raise
        if hosted:
            raise NeedsHost(str(hosted[0]), hosted[0].tensor, [h.tensor for h in hosted])

        g.set_outputs(_named_outputs(g, f, env, [o.name for o in gp.output], where))
        return g


def _convert_node(node: NodeProto, index: int, env: dict[str, Operand], f: Emitter, opset: int,
                  used_names: set[str], reader: _TensorReader, where: str) -> None:
    operands = [env[name] if name else None for name in node.input]
    used = [bool(out) and out in used_names for out in node.output]

    def subgraph(graph: GraphProto, inputs: Sequence[Operand], what: str) -> list[Operand]:
        held = f"{where}: {what} of {describe_node(node, index)}"
        return _convert_subgraph(graph, inputs, env, f, opset, reader, held)

    ctx = NodeContext(node, index, operands, f, opset, used, reader.read, subgraph)
    try:
        results = CONVERTERS[node.op_type](ctx)
    except ModelError as exc:
        text = str(exc)
        text = text if text.startswith(where) else f"{where}: {ctx.describe()}: {text}"
        if isinstance(exc, (NeedsValue, NeedsHost)):
            raise type(exc)(text, exc.tensor) from None
        if isinstance(exc, SpliceIf):
            raise SpliceIf(text, exc.tensor, exc.taken) from None
        raise ModelError(text) from None
    except (RlxError, ValueError, IndexError, ArithmeticError) as exc:
        raise ModelError(f"{where}: {ctx.describe()}: {exc}") from None
    for i, out in enumerate(node.output):
        if not out:
            continue
        result = results[i] if i < len(results) else None
        if result is None:
            if used[i]:
                raise ModelError(f"{where}: {ctx.describe()}: output {i} ({out!r}) is not supported by rlx, but "
                                 "the model uses it")
            continue
        env[out] = result


def _convert_subgraph(graph: GraphProto, inputs: Sequence[Operand], env: Mapping[str, Operand], f: Emitter,
                      opset: int, reader: _TensorReader, where: str) -> list[Operand]:
    """Convert ``graph`` (a subgraph: a branch, a loop body) inline, its inputs bound to
    ``inputs`` in order, the values of the enclosing graphs read from ``env``; its
    outputs. Its initializers are constants; its nodes go through the same converters and
    checks as a graph's (``where`` names the node that holds it in messages)."""
    if len(inputs) != len(graph.input):
        raise ModelError(f"{where}: takes {len(graph.input)} inputs, {len(inputs)} given")
    _check_supported(graph.node, where)
    check_versions(graph.node, opset, where)
    scope: dict[str, Operand] = dict(env)
    scope.update({i.name: v for i, v in zip(graph.input, inputs)})
    for t in graph.initializer:
        scope[t.name] = frozen(reader.read(t, f"{where}: initializer {t.name!r}"))
    used = {name for node in graph.node for name in node_reads(node)} | {o.name for o in graph.output}
    for index in _toposort(graph, set(scope), where):
        _convert_node(graph.node[index], index, scope, f, opset, used, reader, where)
    missing = [o.name for o in graph.output if o.name not in scope]
    if missing:
        raise ModelError(f"{where}: output(s) {missing} are not defined")
    return [scope[o.name] for o in graph.output]


def _named_outputs(g: Graph, f: Emitter, env: Mapping[str, Operand], names: Sequence[str], where: str) -> list[Value]:
    """The graph outputs as values whose node carries the ONNX output name.

    A value produced under another name (an input, a param, an Identity's operand, a
    value listed twice) is wrapped in a same-shape reshape that carries the name.
    """
    outs: list[Value] = []
    taken: set[int] = set()
    for out_name in names:
        operand = env[out_name]
        value = f.value(operand, name=out_name)
        node = g.node(value)
        if node.name != out_name or node.id in taken or node.op in ("input", "param"):
            value = g.reshape(value, value.shape, name=out_name)
        taken.add(value.id)
        outs.append(value)
    return outs
