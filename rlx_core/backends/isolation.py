"""Backend work that may crash its process runs in a child process: probes and calibration.

A probe and a calibration are the first code to touch a driver, and the places where a
broken one shows: a PoCL build that segfaults inside a generated kernel, an ICD loader
that crashes enumerating platforms, a GPU library that aborts on a wedged device. In the
user's process that is a dead interpreter with no message; in a child it is one line
("probe died with SIGSEGV") and every other device keeps working. JAX and PyTorch start
their backends in-process; Chromium's GPU process and pytest-xdist's workers are the
model here: the risky part lives in a process that may die, and the parent reads why.

The child is ``python -m rlx_core.backends._isolated_child``: a fresh interpreter (never ``fork``, which
would copy the parent's OpenMP and driver threads in an undefined state, and never
``multiprocessing``'s spawn, which re-imports the user's ``__main__``). It is told which
entry point to load and what to do in one JSON line on stdin, answers in JSON lines on
stdout (``started``, ``step`` for progress, then ``result`` or ``error``), and its stderr
(compiler chatter, the plugin's own prints) is kept for the log and the last line of a
death. It exits when its stdin closes, so a parent that exits never leaves a child behind.

No child imports from the user's working directory: ``python -m`` would put the cwd first
on ``sys.path``, and running ``rlx`` inside an unpacked model folder holding a
``numpy.py`` would run it. Every child starts with ``-P`` (Python 3.11+) or, on 3.10,
in a private empty directory (``child_command``, ``child_cwd``); ``child_env`` hands it
the parent's ``sys.path`` without ``''`` and the cwd, so it sees the same installed
distributions (``PYTHONPATH`` included) and nothing else.

``RLX_ISOLATION=0`` runs all of it in-process instead (a debugger, a host that cannot
start processes); backends added with ``Registry.register`` always run in-process,
since a child cannot rebuild an object it was only handed.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import importlib.metadata
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from ..errors import ConfigError

__all__ = ["ISOLATION_ENV", "ChildTarget", "ChildOutcome", "isolation_enabled", "run_child", "describe_exit",
           "STARTUP_SECONDS", "ChildChannel", "child_env", "start_child", "finish_child", "read_messages",
           "read_stderr", "CHILD_ENV", "in_isolation_child", "child_command", "child_cwd", "reraised",
           "child_messages", "ChildTimedOut"]

ISOLATION_ENV = "RLX_ISOLATION"
#: The child's entry point (``python -m``): its tasks load backends, so they live apart
#: from this module, which the registry imports.
CHILD_MODULE = "rlx_core.backends._isolated_child"
#: Set to "1" in the environment of every child (``in_isolation_child``).
CHILD_ENV = "RLX_ISOLATION_CHILD"
#: What a child may spend starting up (interpreter, numpy, the plugin's import) before the
#: task's own timeout starts: a cold disk or a busy host can take seconds, and a probe's
#: ``RLX_PROBE_TIMEOUT`` is about the probe, not about Python starting.
STARTUP_SECONDS = 60.0
_STDERR_LINES = 40
#: Whether this interpreter has ``-P`` (3.11+: do not prepend the script's directory or
#: the cwd to ``sys.path``); without it children start in ``child_cwd()`` instead.
SAFE_PATH_FLAG = sys.version_info >= (3, 11)
log = logging.getLogger("rlx.isolation")
_cwd_lock = threading.Lock()
_empty_dir: str | None = None


def isolation_enabled(environ: Mapping[str, str]) -> bool:
    """``RLX_ISOLATION``: ``1`` (default) runs probes and calibration in child processes,
    ``0`` in this process. Anything else is a ``ConfigError`` naming the value."""
    raw = environ.get(ISOLATION_ENV, "").strip()
    if raw in ("", "1"):
        return True
    if raw == "0":
        return False
    raise ConfigError(f"{ISOLATION_ENV}: {raw!r} is not 0 or 1")


@dataclass(frozen=True)
class ChildTarget:
    """How a child finds the backend: the entry point (name and ``module:attr`` value)
    and the backend's name among those the hook returns."""

    entry_point: str
    value: str
    backend: str

    @classmethod
    def of(cls, entry_point: Any, backend: str) -> ChildTarget | None:
        """The target for a backend loaded from ``entry_point``; ``None`` when a child
        could not load it the same way (not a real ``importlib.metadata.EntryPoint``)."""
        if not isinstance(entry_point, importlib.metadata.EntryPoint):
            return None
        return cls(entry_point.name, entry_point.value, backend)


@dataclass
class ChildOutcome:
    """What became of a child: its ``result`` payload, or the ``error`` its task raised
    (``{"type", "message"}``), or ``died``: why it ended without either (a signal, an exit
    status, a timeout). ``step`` is the last step it reported, ``stderr`` its last lines."""

    result: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    died: str = ""
    step: str = ""
    stderr: list[str] = field(default_factory=list)


