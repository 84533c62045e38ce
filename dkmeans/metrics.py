"""Clustering quality: internal scores (Calinski-Harabasz, Davies-Bouldin, silhouettes, sizes),
the objective, and comparisons with a reference (Hungarian-matched accuracy, Centroid Index,
adjusted Rand index).

The internal scores take the rows as a fit does (NumPy, pandas, Dask arrays or Dask
DataFrames, in memory or read from files; out of core when they do not fit the cluster,
:mod:`dkmeans.fit.scoring`) and a partition as ``labels_or_model``:

* a fitted :class:`~dkmeans.KMeans` (or anything with ``cluster_centers_``): each row's
  label is its nearest centre, what ``predict`` gives (in the model's metric: with
  ``metric="cosine"`` the scores are those of the normalised rows);
* centroids, a 2-D array ``(k, n_features)``: the same, Euclidean;
* labels, one per row (scikit-learn's signature): NumPy/pandas labels of any type, or
  numeric Dask labels partitioned like ``X`` (e.g. ``model.predict(X)``); they are read
  beside the rows, in the same passes. Cluster means are the means of the labels' rows.

Each says its passes over the data and its memory. They equal scikit-learn's functions on
data in memory up to float rounding, with ``sample_weight`` counting a row as that many
copies of it. Where scikit-learn raises (fewer than 2 clusters, or as many as rows), they
raise the same ``ValueError``.

Label-comparison metrics accept NumPy or Dask label arrays (Dask labels are reduced to a
contingency table on the cluster; only the table comes back).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from dkmeans.errors import InvalidDataError
from dkmeans.fit import inference, label_tables, scoring
from dkmeans.fit.inputs import is_dask_array
from dkmeans.fit.quality import ClusterScores


def objective(X, centroids, sample_weight=None) -> float:
    """Weighted sum of squared distances of the rows of ``X`` to their nearest centroid.

    Parameters
    ----------
    X : ndarray or dask.array.Array, shape (n, d)
        The rows.
    centroids : array-like, shape (k, d)
        The centroids.
    sample_weight : array-like or dask.array.Array, shape (n,), optional
        A row counts as ``sample_weight`` copies of itself.

    Returns
    -------
    float
        The objective (``inertia_`` of a fit with these centroids).
    """
    if not is_dask_array(X):
        X = np.asarray(X)
        if X.dtype not in (np.float32, np.float64):
            X = X.astype(np.float64)
    return inference.objective(
        X, np.asarray(centroids).astype(X.dtype), sample_weight=sample_weight
    )


def contingency_matrix(labels_true, labels_pred) -> np.ndarray:
    """Counts ``n_ij`` of rows with true class ``i`` and predicted cluster ``j`` (empty rows/columns dropped).

    Dask labels (integers) are counted on the cluster (``dkmeans.fit.label_tables.pair_count_table``);
    only the table comes back.

    Parameters
    ----------
    labels_true : array-like or dask.array.Array of shape (n_samples,)
        The known classes.
    labels_pred : array-like or dask.array.Array of shape (n_samples,)
        The clusters, e.g. ``labels_`` of a fit.

    Returns
    -------
    ndarray of shape (n_classes, n_clusters), int64
        The counts, classes and clusters in sorted order.
    """
    table = label_tables.pair_count_table(labels_true, labels_pred)
    return table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]


def accuracy(labels_true, labels_pred) -> float:
    """Share of rows whose cluster maps to their class under the best one-to-one matching.

    The matching maximises the matched counts (Hungarian algorithm,
    :func:`scipy.optimize.linear_sum_assignment`); unmatched clusters count as errors.

    Parameters
    ----------
    labels_true : array-like or dask.array.Array of shape (n_samples,)
        The known classes.
    labels_pred : array-like or dask.array.Array of shape (n_samples,)
        The clusters, e.g. ``labels_`` of a fit.

    Returns
    -------
    float
        In [0, 1]; 1 when the clusters are the classes up to their names.
    """
    table = contingency_matrix(labels_true, labels_pred)
    rows, cols = linear_sum_assignment(-table)
    return float(table[rows, cols].sum() / table.sum())


def _pairs(x):
    x = np.asarray(x, dtype=np.float64)
    return x * (x - 1) / 2


def adjusted_rand_index(labels_true, labels_pred) -> float:
    """Adjusted Rand index (Hubert and Arabie 1985), from the contingency table.

    Parameters
    ----------
    labels_true : array-like or dask.array.Array of shape (n_samples,)
        The known classes.
    labels_pred : array-like or dask.array.Array of shape (n_samples,)
        The clusters, e.g. ``labels_`` of a fit.

    Returns
    -------
    float
        1 for identical partitions, about 0 for independent ones (scikit-learn's
        ``adjusted_rand_score``).
    """
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

    Parameters
    ----------
    centroids : array-like of shape (k, n_features)
        The fitted centroids.
    reference : array-like of shape (k_ref, n_features)
        The reference centroids (e.g. the ground truth's, :func:`class_means`).

    Returns
    -------
    int
        The number of clusters placed wrongly.
    """
    A = np.asarray(centroids, dtype=np.float64)
    B = np.asarray(reference, dtype=np.float64)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[1]:
        raise InvalidDataError(
            f"centroid sets must be 2-D with equal widths, got {A.shape} and {B.shape}"
        )
    return max(_orphans(A, B), _orphans(B, A))


