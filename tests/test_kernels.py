"""Kernels against brute-force float64 references (NumPy, and CuPy where present)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from dkmeans.backend import to_host
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


@pytest.fixture(autouse=True, params=["auto", "blas", "xp"])
def engine(request, monkeypatch):
    """Every kernel test runs with each NumPy path: compiled per shape (a direct loop for
    small d), compiled with BLAS always, and the namespace code."""
    monkeypatch.setattr(importlib.import_module("dkmeans.kernels.assign"), "ENGINE", request.param)
    return request.param


def brute_sq(X, C):
    X = np.asarray(X, np.float64)
    C = np.asarray(C, np.float64)
    return ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)


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
    labels, d2 = assign(xp.asarray(X.astype(dtype)), xp.asarray(C.astype(dtype)), scratch_bytes=scratch)
    labels, d2 = to_host(labels), to_host(d2)
    D = brute_sq(X.astype(dtype), C.astype(dtype))
    assert labels.dtype == np.int32 and d2.dtype == dtype
    np.testing.assert_array_equal(labels, D.argmin(1))
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(d2, D.min(1), rtol=rtol)


def test_assign_centroid_blocks_equal_single_block(monkeypatch, data):
    """Tiling over centroids (large k) gives the same labels as one block."""
    mod = importlib.import_module("dkmeans.kernels.assign")

    X, C = data
    full = assign(X, C)[0]
    monkeypatch.setattr(mod, "MAX_CENTROID_BLOCK", 5)
    np.testing.assert_array_equal(assign(X, C, scratch_bytes=512)[0], full)


def test_ties_go_to_lowest_index(monkeypatch):
    mod = importlib.import_module("dkmeans.kernels.assign")

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
    p = assign_partials(xp.asarray(X), xp.asarray(C), None if w is None else xp.asarray(w), scratch_bytes=4096)
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
    assert p.sums.shape == (4, 3) and not p.sums.any() and not p.counts.any() and float(p.objective) == 0


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
