"""In-memory data above dkmeans.in-process-bytes with a client whose workers share this machine:
fitted in the caller on the workers' threads, with the cluster's results; elsewhere on the cluster."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest

import dkmeans
from dkmeans.engine import client as engine_client
from dkmeans.engine import place
from dkmeans.fit import placement
from dkmeans.testing import make_blobs

#: Smaller than the rows below: the rows are "larger in-memory data" for these tests.
LIMIT = {"dkmeans.in-process-bytes": "64KiB"}


def _rows():
    X, _, _ = make_blobs(6_000, 5, 4, spread=1.0, box=10.0, seed=0)
    return X  # 240,000 bytes


def _refuse_placement(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("in-memory rows were placed on the cluster")

    monkeypatch.setattr(placement, "place_data", refuse)


def test_the_session_clusters_workers_are_found_on_this_machine(client):
    threads = engine_client.local_worker_threads(client)
    assert threads == sum(client.nthreads().values()) and threads >= 1
    assert engine_client._is_this_host("inproc://10.1.2.3/1234/1")
    assert engine_client._is_this_host("tcp://127.0.0.1:8786")
    assert engine_client._is_this_host("tcp://localhost:8786")
    assert not engine_client._is_this_host("tcp://203.0.113.9:8786")  # TEST-NET-3: never ours
    assert not engine_client._is_this_host("not an address")


def test_a_cluster_that_cannot_answer_counts_as_elsewhere():
    class Closed:
        def nthreads(self):
            raise OSError("scheduler gone")

    class Remote:
        def nthreads(self):
            return {"tcp://127.0.0.1:1": 2, "tcp://203.0.113.9:2": 2}

    class Empty:
        def nthreads(self):
            return {}

    class Asynchronous:
        asynchronous = True

        def nthreads(self):
            raise AssertionError("an asynchronous client is not asked")

    for stub in (Closed(), Remote(), Empty(), Asynchronous()):
        assert engine_client.local_worker_threads(stub) is None


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_larger_numpy_rows_with_a_local_client_are_fitted_here_as_on_the_cluster(
    client, monkeypatch, metric
):
    X = _rows()
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(X))
    with dask.config.set({"dkmeans.in-process-bytes": 0}):  # the cluster's fit, the reference
        on_cluster = dkmeans.KMeans(4, metric=metric, random_state=3).fit(X, sample_weight=w)
    seen = []
    original = place.in_process_threads

    def spy(dataset, weights):
        seen.append(original(dataset, weights))
        return seen[-1]

    monkeypatch.setattr(placement, "in_process_threads", spy)
    with monkeypatch.context() as patch, dask.config.set(LIMIT):
        _refuse_placement(patch)
        here = dkmeans.KMeans(4, metric=metric, random_state=3).fit(X, sample_weight=w)
    threads = min(sum(client.nthreads().values()), len(os.sched_getaffinity(0)))
    assert seen and set(seen) == {threads}
    np.testing.assert_allclose(here.cluster_centers_, on_cluster.cluster_centers_, rtol=1e-12)
    np.testing.assert_array_equal(here.labels_, on_cluster.labels_)
    assert here.inertia_ == pytest.approx(on_cluster.inertia_, rel=1e-12)
    assert here.n_iter_ == on_cluster.n_iter_
    if (
        metric == "euclidean"
    ):  # scikit-learn's Lloyd step from the same centroids, as a check of both
        from sklearn.cluster import KMeans

        reference = KMeans(4, init=here.cluster_centers_, n_init=1, max_iter=1).fit(
            X, sample_weight=w
        )
        np.testing.assert_array_equal(reference.labels_, here.labels_)


def test_larger_numpy_rows_go_to_a_cluster_elsewhere_or_when_asked(client, monkeypatch):
    X = _rows()
    _refuse_placement(monkeypatch)
    with dask.config.set(LIMIT), pytest.raises(AssertionError, match="placed"):
        dkmeans.KMeans(4, random_state=0, out_of_core=True).fit(X)
    with dask.config.set({"dkmeans.in-process-bytes": 0}), pytest.raises(AssertionError):
        dkmeans.KMeans(4, random_state=0).fit(X)
    monkeypatch.setattr(place, "local_worker_threads", lambda client: None)  # workers elsewhere
    with dask.config.set(LIMIT), pytest.raises(AssertionError, match="placed"):
        dkmeans.KMeans(4, random_state=0).fit(X)
