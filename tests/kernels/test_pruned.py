"""The pruned assignment against the unpruned kernel (to the bit) and float64 bounds references.

Each test runs a short Lloyd sequence twice from the same centroids: once with
:func:`assign_partials` (the unpruned kernel) and once with :func:`pruned_partials` carrying its
bounds from pass to pass. Asserted exactly: the labels equal :func:`assign`'s, the sums, counts
and objective equal the unpruned partials' bit for bit (so the centroid sequences coincide).
Asserted against float64 NumPy distances (from differences): every upper bound is at least the
row's distance to its centroid and every group bound at most the distance to any other centroid
of the group.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dkmeans.kernels import assign, assign_partials, update_centroids
from dkmeans.kernels.backends.select import Backend
from dkmeans.kernels.nearest import _backend
from dkmeans.kernels.pruned import (
    CentroidGroups,
    centroid_groups,
    combine_pruned,
    group_count,
    pruned_partials,
)
from dkmeans.testing import make_blobs


def _drift(new, old):
    diff = new.astype(np.float64) - old.astype(np.float64)
    return np.sqrt(np.einsum("ij,ij->i", diff, diff)) * (1 + 2.0**-40)


def _check_bounds(X, C, state, groups):
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    D = np.sqrt(((X64[:, None, :] - C64[None, :, :]) ** 2).sum(axis=2))
    rows = np.arange(len(X))
    labels = state["labels"]
    assert np.all(state["upper"] >= D[rows, labels])
    for g in range(groups.n_groups):
        members = groups.order[groups.starts[g] : groups.starts[g + 1]]
        Dg = D[:, members].copy()
        Dg[labels[:, None] == members[None, :]] = np.inf
        assert np.all(state["lower"][g].astype(np.float64) <= Dg.min(axis=1))


def run_both(X, C0, iters, weights=None, n_groups=None, check_bounds=True):
    """Lloyd ``iters`` passes unpruned and pruned; asserts equality each pass; returns the fractions computed."""
    k = len(C0)
    groups = centroid_groups(C0, n_groups or group_count(k, X.shape[1], X.dtype.itemsize), token=1)
    C = C0.astype(X.dtype)
    state, previous, fractions = None, None, []
    prunable = (
        _backend(X, k) is Backend.COMPILED
    )  # d > 16 with k < 3 takes BLAS: the unpruned partials
    for _ in range(iters):
        ref = assign_partials(X, C, weights)
        drift = None if previous is None else _drift(C, previous)
        state, out = pruned_partials(X, C, state, weights, groups, drift)
        assert out.pruned == prunable
        if prunable:
            np.testing.assert_array_equal(state["labels"], assign(X, C)[0])
        np.testing.assert_array_equal(out.partials.sums, ref.sums)
        np.testing.assert_array_equal(out.partials.counts, ref.counts)
        assert float(out.partials.objective) == float(ref.objective)
        if check_bounds and prunable:
            _check_bounds(X, C, state, groups)
        fractions.append(out.distances / out.pairs)
        new, empty = update_centroids(ref, C)
        previous, C = C, new.astype(X.dtype)
    return fractions


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d,k", [(2, 3), (7, 20), (16, 40), (24, 64), (33, 9)])
def test_equals_unpruned_and_bounds_hold(dtype, d, k):
    X, _, _ = make_blobs(1500, d, max(2, k // 2), spread=2.0, box=6.0, seed=d + k, dtype=dtype)
    C0 = X[np.random.default_rng(k).choice(len(X), k, replace=False)]
    fractions = run_both(X, C0, 8)
    assert fractions[0] >= 1.0  # the first pass builds the bounds: every distance


def test_well_separated_blobs_compute_few_distances():
    X, _, centers = make_blobs(4000, 16, 40, spread=0.3, box=20.0, seed=5, dtype=np.float32)
    C0 = (centers + 0.5).astype(np.float32)
    fractions = run_both(X, C0, 6, check_bounds=False)
    assert fractions[-1] < 0.2, fractions


def test_weights_and_zero_weights():
    X, _, _ = make_blobs(1200, 5, 8, spread=2.0, box=5.0, seed=2, dtype=np.float32)
    w = np.random.default_rng(0).uniform(0, 3, len(X))
    w[:100] = 0.0
    run_both(X, X[:12].copy(), 6, weights=w)


def test_duplicated_rows_and_centroids_tie_to_the_lowest_index():
    rng = np.random.default_rng(1)
    base = rng.normal(size=(30, 6)).astype(np.float32)
    X = np.repeat(base, 20, axis=0)
    C0 = np.concatenate([base[:5], base[:5], base[5:10]])  # exact duplicates: every score ties
    run_both(X, C0, 5)
    mid = np.concatenate([(base[:1] + base[1:2]) / 2] * 50)  # rows midway between two centroids
    run_both(
        np.concatenate([X, mid]).astype(np.float32),
        np.concatenate([base[:1], base[1:2], base[2:6]]),
        4,
    )


def test_k_close_to_n_and_k_two():
    X = np.random.default_rng(4).normal(size=(40, 3))
    run_both(X, X[:38].copy(), 4)
    run_both(X, X[:2].copy(), 4)


def test_other_backends_are_not_pruned():
    X = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32)
    C = X[:5].copy()
    with dask.config.set({"dkmeans.kernels.backend": "numpy"}):
        state, out = pruned_partials(X, C, None, None, centroid_groups(C, 1))
    assert state is None and not out.pruned and out.distances == out.pairs
    ref = assign_partials(X, C)
    np.testing.assert_array_equal(out.partials.sums, ref.sums)


def test_empty_chunk_and_combine():
    C = np.eye(3, dtype=np.float32)
    groups = centroid_groups(C, 1)
    state, empty = pruned_partials(np.empty((0, 3), np.float32), C, None, None, groups)
    X = np.eye(3, dtype=np.float32)
    _, full = pruned_partials(X, C, None, None, groups)
    both = combine_pruned([empty, full])
    np.testing.assert_array_equal(both.partials.counts, [1, 1, 1])
    assert both.pairs == 9 and both.pruned


def test_groups_partition_the_centroids():
    C = np.random.default_rng(0).normal(size=(100, 4))
    groups = centroid_groups(C, 10)
    assert isinstance(groups, CentroidGroups)
    assert sorted(groups.order.tolist()) == list(range(100))
    assert groups.starts[0] == 0 and groups.starts[-1] == 100 and np.all(np.diff(groups.starts) > 0)
    for g in range(groups.n_groups):
        assert np.all(groups.group_of[groups.order[groups.starts[g] : groups.starts[g + 1]]] == g)
    assert (
        group_count(1, 4, 4) == 1
        and group_count(10_000, 128, 4) == 16 * 4
        and group_count(2048, 16, 4) == 8
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 120),
    d=st.integers(1, 20),
    k=st.integers(2, 30),
    dup=st.integers(1, 4),
    dtype=st.sampled_from([np.float32, np.float64]),
    weighted=st.booleans(),
    seed=st.integers(0, 2**16),
    n_groups=st.integers(1, 6),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
    offset=st.sampled_from([0.0, 100.0]),
)
def test_property_equals_unpruned(n, d, k, dup, dtype, weighted, seed, n_groups, scale, offset):
    rng = np.random.default_rng(seed)
    X = (offset + scale * np.repeat(rng.integers(-3, 4, size=(n, d)) / 2.0, dup, axis=0)).astype(
        dtype
    )
    k = min(k, len(X))
    C0 = X[rng.choice(len(X), k, replace=False)]
    w = rng.uniform(0, 2, len(X)) if weighted else None
    run_both(X, C0, 4, weights=w, n_groups=n_groups)


def _far_move_case():
    X, _, centers = make_blobs(3000, 8, 30, spread=0.5, box=20.0, seed=4, dtype=np.float32)
    C0 = centers.astype(np.float32)
    groups = centroid_groups(C0, 3, token=1)
    state, _ = pruned_partials(X, C0, None, None, groups)
    return X, C0, groups, state


def test_a_chunk_whose_rows_all_fail_the_first_test_takes_the_unpruned_kernel():
    """Centroids that moved across the data leave no row settled: with ``plain_above`` set the sample's
    estimate sends the chunk to the unpruned kernel (its partials to the bit); it marks its bounds
    stale, and the next pass builds them into the same arrays, as a build from nothing would."""
    X, C0, groups, state = _far_move_case()
    arrays = {key: state[key] for key in ("labels", "upper", "lower", "norm")}
    C1 = C0[::-1].copy()  # every centroid jumps to another blob
    state, out = pruned_partials(X, C1, state, None, groups, _drift(C1, C0), plain_above=0.3)
    assert state["token"] is None and out.pruned and out.distances == out.pairs
    ref = assign_partials(X, C1)
    np.testing.assert_array_equal(out.partials.sums, ref.sums)
    np.testing.assert_array_equal(out.partials.counts, ref.counts)
    assert float(out.partials.objective) == float(ref.objective)
    C2 = C1 + np.float32(0.01)
    rebuilt, out2 = pruned_partials(X, C2, state, None, groups, _drift(C2, C1), plain_above=0.3)
    fresh, out3 = pruned_partials(X, C2, None, None, groups)
    assert all(rebuilt[key] is arrays[key] for key in arrays)
    assert rebuilt["token"] == groups.token and out2.distances == out3.distances
    for key in arrays:
        np.testing.assert_array_equal(rebuilt[key], fresh[key])
    assert rebuilt["lmax"] == fresh["lmax"]
    np.testing.assert_array_equal(out2.partials.sums, out3.partials.sums)


@pytest.mark.parametrize("plain_above,falls_back", [(0.0, True), (1.0, False)])
def test_the_sampled_estimate_decides_where_some_rows_fail(plain_above, falls_back):
    """Where some rows, not nearly all, fail the first test, a sample of them estimates the pairs to
    compute: above ``plain_above`` (0: any) the unpruned kernel, below it the pruned pass; both
    give the unpruned partials, and the pruned pass's bounds still hold."""
    X, C0, groups, state = _far_move_case()
    C1 = C0.copy()
    C1[:3] += np.float32(5.0)  # three centroids move: a tenth of the rows fail, the others settle
    state, out = pruned_partials(
        X, C1, state, None, groups, _drift(C1, C0), plain_above=plain_above
    )
    assert (state["token"] is None) == falls_back and out.pruned
    assert (out.distances == out.pairs) == falls_back
    ref = assign_partials(X, C1)
    np.testing.assert_array_equal(out.partials.sums, ref.sums)
    assert float(out.partials.objective) == float(ref.objective)
    if not falls_back:
        np.testing.assert_array_equal(state["labels"], assign(X, C1)[0])
        _check_bounds(X, C1, state, groups)


