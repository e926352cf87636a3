"""Channels-last chains: which values the cpu backend holds NHWC, and the kernels that
read and write them.

Why: oneDNN's convolutions run on channels-last (NHWC) data. Converting each one's input
from NCHW and its output back (``onednn_steps.conv_steps`` on its own) costs two passes over
memory per convolution, which is why pointwise convolutions stayed on rlx's NCHW GEMM and
each kind of convolution had to win a probe against rlx's kernel first. A chain of
convolutions and the elementwise work between them (bias, activations, residual adds,
squeeze-excitation scales) can instead stay NHWC from its first convolution to its last
reader: then every convolution of the chain runs on oneDNN with no reorder at all.
Measured on the 2-core Xeon (AVX-512) of session 23: MobileNetV2's 52 convolutions took
2.3 ms on oneDNN over NHWC against 6.6 ms as rlx ran them (ORT: 4.0 ms for the whole
model), ResNet-50's 25 ms against 44 ms for the model (ORT 30 ms); BENCHMARKS.md has the
model figures.

The plan (``plan``), once per compile, over the legal graph:

- *Convolutions oneDNN takes* (float32, 4-D, weights and bias fixed at compile time, an
  output plane of more than one pixel: a squeeze-excitation's 1x1 planes stay on rlx's
  matrix-vector kernel; a grouped one only where oneDNN runs it on one of its own kernels,
  not its im2col + GEMM fallback nor its reference loops: ``_conv_in_chain``) and *max
  and average pools* read either layout and write either (``onednn_steps``: a reorder in
  plan scratch where a side is NCHW).
- *Elementwise nodes* (plain ops and fused regions) over 4-D values compute the same
  function on NHWC operands when every operand is permuted alike: their full-size
  operands must all be held NHWC, and the broadcast ones (a per-channel ``(1, C, 1, 1)``,
  a scalar, an ``(N, C, 1, 1)`` scale) are read through a transposed view.
- *Concats* of values all held NHWC are oneDNN's concat along the moved axis.
- *Global average pooling* reads NHWC (its ``(N, C, 1, 1)`` output is the same memory in
  either layout), on native.c's plane reductions (``reduce_planes``).
- *Transposes* to NHWC of a value held NHWC, and to NCHW of one held NCHW, are views
  (``Plan.views``: ConvNeXt's blocks, models fed NHWC images).

A value is held NHWC when its producer is one of these and every reader reads NHWC; it is
never a graph output. The fixed point drops values until that holds, so every value
reaches each reader in the layout the reader expects, and nothing outside a chain sees a
change. A fused convolution's epilogue becomes oneDNN post-ops where it maps to them
(``post_ops.post_ops``: clamps, scalar affine steps, a residual add, ReLU, SiLU, hard-swish,
GELU, sigmoid, tanh), else a region over the output in its layout. Where oneDNN declines
a node the plan chose (only its reference loops would take it), rlx's NCHW kernel runs it
between transposes (``_via_nchw``). ``RLX_CPU_LAYOUT=nchw`` turns it all off (every
convolution then goes the way ``onednn.use`` measured, with its reorders).

Without oneDNN, on AVX-512 hosts, rlx's own kernels hold narrower chains
(``NativeChains``, ``conv_nhwc``): ungrouped convolutions on the channels-inner kernel,
pools on its NHWC pool, no concats; a chain is kept only where it holds enough
convolutions NHWC on both sides to pay for its transposes (``_short_chains``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from rlx_core.ir import Graph, Node
from rlx_core.ir.ops import ELEMENTWISE_OPS, OpKind
from rlx_core.plugin import conv_inputs

from . import conv_nhwc, native, onednn, onednn_steps, swish
from .ccall import bound_call
from .gemm import matmul_step
from .native_nn import pool_kind, pool_to_nhwc_step
from .post_ops import post_ops
from .regions import SPLIT_NS
from .steps import HELD16, Step, laid_out
from .transposes import transpose_step

__all__ = ["TO_CL", "TO_NCHW", "NATIVE", "NativeChains", "enabled", "native_chains", "describe",
           "Plan", "plan", "readers_of", "cl_shape", "cl_view", "steps",
           "post_ops"]

log = logging.getLogger("rlx_cpu")

#: NCHW -> NHWC, and back.
TO_CL, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
_CONVS = (OpKind.CONV2D, OpKind.FUSED_CONV)
_ELEMENTWISE = ELEMENTWISE_OPS | {OpKind.FUSED_ELEMENTWISE}


class NativeChains:
    """The chain provider where oneDNN does not run: rlx's own kernels
    (``conv_nhwc``: the channels-inner convolution and NHWC pools). Chains are narrower
    there: ungrouped, undilated convolutions of at least 16 input channels (grouped and
    depthwise ones, and concats, stay NCHW, and so does everything joined to them;
    depthwise ones join where ``conv_nhwc.DEPTHWISE`` says, NHWC on both sides), and
    only on AVX-512 hosts, where the kernel was measured. Why: rlx's NCHW implicit GEMM
    copies each image kw times over before its products; the channels-inner kernel reads
    its NHWC input as it is (ResNet's 3x3 convolutions 0.63-0.93x its time on the 2-core
    Zen 5, at or near ORT's MLAS; BENCHMARKS.md, session 41)."""

    def __repr__(self) -> str:
        return "rlx native chains"


#: The provider of ``enabled`` when rlx's own kernels hold the chains.
NATIVE = NativeChains()


def enabled() -> onednn.Dnnl | NativeChains | None:
    """What runs channels-last chains here (``RLX_CPU_LAYOUT``): oneDNN where it is
    wanted and installed, else rlx's native kernels (``native_chains``), else None."""
    if chains_planned():
        return onednn.library()
    return NATIVE if native_chains() else None


def native_chains() -> bool:
    """Whether compiles here plan channels-last chains on rlx's own kernels: oneDNN does
    not plan them, ``RLX_CPU_LAYOUT`` is not ``nchw`` and the native library has its
    AVX-512 clones."""
    from .settings import LAYOUT

    if LAYOUT.read() == "nchw" or chains_planned():
        return False
    lib = native.library()
    return lib is not None and bool(lib.gemm_avx512)


def chains_planned() -> bool:
    """Whether compiles here plan channels-last chains (``RLX_CPU_LAYOUT`` not ``nchw``,
    oneDNN wanted and installed), without loading oneDNN."""
    from .settings import LAYOUT

    return LAYOUT.read() != "nchw" and onednn.wanted() != "off" and onednn.find_library() is not None


def describe() -> str:
    """The probe's ``"layout"`` entry (``rlx devices --explain``): whether chains go
    channels-last here, and if not, why not. Loads nothing."""
    from .settings import LAYOUT

    if LAYOUT.read() == "nchw":
        return "NCHW everywhere (RLX_CPU_LAYOUT=nchw)"
    if onednn.wanted() == "off" or onednn.find_library() is None:
        why = ("RLX_CPU_ONEDNN=off" if onednn.wanted() == "off"
               else "channels-last chains of every kind need oneDNN: pip install 'rlx-cpu[onednn]'")
        if native_chains():
            return (f"chains of ungrouped convolutions channels-last (NHWC) on rlx's channels-inner kernel, the rest "
                    f"NCHW ({why})")
        return f"NCHW everywhere ({why})"
    return ("chains of convolutions channels-last (NHWC), each convolution on oneDNN with its epilogue as "
            "post-ops where it maps to them; a grouped one oneDNN would run only as im2col + GEMM or its reference "
            f"loops stays NCHW on rlx's kernels (RLX_CPU_LAYOUT=auto; a SiLU as the post-op or a region after: "
            f"{swish.describe()})")


def cl_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """An NCHW shape's NHWC order."""
    return tuple(shape[p] for p in TO_CL)


def cl_view(x: Any) -> Any:
    """An operand of a channels-last elementwise node, held NCHW (a broadcast one):
    right-aligned to 4-D, then viewed NHWC (no copy)."""
    if x.ndim < 4:
        x = x.reshape((1,) * (4 - x.ndim) + tuple(x.shape))
    return x.transpose(TO_CL)


def _conv_on_dnnl(node: Node, graph: Graph, fixed: Sequence[bool]) -> bool:
    if node.op not in _CONVS or node.dtype != "float32" or len(node.shape) != 4:
        return False
    n_conv = conv_inputs(node.attrs) if node.op is OpKind.FUSED_CONV else len(node.inputs)
    x = graph.node(node.inputs[0])
    if x.dtype != "float32" or len(x.shape) != 4 or not all(fixed[i] for i in node.inputs[1:n_conv]):
        return False
    if any(graph.node(i).dtype != "float32" for i in node.inputs):
        return False
    return node.shape[2] * node.shape[3] > 1


REDUCES = {OpKind.GLOBAL_AVG_POOL2D: "mean", OpKind.REDUCE_MEAN: "mean", OpKind.REDUCE_SUM: "sum",
           OpKind.REDUCE_MAX: "max"}


def spatial_reduce(node: Node, graph: Graph) -> bool:
    """A reduction over the two spatial axes of a 4-D float32 value (a global pool, or
    a squeeze-excitation's ``ReduceMean(axes=(2, 3))`` as the dynamo exporter writes it):
    its (N, C) or (N, C, 1, 1) result is the same memory whichever layout it read."""
    if node.op not in REDUCES or node.dtype != "float32" or len(graph.node(node.inputs[0]).shape) != 4:
        return False
    if node.op is OpKind.GLOBAL_AVG_POOL2D:
        return True
    axes = node.attrs.get("axes")
    return axes is not None and sorted(a % 4 for a in axes) == [2, 3]


def _conv_in_chain(node: Node, graph: Graph, fixed: Sequence[bool]) -> bool:
    """A convolution a oneDNN chain holds: one oneDNN takes (``_conv_on_dnnl``) and, if
    grouped (not depthwise), on more than its reference loops or its im2col + GEMM
    fallback (``gemm:jit``), asked of oneDNN once a geometry (``Dnnl.conv_impl``). That
    fallback is what rlx runs itself in NCHW with no reorder, and slower than rlx's
    grouped kernel: ResNeXt's 32 groups of 4 channels got it over NHWC on the 2-core Zen 3
    (AVX2), 42-50 ms a layer at batch 8 against 6 ms on rlx's grouped kernel (oneDNN's
    grouped kernels block 8 or 16 channels a group). Such a convolution stays NCHW, and
    the chain ends at it. Ungrouped and depthwise ones got oneDNN's own kernels on every
    model measured there, so nothing is asked for them (a question costs ~0.1-0.2 ms a
    geometry at compile), nor for sizes not known yet; where oneDNN declines one after
    all, ``_via_nchw`` runs it."""
    if not _conv_on_dnnl(node, graph, fixed):
        return False
    a = node.attrs
    x, w = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    if a["groups"] == 1 or a["groups"] == x.shape[1] == node.shape[1]:
        return True
    if not all(isinstance(d, int) for d in (*x.shape, *w.shape, *node.shape)):
        return True
    lib = onednn.library()
    if lib is None:
        return False
    impl = lib.conv_impl(tuple(x.shape), tuple(w.shape), tuple(node.shape), a["stride"], a.get("dilation", (1, 1)),
                         a["padding"], a["groups"])
    return bool(impl) and not impl.startswith("ref") and "gemm:" not in impl


def _conv_native(node: Node, graph: Graph, fixed: Sequence[bool]) -> bool:
    """A convolution the channels-inner kernel runs in a chain (``NativeChains``)."""
    if not _conv_on_dnnl(node, graph, fixed):  # (the same float32, 4-D, fixed-weights test)
        return False
    a = node.attrs
    c = graph.node(node.inputs[0]).shape[1]
    if conv_nhwc.takes_depthwise(c, a["groups"], node.shape[1]):
        return True
    return tuple(a.get("dilation", (1, 1))) == (1, 1) and conv_nhwc.takes(c, a["groups"])


def _pool(node: Node) -> bool:
    return node.op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D) and node.dtype == "float32" and len(node.shape) == 4


