"""Size-capped assignment: prices moved by counting passes against an optimal-transport reference."""

import dask
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment

from dkmeans.drivers.capacitated import CapacitatedPasses, Capacity
from dkmeans.engine.local import ChunkList
from dkmeans.kernels.capacitated import (
    RepairAsk,
    cost_cache,
    lex_argmin,
    max_sq_distance,
    price_partials,
    priced_labels,
    sq_distances64,
    tie_costs,
)


def transport_cost(X, C, lower, upper, w=None):
    """The optimal capacitated assignment's cost: linear_sum_assignment on replicated columns (float64).

    Each cluster gets ``lower`` mandatory columns (a large cost for the dummy rows that fill the
    matrix to square) and ``upper - lower`` optional ones.
    """
    n, k = len(X), len(C)
    d2 = ((X[:, None, :].astype(np.float64) - C[None].astype(np.float64)) ** 2).sum(-1)
    mandatory, optional = np.repeat(np.arange(k), lower), np.repeat(np.arange(k), upper - lower)
    M = np.concatenate([d2[:, mandatory], d2[:, optional]], axis=1)
    extra = M.shape[1] - n
    dummy = np.concatenate(
        [np.full((extra, mandatory.size), 1e12), np.zeros((extra, optional.size))], axis=1
    )
    M = np.concatenate([M, dummy])
    rows, cols = linear_sum_assignment(M)
    return float(M[rows[:n], cols[:n]].sum())


def solve(X, C, lower, upper, n_chunks=1, w=None):
    data = ChunkList.from_array(X, w, n_chunks=min(n_chunks, len(X)))
    passes = CapacitatedPasses(Capacity(float(lower), float(upper)))
    part = passes.solve(data, C.astype(X.dtype))
    labels, per = passes.labels(data, C.astype(X.dtype))
    return part, labels, per, passes


