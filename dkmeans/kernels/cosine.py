"""Cosine (spherical k-means) kernels: unit rows, unit centroids, and the Euclidean kernels reused.

Spherical k-means (Dhillon and Modha, 2001) clusters directions: it maximises
``sum_i w_i cos(x_i, c_label(i))``, i.e. minimises the objective ``sum_i w_i (1 - cos)``.
For unit vectors ``x`` and ``c``, ``||x - c||^2 = 2 - 2 x.c = 2 (1 - cos(x, c))``. So once
the rows are normalised (once, where the data is read: :func:`normalize_rows`) and the
centroids are kept at unit norm (:func:`unit_centroids`), every Euclidean kernel, with its
compiled, CuPy and sparse fast paths, gives the cosine answer unchanged:

* the nearest centroid is the one of largest dot product (largest cosine); an exact tie
  in the dot products (a row orthogonal to several centroids, common in sparse text data)
  goes to the lowest centroid index, as in the Euclidean kernels, because every kernel
  compares a unit centroid by ``1/2 - x.c`` exactly (:func:`unit_half_sq_norms`) and not
  by ``||c||^2 / 2 - x.c`` with a squared norm that differs from 1 by rounding (which
  decided such ties by the rounding of each centroid's norm, differently on each path);
* the farthest point from its centroid (the empty-cluster rule) is the one of smallest
  cosine to it;
* k-means++ and k-means|| draw rows with probability proportional to ``w ||x - c||^2``,
  that is to ``w (1 - cos)``: D^2 seeding in the cosine distance.

What changes is only (1) the row normalisation, (2) the centroid update: the weighted mean
of the cluster's unit rows, then normalised (the unit vector that maximises the cluster's
sum of cosines), and (3) the objective reported: half the squared distance
(:data:`COSINE_SCALE`).

Rules:

* a row of norm zero has no direction: :func:`normalize_rows` raises
  :class:`~dkmeans.errors.InvalidDataError` (:data:`ZERO_ROW_MESSAGE`), at fit and predict;
* a cluster whose rows cancel (the norm of its weighted mean is at most
  :data:`ZERO_MEAN_NORM`, where a mean of unit rows has norm up to 1) has no direction
  either: :func:`unit_centroids` reports it with the empty clusters, so it takes the row
  farthest from the other centroids (oneDAL's rule), never the origin.
"""

from __future__ import annotations

import numpy as np

from dkmeans.errors import InvalidDataError
from dkmeans.kernels.backends import sparse as _sparse

# the unit rule of the nearest-centroid choice lives beside the other shared kernel pieces (the
# assignment kernels, which this module's users import, need it without importing this module)
from dkmeans.kernels.common import UNIT_PREFILTER, UNIT_SQ_NORM_TOL, unit_half_sq_norms  # noqa: F401
from dkmeans.kernels.namespace import get_namespace

#: Cosine objective / squared Euclidean distance between unit vectors.
COSINE_SCALE = 0.5
#: A cluster's weighted mean of unit rows with at most this norm has no direction (its rows cancel).
ZERO_MEAN_NORM = 1e-9
#: The message of the error about rows of norm zero under the cosine metric.
ZERO_ROW_MESSAGE = (
    "metric='cosine': the input has a row of norm zero (all values zero), whose direction and cosine "
    "similarity are undefined; remove such rows or use metric='euclidean'."
)
#: Rows normalised per tile (float64 scratch of about this many bytes).
NORMALIZE_TILE_BYTES = 4 * 2**20


def objective_scale(metric: str) -> float:
    """The metric's objective per unit of squared Euclidean distance on the prepared rows and centroids."""
    return COSINE_SCALE if metric == "cosine" else 1.0


def _dense_row_norms(xp, X64):
    """Euclidean norms of float64 rows, scaled by the largest magnitude first so squares cannot overflow."""
    peak = xp.max(xp.abs(X64), axis=1)
    safe = xp.where(peak > 0, peak, 1.0)
    scaled = X64 / safe[:, None]
    return peak * xp.sqrt(xp.sum(scaled * scaled, axis=1))


def _check_nonzero(xp, norms) -> None:
    # NaN or infinity give non-finite norms and rows: reported by the finiteness checks, not here
    if bool(xp.any(norms == 0)):
        raise InvalidDataError(ZERO_ROW_MESSAGE)


