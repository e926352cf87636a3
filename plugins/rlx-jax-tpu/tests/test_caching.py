"""The compile caches: JAX's persistent compilation cache under rlx's cache directory,
verified entry by entry (a swapped, tampered or unsigned entry is never executed), used
only in a private directory rlx created, off when JAX's internals are not the ones rlx
knows, left alone when the user configured it; and the in-process program LRU.

Where JAX's cache points is process-wide and decided once, so each step runs in a fresh
interpreter (``STEP``) with ``RLX_CACHE_DIR`` set to a temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

from rlx_core.cache import ClearedCache, JsonCache, cache_info, clear_cache
from rlx_core.errors import CacheWarning, ConfigError

pytest.importorskip("jax", reason="jax is not installed (pip install jax); the rlx-jax-tpu backends need it")

import rlx_jax_tpu.persistent_cache as persistent_cache  # after the skip: needs jax
from rlx_jax_tpu.caching import CompiledProgram, ProgramCache
from rlx_jax_tpu.persistent_cache import (
    KEY_FILE,
    CacheRefused,
    VerifyingCache,
    _load_secret,
    _private_directory,
)

X = [-1.0, 2.0, -3.0, 4.0]
WANT = {"relu": [0.0, 2.0, 0.0, 4.0], "neg": [1.0, -2.0, 3.0, -4.0]}

# One fresh process: optional setup code (argv[1]), then a relu graph and a neg graph
# compiled and run on the jax backend, every program written to the persistent cache.
STEP = textwrap.dedent("""
    import json, os, sys, warnings
    exec(sys.argv[1])
    import numpy as np
    import jax
    from rlx_core.ir import Graph
    from rlx_jax_tpu.backend import JaxBackend
    from rlx_jax_tpu.executable import JaxExecutable
    from rlx_jax_tpu.persistent_cache import persistent_cache_reason
    from jax._src import compilation_cache

    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # write even tiny programs
    X, out, new_files = json.loads(os.environ["STEP_X"]), {}, {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for op in ("relu", "neg"):
            jax_dir = jax.config.jax_compilation_cache_dir
            before = set(os.listdir(jax_dir)) if jax_dir and os.path.isdir(jax_dir) else set()
            g = Graph(op)
            g.set_outputs([getattr(g, op)(g.input("x", (4,)))])
            exe = JaxExecutable(g, jax.devices()[0])
            out[op] = exe.run({"x": np.array(X, np.float32)})[0].tolist()
            jax_dir = jax.config.jax_compilation_cache_dir
            after = set(os.listdir(jax_dir)) if jax_dir and os.path.isdir(jax_dir) else set()
            new_files[op] = sorted(after - before)
        # what `rlx devices --explain` shows: the probe's answer (last: its own program is cached too)
        probe = JaxBackend().probe().reason if os.environ.get("STEP_PROBE") else None
    cache = compilation_cache._cache
    print(json.dumps({
        "out": out, "new_files": new_files, "jax_dir": jax.config.jax_compilation_cache_dir,
        "exe_dir": exe.persistent_cache, "reason": persistent_cache_reason(), "report": exe.report_notes(),
        "verified": getattr(cache, "verified", None), "refused": getattr(cache, "refused", None), "probe": probe,
        "xla_caches": jax.config.jax_persistent_cache_enable_xla_caches,
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
    }))
""")


def _start(root: Path | str, setup: str = "", **env: str) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "RLX_"))}
    env = {**base, "JAX_PLATFORMS": "cpu", "RLX_CACHE_DIR": str(root), "STEP_X": json.dumps(X), **env}
    return subprocess.Popen([sys.executable, "-P", "-c", STEP, setup], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _step(root: Path | str, setup: str = "", **env: str) -> dict[str, Any]:
    return _result(_start(root, setup, **env))


def _cache_warnings(got: dict[str, Any]) -> list[str]:
    return [w for w in got["warnings"] if w.startswith("CacheWarning")]


def _entry(files: list[str]) -> str:
    """The one ``-cache`` file (JAX's entry) among the files a step added."""
    (name,) = [f for f in files if f.endswith("-cache")]
    return name


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """An rlx cache dir holding the relu and the neg program, written and signed by rlx:
    ``(root, {op: entry file name})``. Tests work on copies."""
    root = tmp_path_factory.mktemp("populated") / "cache"
    got = _step(root)
    assert got["out"] == WANT and got["jax_dir"] == got["exe_dir"] == str(root / "jax")
    assert _cache_warnings(got) == [] and got["verified"] == 0 and got["refused"] == []
    assert "checked against rlx's keyed hash" in got["reason"] and got["reason"] in got["report"][0]
    assert got["xla_caches"] == "none"  # XLA's own caches would sit in the same folder, unverified
    entries = {op: _entry(files) for op, files in got["new_files"].items()}
    assert entries["relu"] != entries["neg"]
    return root, entries


def _copy(populated: tuple[Path, dict[str, str]], tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    root, entries = populated
    copy = tmp_path / "cache"
    shutil.copytree(root, copy)  # modes kept: the jax dir stays 0700, the key 0600
    return copy, copy / "jax", entries


@pytest.mark.slow
def test_swapped_entries_are_never_executed(populated: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, jax_dir, entries = _copy(populated, tmp_path)
    relu, neg = jax_dir / entries["relu"], jax_dir / entries["neg"]
    relu_bytes, neg_bytes = relu.read_bytes(), neg.read_bytes()
    relu.write_bytes(neg_bytes)
    neg.write_bytes(relu_bytes)

    got = _step(root)
    assert got["out"] == WANT  # the relu graph computes relu, the neg graph neg
    assert got["verified"] == 0  # nothing swapped was handed to JAX
    assert sorted(got["refused"]) == sorted(name.removesuffix("-cache") for name in entries.values())
    warned = _cache_warnings(got)
    assert len(warned) == 2
    for name in entries.values():
        assert any(name in w and "do not match the keyed hash" in w and "compiles the program again" in w
                   for w in warned), warned

    again = _step(root, STEP_PROBE="1")  # recompiled and signed anew: verified and used
    assert again["out"] == WANT and again["verified"] == 2 and again["refused"] == []
    assert _cache_warnings(again) == []
    assert again["reason"] in again["probe"]  # `rlx devices --explain` says where the cache is


@pytest.mark.slow
def test_a_tampered_entry_and_an_unsigned_one_are_refused(populated: tuple[Path, dict[str, str]],
                                                          tmp_path: Path) -> None:
    root, jax_dir, entries = _copy(populated, tmp_path)
    relu = jax_dir / entries["relu"]
    data = bytearray(relu.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte flipped
    relu.write_bytes(bytes(data))
    key = entries["neg"].removesuffix("-cache")
    JsonCache("jax", 1, root).path(key).unlink()  # its signature gone: as if someone else wrote the entry

    got = _step(root)
    assert got["out"] == WANT and got["verified"] == 0 and len(got["refused"]) == 2
    warned = _cache_warnings(got)
    assert any(entries["relu"] in w and "do not match the keyed hash" in w for w in warned), warned
    assert any(entries["neg"] in w and "no record of writing it" in w for w in warned), warned


def test_clear_removes_what_rlx_wrote_and_leaves_a_stray_file(populated: tuple[Path, dict[str, str]],
                                                               tmp_path: Path) -> None:
    root, jax_dir, _ = _copy(populated, tmp_path)
    (jax_dir / "notes.txt").write_text("the user's")
    (row,) = [ns for ns in cache_info(root)["namespaces"] if ns["name"] == "jax"]
    assert (row["entries"], row["other"]) == (4, 1) and "JAX" in row["what"]  # two programs, two signatures

    assert clear_cache(root, ["jax"]) == ClearedCache(removed=4, left=(jax_dir / "notes.txt",))
    assert sorted(os.listdir(jax_dir)) == ["CACHEDIR.TAG", "notes.txt"]
    assert (root / KEY_FILE).exists()  # the key is not a cache entry: it outlives a clear


@pytest.mark.slow
def test_a_group_writable_directory_is_refused_with_its_reason(populated: tuple[Path, dict[str, str]],
                                                                tmp_path: Path) -> None:
    root, jax_dir, _ = _copy(populated, tmp_path)
    jax_dir.chmod(0o770)
    before = sorted(os.listdir(jax_dir))
    got = _step(root, STEP_PROBE="1")
    assert got["out"] == WANT and got["jax_dir"] is None and got["exe_dir"] is None
    assert "writable by its group (mode 770)" in got["reason"] and "chmod go-w" in got["reason"]
    assert got["reason"] in got["probe"] and got["reason"] in got["report"][0]  # --explain and report() say why
    assert any("writable by its group" in w for w in _cache_warnings(got))
    assert sorted(os.listdir(jax_dir)) == before  # nothing read from it, nothing written to it


@pytest.mark.slow
def test_a_users_folder_is_not_adopted_used_or_cleared(tmp_path: Path) -> None:
    # the case: RLX_CACHE_DIR holds the user's own jax/ folder
    root = tmp_path / "cache"
    user = root / "jax"
    (user / "src").mkdir(parents=True)
    (user / "README.md").write_text("mine")
    (user / "src" / "code.py").write_text("print('mine')")

    got = _step(root)
    assert got["out"] == WANT and got["jax_dir"] is None
    assert "is not an rlx cache directory" in got["reason"] and "'README.md'" in got["reason"]
    assert any("jax already exists and is not an rlx cache directory" in w for w in _cache_warnings(got))
    with pytest.raises(ConfigError, match="is not rlx's: left alone"):
        clear_cache(root, ["jax"])
    assert clear_cache(root).removed == 0
    assert sorted(str(p.relative_to(user)) for p in user.rglob("*")) == ["README.md", "src", "src/code.py"]


@pytest.mark.slow
def test_unsupported_jax_internals_turn_the_cache_off(tmp_path: Path) -> None:
    # another JAX version: what rlx would replace is not there, so there is no cache at all
    got = _step(tmp_path / "cache", "import jax._src.lru_cache as m; del m._ATIME_SUFFIX")
    assert got["out"] == WANT and got["jax_dir"] is None and got["verified"] is None
    assert "internals are not the ones rlx-jax-tpu verifies" in got["reason"]
    assert "(missing: jax._src.lru_cache._ATIME_SUFFIX)" in got["reason"] and "safe" in got["reason"]
    assert not (tmp_path / "cache" / "jax").exists()


@pytest.mark.slow
def test_a_configured_cache_is_the_users_and_a_blocked_one_is_off(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    procs = {"user": _start(tmp_path / "unused", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "own")),
             "blocked": _start(blocked)}
    got = {name: _result(p) for name, p in procs.items()}

    assert got["user"]["out"] == WANT and got["user"]["jax_dir"] == got["user"]["exe_dir"] == str(tmp_path / "own")
    assert "configured by the user" in got["user"]["reason"] and "not verified by rlx" in got["user"]["reason"]
    assert not (tmp_path / "unused").exists() and not list((tmp_path / "own").glob("*.json"))  # rlx wrote nothing

    assert got["blocked"]["out"] == WANT and got["blocked"]["jax_dir"] is None
    assert any("a-file" in w for w in _cache_warnings(got["blocked"])) and "a-file" in got["blocked"]["reason"]


# ----------------------------------------------------------------------------- in process
class _FakeLru:
    """What ``VerifyingCache`` uses of JAX's ``LRUCache``: files ``<key>-cache`` in a folder."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, key: str) -> bytes | None:
        entry = self.path / f"{key}-cache"
        return entry.read_bytes() if entry.exists() else None

    def put(self, key: str, value: bytes) -> None:
        entry = self.path / f"{key}-cache"
        if not entry.exists():
            entry.write_bytes(value)


def test_an_entry_moved_with_its_signature_is_still_refused(tmp_path: Path) -> None:
    # swapping the records along with the entries does not help: the key is in the hash
    directory = _private_directory(tmp_path / "jax")
    records = JsonCache("jax", 1, tmp_path)
    cache = VerifyingCache(_FakeLru(directory), directory, b"k" * 32, records, "-cache", "-atime")
    cache.put("a", b"program a")
    cache.put("b", b"program b")
    assert (cache.get("a"), cache.get("b")) == (b"program a", b"program b") and cache.verified == 2
    (directory / "a-cache").write_bytes(b"program b")
    records.path("a").write_text(records.path("b").read_text())
    with pytest.warns(CacheWarning, match="a-cache .*no record of writing it"):
        assert cache.get("a") is None
    assert not (directory / "a-cache").exists() and not records.path("a").exists()  # dropped: JAX writes it anew
    other_key = VerifyingCache(_FakeLru(directory), directory, b"x" * 32, records, "-cache", "-atime")
    with pytest.warns(CacheWarning, match="do not match the keyed hash"):
        assert other_key.get("b") is None  # signed with another user's key


def test_the_key_is_private_and_one_that_is_not_is_refused(tmp_path: Path) -> None:
    key = tmp_path / KEY_FILE
    first = _load_secret(key)
    assert len(first) == 32 and _load_secret(key) == first
    if os.name == "nt":
        return
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    key.chmod(0o644)
    with pytest.raises(CacheRefused, match=r"not private to this user .*mode 644"):
        _load_secret(key)
    key.chmod(0o600)
    key.write_bytes(b"short")
    with pytest.raises(CacheRefused, match="holds 5 bytes, not 32"):
        _load_secret(key)
    link = tmp_path / "link.key"
    link.symlink_to(key)
    with pytest.raises(CacheRefused, match="cannot be opened"):
        _load_secret(link)


def test_a_directory_rlx_creates_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    created = _private_directory(tmp_path / "new" / "jax")
    assert os.name == "nt" or stat.S_IMODE(created.stat().st_mode) == 0o700
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(CacheRefused, match="writable by its group and other users"):
            _private_directory(tmp_path / "open")
    (tmp_path / "link").symlink_to(created, target_is_directory=True)  # a link to rlx's own directory
    with pytest.raises(CacheRefused, match=r"link is not a directory of rlx.s \(a link or a file\)"):
        _private_directory(tmp_path / "link")
    monkeypatch.setattr(persistent_cache, "_uid", lambda: created.stat().st_uid + 1)  # as another user sees it
    with pytest.raises(CacheRefused, match=r"is owned by uid \d+, not this user"):
        _private_directory(created)


def _program(tag: int) -> CompiledProgram:
    return CompiledProgram(compiled=tag, check_ids=(), lower_seconds=0.0, compile_seconds=0.0)


def test_the_program_cache_is_a_bounded_lru() -> None:
    cache = ProgramCache(maxsize=2)
    assert cache.get_or_build("a", lambda: _program(1)) == (_program(1), False)
    cache.get_or_build("b", lambda: _program(2))
    assert cache.get_or_build("a", lambda: _program(9))[0].compiled == 1  # hit; "a" is now the newest
    cache.get_or_build("c", lambda: _program(3))  # evicts "b", the least recently used
    assert "a" in cache and "c" in cache and "b" not in cache and len(cache) == 2
    assert (cache.hits, cache.misses) == (1, 3)
    with pytest.raises(ConfigError, match="maxsize"):
        ProgramCache(maxsize=0)
