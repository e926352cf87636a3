"""Recent probe answers, kept on disk so that the next ``rlx`` command does not probe again.

Each backend from an entry point is probed in a child process (``probing.py``): a fresh
interpreter, the plugin's import, and a real computation on the device, about half a
second to a few seconds each. Every ``rlx`` command used to pay that for every backend.
An answer a child gave is now kept (namespace ``probes``) and reused by later processes
for ``PROBE_VERDICT_TTL_S`` (ten minutes) while nothing it could depend on has changed:

- the backend, its entry point, its distribution and version, and the plugin's
  fingerprint (``plugin_import.fingerprint``: its files' mtimes and sizes);
- the environment the child would be given (``child_env``: every variable, ``RLX_*``
  included, less the shell's bookkeeping and rlx's device-policy and timeout settings,
  which choose among devices but do not change what a probe finds), so that
  ``CUDA_VISIBLE_DEVICES=``, ``JAX_PLATFORMS`` or a plugin's ``RLX_CPU_*`` change it;
- the mtime of every site-packages directory on ``sys.path`` (installing a driver's
  Python package, pyopencl say, changes it), the interpreter, rlx-core's version, and
  the boot (``/proc/sys/kernel/random/boot_id`` where there is one).

Doubt means probing again: an answer older than the TTL, from the future (the clock
moved), or written for anything else is not used. Only an answer the probe gave is kept
(available or not, with its reason); a probe that timed out, crashed, raised or returned
garbage is asked again by the next process. A device that appears (a driver installed
outside Python, a GPU attached) is therefore seen at the latest ``PROBE_VERDICT_TTL_S``
later; one that disappears fails at compile and is fallen back from, as any device that
fails. ``Registry.invalidate`` forgets the backend's answer here too. A probe in this
process (``RLX_ISOLATION=0``, backends added with ``Registry.register``) is never cached:
it may leave state in the backend that a remembered answer would not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._version import __version__
from ..cache import JsonCache
from ..plugin import Availability
from .isolation import ChildTarget, child_env
from .plugin_import import cache_writable, interpreter_tag, verdict_root

__all__ = ["PROBE_VERDICT_TTL_S", "ProbeVerdicts", "PROBE_NAMESPACE"]

log = logging.getLogger("rlx.registry")

PROBE_NAMESPACE = "probes"
#: Seconds a probe's answer is reused by later processes.
PROBE_VERDICT_TTL_S = 600.0
_SCHEMA = 1
#: What the environment's identity leaves out: the shell's bookkeeping, and rlx's
#: settings that choose among devices or bound waits without changing what a probe finds.
_NOT_IDENTITY = frozenset({
    "PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES",
    "RLX_DEVICE", "RLX_DEVICES", "RLX_DENY_DEVICES", "RLX_PREFER_DEVICES", "RLX_DEVICE_CHAIN",
    "RLX_BENCHMARK_PICK", "RLX_STRICT", "RLX_PROBE_TIMEOUT", "RLX_CALIBRATE_TIMEOUT", "RLX_DISABLE_PLUGINS",
})


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _path_mtimes() -> list[Any]:
    """The mtimes of the install directories on ``sys.path`` (``site-packages``,
    ``dist-packages``): what ``pip install`` changes. Not every entry: a source tree on the
    path (an editable install's) changes with every file someone saves there."""
    found: list[Any] = []
    for entry in dict.fromkeys(p for p in sys.path if isinstance(p, str) and p):
        if os.path.basename(os.path.normpath(entry)) not in ("site-packages", "dist-packages"):
            continue
        try:
            found.append([entry, os.stat(entry).st_mtime_ns])
        except OSError:
            found.append([entry, None])
    return found


class ProbeVerdicts:
    """The probe answers of child processes on this host, one entry per backend and
    interpreter, each reused for ``PROBE_VERDICT_TTL_S`` under its identity (see the
    module's docstring), in the cache of a registry whose environment is ``environ``."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._cache = JsonCache(PROBE_NAMESPACE, schema=_SCHEMA, root=verdict_root(environ),
                                what="recent probe answers, reused by later commands for "
                                     f"{PROBE_VERDICT_TTL_S / 60:g} minutes")

    @staticmethod
    def identity(target: ChildTarget, distribution: str, version: str, plugin: str,
                 environ: Mapping[str, str]) -> str:
        """A digest of everything the answer of ``target``'s probe may depend on."""
        env = sorted((k, v) for k, v in child_env(environ).items() if k not in _NOT_IDENTITY)
        described = [target.backend, target.entry_point, target.value, distribution, version, plugin, __version__,
                     sys.executable, sys.version, _boot_id(), _path_mtimes(), env]
        return hashlib.sha256(json.dumps(described).encode("utf-8", "surrogatepass")).hexdigest()

    @staticmethod
    def _key(backend: str) -> str:
        return f"{backend}.{interpreter_tag()}"

    def get(self, backend: str, identity: str) -> Availability | None:
        """The answer kept for ``backend`` under ``identity`` and younger than the TTL."""
        key = self._key(backend)
        entry = self._cache.get(key, {"backend": backend})
        if entry is None:
            return None
        answer, written = entry.get("answer"), entry.get("time")
        try:
            if not isinstance(answer, dict) or isinstance(written, bool) or not isinstance(written, (int, float)):
                raise TypeError("no answer and time")
            memory = answer["memory_bytes"]
            found = Availability(bool(answer["available"]), str(answer["reason"]),
                                 devices=[str(d) for d in answer["devices"]],
                                 versions={str(k): str(v) for k, v in dict(answer["versions"]).items()},
                                 memory_bytes=memory if isinstance(memory, int) and not isinstance(memory, bool)
                                 else None)
        except (KeyError, TypeError, ValueError):
            self._cache.reject(key, "it is not a probe answer")
            return None
        age = time.time() - written
        if entry.get("identity") != identity or not 0 <= age <= PROBE_VERDICT_TTL_S:
            return None
        log.debug("rlx backend %r: using the probe answer of %.0f s ago", backend, age)
        return found

    def put(self, backend: str, identity: str, answer: Availability) -> None:
        """Keep ``answer`` (a probe's own, from a child) for later processes."""
        directory = self._cache.directory
        if not cache_writable(directory):
            log.info("rlx backend %r: the probe answer is not cached: %s is not writable", backend, directory)
            return
        memory = answer.memory_bytes if isinstance(answer.memory_bytes, int) else None
        self._cache.put(self._key(backend), {"backend": backend},
                        {"identity": identity, "time": time.time(),
                         "answer": {"available": bool(answer.available), "reason": str(answer.reason),
                                    "devices": [str(d) for d in answer.devices],
                                    "versions": {str(k): str(v) for k, v in answer.versions.items()},
                                    "memory_bytes": memory}})

    def forget(self, backend: str) -> None:
        """Drop ``backend``'s answer: the next process probes it again."""
        self._cache.remove(self._key(backend))

