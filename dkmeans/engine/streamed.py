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
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Sequence

import dask
import dask.array as da
from dask.array.utils import meta_from_array
import numpy as np
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import Task, TaskRef

from dkmeans.backend import to_host
from dkmeans.engine.futures import gather
from dkmeans.engine.memory import MemoryBudget, check_chunks_fit
from dkmeans.engine.passes import add_reduction_tree, first_chunk, fold_chunks, submitting_own_graph, task_args


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


def _stream_chunk(chunk_fn, args, offset, X, w=None):
    return to_host(chunk_fn(X, w, offset, *args)), False


def _stream_chunk_counting(chunk_fn, args, index, X, w=None):
    """A first pass over chunks of unknown length: the result, and the chunk's row count."""
    return (to_host(chunk_fn(X, w, None, *args)), {index: int(X.shape[0])}), False


class _CountingCombine:
    """``combine_fn`` over ``(value, {chunk: rows})`` parts: the combined value and every chunk's rows."""

    def __init__(self, combine_fn):
        self.combine_fn = combine_fn

    def __call__(self, parts):
        rows = {}
        for _, r in parts:
            rows.update(r)
        return self.combine_fn([value for value, _ in parts]), rows


def _stream_chunk_stateful(steps, offset, X, w=None):
    return to_host(_replay(X, w, offset, steps)[1]), False


def _state_block(steps, name, offset, X, w=None):
    return _replay(X, w, offset, steps)[0][name]


def rows_in_block(X):
    return np.array([X.shape[0]], dtype=np.int64)


