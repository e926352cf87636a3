"""Every error and warning rlx raises.

One module so that callers can ``except rlx_core.RlxError`` and know they caught
everything of ours, and so that the CLI can turn exactly these into one line on
stderr (anything else is a bug and keeps its traceback).
"""

from __future__ import annotations

__all__ = [
    "RlxError",
    "GraphError",
    "InputError",
    "DeviceError",
    "ConfigError",
    "ModelError",
    "PluginError",
    "DeviceFallbackError",
    "UnknownDeviceError",
    "RlxWarning",
    "FallbackWarning",
    "PluginWarning",
    "CacheWarning",
]


class RlxError(Exception):
    """Base of every error rlx raises on purpose."""


class GraphError(RlxError, ValueError):
    """A graph was built wrongly: bad shapes, dtypes, axes, attributes, or a frozen graph."""


class InputError(RlxError, ValueError):
    """Run-time inputs or ``set_param`` values do not match what the graph declares."""


class DeviceError(RlxError):
    """A device is unknown, unavailable, or cannot run the graph it was asked to run.

    ``device`` names the device at fault when the raiser knows it (a segment of a split
    that failed to compile), so a fallback can leave that one out; else ``None``."""

    def __init__(self, *args: object, device: str | None = None) -> None:
        super().__init__(*args)
        self.device = device


class ConfigError(RlxError, ValueError):
    """An ``RLX_*`` environment variable or an option has a malformed value."""


class UnknownDeviceError(ConfigError, DeviceError):
    """A setting (``RLX_DENY_DEVICES``, ``DevicePolicy(device=...)``) names a device that is
    not known here: the caller's configuration (``ConfigError``, raised at once, never a
    fallback) and an unknown device (``DeviceError``, as every unknown name is)."""


class ModelError(RlxError):
    """A model file (graph JSON, ONNX) is missing, malformed, or unsupported."""


class PluginError(RlxError):
    """A backend plugin failed to load, declared the wrong API, or misbehaved."""


class DeviceFallbackError(DeviceError):
    """Every device of a fallback chain failed.

    ``attempts`` lists ``(device, error message)`` in the order they were tried, so a
    caller can see every reason, not just the last one.
    """

    def __init__(self, message: str, attempts: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.attempts: list[tuple[str, str]] = list(attempts or [])


#: Errors that are the caller's, not a device's: raised at once by every fallback loop
#: (another device would fail the same way, and a fallback would hide the real cause).
CALLER_ERRORS: tuple[type[RlxError], ...] = (InputError, ConfigError)


class RlxWarning(UserWarning):
    """Base of rlx's warning categories, so users can filter all of them at once."""


class FallbackWarning(RlxWarning):
    """A device failed while compiling or running and the next one was tried."""


class PluginWarning(RlxWarning):
    """A plugin could not be loaded or probed; the rest of rlx keeps working."""


class CacheWarning(RlxWarning):
    """A cache entry was corrupt, foreign or unwritable and was ignored."""
