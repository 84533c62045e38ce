"""scipy.sparse CSR input: the sparse kernels against the dense ones, and fits that never densify a chunk."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

import dkmeans
import dkmeans.engine.sparse_rows
from dkmeans import kernels
from dkmeans.errors import InvalidParameterError
from dkmeans.kernels.backends import sparse as sparse_kernels


def _csr(n=300, d=25, density=0.2, seed=0, dtype=np.float64):
    """Random CSR rows, none empty (cosine needs a direction), with a few rows repeated."""
    X = sp.random(n, d, density=density, format="csr", random_state=seed, dtype=dtype)
    X = X + sp.csr_matrix((np.ones(n, dtype), (np.arange(n), np.arange(n) % d)), shape=(n, d))
    return sp.vstack([X, X[:5]], format="csr")


def _clustered_csr(n_per=150, d=40, k=4, seed=0, dtype=np.float64):
    """Sparse rows in ``k`` groups with disjoint supports (well separated in both metrics)."""
    rng = np.random.default_rng(seed)
    blocks = []
    width = d // k
    for j in range(k):
        cols = rng.integers(j * width, (j + 1) * width, size=(n_per, 4))
        vals = rng.random((n_per, 4)) + 0.5
        rows = np.repeat(np.arange(n_per), 4)
        blocks.append(sp.csr_matrix((vals.ravel(), (rows, cols.ravel())), shape=(n_per, d)))
    X = sp.vstack(blocks, format="csr").astype(dtype)
    return X[rng.permutation(X.shape[0])]


# -- kernels: sparse against dense ------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_assign_matches_dense(dtype):
    X = _csr(dtype=dtype)
    C = X[[3, 40, 77, 150]].toarray() + 0.01
    labels, d2 = kernels.assign(X, C)
    ref_labels, _ = kernels.assign(X.toarray(), C)
    ref_d2 = ((X.toarray().astype(np.float64) - C[ref_labels].astype(np.float64)) ** 2).sum(axis=1)
    np.testing.assert_array_equal(labels, ref_labels)
    assert labels.dtype == np.int32 and d2.dtype == dtype
    np.testing.assert_allclose(d2, ref_d2, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-12)


def test_row_equal_to_its_centroid_is_at_distance_zero():
    X = _csr()
    C = X[[3, 40]].toarray()
    _, d2 = kernels.assign(X, C)
    assert d2[3] == 0.0 and d2[40] == 0.0
    far = kernels.farthest_points(X, C, 3, 0)
    assert not set(far.index.tolist()) & {3, 40}


def test_partials_match_dense_with_weights():
    X = _csr()
    C = X[[3, 40, 77]].toarray()
    w = np.random.default_rng(1).random(X.shape[0])
    for weights in (None, w):
        p = kernels.assign_partials(X, C, weights)
        q = kernels.assign_partials(X.toarray(), C, weights)
        np.testing.assert_allclose(p.sums, q.sums, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(p.counts, q.counts, rtol=1e-12)
        np.testing.assert_allclose(p.objective, q.objective, rtol=1e-10)


def test_tiles_and_centroid_blocks_do_not_change_results(monkeypatch):
    """A tiny scratch budget (one row per tile) and blocks of 3 centroids give the same answer."""
    X = _csr()
    C = np.random.default_rng(2).random((10, X.shape[1]))
    labels, d2 = kernels.assign(X, C)
    partials = kernels.assign_partials(X, C)
    monkeypatch.setattr(sparse_kernels, "MAX_CENTROID_BLOCK", 3)
    labels_t, d2_t = kernels.assign(X, C, scratch_bytes=1)
    partials_t = kernels.assign_partials(X, C, scratch_bytes=1)
    np.testing.assert_array_equal(labels_t, labels)
    np.testing.assert_allclose(d2_t, d2, rtol=1e-12)
    np.testing.assert_allclose(partials_t.sums, partials.sums, rtol=1e-12, atol=1e-12)
    assert sparse_kernels._tile_rows(X, 10, 1) == 1


def test_distances_and_seeding_kernels_match_dense():
    X = _csr()
    Xd = X.toarray()
    C = Xd[[3, 40, 77]] + 0.1
    w = np.random.default_rng(3).random(X.shape[0])
    np.testing.assert_allclose(
        kernels.distances(X, C), np.sqrt(((Xd[:, None] - C[None]) ** 2).sum(-1)), rtol=1e-10
    )
    np.testing.assert_allclose(
        kernels.sq_distances(X, C), kernels.sq_distances(Xd, C), rtol=1e-10, atol=1e-12
    )
    for a, b in [
        (kernels.farthest_points(X, C, 4, 100, w), kernels.farthest_points(Xd, C, 4, 100, w)),
        (kernels.random_top_rows(X, w, 10, 5, 7, 1), kernels.random_top_rows(Xd, w, 10, 5, 7, 1)),
    ]:
        np.testing.assert_array_equal(a.index, b.index)
        np.testing.assert_array_equal(a.rows, b.rows)
        assert isinstance(a.rows, np.ndarray)
    d2 = kernels.assign(Xd, C)[1].astype(np.float64)
    top, phi = kernels.oversample_scores(X, w, 0, d2, 5, 2, 6)
    top_d, phi_d = kernels.oversample_scores(Xd, w, 0, d2, 5, 2, 6)
    np.testing.assert_array_equal(top.rows, top_d.rows)
    trial = kernels.kpp_trials(X, w, 0, d2, C[:2], 5, 3, 4)
    trial_d = kernels.kpp_trials(Xd, w, 0, d2, C[:2], 5, 3, 4)
    np.testing.assert_allclose(trial.potentials, trial_d.potentials, rtol=1e-10)
    labels = kernels.assign(X, C)[0]
    sums, counts = kernels.cluster_sums(X, labels, 3, w)
    sums_d, counts_d = kernels.cluster_sums(Xd, labels, 3, w)
    np.testing.assert_allclose(sums, sums_d, rtol=1e-12, atol=1e-12)


def test_column_moments_match_dense_and_explicit_zeros_count_once():
    X = _csr()
    X.data[::7] = 0.0  # explicit zeros are values like any other
    m, m_d = kernels.column_moments(X), kernels.column_moments(X.toarray())
    np.testing.assert_allclose(m.mean, m_d.mean, rtol=1e-12)
    np.testing.assert_allclose(m.m2, m_d.m2, rtol=1e-10)
    assert float(m.count) == X.shape[0]


def test_non_canonical_and_csc_rows_are_handled():
    rows, cols = np.array([0, 0, 1, 2]), np.array([1, 1, 0, 2])  # a duplicate (0, 1): summed
    X = sp.csr_matrix((np.array([1.0, 2.0, 4.0, 5.0]), (rows, cols)), shape=(3, 3))
    X.has_canonical_format = False
    X = sp.csr_matrix((X.data, X.indices, X.indptr), shape=X.shape)
    C = np.array([[0.0, 3.0, 0.0], [4.0, 0.0, 0.0]])
    labels, d2 = kernels.assign(X, C)
    np.testing.assert_array_equal(labels, [0, 1, 0])
    assert d2[0] == 0.0 and d2[1] == 0.0
    np.testing.assert_array_equal(kernels.take_rows(X.tocsc(), [0]), [[0.0, 3.0, 0.0]])


# -- fits: the same result as the dense path --------------------------------------------
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_fit_predict_transform_match_dense(client, metric):
    X = _clustered_csr()
    C0 = X[[0, 1, 2, 3]].toarray()
    w = np.random.default_rng(4).random(X.shape[0]) + 0.5
    for weights in (None, w):
        params = dict(n_clusters=4, init=C0, metric=metric, max_iter=50, tol=0.0)
        a = dkmeans.KMeans(**params).fit(X, sample_weight=weights)
        b = dkmeans.KMeans(**params).fit(X.toarray(), sample_weight=weights)
        np.testing.assert_array_equal(a.labels_, b.labels_)
        np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a.inertia_, b.inertia_, rtol=1e-10)
        assert a.n_iter_ == b.n_iter_
        np.testing.assert_array_equal(a.predict(X), b.predict(X.toarray()))
        np.testing.assert_allclose(a.transform(X), b.transform(X.toarray()), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(
            a.score(X, sample_weight=weights),
            b.score(X.toarray(), sample_weight=weights),
            rtol=1e-10,
        )


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_dask_array_of_csr_chunks(client, metric):
    """A Dask array of CSR chunks: seeded fit, lazy labels and inference, the in-memory result."""
    X = _clustered_csr(dtype=np.float32)
    Xd = da.from_array(
        X,
        chunks=(97, X.shape[1]),
        asarray=False,
        meta=sp.csr_matrix((0, X.shape[1]), dtype=X.dtype),
    )
    params = dict(n_clusters=4, metric=metric, random_state=5)
    a = dkmeans.KMeans(**params).fit(Xd)
    b = dkmeans.KMeans(**params).fit(X)
    assert isinstance(a.labels_, da.Array)
    np.testing.assert_array_equal(a.labels_.compute(), b.labels_)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-5, atol=1e-6)
    assert a.cluster_centers_.dtype == np.float32
    np.testing.assert_array_equal(a.predict(Xd).compute(), b.labels_)
    transformed = a.transform(Xd)
    assert isinstance(transformed, da.Array)
    np.testing.assert_allclose(transformed.compute(), b.transform(X), rtol=1e-5, atol=1e-6)


def _forbid_densify(forbid: bool):
    """Make ``toarray``/``todense`` of every scipy.sparse class raise (or restore them); runs on workers too."""
    import scipy.sparse as sps

    classes = (
        sps.csr_matrix,
        sps.csc_matrix,
        sps.coo_matrix,
        sps.csr_array,
        sps.csc_array,
        sps.coo_array,
    )
    saved = getattr(sps, "_dkmeans_saved", None)
    if forbid and saved is None:
        saved = {
            (cls, name): cls.__dict__.get(name)
            for cls in classes
            for name in ("toarray", "todense")
        }
        sps._dkmeans_saved = saved

        def refuse(self, *args, **kwargs):
            raise AssertionError(f"a {type(self).__name__} of shape {self.shape} was densified")

        for cls, name in saved:
            setattr(cls, name, refuse)
    elif not forbid and saved is not None:
        for (cls, name), original in saved.items():
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        del sps._dkmeans_saved
    return True


@pytest.fixture
def no_densify(client):
    client.run(_forbid_densify, True)
    _forbid_densify(True)
    try:
        yield
    finally:
        _forbid_densify(False)
        client.run(_forbid_densify, False)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random", "random-partition"])
def test_no_chunk_is_densified(client, no_densify, metric, init):
    """fit, predict, transform and score with toarray/todense raising on the client and every worker."""
    X = _clustered_csr()
    with pytest.raises(AssertionError, match="densified"):  # the guard is in place here ...
        X.toarray()
    assert all(
        client.run(
            lambda: __import__("scipy.sparse").sparse.csr_matrix.toarray.__name__ == "refuse"
        ).values()
    )
    Xd = da.from_array(X, chunks=(101, X.shape[1]), asarray=False, meta=X[:0])
    w = np.random.default_rng(6).random(X.shape[0]) + 0.1
    for data in (X, Xd):
        km = dkmeans.KMeans(n_clusters=4, init=init, metric=metric, random_state=0, n_init=1).fit(
            data, sample_weight=w
        )
        labels = km.predict(data)
        distances = km.transform(data)
        score = km.score(data)
        if isinstance(data, da.Array):
            labels, distances = labels.compute(), distances.compute()
        assert (
            labels.shape == (X.shape[0],)
            and distances.shape == (X.shape[0], 4)
            and np.isfinite(score)
        )


def test_single_task_and_out_of_core_modes(client, single_task):
    """The modes a small and a large fit take: one task (chunks stacked as CSR) and streamed from the source."""
    X = _clustered_csr()
    Xd = da.from_array(X, chunks=(101, X.shape[1]), asarray=False, meta=X[:0])
    dkmeans.KMeans(n_clusters=4, random_state=1, out_of_core=False).fit(X)
    assert "lloyd_iterations" in single_task
    for metric in ("euclidean", "cosine"):
        base = dkmeans.KMeans(n_clusters=4, random_state=1, metric=metric, out_of_core=False).fit(
            Xd
        )
        streamed = dkmeans.KMeans(
            n_clusters=4, random_state=1, metric=metric, out_of_core=True
        ).fit(Xd)
        assert streamed.data_mode_ == "out-of-core"
        np.testing.assert_allclose(
            streamed.cluster_centers_, base.cluster_centers_, rtol=1e-10, atol=1e-12
        )
        np.testing.assert_array_equal(streamed.labels_.compute(), base.labels_.compute())


def test_other_sparse_formats_are_taken_as_csr(client):
    X = _clustered_csr()
    ref = dkmeans.KMeans(n_clusters=4, random_state=2).fit(X)
    for other in (X.tocsc(), X.tocoo(), sp.csr_array(X)):
        km = dkmeans.KMeans(n_clusters=4, random_state=2).fit(other)
        np.testing.assert_array_equal(km.labels_, ref.labels_)
        np.testing.assert_array_equal(km.predict(other), ref.labels_)


def test_wide_sparse_chunks_are_planned_by_their_stored_bytes(client):
    """Counted as dense, each chunk would be 4 GB, more than a worker's task budget (ChunkTooLargeError)."""
    n, d = 1000, 2_000_000
    rng = np.random.default_rng(7)
    cols = rng.integers(0, d, size=(n, 8))
    cols[: n // 2, 0], cols[n // 2 :, 0] = 0, 1  # two groups
    X = sp.csr_matrix(
        (rng.random(n * 8).astype(np.float32) + 1, (np.repeat(np.arange(n), 8), cols.ravel())),
        shape=(n, d),
    )
    C0 = X[[0, n - 1]].toarray()
    km = dkmeans.KMeans(n_clusters=2, init=C0, max_iter=5, metric="cosine").fit(X)
    assert km.data_mode_ == "in-memory" and km.cluster_centers_.shape == (2, d)
    per_row = dkmeans.engine.sparse_rows.sparse_row_bytes(
        client, da.from_array(X, chunks=(500, d), asarray=False, meta=X[:0])
    )
    assert per_row < 200 < d * 4


@pytest.mark.parametrize(
    "params, match",
    [
        ({"algorithm": "hartigan"}, "Hartigan"),
        ({"refine": "hartigan"}, "Hartigan"),
        ({"local_search": True}, "local_search=True"),
        ({"device": "gpu"}, "sparse"),
    ],
)
def test_unsupported_with_sparse_input(client, params, match):
    with pytest.raises(InvalidParameterError, match=match):
        dkmeans.KMeans(n_clusters=3, random_state=0, **params).fit(_csr())


def test_local_search_auto_is_off_for_sparse_input(client):
    km = dkmeans.KMeans(n_clusters=4, random_state=0, local_search="auto").fit(_clustered_csr())
    assert all(record["algorithm"] != "local-search" for record in km.history_)
