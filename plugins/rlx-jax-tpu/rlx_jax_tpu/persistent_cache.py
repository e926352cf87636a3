"""JAX's persistent compilation cache under rlx's cache directory, verified before use.

A JAX cache entry is a serialized XLA executable: JAX loads and runs whatever bytes sit
under a key's file name, so anyone who can change the directory chooses the code rlx
runs (swap two entries and a relu graph returns a neg graph's output). rlx therefore
uses the cache only when both hold:

- the directory is rlx's: created by rlx (tagged, mode 0700) or an empty one it tagged,
  owned by this user and writable by no one else, and not a symbolic link;
- every entry is verified: when JAX writes an entry, rlx records an HMAC-SHA256 of the
  key and the entry's bytes, made with a per-user secret key (``<rlx cache dir>/.rlx-
  jax-cache.key``, mode 0600, outside the JAX folder), in a signature record beside it
  (a ``JsonCache`` entry that also lists JAX's files for that key, so ``rlx cache
  clear`` deletes exactly those). Reading, an entry is handed to JAX only when its HMAC
  matches; a mismatch, or an entry rlx has no record of writing, is a ``CacheWarning``
  naming it, the entry is removed and JAX compiles the program again.

rlx does this by replacing JAX's cache object (``jax._src.compilation_cache._cache``)
with ``VerifyingCache``, a wrapper around JAX's own ``LRUCache``. Those are JAX
internals: when they are not exactly what this module knows (another JAX version), the
persistent cache stays off (no cache is the safe answer) and the reason is kept for
``rlx devices --explain``. A cache directory the user configured for JAX
(``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) is the user's business: rlx leaves it
to JAX, unverified, and says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import inspect
import logging
import os
import secrets
import stat
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from rlx_core.errors import CacheWarning, ConfigError
from rlx_core.plugin import JsonCache, cache_dir, tag_cache_dir

__all__ = ["VerifyingCache", "enable_persistent_cache", "persistent_cache_reason", "KEY_FILE"]

log = logging.getLogger("rlx.jax")

#: What ``rlx cache info`` says the directory holds.
WHAT = "JAX's compiled XLA programs, each checked against rlx's keyed hash before use (rlx-jax-tpu)"
#: The per-user secret the signatures are made with, in rlx's cache dir (not the JAX folder).
KEY_FILE = ".rlx-jax-cache.key"
_KEY_BYTES = 32
_RECORD_SCHEMA = 1
_RECORD_IDENTITY = {"mac": "hmac-sha256(key, NUL, entry bytes)"}
# JAX's XLA side caches that the persistent cache turns on by default (autotuning results
# on GPU) are written under the same directory and are not verified: rlx turns them off.
_XLA_CACHES_DEFAULT = "xla_gpu_per_fusion_autotune_cache_dir"

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "dir": str | None, "reason": str, once decided in this process


class CacheRefused(Exception):
    """Why rlx does not use a persistent cache here (the message is the reason)."""


class VerifyingCache:
    """JAX's ``CacheInterface`` (``get``/``put``) over JAX's ``LRUCache``: ``put`` records
    an HMAC of each entry, ``get`` returns an entry only when it matches (see the module).

    ``verified`` counts the entries handed to JAX; ``refused`` lists the keys of entries
    that were not (warned about and removed), in order: what a test or a curious user
    can read from ``jax._src.compilation_cache._cache``.
    """

    def __init__(self, base: Any, directory: Path, secret: bytes, records: JsonCache, cache_suffix: str,
                 atime_suffix: str) -> None:
        self._base = base
        self._path = directory  # JAX reads it (``reset_cache`` logs it)
        self._secret = secret
        self._records = records
        self._suffixes = (cache_suffix, atime_suffix)
        self.verified = 0
        self.refused: list[str] = []

    def _files(self, key: str) -> list[str]:
        """The files JAX's ``LRUCache`` writes for ``key``: the entry and its access time."""
        return [f"{key}{suffix}" for suffix in self._suffixes]

    def _mac(self, key: str, value: bytes) -> str:
        """The key is in the hash, so an entry moved to another key (with its record) fails."""
        return hmac.new(self._secret, key.encode("utf-8", "surrogatepass") + b"\0" + value, hashlib.sha256).hexdigest()

    def get(self, key: str) -> bytes | None:
        """The entry for ``key`` when rlx wrote exactly these bytes under this key, else
        ``None`` (JAX then compiles and ``put``s again)."""
        try:
            value = self._base.get(key)
        except Exception as exc:  # a cache never makes a compile fail
            self._warn(key, f"could not be read ({type(exc).__name__}: {exc})", removed=False)
            return None
        if value is None:
            return None
        record = self._records.get(key, _RECORD_IDENTITY)
        if record is None or not isinstance(record.get("mac"), str) or record.get("key") != key:
            return self._refuse(key, "rlx has no record of writing it (no signature: another program, another user "
                                     "or an older rlx put it there)")
        if not hmac.compare_digest(record["mac"], self._mac(key, value)):
            return self._refuse(key, "its bytes do not match the keyed hash rlx recorded when it wrote them (changed "
                                     "or swapped since)")
        self.verified += 1
        return value

    def put(self, key: str, value: bytes) -> None:
        """Let JAX's ``LRUCache`` write the entry, then record its HMAC, once the bytes on
        disk are the ones given (another process may have written the key first: its own
        record stands, or its entry is refused when read)."""
        entry = self._path / self._files(key)[0]
        try:
            self._base.put(key, value)
            on_disk = entry.read_bytes()
        except Exception as exc:  # a cache never makes a compile fail
            self._warn(key, f"could not be written ({type(exc).__name__}: {exc})", removed=False)
            return
        if on_disk == value:
            self._records.put(key, _RECORD_IDENTITY, {"key": key, "mac": self._mac(key, value), "bytes": len(value)},
                              files=self._files(key))

    def _refuse(self, key: str, why: str) -> None:
        """Warn, and remove the entry so that JAX's ``put`` (which skips a key whose file
        exists) can write the recompiled program and rlx sign it: warned about once."""
        self.refused.append(key)
        lock = getattr(self._base, "lock", None) if getattr(self._base, "eviction_enabled", False) else None
        with lock if lock is not None else contextlib.nullcontext():
            for path in [*(self._path / name for name in self._files(key)), self._records.path(key)]:
                with contextlib.suppress(OSError):  # not ``records.remove``: it trusts the record's file list
                    path.unlink()
        self._warn(key, why, removed=True)
        return None

    def _warn(self, key: str, why: str, removed: bool) -> None:
        entry = self._path / self._files(key)[0]
        then = "removed; JAX compiles the program again" if removed else "compiling without it"
        warnings.warn(f"rlx-jax-tpu: JAX's cached program {entry} (key {key}) {why}; not used: {then}", CacheWarning,
                      stacklevel=3)


