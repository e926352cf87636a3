"""Graph-to-graph passes of the compile pipeline: legalize, optimize, fuse, plan.

``run_pipeline`` runs them for one backend (see ``pipeline.py`` and ``docs/pipeline.md``);
each pass is also callable on its own.
"""

from .legalize import LegalizeResult, legalize
from .pipeline import PASS_NAMES, PipelineResult, StageRecord, fusion_report_enabled, run_pipeline
from .plan import MemoryPlan, plan_memory

__all__ = [
    "LegalizeResult",
    "MemoryPlan",
    "PASS_NAMES",
    "PipelineResult",
    "StageRecord",
    "fusion_report_enabled",
    "legalize",
    "plan_memory",
    "run_pipeline",
]