def check_against_transport(X, C, lower, upper, n_chunks=3):
    """Sizes within the caps; the assignment certified and its objective that of the optimal
    transport (unit weights, k up to EXACT_MAX_K); the dual bound at most it. A CapacityError
    fails the test: the caps are feasible."""
    part, labels, per, passes = solve(X, C, lower, upper, n_chunks=n_chunks)
    k = len(C)
    sizes = np.bincount(labels, minlength=k)
    assert sizes.max() <= upper and sizes.min() >= lower
    np.testing.assert_array_equal(sizes, part.partials.counts)
    reference = transport_cost(X, C, lower, upper)
    objective, bound = passes.bounds
    assert float(per[:, 0].sum()) == pytest.approx(
        float(part.partials.objective), rel=1e-9, abs=1e-9
    )
    assert bound <= reference + 1e-9 * max(1.0, abs(reference))
    assert passes.certified_per_solve[-1] is True
    assert objective == pytest.approx(reference, rel=1e-9, abs=1e-9)
    return passes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 40),
    k=st.integers(1, 6),
    d=st.integers(1, 3),
    seed=st.integers(0, 2**31),
    slack=st.floats(0, 1),
)
def test_max_caps_match_optimal_transport(n, k, d, seed, slack):
    """Sizes within the cap, and the cost of the optimal transport of the same centroids (continuous rows)."""
    k = min(k, n)
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    C = X[rng.choice(n, k, replace=False)] + 0.05 * rng.normal(size=(k, d))
    upper = int(np.ceil(n / k) + slack * (n - np.ceil(n / k)))
    check_against_transport(X, C, 0, upper)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 40),
    k=st.integers(1, 6),
    d=st.integers(1, 3),
    seed=st.integers(0, 2**31),
    duplicates=st.booleans(),
)
def test_balanced_caps_against_optimal_transport(n, k, d, seed, duplicates):
    """Both caps of balanced=True (sizes within one of n/k), duplicated rows too: never a CapacityError."""
    k = min(k, n)
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    if duplicates:
        X = X[rng.integers(0, max(1, n // 3), size=n)]
    C = X[rng.choice(n, k, replace=False)] + 0.05 * rng.normal(size=(k, d))
    check_against_transport(X, C, n // k, -(-n // k))


def test_hand_computed_split_of_duplicates():
    """Five equal rows, two equal centroids, cap 3: the split follows the rows' index hash, whatever the chunks."""
    X = np.zeros((5, 2))
    C = np.array([[1.0, 0.0], [0.0, 1.0]])
    results = [solve(X, C, 0, 3, n_chunks=c)[1] for c in (1, 2, 5)]
    for labels in results:
        assert sorted(np.bincount(labels, minlength=2)) == [2, 3]
        np.testing.assert_array_equal(labels, results[0])


def test_unconstrained_caps_give_nearest_centroids():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    C = X[:4].copy()
    part, labels, _, passes = solve(X, C, 0, 200)
    d2 = ((X[:, None] - C[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(labels, d2.argmin(1))
    assert passes.passes_per_solve == [1]


def test_chunking_does_not_change_labels():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 4)).astype(np.float32)
    C = X[rng.choice(300, 5, replace=False)]
    labels = [solve(X, C, 0, 70, n_chunks=c)[1] for c in (1, 4, 7)]
    for other in labels[1:]:
        np.testing.assert_array_equal(other, labels[0])
    assert np.bincount(labels[0]).max() <= 70


def test_weighted_rows_count_by_weight():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 2))
    w = rng.integers(1, 4, size=60).astype(np.float64)
    C = X[:3].copy()
    cap = float(np.ceil(w.sum() / 3)) + 12
    part, labels, per, _ = solve(X, C, 0, cap, n_chunks=3, w=w)
    sizes = np.bincount(labels, weights=w, minlength=3)
    assert sizes.max() <= cap
    np.testing.assert_allclose(sizes, per[:, 1])


def test_kernel_lexicographic_choice_and_ties():
    A = np.array([[1.0, 1.0, 2.0], [0.0, 3.0, 0.0]])
    B = np.array([[5.0, 4.0, 0.0], [1.0, 0.0, 1.0]])
    labels, a, b = lex_argmin(A, B)
    np.testing.assert_array_equal(
        labels, [1, 0]
    )  # primary tie broken by the secondary; a full tie: lowest
    np.testing.assert_array_equal(a, [1.0, 0.0])
    assert tie_costs(10, 3, 4).shape == (3, 4)
    np.testing.assert_array_equal(
        tie_costs(10, 3, 4)[1:], tie_costs(11, 2, 4)
    )  # by global index only


@pytest.mark.parametrize("weighted", [False, True])
def test_compiled_and_kept_costs_give_the_numpy_pass(weighted):
    """The compiled loops and a pass over kept costs report what the NumPy pass does: the same
    labels' counts, margins (shed, enter, exits), dual and repair moves, to the bit; the partials
    up to float rounding. Duplicated rows and integer prices make primary ties (secondary
    costs decide)."""
    rng = np.random.default_rng(5)
    X = np.repeat(rng.normal(size=(60, 3)), 3, axis=0).astype(np.float32)
    w = rng.uniform(0.5, 2.0, size=len(X)) if weighted else None
    C = rng.normal(size=(5, 3))
    q = 2.0**-20
    P = np.rint(rng.normal(size=5) * 2**18)
    Q = np.rint(rng.uniform(0, 2**30, size=5))
    C[3], P[3] = C[1], P[1]  # every row's costs tie between clusters 1 and 3
    shed, enter = np.array([7, 0, 3, 0, 0]), np.array([0, 9, 0, 0, 4])
    exit_from, exit_to = np.array([1, 0, 1, 0, 0], bool), np.array([0, 1, 0, 1, 0], bool)
    overrides = (np.array([2, 50, 101]), np.array([4, 0, 1], np.int32))
    repair = RepairAsk(
        True,
        np.array([1, 1, 0, 0, 0], bool),
        np.array([0, 0, 1, 1, 1], bool),
        np.array([6, 6, 0, 0, 0]),
    )
    args = (C, P, Q, q, shed, enter, exit_from, exit_to, 5, overrides, repair)
    with dask.config.set({"dkmeans.compile": "off"}):
        reference = price_partials(X, w, 40, *args)
        kept_numpy = price_partials(X, w, 40, *args, cache=cost_cache(X, C, q, 40, None))
    compiled = price_partials(X, w, 40, *args)
    kept = price_partials(X, w, 40, *args, cache=cost_cache(X, C, q, 40, None))
    for out in (kept_numpy, compiled, kept):
        np.testing.assert_array_equal(out.rows, reference.rows)
        for name in ("shed", "enter", "exits", "moves"):
            for got, want in zip(getattr(out, name), getattr(reference, name)):
                np.testing.assert_array_equal(got, want)
        assert out.dual == reference.dual and out.max_sq == reference.max_sq
        np.testing.assert_allclose(
            out.partials.sums, reference.partials.sums, rtol=1e-12, atol=1e-12
        )
        np.testing.assert_allclose(out.partials.counts, reference.partials.counts, rtol=1e-12)
        assert float(out.partials.objective) == pytest.approx(
            float(reference.partials.objective), rel=1e-12
        )
    assert reference.shed.cluster.shape[0] and reference.enter.cluster.shape[0]
    assert reference.exits.cluster.shape[0] and reference.moves.row.shape[0]
    assert reference.rows[1] and reference.rows[3]  # the ties split by the rows' hashes


def test_kernel_margins_move_exactly():
    """Raising a cluster's price by a reported margin moves exactly the rows below it."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 2))
    C = np.array([[0.0, 0.0], [3.0, 0.0]])
    P, Q = np.zeros(2), np.zeros(2)
    q = 2.0**-30
    part = price_partials(X, None, 0, C, P, Q, q, np.array([5, 0]), np.array([0, 0]))
    before = np.bincount(priced_labels(X, C, P, Q, q, 0), minlength=2)
    m = part.shed
    P2, Q2 = P.copy(), Q.copy()
    P2[0] += m.primary[2]
    Q2[0] += (
        m.secondary[2] + 0.5 * (m.secondary[3] - m.secondary[2])
        if m.primary[3] == m.primary[2]
        else 1.0
    )
    after = np.bincount(priced_labels(X, C, P2, Q2, q, 0), minlength=2)
    assert before[0] - after[0] == 3


@pytest.mark.parametrize("lower, upper", [(0, 45), (40, 41), (30, 60)])
def test_repair_meets_caps_exactly_whatever_the_chunks(monkeypatch, lower, upper):
    """The auction cut short (one pass): the repair alone brings the sizes within both caps, the
    same labels for any chunking, an objective at least the optimal transport's, and the dual
    bound at most it."""
    import dkmeans.drivers.capacitated as capacitated

    monkeypatch.setattr(capacitated, "AUCTION_PASSES", 1)
    rng = np.random.default_rng(11)
    X = np.concatenate([rng.normal(size=(150, 2)), rng.normal(size=(50, 2)) + 3])[
        : 205 if upper == 41 else 200
    ]
    X = np.concatenate([X, X[:5]]) if len(X) < 205 else X  # 205 rows: duplicates of the first five
    C = X[rng.choice(len(X), 5, replace=False)] + 0.1
    results = []
    for chunks in (1, 3, 8):
        passes = check_against_transport(X, C, lower, upper, n_chunks=chunks)
        assert passes.repaired_per_solve[-1] > 0  # the repair ran
        results.append(solve(X, C, lower, upper, n_chunks=chunks)[1])
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


@pytest.mark.parametrize("alternatives", [1, 4])
def test_uncertified_repair_meets_caps_the_same_whatever_the_chunks(monkeypatch, alternatives):
    """The path of k above EXACT_MAX_K (no model passes, no certificate), forced on small data:
    one auction pass, then the repair moving rows to their cheapest clusters with room; sizes
    within the caps, the same labels for any chunking, an objective at least the optimal
    transport's."""
    import dkmeans.drivers.capacitated as capacitated

    monkeypatch.setattr(capacitated, "AUCTION_PASSES", 1)
    monkeypatch.setattr(capacitated, "MODEL_MAX_K", 1)
    monkeypatch.setattr(capacitated, "EXACT_MAX_K", 1)
    monkeypatch.setattr(capacitated, "REPAIR_ALTERNATIVES", alternatives)
    rng = np.random.default_rng(4)
    X = np.concatenate([rng.normal(size=(160, 2)), rng.normal(size=(40, 2)) + 3])
    X = np.concatenate([X, X[:20]]).astype(np.float32)  # duplicated rows
    C = X[rng.choice(len(X), 8, replace=False)] + 0.05
    results = []
    for chunks in (1, 3, 7):
        part, labels, per, passes = solve(X, C, 0, 30, n_chunks=chunks)
        sizes = np.bincount(labels, minlength=8)
        assert sizes.max() <= 30
        assert passes.repaired_per_solve[-1] > 0 and passes.certified_per_solve[-1] is None
        assert float(part.partials.objective) >= transport_cost(X, C, 0, 30) * (1 - 1e-9)
        results.append(labels)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_above_exact_max_k_caps_hold_near_the_optimal_transport_whatever_the_chunks():
    """k = 140 (above EXACT_MAX_K: the short auction and the repair, uncertified): sizes within the
    cap, the same labels from 1 and 5 chunks, the objective at least the optimal transport's and
    within 15% of it."""
    from dkmeans.drivers.capacitated import AUCTION_PASSES_ABOVE_EXACT, EXACT_MAX_K, FIX_PASSES

    rng = np.random.default_rng(7)
    centres = rng.normal(scale=3, size=(20, 4))
    shares = np.r_[[0.3], np.full(19, 0.7 / 19)]  # one blob holds 360 rows: caps of 10 split it
    X = centres[rng.choice(20, 1200, p=shares)] + rng.normal(size=(1200, 4))
    X = X.astype(np.float32)
    C = X[rng.choice(1200, 140, replace=False)] + 0.01
    assert len(C) > EXACT_MAX_K
    reference = transport_cost(X, C, 0, 10)
    results = []
    for chunks in (1, 5):
        part, labels, per, passes = solve(X, C, 0, 10, n_chunks=chunks)
        assert np.bincount(labels, minlength=140).max() <= 10
        assert passes.certified_per_solve == [None]
        assert passes.passes_per_solve[0] <= AUCTION_PASSES_ABOVE_EXACT + FIX_PASSES
        objective = float(part.partials.objective)
        assert reference * (1 - 1e-9) <= objective <= 1.15 * reference
        results.append(labels)
    np.testing.assert_array_equal(results[1], results[0])


@pytest.mark.parametrize("alternatives", [1, 2, 3])
def test_repair_moves_list_each_rows_cheapest_clusters_with_room(alternatives):
    """A shed ask's moves: per row of an over-full cluster its ``alternatives`` cheapest clusters
    with room (brute force over the integer costs), the ``wanted`` cheapest per source by cost,
    row, target; the same from any chunking, compiled or not."""
    from dkmeans.kernels.capacitated import combine_price_partials

    rng = np.random.default_rng(alternatives)
    X = rng.normal(size=(90, 3)).astype(np.float32)
    X[60:] = X[:30]  # duplicated rows: equal costs, split by row
    C = rng.normal(size=(6, 3))
    q = 2.0**-20
    P, Q = np.zeros(6), np.zeros(6)
    labels = priced_labels(X, C, P, Q, q, 0)
    source = np.zeros(6, bool)
    source[np.argsort(np.bincount(labels, minlength=6))[-2:]] = True  # the two largest shed
    target = ~source
    target[np.flatnonzero(target)[0]] = False  # one cluster without room
    wanted = np.where(source, 7, 0)
    ask = RepairAsk(True, source, target, wanted, alternatives)
    D = np.rint(sq_distances64(X, C) / q)
    brute = []
    for i in np.flatnonzero(source[labels]):
        costs = sorted((D[i, t] - D[i, labels[i]], int(t)) for t in np.flatnonzero(target))
        brute += [(int(labels[i]), c, int(i), t) for c, t in costs[:alternatives]]
    want = []
    for s in np.flatnonzero(source):
        want += sorted((c, i, t) for a, c, i, t in brute if a == s)[: wanted[s]]
    want = sorted(want)
    none = np.zeros(6, np.int64)
    args = (C, P, Q, q, none, none, None, None, 0, None, ask)
    whole = price_partials(X, None, 0, *args).moves
    got = sorted(zip(whole.cost.tolist(), whole.row.tolist(), whole.target.tolist()))
    assert got == want and len(got) == 14
    assert list(zip(whole.cost, whole.row, whole.target)) == want  # sorted as the caller takes them
    for bounds in ((0, 40, 90), (0, 13, 50, 77, 90)):
        parts = [price_partials(X[a:b], None, a, *args) for a, b in zip(bounds[:-1], bounds[1:])]
        merged = combine_price_partials(
            parts, shed_wanted=none, enter_wanted=none, repair=ask, exchange=0
        ).moves
        for got_field, want_field in zip(merged, whole):
            np.testing.assert_array_equal(got_field, want_field)
    with dask.config.set({"dkmeans.compile": "off"}):
        numpy_moves = price_partials(X, None, 0, *args).moves
    for got_field, want_field in zip(numpy_moves, whole):
        np.testing.assert_array_equal(got_field, want_field)


def test_repair_takes_a_rows_next_cluster_where_its_first_filled_in_the_same_pass():
    """Two rows of an over-full cluster both nearest a cluster with room for one: the second goes
    to its next cluster with room in the same pass (not a pass later)."""
    from dkmeans.drivers.capacitated import _apply_moves
    from dkmeans.kernels.capacitated import Moves

    # rows 10 and 11 of cluster 0 (over its cap of 3 by 2); cluster 1 has room for one, 2 for five
    moves = Moves(
        np.array([0, 0, 0, 0]),
        np.array([1, 1, 2, 2]),
        np.array([1.0, 2.0, 5.0, 6.0]),
        np.array([10, 11, 10, 11]),
        np.ones(4),
    )
    sizes = np.array([5.0, 2.0, 0.0])
    moved = {}
    kept = _apply_moves(moves, True, sizes, 0.0, 3.0, 0.0, moved)
    assert kept == 2 and moved == {10: 1, 11: 2}
    np.testing.assert_array_equal(sizes, [3.0, 3.0, 1.0])


# -- the exact solve: exchange lists, moves over them, the Lloyd loop's monotone objective -------


def brute_exchange(D, labels, m, row_offset=0):
    """Per pair (a, b), the m cheapest (D[i, b] - D[i, a], global row) of the rows labelled a."""
    out = []
    for a in range(D.shape[1]):
        rows = np.flatnonzero(labels == a)
        for b in range(D.shape[1]):
            if b == a:
                continue
            moves = sorted((D[i, b] - D[i, a], i + row_offset) for i in rows)[:m]
            out += [(a, b, c, r) for c, r in moves]
    return out


@pytest.mark.parametrize("m", [1, 3, 50])
def test_exchange_lists_against_brute_force(m):
    """The exchange lists of a chunk (NumPy and compiled, whole and in pieces combined) are every
    pair's m cheapest moves by extra integer cost, then global row (ties in the costs)."""
    from dkmeans.kernels.capacitated import Moves, _exchange, exchange_moves, select_exchange

    rng = np.random.default_rng(m)
    D = rng.integers(0, 6, size=(90, 5)).astype(np.float64)  # many equal costs
    labels = rng.integers(0, 5, size=90)
    wt = np.ones(90)
    want = brute_exchange(D, labels, m, row_offset=7)

    def listed(moves):
        return list(
            zip(
                moves.source.tolist(),
                moves.target.tolist(),
                moves.cost.tolist(),
                moves.row.tolist(),
            )
        )

    with dask.config.set({"dkmeans.compile": "off"}):
        numpy_lists = exchange_moves(D, labels, wt, 7, m)
    compiled = _exchange(D, labels, wt, 7, m)
    pieces = [
        exchange_moves(D[a:b], labels[a:b], wt[a:b], 7 + a, m) for a, b in ((0, 31), (31, 90))
    ]
    combined = select_exchange(Moves(*(np.concatenate(field) for field in zip(*pieces))), m)
    for got in (numpy_lists, compiled, combined):
        assert listed(got) == want


def random_lists(rng, k, n, lower, upper, m):
    """Exchange lists of a random assignment of n rows (integer costs), and its sizes."""
    from dkmeans.kernels.capacitated import exchange_moves

    D = rng.integers(0, 40, size=(n, k)).astype(np.float64)
    labels = rng.integers(0, k, size=n)
    ex = exchange_moves(D, labels, np.ones(n), 0, m)
    return D, labels, ex, np.bincount(labels, minlength=k).astype(np.float64)


@pytest.mark.parametrize("seed", range(6))
def test_exchange_flow_compiled_is_the_python_function(seed):
    """The compiled exchange_flow is the plain function compiled: the same outcome, moves, sizes
    and prices on the same lists."""
    from dkmeans.drivers.capacitated import _slack
    from dkmeans.kernels.backends import compiled_capacitated
    from dkmeans.kernels.capacitated import exchange_row_costs
    from dkmeans.kernels.exchange import exchange_flow

    rng = np.random.default_rng(seed)
    k, n = 5, 80
    _, _, ex, sizes = random_lists(rng, k, n, 0, 0, 4)
    pair = ex.source * k + ex.target
    starts = np.searchsorted(pair, np.arange(k * k)).astype(np.int64)
    ends = np.searchsorted(pair, np.arange(k * k), side="right").astype(np.int64)
    rows, group = np.unique(ex.row, return_inverse=True)
    lower, upper = (15.0, 17.0) if seed % 2 else (0.0, 18.0)
    results = []
    for flow in (exchange_flow, compiled_capacitated.exchange_flow):
        used = np.full(rows.shape[0], -1, np.int64)
        duals, s = np.zeros(k), sizes.copy()
        outcome = flow(
            starts,
            ends,
            ex.cost,
            group.astype(np.int64),
            k,
            s,
            lower,
            upper,
            _slack(s),
            used,
            1 << 20,
            duals,
            exchange_row_costs(ex, group.astype(np.int64), rows.shape[0], k),
        )
        results.append((outcome, used, s, duals))
    assert results[0][0] == results[1][0]
    for got, want in zip(results[1][1:], results[0][1:]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("lower, upper", [(25, 25), (0, 28), (20, 40)])
def test_exact_solve_from_any_start_is_the_optimal_transport(lower, upper):
    """From zero prices and from prices far off (the caller's moves alone, no auction), and in one
    chunk or seven: the same labels, certified, at the optimal transport's cost; the prices it
    hands on are optimal duals (a priced pass at them is within the caps)."""
    rng = np.random.default_rng(lower + upper)
    X = np.concatenate([rng.normal(size=(70, 2)), rng.normal(size=(30, 2)) + 2.5])
    C = X[rng.choice(100, 4, replace=False)] + 0.1
    reference = transport_cost(X, C, lower, upper)
    results = []
    for chunks, start in ((1, None), (7, None), (3, np.array([5e13, -5e13, 0.0, 1e13]))):
        data = ChunkList.from_array(X, None, n_chunks=chunks)
        passes = CapacitatedPasses(Capacity(float(lower), float(upper)))
        if start is not None:
            passes._warm = (start, np.zeros(4))
        part = passes.solve(data, C)
        assert passes.certified_per_solve == [True]
        assert float(part.partials.objective) == pytest.approx(reference, rel=1e-9)
        labels, _ = passes.labels(data, C)
        sizes = np.bincount(labels, minlength=4)
        assert sizes.min() >= lower and sizes.max() <= upper
        results.append(labels)
        P = passes._warm[0]
        assert passes.optimal(P, part.partials.counts)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_objective_at_new_centroids_from_the_sums():
    """The previous assignment's objective at moved centroids, from its sums, against the direct
    sum of squared distances."""
    from dkmeans.drivers.capacitated import _objective_at
    from dkmeans.kernels.common import Partials

    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 4))
    w = rng.uniform(0.5, 2, size=300)
    labels = rng.integers(0, 3, size=300)
    C_old, C_new = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    sums = np.stack([(w[labels == j, None] * X[labels == j]).sum(0) for j in range(3)])
    counts = np.bincount(labels, weights=w, minlength=3)
    before = float((w * ((X - C_old[labels]) ** 2).sum(1)).sum())
    after = float((w * ((X - C_new[labels]) ** 2).sum(1)).sum())
    got = _objective_at(Partials(sums, counts, np.asarray(before)), C_old, C_new)
    assert got == pytest.approx(after, rel=1e-12)


@pytest.mark.parametrize("caps", [dict(balanced=True), dict(max_cluster_size=0.3)])
def test_capped_fit_objective_never_rises_and_ends_optimal(caps):
    """A capped fit's objective per iteration never rises, and the final labels are an optimal
    transport of the final centroids (scipy on the replicated-column matrix)."""
    from dkmeans import KMeans

    rng = np.random.default_rng(4)
    X = np.concatenate([rng.normal(size=(90, 2)), rng.normal(size=(30, 2)) + 4])
    km = KMeans(4, random_state=0, n_init=1, **caps).fit(X)
    objective = [r["objective"] for r in km.history_]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objective, objective[1:]))
    assert km.inertia_ <= objective[-1] * (1 + 1e-12)
    lower, upper = (30, 30) if caps.get("balanced") else (0, 36)
    sizes = np.bincount(km.labels_, minlength=4)
    assert sizes.min() >= lower and sizes.max() <= upper
    reference = transport_cost(X, km.cluster_centers_.astype(np.float64), lower, upper)
    assert km.inertia_ == pytest.approx(reference, rel=1e-9)
    # one entry per assignment: each iteration's, the settled one's, the final one's
    assert km.n_iter_ + 1 <= len(km.capacity_passes_) <= km.n_iter_ + 2