def persistent_cache_reason() -> str:
    """Where JAX's persistent cache is and why, or why there is none, in one line (for
    ``rlx devices --explain`` and ``CompiledGraph.report()``). Decides it if not yet done."""
    enable_persistent_cache()
    return str(_state["reason"])


def enable_persistent_cache() -> str | None:
    """Set up JAX's persistent compilation cache for rlx, once per process; returns the
    directory JAX uses, or ``None`` (``persistent_cache_reason`` says why).

    A refusal that the user can act on (a folder that is not rlx's, a directory others
    can write, a key file that is not private) is also a ``CacheWarning``; compiling
    always goes on, without a persistent cache: a cache must never make a compile fail.
    """
    with _lock:
        if "reason" not in _state:
            directory, reason = _decide()
            _state.update(dir=directory, reason=reason)
        return _state["dir"]


def _decide() -> tuple[str | None, str]:
    """``(directory or None, reason)``: the checks in the order that answers the user best
    (their own configuration first; then JAX's internals, which no setting fixes; then
    rlx's directory and key, which they can fix)."""
    import jax

    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return str(configured), (f"JAX persistent cache: {configured}, configured by the user "
                                 "(JAX_COMPILATION_CACHE_DIR or jax.config): JAX's own, left to JAX and not "
                                 "verified by rlx")
    if not getattr(jax.config, "jax_enable_compilation_cache", True):
        return None, "JAX persistent cache: off (jax_enable_compilation_cache is false)"
    internals = _jax_internals()
    if isinstance(internals, str):
        log.info("rlx-jax-tpu: %s", internals)
        return None, f"JAX persistent cache: off: {internals}"
    try:
        root = cache_dir()
        directory = _private_directory(root / "jax")
        secret = _load_secret(root / KEY_FILE)
        _install(jax, internals, directory, secret)
    except (CacheRefused, ConfigError, OSError) as exc:
        reason = f"JAX persistent cache: off: {exc}"
        warnings.warn(f"rlx-jax-tpu: {reason}; compiling without a persistent cache", CacheWarning, stacklevel=4)
        return None, reason
    return str(directory), (f"JAX persistent cache: {directory}, each program checked against rlx's "
                            "keyed hash (HMAC-SHA256) before JAX loads it")


def _jax_internals() -> tuple[Any, Any] | str:
    """``(compilation_cache, lru_cache)``, JAX's modules, when they have what rlx replaces
    and wraps, exactly as this module knows it; else why not (a string)."""
    import jax

    try:
        from jax._src import compilation_cache as cc
        from jax._src import lru_cache
    except ImportError as exc:
        return f"JAX {jax.__version__} has no jax._src.compilation_cache or lru_cache ({exc}); no cache is safer"
    wanted = [(cc, name) for name in ("_cache", "_cache_initialized", "_cache_initialized_mutex", "_get_cache",
                                      "CacheInterface")]
    wanted += [(lru_cache, name) for name in ("LRUCache", "_CACHE_SUFFIX", "_ATIME_SUFFIX")]
    missing = [f"{module.__name__}.{name}" for module, name in wanted if not hasattr(module, name)]
    for option in ("jax_compilation_cache_max_size", "jax_persistent_cache_enable_xla_caches"):
        if not hasattr(jax.config, option):
            missing.append(f"jax.config.{option}")
    if not missing:
        try:
            params = inspect.signature(lru_cache.LRUCache).parameters
        except (TypeError, ValueError):
            params = {}
        if "path" not in params or "max_size" not in params:
            missing.append("LRUCache(path, max_size=...)")
    if missing:
        return (f"JAX {jax.__version__}'s compilation-cache internals are not the ones rlx-jax-tpu verifies (missing: "
                f"{', '.join(missing)}); no cache is the safe answer")
    return cc, lru_cache


