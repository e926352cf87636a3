"""The graph: its state, what backends read, and the edit API the passes use.

Shapes and dtypes are inferred (and checked) when a node is added, so a mistake raises
``GraphError`` at the line that made it. ``graph.nodes`` is topologically ordered by
construction; backends walk it once at compile time. Passes build new graphs through
the same door as users (``add_node``, the builders), and say which user node each new
node stands for with ``origin``; nothing outside ``rlx_core.ir`` touches the private state.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import math
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Union

import numpy as np

from ..errors import GraphError, ModelError
from .builders import OpBuilders
from .dtypes import normalize_dtype
from .internal_types import infer_any
from .ops import OpKind
from .serialize import GRAPH_FORMAT, GRAPH_FORMAT_VERSION, graph_from_json
from .shape_rules import Constraint, holds_sym, parse_dim, recording
from .sized import is_sized, sized_attrs, sized_to_json
from .symbolic import Dim, Sym, format_shape, free_symbols, to_obj

__all__ = ["Graph", "Node", "Value", "GRAPH_FORMAT", "GRAPH_FORMAT_VERSION"]

_graph_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Node:
    """One SSA value: ``op`` applied to earlier nodes ``inputs`` with ``attrs``.

    ``origin`` is the id of the user's node a legalized node was decomposed from (its
    own id for nodes the user built), so that errors and reports can point back to it.
    """

    id: int
    op: OpKind
    inputs: tuple[int, ...]
    attrs: Mapping[str, Any]
    shape: tuple[Dim, ...]  # ints, or ``Sym`` where the graph is symbolic
    dtype: str
    name: str = ""
    origin: int | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def describe(self) -> str:
        """``node 7 'probs'`` or ``node 7``: how messages refer to a node."""
        return f"node {self.id} {self.name!r}" if self.name else f"node {self.id}"


@dataclass(frozen=True, eq=False)
class Value:
    """The handle a builder method returns: a node's id, shape and dtype."""

    graph: Graph = field(repr=False)
    id: int
    shape: tuple[Dim, ...]
    dtype: str
    name: str = ""

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __index__(self) -> int:
        return self.id


ValueLike = Union[Value, int, np.ndarray, float, bool, np.generic]


def _immutable(value: np.ndarray) -> bool:
    """Whether ``value`` is read-only and so is its memory: an owning array made read-only
    (ours), or read-only views down to an immutable ``bytes`` object (an ONNX tensor's raw
    data, which the loader hands over without copying it)."""
    if value.flags.writeable:
        return False
    base = value.base
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    return base is None or isinstance(base, bytes)


def _frozen_array(value: Any, dtype: str | None, what: str) -> np.ndarray:
    if isinstance(value, np.ndarray) and _immutable(value) and value.dtype.isnative:
        if dtype is None or value.dtype == dtype:  # already ours (or immutable): share, don't copy
            normalize_dtype(value.dtype, what=what)
            return value
    try:
        arr = np.array(value, dtype=dtype, copy=True)
    except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: g.add(uint8_x, -1)
        raise GraphError(f"{what}: cannot make an array of {type(value).__name__}: {exc}") from None
    normalize_dtype(arr.dtype, what=what)
    arr.flags.writeable = False
    return arr


def _static(shape: tuple[Dim, ...]) -> bool:
    return not any(isinstance(d, Sym) for d in shape)


def _attr_symbols(attrs: Mapping[str, Any]) -> frozenset[str]:
    """The symbols in a node's attrs (a reshape's target, a slice's bounds: ``holds_sym``)."""
    return frozenset().union(*(free_symbols(v) for v in attrs.values() if holds_sym(v)))


def _input_dim(raw: Any) -> Dim:
    """An input's dim: an int-like (bools refused), or a symbol name or ``Sym``."""
    if isinstance(raw, str) and not raw.isidentifier():
        raise ValueError(raw)
    dim = None if isinstance(raw, bool) else parse_dim(raw)
    return int(raw) if dim is None else dim  # int() of a float raises, or is checked by the caller


