"""Clustering quality: objective, Hungarian-matched accuracy, Centroid Index, adjusted Rand index.

Label-based metrics accept NumPy or Dask label arrays (Dask labels are reduced to a
contingency table on the cluster; only the table comes back).
"""

from __future__ import annotations

import dask.array as da
import numpy as np
from scipy.optimize import linear_sum_assignment

from dkmeans.errors import InvalidDataError
from dkmeans.fit import inference
from dkmeans.kernels import cluster_sums


def objective(X, centroids, sample_weight=None) -> float:
    """Weighted sum of squared distances of the rows of ``X`` to their nearest centroid.

    Parameters
    ----------
    X : ndarray or dask.array.Array, shape (n, d)
    centroids : array-like, shape (k, d)
    sample_weight : array-like or dask.array.Array, shape (n,), optional
    """
    if not isinstance(X, da.Array):
        X = np.asarray(X)
        if X.dtype not in (np.float32, np.float64):
            X = X.astype(np.float64)
    return inference.objective(X, np.asarray(centroids).astype(X.dtype), sample_weight=sample_weight)


def contingency_matrix(labels_true, labels_pred) -> np.ndarray:
    """Counts ``n_ij`` of rows with true class ``i`` and predicted cluster ``j`` (empty rows/columns dropped)."""
    if isinstance(labels_true, da.Array) or isinstance(labels_pred, da.Array):
        a = da.asarray(labels_true).astype(np.int64)
        b = da.asarray(labels_pred).astype(np.int64)
        if a.shape != b.shape:
            raise InvalidDataError(f"label arrays differ in length: {a.shape} vs {b.shape}")
        b = b.rechunk(a.chunks)
        amin, amax, bmin, bmax = (int(v) for v in da.compute(a.min(), a.max(), b.min(), b.max()))
        width = bmax - bmin + 1
        code = (a - amin) * width + (b - bmin)
        counts = da.bincount(code, minlength=(amax - amin + 1) * width).compute()
        table = counts.reshape(amax - amin + 1, width)
    else:
        a = np.asarray(labels_true).ravel()
        b = np.asarray(labels_pred).ravel()
        if a.shape != b.shape:
            raise InvalidDataError(f"label arrays differ in length: {a.shape} vs {b.shape}")
        _, ai = np.unique(a, return_inverse=True)
        _, bi = np.unique(b, return_inverse=True)
        width = int(bi.max()) + 1 if len(bi) else 0
        table = np.bincount(ai * width + bi, minlength=(int(ai.max()) + 1 if len(ai) else 0) * width)
        table = table.reshape(-1, width) if width else table.reshape(0, 0)
    return table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]


def accuracy(labels_true, labels_pred) -> float:
    """Share of rows whose cluster maps to their class under the best one-to-one matching.

    The matching maximises the matched counts (Hungarian algorithm,
    :func:`scipy.optimize.linear_sum_assignment`); unmatched clusters count as errors.
    """
    table = contingency_matrix(labels_true, labels_pred)
    rows, cols = linear_sum_assignment(-table)
    return float(table[rows, cols].sum() / table.sum())


def _pairs(x):
    x = np.asarray(x, dtype=np.float64)
    return x * (x - 1) / 2


def adjusted_rand_index(labels_true, labels_pred) -> float:
    """Adjusted Rand index (Hubert and Arabie 1985), from the contingency table."""
    table = contingency_matrix(labels_true, labels_pred)
    n = table.sum()
    index = _pairs(table).sum()
    sum_a = _pairs(table.sum(axis=1)).sum()
    sum_b = _pairs(table.sum(axis=0)).sum()
    expected = sum_a * sum_b / _pairs(n) if n > 1 else 0.0
    maximum = (sum_a + sum_b) / 2
    if maximum == expected:  # both partitions trivial: identical by convention
        return 1.0
    return float((index - expected) / (maximum - expected))


def _orphans(A, B) -> int:
    nearest = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1).argmin(axis=1)
    return int(B.shape[0] - np.unique(nearest).size)


def centroid_index(centroids, reference) -> int:
    """Centroid Index (Fränti, Rezaei and Zhao 2014): clusters placed wrongly.

    Each centroid of one set is mapped to its nearest centroid of the other; ``CI`` is the
    larger of the two numbers of centroids that nobody maps to (0: the same cluster structure).
    """
    A = np.asarray(centroids, dtype=np.float64)
    B = np.asarray(reference, dtype=np.float64)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[1]:
        raise InvalidDataError(f"centroid sets must be 2-D with equal widths, got {A.shape} and {B.shape}")
    return max(_orphans(A, B), _orphans(B, A))


def class_means(X, labels) -> np.ndarray:
    """Mean of the rows of each class (sorted class order), e.g. a ground-truth partition's centroids."""
    X = np.asarray(X, dtype=np.float64)
    classes, inverse = np.unique(np.asarray(labels), return_inverse=True)
    sums, counts = cluster_sums(X, inverse.astype(np.int32), classes.size)
    return sums / counts[:, None]
