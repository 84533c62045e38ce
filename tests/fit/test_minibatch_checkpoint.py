"""MiniBatchKMeans checkpoints: a fit stopped after a checkpoint and resumed ends exactly where an
uninterrupted fit ends, in memory (blocks of steps) and out of core (a position in the pass)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import dkmeans
from dkmeans import MiniBatchKMeans
from dkmeans.engine.streamed import StreamedData
from dkmeans.io.checkpoint import Checkpointer, CheckpointError
from dkmeans.testing import make_blobs


class Interrupted(Exception):
    """Stands for a job killed right after a checkpoint write."""


@pytest.fixture(scope="module")
def X():
    X, _, _ = make_blobs(6000, 4, 6, spread=1.0, box=10.0, seed=5)
    return X[np.random.default_rng(0).permutation(len(X))]


def stop_after_writes(monkeypatch, n_writes: int) -> list:
    """Make the ``n_writes + 1``-th checkpoint write raise :class:`Interrupted` (the file keeps the n-th)."""
    original, writes = Checkpointer.save, []

    def save(self, state):
        if len(writes) == n_writes:
            raise Interrupted
        original(self, state)
        writes.append(Checkpointer(self.path, 1, {}).progress())

    monkeypatch.setattr(Checkpointer, "save", save)
    return writes


def resumed_from(monkeypatch) -> list:
    """Record the step each mini-batch driver starts from; a resumed fit must not initialise again."""
    import dkmeans.fit.minibatch

    starts = []

    def no_init(*args, **kwargs):
        raise AssertionError("a resumed fit initialised again")

    def spy(driver):
        def run(data, state, **kwargs):
            starts.append(kwargs["resume"].run.n_steps)
            return driver(data, state, **kwargs)

        return run

    monkeypatch.setattr(dkmeans.fit.minibatch, "_minibatch_centers", no_init)
    monkeypatch.setattr(dkmeans.fit.minibatch, "minibatch", spy(dkmeans.fit.minibatch.minibatch))
    monkeypatch.setattr(
        dkmeans.fit.minibatch, "minibatch_pass", spy(dkmeans.fit.minibatch.minibatch_pass)
    )
    return starts


def assert_same_fit(a, b):
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(a._counts, b._counts)
    assert a.n_steps_ == b.n_steps_ and a.stop_reason_ == b.stop_reason_
    assert [
        h["batch_objective"] if "batch_objective" in h else h["objective"] for h in a.history_
    ] == [h["batch_objective"] if "batch_objective" in h else h["objective"] for h in b.history_]


@pytest.mark.parametrize("where", ["process", "cluster"])
def test_in_memory_fit_resumes_to_the_uninterrupted_result(client, X, tmp_path, monkeypatch, where):
    kwargs = dict(n_clusters=6, random_state=3, batch_size=128, max_iter=3, max_no_improvement=None)
    as_input = (lambda A, c: A) if where == "process" else (lambda A, c: da.from_array(A, chunks=c))
    reference = MiniBatchKMeans(**kwargs).fit(as_input(X, 900))
    path = tmp_path / "mb.ckpt"
    with monkeypatch.context() as m:
        writes = stop_after_writes(m, 3)  # the initialisation, then two blocks of 16 steps
        with pytest.raises(Interrupted):
            MiniBatchKMeans(**kwargs, checkpoint=path, checkpoint_every=16).fit(as_input(X, 900))
    assert [w["n_iter"] for w in writes] == [0, 16, 32]
    starts = resumed_from(monkeypatch)
    resumed = MiniBatchKMeans(**kwargs, checkpoint=path, checkpoint_every=16).fit(as_input(X, 1300))
    assert starts == [32]
    assert reference.n_steps_ == (3 * len(X)) // 128 > 32
    assert_same_fit(resumed, reference)
    assert len(resumed.history_) == reference.n_steps_
    assert Checkpointer(path, 1, {}).progress()["n_iter"] == reference.n_steps_


def test_weighted_fit_resumes_to_the_uninterrupted_result(client, X, tmp_path, monkeypatch):
    """Batches drawn by weight (the cumulative-weight draws) resume exactly, on another chunking."""
    w = np.random.default_rng(9).uniform(0.0, 3.0, len(X))
    w[::7] = 0.0
    kwargs = dict(n_clusters=6, random_state=8, batch_size=128, max_iter=2, max_no_improvement=None)

    def fit(chunks, **extra):
        dX, dw = da.from_array(X, chunks=chunks), da.from_array(w, chunks=chunks)
        return MiniBatchKMeans(**kwargs, **extra).fit(dX, sample_weight=dw)

    reference = fit(900)
    unweighted = MiniBatchKMeans(**kwargs).fit(X)  # the weights do change the run
    assert not np.array_equal(unweighted.cluster_centers_, reference.cluster_centers_)
    path = tmp_path / "mb.ckpt"
    with monkeypatch.context() as m:
        writes = stop_after_writes(m, 3)
        with pytest.raises(Interrupted):
            fit(900, checkpoint=path, checkpoint_every=16)
    assert [w["n_iter"] for w in writes] == [0, 16, 32]
    starts = resumed_from(monkeypatch)
    resumed = fit(1300, checkpoint=path, checkpoint_every=16)
    assert starts == [32] and reference.n_steps_ == (2 * len(X)) // 128
    assert_same_fit(resumed, reference)


def test_early_stopped_fit_resumes_to_the_same_stop(X, tmp_path, monkeypatch):
    """The early-stopping bookkeeping (smoothed objective, steps without improvement) is saved too."""
    kwargs = dict(n_clusters=6, random_state=4, batch_size=64, max_iter=20, max_no_improvement=5)
    reference = MiniBatchKMeans(**kwargs).fit(X)
    assert reference.stop_reason_ == "no-improvement" and reference.n_steps_ > 8
    path = tmp_path / "mb.ckpt"
    with monkeypatch.context() as m:
        stop_after_writes(m, 2)
        with pytest.raises(Interrupted):
            MiniBatchKMeans(**kwargs, checkpoint=path, checkpoint_every=4).fit(X)
    starts = resumed_from(monkeypatch)
    assert_same_fit(
        MiniBatchKMeans(**kwargs, checkpoint=path, checkpoint_every=4).fit(X), reference
    )
    assert starts == [4]


def test_out_of_core_fit_resumes_at_its_row(client, X, tmp_path, monkeypatch):
    """Out of core the checkpoint holds the position in the pass: the resumed fit reads on from there."""
    kwargs = dict(
        n_clusters=6,
        random_state=2,
        batch_size=100,
        max_iter=2,
        max_no_improvement=None,
        out_of_core=True,
    )
    reference = MiniBatchKMeans(**kwargs).fit(da.from_array(X, chunks=500))
    assert reference.data_mode_ == "out-of-core" and reference.n_steps_ == 120
    path = tmp_path / "mb.ckpt"
    with monkeypatch.context() as m:
        writes = stop_after_writes(m, 3)
        with pytest.raises(Interrupted):
            MiniBatchKMeans(**kwargs, checkpoint=path, checkpoint_every=10).fit(
                da.from_array(X, chunks=500)
            )
    saved = writes[-1]
    assert saved["n_iter"] >= 20 and 0 < saved["next_row"] < len(X) and saved["epoch"] == 0
    starts = []
    original = StreamedData.fold

    def fold(self, *args, start_row=0, **kw):
        starts.append(start_row)
        return original(self, *args, start_row=start_row, **kw)

    monkeypatch.setattr(StreamedData, "fold", fold)
    steps = resumed_from(monkeypatch)
    resumed = MiniBatchKMeans(**kwargs, checkpoint=path, checkpoint_every=10).fit(
        da.from_array(X, chunks=700)
    )
    assert steps == [saved["n_iter"]]
    assert starts == [
        saved["next_row"],
        0,
    ]  # the rest of the first pass, then the second from its start
    assert_same_fit(resumed, reference)


def test_checkpoint_of_another_job_is_refused(X, tmp_path):
    path = tmp_path / "mb.ckpt"
    MiniBatchKMeans(6, random_state=0, batch_size=256, checkpoint=path).fit(X)
    with pytest.raises(CheckpointError, match="batch_size"):
        MiniBatchKMeans(6, random_state=0, batch_size=512, checkpoint=path).fit(X)
    with pytest.raises(CheckpointError):  # a mini-batch checkpoint offered to a Lloyd fit
        dkmeans.KMeans(6, random_state=0, checkpoint=path).fit(X)
    lloyd = tmp_path / "lloyd.ckpt"
    dkmeans.KMeans(6, random_state=0, max_iter=3, checkpoint=lloyd).fit(X)
    with pytest.raises(CheckpointError):  # and the other way round
        MiniBatchKMeans(6, random_state=0, checkpoint=lloyd).fit(X)


def test_lloyd_checkpoints_stay_version_1(X, tmp_path):
    """Lloyd checkpoints are written as before (format version 1, readable by older versions)."""
    from dkmeans.io.model_file import read_archive

    lloyd, mb = tmp_path / "lloyd.ckpt", tmp_path / "mb.ckpt"
    a = dkmeans.KMeans(6, random_state=0, max_iter=4, tol=0, checkpoint=lloyd).fit(X)
    MiniBatchKMeans(6, random_state=0, checkpoint=mb).fit(X)
    versions = [
        read_archive(
            p,
            set(),
            "checkpoint",
            CheckpointError,
            optional=frozenset(
                {"centroids", "best_centroids", "counts", "pending", "pending_weights"}
            ),
        )[1]["format_version"]
        for p in (lloyd, mb)
    ]
    assert versions == [1, 2]
    b = dkmeans.KMeans(6, random_state=0, max_iter=4, tol=0, checkpoint=lloyd).fit(
        X
    )  # resumes from it
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)


def test_functional_train_minibatch_resumes(X, tmp_path, monkeypatch):
    desc = dkmeans.Descriptor(
        cluster_count=6, max_iteration_count=2, method="minibatch", dtype=np.float64
    )
    kwargs = dict(random_state=0, batch_size=128, max_no_improvement=None)
    reference = dkmeans.train(desc, X, "k-means++", **kwargs)
    path = tmp_path / "train.ckpt"
    with monkeypatch.context() as m:
        stop_after_writes(m, 2)
        with pytest.raises(Interrupted):
            dkmeans.train(desc, X, "k-means++", checkpoint=path, checkpoint_every=20, **kwargs)
    starts = resumed_from(monkeypatch)
    resumed = dkmeans.train(desc, X, "k-means++", checkpoint=path, checkpoint_every=20, **kwargs)
    assert starts == [20]
    np.testing.assert_array_equal(resumed.model.centroids, reference.model.centroids)
    assert resumed.objective_function_value == reference.objective_function_value
