"""The engine's file reader: tasks that read a piece of a file in row batches, and their size.

Parquet files behind a ``dd.read_parquet`` DataFrame (and CSV files read through
:func:`dkmeans.engine.files.read_table`) are read by the engine itself: a
:class:`~dkmeans.engine.sources.ParquetSource` cuts them into pieces (row groups, or a byte
range cut at line ends), and each task of a pass over them
(:class:`~dkmeans.engine.streamed.StreamedData`) reads one piece in batches of rows sized
from the measured peak memory of a read (:func:`batch_rows`), so a task holds one batch plus
the kernel's scratch whatever the file's size. A pass whose tasks rose above their budget
gives smaller batches to the next (:func:`shrunk_batch_rows`).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Task

from dkmeans.engine.futures import gather
from dkmeans.engine.memory import MemoryBudget
from dkmeans.engine.sources import (
    KERNEL_ROW_VALUES,
    MAX_BATCH_ROWS,
    MIN_BATCH_ROWS,
    ParquetSource,
    measure_read,
    task_peak,
    task_peak_start,
)
from dkmeans.engine.workers import worker_info
from dkmeans.errors import WorkersPausedError
from dkmeans.kernels.namespace import to_host

logger = logging.getLogger("dkmeans")


# -- in the tasks -------------------------------------------------------------------------
def piece_batches(source: ParquetSource, piece: int, batch_rows: int, w):
    """``(row offset in the piece, X, w)`` batches of a piece (weights sliced alike)."""
    for start, X in source.batches(piece, batch_rows):
        yield start, X, (None if w is None else w[start : start + X.shape[0]])


def read_piece(source, piece, batch_rows, chunk_fn, combine_fn, args, offset, w=None):
    """A piece of a file, batch by batch: ``combine_fn`` of
    ``chunk_fn(X_b, w_b, row_offset_b, *args)`` over its batches, and the task's peak memory.
    Only one batch is held at a time."""
    start_rss = task_peak_start()
    results = []
    for start, X, wb in piece_batches(source, piece, batch_rows, w):
        results.append(to_host(chunk_fn(X, wb, offset + start, *args)))
        del X, wb
    return combine_fn(results), task_peak(start_rss)


def piece_column(source, piece, batch_rows, batch_fn, offset, w=None):
    """``batch_fn(X_b, w_b, row_offset_b)`` (a per-row array) of every batch of a piece,
    concatenated."""
    parts = [
        batch_fn(X, wb, offset + start)
        for start, X, wb in piece_batches(source, piece, batch_rows, w)
    ]
    return np.concatenate(parts) if parts else np.zeros((0,), dtype=np.int32)


class PieceFold:
    """A fold step over a whole piece: ``chunk_fn`` applied batch by batch (``X`` is the
    piece's index)."""

    def __init__(self, source, batch_rows, chunk_fn):
        self.source, self.batch_rows, self.chunk_fn = source, batch_rows, chunk_fn

    def __call__(self, piece, w, offset, state, *args):
        for start, X, wb in piece_batches(self.source, piece, self.batch_rows, w):
            state = to_host(self.chunk_fn(X, wb, offset + start, state, *args))
            del X, wb
        return state


def _read_rows(source, piece, start, stop, batch_rows):
    """Rows ``start:stop`` of a piece (a block of the source as a Dask array)."""
    out = np.empty((stop - start, len(source.columns)), dtype=source.dtype)
    for b0, X in source.batches(piece, batch_rows, limit=stop):
        lo, hi = max(start, b0), min(stop, b0 + X.shape[0])
        if lo < hi:
            out[lo - start : hi - start] = X[lo - b0 : hi - b0]
        del X
    return out


def source_array(source: ParquetSource, block_rows: int) -> da.Array:
    """The source's rows as a Dask array of blocks of at most ``block_rows`` rows, each read by
    the engine."""
    name = f"dkmeans-files-{uuid.uuid4().hex[:12]}"
    tasks, rows = {}, []
    for p, n in enumerate(source.piece_rows):
        for start in range(0, n, block_rows):
            stop = min(n, start + block_rows)
            key = (name, len(rows), 0)
            tasks[key] = Task(key, _read_rows, source, p, start, stop, block_rows)
            rows.append(stop - start)
    graph = HighLevelGraph.from_collections(name, tasks, dependencies=())
    return da.Array(
        graph,
        name,
        (tuple(rows), (len(source.columns),)),
        dtype=source.dtype,
        meta=np.empty((0, 0), dtype=source.dtype),
    )


# -- the batches' size, on the caller -------------------------------------------------------
def worker_memory(client, workers=None) -> str:
    """The workers' memory in words (for messages): used of limit, and status, per worker."""
    info = worker_info(client)
    return "; ".join(
        f"{a}: {int(w.get('metrics', {}).get('memory', 0)) / 2**20:.0f} MiB of "
        f"{int(w.get('memory_limit') or 0) / 2**20:.0f} MiB ({w.get('status', 'running')})"
        for a, w in info.items()
        if workers is None or a in workers
    )


def _kernel_per_row(source: ParquetSource) -> float:
    return KERNEL_ROW_VALUES * 8.0 * len(source.columns)


def batch_rows(client, source: ParquetSource, budget: MemoryBudget):
    """The read's measured cost and the rows per batch that a worker's task budget holds:
    ``(cost, rows, budget, full)``.

    The cost is measured by a probe task on a worker (:func:`~dkmeans.engine.sources.measure_read`),
    and the budget measured again after it (``budget``: the one to plan with). ``full``: workers
    without room for even :data:`~dkmeans.engine.sources.MIN_BATCH_ROWS` rows, left out of
    ``budget`` and of the passes while other workers have room.

    Raises
    ------
    WorkersPausedError
        No worker has room for a batch.
    """
    workers = list(budget.limits)
    future = client.submit(
        measure_read, source, pure=False, workers=workers, allow_other_workers=False
    )
    cost = gather(client, future)
    # what the probe's reads left in the pools released, and the memory measured again: the
    # budget was read before (a computation that just ended may have been releasing its data)
    budget = budget.remeasured(client)
    needed = min(MIN_BATCH_ROWS, max(source.piece_rows))

    def rows_on(address=None):
        task = budget.task_bytes(address)
        return min(
            MAX_BATCH_ROWS, max(source.piece_rows), cost.rows_for(task, _kernel_per_row(source))
        )

    full = [a for a in workers if rows_on(a) < needed]
    if full and len(full) < len(workers):  # as for paused workers: the others take their share
        logger.warning(
            "workers without room for %d rows of the files at a time get none of this fit's tasks: "
            "%s",
            needed,
            worker_memory(client, full),
        )
        budget = dataclasses.replace(
            budget, limits={a: v for a, v in budget.limits.items() if a not in full}
        )
    else:
        full = []
    task_bytes = budget.task_bytes()
    rows = rows_on()
    if rows < needed:
        raise WorkersPausedError(
            f"The workers have no room to read even {MIN_BATCH_ROWS} rows of the files at a "
            f"time: a read takes {cost.fixed / 2**20:.1f} MiB plus {cost.per_row:.0f} bytes per "
            f"row (measured), a task may take {task_bytes / 2**20:.1f} MiB "
            f"({worker_memory(client)}). The workers' processes keep that memory themselves "
            f"(imports, a previous computation's allocations); give the workers more memory, "
            f"restart them (client.restart()) before the fit, or use fewer worker processes with "
            f"more memory each."
        )
    logger.info(
        "reading %d file pieces in batches of %d rows: a read takes %.1f MiB + %.0f bytes per row "
        "(%s), a task may take %.1f MiB",
        len(source.pieces),
        rows,
        cost.fixed / 2**20,
        cost.per_row,
        "measured" if cost.measured else "not measured: a default",
        task_bytes / 2**20,
    )
    return cost, int(rows), budget, set(full)


def task_allowance(budget: MemoryBudget) -> float:
    """Bytes a task may rise by: its input budget, the kernel's fixed scratch and the centroids."""
    return budget.task_bytes() + budget.scratch_bytes + budget.centroid_bytes


def shrunk_batch_rows(source: ParquetSource, cost, budget: MemoryBudget, peak: float) -> int:
    """After a pass over the files: the rows per batch from now on, fewer where a task's measured
    ``peak`` exceeded its budget (:func:`task_allowance`), else ``source.batch_rows``."""
    allowed = task_allowance(budget)
    rows = source.batch_rows
    if peak <= allowed:
        return rows
    fixed = cost.fixed + budget.scratch_bytes + budget.centroid_bytes
    shrunk = max(MIN_BATCH_ROWS, int(rows * max(0.0, allowed - fixed) / max(1.0, peak - fixed)))
    if shrunk < rows:
        logger.info(
            "a task's measured peak was %.1f MiB, above its budget of %.1f MiB: batches of %d rows "
            "(were %d)",
            peak / 2**20,
            allowed / 2**20,
            shrunk,
            rows,
        )
        return shrunk
    return rows


__all__ = [
    "PieceFold",
    "batch_rows",
    "piece_batches",
    "piece_column",
    "read_piece",
    "shrunk_batch_rows",
    "source_array",
    "task_allowance",
    "worker_memory",
]
