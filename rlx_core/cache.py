"""On-disk caches (calibrated cost models and the like): JSON only, written atomically.

Never pickle: a cache file is data another process (or another version of rlx) may
write, and loading it must not run code. Every entry records the schema it was written
with and the identity of what it describes (plugin version, device, driver versions), so
a stale or foreign entry is noticed, warned about and recomputed instead of trusted.
Writes go to a temp file in the same directory and are renamed over the target, so
concurrent writers (threads or processes) never leave a torn file: the last one wins.

Layout: ``<root>/<namespace>/<key>.json``; each namespace directory carries a
``CACHEDIR.TAG`` (the standard marker backup tools honour), which is also how
``cache_info`` and ``clear_cache`` recognise directories that are rlx's (and say what
each holds: the tag's ``# what:`` line). A plugin that keeps a cache in another format
under the cache dir (rlx-jax-tpu: JAX's compiled programs) marks its directory with
``tag_cache_dir``, so that ``rlx cache info`` lists it and ``rlx cache clear`` empties it
like every other: the user has one place to look, whatever wrote the files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import platformdirs

from .errors import CacheWarning, ConfigError

__all__ = ["cache_dir", "atomic_write_text", "JsonCache", "cache_info", "clear_cache", "tag_cache_dir",
           "cache_namespaces"]

TAG_NAME = "CACHEDIR.TAG"
_TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file marks an rlx cache directory (https://bford.info/cachedir/).\n"
    "# Its contents are recomputed when missing; `rlx cache clear` removes them.\n"
)
_TAG_MARK = "rlx cache"  # what tells rlx's tags from another program's
_WHAT = "# what: "
_ENTRY_KEYS = {"schema", "identity", "payload"}
log = logging.getLogger("rlx.cache")
_SAFE_KEY = re.compile(r"[a-z0-9][a-z0-9_.\-]{0,63}")
_SAFE_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
# Names Windows refuses whatever the extension; hashed like any other odd key.
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The cache root: ``RLX_CACHE_DIR`` when set, else the platform's user cache dir."""
    env = os.environ if environ is None else environ
    configured = env.get("RLX_CACHE_DIR", "").strip()
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_cache_dir("rlx", appauthor=False))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never
    half of either: temp file in the same directory, fsync, then ``os.replace``.

    Creates missing parent directories; removes its temp file if anything fails.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _file_name(key: str) -> str:
    """A safe, case-insensitively unique file name for ``key``.

    Plain lowercase keys are used as they are; anything else (long, upper case, odd
    characters, reserved names) becomes a readable prefix plus a hash of the exact key,
    joined by ``~``, which plain keys cannot contain, so the two forms never collide.
    """
    if _SAFE_KEY.fullmatch(key) and not key.endswith(".tmp") and key.split(".")[0] not in _RESERVED:
        return f"{key}.json"
    prefix = re.sub(r"[^a-z0-9_.\-]+", "_", key.lower())[:40].strip("._-") or "key"
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{prefix}~{digest}.json"


