"""Out-of-core data: every pass reads the chunks from their source, runs the kernel, drops the chunk.

When the data does not fit the cluster's memory budget (see :mod:`dkmeans.engine.memory`)
it is not persisted. :class:`StreamedData` keeps the source's (optimised) graph instead:
a Parquet or CSV read restricted to the feature columns, a Zarr array, any recomputable
Dask collection. Each pass submits one task per chunk that applies the chunk function to
the freshly read chunk and returns only its small result, then a reduction tree. Dask
schedules the reads as root tasks (queued to about one per worker thread, see
``distributed.scheduler.worker-saturation``), and a chunk is released as soon as its kernel
task has run, so a worker holds about one chunk per thread whatever the data's size.

Per-chunk state between passes (k-means|| distances, k-means++ trials, Hartigan labels)
is not kept: a stateful pass replays, on each chunk, the chunk functions of the passes
that built the state, from the same arguments, so it gets the same bits the in-memory
mode keeps (:class:`ReplayState`). That costs compute (the seedings' few passes each
redo the earlier ones' distance updates) but no memory per row.

Parquet files behind a ``dd.read_parquet`` DataFrame (and CSV files read through
:func:`dkmeans.engine.files.read_table`) are read by the engine itself
(:mod:`dkmeans.engine.sources` cuts them into pieces, :mod:`dkmeans.engine.reader` reads
them): each task of a pass reads one piece of a file (row groups, or a byte range cut at line
ends) in row batches sized from the measured peak memory of a read, so a task holds one batch
plus the kernel's scratch whatever the file's size. Tasks go only to workers
that are not paused by distributed's memory monitor: a pass whose tasks wait on a
worker that stays paused (its memory is its own, not Dask's data) is submitted again
without it (see :func:`dkmeans.engine.futures.gather`).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.array.utils import meta_from_array
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import Task, TaskRef

from dkmeans.engine.device import beside_rows
from dkmeans.engine.futures import WorkersStalledError, gather
from dkmeans.engine.memory import MemoryBudget, check_chunks_fit, release_memory
from dkmeans.engine.passes import (
    add_reduction_tree,
    first_chunk,
    fold_chunks,
    submitting_own_graph,
    task_args,
)
from dkmeans.engine.protocol import InCallerLoop, SummedLabels
from dkmeans.engine.reader import (
    PieceFold,
    batch_rows,
    piece_column,
    read_piece,
    shrunk_batch_rows,
    source_array,
    worker_memory,
)
from dkmeans.engine.sources import (
    KERNEL_ROW_VALUES,
    MAX_BATCH_ROWS,
    MIN_BATCH_ROWS,
    ParquetSource,
    count_rows,
)
from dkmeans.engine.workers import worker_info
from dkmeans.errors import WorkersPausedError
from dkmeans.kernels.namespace import to_host

logger = logging.getLogger("dkmeans")


class ReplayState:
    """The passes that built a streamed per-chunk state: ``[(chunk_fn, args), ...]`` in order."""

    def __init__(self, steps: tuple):
        self.steps = steps


def _replay(X, w, offset, steps):
    """The state of this chunk after ``steps``, and the last step's result."""
    state = out = None
    for fn, args in steps:
        state, out = fn(X, w, offset, state, *args)
    return state, out


def _row_batches(X, w, batch_rows):
    """``(row offset in the chunk, X, w)`` slices of at most ``batch_rows`` rows of a dense chunk (views, no
    copy; other chunks, and chunks of at most ``batch_rows`` rows, whole)."""
    n = X.shape[0]
    if not batch_rows or n <= batch_rows or not isinstance(X, np.ndarray):
        yield 0, X, w
        return
    for start in range(0, n, batch_rows):
        stop = min(n, start + batch_rows)
        yield start, X[start:stop], (None if w is None else w[start:stop])


def _at(offset, start):
    return None if offset is None else offset + start