def _elementwise(node: Node, graph: Graph) -> bool:
    return (node.op in _ELEMENTWISE and len(node.shape) == 4
            and all(len(graph.node(i).shape) <= 4 for i in node.inputs))


class Plan(NamedTuple):
    """``cl``: the values held NHWC; ``views``: the transposes that cost nothing under
    that plan (each is its input's array: see ``plan``)."""

    cl: frozenset[int]
    views: frozenset[int]


def _transpose(node: Node, perm: tuple[int, ...], fixed: Sequence[bool]) -> bool:
    return (node.op is OpKind.TRANSPOSE and len(node.shape) == 4 and tuple(node.attrs["perm"]) == perm
            and not fixed[node.id])


def readers_of(graph: Graph) -> dict[int, list[int]]:
    """Each value's readers (node ids, each once), for the plans over the graph
    (``plan``, ``held.plan``)."""
    readers: dict[int, list[int]] = {}
    for node in graph.nodes:
        for i in dict.fromkeys(node.inputs):
            readers.setdefault(i, []).append(node.id)
    return readers


def plan(graph: Graph, buffered: Sequence[bool], fixed: Sequence[bool], native_kernels: bool = False) -> Plan:
    """The values to hold NHWC (see the module). ``buffered[i]``: value ``i`` is computed
    per run into a plan buffer; ``fixed[i]``: it is known at compile time;
    ``native_kernels``: the chains run on rlx's own kernels (``NativeChains``): fewer
    convolutions qualify and no concat is held NHWC (its inputs would each be copied).

    Transposes between the layouts, as models written channels-last export them
    (ConvNeXt's blocks: a depthwise convolution, ``transpose(0, 2, 3, 1)``, LayerNorm and
    an MLP over the channels, ``transpose(0, 3, 1, 2)``), cost nothing: the first of a
    value held NHWC *is* that value's array, and the second, when every reader of its
    result reads NHWC, makes a value held NHWC out of its input's array as it is."""
    nodes = graph.nodes
    readers = readers_of(graph)
    # oneDNN's convolutions and pools read either layout and write either (reorders where needed).
    convs = _conv_native if native_kernels else _conv_in_chain
    either = {n.id for n in nodes if buffered[n.id] and (convs(n, graph, fixed) or _pool(n))}
    gaps = {n.id for n in nodes if buffered[n.id] and spatial_reduce(n, graph)}
    unwrap = {n.id for n in nodes if _transpose(n, TO_CL, fixed)}
    wrap = {n.id for n in nodes if _transpose(n, TO_NCHW, fixed)}
    concats = set() if native_kernels else {n.id for n in nodes
                                            if buffered[n.id] and n.op is OpKind.CONCAT and len(n.shape) == 4}
    # rlx's depthwise kernel reads and writes NHWC only: held NHWC on both sides or neither
    both = ({n.id for n in nodes if n.id in either and n.op in _CONVS and n.attrs["groups"] > 1}
            if native_kernels else set())
    cl = either | wrap | concats | {n.id for n in nodes if buffered[n.id] and _elementwise(n, graph)}
    outputs = set(graph.outputs)

    def reads_cl(nid: int, value: int) -> bool:
        """Whether reader ``nid`` takes ``value`` NHWC: a convolution as its input or an
        epilogue operand (never as weights), a pool as its input, a transpose to NHWC,
        an elementwise node when it is itself NHWC."""
        reader = nodes[nid]
        if nid in both:
            return nid in cl
        if nid in either:
            if reader.op not in _CONVS:
                return True
            n_conv = conv_inputs(reader.attrs) if reader.op is OpKind.FUSED_CONV else len(reader.inputs)
            return value not in reader.inputs[1:n_conv]
        if nid in gaps or nid in unwrap:
            return True
        return nid in cl

    changed = True
    while changed:
        changed = False
        for nid in sorted(cl):
            node = nodes[nid]
            keep = nid not in outputs and bool(readers.get(nid)) and all(reads_cl(r, nid) for r in readers[nid])
            if keep and nid in both:
                keep = node.inputs[0] in cl
            if keep and nid in wrap:  # its input's array, as it is: an input held NCHW
                keep = node.inputs[0] not in cl
            elif keep and nid in concats:  # blocks of the channels (or any axis) of NHWC inputs
                keep = all(i in cl for i in node.inputs)
            elif keep and nid not in either:  # elementwise: full-size operands NHWC, the others not
                full = [i for i in node.inputs if tuple(nodes[i].shape) == tuple(node.shape)]
                keep = (bool(full) and all(i in cl for i in full)
                        and not any(i in cl for i in node.inputs if i not in full))
            if not keep:
                cl.discard(nid)
                changed = True
    if native_kernels:
        cl -= _short_chains(nodes, cl, readers)
    views = frozenset({u for u in unwrap if nodes[u].inputs[0] in cl} | (wrap & cl))
    if cl:
        log.debug("rlx-cpu: %d of %d values held channels-last, %d transposes made views", len(cl), len(nodes),
                  len(views))
    return Plan(frozenset(cl), views)


