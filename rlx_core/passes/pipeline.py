"""The compile pipeline: legalize, optimize, fuse, plan — per device.

``run_pipeline`` turns the user's graph into the graph one backend receives:

1. *legalize* — decompose each composite (and expand each internal op) the backend does
   not claim; a primitive it does not claim is the blocker.
2. *optimize* — passes that keep results equal on every backend (``optimize.py``), then
   exported attention and GELU chains as their ops where the backend claims them
   (``attention.py``, ``gelu.py``), activations moved above the reshapes and transposes
   between them and their producer (``hoist.py``), and the gemm epilogue (matmul + bias +
   activation) where the backend claims ``gemm``.
3. *fuse* — elementwise regions where the backend claims ``fused_elementwise``, then
   convolution epilogues (conv2d + the elementwise node or region after it) where it
   claims ``fused_conv``.
4. *plan* — value lifetimes and buffer reuse, handed to the backend as advice.

Every stage is switched by ``CompileOptions``; every pass leaves notes saying what it did
and why, shown by ``cg.report()`` and, with ``RLX_FUSION_REPORT=1``, on stderr at compile.
If a rewritten graph held a node the backend declines, the pipeline falls back to the
plain legalized graph (noted), so a backend never receives what it did not claim.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..ir import Graph, Node
from ..ir.ops import SOURCE_OPS
from ..options import CompileOptions
from .attention import fuse_attention
from .fuse import fuse_conv, fuse_elementwise, fuse_gemm
from .gelu import fuse_gelu
from .hoist import hoist_activations
from .legalize import DtypeGate, LegalizeResult, ask_claims, legalize
from .optimize import OPTIMIZE_PASSES
from .plan import MemoryPlan, plan_memory

__all__ = ["PASS_NAMES", "PipelineResult", "StageRecord", "run_pipeline", "fusion_report_enabled", "first_declined"]

log = logging.getLogger("rlx.passes")

Claims = Callable[[Node], "bool | str"]
#: Every pass ``CompileOptions.disable`` may name: the optimize passes, then the fusions.
PASS_NAMES: tuple[str, ...] = (*OPTIMIZE_PASSES, "attention", "gelu", "hoist", "gemm", "elementwise",
                                "conv")
FUSION_REPORT_ENV = "RLX_FUSION_REPORT"


def fusion_report_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``RLX_FUSION_REPORT``: ``1`` prints each compile's report to stderr, ``0``/unset not."""
    raw = (environ if environ is not None else os.environ).get(FUSION_REPORT_ENV, "").strip()
    if raw in ("", "0"):
        return False
    if raw == "1":
        return True
    raise ConfigError(f"{FUSION_REPORT_ENV} must be 0 or 1, got {raw!r}")


@dataclass
class StageRecord:
    """What one stage did: node counts before and after, and its notes."""

    name: str
    enabled: bool
    nodes_before: int = 0
    nodes_after: int = 0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if not self.enabled:
            return f"{self.name}: off"
        return f"{self.name}: {self.nodes_before} -> {self.nodes_after} nodes"


@dataclass
class PipelineResult:
    """The graph a backend receives, and the record of how it was made."""

    graph: Graph
    legalized: LegalizeResult
    stages: list[StageRecord] = field(default_factory=list)
    memory_plan: MemoryPlan | None = None
    #: The graph as priced for a backend that fuses by itself (``placement.priced_graph``).
    priced: Graph | None = None
    #: The params whose value a pass folded into the graph it made (the attention fusion's
    #: scalar scale or guard): ``set_param`` of one compiles again (``CompiledGraph``).
    folded_params: frozenset[str] = frozenset()

    @property
    def blocker(self) -> str | None:
        return self.legalized.blocker

    @property
    def supported(self) -> bool:
        return self.legalized.supported

    def stage(self, name: str) -> StageRecord:
        return next(s for s in self.stages if s.name == name)

    @property
    def fused(self) -> list[str]:
        """The notes of the fusions made (gemm epilogues and elementwise regions)."""
        return [n for s in self.stages for n in s.notes if n.startswith("fused ")]

    def describe(self) -> list[str]:
        """Report lines: one per stage, then its notes indented."""
        lines = []
        for s in self.stages:
            lines.append(s.describe())
            lines += [f"  {n}" for n in s.notes]
        if self.memory_plan is not None:
            lines.append(f"  plan: {self.memory_plan.describe()}")
        return lines


def _computational(g: Graph) -> int:
    return sum(1 for n in g.nodes if n.op not in SOURCE_OPS)