def _brute_histogram(D, P, labels, a, edges, limit=np.inf):
    """Every (row, other cluster) margin up to ``limit`` counted one by one (float64 loops)."""
    n, k = D.shape
    nbins = len(edges) + 1
    counts = {}
    for i in range(n):
        for b in range(k):
            if b == labels[i]:
                continue
            e = D[i, b] + P[b] - a[i]
            if e > limit:
                continue
            t = int(np.sum(edges <= e))  # edges at or below the margin
            key = (labels[i] * k + b) * nbins + t
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_margin_histogram_bins_every_edge_and_its_neighbours_as_searchsorted():
    """The compiled histogram takes a margin's bin from its float's exponent and mantissa: at
    every edge, the floats just below and above it, 0, 1, infinity and margins over 70 octaves,
    its bins are ``searchsorted(edges, margin, "right")``, as the NumPy path's."""
    from dkmeans.kernels.capacitated import margin_edges, margin_histogram

    edges = margin_edges()
    rng = np.random.default_rng(1)
    margins = np.concatenate(
        [
            edges,
            np.nextafter(edges, 0.0),
            np.nextafter(edges, np.inf),
            np.exp2(rng.uniform(-3.0, 70.0, 5_000)),
            [0.0, 0.5, 1.0, 2.0**64, 2.0**70, np.inf],
        ]
    )
    n = margins.shape[0]
    D = np.column_stack([np.zeros(n), margins])
    labels, a, P = np.zeros(n, np.int64), np.zeros(n), np.zeros(2)
    nbins = len(edges) + 1
    want = np.bincount(nbins + np.searchsorted(edges, margins, side="right"))
    for mode in ("off", "auto"):
        with dask.config.set({"dkmeans.compile": mode}):
            got = margin_histogram(D, P, labels, a, np.ones(n), edges)
        counts = np.zeros(want.shape[0])
        counts[got.index] = got.count
        np.testing.assert_array_equal(counts, want)


