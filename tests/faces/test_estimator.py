"""dkmeans.KMeans against scikit-learn's KMeans from the same initial centroids."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.cluster import KMeans as SKKMeans
from sklearn.exceptions import NotFittedError

from dkmeans import KMeans
from dkmeans.errors import InvalidDataError, InvalidParameterError
from dkmeans.testing import make_blobs, pick_rows, reference_lloyd


@pytest.fixture(scope="module")
def data():
    X, _, _ = make_blobs(4000, 5, 7, spread=2.0, box=8.0, seed=4)
    return X, pick_rows(X, 7, seed=6)


def sklearn_fit(X, C0, **kw):
    return SKKMeans(n_clusters=len(C0), init=C0, n_init=1, algorithm="lloyd", **kw).fit(X)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-7), (np.float32, 1e-4)])
@pytest.mark.parametrize("tol", [1e-4, 0.0])
def test_matches_scikit_learn(client, data, dtype, rtol, tol):
    X, C0 = data
    X, C0 = X.astype(dtype), C0.astype(dtype)
    km = KMeans(n_clusters=7, init=C0, tol=tol).fit(X)
    sk = sklearn_fit(X, C0, tol=tol)
    assert km.n_iter_ == sk.n_iter_
    assert km.cluster_centers_.dtype == dtype
    np.testing.assert_allclose(km.cluster_centers_, sk.cluster_centers_, rtol=rtol, atol=rtol)
    np.testing.assert_array_equal(km.labels_, sk.labels_)
    np.testing.assert_allclose(km.inertia_, sk.inertia_, rtol=rtol)
    np.testing.assert_array_equal(km.predict(X), sk.predict(X))
    np.testing.assert_allclose(
        km.transform(X), sk.transform(X), rtol=rtol * 10, atol=1e-3 if dtype == np.float32 else 1e-9
    )
    np.testing.assert_allclose(km.score(X), sk.score(X), rtol=rtol)


def test_float64_reference_agrees(client, data):
    X, C0 = data
    km = KMeans(n_clusters=7, init=C0, tol=0.0, max_iter=500).fit(X)
    ref = reference_lloyd(X, C0, max_iter=500, tol=0.0)
    assert km.n_iter_ == ref.n_iter
    np.testing.assert_allclose(km.cluster_centers_, ref.centroids, rtol=1e-7)
    np.testing.assert_allclose(km.inertia_, ref.objective, rtol=1e-7)


def test_sample_weight_matches_scikit_learn(client, data):
    X, C0 = data
    w = np.random.default_rng(0).uniform(0.1, 5, size=len(X))
    w_before = w.copy()
    km = KMeans(n_clusters=7, init=C0).fit(X, sample_weight=w)
    sk = sklearn_fit(X, C0).fit(X, sample_weight=w)
    assert km.n_iter_ == sk.n_iter_
    np.testing.assert_allclose(km.cluster_centers_, sk.cluster_centers_, rtol=1e-7)
    np.testing.assert_allclose(km.inertia_, sk.inertia_, rtol=1e-7)
    np.testing.assert_allclose(
        km.score(X, sample_weight=w), sk.score(X, sample_weight=w), rtol=1e-7
    )
    np.testing.assert_array_equal(w, w_before)


def test_dask_array_in_lazy_out(client, data):
    X, C0 = data
    Xd = da.from_array(X.astype(np.float32), chunks=(500, 5))
    km = KMeans(n_clusters=7, init=C0).fit(Xd)
    assert isinstance(km.labels_, da.Array) and km.cluster_centers_.dtype == np.float32
    pred = km.predict(Xd)
    assert isinstance(pred, da.Array) and pred.dtype == np.int32
    np.testing.assert_array_equal(pred.compute(), km.labels_.compute())
    dist = km.transform(Xd)
    assert isinstance(dist, da.Array) and dist.shape == (len(X), 7)
    np.testing.assert_allclose(
        dist.compute(), km.transform(X.astype(np.float32)), rtol=1e-5, atol=1e-4
    )
    assert km.score(Xd) == pytest.approx(-km.inertia_, rel=1e-6)
    local = KMeans(n_clusters=7, init=C0).fit(X.astype(np.float32))
    np.testing.assert_allclose(km.cluster_centers_, local.cluster_centers_, rtol=1e-6)


def test_fit_predict_and_fit_transform(client, data):
    X, C0 = data
    km = KMeans(n_clusters=7, init=C0)
    labels = km.fit_predict(X)
    np.testing.assert_array_equal(labels, km.labels_)
    np.testing.assert_allclose(
        KMeans(n_clusters=7, init=C0).fit_transform(X), km.transform(X), rtol=1e-12
    )


def test_random_init_is_reproducible_and_chunking_invariant(client, data):
    X, _ = data
    a = KMeans(n_clusters=7, random_state=3).fit(X)
    b = KMeans(n_clusters=7, random_state=3).fit(da.from_array(X, chunks=(333, 5)))
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-12)
    c = KMeans(n_clusters=7, random_state=np.random.default_rng(3)).fit(X)
    assert c.cluster_centers_.shape == (7, 5)


def test_pandas_feature_names(client, data):
    X, C0 = data
    df = pd.DataFrame(X, columns=list("abcde"))
    km = KMeans(n_clusters=7, init=C0).fit(df)
    assert list(km.feature_names_in_) == list("abcde") and km.n_features_in_ == 5
    np.testing.assert_array_equal(km.predict(df), km.labels_)


def test_history_is_recorded(client, data):
    X, C0 = data
    km = KMeans(n_clusters=7, init=C0, tol=0.0).fit(X)
    assert len(km.history_) == km.n_iter_
    assert set(km.history_[0]) == {
        "iteration",
        "objective",
        "centroid_shift",
        "empty_clusters_fixed",
        "seconds",
        "distances_computed",
        "algorithm",
    }
    objs = [h["objective"] for h in km.history_]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objs, objs[1:]))
    assert objs[-1] >= km.inertia_ * (1 - 1e-12)


def test_verbose_prints_progress(client, data, capsys):
    X, C0 = data
    KMeans(n_clusters=7, init=C0, verbose=1).fit(X)
    out = capsys.readouterr().out
    assert "iteration    1" in out and "objective" in out


def test_clone_and_params():
    km = KMeans(n_clusters=3, tol=1e-3)
    assert clone(km).get_params() == km.get_params()
    with pytest.raises(ValueError, match="Invalid parameter 'n_cluster'"):
        km.set_params(n_cluster=4)
    with pytest.raises(TypeError, match="unexpected keyword"):
        KMeans(n_cluster=4)


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"n_clusters": 0}, "n_clusters"),
        ({"n_clusters": 2.0}, "n_clusters"),
        ({"max_iter": 0}, "max_iter"),
        ({"tol": -1.0}, "tol"),
        ({"algorithm": "elkan"}, "algorithm"),
        ({"init": "kmeans"}, "init"),
        ({"random_state": -1}, "random_state"),
    ],
)
def test_bad_parameters(client, data, params, fragment):
    X, _ = data
    with pytest.raises(InvalidParameterError, match=fragment):
        KMeans(**{"n_clusters": 3, **params}).fit(X)


def test_bad_data(client, data):
    X, C0 = data
    Xn = X.copy()
    Xn[10, 0] = np.nan
    with pytest.raises(InvalidDataError, match="NaN"):
        KMeans(n_clusters=3).fit(Xn)
    with pytest.raises(InvalidDataError, match="NaN or infinity"):
        KMeans(n_clusters=3).fit(da.from_array(Xn, chunks=(700, 5)))
    with pytest.raises(InvalidDataError, match="2D"):
        KMeans(n_clusters=3).fit(X[:, 0])
    with pytest.raises(InvalidDataError, match="0 sample"):
        KMeans(n_clusters=3).fit(X[:0])
    with pytest.raises(InvalidParameterError, match="should be >= n_clusters"):
        KMeans(n_clusters=30).fit(X[:10])
    with pytest.raises(InvalidParameterError, match="should be >= n_clusters"):
        KMeans(n_clusters=30).fit(da.from_array(X[:10], chunks=(3, 5)))
    with pytest.raises(InvalidDataError, match="shape"):
        KMeans(n_clusters=7, init=C0[:, :3]).fit(X)
    with pytest.raises(InvalidDataError, match="Complex data not supported"):
        KMeans(n_clusters=3).fit(X.astype(np.complex128))
    with pytest.raises(InvalidDataError, match="sample_weight"):
        KMeans(n_clusters=3).fit(X, sample_weight=np.ones(5))
    with pytest.raises(InvalidDataError, match="non-negative"):
        KMeans(n_clusters=3).fit(X, sample_weight=-np.ones(len(X)))


def test_predict_checks(client, data):
    X, C0 = data
    with pytest.raises(NotFittedError):
        KMeans(n_clusters=3).predict(X)
    km = KMeans(n_clusters=7, init=C0, max_iter=2).fit(X)
    with pytest.raises(InvalidDataError, match="features"):
        km.predict(X[:, :4])
    with pytest.raises(InvalidDataError, match="features"):
        km.predict(da.from_array(X[:, :4]))
    with pytest.raises(InvalidDataError, match="NaN"):
        km.predict(np.full((2, 5), np.nan))


def test_integer_input_is_converted_like_scikit_learn(client):
    X = np.repeat(np.arange(10), 5).reshape(-1, 1) * np.array([[1, 2]])
    km = KMeans(n_clusters=2, init=np.array([[0, 0], [9, 18]])).fit(X)
    assert km.cluster_centers_.dtype == np.float64
    assert X.dtype.kind == "i"  # untouched


def test_failed_fit_leaves_no_half_fitted_estimator(client, data):
    X, _ = data
    Xn = da.from_array(np.where(np.arange(len(X))[:, None] == 3000, np.inf, X), chunks=(500, 5))
    km = KMeans(n_clusters=3)
    with pytest.raises(InvalidDataError):
        km.fit(Xn)
    assert not hasattr(km, "cluster_centers_") and not hasattr(km, "labels_")
