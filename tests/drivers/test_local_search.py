"""k-means++ local search: the swap kernels against float64 brute force, and the driver's properties."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dkmeans import metrics
from dkmeans.drivers.lloyd import CentroidShift, lloyd
from dkmeans.drivers.local_search import local_search
from dkmeans.drivers.swaps import best_swaps, select_swaps
from dkmeans.engine.local import ChunkList
from dkmeans.errors import InvalidParameterError
from dkmeans.kernels.namespace import to_host
from dkmeans.kernels.swap import (
    combine_candidate_samples,
    nearest_two,
    sample_by_cost,
    swap_costs,
    swap_partials,
)
from dkmeans.testing import make_blobs


class Chunks(ChunkList):
    """The data protocol over row chunks in this process (passes counted by :class:`ChunkList`).

    Chunk results are combined in pairs (a "worker"), then across pairs, so a combine
    that is not associative shows up as a dependence on the chunking.
    """

    def __init__(self, X, weights=None, n_chunks: int = 1):
        base = ChunkList.from_array(X, weights, n_chunks)
        super().__init__(base.blocks, base.weights, base.offsets, X.dtype, X.shape[1])

    def _local(self, chunk_fn, combine_fn, args):
        self.passes += 1
        results = [
            chunk_fn(X, w, o, *args) for X, w, o in zip(self.blocks, self.weights, self.offsets)
        ]
        return combine_fn([combine_fn(results[i : i + 2]) for i in range(0, len(results), 2)])


def sq(X, C):
    X = np.asarray(X, np.float64)
    C = np.asarray(C, np.float64)
    return ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)


def objective(X, C, w=None):
    d = sq(X, C).min(1)
    return float(d.sum() if w is None else d @ w)


@pytest.fixture
def rows():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(700, 3)) * 4 + 1000.0  # far from the origin: the translation must hold up
    C = X[rng.choice(700, 9, replace=False)] + rng.normal(size=(9, 3))
    P = X[rng.choice(700, 6, replace=False)]
    w = rng.uniform(0, 2, size=700)
    w[:20] = 0
    return X, C, P, w


@pytest.fixture
def stuck():
    """Eight blobs and centroids where Lloyd left some blobs doubled and others shared."""
    X, y, _ = make_blobs(1600, 2, 8, spread=0.6, box=12.0, seed=11)
    rng = np.random.default_rng(0)
    C0 = X[rng.choice(len(X), 8, replace=False)]
    C = lloyd(Chunks(X), C0, max_iter=100, stop_rule=CentroidShift(0.0)).centroids
    assert metrics.centroid_index(C, metrics.class_means(X, y)) > 0, (
        "the fixture should start in a poor optimum"
    )
    w = rng.uniform(0.5, 2.0, size=len(X))
    w[::50] = 0
    return X, y, C, w


@pytest.fixture(params=["eager", "off"])
def compiled(request):
    """The kernels' compiled loops (eager) and their NumPy code (off) must agree."""
    with dask.config.set({"dkmeans.compile": request.param}):
        yield request.param


SEARCH = dict(
    rounds=4, candidates_per_round=16, seed=7, lloyd_iters=3, stop_rule=CentroidShift(0.0)
)


