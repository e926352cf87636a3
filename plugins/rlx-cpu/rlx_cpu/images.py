"""Image by image: runs of per-image layers at batch > 1 scheduled a few images at a time.

Why: a plan runs node after node over the whole batch. Where a layer's values are large
(a mobile net's few-channel layers over 112x112 and 56x56 planes), each node writes the
whole batch's output before the next reads it: at batch 4, MobileNetV3's expansion writes
12.8 MB that its depthwise convolution then reads back from memory, and the layers run at
the speed of memory. The same layers run image by image keep each image's values in cache
from the node that writes them to the one that reads them: MobileNetV3-Large's layers
over 112x112 and 56x56 (its stem and first three blocks) took 2.45-3.49 ms at batch 4
against 1.78-2.36 ms as four batch-1 runs (no extras, the 2-core Zen 5; BENCHMARKS.md,
session 46). ORT's own plan gains less that way (1.44-1.72 against 1.32-1.56).

So ``segments`` finds runs of consecutive nodes that compute each image from that image
alone (convolutions with resident weights, pools, elementwise ops whose operands are per
image or broadcast, concatenations along another axis than the batch's) whose outputs
are large per image, and binding (``binding.PlanBinding``) builds each node of a run
once per chunk of images (as many as keep the run's widest node within ``BUDGET_BYTES``:
one image for MobileNet's 112x112 layers) over that chunk's slice, and orders the steps
chunk-major: every node of the run for the first chunk, then for the next, and so on (a
value held channels-last, ``layout.py``, is sliced the same way: NHWC keeps the batch
first). A value read only inside its run lives in a buffer of one chunk, reused by every
chunk (its lines stay in cache, and the plan needs less memory), taken and given back in
node order like the plan's own; a value read after the run gets its whole-batch buffer,
given back only after the whole run (a later node's first chunk must not take memory an
earlier node's second chunk still writes). A run does not start at a node shrinking its
input (a stem's pool): that input would stay alive through the run.

Small layers stay batched: over 28x28 and smaller planes a whole batch's values fit in
cache anyway, and a product over the batch reuses its weights across images.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from rlx_core.ir import Node
from rlx_core.ir.ops import ELEMENTWISE_OPS, OpKind
from rlx_core.plugin import conv_inputs

from .settings import PER_IMAGE

__all__ = ["BUDGET_BYTES", "LARGE_BYTES", "LARGE_PLANE", "LIGHT_MACS", "Segment", "segments", "per_image_node"]

#: A node is large when one image's output takes at least this many bytes over a plane of
#: at least ``LARGE_PLANE`` pixels: MobileNetV3's 16 x 112 x 112 (784 KiB) and 24 x 56 x 56
#: (294 KiB) layers are, its 40 x 28 x 28 (122 KiB) ones and EfficientNet's 672 x 14 x 14
#: (527 KiB, whose 1x1 convolutions' weights are as large as their inputs) are not. A run
#: starts and ends at large nodes and holds at least two.
LARGE_BYTES = 256 << 10
LARGE_PLANE = 56 * 56
#: Products an output of a convolution that makes it a large node: EfficientNetV2's 3x3
#: convolutions over 24 channels at 112x112 (216) are bound by their products, and run
#: image by image they ran 1-3% slower with the onednn extra; MobileNets' pointwise
#: convolutions over 16-64 channels and depthwise ones (9, 25) are bound by memory.
LIGHT_MACS = 64
#: A run takes as many images at a time as keep its largest node's input and output
#: within this many bytes (about the two cores' L2): each chunk of images is a call per
#: node, and on small planes one image a call paid more in calls than it saved
#: (MobileNetV3-Small at batch 8).
BUDGET_BYTES = 2 << 20

_CONVS = (OpKind.CONV2D, OpKind.FUSED_CONV)
_POOLS = (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D, OpKind.GLOBAL_AVG_POOL2D)


class Segment(NamedTuple):
    """A run bound image by image: its nodes' ids in order, and how many images a call."""

    nodes: tuple[int, ...]
    chunk: int


def per_image_node(node: Node, images: int = 1) -> Node:
    """``node`` as its builder sees it over ``images`` images: the same op, the batch axis ``images``."""
    return dataclasses.replace(node, shape=(images, *node.shape[1:]))


