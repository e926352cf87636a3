"""Bundled example graphs, stored beside this module as ``NAME.json`` (``rlx run --example NAME``).

``mlp`` is also the *representative* graph: without a graph of the user's,
``recommended`` marks the highest-priority usable device (the contract), and
``placement.example_pick`` says where the policy and the cost ranking put this graph —
what ``rlx run --example mlp`` runs on, which ``rlx devices`` prints under its table so
that a new user's first run does not contradict it unexplained. A small dense model is
what "the device for a typical graph" can honestly mean; a user whose graphs look
otherwise passes ``--graph``.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from typing import TYPE_CHECKING

from ..errors import ModelError

if TYPE_CHECKING:
    from ..ir import Graph

__all__ = ["EXAMPLES", "REPRESENTATIVE", "example_text", "example_graph", "representative_graph"]

#: Every bundled example's name.
EXAMPLES: tuple[str, ...] = ("mlp",)
#: The example the no-graph recommendation is priced on.
REPRESENTATIVE = "mlp"


def example_text(name: str) -> str:
    """The JSON text of example ``name``; ``ModelError`` listing the examples if unknown."""
    if name not in EXAMPLES:
        raise ModelError(f"unknown example {name!r}; bundled examples: {', '.join(EXAMPLES)}")
    return files(__package__).joinpath(f"{name}.json").read_text(encoding="utf-8")


def example_graph(name: str) -> Graph:
    """A fresh, unfrozen copy of example ``name`` (the caller may compile or extend it)."""
    from ..ir import Graph

    return Graph.from_json(example_text(name))


@functools.lru_cache(maxsize=1)
def representative_graph() -> Graph:
    """The representative graph, frozen and shared: every question about it reuses one
    legalization and one pipeline per backend (placement caches them per graph)."""
    return example_graph(REPRESENTATIVE).freeze()
