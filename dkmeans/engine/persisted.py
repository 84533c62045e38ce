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

A pass takes each worker's chunks in groups that fit its memory budget
(:mod:`dkmeans.engine.memory`), one task per group, so chunks that Dask spilled to disk
come back one group at a time.

:meth:`PersistedData.run_loop` runs a driver's loop where it is fastest: a loop whose
passes are too small to gain from spreading (less work than the cluster round trip, see
:meth:`PersistedData.fits_one_task`) runs whole inside one task, which hands the driver a
:class:`~dkmeans.engine.local.LocalChunks`; a larger one SPMD, one task per worker thread
for many passes (:mod:`dkmeans.engine.spmd`), when each rank's chunks fit its budget;
otherwise one graph per pass.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import Task, TaskRef
from distributed import futures_of, get_worker, wait

from dkmeans import config
from dkmeans.engine import kept, spmd
from dkmeans.engine.balance import balance_rows, chunk_holders, spread_rows
from dkmeans.engine.device import beside_rows
from dkmeans.engine.futures import cancel_quietly, gather
from dkmeans.engine.health import note_interrupt
from dkmeans.engine.local import reraise_warnings, run_in_one_task, split_blocks
from dkmeans.engine.memory import MemoryBudget, check_chunks_fit, group_by_bytes
from dkmeans.engine.passes import (
    add_reduction_tree,
    first_chunk,
    fold_chunks,
    submitting_own_graph,
    task_args,
)
from dkmeans.engine.protocol import PrunableData
from dkmeans.engine.spmd import SpmdUnavailable, spmd_enabled
from dkmeans.engine.workers import worker_info
from dkmeans.kernels.namespace import to_host

logger = logging.getLogger("dkmeans")

#: Data larger than this is never gathered onto one worker for a single-task loop.
SINGLE_TASK_MAX_BYTES = 128 * 2**20


def single_task_work() -> float:
    """The per-pass work below which a loop runs in one task (Dask config ``dkmeans.single-task-work``)."""
    return config.get("single-task-work")


def _run_on_worker(
    chunk_fn,
    combine_fn,
    args,
    chunk_ids,
    offsets,
    has_weights,
    planned_worker,
    stateful,
    n_blocks,
    *refs,
):
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


def _pick_state(task_output, cid, name):
    return task_output[0][cid][name]


def _second(pair):
    return pair[1]


class ChunkState:
    """Per-chunk state kept on the workers between passes (one future per worker task).

    Returned by :meth:`PersistedData.map_reduce_stateful`; dropping it frees the memory.
    """

    def __init__(self, futures: dict[str, Any], chunk_owner: dict[int, str]):
        self._futures = futures  # key -> Future of a {chunk_id: state} dict
        self._chunk_owner = chunk_owner  # chunk_id -> key

    def keys_for(self, chunk_ids) -> list[str]:
        return sorted({self._chunk_owner[i] for i in chunk_ids})


