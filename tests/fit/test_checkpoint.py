"""Checkpoint and resume: an interrupted fit resumed from its checkpoint ends as an uninterrupted one."""

from __future__ import annotations

import numpy as np
import pytest

import dkmeans
import dkmeans.estimator
import dkmeans.fit.runs
from dkmeans.drivers.lloyd import CentroidShift, lloyd
from dkmeans.drivers.state import FitState, IterationRecord, LoopState
from dkmeans.io.checkpoint import Checkpointer, CheckpointError, checkpoint_path
from dkmeans.testing import make_blobs, persist_rows


class Interrupted(Exception):
    """Stands for a job killed between two iterations."""


@pytest.fixture(scope="module")
def data():
    X, _, _ = make_blobs(6000, 3, 14, spread=2.5, box=6.0, seed=4, dtype=np.float32)
    return X


def _interrupt_after(monkeypatch, n_records):
    """Make the estimator's progress callback raise after ``n_records`` iteration records."""
    seen = []

    def progress(verbose):
        def show(record):
            seen.append(record)
            if len(seen) == n_records:
                raise Interrupted

        return show

    monkeypatch.setattr(dkmeans.estimator, "_progress", progress)
    return seen


def _assert_same_fit(a, b):
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert a.n_iter_ == b.n_iter_
    assert a.stop_reason_ == b.stop_reason_
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-12)
    assert [h["objective"] for h in a.history_] == [h["objective"] for h in b.history_]


@pytest.mark.parametrize("n_records", [3, 20])  # in the first run; in the second
def test_estimator_resumes_to_the_uninterrupted_result(
    client, data, tmp_path, monkeypatch, n_records
):
    _interrupt_and_resume(data, tmp_path, monkeypatch, n_records)


@pytest.mark.parametrize("n_records", [3, 20])
def test_single_task_loop_resumes_to_the_uninterrupted_result(
    client, data, tmp_path, monkeypatch, single_task, n_records
):
    """The loop runs in one task per block of ``checkpoint_every`` updates; a checkpoint ends each block."""
    _interrupt_and_resume(data, tmp_path, monkeypatch, n_records)
    assert "lloyd_iterations" in single_task


@pytest.mark.parametrize("n_records", [3, 20])
def test_spmd_loop_resumes_to_the_uninterrupted_result(
    client, data, tmp_path, monkeypatch, spmd, n_records
):
    """The loop runs SPMD in blocks of ``checkpoint_every`` updates, reporting each iteration as it ends."""
    _interrupt_and_resume(data, tmp_path, monkeypatch, n_records)
    assert "lloyd_iterations" in spmd


def _interrupt_and_resume(data, tmp_path, monkeypatch, n_records):
    params = dict(n_clusters=14, init="k-means++", n_init=2, tol=0, random_state=3)
    reference = dkmeans.KMeans(**params).fit(data)
    assert len(reference.history_) > 20, (
        "the reference must run long enough to be interrupted in run 2"
    )
    path = tmp_path / "job.npz"
    seen = _interrupt_after(monkeypatch, n_records)
    km = dkmeans.KMeans(**params, checkpoint=path, checkpoint_every=2)
    with pytest.raises(Interrupted):
        km.fit(data)
    assert len(seen) == n_records and path.is_file()
    assert not hasattr(km, "cluster_centers_")  # no half-fitted estimator
    monkeypatch.undo()
    resumed = dkmeans.KMeans(**params, checkpoint=path, checkpoint_every=2).fit(data)
    _assert_same_fit(resumed, reference)


def test_random_state_none_resumes_with_the_saved_seed(client, data, tmp_path, monkeypatch):
    path = tmp_path / "seedless"
    _interrupt_after(monkeypatch, 2)
    with pytest.raises(Interrupted):
        dkmeans.KMeans(14, tol=0, checkpoint=path, checkpoint_every=1).fit(data)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "seedless"
    ]  # the file named, no suffix added
    saved_seed = Checkpointer(path, 1, {})._read()[1]["seed"]
    resumed = dkmeans.KMeans(14, tol=0, checkpoint=path).fit(data)
    # the same job with the saved seed as an explicit random_state, from scratch
    reference = dkmeans.KMeans(14, tol=0, random_state=int(saved_seed)).fit(data)
    _assert_same_fit(resumed, reference)


def test_finished_checkpoint_returns_the_result_without_iterating(
    client, data, tmp_path, monkeypatch
):
    params = dict(n_clusters=14, tol=0, random_state=5, checkpoint=tmp_path / "done.npz")
    first = dkmeans.KMeans(**params).fit(data)
    seen = _interrupt_after(monkeypatch, 10**9)
    again = dkmeans.KMeans(**params).fit(data)
    assert seen == []
    _assert_same_fit(again, first)


def test_hartigan_refinement_resumes_from_the_lloyd_result(client, data, tmp_path, monkeypatch):
    params = dict(n_clusters=14, tol=0, random_state=6, refine="hartigan")
    reference = dkmeans.KMeans(**params).fit(data)
    n_lloyd = sum(h["algorithm"] == "lloyd" for h in reference.history_)
    assert len(reference.history_) > n_lloyd, (
        "Hartigan must move rows for this test to mean anything"
    )
    path = tmp_path / "refine.npz"
    _interrupt_after(monkeypatch, n_lloyd + 1)  # inside the Hartigan phase
    with pytest.raises(Interrupted):
        dkmeans.KMeans(**params, checkpoint=path).fit(data)
    monkeypatch.undo()
    _assert_same_fit(dkmeans.KMeans(**params, checkpoint=path).fit(data), reference)


