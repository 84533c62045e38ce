"""``dkmeans.KMeans``: a scikit-learn compatible estimator running on Dask.

This module is the one place that maps scikit-learn's names onto the drivers'
(``n_clusters`` -> k, ``max_iter``, ``tol`` scaled by the mean feature variance as in
scikit-learn, ``cluster_centers_``, ``inertia_``, ``n_iter_``).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import TYPE_CHECKING

import numpy as np
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    TransformerMixin,
)
from sklearn.utils.validation import check_is_fitted, validate_data

from dkmeans import _callbacks
from dkmeans._lazy import lazy_module
from dkmeans.errors import InvalidDataError, InvalidParameterError
from dkmeans.fit import params as _params
from dkmeans.fit.options import auto_n_init, init_options
from dkmeans.fit.progress import Progress as _Progress
from dkmeans.fit.progress import finish_progress as _finish_progress
from dkmeans.fit.progress import history_dicts
from dkmeans.fit.quality import imbalance_factor
from dkmeans.fit.spec import FitSpec

if TYPE_CHECKING:
    from dkmeans.fit.inputs import Dataset

# The fit service, its data checks and inference load Dask's array collection and distributed:
# each is imported at its first use (a fit, predict, ...), so that importing (and constructing)
# an estimator loads what scikit-learn's does (see dkmeans._lazy). The model files' module is
# light, but only save and load read it.
_inputs = lazy_module("dkmeans.fit.inputs")
_inference = lazy_module("dkmeans.fit.inference")
_model_files = lazy_module("dkmeans.fit.model_files")
_service = lazy_module("dkmeans.fit.service")


def _progress(verbose):
    """The progress callback of a fit (:class:`~dkmeans.fit.progress.Progress`; tests replace this seam)."""
    return _Progress(verbose)


def _progress_for(verbose, max_iter: int):
    progress = _progress(verbose)
    if isinstance(progress, _Progress):
        progress.max_iter = max_iter
    return progress


def _head_rows(X, n: int):
    """At most ``n`` rows of ``X`` in memory: a Dask collection's first rows, else ``X``."""
    if _inputs.is_dask_dataframe(X):
        return X.head(n, npartitions=-1)
    if _inputs.is_dask_collection(X):
        return X[:n].compute()
    if hasattr(X, "toarray"):  # scipy.sparse: the drawing needs dense rows
        return X[:n].toarray()
    return X