def test_margin_histogram_counts_every_row_and_pair_by_hand():
    """The histogram of a tile (NumPy and compiled) counts each row once for every other cluster,
    in the bin of its margin: margins 0 (ties), exact edges and values between them, against a
    count made row by row."""
    from dkmeans.kernels.capacitated import margin_edges, margin_histogram

    edges = margin_edges()
    assert edges[0] == 1.0 and edges[4] == 2.0 and edges[-1] == 2.0**64
    D = np.array(
        [[0.0, 0.0, 5.0], [4.0, 1.0, 1.0], [10.0, 2.0**40, 3.0], [7.0, 8.0, 1.0 + 2.0**0.25]]
    )
    P = np.array([0.0, 0.0, 1.0])
    labels, a = np.array([0, 1, 2, 2]), np.array([0.0, 1.0, 4.0, 2.0 + 2.0**0.25])
    want = _brute_histogram(D, P, labels, a, edges)
    for mode in ("off", "auto"):
        with dask.config.set({"dkmeans.compile": mode}):
            got = margin_histogram(D, P, labels, a, np.ones(4), edges)
        assert dict(zip(got.index.tolist(), got.count.tolist())) == want
        for limit in (0.0, 6.0, 7.0):  # a limit drops the larger margins, the limit's own kept
            want_within = _brute_histogram(D, P, labels, a, edges, limit)
            with dask.config.set({"dkmeans.compile": mode}):
                got = margin_histogram(D, P, labels, a, np.ones(4), edges, limit=limit)
            assert dict(zip(got.index.tolist(), got.count.tolist())) == want_within
            assert sum(want_within.values()) < sum(want.values())
    nbins = len(edges) + 1
    # row 0 ties cluster 1 at margin 0 (bin 0); row 2's margin 6 to cluster 0 is between edges
    assert want[(0 * 3 + 1) * nbins + 0] == 1
    assert want[(2 * 3 + 0) * nbins + int(np.sum(edges <= 6.0))] == 1


