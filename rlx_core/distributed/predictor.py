"""``Predictor``: a model as a row-wise function on columns, on the device *this* host picks.

Ray Data builds one ``Predictor`` per worker (``map_batches`` with a callable class), so
everything host-specific happens in ``__init__``, on the worker: reading the ``RLX_*``
environment (``policy=None``), probing backends, ranking devices and compiling. The
driver only ships the model's bytes. The same object works without Ray, on a dict of
numpy arrays, which is how ``rlx batch`` runs in-process.

Failures follow ``run_with_fallback``: a device that fails while compiling or running
emits one ``FallbackWarning`` and the rows go to the next device of the chain; the
device column says where each row really ran. The failed device is then dropped for the
rest of this worker's life (a device that failed once would most likely fail, slowly,
on every later batch). Under a strict policy, or with an explicit device, there is no
fallback: the failure is a ``DeviceError`` naming the host and the device.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError, DeviceError, InputError, RlxError
from ..ir import Graph
from ..placement.policy import DevicePolicy
from ..run.drift import DriftWatch, Repick, drift_settings
from ..run.fallback import Wording, try_in_turn
from ..run.session import CompiledGraph, GraphDevices
from ._model import BatchModel, ColumnSpec

__all__ = ["Predictor", "DEFAULT_DEVICE_COLUMN", "node_label"]

log = logging.getLogger("rlx.distributed")

DEFAULT_DEVICE_COLUMN = "rlx_device"

#: Batch schemas (and device columns) remembered as checked; a job uses one or two.
_SCHEMAS_KEPT = 16


def node_label() -> str:
    """How errors name this host: its hostname, plus the Ray node id inside a Ray worker."""
    host = socket.gethostname()
    ray = sys.modules.get("ray")  # never import ray just to name the host
    if ray is not None:
        try:
            if ray.is_initialized():
                return f"node {ray.get_runtime_context().get_node_id()[:12]} ({host}, pid {os.getpid()})"
        except Exception:  # an old or half-initialized ray: the hostname still says where
            pass
    return f"host {host} (pid {os.getpid()})"


class Predictor:
    """Run ``model`` on batches of rows: ``predictor({"x": x, "id": ids}) -> {"probs": ..., "id": ..., ...}``.

    ``model`` is a ``Graph``, a graph ``.json`` or ``.onnx`` path, the bytes of either, or
    a ``BatchModel`` already loaded.
    ``policy=None`` reads ``DevicePolicy.from_env()`` here, in this process (on a Ray
    worker: that node's own ``RLX_*`` environment). ``device`` names one device, strictly
    (no fallback). ``device_column`` is the output column that names, per row, the device
    that computed it (``None``: no such column); it is read-only (see ``_device_values``).
    ``batch_size`` (optional) caps how many rows a symbolic-batch model runs at once and is
    the size it is compiled for up front.

    Columns named like the graph's inputs feed them, their leading dimension being rows;
    each graph output becomes a column named by the output's name; other columns pass
    through unchanged. Rows must be independent along the batch dimension (true of
    inference models): a fixed batch ``B`` runs in chunks of ``B`` rows, the last one
    padded with copies of its last row and its outputs cut back.
    """

    def __init__(self, model: Any, *, policy: DevicePolicy | None = None, device: str | None = None,
                 device_column: str | None = DEFAULT_DEVICE_COLUMN, batch_size: int | None = None) -> None:
        if policy is not None and not isinstance(policy, DevicePolicy):
            raise ConfigError(f"policy must be a DevicePolicy or None, got {type(policy).__name__}")
        if device is not None and (not isinstance(device, str) or not device.strip()):
            raise ConfigError(f"device must be a device name like 'cpu' or 'cuda:1', got {device!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ConfigError(f"batch_size must be an int >= 1 or None, got {batch_size!r}")
        self.model = model if isinstance(model, BatchModel) else BatchModel(model)
        self.policy = policy if policy is not None else DevicePolicy.from_env()
        self.device_column = device_column
        self.batch_size = batch_size
        explicit = device if device not in (None, "auto") else self.policy.device
        self._explicit: str | None = explicit or None
        self._strict = bool(self._explicit) or self.policy.strict
        inputs = {c.name for c in self.model.inputs}
        clash = [c.name for c in self.model.outputs if c.name in inputs]
        if device_column is not None:
            if not isinstance(device_column, str) or not device_column:
                raise ConfigError(f"device_column must be a non-empty column name or None, got {device_column!r}")
            clash += [device_column] if device_column in {c.name for c in self.model.outputs} else []
        if clash:
            raise ConfigError(f"{self.model.origin}: column {clash[0]!r} would be both an input or the device "
                              "column and a model output; rename the output or pass another device_column")
        self._sessions: dict[int, tuple[GraphDevices, list[str]]] = {}
        # (graph id, device) -> compiled copy: GraphDevices.compile re-checks the placement on
        # every call, which costs more than running a small model; a batch must not pay it.
        self._ready: dict[tuple[int, str], CompiledGraph] = {}
        self._failed: dict[str, str] = {}  # device -> why it was dropped on this worker
        self._watches: dict[int, DriftWatch] = {}  # graph id -> re-pick on slowdown (auto chains only)
        self._input_names = tuple(c.name for c in self.model.inputs)
        self._output_names = tuple(c.name for c in self.model.outputs)
        self._checked: dict[tuple, int] = {}  # batch schema (name, shape, dtype per column) -> rows
        self._device_cols: dict[tuple[str, int], np.ndarray] = {}
        self.rows_by_device: Counter[str] = Counter()
        self.where = node_label()
        # Resolve and compile now, on this host: a worker that cannot run the model fails
        # while it starts, before it takes any rows.
        first_rows = self.model.rows_per_run or self.batch_size
        if first_rows is not None:
            self._on_chain(self.model.graph_for(first_rows), lambda cg: None)
        log.info("%s: predictor for %s ready on %s", self.where, self.model.name, self.device or "(chosen per size)")

    # ------------------------------------------------------------------ schema
    @property
    def input_columns(self) -> tuple[ColumnSpec, ...]:
        return self.model.inputs

    @property
    def output_columns(self) -> tuple[ColumnSpec, ...]:
        return self.model.outputs

    @property
    def device(self) -> str | None:
        """The device the next rows go to (``None`` before a symbolic model saw a batch)."""
        for _, chain in self._sessions.values():
            alive = [d for d in chain if d not in self._failed]
            if alive:
                return alive[0]
        return None

    def check_columns(self, columns: Mapping[str, tuple[tuple[int, ...], Any]]) -> None:
        """Check ``{column: (row_shape, dtype)}`` against the model (``BatchModel.check_columns``)."""
        self.model.check_columns(columns, self.device_column)

    # ------------------------------------------------------------------ running
    def __call__(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if type(batch) is not dict and not isinstance(batch, Mapping):  # the type test spares the ABC check
            raise InputError(f"a batch must be a mapping of column name to array, got {type(batch).__name__} "
                             "(with Ray Data, use batch_format='numpy')")
        arrays = {name: value if type(value) is np.ndarray and value.ndim and value.dtype.kind != "O"
                  else _column(name, value) for name, value in batch.items()}
        # A job's batches share one schema (and one size, but the last): the row count and the
        # column check are a function of it, so they are done once per schema, not per batch.
        schema = tuple([(name, a.shape, a.dtype) for name, a in arrays.items()])
        rows = self._checked.get(schema)
        if rows is None:
            rows = _row_count(arrays)
            self.check_columns({name: (a.shape[1:], a.dtype) for name, a in arrays.items()})
            if len(self._checked) >= _SCHEMAS_KEPT:
                self._checked.clear()
            self._checked[schema] = rows
        feeds = {name: arrays[name] for name in self._input_names}
        outs, devices = self._run_rows(feeds, rows)
        result = {name: a for name, a in arrays.items() if name not in feeds}
        result.update(zip(self._output_names, outs))
        if self.device_column is not None:
            result[self.device_column] = devices
        return result

    def _device_values(self, device: str, rows: int) -> np.ndarray:
        """The device column of ``rows`` rows that all ran on ``device``.

        A read-only zero-stride view of one string (``np.broadcast_to``): a column like any
        other (it compares, slices, concatenates, converts to Arrow and saves as ``rows``
        values) that costs no per-row memory, is built once per (device, size), and tells a
        consumer in O(1) that the batch ran on one device (its stride is 0).
        """
        col = self._device_cols.get((device, rows))
        if col is None:
            if len(self._device_cols) >= _SCHEMAS_KEPT:
                self._device_cols.clear()
            col = self._device_cols[device, rows] = np.broadcast_to(np.array(device), (rows,))
        return col

    def _run_rows(self, feeds: dict[str, np.ndarray], rows: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Every output for ``rows`` rows, and the device of each row, chunk by chunk."""
        step = self.model.rows_per_run or self.batch_size or max(rows, 1)
        if 0 < rows <= step and (self.model.rows_per_run is None or rows == step):
            # One run, no padding (the usual batch): no slicing, no concatenation. On a
            # small model this path is what the predictor adds to the device's own run.
            device, outs = self._on_chain(self.model.graph_for(rows), lambda cg: cg.run(feeds))
            self.rows_by_device[device] += rows
            return list(outs), self._device_values(device, rows)
        pieces: list[list[np.ndarray]] = [[] for _ in self.model.outputs]
        names: list[str] = []
        counts: list[int] = []
        for start in range(0, rows, step):
            n = min(step, rows - start)
            chunk = {k: v[start : start + n] for k, v in feeds.items()}
            size = self.model.rows_per_run or n
            if n < size:  # the last chunk of a fixed batch: pad with copies of its last row
                chunk = {k: np.concatenate([v, np.repeat(v[-1:], size - n, axis=0)]) for k, v in chunk.items()}
            device, outs = self._on_chain(self.model.graph_for(size), lambda cg, chunk=chunk: cg.run(chunk))
            for acc, out in zip(pieces, outs):
                acc.append(out[:n])
            names.append(device)
            counts.append(n)
            self.rows_by_device[device] += n
        if not names:
            outs = [np.empty((0, *c.row_shape), c.dtype) for c in self.model.outputs]
            devices = np.empty(0, dtype="<U1")
        else:
            outs = [acc[0] if len(acc) == 1 else np.concatenate(acc) for acc in pieces]
            if len(set(names)) == 1:
                return outs, self._device_values(names[0], rows)
            devices = np.repeat(np.array(names), counts)  # a fallback mid-batch: rows on several devices
        devices.flags.writeable = False  # read-only like the one-device column: one contract for the column
        return outs, devices

    def _compiled_for(self, graph: Graph) -> tuple[GraphDevices, list[str]]:
        """The session of ``graph`` and its device chain, resolved on this host once."""
        key = id(graph)
        found = self._sessions.get(key)
        if found is not None and found[0].graph is graph:
            return found
        gd = GraphDevices(graph, self.policy)
        if self._explicit:
            chain = [self._explicit]
            gd.compile(self._explicit)  # DeviceError naming the blocker, before any rows
        else:
            from ..placement.ranking import devices_for

            viable = devices_for(graph, self.policy)
            chain = [d for d in self.policy.chain if d.split(":")[0] in viable] if self.policy.chain else viable
            if not chain:
                why = "the policy's chain has no viable device" if self.policy.chain else "no viable device"
                raise DeviceError(f"{self.where}: {why} for graph {graph.name!r} "
                                  f"(see `rlx devices --graph` on this host)")
            if self._strict:
                chain = chain[:1]
            elif not self.policy.chain:
                self._watch(graph, chain)
        if len(self._sessions) >= 8:  # symbolic models rebind per size; keep the recent ones
            dropped = next(iter(self._sessions))
            self._sessions.pop(dropped)
            self._ready = {k: v for k, v in self._ready.items() if k[0] != dropped}
            self._watches.pop(dropped, None)
        self._sessions[key] = (gd, chain)
        return gd, chain

    def _watch(self, graph: Graph, chain: list[str]) -> None:
        """Watch the auto-ranked chain's first device for slowdowns (``drift.py``): a worker
        that runs for hours moves its rows when a neighbour takes its device."""
        factor, forget = drift_settings()
        if factor is None or len(chain) < 2 or self.policy.prefer or self.policy.pick != "cost":
            return
        from ..placement.ranking import Placement

        placement = Placement(graph, self.policy)
        estimates = {r.device: r.est_seconds for r in placement.rank(placement.candidates(chain))
                     if r.est_seconds is not None}
        if chain[0] in estimates:
            self._watches[id(graph)] = DriftWatch(estimates, chain[0], factor=factor, forget_seconds=forget)

    @property
    def repicks(self) -> list[Repick]:
        """Every re-pick on slowdown this worker made (``drift.Repick``)."""
        return [m for w in self._watches.values() for m in w.repicks]

    def _on_chain(self, graph: Graph, action: Callable[[CompiledGraph], Any]) -> tuple[str, Any]:
        """``action`` on the first device of the chain that compiles ``graph`` and does it."""
        gd, chain = self._compiled_for(graph)
        attempts: list[tuple[str, str]] = []
        alive = chain
        if self._failed:  # only after a fallback: the usual batch skips both lists
            attempts = [(d, f"failed earlier on this worker: {why}") for d, why in self._failed.items() if d in chain]
            alive = [d for d in chain if d not in self._failed]
        watch = self._watches.get(id(graph))
        if watch is not None and watch.current in alive and alive[0] != watch.current:
            alive = [watch.current, *(d for d in alive if d != watch.current)]

        def attempt(device: str) -> Any:
            cg = self._ready.get((id(graph), device))
            if cg is None:
                cg = self._ready[id(graph), device] = gd.compile(device)
            if watch is None:
                return cg.device, action(cg)
            t0 = time.perf_counter()
            out = action(cg)
            watch.observe(device, time.perf_counter() - t0)
            return cg.device, out

        def forget(device: str, exc: BaseException, why: str) -> None:  # this worker stops sending it rows
            if not isinstance(exc, RlxError):
                log.exception("%s: device %s failed", self.where, device)
            self._failed[device] = why

        mode = "explicit device" if self._explicit else "RLX_STRICT"
        where = self.where.replace("{", "{{").replace("}", "}}")
        wording = Wording(failed=f"rlx: {where}: device {{device}} failed on graph {{graph!r}} ({{error}}); ",
                          then="its rows go to {next}",
                          none=f"{where}: no device could run graph {{graph!r}}: {{detail}}",
                          strict=f"{where}: device {{device}} failed running graph {{graph!r}} ({mode}: no fallback): "
                                 "{error}")
        _, (device, out), _ = try_in_turn(alive, attempt, graph=graph.name, wording=wording, strict=self._strict,
                                          attempts=attempts, on_failure=forget, stacklevel=4)
        return device, out

    def __repr__(self) -> str:
        return f"<Predictor {self.model.name!r} on {self.device or 'unresolved'} at {self.where}>"


def _column(name: str, value: Any) -> np.ndarray:
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    if arr.ndim == 0:
        raise InputError(f"column {name!r} is a scalar; every column needs one entry per row")
    if arr.dtype == object and arr.size and isinstance(arr.flat[0], np.ndarray):
        try:  # Ray hands ragged-capable tensor columns over as an object array of rows
            arr = np.stack(list(arr))
        except ValueError:
            raise InputError(f"column {name!r}: its rows have different shapes") from None
    return arr


def _row_count(arrays: Mapping[str, np.ndarray]) -> int:
    counts = {name: len(a) for name, a in arrays.items()}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{n!r}: {c}" for n, c in counts.items())
        raise InputError(f"the columns of a batch have different numbers of rows ({detail})")
    return next(iter(counts.values()), 0)
