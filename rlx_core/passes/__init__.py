"""Graph-to-graph passes of the compile pipeline (legalize today; optimize, fuse and plan grow here)."""

from .legalize import LegalizeResult, legalize

__all__ = ["LegalizeResult", "legalize"]