@pytest.mark.parametrize("seed, histogram", [(0, 1), (1, 1), (2, 1), (0, 3), (1, 4)])
def test_margin_histogram_compiled_numpy_and_chunks_agree(seed, histogram):
    """A pass's histogram is the same to the bit from the compiled loops and NumPy, in one chunk
    or five; its counts sum to n (k - 1) where every row counts, and a sampled one (one row in
    ``2**(histogram - 1)`` by row hash, counted as many times) counts the hash's rows."""
    from dkmeans.drivers.capacitated import _Requests, combine_price_partials
    from dkmeans.kernels.capacitated import row_hashes

    rng = np.random.default_rng(seed)
    X = np.repeat(rng.normal(size=(80, 3)), 2, axis=0)
    C = rng.normal(size=(6, 3))
    P, Q, q = np.rint(rng.normal(size=6) * 2**30), np.zeros(6), 2.0**-36
    none = _Requests.none(6)
    args = (C, P, Q, q) + none.args()
    outs = []
    for mode in ("off", "auto"):
        with dask.config.set({"dkmeans.compile": mode}):
            for chunks in (1, 5):
                parts = [
                    price_partials(X[i0:i1], None, i0, *args, histogram=histogram)
                    for i0, i1 in zip(
                        np.linspace(0, 160, chunks + 1).astype(int)[:-1],
                        np.linspace(0, 160, chunks + 1).astype(int)[1:],
                    )
                ]
                out = combine_price_partials(
                    parts, none.shed, none.enter, histogram=histogram
                ).histogram
                outs.append(out)
    share = 1 << (histogram - 1)
    sampled = int(np.sum(row_hashes(0, 160) % np.uint64(share) == 0))
    assert 0 < sampled <= 160
    assert outs[0].count.sum() == sampled * share * 5
    for out in outs[1:]:
        np.testing.assert_array_equal(out.index, outs[0].index)
        np.testing.assert_array_equal(out.count, outs[0].count)


def test_model_prices_move_the_rows_the_caps_need():
    """Two clusters, 40 rows of cluster 0 whose margins to cluster 1 are 1000 .. 40000, and a cap
    of 30: the model raises cluster 0's price over cluster 1's by about the 10th smallest margin
    (within a bin: a quarter octave)."""
    from dkmeans.drivers.price_model import model_price_changes
    from dkmeans.kernels.capacitated import margin_edges, margin_histogram

    edges = margin_edges()
    margins = np.arange(1, 41) * 1000.0
    D = np.stack([np.zeros(40), margins], axis=1)
    hist = margin_histogram(
        D, np.zeros(2), np.zeros(40, np.int64), np.zeros(40), np.ones(40), edges
    )
    pi = model_price_changes(hist.index, hist.count, np.array([40.0, 0.0]), 0.0, 30.0, edges)
    step = pi[0] - pi[1]
    assert 10_000 * 2**-0.25 <= step <= 11_000 * 2**0.25
    moved = int(np.sum(margins < step))
    assert 8 <= moved <= 12
    # a step held to 4,000 (its histogram's margins up to 8,000): the prices move by at most
    # that, and the rows below it still go
    hist = margin_histogram(
        D, np.zeros(2), np.zeros(40, np.int64), np.zeros(40), np.ones(40), edges, limit=8_000.0
    )
    pi = model_price_changes(
        hist.index, hist.count, np.array([40.0, 0.0]), 0.0, 30.0, edges, 4_000.0
    )
    assert np.abs(pi).max() <= 4_000.0 * (1 + 1e-9)
    assert 4_000 * 2**-0.25 <= pi[0] - pi[1]


def spy_model_passes(monkeypatch) -> list:
    """The passes of every ``_model`` call from now on, in a list that grows as they run."""
    calls = []
    original = CapacitatedPasses._model

    def spy(self, *args):
        out = original(self, *args)
        calls.append(out[1])
        return out

    monkeypatch.setattr(CapacitatedPasses, "_model", spy)
    return calls


def test_model_passes_change_no_result(monkeypatch):
    """The exact solve with model passes and without (the auction and the exact moves alone):
    the same labels, certified, at the optimal transport's cost; the model path takes several
    passes (a spy; handing over only at the caps)."""
    import dkmeans.drivers.capacitated as capacitated

    rng = np.random.default_rng(11)
    X = np.concatenate([rng.normal(size=(300, 2)), rng.normal(size=(100, 2)) + 3.0])
    C = X[rng.choice(400, 5, replace=False)]
    reference = transport_cost(X, C, 80, 80)
    calls = spy_model_passes(monkeypatch)
    monkeypatch.setattr(capacitated, "MODEL_HANDOFF", 0)
    results = {}
    for max_k in (64, 0):
        monkeypatch.setattr(capacitated, "MODEL_MAX_K", max_k)
        part, labels, _, passes = solve(X, C, 80, 80, n_chunks=3)
        assert passes.certified_per_solve == [True]
        assert float(part.partials.objective) == pytest.approx(reference, rel=1e-9)
        results[max_k] = (labels, passes.passes_per_solve[0])
    np.testing.assert_array_equal(results[64][0], results[0][0])
    assert len(calls) == 1 and calls[0] >= 2


@pytest.mark.parametrize("m", [1, 4, 40])
def test_merged_exchange_lists_are_the_sorted_selection(m):
    """The compiled merge of chunks' sorted lists keeps what one sort of all their entries keeps:
    per pair the m cheapest by cost, then row (equal costs across chunks included)."""
    from dkmeans.kernels.capacitated import Moves, _merge_exchange, select_exchange

    rng = np.random.default_rng(m)
    parts, first = [], 0
    for size in (50, 0, 120, 7, 300):
        rows = np.arange(first, first + size)
        first += size
        source, target = rng.integers(0, 4, size), rng.integers(0, 4, size)
        cost = rng.integers(-5, 6, size).astype(np.float64)  # many equal costs
        part = Moves(source, target, cost, rows, rng.uniform(0.5, 2, size))
        parts.append(select_exchange(part, m))
    want = select_exchange(
        Moves(*(np.concatenate([getattr(p, f) for p in parts]) for f in Moves._fields)), m
    )
    with dask.config.set({"dkmeans.compile": "auto"}):
        got = _merge_exchange(parts, m)
    with dask.config.set({"dkmeans.compile": "off"}):
        plain = _merge_exchange(parts, m)
    for a, b, c in zip(got, want, plain):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, b)
    assert want.row.shape[0] > 0


@pytest.mark.parametrize("caps", [dict(max_cluster_size=0.3), dict(balanced=True)])
def test_weighted_rows_take_one_model_pass_then_the_auction(monkeypatch, caps):
    """Rows of unequal weights: the first assignment's model pass sees them and hands over to the
    auction; the later assignments take no model pass. The sizes keep their caps by weight (this
    fit once raised CapacityError: the repair sent every row to a cluster whose room was below
    any row's weight)."""
    from dkmeans import KMeans

    rng = np.random.default_rng(6)
    X = np.concatenate([rng.normal(size=(150, 2)), rng.normal(size=(50, 2)) + 4])
    w = rng.uniform(0.5, 1.5, size=200)
    calls = []
    original = CapacitatedPasses._model

    def spy(self, *args):
        out = original(self, *args)
        calls.append(out[0] is None)
        return out

    monkeypatch.setattr(CapacitatedPasses, "_model", spy)
    km = KMeans(4, random_state=0, n_init=1, **caps).fit(X, sample_weight=w)
    assert calls and all(calls)  # every model pass found the weights
    assert km.n_iter_ >= 2 and len(calls) <= 2  # the fit's and its start's first assignments
    sizes = np.bincount(km.labels_, weights=w, minlength=4)
    if "balanced" in caps:  # within the largest weight of the share
        assert np.all(np.abs(sizes - w.sum() / 4) <= w.max() + 1e-9)
    else:
        assert sizes.max() <= 0.3 * w.sum() + 1e-9


