"""Cluster-quality scores on every input kind, against scikit-learn's on the same rows and labels."""

from __future__ import annotations

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as sk

import dkmeans
from dkmeans import metrics
from dkmeans.drivers.streams import stream
from dkmeans.fit import scoring
from dkmeans.kernels.sampling import uniform_by_index
from dkmeans.testing import make_blobs
from tests.helpers import sq_distances


@pytest.fixture(scope="module")
def blobs():
    X, _, _ = make_blobs(1200, 4, 5, spread=1.5, box=8.0, seed=4)
    C = X[np.random.default_rng(0).choice(len(X), 5, replace=False)]
    return X, C, sq_distances(X, C).argmin(1)


def _simplified_reference(X, C, labels):
    D = np.sqrt(sq_distances(X, C))
    a = D[np.arange(len(X)), labels]
    D[np.arange(len(X)), labels] = np.inf
    b = D.min(1)
    return float(np.mean((b - a) / np.maximum(a, b)))


# -- in memory, against scikit-learn ------------------------------------------------------------------
def test_centroids_give_scikit_learn_scores_of_the_nearest_centroid_labels(blobs):
    X, C, labels = blobs
    assert metrics.calinski_harabasz_score(X, C) == pytest.approx(
        sk.calinski_harabasz_score(X, labels), rel=1e-10
    )
    assert metrics.davies_bouldin_score(X, C) == pytest.approx(
        sk.davies_bouldin_score(X, labels), rel=1e-10
    )
    assert metrics.silhouette_score(X, C, simplified=True) == pytest.approx(
        _simplified_reference(X, C, labels), rel=1e-10
    )
    scores = metrics.cluster_scores(X, C)
    assert scores.n_passes == 2 and scores.valid and scores.n_labels == 5
    one = scoring.scores(
        X, centroids=C, passes=1
    )  # what calinski_harabasz_score and simplified=True run
    assert (
        one.n_passes == 1
        and one.calinski_harabasz == scores.calinski_harabasz
        and np.isnan(one.davies_bouldin)
    )
    np.testing.assert_array_equal(scores.sizes, np.bincount(labels, minlength=5))
    np.testing.assert_allclose(
        scores.cluster_objective,
        np.bincount(labels, sq_distances(X, C).min(1), minlength=5),
        rtol=1e-10,
    )
    sizes = np.bincount(labels, minlength=5)
    assert scores.imbalance == pytest.approx(5 * (sizes**2).sum() / len(X) ** 2)


def test_labels_of_any_type_give_scikit_learn_scores(blobs):
    X, _, labels = blobs
    named = np.array(["a", "b", "c", "d", "e"])[labels]
    assert metrics.calinski_harabasz_score(X, named) == pytest.approx(
        sk.calinski_harabasz_score(X, named), rel=1e-10
    )
    assert metrics.davies_bouldin_score(X, named) == pytest.approx(
        sk.davies_bouldin_score(X, named), rel=1e-10
    )
    assert metrics.silhouette_score(X, named) == pytest.approx(
        sk.silhouette_score(X, named), rel=1e-10
    )
    scores = metrics.cluster_scores(X, named)
    np.testing.assert_array_equal(scores.labels, ["a", "b", "c", "d", "e"])
    means = np.array([X[labels == j].mean(0) for j in range(5)])
    assert scores.simplified_silhouette == pytest.approx(
        _simplified_reference(X, means, labels), rel=1e-10
    )


def test_a_fitted_model_is_scored_by_its_predictions(blobs):
    X, _, _ = blobs
    km = dkmeans.KMeans(5, random_state=0).fit(X)
    labels = km.predict(X)
    assert metrics.calinski_harabasz_score(X, km) == pytest.approx(
        sk.calinski_harabasz_score(X, labels), rel=1e-10
    )
    assert metrics.davies_bouldin_score(X, km) == pytest.approx(
        sk.davies_bouldin_score(X, labels), rel=1e-10
    )
    # the fitted attributes come from the final pass: sizes and per-cluster objective of labels_
    np.testing.assert_array_equal(km.cluster_sizes_, np.bincount(km.labels_, minlength=5))
    assert km.cluster_inertia_.sum() == pytest.approx(km.inertia_, rel=1e-12)
    np.testing.assert_allclose(
        km.cluster_inertia_, metrics.cluster_scores(X, km).cluster_objective, rtol=1e-10
    )
    assert km.imbalance_ == pytest.approx(5 * (km.cluster_sizes_**2).sum() / len(X) ** 2)


def test_cosine_model_scores_the_normalised_rows(blobs):
    X, _, _ = blobs
    km = dkmeans.KMeans(4, metric="cosine", random_state=1).fit(X)
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    labels = km.predict(X)
    assert metrics.calinski_harabasz_score(X, km) == pytest.approx(
        sk.calinski_harabasz_score(unit, labels), rel=1e-9
    )
    assert metrics.cluster_scores(X, km).objective == pytest.approx(km.inertia_, rel=1e-9)


