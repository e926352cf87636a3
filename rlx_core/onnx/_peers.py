"""What ``rlx bench`` times: rlx devices and peers, interleaved so that they share the machine's noise.

A contender is a name and a zero-argument callable that runs the model once, or a
callable that times a block of runs elsewhere (``rlx bench`` keeps each contender in a
child process, ``rlx_core.cli.bench_worker``, so that a kernel's crash costs one row). Peers are
onnxruntime (for ``.onnx`` files, when it is installed) and plain numpy: the reference
interpreter, float64 inside, cast to float32, labelled as such. Timing interleaves the
contenders in blocks and pauses between blocks, because OpenBLAS and onnxruntime worker
threads keep spinning for a while after a call: on a machine with few cores, one
contender's spinning threads would otherwise slow the next one down.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError, RlxError
from ..timer import Entry, EntryFailed, interleave

__all__ = ["Contender", "ContenderFailed", "numpy_peer", "onnxruntime_peer", "rlx_contender", "time_interleaved"]


#: Raised by a contender's ``block`` to stop it; the message is its note as is.
ContenderFailed = EntryFailed


@dataclass
class Contender(Entry):
    """One row of the benchmark: a ``timer.Entry`` (``run()`` computes the model's outputs
    once, or ``block(n)`` times ``n`` runs elsewhere, already warmed up there; neither: the
    row only says why, ``note``), with its kind and compile time."""

    kind: str = "rlx"  # "rlx" or "peer"
    compile_seconds: float | None = None


def onnxruntime_peer(model: Path | bytes, feeds: Mapping[str, np.ndarray]) -> Contender:
    """onnxruntime's CPU provider on the same model and inputs (a row saying why not when unusable)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return Contender("onnxruntime", kind="peer", note="not installed (pip install onnxruntime)")
    t0 = time.perf_counter()
    try:
        source = str(model) if isinstance(model, Path) else model
        session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own exception types for models it refuses
        return Contender("onnxruntime", kind="peer", note=f"cannot load the model: {str(exc).splitlines()[0]}")
    seconds = time.perf_counter() - t0
    names = [i.name for i in session.get_inputs()]
    ort_feeds = {k: np.asarray(v) for k, v in feeds.items() if k in names}
    version = getattr(ort, "__version__", "")
    return Contender("onnxruntime", run=lambda: session.run(None, ort_feeds), kind="peer", compile_seconds=seconds,
                     note=f"{version} CPU".strip())


def rlx_contender(graph: Any, device: str, feeds: Mapping[str, np.ndarray], note: str = "") -> Contender:
    """rlx on ``device``, compiled here and its compile time measured (a row saying why not
    when it does not compile)."""
    from ..run.session import compile as rlx_compile

    name = f"rlx {device}"
    try:
        t0 = time.perf_counter()
        cg = rlx_compile(graph, device=device)
        seconds = time.perf_counter() - t0
    except RlxError as exc:
        return Contender(name, kind="rlx", note=f"failed: {exc}")
    return Contender(name, run=lambda: cg.run(feeds), kind="rlx", compile_seconds=seconds, note=note)


def numpy_peer(graph: Any, feeds: Mapping[str, np.ndarray]) -> Contender:
    """Plain numpy: ``rlx_core.reference.evaluate`` (float64 inside), outputs cast to float32."""
    from .. import reference

    def run() -> list[np.ndarray]:
        return [o.astype(np.float32) if o.dtype.kind == "f" else o for o in reference.evaluate(graph, feeds)]

    return Contender("numpy", run=run, kind="peer", note="reference, f64→f32")


def time_interleaved(contenders: list[Contender], runs: int, pause: float = 0.15,
                     on_block: Callable[[], None] | None = None) -> None:
    """Time each runnable contender for ``runs`` calls in up to 5 interleaved blocks
    (``timer.interleave``: one untimed call first, then the blocks round the contenders
    in a shuffled order, ``pause`` seconds apart). A contender that raises is stopped and
    its note says why."""
    if runs < 1:
        raise ModelError(f"bench: runs must be >= 1, got {runs}")
    blocks = min(5, runs)
    per_block = [runs // blocks + (1 if i < runs % blocks else 0) for i in range(blocks)]
    interleave(contenders, blocks, lambda c, r: per_block[r], pause=pause,
               on_round=None if on_block is None else lambda r: on_block())