def test_moved_rows_keep_moving_within_a_pass(monkeypatch):
    """The exact moves let a row that moved on a path move on from where it went (its listed
    costs' differences): the same certified labels as without those onward moves, in no more
    passes in all, fewer on some of these starts."""
    import dkmeans.drivers.capacitated as capacitated
    import dkmeans.kernels.capacitated as kernels

    monkeypatch.setattr(capacitated, "MODEL_MAX_K", 0)  # the exact moves from far prices
    real = kernels.exchange_row_costs

    def own_only(ex, group, n_rows, k):
        costs = real(ex, group, n_rows, k)
        return np.where(costs == 0.0, 0.0, np.inf)

    totals = {}
    for name, row_costs in (("onward", real), ("own", own_only)):
        monkeypatch.setattr(capacitated, "exchange_row_costs", row_costs)
        passes_seen, labels_seen = [], []
        for seed in range(4):
            rng = np.random.default_rng(seed)
            X = np.concatenate([rng.normal(size=(240, 2)), rng.normal(size=(60, 2)) + 3.0])
            C = X[rng.choice(300, 5, replace=False)]
            data = ChunkList.from_array(X, None, n_chunks=3)
            passes = CapacitatedPasses(Capacity(60.0, 60.0))
            passes._warm = (np.zeros(5), np.zeros(5))
            part = passes.solve(data, C)
            assert passes.certified_per_solve == [True]
            assert float(part.partials.objective) == pytest.approx(
                transport_cost(X, C, 60, 60), rel=1e-9
            )
            passes_seen.append(passes.passes_per_solve[0])
            labels_seen.append(passes.labels(data, C)[0])
        totals[name] = (passes_seen, labels_seen)
    for a, b in zip(totals["onward"][1], totals["own"][1]):
        np.testing.assert_array_equal(a, b)
    assert sum(totals["onward"][0]) <= sum(totals["own"][0])
    assert any(a < b for a, b in zip(totals["onward"][0], totals["own"][0]))


@pytest.mark.parametrize("bail", [4, 0])
def test_late_assignments_start_with_the_exact_moves(monkeypatch, bail):
    """An assignment whose previous one began a few rows off the caps takes the exact moves at
    once, no model pass (a spy); where their first pass finds more rows off the caps than
    EXACT_FIRST_BAIL times the start's threshold (0 here) it turns to the model passes, that
    pass counted. Either way the labels are those of a fresh solve of the same centroids, at the
    optimal transport's cost."""
    import dkmeans.drivers.capacitated as capacitated

    monkeypatch.setattr(capacitated, "EXACT_FIRST_BAIL", bail)
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(size=(300, 2)), rng.normal(size=(100, 2)) + 3.0])
    C = X[rng.choice(400, 5, replace=False)]
    moved = C + rng.normal(scale=0.05, size=C.shape)  # the next iteration's centroids
    calls = spy_model_passes(monkeypatch)
    data = ChunkList.from_array(X, None, n_chunks=3)
    passes = CapacitatedPasses(Capacity(80.0, 80.0))
    passes.solve(data, C)
    assert calls and passes._opening_gap > 0
    passes._opening_gap = min(passes._opening_gap, capacitated.EXACT_FIRST_AT_NUMPY)  # late
    first_calls = len(calls)
    part = passes.solve(data, moved)
    assert passes.certified_per_solve == [True, True]
    assert float(part.partials.objective) == pytest.approx(
        transport_cost(X, moved, 80, 80), rel=1e-9
    )
    if bail:
        assert len(calls) == first_calls  # no model pass
    else:
        assert len(calls) == first_calls + 1
        assert passes.passes_per_solve[1] >= 1 + calls[-1] + 1  # the bailed pass counted
    fresh_part, fresh_labels, _, _ = solve(X, moved, 80, 80, n_chunks=2)
    np.testing.assert_array_equal(passes.labels(data, moved)[0], fresh_labels)


@pytest.mark.parametrize("path", ["compiled", "numpy"])
def test_exact_moves_start_from_more_rows_where_the_callers_flow_is_compiled(monkeypatch, path):
    """The previous assignment began between EXACT_FIRST_AT_NUMPY and EXACT_FIRST_AT rows off the
    caps: under the compiled plan the next starts with the exact moves (no model pass), under
    the NumPy plan (whose flow is slow for many rows) with the model; both certified, the same
    labels."""
    import dkmeans.drivers.capacitated as capacitated
    from dkmeans.kernels.plans import KernelPlan

    rng = np.random.default_rng(6)
    X = np.concatenate([rng.normal(size=(300, 2)), rng.normal(size=(100, 2)) + 3.0])
    C = X[rng.choice(400, 5, replace=False)]
    moved = C + rng.normal(scale=0.05, size=C.shape)
    calls = spy_model_passes(monkeypatch)
    data = ChunkList.from_array(X, None, n_chunks=3)
    passes = CapacitatedPasses(Capacity(80.0, 80.0))
    with KernelPlan(path, "auto").applied():
        passes.solve(data, C)
        between = (capacitated.EXACT_FIRST_AT_NUMPY + capacitated.EXACT_FIRST_AT) / 2
        passes._opening_gap = between
        first_calls = len(calls)
        passes.solve(data, moved)
        labels = passes.labels(data, moved)[0]
    assert passes.certified_per_solve == [True, True]
    assert len(calls) == first_calls + (0 if path == "compiled" else 1)
    _, fresh_labels, _, _ = solve(X, moved, 80, 80, n_chunks=2)
    np.testing.assert_array_equal(labels, fresh_labels)


