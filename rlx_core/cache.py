"""On-disk caches (calibrated cost models and the like): JSON only, written atomically.

Never pickle: a cache file is data another process (or another version of rlx) may
write, and loading it must not run code. Every entry records the schema it was written
with and the identity of what it describes (plugin version, device, driver versions), so
a stale or foreign entry is noticed, warned about and recomputed instead of trusted.
Writes go to a temp file in the same directory and are renamed over the target, so
concurrent writers (threads or processes) never leave a torn file: the last one wins.

Layout: ``<root>/<namespace>/<key>.json``; ``root`` is ``RLX_CACHE_DIR`` (an absolute
path) or the platform's user cache dir. Each namespace directory carries a
``CACHEDIR.TAG`` (the standard marker backup tools honour), which is how ``cache_info``
and ``clear_cache`` recognise directories that are rlx's (and say what each holds: the
tag's ``# what:`` line). rlx creates a namespace directory already tagged (mode 0700)
and never tags a directory that already holds files it did not write: a user's folder
that happens to sit where a namespace would is left alone, and nothing is cached there.

``rlx cache clear`` deletes only what rlx wrote: the files it recognises as its entries
(their JSON format) and the files an entry lists as its own (``JsonCache.put(...,
files=...)``). A plugin that keeps a cache in another format (rlx-jax-tpu: JAX's
compiled programs) records each file it writes that way, so that ``rlx cache info``
lists them and ``rlx cache clear`` removes them; anything else in a namespace stays, and
is counted as left.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from .errors import CacheWarning, ConfigError

__all__ = ["cache_dir", "atomic_write_text", "JsonCache", "cache_info", "clear_cache", "tag_cache_dir",
           "cache_namespaces", "ClearedCache", "ForeignDirectoryError"]

TAG_NAME = "CACHEDIR.TAG"
_TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file marks an rlx cache directory (https://bford.info/cachedir/).\n"
    "# Its contents are recomputed when missing; `rlx cache clear` removes them.\n"
)
_TAG_MARK = "rlx cache"  # what tells rlx's tags from another program's
_WHAT = "# what: "
_ENTRY_KEYS = {"schema", "identity", "payload"}
_FILES = "files"  # the optional fourth key of an entry: the files it owns in its namespace
_MAX_ENTRY_BYTES = 16 << 20  # a JSON file larger than this is not one of rlx's entries
log = logging.getLogger("rlx.cache")
_SAFE_KEY = re.compile(r"[a-z0-9][a-z0-9_.\-]{0,63}")
_SAFE_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
# Names Windows refuses whatever the extension; hashed like any other odd key.
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
# What ``tempfile.mkstemp``/``mkdtemp`` make for ``atomic_write_text`` and ``tag_cache_dir``:
# ``.<target name>.<8 random characters>.tmp``.
_TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


class ForeignDirectoryError(FileExistsError):
    """Where rlx would keep a cache namespace, a directory that is not rlx's already holds
    files: rlx neither tags it nor writes there (``rlx cache clear`` would else delete them)."""


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The cache root: ``RLX_CACHE_DIR`` when set, else the platform's user cache dir.

    ``RLX_CACHE_DIR`` must be an absolute path (``~`` is expanded): a relative one would put
    the cache, and what ``rlx cache clear`` deletes, under whatever folder a command runs
    in. Anything else is a ``ConfigError`` naming the variable and its value.
    """
    env = os.environ if environ is None else environ
    configured = env.get("RLX_CACHE_DIR", "").strip()
    default = Path(platformdirs.user_cache_dir("rlx", appauthor=False))
    if not configured:
        return default
    fix = f"set it to an absolute path, or unset it for the user cache dir ({default})"
    if any(ord(c) < 32 or ord(c) == 127 for c in configured):
        raise ConfigError(f"RLX_CACHE_DIR={configured!r} contains a control character; {fix}")
    path = Path(os.path.expanduser(configured))  # an unknown ~user stays as it is, and is relative
    if not path.is_absolute():
        raise ConfigError(f"RLX_CACHE_DIR={configured!r} is not an absolute path (rlx would keep its cache under "
                          f"whatever folder a command runs in); {fix}")
    return path


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


