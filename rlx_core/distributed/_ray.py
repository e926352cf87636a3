"""Ray Data glue: ``map_batches`` sets up the actor pool of ``Predictor`` workers.

Ray carries everything that grows with the cluster (scheduling, the object store,
retries, autoscaling the pool); rlx only ships the model's bytes and lets each worker
pick its device. The one thing to get right is the actor pool, whose spelling changed
across Ray releases: ``compute=ActorPoolStrategy(...)`` works on every release we
support, while ``concurrency=`` is deprecated since Ray 2.51 and the retry options
passed as bare keyword arguments are deprecated there too (those releases retry by
default, which the tests check).
"""

from __future__ import annotations

import inspect
import re
from types import ModuleType
from typing import Any

from .. import errors
from ..errors import ConfigError, RlxError
from ..placement.policy import DevicePolicy
from ._model import BatchModel, model_bytes
from .predictor import DEFAULT_DEVICE_COLUMN, Predictor

__all__ = ["RAY_EXTRA", "require_ray", "map_batches", "rlx_error_from", "DEFAULT_SYMBOLIC_BATCH_SIZE"]

RAY_EXTRA = "rlx-core[ray]"

#: Rows per batch for a model whose batch dimension is symbolic, when none is given:
#: Ray Data's own historical default, large enough to amortize per-batch overheads.
DEFAULT_SYMBOLIC_BATCH_SIZE = 1024

#: The first Ray release where bare ``**ray_remote_args`` are deprecated and Ray Data
#: turns on actor restarts and task retries by itself.
_RAY_DEFAULT_RETRIES = (2, 51)