def describe_exit(returncode: int) -> str:
    """``died with SIGSEGV (Segmentation fault)`` for a signal, else ``exited with status N``."""
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
            return f"died with {sig.name} ({signal.strsignal(sig) or sig.name})"
        except ValueError:
            return f"died with signal {-returncode}"
    return f"exited with status {returncode}"


def reraised(name: str, error: Mapping[str, str]) -> Exception:
    """The exception a child's task raised, rebuilt here: ``NotImplementedError`` and
    rlx's own errors keep their type (callers tell "cannot calibrate" from "failed"),
    anything else is a ``PluginError`` naming the backend and the original type."""
    from .. import errors

    kind, message = error.get("type", ""), error.get("message", "")
    if kind == "NotImplementedError":
        return NotImplementedError(message)
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.RlxError):
        return cls(message)
    return errors.PluginError(f"backend {name!r}: calibrate raised {kind}: {message}")


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment, its ``RLX_*`` settings as the registry sees them, the
    parent's ``sys.path`` (plugins found there must be found again), isolation off.

    The path handed on leaves out ``''`` and the working directory (where ``python -m``
    or ``-c`` put them): a child must not import the user's files, whatever the parent
    was started with. An entry the user named in ``PYTHONPATH`` stays, cwd or not: that
    is a choice, not an accident of how the parent was started."""
    env = dict(os.environ)
    if environ is not os.environ:
        env = {k: v for k, v in env.items() if not k.startswith("RLX_")}
        env.update({k: v for k, v in environ.items() if k.startswith("RLX_")})
    env["PYTHONPATH"] = os.pathsep.join(_child_path())
    env[ISOLATION_ENV] = "0"
    env[CHILD_ENV] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _child_path() -> list[str]:
    """``sys.path`` as absolute paths, without ``''`` and the working directory (unless
    ``PYTHONPATH`` names it), without duplicates."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # the cwd was removed: nothing can be imported from it anyway
        cwd = None
    chosen = {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    paths: list[str] = []
    for entry in sys.path:
        if not isinstance(entry, str) or not entry:
            continue
        absolute = os.path.abspath(entry)
        if cwd is not None and os.path.realpath(absolute) == cwd and cwd not in chosen:
            continue
        paths.append(absolute)
    return list(dict.fromkeys(paths))


def child_command(module: str) -> list[str]:
    """``python -P -m module``: the interpreter running rlx, told not to put the cwd on
    ``sys.path`` (3.11+; on 3.10 ``child_cwd`` gives the child a directory of its own)."""
    return [sys.executable, *(["-P"] if SAFE_PATH_FLAG else []), "-m", module]


def child_cwd() -> str | None:
    """Where a child starts: ``None`` (the parent's cwd) where ``-P`` keeps it off
    ``sys.path``; on Python 3.10 a private empty directory, made once per process (mode
    0700, so no one else can put a module there), since ``-m`` puts the cwd first."""
    global _empty_dir
    if SAFE_PATH_FLAG:
        return None
    with _cwd_lock:
        if _empty_dir is None or not os.path.isdir(_empty_dir) or os.listdir(_empty_dir):
            _empty_dir = tempfile.mkdtemp(prefix="rlx-child-cwd-")
            atexit.register(_remove_dir, _empty_dir)
        return _empty_dir


def _remove_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def in_isolation_child() -> bool:
    """Whether this process is a probe/calibration child of rlx (``child_env``): a backend
    may then skip what only a long-lived process wants (JAX reserving most of the GPU's
    memory up front, which would starve the parent and the other children)."""
    return os.environ.get(CHILD_ENV) == "1"


def run_child(task: Mapping[str, Any], *, timeout: float, environ: Mapping[str, str] = os.environ,
              on_started: Callable[[], None] | None = None,
              on_step: Callable[[str, float], None] | None = None) -> ChildOutcome:
    """Run ``task`` in a child and wait for its answer.

    ``timeout`` counts from the child's ``started`` message (after its imports); before
    that it may take ``STARTUP_SECONDS``. A child past its deadline is killed and its
    outcome says so. ``on_started`` and ``on_step`` are called from this thread as the
    messages arrive (progress bars, probe deadlines).
    """
    messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
    stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
    try:
        proc, readers = start_child(CHILD_MODULE, environ, messages, stderr)
    except OSError as exc:
        return ChildOutcome(died=f"could not be started ({type(exc).__name__}: {exc})")
    outcome = ChildOutcome()
    answered = False
    try:
        for message in child_messages(proc, task, messages, timeout):
            event = message.get("event")
            if event == "started":
                if on_started is not None:
                    on_started()
            elif event == "step":
                outcome.step = str(message.get("step", ""))
                if on_step is not None:
                    on_step(outcome.step, float(message.get("frac", 0.0)))
            elif event == "result":
                outcome.result, answered = dict(message.get("payload") or {}), True
                break
            elif event == "error":
                outcome.error, answered = {"type": str(message.get("type", "")),
                                           "message": str(message.get("message", ""))}, True
                break
    except ChildTimedOut:
        outcome.died = f"did not finish within {timeout:g} s"
    finally:
        finish_child(proc, kill=not answered, readers=readers)
    outcome.stderr = list(stderr)
    if not answered and not outcome.died:
        outcome.died = describe_exit(proc.returncode if proc.returncode is not None else -signal.SIGKILL)
    if outcome.died:  # where it died, from faulthandler's traceback: for whoever turns logging on
        log.info("rlx: the %s child %s; its last stderr lines:\n%s", task.get("task"), outcome.died,
                 "\n".join(outcome.stderr))
    else:
        for line in outcome.stderr:
            log.debug("rlx child %s: %s", task.get("task"), line)
    return outcome


class ChildTimedOut(Exception):
    """A child did not answer within its deadline (``child_messages``)."""


def child_messages(proc: subprocess.Popen[str], task: Mapping[str, Any],
                   messages: queue.Queue[dict[str, Any] | None], timeout: float,
                   restart: tuple[str, ...] = ("started",)) -> Iterator[dict[str, Any]]:
    """Send ``task`` (one JSON line) to a started child, then yield its messages until its
    stdout closes. ``timeout`` counts from the child's ``started`` message (before it, the
    child may also take ``STARTUP_SECONDS`` for its interpreter and imports) and again
    from every message whose event is in ``restart``; past it, ``ChildTimedOut``."""
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(dict(task)) + "\n")
        proc.stdin.flush()  # stdin stays open: the child exits when it closes
    except OSError:
        pass  # the child died at once; its exit status says how
    deadline = time.monotonic() + STARTUP_SECONDS + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ChildTimedOut
        try:
            message = messages.get(timeout=remaining)
        except queue.Empty:
            continue
        if message is None:  # stdout closed: the child is gone
            return
        if message.get("event") in restart or message.get("event") == "started":
            deadline = time.monotonic() + timeout
        yield message


