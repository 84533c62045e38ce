"""Metrics against scikit-learn and hand-computed cases."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from dkmeans import metrics


@pytest.fixture
def labels():
    rng = np.random.default_rng(0)
    a = rng.integers(1, 6, size=3000)  # classes 1..5, like the benchmark sets
    b = np.where(rng.random(3000) < 0.8, (a * 7) % 5, rng.integers(0, 6, size=3000))
    return a, b


def test_ari_matches_scikit_learn(labels):
    a, b = labels
    assert metrics.adjusted_rand_index(a, b) == pytest.approx(adjusted_rand_score(a, b), rel=1e-12)
    assert metrics.adjusted_rand_index(a, a) == 1.0
    assert metrics.adjusted_rand_index([0, 0, 0], [1, 1, 1]) == 1.0


def test_dask_labels_give_the_same_values(client, labels):
    a, b = labels
    ad, bd = da.from_array(a, chunks=700), da.from_array(b, chunks=900)
    np.testing.assert_array_equal(
        metrics.contingency_matrix(ad, bd), metrics.contingency_matrix(a, b)
    )
    assert metrics.adjusted_rand_index(ad, bd) == pytest.approx(
        metrics.adjusted_rand_index(a, b), rel=1e-12
    )
    assert metrics.accuracy(ad, bd) == metrics.accuracy(a, b)


def test_accuracy_hand_computed():
    truth = [0, 0, 0, 1, 1, 2, 2, 2]
    pred = [5, 5, 1, 1, 1, 9, 9, 5]  # best map: 5->0, 1->1, 9->2: 2 + 2 + 2 = 6 of 8
    assert metrics.accuracy(truth, pred) == 6 / 8
    assert metrics.accuracy(truth, [3, 3, 3, 4, 4, 0, 0, 0]) == 1.0


def test_centroid_index_hand_computed():
    ref = np.array([[0.0, 0], [10, 0], [0, 10], [10, 10]])
    assert metrics.centroid_index(ref + 0.1, ref) == 0
    # two centroids in one true cluster, none in another: one cluster is wrong
    wrong = np.array([[0.0, 0], [0.5, 0], [10, 0], [10, 10]])
    assert metrics.centroid_index(wrong, ref) == 1
    assert metrics.centroid_index(ref, wrong) == 1


def test_objective_numpy_and_dask(client):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(500, 3))
    C = X[:4]
    w = rng.uniform(size=500)
    ref = (((X[:, None] - C[None]) ** 2).sum(-1).min(1) * w).sum()
    assert metrics.objective(X, C, w) == pytest.approx(ref, rel=1e-12)
    assert metrics.objective(
        da.from_array(X, chunks=(120, 3)), C, da.from_array(w, chunks=120)
    ) == pytest.approx(ref, rel=1e-12)


def test_class_means():
    X = np.array([[0.0], [2.0], [10.0]])
    np.testing.assert_array_equal(metrics.class_means(X, [3, 3, 1]), [[10.0], [1.0]])