def _normalize_sparse(X):
    X = _sparse.as_csr(X)
    data = X.data.astype(np.float64)
    ids = np.repeat(np.arange(X.shape[0], dtype=np.int64), np.diff(X.indptr))
    peak = np.zeros(X.shape[0], dtype=np.float64)
    np.maximum.at(peak, ids, np.abs(data))
    scaled = data / np.where(peak > 0, peak, 1.0)[ids]
    norms = peak * np.sqrt(np.bincount(ids, weights=scaled * scaled, minlength=X.shape[0]))
    _check_nonzero(np, norms)
    out = X.copy()
    out.data = (data / norms[ids]).astype(X.dtype)
    return out


def normalize_rows(X):
    """Every row divided by its Euclidean norm, in ``X``'s dtype (NumPy, CuPy or ``scipy.sparse`` CSR).

    Norms are computed in float64 (scaled, so large values cannot overflow) and each unit
    row is rounded once to the dtype. A sparse chunk stays sparse (only its stored values
    change).

    Raises
    ------
    InvalidDataError
        A row has norm zero (:data:`ZERO_ROW_MESSAGE`).
    """
    if _sparse.is_sparse(X):
        return _normalize_sparse(X)
    xp = get_namespace(X)
    n, d = X.shape
    out = xp.empty_like(X)
    rows = max(1, NORMALIZE_TILE_BYTES // (16 * max(d, 1)))
    for i0 in range(0, n, rows):
        X64 = X[i0 : i0 + rows].astype(xp.float64)
        norms = _dense_row_norms(xp, X64)
        _check_nonzero(xp, norms)
        out[i0 : i0 + rows] = X64 / norms[:, None]
    return out


def unit_centroids(partials, previous):
    """Spherical k-means update: each cluster's weighted mean of unit rows, normalised.

    Parameters
    ----------
    partials : Partials
        Reduced over the whole data set (sums of unit rows).
    previous : array, shape (k, d)
        The centroids the partials were computed with (kept for clusters without a direction
        until the empty-cluster rule replaces them).

    Returns
    -------
    centroids : array, shape (k, d), float64, unit rows (where not ``empty``)
    empty : array of bool, shape (k,)
        Clusters with no weight, and clusters whose rows cancel (mean of norm at most
        :data:`ZERO_MEAN_NORM`): neither has a direction.
    """
    from dkmeans.kernels.reduce import (
        update_centroids,  # here: the assignment kernels import this module
    )

    means, empty = update_centroids(partials, previous)
    xp = get_namespace(means)
    norms = xp.sqrt(xp.sum(means * means, axis=1))
    empty = empty | (norms <= ZERO_MEAN_NORM)
    unit = means / xp.where(empty, 1.0, norms)[:, None]
    return xp.where(empty[:, None], xp.asarray(previous, dtype=xp.float64), unit), empty


def cosine_distances(X, C):
    """Cosine distances ``1 - cos(x, c)`` (n, k) in ``X.dtype``, clipped to [0, 2].

    From the dot products and the norms of rows and centroids, in float64 and tile by
    tile, so neither needs to be unit. ``X`` may be NumPy, CuPy or ``scipy.sparse`` (whose
    product with the centroids is sparse times dense).

    Raises
    ------
    InvalidDataError
        A row has norm zero.
    """
    sparse = _sparse.is_sparse(X)
    if sparse:
        import numpy as xp

        X = _sparse.as_csr(X)
    else:
        xp = get_namespace(X)
    n, d = X.shape
    C64 = xp.asarray(C, dtype=xp.float64)
    c_norm = xp.sqrt(xp.sum(C64 * C64, axis=1))
    unit_t = xp.ascontiguousarray((C64 / xp.where(c_norm > 0, c_norm, 1.0)[:, None]).T)
    out = xp.empty((n, C64.shape[0]), dtype=X.dtype)
    rows = max(1, NORMALIZE_TILE_BYTES // (16 * max(d, C64.shape[0], 1)))
    for i0 in range(0, n, rows):
        if sparse:
            Xt = X[i0 : i0 + rows]
            norms = xp.sqrt(_sparse.row_sq_norms(Xt))
            dots = xp.asarray(Xt @ unit_t)
        else:
            Xt = X[i0 : i0 + rows].astype(xp.float64)
            norms = _dense_row_norms(xp, Xt)
            dots = Xt @ unit_t
        _check_nonzero(xp, norms)
        out[i0 : i0 + rows] = xp.clip(1.0 - dots / norms[:, None], 0.0, 2.0)
    return out


__all__ = [
    "COSINE_SCALE",
    "ZERO_MEAN_NORM",
    "UNIT_SQ_NORM_TOL",
    "ZERO_ROW_MESSAGE",
    "cosine_distances",
    "normalize_rows",
    "objective_scale",
    "unit_centroids",
    "unit_half_sq_norms",
]