#: Convolutions a native chain must hold NHWC on both sides to pay for the transposes at
#: its ends.
MIN_NATIVE_CHAIN = 3


def _short_chains(nodes: Sequence[Node], cl: set[int], readers: dict[int, list[int]]) -> set[int]:
    """The values of native chains (connected sets of values held NHWC) that are not worth
    their transposes: fewer than ``MIN_NATIVE_CHAIN`` convolutions that read and write
    NHWC, or fewer of those than convolutions and pools that transpose one side (an
    NCHW input read, an NCHW output written). Dropped whole: every reader then reads
    NCHW, as before the plan. GoogLeNet's stem (pool, 1x1, 3x3 into a concat's branches)
    made a chain of one inside: its pool's transpose in and the next pool's out (0.9 ms
    each at batch 8) cost more than the kernel saved, 1.05x the model's time; ResNeXt's
    and RegNet's residual adds between grouped convolutions (NCHW) chain a stage's
    pointwise convolutions, each transposing a side: 1.09-1.22x."""
    parent = {v: v for v in cl}

    def root(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for v in cl:
        for i in nodes[v].inputs:
            if i in cl:
                parent[root(i)] = root(v)
    inside: dict[int, int] = {}
    edges: dict[int, int] = {}
    for v in cl:
        if nodes[v].op in _CONVS and nodes[v].inputs[0] in cl:
            inside[root(v)] = inside.get(root(v), 0) + 1
        elif nodes[v].op in _CONVS or nodes[v].op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D):  # reads NCHW
            edges[root(v)] = edges.get(root(v), 0) + 1
        for r in readers.get(v, ()):  # convolutions and pools that read v and write NCHW
            if r not in cl and nodes[r].inputs[0] == v and (
                    nodes[r].op in _CONVS or nodes[r].op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D)):
                edges[root(v)] = edges.get(root(v), 0) + 1
    return {v for v in cl
            if inside.get(root(v), 0) < max(MIN_NATIVE_CHAIN, edges.get(root(v), 0))}