def class_means(X, labels) -> np.ndarray:
    """Mean of the rows of each class (sorted class order), e.g. the ground truth's centroids.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        The rows (in memory).
    labels : array-like of shape (n_samples,)
        Each row's class.

    Returns
    -------
    ndarray of shape (n_classes, n_features), float64
        The means, in sorted class order.
    """
    return label_tables.class_means(X, labels)


# -- internal scores: how good is a partition? ------------------------------------------------------
def _partition(labels_or_model) -> dict:
    """``centroids`` and ``metric``, or ``labels``, from a fitted model, centroids or labels."""
    if hasattr(labels_or_model, "cluster_centers_") or hasattr(labels_or_model, "get_params"):
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(labels_or_model, "cluster_centers_")
        metric = getattr(labels_or_model, "_metric", None) or getattr(
            labels_or_model, "metric", "euclidean"
        )
        return dict(centroids=np.asarray(labels_or_model.cluster_centers_), metric=metric)
    values = labels_or_model
    if not hasattr(values, "ndim"):
        values = np.asarray(values)
    if values.ndim == 2 and not hasattr(values, "to_dask_array"):
        return dict(centroids=values)
    if values.ndim != 1:
        raise InvalidDataError(
            f"labels_or_model: expected labels (1-D), centroids (2-D) or a fitted model, "
            f"got an array of {values.ndim} dimensions"
        )
    return dict(labels=labels_or_model)


def _checked(result: ClusterScores) -> ClusterScores:
    """scikit-learn's error where its scores are undefined."""
    if not result.valid:
        raise ValueError(
            f"Number of labels is {result.n_labels}. Valid values are 2 to n_samples - 1 (inclusive)"
        )
    return result


def cluster_scores(X, labels_or_model, *, sample_weight=None, out_of_core="auto") -> ClusterScores:
    """Every internal score of a partition of ``X``, in two passes over the data.

    Read more in the :ref:`User Guide <guide-evaluating>`.

    Parameters
    ----------
    X : array-like, pandas DataFrame, Dask array or Dask DataFrame of shape (n_samples, n_features)
    labels_or_model : fitted KMeans, centroids (n_clusters, n_features) or labels (n_samples,)
        See the module docstring.
    sample_weight : array-like or Dask array of shape (n_samples,), optional
        A row counts as ``sample_weight`` copies of itself.
    out_of_core : {"auto", True, False}
        Where the rows live during the passes, as for a fit.

    Returns
    -------
    dkmeans.fit.quality.ClusterScores
        ``calinski_harabasz``, ``davies_bouldin``, ``simplified_silhouette``, the weighted
        ``sizes``, ``cluster_objective`` and ``imbalance`` per cluster; scores NaN where
        scikit-learn's are undefined (``valid`` False). Two passes; O(k d) memory on
        the caller and per task, plus the Davies-Bouldin ratios in blocks of about 32 MiB.
    """
    return scoring.scores(
        X, **_partition(labels_or_model), sample_weight=sample_weight, out_of_core=out_of_core
    )


def calinski_harabasz_score(X, labels_or_model, *, sample_weight=None, out_of_core="auto") -> float:
    """Calinski-Harabasz index (variance ratio criterion; higher is better), on distributed data.

    scikit-learn's :func:`sklearn.metrics.calinski_harabasz_score` on data of any size.

    ``(B / (k - 1)) / (W / (n - k))``: ``B`` the weighted squared distances of the cluster
    means to the overall mean, ``W`` those of the rows to their cluster's mean, ``n`` the
    total weight, ``k`` the clusters holding weight. One pass; ``W`` is exact (per-chunk
    scatter combined by Chan's update, not ``sum |x|^2 - n |m|^2``); O(k d) memory.

    Read more in the :ref:`User Guide <guide-evaluating>`.

    Parameters
    ----------
    X : array-like, pandas DataFrame, Dask array or Dask DataFrame of shape (n_samples, n_features)
        The rows.
    labels_or_model : fitted KMeans, centroids (n_clusters, n_features) or labels (n_samples,)
        The partition (see :func:`cluster_scores`).
    sample_weight : array-like or Dask array of shape (n_samples,), optional
        A row counts as ``sample_weight`` copies of itself.
    out_of_core : {"auto", True, False}
        Where the rows live during the pass, as for a fit.

    Returns
    -------
    float
        The index.

    Raises
    ------
    ValueError
        Fewer than 2 clusters, or as many as rows (scikit-learn's error).
    """
    part = _partition(labels_or_model)
    return _checked(
        scoring.scores(X, **part, sample_weight=sample_weight, out_of_core=out_of_core, passes=1)
    ).calinski_harabasz