def _sample_index(n, size, seed):
    """The rows the sample draws, from the definition: the ``size`` largest keys of (seed, row index)."""
    u = uniform_by_index(np.arange(n, dtype=np.int64), seed, stream("silhouette.sample"))
    return np.sort(np.argsort(-u, kind="stable")[:size])


def test_sampled_silhouette_is_scikit_learns_on_the_same_rows(blobs):
    X, C, labels = blobs
    index = _sample_index(len(X), 300, 42)
    ours = metrics.silhouette_score(X, C, sample_size=300, random_state=42)
    assert ours == pytest.approx(sk.silhouette_score(X[index], labels[index]), rel=1e-12)
    assert metrics.silhouette_score(X, labels, sample_size=300, random_state=42) == ours
    assert metrics.silhouette_score(X, C, sample_size=300, random_state=43) != ours
    assert metrics.silhouette_score(X, labels) == pytest.approx(
        sk.silhouette_score(X, labels), rel=1e-12
    )


def test_weights_count_as_repeated_rows(blobs):
    X, C, _ = blobs
    reps = np.random.default_rng(3).integers(0, 4, len(X))
    reps[:2] = 1  # not all zero
    ours = metrics.cluster_scores(X, C, sample_weight=reps.astype(float))
    ref = metrics.cluster_scores(np.repeat(X, reps, axis=0), C)
    for name in ("calinski_harabasz", "davies_bouldin", "simplified_silhouette", "imbalance"):
        assert getattr(ours, name) == pytest.approx(getattr(ref, name), rel=1e-9), name
    np.testing.assert_allclose(ours.sizes, ref.sizes)
    np.testing.assert_allclose(ours.cluster_objective, ref.cluster_objective, rtol=1e-9)


@pytest.mark.parametrize("k", [1, "n"])
def test_one_cluster_or_one_per_row_raise_scikit_learns_error(k):
    X = np.arange(12.0).reshape(6, 2)
    labels = np.zeros(6, int) if k == 1 else np.arange(6)
    for ours, theirs in (
        (metrics.calinski_harabasz_score, sk.calinski_harabasz_score),
        (metrics.davies_bouldin_score, sk.davies_bouldin_score),
        (metrics.silhouette_score, sk.silhouette_score),
    ):
        with pytest.raises(ValueError, match="Number of labels is") as expected:
            theirs(X, labels)
        with pytest.raises(ValueError, match=str(expected.value).split(".")[0]):
            ours(X, labels)
    scores = metrics.cluster_scores(X, X[:1] if k == 1 else X)
    assert (
        not scores.valid and np.isnan(scores.calinski_harabasz) and np.isnan(scores.davies_bouldin)
    )


def test_two_clusters_of_tiny_duplicated_data():
    X = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [5.0, 5.0], [5.0, 5.0]])
    labels = np.array([0, 0, 0, 1, 1])
    assert metrics.calinski_harabasz_score(X, labels) == pytest.approx(
        sk.calinski_harabasz_score(X, labels)
    )
    assert metrics.davies_bouldin_score(X, labels) == pytest.approx(
        sk.davies_bouldin_score(X, labels)
    )
    assert metrics.silhouette_score(X, labels) == pytest.approx(sk.silhouette_score(X, labels))


