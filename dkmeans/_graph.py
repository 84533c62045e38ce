"""One pass over persisted, row-chunked data: one graph, one task per worker.

:class:`PersistedData` holds a row-chunked Dask array (and optional weights) that is
persisted once on the workers. :meth:`PersistedData.map_reduce` runs a chunk function
on every chunk *where it lives*: the graph has one task per worker that loops over the
chunks that worker holds and combines their results, then a tree of combine tasks
(fan-in ``fan_in``) and a last combine on the client. Tasks per pass are therefore
O(workers), not O(chunks); only the small per-worker results cross the network.

A worker with several threads gets one task per thread (its chunks split into
contiguous groups), so every thread of the cluster works in a pass; each task combines
its chunks' results, and the tree combines the tasks of one worker first.

Worker tasks are placed with ``workers=[addr], allow_other_workers=True``: if a worker
has died, the task runs elsewhere and Dask recomputes the chunks it needs from the
persisted graph. The chunk-to-worker map is refreshed after a pass in which a task did
not run where it was planned.

A loop whose passes are too small to gain from spreading (less work than the cluster
round trip, see :meth:`PersistedData.fits_one_task`) can instead run whole inside one
task with :meth:`PersistedData.run_in_one_task`, which hands the driver a
:class:`LocalChunks` with the same ``map_reduce``. A larger loop can run SPMD, one task
per worker thread for many passes (:meth:`PersistedData.run_spmd`, :mod:`dkmeans._spmd`).
"""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from concurrent.futures import CancelledError
from typing import Any, Callable, Sequence

import dask
import dask.array as da
import numpy as np
from dask._task_spec import Alias, Task, TaskRef
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.utils import parse_timedelta
from distributed import futures_of, get_worker, wait

from dkmeans.backend import get_namespace, to_host
from dkmeans.errors import ClusterError, ClusterRestartedError, InputLostError, NoWorkersError

logger = logging.getLogger("dkmeans")

#: Dask config key (env ``DASK_DKMEANS__WORKER_TIMEOUT``): how long a pass may wait with no worker.
WORKER_TIMEOUT_KEY = "dkmeans.worker-timeout"
DEFAULT_WORKER_TIMEOUT = "120s"


def worker_timeout() -> float:
    """Seconds a pass waits while the cluster has no worker at all (Dask config ``dkmeans.worker-timeout``)."""
    return float(parse_timedelta(dask.config.get(WORKER_TIMEOUT_KEY, DEFAULT_WORKER_TIMEOUT)))


#: Dask config key (env ``DASK_DKMEANS__SINGLE_TASK_WORK``): a loop whose passes each cost
#: at most this many multiply-adds (rows x centroids x features) runs inside one task.
SINGLE_TASK_WORK_KEY = "dkmeans.single-task-work"
#: About 10 ms of one thread's work: below it a pass costs less than the cluster round trip
#: that spreading it over workers adds (see :meth:`PersistedData.fits_one_task`).
DEFAULT_SINGLE_TASK_WORK = 2e8
#: Data larger than this is never gathered onto one worker for a single-task loop.
SINGLE_TASK_MAX_BYTES = 128 * 2**20


def single_task_work() -> float:
    """The per-pass work below which a loop runs in one task (Dask config ``dkmeans.single-task-work``)."""
    return float(dask.config.get(SINGLE_TASK_WORK_KEY, DEFAULT_SINGLE_TASK_WORK))


