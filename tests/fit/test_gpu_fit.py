"""Fits on the GPU through the faces, each against the NumPy fit from the same start.

Every test here needs CuPy and a GPU (marked ``gpu``) and skips cleanly without them. The
fits run on the session's CPU cluster, whose worker processes use the GPU for CuPy chunks
(the LocalCUDACluster paths are ``tests/kernels/test_gpu.py`` and the deploy system test).

What is compared, from the same initial centroids: the iteration count, the centroids to
the rounding of the data dtype, the objective, and the labels except at near ties (the
fused kernels and the NumPy kernels round the matrix product differently). Where the
input is on the GPU, the labels, ``predict`` and ``transform`` stay there (CuPy in, CuPy
out); host input fitted with ``device="gpu"`` gets host labels back.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import dkmeans
from dkmeans.testing import make_blobs
from tests.helpers import sq_distances

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, np.float64]


def rtol_of(dtype) -> float:
    return 1e-5 if np.dtype(dtype) == np.float32 else 1e-10


def host(cp, a):
    """A CuPy array, a Dask array (of either) or a NumPy array, in host memory."""
    if hasattr(a, "compute"):
        a = a.compute()
    return cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.asarray(a)


def data(n, d, k, dtype, seed=0, spread=1.0):
    X, _, centers = make_blobs(n, d, k, spread=spread, box=10.0, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    C0 = (X[rng.choice(n, size=k, replace=False)]).astype(dtype)
    return X, C0


def assert_same_fit(cp, gpu_fit, cpu_fit, X, *, dtype, metric="euclidean", max_differ=None):
    """``gpu_fit`` = ``cpu_fit``: iterations, centroids to rounding, objective, labels but near
    ties."""
    rtol = rtol_of(dtype)
    assert isinstance(gpu_fit.cluster_centers_, np.ndarray)
    assert gpu_fit.cluster_centers_.dtype == np.dtype(dtype)
    assert gpu_fit.n_iter_ == cpu_fit.n_iter_, (gpu_fit.n_iter_, cpu_fit.n_iter_)
    scale = float(np.abs(X).max())
    np.testing.assert_allclose(
        gpu_fit.cluster_centers_, cpu_fit.cluster_centers_, rtol=rtol, atol=rtol * scale
    )
    assert gpu_fit.inertia_ == pytest.approx(cpu_fit.inertia_, rel=10 * rtol, abs=1e-12)
    labels = host(cp, gpu_fit.labels_)
    want = host(cp, cpu_fit.labels_)
    differ = labels != want
    limit = max(1, X.shape[0] // 1000) if max_differ is None else max_differ
    assert np.count_nonzero(differ) <= limit, np.count_nonzero(differ)
    if differ.any() and metric == "euclidean":  # only near ties of the final centroids
        D = sq_distances(X[differ], gpu_fit.cluster_centers_)
        rows = np.arange(D.shape[0])
        gap = D[rows, labels[differ]] - D[rows, want[differ]]
        assert np.all(np.abs(gap) <= 1e-4 * (1 + D.max())), gap


# -- CuPy in, CuPy out ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_cupy_fit_matches_numpy_fit_and_stays_on_the_gpu(cp, client, dtype):
    X, C0 = data(3000, 6, 5, dtype, seed=1)
    params = dict(n_clusters=5, init=C0, n_init=1, max_iter=50, tol=1e-6, random_state=0)
    cpu_fit = dkmeans.KMeans(**params).fit(X)
    Xg = cp.asarray(X)
    gpu_fit = dkmeans.KMeans(**params).fit(Xg)
    assert isinstance(gpu_fit.labels_, cp.ndarray), type(gpu_fit.labels_)
    assert gpu_fit.labels_.shape == (3000,)
    assert_same_fit(cp, gpu_fit, cpu_fit, X, dtype=dtype)

    pred = gpu_fit.predict(Xg)
    assert isinstance(pred, cp.ndarray) and pred.dtype == np.int32
    np.testing.assert_array_equal(host(cp, pred), host(cp, gpu_fit.labels_))
    dist = gpu_fit.transform(Xg)
    assert isinstance(dist, cp.ndarray) and dist.shape == (3000, 5) and dist.dtype == dtype
    ref = np.sqrt(sq_distances(X, gpu_fit.cluster_centers_))
    tol = 100 * rtol_of(dtype)
    np.testing.assert_allclose(host(cp, dist), ref, rtol=tol, atol=tol)
    assert gpu_fit.score(Xg) == pytest.approx(-gpu_fit.inertia_, rel=10 * rtol_of(dtype))
    # the host model predicts the same on host rows
    np.testing.assert_array_equal(gpu_fit.predict(X), host(cp, pred))


def test_cupy_integer_input_is_fitted_as_float64(cp, client):
    X = np.random.default_rng(3).integers(-5, 6, size=(400, 3))
    C0 = np.array([[-3.0, 0, 0], [3.0, 0, 0]])
    cpu_fit = dkmeans.KMeans(2, init=C0, n_init=1).fit(X)
    gpu_fit = dkmeans.KMeans(2, init=C0, n_init=1).fit(cp.asarray(X))
    assert gpu_fit.cluster_centers_.dtype == np.float64
    np.testing.assert_allclose(gpu_fit.cluster_centers_, cpu_fit.cluster_centers_, rtol=1e-12)


# -- device="gpu" on host input -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_device_gpu_on_host_input_matches_cpu_fit(cp, client, dtype, kind):
    X, C0 = data(4000, 8, 6, dtype, seed=2)
    params = dict(n_clusters=6, init=C0, n_init=1, max_iter=50, tol=1e-6, random_state=0)
    Xin = X if kind == "numpy" else da.from_array(X, chunks=(900, 8))
    cpu_fit = dkmeans.KMeans(**params).fit(Xin)
    gpu_fit = dkmeans.KMeans(**params, device="gpu").fit(Xin)
    assert_same_fit(cp, gpu_fit, cpu_fit, X, dtype=dtype)
    # labels follow the input: host rows give host labels (a lazy Dask array for Dask input)
    if kind == "numpy":
        assert isinstance(gpu_fit.labels_, np.ndarray), type(gpu_fit.labels_)
    else:
        assert isinstance(gpu_fit.labels_, da.Array)
        assert isinstance(gpu_fit.labels_.compute(), np.ndarray)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cupy_backed_dask_array_matches_numpy(cp, client, dtype):
    X, C0 = data(5000, 4, 7, dtype, seed=4)
    params = dict(n_clusters=7, init=C0, n_init=1, max_iter=60, tol=1e-6, random_state=0)
    Xd = da.from_array(cp.asarray(X), chunks=(1200, 4), asarray=False)
    gpu_fit = dkmeans.KMeans(**params).fit(Xd)
    cpu_fit = dkmeans.KMeans(**params).fit(da.from_array(X, chunks=(1200, 4)))
    assert isinstance(gpu_fit.labels_, da.Array)
    assert isinstance(gpu_fit.labels_.compute(), cp.ndarray)
    assert_same_fit(cp, gpu_fit, cpu_fit, X, dtype=dtype)
    pred = gpu_fit.predict(Xd).compute()
    assert isinstance(pred, cp.ndarray)
    np.testing.assert_array_equal(host(cp, pred), host(cp, gpu_fit.labels_))


# -- options ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_cosine_on_cupy_matches_numpy(cp, client, dtype):
    rng = np.random.default_rng(5)
    directions = rng.standard_normal((4, 16))
    X = (directions[rng.integers(0, 4, 2000)] + 0.3 * rng.standard_normal((2000, 16))).astype(dtype)
    C0 = X[rng.choice(2000, 4, replace=False)]
    params = dict(n_clusters=4, init=C0, n_init=1, max_iter=50, tol=1e-6, metric="cosine")
    cpu_fit = dkmeans.KMeans(**params).fit(X)
    gpu_fit = dkmeans.KMeans(**params).fit(cp.asarray(X))
    assert_same_fit(cp, gpu_fit, cpu_fit, X, dtype=dtype, metric="cosine")
    np.testing.assert_allclose(np.linalg.norm(gpu_fit.cluster_centers_, axis=1), 1.0, rtol=1e-5)
    dist = host(cp, gpu_fit.transform(cp.asarray(X)))
    assert dist.min() >= -1e-5 and dist.max() <= 2 + 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["host", "device"])
def test_sample_weights_on_cupy_match_numpy(cp, client, dtype, where):
    X, C0 = data(3000, 5, 4, dtype, seed=6)
    w = np.random.default_rng(7).uniform(0.0, 3.0, 3000)
    w[::10] = 0.0
    params = dict(n_clusters=4, init=C0, n_init=1, max_iter=50, tol=1e-6)
    cpu_fit = dkmeans.KMeans(**params).fit(X, sample_weight=w)
    w_in = w if where == "host" else cp.asarray(w)
    gpu_fit = dkmeans.KMeans(**params).fit(cp.asarray(X), sample_weight=w_in)
    assert_same_fit(cp, gpu_fit, cpu_fit, X, dtype=dtype)
    score = gpu_fit.score(cp.asarray(X), sample_weight=w_in)
    assert score == pytest.approx(-gpu_fit.inertia_, rel=10 * rtol_of(dtype))
    # the weighted mean of each cluster's rows, from the labels (float64 reference)
    labels = host(cp, gpu_fit.labels_)
    for j in range(4):
        m = labels == j
        want = (w[m, None] * X[m].astype(np.float64)).sum(0) / w[m].sum()
        np.testing.assert_allclose(
            gpu_fit.cluster_centers_[j],
            want,
            rtol=10 * rtol_of(dtype),
            atol=10 * rtol_of(dtype) * 10,
        )


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
def test_seedings_on_cupy_find_the_blobs_like_numpy(cp, client, init):
    X, true_labels, _ = make_blobs(6000, 5, 8, spread=0.3, box=20.0, seed=8, dtype=np.float32)
    params = dict(n_clusters=8, init=init, n_init=2 if init == "random" else 1, random_state=3)
    gpu_fit = dkmeans.KMeans(**params).fit(cp.asarray(X))
    cpu_fit = dkmeans.KMeans(**params).fit(X)
    from sklearn.metrics import adjusted_rand_score

    labels = host(cp, gpu_fit.labels_)
    if init != "random":  # well separated blobs: both seedings find every one
        assert adjusted_rand_score(true_labels, labels) == pytest.approx(1.0)
    # the same random streams (keyed by row): the same start, so the same result
    assert gpu_fit.inertia_ == pytest.approx(cpu_fit.inertia_, rel=1e-4)
    np.testing.assert_allclose(
        np.sort(gpu_fit.cluster_centers_, axis=0),
        np.sort(cpu_fit.cluster_centers_, axis=0),
        rtol=1e-4,
        atol=1e-3,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_cluster_on_cupy_is_refilled_like_numpy(cp, client, dtype):
    """A starting centroid far from every row gets none: the farthest-point rule refills it."""
    X, _ = data(2000, 3, 3, dtype, seed=9, spread=0.5)
    C0 = np.vstack([X[:2], np.full((1, 3), 1e3)]).astype(dtype)
    params = dict(n_clusters=3, init=C0, n_init=1, max_iter=50, tol=1e-6)
    cpu_fit = dkmeans.KMeans(**params).fit(X)
    gpu_fit = dkmeans.KMeans(**params).fit(cp.asarray(X))
    assert_same_fit(cp, gpu_fit, cpu_fit, X, dtype=dtype)
    assert np.abs(gpu_fit.cluster_centers_).max() < 100  # the far centroid moved onto the data
    assert np.bincount(host(cp, gpu_fit.labels_), minlength=3).min() > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_k_is_one_on_cupy(cp, client, dtype):
    X, _ = data(1500, 4, 3, dtype, seed=10)
    gpu_fit = dkmeans.KMeans(1, n_init=1, random_state=0).fit(cp.asarray(X))
    np.testing.assert_allclose(
        gpu_fit.cluster_centers_[0],
        X.astype(np.float64).mean(0),
        rtol=rtol_of(dtype),
        atol=10 * rtol_of(dtype),
    )
    assert not host(cp, gpu_fit.labels_).any()
    want = float(((X.astype(np.float64) - X.astype(np.float64).mean(0)) ** 2).sum())
    assert gpu_fit.inertia_ == pytest.approx(want, rel=10 * rtol_of(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_k_close_to_n_on_cupy_matches_numpy(cp, client, dtype):
    rng = np.random.default_rng(11)
    X = rng.uniform(-5, 5, size=(40, 3)).astype(dtype)
    C0 = X[:38].copy()
    params = dict(n_clusters=38, init=C0, n_init=1, max_iter=50, tol=0.0)
    cpu_fit = dkmeans.KMeans(**params).fit(X)
    gpu_fit = dkmeans.KMeans(**params).fit(cp.asarray(X))
    assert_same_fit(cp, gpu_fit, cpu_fit, X, dtype=dtype, max_differ=0)
    assert np.bincount(host(cp, gpu_fit.labels_), minlength=38).min() >= 1


def test_functional_train_and_infer_on_cupy(cp, client):
    X, C0 = data(2500, 5, 4, np.float32, seed=12)
    desc = dkmeans.Descriptor(cluster_count=4, max_iteration_count=40, accuracy_threshold=0.0)
    gpu = dkmeans.train(desc, cp.asarray(X), initial_centroids=C0)
    cpu = dkmeans.train(desc, X, initial_centroids=C0)
    scale = float(np.abs(X).max())
    np.testing.assert_allclose(
        gpu.model.centroids, cpu.model.centroids, rtol=1e-5, atol=1e-5 * scale
    )
    assert gpu.iteration_count == cpu.iteration_count
    assert gpu.objective_function_value == pytest.approx(cpu.objective_function_value, rel=1e-4)
    inferred = dkmeans.infer(desc, gpu.model, cp.asarray(X))
    assert isinstance(inferred.labels, cp.ndarray)
    want = gpu.objective_function_value
    assert inferred.objective_function_value == pytest.approx(want, rel=1e-5)
    assert np.count_nonzero(host(cp, inferred.labels) != host(cp, cpu.labels)) <= 2
