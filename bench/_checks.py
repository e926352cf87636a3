"""How the suite decides that a contender computed the right thing.

Every contender's output is compared with ONNX Runtime's, within a tolerance derived
from a float64 reference that is independent of both ORT and rlx (the hand-written
numpy math of ``bench/_numpy_models.py`` run on the same weights and inputs cast to
float64)::

    scale   = max |ref64|                       (the output's magnitude)
    ort_err = max |ORT - ref64|                 (how far a good float32 runtime lands)
    tol     = K * ort_err + FLOOR * eps32 * scale
    pass   <=> max |out - ORT| <= tol

By the triangle inequality, a contender at most ``K - 1`` times as far from float64
as ORT always passes (float32 matmuls summing in different orders differ from each other
by about as much as each differs from float64). The ``eps32 * scale`` floor covers two
cases where ORT's own error is a poor yardstick: ORT happens to be almost exact (a
softmax of tiny logits), or ORT sums in short blocks while a plain kernel accumulates
one long dot product in sequence (an OpenCL or GPU matmul over K = 2048 lands about
16 eps32 * scale from float64, several times further than ORT's blocked sums); 64
leaves room for that. A wrong result (a transposed weight, a missing bias, a bad
kernel) is off by a sizeable fraction of the output scale, far beyond either term.
Before any contender is judged, ORT itself must be within ``SANITY * scale`` of the
reference; if not, the model or the reference is wrong and the suite says so instead
of deriving a meaningless tolerance from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlx_core.errors import ModelError

K = 8.0
FLOOR = 64.0
SANITY = 1e-3
EPS32 = float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class Tolerance:
    """The tolerance of one model's output, with the numbers it came from (reported)."""

    scale: float
    ort_err: float
    tol: float

    def check(self, out: np.ndarray, ort: np.ndarray) -> tuple[bool, float]:
        """``(passes, max |out - ort|)``; a shape mismatch or a NaN never passes."""
        out = np.asarray(out)
        if out.shape != ort.shape:
            return False, float("inf")
        diff = float(np.max(np.abs(out.astype(np.float64) - ort.astype(np.float64)), initial=0.0))
        return bool(diff <= self.tol), diff  # NaN <= tol is False


def derive_tolerance(model: str, ort: np.ndarray, ref64: np.ndarray) -> Tolerance:
    """The tolerance for ``model``'s output; ``ModelError`` when ORT and the float64
    reference disagree beyond float32 rounding (a wrong model or a wrong reference)."""
    if ort.shape != ref64.shape:
        raise ModelError(f"bench model {model!r}: ONNX Runtime gives shape {ort.shape}, "
                         f"the float64 reference {ref64.shape}")
    scale = max(float(np.max(np.abs(ref64), initial=0.0)), np.finfo(np.float32).tiny)
    ort_err = float(np.max(np.abs(ort.astype(np.float64) - ref64), initial=0.0))
    if not ort_err <= SANITY * scale:
        raise ModelError(f"bench model {model!r}: ONNX Runtime is {ort_err:.3g} from the float64 reference "
                         f"(output scale {scale:.3g}); the model or bench/_numpy_models.py is wrong")
    return Tolerance(scale, ort_err, K * ort_err + FLOOR * EPS32 * scale)