class _KMeansBase(
    _callbacks.Mixin, ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin, BaseEstimator
):
    """What :class:`KMeans` and :class:`~dkmeans.MiniBatchKMeans` share: data checks, fit
    bookkeeping, model files and inference. A subclass gives ``__init__`` and ``_fit_spec``."""

    # -- data ---------------------------------------------------------------------
    def _fit_dataset(self, X, *, reset: bool = True, in_memory: bool = False) -> Dataset:
        """The fit's input through the one dataset check; records ``n_features_in_`` and the feature names.

        ``in_memory`` (``partial_fit``'s batch): the rows stay in this process whatever ``device``.
        """
        X = _inputs.as_local_frame(X)  # polars, pyarrow: as pandas, every column type kept
        if _inputs.is_dataframe(X):
            _inputs.select_columns(X)  # every column must be numeric: say which are not
        dataset = _inputs.as_dataset(
            X,
            device=None if in_memory else self.device,
            check_local=functools.partial(
                validate_data,
                self,
                accept_sparse="csr",
                dtype=list(_inputs.FLOAT_DTYPES),
                reset=reset,
                ensure_min_samples=1,
            ),
            missing=self._missing(),
        )
        if dataset.is_dask or _inputs.is_cupy_array(
            X
        ):  # validate_data records them for in-memory host input
            self.n_features_in_ = dataset.n_features
        if dataset.is_dask:
            if dataset.frame is not None and all(isinstance(c, str) for c in dataset.frame.columns):
                self.feature_names_in_ = _inputs.feature_names(dataset.frame)
            elif hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        return dataset

    def _missing(self) -> str:
        """The missing-value policy (``missing``; "error" for a model saved before it existed)."""
        return _inputs.check_missing_policy(getattr(self, "missing", "error"))

    def _check_test_data(self, X):
        """Validate predict/transform input: ``(rows, kept)``, the rows an array, a Dask array or a Dask DataFrame.

        ``kept``: with ``missing="skip"``, the mask of the in-memory rows with no missing
        value (the rows returned are those); None otherwise.
        """
        check_is_fitted(self, "cluster_centers_")
        if not _inputs.is_cupy_array(X):
            X, kept = _inputs.test_rows(X, missing=self._missing())
            if kept is not None and not kept.any():  # no row to label: every label is -1
                return np.empty((0, self.n_features_in_), dtype=self.cluster_centers_.dtype), kept
            return self._checked_test_rows(X), kept
        return self._checked_test_rows(X), None

    def _checked_test_rows(self, X):
        if _inputs.is_cupy_array(X):
            X = _inputs.check_cupy_array(X)  # metadata checks and dtype; stays on the GPU
            if X.shape[1] != self.n_features_in_:
                raise InvalidDataError(
                    f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                    f"{self.n_features_in_} features as input."
                )
            return X
        if _inputs.is_dask_dataframe(X):
            if hasattr(self, "feature_names_in_"):
                _inputs.check_feature_names(X, self.feature_names_in_)
            X = _inputs.select_columns(X)
            if len(X.columns) != self.n_features_in_:
                raise InvalidDataError(
                    f"X has {len(X.columns)} features, but {type(self).__name__} is expecting "
                    f"{self.n_features_in_} features as input."
                )
            return X
        if _inputs.is_dataframe(X):
            _inputs.select_columns(X)
        if _inputs.is_dask_collection(X):
            arr = _inputs.check_dask_array(X)
            if arr.shape[1] != self.n_features_in_:
                raise InvalidDataError(
                    f"X has {arr.shape[1]} features, but {type(self).__name__} is expecting "
                    f"{self.n_features_in_} features as input."
                )
            return arr
        with _inputs.data_errors("X"):
            return validate_data(
                self, X, accept_sparse="csr", dtype=list(_inputs.FLOAT_DTYPES), reset=False
            )

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
        return self._fit_managed(X, y, sample_weight)

    @_callbacks.managed  # scikit-learn's callbacks (where it has them) are torn down at the end
    def _fit_managed(self, X, y, sample_weight):
        spec = self._fit_spec()
        progress = spec.on_iteration
        tasks = _callbacks.FitTasks.start(self, X, y, sample_weight, spec.n_runs)
        # a fit without per-record progress (BisectingKMeans'): its task tree is the fit alone
        if isinstance(progress, _Progress):
            progress.tasks = tasks
            spec = dataclasses.replace(spec, **progress.hooks())
        fitted_before = {name: value for name, value in vars(self).items() if name.endswith("_")}
        try:
            fitted = self._fit(X, sample_weight, spec)
        except BaseException:
            # a failed (or interrupted) fit leaves the estimator as it was: no half-fitted state
            for name in [n for n in vars(self) if n.endswith("_") and n not in fitted_before]:
                delattr(self, name)
            vars(self).update(fitted_before)
            raise
        if tasks is not None:
            tasks.finish(fitted=True)
        return fitted

    def _fit(self, X, sample_weight, spec: FitSpec):
        result = _service.run_fit(spec, self._fit_dataset(X), sample_weight)
        _finish_progress(spec)
        # attributes are set only once everything succeeded (fit() restores them on failure)
        return self._fitted(result, spec)

    def _fitted(self, result, spec: FitSpec):
        """The fitted attributes from the fit service's result (a fit's, or one k's of a sweep)."""
        self.cluster_centers_ = result.centroids
        self.labels_ = result.labels
        self._n_features_out = result.centroids.shape[0]
        self.inertia_ = result.objective
        self.n_iter_ = result.n_iter
        self.history_ = history_dicts(result.history)
        self.stop_reason_ = result.stop_reason
        self.data_mode_ = result.data_mode
        self.n_passes_ = result.n_passes
        if result.capacity_passes is not None:  # size caps: each capacitated assignment's passes
            self.capacity_passes_ = list(result.capacity_passes)
        # per cluster, from the final assignment's pass (no pass of their own)
        self.cluster_sizes_ = result.cluster_sizes
        self.cluster_inertia_ = result.cluster_objective
        self.imbalance_ = imbalance_factor(result.cluster_sizes)
        self._metric = spec.metric  # predict, transform and score use the fitted metric
        return self

    # -- notebook -------------------------------------------------------------------
    def plot(self, X=None, *, max_points: int = 20_000):
        """The fit in a new matplotlib Figure: the objective per step, and with ``X`` its clusters.

        Parameters
        ----------
        X : array-like, pandas or Dask DataFrame, or Dask array, optional
            Rows to draw, coloured by their predicted cluster, beside the history: at most
            ``max_points`` of them (the first rows of a Dask collection, read from the cluster;
            a random sample of in-memory rows), projected on their first two principal axes
            when they have more than two features.
        max_points : int

        Returns
        -------
        matplotlib.figure.Figure
            A notebook shows it once, as the cell's value; nothing changes matplotlib's backend
            (see ``dkmeans.plot``). scikit-learn's HTML view of the estimator is unchanged.
        """
        from dkmeans.plot import plot_fit

        check_is_fitted(self, "cluster_centers_")
        if X is None:
            return plot_fit(self.history_)
        sample = _head_rows(X, max_points)
        rows = np.asarray(
            _inputs.select_columns(sample) if _inputs.is_dataframe(sample) else sample
        )
        return plot_fit(
            self.history_, rows, self.predict(sample), self.cluster_centers_, max_points=max_points
        )

    # -- model files ----------------------------------------------------------------
    def save(self, path):
        """Write the fitted model to a safe model file (``.npz`` arrays + JSON, never pickle).

        The file holds the centroids, the parameters, feature names, dtype, objective,
        iteration count, history and the cluster sizes and objectives; not the training labels.

        Parameters
        ----------
        path : str or path-like
            The file to write (exactly this path).

        Returns
        -------
        pathlib.Path
            The file written.
        """
        check_is_fitted(self, "cluster_centers_")
        fitted = {
            name: getattr(self, f"{name}_", None)
            for name in (
                "cluster_centers",
                "n_features_in",
                "feature_names_in",
                "inertia",
                "n_iter",
                "stop_reason",
                "history",
                "cluster_sizes",
                "cluster_inertia",
            )
        }
        fitted["feature_names"] = fitted.pop("feature_names_in")
        return _model_files.save_fitted(
            path, f"dkmeans.{type(self).__name__}", self.get_params(), fitted
        )

    @classmethod
    def load(cls, path) -> KMeans:
        """A fitted :class:`KMeans` read from a file written by :meth:`save`.

        Parameters
        ----------
        path : str or path-like
            The model file.

        Returns
        -------
        KMeans
            The fitted estimator.

        Raises
        ------
        dkmeans.io.ModelFileError
            The file is missing, damaged, altered, pickled or of another version.
        """
        params, fitted = _model_files.read_fitted(path, f"dkmeans.{cls.__name__}")
        try:
            est = cls(**params)
        except TypeError as exc:
            raise _model_files.ModelFileError(
                f"{path}: parameters do not fit this dkmeans version ({exc})"
            ) from None
        vars(est).update(fitted)
        est._n_features_out = est.cluster_centers_.shape[0]
        est._metric = getattr(est, "metric", "euclidean")
        return est

    # -- inference ----------------------------------------------------------------
    def predict(self, X):
        """Index of the closest cluster centre for each sample.

        Parameters
        ----------
        X : {array-like, sparse matrix, DataFrame, Dask array} of shape (n_samples, n_features)
            Rows with the training data's features.

        Returns
        -------
        labels : ndarray of int32, or a lazy Dask array for Dask input
            A Dask Series on the input's index for a Dask DataFrame.
        """
        X, kept = self._check_test_data(X)
        return _inputs.expand_labels(
            _inference.labels(
                X, self.cluster_centers_, self._fitted_metric(), missing=self._missing()
            ),
            kept,
        )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # scipy.sparse input is taken as CSR and never densified
        return tags

    def _fitted_metric(self) -> str:
        """The metric the centroids were fitted in (``metric`` for a loaded or unfitted estimator)."""
        return getattr(self, "_metric", None) or getattr(self, "metric", "euclidean")

    def transform(self, X):
        """Euclidean distances to every cluster centre, shape (n_samples, n_clusters).

        With ``metric="cosine"``: cosine distances ``1 - cos(x, c)``, in [0, 2]. A Dask
        DataFrame in gives a Dask DataFrame out, with columns ``get_feature_names_out()``
        and the input's index.

        Parameters
        ----------
        X : {array-like, sparse matrix, DataFrame, Dask array} of shape (n_samples, n_features)
            Rows with the training data's features.

        Returns
        -------
        ndarray, Dask array or Dask DataFrame of shape (n_samples, n_clusters)
            The distances.
        """
        X, kept = self._check_test_data(X)
        out = _inference.distances(
            X,
            self.cluster_centers_,
            self._fitted_metric(),
            names=self.get_feature_names_out(),
            missing=self._missing(),
        )
        if kept is not None:  # rows with a missing value: NaN distances
            full = np.full((kept.shape[0], self.cluster_centers_.shape[0]), np.nan, dtype=out.dtype)
            full[kept] = out
            out = full
        return out

    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit, then return the distances of ``X`` to the cluster centres.

        Parameters
        ----------
        X : {array-like, sparse matrix, DataFrame, Dask array} of shape (n_samples, n_features)
            The training rows.
        y : ignored
            Not used, present for scikit-learn's API.
        sample_weight : array-like or Dask array of shape (n_samples,), optional
            Non-negative weights of the samples.

        Returns
        -------
        ndarray, Dask array or Dask DataFrame of shape (n_samples, n_clusters)
            The distances, as :meth:`transform` gives them.
        """
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def score(self, X, y=None, sample_weight=None):
        """Opposite of the (weighted) objective of ``X`` for the fitted centres (fitted metric).

        With ``missing="skip"`` rows with a missing value are left out.

        Parameters
        ----------
        X : {array-like, sparse matrix, DataFrame, Dask array} of shape (n_samples, n_features)
            Rows with the training data's features.
        y : ignored
            Not used, present for scikit-learn's API.
        sample_weight : array-like or Dask array of shape (n_samples,), optional
            Non-negative weights of the samples.

        Returns
        -------
        float
            Minus the objective (higher is better, as scikit-learn's scores).
        """
        from dkmeans.engine.client import get_client  # the one engine name a face may use

        X, kept = self._check_test_data(X)
        dask_input = _inputs.is_dask_collection(X)
        n_rows = None if dask_input else X.shape[0]
        if kept is not None and sample_weight is not None:  # the weights of the rows scored
            sample_weight = np.asarray(sample_weight)
            if sample_weight.ndim != 1 or sample_weight.shape[0] != kept.shape[0]:
                raise InvalidDataError(
                    f"sample_weight has {sample_weight.size} entries but X has {kept.shape[0]} rows"
                )
            sample_weight = sample_weight[kept]
        weights = _inputs.check_sample_weight(sample_weight, n_rows, positive_sum=False)
        return -_inference.objective(
            X,
            self.cluster_centers_,
            self._fitted_metric(),
            weights,
            client=get_client() if dask_input else None,
            missing=self._missing(),
        )

    def _checked_params(self) -> dict:
        """The estimator's parameters checked against the shared table, with the checks both faces add."""
        p = _params.check("estimator", self.get_params())
        if p["max_iter"] < 1:
            raise InvalidParameterError(f"max_iter must be an integer >= 1, got {self.max_iter}")
        init = self.init
        is_array = hasattr(init, "__array__") or isinstance(init, (list, tuple))
        if (isinstance(init, str) and init not in _params.INIT_STRATEGIES) or not (
            isinstance(init, str) or callable(init) or is_array
        ):
            # scikit-learn's wording; an InvalidParameterError is also a TypeError, as scikit-learn's is
            raise InvalidParameterError(
                f"The 'init' parameter of {type(self).__name__} must be a str among "
                f"{{{', '.join(repr(s) for s in _params.INIT_STRATEGIES)}}}, a callable or an array-like. "
                f"Got {init!r} instead."
            )
        return p

    def _job_params(self) -> dict:
        """The parameters a checkpoint's job is checked against: JSON values, without the
        checkpoint's own parameters, ``verbose`` and ``prune`` (which do not change the result)."""
        params = self.get_params()
        for name in ("verbose", "checkpoint", "checkpoint_every", "prune"):
            params.pop(name, None)
        if (
            params.get("missing") == "error"
        ):  # the default: checkpoints written before the parameter resume
            params.pop("missing")
        for name, default in (
            ("max_cluster_size", None),
            ("min_cluster_size", None),
            ("balanced", False),
        ):
            if (
                params.get(name, default) is default
            ):  # uncapped: checkpoints written before the caps resume
                params.pop(name, None)
        if not isinstance(self.init, str):
            params["init"] = "callable" if callable(self.init) else "array"
        rs = params["random_state"]
        params["random_state"] = (
            int(rs) if isinstance(rs, (int, np.integer)) and not isinstance(rs, bool) else None
        )
        return params


class KMeans(_KMeansBase):
    """K-means clustering on a Dask cluster (Lloyd's algorithm).

    scikit-learn's ``KMeans`` on NumPy, pandas, SciPy sparse, Dask arrays and Dask DataFrames,
    in memory or read from their source in every pass; small in-memory data is fitted in the
    calling process. The default fit (k-means||, Lloyd and a k-means++ local search) reaches
    the quality of scikit-learn's ``n_init=10`` in one run.

    Read more in the :ref:`User Guide <guide-getting-started>`.

    Parameters
    ----------
    n_clusters : int, default 8
        Number of clusters.
    init : {"k-means||", "k-means++", "random", "random-partition"}, callable or array-like, default "k-means||"
        ``"k-means||"``: scalable k-means++ (``init_rounds`` passes, about
        ``oversampling_factor * n_clusters`` candidates per round, then a weighted
        recluster); from ``n_clusters >= 4096`` a two-level seeding on a sample (one pass).
        ``"k-means++"``: exact greedy k-means++ (``n_clusters + 1`` passes).
        ``"random"``: distinct rows drawn uniformly (proportionally to ``sample_weight``).
        ``"random-partition"``: means of a uniformly random partition. An array of shape
        (n_clusters, n_features) gives the initial centroids; a callable
        ``init(X, n_clusters, random_state)`` returns them from the rows (all rows, or a
        uniform sample of ``max(100 * n_clusters, 10000)`` of larger data). Every strategy gives the same
        centres for the same ``random_state`` whatever the chunking and worker count. See
        :ref:`guide-how-a-fit-runs`.
    n_init : "auto" or int, default "auto"
        Number of initialisations (each followed by Lloyd); the run with the lowest
        objective is kept. ``"auto"``: 10 for ``"random"``, ``"random-partition"`` and a
        callable, 1 otherwise (as in scikit-learn).
    max_iter : int, default 300
        Maximum number of Lloyd iterations on the data in a run, whatever phases it has
        (scikit-learn's meaning: ``max_iter=1`` is one update from the seeding). With local
        search they are shared: Lloyd's first 5, then the confirmations of the searches (2 at
        most each), then Lloyd again to its stop rule with what is left; with none left there
        is no search after Lloyd. The start is settled on a sample (up to 300 updates there)
        only with ``max_iter >= 300`` and a sample of at most half the rows. A larger value
        never ends with a higher objective, except across 300 where the settle begins.
    tol : float, default 1e-4
        Relative tolerance as in scikit-learn: stop when the total squared centroid
        shift is at most ``tol`` times the mean variance of the features.
    random_state : int, numpy.random.Generator, RandomState or None
        Seed of the initialisation.
    algorithm : {"lloyd", "hartigan"}, default "lloyd"
        ``"hartigan"``: batch Hartigan (single-point moves with the exact cost change,
        never emptying a cluster) from the initial centroids instead of Lloyd.
    refine : {None, "hartigan"}, default None
        With ``algorithm="lloyd"``: continue from Lloyd's result with Hartigan's method,
        whose local optima are a subset of Lloyd's.
    local_search : {"auto", True, False}, default "auto"
        k-means++ local search (Lattanzi and Sohler, ICML 2019) on a sample of the rows,
        before Lloyd and after its first 5 iterations: swaps of centroids that lower the
        objective, kept only when confirmed on the data, which moves centroids across empty
        space where Lloyd cannot. "auto": when ``init`` is a seeding strategy (not given
        centroids, whose Lloyd result stays scikit-learn's). See :ref:`guide-default-fit`.
    hartigan_mode : {"unsafe", "safe"}, default "unsafe"
        Batch Hartigan: accept every proposed move and keep the round only if the
        objective fell (else redo it safely), or accept only moves whose clusters are
        untouched in the round (exact, slower).
    oversampling_factor : float, default 2.0
        k-means|| only: expected candidates per round, as a multiple of ``n_clusters``.
    init_rounds : int, default 5
        k-means|| only: number of sampling rounds.
    verbose : int or bool, default 0
        Print one line per iteration (objective, centroid shift, time) when > 0 (or True).
        Every iteration is also logged at INFO level on the ``dkmeans`` logger. Printed
        too, as scikit-learn prints them: ``Initialization complete`` before each run's
        first line, and after a Lloyd loop stopped by its rule ``Converged at iteration i:
        strict convergence.`` (no centroid moved) or ``Converged at iteration i: center
        shift s within tolerance.``
    checkpoint : str or path-like, optional
        A checkpoint file (``.npz``): the fit writes its state there after the
        initialisation, every ``checkpoint_every`` Lloyd iterations and after each run
        (atomically: write, then rename). If the file exists when ``fit`` starts, the fit
        resumes from it and ends with the same result as an uninterrupted fit; a
        checkpoint of another job (other data shape, dtype, data moments or parameters)
        is refused with :class:`dkmeans.io.checkpoint.CheckpointError`. The file is kept
        after the fit. Hartigan rounds restart from the last checkpointed centroids. See
        :ref:`guide-long-jobs`.
    checkpoint_every : int, default 10
        Lloyd iterations between checkpoint writes.
    device : {None, "cpu", "gpu"}, default None
        Where the chunks are processed. None: where the data is (a CuPy array or a
        CuPy-backed Dask array runs on the workers' GPUs, the rest on CPUs); "gpu": NumPy
        or Dask data is moved to the GPUs once, chunk by chunk, when it is persisted
        (needs CuPy); "cpu": CuPy data is moved to host memory. ``cluster_centers_`` is
        always NumPy; labels follow the data (CuPy in, CuPy out).
    metric : {"euclidean", "cosine"}, default "euclidean"
        ``"cosine"``: spherical k-means (Dhillon and Modha, 2001) for embeddings and text:
        rows normalised to unit length once (a row of all zeros raises
        :class:`~dkmeans.errors.InvalidDataError`), ``cluster_centers_`` unit vectors,
        ``inertia_``, ``score`` and ``transform`` in ``1 - cos``. Hartigan and
        ``local_search=True`` are Euclidean only. See :ref:`guide-cosine-sparse-large-k`.
    out_of_core : {"auto", True, False}, default "auto"
        Where the data lives during the fit. "auto": persisted on the workers when it fits
        the cluster's memory budget, else read from its source in every pass, so no worker
        holds more than a few chunks. True: always stream; False: always persist. The
        results are the same either way (up to float rounding of the combined sums). See
        :ref:`guide-out-of-core`.
    prune : {"auto", True, False}, default "auto"
        Lloyd iterations over data kept in memory skip the distances that cannot change a
        label (Yinyang k-means bounds). The labels, centroids and objective are exactly those
        of the unpruned iterations; only the time and ``history_[i]["distances_computed"]``
        differ. "auto": where it pays. Out-of-core and mini-batch fits are never pruned. See
        :ref:`guide-pruning`.
    max_cluster_size : int, float or None, default None
        Size cap: no cluster gets more than this many training rows (an integer), or more
        than this fraction of them (a float in (0, 1]); with ``sample_weight`` rows count by
        weight. Each Lloyd iteration then assigns rows to minimise the objective under the
        caps: the optimal transport of the rows to the centroids, found with per-cluster
        prices over counting passes and moves over the clusters' exchange lists, and
        certified optimal for unweighted rows and up to 128 clusters (otherwise within the
        caps, near the optimum); ``labels_`` and ``inertia_`` are the capped assignment's,
        not ``predict``'s nearest centroids. Lloyd only (no Hartigan, local search or sparse rows). See
        :ref:`guide-balanced`.
    min_cluster_size : int, float or None, default None
        Size floor, as ``max_cluster_size``: every cluster gets at least this many rows.
    balanced : bool, default False
        Sizes within one row of ``n / n_clusters`` (caps ``floor`` and ``ceil`` of it; with
        weights, within the largest weight of it). Not with the two caps above.
    missing : {"error", "skip"}, default "error"
        Rows with a missing value (NaN, ``pd.NA``, an Arrow null). ``"error"``: raise
        :class:`~dkmeans.errors.InvalidDataError` naming the columns (and, in memory, how many
        values each lacks; for lazy data, those of the partition where a pass found them).
        ``"skip"``: fit leaves such rows out (``labels_`` is -1 for them), ``predict`` labels
        them -1, ``transform`` gives them NaN distances and ``score`` leaves them out.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        In the dtype of the training data (float32 stays float32).
    labels_ : ndarray, dask.array.Array or dask Series of shape (n_samples,), int32
        NumPy for in-memory input; a persisted Dask array for a Dask array; a Dask Series
        on the input's index (same partitions) for a Dask DataFrame, computed lazily
        from the input's partitions.
    inertia_ : float
        Weighted sum of squared distances to the closest centroid (of ``cluster_centers_``);
        of ``1 - cos`` with ``metric="cosine"``.
    n_iter_ : int
        Lloyd iterations (centroid updates) run on the data, the local search's
        confirmations included (kept or not), plus Hartigan rounds; at most ``max_iter``
        Lloyd iterations. A start settled on a sample of the rows is not counted.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Column names, when fitted on a DataFrame with string column names.
    history_ : list of dict
        Per iteration: ``algorithm`` ("lloyd" or "hartigan"), objective and seconds;
        Lloyd adds centroid_shift, empty_clusters_fixed and distances_computed (the share of
        row-to-centroid distances its assignment step computed: below 1 where pruning skipped
        some, see ``prune``), Hartigan moves, proposals and mode.
    stop_reason_ : str
        ``"centroid-shift"``, ``"fixed-point"``, ``"no-improving-move"`` (Hartigan),
        ``"max_iter"``, or ``"stopped"`` (a scikit-learn callback asked the fit to stop).
    data_mode_ : {"in-memory", "out-of-core"}
        Whether the data was persisted for the fit or read from its source in every pass.
    n_passes_ : int
        Passes over the data the fit made (moments, seeding, iterations, final assignment).
    cluster_sizes_ : ndarray of shape (n_clusters,), float64
        Weighted number of training rows in each cluster (``sample_weight`` summed; row
        counts without weights), from the final assignment's pass (no pass of its own).
    cluster_inertia_ : ndarray of shape (n_clusters,), float64
        Each cluster's share of ``inertia_`` (same pass; they sum to ``inertia_`` up to
        rounding).
    imbalance_ : float
        faiss's imbalance factor ``n_clusters * sum(cluster_sizes_**2) / sum(cluster_sizes_)**2``:
        1.0 for clusters of equal size, up to ``n_clusters`` when one cluster holds all rows.
    capacity_passes_ : list of int
        With size caps only: the passes each capacitated assignment took (per Lloyd
        iteration, per run's score and the final one), the pass giving its partials included.

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
        init="k-means||",
        n_init="auto",
        max_iter=300,
        tol=1e-4,
        random_state=None,
        algorithm="lloyd",
        refine=None,
        local_search="auto",
        hartigan_mode="unsafe",
        oversampling_factor=2.0,
        init_rounds=5,
        verbose=0,
        checkpoint=None,
        checkpoint_every=10,
        device=None,
        out_of_core="auto",
        metric="euclidean",
        prune="auto",
        missing="error",
        max_cluster_size=None,
        min_cluster_size=None,
        balanced=False,
    ):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.algorithm = algorithm
        self.refine = refine
        self.local_search = local_search
        self.hartigan_mode = hartigan_mode
        self.oversampling_factor = oversampling_factor
        self.init_rounds = init_rounds
        self.verbose = verbose
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.device = device
        self.out_of_core = out_of_core
        self.metric = metric
        self.prune = prune
        self.missing = missing
        self.max_cluster_size = max_cluster_size
        self.min_cluster_size = min_cluster_size
        self.balanced = balanced

    # -- parameters ---------------------------------------------------------------
    def _fit_spec(self) -> FitSpec:
        """The parameters checked against the shared table (:mod:`dkmeans.fit.params`) and resolved."""
        p = self._checked_params()
        init = self.init
        if p["algorithm"] == "minibatch":
            raise InvalidParameterError("algorithm='minibatch' is dkmeans.MiniBatchKMeans")
        if p["refine"] is not None and p["algorithm"] != "lloyd":
            raise InvalidParameterError("refine='hartigan' applies to algorithm='lloyd' only")
        n_init = p["n_init"]
        if n_init == "auto":
            n_init = auto_n_init(init)  # scikit-learn's rule (here "random-partition" too)
        if not isinstance(init, str) and not callable(init) and n_init > 1:
            warnings.warn(
                "Explicit initial center position passed: performing only one init in "
                f"{type(self).__name__} instead of n_init={n_init}.",
                RuntimeWarning,
                stacklevel=3,
            )
            n_init = 1
        return FitSpec(
            n_clusters=p["n_clusters"],
            init=init,
            n_init=n_init,
            max_iter=p["max_iter"],
            tol=p["tol"],
            stop_rule="centroid-shift",
            tol_relative=True,
            tol_inclusive=True,
            algorithm=p["algorithm"],
            refine=p["refine"],
            hartigan_mode=p["hartigan_mode"],
            local_search=p["local_search"],
            init_options=init_options(
                oversampling_factor=p["oversampling_factor"], init_rounds=p["init_rounds"]
            ),
            random_state=self.random_state,
            checkpoint=p["checkpoint"],
            checkpoint_every=p["checkpoint_every"],
            out_of_core=p["out_of_core"],
            on_iteration=_progress_for(p["verbose"], p["max_iter"]),
            metric=p["metric"],
            prune=p["prune"],
            max_cluster_size=p["max_cluster_size"],
            min_cluster_size=p["min_cluster_size"],
            balanced=p["balanced"],
            job={"estimator": "dkmeans.KMeans", "params": self._job_params()},
        )
