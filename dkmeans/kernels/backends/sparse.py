"""Kernels for rows held as ``scipy.sparse`` CSR matrices: the dense kernels' signatures, no chunk densified.

The public kernels (:func:`dkmeans.kernels.nearest`, :func:`~dkmeans.kernels.assign_partials`,
:func:`~dkmeans.kernels.distances`, :func:`~dkmeans.kernels.nearest_sq64` (for the farthest points),
:func:`~dkmeans.kernels.cluster_sums`, :func:`~dkmeans.kernels.sq_distances`,
:func:`~dkmeans.kernels.column_moments`) hand a chunk here when ``scipy.sparse.issparse(X)``,
so drivers, the engine and the faces run unchanged on sparse data. Centroids stay dense.

* The *choice* of centroid uses ``||c||^2 / 2 - x.c`` with the product ``X_tile @ C.T``
  (sparse times dense: work proportional to ``nnz(X_tile) * k``), in float64, lowest
  index on exact ties; a unit centroid counts ``||c||^2 / 2`` as exactly 1/2, as on the
  dense paths (:func:`dkmeans.kernels.common.unit_half_sq_norms`: cosine ties, such as a
  row orthogonal to several centroids, go to the lowest index on CSR and dense input alike).
* The squared distance *reported* for the chosen centroid is computed in float64 from the
  stored values: ``sum over the row's nonzeros of (x_j - c_j)^2`` plus the centroid's
  squared norm outside them (``||c||^2 - sum over the nonzeros of c_j^2``). The first part
  is the dense kernels' difference form restricted to the nonzeros, so a row equal to its
  centroid gives exactly 0; the second part is a difference of float64 sums, and a
  remainder at rounding level (at most ``OUTSIDE_RTOL * ||c||^2``) is taken as 0, so that
  a centroid copied from a row is at distance 0 from it.
* Distances to every centroid (``transform``, k-means++ trials) use the expanded form
  ``||x||^2 - 2 x.c + ||c||^2`` in float64 with row norms from the stored values, clipped
  at 0.
* Per-cluster sums are a sparse one-hot product ``onehot @ X_tile`` (``k x m`` times
  ``m x d``, a sparse result with at most ``nnz(X_tile)`` entries) added into the dense
  ``k x d`` float64 sums.
* Selected rows (farthest points, seeding candidates: at most a few per chunk) are returned
  dense by :func:`take_rows`, which builds them from the stored values.

Work is tiled over rows (and over blocks of ``MAX_CENTROID_BLOCK`` centroids) so that the
scratch of one call (an ``m x k`` block of products and the tile's gathered values) stays
within ``scratch_bytes`` whatever ``k`` and ``d`` are. Only NumPy/SciPy: CuPy's sparse
matrices are not handled (the dense kernels' CuPy paths are).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse

from dkmeans.kernels.common import (
    DEFAULT_SCRATCH_BYTES,
    MAX_CENTROID_BLOCK,
    Moments,
    Partials,
    unit_half_sq_norms,
)

#: A centroid's squared norm outside a row's nonzeros below this fraction of its squared
#: norm is float64 rounding of the difference (about 20 ulps), and taken as 0.
OUTSIDE_RTOL = 4e-15


def is_sparse(X) -> bool:
    """True for a ``scipy.sparse`` matrix or array."""
    return scipy.sparse.issparse(X)


def as_csr(X):
    """``X`` as CSR with sorted, unique column indices per row (a copy only when it is not)."""
    if X.format != "csr":
        X = X.tocsr()
    if not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    return X


def _row_ids(X):
    """Row index of every stored value (int64, length nnz)."""
    return np.repeat(np.arange(X.shape[0], dtype=np.int64), np.diff(X.indptr))


def row_sq_norms(X):
    """Squared Euclidean norm of each row, float64, from the stored values."""
    X = as_csr(X)
    data = X.data.astype(np.float64)
    return np.bincount(_row_ids(X), weights=data * data, minlength=X.shape[0])


def _tile_rows(X, k: int, scratch_bytes: int) -> int:
    """Rows per tile: a block of float64 products and the tile's per-value scratch fit ``scratch_bytes``."""
    n = X.shape[0]
    block = max(1, min(k, MAX_CENTROID_BLOCK))
    nnz_per_row = X.nnz / max(1, n)
    per_row = 16 * block + 40 * nnz_per_row + 32
    return int(min(max(n, 1), max(1, scratch_bytes // per_row)))


def _centroid_blocks(C64, k: int, dtype):
    """``(j0, C_block.T as C-contiguous, ||c||^2 / 2)`` per block of at most ``MAX_CENTROID_BLOCK`` centroids.

    ``||c||^2 / 2`` is the choice's: exactly 1/2 for a unit centroid (of the data ``dtype``'s
    tolerance, :func:`dkmeans.kernels.common.unit_half_sq_norms`).
    """

    half = unit_half_sq_norms(np, C64, 0.5 * np.einsum("ij,ij->i", C64, C64), dtype)
    return [
        (
            j0,
            np.ascontiguousarray(C64[j0 : j0 + MAX_CENTROID_BLOCK].T),
            half[j0 : j0 + MAX_CENTROID_BLOCK],
        )
        for j0 in range(0, k, MAX_CENTROID_BLOCK)
    ]


def _nearest(Xt, blocks):
    """Index of the nearest centroid for each row of the CSR tile ``Xt`` (lowest index on ties)."""
    m = Xt.shape[0]
    rows = np.arange(m)
    best_idx = best_val = None
    for j0, CT, half in blocks:
        D = np.asarray(Xt @ CT)  # (m, kb) float64
        np.subtract(half, D, out=D)
        idx = np.argmin(D, axis=1)
        if len(blocks) == 1:
            return idx.astype(np.int32)
        val = D[rows, idx]
        if best_idx is None:
            best_idx, best_val = idx, val
        else:  # strict '<' keeps the lower centroid index on ties, like one argmin
            better = val < best_val
            best_val = np.where(better, val, best_val)
            best_idx = np.where(better, idx + j0, best_idx)
    return best_idx.astype(np.int32)


def _sq_to_chosen(Xt, C64, c_sq, labels):
    """Squared distance (float64) of each row of the CSR tile ``Xt`` to ``C64[labels]`` (see the module docstring)."""
    m = Xt.shape[0]
    ids = _row_ids(Xt)
    c = C64[labels[ids], Xt.indices]
    diff = Xt.data.astype(np.float64) - c
    inside = np.bincount(ids, weights=diff * diff, minlength=m)
    c_inside = np.bincount(ids, weights=c * c, minlength=m)
    total = c_sq[labels]
    outside = total - c_inside
    outside[outside <= OUTSIDE_RTOL * total] = 0.0
    return inside + outside


def _assign64(X, C, scratch_bytes: int):
    """Labels (int32) and float64 squared distances to the nearest centroid."""
    X = as_csr(X)
    n = X.shape[0]
    C64 = np.asarray(C, dtype=np.float64)
    k = C64.shape[0]
    labels = np.empty(n, dtype=np.int32)
    d2 = np.empty(n, dtype=np.float64)
    if n == 0:
        return labels, d2
    blocks = _centroid_blocks(C64, k, X.dtype)
    c_sq = np.einsum(
        "ij,ij->i", C64, C64
    )  # the reported distance's: not the choice's (unit: 1/2 exactly)
    rows = _tile_rows(X, k, scratch_bytes)
    for i0 in range(0, n, rows):
        Xt = X[i0 : i0 + rows]
        lab = _nearest(Xt, blocks)
        labels[i0 : i0 + rows] = lab
        d2[i0 : i0 + rows] = _sq_to_chosen(Xt, C64, c_sq, lab)
    return labels, d2


def assign(X, C, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES):
    """Nearest centroid of each sparse row and the squared distance to it (see :func:`dkmeans.kernels.nearest`).

    Returns
    -------
    labels : ndarray, shape (n,), int32
    min_sq_dist : ndarray, shape (n,), ``X.dtype``
    """
    labels, d2 = _assign64(X, C, scratch_bytes)
    return labels, d2.astype(X.dtype)


def cluster_sums(X, labels, k: int, weights=None, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES):
    """Per-cluster weighted sums (k, d) and counts (k,) of sparse rows, float64: a sparse one-hot product."""
    X = as_csr(X)
    n, d = X.shape
    sums = np.zeros((k, d), dtype=np.float64)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    labels = np.asarray(labels)
    counts = np.bincount(labels, weights=w, minlength=k).astype(np.float64)
    rows = _tile_rows(X, k, scratch_bytes)
    for i0 in range(0, n, rows):
        Xt = X[i0 : i0 + rows].astype(np.float64)
        m = Xt.shape[0]
        data = np.ones(m, dtype=np.float64) if w is None else w[i0 : i0 + m]
        onehot = scipy.sparse.csc_matrix(
            (data, labels[i0 : i0 + m], np.arange(m + 1)), shape=(k, m)
        )
        part = (onehot @ Xt).tocoo()
        part.sum_duplicates()  # unique (cluster, column) pairs: a plain indexed add is exact
        sums[part.row, part.col] += part.data
    return sums, counts


def assign_partials(X, C, weights=None, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES) -> Partials:
    """Assign sparse rows and return the chunk's :class:`~dkmeans.kernels.Partials` (float64)."""
    X = as_csr(X)
    k = np.asarray(C).shape[0]
    labels, d2 = _assign64(X, C, scratch_bytes)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    sums, counts = cluster_sums(X, labels, k, w, scratch_bytes=scratch_bytes)
    objective = np.sum(d2 if w is None else d2 * w)
    return Partials(sums, counts, np.asarray(objective, dtype=np.float64))


def sq_distances(X, C, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES):
    """Squared distances (n, k) of sparse rows to every centroid, float64, clipped at 0."""
    X = as_csr(X)
    n = X.shape[0]
    C64 = np.asarray(C, dtype=np.float64)
    k = C64.shape[0]
    out = np.empty((n, k), dtype=np.float64)
    c_sq = np.einsum("ij,ij->i", C64, C64)
    CT = np.ascontiguousarray(C64.T)
    x_sq = row_sq_norms(X)
    rows = _tile_rows(X, k, scratch_bytes)
    for i0 in range(0, n, rows):
        block = out[i0 : i0 + rows]
        block[...] = np.asarray(X[i0 : i0 + rows] @ CT)
        block *= -2.0
        block += x_sq[i0 : i0 + rows, None]
        block += c_sq[None, :]
        np.maximum(block, 0.0, out=block)
    return out


def distances(X, C):
    """Euclidean distances (n, k) of sparse rows to every centroid, in ``X.dtype``.

    From :func:`sq_distances` (float64); as on dense rows, a pair within rounding of zero
    (at most ``2**-20 (||x||^2 + ||c||^2)``) is recomputed from the difference of the
    (densified) row and the centroid, so a row equal to a centroid is at distance exactly 0.
    """
    X = as_csr(X)
    d2 = sq_distances(X, C)
    C64 = np.asarray(C, dtype=np.float64)
    c_sq = np.einsum("ij,ij->i", C64, C64)
    i, j = np.nonzero(d2 <= 2.0**-20 * (row_sq_norms(X)[:, None] + c_sq[None, :]))
    if len(i):
        diff = take_rows(X, i).astype(np.float64) - C64[j]
        d2[i, j] = np.einsum("ij,ij->i", diff, diff)
    return np.sqrt(d2).astype(X.dtype)


def take_rows(X, index):
    """The rows ``X[index]`` as a dense array in ``X.dtype`` (dense ``X``: plain indexing).

    For the few rows a chunk contributes to a selection (farthest points, seeding
    candidates, the first centre), never for a whole chunk.
    """
    if not is_sparse(X):
        return X[index]
    sub = as_csr(X[index])
    out = np.zeros(sub.shape, dtype=X.dtype)
    out[_row_ids(sub), sub.indices] = sub.data  # canonical: one value per (row, column)
    return out


def assign64(X, C, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES):
    """Nearest centroid (int32) and float64 squared distance of each sparse row."""
    return _assign64(X, C, scratch_bytes)


def column_moments(X):
    """Row count, column means and sums of squared deviations (float64) of sparse rows.

    ``m2_j = sum over stored values of (x - mean_j)^2 + (n - stored_j) mean_j^2``: every
    term is non-negative, so there is no cancellation, and explicit zeros count once.
    """

    X = as_csr(X)
    n, d = X.shape
    if n == 0:
        zeros = np.zeros(d, dtype=np.float64)
        return Moments(np.zeros((), dtype=np.float64), zeros, zeros.copy())
    data = X.data.astype(np.float64)
    mean = np.bincount(X.indices, weights=data, minlength=d) / n
    stored = np.bincount(X.indices, minlength=d)
    dev = data - mean[X.indices]
    m2 = np.bincount(X.indices, weights=dev * dev, minlength=d) + (n - stored) * mean * mean
    return Moments(np.asarray(float(n)), mean, m2)


__all__ = [
    "as_csr",
    "assign",
    "assign64",
    "assign_partials",
    "cluster_sums",
    "column_moments",
    "distances",
    "is_sparse",
    "row_sq_norms",
    "sq_distances",
    "take_rows",
]
