"""The fused CuPy kernels (dkmeans/kernels/backends/cuda.py) against the NumPy kernels and float64 references.

Tests marked ``gpu`` need CuPy and a GPU and skip cleanly without them; the others
(the module imports without CuPy, tile planning) run everywhere.

What is compared, on the same data:

* labels: equal to the float64 reference and to the NumPy kernels except where the two
  centroids are a tie within the rounding of the float matrix product (checked to be
  one); exact ties (integer data, duplicated centroids) go to the lowest index;
* squared distances: exact (from ``x - c``) to a few ulps of the data dtype;
* partials: sums and counts against float64 sums over the kernel's own labels (tight),
  against the NumPy kernels to float32 tolerance; the objective to 1e-5 relative;
* memory: at k = 65,536, d = 128 the CuPy memory pool grows by the planned scratch and
  the outputs only, never by the ``n x k`` product.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import dask
import numpy as np
import pytest

from dkmeans.kernels.backends import cuda as _cuda
from dkmeans.kernels.nearest import assign, assign_partials
from tests.helpers import sq_distances as brute_sq
from tests.helpers import usable_cupy

# the module (dkmeans.kernels exports a function of the same name)
assign_module = importlib.import_module("dkmeans.kernels.nearest")

gpu = pytest.mark.gpu


# -- without a GPU ---------------------------------------------------------------------------
def test_module_imports_without_cupy():
    """With CuPy unimportable, the module imports, supports() says no, a call says why."""
    code = textwrap.dedent("""
        import sys
        sys.modules["cupy"] = None  # any "import cupy" now raises ImportError
        import numpy as np
        from dkmeans.kernels.backends import cuda as _cuda
        assert not _cuda.supports(np.zeros((3, 2)))
        assert "typedef float T;" in _cuda.kernel_code(np.float32)
        assert "typedef double T;" in _cuda.kernel_code("float64")
        try:
            _cuda.assign_cuda(np.zeros((3, 2)), np.zeros((1, 2)))
        except ImportError as exc:
            assert "CuPy" in str(exc), exc
        else:
            raise AssertionError("no ImportError without CuPy")
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "ok"


def test_supports_only_2d_cupy_floats():
    assert not _cuda.supports(np.zeros((4, 2), np.float32))
    assert not _cuda.supports([[1.0]])


@pytest.mark.parametrize(
    "n, k, d, itemsize",
    [
        (10_000_000, 1000, 128, 4),
        (4096, 65_536, 128, 4),
        (7, 3, 2, 8),
        (0, 5, 3, 4),
        (10**9, 1, 1, 4),
        (100, 10**6, 1000, 8),
    ],
)
@pytest.mark.parametrize("scratch", [1, 4096, 32 * 2**20, 256 * 2**20])
def test_plan_tiles_stays_within_scratch(n, k, d, itemsize, scratch):
    tile, block = _cuda.plan_tiles(n, k, d, itemsize, scratch)
    assert 1 <= block <= min(k, _cuda.MAX_CENTROID_BLOCK)
    assert 1 <= tile <= min(max(n, 1), _cuda.MAX_ROW_TILE)
    if tile > 1:  # one row is always allowed
        assert tile * (block * itemsize + itemsize + 4 + d * itemsize) <= scratch
    # the kernels index rows of a tile and threads of a launch with 32-bit ints
    assert tile * 32 < 2**31 and tile * block < 2**40


def test_lanes_per_row():
    assert [_cuda._lanes(w) for w in (0, 1, 2, 3, 5, 16, 17, 32, 33, 4096)] == [
        1,
        1,
        2,
        4,
        8,
        16,
        32,
        32,
        32,
        32,
    ]


# -- GPU fixtures and references -------------------------------------------------------------
@pytest.fixture(scope="module")
def cp():
    return usable_cupy()


def tie_tolerance(X, C, dtype):
    """Per row: how far apart two squared distances may be and still be swapped by the
    rounding of the matrix-product form in ``dtype`` (a bound, relative to the norms)."""
    X = np.asarray(X, np.float64)
    C = np.asarray(C, np.float64)
    d = max(1, X.shape[1])
    eps = np.finfo(dtype).eps
    return 8 * eps * np.sqrt(d) * ((X * X).sum(1) + (C * C).sum(1).max())


