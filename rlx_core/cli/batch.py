"""``rlx batch MODEL INPUT OUTPUT``: batch inference over a table, in-process or on Ray.

Kept out of ``cli.py`` so that the command's logic (schema check, streaming, atomic
output, the per-device summary) reads as one piece; ``cli.py`` only registers it. Ray and
pyarrow are imported inside the command, when ``--ray`` or a Parquet table asks for them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Generator, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import ConfigError, RlxError

if TYPE_CHECKING:
    import numpy as np
    from rich.console import Console

    from ..distributed.tables import TableSource

__all__ = ["register", "run_batch"]

#: Redraws of the progress bar per second (rich's default is 10): each redraw renders the
#: bar on the main thread's time, and a job needs no smoother bar than this.
_REFRESH_PER_S = 4


def register(app: typer.Typer) -> None:
    """Add ``rlx batch`` to ``app``."""
    app.command("batch")(batch)


def batch(
    model: Annotated[Path, typer.Argument(help="Graph .json or .onnx model.", show_default=False)],
    input: Annotated[Path, typer.Argument(help="Rows to run: .npz, .parquet, or a Parquet folder.",
                                          show_default=False)],
    output: Annotated[Path, typer.Argument(help="Where to write: .npz, .parquet, or a folder.", show_default=False)],
    address: Annotated[str | None, typer.Argument(metavar="ADDRESS", show_default=False,
                                                  help="With --ray: 'auto' (the running cluster), a Ray address, "
                                                       "or nothing (start a local Ray).")] = None,
    use_ray: Annotated[bool, typer.Option("--ray", help="Run on Ray (see ADDRESS) instead of in-process.")] = False,
    batch_size: Annotated[int | None, typer.Option("--batch-size", "-b", min=1,
                                                   help="Rows per batch (default: the model's batch dimension, "
                                                        "or 1024 if it is symbolic).")] = None,
    device: Annotated[str, typer.Option("--device", "-d", help="Device everywhere, or 'auto': each host's own "
                                                                "RLX_* policy picks.")] = "auto",
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", min=1,
                                                    help="Ray workers (default: autoscale).")] = None,
) -> None:
    """Run a model over every row of a table; write its outputs, ids and each row's device."""
    from .common import _user_errors, console, require_devices

    with _user_errors():
        if address is not None and not use_ray:
            raise ConfigError(f"ADDRESS {address!r} is given without --ray; did you mean --ray {address}?")
        if concurrency is not None and not use_ray:
            raise ConfigError("--concurrency sizes the Ray worker pool; it needs --ray")
        if not use_ray:  # on Ray each host answers for its own devices
            require_devices([device])
        run_batch(model, input, output, ray_address=(address or "local") if use_ray else None,
                  batch_size=batch_size, device=None if device == "auto" else device, concurrency=concurrency,
                  console=console)


def run_batch(model: Path, input: Path, output: Path, *, ray_address: str | None = None,
              batch_size: int | None = None, device: str | None = None, concurrency: int | None = None,
              console: Console | None = None) -> dict[str, int]:
    """The whole job; returns rows per device. ``ray_address=None`` runs in-process."""
    from rich.console import Console

    from ..distributed import BatchModel
    from ..distributed.tables import open_sink, open_source
    from .common import phases

    console = console or Console(highlight=False)
    with phases(console) as phase:  # a spinner until the rows' bar, on a terminal, past a second
        phase(f"reading {input}")
        source = open_source(input)
        phase(f"loading {model}")
        info = BatchModel(model)
        info.check_columns(source.schema, "rlx_device")  # before any work: InputError naming the column
        rows_per_batch = batch_size or info.rows_per_run or 1024
        sink = open_sink(output)
    counts: Counter[str] = Counter()
    try:
        t0 = time.perf_counter()
        if ray_address is None:
            batches = _in_process(info, source, rows_per_batch, device)
        else:
            batches = _on_ray(model, source, ray_address, rows_per_batch, device, concurrency)
        with _progress(console, source.rows) as advance, closing(batches):  # closing: Ray is shut down at once
            for out in batches:
                sink.write(out)
                devices = out["rlx_device"]
                counts.update(dict(zip(*_unique_counts(devices))))
                advance(len(devices))
        if sink.rows != source.rows:
            raise RlxError(f"wrote {sink.rows} rows but the input has {source.rows}; the output was not written")
        sink.commit()
        seconds = time.perf_counter() - t0
    except BaseException:
        sink.abort()
        raise
    _usual_mode(output)
    _summary(console, counts, seconds, output)
    return dict(counts)