def require_ray() -> ModuleType:
    """``ray`` with ``ray.data`` loaded, or an ``RlxError`` naming the extra to install."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise RlxError(f"batch inference on Ray needs Ray Data: pip install '{RAY_EXTRA}' ({exc})") from None
    return ray


def ray_version(ray: ModuleType) -> tuple[int, ...]:
    parts = []
    for token in str(getattr(ray, "__version__", "0")).split(".")[:3]:
        digits = "".join(ch for ch in token if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def actor_pool(ray: ModuleType, concurrency: Any) -> Any:
    """``ActorPoolStrategy`` for ``concurrency``: ``n`` (fixed), ``(min, max)`` or ``(min, max, initial)``."""
    strategy = ray.data.ActorPoolStrategy
    if concurrency is None:
        return strategy(min_size=1, max_size=None)  # autoscale: Ray adds workers while work queues up
    if isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1:
        return strategy(size=concurrency)
    if isinstance(concurrency, tuple) and len(concurrency) in (2, 3) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in concurrency
    ):
        if concurrency[0] > concurrency[1]:
            raise ConfigError(f"concurrency {concurrency}: the minimum exceeds the maximum")
        if len(concurrency) == 2:
            return strategy(min_size=concurrency[0], max_size=concurrency[1])
        return strategy(min_size=concurrency[0], max_size=concurrency[1], initial_size=concurrency[2])
    raise ConfigError(f"concurrency must be an int >= 1, a (min, max) or (min, max, initial) tuple, or None; "
                      f"got {concurrency!r}")


def map_batches(dataset: Any, model: Any, *, policy: DevicePolicy | None = None, batch_size: int | None = None,
                concurrency: Any = None, num_gpus: float | None = None, device: str | None = None,
                device_column: str | None = DEFAULT_DEVICE_COLUMN, **ray_kwargs: Any) -> Any:
    """``dataset.map_batches`` through a pool of ``Predictor`` actors, one per worker.

    Each worker loads ``model`` from the bytes shipped with the job and resolves its own
    device (``policy=None``: that node's ``RLX_*`` environment; an explicit ``policy`` or
    ``device`` applies on every node). ``batch_size`` defaults to the model's batch
    dimension (1024 rows for a symbolic one). ``concurrency`` sizes the actor pool (an
    int, or ``(min, max)`` to autoscale; default: autoscale from 1). GPUs are requested
    only when ``num_gpus`` is given. Workers that die are restarted and their batches
    redone, so no row is lost or duplicated. Every other keyword argument goes to Ray's
    ``map_batches`` unchanged (``resources``, ``runtime_env``, ``num_cpus``, ...).
    """
    ray = require_ray()
    if not isinstance(dataset, ray.data.Dataset):
        raise ConfigError(f"dataset must be a ray.data.Dataset, got {type(dataset).__name__}")
    if policy is not None and not isinstance(policy, DevicePolicy):
        raise ConfigError(f"policy must be a DevicePolicy or None, got {type(policy).__name__}")
    _, data, _ = model_bytes(model)
    info = BatchModel(data)  # on the driver: a broken model fails here, not on every worker
    if batch_size is None:
        batch_size = info.rows_per_run or DEFAULT_SYMBOLIC_BATCH_SIZE
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be an int >= 1 or None, got {batch_size!r}")
    if "compute" in ray_kwargs:
        if concurrency is not None:
            raise ConfigError("give concurrency or compute, not both")
        compute = ray_kwargs.pop("compute")
    else:
        compute = actor_pool(ray, concurrency)
    fmt = ray_kwargs.pop("batch_format", "numpy")
    if fmt not in ("numpy", "default"):
        raise ConfigError(f"batch_format {fmt!r}: a Predictor takes numpy batches (batch_format='numpy')")
    kwargs: dict[str, Any] = {
        "batch_size": batch_size,
        "compute": compute,
        "batch_format": "numpy",
        "fn_constructor_args": (data,),
        "fn_constructor_kwargs": {"policy": policy, "device": device, "device_column": device_column,
                                  "batch_size": None if info.rows_per_run else batch_size},
    }
    if num_gpus is not None:
        kwargs["num_gpus"] = num_gpus
    params = inspect.signature(dataset.map_batches).parameters
    if "udf_modifying_row_count" in params:  # one row out per row in: lets Ray push limits down
        kwargs["udf_modifying_row_count"] = False
    if ray_version(ray) < _RAY_DEFAULT_RETRIES:
        ray_kwargs.setdefault("max_restarts", -1)
        ray_kwargs.setdefault("max_task_retries", -1)
    clash = sorted(set(kwargs) & set(ray_kwargs))
    if clash:
        raise ConfigError(f"map_batches sets {', '.join(clash)} itself; pass them through its own arguments")
    return dataset.map_batches(Predictor, **kwargs, **ray_kwargs)


_ERROR_LINE = re.compile(r"^\s*(?:rlx_core\.errors\.)?(?P<kind>[A-Za-z]+Error): (?P<message>.+)$", re.MULTILINE)


def rlx_error_from(exc: BaseException) -> RlxError | None:
    """The ``RlxError`` a worker raised, recovered from the Ray error that reports it, if any.

    Ray wraps a worker's exception (``RayTaskError``, Ray Data's ``UserCodeException``)
    and does not always carry the original object across processes, but its message
    always holds the worker's traceback; the last ``rlx_core.errors`` line there is the
    error to show the user (a ``DeviceError`` naming the node and the device, say).
    """
    seen: set[int] = set()
    todo: list[Any] = [exc]
    texts: list[str] = []
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, RlxError) and type(e).__module__ == errors.__name__:
            return e
        texts.append(str(e))
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    for text in texts:
        found = [m for m in _ERROR_LINE.finditer(text) if m.group("kind") in errors.__all__]
        if found:
            kind = getattr(errors, found[-1].group("kind"))
            if isinstance(kind, type) and issubclass(kind, RlxError) and kind is not errors.DeviceFallbackError:
                return kind(found[-1].group("message").strip())
            if kind is errors.DeviceFallbackError:
                return errors.DeviceFallbackError(found[-1].group("message").strip())
    return None