def check_labels(labels, D, tol, *, max_fraction=1e-3):
    """``labels`` are nearest in ``D`` (n, k); a different choice only at a near tie."""
    labels = np.asarray(labels)
    rows = np.arange(D.shape[0])
    best = D.argmin(1)
    gap = D[rows, labels] - D[rows, best]
    assert np.all(gap <= tol), f"rows {np.flatnonzero(gap > tol)[:10]} are not near ties"
    assert np.count_nonzero(labels != best) <= max(1, max_fraction * D.shape[0])


def host_partials(X, C, labels, weights=None):
    """float64 sums, counts and objective over given labels, from the data itself."""
    X = np.asarray(X)
    k = C.shape[0]
    w = np.ones(X.shape[0]) if weights is None else np.asarray(weights, np.float64)
    sums = np.zeros((k, X.shape[1]))
    np.add.at(sums, labels, w[:, None] * X.astype(np.float64))
    counts = np.bincount(labels, weights=w, minlength=k).astype(np.float64)
    diff = (X - np.asarray(C, X.dtype)[labels]).astype(np.float64)
    objective = float((w * (diff * diff).sum(1)).sum())
    return sums, counts, objective


def check_partials(got, X, C, labels, weights, dtype):
    """``got`` (sums, counts, objective) against float64 sums over ``labels``."""
    sums, counts, objective = (np.asarray(a) for a in got)
    ref_sums, ref_counts, ref_obj = host_partials(X, C, labels, weights)
    scale = max(1.0, float(np.abs(X).max())) * max(1.0, float(ref_counts.max()))
    np.testing.assert_allclose(sums, ref_sums, rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(counts, ref_counts, rtol=1e-12, atol=1e-12)
    # the kernel keeps each row's exact distance in float64; the reference rounds x - c in
    # the data dtype the same way, so only the summation order differs
    assert objective == pytest.approx(ref_obj, rel=1e-9, abs=1e-12)


def to_host(cp, a):
    return cp.asnumpy(a)


def blobs(n, d, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10, 10, size=(max(k, 1), d))
    X = (centers[rng.integers(0, max(k, 1), n)] + rng.standard_normal((n, d))).astype(dtype)
    C = (X[rng.choice(n, size=k, replace=n < k)] + 0.5 * rng.standard_normal((k, d))).astype(dtype)
    return X, C


# -- assign ---------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, k, d", [(2000, 37, 6), (1500, 300, 128), (777, 5, 1), (600, 129, 33)])
def test_assign_matches_numpy_and_reference(cp, dtype, n, k, d):
    X, C = blobs(n, d, k, dtype)
    labels, min_sq = _cuda.assign_cuda(cp.asarray(X), cp.asarray(C))
    assert isinstance(labels, cp.ndarray) and isinstance(min_sq, cp.ndarray)
    assert labels.dtype == np.int32 and labels.shape == (n,)
    assert min_sq.dtype == dtype and min_sq.shape == (n,)
    labels, min_sq = to_host(cp, labels), to_host(cp, min_sq)
    D = brute_sq(X, C)
    tol = tie_tolerance(X, C, dtype)
    check_labels(labels, D, tol)
    # the NumPy kernels choose alike (up to near ties of their own rounding)
    np_labels, np_sq = assign(X, C)
    differ = labels != np_labels
    rows = np.arange(n)
    assert np.all(np.abs(D[rows, labels] - D[rows, np_labels])[differ] <= 2 * tol[differ])
    # distances: exact for the chosen centroid, to a few ulps of the data dtype
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(min_sq, D[rows, labels], rtol=4 * eps * max(1, d) ** 0.5, atol=0)
    np.testing.assert_allclose(
        min_sq[~differ], np_sq[~differ], rtol=1e-5 if dtype == np.float32 else 1e-12
    )


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "row_tile, centroid_block", [(None, None), (13, 3), (1, 1), (50, 40), (64, 2)]
)
def test_exact_ties_go_to_lowest_index(cp, dtype, row_tile, centroid_block):
    """Integer data: every product and distance is exact, ties are exact and frequent.

    Duplicated centroids sit where each way of breaking a tie is exercised: in the columns
    one thread scans (indices 32 apart), in different threads of a row (same block), and
    in different centroid blocks."""
    rng = np.random.default_rng(7)
    d, k = 8, 80
    X = rng.integers(-4, 5, size=(400, d)).astype(dtype)
    C = rng.integers(-4, 5, size=(k, d)).astype(dtype)
    for dup in (5, 33, 70):
        C[dup] = C[1]
    for dup in (34, 66, 79):
        C[dup] = C[2]
    X[:20] = C[1]  # distance 0 to centroids 1, 5, 33 and 70
    X[20:40] = C[2] + 1  # equally near 2, 34, 66 and 79
    if row_tile == 1:
        X = X[:60]  # one launch per row and block: fewer rows
    D = brute_sq(X, C)
    want = D.argmin(1)  # numpy: the first minimum
    assert np.count_nonzero((D == D.min(1, keepdims=True)).sum(1) > 1) >= 40  # many ties
    np.testing.assert_array_equal(want[:20], 1)
    np.testing.assert_array_equal(want[20:40], 2)
    labels, min_sq = _cuda.assign_cuda(
        cp.asarray(X), cp.asarray(C), row_tile=row_tile, centroid_block=centroid_block
    )
    np.testing.assert_array_equal(to_host(cp, labels), want)
    np.testing.assert_array_equal(to_host(cp, min_sq), D.min(1).astype(dtype))
    np.testing.assert_array_equal(assign(X, C)[0], want)  # the NumPy kernels agree
    labels = _cuda.nearest_cuda(
        cp.asarray(X), cp.asarray(C), row_tile=row_tile, centroid_block=centroid_block
    )
    np.testing.assert_array_equal(to_host(cp, labels), want)
    got = _cuda.partials_cuda(
        cp.asarray(X), cp.asarray(C), row_tile=row_tile, centroid_block=centroid_block
    )
    check_partials([to_host(cp, a) for a in got], X, C, want, None, dtype)


@gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    "n, k, d, row_tile, centroid_block, scratch",
    [
        (1, 1, 1, None, None, None),
        (5, 3, 2, 1, 1, None),
        (1000, 37, 33, 97, 10, None),  # neither divides
        (513, 1, 128, 100, None, None),
        (300, 4099, 17, 64, None, None),  # two centroid blocks, the second of 3
        (257, 70, 3, 256, 33, None),
        (700, 50, 20, None, None, 4096),  # scratch of a few rows: many tiles
        (64, 9, 40, None, None, 1),  # one row per tile
    ],
)
def test_tiling_edges(cp, dtype, n, k, d, row_tile, centroid_block, scratch):
    X, C = blobs(n, d, k, dtype, seed=n + k)
    kw = dict(row_tile=row_tile, centroid_block=centroid_block)
    if scratch is not None:
        kw["scratch_bytes"] = scratch
    Xg, Cg = cp.asarray(X), cp.asarray(C)
    labels, min_sq = (to_host(cp, a) for a in _cuda.assign_cuda(Xg, Cg, **kw))
    D = brute_sq(X, C)
    check_labels(labels, D, tie_tolerance(X, C, dtype))
    rows = np.arange(n)
    np.testing.assert_allclose(min_sq, D[rows, labels], rtol=4 * np.finfo(dtype).eps * d**0.5)
    np.testing.assert_array_equal(to_host(cp, _cuda.nearest_cuda(Xg, Cg, **kw)), labels)
    w = np.random.default_rng(1).uniform(0.0, 3.0, n)
    for weights in (None, w):
        got = [to_host(cp, a) for a in _cuda.partials_cuda(Xg, Cg, weights, **kw)]
        check_partials(got, X, C, labels, weights, dtype)