def first_declined(graph: Graph, claims: Claims) -> str | None:
    """The first computational node of ``graph`` that ``claims`` declines, described; None when none is."""
    for node in graph.nodes:
        if node.op in SOURCE_OPS:
            continue
        answer = ask_claims(claims, node)
        if answer is not True:
            return f"{node.op} at {node.describe()}: {answer}"
    return None


def run_pipeline(graph: Graph, claims: Claims, options: CompileOptions | None = None, *,
                 legalized: LegalizeResult | None = None, gate: DtypeGate | None = None) -> PipelineResult:
    """Compile ``graph`` for the backend whose per-node answer is ``claims``.

    ``legalized`` is ``legalize(graph, claims, gate=gate)`` when the caller already has it
    (the passes after it never modify their input graph, so it may be shared). ``gate``
    is the backend's ``DtypeGate``: a node of a dtype it does not read blocks the graph
    before ``claims`` hears of it (``None``: every dtype goes to ``claims``), and the
    passes make a node carrying an op extension only where it lists it (``None``: none).
    """
    if options is None:
        options = CompileOptions()
    off = set(options.disable)
    if options.legalize:
        legal = legalized if legalized is not None else legalize(graph, claims, gate=gate)
    else:  # a plain copy (the dtype gate still applies), then checked
        legal = _block_unclaimed(legalize(graph, lambda n: True, gate=gate), graph, claims)
    result = PipelineResult(legal.graph, legal)
    result.stages.append(StageRecord("legalize", options.legalize, _computational(graph), _computational(legal.graph),
                                     list(legal.decomposed)))
    if not legal.supported:
        return result
    current = legal.graph

    record = StageRecord("optimize", options.optimize, _computational(current))
    if options.optimize:
        for _round in range(2):  # a second round catches what the first one exposed
            before = len(current.nodes)
            for name, fn in OPTIMIZE_PASSES.items():
                if name not in off:
                    current, notes = fn(current)
                    record.notes += notes
            if len(current.nodes) == before:
                break
        if "attention" not in off:  # first: an unscaled chain's mask add would otherwise become a gemm bias
            current, notes, folded = fuse_attention(current, claims,
                                                    gate.extensions if gate is not None else frozenset())
            record.notes += notes
            result.folded_params |= folded
        if "gelu" not in off:  # before the products' fusion, which takes a gelu as an epilogue
            current, notes, folded = fuse_gelu(current, claims)
            record.notes += notes
            result.folded_params |= folded
        if "hoist" not in off:  # an activation read through layout moves, onto its producer
            current, notes = hoist_activations(current)
            record.notes += notes
        if "gemm" not in off:
            current, notes = fuse_gemm(current, claims)
            record.notes += notes
    record.nodes_after = _computational(current)
    result.stages.append(record)

    record = StageRecord("fuse", options.fuse, _computational(current))
    if options.fuse and "elementwise" not in off:
        current, notes = fuse_elementwise(current, claims, options.max_fused_ops, options.max_fused_inputs)
        record.notes += notes
    if options.fuse and "conv" not in off:  # after the regions: a region after a conv2d becomes its epilogue
        current, notes = fuse_conv(current, claims)
        record.notes += notes
    record.nodes_after = _computational(current)
    result.stages.append(record)

    refused = first_declined(current, claims)
    if refused is not None:  # a rewrite produced something the backend declines: give it the plain graph
        record.notes.append(f"reverted to the legalized graph: the backend declines {refused}")
        log.warning("pipeline: backend declines %s after optimization; using the legalized graph", refused)
        current = legal.graph
        result.folded_params = frozenset()
    result.graph = current

    record = StageRecord("plan", options.plan, _computational(current), _computational(current))
    if options.plan:
        result.memory_plan = plan_memory(current)
    result.stages.append(record)
    return result


def _block_unclaimed(legal: LegalizeResult, user: Graph, claims: Claims) -> LegalizeResult:
    """With legalization off, a composite the backend does not claim blocks like a primitive."""
    from .legalize import describe_blocker

    if not legal.supported:  # the dtype gate refused a node: claims hears nothing of this graph
        node, reason = legal.unclaimed[0]
        legal.blocker = describe_blocker(user, node, reason)
        return legal
    for node in legal.graph.nodes:
        if node.op in SOURCE_OPS:
            continue
        answer = ask_claims(claims, node)
        if answer is not True:
            legal.unclaimed.append((node, answer))  # type: ignore[arg-type]
    if legal.unclaimed and legal.blocker is None:
        node, reason = legal.unclaimed[0]
        legal.blocker = describe_blocker(user, node, f"{reason} (legalization is off)")
    return legal
