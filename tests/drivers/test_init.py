"""Initialisation strategies: sampling laws, weights, greedy choice, invariance, seeds."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from dkmeans import KMeans
from dkmeans.drivers.init import STRATEGIES, InitOptions
from dkmeans.drivers.init.kmeans_parallel import sample_candidates
from dkmeans.drivers.init.kmeans_plusplus import (
    STEP_STREAMS,
    STREAM_FIRST,
    kmeans_plusplus,
    n_trials,
)
from dkmeans.kernels import candidate_weights, kpp_trials, oversample_scores, uniform_by_index
from dkmeans.testing import make_blobs, persist_rows


def test_oversampling_probabilities_hand_made():
    """d2 = 0, 1, 4, 16, 64 (phi = 85), l*k = 4: P(draw) = min(1, 4 d2 / 85)."""
    X = np.array([[0.0], [1.0], [2.0], [4.0], [8.0]])
    d2 = X[:, 0] ** 2
    ell, phi = 4.0, d2.sum()
    expected = np.minimum(1.0, ell * d2 / phi)
    hits = np.zeros(5)
    n_seeds = 4000
    for seed in range(n_seeds):
        top, chunk_phi = oversample_scores(X, None, 0, d2, seed, 16, m=5)
        assert float(chunk_phi) == phi
        hits[np.asarray(top.index)[np.asarray(top.score) > phi / ell]] += 1
    freq = hits / n_seeds
    assert freq[0] == 0 and freq[4] == 1
    np.testing.assert_allclose(freq, expected, atol=0.025)


def test_oversampling_weights_scale_probabilities():
    X = np.array([[1.0], [1.0]])
    d2 = np.array([1.0, 1.0])
    w = np.array([1.0, 3.0])  # l k w d2 / phi = 2 * (1/4, 3/4) -> 0.5, 1.0
    hits = np.zeros(2)
    for seed in range(3000):
        top, phi = oversample_scores(X, w, 0, d2, seed, 16, m=2)
        hits[np.asarray(top.index)[np.asarray(top.score) > float(phi) / 2.0]] += 1
    np.testing.assert_allclose(hits / 3000, [0.5, 1.0], atol=0.03)


def test_candidate_weights_are_nearest_counts(client):
    X, _, _ = make_blobs(3000, 3, 5, seed=2)
    w = np.random.default_rng(1).uniform(0, 2, size=len(X))
    data = persist_rows(client, X, 6, w)
    C, weights = sample_candidates(data, 5, seed=11, options=InitOptions())
    nearest = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
    np.testing.assert_allclose(
        weights, np.bincount(nearest, weights=w, minlength=len(C)), rtol=1e-9
    )
    np.testing.assert_allclose(
        candidate_weights(nearest.astype(np.int32), w, len(C)), weights, rtol=1e-9
    )
    # about 1 + rounds * l * k candidates, all distinct rows of X
    fewest, most = 1 + 5, 1 + 5 * 2 * 5 * 2
    assert fewest <= len(C) <= most
    assert len(np.unique(C, axis=0)) == len(C)


def test_kpp_trials_potentials_and_conditional_samples():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 2))
    w = rng.uniform(0.5, 2, size=400)
    d2 = ((X - X[0]) ** 2).sum(1)
    trials = X[[5, 17, 300]]
    part = kpp_trials(X, w, 0, d2, trials, seed=3, stream=9, n_next=4)
    for t in range(3):
        d2t = np.minimum(d2, ((X - trials[t]) ** 2).sum(1))
        np.testing.assert_allclose(part.potentials[t], (w * d2t).sum(), rtol=1e-12)
        wd2 = w * d2t
        keys = np.log(uniform_by_index(np.arange(400), 3, 9)) / np.where(wd2 > 0, wd2, 1.0)
        keys[wd2 == 0] = -np.inf
        np.testing.assert_array_equal(part.samples[t].index, np.argsort(-keys, kind="stable")[:4])


def reference_greedy_kpp(X, k, seed):
    """Single-process greedy k-means++ with the same keyed random numbers."""
    n = len(X)
    idx = np.arange(n)
    u0 = uniform_by_index(np.zeros(1, dtype=np.int64), seed, STREAM_FIRST)[0]
    centers = [X[int(u0 * n)]]  # unweighted: a uniform global row index
    d2 = ((X - centers[0]) ** 2).sum(1)
    t = n_trials(k)

    def draw(d2, stream):
        keys = np.where(
            d2 > 0, np.log(uniform_by_index(idx, seed, stream)) / np.where(d2 > 0, d2, 1), -np.inf
        )
        order = np.lexsort((idx, -keys))
        return X[order[: min(t, int((d2 > 0).sum()))]]

    trials = draw(d2, STEP_STREAMS(0))
    for j in range(1, k):
        pots = [np.minimum(d2, ((X - c) ** 2).sum(1)).sum() for c in trials]
        best = int(np.argmin(pots))
        centers.append(trials[best])
        d2 = np.minimum(d2, ((X - trials[best]) ** 2).sum(1))
        trials = draw(d2, STEP_STREAMS(j))
    return np.array(centers)


def test_greedy_kmeans_plusplus_picks_the_best_trial(client):
    X, _, _ = make_blobs(800, 2, 6, seed=8)
    got = kmeans_plusplus(persist_rows(client, X, 5), 6, seed=21)
    np.testing.assert_allclose(got, reference_greedy_kpp(X, 6, 21), rtol=1e-12)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_same_centres_for_any_chunking_and_worker_count(client, single_worker_client, name):
    X, _, _ = make_blobs(2500, 3, 8, spread=1.5, seed=5)
    w = np.random.default_rng(9).uniform(0.2, 2, size=len(X))
    strategy = STRATEGIES[name]
    results = [strategy(persist_rows(client, X, n, w), 8, 77, InitOptions()) for n in (1, 7, 16)]
    results.append(strategy(persist_rows(single_worker_client, X, 7, w), 8, 77, InitOptions()))
    for r in results[1:]:
        np.testing.assert_allclose(r, results[0], rtol=1e-12, atol=1e-12)
    assert results[0].shape == (8, 3) and results[0].dtype == np.float64


def test_random_state_semantics(client):
    X, _, _ = make_blobs(1000, 2, 4, seed=6)
    a = KMeans(4, max_iter=1, random_state=1).fit(X).cluster_centers_
    b = KMeans(4, max_iter=1, random_state=1).fit(X).cluster_centers_
    c = KMeans(4, max_iter=1, random_state=2).fit(X).cluster_centers_
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    g1 = KMeans(4, max_iter=1, random_state=np.random.default_rng(5)).fit(X).cluster_centers_
    g2 = KMeans(4, max_iter=1, random_state=np.random.default_rng(5)).fit(X).cluster_centers_
    np.testing.assert_array_equal(g1, g2)
    # None: fresh entropy each time. On data without clusters, and without the default local search,
    # which settles any start of well-separated blobs in the same optimum (the two fits then agreed)
    U = np.random.default_rng(0).random((1000, 2))
    n1 = KMeans(4, max_iter=1, init="random", n_init=1, local_search=False).fit(U).cluster_centers_
    n2 = KMeans(4, max_iter=1, init="random", n_init=1, local_search=False).fit(U).cluster_centers_
    assert not np.array_equal(n1, n2)


@pytest.mark.parametrize("name", ["k-means||", "k-means++"])
def test_fewer_distinct_points_than_k(client, name):
    X = np.repeat(np.array([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]]), 20, axis=0)
    with pytest.warns(
        ConvergenceWarning,
        match=r"Number of distinct clusters \(3\) found smaller than n_clusters \(5\)",
    ):
        km = KMeans(5, init=name, random_state=0).fit(X)
    assert km.cluster_centers_.shape == (5, 2)
    assert {tuple(c) for c in km.cluster_centers_} >= {(0.0, 0.0), (1.0, 1.0), (5.0, 5.0)}
    assert km.inertia_ == 0.0


def test_n_init_keeps_the_best_run(client):
    X, _, _ = make_blobs(2000, 2, 10, spread=0.8, seed=13)
    best = KMeans(10, init="random", n_init=6, random_state=0).fit(X)
    from dkmeans.drivers.init import derive_seed

    runs = [
        KMeans(10, init="random", n_init=1, random_state=derive_seed(0, i)).fit(X).inertia_
        for i in range(6)
    ]
    assert best.inertia_ == pytest.approx(min(runs), rel=1e-9)
    assert len(set(np.round(runs, 6))) > 1  # the runs really differ


def test_kmeans_parallel_quality_close_to_scikit_learn(client):
    """Mean objective over seeds within 2% of scikit-learn's greedy k-means++ (n_init=1)."""
    from sklearn.cluster import KMeans as SK

    X, _, _ = make_blobs(4000, 2, 15, spread=1.0, box=12, seed=4)
    ours = np.mean([KMeans(15, random_state=s).fit(X).inertia_ for s in range(4)])
    theirs = np.mean([SK(15, n_init=1, random_state=s).fit(X).inertia_ for s in range(4)])
    assert ours <= theirs * 1.02