def builder_node(node: Node) -> Node:
    """``node`` as its kernel builder sees it when its value is held NHWC (a concat's axis
    moved with its dim)."""
    attrs = node.attrs
    if node.op is OpKind.CONCAT:
        attrs = {**attrs, "axis": TO_CL.index(attrs["axis"] % 4)}
    return dataclasses.replace(node, shape=cl_shape(node.shape), attrs=attrs)


def steps(lib: onednn.Dnnl | NativeChains, node: Node, ins: list[Any], out: Any, ctx: Any, in_cl: Sequence[bool],
          out_cl: bool, build: Any, held: tuple[Sequence[bool], bool] = ((), False)) -> list[Any]:
    """The steps of a node that reads or writes NHWC values: ``ins`` and ``out`` are
    each NHWC where ``in_cl`` / ``out_cl`` say so. ``build(node, ins, out, ctx)`` builds
    ``node``'s NCHW kernel (for elementwise nodes, and every fallback). ``held``: which
    inputs, and whether the output, are held in the build's reduced format
    (``held.plan``)."""
    if any(held[0]) or held[1]:
        from .held import steps as held_steps  # (held.py builds on this module)

        return held_steps(lib, node, ins, out, ctx, in_cl, out_cl, build, held)
    if isinstance(lib, NativeChains):
        if node.op in _CONVS:
            return _native_conv(node, ins, out, ctx, in_cl, out_cl, build)
        if node.op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D):
            return _native_pool(node, ins, out, ctx, in_cl, out_cl, build)
    if node.op in _CONVS:
        return _conv(lib, node, ins, out, ctx, in_cl, out_cl, build)
    if node.op in REDUCES:
        done = reduce_planes(REDUCES[node.op], ins[0], out)
        assert done is not None  # (a float32 value always has a way)
        return done
    if node.op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D):
        a = node.attrs
        done = onednn_steps.pool_steps(lib, ins[0], out, node.op is OpKind.MAX_POOL2D,
                                       bool(a.get("count_include_pad")), a["kernel"], a["stride"],
                                       a.get("dilation", (1, 1)), a["padding"], ctx, src_cl=in_cl[0], dst_cl=out_cl)
        return done if done is not None else _via_nchw(node, ins, out, ctx, in_cl, out_cl, build)
    if node.op is OpKind.CONCAT:
        flat = builder_node(node)
        done = onednn_steps.concat_steps(lib, ins, out, flat.attrs["axis"], ctx)
        return done if done is not None else build(flat, ins, out, ctx)
    operands = [x if cl else cl_view(x) for x, cl in zip(ins, in_cl)]
    return build(builder_node(node), operands, out, ctx)