# -- kernels ---------------------------------------------------------------------------
def _brute_swap_costs(X, C, P, w):
    """``ref[p, j]``: the objective with centroid ``j`` replaced by candidate ``p``, recomputed from scratch."""
    ref = np.empty((len(P), len(C)))
    for p in range(len(P)):
        for j in range(len(C)):
            swapped = C.astype(np.float64)
            swapped[j] = P[p]
            ref[p, j] = objective(X, swapped, w)
    return ref


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("scratch", [600, 4 * 2**20])
def test_swap_costs_match_brute_force(xp, rows, dtype, weighted, scratch, compiled):
    """cost[p, j] is the objective with centroid j replaced by candidate p, recomputed from scratch."""
    X, C, P, w = rows
    X, C, P = X.astype(dtype), C.astype(dtype), P.astype(dtype)
    w = w if weighted else None
    out = to_host(
        swap_costs(
            xp.asarray(X),
            xp.asarray(C),
            xp.asarray(P),
            None if w is None else xp.asarray(w),
            scratch_bytes=scratch,
        )
    )
    ref = _brute_swap_costs(X, C, P, w)
    assert out.cost.dtype == np.float64 and out.cost.shape == (len(P), len(C))
    np.testing.assert_allclose(out.cost, ref, rtol=1e-9)
    np.testing.assert_allclose(float(out.objective), objective(X, C, w), rtol=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("scratch", [3000, 4 * 2**20])
def test_swap_costs_of_many_candidates_match_brute_force(xp, rows, dtype, weighted, scratch):
    """More candidates than SWAP_LOOP_MAX_CANDIDATES: blocks of rows in cluster order by matrix products,
    float32 distances for float32 rows (the costs propose swaps; the search measures the ones it makes)."""
    from dkmeans.kernels.swap import SWAP_LOOP_MAX_CANDIDATES

    X, C, _, w = rows
    P = X[np.random.default_rng(2).choice(len(X), SWAP_LOOP_MAX_CANDIDATES + 9, replace=False)]
    X, C, P = X.astype(dtype), C.astype(dtype), P.astype(dtype)
    w = w if weighted else None
    out = to_host(
        swap_costs(
            xp.asarray(X),
            xp.asarray(C),
            xp.asarray(P),
            None if w is None else xp.asarray(w),
            scratch_bytes=scratch,
        )
    )
    ref = _brute_swap_costs(X, C, P, w)
    base = objective(X, C, w)
    assert out.cost.dtype == np.float64 and out.cost.shape == (len(P), len(C))
    # float32: each distance to a candidate within a few float32 ulps of the rows' spread
    tol = 1e-9 if dtype == np.float64 or xp is not np else 1e-5
    np.testing.assert_allclose(out.cost, ref, rtol=0, atol=tol * base)
    np.testing.assert_allclose(float(out.objective), base, rtol=1e-9)
    assert np.argmin(out.cost) == np.argmin(ref)


@pytest.mark.parametrize("k", [1, 2, 9])
def test_nearest_two_matches_brute_force(xp, rows, k, compiled):
    X, C, _, _ = rows
    C = C[:k]
    out = to_host(nearest_two(xp.asarray(X), xp.asarray(C), scratch_bytes=500))
    D = sq(X, C)
    order = np.argsort(D, axis=1, kind="stable")
    np.testing.assert_array_equal(out.labels, order[:, 0])
    np.testing.assert_allclose(out.d1, D[np.arange(len(X)), order[:, 0]], rtol=1e-9)
    if k == 1:
        assert np.all(np.isinf(out.d2)) and np.all(out.second == out.labels)
    else:
        np.testing.assert_array_equal(out.second, order[:, 1])
        np.testing.assert_allclose(out.d2, D[np.arange(len(X)), order[:, 1]], rtol=1e-9)


@pytest.mark.parametrize("weighted", [False, True])
def test_swap_partials_are_lloyd_partials_of_the_swapped_centroids(xp, rows, weighted, compiled):
    """Each trial's sums, counts and objective equal a float64 assignment to its swapped centroids,
    including a trial that removes a centroid and its neighbour (rows losing both nearest)."""
    X, C, P, w = rows
    D = sq(C, C)
    np.fill_diagonal(D, np.inf)
    j, near = 0, int(D[0].argmin())
    trials = [([], []), ([0], [3]), ([1, 2], [j, near]), ([0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5])]
    trials = [(np.asarray(p, dtype=np.int64), np.asarray(c, dtype=np.int64)) for p, c in trials]
    w = w if weighted else np.ones(len(X))
    out = to_host(
        swap_partials(
            xp.asarray(X),
            xp.asarray(C),
            xp.asarray(P),
            trials,
            xp.asarray(w) if weighted else None,
            scratch_bytes=800,
        )
    )
    for t, (p, c) in enumerate(trials):
        swapped = C.copy()
        swapped[c] = P[p]
        labels = sq(X, swapped).argmin(1)
        counts = np.bincount(labels, weights=w, minlength=len(C))
        sums = np.stack([(X[labels == i] * w[labels == i, None]).sum(0) for i in range(len(C))])
        np.testing.assert_allclose(out.counts[t], counts, rtol=1e-12)
        np.testing.assert_allclose(out.sums[t], sums, rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(out.objective[t], objective(X, swapped, w), rtol=1e-9)


def test_sample_by_cost_draws_proportionally_to_weighted_cost():
    """One draw picks row i with probability w_i d1_i / sum(w d1); rows on a centroid never."""
    X = np.array([[1.0, 0.0], [np.sqrt(2.0), 0.0], [np.sqrt(7.0), 0.0], [0.0, 0.0], [0.0, 0.0]])
    C = np.zeros((1, 2))
    for w, expected in [
        (None, [0.1, 0.2, 0.7]),
        (np.array([7.0, 1.0, 1.0, 3.0, 0.0]), [7 / 16, 2 / 16, 7 / 16]),
    ]:
        draws = np.array(
            [int(sample_by_cost(X, C, 1, 0, seed, 3, w).top.index[0]) for seed in range(2000)]
        )
        assert set(draws) <= {0, 1, 2}
        np.testing.assert_allclose(
            np.bincount(draws, minlength=3) / len(draws), expected, atol=0.035
        )


@pytest.mark.parametrize("weighted", [False, True])
def test_sample_by_cost_does_not_depend_on_chunking(rows, weighted):
    X, C, _, w = rows
    w = w if weighted else None
    samples = []
    for n_chunks in (1, 3, 7):
        data = Chunks(X, w, n_chunks)
        samples.append(
            data.map_reduce(
                lambda X, w, o: sample_by_cost(X, C, 25, o, 11, 2, w),
                lambda parts: combine_candidate_samples(parts, 25),
            )
        )
    for s in samples[1:]:
        np.testing.assert_array_equal(s.top.index, samples[0].top.index)
        np.testing.assert_array_equal(s.top.rows, X[s.top.index])
        np.testing.assert_allclose(s.objective, samples[0].objective, rtol=1e-12)
    if weighted:
        assert not np.any(w[samples[0].top.index] == 0)


def test_select_swaps_in_batches_chooses_as_from_the_whole_order(monkeypatch):
    """select_swaps orders the improving swaps a prefix at a time: the same choice as from all of them."""
    import dkmeans.drivers.swaps as swaps

    rng = np.random.default_rng(3)
    C = rng.normal(size=(40, 2)) * 10
    P = rng.normal(size=(60, 2)) * 10
    delta = rng.normal(size=(60, 40))
    delta[rng.random(delta.shape) < 0.3] = -1.0  # ties, broken by index
    index = rng.permutation(1000)[:60]
    monkeypatch.setattr(swaps, "SELECT_FIRST_BATCH", 10**6)
    whole = select_swaps(delta, index, P, C, 12, 0.0, 1e-9)
    monkeypatch.setattr(swaps, "SELECT_FIRST_BATCH", 1)
    batched = select_swaps(delta, index, P, C, 12, 0.0, 1e-9)
    assert len(whole[0]) > 1
    np.testing.assert_array_equal(batched[0], whole[0])
    np.testing.assert_array_equal(batched[1], whole[1])


def test_best_swaps_order_and_ties():
    delta = np.array([[3.0, -1.0, 0.5], [-1.0, 2.0, -1.0], [0.0, -2.0, 4.0]])
    index = np.array([30, 10, 20])  # candidate 1 has the lowest row index
    pos, js = best_swaps(delta, index, 4)
    # -2 first; then the -1 ties: candidate row 10 (both centroids, lower first), then row 30
    assert list(zip(pos, js)) == [(2, 1), (1, 0), (1, 2), (0, 1)]
    assert len(best_swaps(delta, index, 100)[0]) == 9


def test_select_swaps_takes_swaps_that_do_not_interact():
    # centroids 0 and 1 share one blob (each other's nearest); 2 and 3 are far apart
    C = np.array([[0.0, 0.0], [1.0, 0.0], [50.0, 0.0], [0.0, 50.0]])
    # candidates 0 and 1 sit together in one empty region, candidate 2 in another
    P = np.array([[30.0, 30.0], [30.5, 30.0], [-40.0, -40.0]])
    delta = np.array(
        [[-10.0, -9.0, -1.0, -1.0], [-8.0, -7.0, -1.0, -1.0], [-6.0, -5.0, -1.0, -1.0]]
    )
    pos, js = select_swaps(delta, np.arange(3), P, C, 8, -0.5)
    assert (pos[0], js[0]) == (0, 0)  # the best swap first
    assert 1 not in pos  # too close to candidate 0
    assert 1 not in js  # centroid 0's nearest: removing both would strand their rows
    assert len(set(pos)) == len(pos) and len(set(js)) == len(js)
    assert np.all(delta[pos, js] < -0.5)
    assert list(zip(*select_swaps(delta, np.arange(3), P, C, 1, -0.5))) == [(0, 0)]
    assert len(select_swaps(delta, np.arange(3), P, C, 8, -100.0)[0]) == 0


# -- the driver ------------------------------------------------------------------------
def test_one_swap_fixes_two_centroids_in_one_blob():
    """Lloyd is stuck with two centroids in one blob and one between two others; a swap fixes it."""
    rng = np.random.default_rng(0)
    centres = np.array([[-10.0, 0.0], [10.0, 0.0], [10.0, 6.0]])
    X = np.concatenate([c + 0.5 * rng.normal(size=(200, 2)) for c in centres])
    truth = np.repeat([0, 1, 2], 200)
    data = Chunks(X, n_chunks=3)
    stuck = lloyd(
        data,
        np.array([[-10.5, 0.0], [-9.5, 0.0], [10.0, 3.0]]),
        max_iter=100,
        stop_rule=CentroidShift(0.0),
    )
    assert stuck.stop_reason in ("centroid-shift", "fixed-point")
    assert np.sum(stuck.centroids[:, 0] < 0) == 2  # Lloyd cannot cross the empty space
    data.passes = 0
    result = local_search(
        data,
        stuck.centroids,
        rounds=3,
        candidates_per_round=6,
        seed=1,
        lloyd_iters=20,
        stop_rule=CentroidShift(0.0),
    )
    best = objective(X, metrics.class_means(X, truth))
    np.testing.assert_allclose(result.objective, best, rtol=1e-10)
    np.testing.assert_array_equal(np.sort(sq(result.centroids, centres).argmin(1)), [0, 1, 2])
    assert result.swaps_accepted == 1 and result.history[0].kept
    assert result.passes == data.passes


def test_several_swaps_fix_independent_errors_in_one_round():
    """Two far-apart copies of the stuck case: one trial makes both swaps, measured exactly."""
    rng = np.random.default_rng(0)
    base = np.array([[-10.0, 0.0], [10.0, 0.0], [10.0, 6.0]])
    centres = np.concatenate([base, base + 100.0])
    X = np.concatenate([c + 0.5 * rng.normal(size=(150, 2)) for c in centres])
    start = np.array([[-10.5, 0.0], [-9.5, 0.0], [10.0, 3.0]])
    C = lloyd(
        Chunks(X),
        np.concatenate([start, start + 100.0]),
        max_iter=100,
        stop_rule=CentroidShift(0.0),
    ).centroids
    best = objective(X, metrics.class_means(X, np.repeat(np.arange(6), 150)))
    # a seed whose first round draws candidates in both stuck groups (the draws follow local search's stream)
    options = dict(
        rounds=4, candidates_per_round=12, seed=3, lloyd_iters=3, stop_rule=CentroidShift(0.0)
    )
    together = local_search(Chunks(X, n_chunks=3), C, max_swaps=8, **options)
    one_by_one = local_search(Chunks(X, n_chunks=3), C, max_swaps=1, **options)
    assert together.history[0].swaps_accepted == 2
    assert [h.swaps_accepted for h in one_by_one.history][:2] == [1, 1]
    for result in (together, one_by_one):
        np.testing.assert_allclose(result.objective, best, rtol=1e-10)
    assert together.passes < one_by_one.passes


def test_swap_that_leaves_a_cluster_empty_gets_lloyds_rule():
    """Three coinciding centroids: the best swap replaces one, the trial leaves another empty,
    and Lloyd's empty-cluster rule (one more pass) gives it a row."""
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    X = np.concatenate([c + 0.5 * rng.normal(size=(100, 2)) for c in centres])
    C = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [10.0, 0.0]])
    data = Chunks(X, n_chunks=2)
    result = local_search(
        data,
        C,
        rounds=3,
        candidates_per_round=6,
        seed=0,
        lloyd_iters=2,
        stop_rule=CentroidShift(0.0),
    )
    first = result.history[0]
    assert first.kept and first.passes == 2 + first.lloyd_iterations + 1  # the refill's pass
    assert len(np.unique(result.centroids, axis=0)) == 4
    assert result.objective < objective(X, C) and result.passes == data.passes
    np.testing.assert_allclose(result.objective, objective(X, result.centroids), rtol=1e-10)


