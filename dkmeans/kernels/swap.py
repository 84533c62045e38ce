"""Kernels of k-means++ local search: every (candidate, centroid) swap scored in one pass.

A swap replaces centroid ``j`` by a candidate ``p`` (a data row). With ``a(x)``, ``d1(x)``
and ``d2(x)`` the nearest centroid of row ``x`` and its squared distances to the nearest
and second-nearest centroids, the row's cost after the swap is
``min(d2(x) if a(x) == j else d1(x), ||x - p||^2)``, so :func:`swap_costs` gets the exact
objective under every swap from the distances to the ``k`` centroids and the ``m``
candidates. Split as

``cost[p, j] = sum_x w min(d1, dp) + sum_{x: a(x) = j} w (min(d2, dp) - min(d1, dp))``

the first term is one vector over candidates and the second a per-cluster sum (a one-hot
product, :func:`~dkmeans.kernels.nearest.cluster_sums`): a chunk costs ``O(n (k + m) d)``
and returns ``m x k`` numbers. :func:`swap_partials` goes one step further for a few
chosen swaps (or sets of swaps): each one's Lloyd partials, from the same nearest-two
distances, at about the cost of one Lloyd assignment.

Rows are processed in tiles whose scratch (float64 distances to centroids and
candidates) stays under ``scratch_bytes``. Distances are computed in float64 with the
data translated to the centroids' mean (the expanded form ``||x||^2 - 2 x.c + ||c||^2``
then loses little to cancellation even for data far from the origin); ``d1`` and ``d2``
are recomputed from the differences.

:func:`sample_by_cost` draws the candidates: rows with probability proportional to
``w d1`` (the k-means++ "D^2" distribution), without replacement, keyed by global row
index (exponential clocks, :func:`~dkmeans.kernels.seeding.weighted_sample_keys`, top
``m`` by :func:`~dkmeans.kernels.nearest.select_top`), so the sample does not depend on
the chunking. The driver chooses swaps from the reduced costs
(:mod:`dkmeans.drivers.swaps`).

Every function takes arrays of one namespace ``xp`` (NumPy or CuPy).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from dkmeans.kernels.backends.layout import LazyModule
from dkmeans.kernels.backends.select import Backend, Loops, select
from dkmeans.kernels.namespace import get_namespace
from dkmeans.kernels.nearest import TopRows, assign, cluster_sums, select_top
from dkmeans.kernels.reduce import combine_top, sum_in_order
from dkmeans.kernels.sampling import uniform_by_index
from dkmeans.kernels.seeding import weighted_sample_keys

_loops = LazyModule("dkmeans.kernels.backends.compiled_swap")  # numba imported at first use

#: :func:`swap_costs` with more candidates than this, and :func:`nearest_two` with more
#: centroids, take matrix products (rows in cluster order against all candidates; tiles of
#: rows against all centroids) instead of the fused per-row loops, whose scalar float64
#: products are slower from there on.
SWAP_LOOP_MAX_CANDIDATES = 32
#: Scratch memory of one :func:`swap_costs` or :func:`nearest_two` call, in bytes: the
#: row tile's float64 distances to the centroids and candidates and their temporaries.
SWAP_SCRATCH_BYTES = 4 * 2**20


class NearestTwo(NamedTuple):
    """Nearest and second-nearest centroid distances of each row.

    Attributes
    ----------
    labels : array, shape (n,), int32
        Index of the nearest centroid.
    second : array, shape (n,), int32
        Index of the second-nearest centroid (``labels`` when ``k == 1``).
    d1 : array, shape (n,), float64
        Squared distance to it.
    d2 : array, shape (n,), float64
        Squared distance to the second-nearest centroid (``inf`` when ``k == 1``).
    """

    labels: Any
    second: Any
    d1: Any
    d2: Any


class SwapCosts(NamedTuple):
    """One chunk's objective under every swap, and its current objective.

    Attributes
    ----------
    cost : array, shape (m, k), float64
        ``cost[p, j]``: weighted sum of squared distances of the chunk's rows to the
        centroids with centroid ``j`` replaced by candidate ``p``.
    objective : array, shape (), float64
        Weighted sum of squared distances to the current centroids.
    """

    cost: Any
    objective: Any


class TrialPartials(NamedTuple):
    """Lloyd partials of the centroids after each trial's swaps (one chunk, or reduced).

    Attributes
    ----------
    sums : array, shape (t, k, d), float64
        Per trial, per-cluster (weighted) sums of the rows nearest to each centroid.
    counts : array, shape (t, k), float64
        Per trial, per-cluster (weighted) counts.
    objective : array, shape (t,), float64
        Per trial, the (weighted) objective of the swapped centroids.
    """

    sums: Any
    counts: Any
    objective: Any


class CandidateSample(NamedTuple):
    """Rows drawn proportionally to ``w d1`` (top keys) and the chunk's objective.

    Attributes
    ----------
    top : TopRows
        Scores are the sampling keys (larger first); ties by global row index.
    objective : array, shape (), float64
        ``sum(w d1)``: the objective of the centroids the rows were drawn for.
    """

    top: TopRows
    objective: Any


def _tile_rows(k: int, m: int, d: int, scratch_bytes: int) -> int:
    """Rows per tile: float64 distances to the centroids (one array) and candidates (about
    three, and a copy in the per-cluster sum), and a few float64 copies of the row."""
    per_row = 8 * (k + 4 * m + 3 * d) + 64
    return max(1, int(scratch_bytes // per_row))


def _sq_from_dot(xp, x_sq, dots, c_sq):
    """``||x||^2 - 2 x.c + ||c||^2`` clipped at 0, from the products ``dots`` (in place)."""
    dots *= -2.0
    dots += x_sq[:, None]
    dots += c_sq[None, :]
    return xp.maximum(dots, 0.0, out=dots)


def _backend(X) -> Backend:
    """The backend of one swap-kernel call on ``X``: the compiled loops of
    :mod:`dkmeans.kernels.backends.compiled_swap` (one compile unit per dtype) or the namespace code."""
    dtype = np.dtype(X.dtype)
    return select(
        X,
        compiled=Loops(("nearest_two", dtype.str), functools.partial(_warm_up_nearest_two, dtype)),
    )


def _nearest_two_tile(xp, Xt, C64, c_sq):
    """:class:`NearestTwo` of one tile of translated float64 rows ``Xt`` (the namespace code)."""
    t = Xt.shape[0]
    k = C64.shape[0]
    D = Xt @ C64.T
    D *= -2.0
    D += c_sq[None, :]  # ||x||^2 omitted: the same for every centroid of a row
    rows = xp.arange(t)
    first = xp.argmin(D, axis=1)
    diff = Xt - C64[first]
    d1 = xp.sum(diff * diff, axis=1)
    if k == 1:
        first = first.astype(xp.int32)
        return NearestTwo(first, first, d1, xp.full(t, xp.inf, dtype=xp.float64))
    D[rows, first] = xp.inf
    second = xp.argmin(D, axis=1)
    diff = Xt - C64[second]
    d2 = xp.sum(diff * diff, axis=1)
    # the expanded form can misorder near-ties; the exact distances decide
    flip = d2 < d1
    return NearestTwo(
        xp.where(flip, second, first).astype(xp.int32),
        xp.where(flip, first, second).astype(xp.int32),
        xp.where(flip, d2, d1),
        xp.where(flip, d1, d2),
    )


def _host_weights(w):
    """Weights for the compiled loops: the array and whether it is real (ones otherwise)."""
    return (np.ones(1), False) if w is None else (np.ascontiguousarray(w, dtype=np.float64), True)


def _warm_up_nearest_two(dtype) -> None:
    warm_up(dtype)


def warm_up(dtype) -> None:
    """Run the compiled swap loops for rows of ``dtype`` once on a few rows (compiling them, or
    loading them from numba's disk cache)."""
    X = np.random.default_rng(0).random((64, 3)).astype(dtype)
    nearest_two(X, X[:4])
    swap_costs(X, X[:4], X[4:6])
    swap_partials(X, X[:4], X[4:6], [(np.array([0]), np.array([1]))])


def _translated(xp, C):
    """Centroids in float64 translated to their mean, the mean, and their squared norms."""
    C64 = xp.asarray(C, dtype=xp.float64)
    origin = xp.mean(C64, axis=0)
    C64 = C64 - origin
    return C64, origin, xp.sum(C64 * C64, axis=1)


def nearest_two(X, C, *, scratch_bytes: int = SWAP_SCRATCH_BYTES) -> NearestTwo:
    """Nearest centroid of each row and the squared distances to the nearest two.

    Parameters
    ----------
    X : array, shape (n, d)
    C : array, shape (k, d)
        Centroids, same namespace, ``k >= 1``.
    scratch_bytes : int
        Bound on the temporary memory of the call (about ``8 (k + 3 d)`` bytes per row
        of a tile).

    Returns
    -------
    NearestTwo
        Distances in float64, computed from the differences. On exact ties the lower
        centroid index is the nearest; ``d1 == d2`` then.
    """
    return _nearest_two(_backend(X), X, C, scratch_bytes)


def _nearest_two(backend: Backend, X, C, scratch_bytes) -> NearestTwo:
    """:func:`nearest_two` on the chosen backend."""
    xp = get_namespace(X, C)
    n, d = X.shape
    C64, origin, c_sq = _translated(xp, C)
    k = C64.shape[0]
    out = NearestTwo(
        xp.empty(n, dtype=xp.int32),
        xp.empty(n, dtype=xp.int32),
        xp.empty(n, dtype=xp.float64),
        xp.empty(n, dtype=xp.float64),
    )
    if (
        k <= SWAP_LOOP_MAX_CANDIDATES and backend is Backend.COMPILED
    ):  # few centroids: no n x k buffer, no tiles
        _loops.nearest_two_rows(np.ascontiguousarray(X), origin, C64, *out)
        return out
    rows = _tile_rows(k, 0, d, scratch_bytes)
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        Xt = xp.asarray(X[i0:i1], dtype=xp.float64) - origin
        for full, part in zip(out, _nearest_two_tile(xp, Xt, C64, c_sq)):
            full[i0:i1] = part
    return out


def swap_costs(X, C, P, weights=None, *, scratch_bytes: int = SWAP_SCRATCH_BYTES) -> SwapCosts:
    """The chunk's objective if centroid ``j`` were replaced by candidate ``p``, for every pair.

    Parameters
    ----------
    X : array, shape (n, d)
    C : array, shape (k, d)
        Current centroids.
    P : array, shape (m, d)
        Candidate centres (rows of the data, in practice).
    weights : array, shape (n,), optional
        Non-negative sample weights (default: all ones).
    scratch_bytes : int
        Bound on the temporary memory of the call, besides the ``m x k`` result: about
        ``8 (k + 4 m + 3 d)`` bytes per row of a tile.

    Returns
    -------
    SwapCosts
        ``cost`` (m, k) and ``objective``, float64; sum them over chunks with
        :func:`combine_swap_costs`. The change of the objective under swap ``(p, j)`` is
        ``cost[p, j] - objective``.
    """
    xp = get_namespace(X, C, P)
    n, d = X.shape
    C64, origin, c_sq = _translated(xp, C)
    P64 = xp.asarray(P, dtype=xp.float64) - origin
    p_sq = xp.sum(P64 * P64, axis=1)
    k, m = C64.shape[0], P64.shape[0]
    w = None if weights is None else xp.asarray(weights, dtype=xp.float64)
    backend = _backend(X)
    if (
        m > SWAP_LOOP_MAX_CANDIDATES
    ):  # many candidates: matrix products, rows taken cluster by cluster
        return _swap_costs_by_cluster(backend, xp, X, C, origin, P64, p_sq, w, scratch_bytes)
    per_candidate = xp.zeros(m, dtype=xp.float64)  # sum_x w min(d1, dp)
    per_cluster = xp.zeros((k, m), dtype=xp.float64)  # sum_{a(x) = j} w (min(d2, dp) - min(d1, dp))
    objective = xp.zeros((), dtype=xp.float64)
    if backend is Backend.COMPILED:  # one fused loop over rows: no tiles, no n x m temporaries
        objective = np.zeros(1)
        _loops.swap_costs_rows(
            np.ascontiguousarray(X),
            origin,
            C64,
            P64,
            *_host_weights(w),
            per_candidate,
            per_cluster,
            objective,
        )
        return SwapCosts(
            np.ascontiguousarray(per_candidate[:, None] + per_cluster.T), objective.reshape(())
        )
    rows = _tile_rows(k, m, d, scratch_bytes)
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        Xt = xp.asarray(X[i0:i1], dtype=xp.float64) - origin
        wt = None if w is None else w[i0:i1]
        labels, _, d1, d2 = _nearest_two_tile(xp, Xt, C64, c_sq)
        objective = objective + (xp.sum(d1) if wt is None else d1 @ wt)
        if m == 0:
            continue
        dp = _sq_from_dot(xp, xp.sum(Xt * Xt, axis=1), Xt @ P64.T, p_sq)
        keep = xp.minimum(dp, d1[:, None])  # the row's cost when its own centroid stays
        per_candidate += xp.sum(keep, axis=0) if wt is None else wt @ keep
        # when its own centroid goes, the row moves to the second-nearest or to p
        moved = xp.minimum(dp, d2[:, None], out=dp)
        moved -= keep
        per_cluster += cluster_sums(moved, labels, k, wt, scratch_bytes=scratch_bytes)[0]
    cost = per_candidate[:, None] + per_cluster.T
    return SwapCosts(xp.ascontiguousarray(cost), xp.asarray(objective, dtype=xp.float64))


def _swap_costs_by_cluster(
    backend: Backend, xp, X, C, origin, P64, p_sq, w, scratch_bytes
) -> SwapCosts:
    """:func:`swap_costs` for many candidates: blocks of rows in cluster order against all candidates.

    The distances to the candidates are one matrix product per block; a block's rows are
    sorted by nearest centroid, so its per-cluster sums are runs of rows (``reduceat``)
    and each ``m``-vector of ``per_cluster`` is written about once, not once per block.
    On the host the block is candidate-major (``m x rows``: the sums land in the ``m x k``
    result without a transposed copy) and in the rows' precision: float32 rows give float32
    distances, summed into float64. The costs only propose swaps; every swap the search
    makes is measured exactly (:func:`swap_partials`, the objective of the next pass).
    """
    n, d = X.shape
    k, m = C.shape[0], P64.shape[0]
    near = _nearest_two(backend, X, C, scratch_bytes)
    order = xp.argsort(near.labels, kind="stable")
    d1 = near.d1 if w is None else near.d1 * w
    objective = xp.sum(d1)
    if xp is np:
        return SwapCosts(
            _host_costs_by_cluster(X, origin, P64, p_sq, w, near, order, scratch_bytes, k),
            objective,
        )
    per_candidate = xp.zeros(m, dtype=xp.float64)
    per_cluster = xp.zeros((k, m), dtype=xp.float64)
    rows = max(1, int(scratch_bytes // (8 * (3 * m + 2 * d) + 64)))
    for i0 in range(0, n, rows):
        idx = order[i0 : i0 + rows]
        Xt = xp.asarray(X[idx], dtype=xp.float64) - origin
        dp = _sq_from_dot(xp, xp.sum(Xt * Xt, axis=1), Xt @ P64.T, p_sq)
        keep = xp.minimum(dp, near.d1[idx][:, None])  # the row's cost when its own centroid stays
        moved = xp.minimum(dp, near.d2[idx][:, None], out=dp)  # ... and when it goes
        moved -= keep
        wt = None if w is None else w[idx]
        per_candidate += xp.sum(keep, axis=0) if wt is None else wt @ keep
        if wt is not None:
            moved *= wt[:, None]
        per_cluster += cluster_sums(moved, near.labels[idx], k, scratch_bytes=scratch_bytes)[0]
    cost = per_candidate[:, None] + per_cluster.T
    return SwapCosts(xp.ascontiguousarray(cost), xp.asarray(objective, dtype=xp.float64))


def _host_costs_by_cluster(X, origin, P64, p_sq, w, near: NearestTwo, order, scratch_bytes, k: int):
    """The ``m x k`` costs of :func:`_swap_costs_by_cluster` on the host, in the rows' precision.

    Float32 rows take float32 products and sums within a cluster's run of rows (then float64):
    a block's distances are candidate-major (``m x rows``), so the runs are contiguous, and the
    per-cluster sums are added as whole rows of a ``k x m`` array, returned transposed (a view).
    Measured at 4,166 x 64 rows, k = m = 2,048, one thread: 0.09 s against 0.19 s in float64
    row-major with a transposed copy.
    """
    n, d = X.shape
    m = P64.shape[0]
    work = np.float32 if X.dtype == np.float32 else np.float64
    item = np.dtype(work).itemsize
    P = P64.astype(work)
    p_sq_w = p_sq.astype(work)[:, None]
    per_candidate = np.zeros(m, dtype=np.float64)
    per_cluster = np.zeros((k, m), dtype=np.float64)
    rows = max(1, int(scratch_bytes // (item * (2 * m + 2 * d) + 64)))
    for i0 in range(0, n, rows):
        idx = order[i0 : i0 + rows]
        Xt = (X[idx].astype(np.float64) - origin).astype(work)
        dp = P @ Xt.T  # m x rows
        dp *= -2.0
        dp += p_sq_w
        dp += np.einsum("ij,ij->i", Xt, Xt)[None, :]
        np.maximum(dp, 0.0, out=dp)
        keep = np.minimum(
            dp, near.d1[idx].astype(work)[None, :]
        )  # the row's cost when its own centroid stays
        moved = np.minimum(dp, near.d2[idx].astype(work)[None, :], out=dp)  # ... and when it goes
        moved -= keep
        if w is None:
            per_candidate += keep.sum(axis=1, dtype=np.float64)
        else:
            wt = w[idx]
            per_candidate += keep.astype(np.float64) @ wt
            moved *= wt.astype(work)[None, :]
        labels = near.labels[idx]
        starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
        per_cluster[labels[starts]] += np.add.reduceat(
            moved, starts, axis=1
        ).T  # distinct labels in a block
    return per_cluster.T + per_candidate[:, None]


def combine_swap_costs(parts: Sequence[SwapCosts]) -> SwapCosts:
    """Sum per-chunk :class:`SwapCosts` (associative, float64)."""
    return sum_in_order(parts, SwapCosts, "combine_swap_costs")


def swap_partials(
    X, C, P, trials, weights=None, *, scratch_bytes: int = SWAP_SCRATCH_BYTES
) -> TrialPartials:
    """Lloyd partials (sums, counts, objective) of the centroids after each trial's swaps.

    Trial ``t`` replaces centroids ``trials[t][1]`` by the candidates ``P[trials[t][0]]``
    (each candidate takes the index of the centroid it replaces). Each row's nearest
    centroid after the swaps follows from its nearest two before them and its distances
    to the trial's candidates; only rows whose nearest two are both removed are assigned
    afresh. One call is one Lloyd assignment step for every trial, at about the cost of
    one for the current centroids.

    Parameters
    ----------
    X : array, shape (n, d)
    C : array, shape (k, d)
        Current centroids.
    P : array, shape (q, d)
        Candidate centres the trials use.
    trials : sequence of (positions, centroids)
        Pairs of integer arrays of equal length (trials may differ in length): positions in
        ``P`` and the distinct centroids they replace.
    weights : array, shape (n,), optional
    scratch_bytes : int
        Bound on the temporary memory of the call, besides the ``t x k x d`` result.

    Returns
    -------
    TrialPartials
        Sum them over chunks with :func:`combine_trial_partials`.
    """
    xp = get_namespace(X, C, P)
    n, d = X.shape
    C64, origin, c_sq = _translated(xp, C)
    P64 = xp.asarray(P, dtype=xp.float64) - origin
    p_sq = xp.sum(P64 * P64, axis=1)
    k, q, T = C64.shape[0], P64.shape[0], len(trials)
    trials = [
        (xp.asarray(pos, dtype=xp.int64), xp.asarray(js, dtype=xp.int64)) for pos, js in trials
    ]
    removed = xp.zeros((T, k), dtype=bool)
    swapped = []  # each trial's centroids, translated, for rows that lose both nearest centroids
    for t, (pos, js) in enumerate(trials):
        removed[t, js] = True
        Ct = C64.copy()
        Ct[js] = P64[pos]
        swapped.append((Ct, xp.sum(Ct * Ct, axis=1)))
    w = None if weights is None else xp.asarray(weights, dtype=xp.float64)
    sums = xp.zeros((T, k, d), dtype=xp.float64)
    counts = xp.zeros((T, k), dtype=xp.float64)
    objective = xp.zeros(T, dtype=xp.float64)
    if T and _backend(X) is Backend.COMPILED:
        lengths = np.array([pos.shape[0] for pos, _ in trials], dtype=np.int64)
        positions = np.zeros((T, int(lengths.max())), dtype=np.int64)  # ragged trials, padded
        replaced = np.zeros_like(positions)
        for t, (pos, js) in enumerate(trials):
            positions[t, : lengths[t]], replaced[t, : lengths[t]] = pos, js
        _loops.swap_partials_rows(
            np.ascontiguousarray(X),
            origin,
            C64,
            P64,
            lengths,
            positions,
            replaced,
            removed,
            np.stack([Ct for Ct, _ in swapped]),
            *_host_weights(w),
            sums,
            counts,
            objective,
        )
        return TrialPartials(sums, counts, objective)
    rows = _tile_rows(k, q, d, scratch_bytes)
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        Xt = xp.asarray(X[i0:i1], dtype=xp.float64) - origin
        wt = None if w is None else w[i0:i1]
        near = _nearest_two_tile(xp, Xt, C64, c_sq)
        dp = _sq_from_dot(xp, xp.sum(Xt * Xt, axis=1), Xt @ P64.T, p_sq) if q else None
        for t, (pos, js) in enumerate(trials):
            lost = removed[t][near.labels]
            labels = xp.where(lost, near.second, near.labels)
            dist = xp.where(lost, near.d2, near.d1)
            both = xp.nonzero(lost & removed[t][near.second])[0]
            if both.shape[0]:  # nearest two both removed (rare): assign these rows afresh
                again = _nearest_two_tile(xp, Xt[both], *swapped[t])
                labels[both] = again.labels
                dist[both] = again.d1
            if pos.shape[0]:
                dpt = dp[:, pos]
                best = xp.argmin(dpt, axis=1)
                to_new = xp.min(dpt, axis=1)
                closer = to_new < dist
                labels = xp.where(closer, js[best], labels)
                dist = xp.where(closer, to_new, dist)
            s, c = cluster_sums(
                X[i0:i1], labels.astype(xp.int32), k, wt, scratch_bytes=scratch_bytes
            )
            sums[t] += s
            counts[t] += c
            objective[t] += xp.sum(dist) if wt is None else dist @ wt
    return TrialPartials(sums, counts, objective)


def combine_trial_partials(parts: Sequence[TrialPartials]) -> TrialPartials:
    """Sum per-chunk :class:`TrialPartials` (associative, float64)."""
    return sum_in_order(parts, TrialPartials, "combine_trial_partials")


class SplitSums(NamedTuple):
    """Per-cluster statistics for splitting each cluster in two (a chunk's; :func:`combine_split_sums`).

    Each row belongs to its nearest centroid ``c_j`` and lies on one side of the hyperplane through
    ``c_j`` normal to ``v_j``: ``t = (x - c_j) . v_j``.

    Attributes
    ----------
    power : array, shape (k, d), float64
        ``sum w t (x - c_j)`` over the cluster's rows: the cluster's scatter matrix times
        ``v_j`` (a power step towards its principal direction).
    half_sums : array, shape (2 k, d), float64
        Weighted sums of the rows with ``t <= 0`` (row ``2 j``) and ``t > 0`` (row ``2 j + 1``).
    half_counts : array, shape (2 k,), float64
        Their weights.
    """

    power: Any
    half_sums: Any
    half_counts: Any


def split_sums(X, C, V, weights=None, labels=None) -> SplitSums:
    """:class:`SplitSums` of a chunk for centroids ``C`` and directions ``V`` (both ``(k, d)``); ``labels``:
    the rows' nearest centroids when known (:func:`~dkmeans.kernels.nearest.assign`'s)."""
    xp = get_namespace(X)
    k = C.shape[0]
    if labels is None:
        labels, _ = assign(X, C)
    D = X.astype(xp.float64) - xp.asarray(C, dtype=xp.float64)[labels]
    t = xp.einsum("ij,ij->i", D, xp.asarray(V, dtype=xp.float64)[labels])
    w = (
        xp.ones(X.shape[0], dtype=xp.float64)
        if weights is None
        else xp.asarray(weights, dtype=xp.float64)
    )
    power, _ = cluster_sums(D, labels, k, w * t)
    half_sums, half_counts = cluster_sums(X, 2 * labels.astype(xp.int64) + (t > 0), 2 * k, w)
    return SplitSums(power, half_sums, half_counts)


def combine_split_sums(parts: Sequence[SplitSums]) -> SplitSums:
    """Sum per-chunk :class:`SplitSums` in order (float64)."""
    return sum_in_order(parts, SplitSums, "combine_split_sums")


def sample_by_cost(
    X, C, m: int, row_offset: int, seed: int, stream: int, weights=None
) -> CandidateSample:
    """The chunk's ``m`` rows with the largest D^2 sampling keys, and its objective.

    The global top ``m`` keys (:func:`combine_candidate_samples`) are ``m`` distinct rows drawn
    without replacement with probabilities proportional to ``w d1`` (``d1``: squared
    distance to the nearest centroid), keyed by global row index. Rows with ``w d1 == 0``
    (on a centroid, or weightless) are never drawn.

    Parameters
    ----------
    X : array, shape (n, d)
    C : array, shape (k, d)
    m : int
        Number of candidates wanted.
    row_offset : int
        Global index of the chunk's first row.
    seed : int
        Resolved random seed.
    stream : int
        Random stream of this draw (one per round).
    weights : array, shape (n,), optional

    Returns
    -------
    CandidateSample
    """
    xp = get_namespace(X, C)
    index = xp.arange(row_offset, row_offset + X.shape[0], dtype=xp.int64)
    d1 = assign(X, xp.asarray(C, dtype=X.dtype))[1].astype(xp.float64)
    wd1 = d1 if weights is None else d1 * xp.asarray(weights, dtype=xp.float64)
    keys, eligible = weighted_sample_keys(xp, wd1, uniform_by_index(index, seed, stream))
    keep = select_top(xp, keys, index, m, eligible=eligible)
    return CandidateSample(TopRows(keys[keep], index[keep], X[keep]), xp.sum(wd1))


def combine_candidate_samples(parts: Sequence[CandidateSample], m: int) -> CandidateSample:
    """Merge per-chunk :class:`CandidateSample` into the global top ``m`` and the total objective."""
    parts = [p for p in parts if p is not None]
    objective = parts[0].objective
    for p in parts[1:]:
        objective = objective + p.objective
    return CandidateSample(combine_top([p.top for p in parts], m), objective)


__all__ = [
    "CandidateSample",
    "NearestTwo",
    "SWAP_SCRATCH_BYTES",
    "SwapCosts",
    "TrialPartials",
    "combine_candidate_samples",
    "combine_swap_costs",
    "combine_trial_partials",
    "nearest_two",
    "sample_by_cost",
    "swap_costs",
    "swap_partials",
    "warm_up",
]
