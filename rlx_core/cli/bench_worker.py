"""A contender of ``rlx bench`` living in a child process, so that a crash costs one row.

``rlx bench`` times the model on every device and, with ``--peers``, in onnxruntime and
plain numpy: the places where a broken kernel or a peer's abort shows (PoCL's matmul
segfaulting on AMD hosts, onnxruntime aborting on a model it dislikes). Each contender
therefore lives in its own worker, ``python -m rlx_core.cli.bench_worker`` (a fresh
interpreter, as in ``rlx_core.backends.isolation``: never ``fork``, never ``multiprocessing``), and
one that dies becomes a row ``died with SIGSEGV (Segmentation fault) while compiling``
while the others are timed as usual.

The parent writes the model where a child can read it (the user's file as given, or the
graph's JSON) and the inputs as an ``.npz``. A worker reads one JSON request line on stdin
(the contender, the model, its dims, the inputs), loads the model, builds the contender
with the same functions as the in-process path (``rlx_core.onnx._peers``), runs it once,
and answers ``ready`` (its compile and warm-up seconds, its note) or ``error`` (the row's
note). Then each ``{"n": N}`` line asks for a block of N runs, timed with
``time.perf_counter`` inside the child and answered ``timed`` (seconds per run). Answers
are JSON lines on a private copy of stdout (``step`` lines say what it is doing, for the
note of a death); its stderr is kept out of the terminal and logged (``rlx.bench``). A
worker that does not answer in time is killed; one whose stdin closes leaves at once.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ..backends.isolation import ChildChannel, describe_exit, finish_child, start_child
from ..onnx._peers import Contender, ContenderFailed
from ..timer import per_call

if TYPE_CHECKING:
    from ..ir import Graph

__all__ = ["BenchWorker", "WorkerPool", "READY_SECONDS", "BLOCK_SECONDS", "BLOCK_FACTOR"]

#: What a worker may spend starting, loading the model, compiling and warming up.
READY_SECONDS = 600.0
#: The least time a block of timed runs is allowed before its worker is killed ...
BLOCK_SECONDS = 60.0
#: ... and more for a slow model: this many times the warm-up run, per run of the block.
BLOCK_FACTOR = 20.0
_STDERR_LINES = 40
log = logging.getLogger("rlx.bench")


class WorkerPool:
    """The workers of one benchmark, started one at a time (their compilations never
    overlap), and the files they read. ``close`` (or leaving the ``with`` block) closes
    every worker, kills those that do not leave, reaps them and removes the files.

    ``source`` is the file the graph was loaded from (a graph ``.json``, or an ``.onnx``
    model with ``dims`` bound), handed to the workers as is; ``None`` writes the graph's
    JSON for them (a bundled example).
    """

    def __init__(self, graph: Graph, feeds: Mapping[str, np.ndarray], source: Path | None = None,
                 dims: Mapping[str, int] | None = None, *, environ: Mapping[str, str] = os.environ,
                 ready_timeout: float = READY_SECONDS, block_timeout: float = BLOCK_SECONDS) -> None:
        self._dir = tempfile.mkdtemp(prefix="rlx-bench-")
        try:
            if source is None:
                model = os.path.join(self._dir, "graph.json")
                graph.save(model)
            else:
                model = str(Path(source).resolve())
            inputs = os.path.join(self._dir, "inputs.npz")
            np.savez(inputs, *feeds.values())  # by position: a feed may be called "file"
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._request = {"model": model, "dims": dict(dims or {}), "inputs": inputs, "input_names": list(feeds)}
        self._environ = environ
        self._ready_timeout, self._block_timeout = ready_timeout, block_timeout
        self.workers: list[BenchWorker] = []

    def rlx(self, device: str, note: str = "") -> Contender:
        """rlx compiled on ``device`` in a worker (``note`` unless the worker has its own)."""
        return self.start(f"rlx {device}", "rlx", {"contender": "rlx", "device": device}, note)

    def onnxruntime(self) -> Contender:
        """onnxruntime's CPU provider on the ``.onnx`` source, in a worker."""
        return self.start("onnxruntime", "peer", {"contender": "onnxruntime"})

    def numpy(self) -> Contender:
        """The reference interpreter, outputs cast to float32, in a worker."""
        return self.start("numpy", "peer", {"contender": "numpy"})

    def start(self, name: str, kind: str, spec: Mapping[str, Any], note: str = "") -> Contender:
        """A worker for the contender ``spec``, compiled and warmed up: its row, which times
        its blocks there (``Contender.block``), or says why it cannot run."""
        worker = BenchWorker(name, {**self._request, "contender": dict(spec)}, environ=self._environ,
                             block_timeout=self._block_timeout)
        self.workers.append(worker)
        return worker.start(kind, note, timeout=self._ready_timeout)

    def close(self, kill: bool = False) -> None:
        try:
            for worker in self.workers:
                worker.close(kill=kill)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(kill=exc_type is not None)


