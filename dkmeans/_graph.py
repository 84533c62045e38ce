"""One pass over persisted, row-chunked data: one graph, one task per worker.

:class:`PersistedData` holds a row-chunked Dask array (and optional weights) that is
persisted once on the workers. :meth:`PersistedData.map_reduce` runs a chunk function
on every chunk *where it lives*: the graph has one task per worker that loops over the
chunks that worker holds and combines their results, then a tree of combine tasks
(fan-in ``fan_in``) and a last combine on the client. Tasks per pass are therefore
O(workers), not O(chunks); only the small per-worker results cross the network.

Worker tasks are placed with ``workers=[addr], allow_other_workers=True``: if a worker
has died, the task runs elsewhere and Dask recomputes the chunks it needs from the
persisted graph. The chunk-to-worker map is refreshed after a pass in which a task did
not run where it was planned.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Sequence

import dask.array as da
import numpy as np
from dask._task_spec import Task, TaskRef
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed import futures_of, get_worker, wait

from dkmeans.backend import to_host


def _run_on_worker(chunk_fn, combine_fn, args, offsets, has_weights, planned_worker, *blocks):
    """Apply ``chunk_fn`` to each local chunk and combine the results (runs on a worker).

    Returns ``(result, moved)``: ``moved`` is True when the task ran on another worker
    than planned (a worker was lost, or data moved), so the driver refreshes placement.
    """
    step = 2 if has_weights else 1
    results = []
    for i, offset in enumerate(offsets):
        X = blocks[i * step]
        w = blocks[i * step + 1] if has_weights else None
        results.append(chunk_fn(X, w, offset, *args))
    try:
        moved = get_worker().address != planned_worker
    except ValueError:  # not on a worker (e.g. a synchronous scheduler)
        moved = True
    return to_host(combine_fn(results)), moved


def _combine_task(combine_fn, *parts):
    return combine_fn([p[0] for p in parts]), any(p[1] for p in parts)


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
            futures = futures_of(X) + (futures_of(weights) if weights is not None else [])
            # Placement is read from where the chunks are, so wait until they are there.
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
        self._placement: dict[str, list[int]] | None = None

    @property
    def n_chunks(self) -> int:
        return len(self._x_keys)

    # -- placement -----------------------------------------------------------------
    def _current_workers(self) -> frozenset:
        return frozenset(self.client.scheduler_info(n_workers=-1)["workers"])

    def placement(self) -> dict[str, list[int]]:
        """Map worker address -> indices of the chunks it holds.

        Looked up once, and again after a pass in which a task ran away from its planned
        worker (see :meth:`map_reduce`), so steady-state iterations make no extra calls.
        """
        if self._placement is None:
            workers = self._current_workers()
            who_has = self.client.who_has(self._futures)
            groups: dict[str, list[int]] = {}
            for i, key in enumerate(self._x_keys):
                holders = sorted(who_has.get(key, ()) or ())
                # a chunk not in memory anywhere goes to any worker; Dask recomputes it
                addr = holders[0] if holders else (sorted(workers)[i % len(workers)] if workers else "")
                groups.setdefault(addr, []).append(i)
            self._placement = groups
        return self._placement

    # -- one pass ------------------------------------------------------------------
    def build_pass_graph(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (), fan_in: int = 8):
        """The graph of one pass: ``(graph, output_keys)``; see :meth:`map_reduce`."""
        token = uuid.uuid4().hex[:12]
        layers: dict[str, MaterializedLayer] = {}
        deps: dict[str, set] = {}
        current: list[str] = []
        has_w = self._w_keys is not None
        for wi, (addr, chunk_ids) in enumerate(sorted(self.placement().items())):
            key = f"dkmeans-pass-{token}-w{wi}"
            refs = []
            for i in chunk_ids:
                refs.append(TaskRef(self._x_keys[i]))
                if has_w:
                    refs.append(TaskRef(self._w_keys[i]))
            offsets = tuple(self.offsets[i] for i in chunk_ids)
            task = Task(key, _run_on_worker, chunk_fn, combine_fn, tuple(args), offsets, has_w, addr, *refs)
            annotations = {"workers": [addr], "allow_other_workers": True} if addr else None
            layers[key] = MaterializedLayer({key: task}, annotations=annotations)
            deps[key] = set()
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
        return HighLevelGraph(layers, deps), current

    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (), fan_in: int = 8):
        """Run ``chunk_fn(X_i, w_i, row_offset_i, *args)`` on every chunk; return the combined result.

        ``combine_fn(list_of_results)`` must be associative; it runs on each worker over
        its chunks (in chunk order), in the reduction tree, and once on the client.
        Results are copied to host memory on the workers.
        """
        graph, keys = self.build_pass_graph(chunk_fn, combine_fn, args, fan_in)
        parts = self.client.get(graph, keys, sync=True)
        if any(moved for _, moved in parts):
            self._placement = None
        return combine_fn([value for value, _ in parts])

    def release(self) -> None:
        """Drop the references that keep the persisted chunks in cluster memory."""
        self._futures = []
        self.X = None
        self.weights = None
