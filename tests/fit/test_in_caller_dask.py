"""Small Dask arrays are computed once and fitted in the caller, with the cluster's results."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import dkmeans
from dkmeans.fit import placement


def _rows():
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=6.0, size=(4, 5))
    X = np.concatenate([c + rng.normal(size=(700, 5)) for c in centres])
    return X[rng.permutation(len(X))]


def _no_placement(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a small Dask array was placed on the cluster")

    monkeypatch.setattr(placement, "place_data", refuse)


def _same(a, b):
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(a.labels_), np.asarray(b.labels_))
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-12)
    assert a.n_iter_ == b.n_iter_


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_small_dask_array_fitted_in_the_caller_as_on_the_cluster(client, monkeypatch, init, metric):
    X = _rows()
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(X))
    Xd, wd = da.from_array(X, chunks=(450, 5)), da.from_array(w, chunks=450)
    with dask.config.set({"dkmeans.in-process-bytes": 0}):  # the cluster's fit, the reference
        on_cluster = dkmeans.KMeans(4, init=init, metric=metric, random_state=3).fit(
            Xd, sample_weight=wd
        )
    assert on_cluster.data_mode_ == "in-memory"
    with monkeypatch.context() as patch:
        _no_placement(patch)
        here = dkmeans.KMeans(4, init=init, metric=metric, random_state=3).fit(Xd, sample_weight=wd)
    assert isinstance(here.labels_, da.Array) and here.labels_.chunks == (Xd.chunks[0],)
    _same(here, on_cluster)
    # and what scikit-learn's Lloyd gives from the same start on the same rows, as a check of both
    if metric == "euclidean":
        from sklearn.cluster import KMeans

        reference = KMeans(4, init=here.cluster_centers_, n_init=1, max_iter=1).fit(
            X, sample_weight=w
        )
        np.testing.assert_array_equal(reference.labels_, here.labels_.compute())


def test_larger_dask_arrays_and_out_of_core_stay_on_the_cluster(client, monkeypatch):
    Xd = da.from_array(_rows(), chunks=(450, 5))
    _no_placement(monkeypatch)
    smaller = {"dkmeans.in-process-bytes": Xd.nbytes - 1}
    with dask.config.set(smaller), pytest.raises(AssertionError, match="placed"):
        dkmeans.KMeans(4, random_state=0).fit(Xd)
    with pytest.raises(AssertionError, match="placed"):
        dkmeans.KMeans(4, random_state=0, out_of_core=True).fit(Xd)
    dkmeans.KMeans(4, random_state=0).fit(Xd)  # within the limit: never placed


def test_bad_values_found_in_the_caller_raise_the_fits_message(client):
    X = _rows()
    X[1234, 2] = np.nan
    Xd = da.from_array(X, chunks=(450, 5))
    with dask.config.set({"dkmeans.in-process-bytes": 0}), pytest.raises(ValueError) as on_cluster:
        dkmeans.KMeans(4, random_state=0).fit(Xd)
    with pytest.raises(ValueError) as here:
        dkmeans.KMeans(4, random_state=0).fit(Xd)
    assert str(here.value) == str(on_cluster.value)


@pytest.fixture
def no_client(monkeypatch):
    """As in a process where no client exists: Dask's own scheduler, and no cluster may start.

    The session's client (if a test started it) is taken away for the test; dkmeans' embedded
    cluster is refused, and none may be running after it (:func:`embedded_client`).
    """
    from dkmeans.engine import client as engine_client
    from dkmeans.engine import place

    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(engine_client, "start_local_cluster", refuse)
    monkeypatch.setattr(engine_client, "current_client", lambda: None)
    monkeypatch.setattr(place, "current_client", lambda: None)
    assert engine_client.embedded_client() is None
    with dask.config.set(scheduler="threads"):
        yield
    assert engine_client.embedded_client() is None  # dkmeans' own record: none started


def test_small_dask_array_with_no_client_starts_no_cluster(no_client):
    Xd = da.from_array(_rows(), chunks=(450, 5))
    km = dkmeans.KMeans(4, random_state=0).fit(Xd)
    assert isinstance(km.labels_, da.Array)
    np.testing.assert_array_equal(km.labels_.compute(), km.predict(_rows()))


def _same_sweep(here, on_cluster, ks):
    """Two sweeps' models, scores and choice of k: equal (the same passes, fitted elsewhere)."""
    for k in ks:
        _same(here.models[k], on_cluster.models[k])
        assert here.passes[k] == on_cluster.passes[k]
        for name, value in on_cluster.metrics[k].items():
            assert here.metrics[k][name] == pytest.approx(value, rel=1e-9, abs=1e-12), (k, name)
    assert here.answers == on_cluster.answers and here.suggested_k == on_cluster.suggested_k
    assert here.n_passes == on_cluster.n_passes and here.data_mode == on_cluster.data_mode


