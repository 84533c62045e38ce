"""Bisecting k-means against scikit-learn's BisectingKMeans from the same starts; invariances."""

from __future__ import annotations

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.cluster import BisectingKMeans as SkBisectingKMeans

from dkmeans import BisectingKMeans
from dkmeans.drivers.bisecting import _leaves
from dkmeans.errors import InvalidParameterError


def _blobs(n=600, d=3, centres=6, seed=0):
    rng = np.random.default_rng(seed)
    C = rng.uniform(-10, 10, (centres, d))
    return np.concatenate([rng.normal(c, 1.0, (n // centres, d)) for c in C])


def _node_rows(model, labels):
    """Each node's training rows (a boolean mask), from the leaves below it."""
    fit = model._bisecting
    out = {}
    for i in range(len(fit.nodes)):
        below = [fit.leaves.index(leaf) for leaf in _leaves(fit.nodes, i)]
        out[i] = np.isin(labels, below)
    return out


def _fingerprint(rows: np.ndarray):
    return rows.shape[0], tuple(np.round(rows.sum(axis=0), 6))


def sklearn_from_our_starts(model, X, sample_weight=None, **params):
    """scikit-learn's BisectingKMeans, each 2-means started where ours started (a callable init that
    finds the cluster by its rows; scikit-learn hands it rows centred on their mean, as ours are).
    """
    mean = X.mean(axis=0)
    starts = {}
    for i, rows in _node_rows(model, model.labels_).items():
        split = model._bisecting.nodes[i].split
        if split is not None:
            starts[_fingerprint(X[rows] - mean)] = split.start

    def init(Xs, n_clusters, random_state):
        return starts[_fingerprint(Xs)].astype(Xs.dtype)

    return SkBisectingKMeans(init=init, **params).fit(X, sample_weight=sample_weight)


def assert_same_as_sklearn(ours, theirs, X):
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    np.testing.assert_allclose(
        ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-10, atol=1e-10
    )
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=1e-10)
    np.testing.assert_array_equal(ours.predict(X), theirs.predict(X))
    # the same tree: every split divides the same rows
    fit = ours._bisecting

    def sk_tree(node):
        return None if node.left is None else (sk_tree(node.left), sk_tree(node.right))

    def our_tree(i):
        n = fit.nodes[i]
        return None if n.left < 0 else (our_tree(n.left), our_tree(n.left + 1))

    assert our_tree(0) == sk_tree(theirs._bisecting_tree)


@pytest.mark.parametrize("strategy", ["biggest_inertia", "largest_cluster"])
@pytest.mark.parametrize("init", ["random", "k-means++"])
@pytest.mark.parametrize("k", [2, 3, 7, 16])
def test_same_tree_labels_and_centres_as_sklearn(strategy, init, k):
    X = _blobs(seed=k)
    params = dict(n_clusters=k, bisecting_strategy=strategy, max_iter=300, tol=1e-4)
    ours = BisectingKMeans(init=init, random_state=3, **params).fit(X)
    theirs = sklearn_from_our_starts(ours, X, **params)
    assert_same_as_sklearn(ours, theirs, X)


@pytest.mark.parametrize("strategy", ["biggest_inertia", "largest_cluster"])
def test_sample_weight_same_as_sklearn(strategy):
    X = _blobs(seed=5)
    w = np.random.default_rng(5).uniform(0.0, 3.0, len(X))
    w[:20] = 0.0  # rows that count for nothing (but count as rows for "largest_cluster")
    params = dict(n_clusters=6, bisecting_strategy=strategy)
    ours = BisectingKMeans(init="k-means++", random_state=0, **params).fit(X, sample_weight=w)
    theirs = sklearn_from_our_starts(ours, X, sample_weight=w, **params)
    assert_same_as_sklearn(ours, theirs, X)


def test_tol_and_max_iter_same_as_sklearn():
    X = _blobs(n=900, d=5, centres=9, seed=11)
    for params in (
        dict(tol=0.0, max_iter=300),
        dict(tol=1.0, max_iter=300),
        dict(tol=0.0, max_iter=2),
    ):
        ours = BisectingKMeans(8, init="random", random_state=2, **params).fit(X)
        theirs = sklearn_from_our_starts(ours, X, n_clusters=8, **params)
        assert_same_as_sklearn(ours, theirs, X)


def test_duplicated_rows_same_as_sklearn_and_k_up_to_n():
    rng = np.random.default_rng(4)
    X = np.repeat(rng.normal(size=(12, 2)), 3, axis=0)  # every row three times
    for k in (4, 12):
        ours = BisectingKMeans(k, init="k-means++", random_state=1).fit(X)
        theirs = sklearn_from_our_starts(ours, X, n_clusters=k)
        assert_same_as_sklearn(ours, theirs, X)
    assert ours.inertia_ == pytest.approx(0.0, abs=1e-20)
    # beyond the distinct rows every leaf scores 0 to rounding, which then picks the leaf:
    # no reference
    for k in (20, len(X) - 1, len(X)):
        for init in ("k-means++", "random"):
            model = BisectingKMeans(k, init=init, random_state=1).fit(X)
            assert model.cluster_centers_.shape == (k, 2) and model.inertia_ == pytest.approx(
                0.0, abs=1e-20
            )
            np.testing.assert_array_equal(model.predict(X), model.labels_)
            np.testing.assert_allclose(model.cluster_centers_[model.labels_], X, atol=1e-12)


def test_k_close_to_n_same_as_sklearn():
    X = np.random.default_rng(3).normal(size=(30, 3))
    for k in (25, 29, 30):
        ours = BisectingKMeans(k, init="k-means++", random_state=2).fit(X)
        theirs = sklearn_from_our_starts(ours, X, n_clusters=k)
        assert_same_as_sklearn(ours, theirs, X)
        assert (np.bincount(ours.labels_, minlength=k) >= 1).sum() >= k - 1


def test_k_one_is_the_unweighted_mean():
    X = _blobs(seed=2)
    w = np.random.default_rng(2).uniform(0.5, 2.0, len(X))
    ours = BisectingKMeans(1).fit(X, sample_weight=w)
    theirs = SkBisectingKMeans(1).fit(X, sample_weight=w)
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-12)
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=1e-12)
    assert (ours.labels_ == 0).all() and ours.inertia_per_k_.shape == (1,)


def test_every_k_objective_from_one_fit():
    X = _blobs(seed=8)
    model = BisectingKMeans(10, init="k-means++", random_state=0).fit(X)
    assert model.inertia_per_k_.shape == (10,)
    assert model.inertia_per_k_[-1] == pytest.approx(model.inertia_, rel=1e-10)
    assert np.all(
        np.diff(model.inertia_per_k_) <= 1e-9 * model.inertia_per_k_[0]
    )  # a split never adds SSE
    for k in (1, 3, 6, 10):
        C = model.cluster_centers_at(k)
        assert C.shape == (k, 3)
        # the objective of the tree cut after k - 1 splits, each cut node's rows at its centre
        leaves = _node_rows(model, model.labels_)
        fit = model._bisecting
        split = set(fit.split_order[: k - 1])
        stack, cut = [0], []
        while stack:
            i = stack.pop()
            if i in split:
                stack.extend((fit.nodes[i].left + 1, fit.nodes[i].left))
            else:
                cut.append(i)
        objective = sum(((X[leaves[i]] - c) ** 2).sum() for i, c in zip(cut, C))
        assert model.inertia_per_k_[k - 1] == pytest.approx(objective, rel=1e-9)


def test_n_init_keeps_the_best_start():
    X = _blobs(n=900, d=2, centres=9, seed=6)
    one = BisectingKMeans(9, init="random", n_init=1, random_state=5).fit(X)
    several = BisectingKMeans(9, init="random", n_init=4, random_state=5).fit(X)
    # start 0 of several is one's start: keeping the best of 4 never loses at the first split
    assert several.inertia_per_k_[1] <= one.inertia_per_k_[1] * (1 + 1e-9)
    theirs = sklearn_from_our_starts(
        several, X, n_clusters=9
    )  # the kept starts give scikit-learn's tree
    assert_same_as_sklearn(several, theirs, X)


def test_speculative_rounds_give_the_sequential_tree():
    """Many leaves split per round, yet the tree is scikit-learn's one-at-a-time tree."""
    X = _blobs(n=2000, d=4, centres=40, seed=9)
    ours = BisectingKMeans(64, init="k-means++", random_state=7).fit(X)
    assert ours.n_rounds_ < 20
    assert ours._bisecting.splits_computed >= 63
    theirs = sklearn_from_our_starts(ours, X, n_clusters=64)
    assert_same_as_sklearn(ours, theirs, X)


# -- input kinds, chunking, workers and out of core ---------------------------------------
@pytest.fixture(scope="module")
def data():
    X = _blobs(n=1200, d=4, centres=8, seed=12)
    w = np.random.default_rng(12).uniform(0.5, 2.0, len(X))
    return X, w


def _same_fit(a, b):
    np.testing.assert_array_equal(np.asarray(a.labels_), np.asarray(b.labels_))
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(a.inertia_per_k_, b.inertia_per_k_, rtol=1e-9)


def test_dask_array_and_chunking_invariance(client, data):
    X, w = data
    reference = BisectingKMeans(9, init="k-means++", random_state=4).fit(X, sample_weight=w)
    for chunks in (1200, 300, 97):
        ours = BisectingKMeans(9, init="k-means++", random_state=4).fit(
            da.from_array(X, chunks=(chunks, 4)), sample_weight=da.from_array(w, chunks=chunks)
        )
        labels = ours.labels_.compute()
        np.testing.assert_array_equal(labels, reference.labels_)
        np.testing.assert_allclose(ours.cluster_centers_, reference.cluster_centers_, rtol=1e-9)
        np.testing.assert_array_equal(
            ours.predict(da.from_array(X, chunks=(chunks, 4))).compute(), labels
        )


def test_worker_count_and_modes_invariance(client, single_worker_client, data, on_cluster):
    X, _ = data
    reference = BisectingKMeans(7, random_state=1).fit(X)
    with single_worker_client.as_current():
        one = BisectingKMeans(7, random_state=1).fit(da.from_array(X, chunks=(200, 4)))
        _same_fit(reference, one)  # its labels live on that cluster
    streamed = BisectingKMeans(7, random_state=1, out_of_core=True).fit(
        da.from_array(X, chunks=(250, 4))
    )
    assert streamed.data_mode_ == "out-of-core"
    _same_fit(reference, streamed)
    on = BisectingKMeans(7, random_state=1).fit(X)  # in-memory rows sent to the cluster
    _same_fit(reference, on)


def test_dask_dataframe_and_pandas(client, data):
    X, _ = data
    frame = pd.DataFrame(X, columns=list("abcd"))
    reference = BisectingKMeans(5, random_state=2).fit(frame)
    assert list(reference.feature_names_in_) == list("abcd")
    ddf = dd.from_pandas(frame, npartitions=3)
    ours = BisectingKMeans(5, random_state=2).fit(ddf)
    labels = ours.labels_.compute()
    assert isinstance(labels, pd.Series) and (labels.index == frame.index).all()
    np.testing.assert_array_equal(labels.to_numpy(), reference.labels_)
    np.testing.assert_array_equal(ours.predict(ddf).compute().to_numpy(), reference.labels_)
    np.testing.assert_allclose(ours.transform(frame), reference.transform(frame))
    assert ours.score(frame) == pytest.approx(reference.score(frame))


def test_float32_stays_float32():
    X = _blobs(seed=3).astype(np.float32)
    model = BisectingKMeans(4, random_state=0).fit(X)
    assert model.cluster_centers_.dtype == np.float32
    assert model.labels_.dtype == np.int32
    np.testing.assert_array_equal(model.predict(X), model.labels_)


def test_sparse_rows_and_pickle():
    import pickle

    import scipy.sparse as sp

    X = _blobs(seed=7)
    X[np.abs(X) < 3] = 0.0
    dense = BisectingKMeans(6, init="k-means++", random_state=0).fit(X)
    sparse = BisectingKMeans(6, init="k-means++", random_state=0).fit(sp.csr_matrix(X))
    _same_fit(dense, sparse)
    np.testing.assert_array_equal(sparse.predict(sp.csr_matrix(X)), dense.labels_)
    again = pickle.loads(pickle.dumps(dense))
    np.testing.assert_array_equal(again.predict(X), dense.labels_)
    np.testing.assert_array_equal(again.cluster_centers_at(3), dense.cluster_centers_at(3))


def test_transform_and_score_are_scikit_learns():
    X = _blobs(seed=4)
    ours = BisectingKMeans(5, init="k-means++", random_state=0).fit(X)
    theirs = sklearn_from_our_starts(ours, X, n_clusters=5)
    np.testing.assert_allclose(ours.transform(X), theirs.transform(X), rtol=1e-9)
    assert ours.score(X) == pytest.approx(theirs.score(X), rel=1e-9)


def test_bad_parameters_raise_clear_errors():
    X = _blobs()
    for params, message in (
        (dict(init="k-means||"), "init"),
        (dict(bisecting_strategy="x"), "bisecting_strategy"),
        (dict(algorithm="hartigan"), "algorithm"),
        (dict(n_init=0), "n_init"),
        (dict(max_iter=0), "max_iter"),
        (dict(n_clusters=len(X) + 1), "n_samples"),
    ):
        with pytest.raises(InvalidParameterError, match=message):
            BisectingKMeans(**params).fit(X)
    with pytest.raises(InvalidParameterError, match="joblib"):
        BisectingKMeans(2).fit(X).save("model.npz")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    d=st.integers(1, 4),
    k=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    duplicates=st.booleans(),
    strategy=st.sampled_from(["biggest_inertia", "largest_cluster"]),
)
def test_property_scikit_learns_tree_from_our_starts(n, d, k, seed, duplicates, strategy):
    rng = np.random.default_rng(seed)
    # duplicates: rows drawn again (not rounded values, whose exact midpoints between two centres
    # are ties that each library's float formula breaks its own way)
    X = rng.normal(size=(n, d))
    if duplicates:
        X = X[rng.integers(0, max(1, n // 3), n)]
    k = min(k, n)
    ours = BisectingKMeans(k, init="k-means++", random_state=seed, bisecting_strategy=strategy).fit(
        X
    )
    assert ours.cluster_centers_.shape == (k, d) and ours.labels_.shape == (n,)
    assert ours.inertia_ == pytest.approx(ours.inertia_per_k_[-1], rel=1e-9, abs=1e-9)
    np.testing.assert_array_equal(ours.predict(X), ours.labels_)
    distinct = len(np.unique(X, axis=0))
    # scikit-learn's tree is the reference where no leaf of equal rows can be split: there the
    # choice (among zero SSEs) and the split (of equal rows) depend on float rounding
    comparable = distinct == n or (strategy == "biggest_inertia" and k <= distinct)
    rows = {_fingerprint(X[m] - X.mean(axis=0)) for m in _node_rows(ours, ours.labels_).values()}
    if comparable and len(rows) == len(ours._bisecting.nodes):  # each node's rows tell it apart
        theirs = sklearn_from_our_starts(ours, X, n_clusters=k, bisecting_strategy=strategy)
        assert_same_as_sklearn(ours, theirs, X)
