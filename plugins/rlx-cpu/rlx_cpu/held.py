"""Values held in the reduced format between the steps that write and read them.

Why: under ``precision="bf16"`` each convolution rounds its float32 input to bf16 first
(``onednn_steps._layouted``'s reorder in plan scratch) and writes a float32 result: on
the 2-core Xeon with AMX those reorders were 12-18% of DenseNet-121's and RegNetY's time
at batch 8. When every reader of a value reads bf16 anyway, writing it in bf16 at once
saves the reorder in front of each reader and halves the bytes written and read. For a
convolution reading it the numbers are the same (a reorder and a convolution's own
conversion both round to nearest even); an elementwise step or a depthwise convolution
reading it reads it rounded, as OpenVINO's CPU plugin, which keeps activations bf16 end
to end, does. Measured in the zoo against OpenVINO's default on the same host
(BENCHMARKS.md, "bf16 values held between steps"): rlx bf16 / OpenVINO default 1.31x ->
1.17x at batch 8 (ResNet-18 1.15x -> 0.69x, MobileNetV2 1.59x -> 1.04x), errors at or
below OpenVINO's.

Which values (``plan``), once per compile, over the values ``layout.plan`` holds NHWC:

- *Producers*: a convolution expected to take bf16 operands (``tiled``: dense; on AMX's
  tiles 16 channels a group and more, or 8-15 in an even number of groups, merged in
  pairs: ``amx_groups``; on AVX512-BF16 any grouped one: ``bf16_units``), an
  elementwise node; a depthwise convolution, a max or average pool, a
  concat, when what they read is held too (oneDNN runs those on AVX-512's bf16
  instructions: a depthwise 3x3 with bf16 in and out took 0.72-0.81x float32's time).
- *Readers*: every reader is one of those, reading the value as its data input (never as
  a weight), or an elementwise node (the native interpreter reads and writes bf16 as it
  goes), or a convolution reading it as an epilogue operand (a residual: oneDNN's add
  post-op reads bf16), or a global pool or spatial mean (native.c's ``rlx_plane_reduce``
  sums bf16 into float32: EfficientNet's squeeze-excitations then keep their depthwise
  results bf16, 0.67x their time at batch 8 on the Zen 4); a depthwise convolution, pool
  or concat reading it is itself held
  (a depthwise one reading bf16 and writing float32 ran 1.06x float32's time, ConvNeXt's
  blocks 1.07x). On AMX, grouped convolutions of fewer channels a group that cannot be
  merged (4 a group, or an odd number of groups) run neither on the tiles nor faster in
  bf16 (0.7-1.06x), so their inputs stay float32.

Outside the chains (``plan_dense``): a dense layer's or an elementwise node's result read
only by dense layers, as their activation, and by elementwise nodes reading it whole (a
transformer's MLP hidden value, through its GELU: BERT-style encoders 0.96x the time at
batch 8, interleaved A/B).

A fixed point drops values until both hold. A value held so lies in the first half of its
float32 plan buffer's bytes; nothing but those steps ever reads the buffer. A step that
cannot read or write it as planned (an epilogue with no oneDNN post-op, oneDNN declining
the node) runs as if nothing were held, over float32 scratch between conversions
(``_widened``): a wrong expectation costs two reorders, never a wrong answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx_core.ir import Graph, Node
from rlx_core.ir.ops import ELEMENTWISE_OPS, OpKind
from rlx_core.plugin import conv_inputs

from . import amx_groups, bf16_units, layout, native, onednn, onednn_matmul, onednn_steps
from .fused import native_region, program_region
from .post_ops import post_ops
from .steps import held16

__all__ = ["plan", "plan_dense", "steps", "dense_steps", "tiled", "depthwise"]

_CONVS = (OpKind.CONV2D, OpKind.FUSED_CONV)
_POOLS = (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D)
_ELEMENTWISE = ELEMENTWISE_OPS | {OpKind.FUSED_ELEMENTWISE}


def _per_group(node: Node, graph: Graph) -> int:
    return graph.node(node.inputs[0]).shape[1] // int(node.attrs.get("groups", 1))


def tiled(node: Node, graph: Graph) -> bool:
    """Whether convolution ``node`` is one oneDNN is expected to run with reduced operands
    (``onednn_steps.operand_types``): dense; on AMX's tiles wide groups or narrow ones
    merged into wide ones (``amx_groups``), on AVX512-BF16 any grouped one but a depthwise
    one (``bf16_units``)."""
    groups = int(node.attrs.get("groups", 1))
    if groups == 1:
        return True
    per_group = _per_group(node, graph)
    if not bf16_units.merges():  # AVX512-BF16: every grouped convolution but a depthwise one
        return per_group > 1
    return per_group >= amx_groups.WIDE_GROUP or amx_groups.factor(groups, per_group) > 1


def depthwise(node: Node, graph: Graph) -> bool:
    """Whether convolution ``node`` has one input channel a group."""
    return int(node.attrs.get("groups", 1)) > 1 and _per_group(node, graph) == 1


def plan(graph: Graph, cl: frozenset[int]) -> frozenset[int]:
    """The values of ``cl`` (held NHWC) a build under a reduced precision holds in that
    format (see the module)."""
    nodes = graph.nodes
    readers = layout.readers_of(graph)

    def follows(node: Node) -> bool:
        """A producer that writes reduced only what it reads reduced."""
        return node.op in _POOLS or node.op is OpKind.CONCAT or (node.op in _CONVS and depthwise(node, graph))

    def planes(node: Node) -> bool:
        """A global pool or spatial mean (a squeeze-excitation's), which native.c reads
        bf16 as it lies (``layout.reduce_planes``)."""
        return layout.spatial_reduce(node, graph) and native.library() is not None

    def producer(node: Node) -> bool:
        return follows(node) or node.op in _ELEMENTWISE or (node.op in _CONVS and tiled(node, graph))

    held = {v for v in cl if producer(nodes[v]) and readers.get(v)}

    def keeps(v: int) -> bool:
        node = nodes[v]
        if follows(node) and not all(i in held for i in (node.inputs if node.op is OpKind.CONCAT else node.inputs[:1])):
            return False
        for r in readers[v]:
            reader = nodes[r]
            if reader.op in _CONVS:  # as its input (a convolution expected to take it) or an epilogue operand
                n_conv = conv_inputs(reader.attrs) if reader.op is OpKind.FUSED_CONV else len(reader.inputs)
                if v in reader.inputs[1:n_conv]:
                    return False
                if reader.inputs[0] == v and not (tiled(reader, graph) or (depthwise(reader, graph) and r in held)):
                    return False
            elif reader.op not in _ELEMENTWISE and not (follows(reader) and r in held) and not planes(reader):
                return False
        return True

    changed = True
    while changed:
        dropped = {v for v in held if not keeps(v)}
        held -= dropped
        changed = bool(dropped)
    return frozenset(held)


def _dense(node: Node, fixed: Sequence[bool]) -> bool:
    """A dense layer: a product (or the fused GEMM) of a value and a weight fixed at
    compile time, which oneDNN runs with bf16 operands (``onednn_matmul.dense_steps``)."""
    return (node.op in (OpKind.MATMUL, OpKind.GEMM) and node.dtype == "float32" and len(node.inputs) >= 2
            and fixed[node.inputs[1]] and not fixed[node.inputs[0]])


def plan_dense(graph: Graph, cl: frozenset[int], buffered: Sequence[bool], fixed: Sequence[bool]) -> frozenset[int]:
    """The values outside channels-last chains held in the reduced format: a dense
    layer's or an elementwise node's result read only by dense layers (as their
    activation) and elementwise nodes (whole, as the native interpreter reads bf16). A
    transformer's MLP hidden value, four times its width, is the one that counts: its
    product's result through the GELU into the next product, written bf16 and read in
    place, where each was written float32 and the product's input rounded again."""
    nodes = graph.nodes
    readers = layout.readers_of(graph)
    outputs = set(graph.outputs)

    def elementwise(node: Node) -> bool:
        return node.op in _ELEMENTWISE and node.dtype == "float32" and node.id not in cl

    def reads(reader: Node, v: int) -> bool:
        if _dense(reader, fixed):
            return reader.inputs[0] == v and v not in reader.inputs[1:]
        return elementwise(reader) and tuple(reader.shape) == tuple(nodes[v].shape)

    return frozenset(
        n.id for n in nodes
        if buffered[n.id] and n.id not in outputs and n.id not in cl and (_dense(n, fixed) or elementwise(n))
        and readers.get(n.id) and all(reads(nodes[r], n.id) for r in readers[n.id]))


def dense_steps(node: Node, ins: list[Any], out: Any, ctx: Any, held: tuple[Sequence[bool], bool],
                build: Any) -> list[Any]:
    """A dense layer or an elementwise node outside channels-last chains reading or
    writing values held reduced (``plan_dense``): one oneDNN product or native region in
    that format, else ``build(node, ins, out, ctx)`` over float32 scratch between
    conversions."""
    views = [held16(x) if h else x for x, h in zip(ins, held[0])]
    target = held16(out) if held[1] else out
    if node.op in _ELEMENTWISE:
        done = native_region(node, views, target, ins)
    else:
        bias = ins[2] if node.op is OpKind.GEMM and len(ins) == 3 else None
        done = onednn_matmul.dense_steps(views[0], ins[1], bias, node.attrs.get("activation", "none"), target, ctx)
    if done is not None:
        return done
    return _widened(onednn.library(), node, ins, out, ctx, (), False, build, held, lambda i, o: build(node, i, o, ctx))


def steps(lib: onednn.Dnnl, node: Node, ins: list[Any], out: Any, ctx: Any, in_cl: Sequence[bool], out_cl: bool,
          build: Any, held: tuple[Sequence[bool], bool]) -> list[Any]:
    """``layout.steps`` for a node reading or writing values held reduced (``held``:
    which inputs, whether the output): one step reading and writing that format where
    oneDNN or the native interpreter takes the node whole, else the node over float32
    scratch between conversions."""
    views = [held16(x) if h else x for x, h in zip(ins, held[0])]
    target = held16(out) if held[1] else out
    done = _direct(lib, node, ins, views, target, ctx, in_cl, out_cl)
    return done if done is not None else _widened(lib, node, ins, out, ctx, in_cl, out_cl, build, held)


def _direct(lib: onednn.Dnnl, node: Node, typed: list[Any], ins: list[Any], out: Any, ctx: Any,
            in_cl: Sequence[bool], out_cl: bool) -> list[Any] | None:
    """``node``'s one step over ``ins`` and ``out``, each a plan buffer or its view held
    reduced (``typed``: the operands as the graph holds them); None where none takes it."""
    a = node.attrs
    if node.op in _CONVS:
        n_conv = conv_inputs(a) if node.op is OpKind.FUSED_CONV else len(ins)
        post: tuple[tuple[Any, ...], ...] | None = ()
        if node.op is OpKind.FUSED_CONV:
            operands = [out, *(x if cl == out_cl else layout.cl_view(x) if out_cl else x.transpose(layout.TO_NCHW)
                               for x, cl in zip(ins[n_conv:], in_cl[n_conv:]))]
            post = post_ops(a["program"], operands, getattr(ctx, "constant", None))
            if post is None:  # no post-ops for it (or a SiLU faster so: ``swish``): the interpreter after
                return _then_region(lib, node, ins, operands, typed, out, ctx, in_cl, out_cl)
        return onednn_steps.conv_steps(lib, ins[0], ins[1], ins[2] if n_conv == 3 else None, out, a["padding"],
                                       a["stride"], a["dilation"], a["groups"], ctx, src_cl=in_cl[0], dst_cl=out_cl,
                                       post=post)
    if node.op in _POOLS:
        return onednn_steps.pool_steps(lib, ins[0], out, node.op is OpKind.MAX_POOL2D,
                                       bool(a.get("count_include_pad")), a["kernel"], a["stride"],
                                       a.get("dilation", (1, 1)), a["padding"], ctx, src_cl=in_cl[0], dst_cl=out_cl)
    if node.op in layout.REDUCES and in_cl[0]:  # float32 sums of the planes as they lie
        return layout.reduce_planes(layout.REDUCES[node.op], ins[0], out)
    if node.op is OpKind.CONCAT and all(in_cl) and out_cl:
        return onednn_steps.concat_steps(lib, ins, out, layout.builder_node(node).attrs["axis"], ctx)
    if node.op in _ELEMENTWISE and out_cl:  # the native interpreter, bf16 read and written as it goes
        operands = [x if cl else layout.cl_view(x) for x, cl in zip(ins, in_cl)]
        return native_region(layout.builder_node(node), operands, out,
                             [x if cl else layout.cl_view(x) for x, cl in zip(typed, in_cl)])
    return None


def _then_region(lib: onednn.Dnnl, node: Node, ins: list[Any], operands: list[Any], typed: list[Any], out: Any,
                 ctx: Any, in_cl: Sequence[bool], out_cl: bool) -> list[Any] | None:
    """A fused convolution whose epilogue is no chain of oneDNN post-ops: the convolution
    alone, writing ``out`` as it is held, then the epilogue on the native interpreter over
    it in place, reading and writing that format (``operands``: the output, then the
    epilogue's other operands, in the output's layout); None where either declines."""
    a = node.attrs
    n_conv = conv_inputs(a)
    wide = [np.broadcast_to(np.float32(0), out.shape),  # (the operands as the graph holds them, for the types)
            *(x if cl == out_cl else layout.cl_view(x) if out_cl else x.transpose(layout.TO_NCHW)
              for x, cl in zip(typed[n_conv:], in_cl[n_conv:]))]
    after = program_region(a["program"], operands, out, wide)
    if after is None:
        return None
    done = onednn_steps.conv_steps(lib, ins[0], ins[1], ins[2] if n_conv == 3 else None, out, a["padding"],
                                   a["stride"], a["dilation"], a["groups"], ctx, src_cl=in_cl[0], dst_cl=out_cl)
    return None if done is None else done + after


def _widened(lib: onednn.Dnnl, node: Node, ins: list[Any], out: Any, ctx: Any, in_cl: Sequence[bool], out_cl: bool,
             build: Any, held: tuple[Sequence[bool], bool], plain: Any = None) -> list[Any]:
    """``node`` built as if nothing were held, over float32 scratch: each input held
    reduced widened first, the output rounded after (``onednn_steps.convert_steps``).
    ``plain(ins, out)`` builds it so (default: ``layout.steps``)."""
    if plain is None:
        def plain(ins: list[Any], out: Any) -> list[Any]:
            return layout.steps(lib, node, ins, out, ctx, in_cl, out_cl, build)

    first: list[Any] = []
    ins = list(ins)
    wide: dict[int, Any] = {}  # (a value read twice is widened once)
    for k, is_held in enumerate(held[0]):
        if is_held:
            x = ins[k]
            if id(x) not in wide:
                wide[id(x)] = ctx.scratch(tuple(x.shape), np.float32)
                first += _converted(lib, held16(x), wide[id(x)], ctx)
            ins[k] = wide[id(x)]
    if not held[1]:
        return first + plain(ins, out)
    res = ctx.scratch(tuple(out.shape), np.float32)
    return first + plain(ins, res) + _converted(lib, res, held16(out), ctx)


def _converted(lib: onednn.Dnnl, x: Any, out: Any, ctx: Any) -> list[Any]:
    done = onednn_steps.convert_steps(lib, x, out, ctx)
    if done is None:  # (``plan`` runs only in a build with a reduced format)
        raise AssertionError("a value held reduced in a build without a reduced precision")
    return done