@settings(max_examples=15, deadline=None, derandomize=True)
@given(n=st.integers(3, 60), d=st.integers(1, 4), k=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_property_scores_equal_scikit_learn(n, d, k, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.1, 10) + rng.normal() * 50
    labels = rng.integers(0, k, n)
    n_labels = np.unique(labels).size
    if not 1 < n_labels < n:
        with pytest.raises(ValueError):
            metrics.calinski_harabasz_score(X, labels)
        return
    assert metrics.calinski_harabasz_score(X, labels) == pytest.approx(
        sk.calinski_harabasz_score(X, labels), rel=1e-8
    )
    # scikit-learn's distances by the dot-product expansion lose digits on rows far from the
    # origin (4e-8 relative at n=3, seed=0); ours match the direct differences
    assert metrics.davies_bouldin_score(X, labels) == pytest.approx(
        sk.davies_bouldin_score(X, labels), rel=1e-6
    )
    assert metrics.davies_bouldin_score(X, labels) == pytest.approx(
        _davies_bouldin_by_differences(X, labels), rel=1e-10
    )


def _davies_bouldin_by_differences(X, labels):
    """Davies-Bouldin's index from its definition, every distance a norm of differences."""
    groups = [X[labels == label] for label in np.unique(labels)]
    centres = np.array([g.mean(axis=0) for g in groups])
    spread = np.array([np.linalg.norm(g - c, axis=1).mean() for g, c in zip(groups, centres)])
    apart = np.linalg.norm(centres[:, None, :] - centres[None, :, :], axis=2)
    np.fill_diagonal(apart, np.inf)
    return float(np.mean(np.max((spread[:, None] + spread[None, :]) / apart, axis=1)))


# -- on the cluster: every input kind gives the in-memory value --------------------------------------
def test_dask_arrays_with_odd_chunks_and_dataframes_give_the_in_memory_scores(client, blobs):
    X, C, labels = blobs
    ref = metrics.cluster_scores(X, C)
    ref_sample = metrics.silhouette_score(X, C, sample_size=200, random_state=5)
    frame = dd.from_pandas(pd.DataFrame(X, columns=list("abcd")), npartitions=3)
    frame = frame[frame.a > -1e9]  # partition lengths unknown, as read from files
    for data in (da.from_array(X, chunks=(97, 4)), da.from_array(X, chunks=(500, 4)), frame):
        got = metrics.cluster_scores(data, C)
        assert got.calinski_harabasz == pytest.approx(ref.calinski_harabasz, rel=1e-10)
        assert got.davies_bouldin == pytest.approx(ref.davies_bouldin, rel=1e-10)
        assert got.simplified_silhouette == pytest.approx(ref.simplified_silhouette, rel=1e-10)
        np.testing.assert_array_equal(got.sizes, ref.sizes)
    # the sample's rows are keyed by global row index: the same rows whatever the chunks
    assert (
        metrics.silhouette_score(
            da.from_array(X, chunks=(97, 4)), C, sample_size=200, random_state=5
        )
        == ref_sample
    )
    assert metrics.silhouette_score(frame, C, sample_size=200, random_state=5) == ref_sample


def test_dask_labels_travel_with_the_rows(client, blobs):
    X, _, labels = blobs
    db = sk.davies_bouldin_score(X, labels)
    Xd, Ld = (
        da.from_array(X, chunks=(300, 4)),
        da.from_array(labels, chunks=170),
    )  # rechunked like X
    assert metrics.davies_bouldin_score(Xd, Ld) == pytest.approx(db, rel=1e-10)
    index = _sample_index(len(X), 250, 9)
    assert metrics.silhouette_score(Xd, labels, sample_size=250, random_state=9) == pytest.approx(
        sk.silhouette_score(X[index], labels[index]), rel=1e-12
    )
    # a DataFrame of unknown partition lengths with the labels a model predicts for it (same partitions)
    km = dkmeans.KMeans(5, random_state=0).fit(X)
    frame = dd.from_pandas(pd.DataFrame(X, columns=list("abcd")), npartitions=4)
    frame = frame[frame.a > -1e9]
    assert metrics.davies_bouldin_score(frame, km.predict(frame)) == pytest.approx(
        sk.davies_bouldin_score(X, km.predict(X)), rel=1e-10
    )


def test_weights_on_the_cluster_equal_weights_in_memory(client, blobs):
    X, C, _ = blobs
    w = np.random.default_rng(4).uniform(0, 2, len(X))
    ref = metrics.cluster_scores(X, C, sample_weight=w)
    got = metrics.cluster_scores(
        da.from_array(X, chunks=(250, 4)), C, sample_weight=da.from_array(w, chunks=400)
    )
    assert got.calinski_harabasz == pytest.approx(ref.calinski_harabasz, rel=1e-10)
    assert got.davies_bouldin == pytest.approx(ref.davies_bouldin, rel=1e-10)
    np.testing.assert_allclose(got.sizes, ref.sizes, rtol=1e-12)


def test_fitted_sizes_on_the_cluster_and_streamed(client, blobs):
    X, _, _ = blobs
    w = np.random.default_rng(5).uniform(0.5, 2, len(X))
    Xd = da.from_array(X, chunks=(300, 4))
    for out_of_core in (False, True):
        km = dkmeans.KMeans(5, random_state=2, out_of_core=out_of_core, max_iter=10).fit(
            Xd, sample_weight=w
        )
        labels = km.predict(X)
        np.testing.assert_allclose(
            km.cluster_sizes_, np.bincount(labels, w, minlength=5), rtol=1e-12
        )
        assert km.cluster_inertia_.sum() == pytest.approx(km.inertia_, rel=1e-12)
        assert km.imbalance_ == pytest.approx(
            5 * (km.cluster_sizes_**2).sum() / w.sum() ** 2, rel=1e-12
        )


def test_out_of_core_parquet_equals_in_memory(client, blobs, tmp_path):
    X, C, _ = blobs
    frame = pd.DataFrame(X, columns=list("abcd"))
    (tmp_path / "data").mkdir()
    frame.iloc[:500].to_parquet(tmp_path / "data" / "part0.parquet")
    frame.iloc[500:].to_parquet(tmp_path / "data" / "part1.parquet")
    ref = metrics.cluster_scores(X, C)
    ref_sample = metrics.silhouette_score(X, C, sample_size=150, random_state=1)
    with dask.config.set({"dkmeans.out-of-core": True}):
        files = dd.read_parquet(tmp_path / "data")
        got = metrics.cluster_scores(files, C)
        sample = metrics.silhouette_score(files, C, sample_size=150, random_state=1)
    assert got.calinski_harabasz == pytest.approx(ref.calinski_harabasz, rel=1e-10)
    assert got.davies_bouldin == pytest.approx(ref.davies_bouldin, rel=1e-10)
    assert got.simplified_silhouette == pytest.approx(ref.simplified_silhouette, rel=1e-10)
    np.testing.assert_array_equal(got.sizes, ref.sizes)
    assert got.n_passes == 2 and got.data_mode == "out-of-core" and ref.data_mode == "in-memory"
    assert sample == ref_sample
