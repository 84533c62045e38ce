"""Worker loss during Lloyd iterations: the fit finishes with the fault-free result."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from dkmeans.lloyd import CentroidShift, fit_lloyd
from dkmeans.testing import local_cluster, make_blobs, persist_rows, pick_rows


@pytest.fixture
def own_cluster():
    """A separate 2-worker cluster with nannies (a killed worker is restarted)."""
    with local_cluster(2) as c:
        yield c


def test_killed_worker_mid_fit_gives_the_same_result(own_cluster):
    c = own_cluster
    X, _, _ = make_blobs(200_000, 6, 12, spread=3.0, box=6.0, seed=1)
    C0 = pick_rows(X, 12, seed=2)
    reference = fit_lloyd(persist_rows(c, X, 8), C0, max_iter=25, stop_rule=CentroidShift(0.0))
    killed = []

    def kill_one_worker(record):
        if record.iteration == 4 and not killed:
            worker = sorted(c.scheduler_info(n_workers=-1)["workers"])[0]
            pid = c.run(os.getpid, workers=[worker])[worker]
            os.kill(pid, signal.SIGKILL)
            killed.append(worker)

    out = fit_lloyd(persist_rows(c, X, 8), C0, max_iter=25, stop_rule=CentroidShift(0.0),
                    on_iteration=kill_one_worker)
    assert killed, "the worker was never killed"
    assert out.result.n_iter == reference.result.n_iter
    np.testing.assert_allclose(out.result.centroids, reference.result.centroids, rtol=1e-12)
    np.testing.assert_array_equal(c.compute(out.labels, sync=True), c.compute(reference.labels, sync=True))
    assert out.objective == pytest.approx(reference.objective, rel=1e-12)
