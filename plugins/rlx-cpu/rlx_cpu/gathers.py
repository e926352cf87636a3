"""Gathers along an axis by constant indices, and the resize they spell, on the native kernels.

ONNX's ``Resize`` is imported one axis at a time as gathers by constant index tables
and a weighted sum (``rlx_core/onnx/_ops_resize.py``): nearest is one ``gather``, linear
two gathers and ``g0 * w0 + g1 * w1`` (a region of ``mul, mul, add`` once fused), cubic
four. Segmentation heads (DeepLabV3, LR-ASPP, FCN) and feature pyramids resize their
maps this way, and numpy's ``take`` along the last axis copies one element at a time
through a generic loop: 1.4 ms for 1M floats, where LR-ASPP's whole run is 9 ms.

* ``gather_step``: a gather whose indices are a resident, validated when the plan is
  bound, in one native pass (rows copied whole where the axis is not the last), split
  over the cores.
* ``find_resize_taps``: a region that is exactly a sum of weighted gathers of one value
  along one axis, by constant indices and constant weights that vary along that axis
  only, and the gathers read by nothing else. ``resize_steps`` then computes the region
  in one pass over the output (``rlx_resize_taps``), and the gathers are never made:
  the gathered copies were written and read back once per tap. The terms are added in
  the region's order; a product and its sum may be one fused multiply-add (within an
  ulp of the region's two roundings).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from rlx_core.ir import Graph, Node
from rlx_core.ir.ops import OpKind

from .ccall import bound_call
from .native import library
from .regions import SPLIT_NS
from .steps import Step, laid_out

__all__ = ["ResizeTaps", "find_resize_taps", "gather_step", "resize_steps"]

GATHER_NS = 0.3  # single-thread ns per element moved, for the threads decision


def _geometry(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])


def _normalized(idx: np.ndarray, n_in: int) -> np.ndarray | None:
    """``idx`` as C-contiguous int64 with negative indices counted from the end, or None
    where one is out of range (numpy's take then raises the run's ``InputError``)."""
    flat = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
    flat = np.where(flat < 0, flat + n_in, flat)
    if flat.size and (flat.min() < 0 or flat.max() >= n_in):
        return None
    return flat


def gather_step(x: Any, idx: Any, axis: int, out: np.ndarray, ctx: Any) -> Step | None:
    """``out = take(x, idx, axis)`` on the native kernels, where ``idx`` is a resident (a
    step may hold its values: ``BuildContext.constant``) and every index is in range;
    None otherwise (the caller keeps numpy's take)."""
    lib = library()
    constant: Callable[[Any], bool] | None = getattr(ctx, "constant", None)
    if (lib is None or constant is None or not isinstance(idx, np.ndarray) or out.size == 0
            or x.dtype != out.dtype or x.dtype.itemsize not in (1, 2, 4, 8) or not laid_out(x) or not laid_out(out)
            or not constant(idx)):
        return None
    outer, n_in, inner = _geometry(x.shape, axis)
    flat = _normalized(idx, n_in)
    if flat is None:
        return None
    threads = int(lib.threads_for(out.size * GATHER_NS, SPLIT_NS))

    def fallback(x: np.ndarray, out: np.ndarray) -> None:
        x.take(flat, axis, out.reshape(*x.shape[:axis], flat.size, *x.shape[axis + 1 :]))

    args = [0, flat.ctypes.data, 0, outer, n_in, flat.size, inner, x.dtype.itemsize, threads]
    return bound_call(lib.gather_axis, args, (x, out), (0, 2), fallback, keep=(flat,))


class ResizeTaps(NamedTuple):
    """A region computing ``sum_t w[:, t] * take(x, index[:, t], axis)``: ``x``'s node id,
    the axis, the (n_out, taps) indices (in range) and float32 weights, in the order the
    region adds the terms, and the gathers it reads (made by nobody once this runs)."""

    x: int
    axis: int
    index: np.ndarray
    weights: np.ndarray
    gathers: tuple[int, ...]


def _terms(program: Sequence[tuple[str, tuple[int, ...], Any]], n_inputs: int) -> list[tuple[int, int | None]] | None:
    """The region's program as a chain of sums of terms ``(gather input, weight input or
    None)``, in the order it adds them; None for any other program."""
    made: list[Any] = []  # per instruction: ("term", (g, w)) or ("sum", [terms])

    def operand(v: int) -> Any:
        return ("input", v) if v < n_inputs else made[v - n_inputs]

    for op, args, attrs in program:
        if attrs or len(args) != 2:
            return None
        a, b = operand(args[0]), operand(args[1])
        if op == "mul" and a[0] == "input" and b[0] == "input":
            made.append(("term", (a[1], b[1])))
        elif op == "add":
            parts = []
            for side in (a, b):
                if side[0] == "input":
                    parts.append([(side[1], None)])
                elif side[0] == "term":
                    parts.append([side[1]])
                else:
                    parts.append(side[1])
            if len(parts[0]) > 1 and len(parts[1]) > 1:
                return None  # a sum of sums: not the importer's chain
            made.append(("sum", parts[0] + parts[1] if len(parts[1]) == 1 else parts[1] + parts[0]))
        else:
            return None
    if not made:
        return None
    last = made[-1]
    terms = [last[1]] if last[0] == "term" else last[1]
    # every instruction feeds the final sum once (a chain: each result read by the next)
    reads = [a for _, args, _ in program for a in args]
    if any(reads.count(n_inputs + k) != 1 for k in range(len(program) - 1)):
        return None
    return terms


def find_resize_taps(graph: Graph, candidate: Callable[[int], bool], reads: Sequence[int]
                     ) -> dict[int, ResizeTaps]:
    """The regions of ``graph`` that are weighted sums of constant-index gathers
    (``ResizeTaps``), by region id. ``candidate(id)`` says whether a value may take part
    (the region and each gather: a plan buffer of its own; they and the gathered value:
    held NCHW); ``reads[i]``: how many nodes read value ``i``, graph outputs counted."""
    found: dict[int, ResizeTaps] = {}
    for node in graph.nodes:
        if node.op is not OpKind.FUSED_ELEMENTWISE or node.dtype != "float32" or not candidate(node.id):
            continue
        taps = _match(graph, node, candidate, reads)
        if taps is not None:
            found[node.id] = taps
    return found


def _match(graph: Graph, region: Node, candidate: Callable[[int], bool], reads: Sequence[int]) -> ResizeTaps | None:
    chain = _terms(region.attrs["program"], len(region.inputs))
    if chain is None:
        return None
    ins = [graph.node(i) for i in region.inputs]
    # a product's gather is either operand
    terms = [(b, a) if b is not None and ins[b].op is OpKind.GATHER else (a, b) for a, b in chain]
    used = [k for term in terms for k in term if k is not None]
    if sorted(used) != list(range(len(ins))):
        return None  # every input a gather or a weight, once
    gathers = [ins[g] for g, _ in terms]
    first = gathers[0]
    axis = first.attrs.get("axis")
    if first.op is not OpKind.GATHER or not isinstance(axis, int) or not candidate(first.inputs[0]):
        return None
    x = first.inputs[0]
    rank = len(region.shape)
    index_cols, weight_cols = [], []
    for (_, w), gather in zip(terms, gathers):
        if (gather.op is not OpKind.GATHER or gather.inputs[0] != x or gather.attrs.get("axis") != axis
                or gather.shape != region.shape or gather.dtype != "float32" or reads[gather.id] != 1
                or not candidate(gather.id)):
            return None
        idx_node = graph.node(gather.inputs[1])
        if idx_node.op is not OpKind.CONSTANT or len(idx_node.shape) != 1:
            return None
        n_in = graph.node(x).shape[axis]
        flat = _normalized(np.asarray(graph.value(idx_node.id)), n_in)
        if flat is None:
            return None
        n_out = flat.size
        weight = np.ones(n_out, np.float32) if w is None else _along_axis(graph, ins[w], axis, rank, n_out)
        if weight is None:
            return None
        index_cols.append(flat)
        weight_cols.append(weight)
    return ResizeTaps(x, axis, np.ascontiguousarray(np.stack(index_cols, axis=1)),
                      np.ascontiguousarray(np.stack(weight_cols, axis=1)), tuple(g.id for g in gathers))


def _along_axis(graph: Graph, node: Node, axis: int, rank: int, n_out: int) -> np.ndarray | None:
    """A constant float32 weight that varies along ``axis`` only, as its ``n_out`` values."""
    if node.op is not OpKind.CONSTANT or node.dtype != "float32" or len(node.shape) > rank:
        return None
    shape = (1,) * (rank - len(node.shape)) + tuple(node.shape)
    if any(d != 1 for k, d in enumerate(shape) if k != axis) or shape[axis] not in (1, n_out):
        return None
    value = np.asarray(graph.value(node.id), np.float32).reshape(-1)
    return np.ascontiguousarray(np.broadcast_to(value, (n_out,)))


def resize_steps(taps: ResizeTaps, x: Any, out: np.ndarray) -> list[Step]:
    """The steps computing ``taps``' region from ``x`` into ``out``: the native kernel, or
    numpy's gathers and sums where the library is not here or ``x`` does not fit."""
    outer, n_in, inner = _geometry(tuple(x.shape), taps.axis)
    n_out, count = taps.index.shape
    shaped = (*x.shape[: taps.axis], n_out, *x.shape[taps.axis + 1 :])
    w = [taps.weights[:, t].reshape((n_out,) + (1,) * (len(shaped) - taps.axis - 1)) for t in range(count)]

    def numpy_run(x: np.ndarray, out: np.ndarray) -> None:
        acc = out.reshape(shaped)
        np.multiply(x.take(taps.index[:, 0], taps.axis), w[0], out=acc)
        for t in range(1, count):
            acc += x.take(taps.index[:, t], taps.axis) * w[t]

    lib = library()
    if lib is None or x.dtype != np.float32 or not laid_out(x) or not laid_out(out):
        return [Step(numpy_run, (x, out))]
    threads = int(lib.threads_for(out.size * GATHER_NS * count, SPLIT_NS))
    args = [0, taps.index.ctypes.data, taps.weights.ctypes.data, 0, outer, n_in, n_out, inner, count, threads]
    return [bound_call(lib.resize_taps, args, (x, out), (0, 3), numpy_run, keep=(taps.index, taps.weights))]

