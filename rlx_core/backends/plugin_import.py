"""A plugin's first import on a host runs in a child process; the verdict is cached.

Importing a plugin runs its code in the user's process. One whose import segfaults (an
extension built for another CPU, a driver library that aborts as it loads) would end
every rlx command with status 139 and nothing naming it; one whose import hangs (a lock,
a dead network mount) would hang every command. So before the registry imports an entry
point here, a child (``python -m rlx_core.backends._isolated_child``, task ``import``) imports it
and calls its hook, as the registry would, and answers with the backend names. A child
that dies (a signal, an exit) or does not finish within the probe timeout (twice: a
loaded host gets a second chance) makes the plugin a broken-plugin row naming the signal
or the timeout, and it is not imported here. An import that merely raises is safe: the
registry imports it again here and reports the exception exactly as it always did.

The verdict is kept in the cache (namespace ``plugin-imports``), keyed by entry point,
distribution and interpreter, and trusted while the plugin's *fingerprint* is unchanged.
The fingerprint is what can change what the import runs, by what is cheap to read (a few
``stat`` calls and no file reads; about a millisecond a plugin):

- the entry point, the distribution's name and version, and the mtime and size of its
  ``dist-info`` files (``METADATA``, ``RECORD``, ``entry_points.txt``) and directory:
  an install, upgrade or reinstall rewrites them. RECORD alone is not enough: an
  editable install's RECORD lists no module, and a hand edit touches none of it;
- the mtime and size of every Python and extension module under the entry point's
  package (``__pycache__`` left out, or the check's own byte-compiling would change it):
  an edit of any module the import may run;
- the mtime of the directory that holds the distribution (site-packages): installing,
  upgrading or removing anything there, a dependency whose import crashes included;
- rlx-core's version and the interpreter.

So the common case costs one child once per host and plugin version (all unchecked
plugins share it, imported in the order the registry will import them), and a cached
verdict costs no child: ``rlx devices`` stays fast. ``RLX_ISOLATION=0`` imports in this
process as before. A registry inside one of rlx's children checks nothing (no
grandchildren) but skips a plugin whose cached verdict is bad, so a bench worker does
not die of what the parent already found.
"""

from __future__ import annotations

import collections
import difflib
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import logging
import os
import queue
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from .._version import __version__
from ..cache import JsonCache, cache_dir
from ..errors import ConfigError, PluginError
from ..plugin import ENTRY_POINT_GROUP, RlxBackendSpec
from .isolation import (
    CHILD_MODULE,
    ChildTimedOut,
    child_messages,
    describe_exit,
    finish_child,
    in_isolation_child,
    start_child,
)

__all__ = ["ImportVerdict", "ImportChecks", "fingerprint", "check_in_child", "call_hook", "IMPORT_NAMESPACE",
           "distribution_of", "cache_writable", "import_verdicts", "verdict_root", "ReservedName",
           "reserved_for", "times", "disabled_plugins", "interpreter_tag"]

log = logging.getLogger("rlx.registry")

IMPORT_NAMESPACE = "plugin-imports"
_SCHEMA = 1
#: Tries a plugin's import gets in a child before a timeout counts: a loaded host's first
#: one may be slow for reasons of its own.
_TRIES = 2
#: Modules an entry point's package may hold, beyond which its fingerprint stops looking
#: (a namespace package shared by many distributions could hold thousands).
_MAX_FILES = 2000
_SUFFIXES = tuple(importlib.machinery.all_suffixes())


@dataclass(frozen=True)
class ImportVerdict:
    """What importing an entry point did in a child: ``safe`` (it finished, raising or
    not: the registry may import it here), else ``why`` not ("died with SIGSEGV
    (Segmentation fault)", "did not finish within 2 s ..."). ``backends``: the names its
    hook returned, when it returned any."""

    safe: bool
    why: str = ""
    backends: tuple[str, ...] = ()

    def error(self, entry_point: str, value: str) -> str:
        """The broken-plugin row's text, after the distribution's name."""
        return (f"importing entry point {entry_point!r} ({value}) in a child process {self.why}; rlx will not "
                f"import it until the plugin changes (or `rlx cache clear {IMPORT_NAMESPACE}`)")