def _usual_mode(output: Path) -> None:
    """Give ``output`` the mode a plain write would (the umask's), not the 0600 / 0700 of
    the temporary file or folder it was renamed from (``TableSink``)."""
    import os

    from .common import file_mode

    files = file_mode()
    if output.is_dir():
        os.chmod(output, files | ((files & 0o444) >> 2))  # a folder: x wherever r
        for part in output.iterdir():
            if part.is_file():
                os.chmod(part, files)
    elif output.is_file():
        os.chmod(output, files)


def _unique_counts(values: np.ndarray) -> tuple[list[str], list[int]]:
    import numpy as np

    if len(values) and values.ndim == 1 and values.strides[0] == 0:  # the Predictor's one-device column
        return [str(values[0])], [len(values)]
    if len(values) and (values == values[0]).all():  # one device for the whole batch: no sort
        return [str(values[0])], [len(values)]
    names, n = np.unique(values, return_counts=True)
    return [str(x) for x in names], [int(c) for c in n]


@contextmanager
def _progress(console: Console, total: int) -> Iterator[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # A transient bar shows nothing on a console that is not a terminal (a log, a pipe) but
    # still starts rich's refresh thread and leaves a blank line: there it is not drawn.
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, refresh_per_second=_REFRESH_PER_S,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("rows (the first batch compiles)", total=total)
        # ``advance`` takes rich's lock and samples the speed (~1 µs, as much as the rest of
        # the loop's bookkeeping per batch of a fast model), so rows are handed over at most
        # as often as the bar is redrawn, and the rest when the job ends.
        pending, due = 0, 0.0
        every = 1.0 / _REFRESH_PER_S

        def advance(n: int) -> None:
            nonlocal pending, due
            pending += n
            now = time.perf_counter()
            if now >= due:
                if not due:  # the first batch is back: compiled
                    progress.update(task, description="rows")
                progress.advance(task, pending)
                pending, due = 0, now + every

        try:
            yield advance
        finally:
            if pending:
                progress.advance(task, pending)


def _in_process(info: Any, source: TableSource, rows_per_batch: int,
                device: str | None) -> Generator[dict, None, None]:
    from ..distributed import Predictor

    predictor = Predictor(info, device=device, batch_size=None if info.rows_per_run else rows_per_batch)
    for batch in source.batches(rows_per_batch):
        yield predictor(batch)


def _on_ray(model: Path, source: TableSource, address: str, rows_per_batch: int, device: str | None,
            concurrency: int | None) -> Generator[dict, None, None]:
    from ..distributed import map_batches, require_ray
    from ..distributed._ray import rlx_error_from

    ray = require_ray()
    started = False
    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, include_dashboard=False,
                 log_to_driver=True, configure_logging=False)
        started = True
    context = ray.data.DataContext.get_current()
    bars = context.enable_progress_bars
    context.enable_progress_bars = False  # ours is shown instead
    try:
        workers = concurrency or max(1, len(ray.nodes()))
        per_block = max(rows_per_batch, -(-source.rows // (4 * workers)))  # ~4 blocks per worker, whole batches
        per_block = -(-per_block // rows_per_batch) * rows_per_batch
        ds = map_batches(source.to_ray(ray, per_block), model, device=device, batch_size=rows_per_batch,
                         concurrency=concurrency)
        try:
            yield from ds.iter_batches(batch_size=None, batch_format="numpy")
        except Exception as exc:
            cause = rlx_error_from(exc)
            if cause is None:
                raise
            raise cause from exc
    finally:
        context.enable_progress_bars = bars
        if started:
            ray.shutdown()


def _summary(console: Console, counts: Counter[str], seconds: float, output: Path) -> None:
    from rich.table import Table

    total = sum(counts.values())
    table = Table("device", "rows", "share", title=f"rlx batch: {total} rows", title_justify="left")
    for device, n in counts.most_common():
        table.add_row(device, f"{n:,}", f"{n / total:.1%}")
    console.print(table)
    rate = total / seconds if seconds > 0 else float("inf")
    console.print(f"wrote {output}: {total:,} rows in {seconds:.2f} s ({rate:,.0f} rows/s)")