def test_init_options_are_validated(client):
    X = np.random.default_rng(0).normal(size=(50, 2))
    for params in (
        {"oversampling_factor": 0},
        {"init_rounds": 0},
        {"n_init": 0},
        {"n_init": "best"},
    ):
        with pytest.raises(ValueError):
            KMeans(3, **params).fit(X)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        KMeans(3, init=X[:3], n_init=4).fit(X)
    assert any("only one init" in str(c.message) for c in caught)
    assert math.isfinite(KMeans(3, init="k-means++").fit(X).inertia_)


# -- weights that change nothing: no weights, unit weights and equal weights give the same fit ------
@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random", "random-partition"])
def test_unit_weights_give_the_unweighted_fit(client, init):
    """scikit-learn's test_unit_weights_vs_no_weights, exactly; weights of 2 everywhere too."""
    X, _, _ = make_blobs(1200, 4, 8, spread=2.0, box=6.0, seed=12)  # overlapping: the start matters
    n = len(X)
    plain = KMeans(8, init=init, random_state=0).fit(X)
    ones = KMeans(8, init=init, random_state=0).fit(X, sample_weight=np.ones(n))
    twos = KMeans(8, init=init, random_state=0).fit(X, sample_weight=np.full(n, 2.0))
    for weighted in (ones, twos):
        np.testing.assert_array_equal(weighted.cluster_centers_, plain.cluster_centers_)
        np.testing.assert_array_equal(np.asarray(weighted.labels_), np.asarray(plain.labels_))
    assert ones.inertia_ == pytest.approx(plain.inertia_, rel=1e-12)
    assert twos.inertia_ == pytest.approx(2 * plain.inertia_, rel=1e-12)