def _jsonable(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as it will read back from JSON (tuples become lists), for comparison."""
    return json.loads(json.dumps(dict(value), sort_keys=True))


class JsonCache:
    """One namespace of JSON entries (e.g. ``JsonCache("cost-models", schema=1)``).

    ``schema`` is the version of the payload layout: bump it when the payload changes
    meaning, and older entries are ignored. ``identity`` says what an entry describes;
    an entry read with a different identity is stale. ``root`` defaults to
    ``cache_dir()``, evaluated at each use so ``RLX_CACHE_DIR`` changes take effect.
    ``what`` says in a line what the namespace holds (``rlx cache info``); ``recompute``
    ends the warning about an unusable entry with what happens next (default "it will be
    recomputed"; calibration says which command measures again).
    """

    def __init__(self, namespace: str, schema: int, root: str | os.PathLike[str] | None = None, *,
                 what: str = "", recompute: str = "it will be recomputed") -> None:  # fmt: skip
        if not isinstance(namespace, str) or not _SAFE_NAMESPACE.fullmatch(namespace):
            raise ConfigError(f"cache namespace {namespace!r} must be letters, digits, '_', '.', '-' (at most 64)")
        if isinstance(schema, bool) or not isinstance(schema, int):
            raise ConfigError(f"cache schema must be an int, got {schema!r}")
        self.namespace = namespace
        self.schema = schema
        self.what = what  # one line for `rlx cache info`: what the entries are
        self.recompute = recompute
        self._root = None if root is None else Path(root)

    @property
    def directory(self) -> Path:
        return (cache_dir() if self._root is None else self._root) / self.namespace

    def path(self, key: str) -> Path:
        """The file that holds ``key``."""
        return self.directory / _file_name(key)

    def get(self, key: str, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """The payload stored under ``key`` for ``identity``, or ``None``.

        A missing file is a silent ``None``. A corrupt or truncated file, an entry of an
        older schema and one written for another identity are each a ``CacheWarning``
        naming the file and why, then removed, then ``None``: the caller recomputes it,
        and until it does no later process warns again (an entry is keyed by ``key``
        alone, so the next ``put`` would overwrite it anyway). An entry of a *newer*
        schema belongs to a newer rlx sharing this cache: it is left alone and ignored
        with a log line, not a warning each process.
        """
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                seen = os.fstat(f.fileno())
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            return self._ignore(path, f"it could not be read ({type(exc).__name__}: {exc})")
        try:
            entry = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return self._ignore(path, f"it could not be read ({type(exc).__name__}: {exc})", seen)
        except ValueError as exc:
            return self._ignore(path, f"it is not valid JSON, perhaps truncated ({exc})", seen)
        if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS or not isinstance(entry["payload"], dict):
            return self._ignore(path, "it is not an rlx cache entry (expected schema, identity and payload)", seen)
        schema = entry["schema"]
        if schema != self.schema:
            if isinstance(schema, int) and not isinstance(schema, bool) and schema > self.schema:
                log.info("rlx cache: ignoring %s: schema %s is a newer rlx's (this one reads %s); left for it",
                         path, schema, self.schema)  # fmt: skip
                return None
            return self._ignore(path, f"it has schema {schema!r}, this version of rlx reads {self.schema}", seen)
        wanted = _jsonable(identity)
        if entry["identity"] != wanted:
            stored = entry["identity"] if isinstance(entry["identity"], dict) else {}
            diffs = [f"{k} {stored.get(k)!r} cached, {wanted.get(k)!r} now"
                     for k in sorted(set(stored) | set(wanted)) if stored.get(k) != wanted.get(k)]
            return self._ignore(path, "it was written for another identity (" + "; ".join(diffs) + ")", seen)
        return entry["payload"]

    def put(self, key: str, identity: Mapping[str, Any], payload: Mapping[str, Any]) -> None:
        """Store ``payload`` under ``key`` for ``identity``, atomically.

        A cache that cannot be written (read-only, full disk, path blocked by a file) is
        a ``CacheWarning``, never an error: the value is simply recomputed next time.
        A payload that is not JSON-serializable is the caller's bug and raises.
        """
        text = json.dumps({"schema": self.schema, "identity": dict(identity), "payload": dict(payload)},
                          indent=1, sort_keys=True)
        path = self.path(key)
        try:
            if self.what or not (path.parent / TAG_NAME).exists():  # rewritten only if it says otherwise
                tag_cache_dir(path.parent, self.what)
            atomic_write_text(path, text + "\n")
        except OSError as exc:
            warnings.warn(f"rlx cache: could not write {path}: {type(exc).__name__}: {exc}; continuing without "
                          "caching it", CacheWarning, stacklevel=2)

    def remove(self, key: str) -> bool:
        """Delete ``key``'s entry; ``True`` if there was one. A file that cannot be removed
        is a ``CacheWarning`` (the entry then stays until ``rlx cache clear``)."""
        path = self.path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            warnings.warn(f"rlx cache: could not remove {path}: {type(exc).__name__}: {exc}", CacheWarning,
                          stacklevel=2)
            return False
        return True

    def reject(self, key: str, why: str) -> None:
        """Warn that ``key``'s entry is unusable (``why``: e.g. its payload does not parse
        as what the caller stores) and remove it, so that it is warned about once."""
        path = self.path(key)
        try:
            seen = os.stat(path)
        except OSError:
            return
        self._ignore(path, why, seen)

    def _ignore(self, path: Path, why: str, seen: os.stat_result | None = None) -> None:
        """Warn that ``path`` is not used and, when ``seen`` (the stat of what was read) is
        given, remove it: once warned about, an entry no rlx here can use must not be
        warned about by every later process until someone recomputes it. A writer that
        replaced the file meanwhile (``put`` renames a new inode over it) keeps its entry."""
        removed = ""
        if seen is not None:
            with contextlib.suppress(OSError):
                now = os.stat(path)
                if (now.st_ino, now.st_mtime_ns, now.st_size) == (seen.st_ino, seen.st_mtime_ns, seen.st_size):
                    path.unlink()
                    removed = "removed; "
        warnings.warn(f"rlx cache: ignoring {path} because {why}; {removed}{self.recompute}", CacheWarning,
                      stacklevel=3)
        return None


def tag_cache_dir(directory: str | os.PathLike[str], what: str = "") -> Path:
    """Mark ``directory`` (created if missing) as one of rlx's cache namespaces, with a
    ``CACHEDIR.TAG`` saying ``what`` it holds; returns the directory.

    ``rlx cache info`` lists every tagged directory under the cache dir and ``rlx cache
    clear`` empties it, whatever format its files have: a plugin writing its own cache
    there (not ``JsonCache``) calls this so that the user finds and clears it like the
    rest. Raises ``OSError`` when the directory cannot be created or written.
    """
    path = Path(directory)
    text = _TAG_TEXT + (f"{_WHAT}{' '.join(what.split())}\n" if what.strip() else "")
    tag = path / TAG_NAME
    try:
        current = tag.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        current = ""
    if current != text:
        atomic_write_text(tag, text)
    return path


def _tag_text(directory: Path) -> str | None:
    """The text of ``directory``'s rlx tag, or ``None`` when it is not an rlx namespace."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        tag = directory / TAG_NAME
        if directory.is_dir() and tag.is_file():
            text = tag.read_text(encoding="utf-8")
            if _TAG_MARK in text:
                return text
    return None


def _own_namespaces(root: Path) -> list[Path]:
    """Namespace directories under ``root`` that rlx created (they carry our CACHEDIR.TAG)."""
    if not root.is_dir():
        return []
    return [child for child in sorted(root.iterdir()) if _tag_text(child) is not None]


def _walk(namespace_dir: Path) -> tuple[list[Path], list[Path]]:
    """``(files, directories)`` under a namespace, deepest directories first, never
    following a symlink out of it (a link is a file to list or remove, not a way in)."""
    files: list[Path] = []
    dirs: list[Path] = []
    for top, subdirs, names in os.walk(namespace_dir, followlinks=False):
        base = Path(top)
        files += [base / n for n in names]
        for d in subdirs:
            (files if (base / d).is_symlink() else dirs).append(base / d)
    return sorted(files), sorted(dirs, key=lambda d: len(d.parts), reverse=True)


def _entries(namespace_dir: Path) -> list[Path]:
    """The files a namespace holds (in any subdirectory): its tag and the temp files of
    writes in progress or interrupted (``.NAME.*.tmp``) are not entries."""
    return [p for p in _walk(namespace_dir)[0]
            if p != namespace_dir / TAG_NAME and not (p.name.startswith(".") and p.suffix == ".tmp")]


def cache_namespaces(root: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """``[{"name", "entries", "bytes", "what"}]`` for every rlx namespace under ``root``
    (default ``cache_dir()``), by name: ``rlx cache info``'s rows."""
    base = cache_dir() if root is None else Path(root)
    rows = []
    for ns in _own_namespaces(base):
        files = _entries(ns)
        size = 0
        for p in files:
            with contextlib.suppress(OSError):
                size += p.stat().st_size
        tag = _tag_text(ns) or ""
        what = next((line[len(_WHAT):].strip() for line in tag.splitlines() if line.startswith(_WHAT)), "")
        rows.append({"name": ns.name, "entries": len(files), "bytes": size, "what": what})
    return rows


def cache_info(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``{"path", "entries": {namespace: count}, "total_entries", "bytes", "namespaces"}``
    for ``rlx cache info`` (``namespaces`` as ``cache_namespaces`` gives them)."""
    base = cache_dir() if root is None else Path(root)
    namespaces = cache_namespaces(base)
    return {"path": str(base), "entries": {ns["name"]: ns["entries"] for ns in namespaces},
            "total_entries": sum(ns["entries"] for ns in namespaces), "bytes": sum(ns["bytes"] for ns in namespaces),
            "namespaces": namespaces}  # fmt: skip


def clear_cache(root: str | os.PathLike[str] | None = None, namespaces: Iterable[str] | None = None) -> int:
    """Remove rlx's cache files under ``root`` (entries, stray temp files, a plugin's own
    files in a namespace it tagged) and return how many files went.

    ``namespaces`` limits it to those (``rlx cache clear calibration``); a name that is
    not an rlx namespace there is a ``ConfigError`` listing the ones that are. Only
    directories marked with rlx's ``CACHEDIR.TAG`` are touched, so a mistaken
    ``RLX_CACHE_DIR`` (say, the home directory) loses nothing else.
    """
    base = cache_dir() if root is None else Path(root)
    own = _own_namespaces(base)
    if namespaces is not None:
        wanted = list(dict.fromkeys(namespaces))
        names = {ns.name for ns in own}
        unknown = [n for n in wanted if n not in names]
        if unknown:
            listed = ", ".join(sorted(names)) or "none"
            raise ConfigError(f"no rlx cache namespace {unknown[0]!r} in {base}; its namespaces: {listed}")
        own = [ns for ns in own if ns.name in wanted]
    removed = 0
    for ns in own:
        files, dirs = _walk(ns)
        for p in files:
            if p == ns / TAG_NAME:
                continue
            try:
                p.unlink()
            except OSError:  # gone meanwhile, or not ours to remove after all: left as it is
                continue
            removed += 1
        for d in dirs:  # deepest first; one a running process still fills stays for next time
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            (ns / TAG_NAME).unlink()
            ns.rmdir()
    return removed
