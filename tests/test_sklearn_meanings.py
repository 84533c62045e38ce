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


