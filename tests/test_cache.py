"""JSON caches: atomic writes, stale and corrupt entries, unwritable directories, concurrency;
``RLX_CACHE_DIR`` absolute; rlx never adopts a folder it did not create, and ``rlx cache
clear`` deletes only the files rlx wrote."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import warnings
from pathlib import Path

import platformdirs
import pytest

from rlx_core.cache import (
    ClearedCache,
    ForeignDirectoryError,
    JsonCache,
    atomic_write_text,
    cache_dir,
    cache_info,
    cache_namespaces,
    clear_cache,
    tag_cache_dir,
)
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


@pytest.mark.parametrize("value", ["garbage!@#", "rel/dir", "./cache", "~no-such-user-rlx/x", "/tmp/a\nb"])
def test_rlx_cache_dir_must_be_an_absolute_path(value):
    # a relative value would put the cache (and what `rlx cache clear` deletes) under the cwd
    with pytest.raises(ConfigError) as caught:
        cache_dir({"RLX_CACHE_DIR": value})
    assert "RLX_CACHE_DIR" in str(caught.value) and repr(value) in str(caught.value)


def test_rlx_cache_info_with_a_relative_cache_dir_is_one_error_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rlx_core.cli import app

    monkeypatch.chdir(tmp_path)
    for command in (["cache", "info"], ["cache", "clear"]):
        result = CliRunner().invoke(app, command, env={"RLX_CACHE_DIR": "garbage!@#"})
        assert result.exit_code == 2, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: RLX_CACHE_DIR='garbage!@#' is not an absolute path")
    assert list(tmp_path.iterdir()) == []  # nothing made under the cwd


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
    tag_cache_dir(path.parent)
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
    tag_cache_dir(path.parent)
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


@pytest.mark.slow
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
    (tmp_path / "cost-models" / ".cpu.json.abc123de.tmp").write_text("stray temp file")
    (tmp_path / "user-data").mkdir()
    (tmp_path / "user-data" / "precious.json").write_text("{}")
    (tmp_path / "notes.json").write_text("{}")

    info = cache_info(tmp_path)
    assert info["path"] == str(tmp_path)
    assert info["entries"] == {"cost-models": 2, "other": 1} and info["total_entries"] == 3
    assert info["bytes"] == sum(p.stat().st_size for p in tmp_path.glob("*/*.json") if "user-data" not in str(p))

    assert clear_cache(tmp_path) == ClearedCache(removed=4)  # three entries and the stray temp file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json", "user-data"]
    assert (tmp_path / "user-data" / "precious.json").exists()
    assert cache_info(tmp_path)["entries"] == {} and clear_cache(tmp_path) == ClearedCache(removed=0)
    assert cache_info(tmp_path / "missing") == {"path": str(tmp_path / "missing"), "entries": {}, "total_entries": 0,
                                                "bytes": 0, "namespaces": []}


def test_info_and_clear_default_to_the_configured_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    JsonCache("ns", 1).put("k", {}, {})
    assert cache_info()["entries"] == {"ns": 1}
    assert clear_cache().removed == 1


def test_a_stray_file_in_a_namespace_survives_clear_and_is_counted(tmp_path):
    cache = JsonCache("calibration", 3, tmp_path, what="cost models")
    cache.put("cpu", {}, {"x": 1})
    ns = cache.directory
    (ns / "my-notes.txt").write_text("the user's")
    (ns / "lookalike.json").write_text('{"schema": 3, "payload": {}}')  # JSON, but not an rlx entry
    (ns / "sub").mkdir()
    (ns / "sub" / "cpu.json").write_text((ns / "cpu.json").read_text())  # rlx writes no subdirectories

    (row,) = cache_namespaces(tmp_path)
    assert (row["entries"], row["other"]) == (1, 3)
    cleared = clear_cache(tmp_path, ["calibration"])
    assert cleared.removed == 1 and cleared.failed == ()
    assert cleared.left == (ns / "lookalike.json", ns / "my-notes.txt", ns / "sub" / "cpu.json")
    assert all(p.exists() for p in cleared.left) and not cache.path("cpu").exists()
    # still rlx's namespace (its tag stays while it holds files), so rlx keeps using it
    cache.put("cpu", {}, {"x": 2})
    assert cache.get("cpu", {}) == {"x": 2}


def test_rlx_cache_info_and_clear_say_what_rlx_did_not_write(tmp_path):
    from typer.testing import CliRunner

    from rlx_core.cli import app

    cache = JsonCache("calibration", 3, tmp_path, what="cost models")
    cache.put("cpu", {}, {"x": 1})
    (cache.directory / "my-notes.txt").write_text("the user's")
    env = {"RLX_CACHE_DIR": str(tmp_path), "COLUMNS": "200"}
    info = CliRunner().invoke(app, ["cache", "info"], env=env)
    assert info.exit_code == 0 and "calibration: also 1 file rlx did not write" in info.stdout, info.output
    cleared = CliRunner().invoke(app, ["cache", "clear"], env=env)
    assert cleared.exit_code == 0, cleared.output
    assert "removed 1 file from" in cleared.stdout and "left 1 file rlx did not write" in cleared.stdout
    assert str(cache.directory / "my-notes.txt") in cleared.stdout.replace("\n", "")
    assert (cache.directory / "my-notes.txt").exists()


def test_a_users_folder_where_a_namespace_would_be_is_never_adopted_or_emptied(tmp_path):
    # the case: RLX_CACHE_DIR holds the user's own `jax/` folder
    user = tmp_path / "jax"
    (user / "src").mkdir(parents=True)
    (user / "README.md").write_text("mine")
    (user / "src" / "code.py").write_text("print('mine')")
    (user / "data.json").write_text('{"not": "an rlx entry"}')

    with pytest.raises(ForeignDirectoryError, match=r"jax already exists and is not an rlx cache dir.*'README.md'"):
        tag_cache_dir(user, "JAX's programs")
    cache = JsonCache("jax", 1, tmp_path)
    with pytest.warns(CacheWarning, match="could not write .*is not an rlx cache directory"):
        cache.put("data", {}, {"x": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get("data", {}) is None  # a file of the user's is not read as an entry, nor removed
        assert cache.remove("data") is False
    assert cache_namespaces(tmp_path) == []
    with pytest.raises(ConfigError, match=r"no rlx cache namespace 'jax' .*jax is not rlx's: left alone"):
        clear_cache(tmp_path, ["jax"])
    assert clear_cache(tmp_path) == ClearedCache(removed=0)
    assert sorted(str(p.relative_to(user)) for p in user.rglob("*")) == ["README.md", "data.json", "src",
                                                                           "src/code.py"]
    assert not (user / "CACHEDIR.TAG").exists()


def test_an_empty_or_rlx_only_folder_is_tagged_and_a_new_one_is_private(tmp_path):
    created = tag_cache_dir(tmp_path / "new", "x")
    assert (created.stat().st_mode & 0o777) == 0o700 or os.name == "nt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]  # no staging directory left behind
    (tmp_path / "empty").mkdir()
    assert (tag_cache_dir(tmp_path / "empty") / "CACHEDIR.TAG").exists()
    # untagged, but holding only rlx's own entries (a clear raced with a write): still rlx's
    leftover = tmp_path / "leftover"
    leftover.mkdir()
    (leftover / "k.json").write_text(json.dumps({"schema": 1, "identity": {}, "payload": {}}))
    assert (tag_cache_dir(leftover) / "CACHEDIR.TAG").exists()
    other_tool = tmp_path / "other-tool"  # another program's CACHEDIR.TAG: not rlx's to take over
    other_tool.mkdir()
    (other_tool / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n# other tool\n")
    with pytest.raises(ForeignDirectoryError, match=r"CACHEDIR\.TAG"):
        tag_cache_dir(other_tool)
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    with pytest.raises(ForeignDirectoryError, match="not a directory"):
        tag_cache_dir(blocked)


def test_a_plugin_cache_in_its_own_format_is_listed_and_cleared_by_its_records(tmp_path):
    # rlx-jax-tpu keeps JAX's compiled programs under <cache>/jax, each file recorded by an
    # entry (files=...): one place for the user, and clear deletes only what was recorded
    JsonCache("calibration", 3, tmp_path, what="cost models").put("cpu", {}, {"x": 1})
    jax = JsonCache("jax", 1, tmp_path, what="compiled programs")
    jax.put("jit_f-abc", {}, {"mac": "..."}, files=["jit_f-abc-cache", "jit_f-abc-atime"])
    (jax.directory / "jit_f-abc-cache").write_bytes(b"\0" * 100)  # its -atime was never written: fine
    (jax.directory / "unrecorded-cache").write_bytes(b"\0" * 20)  # someone else's, or an older rlx's
    foreign = tmp_path / "someone-else"  # tagged by another program: not rlx's to list or delete
    foreign.mkdir()
    (foreign / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n# other tool\n")
    (foreign / "data").write_text("x")

    rows = {ns["name"]: ns for ns in cache_namespaces(tmp_path)}
    assert set(rows) == {"calibration", "jax"}
    record = jax.path("jit_f-abc").stat().st_size
    assert (rows["jax"]["entries"], rows["jax"]["bytes"], rows["jax"]["other"]) == (2, record + 100, 1)
    assert rows["jax"]["what"] == "compiled programs" and rows["calibration"]["what"] == "cost models"

    assert clear_cache(tmp_path, ["jax"]) == ClearedCache(removed=2, left=(jax.directory / "unrecorded-cache",))
    assert sorted(p.name for p in jax.directory.iterdir()) == ["CACHEDIR.TAG", "unrecorded-cache"]
    with pytest.raises(ConfigError, match=r"no rlx cache namespace 'nope' .*namespaces: calibration, jax"):
        clear_cache(tmp_path, ["nope"])
    assert clear_cache(tmp_path).removed == 1
    assert (foreign / "data").exists()
    (jax.directory / "unrecorded-cache").unlink()
    assert clear_cache(tmp_path) == ClearedCache(removed=0) and not jax.directory.exists()  # empty: removed


@pytest.mark.parametrize("name", ["../escape", "sub/x", "/etc/passwd", "", "..", "CACHEDIR.TAG"])
def test_an_entry_lists_only_files_beside_it(cache, name):
    with pytest.raises(ConfigError, match="plain file names"):
        cache.put("cpu", IDENTITY, {"x": 1}, files=[name])
    assert not cache.path("cpu").exists()


def test_removing_or_rejecting_an_entry_removes_the_files_it_recorded(cache):
    for key in ("a", "b", "c"):
        cache.put(key, IDENTITY, {"x": 1}, files=[f"{key}-blob"])
        (cache.directory / f"{key}-blob").write_bytes(b"\1")
    assert cache.remove("a") and not (cache.directory / "a-blob").exists()
    with pytest.warns(CacheWarning, match="removed"):
        cache.reject("b", "its payload is odd")
    with pytest.warns(CacheWarning, match="another identity"):
        assert cache.get("c", {**IDENTITY, "numpy": "9"}) is None
    assert sorted(p.name for p in cache.directory.iterdir()) == ["CACHEDIR.TAG"]


def test_tag_cache_dir_rewrites_only_what_changed(tmp_path):
    tag = tag_cache_dir(tmp_path / "ns", "first") / "CACHEDIR.TAG"
    stamp = tag.stat().st_mtime_ns, tag.stat().st_ino
    tag_cache_dir(tmp_path / "ns", "first")
    assert (tag.stat().st_mtime_ns, tag.stat().st_ino) == stamp
    tag_cache_dir(tmp_path / "ns", "second")
    assert "# what: second" in tag.read_text()


@pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="needs POSIX symlinks")
def test_clear_never_follows_a_link_out_of_a_namespace(tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (outside / "entry.json").write_text(json.dumps({"schema": 1, "identity": {}, "payload": {}}))
    cache = JsonCache("jax", 1, tmp_path / "cache")
    cache.put("k", {}, {}, files=["to-precious"])  # a recorded name that is now a link: the link goes
    ns = cache.directory
    (ns / "to-precious").symlink_to(outside, target_is_directory=True)
    (ns / "looks-like-an-entry.json").symlink_to(outside / "entry.json")  # not a regular file: not rlx's
    assert clear_cache(tmp_path / "cache") == ClearedCache(removed=2, left=(ns / "looks-like-an-entry.json",))
    assert sorted(p.name for p in outside.iterdir()) == ["entry.json", "keep.txt"]