@pytest.mark.parametrize("method", ["refit", "bisecting"])
def test_sweep_of_a_small_dask_array_in_the_caller_as_on_the_cluster(client, monkeypatch, method):
    """A sweep (choosing k) computes a small Dask array once and runs in the caller, as a fit
    does (its data placed through the same entry), with the cluster's models and scores."""
    X = _rows()
    Xd = da.from_array(X, chunks=(450, 5))
    ks = [2, 4, 6]
    with dask.config.set({"dkmeans.in-process-bytes": 0}):
        on_cluster = dkmeans.sweep(Xd, ks, random_state=3, method=method)
    with monkeypatch.context() as patch:
        _no_placement(patch)
        here = dkmeans.sweep(Xd, ks, random_state=3, method=method)
    models = ks if method == "refit" else [here.suggested_k]
    for k in models:
        labels = here.models[k].labels_
        assert isinstance(labels, da.Array) and labels.chunks == (Xd.chunks[0],)
    _same_sweep(here, on_cluster, models)
    assert here.suggested_k == 4  # four well separated blobs
    # each k's model is the single fit's (itself fitted in the caller)
    single = dkmeans.KMeans(4, random_state=here.random_state).fit(Xd)
    _same(here.models[4], single)


def test_bisecting_fit_of_a_small_dask_array_in_the_caller_as_on_the_cluster(client, monkeypatch):
    X = _rows()
    w = np.random.default_rng(2).uniform(0.5, 2.0, len(X))
    Xd, wd = da.from_array(X, chunks=(450, 5)), da.from_array(w, chunks=450)
    with dask.config.set({"dkmeans.in-process-bytes": 0}):
        on_cluster = dkmeans.BisectingKMeans(5, random_state=1).fit(Xd, sample_weight=wd)
    assert on_cluster.data_mode_ == "in-memory"
    with monkeypatch.context() as patch:
        _no_placement(patch)
        here = dkmeans.BisectingKMeans(5, random_state=1).fit(Xd, sample_weight=wd)
    assert isinstance(here.labels_, da.Array) and here.labels_.chunks == (Xd.chunks[0],)
    assert here.labels_.dtype == np.int32 == on_cluster.labels_.dtype
    _same(here, on_cluster)
    np.testing.assert_allclose(here.inertia_per_k_, on_cluster.inertia_per_k_, rtol=1e-12)
    # and the tree's labels of the same rows in memory: predict descends the same tree
    np.testing.assert_array_equal(here.labels_.compute(), here.predict(X))


def test_scores_of_a_small_dask_array_in_the_caller_as_on_the_cluster(client, monkeypatch):
    from dkmeans import metrics

    X = _rows()
    Xd = da.from_array(X, chunks=(450, 5))
    km = dkmeans.KMeans(4, random_state=0).fit(X)
    labels = da.from_array(km.labels_, chunks=450)

    def scores():
        return (
            metrics.cluster_scores(Xd, km),
            metrics.calinski_harabasz_score(Xd, labels),
            metrics.silhouette_score(Xd, km, sample_size=500, random_state=0),
        )

    with dask.config.set({"dkmeans.in-process-bytes": 0}):
        on_cluster = scores()
    with monkeypatch.context() as patch:
        _no_placement(patch)
        here = scores()
    for name in ("calinski_harabasz", "davies_bouldin", "simplified_silhouette", "imbalance"):
        assert getattr(here[0], name) == pytest.approx(getattr(on_cluster[0], name), rel=1e-12)
    assert here[1:] == pytest.approx(on_cluster[1:], rel=1e-12)
    # against scikit-learn's on the same rows
    from sklearn.metrics import calinski_harabasz_score

    assert here[1] == pytest.approx(calinski_harabasz_score(X, km.labels_), rel=1e-9)


def test_sweep_bisecting_and_scores_with_no_client_start_no_cluster(no_client):
    from dkmeans import metrics

    Xd = da.from_array(_rows(), chunks=(450, 5))
    result = dkmeans.sweep(Xd, [2, 4], random_state=0, reference_draws=2)
    assert result.suggested_k == 4 and isinstance(result.models[4].labels_, da.Array)
    tree = dkmeans.BisectingKMeans(4, random_state=0).fit(Xd)
    np.testing.assert_array_equal(tree.labels_.compute(), tree.predict(_rows()))
    assert metrics.davies_bouldin_score(Xd, tree) > 0
