"""Large k: the two-level seeding, its invariances, bounded kernel scratch, and the memory budget.

The two-level path runs from ``n_clusters >= dkmeans.init.two-level-clusters`` (default
4096); the tests lower that threshold (the config key, or ``InitOptions``) so that small
shapes take the same code path. The benchmark-sized checks (k = 65,536 and 262,144) are in
``benchmarks/large_k.py``.
"""

from __future__ import annotations

import importlib
import tracemalloc

import dask
import dask.array as da
import numpy as np
import pytest

import dkmeans
from dkmeans import kernels
from dkmeans.drivers.init import InitOptions
from dkmeans.drivers.init.kmeans_parallel import kmeans_parallel
from dkmeans.drivers.init.two_level import draw_sample, split_clusters, two_level, two_level_centres
from dkmeans.engine.local import ChunkList
from dkmeans.engine.memory import MemoryBudget
from dkmeans.kernels.common import DEFAULT_SCRATCH_BYTES, centroid_bytes
from dkmeans.kernels.seeding import bernoulli_rows, concat_sample_rows, local_kmeans_plusplus
from dkmeans.testing import make_blobs, persist_rows

# the module itself (the package exports a function of that name)
assign_module = importlib.import_module("dkmeans.kernels.nearest")

TWO_LEVEL = InitOptions(two_level_min_clusters=1)


@pytest.fixture(scope="module")
def many():
    """6,000 x 8 float32 rows around 400 centres."""
    X, _, _ = make_blobs(6000, 8, 400, spread=0.5, box=40.0, seed=4)
    return X.astype(np.float32)


def brute_labels(X, C):
    """Nearest centroid in float64 and each row's gap to its second nearest (for near-ties)."""
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    D = (X64**2).sum(1)[:, None] - 2 * X64 @ C64.T + (C64**2).sum(1)[None, :]
    part = np.partition(D, 1, axis=1)
    return D.argmin(1), part[:, 1] - part[:, 0], D


# -- pieces --------------------------------------------------------------------------------------
def test_split_clusters_proportional_capped_and_complete():
    np.testing.assert_array_equal(split_clusters([10, 10, 10], [1.0, 1.0, 2.0], 8), [2, 2, 4])
    # largest remainders: shares 2.5, 2.5, 5 of 10 -> 3, 2, 5 (ties to the lower group)
    np.testing.assert_array_equal(split_clusters([10, 10, 10], [1.0, 1.0, 2.0], 10), [3, 2, 5])
    # a group cannot take more centres than rows: the rest goes to the others
    alloc = split_clusters([1, 50, 50], [100.0, 1.0, 1.0], 20)
    assert alloc.sum() == 20 and alloc[0] == 1 and (alloc <= [1, 50, 50]).all()
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = rng.integers(0, 30, size=12)
        k = int(rng.integers(1, sizes.sum() + 1))
        alloc = split_clusters(sizes, sizes * rng.uniform(0.5, 2, size=12), k)
        assert alloc.sum() == k and (alloc <= sizes).all() and (alloc >= 0).all()


def test_local_kmeans_plusplus_compiled_equals_namespace_code_and_picks_distinct_rows():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(500, 6))
    w = rng.uniform(0, 2, size=500)
    w[::7] = 0.0
    for trials in (1, 3):
        a = local_kmeans_plusplus(X, w, 40, seed=9, stream=3, trials=trials)
        with dask.config.set({"dkmeans.kernels.backend": "numpy"}):  # the namespace code
            b = local_kmeans_plusplus(X, w, 40, seed=9, stream=3, trials=trials)
        np.testing.assert_array_equal(a, b)
        assert len(np.unique(a)) == 40 and (w[a] > 0).all()
    # fewer distinct rows than k: the remaining steps repeat the first row (no error)
    few = np.repeat(X[:3], 10, axis=0)
    chosen = local_kmeans_plusplus(few, None, 5, seed=1, stream=1)
    assert len(np.unique(few[chosen], axis=0)) == 3


def test_local_kmeans_plusplus_draws_proportional_to_d2():
    """Second step, one trial: P(row) = w d2 / sum(w d2) from the first row."""
    X = np.array([[0.0], [1.0], [2.0], [4.0]])
    hits = np.zeros(4)
    n = 3000
    for seed in range(n):
        chosen = local_kmeans_plusplus(X, None, 2, seed=seed, stream=0)
        if chosen[0] == 0:
            hits[chosen[1]] += 1
    d2 = X[:, 0] ** 2
    np.testing.assert_allclose(hits / hits.sum(), d2 / d2.sum(), atol=0.04)