def _conv_operands(node: Node, ins: list[Any], out: Any, in_cl: Sequence[bool], out_cl: bool
                   ) -> tuple[Any, list[Any]]:
    """A convolution's bias (or None) and its epilogue's operands: the output, then each
    extra input in the output's layout (one held the other way read through a transposed
    view: the region reads strided operands)."""
    n_conv = conv_inputs(node.attrs) if node.op is OpKind.FUSED_CONV else len(ins)
    operands = [out]
    for x, cl in zip(ins[n_conv:], in_cl[n_conv:]):
        operands.append(x if cl == out_cl else cl_view(x) if out_cl else x.transpose(TO_NCHW))
    return (ins[2] if n_conv == 3 else None), operands


def _conv(lib: onednn.Dnnl, node: Node, ins: list[Any], out: Any, ctx: Any, in_cl: Sequence[bool], out_cl: bool,
          build: Any) -> list[Any]:
    from .fused import region_after

    a = node.attrs
    bias, operands = _conv_operands(node, ins, out, in_cl, out_cl)
    post = post_ops(a["program"], operands, getattr(ctx, "constant", None)) if node.op is OpKind.FUSED_CONV else ()
    args = (lib, ins[0], ins[1], bias, out, a["padding"], a["stride"], a["dilation"], a["groups"], ctx)
    if post:  # the epilogue as post-ops, where oneDNN takes them
        done = onednn_steps.conv_steps(*args, src_cl=in_cl[0], dst_cl=out_cl, post=post)
        if done is not None:
            return done
    done = onednn_steps.conv_steps(*args, src_cl=in_cl[0], dst_cl=out_cl)
    if done is None:  # oneDNN declined it after all: rlx's NCHW kernels between transposes
        return _via_nchw(node, ins, out, ctx, in_cl, out_cl, build)
    if post == ():  # a plain convolution: nothing runs after it
        return done
    return done + region_after(a["program"], operands, out, ctx, node.name)


