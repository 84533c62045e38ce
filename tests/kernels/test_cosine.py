"""Cosine (spherical) k-means: against a float64 NumPy reference and hand-computed toys, and its invariances."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

import dkmeans
from dkmeans import kernels
from dkmeans.drivers.lloyd import CentroidShift, lloyd_iterations
from dkmeans.drivers.state import LoopState
from dkmeans.engine.local import ChunkList
from dkmeans.errors import InvalidDataError, InvalidParameterError
from dkmeans.kernels.cosine import ZERO_MEAN_NORM, cosine_distances, normalize_rows, unit_centroids


def _unit(A):
    A = np.asarray(A, dtype=np.float64)
    return A / np.linalg.norm(A, axis=-1, keepdims=True)


def reference_spherical_kmeans(X, C0, weights=None, max_iter=100):
    """Spherical k-means in float64 NumPy (Dhillon and Modha): labels, unit centroids, sum w (1 - cos)."""
    Xn = _unit(X)
    w = np.ones(len(X)) if weights is None else np.asarray(weights, dtype=np.float64)
    C = _unit(C0)
    for _ in range(max_iter):
        labels = np.argmax(Xn @ C.T, axis=1)
        sums = np.zeros_like(C)
        np.add.at(sums, labels, w[:, None] * Xn)
        new = _unit(sums)
        if np.array_equal(new, C):
            break
        C = new
    labels = np.argmax(Xn @ C.T, axis=1)
    cos = np.sum(Xn * C[labels], axis=1)
    return labels, C, float(np.sum(w * (1 - cos)))


def directions(n_per=200, d=6, k=4, seed=0, spread=0.25, dtype=np.float32):
    """Rows around ``k`` random directions, with norms spread over two orders of magnitude."""
    rng = np.random.default_rng(seed)
    centres = _unit(rng.normal(size=(k, d)))
    X = np.concatenate([centres[j] + spread * rng.normal(size=(n_per, d)) for j in range(k)])
    X *= rng.uniform(0.1, 10.0, size=(len(X), 1))
    order = rng.permutation(len(X))
    return X[order].astype(dtype)


# -- the hand-computed toy (Spark's and faiss's definitions) -----------------------------
# Spark's CosineDistanceMeasure and faiss's spherical Clustering agree: rows are compared by
# 1 - cos (Spark normalises the rows, faiss expects unit rows), a centroid is the mean of its
# unit rows, normalised. With C0 = e1, e2 the toy below converges in one update.
TOY = np.array([[3.0, 0.0], [2.0, 1.0], [0.0, 5.0], [1.0, 3.0]])
TOY_C0 = np.array([[1.0, 0.0], [0.0, 1.0]])


def _toy_expected(w):
    """By hand: p1, p2 -> cluster 0 and p3, p4 -> cluster 1, so
    c0 ~ w1 e1 + w2 (2, 1)/sqrt(5) and c1 ~ w3 e2 + w4 (1, 3)/sqrt(10)."""
    s5, s10 = np.sqrt(5.0), np.sqrt(10.0)
    c0 = np.array([w[0] + w[1] * 2 / s5, w[1] * 1 / s5])
    c1 = np.array([w[3] * 1 / s10, w[2] + w[3] * 3 / s10])
    c0, c1 = c0 / np.hypot(*c0), c1 / np.hypot(*c1)
    cos = [c0[0], (2 * c0[0] + c0[1]) / s5, c1[1], (c1[0] + 3 * c1[1]) / s10]
    return np.array([0, 0, 1, 1]), np.array([c0, c1]), float(np.dot(w, 1 - np.array(cos)))


@pytest.mark.parametrize("weights", [None, [1.0, 3.0, 1.0, 2.0]])
def test_hand_computed_toy(client, weights):
    w = np.ones(4) if weights is None else np.asarray(weights)
    labels, centres, objective = _toy_expected(w)
    km = dkmeans.KMeans(n_clusters=2, init=TOY_C0, metric="cosine", tol=0.0).fit(
        TOY, sample_weight=weights
    )
    np.testing.assert_array_equal(km.labels_, labels)
    np.testing.assert_allclose(km.cluster_centers_, centres, rtol=1e-12)
    np.testing.assert_allclose(km.inertia_, objective, rtol=1e-12)
    # the Euclidean means of the same clusters are other points: (2.5, 0.5) is not (c0 scaled)
    assert not np.allclose(_unit([[2.5, 0.5]]), centres[:1])
    cos = TOY @ centres.T / np.linalg.norm(TOY, axis=1)[:, None]
    np.testing.assert_allclose(km.transform(TOY), 1 - cos, atol=1e-12)
    np.testing.assert_array_equal(km.predict(TOY * 7.0), labels)
    np.testing.assert_allclose(-km.score(TOY, sample_weight=weights), objective, rtol=1e-12)


def test_functional_train_and_infer_on_the_toy(client):
    labels, centres, objective = _toy_expected(np.ones(4))
    desc = dkmeans.Descriptor(
        cluster_count=2, max_iteration_count=10, dtype=np.float64, metric="cosine"
    )
    result = dkmeans.train(desc, TOY, TOY_C0)
    np.testing.assert_allclose(result.model.centroids, centres, rtol=1e-12)
    np.testing.assert_allclose(result.objective_function_value, objective, rtol=1e-12)
    np.testing.assert_allclose(
        result.history[-1].objective, objective, rtol=1e-12
    )  # the loop reports 1 - cos too
    inferred = dkmeans.infer(desc, result.model, TOY * 3.0)
    np.testing.assert_array_equal(inferred.labels, labels)
    np.testing.assert_allclose(inferred.objective_function_value, objective, rtol=1e-12)


# -- against the float64 reference ----------------------------------------------------------
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_numpy_reference(client, weighted):
    X = directions()
    C0 = X[[0, 1, 2, 3]]
    w = np.random.default_rng(1).uniform(0.2, 3.0, len(X)) if weighted else None
    ref_labels, ref_C, ref_objective = reference_spherical_kmeans(X, C0, w)
    km = dkmeans.KMeans(n_clusters=4, init=C0, metric="cosine", tol=0.0, max_iter=100).fit(
        X, sample_weight=w
    )
    assert km.cluster_centers_.dtype == np.float32
    np.testing.assert_array_equal(km.labels_, ref_labels)
    np.testing.assert_allclose(km.cluster_centers_, ref_C, atol=2e-6)
    np.testing.assert_allclose(
        np.linalg.norm(km.cluster_centers_.astype(np.float64), axis=1), 1.0, atol=1e-6
    )
    np.testing.assert_allclose(km.inertia_, ref_objective, rtol=1e-5)
    cos = _unit(X) @ _unit(km.cluster_centers_).T
    np.testing.assert_allclose(km.transform(X), 1 - cos, atol=2e-6)
    np.testing.assert_array_equal(km.predict(X), ref_labels)


def test_integer_weights_equal_repeated_rows(client):
    X = directions(n_per=60, dtype=np.float64)
    w = np.random.default_rng(2).integers(1, 4, len(X))
    C0 = X[:4]
    a = dkmeans.KMeans(n_clusters=4, init=C0, metric="cosine", tol=0.0).fit(X, sample_weight=w)
    b = dkmeans.KMeans(n_clusters=4, init=C0, metric="cosine", tol=0.0).fit(np.repeat(X, w, axis=0))
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.inertia_, b.inertia_, rtol=1e-10)


# -- invariances -------------------------------------------------------------------------
def test_row_scaling_changes_nothing(client):
    X = directions(dtype=np.float64)
    scale = np.random.default_rng(3).uniform(1e-3, 1e3, size=(len(X), 1))
    for init in ("k-means||", "k-means++", "random"):
        a = dkmeans.KMeans(n_clusters=4, init=init, metric="cosine", random_state=4).fit(X)
        b = dkmeans.KMeans(n_clusters=4, init=init, metric="cosine", random_state=4).fit(X * scale)
        np.testing.assert_array_equal(a.labels_, b.labels_)
        np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, atol=1e-12)
        np.testing.assert_allclose(a.inertia_, b.inertia_, rtol=1e-10)


def test_chunking_and_worker_count_change_nothing(client, single_worker_client):
    X = directions(n_per=500)
    runs = []
    for chunks, c in [(250, client), (777, client), (2000, single_worker_client)]:
        with c.as_current():
            km = dkmeans.KMeans(n_clusters=4, metric="cosine", random_state=5).fit(
                da.from_array(X, chunks=(chunks, 6))
            )
            runs.append((km.cluster_centers_, km.labels_.compute(), km.inertia_))
    for C, labels, inertia in runs[1:]:
        np.testing.assert_allclose(C, runs[0][0], atol=1e-6)
        np.testing.assert_array_equal(labels, runs[0][1])
        np.testing.assert_allclose(inertia, runs[0][2], rtol=1e-5)


def test_seedings_give_unit_centroids_and_run_out_of_core(client):
    X = directions(n_per=100)
    for init in ("k-means||", "k-means++", "random", "random-partition"):
        km = dkmeans.KMeans(
            n_clusters=4, init=init, metric="cosine", random_state=6, max_iter=1
        ).fit(X)
        np.testing.assert_allclose(
            np.linalg.norm(km.cluster_centers_.astype(np.float64), axis=1), 1.0, atol=1e-6
        )
    a = dkmeans.KMeans(n_clusters=4, metric="cosine", random_state=6, out_of_core=False).fit(
        da.from_array(X, 97)
    )
    b = dkmeans.KMeans(n_clusters=4, metric="cosine", random_state=6, out_of_core=True).fit(
        da.from_array(X, 97)
    )
    assert b.data_mode_ == "out-of-core"
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, atol=1e-6)
    np.testing.assert_allclose(a.inertia_, b.inertia_, rtol=1e-6)


def test_tol_is_relative_to_the_variance_of_the_normalised_rows(client):
    X = directions(dtype=np.float64, spread=0.6)
    tol = 1e-3
    km = dkmeans.KMeans(n_clusters=4, init=X[:4], metric="cosine", tol=tol).fit(X)
    bound = tol * np.mean(np.var(_unit(X), axis=0))
    shifts = [r["centroid_shift"] for r in km.history_]
    assert km.stop_reason_ == "centroid-shift"
    assert shifts[-1] <= bound < shifts[-2]


def test_dask_dataframe_labels_and_transform(client):
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    X = directions(n_per=50, dtype=np.float64)
    df = dd.from_pandas(pd.DataFrame(X, columns=[f"f{i}" for i in range(6)]), npartitions=3)
    ref = dkmeans.KMeans(n_clusters=4, init=X[:4], metric="cosine").fit(X)
    km = dkmeans.KMeans(n_clusters=4, init=X[:4], metric="cosine").fit(df)
    np.testing.assert_array_equal(km.labels_.compute().to_numpy(), ref.labels_)
    np.testing.assert_allclose(km.transform(df).compute().to_numpy(), ref.transform(X), atol=1e-12)


# -- rules: zero rows, cancelling clusters, what cosine does not do -----------------------
ZERO_ROW = "norm zero"


def test_zero_rows_are_refused(client):
    X = directions(n_per=20, dtype=np.float64)
    bad = X.copy()
    bad[33] = 0.0
    km = dkmeans.KMeans(n_clusters=3, metric="cosine", random_state=0)
    for data in (bad, da.from_array(bad, chunks=10), sp.csr_matrix(bad)):
        with pytest.raises(InvalidDataError, match=ZERO_ROW):
            km.fit(data)
        assert not hasattr(km, "cluster_centers_")
    km.fit(X)
    with pytest.raises(InvalidDataError, match=ZERO_ROW):
        km.predict(bad)
    with pytest.raises(InvalidDataError, match=ZERO_ROW):
        km.transform(bad)
    with pytest.raises(InvalidDataError, match=ZERO_ROW):
        km.predict(da.from_array(bad, chunks=10)).compute()
    with pytest.raises(InvalidDataError, match="norm zero"):
        dkmeans.KMeans(n_clusters=2, init=np.array([[1.0] * 6, [0.0] * 6]), metric="cosine").fit(X)


def test_nan_is_still_reported_as_nan(client):
    X = directions(n_per=20, dtype=np.float64)
    X[5, 2] = np.nan
    with pytest.raises(InvalidDataError, match="NaN"):
        dkmeans.KMeans(n_clusters=3, metric="cosine", random_state=0).fit(X)


def test_cluster_whose_rows_cancel_takes_the_farthest_row():
    """Cluster 0 gets e1 and -e1 (ties go to the lower index): their mean is zero, so it is treated as empty."""
    e = np.eye(3)
    X = np.array([e[0], -e[0], e[1], e[2]])
    C0 = np.array([[0.0, 0.0, -1.0], _unit([0.0, 0.6, 0.8])])
    result = lloyd_iterations(
        ChunkList.from_array(X), LoopState(C0), 1, CentroidShift(0.0), metric="cosine"
    )
    assert result.history[0].empty_clusters_fixed == 1
    np.testing.assert_array_equal(
        result.centroids[0], e[0]
    )  # farthest from c1 = (e2 + e3)/sqrt 2, lower index
    np.testing.assert_allclose(result.centroids[1], _unit([0.0, 1.0, 1.0]))


def test_unit_centroids_rule(xp):
    partials = kernels.Partials(
        xp.asarray([[3.0, 4.0], [1e-12, 0.0], [0.0, 0.0]]),
        xp.asarray([2.0, 2.0, 0.0]),
        xp.asarray(0.0),
    )
    previous = xp.asarray([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    C, empty = unit_centroids(partials, previous)
    assert ZERO_MEAN_NORM > 5e-13
    np.testing.assert_array_equal(_host(empty), [False, True, True])
    np.testing.assert_allclose(_host(C), [[0.6, 0.8], [0.0, 1.0], [0.6, 0.8]])


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def test_normalize_and_distances_kernels(xp):
    X = np.array([[3.0, 4.0], [1e300, 1e300], [-2.0, 0.0]], dtype=np.float64)
    out = normalize_rows(xp.asarray(X))
    np.testing.assert_allclose(
        _host(out), [[0.6, 0.8], [2**-0.5, 2**-0.5], [-1.0, 0.0]], rtol=1e-15
    )
    X32 = X[[0, 2]].astype(np.float32)
    assert normalize_rows(xp.asarray(X32)).dtype == np.float32
    C = np.array([[1.0, 0.0], [0.0, 2.0]])
    np.testing.assert_allclose(
        _host(cosine_distances(xp.asarray(X32), xp.asarray(C))), [[0.4, 0.2], [2.0, 1.0]], atol=1e-7
    )
    # on unit rows and centroids the Euclidean kernels give 2 (1 - cos): the seedings' D^2 draws
    Xn, Cn = normalize_rows(xp.asarray(X32)), xp.asarray(_unit(C).astype(np.float32))
    d2 = _host(kernels.update_nearest(Xn, None, Cn, 0).sq_dist)
    np.testing.assert_allclose(d2, 2 * np.array([0.2, 1.0]), atol=1e-6)
    with pytest.raises(InvalidDataError, match=ZERO_ROW):
        normalize_rows(xp.zeros((2, 3)))


def test_sparse_normalize_keeps_sparsity():
    X = sp.csr_matrix(np.array([[3.0, 0.0, 4.0], [0.0, 0.0, 2.0]], dtype=np.float32))
    out = normalize_rows(X)
    assert sp.issparse(out) and out.nnz == X.nnz and out.dtype == np.float32
    np.testing.assert_allclose(out.toarray(), [[0.6, 0.0, 0.8], [0.0, 0.0, 1.0]], rtol=1e-7)
    with pytest.raises(InvalidDataError, match=ZERO_ROW):
        normalize_rows(sp.csr_matrix((2, 3)))


@pytest.mark.parametrize(
    "params, match",
    [
        ({"algorithm": "hartigan"}, "Hartigan"),
        ({"refine": "hartigan"}, "Hartigan"),
        ({"local_search": True}, "local_search=True"),
        ({"metric": "manhattan"}, "metric"),
    ],
)
def test_unsupported_with_cosine(client, params, match):
    with pytest.raises(InvalidParameterError, match=match):
        dkmeans.KMeans(n_clusters=3, random_state=0, **{"metric": "cosine", **params}).fit(
            directions(n_per=10)
        )


def test_save_and_load_keep_the_metric(client, tmp_path):
    X = directions(n_per=40)
    km = dkmeans.KMeans(n_clusters=4, metric="cosine", random_state=7).fit(X)
    loaded = dkmeans.KMeans.load(km.save(tmp_path / "model.npz"))
    assert loaded.metric == "cosine"
    np.testing.assert_array_equal(loaded.predict(X * 5), km.labels_)
    np.testing.assert_allclose(loaded.transform(X), km.transform(X))


# -- exact ties: the lowest centroid index on every path (issue 29) ------------------------
TIED = (1, 3, 4)  # the centroids with the largest, exactly equal, dot product with TIE_FEATURE
TIE_FEATURE = 6  # features 0..5: one per centroid (norms); 7..: zero in every centroid
ASSIGN_PATHS = [
    ("off", "auto"),
    ("eager", "auto"),
    ("eager", "blas"),
]  # NumPy, compiled direct, BLAS


def tie_centroids(dtype, d, k=6):
    """Unit centroids (to rounding) whose squared norms decrease with the index, by more than rounding.

    Centroid j: ``0.5`` (``j`` in :data:`TIED`) or ``0.25`` on :data:`TIE_FEATURE`, and a value on
    feature ``j`` that makes ``||c_j||^2 = 1 + (k - j) delta`` (``delta`` a few ulps of the
    dtype, within :data:`~dkmeans.kernels.cosine.UNIT_SQ_NORM_TOL`). A rule by ``||c||^2/2 - x.c``
    gives every exact tie in ``x.c`` to the highest tied index; the cosine rule, to the lowest.
    """
    from dkmeans.kernels.cosine import UNIT_SQ_NORM_TOL

    dtype = np.dtype(dtype)
    delta = UNIT_SQ_NORM_TOL[dtype] / (2 * k)
    C = np.zeros((k, d))
    for j in range(k):
        C[j, TIE_FEATURE] = 0.5 if j in TIED else 0.25
        C[j, j] = np.sqrt(1.0 + (k - j) * delta - C[j, TIE_FEATURE] ** 2)
    C = C.astype(dtype)
    sq = np.sum(C.astype(np.float64) ** 2, axis=1)
    assert np.all(np.diff(sq) < 0) and np.all(np.abs(sq - 1) <= UNIT_SQ_NORM_TOL[dtype])
    return C


def tie_rows(dtype, d, n_zero=40, n_tied=30, seed=0):
    """Unit rows: ``n_zero`` orthogonal to every centroid, ``n_tied`` whose largest dot product is with :data:`TIED`."""
    rng = np.random.default_rng(seed)
    Z = np.zeros((n_zero, d))
    Z[:, TIE_FEATURE + 1 :] = rng.random((n_zero, d - TIE_FEATURE - 1)) * (
        rng.random((n_zero, d - TIE_FEATURE - 1)) < 0.5
    )
    Z[:, -1] += 0.5  # never a zero row
    T = np.zeros((n_tied, d))
    T[:, TIE_FEATURE] = rng.uniform(0.5, 2.0, n_tied)
    T[::2, TIE_FEATURE + 1 :] = rng.random(
        (len(T[::2]), d - TIE_FEATURE - 1)
    )  # orthogonal to all but TIE_FEATURE
    X = np.concatenate([Z, T])[rng.permutation(n_zero + n_tied)]
    return normalize_rows(X.astype(dtype)), np.all(X[:, : TIE_FEATURE + 1] == 0, axis=1)


def _assign_every_way(X, C, k):
    """Labels from assign, nearest_sq64 and (as counts) assign_partials; also on CSR rows."""
    from dkmeans.kernels.nearest import nearest_sq64

    labels, _ = kernels.assign(X, C)
    np.testing.assert_array_equal(nearest_sq64(X, C)[0], labels)
    np.testing.assert_array_equal(
        kernels.assign_partials(X, C).counts, np.bincount(labels, minlength=k)
    )
    return np.asarray(labels)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    "d", [12, 40]
)  # the compiled direct loop of width 16, and the streamed one
@pytest.mark.parametrize("compile_mode, engine", ASSIGN_PATHS)
def test_exact_ties_go_to_the_lowest_index_on_every_path(
    monkeypatch, dtype, d, compile_mode, engine
):
    """A row orthogonal to every unit centroid gets label 0; one tied among TIED gets TIED[0] (dense and CSR)."""
    import dask

    C = tie_centroids(dtype, d)
    X, orthogonal = tie_rows(dtype, d)
    expected = np.where(orthogonal, 0, TIED[0])
    with dask.config.set({"dkmeans.compile": compile_mode, "dkmeans.kernels.backend": engine}):
        np.testing.assert_array_equal(_assign_every_way(X, C, len(C)), expected)
        np.testing.assert_array_equal(_assign_every_way(sp.csr_matrix(X), C, len(C)), expected)
        np.testing.assert_array_equal(
            _assign_every_way(X, C[::-1].copy(), len(C)),
            np.where(orthogonal, 0, len(C) - 1 - TIED[-1]),
        )


def test_unit_half_sq_norms_rule():
    """Exactly 1/2 for centroids of norm 1 to the dtype's tolerance, else the kernel's value; CuPy applies the same."""
    from dkmeans.kernels.backends import cuda as _cuda
    from dkmeans.kernels.cosine import UNIT_SQ_NORM_TOL, unit_half_sq_norms

    assert _cuda.UNIT_SQ_NORM_TOL == UNIT_SQ_NORM_TOL
    assert f"#define UNIT_SQ_TOL {UNIT_SQ_NORM_TOL[np.dtype(np.float32)]!r}" in _cuda.kernel_code(
        np.float32
    )
    for dtype, tol in UNIT_SQ_NORM_TOL.items():
        C = np.array(
            [[1.0, 0.0], [np.sqrt(1 + tol / 2), 0.0], [np.sqrt(1 + 4 * tol), 0.0], [0.6, 0.0]]
        )
        half = 0.5 * np.sum(C * C, axis=1)
        np.testing.assert_array_equal(
            unit_half_sq_norms(np, C, half, dtype), [0.5, 0.5, half[2], half[3]]
        )


@pytest.mark.parametrize("compile_mode", ["off", "eager"])
def test_sparse_and_dense_fits_agree_on_tie_heavy_data(client, compile_mode):
    """Sparse non-negative rows, a fifth orthogonal to every initial centroid: the same fit on CSR and dense input."""
    import dask

    X = abs(sp.random(3000, 120, density=0.03, format="csr", random_state=2, dtype=np.float64))
    X = X[np.asarray(X.getnnz(axis=1)) > 0]
    C0 = X[:8].toarray()
    orthogonal = np.asarray((normalize_rows(X) @ _unit(C0).T) == 0).all(axis=1)
    assert orthogonal.mean() > 0.15
    with dask.config.set({"dkmeans.compile": compile_mode}):
        fits = [
            dkmeans.KMeans(
                n_clusters=8, init=C0, n_init=1, max_iter=5, tol=0.0, metric="cosine"
            ).fit(data)
            for data in (X, X.toarray())
        ]
    np.testing.assert_array_equal(fits[0].labels_, fits[1].labels_)
    np.testing.assert_allclose(
        fits[0].cluster_centers_, fits[1].cluster_centers_, rtol=0, atol=1e-14
    )
    np.testing.assert_allclose(fits[0].inertia_, fits[1].inertia_, rtol=1e-12)
