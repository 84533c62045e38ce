"""Where dkmeans takes scikit-learn's meaning of a parameter or result (issue 29, item 5).

Each test holds dkmeans against scikit-learn's behaviour (or the documented rule where
scikit-learn has no equivalent): unit sample weights in ``MiniBatchKMeans.fit``,
``n_init="auto"`` with a callable ``init``, the ``init_size < n_clusters`` warning,
``verbose`` as a bool and its messages, exact zeros in ``transform`` for rows equal to a
centre, and where k-means|| puts the centres that data with fewer distinct points than
``n_clusters`` leaves unused.
"""

from __future__ import annotations

import re
import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans as SkKMeans
from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans
from sklearn.cluster import kmeans_plusplus
from sklearn.exceptions import ConvergenceWarning

import dkmeans
from dkmeans import KMeans, MiniBatchKMeans
from dkmeans.engine.local import ChunkList
from dkmeans.errors import InvalidParameterError
from dkmeans.init import InitOptions
from dkmeans.init.kmeans_parallel import kmeans_parallel
from dkmeans.testing import make_blobs


@pytest.fixture(scope="module")
def X():
    return make_blobs(3000, 3, 6, spread=1.0, box=10.0, seed=2)[0]


# -- transform of the centres ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transform_of_the_centres_is_zero_on_the_diagonal(client, X, dtype):
    """A row equal to a centre is at distance exactly 0, as scikit-learn gives for its own centres."""
    Xd = X.astype(dtype)
    km = KMeans(6, random_state=0).fit(Xd)
    C = km.cluster_centers_
    sk = SkKMeans(6, n_init=1, random_state=0).fit(Xd)
    assert np.all(np.diag(sk.transform(sk.cluster_centers_)) == 0)
    for rows in (C, C.copy(), da.from_array(C, chunks=4), sp.csr_matrix(C)):
        D = km.transform(rows)
        D = D.compute() if isinstance(D, da.Array) else D
        assert D.dtype == dtype
        assert np.all(np.diag(D) == 0), np.diag(D)
    # everywhere else as scikit-learn's euclidean_distances (float32 in float64, as it computes them)
    from sklearn.metrics.pairwise import euclidean_distances

    want = euclidean_distances(Xd[:200].astype(np.float64), C.astype(np.float64))
    np.testing.assert_allclose(km.transform(Xd[:200]), want, rtol=1e-6 if dtype == np.float32 else 1e-12)
    np.testing.assert_allclose(km.transform(sp.csr_matrix(Xd[:200])), want, rtol=1e-6 if dtype == np.float32 else 1e-12)
    # rows next to a centre keep their small distance (no cancellation to 0 or to a rounding floor)
    near = C + np.asarray(1e-4, dtype)
    exact = np.sqrt(((near.astype(np.float64) - C.astype(np.float64)) ** 2).sum(axis=1))
    np.testing.assert_allclose(np.diag(km.transform(near)), exact, rtol=1e-6)


# -- fewer distinct points than clusters -----------------------------------------------------
def _two_points(n=40):
    X = np.repeat(np.array([[0.0, 0.0], [5.0, 1.0]]), n // 2, axis=0)
    np.random.default_rng(0).shuffle(X)
    return X


@pytest.mark.parametrize("seed", range(6))
def test_kmeans_parallel_unused_centres_where_sklearn_puts_them(seed):
    """40 rows of 2 distinct points, k = 5: both points, then copies of the first row.

    scikit-learn's k-means++ draws on a zero potential land on row 0 (README: the farthest
    rows fill in deterministically; the centres that must coincide come with a warning
    counting the distinct ones). The same for any chunking.
    """
    X = _two_points()
    results = []
    for n_chunks in (1, 3, 7):
        with pytest.warns(ConvergenceWarning, match=r"Number of distinct clusters \(2\) found smaller than "
                                                    r"n_clusters \(5\)"):
            results.append(kmeans_parallel(ChunkList.from_array(X, None, n_chunks), 5, seed, InitOptions()))
    for C in results[1:]:
        np.testing.assert_array_equal(C, results[0])
    C = results[0]
    assert {tuple(c) for c in C[:2]} == {(0.0, 0.0), (5.0, 1.0)}
    np.testing.assert_array_equal(C[2:], np.repeat(X[:1], 3, axis=0))
    sk, _ = kmeans_plusplus(X, 5, random_state=seed)
    np.testing.assert_array_equal(sk[2:], C[2:])  # scikit-learn's rule for the unused centres


def test_kmeans_parallel_completion_counts_repeated_candidates_once():
    """Repeated candidates count once, and the farthest distinct rows fill in before any centre coincides."""
    from dkmeans.init.kmeans_parallel import _complete

    X = np.concatenate([np.zeros((1, 1)), np.full((10, 1), 10.0), np.full((3, 1), 5.0)])
    data = ChunkList.from_array(X, None, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        # the 3 farthest rows are all 10.0: one fills in, then 5.0 in a further pass
        np.testing.assert_array_equal(_complete(data, X[:1], 3).ravel(), [0.0, 10.0, 5.0])
        np.testing.assert_array_equal(_complete(data, X[[0, 0, 1]], 3).ravel(), [0.0, 10.0, 5.0])
    with pytest.warns(ConvergenceWarning, match=r"distinct clusters \(3\)"):
        np.testing.assert_array_equal(_complete(data, X[[0, 0, 1]], 5).ravel(), [0.0, 10.0, 5.0, 0.0, 0.0])


def test_kmeans_fit_with_fewer_distinct_points_keeps_k_centres(client):
    X = _two_points()
    for fit in (lambda: KMeans(5, random_state=3).fit(X), lambda: KMeans(5, random_state=3).fit(
            da.from_array(X, chunks=13)), lambda: MiniBatchKMeans(5, random_state=3, batch_size=20).fit(X)):
        with pytest.warns(ConvergenceWarning, match="distinct"):
            km = fit()
        assert km.cluster_centers_.shape == (5, 2)
        assert {tuple(c) for c in km.cluster_centers_} == {(0.0, 0.0), (5.0, 1.0)}
        assert km.inertia_ == 0.0