class _Chunks:
    """The data protocol over in-memory row chunks (enough for first_centre), no cluster."""

    def __init__(self, X, weights, rows_per_chunk):
        self.X, self.w, self.step = X, weights, rows_per_chunk
        self.n_rows, self.has_weights = len(X), weights is not None

    def map_reduce(self, chunk_fn, combine_fn, args=()):
        return combine_fn(
            [
                chunk_fn(
                    self.X[i : i + self.step],
                    None if self.w is None else self.w[i : i + self.step],
                    i,
                    *args,
                )
                for i in range(0, self.n_rows, self.step)
            ]
        )

    def rows(self, indices):
        return self.X[np.asarray(indices)]


def test_first_centre_draws_in_proportion_to_the_weights():
    """w_i / sum(w) for every row, zero weights never; the same draws for any chunking."""
    from dkmeans.drivers.init.random import first_centre

    X = np.arange(6, dtype=np.float64)[:, None]  # row i holds the value i
    w = np.array([0.0, 1.0, 3.0, 0.5, 2.5, 1.0])
    seeds = range(4000)
    draws = np.array([int(first_centre(_Chunks(X, w, 2), s, 7)[0, 0]) for s in seeds])
    np.testing.assert_allclose(
        np.bincount(draws, minlength=6) / len(draws), w / w.sum(), atol=0.025
    )
    assert not np.any(draws == 0)
    for step in (1, 4, 6):
        np.testing.assert_array_equal(
            [int(first_centre(_Chunks(X, w, step), s, 7)[0, 0]) for s in seeds[:300]], draws[:300]
        )


def test_first_centre_with_equal_weights_is_the_unweighted_draw():
    from dkmeans.drivers.init.random import first_centre

    X = np.random.default_rng(3).normal(size=(97, 2))
    for seed in range(300):
        plain = first_centre(_Chunks(X, None, 10), seed, 2)
        for w in (np.ones(97), np.full(97, 2.0), np.full(97, 0.3)):
            np.testing.assert_array_equal(first_centre(_Chunks(X, w, 13), seed, 2), plain)
