"""Every ``RLX_*`` variable rlx reads, in one table: name, parser, default, one line of
meaning and the distribution that owns it.

Each variable is read where it is used (the policy at each call, the memory limit at
compile, the timeouts at each probe, rlx-cpu's switches inside its kernels), so without
one list a malformed value surfaces late and in the wrong shape, a typo (``RLX_DEVICS``)
is silently ignored, and ``rlx devices --explain`` forgets whatever was added last. The
table is that list: every ``rlx`` command parses all of it — rlx-core's rows and those
each loaded plugin declares (``Backend.settings``) — before any work
(``check_environment``), and ``--explain`` shows it.

The parsers stay beside the code that acts on them (``policy.py``, ``memory.py``, ...):
a row here calls them, so a value means the same when the CLI checks it as when it is
used. Nothing below the CLI imports this module (the rows import their parsers, lazily),
so no import circle joins it to them; a row is an ``rlx_core.plugin.Setting``, the
contract's type, which plugins use for their own rows.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import PluginWarning, RlxWarning
from ..plugin import Setting

if TYPE_CHECKING:
    from ..backends.registry import Registry

__all__ = ["Setting", "CORE_SETTINGS", "INTERNAL_VARIABLES", "plugin_settings", "all_settings", "check_environment",
           "environment_settings", "unknown_variables"]

CORE_OWNER = "rlx-core"
#: How alike (difflib's ratio, over the part after ``RLX_``) an unknown variable must be
#: to a known one to be called a typo of it: ``DEVICS``/``DEVICES`` is 0.92, while
#: ``FUZZ_DEVICES``/``DEVICES`` (a test suite's own variable) is 0.74.
_TYPO_CUTOFF = 0.8


# --------------------------------------------------------------------------- rlx-core's rows
def _policy(var: str, kind: str) -> Callable[[str], Any]:
    """The policy's own parser of ``var`` (``policy.py``): one device, a list, runs, a bool."""

    def parse(raw: str) -> Any:
        from ..placement import policy

        if kind == "device":
            return policy._device_name(raw, var)
        if kind == "list":
            return policy._device_names(policy._entries(var, raw), var)
        if kind == "runs":
            return policy._parse_runs(var, raw)
        return policy._parse_bool(var, raw)

    return parse


def _disabled_plugins(raw: str) -> frozenset[str]:
    from ..backends.registry import Registry

    return frozenset(Registry(environ={"RLX_DISABLE_PLUGINS": raw})._disabled_names())


def _cache_dir(raw: str) -> Any:
    from ..cache import cache_dir

    return cache_dir({"RLX_CACHE_DIR": raw})


def _fusion_report(raw: str) -> bool:
    from ..passes.pipeline import fusion_report_enabled

    return fusion_report_enabled({"RLX_FUSION_REPORT": raw})


def _memory_limit(raw: str) -> Any:
    from ..compiler.memory import parse_memory_limits

    return parse_memory_limits(raw)


def _drift(var: str) -> Callable[[str], Any]:
    def parse(raw: str) -> Any:
        from .drift import drift_settings

        return drift_settings({var: raw})[0 if var == "RLX_REPICK_DRIFT" else 1]

    return parse


def _isolation(raw: str) -> bool:
    from ..backends.isolation import isolation_enabled

    return isolation_enabled({"RLX_ISOLATION": raw})


def _seconds(var: str) -> Callable[[str], float]:
    """The registry's own parser of a timeout (``Registry._seconds``)."""

    def parse(raw: str) -> float:
        from ..backends.registry import Registry

        return Registry(entry_points=[], environ={var: raw})._seconds(var, 0.0)

    return parse


def _core(name: str, parse: Callable[[str], Any], default: Any, doc: str) -> Setting:
    return Setting(name, doc, parse=parse, default=default, owner=CORE_OWNER)


#: rlx-core's variables, in the order ``rlx devices --explain`` shows them.
CORE_SETTINGS: tuple[Setting, ...] = (
    _core("RLX_DEVICE", _policy("RLX_DEVICE", "device"), None,
          "default device for compile and run (an explicit device: never silently moved)"),
    _core("RLX_DEVICES", _policy("RLX_DEVICES", "list"), None,
          "comma-separated devices allowed to run graphs (unset = all)"),
    _core("RLX_DENY_DEVICES", _policy("RLX_DENY_DEVICES", "list"), (), "comma-separated devices never used"),
    _core("RLX_PREFER_DEVICES", _policy("RLX_PREFER_DEVICES", "list"), (),
          "comma-separated devices tried first, in order, when they can run the graph"),
    _core("RLX_DEVICE_CHAIN", _policy("RLX_DEVICE_CHAIN", "list"), (),
          "comma-separated fallback order for run_with_fallback"),
    _core("RLX_BENCHMARK_PICK", _policy("RLX_BENCHMARK_PICK", "runs"), 0,
          "time the candidates this many runs instead of trusting the cost model (0 = off)"),
    _core("RLX_STRICT", _policy("RLX_STRICT", "bool"), False,
          "1 = no fallback anywhere: the first viable device's failure is an error"),
    _core("RLX_PROBE_TIMEOUT", _seconds("RLX_PROBE_TIMEOUT"), 10.0,
          "seconds a backend's probe may take before it is reported broken (default 10)"),
    _core("RLX_DISABLE_PLUGINS", _disabled_plugins, frozenset(),
          "comma-separated plugin entry-point names not to load (never imported)"),
    _core("RLX_CACHE_DIR", _cache_dir, None,
          "where calibrations and other caches are stored, an absolute path (default: the user cache dir)"),
    _core("RLX_FUSION_REPORT", _fusion_report, False,
          "1 = report what the fusion pass fused and why, for each compiled graph"),
    _core("RLX_MEMORY_LIMIT", _memory_limit, None,
          "bytes a compiled graph may need, for every device (8G) or per device (cuda=2G,cpu=16G); none = no check; "
          "default: what the probe measured, else this host's memory"),
    _core("RLX_REPICK_DRIFT", _drift("RLX_REPICK_DRIFT"), 3.0,
          "a long-lived GraphDevices leaves its auto-picked device when runs get this many times slower than its "
          "baseline (default 3; off = never)"),
    _core("RLX_REPICK_FORGET", _drift("RLX_REPICK_FORGET"), 60.0,
          "seconds after which such a slowdown is forgotten (default 60)"),
    _core("RLX_ISOLATION", _isolation, True,
          "1 (default) = probe and calibrate plugins in child processes; 0 = in this one"),
    _core("RLX_CALIBRATE_TIMEOUT", _seconds("RLX_CALIBRATE_TIMEOUT"), 900.0,
          "seconds one device's calibration may take (default 900)"),
)

