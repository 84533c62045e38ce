"""Row-wise passes over Dask collections: a per-chunk function mapped over an array's row
blocks or a DataFrame's partitions (lazy), and the one pass that labels rows and sums a value.

The engine's half of inference (:mod:`dkmeans.fit.inference` says what to compute): it
knows how Dask maps, persists and gathers, not what the function computes. Chunks of CuPy
give CuPy results (the output's meta follows the input's namespace).
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
from dask.array.utils import meta_from_array
from distributed import futures_of

from dkmeans.engine.futures import gather
from dkmeans.engine.passes import submitting_own_graph
from dkmeans.kernels.namespace import get_namespace, is_sparse


def is_dask_array(X) -> bool:
    return isinstance(X, da.Array)


#: Target size of one chunk when an in-memory array is split for the cluster.
CHUNK_BYTES = 64 * 2**20


def chunked_rows(X: np.ndarray, n_workers: int = 1) -> da.Array:
    """Split an in-memory array into row chunks of about 64 MiB (at least ``n_workers``).

    Fewer chunks than the cluster has threads are split further where they are persisted
    (:mod:`dkmeans.engine.placement`), so the cluster need not be known here. A
    ``scipy.sparse`` CSR matrix gives CSR chunks (sized by their stored bytes).
    """
    n = X.shape[0]
    sparse = is_sparse(X)
    nbytes = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes if sparse else X.nbytes
    n_chunks = max(n_workers, math.ceil(nbytes / CHUNK_BYTES))
    rows = max(1, math.ceil(n / max(1, min(n, n_chunks))))
    if sparse:  # from_array would otherwise call np.asarray on every chunk
        return da.from_array(X, chunks=(rows, X.shape[1]), asarray=False, meta=X[:0])
    return da.from_array(X, chunks=(rows, X.shape[1]))


def weight_stats(w: da.Array) -> tuple[float, float, float]:
    """Whether a Dask array of weights holds NaN, its minimum and its sum, in one computation."""
    return tuple(float(v) for v in da.stack([da.isnan(w).any(), w.min(), w.sum()]).compute())


def map_row_blocks(X: da.Array, fn, *args, dtype, width: int | None = None) -> da.Array:
    """``fn(block, *args)`` for every row block of ``X``, lazily: shape ``(n,)``, or ``(n, width)``."""
    xp = get_namespace(meta_from_array(X))
    if width is None:
        return X.map_blocks(fn, *args, dtype=dtype, drop_axis=1, meta=xp.empty((0,), dtype))
    return X.map_blocks(fn, *args, dtype=dtype, chunks=(X.chunks[0], (width,)), meta=xp.empty((0, width), dtype))


def map_rows_like(X: da.Array, fn) -> da.Array:
    """``fn(block)`` for every row block of ``X``, lazily, where ``fn`` keeps a block's shape and type."""
    return X.map_blocks(fn, dtype=X.dtype, meta=meta_from_array(X))


def map_partitions(df, fn, *args, meta):
    """``fn(partition, *args)`` for every partition of a Dask DataFrame, lazily (its index kept)."""
    return df.map_partitions(fn, *args, meta=meta)


def index_meta(df):
    """An empty index of the DataFrame's index type, for the meta of index-aligned results."""
    return df._meta.index  # private: see the README's table of private uses


def as_array(df, *, lengths: bool = False) -> da.Array:
    """The rows of a Dask DataFrame as a Dask array (``lengths``: partition lengths computed)."""
    return df.to_dask_array(lengths=True if lengths else None)


def row_weights(weights, X: da.Array) -> da.Array:
    """``weights`` (NumPy or Dask, one per row) chunked like ``X``'s rows."""
    return da.asarray(weights).rechunk((X.chunks[0],))


def weights_beside(weights, X: da.Array):
    """In-memory ``weights`` as a Dask array chunked like ``X``'s rows (one chunk while those are unknown).

    Dask weights are returned as they are: the data they are placed with aligns them.
    """
    if not isinstance(weights, np.ndarray):
        return weights
    known = not any(np.isnan(c) for c in X.chunks[0])
    return da.from_array(weights, chunks=X.chunks[0] if known else -1)


def sum_on_cluster(client, values: da.Array, weights=None) -> float:
    """The sum of a lazy 1-D array (times ``weights``), computed on the cluster."""
    if weights is not None:
        values = values * row_weights(weights, values)
    total = values.sum()  # no client: Dask's current scheduler
    return float(total.compute() if client is None else client.compute(total, sync=True))


def labelled_pass(client, X: da.Array, block_fn, args=(), weights=None, *, keep: str = "persist",
                  generation: int | None = None):
    """One pass of ``block_fn(X_block, *args[, w_block])``, which returns ``(n, 2)``: a label and a value per row.

    Returns the labels (int32) and the sum of the values. ``keep``: "persist" (labels
    persisted beside persisted ``X``), "gather" (labels as one in-memory array), "lazy"
    (labels stay lazy, recomputed from ``X``'s source when used) or "none" (no labels).
    ``generation``: the client's restart count when ``X`` was persisted (a restart is then
    reported as such).
    """
    extra = [] if weights is None else [row_weights(weights, X)[:, None]]  # (n, 1): blockwise aligns rows
    blocks = da.map_blocks(block_fn, X, *args, *extra, dtype=np.float64, chunks=(X.chunks[0], (2,)),
                           meta=get_namespace(meta_from_array(X)).empty((0, 2), dtype=np.float64))
    labels = blocks[:, 0].astype(np.int32)
    total = blocks[:, 1].sum()
    inputs = futures_of(X)
    with submitting_own_graph():  # the arguments (centroids) are in the graph once, on purpose (large k)
        if keep in ("none", "lazy"):
            total = gather(client, client.compute(total), inputs, generation)
            labels = labels if keep == "lazy" else None
        elif keep == "gather":
            labels, total = gather(client, client.compute([labels, total]), inputs, generation)
        else:
            labels, total = client.persist([labels, total])
            total = gather(client, client.compute(total), inputs, generation)
    return labels, float(total)


def _value_sum_chunk(block_fn, X, w, offset, *args):
    return float(block_fn(X, *args, w)[:, 1].sum())


def _sum(parts):
    return float(sum(parts))


def summed_pass(data, block_fn, args=()) -> float:
    """The sum of ``block_fn``'s values (column 1) over ``data``'s chunks: a labelled pass that keeps no labels."""
    import functools

    return data.map_reduce(functools.partial(_value_sum_chunk, block_fn), _sum, args)


__all__ = ["CHUNK_BYTES", "as_array", "chunked_rows", "index_meta", "is_dask_array", "labelled_pass", "map_partitions", "map_row_blocks", "map_rows_like",
           "row_weights", "sum_on_cluster", "summed_pass", "weight_stats", "weights_beside"]