class Graph(OpBuilders):
    """A computation graph under construction (then frozen once compiled).

    Build it with the op methods (``g.matmul(x, w)``), each returning a ``Value``; every
    method also accepts node ids, numpy arrays (added as constants) and Python scalars
    (added as constants of the other operand's dtype, like JAX's weak types).
    """

    def __init__(self, name: str = "graph") -> None:
        self.name = str(name)
        self._nodes: list[Node] = []
        self._values: dict[int, np.ndarray] = {}
        self._inputs: list[int] = []
        self._params: list[int] = []
        self._outputs: tuple[int, ...] = ()
        self._names: dict[str, int] = {}
        self._frozen = False
        self._origin: int | None = None  # set by legalization while it emits a decomposition
        self._uid = next(_graph_ids)
        self._constraints: list[Constraint] = []  # what symbolic shape inference could not decide
        self._by_node: tuple[int, dict[int | None, list[Constraint]]] | None = None  # (_node_constraints)
        self._node_symbols: dict[str, int] = {}  # symbols first met in a computational node (not an input)
        self._has_sym = False  # any node's shape holds a Sym: kept as nodes are added (is_symbolic)
        # The session each runtime keeps for this graph (runtime.Runtime.session): held here,
        # not by the runtime, so that it dies with the graph (a session holds its graph).
        self._sessions: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    # ----------------------------------------------------------------- reading
    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    @property
    def inputs(self) -> tuple[int, ...]:
        return tuple(self._inputs)

    @property
    def params(self) -> tuple[int, ...]:
        return tuple(self._params)

    @property
    def outputs(self) -> tuple[int, ...]:
        return self._outputs

    @property
    def frozen(self) -> bool:
        return self._frozen

    @property
    def is_symbolic(self) -> bool:
        """Whether any node's shape holds a symbolic dim (a ``Sym``)."""
        return self._has_sym

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbol names the inputs' shapes use, sorted."""
        return tuple(sorted(free_symbols(tuple(d for i in self._inputs for d in self._nodes[i].shape))))

    @property
    def constraints(self) -> tuple[Constraint, ...]:
        """What shape inference required of the symbols (``n == batch``, ``h >= 3``), each with
        the op and node that required it; ``bind`` checks them."""
        return tuple(self._constraints)

    def input_shapes(self, inputs: Any) -> dict[str, tuple[int, ...]]:
        """The shape of each input in ``inputs`` (a mapping of input name to array), for
        ``bind``; ``InputError`` naming the inputs missing or unknown, or one whose shape
        cannot be read."""
        from .specialize import input_shapes

        return input_shapes(self, inputs)

    def bind(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
        """The value of every symbol, from the inputs' concrete shapes (input name -> shape).
        ``InputError`` names the input, dim, symbol and conflicting sizes, a wrong rank, a
        constraint that does not hold (and which op and node recorded it) or an unbound symbol."""
        from .specialize import bind_shapes

        return bind_shapes(self, shapes)

    def specialize(self, bindings: Mapping[str, int]) -> Graph:
        """A new static, unfrozen graph: the same node ids, ops, names, inputs, outputs and
        params (arrays shared, not copied), every dim and shape-valued attribute evaluated
        under ``bindings`` and every node re-inferred, so it is exactly the graph the builder
        makes with those sizes. ``GraphError`` for a missing binding or a broken constraint."""
        from .specialize import specialize_graph

        return specialize_graph(self, bindings)

    def node(self, id: int | Value) -> Node:
        i = int(id.id if isinstance(id, Value) else id)
        if not 0 <= i < len(self._nodes):
            raise GraphError(f"graph {self.name!r} has no node {i} (it has {len(self._nodes)})")
        return self._nodes[i]

    def value(self, id: int | Value) -> np.ndarray:
        """The current array of a param or constant node (read-only)."""
        node = self.node(id)
        if node.id not in self._values:
            if node.op is OpKind.CONSTANT:  # a sized constant (``sized.py``)
                raise GraphError(f"{node.describe()} is computed from the sizes ({node.attrs['sized']}, shape "
                                 f"{format_shape(node.shape)}): it has a value once the graph is specialized")
            raise GraphError(f"{node.describe()} is a {node.op}, which holds no value")
        return self._values[node.id]

    def input_node(self, name: str) -> Node:
        """The ``input`` or ``param`` node called ``name``."""
        if name not in self._names:
            known = ", ".join(repr(n) for n in self._names) or "none"
            raise GraphError(f"graph {self.name!r} has no input or param {name!r}; it has {known}")
        return self._nodes[self._names[name]]

    def freeze(self) -> Graph:
        """Forbid further building; compiling freezes a graph so its executables stay valid."""
        self._frozen = True
        return self

    def __len__(self) -> int:
        return len(self._nodes)

    # ----------------------------------------------------------------- editing (passes)
    @contextmanager
    def origin(self, node_id: int | None) -> Iterator[None]:
        """Nodes added inside record ``node_id`` (a user's node) as their ``origin``: a
        decomposition's or rewrite's nodes point back to the node they stand for, which
        errors and reports name. ``None`` makes them their own origin. Nests."""
        before = self._origin
        self._origin = node_id
        try:
            yield
        finally:
            self._origin = before

    def copy(self, name: str | None = None) -> Graph:
        """An unfrozen graph with the same nodes, ids, names, inputs, params, outputs and
        symbolic constraints; arrays are shared (read-only), so a copy costs no weights.
        ``replace_value`` on the copy leaves this graph's arrays alone."""
        new = Graph(self.name if name is None else name)
        new._take_contents(self)
        return new

    def _recount_symbols(self) -> None:
        """``is_symbolic`` again from every node (for a subclass that replaced nodes)."""
        self._has_sym = not all(_static(n.shape) for n in self._nodes)

    def _take_contents(self, other: Graph) -> None:
        self._nodes = list(other._nodes)
        self._values = dict(other._values)
        self._inputs, self._params, self._outputs = list(other._inputs), list(other._params), other._outputs
        self._names = dict(other._names)
        self._constraints = list(other._constraints)  # a symbolic graph's checks travel with it
        self._by_node = None
        self._node_symbols = dict(other._node_symbols)
        self._has_sym = other._has_sym

    def replace_value(self, id: int | Value, value: np.ndarray) -> np.ndarray:
        """Put ``value`` (same shape and dtype, read-only) in place of a param's array and
        return the array it replaces. For a compiled graph's own copy when ``set_param``
        swaps its weights, frozen or not; user graphs keep their arrays."""
        node = self.node(id)
        if node.op is not OpKind.PARAM:
            raise GraphError(f"replace_value: {node.describe()} is a {node.op}, not a param")
        arr = np.asarray(value)
        if arr.shape != node.shape or arr.dtype.name != node.dtype:
            raise GraphError(f"replace_value: {node.describe()} is {node.dtype}{format_shape(node.shape)}, "
                             f"got {arr.dtype.name}{format_shape(arr.shape)}")
        old = self._values[node.id]
        self._values[node.id] = arr
        return old

    @property
    def attachments(self) -> weakref.WeakKeyDictionary[Any, Any]:
        """State other objects keep for this graph, keyed (weakly) by themselves: it dies
        with the graph and never keeps its owner alive (a runtime's session per graph)."""
        return self._sessions

    @property
    def symbol_origins(self) -> Mapping[str, int]:
        """Each symbol first met in a computational node rather than an input's shape
        (a ``Reshape`` to a named size), with that node's id: ``bind`` must see it bound."""
        return MappingProxyType(self._node_symbols)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self._nodes)} nodes, {len(self._outputs)} outputs)"

    # ----------------------------------------------------------------- building core
    def _check_open(self, what: str) -> None:
        if self._frozen:
            raise GraphError(f"{what}: graph {self.name!r} is frozen (it was compiled); build a new graph")

    def _ref(self, v: ValueLike, what: str, like: str | None = None) -> Node:
        if isinstance(v, Value):
            if v.graph is not self:
                raise GraphError(f"{what}: value {v.id} belongs to graph {v.graph.name!r}, not {self.name!r}")
            return self._nodes[v.id]
        if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and like is None:
            return self.node(int(v))
        if isinstance(v, (bool, int, float, np.generic, np.ndarray, list, tuple)):
            if isinstance(v, (bool, int, float)) and like is not None:
                return self._nodes[self.constant(v, dtype=like).id]
            return self._nodes[self.constant(v).id]
        raise GraphError(f"{what}: expected a Value, node id, array or scalar, got {type(v).__name__}")

    def _refs(self, op: OpKind, values: Sequence[ValueLike]) -> list[Node]:
        """Resolve operands; Python scalars take the dtype of the first non-scalar one."""
        like = None
        for v in values:  # the first non-bool operand decides (where(cond, 0.0, x) takes x's)
            if isinstance(v, (Value, np.ndarray)):
                dtype = v.dtype if isinstance(v, Value) else normalize_dtype(v.dtype, what=str(op))
                if like is None or like == "bool":
                    like = dtype
                if dtype != "bool":
                    break
        out = []
        for v in values:
            scalar = isinstance(v, (bool, int, float)) and not isinstance(v, Value)
            out.append(self._ref(v, str(op), like if scalar and like is not None else None))
        return out

    def add_node(self, op: OpKind | str, inputs: Sequence[int | Value], attrs: Mapping[str, Any],
                 name: str = "") -> Value:
        """Add a node of any computational op (internal ones included: ``gemm``,
        ``fused_elementwise``, ``fused_conv``) on existing nodes, after checking it: the
        single door into the graph, which the builder methods go through too. Passes
        use it to emit a node they copy or rewrite."""
        try:
            op = OpKind(op)
        except ValueError:
            raise GraphError(f"unknown op {op!r}") from None
        self._check_open(str(op))
        ins = [self.node(i) for i in inputs]
        with recording() as found:
            norm, shape, dtype = infer_any(op, ins, attrs)
        if name:
            norm_name = str(name)
        else:
            norm_name = ""
        nid = len(self._nodes)
        node = Node(nid, op, tuple(n.id for n in ins), MappingProxyType(norm), tuple(shape), dtype, norm_name,
                    self._origin if self._origin is not None else nid)
        self._nodes.append(node)
        if found:
            self._constraints.extend(dataclasses.replace(c, node=nid) for c in found)
        self._note_symbols(node)
        return Value(self, nid, node.shape, dtype, norm_name)

    def _note_symbols(self, node: Node) -> None:
        """Mark the graph symbolic where ``node``'s shape is, and record the first node to
        name each symbol (a reshape's target may name one its input has not)."""
        static = _static(node.shape)
        if not static:
            self._has_sym = True
        if node.op is OpKind.RESHAPE or not static:
            for sym in free_symbols(node.shape) | _attr_symbols(node.attrs):
                self._node_symbols.setdefault(sym, node.id)

    def _add(self, op: OpKind, values: Sequence[ValueLike], name: str = "", **attrs: Any) -> Value:
        self._check_open(str(op))
        nodes = self._refs(op, values)
        try:
            return self.add_node(op, [n.id for n in nodes], attrs, name)
        except GraphError as exc:
            if name:
                raise GraphError(f"{exc} (building {name!r})") from None
            raise

    def copy_node(self, src: Graph, node: Node, inputs: Sequence[int], *, keep_origin: bool = False) -> Value:
        """Add ``src``'s computational ``node`` on this graph's ``inputs`` (its inputs,
        mapped): same op, attrs, name. When every mapped input has exactly the shape and
        dtype the original's had (symbolic dims compare as canonical expressions), the
        node's own shape, dtype and normalized attrs are kept as they are, and so are the
        constraints its rule recorded (the type rule is a pure function of those: a pass
        copying a graph pays a comparison per node, not the rule again); otherwise it goes
        through ``add_node``. ``keep_origin`` gives the new
        node ``node.origin`` (a pass's copy), else the one ``origin()`` says."""
        if self._frozen:
            self._check_open(str(node.op))
        mine, theirs, ids = self._nodes, src._nodes, tuple(int(i) for i in inputs)
        same = len(ids) == len(node.inputs)
        if same:
            n = len(mine)
            for i, j in zip(ids, node.inputs):
                a, b = mine[i] if 0 <= i < n else None, theirs[j]
                if a is None or a.shape != b.shape or a.dtype != b.dtype:
                    same = False
                    break
        origin = node.origin if keep_origin else self._origin
        if not same:
            with self.origin(origin):
                return self.add_node(node.op, ids, node.attrs, node.name)
        nid = len(self._nodes)
        new = Node(nid, node.op, ids, node.attrs, node.shape, node.dtype, node.name,
                   origin if origin is not None else nid)
        self._nodes.append(new)
        if src._has_sym:  # equal symbolic shapes are equal expressions: the rule's answer, and its checks, carry
            self._constraints.extend(dataclasses.replace(c, node=nid) for c in src._node_constraints(node.id))
            self._note_symbols(new)
        return Value(self, nid, new.shape, new.dtype, new.name)

    def _node_constraints(self, node_id: int) -> list[Constraint]:
        """The constraints node ``node_id``'s type rule recorded (indexed once per count)."""
        index = self._by_node
        if index is None or index[0] != len(self._constraints):
            by: dict[int | None, list[Constraint]] = {}
            for c in self._constraints:
                by.setdefault(c.node, []).append(c)
            index = self._by_node = (len(self._constraints), by)
        return index[1].get(node_id, [])

    _add_node = add_node  # the door's name before it was public (code written against it keeps working)

    def _append_typed(self, node: Node, shape: tuple[int, ...]) -> None:
        """Append a static copy of a symbolic graph's ``node`` (same id, inputs, attrs)
        with ``shape``, its dims evaluated: ``specialize``'s door for ops whose type rule
        reads no size into their attrs (``specialize._TYPED_ONCE``)."""
        nid = len(self._nodes)
        self._nodes.append(Node(nid, node.op, node.inputs, node.attrs, shape, node.dtype, node.name,
                                self._origin if self._origin is not None else nid))

    def _add_source(self, op: OpKind, name: str, shape: tuple[int, ...], dtype: str,
                    value: np.ndarray | None, attrs: Mapping[str, Any] | None = None) -> Value:
        nid = len(self._nodes)
        node = Node(nid, op, (), MappingProxyType(dict(attrs or {})), shape, dtype, name,
                    self._origin if self._origin is not None else nid)
        self._nodes.append(node)
        if not _static(shape):
            self._has_sym = True
        if attrs:  # a sized constant: its symbols must be bound by the inputs, as a reshape's are
            self._has_sym = True
            for sym in free_symbols((*shape, *attrs.get("values", ()), attrs.get("start", 0))):
                self._node_symbols.setdefault(sym, nid)
        if value is not None:
            self._values[nid] = value
        if op is OpKind.INPUT:
            self._inputs.append(nid)
        elif op is OpKind.PARAM:
            self._params.append(nid)
        if op is not OpKind.CONSTANT:
            self._names[name] = nid
        return Value(self, nid, shape, dtype, name)

    def _check_name(self, what: str, name: Any) -> str:
        if not isinstance(name, str) or not name:
            raise GraphError(f"{what}: name must be a non-empty string, got {name!r}")
        if name in self._names:
            raise GraphError(f"{what}: name {name!r} is already used by {self._nodes[self._names[name]].describe()}")
        return name

    # ----------------------------------------------------------------- sources
    def input(self, name: str, shape: Iterable[int | str | Sym], dtype: Any = "float32") -> Value:
        """A run-time input, fed by ``run({name: array})``. A dim is an int, or a symbol
        (a name such as ``"batch"``, or a ``Sym``) whose size comes with each run."""
        self._check_open("input")
        name = self._check_name("input", name)
        try:
            if isinstance(shape, (str, Sym)):
                raise TypeError
            raws = tuple(shape)
            dims = tuple(_input_dim(d) for d in raws)
            bad = [d for d, raw in zip(dims, raws)
                   if not isinstance(d, Sym) and (d < 0 or isinstance(raw, bool) or int(raw) != raw)]
        except (TypeError, ValueError):
            raise GraphError(f"input {name!r}: shape must be a sequence of ints, got {shape!r}") from None
        if bad:
            raise GraphError(f"input {name!r}: shape must hold ints >= 0, got {tuple(shape)!r}")
        return self._add_source(OpKind.INPUT, name, dims, normalize_dtype(dtype, what=f"input {name!r}"), None)

    def param(self, name: str, value: Any, dtype: Any = None) -> Value:
        """A named weight: baked into compiled code but replaceable with ``set_param``."""
        self._check_open("param")
        name = self._check_name("param", name)
        arr = _frozen_array(value, None if dtype is None else normalize_dtype(dtype), f"param {name!r}")
        return self._add_source(OpKind.PARAM, name, arr.shape, normalize_dtype(arr.dtype), arr)

    def constant(self, value: Any, dtype: Any = None, name: str = "") -> Value:
        """A fixed array. Python floats default to float32 and ints to int64."""
        self._check_open("constant")
        if dtype is None and isinstance(value, float):
            dtype = "float32"
        arr = _frozen_array(value, None if dtype is None else normalize_dtype(dtype), "constant")
        return self._add_source(OpKind.CONSTANT, str(name), arr.shape, normalize_dtype(arr.dtype), arr)

    def copy_source(self, src: Graph, node: Node) -> Value:
        """``src``'s source ``node`` (an input, a param, a constant or a sized constant) added
        here as it is: what a pass copying a graph does with each source."""
        if node.op is OpKind.INPUT:
            return self.input(node.name, node.shape, node.dtype)
        if node.op is OpKind.PARAM:
            return self.param(node.name, src.value(node.id))
        if is_sized(node.attrs):
            self._check_open("sized_constant")
            return self._add_source(OpKind.CONSTANT, node.name, node.shape, node.dtype, None, node.attrs)
        return self.constant(src.value(node.id), name=node.name)

    def sized_constant(self, kind: str, shape: Iterable[Dim], dtype: Any, name: str = "", **params: Any) -> Value:
        """A constant computed from the sizes (``rlx_core.ir.sized``): ``fill`` (``value=``),
        ``arange`` (``start=``, ``delta=``) or ``dims`` (``values=``), its ``shape`` symbolic
        where it depends on the symbols. Specializing the graph makes it a plain constant."""
        self._check_open("sized_constant")
        attrs, shape = sized_attrs(kind, tuple(shape), dtype, params)
        return self._add_source(OpKind.CONSTANT, str(name), shape, normalize_dtype(dtype), None, attrs)

    def set_outputs(self, outputs: Sequence[ValueLike] | ValueLike) -> None:
        """Declare the graph's outputs, in order (replaces any earlier declaration)."""
        self._check_open("set_outputs")
        if isinstance(outputs, (Value, int)):
            outputs = [outputs]
        nodes = [self._ref(v, "set_outputs") for v in outputs]
        if not nodes:
            raise GraphError("set_outputs: a graph needs at least one output")
        self._outputs = tuple(n.id for n in nodes)

    # ----------------------------------------------------------------- describing
    def summary(self) -> str:
        """A human-readable listing: one line per node with op, inputs, shape and dtype."""
        lines = [f"Graph {self.name!r}: {len(self._nodes)} nodes, inputs {len(self._inputs)}, "
                 f"params {len(self._params)}, outputs {list(self._outputs)}"]
        outs = set(self._outputs)
        for n in self._nodes:
            args = ", ".join(f"%{i}" for i in n.inputs)
            attrs = ", ".join(f"{k}={v}" for k, v in n.attrs.items())
            label = f" {n.name!r}" if n.name else ""
            mark = "  -> output" if n.id in outs else ""
            lines.append(
                f"  %{n.id:<3} = {n.op}({args}{', ' if args and attrs else ''}{attrs}){label} "
                f": {n.dtype}{format_shape(n.shape)}{mark}"
            )
        return "\n".join(lines)

    def use_counts(self) -> list[int]:
        """How many times each node's value is read: one per consuming edge (an input read
        twice by one node counts twice), one per output slot. The passes' rewrites and a
        backend's buffer liveness both ask it."""
        uses = [0] * len(self._nodes)
        for node in self._nodes:
            for i in node.inputs:
                uses[i] += 1
        for i in self._outputs:
            uses[i] += 1
        return uses

    def live_nodes(self) -> set[int]:
        """Ids of the nodes the outputs depend on (the outputs included): what a backend
        must compute; the rest is dead code. One reverse sweep, nodes being in topological order."""
        live = set(self._outputs)
        for node in reversed(self._nodes):
            if node.id in live:
                live.update(node.inputs)
        return live

    def output_names(self) -> list[str]:
        """Each output's node name, or ``output_<i>`` when it has none; made unique
        (``y``, ``y_1``, ...) so that they can key a dict, an ``.npz`` or a table."""
        seen: dict[str, int] = {}
        names = []
        for i, nid in enumerate(self._outputs):
            name = self._nodes[nid].name or f"output_{i}"
            seen[name] = seen.get(name, 0) + 1
            names.append(name if seen[name] == 1 else f"{name}_{seen[name] - 1}")
        return names

    # ----------------------------------------------------------------- JSON
    def to_json(self) -> str:
        """Serialize to JSON (arrays base64-encoded, little-endian). Never pickle."""
        nodes = []
        for n in self._nodes:
            d: dict[str, Any] = {"id": n.id, "op": n.op.value, "inputs": list(n.inputs), "name": n.name}
            if n.op is OpKind.INPUT:
                d["shape"], d["dtype"] = [to_obj(x) if isinstance(x, Sym) else x for x in n.shape], n.dtype
            elif n.op is OpKind.CONSTANT and is_sized(n.attrs):
                d["sized"], d["dtype"] = sized_to_json(n.attrs, n.shape), n.dtype
            elif n.id in self._values:
                arr = np.asarray(self._values[n.id], order="C").astype(np.dtype(n.dtype).newbyteorder("<"))
                d["value"] = {"dtype": n.dtype, "shape": list(arr.shape),
                              "data": base64.b64encode(arr.tobytes()).decode("ascii")}
            else:
                d["attrs"] = {k: [to_obj(x) if isinstance(x, Sym) else x for x in v] if isinstance(v, tuple) else v
                              for k, v in n.attrs.items()}
            nodes.append(d)
        doc = {"format": GRAPH_FORMAT, "version": GRAPH_FORMAT_VERSION, "name": self.name,
               "nodes": nodes, "outputs": list(self._outputs)}
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        """Rebuild a graph from ``to_json`` output, checking it like a graph built by hand."""
        return graph_from_json(cls, text)

    def save(self, path: Any) -> None:
        from ..cache import atomic_write_text

        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: Any) -> Graph:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise ModelError(f"cannot read graph file {str(path)!r}: {exc.strerror or exc}") from None
        try:
            return cls.from_json(data)
        except ModelError as exc:
            raise ModelError(f"{path}: {exc}") from None