def _per_image(node: Node, nodes: Sequence[Node], resident: Sequence[bool]) -> bool:
    """Whether ``node`` computes each image of its output from that image of its inputs
    alone, with the batch on axis 0 of its output and of every per-image operand."""
    if not node.shape or not isinstance(node.shape[0], int) or node.shape[0] < 2:
        return False
    batch, rank = node.shape[0], len(node.shape)
    if node.op in _CONVS:
        n_conv = conv_inputs(node.attrs) if node.op is OpKind.FUSED_CONV else len(node.inputs)
        if n_conv < 2 or not all(resident[i] for i in node.inputs[1:n_conv]):
            return False  # weights computed per run: not a layer of this kind
        operands = (node.inputs[0], *node.inputs[n_conv:])  # the input, then an epilogue's operands
    elif node.op in _POOLS or node.op in ELEMENTWISE_OPS or node.op is OpKind.FUSED_ELEMENTWISE:
        operands = node.inputs
    elif node.op is OpKind.CONCAT and node.attrs.get("axis", 0) % rank != 0:
        operands = node.inputs  # joined along another axis than the batch's (DenseNet's channels)
    else:
        return False
    for i in operands:
        shape = nodes[i].shape
        if len(shape) < rank or shape[0] == 1:
            continue  # broadcast over the batch: read whole by every image
        if len(shape) == rank and shape[0] == batch and not resident[i]:
            continue  # sliced by image (a constant with a batch axis is not: binding reads constants whole)
        return False
    return True


def segments(nodes: Sequence[Node], resident: Sequence[bool], eligible: Sequence[bool]) -> list[Segment]:
    """The runs to schedule image by image.

    ``resident[i]``: value ``i`` is a constant of the executable (never a step);
    ``eligible[i]``: node ``i`` may run over an image's slice (the executable leaves
    out what binding treats specially: reduced-precision values, transposes made views,
    concat blocks, values handed to the caller). A run is broken by any other node that
    makes steps; constants between are skipped. Off where ``RLX_CPU_PER_IMAGE=off``."""
    if not PER_IMAGE.read():
        return []
    found: list[Segment] = []
    run: list[int] = []

    def close() -> None:
        large = [k for k, nid in enumerate(run) if _large(nodes[nid], nodes)]
        # A run's whole-batch inputs stay alive until its last chunk: one that starts at a
        # node shrinking its input (a stem's max pool over 64 x 112 x 112) would hold that
        # input beside the run's own output (DenseNet-121 b8: 87.4 MiB against 58.2).
        while large and _shrinks(nodes[run[large[0]]], nodes, resident):
            large.pop(0)
        if len(large) >= 2:
            ids = tuple(run[large[0] : large[-1] + 1])
            widest = max(_bytes(nodes[nid]) + sum(_bytes(nodes[i]) for i in nodes[nid].inputs if not resident[i])
                         for nid in ids)
            chunk = max(1, BUDGET_BYTES // max(widest, 1))
            if chunk < nodes[ids[0]].shape[0]:
                found.append(Segment(ids, chunk))
        run.clear()

    for node in nodes:
        if resident[node.id] or node.op is OpKind.INPUT:
            continue
        if eligible[node.id] and _per_image(node, nodes, resident):
            if run and nodes[run[0]].shape[0] != node.shape[0]:
                close()
            run.append(node.id)
        else:
            close()
    close()
    return found


def _bytes(node: Node) -> int:
    """One image's bytes of ``node``'s value (the whole value where it is broadcast over the batch)."""
    return int(np.prod(node.shape[1:], dtype=np.int64)) * np.dtype(node.dtype).itemsize


def _shrinks(node: Node, nodes: Sequence[Node], resident: Sequence[bool]) -> bool:
    """Whether ``node`` reads more than twice the bytes it writes (a pool or strided
    convolution over a larger plane)."""
    return sum(_bytes(nodes[i]) for i in node.inputs if not resident[i]) > 2 * _bytes(node)


def _large(node: Node, nodes: Sequence[Node]) -> bool:
    """Whether ``node`` is worth a run: large per image, over a large plane, and bound by
    memory rather than by its products (a convolution of at most ``LIGHT_MACS`` products an
    output: pointwise ones over few channels, depthwise ones)."""
    if _bytes(node) < LARGE_BYTES or len(node.shape) != 4 or node.shape[2] * node.shape[3] < LARGE_PLANE:
        return False
    if node.op in _CONVS:
        w = nodes[node.inputs[1]].shape
        return int(np.prod(w[1:])) <= LIGHT_MACS
    return True
