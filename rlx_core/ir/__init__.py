"""The graph IR: an SSA graph of typed nodes built through one method per op.

``graph.py`` holds the graph (its state, what backends read, and the edit API passes use),
``builders.py`` the builder method of every op, ``specialize.py`` binding symbolic dims
and specializing to static shapes, ``serialize.py`` the checked JSON reader. Nothing
outside this package touches a graph's private state (a test enforces it): passes edit
graphs through ``add_node``, ``origin``, ``copy`` and ``replace_value``.
"""

from .graph import GRAPH_FORMAT, GRAPH_FORMAT_VERSION, Graph, Node, Value, ValueLike

__all__ = ["Graph", "Node", "Value", "ValueLike", "GRAPH_FORMAT", "GRAPH_FORMAT_VERSION"]