def gather(client, futures, inputs=(), generation=None):
    """Wait for ``futures`` (a future or a list) and return their results, failing clearly instead of hanging.

    * Every worker gone for longer than :func:`worker_timeout`: the futures are
      cancelled and :class:`~dkmeans.errors.NoWorkersError` is raised. While at least
      one worker is alive, lost chunks are being recomputed and the wait goes on.
    * A cancelled task: :class:`~dkmeans.errors.ClusterRestartedError` after
      ``client.restart()``, :class:`~dkmeans.errors.InputLostError` when input chunks
      (``inputs``: their futures) were lost and cannot be recomputed. ``generation``:
      the client's restart count when the inputs were persisted (a restart since then
      also cancelled them).
    """
    timeout = worker_timeout()
    poll = min(1.0, max(0.05, timeout / 4))
    single = not isinstance(futures, (list, tuple))
    futures = [futures] if single else list(futures)
    no_workers_since = None
    try:
        while True:
            try:
                with client.as_current():  # wait() uses the current client
                    wait(futures, timeout=poll)
                break
            except TimeoutError:
                pass
            if client.nthreads():  # workers alive: lost chunks are being recomputed, keep waiting
                no_workers_since = None
                continue
            no_workers_since = no_workers_since or time.monotonic()
            if time.monotonic() - no_workers_since > timeout:
                client.cancel(futures)
                raise NoWorkersError(
                    f"The Dask cluster has had no workers for {timeout:g} s, so the computation was stopped. "
                    f"Start workers (or find out why they died: memory limits, preemption) and run again; "
                    f"the wait is set by the Dask config {WORKER_TIMEOUT_KEY!r}."
                )
        results = client.gather(futures)
    except CancelledError as exc:
        restarted = generation is not None and getattr(client, "generation", generation) != generation
        raise _cancelled_error(exc, inputs, restarted) from exc
    return results[0] if single else results


def _cancelled_error(exc, inputs, restarted=False):
    groups = getattr(exc, "error_groups", None)  # FuturesCancelledError: one reason per group
    reason = " ".join(g.reason or "" for g in groups) if groups else (getattr(exc, "reason", None) or str(exc))
    if restarted or "restart" in reason:
        return ClusterRestartedError(
            "The Dask cluster was restarted (client.restart()) while dkmeans was using it, which dropped the "
            "data persisted for this job. Nothing was fitted; run it again once the cluster is up."
        )
    lost = [f for f in inputs if f.status in ("cancelled", "lost")]
    if lost or "forgotten" in reason or "lost" in reason:
        return InputLostError(
            "Input data was lost with a worker and cannot be recomputed: it lived only in worker memory "
            "(for example put there with client.scatter). Build the Dask array from a recomputable source "
            "(dask.array.from_array, from_zarr, dask.dataframe.read_parquet, ...) so that lost chunks are "
            "recomputed, or replicate scattered data (client.scatter(..., broadcast=True))."
        )
    return ClusterError(f"The Dask cluster cancelled this computation (reason: {reason}); run it again.")


def _run_on_worker(chunk_fn, combine_fn, args, chunk_ids, offsets, has_weights, planned_worker, stateful, n_blocks,
                   *refs):
    """Apply ``chunk_fn`` to each local chunk and combine the results (runs on a worker).

    ``refs`` holds the chunk blocks (``X_i`` or ``X_i, w_i`` pairs), then, for a stateful
    pass, the previous state dicts (``{chunk_id: state}``) that cover these chunks.

    Returns ``(result, moved)``, or ``(new_states, (result, moved))`` for a stateful pass;
    ``moved`` is True when the task ran on another worker than planned (a worker was
    lost, or data moved), so the driver refreshes placement.
    """
    blocks, weights = split_blocks(refs[:n_blocks], has_weights)
    state_dicts = refs[n_blocks:]
    previous = {}
    for states, _ in state_dicts:  # outputs of the previous stateful pass
        previous.update(states)
    results, new_states = [], {}
    for j, (cid, offset) in enumerate(zip(chunk_ids, offsets)):
        X, w = blocks[j], weights[j]
        if stateful:
            new_states[cid], out = chunk_fn(X, w, offset, previous.get(cid), *args)
        else:
            out = chunk_fn(X, w, offset, *args)
        results.append(out)
    try:
        moved = get_worker().address != planned_worker
    except ValueError:  # not on a worker (e.g. a synchronous scheduler)
        moved = True
    reduced = (to_host(combine_fn(results)), moved)
    return (new_states, reduced) if stateful else reduced


