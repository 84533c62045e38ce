"""``sweep(method="bisecting")``: every k from one bisecting fit, scored as scikit-learn scores it,
the suggested k refitted as ``KMeans`` fits it alone."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score, silhouette_score

import dkmeans
from dkmeans import BisectingKMeans, KMeans
from dkmeans.errors import InvalidParameterError
from dkmeans.fit.krules import answers, bic_score
from dkmeans.testing import make_blobs


@pytest.fixture(scope="module")
def blobs():
    X, _, _ = make_blobs(900, 3, 5, spread=1.0, box=10.0, seed=2)
    return X


def _nearest(X, C):
    d2 = ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)
    return d2.argmin(1), float(d2.min(1).sum())


def test_each_k_is_the_tree_s_centroids_scored_as_scikit_learn_scores_them(blobs):
    """Per k: the tree's first k - 1 splits, every row at its nearest centre; the indices of
    scikit-learn on those labels, the objective a float64 sum by hand, the silhouette of all
    rows."""
    ks = [2, 3, 5, 7]
    result = dkmeans.sweep(
        blobs, ks, random_state=4, method="bisecting", silhouette_rows=len(blobs)
    )
    tree = result.tree
    assert result.method == "bisecting" and isinstance(tree, BisectingKMeans)
    reference = BisectingKMeans(7, random_state=result.random_state).fit(blobs)
    np.testing.assert_array_equal(tree.cluster_centers_, reference.cluster_centers_)
    for k in ks:
        labels, objective = _nearest(blobs, tree.cluster_centers_at(k))
        m = result.metrics[k]
        assert result.objective[k] == pytest.approx(objective, rel=1e-10)
        # the nearest centre never costs more than the tree's own leaf
        assert result.objective[k] <= tree.inertia_per_k_[k - 1] * (1 + 1e-12)
        want = calinski_harabasz_score(blobs, labels)
        assert m["calinski_harabasz"] == pytest.approx(want, rel=1e-9)
        assert m["davies_bouldin"] == pytest.approx(davies_bouldin_score(blobs, labels), rel=1e-9)
        assert m["silhouette"] == pytest.approx(silhouette_score(blobs, labels), rel=1e-9)
        sizes = np.bincount(labels, minlength=k)
        assert m["bic"] == pytest.approx(bic_score(sizes, objective, 3), rel=1e-9)
        ref = result.reference
        assert m["gap"] == pytest.approx(ref.mean_log[k] - np.log(objective / len(blobs)), rel=1e-9)
    assert result.answers == answers(result.scores)


def test_the_suggested_k_is_refitted_as_kmeans_fits_it_alone(blobs):
    result = dkmeans.sweep(blobs, [2, 3, 5, 8, 12], random_state=0, method="bisecting")
    assert result.suggested_k == 5, result.rule
    assert list(result.models) == [5]
    single = KMeans(5, random_state=0).fit(blobs)
    model = result.models[5]
    np.testing.assert_array_equal(model.cluster_centers_, single.cluster_centers_)
    np.testing.assert_array_equal(model.labels_, single.labels_)
    # the same answer as the refit of every k
    assert dkmeans.sweep(blobs, [2, 3, 5, 8, 12], random_state=0).suggested_k == 5
    table = result.format_table()
    assert "one bisecting fit of" in table and "the refit of k = 5" in table
    # the tree's passes, the refit's, and the scores' (two combined passes, more where the gap's
    # reference fits outlast them)
    scoring = result.n_passes - result.tree.n_passes_ - model.n_passes_
    assert 2 <= scoring <= result.reference.n_passes + 1


def test_the_issue_s_eight_blobs_and_uniform_data():
    X, _, _ = make_blobs(6000, 6, 8, spread=1.0, box=10.0, seed=36)
    result = dkmeans.sweep(X, [2, 3, 4, 6, 8, 10, 12], random_state=0, method="bisecting")
    assert result.suggested_k == 8, result.rule
    U = np.random.default_rng(0).uniform(size=(3000, 3))
    none = dkmeans.sweep(U, [2, 3, 4, 6, 8], random_state=0, method="bisecting")
    assert none.suggested_k is None and none.rule.startswith("no clear k") and none.models == {}
    assert "suggested k: none" in none.format_table()


def test_weights_and_a_dask_array_on_the_cluster(client, blobs):
    """Integer weights are repeated rows: the same tree scores as on the repeated data."""
    w = np.random.default_rng(1).integers(1, 3, len(blobs)).astype(np.float64)
    X = da.from_array(blobs, chunks=(300, 3))
    result = dkmeans.sweep(
        X, [2, 5], random_state=1, method="bisecting", sample_weight=w, silhouette_rows=0
    )
    assert result.data_mode == "in-memory"
    repeated = np.repeat(blobs, w.astype(int), axis=0)
    for k in (2, 5):
        labels, objective = _nearest(repeated, result.tree.cluster_centers_at(k))
        assert result.objective[k] == pytest.approx(objective, rel=1e-9)
        assert result.metrics[k]["calinski_harabasz"] == pytest.approx(
            calinski_harabasz_score(repeated, labels), rel=1e-9
        )


@pytest.mark.parametrize(
    "params, message",
    [
        ({"method": "tree"}, "method must be one of 'refit', 'bisecting'"),
        ({"method": "bisecting", "metric": "cosine"}, "method='bisecting' is Euclidean"),
        ({"method": "bisecting", "init": "bogus"}, "init"),
    ],
)
def test_what_the_bisecting_sweep_refuses(blobs, params, message):
    with pytest.raises(InvalidParameterError, match=message):
        dkmeans.sweep(blobs, [2, 3], random_state=0, **params)


def test_sparse_rows_scored_as_scikit_learn_scores_the_dense_rows():
    """CSR rows: the tree's centres scored on the dense rows' labels; no gap, no silhouette."""
    import scipy.sparse as sp

    X = sp.random(400, 12, density=0.3, format="csr", random_state=0, dtype=np.float64)
    result = dkmeans.sweep(X, [2, 3, 4], random_state=0, method="bisecting")
    dense = X.toarray()
    for k in (2, 3, 4):
        labels, objective = _nearest(dense, result.tree.cluster_centers_at(k))
        assert result.objective[k] == pytest.approx(objective, rel=1e-9)
        assert result.metrics[k]["davies_bouldin"] == pytest.approx(
            davies_bouldin_score(dense, labels), rel=1e-9
        )
    assert result.reference is None and result.answers["gap"] is None
    assert result.suggested_k in result.models
    assert "no test for data without clusters" in result.rule


def test_out_of_core_equals_in_memory(client, blobs):
    """Rows read from their source in every pass: the same tree, scores and suggestion."""
    X = da.from_array(blobs, chunks=(300, 3))
    ks = [2, 4, 5]
    streamed = dkmeans.sweep(X, ks, random_state=2, method="bisecting", out_of_core=True)
    local = dkmeans.sweep(blobs, ks, random_state=2, method="bisecting")
    assert streamed.data_mode == "out-of-core" and local.data_mode == "in-memory"
    np.testing.assert_allclose(
        streamed.tree.cluster_centers_, local.tree.cluster_centers_, rtol=1e-10
    )
    for k in ks:
        assert streamed.objective[k] == pytest.approx(local.objective[k], rel=1e-10)
        assert streamed.metrics[k]["gap"] == pytest.approx(local.metrics[k]["gap"], rel=1e-9)
    assert streamed.suggested_k == local.suggested_k == 5
    assert streamed.models[5].data_mode_ == "out-of-core"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    ks=st.sets(st.integers(1, 9), min_size=1, max_size=4),
    n=st.integers(12, 120),
    d=st.integers(1, 4),
)
def test_any_grid_is_the_tree_s_cuts_at_their_nearest_centres(seed, ks, n, d):
    """Shapes, grids (k = 1 too), seeds: each k's objective is its cut's at the nearest centres,
    never above the tree's own; the suggestion is a k of the grid or none."""
    X = np.random.default_rng(seed).normal(size=(n, d)) * np.arange(1, d + 1)
    result = dkmeans.sweep(
        X, sorted(ks), random_state=seed, method="bisecting", reference_draws=0, silhouette_rows=0
    )
    for k in ks:
        centres = result.tree.cluster_centers_at(k)
        assert centres.shape == (k, d)
        _, objective = _nearest(X, centres)
        assert result.objective[k] == pytest.approx(objective, rel=1e-9, abs=1e-12)
        assert result.objective[k] <= result.tree.inertia_per_k_[k - 1] * (1 + 1e-9) + 1e-12
    assert result.suggested_k is None or result.suggested_k in ks
    assert list(result.models) == ([] if result.suggested_k is None else [result.suggested_k])
