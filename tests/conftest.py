"""Shared fixtures. Keep this small: fixtures used by one test module live in that module.

- ``fake_site``: installs the fake plugins of ``tests/fakeplugins`` as real distributions
  in a temporary directory on ``sys.path`` (see ``FakeSite``).
- ``isolated_registry``: a fresh process-wide default registry for the test, restored after.
- ``children``: what each child process rlx starts during the test is for.
- ``_own_cache_dir`` (autouse): ``RLX_CACHE_DIR`` is a fresh directory for every test, so
  that what one test's runs record on disk (measured picks, observed prediction errors,
  calibrations) never changes another test's ranking, nor the developer's own cache.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

FAKE_PLUGINS_DIR = Path(__file__).parent / "fakeplugins"

#: entry point name -> entry point value; each becomes distribution ``rlxfake-<name>`` 1.0.
FAKE_PLUGINS: dict[str, str] = {
    "fakenp": "rlxfake_good",
    "fakeobj": "rlxfake_obj:plugin",
    "fakeimport": "rlxfake_importerror",
    "fakeraises": "rlxfake_raises",
    "fakegarbage": "rlxfake_garbage",
    "fakemixed": "rlxfake_mixed",
    "fakev2": "rlxfake_apiv2",
    "fakeprobes": "rlxfake_probes",
    "fakehang": "rlxfake_hang",
    "fakedup": "rlxfake_dup",
    "fakedisabled": "rlxfake_disabled",
    "faketypo": "rlxfake_typo",
    "fakebadargs": "rlxfake_badargs",
    "fakebadname": "rlxfake_badname",
}
#: Installed only by the tests that ask for it (``FakeSite(path, CRASH_PLUGIN)``): its
#: device would join every other test's device listings.
CRASH_PLUGIN: dict[str, str] = {"fakecrash": "rlxfake_crash"}
#: Plugins whose *import* kills or hangs its process, and a third party's backend named
#: ``cpu`` (issue 31): installed only by the tests that ask for them, since importing the
#: first two here would end or hang the test run, which is exactly what rlx must avoid.
IMPORT_FAULT_PLUGINS: dict[str, str] = {"fakeimportsegv": "rlxfake_importsegv",
                                        "fakeimporthang": "rlxfake_importhang", "fakecpu": "rlxfake_cpu"}
#: A probe that hangs on its first try only (a loaded host): for the retry's test.
HANG_ONCE_PLUGIN: dict[str, str] = {"fakehangonce": "rlxfake_hangonce"}
#: Two devices that run a graph only together (``fakemm`` products, ``fakerest`` the rest):
#: installed only by the partition tests, whose graphs they split.
SPLIT_PLUGIN: dict[str, str] = {"fakesplit": "rlxfake_split"}


class FakeSite:
    """A directory of installed-looking fake plugin distributions, on ``sys.path``."""

    def __init__(self, path: Path, plugins: dict[str, str] | None = None) -> None:
        self.path = path
        for ep_name, value in (FAKE_PLUGINS if plugins is None else plugins).items():
            module = value.partition(":")[0]
            shutil.copy(FAKE_PLUGINS_DIR / f"{module}.py", path / f"{module}.py")
            info = path / f"rlxfake_{ep_name}-1.0.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rlxfake-{ep_name}\nVersion: 1.0\n")
            (info / "entry_points.txt").write_text(f"[rlx.backends]\n{ep_name} = {value}\n")

    def entry_points(self, *names: str) -> list[importlib.metadata.EntryPoint]:
        """The real ``importlib.metadata`` entry points of the named fake plugins."""
        found = [ep for ep in importlib.metadata.entry_points(group="rlx.backends") if ep.name in names]
        assert sorted(ep.name for ep in found) == sorted(names), "fake site not visible to importlib.metadata"
        return sorted(found, key=lambda ep: names.index(ep.name))


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.mktemp("rlx-cache")))


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    site = FakeSite(site_dir)
    monkeypatch.syspath_prepend(str(site_dir))
    importlib.invalidate_caches()
    try:
        yield site
    finally:
        hang = sys.modules.get("rlxfake_hang")
        if hang is not None:
            hang.release()  # let this test's hung probe threads finish
        for name in [m for m in sys.modules if m.startswith("rlxfake_")]:
            del sys.modules[name]


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What every child process rlx starts during the test is for, in order: ``"import"``
    (a plugin import check, ``plugin_import``), ``"task"`` (a probe or calibration,
    ``isolation.run_child``) or ``"bench"`` (an ``rlx bench`` worker): how tests see that
    a kept verdict cost no child."""
    from rlx_core.backends import isolation, plugin_import
    from rlx_core.cli import bench_worker as _bench_worker

    started: list[str] = []
    real = isolation.start_child

    def counting(kind: str) -> Callable[..., Any]:
        def start(*args: Any, **kwargs: Any) -> Any:
            started.append(kind)
            return real(*args, **kwargs)

        return start

    monkeypatch.setattr(isolation, "start_child", counting("task"))
    monkeypatch.setattr(plugin_import, "start_child", counting("import"))
    monkeypatch.setattr(_bench_worker, "start_child", counting("bench"))
    return started


@pytest.fixture
def isolated_registry() -> Iterator[None]:
    from rlx_core.backends import registry

    saved = registry._default
    registry.set_default_registry(None)
    try:
        yield
    finally:
        registry.set_default_registry(saved)