class LocalChunks:
    """All chunks of a :class:`PersistedData`, in one process: the same passes, run in a loop.

    A driver given this object instead of the persisted data runs unchanged inside one
    task (see :meth:`PersistedData.run_in_one_task`). The chunks are concatenated once
    (a copy of at most ``SINGLE_TASK_MAX_BYTES``), so a pass is one kernel call.
    """

    def __init__(self, blocks, weights, offsets, dtype, n_features):
        if len(blocks) > 1:  # one contiguous array: one kernel call per pass instead of one per chunk
            xp = get_namespace(blocks[0])
            blocks = [xp.concatenate(blocks)]
            weights = [None if weights[0] is None else xp.concatenate(weights)]
            offsets = (0,)
        self.blocks = blocks
        self.weights = weights
        self.offsets = offsets
        self.dtype = dtype
        self.n_features = n_features
        self.n_rows = int(blocks[0].shape[0])

    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (), fan_in: int = 8):
        """``combine_fn`` of ``chunk_fn(X_i, w_i, row_offset_i, *args)`` over the chunks (host memory)."""
        results = [chunk_fn(X, w, offset, *args) for X, w, offset in zip(self.blocks, self.weights, self.offsets)]
        return to_host(combine_fn(results))


def split_blocks(refs, has_weights: bool) -> tuple[list, list]:
    """The chunk blocks and their weights (None without weights) from :meth:`PersistedData.chunk_refs`' order."""
    step = 2 if has_weights else 1
    blocks = list(refs[::step])
    return blocks, (list(refs[1::step]) if has_weights else [None] * len(blocks))


def _run_in_one_task(fn, args, offsets, has_weights, dtype, n_features, *refs):
    """``fn(LocalChunks, *args)`` on a worker, with the warnings it raised: ``(result, warnings)``."""
    blocks, weights = split_blocks(refs, has_weights)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(LocalChunks(blocks, weights, offsets, dtype, n_features), *args)
    return result, [(str(w.message), w.category) for w in caught]


#: Input with fewer row chunks than the cluster has worker threads is split into pieces of
#: at least this many rows, one per thread, placed thread by thread (:func:`_spread_rows`).
SPREAD_MIN_ROWS = 8192


def _row_piece(block, start, stop):
    return block[start:stop].copy()  # a copy: a view would keep the whole parent chunk alive


