"""The final assignment: labels and objective of a Dask array for fixed centroids, in one pass.

Used by the fit service after the last iteration (so that labels and objective are what
inference gives for the fitted centroids) and by :func:`dkmeans.infer`. Labels stay
distributed: persisted next to persisted data, lazy (recomputed from the source) for
streamed data. A chunk holding NaN or infinity raises :class:`~dkmeans.errors.InvalidDataError`
when it is computed, also lazily.
"""

from __future__ import annotations

import functools

import dask.array as da
from dask.array.utils import meta_from_array
import numpy as np
from distributed import futures_of

from dkmeans.kernels.stats import check_finite_block
from dkmeans.kernels.namespace import get_namespace
from dkmeans.engine import gather as gather_results
from dkmeans.engine.passes import submitting_own_graph
from dkmeans.kernels import assign
from dkmeans.kernels.backends.compile import call_pinned, current_pin


def _label_block(X, C, w=None):
    labels, min_sq = assign(X, C)
    check_finite_block(min_sq, X)
    d2 = min_sq.astype(np.float64)
    xp = get_namespace(labels)
    if w is not None:
        d2 = d2 * w.reshape(-1)
    return xp.stack([labels.astype(xp.float64), d2], axis=1)


def assign_dataset(client, X: da.Array, centroids: np.ndarray, weights: da.Array | None = None, *,
                   gather: bool = False, keep_labels: bool = True, persist: bool = True,
                   generation: int | None = None):
    """Labels and (weighted) objective of ``X`` for fixed centroids, in one pass.

    Parameters
    ----------
    client : distributed.Client
    X : dask.array.Array, shape (n, d)
    centroids : ndarray, shape (k, d)
    weights : dask.array.Array, shape (n,), optional
    gather : bool
        Return the labels as a NumPy array instead of a Dask array.
    keep_labels : bool
        False: compute only the objective (the caller labels the rows another way).
    persist : bool
        Persist the labels (with persisted ``X``); False: they stay lazy, computed from
        ``X``'s source when used (out-of-core data).
    generation : int, optional
        The client's restart count when ``X`` was persisted (to report a cluster restart).

    Returns
    -------
    labels : dask.array.Array, ndarray (int32), or None without ``keep_labels``
    objective : float
    """
    C = np.asarray(centroids).astype(X.dtype)
    # weights as an (n, 1) column so blockwise aligns them with X's rows
    args = [X, C] if weights is None else [X, C, weights.rechunk((X.chunks[0],))[:, None]]
    # the caller's kernel path and backend setting (a fit's), in the tasks too
    blocks = da.map_blocks(
        functools.partial(call_pinned, current_pin(), _label_block), *args, dtype=np.float64, chunks=(X.chunks[0], (2,)),
        meta=get_namespace(meta_from_array(X)).empty((0, 2), dtype=np.float64),  # CuPy chunks give CuPy labels
    )
    labels = blocks[:, 0].astype(np.int32)
    objective = blocks[:, 1].sum()
    inputs = futures_of(X)
    with submitting_own_graph():  # the centroids are in the graph once, on purpose (large k)
        if not keep_labels or (not persist and not gather):
            objective = gather_results(client, client.compute(objective), inputs, generation)
            labels = labels if keep_labels else None
        elif gather:
            labels, objective = gather_results(client, client.compute([labels, objective]), inputs, generation)
        else:
            labels, objective = client.persist([labels, objective])
            objective = gather_results(client, client.compute(objective), inputs, generation)
    return labels, float(objective)


def assign_local(X, centroids, weights=None):
    """Labels (int32) and (weighted) objective of an in-memory array, in this process."""
    out = _label_block(X, np.asarray(centroids).astype(X.dtype), weights)
    return out[:, 0].astype(np.int32), float(out[:, 1].sum())


def _labels_block(X, C):
    return _label_block(X, C)[:, 0].astype(np.int32)


def lazy_labels(X: da.Array, centroids: np.ndarray) -> da.Array:
    """The labels of ``X`` for ``centroids`` as a lazy Dask array (computed from ``X``'s source when used).

    A chunk holding NaN or infinity raises :class:`~dkmeans.errors.InvalidDataError` when computed.
    """
    C = np.asarray(centroids).astype(X.dtype)
    return X.map_blocks(_labels_block, C, dtype=np.int32, drop_axis=1,
                        meta=get_namespace(meta_from_array(X)).empty((0,), np.int32))


__all__ = ["assign_dataset", "assign_local", "lazy_labels"]
