"""The compile caches: JAX's persistent compilation cache under rlx's cache directory
(only when the user configured none; never fatal), and the in-process program LRU.

Where JAX's cache points is process-wide and decided once, so each scenario runs in its
own interpreter; the three run concurrently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlx_core.errors import ConfigError

pytest.importorskip("jax", reason="jax is not installed (pip install jax); the rlx-jax-tpu backends need it")

from rlx_jax_tpu.caching import CompiledProgram, ProgramCache  # after the skip: needs jax

SCENARIO = textwrap.dedent("""
    import json, os, warnings
    import numpy as np
    import jax
    import rlx_core as rlx

    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # write even tiny programs
    g = rlx.Graph("cached")
    g.set_outputs([g.tanh(g.add(g.input("x", (4,)), g.constant(np.arange(4, dtype=np.float32))))])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cg = rlx.compile(g, device="jax")
        out = cg.run({"x": np.zeros(4, np.float32)})[0]
    jax_dir = jax.config.jax_compilation_cache_dir
    print(json.dumps({
        "jax_dir": jax_dir, "exe_dir": cg._exe.persistent_cache, "ok": bool(np.allclose(out, np.tanh(np.arange(4)))),
        "files": sorted(os.listdir(jax_dir)) if jax_dir and os.path.isdir(jax_dir) else [],
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
    }))
""")


def _start(env: dict[str, str]) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "RLX_CACHE_DIR")}
    return subprocess.Popen([sys.executable, "-c", SCENARIO], env={**base, "JAX_PLATFORMS": "cpu", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _result(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_the_persistent_cache_lives_under_the_rlx_cache_dir_unless_configured(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    procs = {
        "rlx": _start({"RLX_CACHE_DIR": str(tmp_path / "rlx")}),
        "blocked": _start({"RLX_CACHE_DIR": str(blocked)}),
        "user": _start({"RLX_CACHE_DIR": str(tmp_path / "unused"), "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "own")}),
    }
    got = {name: _result(p) for name, p in procs.items()}

    rlx_dir = str(tmp_path / "rlx" / "jax")
    assert got["rlx"]["ok"] and got["rlx"]["jax_dir"] == got["rlx"]["exe_dir"] == rlx_dir
    assert "CACHEDIR.TAG" in got["rlx"]["files"]
    assert len(got["rlx"]["files"]) > 1, "JAX wrote no compiled program to the cache"
    # it is one of rlx's caches: `rlx cache info` lists it, `rlx cache clear jax` empties it
    from rlx_core.cache import cache_info, clear_cache

    listed = {ns["name"]: ns for ns in cache_info(tmp_path / "rlx")["namespaces"]}
    assert listed["jax"]["entries"] == len(got["rlx"]["files"]) - 1 and "JAX" in listed["jax"]["what"]
    assert clear_cache(tmp_path / "rlx", ["jax"]) == listed["jax"]["entries"]
    assert not (tmp_path / "rlx" / "jax").exists()

    assert got["blocked"]["ok"] and got["blocked"]["exe_dir"] is None and not got["blocked"]["jax_dir"]
    assert any(w.startswith("CacheWarning") and "a-file" in w for w in got["blocked"]["warnings"])

    assert got["user"]["ok"] and got["user"]["jax_dir"] == got["user"]["exe_dir"] == str(tmp_path / "own")
    assert not (tmp_path / "unused").exists()


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
