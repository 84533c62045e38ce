"""Faults on a real multi-process cluster: worker loss (Lloyd, k-means|| init), lost scattered
input, every worker gone, a restarted cluster, and a killed CLI job resumed from its checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest

import dkmeans
import dkmeans.estimator
from dkmeans.drivers.lloyd import CentroidShift
from dkmeans.engine.persisted import PersistedData
from dkmeans.errors import ClusterRestartedError, InputLostError, NoWorkersError
from dkmeans.io.checkpoint import Checkpointer
from dkmeans.testing import fit_lloyd, local_cluster, make_blobs, persist_rows, pick_rows
from tests.helpers import kill_when

# Failures of the cluster: in-memory input goes to the cluster too (not fitted in-process).
pytestmark = pytest.mark.usefixtures("on_cluster")


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

    out = fit_lloyd(
        persist_rows(c, X, 8),
        C0,
        max_iter=25,
        stop_rule=CentroidShift(0.0),
        on_iteration=kill_one_worker,
    )
    assert killed, "the worker was never killed"
    assert out.result.n_iter == reference.result.n_iter
    np.testing.assert_allclose(out.result.centroids, reference.result.centroids, rtol=1e-12)
    np.testing.assert_array_equal(
        c.compute(out.labels, sync=True), c.compute(reference.labels, sync=True)
    )
    assert out.objective == pytest.approx(reference.objective, rel=1e-12)


def test_killed_worker_with_a_spread_one_chunk_input_gives_the_same_result(own_cluster):
    """The pieces a one-chunk input is split into keep their lineage: lost ones are recomputed."""
    c = own_cluster
    X, _, _ = make_blobs(120_000, 5, 8, spread=3.0, box=6.0, seed=3)
    C0 = pick_rows(X, 8, seed=4)
    reference = fit_lloyd(persist_rows(c, X, 8), C0, max_iter=25, stop_rule=CentroidShift(0.0))
    data = PersistedData(c, da.from_array(X, chunks=X.shape))
    assert len({addr for addr, _ in data.placement()}) == 2
    killed = []

    def kill_one_worker(record):
        if record.iteration == 3 and not killed:
            killed.append(_kill_worker(c, 0))

    out = fit_lloyd(
        data, C0, max_iter=25, stop_rule=CentroidShift(0.0), on_iteration=kill_one_worker
    )
    assert killed
    assert out.result.n_iter == reference.result.n_iter
    np.testing.assert_allclose(out.result.centroids, reference.result.centroids, rtol=1e-12)
    assert out.objective == pytest.approx(reference.objective, rel=1e-12)


def test_killed_worker_between_single_task_blocks_gives_the_same_result(own_cluster, single_task):
    """A small loop runs in one task per block; the worker running it is killed between blocks."""
    c = own_cluster
    X, _, _ = make_blobs(20_000, 4, 9, spread=3.0, box=5.0, seed=5)
    C0 = pick_rows(X, 9, seed=6)
    options = dict(max_iter=30, stop_rule=CentroidShift(0.0), state_every=3)
    reference = fit_lloyd(persist_rows(c, X, 6), C0, on_state=lambda s: None, **options)
    killed = []

    def kill_after_block(state):
        if state.n_iter >= 6 and not killed:
            killed.append(_kill_worker(c, 0))

    out = fit_lloyd(persist_rows(c, X, 6), C0, on_state=kill_after_block, **options)
    assert killed and single_task.count("lloyd_iterations") >= 3
    assert out.result.n_iter == reference.result.n_iter > 6
    np.testing.assert_allclose(out.result.centroids, reference.result.centroids, rtol=1e-12)
    assert out.objective == pytest.approx(reference.objective, rel=1e-12)


def _kill_worker(c, index=0):
    worker = sorted(c.scheduler_info(n_workers=-1)["workers"])[index]
    pid = c.run(os.getpid, workers=[worker])[worker]
    os.kill(pid, signal.SIGKILL)
    return worker


def test_killed_worker_during_kmeans_parallel_init_gives_the_same_result(own_cluster, monkeypatch):
    """The seeding state kept on the workers (distances, draws) is recomputed from its lineage."""
    c = own_cluster
    X, _, _ = make_blobs(100_000, 5, 20, spread=2.0, box=8.0, seed=3)
    params = dict(n_clusters=20, init="k-means||", max_iter=50, random_state=11)
    Xd = da.from_array(X, chunks=(12_500, 5))
    with c.as_current():
        reference = dkmeans.KMeans(**params).fit(Xd)
        real = PersistedData.map_reduce_stateful
        calls, killed = [], []

        def map_reduce_stateful(self, *args, **kwargs):
            calls.append(1)
            if (
                len(calls) == 3
            ):  # the second sampling round: state of rounds 1-2 lives on the workers
                killed.append(_kill_worker(c))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(PersistedData, "map_reduce_stateful", map_reduce_stateful)
        faulty = dkmeans.KMeans(**params).fit(Xd)
    assert killed, "the worker was never killed"
    # equal up to the order in which per-worker partial sums were added
    np.testing.assert_allclose(
        faulty.cluster_centers_, reference.cluster_centers_, rtol=1e-12, atol=1e-12
    )
    assert faulty.n_iter_ == reference.n_iter_
    np.testing.assert_array_equal(
        c.compute(faulty.labels_, sync=True), c.compute(reference.labels_, sync=True)
    )


def test_lost_scattered_input_fails_fast_with_the_cause(own_cluster):
    c = own_cluster
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(5_000, 3)) for _ in range(4)]
    futures = c.scatter(parts)  # held only in worker memory: not recomputable
    X = da.concatenate(
        [da.from_delayed(f, shape=p.shape, dtype=p.dtype) for f, p in zip(futures, parts)]
    )
    km = dkmeans.KMeans(4, init="random", n_init=1, max_iter=300, tol=0, random_state=0)
    killed = []

    def kill_once(verbose):
        def show(record):
            if not killed:
                killed.append(_kill_worker(c))

        return show

    started = time.monotonic()
    with c.as_current(), dask.config.set({"dkmeans.worker-timeout": "30s"}):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(dkmeans.estimator, "_progress", kill_once)
            with pytest.raises(InputLostError, match="cannot be recomputed.*client.scatter"):
                km.fit(X)
    assert (
        killed and time.monotonic() - started < 20
    )  # not the worker timeout: the cause is known at once
    assert not hasattr(km, "cluster_centers_")


def test_losing_every_worker_ends_with_a_timeout_error(monkeypatch):
    with local_cluster(2) as c, c.as_current(), dask.config.set({"dkmeans.worker-timeout": "2s"}):
        X = da.random.default_rng(0).normal(size=(20_000, 3), chunks=(5_000, 3))
        km = dkmeans.KMeans(5, init="random", n_init=1, max_iter=300, tol=0, random_state=0)
        stopped = []

        def stop_all_workers(verbose):
            def show(record):
                if not stopped:
                    c.cluster.scale(0)
                    deadline = time.monotonic() + 30
                    while c.nthreads() and time.monotonic() < deadline:
                        time.sleep(0.05)
                    stopped.append(time.monotonic())

            return show

        monkeypatch.setattr(dkmeans.estimator, "_progress", stop_all_workers)
        with pytest.raises(NoWorkersError, match="no workers for 2 s.*dkmeans.worker-timeout"):
            km.fit(X)
        assert 2 <= time.monotonic() - stopped[0] < 20
        assert not hasattr(km, "cluster_centers_")


def test_cluster_restart_mid_fit_is_a_clear_error_and_keeps_the_previous_fit(
    own_cluster, monkeypatch
):
    c = own_cluster
    X, _, _ = make_blobs(20_000, 3, 6, seed=5)
    Xd = da.from_array(X, chunks=(5_000, 3))
    with c.as_current():
        km = dkmeans.KMeans(6, init="random", n_init=1, tol=0, random_state=0).fit(Xd)
        before = {k: v for k, v in vars(km).items() if k.endswith("_")}
        restarted = []

        def restart_once(verbose):
            def show(record):
                if not restarted:
                    c.restart()
                    restarted.append(1)

            return show

        monkeypatch.setattr(dkmeans.estimator, "_progress", restart_once)
        km.set_params(n_clusters=5)
        with pytest.raises(ClusterRestartedError, match="restarted"):
            km.fit(
                np.asarray(X[:, :2])
            )  # another shape: a half-done fit would have changed n_features_in_
    assert restarted
    assert {k: v for k, v in vars(km).items() if k.endswith("_")}.keys() == before.keys()
    assert km.n_features_in_ == 3
    np.testing.assert_array_equal(km.cluster_centers_, before["cluster_centers_"])


def test_cli_fit_killed_mid_run_resumes_to_the_same_model(own_cluster, tmp_path):
    """Run ``dkmeans fit`` in a subprocess, SIGKILL it mid-fit, resume with --resume."""
    c = own_cluster
    rng = np.random.default_rng(7)
    frame = pd.DataFrame(
        rng.uniform(size=(200_000, 6)).astype(np.float32), columns=[f"f{i}" for i in range(6)]
    )
    data = tmp_path / "data.parquet"
    frame.to_parquet(data)
    address = c.scheduler.address
    base = [
        sys.executable,
        "-m",
        "dkmeans",
        "fit",
        str(data),
        "-k",
        "40",
        "--init",
        "random",
        "--random-state",
        "1",
        "--tol",
        "0",
        "--max-iter",
        "400",
        "--scheduler",
        address,
        "--quiet",
    ]
    subprocess.run(
        base + ["--model", str(tmp_path / "reference.npz")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    checkpoint = tmp_path / "job.npz"
    run = base + [
        "--model",
        str(tmp_path / "resumed.npz"),
        "--checkpoint",
        str(checkpoint),
        "--checkpoint-every",
        "1",
    ]

    def three_iterations_saved():
        n_iter = Checkpointer(checkpoint, 1, {}).progress()["n_iter"] if checkpoint.exists() else 0
        return n_iter if n_iter >= 3 else 0

    iteration = kill_when(run, three_iterations_saved, poll=0.02)
    again = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert (
        again.returncode == 2 and "--resume" in again.stderr
    )  # an existing checkpoint is never overwritten
    resumed = subprocess.run(run + ["--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    a, b = (
        dkmeans.KMeans.load(tmp_path / "reference.npz"),
        dkmeans.KMeans.load(tmp_path / "resumed.npz"),
    )
    assert a.n_iter_ == b.n_iter_ > iteration
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-12)


def test_all_workers_paused_is_named():
    """A pass whose workers are all paused (memory) is a named failure, not a wait for ever."""
    from dkmeans.engine.futures import _paused_workers

    class Scheduler:
        def __init__(self, statuses):
            self.statuses = statuses
            self.scheduler = self  # the scheduler's RPCs: identity

        def identity(self, n_workers=-1):
            return {
                "workers": {
                    f"tcp://w{i}": {
                        "status": s,
                        "metrics": {"memory": 330 * 2**20},
                        "memory_limit": 400 * 2**20,
                    }
                    for i, s in enumerate(self.statuses)
                }
            }

        def sync(self, fn, *args, **kwargs):
            return fn(*args, **kwargs)

    assert _paused_workers(Scheduler(["paused", "running"])) is None
    assert _paused_workers(Scheduler([])) is None
    named = _paused_workers(Scheduler(["paused", "paused"]))
    assert named == ["tcp://w0: 330 MiB of 400 MiB", "tcp://w1: 330 MiB of 400 MiB"]
