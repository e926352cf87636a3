"""``CompileOptions``: what the core passes to ``Backend.compile`` besides the graph, and
what users pass to ``rlx.compile`` to steer the compile pipeline.

A module of its own (re-exported by ``rlx_core.plugin``, the contract) so that the
passes and calibration, which take options, need not import the plugin contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

__all__ = ["CompileOptions", "PASS_NAMES", "PRECISIONS", "precision_name"]

#: Every pass ``CompileOptions.disable`` may name (``passes/pipeline.py`` runs them; a test
#: keeps the two lists equal). Here, with the options, so that checking an option needs
#: no import of the passes.
PASS_NAMES: tuple[str, ...] = ("fold", "simplify", "cse", "dce", "sink_relu", "conv_taps", "conv_scale",
                                "image_transposes", "attention", "gelu", "hoist", "gemm", "elementwise", "conv")

#: The precisions ``CompileOptions.precision`` names: ``fp32`` (the default: float32 values
#: computed in float32), and the reduced formats a backend may compute float32 products in
#: when the user allows it (``bf16``: bfloat16, ``fp16``: IEEE half), and hold values
#: between its steps in (``docs/precision.md``). A permission, as
#: torch's ``set_float32_matmul_precision`` and oneDNN's fpmath mode are: a backend that
#: does not declare the format here (``Backend.precisions``) computes in float32, and the
#: report says which happened.
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
_PRECISION_ALIASES = {"fp32": "fp32", "float32": "fp32", "f32": "fp32", "bf16": "bf16", "bfloat16": "bf16",
                      "fp16": "fp16", "float16": "fp16", "f16": "fp16", "half": "fp16"}


def precision_name(value: object, what: str = "precision") -> str:
    """``value`` as one of ``PRECISIONS`` (the dtype spellings ``float32``, ``bfloat16``,
    ``float16`` are taken too), or ``ConfigError`` naming ``what`` and the known ones."""
    name = _PRECISION_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None
    if name is None:
        raise ConfigError(f"{what} must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return name


@dataclass(frozen=True)
class CompileOptions:
    """What the core passes to ``Backend.compile`` besides the graph.

    ``device`` is the full device string (``"cuda:1"``) and ``device_index`` its index or
    ``None`` for the backend's default device. ``extra`` carries backend-specific options
    by name, so that adding one never changes this contract.

    Users pass one to ``rlx.compile(g, options=...)`` to steer the compile pipeline
    (``docs/pipeline.md``); the core fills in ``device`` and ``device_index``. ``legalize``,
    ``optimize``, ``fuse`` and ``plan`` switch the stages; ``disable`` names single passes
    to skip (``fold``, ``simplify``, ``cse``, ``dce``, ``gemm``, ``elementwise``);
    ``max_fused_ops`` and ``max_fused_inputs`` bound an elementwise region. The plan
    stage's advice reaches the backend as ``memory_plan`` (a ``passes.MemoryPlan``).
    """

    device: str = ""
    device_index: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    legalize: bool = True
    optimize: bool = True
    fuse: bool = True
    plan: bool = True
    disable: tuple[str, ...] = ()
    max_fused_ops: int = 32
    max_fused_inputs: int = 8
    precision: str = "fp32"
    memory_plan: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        """``ConfigError`` naming the field that is malformed."""
        for name in ("legalize", "optimize", "fuse", "plan"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"CompileOptions.{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("max_fused_ops", "max_fused_inputs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"CompileOptions.{name} must be an int >= 1, got {v!r}")
        disable = self.disable
        if isinstance(disable, str) or not all(isinstance(p, str) for p in disable):
            raise ConfigError(f"CompileOptions.disable must be a sequence of pass names, got {disable!r}")
        object.__setattr__(self, "precision", precision_name(self.precision, "CompileOptions.precision"))
        unknown = sorted(set(disable) - set(PASS_NAMES))
        if unknown:
            raise ConfigError(f"CompileOptions.disable: unknown pass(es) {unknown}; known: {', '.join(PASS_NAMES)}")
