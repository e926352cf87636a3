"""On-disk caches (calibrated cost models and the like): JSON only, written atomically.

Never pickle: a cache file is data another process (or another version of rlx) may
write, and loading it must not run code. Every entry records the schema it was written
with and the identity of what it describes (plugin version, device, driver versions), so
a stale or foreign entry is noticed, warned about and recomputed instead of trusted.
Writes go to a temp file in the same directory and are renamed over the target, so
concurrent writers (threads or processes) never leave a torn file: the last one wins.

Layout: ``<root>/<namespace>/<key>.json``; each namespace directory carries a
``CACHEDIR.TAG`` (the standard marker backup tools honour), which is also how
``clear_cache`` recognises directories that are rlx's to delete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import platformdirs

from .errors import CacheWarning, ConfigError

__all__ = ["cache_dir", "atomic_write_text", "JsonCache", "cache_info", "clear_cache"]

TAG_NAME = "CACHEDIR.TAG"
_TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file marks an rlx cache directory (https://bford.info/cachedir/).\n"
    "# Its contents are recomputed when missing; `rlx cache clear` removes them.\n"
)
_ENTRY_KEYS = {"schema", "identity", "payload"}
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
    """

    def __init__(self, namespace: str, schema: int, root: str | os.PathLike[str] | None = None) -> None:
        if not isinstance(namespace, str) or not _SAFE_NAMESPACE.fullmatch(namespace):
            raise ConfigError(f"cache namespace {namespace!r} must be letters, digits, '_', '.', '-' (at most 64)")
        if isinstance(schema, bool) or not isinstance(schema, int):
            raise ConfigError(f"cache schema must be an int, got {schema!r}")
        self.namespace = namespace
        self.schema = schema
        self._root = None if root is None else Path(root)

    @property
    def directory(self) -> Path:
        return (cache_dir() if self._root is None else self._root) / self.namespace

    def path(self, key: str) -> Path:
        """The file that holds ``key``."""
        return self.directory / _file_name(key)

    def get(self, key: str, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """The payload stored under ``key`` for ``identity``, or ``None``.

        A missing file is a silent ``None``; a corrupt, truncated, foreign-schema or
        stale (other identity) entry is a ``CacheWarning`` naming the file and why, then
        ``None`` so that the caller recomputes and overwrites it.
        """
        path = self.path(key)
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except UnicodeDecodeError as exc:
            return self._ignore(path, f"it could not be read ({type(exc).__name__}: {exc})", remove=True)
        except OSError as exc:
            return self._ignore(path, f"it could not be read ({type(exc).__name__}: {exc})")
        try:
            entry = json.loads(text)
        except ValueError as exc:
            return self._ignore(path, f"it is not valid JSON, perhaps truncated ({exc})", remove=True)
        if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS or not isinstance(entry["payload"], dict):
            return self._ignore(path, "it is not an rlx cache entry (expected schema, identity and payload)",
                                remove=True)  # fmt: skip
        if entry["schema"] != self.schema:
            return self._ignore(path, f"it has schema {entry['schema']!r}, this version of rlx reads {self.schema}")
        wanted = _jsonable(identity)
        if entry["identity"] != wanted:
            stored = entry["identity"] if isinstance(entry["identity"], dict) else {}
            diffs = [f"{k} {stored.get(k)!r} cached, {wanted.get(k)!r} now"
                     for k in sorted(set(stored) | set(wanted)) if stored.get(k) != wanted.get(k)]
            return self._ignore(path, "it was written for another identity (" + "; ".join(diffs) + ")")
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
            tag = path.parent / TAG_NAME
            if not tag.exists():
                atomic_write_text(tag, _TAG_TEXT)
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

    def _ignore(self, path: Path, why: str, remove: bool = False) -> None:
        """Warn that ``path`` is not used. A file no rlx could ever read (garbage, torn) is
        also removed, so that it is warned about once, not by every process until someone
        recomputes it; a valid entry of another schema or identity is left to its owner."""
        removed = ""
        if remove:
            with contextlib.suppress(OSError):
                path.unlink()
                removed = "removed; "
        warnings.warn(f"rlx cache: ignoring {path} because {why}; {removed}it will be recomputed", CacheWarning,
                      stacklevel=3)
        return None


def _own_namespaces(root: Path) -> list[Path]:
    """Namespace directories under ``root`` that rlx created (they carry our CACHEDIR.TAG)."""
    if not root.is_dir():
        return []
    found = []
    for child in sorted(root.iterdir()):
        tag = child / TAG_NAME
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if child.is_dir() and tag.is_file() and "rlx cache" in tag.read_text(encoding="utf-8"):
                found.append(child)
    return found


def _own_files(namespace_dir: Path) -> list[Path]:
    return [p for p in sorted(namespace_dir.iterdir())
            if p.is_file() and (p.suffix == ".json" or (p.name.startswith(".") and p.suffix == ".tmp"))]


def cache_info(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``{"path", "entries": {namespace: count}, "total_entries", "bytes"}`` for ``rlx cache info``."""
    base = cache_dir() if root is None else Path(root)
    entries: dict[str, int] = {}
    total_bytes = 0
    for ns in _own_namespaces(base):
        files = [p for p in _own_files(ns) if p.suffix == ".json"]
        entries[ns.name] = len(files)
        for p in files:
            with contextlib.suppress(OSError):
                total_bytes += p.stat().st_size
    return {"path": str(base), "entries": entries, "total_entries": sum(entries.values()), "bytes": total_bytes}


def clear_cache(root: str | os.PathLike[str] | None = None) -> int:
    """Remove rlx's cache files under ``root`` (entries and stray temp files) and return
    how many files went.

    Only namespace directories marked with rlx's ``CACHEDIR.TAG`` are touched, so a
    mistaken ``RLX_CACHE_DIR`` (say, the home directory) loses nothing else.
    """
    base = cache_dir() if root is None else Path(root)
    removed = 0
    for ns in _own_namespaces(base):
        for p in _own_files(ns):
            try:
                p.unlink()
            except FileNotFoundError:
                continue
            removed += 1
        with contextlib.suppress(OSError):
            (ns / TAG_NAME).unlink()
            ns.rmdir()
    return removed
