"""The cluster-quality scores of :mod:`dkmeans.metrics` on any input: checked once, placed as a fit places it.

The faces give the rows (NumPy, pandas, Dask arrays or DataFrames, in memory or read from
files), a partition (centroids, or a label per row) and weights; this module validates
them as a fit does (:func:`dkmeans.fit.inputs.as_dataset`, :func:`~dkmeans.fit.inputs.check_sample_weight`),
places the rows where a fit would (:func:`dkmeans.fit.placement.placed`: in this
process, persisted on the workers, or read from their source in every pass when they do
not fit the cluster's memory budget; ``out_of_core`` and the Dask config
``dkmeans.out-of-core`` decide as for a fit) and runs :mod:`dkmeans.fit.quality` on them.

Given labels travel as one more column of the rows (:func:`dkmeans.engine.rowwise.with_label_column`),
so they are read in the same passes as the rows; the rows are then read as float64.
In-memory labels of any type are encoded first (their sorted distinct values, as
scikit-learn's ``LabelEncoder``); Dask labels must be numeric.
"""

from __future__ import annotations

import numpy as np

from dkmeans.engine.rowwise import as_array, chunked_rows, with_label_column
from dkmeans.engine.sparse_rows import is_sparse_array
from dkmeans.errors import InvalidDataError
from dkmeans.fit.inputs import (
    Dataset,
    as_dataset,
    check_int,
    check_sample_weight,
    check_user_centroids,
    is_dask_collection,
)
from dkmeans.fit.metric_inputs import prepare_dataset
from dkmeans.fit.placement import placed
from dkmeans.fit.quality import ClusterScores, cluster_scores, sample_silhouette


def _labelled(dataset: Dataset, labels):
    """``dataset`` with ``labels`` as its last column, and the label values (None for Dask labels)."""
    if is_sparse_array(dataset.array) or (
        dataset.local is not None and not isinstance(dataset.local, np.ndarray)
    ):
        raise InvalidDataError(
            "labels with sparse X are not supported: pass centroids or a fitted model"
        )
    if not is_dask_collection(labels):
        values, codes = np.unique(np.asarray(labels).reshape(-1), return_inverse=True)
        if dataset.n_rows is not None and codes.shape[0] != dataset.n_rows:
            raise InvalidDataError(
                f"labels has {codes.shape[0]} entries but X has {dataset.n_rows} rows"
            )
        labels = codes.reshape(-1)
        if dataset.local is not None:
            rows = np.column_stack([dataset.local.astype(np.float64), labels.astype(np.float64)])
            return Dataset(
                chunked_rows(rows), False, rows.shape[1], rows.shape[0], local=rows
            ), values
    else:
        values = None
        n = getattr(labels, "shape", (None,))[0]
        if dataset.n_rows is not None and isinstance(n, (int, np.integer)) and n != dataset.n_rows:
            raise InvalidDataError(f"labels has {n} entries but X has {dataset.n_rows} rows")
    X = dataset.array
    if not is_dask_collection(labels) and any(np.isnan(c) for c in X.chunks[0]):
        X = as_array(dataset.frame, lengths=True)  # in-memory labels need the partitions' lengths
    rows = with_label_column(X, labels)
    return Dataset(rows, True, dataset.n_features + 1, dataset.n_rows), values


def _prepared(X, *, centroids, labels, sample_weight, metric):
    """The checked dataset (labels appended, or rows prepared for ``metric``), weights, centroids and label values."""
    if (centroids is None) == (labels is None):
        raise InvalidDataError("give either centroids or labels")
    dataset = as_dataset(X, name="X")
    weights = check_sample_weight(sample_weight, dataset.n_rows)
    values = None
    if centroids is not None:
        C = np.asarray(centroids.compute() if is_dask_collection(centroids) else centroids)
        centroids = check_user_centroids(
            C,
            C.shape[0] if C.ndim == 2 else 0,
            dataset.n_features,
            dataset.array.dtype,
            name="centroids",
        )
        dataset = prepare_dataset(dataset, metric)
    else:
        dataset, values = _labelled(dataset, labels)
    return dataset, weights, centroids, values


def scores(
    X,
    *,
    centroids=None,
    labels=None,
    sample_weight=None,
    metric: str = "euclidean",
    out_of_core="auto",
    passes: int = 2,
) -> ClusterScores:
    """:func:`dkmeans.fit.quality.cluster_scores` of ``X`` partitioned by ``centroids`` or ``labels``.

    With in-memory labels, ``ClusterScores.labels`` holds the label values themselves.
    """
    dataset, weights, C, values = _prepared(
        X, centroids=centroids, labels=labels, sample_weight=sample_weight, metric=metric
    )
    k = 0 if C is None else C.shape[0]
    with placed(dataset, weights, out_of_core=out_of_core, n_clusters=k, fit=False) as (data, _):
        result = cluster_scores(data, C, metric=metric, passes=passes)
    if values is not None:
        from dataclasses import replace

        result = replace(result, labels=values[result.labels.astype(np.int64)])
    return result


def silhouette(
    X,
    *,
    centroids=None,
    labels=None,
    sample_size=None,
    random_state=None,
    sample_weight=None,
    metric: str = "euclidean",
    out_of_core="auto",
) -> float:
    """:func:`dkmeans.fit.quality.sample_silhouette` of ``X`` (all rows when ``sample_size`` is None)."""
    if sample_size is not None:
        sample_size = check_int("sample_size", sample_size, 1)
    dataset, weights, C, _ = _prepared(
        X, centroids=centroids, labels=labels, sample_weight=sample_weight, metric=metric
    )
    k = 0 if C is None else C.shape[0]
    with placed(dataset, weights, out_of_core=out_of_core, n_clusters=k, fit=False) as (data, _):
        size = data.n_rows if sample_size is None else sample_size
        if size is None:  # rows of unknown count: every row
            size = np.iinfo(np.int64).max
        return sample_silhouette(data, C, size, random_state)


__all__ = ["scores", "silhouette"]
