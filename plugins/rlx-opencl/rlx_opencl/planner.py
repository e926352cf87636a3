"""From a legalized graph to kernels and a memory plan, once, at compile time.

Three decisions are made here:

- **Fusion.** An elementwise node whose only consumer is an elementwise node of the same
  shape is computed inside that consumer's kernel (a region is one kernel). A transpose
  of the last two axes feeding only the B operand of a matmul becomes the matmul's
  transposed (``NT``) form. ``reshape`` is free: it aliases its input's buffer.
- **Kernels.** Each remaining node becomes one or two kernels (``codegen/``), with
  vectors at most ``vector_bits`` wide (what the device's compiler takes).
- **Memory.** Intermediates live in a few slots, assigned by liveness: a slot is free
  again after the last step that reads its value, and is reused by the next value that
  fits (best fit; a slot grows if none fits). Outputs stay live to the end. Every buffer
  is allocated once, when the executable is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlx_core.ir import Graph, Node
from rlx_core.ir.ops import ELEMENTWISE_OPS, SOURCE_OPS, OpKind
from rlx_core.plugin import EXTENDED_DTYPES, itemsize

from .codegen.common import MAX_VECTOR_BITS, Kernel
from .codegen.conv import conv2d_kernels, pool_kernel
from .codegen.elementwise import elementwise_kernel, region_inputs
from .codegen.matmul import MatmulSpec, matmul_kernel
from .codegen.movement import concat_kernel, gather_kernel, slice_kernel, transpose_kernel
from .codegen.reduce import layer_norm_kernel, reduce_kernel, softmax_kernel

__all__ = ["Plan", "Step", "Check", "plan_graph"]

#: The integer dtypes (a division by zero among them is checked at run time).
_INT_DTYPES = frozenset({"int32", "int64", *(d for d in EXTENDED_DTYPES if "int" in d)})


@dataclass
class Step:
    """The kernels computing ``node`` (and the nodes fused into it); ``scratch`` holds the
    byte sizes of buffers the step needs only while it runs (im2col)."""

    node: Node
    kernels: list[Kernel]
    scratch: list[int] = field(default_factory=list)
    fused: tuple[int, ...] = ()


@dataclass(frozen=True)
class Check:
    """A run-time check a kernel reports through the status buffer (slot ``2*k``: flag,
    ``2*k+1``: the offending value)."""

    node: Node
    kind: str  # "div" (integer division by zero) or "gather" (index out of range)
    size: int = 0  # gather: the size of the indexed axis


@dataclass
class Plan:
    """Everything the executable needs: steps in order, which buffer holds each value
    (``root``: node id -> the node whose buffer it is), slot sizes and assignments."""

    steps: list[Step]
    root: dict[int, int]
    slots: list[int]
    slot_of: dict[int, int]
    scratch_slots: dict[tuple[int, int], int]
    checks: list[Check]
    live: set[int]


def _swaps_last_two(node: Node) -> bool:
    perm, r = node.attrs["perm"], len(node.shape)
    return r >= 2 and tuple(perm) == (*range(r - 2), r - 1, r - 2)


def plan_graph(graph: Graph, vector_bits: int = MAX_VECTOR_BITS) -> Plan:
    """The steps, kernels and memory plan of ``graph``, with vectors at most ``vector_bits`` wide."""
    nodes = graph.nodes
    live = graph.live_nodes()
    outputs = set(graph.outputs)
    consumers: dict[int, set[int]] = {i: set() for i in live}
    for n in nodes:
        if n.id in live:
            for i in n.inputs:
                consumers[i].add(n.id)

    root: dict[int, int] = {}
    for n in nodes:
        if n.id in live:
            root[n.id] = root[n.inputs[0]] if n.op is OpKind.RESHAPE else n.id

    def only_consumer(n: Node) -> Node | None:
        users = consumers[n.id]
        if n.id in outputs or len(users) != 1:
            return None
        return nodes[next(iter(users))]

    inlined: set[int] = set()
    folded: set[int] = set()  # transposes read by a matmul as its NT form
    for n in nodes:
        if n.id not in live or n.op in SOURCE_OPS:
            continue
        user = only_consumer(n)
        if user is None:
            continue
        if (n.op in ELEMENTWISE_OPS and user.op in ELEMENTWISE_OPS and user.shape == n.shape
                and not (n.op is OpKind.CAST and n.dtype == "float16")):
            inlined.add(n.id)  # a float16 cast must round: it is stored, never fused
        elif (n.op is OpKind.TRANSPOSE and _swaps_last_two(n) and user.op is OpKind.MATMUL
              and user.inputs[1] == n.id and user.inputs[0] != n.id):
            folded.add(n.id)

    steps: list[Step] = []
    checks: list[Check] = []
    for n in nodes:
        if n.id not in live or n.op in SOURCE_OPS or n.op is OpKind.RESHAPE or n.id in inlined or n.id in folded:
            continue
        name = f"k{len(steps)}_{n.op.value}"
        # An empty result needs no kernel (and the generators divide by its extents).
        step = Step(n, []) if n.size == 0 else _step(graph, n, name, inlined, folded, checks, vector_bits)
        steps.append(step)

    slots, slot_of, scratch_slots = _assign_memory(graph, steps, root, outputs)
    return Plan(steps, root, slots, slot_of, scratch_slots, checks, live)


def _region(graph: Graph, n: Node, inlined: set[int]) -> list[Node]:
    out: list[int] = []

    def visit(i: int) -> None:
        for j in graph.nodes[i].inputs:
            if j in inlined and j not in out:
                visit(j)
        if i not in out:
            out.append(i)

    visit(n.id)
    return [graph.nodes[i] for i in sorted(out)]


def _step(graph: Graph, n: Node, name: str, inlined: set[int], folded: set[int], checks: list[Check],
          vector_bits: int) -> Step:
    nodes = graph.nodes
    ins = [nodes[i] for i in n.inputs]
    op = n.op
    if op in ELEMENTWISE_OPS:
        region = _region(graph, n, inlined)
        externals = [nodes[i] for i in region_inputs(region)]
        slot = None
        divs = [r for r in region if r.op is OpKind.DIV and r.dtype in _INT_DTYPES]
        if divs:
            slot = len(checks)
            checks.append(Check(divs[0], "div"))
        kernel = elementwise_kernel(name, region, externals, slot, vector_bits)
        return Step(n, [kernel], fused=tuple(r.id for r in region[:-1]))
    if op is OpKind.MATMUL:
        return Step(n, [_matmul(graph, n, name, folded, vector_bits)])
    if op in (OpKind.REDUCE_SUM, OpKind.REDUCE_MEAN, OpKind.REDUCE_MAX, OpKind.GLOBAL_AVG_POOL2D):
        return Step(n, [reduce_kernel(name, n, ins[0])])
    if op is OpKind.SOFTMAX:
        return Step(n, [softmax_kernel(name, n, ins[0])])
    if op is OpKind.LAYER_NORM:
        return Step(n, [layer_norm_kernel(name, n, ins[0], ins[1], ins[2] if len(ins) == 3 else None)])
    if op is OpKind.TRANSPOSE:
        return Step(n, [transpose_kernel(name, n, ins[0])])
    if op is OpKind.SLICE:
        return Step(n, [slice_kernel(name, n, ins[0])])
    if op is OpKind.CONCAT:
        return Step(n, [concat_kernel(name, n, ins)])
    if op is OpKind.GATHER:
        checks.append(Check(n, "gather", ins[0].shape[n.attrs["axis"]]))
        return Step(n, [gather_kernel(name, n, ins[0], ins[1], len(checks) - 1)])
    if op is OpKind.CONV2D:
        kernels, scratch = conv2d_kernels(name, n, ins[0], ins[1], ins[2] if len(ins) == 3 else None, vector_bits)
        return Step(n, kernels, [scratch * itemsize(n.dtype)] if scratch else [])
    if op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D):
        return Step(n, [pool_kernel(name, n, ins[0])])
    raise NotImplementedError(f"rlx-opencl has no kernel for {op} ({n.describe()}); it should not have claimed it")


def _batch_strides(shape: tuple[int, ...], batch: tuple[int, ...], matrix: int) -> tuple[int, ...]:
    """Per output batch dim, the element stride of an operand whose batch dims are
    ``shape`` (right-aligned; 0 where it broadcasts) and whose matrices hold ``matrix``."""
    out, stride = [], matrix
    sizes = list(shape)
    strides_rev = []
    for d in reversed(sizes):
        strides_rev.append(stride if d != 1 else 0)
        stride *= d
    strides_r = strides_rev[::-1]
    lead = len(batch) - len(sizes)
    for d in range(len(batch)):
        out.append(0 if d < lead else strides_r[d - lead])
    return tuple(out)


def _matmul(graph: Graph, n: Node, name: str, folded: set[int], vector_bits: int) -> Kernel:
    nodes = graph.nodes
    a, b = nodes[n.inputs[0]], nodes[n.inputs[1]]
    trans_b = b.id in folded
    src_b = nodes[b.inputs[0]] if trans_b else b
    a2 = (1, *a.shape) if len(a.shape) == 1 else a.shape
    b2 = (*b.shape, 1) if len(b.shape) == 1 else b.shape
    m, k, nn = a2[-2], a2[-1], b2[-1]
    batch = tuple(n.shape[: len(n.shape) - (len(a.shape) > 1) - (len(b.shape) > 1)])
    spec = MatmulSpec(m=m, k=k, n=nn, dtype=n.dtype, batch=batch,
                      a_strides=_batch_strides(a2[:-2], batch, m * k),
                      b_strides=_batch_strides(b2[:-2], batch, k * nn), trans_b=trans_b)
    return matmul_kernel(name, spec, a.id, src_b.id, n.id, vector_bits=vector_bits)


def _assign_memory(graph: Graph, steps: list[Step], root: dict[int, int],
                   outputs: set[int]) -> tuple[list[int], dict[int, int], dict[tuple[int, int], int]]:
    """Slots for computed values and scratch, reused by liveness (see the module doc)."""
    nodes = graph.nodes
    forever = len(steps)
    last_use: dict[int, int] = {}
    for s, step in enumerate(steps):
        for kernel in step.kernels:
            for arg in kernel.args:
                if arg.value is not None:
                    r = root[arg.value]
                    last_use[r] = max(last_use.get(r, -1), s)
    for o in outputs:
        last_use[root[o]] = forever
    slots: list[int] = []
    free: list[int] = []
    holder: dict[int, int] = {}  # slot -> root it holds
    slot_of: dict[int, int] = {}
    scratch_slots: dict[tuple[int, int], int] = {}

    def take(nbytes: int) -> int:
        fits = [s for s in free if slots[s] >= nbytes]
        if fits:
            s = min(fits, key=lambda i: slots[i])
        elif free:
            s = max(free, key=lambda i: slots[i])
            slots[s] = nbytes
        else:
            slots.append(nbytes)
            return len(slots) - 1
        free.remove(s)
        return s

    for s, step in enumerate(steps):
        for slot, r in list(holder.items()):
            if last_use.get(r, -1) < s:
                free.append(slot)
                del holder[slot]
        r = root[step.node.id]
        if r not in slot_of:
            node = nodes[r]
            slot_of[r] = take(max(node.size * itemsize(node.dtype), 1))
            holder[slot_of[r]] = r
        scratch_taken = [take(max(nbytes, 1)) for nbytes in step.scratch]
        for k, slot in enumerate(scratch_taken):
            scratch_slots[(s, k)] = slot
        free.extend(scratch_taken)  # free again once this step has run
    return slots, slot_of, scratch_slots


def describe_plan(plan: Plan) -> str:
    """A few lines for logs and reprs: kernels, fused nodes, slots and their bytes."""
    kernels = sum(len(s.kernels) for s in plan.steps)
    fused = sum(len(s.fused) for s in plan.steps)
    return (f"{len(plan.steps)} steps, {kernels} kernels ({fused} nodes fused), "
            f"{len(plan.slots)} slots, {math.fsum(plan.slots) / 1e6:.3g} MB")
