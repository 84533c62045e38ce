"""Row-wise passes over Dask collections: a per-chunk function mapped over an array's row
blocks or a DataFrame's partitions (lazy), and the one pass that labels rows and sums a value.

The engine's half of inference (:mod:`dkmeans.fit.inference` says what to compute): it
knows how Dask maps, persists and gathers, not what the function computes. Chunks of CuPy
give CuPy results (the output's meta follows the input's namespace).
"""

from __future__ import annotations

import functools
import math

import dask.array as da
import numpy as np
from dask.array.utils import meta_from_array
from distributed import futures_of

from dkmeans.engine.columns import (
    complete_rows,
    float_frame_meta,
    missing_counts_partition,
    partition_to_float_frame,
    result_dtype,
)
from dkmeans.engine.device import beside_rows
from dkmeans.engine.futures import gather
from dkmeans.engine.passes import submitting_own_graph
from dkmeans.kernels.namespace import get_namespace, is_sparse, to_host
from dkmeans.kernels.quality import label_sums


def is_dask_array(X) -> bool:
    return isinstance(X, da.Array)


#: Target size of one chunk when an in-memory array is split for the cluster.
CHUNK_BYTES = 64 * 2**20


def chunked_rows(X: np.ndarray, n_workers: int = 1) -> da.Array:
    """Split an in-memory array into row chunks of about 64 MiB (at least ``n_workers``).

    Fewer chunks than the cluster has threads are split further where they are persisted
    (:mod:`dkmeans.engine.balance`), so the cluster need not be known here. A
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
    return X.map_blocks(
        fn, *args, dtype=dtype, chunks=(X.chunks[0], (width,)), meta=xp.empty((0, width), dtype)
    )


def _at_offset(fn, block, *args, block_info=None):
    return fn(block, int(block_info[0]["array-location"][0][0]), *args)


def map_row_blocks_at(X: da.Array, fn, *args, dtype) -> da.Array:
    """``fn(block, row_offset, *args)`` for every row block of ``X`` (``row_offset`` its first
    row's global index), lazily: shape ``(n,)``. The row blocks' lengths must be known."""
    if any(math.isnan(c) for c in X.chunks[0]):
        raise ValueError("rows of unknown block lengths (compute_chunk_sizes() first)")
    xp = get_namespace(meta_from_array(X))
    return X.map_blocks(
        functools.partial(_at_offset, fn),
        *args,
        dtype=dtype,
        drop_axis=1,
        meta=xp.empty((0,), dtype),
    )


def map_rows_like(X: da.Array, fn) -> da.Array:
    """``fn(block)`` for every row block of ``X``, lazily, where ``fn`` keeps a block's shape and type."""
    return X.map_blocks(fn, dtype=X.dtype, meta=meta_from_array(X))


def map_partitions(df, fn, *args, meta):
    """``fn(partition, *args)`` for every partition of a Dask DataFrame, lazily (its index kept)."""
    return df.map_partitions(fn, *args, meta=meta)


def _partition_at(fn, offsets, part, *args, partition_info=None):
    return fn(part, int(offsets[partition_info["number"]]), *args)


def map_partitions_at(df, fn, *args, meta):
    """``fn(partition, row_offset, *args)`` for every partition of a Dask DataFrame, lazily (its
    index kept), ``row_offset`` the global index of the partition's first row (the partitions'
    lengths are counted first, in one pass)."""
    lengths = np.asarray(df.map_partitions(len).compute(), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return df.map_partitions(functools.partial(_partition_at, fn, offsets), *args, meta=meta)


def index_meta(df):
    """An empty index of the DataFrame's index type, for the meta of index-aligned results."""
    return df._meta.index  # private: see the README's table of private uses


def as_array(df, *, lengths: bool = False) -> da.Array:
    """The rows of a Dask DataFrame as a Dask array (``lengths``: partition lengths computed).

    Columns of extension types (nullable, pyarrow-backed) are converted partition by
    partition first (:func:`frame_rows`), never to ``object``.
    """
    if not all(isinstance(t, np.dtype) and t.kind in "fiub" for t in df.dtypes):
        df = float_frame(df, result_dtype(df.dtypes))
    return df.to_dask_array(lengths=True if lengths else None)


def float_frame(df, dtype, *, name: str = "X", missing: str = "error", drop: bool = False):
    """A Dask DataFrame of numeric columns of any type as one of float columns of ``dtype``, lazily.

    Each partition is converted where it is read (:func:`dkmeans.engine.columns.partition_to_float_frame`):
    missing values raise the one missing-values error there (``missing="error"``), or stay
    NaN, or with ``drop`` the rows holding them are left out.
    """
    meta = float_frame_meta(df.columns, dtype)
    meta.index = index_meta(df)
    return df.map_partitions(
        partition_to_float_frame, np.dtype(dtype), name, missing, drop, meta=meta
    )


def frame_rows(
    df, dtype, *, name: str = "X", missing: str = "error", drop: bool = False
) -> da.Array:
    """The rows of a Dask DataFrame as a float Dask array of ``dtype`` (see :func:`float_frame`), one chunk
    per partition (lengths unknown until read)."""
    return float_frame(df, dtype, name=name, missing=missing, drop=drop).to_dask_array()


def missing_counts(df) -> dict:
    """``{column: missing values}`` of a Dask DataFrame (NaN and nulls), counted in one pass."""
    import pandas as pd  # here: workers running array tasks never import it (see .columns)

    meta = pd.DataFrame({c: np.empty(0, np.int64) for c in df.columns})
    counts = df.map_partitions(missing_counts_partition, meta=meta).sum().compute()
    return {c: int(n) for c, n in counts.items()}


def _complete_block(X):
    return X[complete_rows(X)] if X.shape[0] else X


def skip_missing_rows(X: da.Array) -> da.Array:
    """A float Dask array without its rows holding NaN, lazily (row chunk lengths become unknown)."""
    return X.map_blocks(
        _complete_block,
        dtype=X.dtype,
        chunks=((np.nan,) * X.numblocks[0], X.chunks[1]),
        meta=meta_from_array(X),
    )


def row_weights(weights, X: da.Array) -> da.Array:
    """``weights`` (NumPy or Dask, one per row) chunked like ``X``'s rows."""
    return beside_rows(da.asarray(weights).rechunk((X.chunks[0],)), X)


def weights_beside(weights, X: da.Array):
    """In-memory ``weights`` as a Dask array chunked like ``X``'s rows (one chunk while those are unknown).

    Dask weights are returned as they are: the data they are placed with aligns them.
    """
    if not isinstance(weights, np.ndarray):
        return beside_rows(weights, X)
    known = not any(np.isnan(c) for c in X.chunks[0])
    return beside_rows(da.from_array(weights, chunks=X.chunks[0] if known else -1), X)


def _with_column(X, labels):
    xp = get_namespace(X)
    if X.shape[0] != labels.shape[0]:
        from dkmeans.errors import InvalidDataError

        raise InvalidDataError(
            f"labels: a chunk of {labels.shape[0]} labels beside a partition of {X.shape[0]} rows; "
            "give labels partitioned like X (e.g. the model's predict(X))"
        )
    return xp.concatenate(
        [xp.asarray(X, dtype=xp.float64), xp.asarray(labels, dtype=xp.float64).reshape(-1, 1)],
        axis=1,
    )


def with_label_column(X: da.Array, labels) -> da.Array:
    """``X`` in float64 with ``labels`` beside it as one more column: a row's label travels with it in every pass.

    ``labels``: one per row, NumPy or Dask (an array, or a Series of the same partitions
    as the DataFrame ``X`` came from). Known row chunks: the labels are rechunked like
    ``X``; unknown ones (a DataFrame read from files): the labels must have as many
    chunks (a chunk of another length raises :class:`~dkmeans.errors.InvalidDataError`
    when computed), and in-memory labels need ``X``'s chunk lengths (``X`` from
    ``as_array(frame, lengths=True)``).
    """
    if hasattr(labels, "to_dask_array"):  # a Dask Series or one-column frame
        labels = labels.to_dask_array()
    if isinstance(labels, da.Array) and labels.ndim == 2:  # one column
        labels = labels[:, 0]
    known = not any(math.isnan(c) for c in X.chunks[0])
    if not isinstance(labels, da.Array):
        labels = da.from_array(np.asarray(labels).reshape(-1), chunks=(X.chunks[0],))
    elif known and not any(math.isnan(c) for c in labels.chunks[0]):
        labels = labels.rechunk((X.chunks[0],))
    if labels.numblocks[0] != X.numblocks[0]:
        from dkmeans.errors import InvalidDataError

        raise InvalidDataError(
            f"labels come in {labels.numblocks[0]} chunks of unknown length beside X's "
            f"{X.numblocks[0]}: give labels partitioned like X (e.g. the model's predict(X))"
        )
    width = X.shape[1] + 1
    return da.map_blocks(
        _with_column,
        X,
        labels[:, None],
        dtype=np.float64,
        chunks=(X.chunks[0], (width,)),
        meta=get_namespace(meta_from_array(X)).empty((0, width), dtype=np.float64),
    )


def pair_counts(labels_true, labels_pred) -> np.ndarray:
    """The table of counts of each (true, predicted) pair of integer labels, counted on the cluster.

    Row ``i`` is the true label ``min + i``, column ``j`` the predicted ``min + j`` (empty
    rows and columns kept); one computation of the bounds, one of the counts.
    """
    from dkmeans.errors import InvalidDataError

    a = da.asarray(labels_true).astype(np.int64)
    b = da.asarray(labels_pred).astype(np.int64)
    if a.shape != b.shape:
        raise InvalidDataError(f"label arrays differ in length: {a.shape} vs {b.shape}")
    b = b.rechunk(a.chunks)
    amin, amax, bmin, bmax = (int(v) for v in da.compute(a.min(), a.max(), b.min(), b.max()))
    width = bmax - bmin + 1
    code = (a - amin) * width + (b - bmin)
    counts = da.bincount(code, minlength=(amax - amin + 1) * width).compute()
    return counts.reshape(amax - amin + 1, width)


def sum_on_cluster(client, values: da.Array, weights=None) -> float:
    """The sum of a lazy 1-D array (times ``weights``), computed on the cluster."""
    if weights is not None:
        values = values * row_weights(weights, values)
    total = values.sum()  # no client: Dask's current scheduler
    # through gather: an interrupted wait cancels the computation (and cluster failures are named)
    return float(total.compute() if client is None else gather(client, client.compute(total)))


def _label_sums_block(out, k: int):
    return label_sums(out, k).reshape(1, 2 * k)


def labelled_pass(
    client,
    X: da.Array,
    block_fn,
    args=(),
    weights=None,
    *,
    keep: str = "persist",
    generation: int | None = None,
    per_label: int = 0,
):
    """One pass of ``block_fn(X_block, *args[, w_block])``, which returns ``(n, 2)``: a label and a value per row.

    Returns the labels (int32) and the sum of the values. ``keep``: "persist" (labels
    persisted beside persisted ``X``), "gather" (labels as one in-memory array), "lazy"
    (labels stay lazy, recomputed from ``X``'s source when used) or "none" (no labels).
    ``generation``: the client's restart count when ``X`` was persisted (a restart is then
    reported as such). ``per_label=k``: ``block_fn`` returns ``(n, 3)`` (a label, a value
    and a weight per row) and the per-label sums ``(k, 2)`` of the values and weights
    (:func:`~dkmeans.kernels.quality.label_sums`) come back third, from the same blocks.
    """
    width = 3 if per_label else 2
    extra = (
        [] if weights is None else [row_weights(weights, X)[:, None]]
    )  # (n, 1): blockwise aligns rows
    blocks = da.map_blocks(
        block_fn,
        X,
        *args,
        *extra,
        dtype=np.float64,
        chunks=(X.chunks[0], (width,)),
        meta=get_namespace(meta_from_array(X)).empty((0, width), dtype=np.float64),
    )
    labels = blocks[:, 0].astype(np.int32)
    total = blocks[:, 1].sum()
    sums = []
    if per_label:
        sums = [
            blocks.map_blocks(
                _label_sums_block,
                per_label,
                dtype=np.float64,
                chunks=((1,) * blocks.numblocks[0], (2 * per_label,)),
                meta=get_namespace(meta_from_array(X)).empty((0, 0), dtype=np.float64),
            ).sum(axis=0)
        ]
    inputs = futures_of(X)
    with (
        submitting_own_graph()
    ):  # the arguments (centroids) are in the graph once, on purpose (large k)
        if keep in ("none", "lazy"):
            total, *sums = gather(client, client.compute([total, *sums]), inputs, generation)
            labels = labels if keep == "lazy" else None
        elif keep == "gather":
            labels, total, *sums = gather(
                client, client.compute([labels, total, *sums]), inputs, generation
            )
        else:
            labels, total, *sums = client.persist([labels, total, *sums])
            total, *sums = gather(client, client.compute([total, *sums]), inputs, generation)
    if per_label:
        return (
            labels,
            float(total),
            np.asarray(to_host(sums[0]), dtype=np.float64).reshape(per_label, 2),
        )
    return labels, float(total)


def _value_sum_chunk(block_fn, X, w, offset, *args):
    return float(block_fn(X, *args, w)[:, 1].sum())


def _value_label_sums_chunk(block_fn, per_label, X, w, offset, *args):
    out = block_fn(X, *args, w)
    return float(out[:, 1].sum()), to_host(label_sums(out, per_label))


def _sum(parts):
    return float(sum(parts))


def sum_pairs(parts):
    """``(total, per-label sums)`` of a pass's chunks, added in chunk order (associative)."""
    total, sums = parts[0][0], parts[0][1].copy()
    for value, more in parts[1:]:  # in chunk order
        total += value
        sums += more
    return total, sums


def summed_pass(data, block_fn, args=(), per_label: int = 0):
    """The sum of ``block_fn``'s values (column 1) over ``data``'s chunks: a labelled pass that keeps no labels.

    ``per_label=k``: also the per-label sums ``(k, 2)`` of the values and weights (columns 1
    and 2 of ``block_fn``'s ``(n, 3)``), as :func:`labelled_pass` gives them.
    """
    import functools

    if per_label:
        return data.map_reduce(
            functools.partial(_value_label_sums_chunk, block_fn, per_label), sum_pairs, args
        )
    return data.map_reduce(functools.partial(_value_sum_chunk, block_fn), _sum, args)


__all__ = [
    "CHUNK_BYTES",
    "as_array",
    "chunked_rows",
    "float_frame",
    "frame_rows",
    "missing_counts",
    "skip_missing_rows",
    "index_meta",
    "is_dask_array",
    "labelled_pass",
    "map_partitions",
    "map_partitions_at",
    "map_row_blocks",
    "map_row_blocks_at",
    "map_rows_like",
    "pair_counts",
    "row_weights",
    "sum_on_cluster",
    "summed_pass",
    "weight_stats",
    "weights_beside",
    "with_label_column",
]