def test_functional_train_resumes_with_the_objective_rule(client, data, tmp_path, monkeypatch):
    desc = dkmeans.Descriptor(cluster_count=14, max_iteration_count=200, accuracy_threshold=2.0)
    job = dict(initial_centroids="random", random_state=2)
    reference = dkmeans.train(desc, data, **job)
    assert reference.iteration_count > 5
    real_lloyd = dkmeans.fit.runs.lloyd

    def lloyd_killed_after_5(*args, on_state=None, **kwargs):
        def state(loop):
            on_state(loop)
            if loop.n_iter == 5:
                raise Interrupted

        return real_lloyd(*args, on_state=state, **kwargs)

    path = tmp_path / "train.npz"
    monkeypatch.setattr(dkmeans.fit.runs, "lloyd", lloyd_killed_after_5)
    with pytest.raises(Interrupted):
        dkmeans.train(desc, data, **job, checkpoint=path, checkpoint_every=1)
    monkeypatch.undo()
    assert Checkpointer(path, 1, {}).path.is_file()
    shorter = dkmeans.Descriptor(cluster_count=14, max_iteration_count=100, accuracy_threshold=2.0)
    with pytest.raises(CheckpointError, match="descriptor.max_iteration_count"):
        dkmeans.train(shorter, data, **job, checkpoint=path)
    out = dkmeans.train(desc, data, **job, checkpoint=path, checkpoint_every=1)
    assert out.iteration_count == reference.iteration_count
    np.testing.assert_array_equal(out.model.centroids, reference.model.centroids)
    np.testing.assert_array_equal(out.labels, reference.labels)
    assert out.objective_function_value == pytest.approx(
        reference.objective_function_value, rel=1e-12
    )
    assert out.stop_reason == reference.stop_reason == "objective-decrease"
    assert [r.objective for r in out.history] == [r.objective for r in reference.history]


def test_a_checkpoint_of_another_job_is_refused(client, data, tmp_path):
    path = tmp_path / "job.npz"
    dkmeans.KMeans(14, random_state=0, checkpoint=path).fit(data)
    with pytest.raises(CheckpointError, match="params.n_clusters"):
        dkmeans.KMeans(13, random_state=0, checkpoint=path).fit(data)
    other = data.copy()
    other[:, 0] += 1.0  # same shape and dtype, other values
    with pytest.raises(CheckpointError, match="data"):
        dkmeans.KMeans(14, random_state=0, checkpoint=path).fit(other)
    with pytest.raises(CheckpointError, match="dtype"):
        dkmeans.KMeans(14, random_state=0, checkpoint=path).fit(data.astype(np.float64))


def test_damaged_checkpoint_is_refused(client, data, tmp_path):
    path = tmp_path / "job.npz"
    dkmeans.KMeans(14, random_state=0, checkpoint=path).fit(data)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="damaged or truncated"):
        dkmeans.KMeans(14, random_state=0, checkpoint=path).fit(data)


def test_writes_are_atomic(tmp_path, monkeypatch):
    cp = Checkpointer(tmp_path / "a", 1, {"job": 1})
    assert (
        cp.path == checkpoint_path(tmp_path / "a") == tmp_path / "a"
    )  # the file named, no suffix added
    first = FitState(
        seed=7, run=0, phase="lloyd", loop=LoopState(np.eye(3, dtype=np.float32), 4, 1.5, [])
    )
    cp.save(first)

    def crash(fh, **arrays):
        fh.write(b"PK\x03\x04 half a file")
        raise OSError("disk full")

    monkeypatch.setattr("dkmeans.io.model_file.np.savez", crash)
    with pytest.raises(OSError, match="disk full"):
        cp.save(
            FitState(
                seed=7,
                run=0,
                phase="lloyd",
                loop=LoopState(np.zeros((3, 3), np.float32), 5, 1.0, []),
            )
        )
    monkeypatch.undo()
    loaded = cp.load()
    assert loaded.loop.n_iter == 4 and loaded.loop.previous_objective == 1.5 and loaded.seed == 7
    np.testing.assert_array_equal(loaded.loop.centroids, np.eye(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no temporary file left


def test_lloyd_resumed_at_its_stopping_point_stops(client):
    X, _, _ = make_blobs(500, 2, 3, seed=0)
    data = persist_rows(client, X, 2)
    C = X[:3].copy()
    done = LoopState(C, 4, 10.0, [IterationRecord(4, 10.0, 0.0, 0, 0.1)])
    result = lloyd(data, None, max_iter=100, stop_rule=CentroidShift(0.0), resume=done)
    assert (result.n_iter, result.stop_reason) == (4, "centroid-shift")
    np.testing.assert_array_equal(result.centroids, C)


def test_checkpoint_parameters_are_checked(client, data):
    with pytest.raises(ValueError, match="checkpoint_every"):
        dkmeans.KMeans(3, checkpoint="x.npz", checkpoint_every=0).fit(data)
    with pytest.raises(ValueError, match="checkpoint must be a file path"):
        dkmeans.KMeans(3, checkpoint=5).fit(data)
