"""``dkmeans.KMeans``: a scikit-learn compatible estimator running on Dask.

This module is the one place that maps scikit-learn's names onto the drivers'
(``n_clusters`` -> k, ``max_iter``, ``tol`` scaled by the mean feature variance as in
scikit-learn, ``cluster_centers_``, ``inertia_``, ``n_iter_``).
"""

from __future__ import annotations

import logging
import sys

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from dkmeans import init as init_strategies
from dkmeans._graph import PersistedData
from dkmeans._random import resolve_seed
from dkmeans._validation import (
    FLOAT_DTYPES,
    Dataset,
    check_centroids,
    check_dask_array,
    check_float,
    check_int,
    check_n_clusters_vs_rows,
    check_sample_weight,
    chunk_local_array,
    data_errors,
    is_dask_collection,
)
from dkmeans.cluster import get_client
from dkmeans.errors import InvalidDataError, InvalidParameterError
from dkmeans.kernels import assign, column_moments, combine_moments, distances
from dkmeans.lloyd import CentroidShift, IterationRecord, fit_lloyd

logger = logging.getLogger("dkmeans")

ALGORITHMS = ("lloyd",)


def _moments_chunk(X, w, offset):
    return column_moments(X)


def _labels_block(X, C):
    return assign(X, C)[0]


def _sq_dist_block(X, C):
    return assign(X, C)[1].astype(np.float64)


def _distances_block(X, C):
    return distances(X, C)


def _progress_printer(stream):
    def show(record: IterationRecord) -> None:
        print(
            f"iteration {record.iteration:4d}  objective {record.objective:.6e}  "
            f"shift {record.centroid_shift:.3e}  empty fixed {record.empty_clusters_fixed}  "
            f"{record.seconds * 1e3:8.1f} ms",
            file=stream,
            flush=True,
        )

    return show


