"""Per-chunk inference for a metric: labels, objective terms and distances of a block of rows.

``predict``, ``score``, ``transform``, ``infer`` and the DataFrame helpers run these on
each chunk: the same normalisation and kernels as the fit, so training labels are what
``predict`` gives.
"""

from __future__ import annotations

import numpy as np

from dkmeans.kernels import assign, distances
from dkmeans.kernels.cosine import cosine_distances, normalize_rows, objective_scale
from dkmeans.kernels.stats import check_finite_block


def labels_block(X, C, metric: str = "euclidean"):
    """Labels (int32) of a chunk for centroids ``C``; raises on NaN/infinity (and zero rows for cosine)."""
    Xm = normalize_rows(X) if metric == "cosine" else X
    labels, min_sq = assign(Xm, C)
    check_finite_block(min_sq, X)
    return labels


def objective_block(X, C, metric: str = "euclidean"):
    """Each row's contribution to the objective, float64: squared distance, or ``1 - cos`` for cosine."""
    Xm = normalize_rows(X) if metric == "cosine" else X
    min_sq = assign(Xm, C)[1]
    check_finite_block(min_sq, X)
    return min_sq.astype(np.float64) * objective_scale(metric)


def labels_objective_block(
    X, C, w=None, metric: str = "euclidean", normalize: bool = True, with_weights: bool = False
):
    """Labels and (weighted) objective terms of a chunk as one ``(n, 2)`` float64 array.

    Column 0: the label; column 1: the row's objective term (``w`` times the squared
    distance, times the metric's :func:`~dkmeans.kernels.cosine.objective_scale`). Rows
    already prepared for the metric (a fit's unit rows) pass ``normalize=False``.
    ``with_weights``: a third column holds the row's weight (1 without weights), for the
    per-cluster sizes and objective of a labelled pass. Raises on NaN or infinity.
    """
    from dkmeans.kernels.namespace import get_namespace

    Xm = normalize_rows(X) if metric == "cosine" and normalize else X
    labels, min_sq = assign(Xm, C)
    check_finite_block(min_sq, X)
    d2 = min_sq.astype(np.float64)
    xp = get_namespace(labels)
    if w is not None:
        w = xp.asarray(w, dtype=xp.float64).reshape(-1)  # host weights of CuPy rows: to the GPU
        d2 = d2 * w
    scale = objective_scale(metric)
    if scale != 1.0:
        d2 = d2 * scale  # exact: 0.5 for cosine
    columns = [labels.astype(xp.float64), d2]
    if with_weights:
        columns.append(xp.ones(d2.shape[0], dtype=xp.float64) if w is None else w)
    return xp.stack(columns, axis=1)


def distances_block(X, C, metric: str = "euclidean"):
    """Distances (n, k) of a chunk to every centroid: Euclidean, or ``1 - cos`` for cosine."""
    out = cosine_distances(X, C) if metric == "cosine" else distances(X, C)
    check_finite_block(out, X)
    return out


__all__ = ["distances_block", "labels_block", "labels_objective_block", "objective_block"]
