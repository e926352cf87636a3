"""Plugin discovery, validation, isolation and probing (rlx_core.backends.registry)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import HANG_ONCE_PLUGIN, FakeSite
from hypothesis import given
from hypothesis import strategies as st
from support import broken_error

import rlx_core
from rlx_core.backends import registry as reg_mod
from rlx_core.backends.probing import ProbeRun
from rlx_core.backends.registry import PLATFORM_PRIORITY, Registry, parse_device
from rlx_core.cost import CostModel
from rlx_core.errors import ConfigError, DeviceError, PluginError, PluginWarning
from rlx_core.plugin import CompileOptions

REPO = Path(__file__).resolve().parents[1]
#: Validation and probing in this process: what these tests check is the same there, a
#: child per import check and probe would cost seconds, and a probe's effects on the fake
#: plugin (``rlxfake_hang.STARTED``) are visible here. Children have their own tests below
#: and in test_isolation.py.
FAST = {"RLX_PROBE_TIMEOUT": "0.2", "RLX_ISOLATION": "0"}
#: Imports checked and probes run in child processes, with time to spare under load.
CHILD = {"RLX_PROBE_TIMEOUT": "10"}


class Toy(rlx_core.Backend):
    name = "toy"
    priority = 10

    def __init__(self, answer: object = None) -> None:
        self.answer = rlx_core.Availability(True) if answer is None else answer
        self.calls = 0

    def probe(self) -> rlx_core.Availability:
        self.calls += 1
        return self.answer  # type: ignore[return-value]

    def supported_ops(self) -> frozenset[str]:
        return frozenset()


def toy(name: str, priority: int = 10, **attrs: object) -> rlx_core.Backend:
    cls = type(f"Toy_{name}", (Toy,), {"name": name, "priority": priority, **attrs})
    return cls()


def loaded(site, *names: str, environ: dict[str, str] | None = None) -> Registry:
    """A registry over some fake plugins, already loaded (its load warnings swallowed)."""
    registry = Registry(entry_points=site.entry_points(*names), environ=environ or FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)
        registry.names()
    return registry


# -- device strings ----------------------------------------------------------------


@pytest.mark.parametrize(("text", "parsed"), [
    ("cpu", ("cpu", None)), ("cuda:1", ("cuda", 1)), ("  cuda:0 ", ("cuda", 0)), ("my-dev.x", ("my-dev.x", None)),
])
def test_parse_device(text, parsed):
    assert parse_device(text) == parsed


@pytest.mark.parametrize("text", ["cuda:x", ":1", "", "  ", "cu da", "cuda:", "cuda:1:2", "cuda:-1", "9gpu"])
def test_parse_device_rejects_malformed_strings_naming_them(text):
    with pytest.raises(DeviceError, match="malformed device") as exc:
        parse_device(text)
    assert repr(text) in str(exc.value)


@given(st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True), st.integers(0, 10_000))
def test_parse_device_round_trips(name, index):
    assert parse_device(f"{name}:{index}") == (name, index)
    assert parse_device(name) == (name, None)


def test_platform_priorities_match_the_contract():
    assert PLATFORM_PRIORITY["tpu"] > PLATFORM_PRIORITY["cuda"] > PLATFORM_PRIORITY["opencl"] > PLATFORM_PRIORITY["cpu"]
    assert PLATFORM_PRIORITY["cpu"] == 0 and PLATFORM_PRIORITY["jax"] == 40


# -- discovery ---------------------------------------------------------------------


def test_good_plugin_is_discovered_with_its_distribution_and_really_computes(fake_site):
    registry = loaded(fake_site, "fakenp")
    assert registry.names() == ["fakenp"]
    assert registry.broken() == []
    info = registry.info("fakenp:0")
    assert (info.entry_point, info.distribution, info.version) == ("fakenp", "rlxfake-fakenp", "1.0")
    assert (info.label, info.priority) == ("Fake numpy (add, mul)", 30)
    backend = registry.get("fakenp")
    assert backend is info.backend and registry.get(" fakenp:3 ") is backend
    assert registry.availability("fakenp").available

    g = rlx_core.Graph("axpy")
    x = g.input("x", (2, 3), "float32")
    y = g.input("y", (2, 3), "float32")
    g.set_outputs([g.add(g.mul(x, g.constant(np.float32(2.0))), y)])
    xs, ys = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    (out,) = backend.compile(g, CompileOptions("fakenp")).run({"x": xs, "y": ys})
    np.testing.assert_allclose(out, 2 * xs + ys)


def test_entry_point_naming_an_object_works(fake_site):
    registry = loaded(fake_site, "fakeobj")
    assert registry.names() == ["fakeobj"]
    assert registry.availability("fakeobj") == rlx_core.Availability(False, "no fake accelerator attached")
    assert registry.broken() == []  # unavailable with a reason is a normal answer


def test_default_discovery_reads_installed_entry_points(fake_site):
    skip = ",".join(n for n in ("fakeimport", "fakeraises", "fakegarbage", "fakemixed", "fakev2", "fakeprobes",
                                "fakehang", "fakedup", "fakedisabled", "faketypo", "fakebadargs", "fakebadname"))
    registry = Registry(environ={"RLX_DISABLE_PLUGINS": skip})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)  # whatever else is installed may be broken
        assert {"fakenp", "fakeobj"} <= set(registry.names())
    assert registry.info("fakenp").distribution == "rlxfake-fakenp"
    assert "fakedisabled" in registry.disabled()


def test_names_are_sorted_by_priority_then_name():
    registry = Registry(entry_points=[])
    for backend in (toy("b", 5), toy("a", 5), toy("z", 99), toy("m", 0)):
        registry.register(backend)
    assert registry.names() == ["z", "a", "b", "m"]
    assert [i.name for i in registry.infos()] == registry.names()


@pytest.mark.parametrize(("ep", "needle"), [
    ("fakeimport", "rlxfake-fakeimport 1.0: ModuleNotFoundError: No module named 'rlx_fake_missing_dependency'"),
    ("fakeraises", "rlxfake-fakeraises 1.0: RuntimeError: driver table corrupt"),
    ("fakegarbage", "rlxfake-fakegarbage 1.0: rlx_backends returned dict, expected a list of rlx_core.Backend"),
    ("fakev2", "rlxfake-fakev2 1.0: backend 'fakev2' declares plugin API version 2, "
               f"rlx-core {rlx_core.__version__} speaks version 1"),
    ("faketypo", "rlxfake-faketypo 1.0: PluginValidationError: unknown hook 'rlx_backend'"),
    ("fakebadargs", "rlxfake-fakebadargs 1.0: PluginValidationError"),
    ("fakebadname", "invalid name 'bad name:0'"),
])
def test_broken_plugins_are_reported_and_isolated(fake_site, ep, needle):
    registry = Registry(entry_points=fake_site.entry_points(ep, "fakenp"), environ=FAST)
    with pytest.warns(PluginWarning, match=f"rlx plugin '{ep}' is broken"):
        assert registry.names() == ["fakenp"]
    assert needle in broken_error(registry, ep)
    assert registry.availability("fakenp").available  # everything else keeps working


def test_object_without_a_hook_is_broken():
    class BareEntryPoint:
        name, value, dist = "bare", "somewhere:nothing", None

        def load(self):
            return object()

    registry = Registry(entry_points=[BareEntryPoint()])
    with pytest.warns(PluginWarning):
        assert registry.names() == []
    assert registry.broken() == [("bare", "entry point 'bare': PluginError: 'somewhere:nothing' implements no "
                                          "rlx_backends hook (decorate it with rlx_core.hookimpl)")]

def test_a_plugin_with_one_bad_item_keeps_its_good_backends(fake_site):
    registry = loaded(fake_site, "fakemixed")
    assert registry.names() == ["fakemixed"]
    assert "returned 42, which is not an rlx_core.Backend instance" in broken_error(registry, "fakemixed")


def test_duplicate_backend_name_is_broken_and_first_one_wins(fake_site):
    registry = loaded(fake_site, "fakenp", "fakedup")
    assert registry.names() == ["fakenp"]
    assert registry.info("fakenp").entry_point == "fakenp"
    assert broken_error(registry, "fakedup") == ("rlxfake-fakedup 1.0: backend name 'fakenp' is already provided "
                                                 "by rlxfake-fakenp 1.0")


def test_unknown_device_lists_known_ones_and_mentions_broken_or_disabled(fake_site):
    registry = loaded(fake_site, "fakenp", "fakev2", "fakedisabled", environ={"RLX_DISABLE_PLUGINS": "fakedisabled"})
    with pytest.raises(DeviceError, match=r"unknown device 'nope'; known devices: fakenp$"):
        registry.get("nope")
    with pytest.raises(DeviceError, match=r"'fakev2:1'.*plugin 'fakev2' failed to load: .*API version 2"):
        registry.get("fakev2:1")
    with pytest.raises(DeviceError, match="plugin 'fakedisabled' is disabled by RLX_DISABLE_PLUGINS"):
        registry.get("fakedisabled")
    with pytest.raises(DeviceError, match="malformed"):
        registry.get("fakenp:x")


def test_disabled_plugins_are_never_imported(fake_site):
    registry = loaded(fake_site, "fakenp", "fakedisabled", "fakeimport",
                      environ={"RLX_DISABLE_PLUGINS": " fakedisabled ,fakeimport "})
    assert registry.names() == ["fakenp"]
    assert registry.disabled() == ["fakedisabled", "fakeimport"]
    assert registry.broken() == []
    assert "rlxfake_disabled" not in sys.modules and "rlxfake_importerror" not in sys.modules


def test_malformed_disable_list_is_a_config_error(fake_site):
    registry = Registry(entry_points=fake_site.entry_points("fakenp"), environ={"RLX_DISABLE_PLUGINS": "fake np"})
    with pytest.raises(ConfigError, match=r"RLX_DISABLE_PLUGINS: 'fake np'"):
        registry.names()
    registry = Registry(entry_points=fake_site.entry_points("fakenp"), environ={"RLX_DISABLE_PLUGINS": "fakehang,,"})
    with pytest.raises(ConfigError, match=r"RLX_DISABLE_PLUGINS: 'fakehang,,' has an empty entry"):
        registry.names()


def test_a_typo_in_the_disable_list_is_a_config_error_listing_the_known_plugins(fake_site):
    """``RLX_DISABLE_PLUGINS=opencll`` would leave the plugin meant enabled: an error at
    discovery, before anything loads, naming the token and the names it could have been:
    the registry's entry points, the installed ones (from metadata) and rlx's own."""
    environ = {"RLX_DISABLE_PLUGINS": "fakenp,opencll"}
    registry = Registry(entry_points=fake_site.entry_points("fakenp"), environ=environ)
    for _ in range(2):  # every question raises it: a registry that failed to load never looks empty
        with pytest.raises(ConfigError, match=r"^RLX_DISABLE_PLUGINS: 'opencll' ") as info:
            registry.names()
    listed = set(str(info.value).rsplit(": ", 1)[-1].split(", "))
    assert {"fakenp", "fakehang", "fakeobj", "cpu", "cuda", "opencl", "jax", "tpu"} <= listed, listed
    assert "rlxfake_good" not in sys.modules
    # rlx's own names are accepted where they are not installed: one variable serves every host
    quiet = Registry(entry_points=fake_site.entry_points("fakenp"), environ={**FAST, "RLX_DISABLE_PLUGINS": "cuda,tpu"})
    assert quiet.names() == ["fakenp"]


def test_plugins_load_lazily_and_once(fake_site):
    registry = Registry(entry_points=fake_site.entry_points("fakenp"), environ=FAST)
    assert "rlxfake_good" not in sys.modules
    assert registry.names() == ["fakenp"]
    module = sys.modules["rlxfake_good"]
    registry.names()
    assert sys.modules["rlxfake_good"] is module


def test_concurrent_first_use_loads_each_plugin_once():
    loads = []

    class CountingEntryPoint:
        name, value, dist = "counted", "counted", None

        def load(self):
            loads.append(1)
            time.sleep(0.05)

            class Plugin:
                @rlx_core.hookimpl
                def rlx_backends(self):
                    return [toy("counted")]

            return Plugin()

    registry = Registry(entry_points=[CountingEntryPoint()])
    results: list[list[str]] = []
    threads = [threading.Thread(target=lambda: results.append(registry.names())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == [1] and results == [["counted"]] * 8
    assert registry.info("counted").distribution == ""
    assert "entry point 'counted'" in reg_mod._origin("", "", "counted")


def test_register_validates_like_discovery():
    registry = Registry(entry_points=[])
    registry.register(toy("loop"), distribution="rlx-tests", version="0")
    assert registry.info("loop").entry_point == "" and registry.info("loop").distribution == "rlx-tests"
    with pytest.raises(PluginError, match="'loop' is already provided by rlx-tests 0"):
        registry.register(toy("loop"))
    with pytest.raises(PluginError, match=r"declares plugin API version 7, rlx-core .* speaks version 1"):
        registry.register(toy("future", api_version=7))
    with pytest.raises(PluginError, match="invalid name ''"):
        registry.register(toy(""))
    with pytest.raises(PluginError, match=r"not an rlx_core\.Backend"):
        registry.register(object())  # type: ignore[arg-type]
    with pytest.raises(PluginError, match="priority 'high'"):
        registry.register(toy("pri", priority="high"))  # type: ignore[arg-type]
    assert registry.names() == ["loop"]


def test_real_cpu_entry_point_is_discovered():
    if importlib.util.find_spec("rlx_cpu") is None:
        pytest.skip("rlx-cpu is not installed")
    import rlx_cpu

    if not hasattr(rlx_cpu, "rlx_backends"):
        pytest.skip("rlx_cpu does not implement the rlx_backends hook yet")
    eps = [ep for ep in importlib.metadata.entry_points(group="rlx.backends") if ep.name == "cpu"]
    registry = Registry(entry_points=eps)
    assert "cpu" in registry.names(), registry.broken()
    info = registry.info("cpu")
    assert (info.distribution, info.entry_point, info.priority) == ("rlx-cpu", "cpu", 0)
    assert registry.availability("cpu").available


# -- probes ------------------------------------------------------------------------


def test_probe_runs_once_per_registry_and_is_invalidated_on_demand():
    registry = Registry(entry_points=[])
    backend = toy("once")
    registry.register(backend)
    assert registry.availability("once").available and registry.availability("once:2").available
    assert backend.calls == 1  # type: ignore[attr-defined]
    registry.invalidate("once")
    registry.availability("once")
    assert backend.calls == 2  # type: ignore[attr-defined]


def test_raising_and_garbage_probes_are_unavailable_and_broken(fake_site):
    registry = loaded(fake_site, "fakeprobes", "fakenp")
    with pytest.warns(PluginWarning) as record:
        answers = registry.probe_all()
    assert sorted(str(w.message) for w in record) == [
        "rlx backend 'fakegarbageprobe': probe returned str, expected rlx_core.Availability",
        "rlx backend 'fakeraise': probe raised ValueError: no device 0",
    ]
    assert answers["fakeraise"] == rlx_core.Availability(False, "probe raised ValueError: no device 0")
    assert answers["fakegarbageprobe"] == rlx_core.Availability(
        False, "probe returned str, expected rlx_core.Availability")
    assert answers["fakenp"].available
    errors = [error for ep, error in registry.broken() if ep == "fakeprobes"]
    assert sorted(errors) == [
        "rlxfake-fakeprobes 1.0: backend 'fakegarbageprobe' probe returned str, expected rlx_core.Availability",
        "rlxfake-fakeprobes 1.0: backend 'fakeraise' probe raised ValueError: no device 0",
    ]


def test_hanging_probe_times_out_without_blocking_others(fake_site, monkeypatch):
    registry = loaded(fake_site, "fakehang", "fakenp", "fakeobj")
    started_before_waiting: list[int] = []
    real_wait = ProbeRun.wait

    def wait(self: ProbeRun, timeout: float) -> None:
        started_before_waiting.append(len(registry._probes))
        real_wait(self, timeout)

    monkeypatch.setattr(ProbeRun, "wait", wait)
    with pytest.warns(PluginWarning, match="fakehang"):
        answers = registry.probe_all()
    # concurrent: every probe was under way before the first wait, so the call costs one
    # timeout (each probe's deadline counts from its own start), not one per backend
    assert started_before_waiting[0] == 3, started_before_waiting
    reason = "probe did not answer within 0.2 s (RLX_PROBE_TIMEOUT)"
    assert answers["fakehang"] == rlx_core.Availability(False, reason)
    assert answers["fakenp"].available and not answers["fakeobj"].available
    assert broken_error(registry, "fakehang") == f"rlxfake-fakehang 1.0: backend 'fakehang' {reason}"
    # the answer is kept: asking again starts no probe
    monkeypatch.setattr(reg_mod, "ProbeRun", _no_probe)
    assert not registry.availability("fakehang").available
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("rlx-probe-"))


def _no_probe(*args: object, **kwargs: object) -> ProbeRun:
    raise AssertionError("a probe was started where a kept answer was expected")


def test_explicit_device_probes_only_that_backend(fake_site):
    registry = loaded(fake_site, "fakehang", "fakenp")
    assert registry.availability("fakenp").available
    assert not sys.modules["rlxfake_hang"].STARTED.is_set()


def test_hanging_probe_does_not_delay_interpreter_exit(fake_site):
    """In this process (``RLX_ISOLATION=0``) the hung probe's thread never returns: the
    interpreter must exit anyway (a joined thread would block it for ever, and
    ``subprocess.run``'s timeout would fail the test)."""
    script = textwrap.dedent("""
        import importlib.metadata, time
        from rlx_core.backends.registry import Registry
        eps = [ep for ep in importlib.metadata.entry_points(group="rlx.backends") if ep.name == "fakehang"]
        registry = Registry(entry_points=eps, environ={"RLX_PROBE_TIMEOUT": "0.2", "RLX_ISOLATION": "0"})
        print(registry.availability("fakehang").reason, flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_site.path), str(REPO)])}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", script], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "probe did not answer within 0.2 s (RLX_PROBE_TIMEOUT)"  # in-process: one try


@pytest.mark.parametrize(("value", "expected"), [(None, 10.0), ("", 10.0), ("2.5", 2.5), (" 1 ", 1.0)])
def test_probe_timeout(value, expected):
    environ = {} if value is None else {"RLX_PROBE_TIMEOUT": value}
    assert Registry(entry_points=[], environ=environ).probe_timeout() == expected


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf"])
def test_malformed_probe_timeout_is_a_config_error(value):
    registry = Registry(entry_points=[], environ={"RLX_PROBE_TIMEOUT": value})
    with pytest.raises(ConfigError, match=f"RLX_PROBE_TIMEOUT: '{value}'"):
        registry.probe_timeout()


# -- probe answers kept for later processes, second tries, start-up (issue 31) --------


@pytest.mark.slow
def test_a_second_registry_reuses_the_probe_answers_of_the_first(fake_site, children):
    """What ``rlx devices`` twice in a row does: the second pays no probe (nor import check)."""
    first = loaded(fake_site, "fakenp", "fakeobj", environ=CHILD)
    answers = first.probe_all()
    assert children == ["import", "task", "task"]
    second = loaded(fake_site, "fakenp", "fakeobj", environ=CHILD)
    assert second.probe_all() == answers and not answers["fakeobj"].available  # unavailable answers are kept too
    assert children == ["import", "task", "task"]
    assert second.info("fakenp").backend.told == answers["fakenp"]  # Backend.probed hears the kept answer
    here = loaded(fake_site, "fakenp", environ={**CHILD, "RLX_ISOLATION": "0"})
    assert here.availability("fakenp").available and not hasattr(here.info("fakenp").backend, "told")


@pytest.mark.slow
def test_a_kept_probe_answer_is_used_only_while_nothing_it_depends_on_changed(fake_site, children, monkeypatch,
                                                                               tmp_path):
    from rlx_core.backends import probe_verdicts

    installs = tmp_path / "lib" / "site-packages"
    installs.mkdir(parents=True)
    monkeypatch.syspath_prepend(str(installs))

    def probes(environ: dict[str, str] = CHILD) -> int:
        loaded(fake_site, "fakeobj", environ=environ).probe_all()
        return children.count("task")

    assert probes() == 1
    assert probes({**CHILD, "RLX_DEVICES": "fakeobj", "RLX_STRICT": "1", "RLX_PROBE_TIMEOUT": "30"}) == 1  # policy only
    assert probes({**CHILD, "RLX_FAKEOBJ_MODE": "fast"}) == 2  # a setting a plugin may read
    assert probes() == 3  # an answer written for another environment is not used
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what a driver reads, not only RLX_*
    assert probes() == 4
    monkeypatch.setattr(probe_verdicts, "PROBE_VERDICT_TTL_S", -1.0)  # older than the TTL
    assert probes() == 5
    monkeypatch.setattr(probe_verdicts, "PROBE_VERDICT_TTL_S", 600.0)
    assert probes() == 5
    loaded(fake_site, "fakeobj", environ=CHILD).invalidate("fakeobj")  # forgets the kept answer too
    assert probes() == 6
    (installs / "pyopencl").mkdir()  # pip installed something: a driver's Python package, say
    assert probes() == 7
    plugin = fake_site.path / "rlxfake_obj.py"
    plugin.write_text(plugin.read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    assert probes() == 8 and children.count("import") == 2  # a changed plugin: imported in a child, probed again


@pytest.mark.slow
def test_an_answer_that_did_not_come_from_the_probe_is_not_kept(fake_site):
    """A timeout (like a crash, see test_isolation) says nothing about the next process."""
    from rlx_core.cache import cache_dir

    with pytest.warns(PluginWarning, match="fakehang"):
        loaded(fake_site, "fakehang", "fakenp", environ={"RLX_PROBE_TIMEOUT": "0.2"}).probe_all()
    kept = sorted(p.name.partition(".")[0] for p in (cache_dir() / "probes").glob("*.json"))
    assert kept == ["fakenp"]


@pytest.mark.slow
def test_a_probe_that_times_out_is_tried_once_more_in_a_fresh_child(tmp_path, monkeypatch, children):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    site = FakeSite(site_dir, HANG_ONCE_PLUGIN)
    monkeypatch.syspath_prepend(str(site_dir))
    monkeypatch.setenv("RLXFAKE_HANGONCE", str(tmp_path / "hung-once"))
    try:
        registry = loaded(site, "fakehangonce", environ={"RLX_PROBE_TIMEOUT": "1"})
        answer = registry.availability("fakehangonce")
    finally:
        sys.modules.pop("rlxfake_hangonce", None)
    assert answer == rlx_core.Availability(True, "answered on the second try")
    assert children.count("task") == 2 and registry.broken() == []


@pytest.mark.slow
def test_a_probe_timeout_does_not_count_the_childs_start_up(fake_site, tmp_path, monkeypatch, children):
    """A child whose interpreter takes longer to start than ``RLX_PROBE_TIMEOUT`` (a
    loaded host, a cold disk) still probes, and its plugin's import check passes."""
    slow = tmp_path / "slow-start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text("import time\ntime.sleep(1.5)\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(slow))  # children find it on their path; this process has started
    registry = loaded(fake_site, "fakenp", environ={"RLX_PROBE_TIMEOUT": "1"})
    assert registry.availability("fakenp").available and registry.broken() == []
    assert children == ["import", "task"]  # each in one try


@pytest.mark.slow
def test_a_child_that_never_gets_to_probing_says_so(fake_site, tmp_path, monkeypatch):
    """Not "the probe did not answer", which would send the user to RLX_PROBE_TIMEOUT:
    the child did not even start in time (here start-up may take 0.5 s and takes 3)."""
    from rlx_core.backends import isolation, probing

    slow = tmp_path / "slow-start"
    slow.mkdir()
    monkeypatch.syspath_prepend(str(slow))
    registry = loaded(fake_site, "fakenp", environ={"RLX_PROBE_TIMEOUT": "0.2"})  # its import check passes first
    (slow / "sitecustomize.py").write_text("import time\ntime.sleep(3)\n", encoding="utf-8")
    for module in (isolation, probing):
        monkeypatch.setattr(module, "STARTUP_SECONDS", 0.5)
    with pytest.warns(PluginWarning, match="fakenp"):
        answer = registry.availability("fakenp")
    assert answer.reason.startswith("probe's child process did not get to probing within 0.5 s"), answer


# -- cost models -------------------------------------------------------------------


def test_cost_model_is_cached_and_falls_back_with_a_warning(fake_site):
    registry = loaded(fake_site, "fakenp", "fakeobj")
    model = registry.cost_model("fakenp")
    assert model.source == "fake figures" and registry.cost_model("fakenp:1") is model
    with pytest.warns(PluginWarning, match="cost_model\\(\\) raised RuntimeError: calibration table unreadable"):
        fallback = registry.cost_model("fakeobj")
    assert fallback.device == "fakeobj" and not fallback.calibrated
    assert fallback.source.startswith("rlx-core generic defaults (plugin cost_model failed: raised RuntimeError")
    registry.invalidate()
    assert registry.cost_model("fakenp") is not model


def test_cost_model_of_the_wrong_type_falls_back():
    registry = Registry(entry_points=[])
    registry.register(toy("odd", cost_model=lambda self: {"sgemm_gflops": 1}))
    with pytest.warns(PluginWarning, match="returned dict, not a CostModel"):
        assert isinstance(registry.cost_model("odd"), CostModel)


# -- the process-wide default and import hygiene -----------------------------------


def test_default_registry_is_lazy_shared_and_replaceable(isolated_registry):
    mine = Registry(entry_points=[])
    mine.register(toy("mine"))
    reg_mod.set_default_registry(mine)
    assert reg_mod.default_registry() is mine
    assert reg_mod.get_backend("mine:0") is mine.get("mine")
    assert reg_mod.broken_plugins() == []
    reg_mod.set_default_registry(None)
    fresh = reg_mod.default_registry()
    assert fresh is not mine and fresh is reg_mod.default_registry()


def test_importing_rlx_core_loads_no_plugin_and_reads_no_entry_point(fake_site):
    script = textwrap.dedent("""
        import importlib.metadata, sys
        calls = []
        importlib.metadata.entry_points = lambda *a, **k: calls.append(1) or []
        import rlx_core, rlx_core.backends.registry, rlx_core.placement.policy, rlx_core.cache
        plugins = sorted(m for m in sys.modules if m.startswith(("rlx_cpu", "rlxfake_", "rlx_cuda", "rlx_opencl")))
        print(calls, plugins)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_site.path), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[] []"



def test_first_party_backends_that_are_not_installed_are_named_with_their_pip_command(fake_site):
    from rlx_core.backends.registry import FIRST_PARTY

    registry = loaded(fake_site, "fakenp")
    missing = registry.not_installed()
    assert set(missing) == set(FIRST_PARTY)  # only the fake is installed in this registry
    assert missing["cuda"] == "pip install rlx-cuda"
    assert missing["opencl"] == "pip install 'rlx-opencl[pocl]'"
    cpu_only = [ep for ep in importlib.metadata.entry_points(group="rlx.backends") if ep.name == "cpu"]
    assert "cpu" not in Registry(entry_points=cpu_only).not_installed()