class StreamedData:
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

    def __init__(self, client, X: da.Array, weights: da.Array | None = None, budget: MemoryBudget | None = None,
                 read_overhead: float = 1.0, first_row: int = 0, row_bytes: float | None = None):
        if X.numblocks[1] != 1:
            X = X.rechunk({1: -1})
        self.client = client
        self.row_bytes = float(row_bytes or X.shape[1] * X.dtype.itemsize)
        self.passes = 0
        self.generation = getattr(client, "generation", None)
        if weights is not None and any(np.isnan(c) for c in X.chunks[0]):
            X = self._with_chunk_sizes(X)  # weights need the rows' chunks now
        if weights is not None:
            weights = weights.rechunk((X.chunks[0],))
        (X,) = dask.optimize(X)
        if weights is not None:
            (weights,) = dask.optimize(weights)
        self.X, self.weights = X, weights
        self.n_features = int(X.shape[1])
        self.dtype = X.dtype
        self.first_row = int(first_row)
        self.budget = budget if budget is not None else MemoryBudget.of(client)
        self.read_overhead = float(read_overhead)
        self.chunk_rows = None
        if not any(np.isnan(c) for c in X.chunks[0]):
            self._set_chunk_rows(X.chunks[0])
        self.loop_modes: list[str] = []
        self._on_progress = None

    def _set_chunk_rows(self, rows) -> None:
        """Row counts known (from metadata or the first pass): offsets, and every chunk checked against the budget."""
        self.chunk_rows = tuple(int(r) for r in rows)
        self.offsets = tuple(int(self.first_row + o) for o in np.concatenate([[0], np.cumsum(self.chunk_rows)[:-1]]))
        self._n_rows = int(sum(self.chunk_rows))
        if any(np.isnan(c) for c in self.X.chunks[0]):
            self.X = da.Array(self.X.dask, self.X.name, (self.chunk_rows, self.X.chunks[1]), meta=meta_from_array(self.X))
        per_row = self.row_bytes + (8 if self.weights is not None else 0)
        check_chunks_fit([r * per_row * self.read_overhead for r in self.chunk_rows], self.budget)

    def _with_chunk_sizes(self, X: da.Array) -> da.Array:
        """``X`` with its row counts known, counted in one streamed pass (nothing is kept)."""
        counts = X.map_blocks(rows_in_block, dtype=np.int64, chunks=((1,) * X.numblocks[0],), drop_axis=1)
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
        return self.X.numblocks[0]

    @property
    def nbytes(self) -> int:
        self._ensure_chunk_rows()
        per_row = self.row_bytes + (8 if self.weights is not None else 0)
        return int(self.n_rows * per_row)

    # -- passes --------------------------------------------------------------------
    def _pass(self, make_task: Callable, combine_fn: Callable, fan_in: int = 8, args: Sequence[Any] = ()):
        """Submit one task per chunk (``make_task(key, i, refs, args)``) plus a reduction tree; the combined result.

        ``args`` reach ``make_task`` as one task argument (:func:`~dkmeans.engine.passes.task_args`).
        """
        token = uuid.uuid4().hex[:12]
        sources = [self.X] + ([self.weights] if self.weights is not None else [])
        layers = {name: layer for a in sources for name, layer in a.dask.layers.items()}
        deps = {name: d for a in sources for name, d in a.dask.dependencies.items()}
        parents = set().union(*(a.__dask_layers__() for a in sources))
        x_keys = [k[0] for k in self.X.__dask_keys__()]
        w_keys = list(self.weights.__dask_keys__()) if self.weights is not None else None
        current = []
        shared, needs = task_args(args, token, layers, deps)
        for i, x_key in enumerate(x_keys):
            key = f"dkmeans-stream-{token}-{i}"
            refs = [TaskRef(x_key)] + ([TaskRef(w_keys[i])] if w_keys is not None else [])
            layers[key] = MaterializedLayer({key: make_task(key, i, refs, shared)})
            deps[key] = set(parents) | needs
            current.append(key)
        current = add_reduction_tree(layers, deps, current, combine_fn, token, fan_in)
        with submitting_own_graph():
            futures = self.client.get(HighLevelGraph(layers, deps), current, sync=False)
        parts = gather(self.client, futures, (), self.generation)
        self.passes += 1
        return combine_fn([value for value, _ in parts])

    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = ()):
        """``combine_fn`` of ``chunk_fn(X_i, w_i, row_offset_i, *args)`` over every chunk, read from the source."""
        if self.chunk_rows is None:  # the first pass also counts the rows of each chunk
            value, rows = self._pass(lambda key, i, refs, a: Task(key, _stream_chunk_counting, chunk_fn, a, i, *refs),
                                     _CountingCombine(combine_fn), args=args)
            self._set_chunk_rows([rows[i] for i in range(self.n_chunks)])
            return value
        return self._pass(lambda key, i, refs, a: Task(key, _stream_chunk, chunk_fn, a, self.offsets[i], *refs),
                          combine_fn, args=args)

    def map_reduce_stateful(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (),
                            state: ReplayState | None = None):
        """A stateful pass whose state is rebuilt on each chunk by replaying the passes that made it."""
        self._ensure_chunk_rows()
        steps = (state.steps if state is not None else ()) + ((chunk_fn, tuple(args)),)
        value = self._pass(lambda key, i, refs, _: Task(key, _stream_chunk_stateful, steps, self.offsets[i], *refs),
                           combine_fn)
        return value, ReplayState(steps)

    def fold(self, chunk_fn: Callable, state: Any, args: Sequence[Any] = (), *,
             stop: Callable[[Any], bool] | None = None, on_state: Callable[[Any], None] | None = None,
             start_row: int = 0, window: int | None = None):
        """A sequential pass, read from the source a window of chunks at a time (one per worker thread).

        The reads of a window run in parallel; the state moves from chunk to chunk in row
        order; a worker holds about one chunk per thread, as in :meth:`map_reduce`. Chunks
        ending at or before ``start_row`` are not read.
        """
        self._ensure_chunk_rows()
        sources = [self.X] + ([self.weights] if self.weights is not None else [])
        layers = {name: layer for a in sources for name, layer in a.dask.layers.items()}
        deps = {name: d for a in sources for name, d in a.dask.dependencies.items()}
        parents = set().union(*(a.__dask_layers__() for a in sources))
        x_keys = [k[0] for k in self.X.__dask_keys__()]
        w_keys = list(self.weights.__dask_keys__()) if self.weights is not None else None
        if window is None:
            window = max(2, len(self.budget.per_worker()))  # about one chunk per worker at a time

        def refs(i):
            return [TaskRef(x_keys[i])] + ([TaskRef(w_keys[i])] if w_keys is not None else [])

        state = fold_chunks(self.client, self.n_chunks, refs, self.offsets, chunk_fn, state, args, window=window,
                            stop=stop, on_state=on_state, first=first_chunk(self.offsets, self.chunk_rows, start_row),
                            source_layers=layers, source_deps=deps, parents=parents,
                            gather_fn=lambda f: gather(self.client, f, (), self.generation))
        self.passes += 1
        return state

    def state_column(self, state: ReplayState, name: str) -> da.Array:
        """The per-row array ``name`` of the replayed states: a lazy Dask array (computed from the source)."""
        self._ensure_chunk_rows()
        x_blocks = self.X.to_delayed().ravel()
        w_blocks = self.weights.to_delayed().ravel() if self.weights is not None else [None] * len(x_blocks)
        pieces = []
        for i, (xb, wb) in enumerate(zip(x_blocks, w_blocks)):
            block = dask.delayed(_state_block)(state.steps, name, self.offsets[i], xb, wb)
            pieces.append(da.from_delayed(block, shape=(self.chunk_rows[i],), dtype=np.int32))
        return da.concatenate(pieces) if pieces else da.zeros((0,), dtype=np.int32)

    def rows(self, indices) -> np.ndarray:
        """The rows at these global indices (only the chunks holding them are read)."""
        self._ensure_chunk_rows()
        idx = np.asarray(indices, dtype=np.int64) - self.first_row
        if len(idx) and np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx))):  # a range: a plain slice
            return to_host(gather(self.client, self.client.compute(self.X[int(idx[0]):int(idx[0]) + len(idx)])))
        order = np.argsort(idx, kind="stable")
        picked = to_host(gather(self.client, self.client.compute(self.X[idx[order]])))
        return picked[np.argsort(order, kind="stable")]  # back to the order asked (also for sparse rows)

    def run_loop(self, fn: Callable, args: Sequence[Any] = (), *, work_per_row: float = 0.0,
                 on_progress: Callable[[dict], None] | None = None):
        """``fn(self, *args)`` here: every pass of the loop streams the data."""
        self._on_progress = on_progress
        try:
            return fn(self, *args)
        finally:
            self._on_progress = None
            self.loop_modes.append("streamed")

    def report(self, record: dict) -> None:
        if self._on_progress is not None:
            self._on_progress(record)

    def release(self) -> None:
        """Nothing is held on the cluster between passes."""
        self.X = self.weights = None


__all__ = ["ReplayState", "StreamedData"]
