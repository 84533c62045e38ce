"""The Lloyd driver against the float64 reference, stop rules, empty clusters, invariance."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from dkmeans.drivers.lloyd import CentroidShift, ObjectiveDecrease, lloyd
from dkmeans.testing import fit_lloyd, make_blobs, persist_rows, reference_lloyd
from dkmeans.testing import pick_rows as initial_rows


@pytest.fixture(autouse=True, params=["per-iteration", "single-task", "spmd"])
def loop_mode(request):
    """Every test runs with one graph per iteration, with the whole loop in one task, and SPMD."""
    if request.param == "per-iteration":
        request.getfixturevalue("graph_loop")
        yield
        return
    if request.param == "spmd":
        calls = request.getfixturevalue("spmd")
        yield
        assert "lloyd_iterations" in calls, "the loop did not run SPMD"
        return
    calls = request.getfixturevalue("single_task")
    yield
    assert "lloyd_iterations" in calls, "the loop did not run in one task"


@pytest.fixture
def overlapping():
    """Overlapping blobs: Lloyd takes many iterations to reach a fixed point."""
    X, _, _ = make_blobs(2000, 3, 6, spread=4.0, box=6.0, seed=7)
    return X


@pytest.mark.parametrize("n_chunks", [1, 3, 16])
def test_matches_reference_to_fixed_point(client, overlapping, n_chunks):
    X = overlapping
    C0 = initial_rows(X, 6)
    ref = reference_lloyd(X, C0, max_iter=200)
    out = fit_lloyd(
        persist_rows(client, X, n_chunks), C0, max_iter=200, stop_rule=CentroidShift(0.0)
    )
    assert ref.n_iter > 5  # a real run, not a trivial one
    assert out.result.n_iter == ref.n_iter
    np.testing.assert_allclose(out.result.centroids, ref.centroids, rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(out.labels.compute(), ref.labels)
    np.testing.assert_allclose(out.objective, ref.objective, rtol=1e-7)
    assert out.labels.dtype == np.int32


def test_results_do_not_depend_on_chunking(client, overlapping):
    X = overlapping
    C0 = initial_rows(X, 6, seed=3)
    runs = [
        fit_lloyd(persist_rows(client, X, n), C0, max_iter=50, stop_rule=ObjectiveDecrease(0.0))
        for n in (1, 3, 16)
    ]
    for r in runs[1:]:
        assert r.result.n_iter == runs[0].result.n_iter
        np.testing.assert_allclose(r.result.centroids, runs[0].result.centroids, rtol=1e-12)
        assert r.objective == pytest.approx(runs[0].objective, rel=1e-12)


def test_results_do_not_depend_on_worker_count(client, single_worker_client, overlapping):
    X = overlapping
    C0 = initial_rows(X, 6, seed=4)
    two = fit_lloyd(persist_rows(client, X, 8), C0, max_iter=60, stop_rule=CentroidShift(0.0))
    one = fit_lloyd(
        persist_rows(single_worker_client, X, 8), C0, max_iter=60, stop_rule=CentroidShift(0.0)
    )
    assert one.result.n_iter == two.result.n_iter
    np.testing.assert_allclose(one.result.centroids, two.result.centroids, rtol=1e-12)
    np.testing.assert_array_equal(
        single_worker_client.compute(one.labels, sync=True), two.labels.compute()
    )


def test_objective_never_increases(client, overlapping):
    X = overlapping
    res = lloyd(
        persist_rows(client, X, 5),
        initial_rows(X, 6, seed=9),
        max_iter=100,
        stop_rule=CentroidShift(0.0),
    )
    objectives = [h.objective for h in res.history]
    assert len(objectives) > 5
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objectives, objectives[1:]))
    assert all(h.seconds > 0 for h in res.history)
    assert res.history[-1].centroid_shift == 0.0 and res.converged


def test_weighted_matches_reference(client, overlapping):
    X = overlapping
    w = np.random.default_rng(2).uniform(0, 3, size=len(X))
    w[:50] = 0.0
    C0 = initial_rows(X, 6, seed=5)
    ref = reference_lloyd(X, C0, max_iter=100, weights=w)
    out = fit_lloyd(persist_rows(client, X, 4, w), C0, max_iter=100, stop_rule=CentroidShift(0.0))
    assert out.result.n_iter == ref.n_iter
    np.testing.assert_allclose(out.result.centroids, ref.centroids, rtol=1e-7)
    np.testing.assert_allclose(out.objective, ref.objective, rtol=1e-7)


def test_empty_cluster_takes_farthest_point_hand_computed(client):
    """X = 0, 1, 3, 10, 11; C0 = 1, 10.5, 100 (cluster 2 gets nothing).

    After the first update c0 = 4/3 and c1 = 10.5; distances^2 to these are
    16/9, 1/9, 25/9, 1/4, 1/4, so the empty cluster takes x = 3 (row 2).
    """
    X = np.array([[0.0], [1.0], [3.0], [10.0], [11.0]])
    C0 = np.array([[1.0], [10.5], [100.0]])
    res = lloyd(persist_rows(client, X, 2), C0, max_iter=1, stop_rule=CentroidShift(0.0))
    np.testing.assert_allclose(res.centroids.ravel(), [4 / 3, 10.5, 3.0])
    assert res.history[0].empty_clusters_fixed == 1
    # continued to the end: clusters {0, 1}, {3}, {10, 11}
    res = lloyd(persist_rows(client, X, 2), C0, max_iter=10, stop_rule=CentroidShift(0.0))
    np.testing.assert_allclose(np.sort(res.centroids.ravel()), [0.5, 3.0, 10.5])


def test_several_empty_clusters_take_distinct_points(client):
    X = np.array([[0.0], [1.0], [3.0], [10.0], [11.0]])
    C0 = np.array([[1.0], [10.5], [100.0], [200.0]])
    res = lloyd(persist_rows(client, X, 3), C0, max_iter=1, stop_rule=CentroidShift(0.0))
    # farthest: x=3 (25/9), then x=0 (16/9)
    np.testing.assert_allclose(res.centroids.ravel(), [4 / 3, 10.5, 3.0, 0.0])
    assert res.history[0].empty_clusters_fixed == 2
    ref = reference_lloyd(X, C0, max_iter=1)
    np.testing.assert_allclose(res.centroids, ref.centroids)


def test_objective_decrease_rule(client, overlapping):
    X = overlapping
    C0 = initial_rows(X, 6, seed=11)
    threshold = 50.0
    ref = reference_lloyd(X, C0, max_iter=100, threshold=threshold)
    res = lloyd(
        persist_rows(client, X, 4), C0, max_iter=100, stop_rule=ObjectiveDecrease(threshold)
    )
    assert res.n_iter == ref.n_iter and res.stop_reason == "objective-decrease"
    objectives = [h.objective for h in res.history]
    # every performed update followed a decrease >= threshold
    assert all(a - b >= threshold for a, b in zip(objectives, objectives[1:]))
    np.testing.assert_allclose(res.centroids, ref.centroids, rtol=1e-9)


def test_max_iter_zero_and_bound(client, overlapping):
    X = overlapping
    C0 = initial_rows(X, 6)
    out = fit_lloyd(persist_rows(client, X), C0, max_iter=0, stop_rule=ObjectiveDecrease(0.0))
    assert out.result.n_iter == 0 and out.result.stop_reason == "max_iter"
    np.testing.assert_array_equal(out.result.centroids, C0)
    ref = reference_lloyd(X, C0, max_iter=0)
    assert out.objective == pytest.approx(ref.objective, rel=1e-12)
    res = lloyd(persist_rows(client, X), C0, max_iter=3, stop_rule=ObjectiveDecrease(0.0))
    assert res.n_iter == 3 and not res.converged


def test_centroid_shift_strict_vs_inclusive(client):
    X, _, _ = make_blobs(500, 2, 3, seed=3)
    C0 = initial_rows(X, 3)
    ref = reference_lloyd(X, C0, max_iter=100)
    # tol = 0 strict can never be satisfied: the run ends at the fixed point instead
    res = lloyd(
        persist_rows(client, X), C0, max_iter=100, stop_rule=CentroidShift(0.0, inclusive=False)
    )
    assert res.stop_reason == "fixed-point" and res.n_iter == ref.n_iter
    res = lloyd(
        persist_rows(client, X), C0, max_iter=100, stop_rule=CentroidShift(0.0, inclusive=True)
    )
    assert res.stop_reason == "centroid-shift" and res.n_iter == ref.n_iter


def test_non_finite_data_is_reported_in_first_pass(client):
    X = np.random.default_rng(0).normal(size=(100, 2))
    X[77, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        lloyd(persist_rows(client, X, 4), X[:3], max_iter=5, stop_rule=CentroidShift(0.0))


def test_float32_data_gives_float32_centroids(client, overlapping):
    X = overlapping.astype(np.float32)
    C0 = initial_rows(X, 6)
    ref = reference_lloyd(X, C0, max_iter=200)
    out = fit_lloyd(persist_rows(client, X, 3), C0, max_iter=200, stop_rule=CentroidShift(0.0))
    assert out.result.centroids.dtype == np.float32
    assert out.result.n_iter == ref.n_iter
    np.testing.assert_allclose(out.result.centroids, ref.centroids, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.objective, ref.objective, rtol=1e-4)


def test_too_few_distinct_points_warns_and_terminates(client):
    """Three distinct points, five centroids: the empty clusters can only get coinciding rows."""
    X = np.repeat([[0.0], [1.0], [5.0]], 4, axis=0)
    C0 = np.array(
        [[0.0], [0.0], [1.0], [5.0], [5.0]]
    )  # ties go to the lowest index: 1 and 4 stay empty
    with pytest.warns(ConvergenceWarning, match="fewer distinct points"):
        res = lloyd(persist_rows(client, X, 3), C0, max_iter=20, stop_rule=CentroidShift(0.0))
    assert res.converged and res.n_iter < 20
    assert set(res.centroids.ravel()) == {0.0, 1.0, 5.0}


def test_repeated_empty_clusters_match_reference(client):
    """Few rows per centroid: updates keep leaving clusters empty. The refill and the next
    assignment are formed together (one full product) and must give the reference's run."""
    X, _, _ = make_blobs(600, 32, 75, spread=1.0, box=10.0, seed=8)
    C0 = initial_rows(X, 200, seed=3)
    ref = reference_lloyd(X, C0, max_iter=8)
    res = lloyd(persist_rows(client, X, 4), C0, max_iter=8, stop_rule=CentroidShift(0.0))
    refilled = [h.empty_clusters_fixed for h in res.history]
    assert sum(refilled[:-1]) >= 3, (
        refilled
    )  # refills before the last update: the combined path ran
    assert res.n_iter == ref.n_iter
    np.testing.assert_allclose(res.centroids, ref.centroids, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose([h.objective for h in res.history], ref.objectives, rtol=1e-9)