#: Variables rlx sets for itself, not settings: known (never called a typo), not listed.
INTERNAL_VARIABLES: Mapping[str, str] = {"RLX_ISOLATION_CHILD": "set to 1 in rlx's probe and calibration children"}


# --------------------------------------------------------------------------- plugins' rows
def plugin_settings(registry: Registry) -> list[Setting]:
    """The settings every loaded backend of ``registry`` declares (``Backend.settings``),
    each with its distribution as ``owner``, once per variable.

    A plugin's mistake here (``settings()`` raising, something not a ``Setting``, a name
    rlx-core or another distribution owns) is a ``PluginWarning`` and that row is left
    out: a plugin must not stop every ``rlx`` command, nor take over another's variable.
    """
    core = {s.name for s in CORE_SETTINGS} | set(INTERNAL_VARIABLES)
    found: dict[str, Setting] = {}
    for info in registry.infos():
        owner = info.distribution or f"plugin {info.entry_point or info.name}"
        try:
            declared = list(getattr(info.backend, "settings", lambda: ())() or ())
        except Exception as exc:
            warnings.warn(f"rlx backend {info.name!r} ({owner}): settings() raised {type(exc).__name__}: {exc}; "
                          "its variables are not checked", PluginWarning, stacklevel=2)
            continue
        for setting in declared:
            problem = ""
            if not isinstance(setting, Setting):
                problem = f"settings() returned {type(setting).__name__}, not an rlx_core.plugin.Setting"
            elif setting.name in core:
                problem = f"{setting.name} belongs to rlx-core"
            elif setting.name in found and found[setting.name].owner != owner:
                problem = f"{setting.name} is already declared by {found[setting.name].owner}"
            if problem:
                warnings.warn(f"rlx backend {info.name!r} ({owner}): {problem}; left out", PluginWarning, stacklevel=2)
                continue
            found.setdefault(setting.name, replace(setting, owner=owner))
    return list(found.values())


def all_settings(registry: Registry | None = None) -> list[Setting]:
    """rlx-core's table, then the loaded plugins' (``registry``: the default one)."""
    from ..backends.registry import default_registry

    return [*CORE_SETTINGS, *plugin_settings(registry or default_registry())]


# --------------------------------------------------------------------------- checking
def unknown_variables(environ: Mapping[str, str], known: Iterable[str]) -> list[tuple[str, str]]:
    """``(variable, the known one it looks like a typo of)`` for each ``RLX_*`` variable
    in ``environ`` that rlx does not read but that is close to one it does. Unknown
    variables that resemble none are left alone: other tools may use the prefix."""
    names = set(known) | set(INTERNAL_VARIABLES)
    suffixes = {n[4:]: n for n in names}
    typos = []
    for var in sorted(environ):
        if not var.startswith("RLX_") or var in names:
            continue
        close = difflib.get_close_matches(var[4:], list(suffixes), n=1, cutoff=_TYPO_CUTOFF)
        if close:
            typos.append((var, suffixes[close[0]]))
    return typos


def check_environment(environ: Mapping[str, str] | None = None, registry: Registry | None = None) -> list[Setting]:
    """Parse every variable of the table — rlx-core's, then those of the plugins loaded
    in ``registry`` (the default one) — and raise the first ``ConfigError`` (naming the
    variable, the value and what is accepted); warn (``RlxWarning``) about an ``RLX_*``
    variable that is no setting but looks like a typo of one. Returns the settings
    checked.

    rlx-core's rows come first and need no plugin: a malformed ``RLX_DISABLE_PLUGINS``
    is reported as itself, not as a failure to load the plugins. Device names are
    checked against the installed backends later, by ``DevicePolicy.validate``.
    """
    env = os.environ if environ is None else environ
    for setting in CORE_SETTINGS:
        setting.read(env)
    from ..backends.registry import default_registry

    plugins = plugin_settings(registry or default_registry())
    for setting in plugins:
        setting.read(env)
    checked = [*CORE_SETTINGS, *plugins]
    for var, like in unknown_variables(env, (s.name for s in checked)):
        warnings.warn(f"{var} is not a variable rlx reads; did you mean {like}? ({var} is ignored)", RlxWarning,
                      stacklevel=2)
    return checked


def environment_settings(prefix: str = "RLX", environ: Mapping[str, str] | None = None,
                         ) -> list[tuple[str, str | None, str]]:
    """``(variable, current value or None, meaning)`` for every variable of rlx-core's
    table, in its order; ``prefix`` renames them as ``DevicePolicy.from_env(prefix)``
    reads them. The plugins' rows are in ``all_settings``."""
    env = os.environ if environ is None else environ
    names = [(f"{prefix}_{s.name[4:]}", s.doc) for s in CORE_SETTINGS]
    return [(name, env.get(name), doc) for name, doc in names]