def test_a_later_assignments_first_model_pass_counts_margins_up_to_the_last_ones_reach(
    monkeypatch,
):
    """The first model pass of an assignment after one whose model moved the prices counts the
    margins up to MODEL_LIMIT_GROWTH times that move's spread (not every margin), and the
    assignment is still certified at the optimal transport's cost; prices seeded from another
    problem count every margin again."""
    import dkmeans.drivers.capacitated as capacitated

    monkeypatch.setattr(capacitated, "MODEL_HANDOFF", 0)  # the model moves the prices
    monkeypatch.setattr(capacitated, "EXACT_FIRST_AT", -1)  # every assignment: model first
    monkeypatch.setattr(capacitated, "EXACT_FIRST_AT_NUMPY", -1)
    rng = np.random.default_rng(12)
    X = np.concatenate([rng.normal(size=(300, 2)), rng.normal(size=(100, 2)) + 3.0])
    C = X[rng.choice(400, 5, replace=False)]
    moved = C + rng.normal(scale=0.2, size=C.shape)
    limits = []  # per model pass: (assignment, the margins' limit)
    moves = []  # per model call: the spread of its price changes
    original_pass, original_model = CapacitatedPasses._pass, CapacitatedPasses._model

    def spy_pass(self, data, combine, args):
        if len(args) > 12 and args[12]:
            limits.append((len(self.passes_per_solve), args[13]))
        return original_pass(self, data, combine, args)

    def spy_model(self, data, C, q, P, Q):
        start = P.copy()
        out = original_model(self, data, C, q, P, Q)
        moves.append(float(np.ptp(P - start)))
        return out

    monkeypatch.setattr(CapacitatedPasses, "_pass", spy_pass)
    monkeypatch.setattr(CapacitatedPasses, "_model", spy_model)
    data = ChunkList.from_array(X, None, n_chunks=3)
    passes = CapacitatedPasses(Capacity(80.0, 80.0))
    passes.solve(data, C)
    first = [limit for n, limit in limits if n == 0]
    assert first[0] == np.inf and passes.certified_per_solve == [True]
    assert len(moves) == 1 and moves[0] > 0
    part = passes.solve(data, moved)
    second = [limit for n, limit in limits if n == 1]
    assert second[0] == pytest.approx(capacitated.MODEL_LIMIT_GROWTH * moves[0])
    assert all(limit < np.inf for limit in second)
    assert passes.certified_per_solve == [True, True]
    assert float(part.partials.objective) == pytest.approx(
        transport_cost(X, moved, 80, 80), rel=1e-9
    )
    passes.seed(np.zeros(5), passes.quantum)
    passes.solve(data, C)
    third = [limit for n, limit in limits if n == 2]
    assert third[0] == np.inf


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 300),
    k=st.integers(1, 9),
    d=st.integers(1, 5),
    q_exp=st.integers(-60, 2),  # down to the distances' last bits: any other order shows
    integral=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_cost_cache_compiled_and_reused_equals_numpy_to_the_bit(
    n, k, d, q_exp, integral, dtype, seed
):
    """The compiled build of a chunk's integer costs, fresh and into the previous cache's array,
    is the NumPy build's to the bit (integral rows and q = 2 give exact halves: rint's even
    rounding), and so is the largest squared distance; a cache of another shape is not reused."""
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=3.0, size=(n, d))
    C = rng.normal(scale=3.0, size=(k, d))
    if integral:
        X, C = np.rint(X), np.rint(C)
    X, C = X.astype(dtype), C.astype(dtype)
    q = 2.0**q_exp
    with dask.config.set({"dkmeans.compile": "off"}):
        reference = cost_cache(X, C, q, 7, None)
    fresh = cost_cache(X, C, q, 7, None)
    stale = cost_cache(X, C + dtype(1.0), q, 7, None)
    reused = cost_cache(X, C, q, 7, None, reuse=stale)
    for got in (fresh, reused):
        np.testing.assert_array_equal(got.D, reference.D)
        np.testing.assert_array_equal(got.hrow, reference.hrow)
        assert got.max_sq == reference.max_sq
    # the scale's largest squared distance, without costs, both paths: the cache's
    assert max_sq_distance(X, C) == reference.max_sq
    with dask.config.set({"dkmeans.compile": "off"}):
        assert max_sq_distance(X, C) == reference.max_sq
    assert n == 0 or reference.max_sq == float(np.maximum(sq_distances64(X, C), 0).max())
    assert n == 0 or reused.D is stale.D  # overwritten in place
    other = cost_cache(X[: n // 2], C, q, 7, None, reuse=fresh)
    assert other.D.shape == (n // 2, k) and (n // 2 == n or other.D is not fresh.D)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 300),
    k=st.integers(1, 6),
    offset=st.integers(0, 10**6),
    weighted=st.booleans(),
    compiled=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_final_labels_are_the_lexicographic_choice_and_their_sums_the_float64_ones(
    n, k, offset, weighted, compiled, seed
):
    """The final assignment's labels (with and without the per-cluster sums, both kernel paths)
    are each row's lexicographically smallest ``(rint(d2 / q) + P, h(i) xor g(j) + Q)`` (lowest
    column on full ties) with the overrides in place, written out here row by row from
    the definition; the sums are the float64 objective and weight of each label."""
    from dkmeans.kernels.capacitated import (
        cluster_hashes,
        priced_label_objective,
        row_hashes,
    )

    rng = np.random.default_rng(seed)
    X = np.rint(rng.normal(scale=2.0, size=(n, 3)))  # integral: exact ties between clusters
    X = X[rng.integers(0, max(n, 1), size=n)] if n else X  # duplicated rows
    C = np.rint(rng.normal(scale=2.0, size=(k, 3)))
    q = 0.5
    P = rng.integers(0, 4, size=k).astype(np.float64)
    Q = rng.integers(0, 2**20, size=k).astype(np.float64)
    w = rng.uniform(0.5, 2.0, size=n) if weighted else None
    rows = np.sort(rng.choice(n, size=min(n, 3), replace=False)) + offset if n else None
    overrides = None if rows is None else (rows, rng.integers(0, k, size=rows.shape[0]))
    h, g = row_hashes(offset, n), cluster_hashes(k)
    expected = np.empty(n, dtype=np.int64)
    for i in range(n):
        d2 = ((X[i] - C) ** 2).sum(axis=1)
        keys = [
            (np.rint(d2[j] / q) + P[j], float(int(h[i]) ^ int(g[j])) + Q[j], j) for j in range(k)
        ]
        expected[i] = min(keys)[2]
    if overrides is not None:
        expected[overrides[0] - offset] = overrides[1]
    with dask.config.set({"dkmeans.compile": "auto" if compiled else "off"}):
        labels = priced_labels(X, C, P, Q, q, offset, overrides)
        both, per = priced_label_objective(X, w, offset, C, P, Q, q, overrides)
    np.testing.assert_array_equal(labels, expected)
    np.testing.assert_array_equal(both, expected)
    wt = np.ones(n) if w is None else w
    d2 = ((X - C[expected]) ** 2).sum(axis=1) if n else np.zeros(0)
    np.testing.assert_allclose(per[:, 0], np.bincount(expected, d2 * wt, minlength=k), rtol=1e-12)
    np.testing.assert_allclose(per[:, 1], np.bincount(expected, wt, minlength=k), rtol=1e-12)


def test_large_cost_arrays_are_pages_of_their_own_and_give_the_same_costs(monkeypatch):
    """A cost array from COST_PAGES_FROM bytes is an anonymous mapping (not NumPy's heap): C-ordered,
    writable float64 of the asked shape, and a cache built into one (fresh and reused) holds the
    costs of one built on the heap, to the bit."""
    import mmap

    from dkmeans.kernels import capacitated as kernels

    rng = np.random.default_rng(3)
    X, C = rng.normal(size=(3000, 4)), rng.normal(size=(7, 4))
    heap = cost_cache(X, C, 2.0**-20, 11, None)
    monkeypatch.setattr(kernels, "COST_PAGES_FROM", 0)
    D = kernels._cost_array(3000, 7)
    owner = D
    while isinstance(owner, np.ndarray | memoryview):  # the array's view chain, down to its buffer
        owner = owner.base if isinstance(owner, np.ndarray) else owner.obj
    assert isinstance(owner, mmap.mmap), type(owner)
    assert (
        D.shape == (3000, 7)
        and D.dtype == np.float64
        and D.flags.c_contiguous
        and D.flags.writeable
    )
    paged = cost_cache(X, C, 2.0**-20, 11, None)
    again = cost_cache(X, C, 2.0**-20, 11, None, reuse=cost_cache(X, C + 1.0, 2.0**-20, 11, None))
    for got in (paged, again):
        np.testing.assert_array_equal(got.D, heap.D)
        assert got.max_sq == heap.max_sq


def test_the_costs_kept_past_a_block_are_rebuilt_in_place_for_the_final_assignment():
    """After a capped Lloyd block, the final assignment's first pass builds its costs into the
    arrays the block kept (no fresh pages) and is still the optimal transport of its centroids."""
    from dkmeans.drivers.lloyd import CentroidShift, lloyd

    rng = np.random.default_rng(4)
    X = rng.normal(size=(600, 3)) + rng.integers(0, 3, size=(600, 1)) * 4.0
    data = ChunkList.from_array(X, None, n_chunks=3)
    passes = CapacitatedPasses(Capacity(200.0, 200.0))
    result = lloyd(data, X[[0, 1, 2]], max_iter=3, stop_rule=CentroidShift(0.0), capacitated=passes)
    kept = [cache.D for cache in passes.state]
    assert len(kept) == 3
    C = np.asarray(result.centroids) + 0.01
    part = passes.solve(data, C)
    assert all(cache.D is D for cache, D in zip(passes.state, kept))
    assert passes.certified_per_solve[-1]
    assert part.partials.counts.tolist() == [200.0, 200.0, 200.0]
    # the optimal transport of the same centroids: each column replicated to its cap
    q = passes.quantum
    D = np.rint(((X[:, None, :] - C[None]) ** 2).sum(-1) / q)
    rows, cols = linear_sum_assignment(np.repeat(D, 200, axis=1))
    labels = passes.labels(data, C)[0]
    assert D[np.arange(600), labels].sum() == D[rows, cols // 200].sum()


def _listed_moves(X, C, lower, upper, m, seed_prices=None):
    """One pass's exchange lists (``m`` moves a pair) at prices ``seed_prices`` (else zero), the
    flow's moves over them and its proof: ``(labels, D, found, duals, outcome, proved)``, the
    labels after the moves and the pass's integer costs."""
    from dkmeans.drivers.capacitated import exchange_moves_of

    k = len(C)
    data = ChunkList.from_array(X, None, n_chunks=2)
    passes = CapacitatedPasses(Capacity(float(lower), float(upper)))
    q = passes._scale(data, C)
    P = np.zeros(k) if seed_prices is None else np.rint(seed_prices / q)
    Q = np.zeros(k)
    part = passes._plain_pass(data, C, P, Q, q, None, exchange=m)
    found, duals, outcome, proved = exchange_moves_of(
        part.exchange, part.partials.counts, lower, upper, k, m
    )
    labels = priced_labels(X, C, P, Q, q, 0)
    for row, (source, target) in found.items():
        assert labels[row] == source
        labels[row] = target
    D = np.rint(((X[:, None, :] - C[None]) ** 2).sum(-1) / q)
    return labels, D, found, duals, outcome, proved


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    k=st.integers(2, 5),
    m=st.integers(1, 4),
    caps=st.sampled_from(["balanced", "max", "min", "range"]),
)
def test_a_proof_from_the_lists_is_sound(seed, k, m, caps):
    """Where the flow's moves are proved optimal from the same short lists (no second pass), they
    are: the sizes within the caps, the assignment's cost the optimal transport's, every row at
    its cheapest cluster under the proof's prices, and those prices in complementary slackness
    (a cluster with room priced at most one above its floor)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3 * k, 12 * k))
    X = np.concatenate([rng.normal(size=(n - n // 3, 2)), rng.normal(size=(n // 3, 2)) + 2.5])
    C = X[rng.choice(n, k, replace=False)] + rng.normal(scale=0.1, size=(k, 2))
    share = n / k
    lower, upper = {
        "balanced": (np.floor(share), np.ceil(share)),
        "max": (0.0, np.ceil(share * 1.2)),
        "min": (np.floor(share * 0.7), float(n)),
        "range": (np.floor(share * 0.8), np.ceil(share * 1.25)),
    }[caps]
    labels, D, found, duals, outcome, proved = _listed_moves(
        X, C, lower, upper, m, seed_prices=rng.normal(scale=0.5, size=k)
    )
    if not proved:
        return
    sizes = np.bincount(labels, minlength=k)
    assert sizes.min() >= lower and sizes.max() <= upper
    cost = float(((X - C[labels]) ** 2).sum())
    assert cost == pytest.approx(transport_cost(X, C, int(lower), int(upper)), rel=1e-9, abs=1e-9)
    priced = D + duals[None, :]
    assert np.all(priced[np.arange(n), labels] <= priced.min(axis=1))
    room, above = sizes < upper, sizes > lower
    if room.any() and above.any():
        assert duals[room].max() <= duals[above].min()


def test_the_flows_moves_are_proved_from_the_lists_and_save_the_confirming_pass(monkeypatch):
    """From near prices the exact moves end in one pass of lists, proved there (the moved rows'
    partials fetched, not passed over again): one pass fewer than where the proof is withheld,
    the same labels, certified, at the optimal transport's cost; the partials those of the labels."""
    import dkmeans.drivers.capacitated as capacitated

    rng = np.random.default_rng(13)
    X = np.concatenate([rng.normal(size=(600, 2)), rng.normal(size=(200, 2)) + 3.0])
    C = X[rng.choice(800, 4, replace=False)]
    results = {}
    for name in ("proved", "withheld"):
        if name == "withheld":
            monkeypatch.setattr(capacitated, "list_certificate", lambda *args: None)
        data = ChunkList.from_array(X, None, n_chunks=3)
        passes = CapacitatedPasses(Capacity(200.0, 200.0))
        passes.solve(data, C)  # the optimal prices of these centroids
        moved = C + rng.normal(scale=0.02, size=C.shape) if name == "proved" else results["C"]
        passes._opening_gap = 0  # a late assignment: the exact moves at once
        part = passes.solve(data, moved)
        labels = passes.labels(data, moved)[0]
        assert passes.certified_per_solve == [True, True]
        results[name] = (passes.passes_per_solve[1], labels, part)
        results["C"] = moved
    (p1, labels, part), (p2, labels2, _) = results["proved"], results["withheld"]
    assert p1 == 1 and p2 == 2
    np.testing.assert_array_equal(labels, labels2)
    moved = results["C"]
    sizes = np.bincount(labels, minlength=4)
    np.testing.assert_array_equal(part.partials.counts, sizes)
    np.testing.assert_array_equal(part.rows, sizes)
    sums = np.zeros((4, 2))
    np.add.at(sums, labels, X)
    np.testing.assert_allclose(part.partials.sums, sums, rtol=1e-12, atol=1e-9)
    cost = float(((X - moved[labels]) ** 2).sum())
    assert float(part.partials.objective) == pytest.approx(cost, rel=1e-12)
    assert cost == pytest.approx(transport_cost(X, moved, 200, 200), rel=1e-9)


@pytest.mark.parametrize("shed", [True, False])
@pytest.mark.parametrize("seed", [0, 3, 4])
def test_take_moves_compiled_is_the_python_function(shed, seed):
    """The repair's greedy take: the compiled loops take the same moves as the plain function and
    as a dictionary walk written here; every taken move keeps the caps' rule."""
    from dkmeans.kernels import repair
    from dkmeans.kernels.capacitated import Moves, take_moves

    rng = np.random.default_rng(seed)
    m, k = 400, 12
    moves = Moves(
        rng.integers(0, k, m),
        rng.integers(0, k, m),
        np.sort(rng.integers(0, 50, m)).astype(np.float64),
        rng.integers(0, 150, m) + 10**12,  # global rows, repeated: a row's alternatives
        rng.choice([1.0, 1.0, 2.0], m),
    )
    lower, upper = 20.0, 30.0
    start = rng.integers(10, 40, k).astype(np.float64)
    sizes = start.copy()
    kept = take_moves(moves, shed, sizes, lower, upper, 0.0)
    with dask.config.set({"dkmeans.compile": "off"}):
        plain = start.copy()
        np.testing.assert_array_equal(take_moves(moves, shed, plain, lower, upper, 0.0), kept)
    np.testing.assert_array_equal(plain, sizes)
    walk, taken, want = start.copy(), set(), []
    for i, (s, t, row, w) in enumerate(zip(moves.source, moves.target, moves.row, moves.weight)):
        if row in taken:
            continue
        ok = (
            walk[s] - upper > 0 and walk[t] + w <= upper
            if shed
            else lower - walk[t] > 0 and walk[s] - w >= lower
        )
        if ok:
            walk[s] -= w
            walk[t] += w
            taken.add(row)
            want.append(i)
    np.testing.assert_array_equal(kept, want)
    np.testing.assert_array_equal(walk, sizes)
    assert len(want) > 2 and repair.take_moves is not None  # the rules took and refused moves
    assert len(want) < len(set(moves.row.tolist()))
