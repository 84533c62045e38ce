"""Shared passes: each job's results are those of its own passes, the passes over the data are combined."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dkmeans.engine.local import ChunkList
from dkmeans.engine.shared_passes import SharedPasses, SharedState


def _sum_chunk(X, w, offset, scale):
    return float(X.sum()) * scale


def _sum(parts):
    return float(sum(parts))


def _rows_chunk(X, w, offset):
    return [(offset, X.shape[0])]


def _concat(parts):
    return [p for part in parts for p in part]


def _running_chunk(X, w, offset, state, add):
    """Per-chunk state: a running total of the chunk's row sums plus ``add`` per pass."""
    previous = np.zeros(X.shape[0]) if state is None else state["total"]
    total = previous + X.sum(axis=1) + add
    return {"total": total}, float(total.sum())


def _labels_block(X, C, w=None):
    d = ((X[:, None, :] - C[None]) ** 2).sum(-1)
    labels = d.argmin(1)
    value = d.min(1) * (1.0 if w is None else w)
    return np.stack([labels.astype(np.float64), value], axis=1)


@pytest.fixture
def X():
    return np.random.default_rng(0).normal(size=(103, 3))


def _data(X, n_chunks=4):
    return ChunkList.from_array(X, None, n_chunks=n_chunks)


def _job(n_passes, scale):
    """A job of ``n_passes`` plain passes, a stateful chain of 3 passes, a labelled pass and the rows it saw."""

    def job(data):
        sums = [data.map_reduce(_sum_chunk, _sum, (scale * (i + 1),)) for i in range(n_passes)]
        value, state = data.map_reduce_stateful(_running_chunk, _sum, (scale,))
        for _ in range(2):
            value, state = data.map_reduce_stateful(_running_chunk, _sum, (scale,), state)
        labels, total = data.labelled_pass(_labels_block, (data.rows([0, 50]),))
        return (
            sums,
            value,
            data.state_column(state, "total"),
            labels,
            total,
            data.map_reduce(_rows_chunk, _concat),
        )

    return job


def test_each_job_gets_what_its_own_passes_give(X):
    jobs = [_job(n, s) for n, s in ((1, 1.0), (4, 2.0), (2, -1.0))]
    alone = [job(_data(X)) for job in jobs]
    alone_passes = [
        n + 3 + 1 + 1 for n in (1, 4, 2)
    ]  # plain, stateful, labelled, the last plain pass
    data = _data(X)
    together = SharedPasses(data).run(jobs)
    for got, ref in zip(together, alone):
        assert got[0] == ref[0] and got[1] == ref[1] and got[5] == ref[5]
        assert got[4] == pytest.approx(
            ref[4], rel=1e-12
        )  # summed per chunk; the data's own pass sums all rows at once
        np.testing.assert_array_equal(got[2], ref[2])
        np.testing.assert_array_equal(got[3], ref[3])
        assert got[3].dtype == np.int32
    # each round serves every job still running: the longest job's passes, not the sum
    assert data.passes == max(alone_passes) < sum(alone_passes)


def test_views_count_their_own_passes(X):
    data = _data(X)
    data.map_reduce(_sum_chunk, _sum, (1.0,))  # a pass before the jobs (the fit's first pass)
    counted = SharedPasses(data).run(
        [lambda v: (v.map_reduce(_sum_chunk, _sum, (1.0,)), v.passes)[1], lambda v: v.passes]
    )
    assert counted == [2, 1] and data.passes == 2


def test_run_loop_runs_in_the_jobs_thread_and_reports(X):
    seen = []

    def loop(data, n):
        data.report({"thread": threading.current_thread().name})
        return [data.map_reduce(_sum_chunk, _sum, (1.0,)) for _ in range(n)]

    data = _data(X)
    out = SharedPasses(data).run(
        [lambda v: v.run_loop(loop, (3,), on_progress=seen.append)] * 2, names=["a", "b"]
    )
    assert out[0] == out[1] == [pytest.approx(X.sum())] * 3 and data.passes == 3
    assert sorted(r["thread"] for r in seen) == ["dkmeans-shared-a", "dkmeans-shared-b"]


def test_states_of_different_passes_are_kept_apart(X):
    """Two jobs continuing states made by different combined passes: a pass each, each its own state."""

    def starts_first(data):
        value, state = data.map_reduce_stateful(_running_chunk, _sum, (1.0,))
        data.map_reduce(_sum_chunk, _sum, (1.0,))
        return data.map_reduce_stateful(_running_chunk, _sum, (1.0,), state)[0]

    def starts_second(data):
        data.map_reduce(_sum_chunk, _sum, (1.0,))
        value, state = data.map_reduce_stateful(_running_chunk, _sum, (5.0,))
        return data.map_reduce_stateful(_running_chunk, _sum, (5.0,), state)[0]

    ref = [starts_first(_data(X)), starts_second(_data(X))]
    data = _data(X)
    assert SharedPasses(data).run([starts_first, starts_second]) == ref
    assert data.passes == 4  # the third requests continue states of passes 1 and 2: two passes


def test_a_failing_job_stops_the_others_and_is_raised_with_its_name(X):
    started = threading.Event()

    def endless(data):
        started.set()
        while True:  # stops at its next request once the other job failed
            data.map_reduce(_sum_chunk, _sum, (1.0,))

    def failing(data):
        data.map_reduce(_sum_chunk, _sum, (1.0,))
        raise ValueError("k=3 cannot")

    before = threading.active_count()
    with pytest.raises(ValueError, match="k=3 cannot") as info:
        SharedPasses(_data(X), wait_s=5).run(
            [endless, failing], names=["n_clusters=2", "n_clusters=3"]
        )
    assert started.is_set()
    assert any("n_clusters=3" in note for note in info.value.__notes__)
    assert threading.active_count() == before  # no thread left waiting


def test_a_failing_pass_is_raised_and_stops_every_job(X):
    def bad_chunk(X, w, offset):
        raise RuntimeError("bad chunk")

    def job(data):
        return data.map_reduce(bad_chunk, _sum)

    before = threading.active_count()
    with pytest.raises(RuntimeError, match="bad chunk"):
        SharedPasses(_data(X), wait_s=5).run([job, job])
    assert threading.active_count() == before


def test_a_pass_waits_for_a_slow_job_only_until_its_deadline(X):
    def slow(data):
        time.sleep(0.6)
        return data.map_reduce(_sum_chunk, _sum, (1.0,))

    def quick(data):
        return data.map_reduce(_sum_chunk, _sum, (2.0,))

    data = _data(X)
    t0 = time.perf_counter()
    out = SharedPasses(data, wait_s=0.1).run([slow, quick])
    assert out == [pytest.approx(X.sum()), pytest.approx(2 * X.sum())]
    assert (
        data.passes == 2 and time.perf_counter() - t0 < 5
    )  # the quick job's pass did not wait for the slow one
    data = _data(X)
    SharedPasses(data, wait_s=5).run([slow, quick])
    assert data.passes == 1  # within the deadline: one pass for both


def test_state_handles_are_the_views_own(X):
    data = _data(X)

    def job(view):
        with pytest.raises(TypeError, match="state must be one this view returned"):
            view.map_reduce_stateful(_running_chunk, _sum, (1.0,), state=[None] * 4)
        value, state = view.map_reduce_stateful(_running_chunk, _sum, (1.0,))
        return isinstance(state, SharedState)

    assert SharedPasses(data).run([job]) == [True]
