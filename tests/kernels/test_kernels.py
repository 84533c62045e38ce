"""Kernels against brute-force float64 references (NumPy, and CuPy where present)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from dkmeans.kernels import (
    Partials,
    assign,
    assign_partials,
    column_moments,
    combine_moments,
    combine_partials,
    combine_top,
    distances,
    farthest_points,
    plan_tiles,
    random_top_rows,
    uniform_by_index,
    update_centroids,
)
from dkmeans.kernels.namespace import to_host
from tests.helpers import sq_distances as brute_sq


@pytest.fixture(autouse=True)
def every_backend(kernel_backend):
    """Every kernel test runs with each NumPy path: compiled per shape (a direct loop for
    small d), compiled with BLAS always, and the namespace code."""
    return kernel_backend


@pytest.fixture
def data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(2000, 6))
    C = rng.normal(size=(37, 6))
    return X, C


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scratch", [64, 4096, 32 * 2**20])
def test_assign_matches_brute_force(xp, data, dtype, scratch):
    X, C = data
    labels, d2 = assign(
        xp.asarray(X.astype(dtype)), xp.asarray(C.astype(dtype)), scratch_bytes=scratch
    )
    labels, d2 = to_host(labels), to_host(d2)
    D = brute_sq(X.astype(dtype), C.astype(dtype))
    assert labels.dtype == np.int32 and d2.dtype == dtype
    np.testing.assert_array_equal(labels, D.argmin(1))
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(d2, D.min(1), rtol=rtol)


def test_assign_centroid_blocks_equal_single_block(monkeypatch, data):
    """Tiling over centroids (large k) gives the same labels as one block."""
    mod = importlib.import_module("dkmeans.kernels.common")  # the tile planner's bound

    X, C = data
    full = assign(X, C)[0]
    monkeypatch.setattr(mod, "MAX_CENTROID_BLOCK", 5)
    np.testing.assert_array_equal(assign(X, C, scratch_bytes=512)[0], full)


def test_ties_go_to_lowest_index(monkeypatch):
    mod = importlib.import_module("dkmeans.kernels.common")

    X = np.array([[0.0], [1.0], [2.0]])
    C = np.array([[1.0], [1.0], [3.0], [1.0]])  # centroids 0, 1 and 3 coincide
    monkeypatch.setattr(mod, "MAX_CENTROID_BLOCK", 1)
    np.testing.assert_array_equal(assign(X, C)[0], [0, 0, 0])


def test_plan_tiles_bounds_scratch():
    budget = 32 * 2**20
    for k in (8, 2048, 65536, 10**6):
        rows, block = plan_tiles(10**7, k, 128, 4, budget)
        assert rows >= 1 and block <= 4096
        assert rows * (block * 4 + 128 * (4 + 8)) <= budget or rows == 1


@pytest.mark.parametrize("weighted", [False, True])
def test_assign_partials_matches_reference(xp, data, weighted):
    X, C = data
    w = np.random.default_rng(0).uniform(0, 3, size=len(X)) if weighted else None
    p = assign_partials(
        xp.asarray(X), xp.asarray(C), None if w is None else xp.asarray(w), scratch_bytes=4096
    )
    p = to_host(p)
    D = brute_sq(X, C)
    lab = D.argmin(1)
    ww = np.ones(len(X)) if w is None else w
    assert p.sums.dtype == np.float64 and p.counts.dtype == np.float64
    np.testing.assert_allclose(p.counts, np.bincount(lab, weights=ww, minlength=len(C)))
    ref_sums = np.stack([(X[lab == j] * ww[lab == j, None]).sum(0) for j in range(len(C))])
    np.testing.assert_allclose(p.sums, ref_sums, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(float(p.objective), (D.min(1) * ww).sum(), rtol=1e-12)


def test_float32_sums_accumulate_in_float64():
    """A million float32 ones plus one large value: float32 accumulation would lose it."""
    X = np.ones((2**20 + 1, 1), dtype=np.float32)
    X[-1] = 0.5
    p = assign_partials(X, np.array([[1.0]], dtype=np.float32))
    assert float(p.sums[0, 0]) == 2**20 + 0.5


def test_partials_empty_chunk():
    p = assign_partials(np.empty((0, 3)), np.zeros((4, 3)))
    assert (
        p.sums.shape == (4, 3)
        and not p.sums.any()
        and not p.counts.any()
        and float(p.objective) == 0
    )


def test_combine_is_associative(data):
    X, C = data
    parts = [assign_partials(X[i : i + 300], C) for i in range(0, len(X), 300)]
    whole = assign_partials(X, C)
    left = combine_partials([combine_partials(parts[:3]), combine_partials(parts[3:])])
    right = combine_partials(parts)
    for a, b in ((left, whole), (right, whole)):
        np.testing.assert_allclose(a.sums, b.sums, rtol=1e-12)
        np.testing.assert_allclose(a.counts, b.counts)
        np.testing.assert_allclose(a.objective, b.objective, rtol=1e-12)


def test_update_centroids_means_and_empty():
    p = Partials(np.array([[4.0, 2.0], [0.0, 0.0]]), np.array([2.0, 0.0]), np.array(1.0))
    prev = np.array([[9.0, 9.0], [7.0, 7.0]])
    C, empty = update_centroids(p, prev)
    np.testing.assert_array_equal(C, [[2.0, 1.0], [7.0, 7.0]])
    np.testing.assert_array_equal(empty, [False, True])


def test_farthest_points_order_ties_and_weights():
    X = np.array([[0.0], [3.0], [-3.0], [1.0], [5.0]])
    C = np.array([[0.0]])
    top = farthest_points(X, C, 3, row_offset=10)
    np.testing.assert_array_equal(top.index, [14, 11, 12])  # 25, then the tie 9/9 by index
    np.testing.assert_array_equal(top.score, [25.0, 9.0, 9.0])
    w = np.array([1, 1, 1, 1, 0.0])  # the farthest row has zero weight: never chosen
    np.testing.assert_array_equal(farthest_points(X, C, 1, 0, w).index, [1])


def test_combine_top_is_chunking_invariant():
    rng = np.random.default_rng(5)
    X = rng.integers(0, 4, size=(500, 2)).astype(float)  # many exact ties
    C = np.array([[1.5, 1.5]])
    whole = farthest_points(X, C, 7, 0)
    parts = [farthest_points(X[i : i + 64], C, 7, i) for i in range(0, 500, 64)]
    merged = combine_top(parts, 7)
    np.testing.assert_array_equal(merged.index, whole.index)


def test_distances_match_brute_force(data):
    X, C = data
    np.testing.assert_allclose(distances(X, C), np.sqrt(brute_sq(X, C)), rtol=1e-9, atol=1e-9)


def test_moments_combine_matches_numpy(data):
    X, _ = data
    m = combine_moments([column_moments(X[:1]), column_moments(X[1:900]), column_moments(X[900:])])
    np.testing.assert_allclose(m.mean, X.mean(0), rtol=1e-12)
    np.testing.assert_allclose(m.m2 / m.count, X.var(0), rtol=1e-12)


def test_uniform_by_index_is_keyed_by_index():
    idx = np.arange(100_000, dtype=np.int64)
    u = uniform_by_index(idx, seed=7)
    np.testing.assert_array_equal(uniform_by_index(idx[500:900], seed=7), u[500:900])
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    assert not np.array_equal(uniform_by_index(idx, seed=8), u)
    assert not np.array_equal(uniform_by_index(idx, seed=7, stream=1), u)


def test_random_top_rows_weighted_frequencies():
    """Weighted sampling without replacement: a row of weight 3 is drawn first 3x as often."""
    X = np.arange(4, dtype=float)[:, None]
    w = np.array([1.0, 3.0, 0.0, 1.0])
    first = [int(random_top_rows(X, w, 0, 1, seed=s).index[0]) for s in range(3000)]
    counts = np.bincount(first, minlength=4)
    assert counts[2] == 0
    np.testing.assert_allclose(counts / 3000, [0.2, 0.6, 0.0, 0.2], atol=0.03)


# -- compiled paths: direct loop (d <= 16) and BLAS, against the float64 brute force --------
def _brute_partials(X, C, w=None):
    D = brute_sq(X, C)
    lab = D.argmin(1)
    ww = np.ones(len(X)) if w is None else w
    X64 = np.asarray(X, np.float64)
    sums = np.zeros(C.shape)
    np.add.at(sums, lab, X64 * ww[:, None])
    return (
        lab,
        D.min(1),
        sums,
        np.bincount(lab, weights=ww, minlength=len(C)),
        float((D.min(1) * ww).sum()),
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 3, 4, 5, 8, 9, 12, 15, 16, 17, 32, 40])
@pytest.mark.parametrize("k", [1, 3, 4, 7, 33])
def test_paths_match_brute_force_over_shapes(d, k, dtype):
    """Every feature width (padding of the direct loop), centroid counts around the groups of 4."""
    rng = np.random.default_rng(d * 100 + k)
    X = rng.normal(size=(517, d)).astype(dtype)
    C = rng.normal(size=(k, d)).astype(dtype)
    w = rng.uniform(0, 2, size=len(X))
    lab, dmin, sums, counts, obj = _brute_partials(X, C, w)
    labels, d2 = assign(X, C)
    np.testing.assert_array_equal(labels, lab)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(d2, dmin, rtol=rtol, atol=1e-6 if dtype == np.float32 else 0)
    p = assign_partials(X, C, w)
    np.testing.assert_allclose(p.sums, sums, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(p.counts, counts, rtol=1e-12)
    np.testing.assert_allclose(float(p.objective), obj, rtol=rtol)


@pytest.mark.parametrize("n", [1, 255, 256, 257, 1000])
@pytest.mark.parametrize("scratch", [1, 700, 32 * 2**20])
def test_row_tiles_edges(n, scratch):
    """Row counts around the tile sizes, and tiny scratch budgets (one row per tile)."""
    rng = np.random.default_rng(n)
    for d in (6, 24):
        X = rng.normal(size=(n, d)).astype(np.float32)
        C = rng.normal(size=(9, d)).astype(np.float32)
        lab, dmin, sums, counts, obj = _brute_partials(X, C)
        labels, d2 = assign(X, C, scratch_bytes=scratch)
        np.testing.assert_array_equal(labels, lab)
        np.testing.assert_allclose(d2, dmin, rtol=1e-5, atol=1e-6)
        p = assign_partials(X, C, scratch_bytes=scratch)
        np.testing.assert_allclose(p.sums, sums, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(p.counts, counts)


@pytest.mark.parametrize("d", [2, 16, 20])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exact_ties_go_to_lowest_index_in_every_position(d, dtype):
    """Duplicated centroids inside a group of 4, across groups and in the remainder."""
    rng = np.random.default_rng(d)
    base = rng.normal(size=(6, d)).astype(dtype)
    # positions: 0..3 first group, 4..7 second, 8..9 remainder
    C = np.stack(
        [base[0], base[1], base[1], base[2], base[0], base[3], base[2], base[4], base[3], base[5]]
    )
    first = {0: 0, 1: 1, 2: 3, 3: 5, 4: 7, 5: 9}
    X = rng.normal(size=(300, d)).astype(dtype)
    X[:6] = base  # rows exactly on a duplicated centroid (distance 0)
    # (OpenBLAS's float32 products, NumPy 1.24's and 2.4's on some processors, round identical
    # centroid columns in different positions apart: the product-based paths map labels to first copies.)
    labels, d2 = assign(X, C)
    expected = np.array([first[j] for j in brute_sq(X, base).argmin(1)])
    np.testing.assert_array_equal(labels, expected)
    np.testing.assert_array_equal(d2[:6], 0)
    p = assign_partials(X, C)
    assert not p.counts[[2, 4, 6, 8]].any()  # the later copies never win


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("block_bytes", [1, 2**30])
def test_streamed_kernel_over_centroid_blocks(monkeypatch, dtype, block_bytes):
    """d > 16: centroids packed in groups of 8 and, with a 1-byte budget, taken one group at a
    time, the running minimum carried from block to block; a tie across blocks goes to the
    lowest index and the padding of the last group is never chosen."""
    monkeypatch.setattr(
        importlib.import_module("dkmeans.kernels.nearest"), "STREAM_BLOCK_BYTES", block_bytes
    )
    rng = np.random.default_rng(11)
    X = rng.normal(size=(700, 20)).astype(dtype)
    C = rng.normal(size=(37, 20)).astype(dtype)
    C[30] = C[3]  # groups 0 and 3
    X[:5] = C[3]
    X[5:9] = 0  # nearer to the zero padding (centroids 37..39) than to any centroid
    C += 3 * np.sign(C)
    X[:5] = C[3]
    D = brute_sq(X, C)
    labels, d2 = assign(X, C)
    np.testing.assert_array_equal(labels, D.argmin(1))
    assert (labels[:5] == 3).all() and (labels < 37).all()
    lab, dmin, sums, counts, obj = _brute_partials(X, C)
    p = assign_partials(X, C)
    np.testing.assert_allclose(p.sums, sums, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(p.counts, counts)
    np.testing.assert_allclose(float(p.objective), obj, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_non_contiguous_and_mixed_dtype_input():
    rng = np.random.default_rng(2)
    X = np.asfortranarray(rng.normal(size=(300, 12)).astype(np.float32))
    C = rng.normal(size=(5, 12))  # float64 centroids for float32 rows: cast to float32
    labels, d2 = assign(X[::2], C)
    D = brute_sq(X[::2], C.astype(np.float32))
    np.testing.assert_array_equal(labels, D.argmin(1))
    assert d2.dtype == np.float32


def test_compiled_paths_agree_with_each_other():
    """The direct loop and the BLAS path give the same labels and partials."""
    import dask

    rng = np.random.default_rng(4)
    X = rng.normal(size=(3000, 16)).astype(np.float32)
    C = X[rng.choice(3000, 70, replace=False)]
    out = {}
    for eng in ("auto", "blas"):
        with dask.config.set({"dkmeans.kernels.backend": eng}):
            out[eng] = (assign(X, C), assign_partials(X, C))
    np.testing.assert_array_equal(out["auto"][0][0], out["blas"][0][0])
    np.testing.assert_allclose(out["auto"][1].sums, out["blas"][1].sums, rtol=1e-12)


@pytest.mark.parametrize("width, d", [(4, 3), (None, 21)])
def test_direct_kernel_without_a_cache_directory(monkeypatch, width, d):
    """When no directory is writable the generated loop is compiled in memory."""
    numba_mod = pytest.importorskip("dkmeans.kernels.backends.compiled")
    monkeypatch.setattr(numba_mod, "_write_source", lambda name, source: None)
    module = numba_mod._load_source(f"test_in_memory_{width}", numba_mod.direct_source(width))
    kernel = getattr(module, f"direct_{width or 'streamed'}")
    X = np.random.default_rng(0).normal(size=(50, d))
    C = X[:5].copy()
    labels = np.empty(50, np.int32)
    empty = np.empty(0)
    kernel(
        X,
        C,
        0.5 * (C * C).sum(1),
        16,
        1,
        labels,
        empty,
        empty,
        False,
        np.zeros((0, 0)),
        empty,
        int(numba_mod.Output.LABELS),
    )
    np.testing.assert_array_equal(labels, brute_sq(X, C).argmin(1))


def test_moments_of_a_chunk_in_many_tiles_match_numpy(monkeypatch):
    """The chunk is read in row tiles (bounded scratch); far-from-zero columns keep their accuracy."""
    import dkmeans.kernels.stats as stats

    rng = np.random.default_rng(3)
    X = (rng.standard_normal((1001, 5)) * [1, 10, 1e-3, 5, 2] + [0, 1e4, -3, 7e5, 1]).astype(
        np.float32
    )
    monkeypatch.setattr(stats, "MOMENTS_TILE_BYTES", 16 * 5 * 64)  # 64 rows per tile: 16 tiles
    m = column_moments(X)
    X64 = X.astype(np.float64)
    assert float(m.count) == 1001
    np.testing.assert_allclose(m.mean, X64.mean(0), rtol=1e-12)
    np.testing.assert_allclose(m.m2 / m.count, X64.var(0), rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 3, 4, 5, 8, 12, 16, 17, 24])
def test_tile_transpose_copies_exactly_and_only_the_tile(d, dtype):
    """The shuffled blocks (8 or 4 wide) and the element-by-element rest give ``X[i0:i0+m].T``."""
    simd = pytest.importorskip("dkmeans.kernels.backends.simd")
    rng = np.random.default_rng(d)
    X = rng.normal(size=(203, d)).astype(dtype)
    for i0, m in [(0, 203), (5, 64), (17, 13), (200, 3), (9, 1)]:
        XT = np.full((d + 2, 70 if m < 70 else 210), -7.0, dtype=dtype)
        simd.transpose_tile(X, i0, m, XT)
        np.testing.assert_array_equal(XT[:d, :m], X[i0 : i0 + m].T)
        assert (XT[d:] == -7).all() and (XT[:, m:] == -7).all()  # nothing written outside the tile


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_refill_partials_equal_a_full_assignment(sparse, weighted):
    """Partials formed from the nearest live centroid plus the refilled ones equal a full
    assignment, exact ties included (a duplicate of a live centroid: the lower index wins)."""
    import scipy.sparse as sp

    from dkmeans.kernels.nearest import nearest_sq64, refill_partials

    rng = np.random.default_rng(4)
    X = rng.normal(size=(500, 6))
    if sparse:
        X[rng.random(X.shape) < 0.6] = 0.0
    C = X[rng.choice(500, 30, replace=False)].copy()
    C[17] = C[5]  # refilled 17 ties live 5: rows stay at 5
    C[3] = C[20]  # refilled 3 ties live 20: rows go to 3
    refill = np.array([3, 17, 22])
    live = np.setdiff1d(np.arange(30), refill)
    w = rng.uniform(0.5, 2.0, 500) if weighted else None
    Xin = sp.csr_matrix(X) if sparse else X
    labels, d2 = nearest_sq64(Xin, C[live])
    got = refill_partials(Xin, labels, d2, C[live], C[refill], live, refill, 30, w)
    ref = assign_partials(Xin, C, w)
    np.testing.assert_allclose(got.counts, ref.counts, rtol=1e-12)
    np.testing.assert_allclose(got.sums, ref.sums, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.objective, ref.objective, rtol=1e-10)
    assert got.counts[5] > 0 and got.counts[17] == 0 and got.counts[3] > 0 and got.counts[20] == 0


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("mode", ["off", "eager"])
def test_refill_partials_break_cosine_ties_as_a_full_assignment(sparse, mode):
    """Unit rows orthogonal to every centroid (common in sparse text): their squared distances
    2 differ only by the rounding of each centroid's norm, and a full assignment gives them to
    the lowest index; the refill shortcut does the same."""
    import dask
    import scipy.sparse as sp

    from dkmeans.kernels.cosine import normalize_rows
    from dkmeans.kernels.nearest import nearest_sq64, refill_partials

    rng = np.random.default_rng(7)
    X = np.abs(rng.normal(size=(400, 60)))
    X[:200, 20:] = 0.0  # rows 0-199 live in features 0-19, where no centroid has weight
    X[200:, :20] = 0.0
    X = normalize_rows(X * rng.uniform(0.5, 2.0, size=(400, 1)))
    C = np.abs(rng.normal(size=(12, 60)))
    C[:, :20] = 0.0
    C = normalize_rows(C * rng.uniform(0.5, 2.0, size=(12, 1)))
    refill = np.array([0, 2, 7])
    live = np.setdiff1d(np.arange(12), refill)
    Xin = sp.csr_matrix(X) if sparse else X
    with dask.config.set({"dkmeans.compile": mode}):
        labels, d2 = nearest_sq64(Xin, C[live])
        got = refill_partials(Xin, labels, d2, C[live], C[refill], live, refill, 12)
        ref = assign_partials(Xin, C)
    np.testing.assert_array_equal(got.counts, ref.counts)
    np.testing.assert_allclose(got.sums, ref.sums, rtol=1e-10, atol=1e-12)
