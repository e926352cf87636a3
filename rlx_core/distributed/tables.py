"""Tables of rows on disk for ``rlx batch``: ``.npz`` archives and Parquet files or folders.

An ``.npz`` holds one array per column, the first dimension being rows. A Parquet file
holds tensor columns as Arrow's canonical ``fixed_shape_tensor`` (what we write; Ray Data
reads it), or as nested fixed-size lists, or as Ray Data's own tensor type (what Ray
writes); scalar columns are plain columns. Sources give their schema (per-row shape and
dtype of each column) before any row is read, so that a job is checked before it starts.
Sinks write to a temporary sibling of the output and rename it into place on ``commit``:
a failed job leaves no partial output. pyarrow is imported only for Parquet.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError

__all__ = ["TableSource", "TableSink", "open_source", "open_sink", "table_format", "plain_column"]

Schema = dict[str, tuple[tuple[int, ...], np.dtype]]

_PARQUET_SUFFIXES = (".parquet", ".pq")


def table_format(path: Path) -> str:
    """``"npz"``, ``"parquet"`` (a file) or ``"parquet-dir"`` (a folder), from the path."""
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix in _PARQUET_SUFFIXES:
        return "parquet"
    if path.is_dir() or not suffix:
        return "parquet-dir"
    raise ConfigError(f"{str(path)!r}: unknown table format {suffix!r}; use .npz, .parquet, or a Parquet folder")


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.dataset
        import pyarrow.parquet
    except ImportError:
        raise ConfigError("Parquet tables need pyarrow: pip install pyarrow (it comes with 'rlx-core[ray]')") from None
    return pyarrow


# ---------------------------------------------------------------- arrow <-> numpy
def _arrow_row_spec(name: str, t: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """Per-row shape and dtype of an Arrow column type, or ``None`` if it has no fixed shape."""
    pa = _pyarrow()
    if isinstance(t, pa.FixedShapeTensorType):
        return tuple(t.shape), np.dtype(t.value_type.to_pandas_dtype())
    if isinstance(t, pa.ExtensionType):
        shape, scalar = getattr(t, "shape", None), getattr(t, "scalar_type", None)
        if shape is not None and scalar is not None and all(isinstance(d, int) and d >= 0 for d in shape):
            return tuple(shape), np.dtype(scalar.to_pandas_dtype())  # Ray Data's tensor type
        return None
    shape: list[int] = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return (tuple(shape), np.dtype(str)) if not shape else None
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t):
        return tuple(shape), np.dtype(t.to_pandas_dtype())
    return None


def arrow_to_numpy(name: str, arr: Any) -> np.ndarray:
    """One Arrow column (array or chunked array) as a numpy array, rows first."""
    pa = _pyarrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise InputError(f"column {name!r} has {arr.null_count} missing value(s); every row needs a value")
    t = arr.type
    if isinstance(t, pa.FixedShapeTensorType):
        return arr.to_numpy_ndarray()
    if isinstance(t, pa.ExtensionType) and hasattr(arr, "to_numpy"):
        return np.asarray(arr.to_numpy())
    shape = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        arr, t = arr.flatten(), t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return np.asarray(arr.to_pylist(), dtype=str)
    values = arr.to_numpy(zero_copy_only=False)
    if values.dtype == object:
        raise InputError(f"column {name!r} of Arrow type {arr.type} is not a fixed-shape tensor or scalar column")
    return values.reshape(-1, *shape) if shape else values


def plain_column(name: str, values: Any) -> np.ndarray:
    """``values`` as a numpy array with a plain dtype: Ray hands string columns over as
    object arrays of ``str``, which become fixed-width unicode; other objects are refused."""
    values = np.asarray(values)
    if values.dtype != object:
        return values
    if values.ndim == 1 and all(isinstance(v, str) for v in values):
        return values.astype(str) if len(values) else np.empty(0, dtype="<U1")
    raise InputError(f"column {name!r} holds Python objects; only numeric, bool and string columns are written")


def numpy_to_arrow(name: str, values: np.ndarray) -> Any:
    """A numpy column as Arrow: scalars as plain arrays, tensors as ``fixed_shape_tensor``."""
    pa = _pyarrow()
    values = plain_column(name, values)
    if values.ndim == 1:
        return pa.array(values)
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values))


# ---------------------------------------------------------------- sources
class TableSource:
    """Rows to read: ``schema`` and ``rows`` up front, then ``batches(n)``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.format = table_format(path)
        self._arrays: dict[str, np.ndarray] | None = None
        self._dataset: Any = None
        if not path.exists():
            raise InputError(f"input {str(path)!r} does not exist")
        if self.format == "npz":
            self._open_npz()
        else:
            self._open_parquet()

    def _open_npz(self) -> None:
        try:
            with np.load(self.path, allow_pickle=False) as archive:
                arrays = {name: archive[name] for name in archive.files}
        except ValueError as exc:
            raise InputError(f"{str(self.path)!r}: a column holds Python objects, which rlx does not unpickle "
                             f"({exc})") from None
        except (OSError, EOFError) as exc:
            raise InputError(f"cannot read {str(self.path)!r} as an .npz archive: {exc}") from None
        if not arrays:
            raise InputError(f"{str(self.path)!r} holds no arrays (one array per column expected)")
        for name, a in arrays.items():
            if a.ndim == 0:
                raise InputError(f"column {name!r} in {str(self.path)!r} is a scalar; each column needs one entry "
                                 "per row (first dimension = rows)")
        lengths = {name: len(a) for name, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            first = next(iter(lengths))
            odd = next(n for n, c in lengths.items() if c != lengths[first])
            raise InputError(f"column {odd!r} in {str(self.path)!r} has {lengths[odd]} rows, but column {first!r} "
                             f"has {lengths[first]}")
        self._arrays = arrays
        self.schema: Schema = {name: (a.shape[1:], a.dtype) for name, a in arrays.items()}
        self.rows = next(iter(lengths.values()))

    def _open_parquet(self) -> None:
        pa = _pyarrow()
        try:
            self._dataset = pa.dataset.dataset(str(self.path), format="parquet")
            arrow_schema = self._dataset.schema
        except (OSError, pa.ArrowInvalid) as exc:
            raise InputError(f"cannot read {str(self.path)!r} as Parquet: {exc}") from None
        if any(b"ray.data" in (f.metadata or {}).get(b"ARROW:extension:name", b"") for f in arrow_schema):
            from ._ray import require_ray

            require_ray()  # registers Ray's tensor type, so its columns read as tensors
            self._dataset = pa.dataset.dataset(str(self.path), format="parquet")
            arrow_schema = self._dataset.schema
        self.schema = {}
        self._unsized: set[str] = set()
        for field in arrow_schema:
            spec = _arrow_row_spec(field.name, field.type)
            if spec is None:
                self._unsized.add(field.name)
                spec = ((), np.dtype(object))
            self.schema[field.name] = spec
        self.rows = self._dataset.count_rows()

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """The rows in batches of at most ``batch_size``, as ``{column: array}``."""
        if self._arrays is not None:
            for start in range(0, self.rows, batch_size):
                yield {name: a[start : start + batch_size] for name, a in self._arrays.items()}
            return
        for rb in self._dataset.to_batches(batch_size=batch_size):
            if rb.num_rows:
                yield {name: arrow_to_numpy(name, rb.column(name)) for name in rb.schema.names}

    def to_ray(self, ray: Any, rows_per_block: int) -> Any:
        """The rows as a ``ray.data.Dataset``: Parquet is read by Ray's workers; an ``.npz``
        is read here and handed over in blocks of ``rows_per_block`` rows (one block per
        worker at a time, so that every worker of the pool gets some)."""
        if self._arrays is None:
            return ray.data.read_parquet(str(self.path))
        pa = _pyarrow()
        table = pa.table({name: numpy_to_arrow(name, a) for name, a in self._arrays.items()})
        step = max(1, rows_per_block)
        return ray.data.from_arrow([table.slice(i, step) for i in range(0, max(self.rows, 1), step)])


def open_source(path: Path) -> TableSource:
    return TableSource(Path(path))


# ---------------------------------------------------------------- sinks
class TableSink:
    """Rows to write, batch by batch, into a temporary sibling renamed over ``path`` on ``commit``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.format = table_format(self.path) if self.path.suffix or not self.path.exists() else "parquet-dir"
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if not parent.is_dir():
            raise ConfigError(f"cannot write {str(self.path)!r}: folder {str(parent)!r} does not exist")
        if self.format != "npz":
            _pyarrow()
        self._columns: dict[str, list[np.ndarray]] = {}
        self._writer: Any = None
        self._schema: Any = None
        self.rows = 0
        try:
            if self.format == "parquet-dir":
                self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=parent))
            else:
                fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=parent)
                os.close(fd)
                self._tmp = Path(tmp)
        except OSError as exc:
            raise ConfigError(f"cannot write {str(self.path)!r}: {exc.strerror or exc}") from None

    def write(self, batch: dict[str, np.ndarray]) -> None:
        if not batch:
            return
        rows = len(next(iter(batch.values())))
        if self.format == "npz":
            if self._columns and set(self._columns) != set(batch):
                raise InputError(f"a batch has columns {sorted(batch)}, earlier ones {sorted(self._columns)}")
            for name, values in batch.items():
                self._columns.setdefault(name, []).append(plain_column(name, values))
        else:
            self._write_parquet(batch)
        self.rows += rows

    def _write_parquet(self, batch: dict[str, np.ndarray]) -> None:
        pa = _pyarrow()
        table = pa.table({name: numpy_to_arrow(name, np.asarray(v)) for name, v in batch.items()})
        if self._writer is None:
            target = self._tmp / "part-00000.parquet" if self.format == "parquet-dir" else self._tmp
            self._schema = table.schema
            self._writer = pa.parquet.ParquetWriter(str(target), self._schema)
        elif table.schema != self._schema:
            table = table.cast(self._schema)  # e.g. string columns of another width: same Arrow type
        self._writer.write_table(table)

    def commit(self) -> None:
        """Finish writing and move the output into place (replacing an older one)."""
        if self.format == "npz":
            arrays = {name: np.concatenate(parts) for name, parts in self._columns.items()}
            with open(self._tmp, "wb") as fh:
                np.savez(fh, **arrays)
        elif self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.format == "parquet-dir":
            old = None
            if self.path.exists():
                old = self.path.with_name(f".{self.path.name}.old-{os.getpid()}")
                os.replace(self.path, old)
            os.replace(self._tmp, self.path)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop everything written so far; the output is left as it was."""
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # already failing: the temp file goes anyway
                pass
        if self._tmp.is_dir():
            shutil.rmtree(self._tmp, ignore_errors=True)
        else:
            self._tmp.unlink(missing_ok=True)


def open_sink(path: Path) -> TableSink:
    return TableSink(Path(path))