def _native_conv(node: Node, ins: list[Any], out: Any, ctx: Any, in_cl: Sequence[bool], out_cl: bool,
                 build: Any) -> list[Any]:
    """A convolution of a native chain: the channels-inner kernel, ``x`` and ``out`` each
    in the layout the plan holds it (the kernel transposes an NCHW side itself), its
    epilogue run by the kernel over the finished outputs (a region after it where the
    interpreter cannot take the program)."""
    from .fused import program_epilogue, region_after

    a = node.attrs
    bias, operands = _conv_operands(node, ins, out, in_cl, out_cl)
    inside = None
    if node.op is OpKind.FUSED_CONV:
        inside = program_epilogue(a["program"], operands, out, ctx)
    if a["groups"] > 1:  # depthwise (``_conv_native``): NHWC on both sides, else its NCHW kernel
        done = None
        if in_cl[0] and out_cl:
            done = conv_nhwc.depthwise_steps(ins[0], ins[1], bias, out, a["padding"][:2], a["stride"], a["dilation"],
                                             ctx, inside)
    else:
        done = conv_nhwc.chain_conv_steps(ins[0], ins[1], bias, out, a["padding"][:2], a["stride"], a["dilation"],
                                          ctx, inside, not in_cl[0], not out_cl)
    if done is None:
        return _via_nchw(node, ins, out, ctx, in_cl, out_cl, build)
    if node.op is OpKind.FUSED_CONV and inside is None:
        return done + region_after(a["program"], operands, out, ctx, node.name)
    return done