def start_child(module: str, environ: Mapping[str, str], messages: queue.Queue[dict[str, Any] | None],
                stderr: collections.deque[str]) -> tuple[subprocess.Popen[str], list[threading.Thread]]:
    """Start ``python -P -m module`` (``child_command``, in ``child_cwd``) with
    ``child_env(environ)`` and the daemon threads that feed its JSON messages into
    ``messages`` (``None`` at the end) and its stderr lines into ``stderr``; raises
    ``OSError`` when it cannot be started. Every child rlx starts comes through here."""
    proc = subprocess.Popen(child_command(module), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=child_env(environ), cwd=child_cwd(), text=True,
                            encoding="utf-8", errors="replace")
    readers = [threading.Thread(target=read_messages, args=(proc.stdout, messages), daemon=True),
               threading.Thread(target=read_stderr, args=(proc.stderr, stderr), daemon=True)]
    for t in readers:
        t.start()
    return proc, readers


def finish_child(proc: subprocess.Popen[str], kill: bool, readers: Sequence[threading.Thread] = ()) -> None:
    """Close the child's stdin (its signal to exit) and reap it, killing it if it must go;
    then wait for its ``readers`` to drain its pipes."""
    with contextlib.suppress(OSError):
        assert proc.stdin is not None
        proc.stdin.close()
    if kill and proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for t in readers:
        t.join(timeout=5)


def read_messages(stream: IO[str] | None, out: queue.Queue[dict[str, Any] | None]) -> None:
    assert stream is not None
    try:
        for line in stream:
            line = line.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue  # not ours: the protocol has its own descriptor, this cannot happen
            if isinstance(message, dict):
                out.put(message)
    finally:
        out.put(None)
        stream.close()


def read_stderr(stream: IO[str] | None, out: collections.deque[str]) -> None:
    assert stream is not None
    try:
        for line in stream:
            out.append(line.rstrip("\n"))
    finally:
        stream.close()


# --------------------------------------------------------------------------- the child
class ChildChannel:
    """The child's side of the protocol: JSON lines on a private copy of the original
    stdout, while fd 1 itself is pointed at stderr so a plugin's prints cannot corrupt it."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._lock = threading.Lock()

    def send(self, event: str, **fields: Any) -> None:
        with self._lock:
            self._out.write(json.dumps({"event": event, **fields}) + "\n")
            self._out.flush()