def _pairs_after_the_bounds(X, C, state, groups, drift):
    """The pairs a pruned pass scores, counted by its own steps (settle, tighten, group needs) on a copy."""
    from dkmeans.kernels import pruned
    from dkmeans.kernels.backends import compiled_pruned as loops

    state = {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in state.items()}
    prep = pruned._prepare(C, groups)
    shift = loops.float32_shift(
        np.maximum.reduceat(drift[groups.order], groups.starts[:-1]), state["lmax"]
    )
    n = len(X)
    cand, lmin = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.float32)
    args = (state["labels"], state["upper"], state["lower"], state["norm"])
    m = loops.settle(*args, drift, shift, prep.k0, prep.k1, cand, lmin)
    m = loops.tighten(
        X, C, state["labels"], state["upper"], lmin, state["norm"], prep.k0, prep.k1, cand, m
    )
    need = np.empty((groups.n_groups, m), dtype=np.bool_)
    loops.group_needs(*args, prep.k0, prep.k1, groups.group_of, cand, m, need)
    return float(need.sum(axis=1) @ np.diff(groups.starts)), (prep, shift)


@pytest.mark.parametrize("moved", [0, 3, 30])
def test_sampled_pairs_estimate_the_pass_before_any_per_row_work(moved):
    """:func:`sampled_pairs` reads the state only; over every row (stride 1) it counts the pairs the
    pass's own steps count (up to the last bits of an upper bound's sum), and every 32nd row
    estimates them within a factor of 2 (or both are small)."""
    from dkmeans.kernels.backends import compiled_pruned as loops

    X, C0, groups, state = _far_move_case()
    C1 = C0.copy()
    C1[:moved] += np.float32(5.0)
    drift = _drift(C1, C0)
    truth, (prep, shift) = _pairs_after_the_bounds(X, C1, state, groups, drift)
    before = {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in state.items()}
    widths = np.diff(groups.starts)

    def estimate(stride):
        return loops.sampled_pairs(
            X,
            C1,
            state["labels"],
            state["upper"],
            state["lower"],
            state["norm"],
            drift,
            shift,
            prep.k0,
            prep.k1,
            groups.group_of,
            widths,
            stride,
        )

    every = estimate(1)
    assert abs(every - truth) <= 0.002 * len(X) * len(C1)
    sampled = estimate(32)
    pairs = len(X) * len(C1)
    assert (truth < 0.01 * pairs and sampled < 0.05 * pairs) or truth / 2 <= sampled <= 2 * truth
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(state[key], value)
    if moved == 30:
        assert truth > 0.2 * pairs
    if moved == 0:
        assert truth < 0.01 * pairs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "d,k,n_groups,block_packs",
    [(3, 5, 3, 1), (24, 17, 3, 1), (128, 40, 3, 2), (16, 70, 7, 3), (40, 200, 20, 100)],
)
def test_fused_group_minima_against_float64(dtype, d, k, n_groups, block_packs):
    """The build's group minima (the streamed products folded in registers, tile by tile, a short last
    tile, groups that start and end inside packs of centroids and blocks of packs) against float64
    NumPy scores: the smallest and second smallest score of every group within rounding, and the
    same centroid where the runner-up trails clearly."""
    from dkmeans.kernels import pruned
    from dkmeans.kernels.backends import compiled_pruned as loops

    rng = np.random.default_rng(d + k)
    X = rng.normal(size=(300, d)).astype(dtype)
    C = rng.normal(size=(k, d)).astype(dtype)
    groups = centroid_groups(C, n_groups)
    Cp = np.ascontiguousarray(C[groups.order])
    h = (0.5 * np.einsum("ij,ij->i", Cp, Cp)).astype(dtype)
    G, n, T = groups.n_groups, len(X), 64
    call_rows = loops.STREAM_ROW_VECTORS * loops.VECTOR_BYTES // np.dtype(dtype).itemsize
    cols = -(-T // call_rows) * call_rows
    gm, gs = np.empty((G, n), dtype), np.empty((G, n), dtype)
    gi = np.zeros((G, n), np.int32)
    CG, h_pad, pack_group = pruned._packed(Cp, h, groups)
    loops.fused_minima(
        X,
        CG,
        block_packs,
        h_pad,
        pack_group,
        groups.order,
        T,
        np.zeros((d, cols), dtype),
        gm,
        gi,
        gs,
    )
    scores = h.astype(np.float64)[None, :] - X.astype(np.float64) @ Cp.astype(np.float64).T
    tol = (1e-4 if dtype == np.float32 else 1e-12) * (1 + np.abs(scores).max())
    for g in range(G):
        part = scores[:, groups.starts[g] : groups.starts[g + 1]]
        two = np.sort(part, axis=1)[:, :2] if part.shape[1] > 1 else np.c_[part, np.full(n, np.inf)]
        np.testing.assert_allclose(gm[g], two[:, 0], atol=tol)
        finite = np.isfinite(two[:, 1])
        np.testing.assert_allclose(gs[g][finite], two[finite, 1], atol=tol)
        assert np.all(np.isinf(gs[g][~finite]))
        clear = two[:, 1] - two[:, 0] > 4 * tol
        np.testing.assert_array_equal(
            gi[g][clear], groups.order[groups.starts[g] + part.argmin(axis=1)][clear]
        )


def test_many_centroids_in_wide_groups():
    """Many centroids in few, wide groups (each group spans many packs and blocks of packs): the
    build and the passes after it equal the unpruned kernel to the bit, and the bounds hold."""
    X, _, _ = make_blobs(1500, 24, 16, spread=2.0, box=6.0, seed=7, dtype=np.float32)
    run_both(X, X[np.random.default_rng(7).choice(len(X), 600, replace=False)], 4, n_groups=3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_centroids_that_jump_far_are_scored_exactly(dtype, weighted):
    """A swap's centroids (a few jump across the data) after a settled pass: the far-moved ones are
    scored for every row (far_centroids), the pass equals the unpruned kernel to the bit, the bounds
    hold against float64 distances, and it computes far fewer distances than shifting their groups."""
    from dkmeans.kernels.pruned import far_centroids

    X, _, centers = make_blobs(6000, 24, 48, spread=0.6, box=12.0, seed=11, dtype=dtype)
    w = np.random.default_rng(3).uniform(0, 2, len(X)) if weighted else None
    k = 96
    C0 = X[np.random.default_rng(5).choice(len(X), k, replace=False)]
    C = C0
    for _ in range(6):  # near Lloyd's fixed point: the bounds settle nearly every row
        C = update_centroids(assign_partials(X, C, w), C)[0].astype(dtype)
    groups = centroid_groups(C, group_count(k, X.shape[1], X.dtype.itemsize), token=7)
    state, _ = pruned_partials(X, C, None, w, groups)
    moved = C.copy()
    jumpers = np.array([3, 40, 41, 77])  # to rows far from where they were (one each, as swaps do)
    rng = np.random.default_rng(9)
    for j in jumpers:
        far_rows = np.flatnonzero(np.linalg.norm(X - C[j], axis=1) > 15.0)
        moved[j] = X[rng.choice(far_rows)]
    moved[:] += rng.normal(scale=1e-3, size=moved.shape).astype(dtype)  # and the others a little
    drift = _drift(moved, C)
    assert set(far_centroids(drift, state, groups)) == set(jumpers)
    results = {}
    for far in (True, False):
        st = {
            key: (value.copy() if isinstance(value, np.ndarray) else value)
            for key, value in state.items()
        }
        st, out = pruned_partials(X, moved, st, w, groups, drift, far=far)
        ref = assign_partials(X, moved, w)
        np.testing.assert_array_equal(st["labels"], assign(X, moved)[0])
        np.testing.assert_array_equal(out.partials.sums, ref.sums)
        np.testing.assert_array_equal(out.partials.counts, ref.counts)
        assert float(out.partials.objective) == float(ref.objective)
        _check_bounds(X, moved, st, groups)
        results[far] = out.distances / out.pairs
    assert results[True] < 0.5 * results[False] and results[True] < 0.2, results
    # a second pass from the far path's bounds still equals the kernel
    st = {
        key: (value.copy() if isinstance(value, np.ndarray) else value)
        for key, value in state.items()
    }
    st, _ = pruned_partials(X, moved, st, w, groups, drift)
    new = update_centroids(assign_partials(X, moved, w), moved)[0].astype(dtype)
    st, out = pruned_partials(X, new, st, w, groups, _drift(new, moved))
    np.testing.assert_array_equal(st["labels"], assign(X, new)[0])
    _check_bounds(X, new, st, groups)


def test_far_centroids_only_where_it_pays():
    """Small drifts (Lloyd's late tail) leave no centroid to score exactly, even heavy-tailed ones;
    at most k / 16 are taken, the farthest."""
    from dkmeans.kernels.pruned import far_centroids

    X, _, _ = make_blobs(3000, 16, 32, spread=0.5, box=12.0, seed=2, dtype=np.float32)
    k = 64
    C = X[np.random.default_rng(1).choice(len(X), k, replace=False)]
    for _ in range(5):
        C = update_centroids(assign_partials(X, C), C)[0].astype(np.float32)
    groups = centroid_groups(C, 6, token=3)
    state, _ = pruned_partials(X, C, None, None, groups)
    tail = np.full(k, 1e-6)
    tail[:3] = 1e-4  # 100x the others, still far below every bound's gap
    assert far_centroids(tail, state, groups).size == 0
    jumps = np.full(k, 1e-6)
    jumps[10:16] = np.arange(10, 16) * 10.0
    assert list(far_centroids(jumps, state, groups)) == [12, 13, 14, 15]  # k / 16 = 4: the farthest
