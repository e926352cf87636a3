"""The executable's residents: its weights, folded constants and arrays derived from them.

Why a module of its own: residents are the state an executable keeps across runs and
shares between its plans, and the only state ``set_param`` changes. ``Residents`` is a
mixin of ``executor.CpuExecutable``:

- ``_fold`` makes the resident arrays at compile time: params (borrowed from the graph,
  or owned: ``params.py``), constants, and every node computed from those alone;
- ``_derived`` keeps arrays that kernels derive from residents (packed or reordered
  weights, a bias column), made once per executable, or once per shape family where the
  copies share their params (``_FAMILY_KEYS``), and shared by every plan;
- ``set_param`` copies a new value into its param's array, then recomputes the folded
  nodes and refills the derived arrays that read it, in place: the plans' steps hold
  their addresses. A param whose values some step holds as numbers (``_constant``) drops
  the plans bound before (a new generation: ``binding._Plan``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.errors import InputError
from rlx_core.ir import Graph, Node
from rlx_core.ir.ops import OpKind
from rlx_core.plugin import ShapeFamily

from .binding import _BUILDERS, RESIDENT, _build_steps, _Plan
from .params import SHARED_ROOTS, borrowed, owned_rebuild, param_array
from .steps import aligned_empty, bind, owner
from .threads import ThreadTuner


class _Owned:
    """The ``BuildContext`` of folded nodes: private temporaries, kept for recomputation."""

    def scratch(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return aligned_empty(shape, dtype)

    def derived(self, source: Any, key: Any, make: Callable[..., np.ndarray], also: Sequence[Any] = ()) -> None:
        return None  # a folded node runs once per set_param: nothing to keep


#: The ``derived`` keys that name all their array depends on besides its sources, at any
#: size of the graph, so that one family's copies may share it. oneDNN's weights carry
#: the layout their primitive chose (``Dnnl.layout``), which may differ between sizes;
#: a key not listed here is made per copy.
_FAMILY_KEYS = frozenset({"onednn_conv_weights", "onednn_matmul_weights", "conv_bias_column", "conv_direct_pack",
                          "rlx_depthwise_lanes_pack", "rlx_conv_gemm_pack", "rlx_gemm_pack_a", "rlx_gemm_pack_b",
                          "sgemm_pack_b", "float32_copy"})


class Residents:
    """The residents of ``executor.CpuExecutable``: folding, derived arrays and
    ``set_param``. A mixin: the analysis it reads is set by ``CpuExecutable.__init__``
    (declared here), and so are the empty tables it fills."""

    _graph: Graph
    _graph_name: str
    _nodes: tuple[Node, ...]
    _outputs: tuple[int, ...]
    _kinds: list[str]  # each value's DYNAMIC, RESIDENT, BUFFER or VIEW (``binding``)
    _precision: str
    _family: ShapeFamily | None
    _params: dict[str, np.ndarray]
    _residents: dict[int, np.ndarray]
    _folds: list[tuple[frozenset[str], list[Callable[[], Any]]]]
    _resident_deps: dict[int, frozenset[str]]
    _derived_arrays: dict[Any, list[Any]]
    _baked: set[str]
    _generation: int
    _pool: list[_Plan]
    _tuner: ThreadTuner | None

    def _fold(self, graph: Graph, owned_params: Mapping[str, np.ndarray] | None) -> None:
        """Make the resident arrays: params (borrowed, or ``owned_params``: ``params.py``),
        constants as they are, and every node of only residents computed once (and again
        by ``set_param``)."""
        deps: dict[int, frozenset[str]] = {}
        owned = _Owned()
        gemv_weights = self._gemv_weights(graph)
        for node in self._nodes:
            if self._kinds[node.id] != RESIDENT:
                continue
            if node.op is OpKind.PARAM:
                arr = param_array(node, graph.value(node.id), owned_params)
                self._params[node.name] = arr
                deps[node.id] = frozenset({node.name})
            elif node.op is OpKind.CONSTANT:
                arr = np.asarray(graph.value(node.id), dtype=node.dtype, order="C")  # keeps 0-d as 0-d
                deps[node.id] = frozenset()
            else:
                ins = [self._residents[i] for i in node.inputs]
                deps[node.id] = frozenset().union(*(deps[i] for i in node.inputs))
                if node.op is OpKind.RESHAPE:
                    arr = ins[0].reshape(node.shape)
                elif node.id in gemv_weights:
                    arr = ins[0].transpose(node.attrs["perm"])  # a view: see _gemv_weights
                else:
                    arr = aligned_empty(node.shape, node.dtype)
                    steps = [bind(s, []) for s in _build_steps(_BUILDERS[node.op], node, ins, arr, owned)]
                    _run_quietly(steps)
                    if deps[node.id]:
                        self._folds.append((deps[node.id], steps))
            self._residents[node.id] = arr
            root = id(owner(arr))
            self._resident_deps[root] = self._resident_deps.get(root, frozenset()) | deps[node.id]

    def _derived(self, source: Any, key: Any, make: Callable[[np.ndarray, np.ndarray | None], np.ndarray],
                 also: Sequence[Any] = ()) -> np.ndarray | None:
        """``BuildContext.derived``: ``make(source, None)`` once per source and key, shared
        by every plan, and refilled in place by ``set_param`` when a param it reads (through
        ``source`` or the arrays in ``also``, which ``make`` reads too) changes."""
        deps: frozenset[str] = frozenset()
        for array in (source, *also):
            if not isinstance(array, np.ndarray):
                return None
            found = self._resident_deps.get(id(owner(array)))
            if found is None:  # a plan buffer: its contents change every run
                return None
            deps |= found
        k = (*((a.__array_interface__["data"][0], a.shape, a.strides) for a in (source, *also)), key)
        entry = self._derived_arrays.get(k)
        if entry is None and self._family is not None and key[0] in _FAMILY_KEYS:
            entry = self._derived_arrays[k] = self._family_derived(k, source, make, also, deps)
        if entry is None:
            entry = self._derived_arrays[k] = [source, make, make(source, None), deps]
            # A derived array may be the source of another (weights with a bias column,
            # then packed for the GEMM): set_param refills them in the order they were made.
            self._resident_deps.setdefault(id(owner(entry[2])), deps)
        return entry[2]

    def _family_derived(self, k: Any, source: np.ndarray, make: Callable[[np.ndarray, np.ndarray | None], np.ndarray],
                        also: Sequence[Any], deps: frozenset[str]) -> list[Any] | None:
        """``_derived``'s entry shared with the other copies of this graph's family, when
        every array it is made from is one they share (``params.param_array``); else ``None``.
        ``set_param`` reaches every copy, and each refills it in place: the same values."""
        family = self._family
        assert family is not None
        with family.lock:
            roots = family.shared.get(SHARED_ROOTS, set())
            if not all(id(owner(a)) in roots for a in (source, *also)):
                return None
            entry = family.shared.get(("rlx_cpu.derived", k))
            if entry is None:
                entry = family.shared[("rlx_cpu.derived", k)] = [source, make, make(source, None), deps]
                roots.add(id(owner(entry[2])))  # (a derived array may be the source of another)
        self._resident_deps.setdefault(id(owner(entry[2])), deps)
        return entry

    def _constant(self, array: Any) -> bool:
        """``BuildContext.constant``: whether a step may hold ``array``'s values as numbers
        (a oneDNN post-op's clamp bound): it is a resident. One a param reaches (the
        dynamo exporter stores ReLU6's bounds as initializers) is recorded, and
        ``set_param`` of that param drops the plans bound with its old values."""
        if not isinstance(array, np.ndarray):
            return False
        deps = self._resident_deps.get(id(owner(array)))
        if deps is None:
            return False
        self._baked |= deps
        return True

    def _gemv_weights(self, graph: Graph) -> set[int]:
        """Resident 2-d transposes read only as the weights of one-row matmuls.

        ONNX's ``Gemm(transB=1)`` stores a dense layer's weights as (N, K) and the graph
        transposes them. Folded into a contiguous (K, N) array, a one-row product
        ``x @ w`` walks the weights column-wise (3x slower for a 1x8192 @ 8192x10 head);
        left as a view of the (N, K) array, BLAS runs it as a row-major gemv. With more
        rows the contiguous copy is as fast or faster, so only these stay views."""
        readers: dict[int, list[Node]] = {}
        for node in self._nodes:
            for i in node.inputs:
                readers.setdefault(i, []).append(node)
        found = set()
        for node in self._nodes:
            if node.op is not OpKind.TRANSPOSE or len(node.shape) != 2 or self._kinds[node.id] != RESIDENT:
                continue
            users = readers.get(node.id, [])
            if users and node.id not in self._outputs and all(
                u.op in (OpKind.MATMUL, OpKind.GEMM) and u.inputs[1] == node.id and u.inputs[0] != node.id
                and math.prod(graph.node(u.inputs[0]).shape[:-1]) == 1 for u in users
            ):
                found.add(node.id)
        return found

    def set_param(self, name: str, value: np.ndarray) -> None:
        """Copy ``value`` into the param's resident array (seen by every plan) and
        recompute the folded values that depend on it."""
        target = self._params.get(name)
        if target is None:
            raise InputError(f"set_param: graph {self._graph_name!r} has no param {name!r}; "
                             f"its params: {sorted(self._params)}")
        value = np.asarray(value)
        if value.dtype != target.dtype:
            raise InputError(f"set_param {name!r}: expected dtype {target.dtype}, got {value.dtype} (no silent casts)")
        if value.shape != target.shape:
            raise InputError(f"set_param {name!r}: expected shape {target.shape}, got {value.shape}")
        if borrowed(target):
            self._own_params()
            target = self._params[name]
        np.copyto(target, value)
        for deps, steps in self._folds:
            if name in deps:
                _run_quietly(steps)
        for source, make, array, deps in self._derived_arrays.values():
            if name in deps:
                make(source, array)  # in place: the plans' steps hold its address
        if name in self._baked:  # steps hold its old values: plans are bound again, as they are needed
            self._generation += 1
            self._pool.clear()

    def _own_params(self) -> None:
        """Own every borrowed param (``params.py``) and build the executable again over the
        owned copies: its folds, derived arrays and plans read them from now on (a plan of
        the borrowed arrays that a run in another thread gives back later is dropped: a
        new generation). The thread tuner's verdict is kept."""
        tuner = self._tuner
        with owned_rebuild(self._params, self._family) as owned:
            self.__init__(self._graph, owned, self._generation + 1, precision=self._precision)  # type: ignore[misc]
        self._tuner = tuner


def _run_quietly(steps: Sequence[Callable[[], Any]]) -> None:
    """Run a fold's steps with numpy's floating-point warnings off: a constant subgraph's
    IEEE results (T5's relative-position buckets take ``log(0)`` and cast the ``-inf``
    before a ``where`` drops it) are what the graph computes, as at run time
    (``steps._ieee``), not RuntimeWarnings for the user at compile."""
    with np.errstate(all="ignore"):
        for step in steps:
            step()
