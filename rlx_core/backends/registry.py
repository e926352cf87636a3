"""The backend registry: discovers plugins, validates them, probes them lazily.

Discovery follows the plugin contract (ARCHITECTURE.md): every entry point of group
``rlx.backends`` is loaded in isolation, through its own ``pluggy.PluginManager`` so that
pluggy validates its hook implementation and one bad plugin cannot spoil another. What
fails is recorded in ``broken()`` (with one ``PluginWarning``) and raised only when
someone asks for that device, as JAX does for an optional platform.

Nothing happens at import: entry points are read on the first question, and each
backend's probe runs on the first question about that backend, watched by a daemon
thread with a timeout, so that a hung driver never hangs the caller or delays
interpreter exit. Probes and calibration of backends loaded from entry points run in a
child process (``isolation.py``): a driver that crashes there costs its device, never
the caller's process; a calibration that crashed is remembered (``faults.py``). A
plugin's first import on a host runs in a child too (``plugin_import.py``): one that
crashes or hangs there is a broken plugin, never imported here until it changes. A
child's probe answer is reused by later processes for a few minutes
(``probe_verdicts.py``). The device names of rlx's own backends (``FIRST_PARTY``) are
reserved for their distributions: another's backend by such a name is broken, never
loaded in their place.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import math
import os
import re
import reprlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._version import __version__
from ..cost import CostModel
from ..errors import ConfigError, DeviceError, PluginError, PluginWarning
from ..ir.dtypes import DTYPES
from ..plugin import ENTRY_POINT_GROUP, PLUGIN_API_VERSION, Availability, Backend
from .faults import DeviceFault, FaultLog
from .isolation import ChildTarget, isolation_enabled, reraised
from .plugin_import import (
    ImportVerdict,
    ReservedName,
    call_hook,
    disabled_plugins,
    distribution_of,
    import_verdicts,
    reserved_for,
)
from .probe_verdicts import ProbeVerdicts
from .probing import ProbeRun, describe_error

__all__ = ["PLATFORM_PRIORITY", "FIRST_PARTY", "BackendInfo", "Registry", "parse_device", "default_registry",
           "set_default_registry", "broken_plugins", "get_backend"]

logger = logging.getLogger("rlx.registry")

#: Conventional priorities of well-known platforms (higher wins ties and orders reports).
#: Documentation and defaults only: a backend's own ``priority`` attribute ranks it.
PLATFORM_PRIORITY: dict[str, int] = {
    "tpu": 100, "cuda": 90, "rocm": 85, "mlx": 80, "metal": 75, "gpu": 70, "opencl": 50, "jax": 40, "cpu": 0,
}

#: rlx's own backends and the pip requirement that installs each (``rlx devices`` names
#: the ones missing here: a user who expects ``cuda`` learns what to install, not nothing).
FIRST_PARTY: dict[str, str] = {"cpu": "rlx-cpu", "opencl": "rlx-opencl[pocl]", "cuda": "rlx-cuda",
                               "jax": "rlx-jax-tpu", "tpu": "rlx-jax-tpu"}

DEFAULT_PROBE_TIMEOUT = 10.0
DEFAULT_CALIBRATE_TIMEOUT = 900.0

# A backend name: no ':' (it separates the index), no whitespace, nothing a shell or a
# comma-separated RLX_* variable would mangle.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


def parse_device(device: str) -> tuple[str, int | None]:
    """Split a device string into backend name and index: ``"cuda:1" -> ("cuda", 1)``.

    The bare name means the backend's default device (index ``None``). Anything else
    (``"cuda:x"``, ``":1"``, ``""``, ``"cu da"``) raises ``DeviceError`` naming it.
    """
    if not isinstance(device, str):
        raise DeviceError(f"device must be a string like 'cpu' or 'cuda:1', got {device!r}")
    text = device.strip()
    name, sep, index = text.partition(":")
    if not _NAME_RE.fullmatch(name) or (sep and not (index.isascii() and index.isdigit())):
        raise DeviceError(f"malformed device {device!r}: expected a backend name with an optional index, "
                          "like 'cpu' or 'cuda:1'")
    return name, int(index) if sep else None


@dataclass(frozen=True)
class BackendInfo:
    """A discovered backend and where it came from (for ``rlx devices`` and errors).

    ``entry_point`` is ``""`` for a backend added with ``Registry.register``.
    """

    name: str
    backend: Backend
    entry_point: str
    distribution: str
    version: str
    label: str
    priority: int | float


@dataclass(frozen=True)
class _Broken:
    entry_point: str
    error: str
    backend_names: tuple[str, ...] = ()


def _origin(dist: str, version: str, entry_point: str) -> str:
    """How an error names where a backend came from: ``"rlx-foo 1.2"``."""
    if dist:
        return f"{dist} {version}".strip()
    return f"entry point {entry_point!r}" if entry_point else "directly registered backend"


class Registry:
    """Backends discovered from entry points (or registered directly), probed on demand.

    ``entry_points`` defaults to the installed ``rlx.backends`` entry points, read on
    first use; pass any iterable of EntryPoint-like objects (``name``, ``value``,
    ``load()``, ``dist``) to control discovery. ``environ`` defaults to ``os.environ``,
    read when needed (``RLX_DISABLE_PLUGINS`` at loading, ``RLX_PROBE_TIMEOUT`` at each
    probe). Thread-safe; state lives in the instance so tests can make fresh ones.
    """

    def __init__(self, *, entry_points: Iterable[Any] | None = None, environ: Mapping[str, str] | None = None) -> None:
        self._entry_points = entry_points
        self._environ = environ
        self._lock = threading.RLock()
        self._loaded = False
        self._loading = False
        self._infos: dict[str, BackendInfo] = {}
        self._broken: list[_Broken] = []
        self._probe_broken: dict[str, _Broken] = {}
        self._disabled: list[str] = []
        self._distributions: set[str] = set()  # of every entry point seen: loaded, disabled or broken
        self._probes: dict[str, ProbeRun] = {}
        self._targets: dict[str, ChildTarget] = {}  # backends a child process can load again
        # What each of this registry's backends makes of a graph (legalized, through the
        # pipeline): lowering.py's cache, owned here since its answers are these backends'.
        # Weakly keyed by graph: it dies with the graph.
        self.lowered: weakref.WeakKeyDictionary[Any, dict[tuple, Any]] = weakref.WeakKeyDictionary()
        self.lowered_lock = threading.Lock()
        self._faults = FaultLog()
        self._fingerprints: dict[str, str] = {}  # backend name -> its plugin's fingerprint (plugin_import)
        self._availability: dict[str, Availability] = {}
        self._cost_models: dict[str, CostModel] = {}

    @property
    def environ(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    # -- discovery -------------------------------------------------------------------

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            # ``_loading`` stops a plugin that asks the registry at import from recursing.
            if self._loaded or self._loading:
                return
            disabled = self._disabled_names()
            eps = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if self._entry_points is None
                       else self._entry_points)
            verdicts, fingerprints = import_verdicts([ep for ep in eps if ep.name not in disabled], self.environ,
                                                     isolated=self.isolated, timeout=self.probe_timeout)
            self._loading = True
            try:
                for ep in eps:
                    self._distributions.add(distribution_of(ep))
                    if ep.name in disabled:
                        logger.debug("rlx plugin %r skipped: listed in RLX_DISABLE_PLUGINS", ep.name)
                        self._disabled.append(ep.name)
                        continue
                    self._load_entry_point(ep, verdicts.get(id(ep)), fingerprints.get(id(ep), ""))
            finally:
                self._loading = False
                self._loaded = True

    def _disabled_names(self) -> set[str]:
        """``RLX_DISABLE_PLUGINS`` as a set of entry point names (``plugin_import.disabled_plugins``)."""
        if self._entry_points is not None and not isinstance(self._entry_points, (list, tuple)):
            self._entry_points = list(self._entry_points)  # read twice: here and by the loading
        return disabled_plugins(self.environ.get("RLX_DISABLE_PLUGINS", ""), self._entry_points, FIRST_PARTY)

    def _load_entry_point(self, ep: Any, verdict: ImportVerdict | None = None, fingerprint: str = "") -> None:
        dist_obj = getattr(ep, "dist", None)
        dist = version = ""
        if dist_obj is not None:
            dist = getattr(dist_obj, "name", None) or dist_obj.metadata["Name"] or ""
            version = dist_obj.version or ""
        origin = _origin(dist, version, ep.name)
        if verdict is not None and not verdict.safe:  # it crashed or hung a child: not here
            self._record_broken(_Broken(ep.name, f"{origin}: {verdict.error(ep.name, ep.value)}"))
            return
        owners = [reserved_for(n, dist, FIRST_PARTY) for n in verdict.backends] if verdict is not None else []
        if owners and all(owners):  # nothing of it could be loaded: it is not even imported
            for name, owner in zip(verdict.backends, owners):  # type: ignore[union-attr]
                self._record_broken(_Broken(ep.name, f"{origin}: {ReservedName.text(name, owner)}; not imported"))
            return
        try:
            returned = call_hook(ep.load(), ep.name, ep.value)
        except (Exception, SystemExit) as exc:  # whatever a plugin does, discovery goes on
            self._record_broken(_Broken(ep.name, f"{origin}: {describe_error(exc)}"))
            return
        if not isinstance(returned, (list, tuple)):
            self._record_broken(_Broken(ep.name, f"{origin}: rlx_backends returned {type(returned).__name__}, "
                                                 "expected a list of rlx_core.Backend"))
            return
        for backend in returned:
            try:
                self._add(backend, ep.name, dist, version)
                target = ChildTarget.of(ep, backend.name)
                if target is not None:
                    self._targets[backend.name] = target
                    self._fingerprints[backend.name] = fingerprint
            except PluginError as exc:
                named = isinstance(getattr(backend, "name", None), str) and not isinstance(exc, ReservedName)
                names = (backend.name,) if named else ()  # a reserved name stays rlx's own (not_installed)
                self._record_broken(_Broken(ep.name, f"{origin}: {exc}", names))

    def _record_broken(self, broken: _Broken) -> None:
        logger.debug("rlx plugin %r is broken: %s", broken.entry_point, broken.error)
        warnings.warn(f"rlx plugin {broken.entry_point!r} is broken: {broken.error}", PluginWarning, stacklevel=4)
        self._broken.append(broken)

    def _add(self, backend: Any, entry_point: str, dist: str, version: str) -> None:
        """Validate one backend (as pluggy validates a hook) and add it, or raise PluginError."""
        if not isinstance(backend, Backend):
            raise PluginError(f"returned {reprlib.repr(backend)}, which is not an rlx_core.Backend instance")
        name = backend.name
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise PluginError(f"backend {type(backend).__name__} has an invalid name {name!r} "
                              "(expected letters, digits, '_', '.', '-', like 'cuda')")
        owner = reserved_for(name, dist, FIRST_PARTY)
        if owner:
            raise ReservedName(ReservedName.text(name, owner))
        if backend.api_version != PLUGIN_API_VERSION:
            raise PluginError(f"backend {name!r} declares plugin API version {backend.api_version}, "
                              f"rlx-core {__version__} speaks version {PLUGIN_API_VERSION}")
        priority = backend.priority
        if isinstance(priority, bool) or not isinstance(priority, (int, float)) or not math.isfinite(priority):
            raise PluginError(f"backend {name!r} has priority {priority!r}, expected a number")
        dtypes = backend.dtypes
        if not isinstance(dtypes, (frozenset, set)) or not set(dtypes) <= set(DTYPES):
            raise PluginError(f"backend {name!r} declares dtypes {reprlib.repr(dtypes)}, expected a frozenset "
                              f"of {', '.join(DTYPES)}")
        if name in self._infos:
            other = self._infos[name]
            raise PluginError(f"backend name {name!r} is already provided by "
                              f"{_origin(other.distribution, other.version, other.entry_point)}")
        label = backend.label if isinstance(backend.label, str) and backend.label else name
        self._infos[name] = BackendInfo(name, backend, entry_point, dist, version, label, priority)
        try:  # the registry that holds it: calibration reads this registry's probe, not the global one
            backend._rlx_registry = weakref.ref(self)
        except AttributeError:  # a backend with __slots__: calibrated as an unregistered one
            pass
        logger.debug("rlx backend %r loaded from %s", name, _origin(dist, version, entry_point))

    def register(self, backend: Backend, *, distribution: str = "", version: str = "") -> None:
        """Add a backend object directly (tests, loopback backends), validated like a
        discovered one; raises ``PluginError`` if it is invalid or its name is taken."""
        self._ensure_loaded()
        with self._lock:
            self._add(backend, "", distribution, version)

    # -- questions -------------------------------------------------------------------

    def infos(self) -> list[BackendInfo]:
        """Every loaded backend, highest priority first, then by name."""
        self._ensure_loaded()
        with self._lock:
            return self._sorted_infos()

    def _sorted_infos(self) -> list[BackendInfo]:
        return sorted(self._infos.values(), key=lambda i: (-i.priority, i.name))

    def names(self) -> list[str]:
        """Backend names, highest priority first, then by name."""
        return [i.name for i in self.infos()]

    def info(self, name: str) -> BackendInfo:
        """Where backend ``name`` (``"cuda:1"`` accepted) came from; ``DeviceError`` if unknown."""
        base, _ = parse_device(name)
        self._ensure_loaded()
        with self._lock:
            found = self._infos.get(base)
            if found is not None:
                return found
            known = ", ".join(i.name for i in self._sorted_infos())
            message = f"unknown device {name.strip()!r}; known devices: {known or '(none)'}"
            for b in self._broken:
                if base == b.entry_point or base in b.backend_names:
                    message += f" (plugin {b.entry_point!r} failed to load: {b.error})"
                    break
            if base in self._disabled:
                message += f" (plugin {base!r} is disabled by RLX_DISABLE_PLUGINS)"
        raise DeviceError(message)

    def get(self, name: str) -> Backend:
        """The backend object for ``name`` (``"cuda:1"`` accepted); ``DeviceError`` if unknown."""
        return self.info(name).backend

    def broken(self) -> list[tuple[str, str]]:
        """``(entry point name, error)`` for every plugin that failed to load, and every
        backend whose probe raised, timed out or answered garbage so far (probes are lazy:
        call ``probe_all`` first for a complete list)."""
        self._ensure_loaded()
        with self._lock:
            records = self._broken + list(self._probe_broken.values())
        return [(b.entry_point, b.error) for b in records]

    def not_installed(self) -> dict[str, str]:
        """rlx's own backends that are not here: ``{device: "pip install ..."}``; one whose
        plugin is installed but disabled or broken is not listed (it is reported as such)."""
        self._ensure_loaded()
        with self._lock:
            present = set(self._infos) | set(self._disabled)
            present |= {b.entry_point for b in self._broken} | {n for b in self._broken for n in b.backend_names}
            dists = {i.distribution for i in self._infos.values()} | self._distributions
        # by distribution too: rlx-jax-tpu's one entry point, disabled, stands for tpu as well
        return {name: f"pip install '{req}'" if "[" in req else f"pip install {req}"
                for name, req in FIRST_PARTY.items() if name not in present and req.partition("[")[0] not in dists}

    def known_names(self) -> set[str]:
        """Every backend name a device policy may mention here: the loaded backends, rlx's
        own (``FIRST_PARTY``) whether installed or not, and the plugins disabled or broken
        here (``DevicePolicy.validate`` refuses any other name)."""
        self._ensure_loaded()
        with self._lock:
            names = set(self._infos) | set(FIRST_PARTY) | set(self._disabled)
            names |= {b.entry_point for b in self._broken} | {n for b in self._broken for n in b.backend_names}
        return names

    def disabled(self) -> list[str]:
        """Entry point names skipped (never imported) because of ``RLX_DISABLE_PLUGINS``."""
        self._ensure_loaded()
        return list(self._disabled)

    # -- probes ----------------------------------------------------------------------

    def probe_timeout(self) -> float:
        """Seconds a probe may take (``RLX_PROBE_TIMEOUT``, default 10)."""
        return self._seconds("RLX_PROBE_TIMEOUT", DEFAULT_PROBE_TIMEOUT)

    def _seconds(self, variable: str, default: float) -> float:
        """A positive number of seconds from ``variable``; ``default`` when unset or blank."""
        raw = self.environ.get(variable, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{variable}: {raw!r} is not a number of seconds > 0")
        return value

    def availability(self, name: str) -> Availability:
        """Whether backend ``name`` can run here; probes only that backend, once."""
        return self.probe_all([name])[parse_device(name)[0]]

    def isolated(self) -> bool:
        """Whether probes and calibration of entry-point backends run in child processes
        (``RLX_ISOLATION``, default on)."""
        return isolation_enabled(self.environ)

    def probe_all(self, names: Iterable[str] | None = None) -> dict[str, Availability]:
        """Probe ``names`` (default: every backend) concurrently, each watched by a daemon
        thread, each at most ``probe_timeout()`` seconds; answers are cached per registry.

        A backend from an entry point is probed in a child process (unless
        ``RLX_ISOLATION=0``), so a probe that crashes its process costs only its device;
        a device whose calibration crashed (``fault``) is unavailable with that reason.
        A child's answer of the last minutes is reused (``probe_verdicts``)."""
        timeout = self.probe_timeout()
        wanted = self.names() if names is None else [self.info(n).name for n in names]
        isolated = self.isolated() if any(n in self._targets for n in wanted) else False
        answers: dict[str, Availability] = {}
        running: dict[str, ProbeRun] = {}
        recalled: dict[str, Availability] = {}
        with self._lock:
            for name in wanted:
                if name in self._availability:
                    answers[name] = self._availability[name]
                    continue
                if name not in self._probes:
                    target = self._targets.get(name) if isolated else None
                    kept = self._kept_probes(name) if target is not None else None
                    remembered = kept[0].get(name, kept[1]) if kept is not None else None
                    if remembered is not None:
                        recalled[name] = remembered
                        continue
                    self._probes[name] = ProbeRun(self._infos[name].backend, target, timeout=timeout,
                                                  environ=self._environ)
                running[name] = self._probes[name]
        for name, answer in recalled.items():
            answers[name] = self._settle_recalled(name, answer)
        for name, probe in running.items():
            probe.wait(timeout)
            answers[name] = self._settle(name, probe, timeout)
        return {name: answers[name] for name in wanted}

    def _settle(self, name: str, probe: ProbeRun, timeout: float) -> Availability:
        """Turn a finished (or overdue) probe into an answer, cached unless invalidated meanwhile."""
        with self._lock:
            current = self._probes.get(name) is probe
            if current and name in self._availability:
                return self._availability[name]
            reason = probe.reason(timeout)
            if not reason:
                assert isinstance(probe.result, Availability)
                answer = self._unless_faulted(name, probe.result)
            else:
                answer = Availability(False, reason)
                if current:
                    info = self._infos[name]
                    error = f"{_origin(info.distribution, info.version, info.entry_point)}: backend {name!r} {reason}"
                    self._probe_broken[name] = _Broken(info.entry_point or name, error, (name,))
                    logger.debug("rlx backend %r: %s", name, reason)
                    warnings.warn(f"rlx backend {name!r}: {reason}", PluginWarning, stacklevel=4)
            if current:
                self._availability[name] = answer
        if current and probe.isolated and not reason and probe.result is not None:
            self._tell_probed(name, probe.result)  # outside the lock: the backend's own code
            kept = self._kept_probes(name)
            if kept is not None:
                kept[0].put(name, kept[1], probe.result)
        return answer

    def _unless_faulted(self, name: str, answer: Availability) -> Availability:
        """``answer``, or unavailable for the calibration fault recorded for ``name``."""
        fault = self.fault(name) if answer.available else None
        if fault is None:
            return answer
        return Availability(False, fault.reason(), devices=list(answer.devices), versions=dict(answer.versions))

    def _kept_probes(self, name: str) -> tuple[ProbeVerdicts, str] | None:
        """Where probe answers are kept for later processes, and backend ``name``'s
        identity there; ``None`` for one whose answers are not kept (no child, or no
        plugin fingerprint: ``RLX_ISOLATION=0``, a fake entry point)."""
        info, target, plugin = self._infos[name], self._targets.get(name), self._fingerprints.get(name)
        if target is None or not plugin:
            return None
        identity = ProbeVerdicts.identity(target, info.distribution, info.version, plugin, self.environ)
        return ProbeVerdicts(self.environ), identity

    def _settle_recalled(self, name: str, answer: Availability) -> Availability:
        """A kept answer, settled as ``_settle`` settles a fresh one."""
        with self._lock:
            shown = self._availability.setdefault(name, self._unless_faulted(name, answer))
        self._tell_probed(name, answer)
        return shown

    def _tell_probed(self, name: str, answer: Availability) -> None:
        """``Backend.probed``: what the child's probe learned, for this process's backend."""
        try:
            self._infos[name].backend.probed(answer)
        except Exception as exc:  # an optional courtesy: its failure costs nothing else
            logger.debug("rlx backend %r: probed() raised %s: %s", name, type(exc).__name__, exc)

    # -- faults and calibration ------------------------------------------------------

    def fault(self, name: str) -> DeviceFault | None:
        """The crash recorded for backend ``name``'s calibration on this host (from any
        process), while its plugin version is the one that crashed; else ``None``."""
        info = self.info(name)
        try:
            return self._faults.get(info.name, info.version)
        except Exception as exc:  # an unreadable cache must not make a device unusable
            logger.debug("rlx: cannot read the fault record of %r: %s", info.name, exc)
            return None

    def calibrate_timeout(self) -> float:
        """Seconds a calibration may take (``RLX_CALIBRATE_TIMEOUT``, default 900)."""
        return self._seconds("RLX_CALIBRATE_TIMEOUT", DEFAULT_CALIBRATE_TIMEOUT)

    def calibrate(self, name: str, quick: bool = False,
                  progress: Callable[[str, float], None] | None = None) -> CostModel:
        """Run backend ``name``'s ``calibrate`` and return the model it cached.

        For a backend from an entry point this runs in a child process (unless
        ``RLX_ISOLATION=0``), with ``progress(step, fraction)`` fed from it. A child that
        dies (a signal, an exit, ``RLX_CALIBRATE_TIMEOUT``) is recorded as the backend's
        ``fault`` — it is unavailable here, in this process and later ones, until a
        calibration passes — and raises ``DeviceError`` naming the signal and the step.
        What the backend's ``calibrate`` raised is raised again (its type when it is
        ``NotImplementedError`` or an rlx error, else ``PluginError``)."""
        from ..calibration import progress_sink
        from .isolation import run_child

        info = self.info(name)
        target = self._targets.get(info.name) if self.isolated() else None
        if target is None:
            with progress_sink(progress):
                model = info.backend.calibrate(quick=quick)
            if not isinstance(model, CostModel):
                raise PluginError(f"backend {info.name!r}: calibrate() returned {type(model).__name__}, "
                                  "expected rlx_core.CostModel")
        else:
            timeout = self.calibrate_timeout()
            outcome = run_child({"task": "calibrate", "target": dataclasses.asdict(target), "quick": quick},
                                timeout=timeout, environ=self.environ, on_step=progress)
            if outcome.died:
                what = outcome.died + (" (RLX_CALIBRATE_TIMEOUT)" if outcome.died.startswith("did not") else "")
                fault = self._faults.record(info.name, "calibration", what, outcome.step, info.version)
                self.invalidate(info.name)
                raise DeviceError(f"{info.name}: calibration {what} in its child process"
                                  + (f" at step {outcome.step!r}" if outcome.step else "")
                                  + f"; {info.name} is unusable until `rlx calibrate {fault.backend}` succeeds")
            if outcome.error is not None:
                raise reraised(info.name, outcome.error)
            model = CostModel.from_dict((outcome.result or {})["model"])
        if self.fault(info.name) is not None:
            self._faults.clear(info.name)
            self.invalidate(info.name)  # it was unavailable for the fault: ask its probe again
        with self._lock:
            self._cost_models.pop(info.name, None)
        return model

    # -- cost models -----------------------------------------------------------------

    def cost_model(self, name: str) -> CostModel:
        """The backend's cost model, cached; generic defaults (with a ``PluginWarning``)
        when the plugin's ``cost_model`` raises or returns something else."""
        info = self.info(name)
        with self._lock:
            cached = self._cost_models.get(info.name)
        if cached is not None:
            return cached
        try:
            model = info.backend.cost_model()
            problem = "" if isinstance(model, CostModel) else f"returned {type(model).__name__}, not a CostModel"
        except Exception as exc:
            model, problem = None, f"raised {describe_error(exc)}"
        if problem:
            warnings.warn(f"rlx backend {info.name!r}: cost_model() {problem}; using generic defaults",
                          PluginWarning, stacklevel=2)
            model = CostModel(device=info.name,
                              source=f"rlx-core generic defaults (plugin cost_model failed: {problem})")
        assert isinstance(model, CostModel)
        with self._lock:
            return self._cost_models.setdefault(info.name, model)

    def invalidate(self, name: str | None = None) -> None:
        """Forget cached probe answers and cost models (all, or one backend's), e.g.
        after ``calibrate``; the next question asks the backend again."""
        with self._lock:
            keys = [parse_device(name)[0]] if name is not None else list(self._infos)
            for key in keys:
                self._availability.pop(key, None)
                self._cost_models.pop(key, None)
                self._probe_broken.pop(key, None)
                self._probes.pop(key, None)
        for key in keys:  # and the answer later processes would reuse
            if self._targets.get(key) is not None:
                ProbeVerdicts(self.environ).forget(key)


_default: Registry | None = None
_default_lock = threading.Lock()


def default_registry() -> Registry:
    """The process-wide registry, created on first use (plugins load on its first question)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Registry()
        return _default


def set_default_registry(registry: Registry | None) -> None:
    """Replace the process-wide registry (tests); ``None`` makes the next use create a fresh one."""
    global _default
    with _default_lock:
        _default = registry


def broken_plugins() -> list[tuple[str, str]]:
    """``(entry point name, error)`` of every plugin that failed to load or probe so far."""
    return default_registry().broken()


def get_backend(device: str) -> Backend:
    """The discovered backend object for ``device`` (e.g. to hand to the conformance kit)."""
    return default_registry().get(device)
