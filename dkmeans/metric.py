"""The metric of a fit (``"euclidean"`` or ``"cosine"``) where the data is read, and what sparse input allows.

The fit service and the faces call these; the drivers see only unit rows and get the
metric's centroid update and objective scale from :mod:`dkmeans.kernels.cosine`.

Cosine (spherical k-means) is Euclidean k-means on unit rows with unit centroids (see
:mod:`dkmeans.kernels.cosine` for why every Euclidean kernel then gives the cosine answer):

* :func:`prepare_array` normalises the rows of a validated Dask array chunk by chunk,
  where the chunks are read (persisted once, or on every pass of out-of-core data), before
  the fit service places it; the fit's first pass (column moments) then sees unit rows, so
  the estimator's relative ``tol`` is relative to the mean feature variance of the
  *normalised* rows (and bounds the squared shift of unit centroids);
* :func:`prepare_centroids` normalises given or seeded initial centroids;
* the block functions (:func:`labels_block`, :func:`objective_block`,
  :func:`distances_block`) are what ``predict``, ``score`` and ``transform`` run on each
  chunk: the same normalisation and kernels as the fit, so training labels are what
  ``predict`` gives.

:func:`supports_local_search` says which fit phases a metric and sparse input support:
Hartigan's method and the swap-based local search compute Euclidean cost changes on dense
rows, so they are refused for cosine and sparse input (an explicit request raises; the
default ``local_search="auto"`` turns local search off).
"""

from __future__ import annotations

import numpy as np
from dask.array.utils import meta_from_array

from dkmeans.backend import is_sparse
from dkmeans.errors import InvalidDataError, InvalidParameterError
from dkmeans.kernels import assign, distances
from dkmeans.kernels.cosine import cosine_distances, normalize_rows, objective_scale


def is_sparse_array(X) -> bool:
    """Whether a Dask array's chunks are ``scipy.sparse`` matrices (from its meta)."""
    return is_sparse(meta_from_array(X))


def _stored_bytes_per_row(X):
    X = X.tocsr()
    return np.array([(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / max(1, X.shape[0])])


#: The bytes per row of sparse data, estimated from its first chunk, are planned with this margin
#: (other chunks may hold more values per row).
SPARSE_BYTES_MARGIN = 1.5


def sparse_row_bytes(client, X) -> float | None:
    """Bytes per row of a Dask array of ``scipy.sparse`` chunks for memory planning; None for dense chunks.

    The engine counts dense rows as ``n_features * itemsize``, which for sparse rows (text:
    a few hundred values out of 10^5 or more columns) would overstate the data by orders of
    magnitude, refuse chunks that fit and stream data that fits. Here: the stored bytes
    (values, column indices, row pointers) per row of the first chunk, read once, times
    :data:`SPARSE_BYTES_MARGIN`.
    """
    if not is_sparse_array(X):
        return None
    from dkmeans.engine import gather

    first = X.blocks[0].map_blocks(_stored_bytes_per_row, dtype=np.float64, chunks=((1,),), drop_axis=1,
                                   meta=np.empty((0,), np.float64))
    return float(gather(client, client.compute(first))[0]) * SPARSE_BYTES_MARGIN


def prepare_array(X, metric: str):
    """The Dask array whose chunks the kernels see: rows normalised per chunk for cosine, else ``X``.

    Lazy: a chunk with a row of norm zero raises :class:`~dkmeans.errors.InvalidDataError`
    when it is computed (persisted or streamed), with the same message as ``predict``.
    """
    if metric != "cosine":
        return X
    return X.map_blocks(normalize_rows, dtype=X.dtype, meta=meta_from_array(X))


def prepare_dataset(dataset, metric: str):
    """A copy of a :class:`~dkmeans._validation.Dataset` whose array is :func:`prepare_array`'s."""
    from dataclasses import replace

    if metric != "cosine":
        return dataset
    local = None if dataset.local is None else normalize_rows(dataset.local)  # fitted in-process: at once
    return replace(dataset, array=prepare_array(dataset.array, metric), local=local)


def prepare_centroids(C, metric: str, name: str = "init"):
    """Initial centroids for ``metric``: unit rows for cosine (a zero centroid has no direction and is refused)."""
    if metric != "cosine":
        return C
    C = np.asarray(C)
    norms = np.linalg.norm(C.astype(np.float64), axis=1)
    if np.any(norms == 0):
        raise InvalidDataError(f"{name}: a centroid of norm zero has no direction; metric='cosine' needs non-zero "
                               "centroids")
    return (C / norms[:, None]).astype(C.dtype)


def supports_local_search(metric: str, sparse: bool, *, algorithm: str, refine, local_search) -> bool:
    """Whether local search may run for this metric and input; raises for phases that cannot.

    Hartigan's method (``algorithm``/``method`` or ``refine`` "hartigan") and an explicit
    ``local_search=True`` raise :class:`~dkmeans.errors.InvalidParameterError` with cosine or
    sparse input; ``local_search="auto"`` (or False) gives False there.
    """
    reason = "metric='cosine'" if metric == "cosine" else "sparse input" if sparse else None
    if reason is None:
        return True
    if "hartigan" in (algorithm, refine):
        raise InvalidParameterError(f"Hartigan's method is not available with {reason}: it moves dense rows by "
                                    "their Euclidean cost change; use algorithm='lloyd' without refine")
    if local_search is True:
        raise InvalidParameterError(f"local_search=True is not available with {reason}: the swap search scores "
                                    "Euclidean swaps on dense rows; use local_search='auto' or False")
    return False


# -- per-chunk inference (predict, score, transform) ------------------------------------------
def labels_block(X, C, metric: str = "euclidean"):
    """Labels (int32) of a chunk for centroids ``C``; raises on NaN/infinity (and zero rows for cosine)."""
    from dkmeans.kernels.stats import check_finite_block

    Xm = normalize_rows(X) if metric == "cosine" else X
    labels, min_sq = assign(Xm, C)
    check_finite_block(min_sq, X)
    return labels


def objective_block(X, C, metric: str = "euclidean"):
    """Each row's contribution to the objective, float64: squared distance, or ``1 - cos`` for cosine."""
    from dkmeans.kernels.stats import check_finite_block

    Xm = normalize_rows(X) if metric == "cosine" else X
    min_sq = assign(Xm, C)[1]
    check_finite_block(min_sq, X)
    return min_sq.astype(np.float64) * objective_scale(metric)


def distances_block(X, C, metric: str = "euclidean"):
    """Distances (n, k) of a chunk to every centroid: Euclidean, or ``1 - cos`` for cosine."""
    from dkmeans.kernels.stats import check_finite_block

    out = cosine_distances(X, C) if metric == "cosine" else distances(X, C)
    check_finite_block(out, X)
    return out


__all__ = [
    "distances_block",
    "is_sparse_array",
    "labels_block",
    "objective_block",
    "prepare_array",
    "prepare_centroids",
    "prepare_dataset",
    "sparse_row_bytes",
    "supports_local_search",
]
