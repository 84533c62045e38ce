"""Cluster-quality kernels against float64 NumPy references and scikit-learn (NumPy, and CuPy where present)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score

from dkmeans.kernels.namespace import to_host
from dkmeans.kernels.quality import (
    calinski_harabasz_index,
    centroid_codes,
    centroid_stats,
    codes_of,
    combine_label_stats,
    combine_mean_distances,
    davies_bouldin_index,
    imbalance_factor,
    label_stats,
    label_sums,
    mean_distances,
)
from tests.helpers import sq_distances


@pytest.fixture
def data():
    rng = np.random.default_rng(7)
    X = (
        np.concatenate([rng.normal(loc=c, size=(150, 3)) for c in (-4.0, 0.0, 5.0)]) + 100.0
    )  # far from 0
    C = X[rng.choice(len(X), 5, replace=False)]
    w = rng.uniform(0.0, 3.0, len(X))
    w[::17] = 0.0
    return X, C, w


def _reference(X, labels, k, w):
    """Per-label counts, means, scatter and distance sums, float64 from the definitions."""
    count = np.array([w[labels == j].sum() for j in range(k)])
    mean = np.array(
        [
            (w[labels == j, None] * X[labels == j]).sum(0) / max(count[j], 1e-300)
            if count[j]
            else np.zeros(X.shape[1])
            for j in range(k)
        ]
    )
    dev = ((X - mean[labels]) ** 2).sum(1)
    scatter = np.array([(w * dev)[labels == j].sum() for j in range(k)])
    dist = np.array([(w * np.sqrt(dev))[labels == j].sum() for j in range(k)])
    return count, mean, scatter, dist


def _simplified(X, centres, own, w):
    """Weighted sum of (b - a) / max(a, b): a to the own centre, b to the nearest other."""
    D = np.sqrt(sq_distances(X, centres))
    a = D[np.arange(len(X)), own]
    D[np.arange(len(X)), own] = np.inf
    b = D.min(1)
    return float((w * (b - a) / np.maximum(a, b)).sum())


def test_centroid_stats_match_a_float64_reference(xp, data):
    X, C, w = data
    labels = sq_distances(X, C).argmin(1)
    count, mean, scatter, _ = _reference(X, labels, 5, w)
    got = to_host(centroid_stats(xp.asarray(X), xp.asarray(C), xp.asarray(w)))
    np.testing.assert_array_equal(got.keys, np.arange(5))
    np.testing.assert_allclose(got.count, count, rtol=1e-12)
    np.testing.assert_allclose(got.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(got.scatter, scatter, rtol=1e-9)
    objective = np.array([(w * sq_distances(X, C).min(1))[labels == j].sum() for j in range(5)])
    np.testing.assert_allclose(got.objective, objective, rtol=1e-9)
    assert float(got.silhouette) == pytest.approx(_simplified(X, C, labels, w), rel=1e-9)
    assert float(got.rows) == len(X)


@pytest.mark.parametrize("cuts", [[0, 450], [0, 1, 200, 201, 450], [0, 30, 300, 450]])
def test_combined_chunks_equal_the_whole(data, cuts):
    """Chunks that see different labels (some none of a cluster) combine to the whole's statistics."""
    X, _, w = data
    labels = np.repeat([3.0, 7.0, 11.0], 150)  # label values, not codes
    parts = [label_stats(X[a:b], labels[a:b], w[a:b]) for a, b in zip(cuts, cuts[1:])]
    got = combine_label_stats(parts)
    count, mean, scatter, _ = _reference(X, np.repeat([0, 1, 2], 150), 3, w)
    np.testing.assert_array_equal(got.keys, [3.0, 7.0, 11.0])
    np.testing.assert_allclose(got.count, count, rtol=1e-12)
    np.testing.assert_allclose(got.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(
        got.scatter, scatter, rtol=1e-9
    )  # Chan's update: no cancellation at 100 + x


def test_label_stats_of_unsorted_chunks_combine_in_any_grouping(data):
    X, _, _ = data
    labels = np.random.default_rng(0).integers(0, 6, len(X)).astype(float)
    chunks = [label_stats(X[i : i + 37], labels[i : i + 37]) for i in range(0, len(X), 37)]
    flat = combine_label_stats(chunks)
    nested = combine_label_stats([combine_label_stats(chunks[:4]), combine_label_stats(chunks[4:])])
    for a, b in zip(flat, nested):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_mean_distances_match_a_float64_reference(xp, data):
    X, _, w = data
    labels = np.repeat([0, 1, 2], 150)
    count, mean, _, dist = _reference(X, labels, 3, w)
    got = to_host(
        mean_distances(xp.asarray(X), xp.asarray(labels), mean, xp.asarray(w), silhouette=True)
    )
    np.testing.assert_allclose(got.distance, dist, rtol=1e-9)
    assert float(got.silhouette) == pytest.approx(_simplified(X, mean, labels, w), rel=1e-9)
    halves = [mean_distances(X[a:b], labels[a:b], mean, w[a:b]) for a, b in ((0, 100), (100, 450))]
    np.testing.assert_allclose(combine_mean_distances(halves).distance, dist, rtol=1e-12)


def test_rows_of_unknown_labels_are_skipped():
    X = np.array([[0.0], [1.0], [5.0]])
    codes = codes_of(np.array([2.0, 9.0, 4.0]), np.array([2.0, 4.0]))
    np.testing.assert_array_equal(codes, [0, -1, 1])
    got = mean_distances(X, codes, np.array([[0.5], [5.0]]))
    np.testing.assert_array_equal(got.distance, [0.5, 0.0])


def test_centroid_codes_are_the_nearest_centroids(data):
    X, C, _ = data
    np.testing.assert_array_equal(
        centroid_codes(X, C, np.arange(5.0)), sq_distances(X, C).argmin(1)
    )


def test_scores_from_statistics_equal_scikit_learn(data):
    X, _, _ = data
    labels = np.random.default_rng(1).integers(0, 4, len(X))
    ones = np.ones(len(X))
    count, mean, scatter, dist = _reference(X, labels, 4, ones)
    assert calinski_harabasz_index(count, mean, scatter) == pytest.approx(
        calinski_harabasz_score(X, labels), rel=1e-9
    )
    assert davies_bouldin_index(mean, dist / count) == pytest.approx(
        davies_bouldin_score(X, labels), rel=1e-9
    )


def test_score_conventions_of_scikit_learn():
    # every row on its cluster's mean: CH is 1.0 by convention, DB 0.0
    X = np.array([[0.0, 0.0], [0.0, 0.0], [3.0, 4.0], [3.0, 4.0]])
    labels = np.array([0, 0, 1, 1])
    count, mean, scatter, dist = _reference(X, labels, 2, np.ones(4))
    assert (
        calinski_harabasz_index(count, mean, scatter) == calinski_harabasz_score(X, labels) == 1.0
    )
    assert davies_bouldin_index(mean, dist / count) == davies_bouldin_score(X, labels) == 0.0


def test_davies_bouldin_in_blocks_equals_one_block(monkeypatch):
    import dkmeans.kernels.quality as quality

    rng = np.random.default_rng(2)
    mean, s = rng.normal(size=(50, 4)), rng.uniform(size=50)
    whole = davies_bouldin_index(mean, s)
    monkeypatch.setattr(quality, "DB_BLOCK_BYTES", 8 * 50 * 4 * 3)  # 3 rows a block
    assert davies_bouldin_index(mean, s) == pytest.approx(whole, rel=1e-15)


def test_imbalance_factor_hand_computed():
    assert imbalance_factor([5, 5, 5, 5]) == 1.0
    assert imbalance_factor([20, 0, 0, 0]) == 4.0
    assert imbalance_factor([1, 3]) == pytest.approx(2 * 10 / 16)


def test_label_sums_hand_computed(xp):
    out = xp.asarray([[1.0, 2.0, 1.0], [0.0, 3.0, 2.0], [1.0, 4.0, 0.5]])
    np.testing.assert_array_equal(to_host(label_sums(out, 3)), [[3.0, 2.0], [6.0, 1.5], [0.0, 0.0]])
