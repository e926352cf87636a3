"""JSON caches: atomic writes, stale and corrupt entries, unwritable directories, concurrency."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import warnings
from pathlib import Path

import platformdirs
import pytest

from rlx_core.cache import JsonCache, atomic_write_text, cache_dir, cache_info, clear_cache
from rlx_core.errors import CacheWarning, ConfigError

IDENTITY = {"plugin": "rlx-cpu 0.1.0", "device": "cpu", "numpy": "2.0"}


@pytest.fixture
def cache(tmp_path: Path) -> JsonCache:
    return JsonCache("cost-models", schema=2, root=tmp_path)


def test_cache_dir(monkeypatch, tmp_path):
    assert cache_dir({"RLX_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_dir({"RLX_CACHE_DIR": "~/x"}) == Path.home() / "x"
    assert cache_dir({}) == Path(platformdirs.user_cache_dir("rlx", appauthor=False))
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "env"))
    assert cache_dir() == tmp_path / "env"
    assert JsonCache("ns", 1).directory == tmp_path / "env" / "ns"  # read at use, not at construction


def test_round_trip_and_file_layout(cache, tmp_path):
    assert cache.get("cpu", IDENTITY) is None  # missing: silent
    cache.put("cpu", IDENTITY, {"sgemm_gflops": 12.5, "points": (1, 2)})
    assert cache.get("cpu", dict(reversed(IDENTITY.items()))) == {"sgemm_gflops": 12.5, "points": [1, 2]}
    entry = json.loads((tmp_path / "cost-models" / "cpu.json").read_text())
    assert entry == {"schema": 2, "identity": IDENTITY, "payload": {"sgemm_gflops": 12.5, "points": [1, 2]}}
    assert (tmp_path / "cost-models" / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f")
    assert sorted(p.name for p in (tmp_path / "cost-models").iterdir()) == ["CACHEDIR.TAG", "cpu.json"]


@pytest.mark.parametrize("key", ["CPU", "cuda:0", "../../etc/passwd", "a" * 300, "", "nul", "x.tmp", "ü", "a/b"])
def test_odd_keys_become_safe_distinct_file_names(cache, key):
    path = cache.path(key)
    assert path.parent == cache.directory and path.suffix == ".json" and "~" in path.name
    assert len(path.name) < 80 and path.name.isascii() and "/" not in path.name
    cache.put(key, IDENTITY, {"key": key})
    assert cache.get(key, IDENTITY) == {"key": key}
    assert cache.path(key) != cache.path(key + "x") and cache.path(key) != cache.path(key.lower() + "-")


def test_case_variants_never_share_a_file(cache):
    assert len({cache.path(k).name.lower() for k in ("cpu", "CPU", "Cpu")}) == 3


@pytest.mark.parametrize(("content", "why"), [
    ('{"schema": 2, "identity": {"device": "cpu"', "not valid JSON, perhaps truncated"),
    ("", "not valid JSON"),
    ("\x00\x01 binary", "not valid JSON"),
    ("[1, 2, 3]", "not an rlx cache entry"),
    ('{"schema": 2, "identity": {}, "payload": {}, "extra": 1}', "not an rlx cache entry"),
    ('{"schema": 2, "identity": {}, "payload": [1]}', "not an rlx cache entry"),
    ('{"schema": 1, "identity": {}, "payload": {}}', "it has schema 1, this version of rlx reads 2"),
    ('{"schema": "2", "identity": {}, "payload": {}}', "it has schema '2'"),
])
def test_corrupt_or_foreign_entries_are_ignored_with_a_warning(cache, content, why):
    path = cache.path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.warns(CacheWarning, match="it will be recomputed") as record:
        assert cache.get("cpu", IDENTITY) is None
    message = str(record[0].message)
    assert str(path) in message and why in message
    # nothing this rlx can use: removed, so it is warned about once, not by every process
    assert "removed" in message and not path.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get("cpu", IDENTITY) is None
    cache.put("cpu", IDENTITY, {"ok": True})  # recomputed and overwritten
    assert cache.get("cpu", IDENTITY) == {"ok": True}


def test_undecodable_file_is_ignored_with_a_warning(cache):
    path = cache.path("cpu")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.warns(CacheWarning, match="could not be read"):
        assert cache.get("cpu", IDENTITY) is None


def test_identity_mismatch_names_what_changed_and_removes_the_stale_entry(cache):
    cache.put("cpu", IDENTITY, {"sgemm_gflops": 1.0})
    with pytest.warns(CacheWarning, match=r"another identity \(numpy '2.0' cached, '2.1' now\); removed"):
        assert cache.get("cpu", {**IDENTITY, "numpy": "2.1"}) is None
    assert not cache.path("cpu").exists()  # the next process does not warn again
    cache.put("cpu", IDENTITY, {"sgemm_gflops": 1.0})
    with pytest.warns(CacheWarning, match=r"driver None cached, '550' now"):
        assert cache.get("cpu", {**IDENTITY, "driver": "550"}) is None


def test_a_newer_schema_is_left_for_the_newer_rlx_without_a_warning(tmp_path, caplog):
    JsonCache("ns", 5, tmp_path).put("k", {}, {"v": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level("INFO", logger="rlx.cache"):
            assert JsonCache("ns", 4, tmp_path).get("k", {}) is None
    assert JsonCache("ns", 5, tmp_path).get("k", {}) == {"v": 1}  # still there for its owner
    assert "newer rlx" in caplog.text


def test_an_entry_rewritten_meanwhile_is_not_removed(cache):
    # a reader judged the old file stale; a writer renamed a new one over it since: it stays
    cache.put("cpu", {"numpy": "old"}, {"v": 1})
    seen = os.stat(cache.path("cpu"))
    cache.put("cpu", IDENTITY, {"v": 2})
    with pytest.warns(CacheWarning, match="stale"):
        cache._ignore(cache.path("cpu"), "it is stale", seen)
    assert cache.get("cpu", IDENTITY) == {"v": 2}


def test_reject_warns_once_and_removes(cache):
    cache.put("cpu", IDENTITY, {"v": "not what the caller stores"})
    with pytest.warns(CacheWarning, match="its payload is odd; removed; it will be recomputed"):
        cache.reject("cpu", "its payload is odd")
    assert not cache.path("cpu").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.reject("cpu", "nothing there: silent")


def test_schemas_and_namespaces_are_separate(tmp_path):
    JsonCache("a", 1, tmp_path).put("k", {}, {"v": "a"})
    assert JsonCache("b", 1, tmp_path).get("k", {}) is None
    with pytest.warns(CacheWarning, match="schema 1"):
        assert JsonCache("a", 3, tmp_path).get("k", {}) is None


@pytest.mark.parametrize("namespace", ["", "a/b", "..", " x"])
def test_bad_namespace_is_refused(namespace):
    with pytest.raises(ConfigError, match="namespace"):
        JsonCache(namespace, 1)


def test_unwritable_cache_warns_and_carries_on(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache directory should be")
    cache = JsonCache("cost-models", 1, root=blocker / "cache")
    with pytest.warns(CacheWarning, match=f"could not write {blocker}"):
        cache.put("cpu", IDENTITY, {"x": 1})
    assert cache.get("cpu", IDENTITY) is None
    assert blocker.read_text().startswith("a file")


def test_non_json_payload_is_a_caller_bug(cache):
    with pytest.raises(TypeError):
        cache.put("cpu", IDENTITY, {"x": object()})
    assert not cache.path("cpu").exists()


def test_atomic_write_creates_parents_and_leaves_no_temp_file_on_error(tmp_path, monkeypatch):
    target = tmp_path / "a" / "b" / "f.json"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "three")
    assert target.read_text() == "two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.json"]


def _hammer(root: str, worker: int, rounds: int) -> None:
    """Write and read one key over and over; any torn read raises a CacheWarning error."""
    warnings.simplefilter("error", CacheWarning)
    cache = JsonCache("race", 1, root)
    for i in range(rounds):
        cache.put("shared", {"id": "x"}, {"worker": worker, "round": i, "blob": [worker] * 5_000})
        got = cache.get("shared", {"id": "x"})
        assert got is not None and got["blob"] == [got["worker"]] * 5_000


def test_concurrent_processes_never_leave_a_torn_file(tmp_path):
    ctx = multiprocessing.get_context("spawn")  # no fork: the test process has probe threads
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), w, 10)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 8
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        payload = JsonCache("race", 1, tmp_path).get("shared", {"id": "x"})
    assert payload is not None and payload["round"] == 9
    assert sorted(p.name for p in (tmp_path / "race").iterdir()) == ["CACHEDIR.TAG", "shared.json"]


def test_concurrent_threads_never_leave_a_torn_file(tmp_path):
    errors: list[BaseException] = []

    def run(worker: int) -> None:
        try:
            with warnings.catch_warnings():
                _hammer(str(tmp_path), worker, 5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_info_and_clear_touch_only_rlx_files(tmp_path):
    JsonCache("cost-models", 1, tmp_path).put("cpu", {}, {"x": 1})
    JsonCache("cost-models", 1, tmp_path).put("cuda:0", {}, {"x": 2})
    JsonCache("other", 1, tmp_path).put("k", {}, {"x": 3})
    (tmp_path / "cost-models" / ".cpu.json.abc123.tmp").write_text("stray temp file")
    (tmp_path / "user-data").mkdir()
    (tmp_path / "user-data" / "precious.json").write_text("{}")
    (tmp_path / "notes.json").write_text("{}")

    info = cache_info(tmp_path)
    assert info["path"] == str(tmp_path)
    assert info["entries"] == {"cost-models": 2, "other": 1} and info["total_entries"] == 3
    assert info["bytes"] == sum(p.stat().st_size for p in tmp_path.glob("*/*.json") if "user-data" not in str(p))

    assert clear_cache(tmp_path) == 4  # three entries and the stray temp file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json", "user-data"]
    assert (tmp_path / "user-data" / "precious.json").exists()
    assert cache_info(tmp_path)["entries"] == {} and clear_cache(tmp_path) == 0
    assert cache_info(tmp_path / "missing") == {"path": str(tmp_path / "missing"), "entries": {}, "total_entries": 0,
                                                "bytes": 0, "namespaces": []}


def test_info_and_clear_default_to_the_configured_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    JsonCache("ns", 1).put("k", {}, {})
    assert cache_info()["entries"] == {"ns": 1}
    assert clear_cache() == 1


def test_a_plugin_cache_in_its_own_format_is_listed_and_cleared_like_the_rest(tmp_path):
    # rlx-jax-tpu keeps JAX's compiled programs under <cache>/jax: one place for the user
    from rlx_core.cache import cache_namespaces, tag_cache_dir

    JsonCache("calibration", 3, tmp_path, what="cost models").put("cpu", {}, {"x": 1})
    jax = tag_cache_dir(tmp_path / "jax", "compiled programs")
    (jax / "jit_f-abc-cache").write_bytes(b"\0" * 100)
    (jax / "sub").mkdir()
    (jax / "sub" / "more-cache").write_bytes(b"\0" * 20)
    foreign = tmp_path / "someone-else"  # tagged by another program: not rlx's to list or delete
    foreign.mkdir()
    (foreign / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n# other tool\n")
    (foreign / "data").write_text("x")

    rows = {ns["name"]: ns for ns in cache_namespaces(tmp_path)}
    assert set(rows) == {"calibration", "jax"}
    assert (rows["jax"]["entries"], rows["jax"]["bytes"], rows["jax"]["what"]) == (2, 120, "compiled programs")
    assert rows["calibration"]["what"] == "cost models"

    assert clear_cache(tmp_path, ["jax"]) == 2
    assert not jax.exists() and (tmp_path / "calibration").exists()
    with pytest.raises(ConfigError, match=r"no rlx cache namespace 'nope' .*namespaces: calibration"):
        clear_cache(tmp_path, ["nope"])
    assert clear_cache(tmp_path) == 1
    assert (foreign / "data").exists()


def test_tag_cache_dir_rewrites_only_what_changed(tmp_path):
    from rlx_core.cache import tag_cache_dir

    tag = tag_cache_dir(tmp_path / "ns", "first") / "CACHEDIR.TAG"
    stamp = tag.stat().st_mtime_ns, tag.stat().st_ino
    tag_cache_dir(tmp_path / "ns", "first")
    assert (tag.stat().st_mtime_ns, tag.stat().st_ino) == stamp
    tag_cache_dir(tmp_path / "ns", "second")
    assert "# what: second" in tag.read_text()


@pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="needs POSIX symlinks")
def test_clear_never_follows_a_link_out_of_a_namespace(tmp_path):
    from rlx_core.cache import tag_cache_dir

    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    ns = tag_cache_dir(tmp_path / "cache" / "jax", "programs")
    (ns / "to-precious").symlink_to(outside, target_is_directory=True)
    assert clear_cache(tmp_path / "cache") == 1  # the link itself
    assert (outside / "keep.txt").read_text() == "mine"