@pytest.mark.parametrize("lloyd_iters", [0, 2])
def test_objective_never_increases(lloyd_iters):
    X, _, _ = make_blobs(1200, 3, 10, spread=2.5, box=8.0, seed=4)
    C0 = X[:10]  # a poor start: rounds keep finding improvements
    data = Chunks(X, n_chunks=2)
    start = objective(X, C0)
    result = local_search(
        data,
        C0,
        rounds=6,
        candidates_per_round=20,
        seed=3,
        lloyd_iters=lloyd_iters,
        stop_rule=CentroidShift(0.0),
        min_gain=0.0,
        patience=None,
    )
    assert result.swaps_accepted > 0
    objectives = [start] + [r.objective for r in result.history]
    assert all(b <= a for a, b in zip(objectives, objectives[1:]))
    assert all(r.objective <= r.objective_before for r in result.history)
    np.testing.assert_allclose(result.objective, objective(X, result.centroids), rtol=1e-10)
    assert result.passes == data.passes == 1 + sum(r.passes for r in result.history)
    if (
        lloyd_iters == 0
    ):  # the plain swap search: each kept round lowers it by exactly the best swap's change
        for r in result.history:
            if r.kept:
                assert r.swaps_accepted == 1 and r.lloyd_iterations == 0
                np.testing.assert_allclose(
                    r.objective, r.objective_before + r.best_swap_change, rtol=1e-10
                )


