"""A fit stopped from outside (Ctrl-C, the command line's SIGTERM) writes its last finished
iteration to its checkpoint on the way out, and resumes from it to the uninterrupted result."""

from __future__ import annotations

import numpy as np
import pytest

import dkmeans
import dkmeans.estimator
from dkmeans.errors import JobInterrupted
from dkmeans.io.checkpoint import Checkpointer
from dkmeans.testing import make_blobs

PARAMS = dict(n_clusters=14, init="k-means++", n_init=1, tol=0, random_state=3, local_search=False)


@pytest.fixture(scope="module")
def data():
    X, _, _ = make_blobs(6000, 3, 14, spread=2.5, box=6.0, seed=4, dtype=np.float32)
    return X


def _stop_after(monkeypatch, n_records, exc):
    """The estimator's progress callback raises ``exc`` when the ``n_records``-th record is shown."""
    seen = []

    def progress(verbose):
        def show(record):
            seen.append(record)
            if len(seen) == n_records:
                raise exc

        return show

    monkeypatch.setattr(dkmeans.estimator, "_progress", progress)
    return seen


@pytest.mark.parametrize(
    "exc", [JobInterrupted(15), KeyboardInterrupt()], ids=["sigterm", "ctrl-c"]
)
@pytest.mark.parametrize("loop", ["in-process", "graph"])
def test_stopped_fit_saves_its_last_iteration_and_resumes_to_the_uninterrupted_result(
    client, data, tmp_path, monkeypatch, request, exc, loop
):
    if loop == "graph":
        request.getfixturevalue("graph_loop")
        request.getfixturevalue("on_cluster")
    reference = dkmeans.KMeans(**PARAMS).fit(data)
    assert reference.n_iter_ > 12, "the reference must run long enough to be stopped"
    path = tmp_path / "job.ckpt"
    seen = _stop_after(monkeypatch, 12, exc)
    km = dkmeans.KMeans(**PARAMS, checkpoint=path, checkpoint_every=1000)
    with pytest.raises(type(exc)):
        km.fit(data)
    assert len(seen) == 12
    assert not hasattr(km, "cluster_centers_")  # no half-fitted estimator
    # checkpoint_every=1000: only the write on the way out holds Lloyd iterations. The 12th update
    # was being reported when the fit stopped: the last finished one is the 11th.
    assert Checkpointer(path, 1, {}).progress() == {"run": 0, "phase": "lloyd", "n_iter": 11}
    monkeypatch.undo()
    resumed = dkmeans.KMeans(**PARAMS, checkpoint=path, checkpoint_every=1000).fit(data)
    np.testing.assert_array_equal(resumed.cluster_centers_, reference.cluster_centers_)
    assert resumed.n_iter_ == reference.n_iter_ and resumed.stop_reason_ == reference.stop_reason_
    assert [h["objective"] for h in resumed.history_] == [
        h["objective"] for h in reference.history_
    ]


def test_a_fit_without_checkpoint_writes_nothing_when_stopped(client, data, tmp_path, monkeypatch):
    _stop_after(monkeypatch, 3, JobInterrupted(2))
    with pytest.raises(JobInterrupted):
        dkmeans.KMeans(**PARAMS).fit(data)
    assert list(tmp_path.iterdir()) == []
