"""Fits inside joblib workers and Dask tasks: GridSearchCV with loky and Dask backends, fits in tasks.

A loky worker has no Dask client and may not start worker processes; a Dask task holds
its worker's thread. Small in-memory data is fitted in the calling process, so neither
needs a cluster; larger data inside a Dask task uses the task's cluster through
``worker_client`` (the task gives its thread back while it waits).
"""

from __future__ import annotations

import dask
import joblib
import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV

from dkmeans import KMeans
from dkmeans.testing import make_blobs

GRID = {"n_clusters": [2, 3, 5], "init": ["k-means||", "random"]}


@pytest.fixture(scope="module")
def X():
    return make_blobs(600, 3, 4, spread=1.0, box=8.0, seed=2)[0]


def _search(X, n_jobs):
    return GridSearchCV(KMeans(random_state=0, max_iter=50), GRID, cv=3, n_jobs=n_jobs).fit(X)


def test_grid_search_in_loky_workers_matches_serial(X):
    serial = _search(X, 1)
    parallel = _search(
        X, 2
    )  # joblib's default backend: loky worker processes, no Dask client there
    assert parallel.best_params_ == serial.best_params_
    np.testing.assert_allclose(
        parallel.cv_results_["mean_test_score"], serial.cv_results_["mean_test_score"], rtol=1e-12
    )


@pytest.mark.timeout(180)
def test_grid_search_under_the_dask_joblib_backend_matches_serial(client, X):
    serial = _search(X, 1)
    with joblib.parallel_backend("dask"):  # every fit runs inside a task on the session cluster
        on_dask = _search(X, 2)
    assert on_dask.best_params_ == serial.best_params_
    np.testing.assert_allclose(
        on_dask.cv_results_["mean_test_score"], serial.cv_results_["mean_test_score"], rtol=1e-12
    )


def _fit_on_the_cluster_in_a_task(X):
    with dask.config.set({"dkmeans.in-process-bytes": 0}):  # force the cluster path inside the task
        km = KMeans(3, random_state=0, max_iter=30).fit(X)
    return km.cluster_centers_, km.data_mode_


@pytest.mark.timeout(180)
def test_fits_on_the_cluster_inside_tasks_holding_every_thread(client, X):
    """Two tasks occupy both worker threads; each fit waits on the cluster, so each must give its thread up."""
    futures = [client.submit(_fit_on_the_cluster_in_a_task, X, pure=False) for _ in range(2)]
    results = client.gather(futures)
    with dask.config.set({"dkmeans.in-process-bytes": 0}):
        reference = KMeans(3, random_state=0, max_iter=30).fit(X)
    for centres, mode in results:
        assert mode == "in-memory"
        np.testing.assert_allclose(centres, reference.cluster_centers_, rtol=1e-12)
