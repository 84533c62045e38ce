"""The pass graph: correct results, one task per worker, tree reduction."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from distributed import get_task_stream

from dkmeans.engine.persisted import PersistedData
from dkmeans.kernels import assign_partials, combine_partials


def partials_chunk(X, w, offset, C):
    return assign_partials(X, C, w)


@pytest.fixture
def X():
    return np.random.default_rng(0).normal(size=(4000, 3))


def test_map_reduce_equals_single_process(client, X):
    C = X[:9]
    w = np.random.default_rng(1).uniform(0.5, 2, size=len(X))
    data = PersistedData(client, da.from_array(X, chunks=(300, 3)), da.from_array(w, chunks=1000))
    got = data.map_reduce(partials_chunk, combine_partials, (C,))
    ref = assign_partials(X, C, w)
    np.testing.assert_allclose(got.sums, ref.sums, rtol=1e-12)
    np.testing.assert_allclose(got.counts, ref.counts, rtol=1e-12)
    np.testing.assert_allclose(got.objective, ref.objective, rtol=1e-12)
    assert data.offsets[:3] == (0, 300, 600) and data.n_rows == 4000


def test_chunks_are_spread_over_workers(client, X):
    data = PersistedData(client, da.from_array(X, chunks=(250, 3)))
    placement = data.placement()
    assert sorted(i for _, ids in placement for i in ids) == list(range(16))
    assert len({addr for addr, _ in placement}) == len(placement) == 2  # 2 workers x 1 thread


def count_pass_tasks(client, data, C):
    """The tasks that ran for one pass: those of the graphs dkmeans submits, and any on the data's chunks.

    Other activity on the shared test cluster (results of earlier tests still computing) is
    left out, and so are the data's own chunks: they were in memory before the pass began
    (the constructor waits for them), but the task stream selects tasks by their stop time
    as the workers' clocks put it, so a chunk placed just before the pass can fall inside
    its window. The keys seen are in the assertion message.
    """
    placed = {str(k) for k in data._x_keys}
    with get_task_stream(client) as ts:
        data.map_reduce(partials_chunk, combine_partials, (C,))
    keys = [str(t["key"]) for t in ts.data if str(t["key"]) not in placed]
    ours = [k for k in keys if "dkmeans-" in k or data.X.name in k]
    return len(ours), sorted({k.split(",")[0][:60] for k in keys})


@pytest.mark.parametrize("n_chunks", [4, 40])
def test_tasks_per_pass_do_not_grow_with_chunks(client, X, n_chunks):
    """Every task that ran during one pass is counted: one per worker, none per chunk."""
    data = PersistedData(client, da.from_array(X, chunks=(len(X) // n_chunks, 3)))
    assert data.n_chunks >= n_chunks
    n_workers = len(data.placement())
    count, seen = count_pass_tasks(client, data, X[:5])
    assert count == n_workers == 2, seen


def test_tree_reduction_with_many_workers(client, X):
    """With more 'workers' than the fan-in, combine tasks form a tree (O(workers) tasks)."""
    data = PersistedData(client, da.from_array(X, chunks=(400, 3)))
    # Pretend the 10 chunks live on 10 workers (unknown addresses: placement is a hint,
    # allow_other_workers lets the scheduler run them anywhere).
    data._placement = [(f"tcp://127.0.0.1:{1000 + i}", [i]) for i in range(10)]
    graph, keys, _ = data.build_pass_graph(partials_chunk, combine_partials, (X[:4],), fan_in=2)
    layer_names = list(graph.layers)
    assert sum(n.startswith("dkmeans-pass") for n in layer_names) == 10
    # 10 -> 5 -> 3 -> 2 combine tasks, the last two combined on the client
    assert sum(n.startswith("dkmeans-combine") for n in layer_names) == 5 + 3 + 2
    assert len(keys) == 2
    got = data.map_reduce(partials_chunk, combine_partials, (X[:4],), fan_in=2)
    np.testing.assert_allclose(got.sums, assign_partials(X, X[:4]).sums, rtol=1e-12)
    # the tasks ran away from their (fictional) workers: placement is looked up again
    assert data._placement is None
    assert {addr for addr, _ in data.placement()} <= set(
        client.scheduler_info(n_workers=-1)["workers"]
    )


def test_one_task_per_worker_thread():
    """A worker with 3 threads gets 3 tasks, each over a contiguous run of its chunks, all used."""
    from distributed import Client, LocalCluster

    X = np.random.default_rng(2).normal(size=(3000, 4))
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=3, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        data = PersistedData(client, da.from_array(X, chunks=(300, 4)))
        groups = data.placement()
        assert [ids for _, ids in groups] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
        assert count_pass_tasks(client, data, X[:5])[0] == 3
        got = data.map_reduce(partials_chunk, combine_partials, (X[:5],))
        np.testing.assert_allclose(got.sums, assign_partials(X, X[:5]).sums, rtol=1e-12)
        # fewer chunks than threads: one task per chunk
        small = PersistedData(client, da.from_array(X, chunks=(1500, 4)))
        assert [ids for _, ids in small.placement()] == [[0], [1]]


def test_placement_is_stable_when_tasks_run_where_planned(client, X):
    data = PersistedData(client, da.from_array(X, chunks=(400, 3)))
    before = data.placement()
    data.map_reduce(partials_chunk, combine_partials, (X[:4],))
    assert data._placement is before


def test_a_chunk_copied_to_another_worker_is_still_read_where_it_was(client, X):
    """A copy made between two fits (here by ``replicate``) moves no chunk to another group, so the
    group sums combine in the same order: the same bits for the same fit on the same data."""
    from distributed import futures_of

    Xd = client.persist(da.from_array(X, chunks=(500, 3)))
    client.wait_for_workers(2)
    first = PersistedData(client, Xd)
    before = first.placement()
    sums = first.map_reduce(partials_chunk, combine_partials, (X[:7],))
    # copy the chunks of the worker that does not have the lowest address onto the other
    higher = max(addr for addr, _ in before)
    moved = [f for f in futures_of(Xd) if higher in client.who_has([f]).get(f.key, ())]
    assert moved, before
    client.replicate(moved, n=2)
    assert all(len(h) == 2 for h in client.who_has(moved).values())
    again = PersistedData(client, Xd)
    assert again.placement() == before
    got = again.map_reduce(partials_chunk, combine_partials, (X[:7],))
    np.testing.assert_array_equal(got.sums, sums.sums)
    assert got.objective == sums.objective


def test_chunk_holders_keeps_a_home_while_it_holds_the_chunk():
    from dkmeans.engine.balance import chunk_holders

    keys = [("holders-test", i) for i in range(3)]
    who_has = {keys[0]: {"b"}, keys[1]: {"a", "b"}}
    assert chunk_holders(who_has, keys, ["x", "y", "z"]) == ["b", "a", "z"]
    # copies appear: the first holders stay; a lost one is replaced by the lowest holder left
    assert chunk_holders(
        {keys[0]: {"a", "b"}, keys[1]: {"b"}, keys[2]: {"c", "z"}}, keys, ["x"]
    ) == ["b", "b", "z"]


def test_unknown_chunk_sizes_are_resolved(client, X):
    arr = da.from_array(X, chunks=(500, 3))
    arr = arr[arr[:, 0] > -10]  # boolean mask: unknown chunk sizes
    assert np.isnan(arr.shape[0])
    data = PersistedData(client, arr)
    assert data.n_rows == len(X) and sum(data.chunk_rows) == len(X)


def count_and_sum(X, w, offset, state, add):
    """Stateful chunk function: the state counts passes and accumulates ``add``."""
    passes, total = state if state is not None else (0, np.zeros(len(X)))
    total = total + add * X[:, 0]
    return (passes + 1, total), np.array([passes + 1, total.sum()])


def sum_arrays(parts):
    return np.sum(parts, axis=0) if parts[0].ndim else sum(parts)


def test_stateful_pass_keeps_state_on_workers(client, X):
    data = PersistedData(client, da.from_array(X, chunks=(500, 3)))
    n_chunks = data.n_chunks
    result, state = data.map_reduce_stateful(count_and_sum, sum_arrays, (1.0,))
    np.testing.assert_allclose(result, [n_chunks, X[:, 0].sum()])
    for _expected_passes, add in ((2, 2.0), (3, -0.5)):
        result, state = data.map_reduce_stateful(count_and_sum, sum_arrays, (add,), state)
    # each chunk saw three passes; its running total is (1 + 2 - 0.5) * x
    np.testing.assert_allclose(result, [3 * n_chunks, 2.5 * X[:, 0].sum()])
    # the state moves with its chunks if placement changes
    data._placement = [(data.placement()[0][0], list(range(n_chunks)))]
    result, state = data.map_reduce_stateful(count_and_sum, sum_arrays, (0.0,), state)
    np.testing.assert_allclose(result, [4 * n_chunks, 2.5 * X[:, 0].sum()])


def test_single_task_decision_follows_work_and_size(client, monkeypatch):
    import dask

    from dkmeans.engine import persisted as _graph

    data = PersistedData(client, da.from_array(np.zeros((1000, 4)), chunks=(250, 4)))
    assert data.nbytes == 1000 * 4 * 8
    with dask.config.set({"dkmeans.single-task-work": 1000 * 4 * 10}):
        assert data.fits_one_task(4 * 10) and not data.fits_one_task(4 * 11)
        monkeypatch.setattr(_graph, "SINGLE_TASK_MAX_BYTES", data.nbytes - 1)
        assert not data.fits_one_task(4)
    with dask.config.set({"dkmeans.single-task-work": 0}):
        assert not data.fits_one_task(1)


def test_run_in_one_task_sees_every_row_once_and_reraises_warnings(client, X):
    import warnings

    w = np.arange(len(X), dtype=float)
    data = PersistedData(client, da.from_array(X, chunks=(700, 3)), da.from_array(w, chunks=1000))

    def summarise(chunks, scale):
        warnings.warn("from the task", UserWarning, stacklevel=2)
        assert len(chunks.blocks) == 1 and chunks.offsets == (0,)
        return chunks.map_reduce(
            lambda X, w, offset, s: np.array([s * (w @ X[:, 0]), offset]), sum_arrays, (scale,)
        )

    with pytest.warns(UserWarning, match="from the task"):
        got, passes = data._run_in_one_task(summarise, (2.0,))
    np.testing.assert_allclose(got, [2.0 * (w @ X[:, 0]), 0.0])
    assert passes == 1


def _sums_chunk(X, w, offset):
    return np.array([X.sum(), (w * X[:, 0]).sum(), len(X)])


def _add_arrays(parts):
    return np.sum(parts, axis=0)


def test_one_chunk_input_is_spread_over_every_worker_thread(client):
    """A one-chunk input (a one-partition Parquet file) would keep every pass on one worker."""
    from dkmeans.engine.balance import SPREAD_MIN_ROWS

    rng = np.random.default_rng(4)
    n = 3 * SPREAD_MIN_ROWS + 17
    X = rng.standard_normal((n, 3))
    w = rng.uniform(0.5, 2.0, n)
    data = PersistedData(client, da.from_array(X, chunks=(n, 3)), da.from_array(w, chunks=n))
    assert data.n_chunks == 2 and sum(data.chunk_rows) == n
    assert len({addr for addr, _ in data.placement()}) == 2, "both workers hold rows"
    total, weighted, rows = data.map_reduce(_sums_chunk, _add_arrays)
    assert rows == n and data.offsets == (0, data.chunk_rows[0])
    np.testing.assert_allclose([total, weighted], [X.sum(), (w * X[:, 0]).sum()], rtol=1e-12)
    np.testing.assert_array_equal(
        data.rows([0, n - 1, data.chunk_rows[0]]), X[[0, n - 1, data.chunk_rows[0]]]
    )


def test_input_with_a_chunk_per_thread_or_few_rows_is_kept_as_it_is(client):
    from dkmeans.engine.balance import SPREAD_MIN_ROWS

    X = np.arange(2 * SPREAD_MIN_ROWS * 2, dtype=float).reshape(-1, 2)
    many = PersistedData(client, da.from_array(X, chunks=(len(X) // 2, 2)))
    assert many.chunk_rows == (len(X) // 2, len(X) // 2)
    assert "dkmeans-rows" not in many.X.name
    few = PersistedData(client, da.from_array(X[: 2 * SPREAD_MIN_ROWS - 1], chunks=(10**9, 2)))
    assert few.n_chunks == 1


# -- rows per worker evened out by moving whole chunks -------------------------------------
def test_chunk_moves_even_out_rows_per_thread():
    from dkmeans.engine.balance import plan_chunk_moves

    two = {"a": 1, "b": 1}
    assert plan_chunk_moves([10] * 16, ["a", "b"] * 8, two) == {}
    moves = plan_chunk_moves([10] * 16, ["a"] * 11 + ["b"] * 5, two)
    assert len(moves) == 3 and set(moves.values()) == {"b"} and all(c < 11 for c in moves)
    # shares follow threads: "a" has 2 of 3 threads, so 2/3 of the rows
    moves = plan_chunk_moves([10] * 12, ["b"] * 12, {"a": 2, "b": 1})
    assert len(moves) == 8 and set(moves.values()) == {"a"}
    # uneven chunks: the one move that evens out 100+40 / 20 is the 40-row chunk
    assert plan_chunk_moves([100, 40, 20], ["a", "a", "b"], two) == {1: "b"}
    # no move helps a single chunk larger than the share; a lone worker has nothing to even out
    assert plan_chunk_moves([100, 5], ["a", "b"], two) == {}
    assert plan_chunk_moves([10, 10], ["a", "a"], {"a": 1}) == {}
    # chunks on a worker that left count as on no worker (Dask recomputes them anywhere)
    assert plan_chunk_moves([10, 10, 10], ["gone", "a", "b"], two) == {}
    # within the tolerance nothing moves
    assert plan_chunk_moves([51, 49], ["a", "b"], two) == {}


def _worker_data_is_shared(keys, dask_worker=None):
    return all(
        dask_worker.data[new] is dask_worker.data[old]
        for new, old in keys
        if new in dask_worker.data
    )


def test_input_held_by_one_worker_is_balanced_without_copying_what_stays(client):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((16_000, 3))
    w = rng.uniform(0.5, 2.0, len(X))
    first = sorted(client.nthreads())[0]
    Xd = client.persist(da.from_array(X, chunks=(1000, 3)), workers=[first])
    wd = client.persist(da.from_array(w, chunks=1000), workers=[first])
    old_keys = [k[0] for k in Xd.__dask_keys__()]
    data = PersistedData(client, Xd, wd)
    who_has = client.who_has(data._futures)
    rows = {}
    for i, key in enumerate(data._x_keys):
        (holder,) = who_has[key]
        rows[holder] = rows.get(holder, 0) + data.chunk_rows[i]
        (w_holder,) = who_has[data._w_keys[i]]
        assert w_holder == holder, "weights move with their rows"
    assert sorted(rows.values()) == [8000, 8000]
    assert len({addr for addr, _ in data.placement()}) == 2
    total, weighted, n = data.map_reduce(_sums_chunk, _add_arrays)
    assert n == len(X)
    np.testing.assert_allclose([total, weighted], [X.sum(), (w * X[:, 0]).sum()], rtol=1e-12)
    np.testing.assert_array_equal(data.rows([0, 7999, 8000, 15999]), X[[0, 7999, 8000, 15999]])
    stayed = [(new, old) for new, old in zip(data._x_keys, old_keys) if first in who_has[new]]
    assert stayed and all(client.run(_worker_data_is_shared, stayed, workers=[first]).values())


def test_large_argument_is_in_the_graph_once(client, X):
    """Centroids over SHARED_ARG_BYTES (large k) become one data key that every task references,
    not a copy per task: the pickled graph holds them once, and the pass result is unchanged."""
    import pickle

    from dkmeans.engine.passes import SHARED_ARG_BYTES

    data = PersistedData(client, da.from_array(X, chunks=(400, 3)))
    data._placement = [(f"tcp://127.0.0.1:{1000 + i}", [i]) for i in range(10)]  # 10 tasks
    C = np.random.default_rng(2).normal(
        size=(SHARED_ARG_BYTES // 24 + 1000, 3)
    )  # > SHARED_ARG_BYTES
    graph, _, _ = data.build_pass_graph(partials_chunk, combine_partials, (C,), fan_in=4)
    assert sum(n.startswith("dkmeans-arg-") for n in graph.layers) == 1
    size = len(pickle.dumps(dict(graph)))
    assert C.nbytes < size < 2 * C.nbytes
    got = data.map_reduce(partials_chunk, combine_partials, (C,))
    ref = assign_partials(X, C)
    np.testing.assert_allclose(got.sums, ref.sums, rtol=1e-12)
    np.testing.assert_array_equal(got.counts, ref.counts)