# -- partials ---------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weights", ["none", "host", "device", "zeros-in"])
def test_partials_match_numpy_and_reference(cp, dtype, weights):
    n, k, d = 3000, 41, 24
    X, C = blobs(n, d, k, dtype, seed=5)
    rng = np.random.default_rng(2)
    w = None if weights == "none" else rng.uniform(0.1, 3.0, n)
    if weights == "zeros-in":
        w[::7] = 0.0
        w[:50] = 0.0
    w_arg = cp.asarray(w) if weights in ("device", "zeros-in") else w
    sums, counts, objective = _cuda.partials_cuda(cp.asarray(X), cp.asarray(C), w_arg)
    assert sums.shape == (k, d) and sums.dtype == np.float64
    assert counts.shape == (k,) and counts.dtype == np.float64
    assert objective.shape == () and objective.dtype == np.float64
    got = [to_host(cp, a) for a in (sums, counts, objective)]
    labels = to_host(cp, _cuda.nearest_cuda(cp.asarray(X), cp.asarray(C)))
    check_labels(labels, brute_sq(X, C), tie_tolerance(X, C, dtype))
    check_partials(got, X, C, labels, w, dtype)
    ref = assign_partials(X, C, w)  # NumPy kernels
    rtol = 1e-5 if dtype == np.float32 else 1e-10
    if np.array_equal(labels, assign(X, C)[0]):
        scale = float(np.abs(ref.sums).max())
        np.testing.assert_allclose(got[0], ref.sums, rtol=rtol, atol=rtol * scale)
        np.testing.assert_allclose(got[1], ref.counts, rtol=rtol)
    assert float(got[2]) == pytest.approx(float(ref.objective), rel=1e-5)
    if w is None:
        np.testing.assert_array_equal(got[1], np.round(got[1]))  # integer counts, exact
        assert got[1].sum() == n


@gpu
def test_empty_and_tiny_inputs(cp):
    C = cp.asarray(np.arange(6, dtype=np.float32).reshape(3, 2))
    X = cp.empty((0, 2), dtype=cp.float32)
    labels, min_sq = _cuda.assign_cuda(X, C)
    assert labels.shape == (0,) and labels.dtype == np.int32 and min_sq.dtype == np.float32
    assert _cuda.nearest_cuda(X, C).shape == (0,)
    sums, counts, objective = _cuda.partials_cuda(X, C)
    assert sums.shape == (3, 2) and not to_host(cp, sums).any() and not to_host(cp, counts).any()
    assert float(to_host(cp, objective)) == 0.0
    with pytest.raises(ValueError, match="no centroids"):
        _cuda.assign_cuda(cp.ones((2, 2), dtype=cp.float32), cp.ones((0, 2), dtype=cp.float32))
    with pytest.raises(ValueError, match="features"):
        _cuda.assign_cuda(cp.ones((2, 2), dtype=cp.float32), cp.ones((1, 3), dtype=cp.float32))
    with pytest.raises(ValueError, match="weights"):
        _cuda.partials_cuda(cp.ones((2, 2), dtype=cp.float32), C, np.ones(3))
    with pytest.raises(TypeError):
        _cuda.assign_cuda(np.ones((2, 2), dtype=np.float32), C)  # host data
    with pytest.raises(TypeError):
        _cuda.assign_cuda(cp.ones((2, 2), dtype=cp.int32), C)


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layouts_and_host_centroids(cp, dtype):
    """Fortran-ordered and strided input, host centroids of another dtype: the results of
    the same rows in C order (same tiles, so the same matrix products, bit for bit)."""
    X, C = blobs(900, 10, 12, dtype, seed=3)
    Xg = cp.asarray(X)
    C64 = C.astype(np.float64)
    for Xv in (cp.asfortranarray(Xg), Xg[::2]):
        base = [
            to_host(cp, a)
            for a in _cuda.assign_cuda(cp.ascontiguousarray(Xv), cp.asarray(C), row_tile=100)
        ]
        got = [to_host(cp, a) for a in _cuda.assign_cuda(Xv, C64, row_tile=100)]
        np.testing.assert_array_equal(got[0], base[0])
        np.testing.assert_array_equal(got[1], base[1])
        P = [to_host(cp, a) for a in _cuda.partials_cuda(Xv, C64, row_tile=100)]
        check_partials(P, to_host(cp, Xv), C, base[0], None, dtype)


