"""The SPMD loop (dkmeans.engine.spmd): the allreduce, live progress, and what happens when the ranks cannot meet.

The cases that kill, restart or block the workers of a cluster of their own are in
``tests/system/test_spmd_faults.py``."""

from __future__ import annotations

import time
import warnings

import dask
import dask.array as da
import numpy as np
import pytest

from dkmeans.drivers.lloyd import CentroidShift
from dkmeans.engine.persisted import PersistedData
from dkmeans.engine.spmd import run_spmd
from dkmeans.errors import InvalidDataError
from dkmeans.testing import fit_lloyd, make_blobs, persist_rows, pick_rows


def _offsets_chunk(X, w, offset):
    return [int(offset)]


def _concat(parts):
    return [x for part in parts for x in part]


def test_allreduce_gives_every_rank_every_chunk_in_rank_order(client):
    X = np.arange(3000 * 2, dtype=np.float64).reshape(3000, 2)
    data = PersistedData(client, da.from_array(X, chunks=(250, 2)))
    groups = data.placement()
    assert len(groups) == 2, "one rank per worker thread"

    def program(chunks):
        warnings.warn(f"rank {chunks.rank}", UserWarning, stacklevel=2)
        seen = chunks.map_reduce(_offsets_chunk, _concat)
        # a second exchange: what each rank received, gathered on rank 0
        views = chunks.comm.allreduce([(chunks.rank, seen)], _concat)
        total = chunks.map_reduce(lambda X, w, offset: X.sum(axis=0), lambda parts: sum(parts))
        # 4 MB from each rank: large messages between workers arrive whole
        big = chunks.comm.allreduce(np.full(1_000_000, chunks.rank + 1, np.float32), np.stack)
        return views, total, big

    with pytest.warns(UserWarning, match="rank 0") as caught:
        (views, total, big), _ = run_spmd(data, program)
    assert not any("rank 1" in str(w.message) for w in caught)  # rank 0's warnings only
    expected = [data.offsets[i] for _, chunk_ids in groups for i in chunk_ids]
    assert [rank for rank, _ in views] == [0, 1]
    assert all(seen == expected for _, seen in views), (views, expected)
    np.testing.assert_allclose(total, X.sum(axis=0))
    assert big.shape == (2, 1_000_000) and big.dtype == np.float32
    np.testing.assert_array_equal(big, np.repeat([[1.0], [2.0]], 1_000_000, axis=1))


def test_progress_reaches_the_client_once_per_iteration_in_order(client, spmd):
    X, _, _ = make_blobs(4000, 3, 6, spread=3.0, box=5.0, seed=3)
    C0 = pick_rows(X, 6, seed=1)
    seen = []
    out = fit_lloyd(
        persist_rows(client, X, 6),
        C0,
        max_iter=12,
        stop_rule=CentroidShift(0.0),
        on_iteration=seen.append,
        on_state=lambda state: None,
        state_every=5,
    )
    assert spmd.count("lloyd_iterations") == 3  # blocks ending at 5, 10, 12 updates
    assert (
        [r.iteration for r in seen] == list(range(1, out.result.n_iter + 1)) == list(range(1, 13))
    )
    assert seen == out.result.history


def test_bad_data_error_is_raised_as_it_is(client, spmd):
    X = np.ones((2000, 3))
    X[1500, 1] = np.nan
    with pytest.raises(InvalidDataError, match="NaN or infinity"):
        fit_lloyd(
            persist_rows(client, X, 4),
            X[:3] + np.arange(3)[:, None],
            max_iter=5,
            stop_rule=CentroidShift(0.0),
        )
    assert "lloyd_iterations" in spmd


def test_spmd_is_the_default_for_loops_too_large_for_one_task(client, monkeypatch, on_cluster):
    """Without the suite's setting, the estimator runs a large loop SPMD and matches the graph loop."""
    import dkmeans.engine.spmd

    calls = []
    original = dkmeans.engine.spmd.run_spmd
    monkeypatch.setattr(
        dkmeans.engine.spmd, "run_spmd", lambda *a, **kw: calls.append(1) or original(*a, **kw)
    )
    X, _, _ = make_blobs(3000, 3, 4, seed=2)
    Xd = da.from_array(X, chunks=(500, 3))
    params = dict(n_clusters=4, init=pick_rows(X, 4, seed=0), tol=0)
    with dask.config.set({"dkmeans.spmd": False, "dkmeans.single-task-work": 0}):
        graph = dkmeans.KMeans(**params).fit(Xd)
    assert not calls
    with dask.config.set(
        {"dkmeans.single-task-work": 0}
    ):  # too large for one task; SPMD as by default
        default = dkmeans.KMeans(**params).fit(Xd)
    assert calls
    np.testing.assert_allclose(default.cluster_centers_, graph.cluster_centers_, rtol=1e-12)
    assert default.n_iter_ == graph.n_iter_


def test_two_fits_at_once_on_one_cluster_both_finish_with_their_own_result(client, spmd):
    """Two SPMD loops competing for the same worker threads: neither hangs, both are right."""
    from concurrent.futures import ThreadPoolExecutor

    problems = []
    for seed in (1, 2):
        X, _, _ = make_blobs(20_000, 4, 7, spread=2.5, box=5.0, seed=seed)
        problems.append((persist_rows(client, X, 6), pick_rows(X, 7, seed=seed)))
    options = dict(max_iter=40, stop_rule=CentroidShift(0.0))
    with dask.config.set({"dkmeans.spmd": False}):
        expected = [fit_lloyd(data, C0, **options).result for data, C0 in problems]
    started = time.monotonic()
    with dask.config.set({"dkmeans.spmd-wait": "2s"}), ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: fit_lloyd(p[0], p[1], **options).result, problems))
    assert time.monotonic() - started < 60
    for got, want in zip(results, expected):
        assert got.n_iter == want.n_iter
        np.testing.assert_allclose(got.centroids, want.centroids, rtol=1e-10)
