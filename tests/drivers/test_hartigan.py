"""Hartigan's k-means: the exact move cost, standard and batch drivers, against brute force.

References are independent of the code under test: objectives recomputed from scratch
from the labels, exhaustive single-move searches, and a plain NumPy batch Hartigan.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dkmeans.drivers.hartigan import hartigan, standard_hartigan
from dkmeans.errors import InvalidParameterError
from dkmeans.kernels.hartigan import best_moves, move_costs, positive_counts
from dkmeans.testing import fit_hartigan, make_blobs, persist_rows, pick_rows, reference_lloyd


# -- brute-force references ------------------------------------------------------------------
def partition_objective(X, labels, k, w=None):
    """Weighted objective of a partition: every cluster's rows to their weighted mean."""
    X = np.asarray(X, dtype=np.float64)
    w = np.ones(len(X)) if w is None else np.asarray(w, dtype=np.float64)
    total = 0.0
    for j in range(k):
        mask = labels == j
        if w[mask].sum() > 0:
            mean = (X[mask] * w[mask, None]).sum(axis=0) / w[mask].sum()
            total += float((w[mask] * ((X[mask] - mean) ** 2).sum(axis=1)).sum())
    return total


def partition_means(X, labels, k, w=None):
    w = np.ones(len(X)) if w is None else w
    return np.stack(
        [
            (X[labels == j] * w[labels == j, None]).sum(axis=0) / w[labels == j].sum()
            for j in range(k)
        ]
    )


def assert_no_improving_move(X, labels, k, w=None, rtol=1e-10):
    """Try every row in every other cluster: no move (that keeps clusters non-empty) lowers the objective."""
    w = np.ones(len(X)) if w is None else w
    base = partition_objective(X, labels, k, w)
    npos = np.bincount(labels[w > 0], minlength=k)
    assert np.all(npos > 0)
    for i in range(len(X)):
        if w[i] > 0 and npos[labels[i]] == 1:
            continue
        for j in range(k):
            if j == labels[i]:
                continue
            moved = labels.copy()
            moved[i] = j
            assert partition_objective(X, moved, k, w) >= base * (1 - rtol), (i, j)