def davies_bouldin_score(X, labels_or_model, *, sample_weight=None, out_of_core="auto") -> float:
    """Davies-Bouldin index (lower is better, 0 best): scikit-learn's, on distributed data.

    The mean over clusters ``i`` of ``max_{j != i} (s_i + s_j) / |m_i - m_j|``, ``m`` the
    clusters' means (of their rows, not fitted centroids) and ``s`` the mean distance of
    their rows to them. Two passes (the means, then the distances); O(k d) memory, and the
    ``k x k`` ratios in blocks of about 32 MiB.

    Read more in the :ref:`User Guide <guide-evaluating>`.

    Parameters
    ----------
    X : array-like, pandas DataFrame, Dask array or Dask DataFrame of shape (n_samples, n_features)
        The rows.
    labels_or_model : fitted KMeans, centroids (n_clusters, n_features) or labels (n_samples,)
        The partition (see :func:`cluster_scores`).
    sample_weight : array-like or Dask array of shape (n_samples,), optional
        A row counts as ``sample_weight`` copies of itself.
    out_of_core : {"auto", True, False}
        Where the rows live during the passes, as for a fit.

    Returns
    -------
    float
        The index.

    Raises
    ------
    ValueError
        Fewer than 2 clusters, or as many as rows (scikit-learn's error).
    """
    part = _partition(labels_or_model)
    return _checked(
        scoring.scores(X, **part, sample_weight=sample_weight, out_of_core=out_of_core)
    ).davies_bouldin


def silhouette_score(
    X,
    labels_or_model,
    *,
    sample_size=None,
    random_state=None,
    simplified: bool = False,
    sample_weight=None,
    out_of_core="auto",
) -> float:
    """Silhouette coefficient (in [-1, 1], higher is better): exact on a sample, or simplified on all rows.

    Read more in the :ref:`User Guide <guide-evaluating>`.

    Parameters
    ----------
    X : array-like, pandas DataFrame, Dask array or Dask DataFrame of shape (n_samples, n_features)
        The rows.
    labels_or_model : fitted KMeans, centroids (n_clusters, n_features) or labels (n_samples,)
        The partition (see :func:`cluster_scores`).
    sample_size : int, optional
        The exact silhouette (:func:`sklearn.metrics.silhouette_score`) of a sample of this
        many rows drawn without replacement, uniformly (proportionally to ``sample_weight``
        with weights), by keys of ``random_state`` and each row's global index, so the
        sample does not depend on chunking, workers or placement: scikit-learn's value on
        the same rows. One pass and the gather of the sample (``sample_size x n_features``),
        then scikit-learn's O(sample_size^2) work on the caller. None: every row (gathered
        to the caller: for data that fits there).
    random_state : None, int, Generator or RandomState
        Seeds the sample (None: fresh entropy).
    simplified : bool
        The simplified silhouette of every row instead: ``(b - a) / max(a, b)`` with ``a``
        the distance to the row's own centre and ``b`` to the nearest other centre
        (centroids, or the clusters' means for labels), weighted mean. One pass with a model
        or centroids, two with labels (the means first); O(k d) memory. A different number
        from the silhouette (Hruschka et al. 2004), at the cost of a pass.
    sample_weight : array-like or Dask array of shape (n_samples,), optional
        A row counts as ``sample_weight`` copies of itself.
    out_of_core : {"auto", True, False}
        Where the rows live during the passes, as for a fit.

    Returns
    -------
    float
        The silhouette coefficient.

    Raises
    ------
    ValueError
        Fewer than 2 clusters, or as many as rows (in the sample for the exact score).
    """
    part = _partition(labels_or_model)
    if simplified:
        passes = 1 if "centroids" in part else 2
        return _checked(
            scoring.scores(
                X, **part, sample_weight=sample_weight, out_of_core=out_of_core, passes=passes
            )
        ).simplified_silhouette
    return scoring.silhouette(
        X,
        **part,
        sample_size=sample_size,
        random_state=random_state,
        sample_weight=sample_weight,
        out_of_core=out_of_core,
    )
