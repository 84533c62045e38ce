"""``dkmeans.BisectingKMeans``: scikit-learn's ``BisectingKMeans`` on Dask.

This module maps scikit-learn's words onto the bisecting fit service
(:mod:`dkmeans.fit.bisecting`); the algorithm is :mod:`dkmeans.drivers.bisecting`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
from sklearn.utils.validation import check_is_fitted

from dkmeans._lazy import lazy_module
from dkmeans.errors import InvalidParameterError
from dkmeans.estimator import _KMeansBase
from dkmeans.fit import params as _params

if TYPE_CHECKING:
    from dkmeans.fit.bisecting import BisectingSpec

# the bisecting fit service loads Dask's collections: imported at its first use (see dkmeans._lazy)
_bisecting = lazy_module("dkmeans.fit.bisecting")

logger = logging.getLogger("dkmeans")


class BisectingKMeans(_KMeansBase):
    """Bisecting k-means on a Dask cluster: scikit-learn's ``BisectingKMeans``, distributed.

    Starting from one cluster, the cluster of largest SSE (or with the most rows) is split
    in two by a 2-means, until ``n_clusters`` clusters: a tree of clusters, whose leaves are
    the clusters. Each 2-means runs on the rows of its cluster where they are (no copy):
    every row finds its cluster by descending the tree, and the 2-means of several clusters
    share their passes over the data. From the same starts, the tree, labels and centres are
    scikit-learn's (centres to float rounding). The data may be in memory, a Dask array or
    DataFrame, or larger than the cluster's memory (read from its source in every pass).

    Parameters
    ----------
    n_clusters : int, default 8
        Number of clusters (leaves of the tree).
    init : {"random", "k-means++"}, default "random"
        Start of each 2-means: two distinct rows of the cluster drawn by ``sample_weight``,
        or k-means++ (a first row drawn by weight, then the better of two candidates drawn by
        weight times the squared distance to it). Draws are keyed by row index, so results
        do not depend on chunking or workers; they are not scikit-learn's draws.
    n_init : int, default 1
        Starts of each 2-means (all run in the same passes); the one of lowest objective is
        kept (by a relative margin of 1e-6, as scikit-learn).
    random_state : int, numpy Generator or RandomState, optional
    max_iter : int, default 300
        Lloyd iterations of each 2-means.
    verbose : int, default 0
        Log each round of splits (logger ``dkmeans``, INFO).
    tol : float, default 1e-4
        A 2-means stops when the squared shift of its two centres is at most ``tol``
        (absolute, not scaled by the data's variance: scikit-learn's ``BisectingKMeans``
        passes its ``tol`` on unscaled).
    copy_x : bool, default True
        Accepted for scikit-learn's signature; the input is never modified.
    algorithm : {"lloyd", "elkan"}, default "lloyd"
        Accepted for scikit-learn's signature; both run Lloyd (Elkan's gives the same result).
    bisecting_strategy : {"biggest_inertia", "largest_cluster"}, default "biggest_inertia"
        Split the leaf of largest weighted SSE, or with the most rows (a count, not weights,
        as scikit-learn); the first leaf in tree order on a tie.
    out_of_core : {"auto", True, False}, default "auto"
        Where the data lives during the fit, as for :class:`~dkmeans.KMeans`.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        Leaf centres in tree order (left subtree first), in the training data's dtype.
    labels_ : ndarray, dask.array.Array or dask Series of shape (n_samples,), int32
        Each row's leaf, found by descending the tree (what :meth:`predict` gives).
    inertia_ : float
        Weighted sum of squared distances of the rows to their leaf's centre.
    inertia_per_k_ : ndarray of shape (n_clusters,)
        ``inertia_per_k_[j]``: the objective of the tree with ``j + 1`` leaves (the first
        ``j`` splits), from the same fit: every k from 1 to ``n_clusters`` at once. The last
        equals ``inertia_`` to rounding.
    n_iter_ : int
        Lloyd iterations of the 2-means that made the tree (the kept starts'), summed.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Column names, when fitted on a DataFrame with string column names.
    n_passes_ : int
        Passes over the data the fit made.
    n_rounds_ : int
        Rounds of shared passes (each splits several clusters).
    data_mode_ : {"in-memory", "out-of-core"}
    cluster_sizes_, cluster_inertia_ : ndarray of shape (n_clusters,)
        Weighted rows and SSE of each leaf, from the labelling pass.

    Examples
    --------
    >>> import numpy as np
    >>> from dkmeans import BisectingKMeans
    >>> X = np.array([[1, 1], [10, 1], [3, 1], [10, 0], [2, 1], [10, 2], [10, 8], [10, 9]], float)
    >>> bkm = BisectingKMeans(n_clusters=3, random_state=0).fit(X)   # doctest: +SKIP
    >>> bkm.predict([[0, 0], [12, 3]])                                # doctest: +SKIP
    """

    def __init__(
        self,
        n_clusters=8,
        *,
        init="random",
        n_init=1,
        random_state=None,
        max_iter=300,
        verbose=0,
        tol=1e-4,
        copy_x=True,
        algorithm="lloyd",
        bisecting_strategy="biggest_inertia",
        out_of_core="auto",
    ):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.random_state = random_state
        self.max_iter = max_iter
        self.verbose = verbose
        self.tol = tol
        self.copy_x = copy_x
        self.algorithm = algorithm
        self.bisecting_strategy = bisecting_strategy
        self.out_of_core = out_of_core

    # -- parameters ---------------------------------------------------------------
    device = None  # the rows are read where they are (NumPy on the host)

    def _fit_spec(self) -> BisectingSpec:
        params = self.get_params()
        algorithm = params.pop("algorithm")
        _params.OneOf(_params.BISECTING_ALGORITHMS)("algorithm", algorithm)
        p = _params.check("estimator", params)
        if p["max_iter"] < 1:
            raise InvalidParameterError(f"max_iter must be an integer >= 1, got {self.max_iter}")
        if p["n_init"] == "auto":
            raise InvalidParameterError("n_init must be an integer >= 1, got 'auto'")
        if not (isinstance(self.init, str) and self.init in _params.BISECTING_INITS):
            # scikit-learn's wording; an InvalidParameterError is also a TypeError, as theirs
            raise InvalidParameterError(
                f"The 'init' parameter of {type(self).__name__} must be a str among "
                f"{{{', '.join(repr(s) for s in _params.BISECTING_INITS)}}}. "
                f"Got {self.init!r} instead."
            )
        return _bisecting.BisectingSpec(
            n_clusters=p["n_clusters"],
            init=self.init,
            n_init=p["n_init"],
            max_iter=p["max_iter"],
            tol=p["tol"],
            random_state=self.random_state,
            bisecting_strategy=p["bisecting_strategy"],
            out_of_core=p["out_of_core"],
        )

    # -- fit ----------------------------------------------------------------------
    def fit(self, X, y=None, sample_weight=None):
        """Compute bisecting k-means clustering.

        Parameters
        ----------
        X : array-like, pandas DataFrame, Dask array or Dask DataFrame, (n_samples, n_features)
        y : ignored
        sample_weight : array-like or Dask array of shape (n_samples,), optional
            Non-negative weights of the samples.

        Returns
        -------
        self : BisectingKMeans
        """
        return super().fit(X, y, sample_weight)

    def _fit(self, X, sample_weight, spec: BisectingSpec):
        result = _bisecting.run_bisecting(spec, self._fit_dataset(X), sample_weight)
        if self.verbose:
            print(
                f"bisecting: {len(result.objectives) - 1} splits in {result.tree.rounds} rounds, "
                f"{result.n_passes} passes, objective {result.objective:.6e}"
            )
        self.cluster_centers_ = result.centroids
        self.labels_ = result.labels
        self._n_features_out = result.centroids.shape[0]
        self.inertia_ = result.objective
        self.inertia_per_k_ = result.objectives
        self.n_iter_ = result.n_iter
        self.n_passes_ = result.n_passes
        self.n_rounds_ = result.tree.rounds
        self.data_mode_ = result.data_mode
        self.cluster_sizes_ = result.cluster_sizes
        self.cluster_inertia_ = result.cluster_objective
        self._tree = result.arrays
        self._bisecting = result.tree  # the nodes, their splits and starts
        self._split_order = result.tree.split_order
        self._node_centres = np.array([n.centre for n in result.tree.nodes]) + result.tree.mean
        self._metric = "euclidean"
        return self

    # -- the tree -----------------------------------------------------------------
    def predict(self, X):
        """Each row's cluster, descending the tree (scikit-learn's ``BisectingKMeans.predict``).

        Parameters
        ----------
        X : array-like, pandas DataFrame, Dask array or Dask DataFrame, (n_samples, n_features)
            The rows to label.

        Returns
        -------
        labels : ndarray of int32 (a lazy Dask array for a Dask array, a Dask Series for a
            Dask DataFrame)
        """
        X, _ = self._check_test_data(X)  # (no missing="skip" here: kept is None)
        return _bisecting.tree_labels(X, self._tree)

    def cluster_centers_at(self, k: int) -> np.ndarray:
        """The centres of the tree's ``k`` leaves after its first ``k - 1`` splits, in tree order.

        ``k`` from 1 to ``n_clusters``; their objective on the training data (rows labelled by
        the tree) is ``inertia_per_k_[k - 1]``.

        Parameters
        ----------
        k : int
            The number of leaves, from 1 to ``n_clusters``.

        Returns
        -------
        ndarray of shape (k, n_features)
            The leaves' centres.
        """
        check_is_fitted(self, "cluster_centers_")
        _params.Int(1)("k", k)
        if k > len(self.cluster_centers_):
            raise InvalidParameterError(
                f"k must be at most n_clusters={len(self.cluster_centers_)}, got {k}"
            )
        split = set(self._split_order[: k - 1])
        left = self._tree.left
        stack, leaves = [0], []
        while stack:
            i = stack.pop()
            if i in split:
                stack.extend((left[i] + 1, left[i]))
            else:
                leaves.append(i)
        return self._node_centres[leaves].astype(self.cluster_centers_.dtype)

    def save(self, path):
        """Not available: a model file holds flat centroids, not the tree ``predict`` descends.

        Pickle or joblib keep a fitted ``BisectingKMeans`` whole.

        Parameters
        ----------
        path : str or path-like
            Not used: always raises.

        Raises
        ------
        InvalidParameterError
            Always.
        """
        raise InvalidParameterError(
            "BisectingKMeans cannot be saved as a dkmeans model file (it holds flat "
            "centroids, not the tree predict descends); use pickle or joblib"
        )

    @classmethod
    def load(cls, path):
        """Not available (see :meth:`save`).

        Parameters
        ----------
        path : str or path-like
            Not used: always raises.

        Raises
        ------
        InvalidParameterError
            Always.
        """
        raise InvalidParameterError(
            "BisectingKMeans cannot be loaded from a dkmeans model file; use pickle or joblib"
        )


__all__ = ["BisectingKMeans"]
