"""Device policy: which devices may run a graph, which are preferred, how to pick.

A ``DevicePolicy`` is an immutable value. ``policy=None`` anywhere in rlx means
``DevicePolicy.from_env()`` evaluated at that call; an explicit policy ignores the
environment. Every setting remembers where it came from (``sources``) so that
``rlx devices --explain`` and every refusal can say "denied by policy (RLX_DENY_DEVICES)"
instead of leaving the user to guess.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..backends.registry import parse_device
from ..errors import ConfigError, DeviceError, UnknownDeviceError

if TYPE_CHECKING:
    from ..backends.registry import Registry

__all__ = ["DevicePolicy", "PICKS"]

PICKS = ("cost", "benchmark", "measure")

_SETTINGS = ("allow", "deny", "prefer", "pick", "benchmark_runs", "device", "chain", "strict")

#: The policy's variables: suffix -> the DevicePolicy setting it feeds. Their parsers are
#: below; their meanings, and every other ``RLX_*`` variable, are in ``settings.py``'s table
#: (with ``environment_settings`` and ``check_environment``, which lived here before it).
_VARIABLES: dict[str, str] = {
    "DEVICE": "device", "DEVICES": "allow", "DENY_DEVICES": "deny", "PREFER_DEVICES": "prefer",
    "DEVICE_CHAIN": "chain", "BENCHMARK_PICK": "benchmark_runs", "STRICT": "strict",
}

#: Settings whose variable is a comma-separated list of device names.
_LIST_SETTINGS = ("allow", "deny", "prefer", "chain")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

P = TypeVar("P", bound="DevicePolicy")


class _PolicyBuilder(Generic[P]):
    """A method that also works on the class: ``DevicePolicy.only([...])`` starts from the
    default policy, ``policy.only([...])`` from that policy. Either way it returns a new
    policy and never mutates one."""

    def __init__(self, func: Callable[..., P]) -> None:
        self.func = func
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __get__(self, obj: P | None, objtype: type[P] | None = None) -> Callable[..., P]:
        if obj is None:
            assert objtype is not None
            obj = objtype()
        return types.MethodType(self.func, obj)


def _device_names(value: Any, what: str) -> tuple[str, ...]:
    """Normalize an iterable of device names (or one comma-separated string) to a tuple of
    stripped, validated, de-duplicated names in their original order."""
    if isinstance(value, str):
        value = value.split(",")
    try:
        items = list(value)
    except TypeError:
        raise ConfigError(f"{what}: expected an iterable of device names, got {value!r}") from None
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{what}: {item!r} is not a device name (expected strings like 'cuda' or 'cuda:1')")
        token = item.strip()
        if not token:
            continue
        names.append(_device_name(token, what))
    return tuple(dict.fromkeys(names))


def _device_name(token: str, what: str) -> str:
    try:
        parse_device(token)
    except DeviceError:
        raise ConfigError(f"{what}: {token!r} is not a device name (expected a name like 'cuda' or 'cuda:1')") \
            from None
    return token.strip()


def _covers(entry: str, device: str) -> bool:
    """Whether a policy entry names ``device``: ``cuda`` covers ``cuda`` and ``cuda:1``;
    ``cuda:1`` covers only ``cuda:1``."""
    return entry == device or (":" not in entry and entry == device.partition(":")[0])


@dataclass(frozen=True)
class DevicePolicy:
    """Which devices may run graphs and how the runtime picks among them.

    ``allow`` (``None`` = every device), ``deny`` and ``prefer`` are tuples of device
    names; ``pick`` is ``"cost"`` (the cost models rank; a long-lived ``GraphDevices``
    times the close candidates on its first runs when the ranking is unsure),
    ``"benchmark"`` (time ``benchmark_runs`` runs on each candidate) or ``"measure"``
    (the cost ranking, and when it is unsure ``rlx.compile`` times the close candidates
    ``benchmark_runs`` runs each at compile, see ``measured.py``); ``device`` is the default device;
    ``chain`` the fallback order; ``strict`` forbids fallback. Iterables are normalized
    to tuples of stripped names, and a malformed setting is a ``ConfigError``.
    ``sources`` maps each setting to where it came from (``"default"``, ``"argument"``,
    ``"env RLX_DEVICES"``); it is filled in automatically and ignored by ``==``.
    """

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    prefer: tuple[str, ...] = ()
    pick: str = "cost"
    benchmark_runs: int = 3
    device: str | None = None
    chain: tuple[str, ...] = ()
    strict: bool = False
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if self.allow is not None:
            put("allow", _device_names(self.allow, "DevicePolicy allow"))
        for name in ("deny", "prefer", "chain"):
            put(name, _device_names(getattr(self, name), f"DevicePolicy {name}"))
        if self.pick not in PICKS:
            raise ConfigError(f"DevicePolicy pick: {self.pick!r} is not one of {', '.join(PICKS)}")
        runs = self.benchmark_runs
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ConfigError(f"DevicePolicy benchmark_runs: {runs!r} is not an integer >= 1")
        if self.device is not None:
            if not isinstance(self.device, str) or not self.device.strip():
                raise ConfigError(f"DevicePolicy device: {self.device!r} is not a device name")
            put("device", _device_name(self.device, "DevicePolicy device"))
        if self.strict in (0, 1):
            put("strict", bool(self.strict))
        else:
            raise ConfigError(f"DevicePolicy strict: {self.strict!r} is not a bool")
        defaults = DevicePolicy.__dataclass_fields__
        sources = {}
        for name in _SETTINGS:
            given = self.sources.get(name)
            sources[name] = given or ("default" if getattr(self, name) == defaults[name].default else "argument")
        put("sources", types.MappingProxyType(sources))

    def __reduce__(self) -> tuple[Any, ...]:
        # ``sources`` is a read-only mappingproxy, which pickle refuses; rebuild from
        # plain values instead (policies travel to Ray workers).
        return (type(self), (*(getattr(self, name) for name in _SETTINGS), dict(self.sources)))

    # -- building --------------------------------------------------------------------

    def _replace(self: P, **changes: Any) -> P:
        sources = dict(self.sources)
        sources.update(dict.fromkeys(changes, "argument"))
        return dataclasses.replace(self, sources=sources, **changes)

    @_PolicyBuilder
    def only(self: P, devices: Iterable[str]) -> P:
        """Allow exactly ``devices`` (on the class: starting from the defaults)."""
        return self._replace(allow=_device_names(devices, "DevicePolicy.only"))

    @_PolicyBuilder
    def with_deny(self: P, devices: Iterable[str]) -> P:
        """Deny ``devices`` (replacing the deny list; on the class: from the defaults)."""
        return self._replace(deny=_device_names(devices, "DevicePolicy.with_deny"))

    @_PolicyBuilder
    def with_prefer(self: P, devices: Iterable[str]) -> P:
        """Prefer ``devices``, in order (replacing the prefer list)."""
        return self._replace(prefer=_device_names(devices, "DevicePolicy.with_prefer"))

    @_PolicyBuilder
    def with_benchmark_pick(self: P, runs: int = 3) -> P:
        """Pick by timing ``runs`` runs on each candidate instead of by cost model."""
        return self._replace(pick="benchmark", benchmark_runs=runs)

    @classmethod
    def from_env(cls, prefix: str = "RLX", environ: Mapping[str, str] | None = None) -> DevicePolicy:
        """The policy the ``{prefix}_*`` variables describe (unset or empty = default)."""
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for suffix, setting in _VARIABLES.items():
            var = f"{prefix}_{suffix}"
            raw = env.get(var, "")
            if not raw.strip():
                continue
            if setting == "device":
                value: Any = _device_name(raw.strip(), var)
            elif setting == "benchmark_runs":
                value = _parse_runs(var, raw)
                if value:
                    kwargs["pick"] = "benchmark"
                else:
                    setting, value = "pick", "cost"
                sources["pick"] = f"env {var}"
            elif setting == "strict":
                value = _parse_bool(var, raw)
            else:
                value = _device_names(_entries(var, raw), var)
            kwargs[setting] = value
            sources[setting] = f"env {var}"
        return cls(**kwargs, sources=sources)

    # -- questions -------------------------------------------------------------------

    def permits(self, device: str) -> str | None:
        """``None`` when the policy lets ``device`` run graphs, else the reason why not.

        ``deny=("cuda",)`` denies ``cuda`` and ``cuda:1``; ``deny=("cuda:1",)`` denies only
        ``cuda:1``. A bare name asks about the backend, so ``allow=("cuda:1",)`` permits
        ``cuda`` (its default device may not be used, the backend may).
        """
        device = _device_name(device, "device")
        for entry in self.deny:
            if _covers(entry, device):
                return f"denied by policy ({self._where('deny')})"
        if self.allow is not None:
            bare = ":" not in device
            if not any(_covers(e, device) or (bare and parse_device(e)[0] == device) for e in self.allow):
                listed = ", ".join(self.allow) or "(none)"
                return f"not in the allowed devices {listed} ({self._where('allow')})"
        return None

    def validate(self, registry: Registry) -> None:
        """``UnknownDeviceError`` (both a ``ConfigError`` and a ``DeviceError``) when a
        setting names a device that is neither a backend here nor one of rlx's own, naming
        the setting (``RLX_DENY_DEVICES``), the name and the known devices.

        A policy is parsed without a registry (from the environment, or by a caller), so
        its names can only be checked when it meets one: ``Placement`` calls this. A name
        of rlx's own backends passes even when its plugin is not installed
        (``RLX_DENY_DEVICES=cuda`` on a host without rlx-cuda is sensible, and the same
        variables travel between hosts), and so does a plugin disabled or broken here;
        anything else is a typo that would otherwise deny, allow or prefer nothing.
        """
        known = registry.known_names()
        for setting in ("device", *_LIST_SETTINGS):
            value = getattr(self, setting)
            entries = (value,) if isinstance(value, str) else (value or ())
            for entry in entries:
                name = parse_device(entry)[0]
                if name not in known:
                    loaded = registry.names()
                    listed = ", ".join([*loaded, *sorted(known - set(loaded))])
                    raise UnknownDeviceError(f"{self._where(setting)}: unknown device {name!r}; "
                                             f"known devices: {listed}")

    def _where(self, setting: str) -> str:
        source = self.sources.get(setting, "default")
        return source[4:] if source.startswith("env ") else f"DevicePolicy.{setting}"

    def to_dict(self) -> dict[str, Any]:
        """Settings and their sources, JSON-ready (``rlx devices --json``)."""
        d: dict[str, Any] = {}
        for name in _SETTINGS:
            value = getattr(self, name)
            d[name] = list(value) if isinstance(value, tuple) else value
        d["sources"] = dict(self.sources)
        return d


def _entries(var: str, raw: str) -> list[str]:
    """The entries of a comma-separated variable. An empty one (``cpu,,``, ``cpu,``,
    ``,cpu``) is a ``ConfigError``: it is almost always a variable that expanded to
    nothing (``RLX_DEVICES=cpu,$EXTRA``), and ignoring it would hide that."""
    entries = raw.split(",")
    if any(not e.strip() for e in entries):
        raise ConfigError(f"{var}: {raw.strip()!r} has an empty entry; expected comma-separated device names "
                          "like 'cpu,cuda'")
    return entries


def _parse_runs(var: str, raw: str) -> int:
    token = raw.strip()
    if not (token.isascii() and token.isdigit()):
        raise ConfigError(f"{var}: {token!r} is not a number of runs (an integer >= 1, or 0 for off)")
    return int(token)


def _parse_bool(var: str, raw: str) -> bool:
    token = raw.strip().lower()
    if token in _TRUE:
        return True
    if token in _FALSE:
        return False
    raise ConfigError(f"{var}: {raw.strip()!r} is not a boolean (expected 0 or 1, true/false, yes/no)")
