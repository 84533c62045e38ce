"""Where a fit's data lives: in the calling process, persisted on the workers, streamed from its source, or both.

The placement policy of the engine. ``dataset`` is the fit service's validated input, read
by its attributes only: ``array`` (a row-chunked Dask array), ``frame`` (the Dask DataFrame
it came from, or None), ``n_rows`` (None when unknown), ``n_features`` and ``local`` (the
in-memory rows, or None).
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np

from dkmeans import config
from dkmeans.engine import MemoryBudget, PersistedData, StreamedData, gather
from dkmeans.engine.client import (
    cpu_count,
    current_client,
    embedded_client,
    in_daemon_process,
    in_worker_task,
    local_worker_threads,
)
from dkmeans.engine.hybrid import HybridData
from dkmeans.engine.sources import ParquetSource, parquet_source
from dkmeans.engine.sparse_rows import is_sparse_array, sparse_row_bytes
from dkmeans.engine.streamed import rows_in_block
from dkmeans.kernels import DEFAULT_SCRATCH_BYTES
from dkmeans.kernels.common import centroid_bytes
from dkmeans.kernels.namespace import is_sparse

logger = logging.getLogger("dkmeans")


#: Out-of-core data keeps its leading chunks persisted when they hold at least this share
#: of the rows (and fit the persist budget); below it, streaming all of it is as fast.
HYBRID_MIN_SHARE = 0.2


#: Data of unknown length is estimated from its first partition times the partition count;
#: it is persisted only if this multiple of the estimate fits (partitions differ in size).
SIZE_ESTIMATE_MARGIN = 1.5


def _estimated_rows(client, X) -> int:
    """Rows of ``X`` estimated from its first chunk (read once) when its chunk lengths are unknown."""
    if not any(math.isnan(c) for c in X.chunks[0]):
        return int(sum(X.chunks[0]))
    first = X.blocks[0].map_blocks(rows_in_block, dtype=np.int64, chunks=((1,),), drop_axis=1)
    return int(gather(client, client.compute(first))[0]) * X.numblocks[0]


def _place(
    client,
    dataset,
    weights,
    out_of_core="auto",
    n_clusters: int = 0,
    allow_hybrid: bool = True,
    plan=None,
):
    """The data protocol object for this fit: persisted if it fits the memory budget, else streamed.

    Where the size is not in the metadata (a Dask DataFrame of unknown partition
    lengths, read from Parquet or CSV), it is estimated from the first partition (read
    once) with a margin of :data:`SIZE_ESTIMATE_MARGIN`; streamed data then counts its rows
    exactly in its first pass. The budget counts the memory the ``n_clusters`` centroids
    take on each worker during a pass (:func:`~dkmeans.kernels.common.centroid_bytes`).
    """
    mode = out_of_core
    budget = MemoryBudget.of(
        client,
        DEFAULT_SCRATCH_BYTES,
        centroid_bytes(n_clusters, dataset.n_features, dataset.array.dtype.itemsize),
        kernels=None
        if plan is None or is_sparse_array(dataset.array)
        else (plan, dataset.array.dtype, dataset.n_features),
    )
    overhead = 3.0 if dataset.frame is not None else 1.0  # Arrow -> pandas -> array while reading
    row_bytes = sparse_row_bytes(client, dataset.array)  # None: dense rows, n_features * itemsize
    # Parquet behind a dd.read_parquet frame: the engine reads it in row batches, row counts from the footers
    # (not with missing="skip": rows left out where Dask reads the partitions, which the footers do not count)
    own_reader = (
        dataset.frame is not None
        and not row_bytes
        and getattr(dataset, "missing", "error") == "error"
    )
    source = parquet_source(dataset.frame, dataset.array.dtype) if own_reader else None
    if source is not None:
        streamed = StreamedData(client, None, weights, budget, source=source)
        reading = (
            2 * streamed.read_cost.fixed * len(budget.limits)
        )  # what each worker's reads keep in pools
        if mode is False or (
            mode == "auto" and streamed.nbytes + reading <= budget.persist_bytes()
        ):
            return PersistedData(client, streamed.X, streamed.weights, budget)
    elif mode is False:
        return PersistedData(client, dataset.array, weights, budget, row_bytes=row_bytes)
    per_row = (row_bytes or dataset.n_features * dataset.array.dtype.itemsize) + (
        8 if weights is not None else 0
    )
    if mode == "auto" and source is None:
        known = dataset.n_rows is not None
        rows = (
            dataset.n_rows
            if known
            else _estimated_rows(client, dataset.array) * SIZE_ESTIMATE_MARGIN
        )
        if rows * per_row <= budget.persist_bytes():
            return PersistedData(client, dataset.array, weights, budget, row_bytes=row_bytes)
    if source is None:
        streamed = StreamedData(
            client, dataset.array, weights, budget, read_overhead=overhead, row_bytes=row_bytes
        )
    if streamed.chunk_rows is None:
        if (
            mode is True
            or _estimated_rows(client, dataset.array) * per_row * SIZE_ESTIMATE_MARGIN
            > HYBRID_MIN_SHARE**-1 * budget.persist_bytes()
        ):
            return streamed  # rows counted in the first pass: no pass of its own
    if mode == "auto" and streamed.nbytes <= budget.persist_bytes():
        return PersistedData(client, streamed.X, streamed.weights, budget, row_bytes=row_bytes)
    logger.info(
        "data of %.1f MiB exceeds the cluster's persist budget of %.1f MiB: reading it from its source "
        "in every pass (out-of-core)",
        streamed.nbytes / 2**20,
        budget.persist_bytes() / 2**20,
    )
    if mode == "auto" and allow_hybrid and source is None:  # files read in batches: all streamed
        # keep the leading chunks that fit persisted when they are a fair share of the data
        per_row = streamed.nbytes / max(1, streamed.n_rows)
        fits = np.cumsum(streamed.chunk_rows) * per_row <= budget.persist_bytes()
        n_head = int(np.sum(fits))
        head_rows = int(np.sum(streamed.chunk_rows[:n_head]))
        if n_head and head_rows >= HYBRID_MIN_SHARE * streamed.n_rows:
            X, w = streamed.X, streamed.weights
            head = PersistedData(
                client,
                X[:head_rows],
                None if w is None else w[:head_rows],
                budget,
                row_bytes=row_bytes,
            )
            tail = StreamedData(
                client,
                X[head_rows:],
                None if w is None else w[head_rows:],
                budget,
                read_overhead=overhead,
                first_row=head_rows,
                row_bytes=row_bytes,
            )
            return HybridData(head, tail)
    return streamed


def in_process_threads(dataset, weights) -> int | None:
    """Threads to fit in this process with, or None to fit on a cluster (Dask config ``dkmeans.in-process-bytes``).

    In-memory data (NumPy or pandas) of at most ``dkmeans.in-process-bytes`` is fitted
    where it is, in one thread: a cluster round trip per pass would cost more than the
    passes. Larger in-memory data is fitted here too, on a thread per core, when no Dask
    client exists (the user has set up no cluster) or when every worker of the current
    client runs on this machine (a ``LocalCluster``; on as many threads as its workers have,
    at most a thread per core): the rows are in this process already, a cluster on the same
    cores adds neither cores nor memory, and copying the rows to it costs more than it saves
    (2,000,000 x 16 float32 on a 2-core machine: the first fit 2.1 s on the workers, 1.0 s
    here). So is any in-memory data when no cluster is current and none can be started here
    (a daemonic process, such as a joblib/loky worker of ``GridSearchCV(n_jobs=2)``).
    ``dkmeans.in-process-bytes = 0`` sends all data to a cluster.
    """
    if dataset.local is None or (weights is not None and not isinstance(weights, np.ndarray)):
        return None
    limit = config.get("in-process-bytes")
    X = dataset.local
    nbytes = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes if is_sparse(X) else X.nbytes
    if nbytes <= limit:
        return 1
    cores = cpu_count()
    client = current_client()
    if client is None:
        if in_daemon_process():
            return 1
        return cores if limit > 0 else None
    if limit > 0 and not in_worker_task():
        threads = local_worker_threads(client)
        if threads is not None:
            return min(threads, cores)
    return None


def in_caller_rows(dataset, weights):
    """A small Dask array's or Parquet frame's rows (and weights) read once into this process, or None.

    A dense Dask array whose chunk lengths are known and whose bytes (rows, and weights) are
    at most ``dkmeans.in-process-bytes`` is computed once (on the current client, or Dask's
    default scheduler when none exists: no cluster is started for it) and fitted here like
    in-memory data: a cluster round trip per pass, the workers' preparation and their memory
    probe would cost more than the passes (20,000 x 5 float64, k = 5: 0.5-0.7 s a fit on a
    running client against a few hundredths in the caller). So is a plain ``dd.read_parquet``
    frame whose rows the files' footers say are that small (no data read to decide): its pieces
    are read here by the reader the workers use (:mod:`dkmeans.engine.sources`; the caller
    reached the files already to build the frame), and its labels stay on the frame's index.
    Results do not depend on where the rows are (keyed by the global row index). Returns
    ``(X, weights)`` as NumPy arrays, or None (:func:`in_caller_reader`): ``missing="skip"``,
    sparse or GPU rows, unknown lengths, other frames, or larger data stay on the cluster.
    """
    read = in_caller_reader(dataset, weights)
    return None if read is None else read()


def in_caller_reader(dataset, weights):
    """What :func:`in_caller_rows` reads, as a function of no argument, or None: decided from
    metadata only (the Parquet files' footers), nothing read."""
    if (
        not dataset.is_dask
        or dataset.local is not None
        or dataset.unfiltered is not None
        or getattr(dataset, "missing", "error") != "error"
        or dataset.on_device
        or is_sparse_array(dataset.array)
    ):
        return None
    if weights is not None and not isinstance(weights, np.ndarray) and not hasattr(weights, "dask"):
        return None
    limit = config.get("in-process-bytes")
    if limit <= 0 or in_worker_task():  # a fit inside a task waits on its cluster (fit_client)
        return None
    if dataset.frame is not None:
        return _parquet_reader(dataset, weights, limit)
    X = dataset.array
    if dataset.n_rows is None or any(math.isnan(c) for c in X.chunks[0]):
        return None
    if not isinstance(getattr(X, "_meta", None), np.ndarray):
        return None
    w_bytes = 8 * dataset.n_rows if weights is not None else 0
    if dataset.n_rows * dataset.n_features * X.dtype.itemsize + w_bytes > limit:
        return None
    return functools.partial(_computed_here, X, weights)


def _computed_here(X, weights):
    """``(X, weights)`` computed into this process (see :func:`in_caller_rows`)."""
    arrays = [X] if weights is None or isinstance(weights, np.ndarray) else [X, weights]
    client = current_client()
    client = embedded_client() if client is None else client
    if client is None:  # no cluster: Dask's own scheduler, as X.compute() would
        import dask

        computed = dask.compute(*arrays)
    else:  # its chunks may live there; lost workers are named, never waited for
        computed = gather(client, client.compute(arrays))
    rows, w = computed[0], (computed[1] if len(computed) > 1 else weights)
    rows = np.ascontiguousarray(rows)
    return rows, (None if w is None else np.ascontiguousarray(w, dtype=np.float64))


def _parquet_reader(dataset, weights, limit: int):
    """The reader of a small Parquet frame's rows (:func:`in_caller_rows`), or None."""
    if weights is not None:  # weights beside a frame: checked against its rows on the cluster
        return None
    source = parquet_source(dataset.frame, dataset.array.dtype, max_bytes=limit)
    if not isinstance(source, ParquetSource):
        return None

    def read():
        pieces = [source.read(p) for p in range(len(source.pieces))]
        return (pieces[0] if len(pieces) == 1 else np.concatenate(pieces)), None

    return read


def labels_like(labels, dataset):
    """Labels computed in this process for a Dask array input, as a Dask array chunked like its rows."""
    if (
        labels is None
        or not dataset.is_dask
        or hasattr(labels, "dask")
        or dataset.frame is not None
    ):
        return labels
    import dask.array as da

    return da.from_array(np.asarray(labels), chunks=(dataset.array.chunks[0],))


def place_data(
    client,
    dataset,
    weights,
    out_of_core="auto",
    n_clusters: int = 0,
    allow_hybrid: bool = True,
    plan=None,
):
    """The data protocol object for this fit: persisted if it fits the memory budget, else streamed.

    Where the size is not in the metadata (a Dask DataFrame of unknown partition lengths,
    read from Parquet or CSV), it is estimated from the first partition (read once) with a
    margin of :data:`SIZE_ESTIMATE_MARGIN`; streamed data then counts its rows exactly in its
    first pass. The budget counts the memory the ``n_clusters`` centroids take on each worker
    during a pass and the fit's compiled kernels.

    ``plan``: the fit's :class:`~dkmeans.kernels.plans.KernelPlan`. The workers are prepared for
    it (:func:`dkmeans.engine.memory.prepare_worker`), and every task of the data's passes runs
    its kernels under ``data.plan``: ``plan``, or its NumPy code where loading the compiled
    kernels would take a worker past its pause threshold (:meth:`MemoryBudget.of
    <dkmeans.engine.memory.MemoryBudget.of>`). None: the tasks' kernels follow the workers' own config.
    """
    data = _place(client, dataset, weights, out_of_core, n_clusters, allow_hybrid, plan)
    budget = data.tail.budget if isinstance(data, HybridData) else data.budget
    data.plan = budget.plan if budget.plan is not None else plan
    if isinstance(data, HybridData):
        data.head.plan = data.tail.plan = data.plan
    return data


def watch_passes(data, callback) -> None:
    """``callback`` gets the progress within each pass over ``data`` read from its source
    (out-of-core, or the streamed part of hybrid data): see
    :meth:`~dkmeans.engine.streamed.StreamedData.watch_passes`. Data kept in memory makes its
    passes in moments: nothing is watched."""
    if callback is not None and isinstance(data, (StreamedData, HybridData)):
        data.watch_passes(callback)


__all__ = [
    "HYBRID_MIN_SHARE",
    "SIZE_ESTIMATE_MARGIN",
    "in_caller_rows",
    "in_process_threads",
    "labels_like",
    "place_data",
    "watch_passes",
]