@pytest.mark.parametrize("weighted", [False, True])
def test_same_result_for_any_chunking(stuck, weighted):
    X, _, C, w = stuck
    w = w if weighted else None
    results = [local_search(Chunks(X, w, n), C, **SEARCH) for n in (1, 3, 7)]
    assert results[0].swaps_accepted > 0
    for r in results[1:]:
        np.testing.assert_allclose(r.centroids, results[0].centroids, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(r.objective, results[0].objective, rtol=1e-10)
        assert [h.swaps_accepted for h in r.history] == [
            h.swaps_accepted for h in results[0].history
        ]
        assert r.passes == results[0].passes


def test_unit_weights_equal_no_weights(stuck):
    X, _, C, _ = stuck
    plain = local_search(Chunks(X, None, 3), C, **SEARCH)
    unit = local_search(Chunks(X, np.ones(len(X)), 3), C, **SEARCH)
    np.testing.assert_allclose(unit.centroids, plain.centroids, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(unit.objective, plain.objective, rtol=1e-10)
    assert [h.swaps_accepted for h in unit.history] == [h.swaps_accepted for h in plain.history]


def test_records_and_stop_reasons(stuck):
    X, y, C, _ = stuck
    seen = []
    data = Chunks(X, n_chunks=2)
    result = local_search(data, C, **{**SEARCH, "rounds": 10}, on_iteration=seen.append)
    assert seen == result.history and result.rounds == len(seen)
    assert result.stop_reason == "no-improvement" and not seen[-1].kept  # patience=1 by default
    assert result.swaps_tried == sum(r.swaps_tried for r in seen) == len(seen) * 16 * len(C)
    assert result.swaps_accepted == sum(r.swaps_accepted for r in seen)
    assert metrics.centroid_index(result.centroids, metrics.class_means(X, y)) == 0
    assert {"round", "objective", "swaps_tried", "swaps_accepted", "passes", "kept"} <= set(
        seen[0].as_dict()
    )
    measured = local_search(Chunks(X), C, **{**SEARCH, "rounds": 0})
    assert measured.passes == 1 and measured.rounds == 0 and measured.stop_reason == "rounds"
    np.testing.assert_array_equal(measured.centroids, C)
    on_centroids = local_search(Chunks(X[:5]), X[:5], **SEARCH)
    assert on_centroids.stop_reason == "no-candidates" and on_centroids.objective == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        {"rounds": -1},
        {"candidates_per_round": 0},
        {"lloyd_iters": 1.5},
        {"trials": 0},
        {"max_swaps": 0},
        {"patience": 0},
        {"min_gain": -1.0},
    ],
)
def test_rejects_bad_parameters(stuck, bad):
    X, _, C, _ = stuck
    with pytest.raises(InvalidParameterError):
        local_search(Chunks(X), C, **{**SEARCH, **bad})