def test_bernoulli_sample_does_not_depend_on_chunking(many):
    w = np.random.default_rng(2).uniform(0, 2, size=len(many))
    w[:100] = 0.0
    whole = bernoulli_rows(many, w, 0, 0.3, seed=5, stream=40)
    bounds = [0, 17, 2000, 2001, 4500, len(many)]
    parts = [
        bernoulli_rows(many[a:b], w[a:b], a, 0.3, seed=5, stream=40)
        for a, b in zip(bounds, bounds[1:])
    ]
    joined = concat_sample_rows(parts[::-1])  # any order: combined in row order
    np.testing.assert_array_equal(joined.index, whole.index)
    np.testing.assert_array_equal(joined.rows, many[whole.index])
    np.testing.assert_array_equal(joined.weights, w[whole.index])
    assert (whole.index >= 100).all()  # zero weight: never drawn
    assert abs(len(whole.index) / (len(many) - 100) - 0.3) < 0.03
    assert len(bernoulli_rows(many, None, 0, 1.0, seed=5, stream=40).index) == len(many)


# -- the seeding ---------------------------------------------------------------------------------
def test_two_level_centres_beat_kmeans_plusplus_on_overlapping_clusters():
    """Many overlapping clusters (the large-k regime): lower objective than scikit-learn's greedy k-means++.

    (On exactly k well-separated blobs, the proportional split of k among coarse groups can
    leave a blob straddling two groups without a centre; Lloyd then keeps that local minimum.)
    """
    from sklearn.cluster import kmeans_plusplus

    X, _, _ = make_blobs(6000, 8, 2000, spread=2.0, box=20.0, seed=4)
    X = X.astype(np.float32)
    k = 400
    C = two_level_centres(X, np.ones(len(X)), k, seed=3)
    assert C.shape == (k, 8) and np.isfinite(C).all()
    ours = brute_labels(X, C)[2].min(1).sum()
    theirs = (
        brute_labels(X, kmeans_plusplus(X.astype(np.float64), k, random_state=0)[0])[2].min(1).sum()
    )
    assert ours < theirs
    # threads do not change the result
    np.testing.assert_array_equal(two_level_centres(X, np.ones(len(X)), k, seed=3, threads=1), C)


def test_kmeans_parallel_takes_two_level_from_threshold(many):
    data = ChunkList.from_array(many, None)
    C = kmeans_parallel(data, 300, seed=7, options=TWO_LEVEL)
    expected = two_level(data, 300, 7, TWO_LEVEL)
    np.testing.assert_array_equal(C, expected)
    assert C.dtype == np.float32
    below = kmeans_parallel(data, 300, seed=7, options=InitOptions(two_level_min_clusters=301))
    assert not np.array_equal(below, C)


def test_two_level_does_not_depend_on_chunking_or_workers(client, single_worker_client, many):
    w = np.random.default_rng(3).uniform(0.5, 2.0, size=len(many))
    reference = two_level(ChunkList.from_array(many, w), 250, 11, TWO_LEVEL)
    for c, chunks in ((client, 1), (client, 7), (single_worker_client, 5)):
        got = kmeans_parallel(persist_rows(c, many, chunks, w), 250, 11, TWO_LEVEL)
        np.testing.assert_array_equal(got, reference)


def test_sample_size_about_per_centroid_times_k(client, many):
    sample = draw_sample(persist_rows(client, many, 4), 100, seed=1, per_centroid=8)
    assert 600 < len(sample.index) < 1000
    assert np.all(np.diff(sample.index) > 0)


def test_fit_with_two_level_labels_equal_brute_force(client, many):
    """A Dask fit through the config key: labels and objective equal a float64 brute force on a subset."""
    X = da.from_array(many, chunks=(1000, 8))
    with dask.config.set({"dkmeans.init.two-level-clusters": 200}):
        km = dkmeans.KMeans(n_clusters=300, random_state=0, max_iter=3, local_search=False).fit(X)
        km_again = dkmeans.KMeans(
            n_clusters=300, random_state=0, max_iter=0 + 3, local_search=False
        ).fit(da.from_array(many, chunks=(700, 8)))
    np.testing.assert_allclose(km_again.cluster_centers_, km.cluster_centers_, rtol=1e-5, atol=1e-5)
    subset = np.arange(0, len(many), 7)
    labels = np.asarray(km.labels_)[subset]
    ref, gap, D = brute_labels(many[subset], km.cluster_centers_)
    clear = gap > 1e-4 * D.min(1).clip(1e-3)
    np.testing.assert_array_equal(labels[clear], ref[clear])
    np.testing.assert_allclose(D[np.arange(len(subset)), labels], D.min(1), rtol=1e-4, atol=1e-4)
    _, _, D_all = brute_labels(many, km.cluster_centers_)
    np.testing.assert_allclose(km.inertia_, D_all.min(1).sum(), rtol=1e-4)


