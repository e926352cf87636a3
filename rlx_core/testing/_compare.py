"""Comparing a backend's output with the reference: the dtype-aware tolerances."""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import is_storage

#: (rtol, atol) per declared dtype before scaling; ints and bool compare exactly.
BASE_TOLERANCE: dict[str, tuple[float, float]] = {
    "float16": (1e-2, 1e-2),
    "float32": (1e-4, 1e-5),
    "float64": (1e-9, 1e-12),
}


def tolerance(dtype: str, ref: np.ndarray, terms: int = 1) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing a ``dtype`` result against the float64 ``ref``.

    ``atol`` scales with the result's magnitude and with the square root of the number
    of terms each element sums (rounding errors of a K-term sum grow like sqrt(K) on
    average), so a float32 matmul over K = 4096 is not held to the bar of an add.
    """
    rtol, atol = BASE_TOLERANCE[dtype]
    finite = np.abs(ref[np.isfinite(ref)])
    magnitude = 1.0 + (float(finite.max()) if finite.size else 0.0)
    return rtol, atol * magnitude * math.sqrt(max(terms, 1))


def mismatch(dtype: str, got: np.ndarray, ref: np.ndarray, *, terms: int = 1, exact: bool = False) -> str | None:
    """``None`` when ``got`` matches ``ref``, else a sentence naming the worst element.

    Floats compare with ``tolerance`` (NaN must meet NaN, an infinity the same infinity);
    ints and bool, the storage dtypes (a cast rounds once, the only way) and every dtype
    when ``exact``, must be equal.
    """
    exact = exact or is_storage(dtype)
    discrete = np.dtype(dtype).kind in "iub"  # every integer width (uint64 does not fit a float64) and bool
    g = np.asarray(got) if discrete else np.asarray(got).astype(np.float64)
    if discrete or exact:
        r = ref if discrete else np.asarray(ref).astype(dtype).astype(np.float64)
        bad = ~((g == r) | (np.isnan(g) & np.isnan(r)) if g.dtype.kind == "f" else (g == r))
        if not bad.any():
            return None
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{int(bad.sum())} of {bad.size} elements differ (exact comparison); first at {at}: "
                f"got {g[at].item()!r}, expected {r[at].item()!r}")
    rtol, atol = tolerance(dtype, ref, terms)
    with np.errstate(invalid="ignore"):
        err = np.abs(g - ref)
        same_special = (np.isnan(g) & np.isnan(ref)) | (np.isinf(ref) & (g == ref))
        bad = ~same_special & ~(err <= atol + rtol * np.abs(ref))
    if not bad.any():
        return None
    worst = np.where(bad, np.nan_to_num(err, nan=np.inf), -1.0)
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(worst)), worst.shape))
    max_err = float(np.max(np.nan_to_num(err[bad], nan=math.inf)))
    return (f"{int(bad.sum())} of {bad.size} elements out of tolerance (rtol={rtol:.3g}, atol={atol:.3g}); "
            f"max error {max_err:.6g} at {at}: got {g[at].item()!r}, expected {ref[at].item()!r}")