def _plain_file_name(name: object) -> bool:
    """Whether ``name`` names a file directly inside a namespace (no directory part, not the
    tag): what an entry may list as its own, so that clearing it cannot reach elsewhere."""
    return (isinstance(name, str) and name not in ("", ".", "..", TAG_NAME) and "/" not in name
            and "\\" not in name and "\0" not in name and name == os.path.basename(name))


def _entry_files(entry: Any) -> list[str] | None:
    """The files ``entry`` (a parsed JSON value) owns, when it is an rlx entry; else ``None``."""
    if not isinstance(entry, dict) or set(entry) - {_FILES} != _ENTRY_KEYS or not isinstance(entry["payload"], dict):
        return None
    files = entry.get(_FILES, [])
    if not isinstance(files, list) or not all(_plain_file_name(f) for f in files):
        return None
    return files


def _is_ours(directory: Path) -> bool:
    return _tag_text(directory) is not None


class JsonCache:
    """One namespace of JSON entries (e.g. ``JsonCache("cost-models", schema=1)``).

    ``schema`` is the version of the payload layout: bump it when the payload changes
    meaning, and older entries are ignored. ``identity`` says what an entry describes;
    an entry read with a different identity is stale. ``root`` defaults to
    ``cache_dir()``, evaluated at each use so ``RLX_CACHE_DIR`` changes take effect.
    ``what`` says in a line what the namespace holds (``rlx cache info``); ``recompute``
    ends the warning about an unusable entry with what happens next (default "it will be
    recomputed"; calibration says which command measures again).

    No entry is used from, written to or removed from a directory that is not rlx's (no
    rlx ``CACHEDIR.TAG``): a user's folder where the namespace would be stays untouched.
    """

    def __init__(self, namespace: str, schema: int, root: str | os.PathLike[str] | None = None, *,
                 what: str = "", recompute: str = "it will be recomputed") -> None:
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

        A missing file is a silent ``None``, and so is a namespace directory that is not
        rlx's (``put`` says why nothing is cached there). A corrupt or truncated file, an
        entry of an older schema and one written for another identity are each a
        ``CacheWarning`` naming the file and why, then removed (with the files it lists as
        its own), then ``None``: the caller recomputes it, and until it does no later
        process warns again (an entry is keyed by ``key`` alone, so the next ``put`` would
        overwrite it anyway). An entry of a *newer* schema belongs to a newer rlx sharing
        this cache: it is left alone and ignored with a log line, not a warning each process.
        """
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                seen = os.fstat(f.fileno())
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if not _is_ours(path.parent):
                return None
            return self._ignore(path, f"it could not be read ({type(exc).__name__}: {exc})")
        if not _is_ours(path.parent):
            return None
        try:
            entry = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return self._ignore(path, f"it could not be read ({type(exc).__name__}: {exc})", seen)
        except ValueError as exc:
            return self._ignore(path, f"it is not valid JSON, perhaps truncated ({exc})", seen)
        files = _entry_files(entry)
        if files is None:
            return self._ignore(path, "it is not an rlx cache entry (expected schema, identity and payload)", seen)
        schema = entry["schema"]
        if schema != self.schema:
            if isinstance(schema, int) and not isinstance(schema, bool) and schema > self.schema:
                log.info("rlx cache: ignoring %s: schema %s is a newer rlx's (this one reads %s); left for it",
                         path, schema, self.schema)
                return None
            why = f"it has schema {schema!r}, this version of rlx reads {self.schema}"
            return self._ignore(path, why, seen, files)
        wanted = _jsonable(identity)
        if entry["identity"] != wanted:
            stored = entry["identity"] if isinstance(entry["identity"], dict) else {}
            diffs = [f"{k} {stored.get(k)!r} cached, {wanted.get(k)!r} now"
                     for k in sorted(set(stored) | set(wanted)) if stored.get(k) != wanted.get(k)]
            return self._ignore(path, "it was written for another identity (" + "; ".join(diffs) + ")", seen, files)
        return entry["payload"]

    def put(self, key: str, identity: Mapping[str, Any], payload: Mapping[str, Any], *,
            files: Sequence[str] = ()) -> None:
        """Store ``payload`` under ``key`` for ``identity``, atomically.

        ``files`` names the files beside the entry (in the namespace directory) that the
        caller wrote for it: the entry is their record, so ``rlx cache clear`` and
        ``remove`` delete them with it, and ``rlx cache info`` counts them as rlx's. This
        is how a plugin keeping a cache in another format says which files are its own.

        A cache that cannot be written (read-only, full disk, path blocked by a file, a
        directory that is not rlx's) is a ``CacheWarning``, never an error: the value is
        simply recomputed next time. A payload that is not JSON-serializable, or a file
        name with a directory part, is the caller's bug and raises.
        """
        bad = [f for f in files if not _plain_file_name(f)]
        if bad:
            raise ConfigError(f"cache namespace {self.namespace!r}: an entry may list only plain file names beside "
                              f"it, not {bad[0]!r}")
        entry: dict[str, Any] = {"schema": self.schema, "identity": dict(identity), "payload": dict(payload)}
        if files:
            entry[_FILES] = list(files)
        text = json.dumps(entry, indent=1, sort_keys=True)
        path = self.path(key)
        try:
            if self.what or not (path.parent / TAG_NAME).exists():  # rewritten only if it says otherwise
                tag_cache_dir(path.parent, self.what)
            atomic_write_text(path, text + "\n")
        except OSError as exc:
            warnings.warn(f"rlx cache: could not write {path}: {type(exc).__name__}: {exc}; continuing without "
                          "caching it", CacheWarning, stacklevel=2)

    def remove(self, key: str) -> bool:
        """Delete ``key``'s entry and the files it lists as its own; ``True`` if there was
        an entry. A file that cannot be removed is a ``CacheWarning`` (the entry then stays
        until ``rlx cache clear``); nothing is removed from a directory that is not rlx's."""
        path = self.path(key)
        if not _is_ours(path.parent):
            return False
        for name in _read_entry_files(path):
            with contextlib.suppress(OSError):
                (path.parent / name).unlink()
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
        self._ignore(path, why, seen, _read_entry_files(path))

    def _ignore(self, path: Path, why: str, seen: os.stat_result | None = None, files: Sequence[str] = ()) -> None:
        """Warn that ``path`` is not used and, when ``seen`` (the stat of what was read) is
        given, remove it and the ``files`` it lists: once warned about, an entry no rlx here
        can use must not be warned about by every later process until someone recomputes
        it. A writer that replaced the file meanwhile (``put`` renames a new inode over it)
        keeps its entry; nothing is removed from a directory that is not rlx's."""
        removed = ""
        if seen is not None and _is_ours(path.parent):
            with contextlib.suppress(OSError):
                now = os.stat(path)
                if (now.st_ino, now.st_mtime_ns, now.st_size) == (seen.st_ino, seen.st_mtime_ns, seen.st_size):
                    for name in files:
                        with contextlib.suppress(OSError):
                            (path.parent / name).unlink()
                    path.unlink()
                    removed = "removed; "
        warnings.warn(f"rlx cache: ignoring {path} because {why}; {removed}{self.recompute}", CacheWarning,
                      stacklevel=3)
        return None


def _read_entry_files(path: Path) -> list[str]:
    """The files the entry at ``path`` lists as its own (none when it is not an entry)."""
    return _read_entry(path) or []


def _read_entry(path: Path) -> list[str] | None:
    """``path``'s own files when it is an rlx entry (a regular file, not a link, in rlx's
    JSON format), else ``None``: how ``clear_cache`` tells rlx's files from anyone else's."""
    try:
        if path.is_symlink():
            return None
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_ENTRY_BYTES:
                return None
            entry = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return _entry_files(entry)


def tag_cache_dir(directory: str | os.PathLike[str], what: str = "") -> Path:
    """Make ``directory`` one of rlx's cache namespaces, with a ``CACHEDIR.TAG`` saying
    ``what`` it holds; returns the directory.

    A missing directory is created already tagged (a private temp directory, mode 0700,
    renamed into place, so no process ever sees it untagged). An existing one is rlx's
    when it carries rlx's tag; an untagged one is tagged only when it holds nothing, or
    nothing but files in rlx's own formats (what a namespace looks like between a ``rlx
    cache clear`` and a concurrent write): rlx never adopts a folder someone else filled,
    since ``rlx cache clear`` would then delete what is in it. Raises
    ``ForeignDirectoryError`` (an ``OSError``) naming the directory and a file in it for
    such a folder, and ``OSError`` when the directory cannot be created or written.
    """
    path = Path(directory)
    text = _TAG_TEXT + (f"{_WHAT}{' '.join(what.split())}\n" if what.strip() else "")
    tag = path / TAG_NAME
    if not _is_ours(path):
        _claim(path, text)
    try:
        current = tag.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        current = ""
    if current != text:
        atomic_write_text(tag, text)
    return path


def _claim(path: Path, tag_text: str) -> None:
    """Create ``path`` tagged, or tag it when it holds nothing that is not rlx's (see
    ``tag_cache_dir``); raise ``ForeignDirectoryError`` when it does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not os.path.lexists(path):
        staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))  # mode 0700
        try:
            (staging / TAG_NAME).write_text(tag_text, encoding="utf-8")
            os.rename(staging, path)  # atomic; fails when another process filled ``path`` first
            return
        except OSError:
            if not path.is_dir():
                raise
        finally:
            with contextlib.suppress(OSError):
                (staging / TAG_NAME).unlink()
                staging.rmdir()
    if _is_ours(path):  # another process created it meanwhile
        return
    if not path.is_dir() or path.is_symlink():
        kind = "a symbolic link" if path.is_symlink() else "not a directory"
        raise ForeignDirectoryError(f"{path} is {kind}; rlx keeps a cache namespace only in a directory of its own")
    items = sorted(path.iterdir())  # only the top level: a subdirectory is foreign as it is, unread
    subdirs = [p for p in items if p.is_dir()]
    others = _sort_files(path, [p for p in items if p not in subdirs])[2]
    foreign = sorted({*subdirs, *others, *(p for p in items if p.name == TAG_NAME)})
    if foreign:
        raise ForeignDirectoryError(
            f"{path} already exists and is not an rlx cache directory (no rlx CACHEDIR.TAG; it holds "
            f"{len(foreign)} item{'s' if len(foreign) != 1 else ''} rlx did not write, e.g. "
            f"{str(foreign[0].relative_to(path))!r}): rlx does not adopt it; move it or point RLX_CACHE_DIR "
            "elsewhere")


def _temp_file(name: str) -> bool:
    """Whether ``name`` is one of rlx's temp files (a write in progress or interrupted)."""
    return _TEMP_NAME.fullmatch(name) is not None


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
    """Namespace directories under ``root`` that rlx created (they carry our CACHEDIR.TAG;
    a ``.name.*.tmp`` directory is one being created, not a namespace)."""
    if not root.is_dir():
        return []
    return [child for child in sorted(root.iterdir()) if not child.name.startswith(".") and _is_ours(child)]


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


def _sort_files(namespace_dir: Path, files: list[Path] | None = None) -> tuple[list[Path], list[Path], list[Path]]:
    """``(entries, temp files, others)`` of a namespace's ``files`` (default: all, in any
    subdirectory), its tag in none of them.

    Entries are what rlx wrote and recognises as its own: JSON files in its entry format
    directly in the namespace, and the files each lists as its own. Temp files are rlx's
    interrupted or in-progress writes. Everything else (a user's file, a file another
    program put there, a file an older rlx wrote without a record) is an other.
    """
    files = _walk(namespace_dir)[0] if files is None else files
    present = set(files)
    entries: set[Path] = set()
    temps: list[Path] = []
    for p in files:
        if p.parent != namespace_dir or p.name == TAG_NAME:
            continue
        if _temp_file(p.name):
            temps.append(p)
        elif p.suffix == ".json" and (listed := _read_entry(p)) is not None:
            entries.add(p)
            entries.update(q for q in (namespace_dir / name for name in listed) if q in present)
    others = [p for p in files if p not in entries and p not in temps and p != namespace_dir / TAG_NAME]
    return sorted(entries), temps, others


def cache_namespaces(root: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """``[{"name", "entries", "bytes", "what", "other"}]`` for every rlx namespace under
    ``root`` (default ``cache_dir()``), by name: ``rlx cache info``'s rows. ``entries`` and
    ``bytes`` count the files rlx wrote (what ``rlx cache clear`` removes); ``other``, the
    files in the namespace that rlx did not write (and leaves)."""
    base = cache_dir() if root is None else Path(root)
    rows = []
    for ns in _own_namespaces(base):
        entries, _, others = _sort_files(ns)
        size = 0
        for p in entries:
            with contextlib.suppress(OSError):
                size += p.lstat().st_size
        tag = _tag_text(ns) or ""
        what = next((line[len(_WHAT):].strip() for line in tag.splitlines() if line.startswith(_WHAT)), "")
        rows.append({"name": ns.name, "entries": len(entries), "bytes": size, "what": what, "other": len(others)})
    return rows


def cache_info(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``{"path", "entries": {namespace: count}, "total_entries", "bytes", "namespaces"}``
    for ``rlx cache info`` (``namespaces`` as ``cache_namespaces`` gives them)."""
    base = cache_dir() if root is None else Path(root)
    namespaces = cache_namespaces(base)
    return {"path": str(base), "entries": {ns["name"]: ns["entries"] for ns in namespaces},
            "total_entries": sum(ns["entries"] for ns in namespaces), "bytes": sum(ns["bytes"] for ns in namespaces),
            "namespaces": namespaces}


@dataclass(frozen=True)
class ClearedCache:
    """What ``clear_cache`` did: ``removed`` files rlx wrote; ``left``, the files in rlx's
    namespaces that rlx did not write (kept); ``failed``, files of rlx's it could not remove."""

    removed: int
    left: tuple[Path, ...] = ()
    failed: tuple[Path, ...] = ()


def clear_cache(root: str | os.PathLike[str] | None = None,
                namespaces: Iterable[str] | None = None) -> ClearedCache:
    """Remove the files rlx wrote under ``root`` (default ``cache_dir()``): its entries,
    the files each entry lists as its own (a plugin's cache in its own format), its
    stray temp files; say how many went and which files were left.

    ``namespaces`` limits it to those (``rlx cache clear calibration``); a name that is
    not an rlx namespace there is a ``ConfigError`` listing the ones that are. Only
    directories marked with rlx's ``CACHEDIR.TAG`` are looked into, and in them only
    files rlx recognises as its own are deleted: a mistaken ``RLX_CACHE_DIR`` (say, the
    home directory) or a file someone put in a namespace loses nothing. A directory is
    removed only once it is empty; a namespace that still holds files keeps its tag.
    """
    base = cache_dir() if root is None else Path(root)
    own = _own_namespaces(base)
    if namespaces is not None:
        wanted = list(dict.fromkeys(namespaces))
        names = {ns.name for ns in own}
        unknown = [n for n in wanted if n not in names]
        if unknown:
            listed = ", ".join(sorted(names)) or "none"
            there = base / unknown[0]
            foreign = f" ({there} is not rlx's: left alone)" if os.path.lexists(there) else ""
            raise ConfigError(f"no rlx cache namespace {unknown[0]!r} in {base}{foreign}; its namespaces: {listed}")
        own = [ns for ns in own if ns.name in wanted]
    removed = 0
    left: list[Path] = []
    failed: list[Path] = []
    for ns in own:
        entries, temps, others = _sort_files(ns)
        left += others
        for p in entries + temps:
            try:
                p.unlink()
            except FileNotFoundError:  # gone meanwhile
                continue
            except OSError:
                failed.append(p)
                continue
            removed += 1
        for d in _walk(ns)[1]:  # deepest first; only empty ones go
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            if [p.name for p in ns.iterdir()] == [TAG_NAME]:
                (ns / TAG_NAME).unlink()
                ns.rmdir()
    return ClearedCache(removed, tuple(sorted(left)), tuple(failed))
