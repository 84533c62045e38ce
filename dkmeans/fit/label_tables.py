"""Tables over labels for the external scores: pair counts of two labellings, and per-class means.

Dask labels are counted on the cluster (only the table comes back); in-memory labels here.
"""

from __future__ import annotations

import numpy as np

from dkmeans.engine.rowwise import is_dask_array, pair_counts
from dkmeans.errors import InvalidDataError
from dkmeans.kernels import cluster_sums


def pair_count_table(labels_true, labels_pred) -> np.ndarray:
    """Counts of each (true, predicted) pair of labels: row ``i`` the ``i``-th true label,
    column ``j`` the ``j``-th predicted one.

    Dask labels (integers) are counted on the cluster, every integer from the least to the
    greatest label a row or column (empty ones kept); in-memory labels of any kind, the labels
    present in sorted order.
    """
    if is_dask_array(labels_true) or is_dask_array(labels_pred):
        return pair_counts(labels_true, labels_pred)
    a = np.asarray(labels_true).ravel()
    b = np.asarray(labels_pred).ravel()
    if a.shape != b.shape:
        raise InvalidDataError(f"label arrays differ in length: {a.shape} vs {b.shape}")
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    width = int(bi.max()) + 1 if len(bi) else 0
    table = np.bincount(ai * width + bi, minlength=(int(ai.max()) + 1 if len(ai) else 0) * width)
    return table.reshape(-1, width) if width else table.reshape(0, 0)


def class_means(X, labels) -> np.ndarray:
    """Mean of the in-memory rows ``X`` of each class of ``labels`` (sorted classes), float64."""
    X = np.asarray(X, dtype=np.float64)
    classes, inverse = np.unique(np.asarray(labels), return_inverse=True)
    sums, counts = cluster_sums(X, inverse.astype(np.int32), classes.size)
    return sums / counts[:, None]


__all__ = ["class_means", "pair_count_table"]