def test_rejects_centroids_of_the_wrong_shape(stuck):
    X, _, C, _ = stuck
    with pytest.raises(InvalidParameterError, match="centroids"):
        local_search(Chunks(X), C[:, :1], **SEARCH)


def test_persisted_data_matches_in_process(client, stuck):
    """The driver on a Dask cluster (one graph per pass) gives the in-process result."""
    from dkmeans.testing import persist_rows

    X, _, C, w = stuck
    persisted = persist_rows(client, X, n_chunks=4, weights=w)
    try:
        distributed = local_search(persisted, C, **{**SEARCH, "rounds": 2})
    finally:
        persisted.release()
    local = local_search(Chunks(X, w, 5), C, **{**SEARCH, "rounds": 2})
    assert local.swaps_accepted > 0
    np.testing.assert_allclose(distributed.centroids, local.centroids, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(distributed.objective, local.objective, rtol=1e-10)
    assert distributed.passes == local.passes


# -- the default: a coreset search confirmed on the data ---------------------------------------
def _grid(n=6000, seed=3):
    centers = np.array([(x, y) for x in range(5) for y in range(5)], dtype=float) * 10.0
    rng = np.random.default_rng(seed)
    return centers[rng.integers(0, 25, n)] + rng.normal(scale=0.8, size=(n, 2)), centers


def _stuck_start(X, centers):
    """Lloyd's fixed point from a start with two centroids in one blob and none in another."""
    start = centers.copy()
    start[24] = centers[0] + [0.5, 0.0]  # blob 24 has none, blob 0 two
    return lloyd(
        ChunkList.from_array(X, None), start, max_iter=100, stop_rule=CentroidShift(0.0)
    ).centroids


def test_coreset_search_escapes_and_is_confirmed_on_the_data():
    from dkmeans.drivers.coreset import coreset_local_search

    X, centers = _grid()
    C = _stuck_start(X, centers)
    data = ChunkList.from_array(X, None, n_chunks=3)
    result = coreset_local_search(data, C, seed=0, stop_rule=CentroidShift(0.0), max_iter=100)
    assert result.kept and result.coreset.swaps_accepted >= 1
    best = objective(
        X, metrics.class_means(X, np.argmin(((X[:, None] - centers[None]) ** 2).sum(2), axis=1))
    )
    np.testing.assert_allclose(objective(X, result.centroids), best, rtol=1e-6)
    assert (
        result.objective >= objective(X, result.centroids) - 1e-9 * best
    )  # an upper bound of the kept result
    assert result.objective < objective(X, C)
    assert (
        result.passes == 2 + result.lloyd.n_iter
    )  # the sample's draw, the start's objective, Lloyd


def test_coreset_search_that_moves_nothing_computes_no_distances(monkeypatch):
    """In memory, the draw needs no distances; the start's objective is measured only to confirm moves."""
    import dkmeans.drivers.coreset as ls

    X, centers = _grid()
    C = lloyd(
        ChunkList.from_array(X, None), centers, max_iter=100, stop_rule=CentroidShift(0.0)
    ).centroids
    calls = []
    monkeypatch.setattr(ls, "objective_of", lambda data, C: calls.append(1) or objective(X, C))
    monkeypatch.setattr(ls, "objectives", lambda *a: pytest.fail("the draw computed distances"))
    result = ls.coreset_local_search(
        ChunkList.from_array(X, None, n_chunks=2),
        C,
        seed=0,
        stop_rule=CentroidShift(0.0),
        max_iter=3,
    )
    assert not result.kept and result.coreset.swaps_accepted == 0 and not calls
    assert result.passes == 1 and np.isnan(result.record.objective)
    np.testing.assert_array_equal(result.centroids, C.astype(result.centroids.dtype))


def test_coreset_search_never_keeps_a_worse_result(monkeypatch):
    """A coreset that proposes a worse solution: Lloyd on the data measures it and the start stays."""
    import dkmeans.drivers.coreset as ls

    X, centers = _grid()
    C = lloyd(
        ChunkList.from_array(X, None), centers + 0.1, max_iter=100, stop_rule=CentroidShift(0.0)
    ).centroids
    real = ls.local_search

    def misleading(data, centroids, **kwargs):
        result = real(data, centroids, **kwargs)
        result.centroids = np.asarray(centroids).copy()
        result.centroids[3] = result.centroids[4]  # two centroids on one blob: worse on the data
        result.swaps_accepted = 1
        return result

    monkeypatch.setattr(ls, "local_search", misleading)
    result = ls.coreset_local_search(
        ChunkList.from_array(X, None), C, seed=0, stop_rule=CentroidShift(0.0), max_iter=1
    )
    assert not result.kept and result.lloyd is not None
    np.testing.assert_array_equal(result.centroids, C.astype(result.centroids.dtype))
    assert result.objective == pytest.approx(objective(X, C), rel=1e-12)


def test_coreset_bounds_whatever_k():
    from dkmeans.drivers.coreset import CORESET_COST_ENTRIES, coreset_candidates, coreset_size

    for k in (1, 2, 32, 2048, 65536, 262144):
        m = coreset_candidates(k)
        assert 1 <= m <= 2 * k and (m * k <= CORESET_COST_ENTRIES or m == 8)
        assert coreset_size(10**6, k) <= max(4096, 10**6 // 12)
    assert coreset_size(500, 4) == 500  # small data: all of it


@pytest.mark.parametrize("max_iter", [1, 2, 5])
def test_max_iter_bounds_the_whole_fit(max_iter):
    """scikit-learn's meaning: at most max_iter Lloyd updates in a run, whatever phases it has."""
    from dkmeans import KMeans

    X, _ = _grid()
    km = KMeans(
        25, init="random", n_init=1, random_state=4, local_search=True, max_iter=max_iter, tol=0
    ).fit(X)
    assert km.n_iter_ <= max_iter
    lloyd_records = [h for h in km.history_ if h.get("algorithm", "lloyd") == "lloyd"]
    assert len(lloyd_records) <= max_iter


def test_default_fit_escapes_a_stuck_start_through_the_coreset():
    from dkmeans import KMeans

    X, centers = _grid()
    stuck = _stuck_start(X, centers)
    plain = KMeans(25, init=stuck, n_init=1, local_search=False).fit(X)
    searched = KMeans(25, init=stuck, n_init=1, local_search=True).fit(X)
    assert searched.inertia_ < 0.9 * plain.inertia_
    assert any(h.get("algorithm") == "local-search" for h in searched.history_)


@pytest.mark.parametrize("weighted", [False, True])
def test_trial_step_by_matrix_products_matches_swap_partials(weighted):
    """From TRIAL_PRODUCT_MIN_K centroids the trial step assigns to each trial's centroids with Lloyd's kernels."""
    from dkmeans.drivers.local_search import TRIAL_PRODUCT_MIN_K, _trial_chunk

    rng = np.random.default_rng(5)
    k = TRIAL_PRODUCT_MIN_K + 16
    X = rng.normal(size=(3000, 5)) * 4
    w = rng.uniform(0.5, 2.0, len(X)) if weighted else None
    C, P = X[rng.choice(len(X), k, replace=False)], X[rng.choice(len(X), 6, replace=False)]
    none = np.empty(0, dtype=np.int64)
    trials = [
        (none, none),
        (np.array([0]), np.array([3])),
        (np.array([1, 2, 5]), np.array([7, 0, k - 1])),
    ]
    got = _trial_chunk(X, w, 0, C, P, trials)
    want = swap_partials(X, C, P, trials, w)
    np.testing.assert_allclose(got.objective, want.objective, rtol=1e-9)
    np.testing.assert_allclose(got.counts, want.counts)
    np.testing.assert_allclose(got.sums, want.sums, rtol=1e-9, atol=1e-9)


def test_coreset_search_does_not_depend_on_the_machines_cores(monkeypatch):
    """The sample's chunks follow its size, never the core count: the same search with 1 or 8 threads."""
    import dkmeans.drivers.coreset as ls

    monkeypatch.setattr(ls, "CORESET_CHUNK_ROWS", 1024)  # 4 chunks of the 4,096-row sample
    X, centers = _grid(n=20_000)
    C = _stuck_start(X, centers)
    results = []
    for cores in (1, 8):
        monkeypatch.setattr(ls.os, "cpu_count", lambda cores=cores: cores)
        data = ChunkList.from_array(X, None, n_chunks=2)
        results.append(
            ls.coreset_local_search(data, C, seed=0, stop_rule=CentroidShift(0.0), max_iter=3)
        )
    assert ls.coreset_chunks(ls.coreset_size(len(X), 25)) == 4
    assert results[0].kept
    np.testing.assert_array_equal(results[0].centroids, results[1].centroids)
    assert results[0].objective == results[1].objective


def test_capped_confirmation_then_lloyd_goes_on_to_its_stop_rule():
    """A confirmation runs CONFIRM_ITERS updates at most; Lloyd then continues to its own stop rule."""
    from dkmeans import KMeans
    from dkmeans.drivers.coreset import CONFIRM_ITERS

    X, centers = _grid()
    stuck = _stuck_start(X, centers)
    km = KMeans(
        25, init="k-means++", n_init=1, random_state=4, local_search=True, tol=0, max_iter=300
    )
    km.fit(X)
    kinds = [h["algorithm"] for h in km.history_]
    assert km.stop_reason_ in ("centroid-shift", "fixed-point")
    assert km.n_iter_ <= 300
    searches = [i for i, kind in enumerate(kinds) if kind == "local-search"]
    assert searches
    for i in searches:
        assert km.history_[i]["lloyd_iterations"] <= CONFIRM_ITERS
    # an escape from the stuck start: confirmed in CONFIRM_ITERS updates, then Lloyd to its fixed point
    km = KMeans(25, init=stuck, n_init=1, local_search=True, tol=0).fit(X)
    kinds = [h["algorithm"] for h in km.history_]
    kept = [h for h in km.history_ if h["algorithm"] == "local-search" and h["kept"]]
    assert kept and all(h["lloyd_iterations"] <= CONFIRM_ITERS for h in kept)
    assert km.stop_reason_ in ("centroid-shift", "fixed-point")


# -- split candidates --------------------------------------------------------------------
def _merged_blobs(d=128, k=32, per=160, mistakes=3, seed=0):
    """Wide blobs (standard deviation 6 in [-10, 10]^d) and Lloyd's fixed point from a start with
    ``mistakes`` centroids each on two blobs and as many blobs with two centroids."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10, 10, size=(k, d))
    y = np.repeat(np.arange(k), per)
    X = (centres[y] + 6.0 * rng.normal(size=(len(y), d))).astype(np.float32)
    means = metrics.class_means(X, y)
    start = means.copy()
    for i in range(mistakes):
        start[2 * i] = (means[2 * i] + means[2 * i + 1]) / 2
        start[2 * i + 1] = means[k - 1 - i] + 0.1 * rng.normal(size=d)
    C = lloyd(
        ChunkList.from_array(X, None),
        start.astype(np.float32),
        max_iter=100,
        stop_rule=CentroidShift(0.0),
    ).centroids
    return X, means, C


@pytest.mark.parametrize("weighted", [False, True])
def test_split_sums_match_a_float64_reference(weighted):
    from dkmeans.kernels.swap import combine_split_sums, split_sums

    rng = np.random.default_rng(1)
    X, C, V = rng.normal(size=(500, 5)), rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    w = rng.uniform(0.5, 2.0, size=500) if weighted else None
    labels = sq(X, C).argmin(1)
    D = X - C[labels]
    t = np.einsum("ij,ij->i", D, V[labels])
    wt = np.ones(500) if w is None else w
    power = np.zeros((7, 5))
    halves, counts = np.zeros((14, 5)), np.zeros(14)
    for i in range(500):
        power[labels[i]] += wt[i] * t[i] * D[i]
        halves[2 * labels[i] + (t[i] > 0)] += wt[i] * X[i]
        counts[2 * labels[i] + (t[i] > 0)] += wt[i]
    whole = split_sums(X, C, V, w)
    parts = combine_split_sums(
        [split_sums(X[a:b], C, V, None if w is None else w[a:b]) for a, b in ((0, 123), (123, 500))]
    )
    for got in (whole, parts):
        np.testing.assert_allclose(got.power, power, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(got.half_sums, halves, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(got.half_counts, counts, rtol=1e-12)


def test_split_candidates_are_the_means_of_a_merged_clusters_blobs():
    """One centroid on two separated blobs, one on a third: the largest split is the merged cluster's,
    its halves are the two blobs and its gain is the exact drop of the objective."""
    from dkmeans.drivers.splits import split_candidates

    rng = np.random.default_rng(2)
    centres = np.array([[0.0, 0.0, 0.0], [20.0, 0.0, 0.0], [0.0, 40.0, 0.0]])
    X = np.concatenate([c + rng.normal(size=(200, 3)) for c in centres])
    means = metrics.class_means(X, np.repeat([0, 1, 2], 200))
    C = np.stack([(means[0] + means[1]) / 2, means[2]])
    P, owners = split_candidates(ChunkList.from_array(X, None, n_chunks=3), C, 1, seed=0, stream=0)
    np.testing.assert_array_equal(owners, [0, 0])
    np.testing.assert_allclose(
        np.sort(P, axis=0), np.sort(means[:2], axis=0), rtol=1e-10, atol=1e-10
    )
    # both halves, more: the objective with the split is the blobs' own
    np.testing.assert_allclose(
        objective(X, np.concatenate([P, C[1:]])), objective(X, means), rtol=1e-12
    )


def test_split_candidates_fix_merged_blobs_that_row_swaps_leave():
    """In 128 dimensions a row lies a blob's radius from its centre: swaps of rows fixed one of three
    merged pairs here, swaps of split halves all three (the blobs' own means)."""
    X, means, C = _merged_blobs()
    best = objective(X, means)
    options = dict(
        rounds=5, candidates_per_round=64, seed=0, lloyd_iters=3, stop_rule=CentroidShift(0.0)
    )
    rows_only = local_search(ChunkList.from_array(X, None, n_chunks=2), C, **options)
    split = local_search(ChunkList.from_array(X, None, n_chunks=2), C, split_share=0.25, **options)
    assert objective(X, rows_only.centroids) > 1.01 * best
    np.testing.assert_allclose(objective(X, split.centroids), best, rtol=1e-6)
    assert split.objective <= objective(X, C)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "half"])
def test_rejects_a_bad_split_share(stuck, bad):
    X, _, C, _ = stuck
    with pytest.raises(InvalidParameterError, match="split_share"):
        local_search(
            Chunks(X),
            C,
            rounds=1,
            candidates_per_round=4,
            seed=0,
            lloyd_iters=1,
            stop_rule=CentroidShift(0.0),
            split_share=bad,
        )
