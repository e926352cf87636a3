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
the caller's process; a calibration that crashed is remembered (``faults.py``).
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

import pluggy

from ._version import __version__
from .cost import CostModel
from .dtypes import DTYPES
from .errors import ConfigError, DeviceError, PluginError, PluginWarning
from .faults import DeviceFault, FaultLog
from .isolation import ChildTarget, isolation_enabled
from .plugin import ENTRY_POINT_GROUP, PLUGIN_API_VERSION, Availability, Backend, RlxBackendSpec
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
                               "jax": "rlx-jax-tpu", "tpu": "rlx-jax-tpu"}  # fmt: skip

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


def _reraised(name: str, error: Mapping[str, str]) -> Exception:
    """The exception a child's task raised, rebuilt here: ``NotImplementedError`` and
    rlx's own errors keep their type (callers tell "cannot calibrate" from "failed"),
    anything else is a ``PluginError`` naming the backend and the original type."""
    from . import errors

    kind, message = error.get("type", ""), error.get("message", "")
    if kind == "NotImplementedError":
        return NotImplementedError(message)
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.RlxError):
        return cls(message)
    return PluginError(f"backend {name!r}: calibrate raised {kind}: {message}")


def _distribution_name(ep: Any) -> str:
    """The name of the distribution an entry point comes from, or ``""``."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ""
    try:
        return str(getattr(dist, "name", None) or dist.metadata["Name"] or "")
    except Exception:  # metadata a broken install cannot give: the entry point is still reported
        return ""


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
            self._loading = True
            try:
                eps = self._entry_points
                if eps is None:
                    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
                for ep in eps:
                    self._distributions.add(_distribution_name(ep))
                    if ep.name in disabled:
                        logger.debug("rlx plugin %r skipped: listed in RLX_DISABLE_PLUGINS", ep.name)
                        self._disabled.append(ep.name)
                        continue
                    self._load_entry_point(ep)
            finally:
                self._loading = False
                self._loaded = True

    def _disabled_names(self) -> set[str]:
        """``RLX_DISABLE_PLUGINS`` as a set of entry point names; blank means none. An empty
        entry (``cuda,,``) is a ``ConfigError`` like any other malformed token: a variable
        that expanded to nothing would otherwise disable less than the user meant."""
        raw = self.environ.get("RLX_DISABLE_PLUGINS", "")
        names: set[str] = set()
        if not raw.strip():
            return names
        for token in raw.split(","):
            token = token.strip()
            if not token:
                raise ConfigError(f"RLX_DISABLE_PLUGINS: {raw.strip()!r} has an empty entry; expected "
                                  "comma-separated entry point names like 'cuda,opencl'")
            if any(c.isspace() for c in token) or "=" in token:
                raise ConfigError(f"RLX_DISABLE_PLUGINS: {token!r} is not an entry point name "
                                  "(expected comma-separated names like 'cuda,opencl')")
            names.add(token)
        return names

    def _load_entry_point(self, ep: Any) -> None:
        dist_obj = getattr(ep, "dist", None)
        dist = version = ""
        if dist_obj is not None:
            dist = getattr(dist_obj, "name", None) or dist_obj.metadata["Name"] or ""
            version = dist_obj.version or ""
        origin = _origin(dist, version, ep.name)
        try:
            plugin = ep.load()
            pm = pluggy.PluginManager("rlx")
            pm.add_hookspecs(RlxBackendSpec)
            pm.register(plugin, name=f"rlx-entry-point-{ep.name}")
            pm.check_pending()
            if not pm.get_hookcallers(plugin):
                raise PluginError(f"{ep.value!r} implements no rlx_backends hook (decorate it with rlx_core.hookimpl)")
            results = pm.hook.rlx_backends()
        except (Exception, SystemExit) as exc:  # whatever a plugin does, discovery goes on
            self._record_broken(_Broken(ep.name, f"{origin}: {describe_error(exc)}"))
            return
        returned = results[0] if results else None
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
            except PluginError as exc:
                names = (backend.name,) if isinstance(getattr(backend, "name", None), str) else ()
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
        a device whose calibration crashed (``fault``) is unavailable with that reason."""
        timeout = self.probe_timeout()
        wanted = self.names() if names is None else [self.info(n).name for n in names]
        isolated = self.isolated() if any(n in self._targets for n in wanted) else False
        answers: dict[str, Availability] = {}
        running: dict[str, ProbeRun] = {}
        with self._lock:
            for name in wanted:
                if name in self._availability:
                    answers[name] = self._availability[name]
                    continue
                if name not in self._probes:
                    target = self._targets.get(name) if isolated else None
                    self._probes[name] = ProbeRun(self._infos[name].backend, target, timeout=timeout,
                                                  environ=self._environ)
                running[name] = self._probes[name]
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
                answer = probe.result
                fault = self.fault(name) if answer.available else None
                if fault is not None:
                    answer = Availability(False, fault.reason(), devices=list(answer.devices),
                                          versions=dict(answer.versions))  # fmt: skip
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
        return answer

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
                  progress: Callable[[str, float], None] | None = None) -> CostModel:  # fmt: skip
        """Run backend ``name``'s ``calibrate`` and return the model it cached.

        For a backend from an entry point this runs in a child process (unless
        ``RLX_ISOLATION=0``), with ``progress(step, fraction)`` fed from it. A child that
        dies (a signal, an exit, ``RLX_CALIBRATE_TIMEOUT``) is recorded as the backend's
        ``fault`` — it is unavailable here, in this process and later ones, until a
        calibration passes — and raises ``DeviceError`` naming the signal and the step.
        What the backend's ``calibrate`` raised is raised again (its type when it is
        ``NotImplementedError`` or an rlx error, else ``PluginError``)."""
        from .calibration import progress_sink
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
                                timeout=timeout, environ=self.environ, on_step=progress)  # fmt: skip
            if outcome.died:
                what = outcome.died + (" (RLX_CALIBRATE_TIMEOUT)" if outcome.died.startswith("did not") else "")
                fault = self._faults.record(info.name, "calibration", what, outcome.step, info.version)
                self.invalidate(info.name)
                raise DeviceError(f"{info.name}: calibration {what} in its child process"
                                  + (f" at step {outcome.step!r}" if outcome.step else "")
                                  + f"; {info.name} is unusable until `rlx calibrate {fault.backend}` succeeds")
            if outcome.error is not None:
                raise _reraised(info.name, outcome.error)
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