# -- bounded memory at large k ----------------------------------------------------------------
@gpu
def test_large_k_runs_in_bounded_memory(cp):
    """k = 65,536 at d = 128: the pool grows by the planned scratch and outputs, not n x k."""
    n, k, d = 4096, 65_536, 128
    rng = np.random.default_rng(11)
    X = rng.standard_normal((n, d)).astype(np.float32)
    C = rng.standard_normal((k, d)).astype(np.float32)
    Xg, Cg = cp.asarray(X), cp.asarray(C)
    pool = cp.get_default_memory_pool()
    scratch = _cuda.DEFAULT_SCRATCH_BYTES
    tile, block = _cuda.plan_tiles(n, k, d, 4, scratch)
    assert block == _cuda.MAX_CENTROID_BLOCK and tile < n  # several tiles and blocks
    _cuda.assign_cuda(Xg[:64], Cg)  # compiles kernels, creates the cuBLAS handle
    cp.cuda.Device().synchronize()
    # ||c||^2/2, slack for the libraries' own (cuBLAS, CuPy); then the outputs
    common = scratch + k * 4 + 8 * 2**20
    outputs = {"assign": n * (4 + 4), "partials": k * d * 8 + k * 8}
    results = {}
    for name, call in (
        ("assign", lambda: _cuda.assign_cuda(Xg, Cg)),
        ("partials", lambda: _cuda.partials_cuda(Xg, Cg)),
    ):
        pool.free_all_blocks()
        before = pool.total_bytes()
        results[name] = [to_host(cp, a) for a in call()]
        cp.cuda.Device().synchronize()
        grown = pool.total_bytes() - before
        assert grown <= common + outputs[name], f"{name}: the pool grew by {grown / 2**20:.1f} MiB"
        assert grown < n * k * 4 // 4  # far below the n x k product (1 GiB)
    labels, min_sq = results["assign"]
    np_labels, np_sq = assign(X, C)
    D_rows = np.flatnonzero(labels != np_labels)
    if D_rows.size:  # only near ties may differ
        sub = brute_sq(X[D_rows], C)
        check_labels(labels[D_rows], sub, tie_tolerance(X[D_rows], C, np.float32), max_fraction=1.0)
    assert D_rows.size <= n // 1000 + 1
    same = labels == np_labels
    np.testing.assert_allclose(min_sq[same], np_sq[same], rtol=1e-5)
    sums, counts, objective = results["partials"]
    np.testing.assert_array_equal(counts, np.bincount(labels, minlength=k))
    ref = assign_partials(X, C)
    assert float(objective) == pytest.approx(float(ref.objective), rel=1e-5)