def _sliced(chunk_fn, combine_fn, args, offset, batch_rows, X, w):
    """``chunk_fn`` over the chunk's row batches, combined (one batch: its result as it is)."""
    results = [
        to_host(chunk_fn(Xb, wb, _at(offset, s), *args))
        for s, Xb, wb in _row_batches(X, w, batch_rows)
    ]
    return results[0] if len(results) == 1 else combine_fn(results)


def _stream_chunk(chunk_fn, combine_fn, args, offset, batch_rows, X, w=None):
    return _sliced(chunk_fn, combine_fn, args, offset, batch_rows, X, w), False


def _stream_chunk_counting(chunk_fn, combine_fn, args, index, batch_rows, X, w=None):
    """A first pass over chunks of unknown length: the result, and the chunk's row count."""
    return (
        _sliced(chunk_fn, combine_fn, args, None, batch_rows, X, w),
        {index: int(X.shape[0])},
    ), False


class _CountingCombine:
    """``combine_fn`` over ``(value, {chunk: rows})`` parts: the combined value and every chunk's rows."""

    def __init__(self, combine_fn):
        self.combine_fn = combine_fn

    def __call__(self, parts):
        rows = {}
        for _, r in parts:
            rows.update(r)
        return self.combine_fn([value for value, _ in parts]), rows


def _stream_chunk_stateful(steps, combine_fn, offset, batch_rows, X, w=None):
    results = [
        to_host(_replay(Xb, wb, offset + s, steps)[1])
        for s, Xb, wb in _row_batches(X, w, batch_rows)
    ]
    return (results[0] if len(results) == 1 else combine_fn(results)), False


def _state_block(steps, name, offset, batch_rows, X, w=None):
    parts = [
        _replay(Xb, wb, offset + s, steps)[0][name] for s, Xb, wb in _row_batches(X, w, batch_rows)
    ]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class _SlicedFold:
    """A fold step over a whole chunk: ``chunk_fn`` applied to its row batches in order."""

    def __init__(self, batch_rows, chunk_fn):
        self.batch_rows, self.chunk_fn = batch_rows, chunk_fn

    def __call__(self, X, w, offset, state, *args):
        for start, Xb, wb in _row_batches(X, w, self.batch_rows):
            state = to_host(self.chunk_fn(Xb, wb, offset + start, state, *args))
        return state


class _ReplayedResult:
    """A batch's result after the replayed ``steps`` (a chunk function for the reader's tasks)."""

    def __init__(self, steps: tuple):
        self.steps = steps

    def __call__(self, X, w, offset):
        return _replay(X, w, offset, self.steps)[1]


class _ReplayedColumn:
    """A batch's per-row array ``name`` of the state after the replayed ``steps``."""

    def __init__(self, steps: tuple, name: str):
        self.steps, self.name = steps, name

    def __call__(self, X, w, offset):
        return _replay(X, w, offset, self.steps)[0][self.name]


def rows_in_block(X):
    return np.array([X.shape[0]], dtype=np.int64)


