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

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler.timing import per_call
from ..errors import ModelError, RlxError

__all__ = ["Contender", "ContenderFailed", "numpy_peer", "onnxruntime_peer", "rlx_contender", "time_interleaved"]


class ContenderFailed(Exception):
    """Raised by a contender's ``block`` to stop it; the message is its note as is
    (``died with SIGSEGV (Segmentation fault) while timing``)."""


@dataclass
class Contender:
    """One row of the benchmark: ``run()`` computes the model's outputs once, or, for a
    contender timed elsewhere (already warmed up there), ``block(n)`` runs it ``n`` times
    and returns the seconds per run. Neither: the row only says why (``note``)."""

    name: str
    kind: str  # "rlx" or "peer"
    run: Callable[[], Any] | None
    compile_seconds: float | None = None
    note: str = ""
    times: list[float] = field(default_factory=list)  # seconds per run, one entry per block
    block: Callable[[int], float] | None = None

    @property
    def runnable(self) -> bool:
        return self.run is not None or self.block is not None

    def stop(self, note: str) -> None:
        self.note, self.run, self.block = note, None, None

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def best(self) -> float | None:
        return min(self.times) if self.times else None


def onnxruntime_peer(model: Path | bytes, feeds: Mapping[str, np.ndarray]) -> Contender:
    """onnxruntime's CPU provider on the same model and inputs (a row saying why not when unusable)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return Contender("onnxruntime", "peer", None, note="not installed (pip install onnxruntime)")
    t0 = time.perf_counter()
    try:
        source = str(model) if isinstance(model, Path) else model
        session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own exception types for models it refuses
        return Contender("onnxruntime", "peer", None, note=f"cannot load the model: {str(exc).splitlines()[0]}")
    seconds = time.perf_counter() - t0
    names = [i.name for i in session.get_inputs()]
    ort_feeds = {k: np.asarray(v) for k, v in feeds.items() if k in names}
    version = getattr(ort, "__version__", "")
    return Contender("onnxruntime", "peer", lambda: session.run(None, ort_feeds), compile_seconds=seconds,
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
        return Contender(name, "rlx", None, note=f"failed: {exc}")
    return Contender(name, "rlx", lambda: cg.run(feeds), seconds, note)


def numpy_peer(graph: Any, feeds: Mapping[str, np.ndarray]) -> Contender:
    """Plain numpy: ``rlx_core.reference.evaluate`` (float64 inside), outputs cast to float32."""
    from .. import reference

    def run() -> list[np.ndarray]:
        return [o.astype(np.float32) if o.dtype.kind == "f" else o for o in reference.evaluate(graph, feeds)]

    return Contender("numpy", "peer", run, note="reference, f64→f32")


def time_interleaved(contenders: list[Contender], runs: int, pause: float = 0.15,
                     on_block: Callable[[], None] | None = None) -> None:
    """Time each runnable contender for ``runs`` calls, in up to 5 interleaved blocks.

    Each contender with ``run`` runs once untimed first (warm-up, lazy compilation); one
    with ``block`` was warmed up where it runs. Then the blocks go round the contenders in
    turn, ``pause`` seconds apart; each block's seconds per call is appended to ``times``.
    A contender that raises is stopped and its note says why.
    """
    if runs < 1:
        raise ModelError(f"bench: runs must be >= 1, got {runs}")
    live = [c for c in contenders if c.runnable]
    for c in list(live):
        if c.run is None:
            continue
        try:
            c.run()
        except Exception as exc:
            c.stop(f"failed: {type(exc).__name__}: {exc}")
            live.remove(c)
    blocks = min(5, runs)
    per_block = [runs // blocks + (1 if i < runs % blocks else 0) for i in range(blocks)]
    for n in per_block:
        for c in list(live):
            time.sleep(pause)
            try:
                c.times.append(_time_block(c, n))
            except ContenderFailed as exc:
                c.stop(str(exc))
                live.remove(c)
            except Exception as exc:
                c.stop(f"failed: {type(exc).__name__}: {exc}")
                live.remove(c)
        if on_block is not None:
            on_block()


def _time_block(c: Contender, n: int) -> float:
    """Seconds per run over ``n`` runs: timed elsewhere (``block``) or here (``run``)."""
    if c.block is not None:
        return c.block(n)
    assert c.run is not None
    return per_call(c.run, n)
