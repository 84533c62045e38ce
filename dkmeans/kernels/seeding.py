"""Kernels of the seeding strategies (k-means||, greedy k-means++, random partition).

Pure array functions of one chunk. Random numbers come from
:func:`dkmeans.kernels.sampling.uniform_by_index`, keyed by global row index, so every
selection is the same whatever the chunking.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dkmeans.kernels.backends import sparse as _sparse
from dkmeans.kernels.backends.select import ALWAYS, Backend, select
from dkmeans.kernels.backends.sparse import take_rows
from dkmeans.kernels.namespace import get_namespace
from dkmeans.kernels.nearest import (
    DEFAULT_SCRATCH_BYTES,
    Partials,
    TopRows,
    assign,
    cluster_sums,
    plan_tiles,
    select_top,
)
from dkmeans.kernels.plans import numpy_plan
from dkmeans.kernels.sampling import uniform_by_index, weighted_sample_keys


class Nearest(NamedTuple):
    """Per-row state: squared distance to (float64) and index of the nearest candidate."""

    sq_dist: Any
    index: Any


def update_nearest(X, state: Nearest | None, new_centers, first_index: int) -> Nearest:
    """Fold new candidates (numbered from ``first_index``) into the per-row nearest state.

    A k-means|| round may draw no candidate (a normal event at small k): with no new
    candidates the state is returned as it is.
    """
    xp = get_namespace(X)
    if new_centers.shape[0] == 0:
        if state is None:
            raise ValueError("update_nearest needs at least one candidate to start from")
        return state
    labels, min_sq = assign(X, new_centers)
    d2 = min_sq.astype(xp.float64)
    if state is None:
        return Nearest(d2, labels.astype(xp.int32) + first_index)
    better = d2 < state.sq_dist
    return Nearest(
        xp.where(better, d2, state.sq_dist), xp.where(better, labels + first_index, state.index)
    )


def row_index(xp, offset: int, n: int):
    return xp.arange(offset, offset + n, dtype=xp.int64)


def oversample_scores(X, weights, offset: int, d2, seed: int, stream: int, m: int):
    """k-means|| sampling scores and the chunk's top ``m`` rows by them.

    A row is drawn when ``u < l k w d2 / phi``, i.e. when its score ``w d2 / u`` exceeds
    ``phi / (l k)``. Scores need no global ``phi``, so a chunk returns its top ``m`` rows
    and the driver applies the threshold once ``phi`` is known (same pass).

    Returns
    -------
    TopRows
        Rows with ``w d2 > 0`` only (a row at distance 0 is already a candidate).
    phi : float64 scalar array
        ``sum(w d2)`` of the chunk.
    """
    xp = get_namespace(X)
    index = row_index(xp, offset, X.shape[0])
    wd2 = d2 if weights is None else d2 * xp.asarray(weights, dtype=xp.float64)
    score = wd2 / uniform_by_index(index, seed, stream)
    keep = select_top(xp, score, index, m, eligible=wd2 > 0)
    return TopRows(score[keep], index[keep], take_rows(X, keep)), xp.sum(wd2)


def rows_above(X, weights, offset: int, d2, seed: int, stream: int, threshold: float) -> TopRows:
    """All rows whose k-means|| score exceeds ``threshold`` (the exact fallback)."""
    xp = get_namespace(X)
    index = row_index(xp, offset, X.shape[0])
    wd2 = d2 if weights is None else d2 * xp.asarray(weights, dtype=xp.float64)
    score = wd2 / uniform_by_index(index, seed, stream)
    keep = select_top(xp, score, index, X.shape[0], eligible=(wd2 > 0) & (score > threshold))
    return TopRows(score[keep], index[keep], take_rows(X, keep))


def sq_distances(X, C, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES):
    """Squared distances (n, k) in float64, tiled; for a few centres (k-means++ trials)."""
    if select(X) is Backend.SPARSE:
        return _sparse.sq_distances(X, C, scratch_bytes=scratch_bytes)
    xp = get_namespace(X)
    n, d = X.shape
    C64 = xp.asarray(C, dtype=xp.float64)
    c_sq = xp.sum(C64 * C64, axis=1)
    out = xp.empty((n, C64.shape[0]), dtype=xp.float64)
    rows, _ = plan_tiles(n, C64.shape[0], d, 8, scratch_bytes)
    for i0 in range(0, n, rows):
        Xt = X[i0 : i0 + rows].astype(xp.float64)
        block = xp.sum(Xt * Xt, axis=1)[:, None] - 2.0 * (Xt @ C64.T) + c_sq[None, :]
        out[i0 : i0 + rows] = xp.maximum(block, 0.0)
    return out


class TrialPartial(NamedTuple):
    """One chunk's contribution to a greedy k-means++ step.

    ``potentials[t]``: ``sum w min(d2, ||x - trial_t||^2)``; ``samples[t]``: the chunk's
    top rows for the next step's trials if trial ``t`` wins (``None`` entries when no
    next step is sampled).
    """

    potentials: Any
    samples: tuple


def kpp_trials(
    X, weights, offset: int, d2, trials, seed: int, stream: int, n_next: int
) -> TrialPartial:
    """Evaluate k-means++ trial centres on a chunk and sample the next trials for each outcome.

    Parameters
    ----------
    d2 : array (n,), float64
        Squared distance of each row to the centres chosen so far.
    trials : array (t, d) or None
        Trial centres to evaluate; ``None`` samples the first trials from ``d2`` only.
    n_next : int
        How many next-step trials to sample per outcome (0: none).
    """
    xp = get_namespace(X)
    index = row_index(xp, offset, X.shape[0])
    w = None if weights is None else xp.asarray(weights, dtype=xp.float64)
    u = uniform_by_index(index, seed, stream) if n_next else None
    if trials is None:
        outcomes = [d2]
    else:
        D = sq_distances(X, trials)
        outcomes = [xp.minimum(d2, D[:, t]) for t in range(D.shape[1])]
    potentials, samples = [], []
    for d2t in outcomes:
        wd2 = d2t if w is None else d2t * w
        potentials.append(xp.sum(wd2))
        if n_next:
            keys, eligible = weighted_sample_keys(xp, wd2, u)
            keep = select_top(xp, keys, index, n_next, eligible=eligible)
            samples.append(TopRows(keys[keep], index[keep], take_rows(X, keep)))
        else:
            samples.append(None)
    return TrialPartial(xp.stack(potentials), tuple(samples))


def random_partition_partials(X, weights, offset: int, k: int, seed: int, stream: int) -> Partials:
    """Sums and counts when each row joins a uniformly random cluster (keyed by row index)."""
    xp = get_namespace(X)
    u = uniform_by_index(row_index(xp, offset, X.shape[0]), seed, stream)
    labels = xp.minimum((u * k).astype(xp.int32), k - 1)
    sums, counts = cluster_sums(X, labels, k, weights)
    return Partials(sums, counts, xp.zeros((), dtype=xp.float64))


def candidate_weights(nearest_index, weights, n_candidates: int):
    """(Weighted) number of rows nearest to each candidate, float64."""
    xp = get_namespace(nearest_index)
    w = None if weights is None else xp.asarray(weights, dtype=xp.float64)
    return xp.bincount(nearest_index, weights=w, minlength=n_candidates).astype(xp.float64)


def objectives(X, weights, center_sets):
    """Weighted objective of the chunk for each centroid set in ``center_sets``, float64 (len(sets),)."""
    xp = get_namespace(X)
    w = None if weights is None else xp.asarray(weights, dtype=xp.float64)
    out = []
    for C in center_sets:
        d2 = assign(X, xp.asarray(C))[1].astype(xp.float64)
        out.append(xp.sum(d2 if w is None else d2 * w))
    return xp.stack(out)


def weighted_lloyd(X, weights, centers, *, max_iter: int = 300, tol: float = 1e-6):
    """Weighted Lloyd on rows held in memory (k-means||'s candidates), by scikit-learn's rules.

    From ``centers``, each update assigns every row to its nearest centre and moves each
    centre to the weighted mean of its rows, until the labels repeat, or the squared centre
    shift summed over centres is at most ``tol`` times the rows' mean (unweighted) feature
    variance, or after ``max_iter`` updates: the stops of ``sklearn.cluster.KMeans(init=centers,
    n_init=1, algorithm="lloyd")``, which this replaces where the candidates are clustered (its
    first call in a process scans the loaded libraries for their thread pools: 20 ms of a
    0.2 s fit). A centre left without rows of positive weight takes the row farthest from its
    centre (the farthest first, ties to the lower index), as scikit-learn relocates them.

    The rows run the namespace code whatever a fit's path: float64 candidates never compile
    float64 loops in the middle of a float32 fit, and the result does not depend on the path.

    Parameters
    ----------
    X : array, shape (n, d)
    weights : array, shape (n,)
        Positive weights.
    centers : array, shape (k, d)
        The start.
    max_iter : int
    tol : float

    Returns
    -------
    array, shape (k, d), float64
    """
    xp = get_namespace(X)
    X = xp.asarray(X, dtype=xp.float64)
    w = xp.asarray(weights, dtype=xp.float64)
    C = xp.array(centers, dtype=xp.float64, copy=True)
    k = C.shape[0]
    threshold = float(tol) * float(xp.mean(xp.var(X, axis=0))) if X.shape[0] else 0.0
    previous = None
    with numpy_plan().applied():
        for _ in range(max_iter):
            labels, d2 = assign(X, C)
            sums, counts = cluster_sums(X, labels, k, w)
            empty = xp.nonzero(counts <= 0)[0]
            if empty.shape[0]:
                _relocate_empty(X, w, labels, d2, sums, counts, empty)
            filled = counts > 0  # a cluster emptied by a relocation keeps its centre
            new = xp.where(filled[:, None], sums / xp.where(filled, counts, 1.0)[:, None], C)
            if previous is not None and bool(xp.all(labels == previous)):
                return new
            shift = float(xp.sum((new - C) ** 2))
            C, previous = new, labels
            if shift <= threshold:
                break
    return C


def _relocate_empty(X, w, labels, d2, sums, counts, empty) -> None:
    """Give each empty cluster the row farthest from its centre: ``sums`` and ``counts`` in place
    (the labels stay: the next update assigns again), see :func:`weighted_lloyd`."""
    xp = get_namespace(X)
    far = xp.argsort(-xp.where(w > 0, d2, -1.0), kind="stable")[: empty.shape[0]]
    for j, i in zip(empty.tolist(), far.tolist()):
        if float(w[i]) <= 0:
            break
        old = int(labels[i])
        sums[old] -= X[i] * w[i]
        counts[old] -= w[i]
        sums[j] = X[i] * w[i]
        counts[j] = w[i]


class SampleRows(NamedTuple):
    """Rows drawn from a chunk, in global row order: their global indices, the rows and their weights."""

    index: Any  # (m,) int64
    rows: Any  # (m, d), the data's dtype (dense)
    weights: Any  # (m,) float64


def bernoulli_rows(
    X, weights, offset: int, probability: float, seed: int, stream: int
) -> SampleRows:
    """Each row with positive weight drawn independently with ``probability`` (keyed by global row index).

    A row is drawn when its uniform number ``u < probability``; ``probability >= 1`` takes
    every row. The draw of a row does not depend on the chunking.
    """
    xp = get_namespace(X)
    index = row_index(xp, offset, X.shape[0])
    w = (
        xp.ones(X.shape[0], dtype=xp.float64)
        if weights is None
        else xp.asarray(weights, dtype=xp.float64)
    )
    keep = w > 0
    if probability < 1:
        keep &= uniform_by_index(index, seed, stream) < probability
    keep = xp.nonzero(keep)[0]
    rows = take_rows(X, keep)
    return SampleRows(index[keep], rows, w[keep])


def concat_sample_rows(parts) -> SampleRows:
    """Concatenate :class:`SampleRows` in global row order (associative; chunk order does not matter)."""
    parts = [p for p in parts if p is not None]
    xp = get_namespace(parts[0].index)
    index = xp.concatenate([p.index for p in parts])
    rows = xp.concatenate([p.rows for p in parts])
    weights = xp.concatenate([p.weights for p in parts])
    if index.shape[0] > 1 and not bool(xp.all(index[1:] > index[:-1])):  # parts out of row order
        order = xp.argsort(index, kind="stable")
        index, rows, weights = index[order], rows[order], weights[order]
    return SampleRows(index, rows, weights)


def _kpp_local_xp(X, w, k: int, trials: int, u, first: int):
    """The namespace version of :func:`dkmeans.kernels.backends.compiled.kpp_local` (same choices)."""
    xp = get_namespace(X)
    n = X.shape[0]
    chosen = [first]
    d2 = xp.sum((X - X[first]) ** 2, axis=1)
    for j in range(1, k):
        cum = xp.cumsum(w * d2)
        total = float(cum[-1])
        if not total > 0:
            chosen.append(first)
            continue
        best_pot, best_row, best = np.inf, first, None
        for t in range(trials):
            row = min(int(xp.searchsorted(cum, float(u[(j - 1) * trials + t]) * total)), n - 1)
            while row > 0 and float(w[row] * d2[row]) <= 0:
                row -= 1
            trial = xp.minimum(d2, xp.sum((X - X[row]) ** 2, axis=1))
            pot = float(xp.sum(w * trial))
            if pot < best_pot:
                best_pot, best_row, best = pot, row, trial
        chosen.append(best_row)
        d2 = best
    return xp.asarray(chosen, dtype=xp.int64)


def local_kmeans_plusplus(X, weights, k: int, seed: int, stream: int, trials: int = 1):
    """k-means++ on rows held in memory (a sample on the client): the indices of the ``k`` chosen rows.

    The first row is drawn proportionally to ``weights``; each later step draws ``trials``
    rows proportionally to ``w d2`` (squared distance to the nearest chosen row) and keeps
    the one that lowers ``sum(w d2)`` most (``trials=1``: Arthur and Vassilvitskii's
    k-means++; ``2 + ln k``: scikit-learn's greedy variant). Draws come from
    :func:`uniform_by_index` keyed by ``(seed, stream)`` and the step, so the choice
    depends only on the rows and their order. If every row coincides with a chosen one,
    the remaining steps repeat the first row (the caller's empty-cluster rule separates them).
    Work: ``k * trials * n * d``; float64 throughout. NumPy rows run a compiled loop
    (Dask config ``dkmeans.kernels.backend = "numpy"``: the namespace code, which makes the
    same choices).

    Returns
    -------
    array of int64, shape (k,)
    """
    xp = get_namespace(X)
    n = X.shape[0]
    X64 = xp.ascontiguousarray(xp.asarray(X, dtype=xp.float64))
    w = (
        xp.ones(n, dtype=xp.float64)
        if weights is None
        else xp.ascontiguousarray(xp.asarray(weights, dtype=xp.float64))
    )
    draws = uniform_by_index(xp.arange((k - 1) * trials + 1, dtype=xp.int64), seed, stream)
    cum_w = xp.cumsum(w)
    first = min(int(xp.searchsorted(cum_w, float(draws[-1]) * float(cum_w[-1]))), n - 1)
    while first > 0 and float(w[first]) <= 0:
        first -= 1
    u = draws[:-1]
    if select(X64, compiled=ALWAYS) is Backend.COMPILED:  # compiled in the call on first use
        from dkmeans.kernels.backends.compiled import kpp_local

        return kpp_local(X64, w, k, trials, np.ascontiguousarray(u), first)
    return _kpp_local_xp(X64, w, k, trials, u, first)