class BenchWorker:
    """The parent's side of one worker: ``start`` it, time ``block``s, ``close`` it."""

    def __init__(self, name: str, request: Mapping[str, Any], *, environ: Mapping[str, str] = os.environ,
                 block_timeout: float = BLOCK_SECONDS) -> None:
        self.name = name
        self._request = dict(request)
        self._environ = environ
        self._block_timeout = block_timeout
        self._warmup = 0.0
        self._step = "starting"
        self._proc: subprocess.Popen[str] | None = None
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._readers: list[threading.Thread] = []
        self._reaped = False
        self.died = ""  # why it ended before it was closed, if it did

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, kind: str, note: str = "", timeout: float = READY_SECONDS) -> Contender:
        """Start the child and wait until it has compiled and warmed up (at most ``timeout`` s)."""
        try:
            self._proc, self._readers = start_child("rlx_core.cli.bench_worker", self._environ, self._messages,
                                                    self._stderr)
        except OSError as exc:
            return Contender(self.name, kind=kind, note=f"could not be started ({type(exc).__name__}: {exc})")
        try:
            self._send(self._request)
            ready = self._answer("ready", timeout)
        except ContenderFailed as exc:
            return Contender(self.name, kind=kind, note=str(exc))
        self._warmup = float(ready.get("warmup_seconds") or 0.0)
        seconds = ready.get("compile_seconds")
        return Contender(self.name, block=self.block, note=str(ready.get("note") or note), kind=kind,
                         compile_seconds=None if seconds is None else float(seconds))

    def block(self, n: int) -> float:
        """Seconds per run over ``n`` runs timed in the child; ``ContenderFailed`` saying why
        when it fails there, dies, or takes longer than its deadline (then it is killed)."""
        if self._reaped:
            raise ContenderFailed(self.died or "its worker was closed")
        timeout = max(self._block_timeout, BLOCK_FACTOR * n * self._warmup)
        self._step = "timing"
        self._send({"n": n})
        return float(self._answer("timed", timeout)["seconds"])

    def close(self, kill: bool = False) -> None:
        """Close its stdin (it leaves at once) and reap it (killed when ``kill`` or when it
        lingers); its stderr goes to the log: at debug, or at info before a death."""
        if self._reap(kill):
            self._log()

    def _reap(self, kill: bool) -> bool:
        proc = self._proc
        if proc is None or self._reaped:
            return False
        self._reaped = True
        finish_child(proc, kill=kill, readers=self._readers)
        return True

    def _log(self) -> None:
        if self.died:
            log.info("rlx bench: %s %s; its last stderr lines:\n%s", self.name, self.died, "\n".join(self._stderr))
        else:
            for line in self._stderr:
                log.debug("rlx bench %s: %s", self.name, line)

    def _send(self, message: Mapping[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(dict(message)) + "\n")
            self._proc.stdin.flush()
        except (OSError, ValueError):
            pass  # it died already: reading its answer says how

    def _answer(self, event: str, timeout: float) -> dict[str, Any]:
        """The child's next ``event`` message; ``ContenderFailed`` (the worker closed) when it
        answers ``error``, ends, or is still silent after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(f"did not answer within {timeout:g} s while {self._step}", kill=True)
            try:
                message = self._messages.get(timeout=remaining)
            except queue.Empty:
                continue
            if message is None:  # stdout closed: the child is gone, or going
                self._fail("", kill=False)
            if message.get("event") == "step":
                self._step = str(message.get("step", ""))
            elif message.get("event") == "error":
                self._fail(str(message.get("note", "")) or "failed", kill=False)
            elif message.get("event") == event:
                return message

    def _fail(self, note: str, kill: bool) -> NoReturn:
        """Close the worker and stop its contender with ``note`` (none: how the child ended)."""
        self._reap(kill)
        if not note:
            assert self._proc is not None
            note = self.died = f"{describe_exit(self._proc.returncode)} while {self._step}"
        elif kill:
            self.died = note
        self._log()
        raise ContenderFailed(note)


# --------------------------------------------------------------------------- the child
class _Unrunnable(Exception):
    """The contender cannot run here; the message is its row's note as is."""


def _load_graph(model: str, dims: Mapping[str, int]) -> Graph:
    from ..ir import Graph

    if model.lower().endswith(".onnx"):
        from .. import onnx as rlx_onnx

        return rlx_onnx.load(Path(model), dims=dict(dims))
    return Graph.load(model)


def _load_inputs(request: Mapping[str, Any]) -> dict[str, np.ndarray]:
    with np.load(request["inputs"], allow_pickle=False) as archive:
        return {name: archive[f"arr_{i}"] for i, name in enumerate(request["input_names"])}


def _build(request: Mapping[str, Any], channel: ChildChannel) -> tuple[Callable[[], Any], dict[str, Any]]:
    """The contender's ``run``, compiled and warmed up, and what ``ready`` says of it."""
    from ..errors import RlxError
    from ..onnx._peers import numpy_peer, onnxruntime_peer, rlx_contender
    from ..placement.ranking import resolve_device

    spec = request["contender"]
    channel.send("step", step="loading the model")
    feeds = _load_inputs(request)
    if spec["contender"] == "onnxruntime":
        channel.send("step", step="compiling")
        contender = onnxruntime_peer(Path(request["model"]), feeds)
    else:
        graph = _load_graph(request["model"], request.get("dims") or {})
        if spec["contender"] == "rlx":
            device = str(spec["device"])
            channel.send("step", step="probing the device")
            with contextlib.suppress(RlxError):  # probed and placed before the clock starts, as in the parent
                resolve_device(graph, hint=device)
            channel.send("step", step="compiling")
            contender = rlx_contender(graph, device, feeds)
        elif spec["contender"] == "numpy":
            contender = numpy_peer(graph, feeds)
        else:
            raise ValueError(f"unknown contender {spec['contender']!r}")
    if contender.run is None:
        raise _Unrunnable(contender.note)
    channel.send("step", step="warming up")
    t0 = time.perf_counter()
    contender.run()
    warmup = time.perf_counter() - t0
    return contender.run, {"compile_seconds": contender.compile_seconds, "warmup_seconds": warmup,
                           "note": contender.note}


def _read_requests(out: queue.Queue[str]) -> None:
    """Hand on the parent's lines; when its end closes (done, or gone), leave at once, mid-run too."""
    with contextlib.suppress(Exception):
        for line in sys.stdin:
            out.put(line)
    os._exit(0)


def _child_main() -> None:
    faulthandler.enable()  # a crash prints the Python stack to stderr, which the parent logs
    channel = ChildChannel()
    request = json.loads(sys.stdin.readline() or "{}")
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_requests, args=(lines,), daemon=True).start()
    try:
        run, ready = _build(request, channel)
        channel.send("ready", **ready)
        while True:
            n = int(json.loads(lines.get())["n"])
            channel.send("timed", seconds=per_call(run, n))
    except _Unrunnable as exc:
        channel.send("error", note=str(exc))
    except BaseException as exc:
        channel.send("error", note=f"failed: {type(exc).__name__}: {exc}")
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: a driver's atexit handlers are where some crash


if __name__ == "__main__":
    _child_main()