def kernel_batch_rows(scratch_bytes: float, n_features: int) -> int:
    """Rows of a chunk's batch whose kernel temporaries (:data:`~dkmeans.engine.sources.KERNEL_ROW_VALUES`
    float64 values per feature and row) fit ``scratch_bytes``, within [MIN_BATCH_ROWS, MAX_BATCH_ROWS]."""
    if scratch_bytes <= 0:
        return MAX_BATCH_ROWS
    rows = int(scratch_bytes // (KERNEL_ROW_VALUES * 8 * max(1, int(n_features))))
    return int(min(MAX_BATCH_ROWS, max(MIN_BATCH_ROWS, rows)))


class StreamedData(SummedLabels, InCallerLoop):
    """Row-chunked data read from its source in every pass (the data protocol, out of core).

    Parameters
    ----------
    client : distributed.Client
    X : dask.array.Array, shape (n, d)
        A recomputable collection (not persisted): each pass computes its chunks again.
        Chunks of unknown length (a Dask DataFrame's partitions) are counted in the first
        pass, which must be a plain :meth:`map_reduce` whose chunk function does not use
        its row offset (the fit service's column-moments pass); another first pass counts
        them in a pass of its own.
    weights : dask.array.Array, shape (n,), optional
        With the same row chunks as ``X`` (or rechunked to them).
    budget : MemoryBudget, optional
        Every chunk (times ``read_overhead``) must fit a worker's task budget, else
        :class:`~dkmeans.errors.ChunkTooLargeError` is raised before any pass runs.
    read_overhead : float
        Peak memory of reading one chunk, as a multiple of the chunk's bytes (a DataFrame
        partition is read as Arrow, converted to pandas, then to an array: about 3).
    first_row : int
        Global index of the first row (when these rows are the tail of larger data).
    row_bytes : float, optional
        Bytes one row takes in memory (default ``n_features * itemsize``: dense rows); for
        ``scipy.sparse`` chunks, the caller's estimate of their stored bytes per row.
    """

    kind = "streamed"
    in_memory = False
    loop_mode = "streamed"

    def __init__(
        self,
        client,
        X: da.Array | None,
        weights: da.Array | None = None,
        budget: MemoryBudget | None = None,
        read_overhead: float = 1.0,
        first_row: int = 0,
        row_bytes: float | None = None,
        source: ParquetSource | None = None,
    ):
        self.client = client
        self.passes = 0
        self.generation = getattr(client, "generation", None)
        self.budget = budget if budget is not None else MemoryBudget.of(client)
        self.source = source
        # workers left out of passes: paused by their own memory when the budget was read, or since
        self.excluded: set = set()
        if source is not None:
            self.excluded = {a for a in worker_info(client) if a not in self.budget.limits}
        self.read_cost = None
        if source is not None:
            # CSV pieces: their rows counted first (one task per piece), so that offsets are known
            count_rows(
                client, source, lambda f: gather(client, f), workers=list(self.budget.limits)
            )
            self.read_cost, source.batch_rows, self.budget, full = batch_rows(
                client, source, self.budget
            )
            self.excluded |= full
            X = source_array(source, source.batch_rows)
        if X.numblocks[1] != 1:
            X = X.rechunk({1: -1})
        self.row_bytes = float(row_bytes or X.shape[1] * X.dtype.itemsize)
        # a chunk's kernels run on row batches of at most this many rows, so that their per-row
        # temporaries stay within the budget's kernel scratch whatever the chunk's size
        self.kernel_rows = kernel_batch_rows(self.budget.scratch_bytes, X.shape[1])
        if weights is not None and any(np.isnan(c) for c in X.chunks[0]):
            X = self._with_chunk_sizes(X)  # weights need the rows' chunks now
        if weights is not None:
            rows = source.piece_rows if source is not None else X.chunks[0]
            weights = beside_rows(weights.rechunk((rows,)), X)
        if source is None:
            (X,) = dask.optimize(X)
        if weights is not None:
            (weights,) = dask.optimize(weights)
        self.X, self.weights = X, weights
        self.n_features = int(X.shape[1])
        self.dtype = X.dtype
        self.first_row = int(first_row)
        self.read_overhead = float(read_overhead)
        self.chunk_rows = None
        if source is not None:
            self._set_chunk_rows(source.piece_rows)
        elif not any(np.isnan(c) for c in X.chunks[0]):
            self._set_chunk_rows(X.chunks[0])
        self.loop_modes: list[str] = []
        self._on_pass = None  # progress within each pass (:meth:`watch_passes`)

    def watch_passes(self, callback: Callable[[dict], None] | None) -> None:
        """``callback({"pass", "done", "total", "seconds"})`` as each pass reads its pieces: at its
        start, about every :data:`~dkmeans.engine.futures.WATCH_POLL_S` while pieces finish, and
        at its end (``done == total``); ``pass`` numbers the passes (1, 2, ...).

        The pass's piece tasks are then watched from here: each piece's small result is held
        until the next look (half a second at most), and let go then.
        """
        self._on_pass = callback

    def _check_task_peak(self, peak: float) -> None:
        """After a pass over the files: smaller batches from now on if a task's measured peak exceeded its budget."""
        if self.source is not None:
            self.source.batch_rows = shrunk_batch_rows(
                self.source, self.read_cost, self.budget, peak
            )

    def _set_chunk_rows(self, rows) -> None:
        """Row counts known (from metadata or the first pass): offsets, and every chunk checked against the budget."""
        self.chunk_rows = tuple(int(r) for r in rows)
        self.offsets = tuple(
            int(self.first_row + o) for o in np.concatenate([[0], np.cumsum(self.chunk_rows)[:-1]])
        )
        self._n_rows = int(sum(self.chunk_rows))
        if any(np.isnan(c) for c in self.X.chunks[0]):
            self.X = da.Array(
                self.X.dask,
                self.X.name,
                (self.chunk_rows, self.X.chunks[1]),
                meta=meta_from_array(self.X),
            )
        if self.source is None:
            per_row = self.row_bytes + (8 if self.weights is not None else 0)
            check_chunks_fit(
                [r * per_row * self.read_overhead for r in self.chunk_rows], self.budget
            )

    def _with_chunk_sizes(self, X: da.Array) -> da.Array:
        """``X`` with its row counts known, counted in one streamed pass (nothing is kept)."""
        counts = X.map_blocks(
            rows_in_block, dtype=np.int64, chunks=((1,) * X.numblocks[0],), drop_axis=1
        )
        rows = tuple(int(r) for r in gather(self.client, self.client.compute(counts)))
        self.passes += 1
        return da.Array(X.dask, X.name, (rows, X.chunks[1]), meta=meta_from_array(X))

    def _ensure_chunk_rows(self) -> None:
        if self.chunk_rows is None:
            self.X = self._with_chunk_sizes(self.X)
            self._set_chunk_rows(self.X.chunks[0])

    @property
    def has_weights(self) -> bool:
        return self.weights is not None

    @property
    def n_rows(self) -> int:
        """Rows of all chunks (counted in a pass of their own if no pass has counted them yet)."""
        self._ensure_chunk_rows()
        return self._n_rows

    @property
    def n_chunks(self) -> int:
        return len(self.source.pieces) if self.source is not None else self.X.numblocks[0]

    @property
    def nbytes(self) -> int:
        self._ensure_chunk_rows()
        per_row = self.row_bytes + (8 if self.weights is not None else 0)
        return int(self.n_rows * per_row)

    # -- passes --------------------------------------------------------------------
    def _sources(self):
        """The Dask arrays a pass's tasks read from: ``X`` (unless the engine reads the files), the weights."""
        return ([self.X] if self.source is None else []) + (
            [self.weights] if self.weights is not None else []
        )

    def _chunk_refs(self, i: int) -> list:
        x = [TaskRef(self._x_keys[i])] if self.source is None else []
        return x + ([TaskRef(self._w_keys[i])] if self.weights is not None else [])

    @property
    def _x_keys(self):
        return [k[0] for k in self.X.__dask_keys__()]

    @property
    def _w_keys(self):
        return list(self.weights.__dask_keys__())

    def _allowed_workers(self) -> list | None:
        """Workers the pass's tasks may run on (None: any), all workers but those left out as paused."""
        if not self.excluded:
            return None
        workers = [a for a in worker_info(self.client) if a not in self.excluded]
        if not workers:
            raise WorkersPausedError(
                f"Every worker of the Dask cluster stays paused by distributed's memory monitor "
                f"({worker_memory(self.client)}), so the pass was stopped: their processes keep "
                f"that memory themselves (imports, a previous computation's allocations), and "
                f"releasing what the allocators keep did not bring them below the pause "
                f"threshold. Restart the workers (client.restart()) before the fit, give them "
                f"more memory, or use fewer worker processes with more memory each."
            )
        return workers

    def _pass(
        self, make_task: Callable, combine_fn: Callable, fan_in: int = 8, args: Sequence[Any] = ()
    ):
        """Submit one task per chunk (``make_task(key, i, refs, args)``) plus a reduction tree; the combined result.

        ``args`` reach ``make_task`` as one task argument (:func:`~dkmeans.engine.passes.task_args`).
        A pass whose tasks wait on workers that stay paused is submitted again without them
        (the results do not depend on where the tasks ran).
        """
        while True:
            futures, pieces = self._submit_pass(
                make_task, combine_fn, fan_in, args, self._allowed_workers()
            )
            watch = None
            if self._on_pass is not None:
                watch = _PassWatch(self._on_pass, self.passes + 1, pieces)
            try:
                parts = gather(
                    self.client, futures, (), self.generation, stalled_workers=True, on_poll=watch
                )
            except WorkersStalledError as exc:
                self.client.cancel(futures)
                watch is not None and watch.cancel(self.client)
                self.excluded |= set(exc.workers)
                logger.warning(
                    "a pass waited on workers paused by memory of their own while the others were idle "
                    "(%s): submitted again without %s",
                    exc,
                    ", ".join(exc.workers),
                )
                continue
            except BaseException:
                if watch is not None:  # the pieces' tasks stop with the pass's (none held any more)
                    watch.cancel(self.client)
                raise
            if watch is not None:
                watch.end()
            self.passes += 1
            self._check_task_peak(max((float(p) for _, p in parts), default=0.0))
            return combine_fn([value for value, _ in parts])

    def _submit_pass(self, make_task, combine_fn, fan_in, args, workers):
        token = uuid.uuid4().hex[:12]
        sources = self._sources()
        layers = {name: layer for a in sources for name, layer in a.dask.layers.items()}
        deps = {name: d for a in sources for name, d in a.dask.dependencies.items()}
        parents = set().union(*(a.__dask_layers__() for a in sources))
        annotations = {"workers": workers, "allow_other_workers": False} if workers else None
        current = []
        shared, needs = task_args(args, token, layers, deps)
        for i in range(self.n_chunks):
            key = f"dkmeans-stream-{token}-{i}"
            layers[key] = MaterializedLayer(
                {key: make_task(key, i, self._chunk_refs(i), shared)}, annotations=annotations
            )
            deps[key] = set(parents) | needs
            current.append(key)
        pieces = list(current) if self._on_pass is not None else []  # watched: their futures too
        current = add_reduction_tree(layers, deps, current, combine_fn, token, fan_in)
        with submitting_own_graph():
            futures = self.client.get(HighLevelGraph(layers, deps), current + pieces, sync=False)
        return futures[: len(current)], futures[len(current) :]

    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = ()):
        """``combine_fn`` of ``chunk_fn(X_i, w_i, row_offset_i, *args)`` over every chunk, read from the source."""
        chunk_fn = self._planned(chunk_fn)
        if self.chunk_rows is None:  # the first pass also counts the rows of each chunk
            value, rows = self._pass(
                lambda key, i, refs, a: Task(
                    key, _stream_chunk_counting, chunk_fn, combine_fn, a, i, self.kernel_rows, *refs
                ),
                _CountingCombine(combine_fn),
                args=args,
            )
            self._set_chunk_rows([rows[i] for i in range(self.n_chunks)])
            return value
        if self.source is not None:
            src, rows = self.source, self.source.batch_rows
            return self._pass(
                lambda key, i, refs, a: Task(
                    key, read_piece, src, i, rows, chunk_fn, combine_fn, a, self.offsets[i], *refs
                ),
                combine_fn,
                args=args,
            )
        return self._pass(
            lambda key, i, refs, a: Task(
                key,
                _stream_chunk,
                chunk_fn,
                combine_fn,
                a,
                self.offsets[i],
                self.kernel_rows,
                *refs,
            ),
            combine_fn,
            args=args,
        )

    def map_reduce_stateful(
        self,
        chunk_fn: Callable,
        combine_fn: Callable,
        args: Sequence[Any] = (),
        state: ReplayState | None = None,
    ):
        """A stateful pass whose state is rebuilt on each chunk by replaying the passes that made it."""
        self._ensure_chunk_rows()
        steps = (state.steps if state is not None else ()) + (
            (self._planned(chunk_fn), tuple(args)),
        )
        if self.source is not None:
            src, rows = self.source, self.source.batch_rows
            last = _ReplayedResult(steps)
            value = self._pass(
                lambda key, i, refs, _: Task(
                    key, read_piece, src, i, rows, last, combine_fn, (), self.offsets[i], *refs
                ),
                combine_fn,
            )
        else:
            value = self._pass(
                lambda key, i, refs, _: Task(
                    key,
                    _stream_chunk_stateful,
                    steps,
                    combine_fn,
                    self.offsets[i],
                    self.kernel_rows,
                    *refs,
                ),
                combine_fn,
            )
        return value, ReplayState(steps)

    def fold(
        self,
        chunk_fn: Callable,
        state: Any,
        args: Sequence[Any] = (),
        *,
        stop: Callable[[Any], bool] | None = None,
        on_state: Callable[[Any], None] | None = None,
        start_row: int = 0,
        window: int | None = None,
    ):
        """A sequential pass, read from the source a window of chunks at a time (one per worker thread).

        The reads of a window run in parallel; the state moves from chunk to chunk in row
        order; a worker holds about one chunk per thread, as in :meth:`map_reduce`. Chunks
        ending at or before ``start_row`` are not read.
        """
        self._ensure_chunk_rows()
        sources = self._sources()
        layers = {name: layer for a in sources for name, layer in a.dask.layers.items()}
        deps = {name: d for a in sources for name, d in a.dask.dependencies.items()}
        parents = set().union(*(a.__dask_layers__() for a in sources))
        if window is None:
            window = max(2, len(self.budget.per_worker()))  # about one chunk per worker at a time
        chunk_fn = self._planned(chunk_fn)
        if self.source is not None:  # the task reads its piece itself, batch by batch
            chunk_fn = PieceFold(self.source, self.source.batch_rows, chunk_fn)
        else:
            chunk_fn = _SlicedFold(self.kernel_rows, chunk_fn)

        def refs(i):
            return ([i] if self.source is not None else []) + self._chunk_refs(i)

        first = first_chunk(self.offsets, self.chunk_rows, start_row)
        on_window = None
        if (
            self._on_pass is not None
        ):  # progress by windows of pieces (a pass a stop request ends early
            # ends there: the next pass, or the next step, closes it)
            index, total, t0 = self.passes + 1, self.n_chunks - first, time.monotonic()

            def tell(end: int) -> None:
                self._on_pass(
                    {
                        "pass": index,
                        "done": end - first,
                        "total": total,
                        "seconds": time.monotonic() - t0,
                    }
                )

            tell(first)
            on_window = tell
        state = fold_chunks(
            self.client,
            self.n_chunks,
            refs,
            self.offsets,
            chunk_fn,
            state,
            args,
            window=window,
            stop=stop,
            on_state=on_state,
            first=first,
            source_layers=layers,
            source_deps=deps,
            parents=parents,
            gather_fn=lambda f: gather(self.client, f, (), self.generation),
            on_window=on_window,
        )
        self.passes += 1
        return state

    def row_state_bytes(self) -> float:
        """Rows read from their source keep no per-row state for a whole loop."""
        return 0.0

    def state_column(self, state: ReplayState, name: str) -> da.Array:
        """The per-row array ``name`` of the replayed states: a lazy Dask array (computed from the source)."""
        self._ensure_chunk_rows()
        w_blocks = (
            self.weights.to_delayed().ravel()
            if self.weights is not None
            else [None] * self.n_chunks
        )
        pieces = []
        if self.source is not None:
            for i, wb in enumerate(w_blocks):
                column = _ReplayedColumn(state.steps, name)
                block = dask.delayed(piece_column)(
                    self.source, i, self.source.batch_rows, column, self.offsets[i], wb
                )
                pieces.append(da.from_delayed(block, shape=(self.chunk_rows[i],), dtype=np.int32))
            return da.concatenate(pieces) if pieces else da.zeros((0,), dtype=np.int32)
        x_blocks = self.X.to_delayed().ravel()
        for i, (xb, wb) in enumerate(zip(x_blocks, w_blocks)):
            block = dask.delayed(_state_block)(
                state.steps, name, self.offsets[i], self.kernel_rows, xb, wb
            )
            pieces.append(da.from_delayed(block, shape=(self.chunk_rows[i],), dtype=np.int32))
        return da.concatenate(pieces) if pieces else da.zeros((0,), dtype=np.int32)

    def rows(self, indices) -> np.ndarray:
        """The rows at these global indices (only the chunks holding them are read)."""
        self._ensure_chunk_rows()
        idx = np.asarray(indices, dtype=np.int64) - self.first_row
        if len(idx) and np.array_equal(
            idx, np.arange(idx[0], idx[0] + len(idx))
        ):  # a range: a plain slice
            return to_host(
                gather(
                    self.client, self.client.compute(self.X[int(idx[0]) : int(idx[0]) + len(idx)])
                )
            )
        order = np.argsort(idx, kind="stable")
        picked = to_host(gather(self.client, self.client.compute(self.X[idx[order]])))
        return picked[
            np.argsort(order, kind="stable")
        ]  # back to the order asked (also for sparse rows)

    def release(self) -> None:
        """Nothing is held on the cluster between passes; what the reads left in the workers' allocators
        and pyarrow's pool is given back (93 MiB of each 768 MiB worker after a fit over 18 files of
        64 MB: 446 -> 353 MiB resident), so that the user's next computation finds the memory the fit
        found. Once: a second call finds nothing to let go."""
        if self.X is None:
            return
        self.X = self.weights = None
        with contextlib.suppress(
            Exception
        ):  # a courtesy: a worker gone by now does not fail the fit
            self.client.run(release_memory)