def nearest(X, C):
    return ((X[:, None, :] - C[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)


def reference_batch(X, C0, mode, max_rounds=1000, tol=1e-12):
    """Plain NumPy batch Hartigan (unweighted): all proposals, sorted, disjoint greedy / accept-all."""
    k = len(C0)
    labels = nearest(X, C0)
    rows = np.arange(len(X))
    for _ in range(max_rounds):
        W = np.bincount(labels, minlength=k).astype(float)
        C = partition_means(X, labels, k)
        D = ((X[:, None, :] - C[None, :, :]) ** 2).sum(axis=2)
        add = W / (W + 1) * D
        add[rows, labels] = np.inf
        target = add.argmin(axis=1)
        best_add = add[rows, target]
        Wl = W[labels]
        movable = Wl >= 2
        remove = np.where(movable, Wl / np.where(movable, Wl - 1, 1) * D[rows, labels], 0.0)
        ok = movable & (best_add * (1 + tol) < remove * (1 - tol))
        if not ok.any():
            return labels
        dcost = np.where(ok, best_add - remove, 0.0)
        if mode == "unsafe":
            new = np.where(ok, target, labels)
            if np.bincount(new, minlength=k).min() > 0 and (
                partition_objective(X, new, k) < partition_objective(X, labels, k)
            ):
                labels = new
                continue
        touched = np.zeros(k, bool)
        new = labels.copy()
        for i in np.lexsort((rows, dcost)):
            if not ok[i]:
                break
            s, t = labels[i], target[i]
            if not touched[s] and not touched[t]:
                touched[s] = touched[t] = True
                new[i] = t
        labels = new
    return labels


def persisted(client, X, n_chunks=3, w=None):
    return persist_rows(client, X, n_chunks, w)


@pytest.fixture
def small():
    """Overlapping blobs, small enough for exhaustive single-move checks."""
    X, _, _ = make_blobs(150, 2, 4, spread=3.0, box=5.0, seed=11)
    return X


@pytest.fixture(params=["auto", "numpy"])
def engine(request):
    """Kernel tests run with the compiled loops and with the namespace code."""
    with dask.config.set({"dkmeans.kernels.backend": request.param}):
        yield request.param


# -- kernels ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("weighted", [False, True])
def test_move_cost_equals_objective_change(weighted):
    rng = np.random.default_rng(0)
    for _trial in range(20):
        n, d, k = rng.integers(5, 30), rng.integers(1, 5), rng.integers(2, 5)
        X = rng.normal(size=(n, d))
        labels = np.arange(n) % k  # every cluster non-empty
        rng.shuffle(labels)
        w = rng.uniform(0.1, 3.0, size=n) if weighted else None
        ww = np.ones(n) if w is None else w
        W = np.bincount(labels, weights=ww, minlength=k)
        C = partition_means(X, labels, k, ww)
        base = partition_objective(X, labels, k, ww)
        targets = (labels + rng.integers(1, k, size=n)) % k
        got = move_costs(X, labels, targets, C, W, w)
        for i in range(n):
            moved = labels.copy()
            moved[i] = targets[i]
            if np.bincount(moved, minlength=k).min() == 0:
                assert got[i] == np.inf
                continue
            expected = partition_objective(X, moved, k, ww) - base
            assert got[i] == pytest.approx(expected, rel=1e-9, abs=1e-9 * base)


@pytest.mark.parametrize("weighted", [False, True])
def test_best_moves_is_the_best_valid_single_move(engine, weighted):
    rng = np.random.default_rng(1)
    n, d, k = 80, 3, 5
    X = rng.normal(size=(n, d))
    labels = rng.integers(0, k - 1, size=n).astype(np.int32)  # cluster k-1 starts empty
    w = rng.uniform(0.5, 2.0, size=n) if weighted else None
    if weighted:
        w[:5] = 0.0  # zero-weight rows never move
    ww = np.ones(n) if w is None else w
    W = np.bincount(labels, weights=ww, minlength=k)
    npos = positive_counts(labels, w, k)
    C = np.zeros((k, d))
    C[:-1] = partition_means(X, labels, k - 1, ww)
    C[-1] = 1e3  # an empty cluster's centroid is never used
    moves = best_moves(X, labels, C, W, npos, w)
    base = partition_objective(X, labels, k, ww)
    for i in range(n):
        costs = []
        for j in range(k):
            moved = labels.copy()
            moved[i] = j
            ok = (
                j != labels[i]
                and ww[i] > 0
                and np.bincount(moved[ww > 0], minlength=k)[labels[i]] > 0
            )
            costs.append(partition_objective(X, moved, k, ww) - base if ok else np.inf)
        best = int(np.argmin(costs))
        if costs[best] < -1e-9:
            assert moves.target[i] == best
            assert moves.dcost[i] == pytest.approx(costs[best], rel=1e-9)
        else:
            assert moves.target[i] == -1 and moves.dcost[i] == 0.0
        assert moves.own_sq[i] == pytest.approx(((X[i] - C[labels[i]]) ** 2).sum(), rel=1e-12)
    assert moves.target[:5].tolist() == [-1] * 5 if weighted else True
    assert np.sum(moves.target == k - 1) > 0  # the empty cluster attracts rows


@pytest.mark.parametrize("weighted", [False, True])
def test_compiled_and_namespace_kernels_agree(monkeypatch, weighted):
    """Several row tiles of the compiled loop (n not a multiple of the tile) against the array code."""
    X, _, _ = make_blobs(1100, 5, 7, spread=3.0, box=4.0, seed=2, dtype=np.float32)
    k = 8
    rng = np.random.default_rng(4)
    labels = rng.integers(0, k - 1, size=len(X)).astype(np.int32)
    w = rng.uniform(0.0, 2.0, size=len(X)) if weighted else None
    ww = np.ones(len(X)) if w is None else w
    W = np.bincount(labels, weights=ww, minlength=k)
    npos = positive_counts(labels, w, k)
    C = np.vstack([partition_means(X.astype(np.float64), labels, k - 1, ww), np.zeros((1, 5))])
    runs = []
    for eng in ("auto", "numpy"):
        with dask.config.set({"dkmeans.kernels.backend": eng}):
            runs.append(best_moves(X, labels, C, W, npos, w))
    np.testing.assert_array_equal(runs[0].target, runs[1].target)
    np.testing.assert_allclose(runs[0].dcost, runs[1].dcost, rtol=1e-12)
    np.testing.assert_allclose(runs[0].own_sq, runs[1].own_sq, rtol=1e-12)
    assert (runs[0].target >= 0).sum() > 100


# -- standard Hartigan ----------------------------------------------------------------------------
@pytest.mark.parametrize("weighted", [False, True])
def test_standard_descends_to_a_single_move_optimum(small, weighted):
    X = small
    k = 4
    w = np.random.default_rng(3).uniform(0.2, 2.0, size=len(X)) if weighted else None
    res = standard_hartigan(X, pick_rows(X, k, seed=2), sample_weight=w)
    assert res.converged and res.stop_reason == "no-improving-move"
    objectives = [h.objective for h in res.history]
    assert sum(h.moves for h in res.history) > 10  # a real run
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objectives, objectives[1:]))
    for prev, rec in zip(res.history, res.history[1:]):  # the exact formula predicts each sweep
        assert rec.objective - prev.objective == pytest.approx(
            rec.predicted_change, rel=1e-8, abs=1e-8
        )
    assert res.objective == pytest.approx(partition_objective(X, res.labels, k, w), rel=1e-12)
    np.testing.assert_allclose(
        res.centroids,
        partition_means(X, res.labels, k, np.ones(len(X)) if w is None else w),
        rtol=1e-12,
    )
    assert_no_improving_move(X, res.labels, k, w)