def _spread_rows(client, X: da.Array, weights: da.Array | None):
    """``X`` (and ``weights``) persisted in about one row piece per worker thread, each on its own worker.

    Dask computes the pieces of a chunk where the chunk is, so a one-chunk input (a Parquet
    file read as one partition) would keep every pass on one worker. The pieces are placed
    round-robin over the worker threads (a preference: Dask may move them) and keep their
    lineage, so lost pieces are recomputed. Input that already has a chunk per thread, or
    too few rows, is returned as it is.
    """
    nthreads = client.nthreads()
    slots = [addr for addr in sorted(nthreads) for _ in range(int(nthreads[addr]))]
    rows = [int(r) for r in X.chunks[0]]
    n_rows = sum(rows)
    n_pieces = min(len(slots), n_rows // SPREAD_MIN_ROWS)
    if n_pieces <= len(rows):
        return X, weights
    token = uuid.uuid4().hex[:12]
    x_name, w_name = f"dkmeans-rows-{token}", f"dkmeans-weights-{token}"
    x_keys = [k[0] for k in X.__dask_keys__()]
    w_keys = list(weights.__dask_keys__()) if weights is not None else None
    layers, piece_rows, j = {}, [], 0
    for c, r in enumerate(rows):
        for part in np.array_split(np.arange(r), max(1, round(r * n_pieces / n_rows))):
            if not len(part):
                continue
            start, stop = int(part[0]), int(part[-1]) + 1
            annotations = {"workers": [slots[j % len(slots)]], "allow_other_workers": True}
            tasks = {(x_name, j, 0): Task((x_name, j, 0), _row_piece, TaskRef(x_keys[c]), start, stop)}
            if w_keys is not None:
                tasks[(w_name, j)] = Task((w_name, j), _row_piece, TaskRef(w_keys[c]), start, stop)
            layers[f"{x_name}-{j}"] = MaterializedLayer(tasks, annotations=annotations)
            piece_rows.append(stop - start)
            j += 1
    return _persist_layers(client, X, weights, layers, x_name, w_name, tuple(piece_rows))


def _persist_layers(client, X: da.Array, weights: da.Array | None, layers: dict, x_name: str, w_name: str,
                    row_chunks: tuple):
    """Persist the arrays named ``x_name`` (and ``w_name``) made by ``layers`` from ``X`` (and ``weights``).

    ``layers`` are the new chunks' layers (their worker annotations are the placement);
    they depend on the layers of ``X`` and ``weights``, so the new chunks keep their lineage.
    Graph optimisation would drop the annotations, so there is none.
    """
    inputs = [X] if weights is None else [X, weights]
    parents = set().union(*(a.__dask_layers__() for a in inputs))
    all_layers = {name: layer for a in inputs for name, layer in a.dask.layers.items()} | layers
    deps = {name: d for a in inputs for name, d in a.dask.dependencies.items()} | dict.fromkeys(layers, parents)
    graph = HighLevelGraph(all_layers, deps)
    X = da.Array(graph, x_name, (row_chunks, X.chunks[1]), meta=X._meta)
    if weights is None:
        return client.persist(X, optimize_graph=False), None
    weights = da.Array(graph, w_name, (row_chunks,), meta=weights._meta)
    return tuple(client.persist([X, weights], optimize_graph=False))


#: Input whose rows per worker thread exceed the even share by more than this fraction is
#: rebalanced by moving whole chunks (:func:`_balance_rows`).
BALANCE_TOLERANCE = 0.04


def plan_chunk_moves(rows: Sequence[int], holders: Sequence[str], nthreads: dict[str, int]) -> dict[int, str]:
    """Chunks to move, ``{chunk index: worker}``, so that each worker holds about its share of the rows.

    A worker's share is proportional to its threads. Greedy: while the most loaded worker
    (rows per thread) is above its share by more than :data:`BALANCE_TOLERANCE`, move to
    the least loaded worker the chunk that most lowers the larger of the two loads; stop
    when no move lowers it. Chunks on workers that are gone count as on no worker.
    """
    workers = sorted(nthreads)
    total_threads = sum(int(nthreads[w]) for w in workers)
    n_rows = sum(rows)
    if len(workers) < 2 or not n_rows:
        return {}
    share = {w: n_rows * int(nthreads[w]) / total_threads for w in workers}
    load = dict.fromkeys(workers, 0)
    owner = {}
    for c, (r, w) in enumerate(zip(rows, holders)):
        if w in load:
            load[w] += r
            owner[c] = w
    moves: dict[int, str] = {}
    for _ in range(len(rows)):
        ratio = {w: load[w] / share[w] for w in workers}
        src, dst = max(workers, key=ratio.get), min(workers, key=ratio.get)
        if ratio[src] <= 1 + BALANCE_TOLERANCE:
            break
        best, best_peak = None, ratio[src]
        for c, w in owner.items():
            if w == src:
                peak = max((load[src] - rows[c]) / share[src], (load[dst] + rows[c]) / share[dst])
                if peak < best_peak:
                    best, best_peak = c, peak
        if best is None:
            break
        load[src] -= rows[best]
        load[dst] += rows[best]
        owner[best] = moves[best] = dst
    return moves


def _balance_rows(client, X: da.Array, weights: da.Array | None):
    """Persisted ``X`` (and ``weights``) with whole chunks moved so that rows per worker thread are even.

    Dask places persisted chunks without regard to their rows; a worker with 9 of 16
    equal chunks makes every pass 12% slower than an even split, 11 of 16 37% slower. A
    moved chunk is copied once to its new worker under a new key (pinned there, with its
    lineage); the others keep their data under new keys that alias the old ones (no
    copy). Returns the arrays unchanged when they are balanced already.
    """
    x_keys = [k[0] for k in X.__dask_keys__()]
    who_has = client.who_has(futures_of(X))
    holders = [min(who_has.get(key, ()) or [""]) for key in x_keys]
    rows = [int(r) for r in X.chunks[0]]
    moves = plan_chunk_moves(rows, holders, client.nthreads())
    if not moves:
        return X, weights
    logger.info("moving %d of %d chunks (%d rows) so that each worker holds its share of the rows",
                len(moves), len(rows), sum(rows[c] for c in moves))
    token = uuid.uuid4().hex[:12]
    x_name, w_name = f"dkmeans-balanced-{token}", f"dkmeans-balanced-weights-{token}"
    w_keys = list(weights.__dask_keys__()) if weights is not None else None
    layers = {}
    for c, r in enumerate(rows):
        keys = [((x_name, c, 0), x_keys[c])] + ([((w_name, c), w_keys[c])] if w_keys is not None else [])
        if c in moves:
            tasks = {new: Task(new, _row_piece, TaskRef(old), 0, r) for new, old in keys}
        else:
            tasks = {new: Alias(new, old) for new, old in keys}
        where = moves.get(c, holders[c])
        annotations = {"workers": [where], "allow_other_workers": True} if where else None
        layers[f"{x_name}-{c}"] = MaterializedLayer(tasks, annotations=annotations)
    return _persist_layers(client, X, weights, layers, x_name, w_name, tuple(rows))


def _second(pair):
    return pair[1]


def _combine_task(combine_fn, *parts):
    return combine_fn([p[0] for p in parts]), any(p[1] for p in parts)


class ChunkState:
    """Per-chunk state kept on the workers between passes (one future per worker task).

    Returned by :meth:`PersistedData.map_reduce_stateful`; dropping it frees the memory.
    """

    def __init__(self, futures: dict[str, Any], chunk_owner: dict[int, str]):
        self._futures = futures  # key -> Future of a {chunk_id: state} dict
        self._chunk_owner = chunk_owner  # chunk_id -> key

    def keys_for(self, chunk_ids) -> list[str]:
        return sorted({self._chunk_owner[i] for i in chunk_ids})


class PersistedData:
    """A row-chunked Dask array (plus optional weights) persisted once on the cluster.

    Parameters
    ----------
    client : distributed.Client
    X : dask.array.Array, shape (n, d)
        Chunked along rows only (one chunk along columns).
    weights : dask.array.Array, shape (n,), optional
        Rechunked to match ``X``'s row chunks.
    """

    def __init__(self, client, X: da.Array, weights: da.Array | None = None):
        if X.numblocks[1] != 1:
            X = X.rechunk({1: -1})
        self.client = client
        if weights is not None:
            weights = weights.rechunk((X.chunks[0],))
            X, weights = client.persist([X, weights])
        else:
            X = client.persist(X)
        with client.as_current():  # wait() and compute_chunk_sizes() use the current client
            if any(np.isnan(c) for c in X.chunks[0]):
                X = X.compute_chunk_sizes()
                if weights is not None:
                    weights = da.Array(weights.dask, weights.name, (X.chunks[0],), weights.dtype)
            X, weights = _spread_rows(client, X, weights)
            # Placement is read from where the chunks are, so wait until they are there.
            wait(futures_of(X) + (futures_of(weights) if weights is not None else []))
            X, weights = _balance_rows(client, X, weights)
            futures = futures_of(X) + (futures_of(weights) if weights is not None else [])
            wait(futures)
        self.X = X
        self.weights = weights
        self.n_rows = int(sum(X.chunks[0]))
        self.n_features = int(X.shape[1])
        self.dtype = X.dtype
        self.chunk_rows = tuple(int(c) for c in X.chunks[0])
        self.offsets = tuple(int(o) for o in np.concatenate([[0], np.cumsum(self.chunk_rows)[:-1]]))
        self._x_keys = [k[0] for k in X.__dask_keys__()]
        self._w_keys = list(weights.__dask_keys__()) if weights is not None else None
        self._futures = futures
        #: the client's restart count now (``client.restart()`` increments it): see :func:`gather`
        self.generation = getattr(client, "generation", None)
        self._placement: list[tuple[str, list[int]]] | None = None

    @property
    def n_chunks(self) -> int:
        return len(self._x_keys)

    @property
    def has_weights(self) -> bool:
        return self._w_keys is not None

    def chunk_refs(self, chunk_ids) -> list:
        """Task references to these chunks: ``X_i``, or ``X_i, w_i`` pairs (see :func:`split_blocks`)."""
        refs = []
        for i in chunk_ids:
            refs.append(TaskRef(self._x_keys[i]))
            if self._w_keys is not None:
                refs.append(TaskRef(self._w_keys[i]))
        return refs

    # -- placement -----------------------------------------------------------------
    def placement(self) -> list[tuple[str, list[int]]]:
        """Task groups of one pass: ``(worker address, chunk indices)``, one per worker thread.

        Each worker's chunks (in chunk order) are split into as many contiguous groups as
        it has threads. Looked up once, and again after a pass in which a task ran away
        from its planned worker (see :meth:`map_reduce`), so steady-state iterations make
        no extra calls.
        """
        if self._placement is None:
            info = self.client.scheduler_info(n_workers=-1)["workers"]
            workers = sorted(info)
            who_has = self.client.who_has(self._futures)
            held: dict[str, list[int]] = {}
            for i, key in enumerate(self._x_keys):
                holders = sorted(who_has.get(key, ()) or ())
                # a chunk not in memory anywhere goes to any worker; Dask recomputes it
                addr = holders[0] if holders else (workers[i % len(workers)] if workers else "")
                held.setdefault(addr, []).append(i)
            groups = []
            for addr, chunk_ids in sorted(held.items()):
                threads = max(1, int(info.get(addr, {}).get("nthreads", 1)))
                groups += [(addr, [int(i) for i in part])
                           for part in np.array_split(np.asarray(chunk_ids), min(threads, len(chunk_ids)))]
            self._placement = groups
        return self._placement

    # -- one pass ------------------------------------------------------------------
    def build_pass_graph(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (),
                         fan_in: int = 8, state: ChunkState | None = None, stateful: bool = False):
        """The graph of one pass: ``(graph, result_keys, state_keys)``; see :meth:`map_reduce`."""
        token = uuid.uuid4().hex[:12]
        layers: dict[str, MaterializedLayer] = {}
        deps: dict[str, set] = {}
        current: list[str] = []
        state_keys: dict[str, list[int]] = {}
        for wi, (addr, chunk_ids) in enumerate(self.placement()):
            key = f"dkmeans-pass-{token}-w{wi}"
            refs = self.chunk_refs(chunk_ids)
            n_blocks = len(refs)
            if state is not None:
                refs.extend(TaskRef(k) for k in state.keys_for(chunk_ids))
            offsets = tuple(self.offsets[i] for i in chunk_ids)
            task = Task(key, _run_on_worker, chunk_fn, combine_fn, tuple(args), tuple(chunk_ids), offsets,
                        self.has_weights, addr, stateful, n_blocks, *refs)
            annotations = {"workers": [addr], "allow_other_workers": True} if addr else None
            layers[key] = MaterializedLayer({key: task}, annotations=annotations)
            deps[key] = set()
            if stateful:
                state_keys[key] = list(chunk_ids)
                rkey = f"dkmeans-result-{token}-w{wi}"
                layers[rkey] = MaterializedLayer({rkey: Task(rkey, _second, TaskRef(key))})
                deps[rkey] = {key}
                key = rkey
            current.append(key)
        level = 0
        while len(current) > fan_in:
            nxt = []
            for g in range(0, len(current), fan_in):
                group = current[g : g + fan_in]
                key = f"dkmeans-combine-{token}-{level}-{g // fan_in}"
                layers[key] = MaterializedLayer(
                    {key: Task(key, _combine_task, combine_fn, *[TaskRef(k) for k in group])}
                )
                deps[key] = set(group)
                nxt.append(key)
            current = nxt
            level += 1
        return HighLevelGraph(layers, deps), current, state_keys

    def _finish(self, parts, combine_fn):
        if any(moved for _, moved in parts):
            self._placement = None
        return combine_fn([value for value, _ in parts])

    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (), fan_in: int = 8):
        """Run ``chunk_fn(X_i, w_i, row_offset_i, *args)`` on every chunk; return the combined result.

        ``combine_fn(list_of_results)`` must be associative; it runs on each worker over
        its chunks (in chunk order), in the reduction tree, and once on the client.
        Results are copied to host memory on the workers.
        """
        graph, keys, _ = self.build_pass_graph(chunk_fn, combine_fn, args, fan_in)
        futures = self.client.get(graph, keys, sync=False)
        return self._finish(gather(self.client, futures, self._futures, self.generation), combine_fn)

    def map_reduce_stateful(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (),
                            state: ChunkState | None = None, fan_in: int = 8):
        """Like :meth:`map_reduce`, with per-chunk state that stays on the workers.

        ``chunk_fn(X_i, w_i, row_offset_i, state_i, *args) -> (new_state_i, result_i)``;
        ``state_i`` is None in the first pass. Returns ``(combined_result, new_state)``.
        """
        graph, keys, state_keys = self.build_pass_graph(chunk_fn, combine_fn, args, fan_in, state, stateful=True)
        futures = self.client.get(graph, list(state_keys) + keys, sync=False)
        state_futures = dict(zip(state_keys, futures[: len(state_keys)]))
        parts = gather(self.client, futures[len(state_keys):], self._futures, self.generation)
        owner = {cid: key for key, cids in state_keys.items() for cid in cids}
        return self._finish(parts, combine_fn), ChunkState(state_futures, owner)

    # -- a whole loop in one task --------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes of the persisted rows (and weights)."""
        per_row = self.n_features * self.dtype.itemsize + (8 if self._w_keys is not None else 0)
        return int(self.n_rows * per_row)

    def fits_one_task(self, work_per_row: int) -> bool:
        """Whether a loop whose passes cost ``work_per_row`` multiply-adds per row should run in one task.

        A pass spread over the workers costs one cluster round trip (about 10 ms with
        distributed) on top of its share of the work. When the whole pass takes one
        thread less than that (``n_rows * work_per_row`` at most Dask config
        ``dkmeans.single-task-work``, default 2e8 multiply-adds, about 10 ms) and the
        data is small (at most 128 MiB), running every pass inside one task on one
        worker is faster, whatever the number of workers. Set the config to 0 to
        always spread passes.
        """
        return self.n_rows * work_per_row <= single_task_work() and self.nbytes <= SINGLE_TASK_MAX_BYTES

    def run_in_one_task(self, fn: Callable, *args):
        """``fn(chunks, *args)`` in one task, where ``chunks`` is a :class:`LocalChunks`.

        The task runs on the worker holding the most rows (the other chunks are copied
        to it once, and Dask keeps the copies while the data is persisted). Warnings
        raised in the task are raised again here.
        """
        rows: dict[str, int] = {}
        for addr, chunk_ids in self.placement():
            rows[addr] = rows.get(addr, 0) + sum(self.chunk_rows[i] for i in chunk_ids)
        addr = max(sorted(rows), key=rows.get) if rows else ""
        refs = self.chunk_refs(range(self.n_chunks))
        key = f"dkmeans-loop-{uuid.uuid4().hex[:12]}"
        task = Task(key, _run_in_one_task, fn, tuple(args), self.offsets, self.has_weights, self.dtype, self.n_features, *refs)
        annotations = {"workers": [addr], "allow_other_workers": True} if addr else None
        graph = HighLevelGraph({key: MaterializedLayer({key: task}, annotations=annotations)}, {key: set()})
        future = self.client.get(graph, [key], sync=False)[0]
        result, caught = gather(self.client, future, self._futures, self.generation)
        for message, category in caught:
            warnings.warn(message, category, stacklevel=2)
        return result

    def run_spmd(self, fn: Callable, *args, on_progress: Callable[[dict], None] | None = None):
        """``fn(chunks, *args)`` on every worker thread at once (see :func:`dkmeans._spmd.run_spmd`)."""
        from dkmeans._spmd import run_spmd

        return run_spmd(self, fn, args, on_progress)

    def rows(self, indices) -> np.ndarray:
        """The rows at these global indices (only the chunks holding them are read)."""
        return to_host(gather(self.client, self.client.compute(self.X[np.asarray(indices)]), self._futures,
                                 self.generation))

    def release(self) -> None:
        """Drop the references that keep the persisted chunks in cluster memory."""
        self._futures = []
        self.X = None
        self.weights = None