class _PassWatch:
    """A pass's progress from its piece tasks' futures (see :meth:`StreamedData.watch_passes`)."""

    def __init__(self, callback: Callable[[dict], None], index: int, pieces: list):
        self.callback, self.index = callback, index
        self.pending, self.total = list(pieces), len(pieces)
        self.t0 = time.monotonic()
        self._tell(0)

    def _tell(self, done: int) -> None:
        self.callback(
            {
                "pass": self.index,
                "done": done,
                "total": self.total,
                "seconds": time.monotonic() - self.t0,
            }
        )

    def __call__(self) -> None:
        # finished pieces are let go by dropping them, never by ``release()``: a pass of at most
        # ``fan_in`` pieces has no reduction tree, its pieces are its results (the same futures,
        # which the pass still gathers); other pieces' small results feed the reduction
        pending = [f for f in self.pending if not f.done()]
        if len(pending) == len(self.pending):
            return
        self.pending = pending
        self._tell(self.total - len(self.pending))

    def end(self) -> None:
        self.pending = []
        self._tell(self.total)

    def cancel(self, client) -> None:
        with contextlib.suppress(Exception):  # the scheduler is gone: nothing runs there any more
            client.cancel(self.pending)
        self.pending = []


__all__ = ["ReplayState", "StreamedData", "kernel_batch_rows", "rows_in_block"]