def _private_directory(path: Path) -> Path:
    """``path`` as rlx's tagged cache namespace (created mode 0700), checked: a directory,
    not a link, owned by this user, writable by no one else. Raises ``CacheRefused``."""
    tag_cache_dir(path, WHAT)  # never adopts a folder that holds files rlx did not write (ForeignDirectoryError)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise CacheRefused(f"{path} is not a directory of rlx's (a link or a file)")
    me = _uid()
    if me is not None and st.st_uid != me:
        raise CacheRefused(f"{path} is owned by uid {st.st_uid}, not this user (uid {me}): others could choose the "
                           "programs JAX runs")
    if st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("its group", 0o020), ("other users", 0o002)) if st.st_mode & bit)
        raise CacheRefused(f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}), who could choose the "
                           f"programs JAX runs; `chmod go-w {path}` makes it private")
    return path


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)
    return getuid() if getuid is not None else None


def _load_secret(path: Path) -> bytes:
    """The per-user key (``_KEY_BYTES`` random bytes), created once at ``path`` with mode
    0600 (linked into place from a private temp file, so racing processes agree on one).
    Refused unless a regular file owned by this user that no one else can read or write:
    whoever knows the key can sign programs for rlx to run."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            _create_secret(path)
            continue
        except OSError as exc:
            raise CacheRefused(f"its key file {path} cannot be opened ({type(exc).__name__}: {exc})") from exc
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read(_KEY_BYTES + 1)
        me = _uid()
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise CacheRefused(f"its key file {path} is not a plain file of its own (a link or a special file)")
        if me is not None and (st.st_uid != me or st.st_mode & 0o077):
            raise CacheRefused(f"its key file {path} is not private to this user (owner uid {st.st_uid}, mode "
                               f"{stat.S_IMODE(st.st_mode):o}; expected uid {me}, mode 600)")
        if len(data) != _KEY_BYTES:
            raise CacheRefused(f"its key file {path} holds {len(data)} bytes, not {_KEY_BYTES}; remove it and rlx "
                               "makes a new one (the signed programs are then compiled again)")
        return data
    raise CacheRefused(f"its key file {path} vanished while it was being created")


def _create_secret(path: Path) -> None:
    """Write a new random key at ``path`` unless another process got there first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(_KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first: its key is the key
            os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _install(jax: Any, internals: tuple[Any, Any], directory: Path, secret: bytes) -> None:
    """Put a ``VerifyingCache`` over JAX's ``LRUCache`` at ``directory`` where JAX looks for
    its cache, under JAX's own lock, and point the config at the directory (what JAX's
    ``is_persistent_cache_enabled`` reads). Refused when JAX's cache is already set up."""
    cc, lru_cache = internals
    cls = type("VerifyingCache", (VerifyingCache, cc.CacheInterface), {"__module__": __name__})
    records = JsonCache("jax", _RECORD_SCHEMA, directory.parent, what=WHAT, recompute="JAX compiles it again")
    with cc._cache_initialized_mutex:
        if cc._cache is not None or cc._cache_initialized:
            raise CacheRefused("JAX's compilation cache was set up in this process before rlx (by the user or another "
                               "library); rlx leaves it alone")
        try:
            base = lru_cache.LRUCache(str(directory), max_size=jax.config.jax_compilation_cache_max_size)
        except Exception as exc:  # e.g. a max size without the filelock package
            raise CacheRefused(f"JAX's LRUCache could not open {directory} ({type(exc).__name__}: {exc})") from exc
        jax.config.update("jax_compilation_cache_dir", str(directory))
        if jax.config.jax_persistent_cache_enable_xla_caches == _XLA_CACHES_DEFAULT:
            jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
        cache = cls(base, directory, secret, records, lru_cache._CACHE_SUFFIX, lru_cache._ATIME_SUFFIX)
        if getattr(jax.config, "jax_compilation_cache_check_contents", False) and hasattr(cc, "VerificationCache"):
            cache = cc.VerificationCache(cache)  # the user's debugging check, as JAX's own setup would add it
        cc._cache = cache
        cc._cache_initialized = True
    if getattr(base, "eviction_enabled", False):  # JAX's lock file is rlx's to clear too
        records.put("jax-lock-file", _RECORD_IDENTITY, {"what": "LRUCache's lock"}, files=[".lockfile"])
