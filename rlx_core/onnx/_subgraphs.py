"""What ONNX subgraphs (the bodies of If, Loop and Scan) read from the graphs around them.

A subgraph may use any value of an enclosing graph by name, without listing it as an
input. Sorting a graph, finding its live nodes and knowing which values are used must
therefore count those *implicit inputs* as inputs of the node that holds the subgraph.
"""

from __future__ import annotations

from collections.abc import Iterator

from onnx import AttributeProto, GraphProto, NodeProto

__all__ = ["implicit_inputs", "node_reads", "subgraphs"]


def subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    """The graphs held by ``node``'s attributes (an If's two branches, a Loop's body)."""
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def _free_names(graph: GraphProto) -> set[str]:
    """Names ``graph`` reads that it does not define (from an enclosing scope)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    free: set[str] = set()
    for node in graph.node:
        free.update(name for name in node.input if name and name not in defined)
        for inner in subgraphs(node):
            free.update(name for name in _free_names(inner) if name not in defined)
        defined.update(out for out in node.output if out)
    free.update(o.name for o in graph.output if o.name not in defined)
    return free


def implicit_inputs(node: NodeProto) -> set[str]:
    """Values of the enclosing graphs that ``node``'s subgraphs read by name."""
    names: set[str] = set()
    for graph in subgraphs(node):
        names |= _free_names(graph)
    return names


def node_reads(node: NodeProto) -> list[str]:
    """Every value ``node`` reads: its inputs, then its subgraphs' implicit inputs."""
    explicit = [name for name in node.input if name]
    return explicit + sorted(implicit_inputs(node) - set(explicit)) if len(node.attribute) else explicit
