"""The SPMD loop when its ranks cannot meet: a rank that cannot start, a worker killed mid-fit, a
cluster restarted mid-fit (each on a 2-worker cluster of its own, ``own_cluster``), and ranks
sharing the one worker of a 3-thread cluster."""

from __future__ import annotations

import logging
import os
import signal
import time

import dask
import numpy as np
import pytest
from distributed import Client

from dkmeans.drivers.lloyd import CentroidShift
from dkmeans.engine.spmd import run_spmd
from dkmeans.errors import ClusterRestartedError
from dkmeans.testing import fit_lloyd, make_blobs, persist_rows, pick_rows


def _concat(parts):
    return [x for part in parts for x in part]


@pytest.mark.parametrize("seen_busy", [True, False])
def test_a_rank_that_cannot_start_falls_back_to_one_graph_per_iteration(
    own_cluster, spmd, caplog, monkeypatch, seen_busy
):
    """One worker's only thread is busy: SPMD is not tried (``seen_busy``), or, when the task
    on it starts just after the check, the other rank gives up after ``dkmeans.spmd-wait``."""
    c = own_cluster
    if not seen_busy:
        monkeypatch.setattr(c, "processing", lambda workers=None: {})
    X, _, _ = make_blobs(6000, 3, 5, spread=2.0, box=5.0, seed=8)
    C0 = pick_rows(X, 5, seed=2)
    data = persist_rows(c, X, 6)
    with dask.config.set({"dkmeans.spmd": False}):
        reference = fit_lloyd(data, C0, max_iter=30, stop_rule=CentroidShift(0.0))
    busy_worker = data.placement()[1][0]
    blocker = c.submit(
        time.sleep, 4, workers=[busy_worker], pure=False
    )  # longer than the wait below
    while not Client.processing(c, [busy_worker]).get(
        busy_worker
    ):  # running there before the fit starts
        time.sleep(0.01)
    started = time.monotonic()
    with (
        dask.config.set({"dkmeans.spmd-wait": "1s"}),
        caplog.at_level(logging.INFO, logger="dkmeans"),
    ):
        out = fit_lloyd(data, C0, max_iter=30, stop_rule=CentroidShift(0.0))
    blocker.result()
    assert "SPMD loop failed" in caplog.text and "lloyd_iterations" in spmd
    assert ("busy with other tasks" in caplog.text) == seen_busy
    assert ("waited" in caplog.text) != seen_busy
    assert time.monotonic() - started < 30
    assert out.result.n_iter == reference.result.n_iter
    np.testing.assert_allclose(out.result.centroids, reference.result.centroids, rtol=1e-12)


def test_killed_worker_mid_spmd_fit_gives_the_same_result(own_cluster, spmd, caplog):
    c = own_cluster
    # overlapping clusters: all 150 iterations run, well over a second, so the kill at the
    # first progress report (within half a second) lands mid-fit
    X, _, _ = make_blobs(300_000, 6, 12, spread=6.0, box=6.0, seed=1)
    C0 = pick_rows(X, 12, seed=2)
    options = dict(max_iter=150, stop_rule=CentroidShift(0.0))
    reference = fit_lloyd(persist_rows(c, X, 8), C0, **options)
    killed = []

    def kill_one_worker(record):  # at the first progress report, well before the end
        if not killed:
            worker = sorted(c.scheduler_info(n_workers=-1)["workers"])[0]
            os.kill(c.run(os.getpid, workers=[worker])[worker], signal.SIGKILL)
            killed.append(record.iteration)

    with caplog.at_level(logging.INFO, logger="dkmeans"):
        out = fit_lloyd(persist_rows(c, X, 8), C0, on_iteration=kill_one_worker, **options)
    assert killed and killed[0] < reference.result.n_iter - 5, (killed, reference.result.n_iter)
    assert "SPMD loop failed" in caplog.text and "lloyd_iterations" in spmd
    assert out.result.n_iter == reference.result.n_iter
    assert [r.iteration for r in out.result.history] == list(range(1, out.result.n_iter + 1))
    np.testing.assert_allclose(out.result.centroids, reference.result.centroids, rtol=1e-10)
    np.testing.assert_array_equal(
        c.compute(out.labels, sync=True), c.compute(reference.labels, sync=True)
    )


def test_cluster_restart_mid_spmd_fit_is_a_clear_error(own_cluster, spmd):
    c = own_cluster
    X, _, _ = make_blobs(20_000, 3, 6, seed=5)
    restarted = []

    def restart_once(record):
        if not restarted:
            c.restart()
            restarted.append(1)

    with pytest.raises(ClusterRestartedError, match="restarted"):
        fit_lloyd(
            persist_rows(c, X, 4),
            pick_rows(X, 6, seed=1),
            max_iter=200,
            stop_rule=CentroidShift(0.0),
            on_iteration=restart_once,
        )
    assert restarted


def test_ranks_sharing_a_worker_exchange_in_process_and_match_the_graph_loop(spmd):
    """One worker with three threads: three ranks on one worker, messages to the same address."""
    from dkmeans.engine.client import start_local_cluster

    c = start_local_cluster(
        n_workers=1, threads_per_worker=3, dashboard_address=None, set_as_default=False
    )
    try:
        X, _, _ = make_blobs(9000, 3, 5, spread=2.5, box=5.0, seed=4)
        C0 = pick_rows(X, 5, seed=3)
        data = persist_rows(c, X, 6)
        groups = data.placement()
        assert len(groups) == 3 and len({addr for addr, _ in groups}) == 1
        views, _ = run_spmd(data, lambda chunks: chunks.comm.allreduce([chunks.rank], _concat))
        assert views == [0, 1, 2]
        options = dict(max_iter=25, stop_rule=CentroidShift(0.0))
        with dask.config.set({"dkmeans.spmd": False}):
            reference = fit_lloyd(data, C0, **options)
        out = fit_lloyd(data, C0, **options)
        assert spmd.count("lloyd_iterations") == 1
        assert out.result.n_iter == reference.result.n_iter
        np.testing.assert_allclose(out.result.centroids, reference.result.centroids, rtol=1e-12)
    finally:
        cluster = c.cluster
        c.close()
        cluster.close()