def lloyd_stuck_case():
    """1-D: {0, 2} and ten rows around 3.2. Lloyd is at a fixed point (2 is nearer 1 than 3.2),
    yet moving 2 lowers the objective by 2/1 * 1^2 - 10/11 * 1.2^2."""
    X = np.concatenate([[0.0, 2.0], np.linspace(3.0, 3.4, 10)])[:, None]
    C0 = np.array([[1.0], [3.2]])
    return X, C0, 2.0 - 10.0 / 11.0 * 1.2**2


def test_hartigan_leaves_a_lloyd_fixed_point(client):
    X, C0, gain = lloyd_stuck_case()
    ref = reference_lloyd(X, C0, max_iter=50)
    np.testing.assert_allclose(ref.centroids, C0, atol=1e-12)  # Lloyd does not move
    np.testing.assert_array_equal(ref.labels, [0, 0] + [1] * 10)
    std = standard_hartigan(X, C0)
    assert std.labels[1] == 1 and std.labels[0] == 0
    assert std.objective == pytest.approx(ref.objective - gain, rel=1e-12)
    for mode in ("safe", "unsafe"):
        res = hartigan(persisted(client, X, 2), C0, mode=mode)
        np.testing.assert_array_equal(res.labels.compute(), std.labels)
        assert res.objective == pytest.approx(ref.objective - gain, rel=1e-12)
        assert res.history[1].predicted_change == pytest.approx(-gain, rel=1e-12)


def test_standard_weighted_matches_repeated_rows(small):
    X = small
    k = 4
    reps = np.random.default_rng(5).integers(1, 4, size=len(X))
    Xr = np.repeat(X, reps, axis=0)
    C0 = pick_rows(X, k, seed=6)
    weighted = standard_hartigan(X, C0, sample_weight=reps.astype(float))
    assert weighted.converged
    # The weighted optimum, expanded to the repeated rows, is an optimum there: no single copy moves.
    expanded = np.repeat(weighted.labels, reps)
    rep = standard_hartigan(Xr, expanded, n_clusters=k)
    assert rep.n_iter == 1 and rep.history[-1].moves == 0
    np.testing.assert_array_equal(rep.labels, expanded)
    np.testing.assert_allclose(rep.centroids, weighted.centroids, rtol=1e-12)
    assert rep.objective == pytest.approx(weighted.objective, rel=1e-12)
    # Unit weights are the unweighted method, move for move.
    plain = standard_hartigan(X, C0)
    ones = standard_hartigan(X, C0, sample_weight=np.ones(len(X)))
    np.testing.assert_array_equal(plain.labels, ones.labels)
    assert [h.moves for h in plain.history] == [h.moves for h in ones.history]


def test_standard_fills_empty_clusters():
    X, _, _ = make_blobs(200, 2, 3, spread=1.0, seed=4)
    C0 = np.vstack(
        [pick_rows(X, 2, seed=1), [[1e4, 1e4], [-1e4, 1e4]]]
    )  # two centroids nobody is near
    res = standard_hartigan(X, C0)
    assert np.bincount(res.labels, minlength=4).min() > 0
    assert res.converged and np.all(np.isfinite(res.centroids))
    assert_no_improving_move(X, res.labels, 4)