class PersistedData(PrunableData):
    """A row-chunked Dask array (plus optional weights) persisted once on the cluster.

    Parameters
    ----------
    client : distributed.Client
    X : dask.array.Array, shape (n, d)
        Chunked along rows only (one chunk along columns).
    weights : dask.array.Array, shape (n,), optional
        Rechunked to match ``X``'s row chunks.
    budget : MemoryBudget, optional
        The cluster's memory budget (default: read from the scheduler). A pass takes each
        worker's chunks in groups that fit its task budget.
    first_row : int
        Global index of the first row (when these rows are the head of larger data).
    row_bytes : float, optional
        Bytes one row takes in memory (default ``n_features * itemsize``: dense rows); for
        ``scipy.sparse`` chunks, the caller's estimate of their stored bytes per row.

    Attributes
    ----------
    passes : int
        Passes made over the data so far (also those inside one-task and SPMD loops).
    loop_modes : list of str
        How each :meth:`run_loop` ran (``"one-task"``, ``"spmd"`` or ``"graph"``).
    """

    kind = "persisted"
    in_memory = True

    def __init__(
        self,
        client,
        X: da.Array,
        weights: da.Array | None = None,
        budget: MemoryBudget | None = None,
        first_row: int = 0,
        row_bytes: float | None = None,
    ):
        if X.numblocks[1] != 1:
            X = X.rechunk({1: -1})
        self.client = client
        budget = budget if budget is not None else MemoryBudget.of(client)
        self.row_bytes = float(row_bytes or X.shape[1] * X.dtype.itemsize)
        if not any(np.isnan(c) for c in X.chunks[0]):  # else checked by the caller's counting pass
            per_row = self.row_bytes + (8 if weights is not None else 0)
            check_chunks_fit([r * per_row for r in X.chunks[0]], budget)
        if weights is not None:
            weights = beside_rows(weights.rechunk((X.chunks[0],)), X)
            with submitting_own_graph():
                X, weights = client.persist([X, weights])
        else:
            # In-memory input travels inside the graph, so that lost chunks can be recomputed;
            # distributed's advice to scatter it instead would make them unrecoverable.
            with submitting_own_graph():
                X = client.persist(X)
        try:
            with client.as_current():  # wait() and compute_chunk_sizes() use the current client
                if any(np.isnan(c) for c in X.chunks[0]):
                    X = X.compute_chunk_sizes()
                    if weights is not None:
                        weights = da.Array(
                            weights.dask, weights.name, (X.chunks[0],), weights.dtype
                        )
                X, weights = spread_rows(client, X, weights)
                # Placement is read from where the chunks are, so wait until they are there.
                wait(futures_of(X) + (futures_of(weights) if weights is not None else []))
                X, weights = balance_rows(client, X, weights)
                futures = futures_of(X) + (futures_of(weights) if weights is not None else [])
                wait(futures)
        except KeyboardInterrupt:  # interrupted while persisting: the chunks leave the cluster now
            note_interrupt()
            cancel_quietly(
                client, futures_of(X) + (futures_of(weights) if weights is not None else [])
            )
            raise
        self.X = X
        self.weights = weights
        self.n_rows = int(sum(X.chunks[0]))
        self.n_features = int(X.shape[1])
        self.dtype = X.dtype
        self.chunk_rows = tuple(int(c) for c in X.chunks[0])
        self.offsets = tuple(
            int(first_row + o) for o in np.concatenate([[0], np.cumsum(self.chunk_rows)[:-1]])
        )
        self.first_row = int(first_row)
        self._x_keys = [k[0] for k in X.__dask_keys__()]
        self._w_keys = list(weights.__dask_keys__()) if weights is not None else None
        self._futures = futures
        #: the client's restart count now (``client.restart()`` increments it): see :func:`gather`
        self.generation = getattr(client, "generation", None)
        self._placement: list[tuple[str, list[int]]] | None = None
        self.budget = budget
        self.passes = 0
        self.loop_modes: list[str] = []
        self._spmd_failed = False
        self._kept: dict[
            str, tuple
        ] = {}  # keep_state's states of graph-mode loops: key -> (tag, ChunkState)
        self._on_progress = None

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

        Each chunk is read on its home (:func:`~dkmeans.engine.balance.chunk_holders`: copies
        made since an earlier fit move no chunk to another group, so sums combine in the same
        order); each worker's chunks (in chunk order) are split into as many contiguous groups as
        it has threads. Looked up once, and again after a pass in which a task ran away
        from its planned worker (see :meth:`map_reduce`), so steady-state iterations make
        no extra calls.
        """
        if self._placement is None:
            info = worker_info(self.client)
            workers = sorted(info)
            who_has = self.client.who_has(self._futures)
            held: dict[str, list[int]] = {}
            # a chunk not in memory anywhere goes to any worker; Dask recomputes it
            for i, addr in enumerate(chunk_holders(who_has, self._x_keys, workers)):
                held.setdefault(addr, []).append(i)
            groups = []
            for addr, chunk_ids in sorted(held.items()):
                threads = max(1, int(info.get(addr, {}).get("nthreads", 1)))
                groups += [
                    (addr, [int(i) for i in part])
                    for part in np.array_split(np.asarray(chunk_ids), min(threads, len(chunk_ids)))
                ]
            self._placement = groups
        return self._placement

    def pass_groups(self) -> list[tuple[str, list[int]]]:
        """The tasks of one pass: :meth:`placement`'s groups split so that each fits its worker's task budget."""
        per_row = self.nbytes / max(1, self.n_rows)
        chunk_bytes = [r * per_row for r in self.chunk_rows]
        budgets = self.budget.per_worker()
        return [
            (addr, part)
            for addr, chunk_ids in self.placement()
            for part in group_by_bytes(
                chunk_ids, chunk_bytes, budgets.get(addr, self.budget.task_bytes())
            )
        ]

    # -- one pass ------------------------------------------------------------------
    def build_pass_graph(
        self,
        chunk_fn: Callable,
        combine_fn: Callable,
        args: Sequence[Any] = (),
        fan_in: int = 8,
        state: ChunkState | None = None,
        stateful: bool = False,
    ):
        """The graph of one pass: ``(graph, result_keys, state_keys)``; see :meth:`map_reduce`."""
        chunk_fn = self._planned(chunk_fn)
        token = uuid.uuid4().hex[:12]
        layers: dict[str, MaterializedLayer] = {}
        deps: dict[str, set] = {}
        current: list[str] = []
        state_keys: dict[str, list[int]] = {}
        shared, needs = task_args(args, token, layers, deps)
        for wi, (addr, chunk_ids) in enumerate(self.pass_groups()):
            key = f"dkmeans-pass-{token}-w{wi}"
            refs = self.chunk_refs(chunk_ids)
            n_blocks = len(refs)
            if state is not None:
                refs.extend(TaskRef(k) for k in state.keys_for(chunk_ids))
            offsets = tuple(self.offsets[i] for i in chunk_ids)
            task = Task(
                key,
                _run_on_worker,
                chunk_fn,
                combine_fn,
                shared,
                tuple(chunk_ids),
                offsets,
                self.has_weights,
                addr,
                stateful,
                n_blocks,
                *refs,
            )
            annotations = {"workers": [addr], "allow_other_workers": True} if addr else None
            layers[key] = MaterializedLayer({key: task}, annotations=annotations)
            deps[key] = set(needs)
            if stateful:
                state_keys[key] = list(chunk_ids)
                rkey = f"dkmeans-result-{token}-w{wi}"
                layers[rkey] = MaterializedLayer({rkey: Task(rkey, _second, TaskRef(key))})
                deps[rkey] = {key}
                key = rkey
            current.append(key)
        current = add_reduction_tree(layers, deps, current, combine_fn, token, fan_in)
        return HighLevelGraph(layers, deps), current, state_keys

    def _finish(self, parts, combine_fn):
        if any(moved for _, moved in parts):
            self._placement = None
        return combine_fn([value for value, _ in parts])

    def map_reduce(
        self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (), fan_in: int = 8
    ):
        """Run ``chunk_fn(X_i, w_i, row_offset_i, *args)`` on every chunk; return the combined result.

        ``combine_fn(list_of_results)`` must be associative; it runs on each worker over
        its chunks (in chunk order), in the reduction tree, and once on the client.
        Results are copied to host memory on the workers.
        """
        graph, keys, _ = self.build_pass_graph(chunk_fn, combine_fn, args, fan_in)
        self.passes += 1
        with submitting_own_graph():
            futures = self.client.get(graph, keys, sync=False)
        return self._finish(
            gather(self.client, futures, self._futures, self.generation), combine_fn
        )

    def map_reduce_stateful(
        self,
        chunk_fn: Callable,
        combine_fn: Callable,
        args: Sequence[Any] = (),
        state: ChunkState | None = None,
        fan_in: int = 8,
    ):
        """Like :meth:`map_reduce`, with per-chunk state that stays on the workers.

        ``chunk_fn(X_i, w_i, row_offset_i, state_i, *args) -> (new_state_i, result_i)``;
        ``state_i`` is None in the first pass. Returns ``(combined_result, new_state)``.
        """
        graph, keys, state_keys = self.build_pass_graph(
            chunk_fn, combine_fn, args, fan_in, state, stateful=True
        )
        self.passes += 1
        with submitting_own_graph():
            futures = self.client.get(graph, list(state_keys) + keys, sync=False)
        state_futures = dict(zip(state_keys, futures[: len(state_keys)]))
        parts = gather(self.client, futures[len(state_keys) :], self._futures, self.generation)
        owner = {cid: key for key, cids in state_keys.items() for cid in cids}
        return self._finish(parts, combine_fn), ChunkState(state_futures, owner)

    # -- a whole loop in one task --------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes of the persisted rows (and weights)."""
        per_row = self.row_bytes + (8 if self._w_keys is not None else 0)
        return int(self.n_rows * per_row)

    def keep_state(self, key: str, tag, state) -> None:
        """See :meth:`dkmeans.engine.protocol.PrunableData.keep_state`: a graph-mode loop's
        :class:`ChunkState` stays referenced here (its futures on the workers)."""
        if state is not None:
            self._kept[key] = (tag, state)

    def kept_state(self, key: str, tag):
        """See :meth:`dkmeans.engine.protocol.PrunableData.kept_state`."""
        entry = self._kept.pop(key, None)
        return entry[1] if entry is not None and entry[0] == tag else None

    def drop_state(self, key: str) -> None:
        """See :meth:`dkmeans.engine.protocol.PrunableData.drop_state`: here, and in every worker's
        registry (what loops run in one task or SPMD kept, :mod:`dkmeans.engine.kept`)."""
        self._kept.pop(key, None)
        if self.client is None:
            return
        try:
            self.client.run(kept.drop, key, on_error="ignore")
        except (
            Exception
        ) as exc:  # a closed client: the workers' registries drop it later (MAX_KEYS)
            logger.debug("could not drop kept state %s: %s", key, exc)

    def row_state_bytes(self) -> float:
        """What the persist budget leaves per row beside the persisted rows (see the protocol)."""
        return max(0.0, self.budget.persist_bytes() - self.nbytes) / max(1, self.n_rows)

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
        return (
            self.n_rows * work_per_row <= single_task_work()
            and self.nbytes <= SINGLE_TASK_MAX_BYTES
        )

    def _run_in_one_task(self, fn: Callable, args):
        """``fn(LocalChunks, *args)`` in one task: ``(result, passes)``.

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
        layers, deps = {}, {}
        shared, needs = task_args(args, key, layers, deps)
        task = Task(
            key,
            run_in_one_task,
            fn,
            shared,
            self.offsets,
            self.has_weights,
            self.dtype,
            self.n_features,
            *refs,
        )
        annotations = {"workers": [addr], "allow_other_workers": True} if addr else None
        layers[key] = MaterializedLayer({key: task}, annotations=annotations)
        deps[key] = set(needs)
        with submitting_own_graph():
            future = self.client.get(HighLevelGraph(layers, deps), [key], sync=False)[0]
        result, passes, caught = gather(self.client, future, self._futures, self.generation)
        reraise_warnings(caught)
        return result, passes

    def loop_mode(self, work_per_row: float) -> str:
        """How :meth:`run_loop` would run a loop: ``"one-task"``, ``"spmd"`` or ``"graph"``."""
        if self.fits_one_task(work_per_row):
            return "one-task"
        groups = self.placement()
        if not self._spmd_failed and spmd_enabled(len(groups)) and self.fits_spmd():
            return "spmd"
        return "graph"

    def fits_spmd(self) -> bool:
        """Whether every rank's chunks fit its worker's memory budget at once (an SPMD rank holds them all)."""
        per_row = self.nbytes / max(1, self.n_rows)
        budgets = self.budget.per_worker()
        return all(
            sum(self.chunk_rows[i] for i in chunk_ids) * per_row <= budgets.get(addr, float("inf"))
            for addr, chunk_ids in self.placement()
        )

    def run_loop(
        self,
        fn: Callable,
        args: Sequence[Any] = (),
        *,
        work_per_row: float = 0.0,
        on_progress: Callable[[dict], None] | None = None,
    ):
        """``fn(data, *args)`` in one task, SPMD, or here with one graph per pass (see :meth:`loop_mode`).

        A block whose SPMD ranks cannot run together runs again here, one graph per pass
        (Dask makes that fault tolerant), and so do later loops on this data.
        """
        mode = self.loop_mode(work_per_row)
        if (
            mode != "graph"
        ):  # the loop runs in tasks: its kernels there under the plan (here, passes carry it)
            fn = self._planned(fn)
        if mode == "spmd":
            try:
                result, passes = spmd.run_spmd(self, fn, args, on_progress)
            except SpmdUnavailable as exc:
                logger.info("SPMD loop failed (%s); running it one graph per pass", exc)
                self._spmd_failed, mode = True, "graph"
        elif mode == "one-task":
            result, passes = self._run_in_one_task(fn, args)
        if mode == "graph":
            self._on_progress = on_progress
            try:
                return fn(self, *args)
            finally:
                self._on_progress = None
                self.loop_modes.append(mode)
        self.passes += passes
        self.loop_modes.append(mode)
        return result

    def report(self, record: dict) -> bool:
        """See :meth:`dkmeans.engine.protocol.ChunkedData.report` (True: asked to stop)."""
        return self._on_progress is not None and bool(self._on_progress(record))

    def rows(self, indices) -> np.ndarray:
        """The rows at these global indices (only the chunks holding them are read)."""
        local = np.asarray(indices, dtype=np.int64) - self.first_row
        return to_host(
            gather(self.client, self.client.compute(self.X[local]), self._futures, self.generation)
        )

    def fold(
        self,
        chunk_fn: Callable,
        state: Any,
        args: Sequence[Any] = (),
        *,
        stop: Callable[[Any], bool] | None = None,
        on_state: Callable[[Any], None] | None = None,
        start_row: int = 0,
        window: int = 16,
    ):
        """A sequential pass over the persisted chunks in row order (the state moves, the chunks stay)."""
        state = fold_chunks(
            self.client,
            self.n_chunks,
            self.chunk_refs_of,
            self.offsets,
            self._planned(chunk_fn),
            state,
            args,
            window=window,
            stop=stop,
            on_state=on_state,
            first=first_chunk(self.offsets, self.chunk_rows, start_row),
            gather_fn=lambda f: gather(self.client, f, self._futures, self.generation),
        )
        self.passes += 1
        return state

    def chunk_refs_of(self, i: int) -> list:
        """References to chunk ``i`` and its weights (a fold step's inputs)."""
        refs = self.chunk_refs([i])
        return refs if self.has_weights else refs + [None]

    def state_column(self, state: ChunkState, name: str) -> da.Array:
        """The per-row array ``name`` of the chunk states, as a persisted Dask array with the data's row chunks."""
        token = f"dkmeans-state-{name}-{uuid.uuid4().hex[:12]}"
        keys = [f"{token}-{cid}" for cid in range(self.n_chunks)]
        graph = {
            key: Task(key, _pick_state, TaskRef(state.keys_for([cid])[0]), cid, name)
            for cid, key in enumerate(keys)
        }
        futures = self.client.get(
            HighLevelGraph({token: MaterializedLayer(graph)}, {token: set()}), keys, sync=False
        )
        first = (
            gather(self.client, futures[0], self._futures, self.generation)
            if futures
            else np.zeros(0)
        )
        blocks = [
            da.from_delayed(f, shape=(n,), dtype=first.dtype, meta=first[:0])
            for f, n in zip(futures, self.chunk_rows)
        ]
        return (
            self.client.persist(da.concatenate(blocks))
            if blocks
            else da.zeros((0,), dtype=np.int32)
        )

    def labelled_pass(
        self,
        block_fn: Callable,
        args: Sequence[Any] = (),
        *,
        keep_labels: bool = True,
        per_label: int = 0,
    ):
        """See :meth:`dkmeans.engine.protocol.ChunkedData.labelled_pass`: labels persisted beside the rows."""
        from dkmeans.engine.rowwise import labelled_pass

        self.passes += 1
        return labelled_pass(
            self.client,
            self.X,
            self._planned(block_fn),
            args,
            self.weights,
            keep="persist" if keep_labels else "none",
            generation=self.generation,
            per_label=per_label,
        )

    def release(self) -> None:
        """Drop the references that keep the persisted chunks in cluster memory."""
        self._futures = []
        self.X = None
        self.weights = None
