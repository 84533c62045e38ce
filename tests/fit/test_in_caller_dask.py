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


def test_small_dask_array_with_no_client_starts_no_cluster(monkeypatch):
    from dkmeans.engine import client as engine_client

    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(engine_client, "start_local_cluster", refuse)
    Xd = da.from_array(_rows(), chunks=(450, 5))
    with dask.config.set(scheduler="threads"):  # as in a process where no client exists
        from distributed import default_client

        try:
            default_client()
        except ValueError:
            pass
        else:  # the session's client is current: take it away for this fit
            monkeypatch.setattr(engine_client, "current_client", lambda: None)
            from dkmeans.engine import place

            monkeypatch.setattr(place, "current_client", lambda: None)
            monkeypatch.setattr(place, "embedded_client", lambda: None)
        km = dkmeans.KMeans(4, random_state=0).fit(Xd)
    assert isinstance(km.labels_, da.Array)
    with dask.config.set(scheduler="threads"):
        np.testing.assert_array_equal(km.labels_.compute(), km.predict(_rows()))