def test_cosine_fit_with_two_level(client):
    rng = np.random.default_rng(5)
    dirs = rng.normal(size=(150, 16))
    X = (np.repeat(dirs, 20, axis=0) + 0.05 * rng.normal(size=(3000, 16))).astype(np.float32)
    with dask.config.set({"dkmeans.init.two-level-clusters": 100}):
        km = dkmeans.KMeans(n_clusters=150, metric="cosine", random_state=0, max_iter=3).fit(
            da.from_array(X, chunks=(600, 16))
        )
    C = km.cluster_centers_
    np.testing.assert_allclose(np.linalg.norm(C, axis=1), 1.0, rtol=1e-5)
    Xn = X / np.linalg.norm(X, axis=1, keepdims=True)
    cos = Xn.astype(np.float64) @ C.astype(np.float64).T
    labels = np.asarray(km.labels_)
    best = cos.max(1)
    assert np.all(cos[np.arange(len(X)), labels] >= best - 1e-5)
    np.testing.assert_allclose(km.inertia_, np.sum(1 - best), rtol=1e-4, atol=1e-3)


def test_config_key_is_checked(client, many):
    with (
        dask.config.set({"dkmeans.init.two-level-clusters": 0}),
        pytest.raises(ValueError, match="two-level-clusters"),
    ):
        dkmeans.KMeans(n_clusters=5, random_state=0).fit(many)


# -- kernels: scratch bounded whatever k is ------------------------------------------------------
@pytest.mark.parametrize("k", [5000, 262_144])
def test_plan_tiles_keeps_scratch_under_the_bound(k):
    for d, itemsize in ((16, 4), (64, 4), (256, 8)):
        rows, block = kernels.plan_tiles(1_000_000, k, d, itemsize)
        assert block <= 4096
        assert rows * (block * itemsize + d * (itemsize + 8) + 16) <= DEFAULT_SCRATCH_BYTES


def test_assign_at_large_k_is_exact_and_scratch_bounded(monkeypatch, kernel_backend):
    """k = 9,000 (> one 4,096-centroid block): labels equal float64 brute force; temporaries stay bounded."""
    monkeypatch.setitem(
        dask.config.config, "dkmeans", {**dask.config.get("dkmeans", {}), "compile": "eager"}
    )
    rng = np.random.default_rng(6)
    X = rng.normal(size=(3000, 24)).astype(np.float32)
    C = rng.normal(size=(9000, 24)).astype(np.float32)
    kernels.assign(X[:10], C)  # compile outside the measurement
    kernels.assign_partials(X[:10], C)
    scratch = 2 * 2**20
    tracemalloc.start()
    labels, _ = kernels.assign(X, C, scratch_bytes=scratch)
    _, peak_assign = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    partials = kernels.assign_partials(X, C, scratch_bytes=scratch)
    _, peak_partials = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    ref, gap, _ = brute_labels(X, C)
    clear = gap > 1e-4
    np.testing.assert_array_equal(labels[clear], ref[clear])
    np.testing.assert_allclose(partials.counts.sum(), len(X))
    # outputs and centroid-sized arrays (a float64 copy, the sums) besides the scratch; never n x k
    centroid_sized = centroid_bytes(9000, 24, 4)
    assert peak_assign <= scratch + centroid_sized + X.nbytes
    assert peak_partials <= scratch + centroid_sized + X.nbytes
    assert (
        max(peak_assign, peak_partials) < X.shape[0] * C.shape[0] * 4
    )  # the n x k block was never made


# -- the memory budget ---------------------------------------------------------------------------
def test_memory_budget_counts_centroids():
    assert centroid_bytes(262_144, 16, 4) == 262_144 * (16 * (8 + 8 * 16) + 32)  # 16 float64 copies
    limits = {"a": 4 * 2**30, "b": 4 * 2**30}
    plain = MemoryBudget(limits, DEFAULT_SCRATCH_BYTES)
    large = MemoryBudget(limits, DEFAULT_SCRATCH_BYTES, {}, centroid_bytes(262_144, 16, 4))
    cb = centroid_bytes(262_144, 16, 4)
    assert plain.task_bytes() - large.task_bytes() == pytest.approx(cb)
    assert plain.persist_bytes() - large.persist_bytes() == pytest.approx(2 * cb)


def test_default_fit_at_large_k_keeps_the_local_search_bounded():
    """The default fit (seeding, Lloyd, local search) at k = 1,024: the search's candidate x
    centroid costs stay at 2^22 entries (the old full-data search asked for k x 2k float64:
    16 MiB each here, 64 GiB at k = 65,536), and max_iter bounds the run's Lloyd updates. Where the
    sample holds fewer than 4 rows per cluster the search does not run at all."""
    X = np.random.default_rng(0).normal(size=(20_000, 4)).astype(np.float32)
    tracemalloc.start()
    try:
        km = dkmeans.KMeans(n_clusters=1_024, random_state=0, max_iter=40).fit(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert km.n_iter_ <= 40
    assert any(h.get("algorithm") == "local-search" for h in km.history_)
    assert peak < 400 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    few_rows = dkmeans.KMeans(n_clusters=4_096, random_state=0, max_iter=5).fit(
        X
    )  # 4,096 sample rows: no search
    assert not any(h.get("algorithm") == "local-search" for h in few_rows.history_)