def times(n: int) -> str:
    """``once``, ``twice``, ``3 times``: how many tries a message reports."""
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def call_hook(plugin: object, entry_point: str, value: str) -> object:
    """Register ``plugin`` (a loaded entry point) with its own pluggy manager, which
    validates its hook implementation, and return what its ``rlx_backends`` returned."""
    pm = pluggy.PluginManager("rlx")
    pm.add_hookspecs(RlxBackendSpec)
    pm.register(plugin, name=f"rlx-entry-point-{entry_point}")
    pm.check_pending()
    if not pm.get_hookcallers(plugin):
        raise PluginError(f"{value!r} implements no rlx_backends hook (decorate it with rlx_core.hookimpl)")
    results = pm.hook.rlx_backends()
    return results[0] if results else None


def disabled_plugins(raw: str, entry_points: Sequence[Any] | None, first_party: Mapping[str, str]) -> set[str]:
    """``RLX_DISABLE_PLUGINS`` (``raw``) as a set of entry point names; blank means none.

    Disabled plugins are never imported, so this is read before any import check. An
    empty entry (``cuda,,``) is a ``ConfigError`` like any other malformed token: a
    variable that expanded to nothing would otherwise disable less than the user meant.
    So is a name that is no plugin here nor one of rlx's own (``opencll``): the plugin the
    user meant would stay enabled. rlx's own names (``first_party``) are accepted where
    they are not installed, since the same variables travel between hosts.
    ``entry_points`` are the registry's own when it was given some (else the installed
    ones are the known names).
    """
    names: set[str] = set()
    if not raw.strip():
        return names
    for token in raw.split(","):
        token = token.strip()
        if not token:
            raise ConfigError(f"RLX_DISABLE_PLUGINS: {raw.strip()!r} has an empty entry; expected "
                              "comma-separated entry point names like 'cuda,opencl'")
        if any(c.isspace() for c in token) or "=" in token:
            raise ConfigError(f"RLX_DISABLE_PLUGINS: {token!r} is not an entry point name "
                              "(expected comma-separated names like 'cuda,opencl')")
        names.add(token)
    if in_isolation_child():  # the parent checked the names; this registry holds one entry point
        return names
    known = set(first_party) | {ep.name for ep in entry_points or ()}
    if names - known:  # the installed plugins too: a registry may be given some entry points only
        known |= {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    for token in sorted(names - known):
        close = difflib.get_close_matches(token, sorted(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"RLX_DISABLE_PLUGINS: {token!r} is not a plugin here; {hint}plugins (entry point "
                          f"names): {', '.join(sorted(known))}")
    return names


def interpreter_tag() -> str:
    """A short tag of this interpreter for cache keys: verdicts about imports and probes
    are kept per interpreter (two venvs on one host see different plugins)."""
    return hashlib.sha256(sys.executable.encode("utf-8", "surrogatepass")).hexdigest()[:10]


class ReservedName(PluginError):
    """A backend named like one of rlx's own, from another distribution: reported broken,
    never loaded, whatever order the entry points are read in."""

    @staticmethod
    def text(name: str, owner: str) -> str:
        return f"backend name {name!r} is reserved for rlx's own {owner}; another distribution may not take it"


def reserved_for(name: object, dist: str, first_party: Mapping[str, str]) -> str:
    """The distribution that owns device name ``name`` (``first_party``: name -> pip
    requirement) when ``dist`` is another; else ``""``. A backend registered without a
    distribution (``dist == ""``: tests, loopback backends) may take any name."""
    owner = first_party.get(name, "").partition("[")[0] if isinstance(name, str) else ""
    return owner if owner and dist and re.sub(r"[-_.]+", "-", dist).lower() != owner else ""


def verdict_root(environ: Mapping[str, str]) -> Path | None:
    """Where a registry with ``environ`` keeps its verdicts: that ``RLX_CACHE_DIR`` when
    it has one, else the process's cache dir (``None``: ``cache_dir()``, as every cache)."""
    return cache_dir(environ) if environ.get("RLX_CACHE_DIR", "").strip() else None


def import_verdicts(entry_points: Sequence[Any], environ: Mapping[str, str], *, isolated: Callable[[], bool],
                    timeout: Callable[[], float]) -> tuple[dict[int, ImportVerdict], dict[int, str]]:
    """The registry's step before it imports ``entry_points``: each one's verdict and
    fingerprint, by ``id``. Checked in a child unless ``isolated()`` is false
    (``RLX_ISOLATION=0``: nothing, as before); in one of rlx's own children, the cached
    verdicts only (no grandchildren). ``timeout()`` is ``RLX_PROBE_TIMEOUT``."""
    child = in_isolation_child()
    if not any(isinstance(ep, importlib.metadata.EntryPoint) for ep in entry_points) or not (child or isolated()):
        return {}, {}
    checks = ImportChecks(verdict_root(environ))
    found = checks.verdicts(entry_points, check=not child, timeout=timeout(), environ=environ)
    return {id(ep): v for ep, v in zip(entry_points, found) if v is not None}, checks.fingerprints


# -- fingerprints ------------------------------------------------------------------------


def _stat(path: str | os.PathLike[str]) -> list[Any]:
    try:
        st = os.stat(path)
    except OSError:
        return [os.fspath(path), None]
    return [os.fspath(path), st.st_mtime_ns, st.st_size]


def _module_files(module: str) -> list[str]:
    """The files importing ``module`` may run, found without importing anything: the
    modules along its dotted path, and every module under its first regular package."""
    parts = module.split(".")
    try:  # a top-level name: finders look, nothing is executed
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return []
    chain = []
    for part in [*parts[1:], None]:
        if spec is None:
            break
        chain.append(spec)
        locations = list(spec.submodule_search_locations or [])
        if part is None or not locations:
            break
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
    files = [s.origin for s in chain if s.origin and os.path.isfile(s.origin)]
    package = next((s for s in chain if s.submodule_search_locations and s.origin), None)
    for root in list(package.submodule_search_locations or []) if package is not None else []:
        for top, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            files += [os.path.join(top, n) for n in sorted(names) if n.endswith(_SUFFIXES)]
            if len(files) > _MAX_FILES:
                return sorted(set(files))[:_MAX_FILES]
    return sorted(set(files))


def fingerprint(ep: Any) -> str:
    """A digest of what can change what importing ``ep`` runs (see the module's
    docstring); ``""`` when ``ep`` has no distribution to describe it."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ""
    try:
        name, version = str(dist.metadata["Name"] or ""), str(dist.version or "")
    except Exception:  # metadata a broken install cannot give: then nothing is cached for it
        return ""
    stats = []
    info = getattr(dist, "_path", None)  # PathDistribution's dist-info directory
    if info is not None:
        info = Path(info)
        stats += [_stat(info), _stat(info.parent)] + [_stat(info / f) for f in ("METADATA", "RECORD",
                                                                                 "entry_points.txt")]
    stats += [_stat(f) for f in _module_files(str(getattr(ep, "module", ep.value.partition(":")[0])))]
    described = [ep.name, ep.value, name, version, __version__, sys.executable, sys.version, stats]
    return hashlib.sha256(json.dumps(described).encode("utf-8", "surrogatepass")).hexdigest()


def distribution_of(ep: Any) -> str:
    """The name of the distribution an entry point comes from, or ``""``."""
    dist = getattr(ep, "dist", None)
    try:
        return str(getattr(dist, "name", None) or dist.metadata["Name"] or "") if dist is not None else ""
    except Exception:  # metadata a broken install cannot give: the entry point is still reported
        return ""


# -- the verdict cache -------------------------------------------------------------------


class ImportChecks:
    """The import verdicts of entry points: from the cache while their fingerprint holds,
    else from a child (``check_in_child``), then cached. ``root`` is the cache root
    (default ``cache_dir()``, read at each use)."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self._cache = JsonCache(IMPORT_NAMESPACE, schema=_SCHEMA, root=root,
                                what="plugin imports checked in a child process (a plugin whose import crashed "
                                     "or hung is not imported until it changes)")
        self.fingerprints: dict[int, str] = {}  # id(entry point) -> its fingerprint, for the probe cache

    def verdicts(self, entry_points: Sequence[Any], *, check: bool, timeout: float,
                 environ: Mapping[str, str]) -> list[ImportVerdict | None]:
        """One verdict per entry point (``None``: unknown, import it here as before). Only
        real ``importlib.metadata.EntryPoint``s are checked (a child must find them
        again); with ``check`` false, only cached verdicts are given (no child)."""
        found: list[ImportVerdict | None] = [None] * len(entry_points)
        todo: list[int] = []
        for i, ep in enumerate(entry_points):
            if not isinstance(ep, importlib.metadata.EntryPoint):
                continue
            digest = self.fingerprints[id(ep)] = fingerprint(ep)
            found[i] = self._cached(ep, digest) if digest else None
            if found[i] is None and check:
                todo.append(i)
        if todo:
            checked = check_in_child([entry_points[i] for i in todo], timeout=timeout, environ=environ)
            for i, verdict in zip(todo, checked):
                found[i] = verdict
                if verdict is not None and self.fingerprints[id(entry_points[i])]:
                    self._store(entry_points[i], self.fingerprints[id(entry_points[i])], verdict)
        return found

    @staticmethod
    def _key(ep: Any) -> str:
        return f"{distribution_of(ep) or 'unknown'}.{ep.name}.{interpreter_tag()}"

    def _cached(self, ep: Any, digest: str) -> ImportVerdict | None:
        key = self._key(ep)
        entry = self._cache.get(key, {"entry_point": ep.name})
        if entry is None:
            return None
        backends = entry.get("backends")
        if (not isinstance(entry.get("safe"), bool) or not isinstance(entry.get("why"), str)
                or not isinstance(backends, list) or not all(isinstance(b, str) for b in backends)):
            self._cache.reject(key, "it is not an import verdict")
            return None
        if entry.get("fingerprint") != digest:
            return None  # the plugin changed: checked again, and this entry overwritten
        return ImportVerdict(entry["safe"], entry["why"], tuple(backends))

    def _store(self, ep: Any, digest: str, verdict: ImportVerdict) -> None:
        if not cache_writable(self._cache.directory):
            log.info("rlx: the import verdict of %r is not cached: %s is not writable", ep.name, self._cache.directory)
            return
        self._cache.put(self._key(ep), {"entry_point": ep.name},
                        {"fingerprint": digest, "safe": verdict.safe, "why": verdict.why,
                         "backends": list(verdict.backends), "checked": time.strftime("%Y-%m-%d %H:%M")})


def cache_writable(directory: Path) -> bool:
    """Whether a cache entry could be written under ``directory`` (or the nearest parent
    that exists): an optimisation's cache that cannot be written is not worth a warning
    in every command."""
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False


# -- the child ---------------------------------------------------------------------------


@dataclass
class _Batch:
    """What one child made of a list of entry points: ``answers`` by index (the backend
    names), ``current`` the index it was importing when it ended (``None``: between
    imports), and how it ended: ``finished``, ``timed_out``, ``died``, or ``failed`` (it
    could not check at all: not started, or died before its first import)."""

    answers: dict[int, tuple[str, ...]] = field(default_factory=dict)
    current: int | None = None
    started: bool = False
    finished: bool = False
    timed_out: bool = False
    died: str = ""
    failed: str = ""
    stderr: list[str] = field(default_factory=list)


def check_in_child(entry_points: Sequence[Any], *, timeout: float,
                   environ: Mapping[str, str]) -> list[ImportVerdict | None]:
    """Import ``entry_points`` in a child, in order, each within ``timeout`` seconds
    (the child's start-up, ``STARTUP_SECONDS``, not counted); one verdict each, ``None``
    where the child could not tell (it could not start: import here, as before).

    One that kills the child is unsafe; the rest go on in a fresh child. One that times
    out is tried once more in a fresh child, then unsafe."""
    verdicts: list[ImportVerdict | None] = [None] * len(entry_points)
    timeouts: collections.Counter[int] = collections.Counter()
    pending = list(range(len(entry_points)))
    while pending:
        batch = _run_batch([entry_points[i] for i in pending], timeout, environ)
        for local, names in batch.answers.items():
            verdicts[pending[local]] = ImportVerdict(True, backends=names)
        if batch.finished:
            break
        culprit = pending[batch.current] if batch.current is not None else None
        if batch.failed or culprit is None:
            log.info("rlx: the plugin import check %s; importing %s in this process unchecked",
                     batch.failed or f"child {batch.died or 'ended'} between imports",
                     ", ".join(repr(entry_points[i].name) for i in pending if verdicts[i] is None))
            break
        if batch.timed_out:
            timeouts[culprit] += 1
            if timeouts[culprit] < _TRIES:
                log.info("rlx: importing plugin %r did not finish within %g s; trying again in a fresh child",
                         entry_points[culprit].name, timeout)
                pending = [i for i in pending if verdicts[i] is None]
                continue
            why = f"did not finish within {timeout:g} s, {times(_TRIES)} (RLX_PROBE_TIMEOUT)"
        else:
            why = batch.died
        log.info("rlx: importing plugin %r %s in a child process; its last stderr lines:\n%s",
                 entry_points[culprit].name, why, "\n".join(batch.stderr))
        verdicts[culprit] = ImportVerdict(False, why)
        pending = [i for i in pending if verdicts[i] is None]
    return verdicts


def _run_batch(entry_points: Sequence[Any], timeout: float, environ: Mapping[str, str]) -> _Batch:
    batch = _Batch()
    messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
    stderr: collections.deque[str] = collections.deque(maxlen=40)
    try:
        proc, readers = start_child(CHILD_MODULE, environ, messages, stderr)
    except OSError as exc:
        batch.failed = f"child could not be started ({type(exc).__name__}: {exc})"
        return batch
    task = {"task": "import", "entry_points": [{"name": ep.name, "value": ep.value} for ep in entry_points]}
    try:  # each plugin's import gets the whole timeout: the clock restarts at every "importing"
        for message in child_messages(proc, task, messages, timeout, restart=("importing",)):
            event = message.get("event")
            if event == "started":
                batch.started = True
            elif event == "importing":
                batch.current = int(message.get("index", 0))
            elif event == "imported":
                names = message.get("backends") or []
                batch.answers[int(message.get("index", 0))] = tuple(str(n) for n in names)
                batch.current = None
            elif event == "result":
                batch.finished = True
                break
            elif event == "error":  # the task itself failed (not a plugin): no verdict from it
                batch.failed = f"child failed: {message.get('type')}: {message.get('message')}"
                break
    except ChildTimedOut:
        batch.timed_out = True
    finally:
        finish_child(proc, kill=not batch.finished, readers=readers)
    batch.stderr = list(stderr)
    if not batch.finished and not batch.timed_out:
        batch.died = describe_exit(proc.returncode if proc.returncode is not None else -signal.SIGKILL)
    if not batch.started and not batch.failed:
        batch.failed = f"child {'did not start in time' if batch.timed_out else batch.died} before any import"
    return batch