class KMeans(ClusterMixin, TransformerMixin, BaseEstimator):
    """K-means clustering on a Dask cluster (Lloyd's algorithm).

    Parameters
    ----------
    n_clusters : int, default 8
        Number of clusters.
    init : {"random"} or array-like of shape (n_clusters, n_features), default "random"
        ``"random"``: ``n_clusters`` distinct rows drawn uniformly (proportionally to
        ``sample_weight`` when given), reproducible from ``random_state`` whatever the
        chunking. An array gives the initial centroids.
    max_iter : int, default 300
        Maximum number of Lloyd iterations.
    tol : float, default 1e-4
        Relative tolerance as in scikit-learn: stop when the total squared centroid
        shift is at most ``tol`` times the mean variance of the features.
    random_state : int, numpy.random.Generator, RandomState or None
        Seed of the initialisation.
    algorithm : {"lloyd"}, default "lloyd"
    verbose : int, default 0
        Print one line per iteration (objective, centroid shift, time) when > 0.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        In the dtype of the training data (float32 stays float32).
    labels_ : ndarray or dask.array.Array of shape (n_samples,), int32
        NumPy for in-memory input; a persisted Dask array for Dask input.
    inertia_ : float
        Weighted sum of squared distances to the closest centroid (of ``cluster_centers_``).
    n_iter_ : int
        Number of Lloyd iterations (centroid updates) run.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Column names, when fitted on a DataFrame with string column names.
    history_ : list of dict
        Per iteration: objective, centroid_shift, empty_clusters_fixed, seconds.
    stop_reason_ : str
        ``"centroid-shift"``, ``"fixed-point"`` or ``"max_iter"``.

    Examples
    --------
    >>> import numpy as np
    >>> from dkmeans import KMeans
    >>> X = np.array([[1, 2], [1, 4], [1, 0], [10, 2], [10, 4], [10, 0]], dtype=float)
    >>> km = KMeans(n_clusters=2, random_state=0).fit(X)   # doctest: +SKIP
    >>> km.predict([[0, 0], [12, 3]])                       # doctest: +SKIP
    """

    def __init__(
        self,
        n_clusters=8,
        *,
        init="random",
        max_iter=300,
        tol=1e-4,
        random_state=None,
        algorithm="lloyd",
        verbose=0,
    ):
        self.n_clusters = n_clusters
        self.init = init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.algorithm = algorithm
        self.verbose = verbose

    # -- parameters ---------------------------------------------------------------
    def _check_params(self):
        k = check_int("n_clusters", self.n_clusters, 1)
        max_iter = check_int("max_iter", self.max_iter, 1)
        tol = check_float("tol", self.tol, 0.0)
        check_int("verbose", self.verbose, 0)
        if self.algorithm not in ALGORITHMS:
            raise InvalidParameterError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if isinstance(self.init, str):
            if self.init not in init_strategies.STRATEGIES:
                raise InvalidParameterError(
                    f"init must be an array of centroids or one of {sorted(init_strategies.STRATEGIES)}, got {self.init!r}"
                )
        elif callable(self.init):
            raise InvalidParameterError("init must be an array of centroids or a strategy name, not a callable")
        return k, max_iter, tol

    # -- data ---------------------------------------------------------------------
    def _fit_dataset(self, X, n_workers: int) -> Dataset:
        if is_dask_collection(X):
            arr = check_dask_array(X)
            self.n_features_in_ = int(arr.shape[1])
            if hasattr(X, "columns"):
                self.feature_names_in_ = np.asarray([str(c) for c in X.columns], dtype=object)
            elif hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
            n = None if np.isnan(arr.shape[0]) else int(arr.shape[0])
            return Dataset(arr, True, self.n_features_in_, n)
        with data_errors("X"):
            X = validate_data(self, X, dtype=list(FLOAT_DTYPES), reset=True, ensure_min_samples=1)
        return Dataset(chunk_local_array(X, n_workers), False, X.shape[1], X.shape[0])

    def _check_test_data(self, X):
        """Validate predict/transform input; returns a NumPy array or a Dask array."""
        check_is_fitted(self, "cluster_centers_")
        if is_dask_collection(X):
            arr = check_dask_array(X)
            if arr.shape[1] != self.n_features_in_:
                raise InvalidDataError(
                    f"X has {arr.shape[1]} features, but KMeans is expecting {self.n_features_in_} features as input."
                )
            return arr
        with data_errors("X"):
            return validate_data(self, X, dtype=list(FLOAT_DTYPES), reset=False)

    # -- fit ----------------------------------------------------------------------
    def fit(self, X, y=None, sample_weight=None):
        """Compute k-means clustering.

        Parameters
        ----------
        X : array-like, pandas DataFrame, Dask array or Dask DataFrame of shape (n_samples, n_features)
        y : ignored
        sample_weight : array-like or Dask array of shape (n_samples,), optional
            Non-negative weights of the samples.

        Returns
        -------
        self : KMeans
        """
        k, max_iter, tol = self._check_params()
        client = get_client()
        n_workers = max(1, len(client.scheduler_info(n_workers=-1)["workers"]))
        dataset = self._fit_dataset(X, n_workers)
        dtype = dataset.array.dtype
        C0 = None
        if not isinstance(self.init, str):
            C0 = check_centroids(self.init, k, dataset.n_features, dtype, name="init")
        if dataset.n_rows is not None:
            check_n_clusters_vs_rows(k, dataset.n_rows)
        weights = check_sample_weight(sample_weight, dataset)
        seed = resolve_seed(self.random_state)

        persisted = PersistedData(client, dataset.array, weights)
        try:
            check_n_clusters_vs_rows(k, persisted.n_rows)
            with np.errstate(invalid="ignore", over="ignore"):  # non-finite data: reported below
                moments = persisted.map_reduce(_moments_chunk, combine_moments)
                mean_variance = float(np.mean(moments.m2 / moments.count))
            if not np.isfinite(mean_variance):
                raise InvalidDataError(
                    "Input contains NaN or infinity (found in the first pass over the data): "
                    "remove or impute non-finite values before clustering."
                )
            if C0 is None:
                C0 = init_strategies.get_strategy(self.init)(persisted, k, seed)
            outcome = fit_lloyd(
                persisted,
                C0,
                max_iter=max_iter,
                stop_rule=CentroidShift(tol * mean_variance, inclusive=True),
                on_iteration=_progress_printer(sys.stdout) if self.verbose else None,
            )
        finally:
            persisted.release()
        run = outcome.result
        # attributes are set only once everything succeeded: no half-fitted estimator
        self.cluster_centers_ = run.centroids
        self.labels_ = outcome.labels if dataset.is_dask else outcome.labels.compute()
        self.inertia_ = outcome.objective
        self.n_iter_ = run.n_iter
        self.history_ = [r.as_dict() for r in run.history]
        self.stop_reason_ = run.stop_reason
        return self

    # -- inference ----------------------------------------------------------------
    def predict(self, X):
        """Index of the closest cluster centre for each sample.

        Returns
        -------
        labels : ndarray of int32, or a lazy Dask array for Dask input
        """
        X = self._check_test_data(X)
        C = self.cluster_centers_
        if isinstance(X, da.Array):
            return X.map_blocks(_labels_block, C, dtype=np.int32, drop_axis=1, meta=np.empty((0,), np.int32))
        return assign(X, C)[0]

    def transform(self, X):
        """Euclidean distances to every cluster centre, shape (n_samples, n_clusters)."""
        X = self._check_test_data(X)
        C = self.cluster_centers_
        if isinstance(X, da.Array):
            return X.map_blocks(
                _distances_block, C, dtype=X.dtype, chunks=(X.chunks[0], (C.shape[0],)),
                meta=np.empty((0, 0), X.dtype),
            )
        return distances(X, C)

    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit, then return the distances of ``X`` to the cluster centres."""
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def score(self, X, y=None, sample_weight=None):
        """Opposite of the (weighted) objective of ``X`` for the fitted centres."""
        X = self._check_test_data(X)
        C = self.cluster_centers_
        if isinstance(X, da.Array):
            d2 = X.map_blocks(_sq_dist_block, C, dtype=np.float64, drop_axis=1)
            if sample_weight is not None:
                d2 = d2 * da.asarray(sample_weight).rechunk((X.chunks[0],))
            return -float(get_client().compute(d2.sum(), sync=True))
        d2 = assign(X, C)[1].astype(np.float64)
        if sample_weight is not None:
            w = np.asarray(sample_weight, dtype=np.float64)
            if w.shape != d2.shape:
                raise InvalidDataError(f"sample_weight has shape {w.shape} but X has {d2.shape[0]} rows")
            d2 = d2 * w
        return -float(d2.sum())