@gpu
def test_device_scratch_is_the_callers_raised_within_an_eighth_of_free_memory(cp):
    """The kernels' signatures pass a host-sized bound; the GPU path raises it to at most
    DEVICE_SCRATCH_BYTES, and to at most an eighth of the device's free memory."""
    X = cp.ones((10, 3), dtype=cp.float32)
    free, _ = cp.cuda.runtime.memGetInfo()
    got = _cuda.device_scratch_bytes(X, 4096)
    assert 4096 <= got <= max(4096, _cuda.DEVICE_SCRATCH_BYTES)
    assert got <= max(4096, free // 8 + 2**20)  # (free memory may move a little between the reads)
    assert _cuda.device_scratch_bytes(X, 2**40) == 2**40  # a larger bound is kept


# -- through the kernels of assign.py -----------------------------------------------------------
@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_assign_module_on_cupy_matches_numpy(cp, dtype):
    """``assign`` and ``assign_partials`` take CuPy arrays and give CuPy arrays that agree
    with their NumPy results (whichever CuPy code path assign.py takes)."""
    X, C = blobs(2500, 16, 20, dtype, seed=9)
    w = np.random.default_rng(4).uniform(0, 2, 2500)
    labels, min_sq = assign(cp.asarray(X), cp.asarray(C))
    assert isinstance(labels, cp.ndarray) and labels.dtype == np.int32 and min_sq.dtype == dtype
    np_labels, np_sq = assign(X, C)
    check_labels(to_host(cp, labels), brute_sq(X, C), tie_tolerance(X, C, dtype))
    P = assign_partials(cp.asarray(X), cp.asarray(C), cp.asarray(w))
    assert isinstance(P.sums, cp.ndarray) and P.sums.dtype == np.float64 and P.objective.shape == ()
    R = assign_partials(X, C, w)
    assert float(to_host(cp, P.objective)) == pytest.approx(float(R.objective), rel=1e-5)
    if np.array_equal(to_host(cp, labels), np_labels):
        np.testing.assert_allclose(
            to_host(cp, min_sq), np_sq, rtol=1e-5 if dtype == np.float32 else 1e-12
        )
        np.testing.assert_allclose(
            to_host(cp, P.sums), R.sums, rtol=1e-5, atol=1e-5 * float(np.abs(R.sums).max())
        )
        np.testing.assert_allclose(to_host(cp, P.counts), R.counts, rtol=1e-9)


@gpu
def test_assign_module_dispatches_to_fused_kernels(cp, monkeypatch):
    """CuPy float input to ``assign``/``assign_partials`` runs the fused kernels."""
    calls = []

    def spy(name):
        real = getattr(_cuda, name)

        def wrapper(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        return wrapper

    for name in ("assign_cuda", "partials_cuda"):
        monkeypatch.setattr(_cuda, name, spy(name))
    X, C = blobs(500, 8, 6, np.float32, seed=2)
    assign(cp.asarray(X), cp.asarray(C))
    assign_partials(cp.asarray(X), cp.asarray(C))
    assert calls == ["assign_cuda", "partials_cuda"], (
        f"nearest.py did not dispatch CuPy input to dkmeans.kernels.backends.cuda (calls: {calls}); "
        f"dkmeans.kernels.backend={dask.config.get('dkmeans.kernels.backend')!r}"
    )


# -- end to end on a LocalCUDACluster -------------------------------------------------------------
@gpu
@pytest.mark.slow
def test_kmeans_fit_on_cupy_dask_array_matches_numpy_fit(cp, tmp_path):
    """KMeans on a CuPy-backed Dask array on a LocalCUDACluster = the NumPy fit from the same
    init: same iterations, centres to float32 rounding, objective to 1e-5, labels except
    near ties. In a fresh process, so that the session's CPU client is not the current one."""
    pytest.importorskip("dask_cuda", reason="dask-cuda is not installed")
    code = textwrap.dedent(f"""
        import importlib.util
        import cupy, dask.array as da, numpy as np
        import dkmeans
        from dkmeans.engine.client import start_local_cuda_cluster

        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})  # the tests package
        spec = importlib.util.spec_from_file_location("gpu_test_helpers", {str(Path(__file__).resolve())!r})
        helpers = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(helpers)
        blobs, brute_sq, check_labels, tie_tolerance = (
            helpers.blobs, helpers.brute_sq, helpers.check_labels, helpers.tie_tolerance)

        n, d, k = 40_000, 8, 6
        X, C0 = blobs(n, d, k, np.float32, seed=21)
        client = start_local_cuda_cluster()
        Xg = da.from_array(cupy.asarray(X), chunks=(7_000, d), asarray=False)
        params = dict(n_clusters=k, init=C0, n_init=1, max_iter=60, tol=1e-4, random_state=0)
        gpu_fit = dkmeans.KMeans(**params).fit(Xg)
        cpu_fit = dkmeans.KMeans(**params).fit(X)
        assert isinstance(gpu_fit.cluster_centers_, np.ndarray), type(gpu_fit.cluster_centers_)
        assert gpu_fit.cluster_centers_.dtype == np.float32, gpu_fit.cluster_centers_.dtype
        assert gpu_fit.n_iter_ == cpu_fit.n_iter_, (gpu_fit.n_iter_, cpu_fit.n_iter_)
        scale = float(np.abs(X).max())
        np.testing.assert_allclose(gpu_fit.cluster_centers_, cpu_fit.cluster_centers_, rtol=1e-5,
                                   atol=1e-5 * scale)
        rel = abs(gpu_fit.inertia_ - cpu_fit.inertia_) / cpu_fit.inertia_
        assert rel <= 1e-5, (gpu_fit.inertia_, cpu_fit.inertia_)
        meta = gpu_fit.labels_._meta
        assert type(meta).__module__.split(".")[0] == "cupy", "labels_ of CuPy input: " + str(type(meta))
        labels = cupy.asnumpy(gpu_fit.labels_.compute())
        differ = labels != np.asarray(cpu_fit.labels_)
        if differ.any():  # only near ties of the final centroids may differ
            C = gpu_fit.cluster_centers_
            check_labels(labels[differ], brute_sq(X[differ], C), tie_tolerance(X[differ], C, np.float32),
                         max_fraction=1.0)
        assert np.count_nonzero(differ) <= n // 1000, np.count_nonzero(differ)
        print("gpu fit ok", gpu_fit.n_iter_, rel, np.count_nonzero(differ))
    """)
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-6000:]
    assert "gpu fit ok" in res.stdout