# -- batch Hartigan ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["safe", "unsafe"])
def test_batch_matches_numpy_reference_and_is_a_local_optimum(client, small, mode):
    X = small
    k = 4
    C0 = pick_rows(X, k, seed=2)
    res = hartigan(persisted(client, X, 3), C0, mode=mode, max_candidates=k * k)
    labels = res.labels.compute()
    assert res.converged and res.stop_reason == "no-improving-move"
    np.testing.assert_array_equal(labels, reference_batch(X, C0, mode))
    assert_no_improving_move(X, labels, k)
    assert res.objective == pytest.approx(partition_objective(X, labels, k), rel=1e-12)
    np.testing.assert_allclose(res.centroids, partition_means(X, labels, k), rtol=1e-12)
    objectives = [h.objective for h in res.history]
    assert res.n_iter == len(res.history) - 1 > 3
    assert all(b < a for a, b in zip(objectives, objectives[1:]))
    for prev, rec in zip(res.history, res.history[1:]):
        if rec.mode != "unsafe":  # disjoint moves: the formula is exact for the round
            assert rec.objective - prev.objective == pytest.approx(rec.predicted_change, rel=1e-9)
            assert rec.moves <= k // 2
    if mode == "unsafe":
        assert any(r.mode == "unsafe" and r.moves > k // 2 for r in res.history)


def test_unsafe_round_that_raises_the_objective_is_undone(client):
    """A data set (found by search) where accepting every proposal once overshoots."""
    X, _, _ = make_blobs(150, 2, 4, spread=3.0, box=5.0, seed=4)
    C0 = pick_rows(X, 4, seed=4)
    res = hartigan(persisted(client, X, 3), C0, mode="unsafe", max_candidates=16)
    labels = res.labels.compute()
    modes = [h.mode for h in res.history]
    assert modes.count("safe-fallback") >= 1
    assert res.n_passes == 2 + res.n_iter + modes.count(
        "safe-fallback"
    )  # one extra pass per undone round
    np.testing.assert_array_equal(labels, reference_batch(X, C0, "unsafe"))
    objectives = [h.objective for h in res.history]
    assert all(b < a for a, b in zip(objectives, objectives[1:]))
    assert_no_improving_move(X, labels, 4)


@pytest.mark.parametrize("mode", ["safe", "unsafe"])
def test_batch_does_not_depend_on_chunking(client, mode):
    X, _, _ = make_blobs(600, 3, 5, spread=4.0, box=6.0, seed=7)
    C0 = pick_rows(X, 5, seed=3)
    runs = [hartigan(persisted(client, X, n), C0, mode=mode, max_iter=40) for n in (1, 3, 7)]
    first = runs[0]
    labels = first.labels.compute()
    assert sum(h.moves for h in first.history) > 40
    for r in runs[1:]:
        assert r.labels.chunks != first.labels.chunks
        assert [h.moves for h in r.history] == [h.moves for h in first.history]
        assert [h.mode for h in r.history] == [h.mode for h in first.history]
        np.testing.assert_array_equal(r.labels.compute(), labels)
        np.testing.assert_allclose(r.centroids, first.centroids, rtol=1e-12)
        assert r.objective == pytest.approx(first.objective, rel=1e-12)


def test_batch_weighted_fills_empty_cluster_and_reaches_optimum(client):
    X, _, _ = make_blobs(120, 2, 3, spread=3.0, box=4.0, seed=12)
    w = np.random.default_rng(9).uniform(0.2, 3.0, size=len(X))
    w[::17] = 0.0
    C0 = np.vstack([pick_rows(X, 3, seed=1), [[500.0, 500.0]]])  # the last cluster starts empty
    res = hartigan(persisted(client, X, 4, w), C0, mode="unsafe")
    labels = res.labels.compute()
    assert res.converged
    assert np.bincount(labels[w > 0], minlength=4).min() > 0
    assert res.objective == pytest.approx(partition_objective(X, labels, 4, w), rel=1e-12)
    assert_no_improving_move(X, labels, 4, w)
    assert all(
        b <= a * (1 + 1e-12)
        for a, b in zip([h.objective for h in res.history], [h.objective for h in res.history][1:])
    )


def test_batch_from_labels_and_final_assignment(client, small):
    X = small
    k = 4
    start = np.random.default_rng(0).integers(0, k, size=len(X))
    data = persisted(client, X, 3)
    fit = fit_hartigan(data, start, mode="unsafe")
    assert fit.result.converged
    partition = fit.result.labels.compute()
    # at a converged partition every row is strictly nearest its own centroid: infer agrees
    np.testing.assert_array_equal(fit.labels.compute(), partition)
    assert fit.objective == pytest.approx(fit.result.objective, rel=1e-10)
    assert_no_improving_move(X, partition, k)
    # max_iter=0: the means of the starting partition
    zero = hartigan(data, start, max_iter=0)
    assert zero.n_iter == 0 and zero.stop_reason == "max_iter"
    np.testing.assert_allclose(zero.centroids, partition_means(X, start, k), rtol=1e-12)
    np.testing.assert_array_equal(zero.labels.compute(), start)


def test_invalid_arguments(client, small):
    data = persisted(client, small, 2)
    with pytest.raises(InvalidParameterError):
        hartigan(data, small[:3], mode="fast")
    with pytest.raises(InvalidParameterError):
        hartigan(data, np.zeros(5, dtype=int))
    with pytest.raises(InvalidParameterError):
        standard_hartigan(small, small[:3, :1])


def test_objective_decrease_threshold(client, small):
    data = persisted(client, small, 3)
    C0 = pick_rows(small, 4, seed=2)
    full = hartigan(data, C0, mode="unsafe")
    decreases = np.diff([h.objective for h in full.history])
    tol = float(np.median(-decreases))
    res = hartigan(data, C0, mode="unsafe", tol=tol)
    assert res.stop_reason == "objective-decrease" and res.converged
    first = int(np.argmax(-decreases < tol)) + 1  # the first round that gained less than tol
    assert res.n_iter == first
    assert res.history[-1].objective == full.history[first].objective