def _native_pool(node: Node, ins: list[Any], out: Any, ctx: Any, in_cl: Sequence[bool], out_cl: bool,
                 build: Any) -> list[Any]:
    """A pool of a native chain: NHWC to NHWC on ``rlx_pool_nhwc``; from NHWC to NCHW the
    same into scratch and its (smaller) output transposed; from NCHW to NHWC on
    ``rlx_pool_to_nhwc`` (ResNet's stem pool, 3x3 stride 2 over 64 x 112 x 112 at batch
    8: 0.68-0.80x the time of the NCHW pool and a transpose of its output, 2-core Zen 5);
    else rlx's NCHW pool with its operands transposed (``_via_nchw``)."""
    a = node.attrs
    if not in_cl[0]:
        kind = pool_kind(node.op is OpKind.MAX_POOL2D, bool(a.get("count_include_pad")))
        step = None
        if out_cl and tuple(a.get("dilation", (1, 1))) == (1, 1):  # (float32 arrays only: the step's check)
            step = pool_to_nhwc_step(ins[0], out, a["kernel"], a["stride"], a["padding"], kind)
        return [step] if step is not None else _via_nchw(node, ins, out, ctx, in_cl, out_cl, build)
    res = out if out_cl else ctx.scratch(cl_shape(node.shape), np.float32)
    done = conv_nhwc.pool_steps(ins[0], res, node.op is OpKind.MAX_POOL2D, bool(a.get("count_include_pad")),
                                a["kernel"], a["stride"], a.get("dilation", (1, 1)), a["padding"])
    if done is None:
        return _via_nchw(node, ins, out, ctx, in_cl, out_cl, build)
    return done if out_cl else [*done, _moved(res, TO_NCHW, out)]


def _via_nchw(node: Node, ins: list[Any], out: Any, ctx: Any, in_cl: Sequence[bool], out_cl: bool,
              build: Any) -> list[Any]:
    """``node``'s NCHW kernel with its NHWC operands copied to NCHW scratch first and its
    output copied back to NHWC after."""
    first: list[Any] = []
    nchw_ins = list(ins)
    for k, (x, cl) in enumerate(zip(ins, in_cl)):
        if cl:
            tmp = ctx.scratch(tuple(x.shape[p] for p in TO_NCHW), x.dtype)
            first.append(_moved(x, TO_NCHW, tmp))
            nchw_ins[k] = tmp
    if not out_cl:
        return first + build(node, nchw_ins, out, ctx)
    res = ctx.scratch(tuple(node.shape), out.dtype)
    return first + build(node, nchw_ins, res, ctx) + [_moved(res, TO_CL, out)]


def _moved(x: Any, perm: tuple[int, ...], out: Any) -> Any:
    """``out = x.transpose(perm)``: batched matrix transposes on the native kernels (a
    plane's channels and pixels swap), else numpy's copy."""
    step = transpose_step(x, perm, out)
    return step if step is not None else Step(np.copyto, (out, x.transpose(perm)))


#: Single-thread time per element read by ``rlx_plane_reduce`` (ns; memory-bound), to
#: decide how many threads it takes.
_REDUCE_NS = 0.1
_REDUCE_KINDS = {"sum": 0, "mean": 1, "max": 2}


def reduce_planes(kind: str, x: Any, out: Any) -> list[Any] | None:
    """The mean, sum or max of each channel of NHWC ``x`` (n, h, w, c: float32, or a
    view held bf16: ``held.py``) into ``out`` (its n * c float32 values in (n, c) order):
    native.c's ``rlx_plane_reduce`` (why: see it). Without the native library, a float32
    ``x``'s mean or sum is, per image, a row of ``1 / (h * w)`` (or ones) times the
    (h * w, c) plane on the BLAS, its max numpy's; None for one held bf16 (then it is
    widened first: ``held._widened``)."""
    n, h, w, c = x.shape
    lib = native.library()
    if lib is not None and laid_out(x) and laid_out(out):
        threads = int(lib.threads_for(x.size * _REDUCE_NS, SPLIT_NS))
        args = [0, 0, n, h * w, c, _REDUCE_KINDS[kind], int(x.dtype == HELD16), threads]
        return [bound_call(lib.plane_reduce, args, (x, out), (0, 1), lambda x, out: _numpy_planes(kind, x, out))]
    if x.dtype == HELD16:
        return None
    planes = x.reshape(n, h * w, c)
    if kind == "max":
        return [Step(np.max, (planes, 1, out.reshape(n, c)))]
    row = np.full((1, h * w), 1.0 / (h * w) if kind == "mean" else 1.0, np.float32)
    row.flags.writeable = False
    return [matmul_step(row, planes, out.reshape(n, 1, c))]


def _numpy_planes(kind: str, x: np.ndarray, out: np.ndarray) -> None:
    """``reduce_planes``'s work in numpy, for a run whose arrays the kernel cannot take
    (a bf16 value widened first: its bits are a float32's top half)."""
    if x.dtype == HELD16:
        x = (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    planes = x.reshape(x.shape[0], -1, x.shape[3])
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max}[kind]
    np.copyto(out.reshape(planes.shape[0], planes.shape[2]), fn(planes, axis=1))
