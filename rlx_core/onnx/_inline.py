"""An ``If`` whose condition is known replaced by its branch's nodes, in the ONNX graph.

The ``If`` converter (``_ops_control``) converts the branch its condition picks straight
into rlx ops, which covers every branch made of ops rlx converts. A branch may also hold
an op that runs on the host (torchvision's detectors export ``NonMaxSuppression`` inside
``If(boxes.numel() == 0)``'s else branch): those run only between compiled parts of a
top-level graph (``_staged``). So before a model (or a part of it built at run time, where
the condition is a value read from the data) is cut into parts, each top-level ``If``
whose condition is a constant is spliced in as its branch's nodes: names the branch
defines get a prefix (``<If output>::then::``), each If output becomes an ``Identity`` of
the branch output. A branch whose nested subgraphs read what the branch defines is left
to the converter.
"""

from __future__ import annotations

import numpy as np
from onnx import GraphProto, NodeProto, TensorProto, helper, numpy_helper

from ..errors import ModelError
from ._context import CONVERTERS
from ._host_ops import HOST_OPS
from ._loader import Model
from ._subgraphs import implicit_inputs, subgraphs
from ._versions import check_versions

__all__ = ["inline_known_ifs", "splice_if", "constant_value"]


def constant_value(node: NodeProto) -> np.ndarray | None:
    """A ``Constant`` node's value, for the kinds a weight can hold (not strings, not sparse)."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    value = helper.get_attribute_value(attr)
    if attr.name == "value":
        arr = numpy_helper.to_array(value)
        return None if arr.dtype.kind in "OSU" else arr
    kinds = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}
    return np.array(value, dtype=kinds[attr.name]) if attr.name in kinds else None


def inline_known_ifs(model: Model) -> Model:
    """``model`` with each top-level ``If`` of known condition replaced by its branch (the
    model itself when there is none)."""
    gp = model.gp
    ifs = [n for n in gp.node if n.op_type == "If" and n.domain in ("", "ai.onnx") and n.input]
    if not ifs:
        return model
    known = _known(model, {n.input[0] for n in ifs})
    nodes: list[NodeProto] = []
    added: list[TensorProto] = []
    changed = False
    for node in gp.node:
        cond = known.get(node.input[0]) if node in ifs else None
        spliced = _splice(node, cond, model.opset) if cond is not None and cond.size == 1 else None
        if spliced is None:
            nodes.append(node)
            continue
        branch_nodes, initializers = spliced
        nodes.extend(branch_nodes)
        added.extend(initializers)
        changed = True
    if not changed:
        return model
    new = GraphProto()
    new.CopyFrom(gp)
    del new.node[:]
    new.node.extend(nodes)
    new.initializer.extend(added)
    return inline_known_ifs(model.with_graph(new))  # a branch may hold an If of known condition too


def splice_if(model: Model, tensor: str, taken: bool) -> Model | None:
    """``model`` with the top-level If making ``tensor`` replaced by its ``taken`` branch
    (None when no top-level If makes it, or its branch cannot be spliced)."""
    for index, node in enumerate(model.gp.node):
        if node.op_type == "If" and tensor in node.output:
            spliced = _splice(node, np.array(taken), model.opset)
            if spliced is None:
                return None
            new = GraphProto()
            new.CopyFrom(model.gp)
            del new.node[:]
            new.node.extend([*model.gp.node[:index], *spliced[0], *model.gp.node[index + 1:]])
            new.initializer.extend(spliced[1])
            return model.with_graph(new)
    return None


def _known(model: Model, names: set[str]) -> dict[str, np.ndarray]:
    """The values of ``names`` known before the model runs: bound inputs, weights read,
    initializers, top-level ``Constant`` nodes."""
    known = {n: np.asarray(model.values[n]) for n in names if n in model.values}
    known.update({n: np.asarray(model.params[n]) for n in names if n in model.params})
    for t in model.gp.initializer:
        if t.name in names and t.name not in known and len(t.dims) <= 1 and not t.external_data:
            known[t.name] = numpy_helper.to_array(t)
    for node in model.gp.node:
        if node.op_type == "Constant" and node.output and node.output[0] in names:
            value = constant_value(node)
            if value is not None:
                known[node.output[0]] = value
    return known


def _readable(branch: GraphProto, opset: int) -> bool:
    """Whether every node of ``branch`` is one ``load`` reads, at a version it reads."""
    if any(n.domain not in ("", "ai.onnx") or (n.op_type not in CONVERTERS and n.op_type not in HOST_OPS)
           for n in branch.node):
        return False
    try:
        check_versions(branch.node, opset, "")
    except ModelError:
        return False
    return True


def _splice(node: NodeProto, cond: np.ndarray, opset: int) -> tuple[list[NodeProto], list[TensorProto]] | None:
    """The nodes (and initializers) replacing ``node``, an If whose condition is ``cond``;
    None when its branch cannot be spliced (its nested subgraphs read what it defines)."""
    taken = bool(cond.reshape(-1)[0])
    attr = "then_branch" if taken else "else_branch"
    branch = next((a.g for a in node.attribute if a.name == attr), None)
    if branch is None or len(branch.output) != len(node.output):
        return None
    if not _readable(branch, opset):  # the converter names what it cannot read, with the branch
        return None
    defined = {t.name for t in branch.initializer} | {o for n in branch.node for o in n.output if o}
    if any(implicit_inputs(n) & defined for n in branch.node if any(True for _ in subgraphs(n))):
        return None
    prefix = f"{node.output[0]}::{attr.split('_')[0]}::"

    def name(value: str) -> str:
        return prefix + value if value in defined else value

    nodes = []
    for inner in branch.node:
        copy = NodeProto()
        copy.CopyFrom(inner)
        copy.input[:] = [name(v) if v else v for v in inner.input]
        copy.output[:] = [name(v) if v else v for v in inner.output]
        copy.name = prefix + inner.name if inner.name else ""
        nodes.append(copy)
    initializers = []
    for t in branch.initializer:
        renamed = TensorProto()
        renamed.CopyFrom(t)
        renamed.name = name(t.name)
        initializers.append(renamed)
    for out, inner in zip(node.output, branch.output):
        if out:
            nodes.append(helper.make_node("Identity", [name(inner.name)], [out], name=f"{prefix}{out}"))
    return nodes, initializers
