"""Choosing k-means++ local search swaps from the reduced costs, on the client (driver logic).

The kernels of :mod:`dkmeans.kernels.swap` score every (candidate, centroid) swap chunk by
chunk; once the costs are reduced, :func:`best_swaps` orders them and :func:`select_swaps`
picks several that barely interact, for :mod:`dkmeans.drivers.local_search`.
"""

from __future__ import annotations

import numpy as np

from dkmeans.kernels import assign


def best_swaps(delta, candidate_index, n: int, resolution: float = 0.0):
    """The ``n`` swaps with the lowest ``delta``, best first (ties: lower candidate row index, then
    lower centroid index).

    Parameters
    ----------
    delta : ndarray, shape (m, k), float64
        Change of the objective under each swap (``cost - objective``), on the host.
    candidate_index : ndarray, shape (m,), int64
        Global row index of each candidate.
    n : int
    resolution : float
        Changes are compared rounded down to multiples of this (0: exactly), so that sums
        rounded differently (another chunking) order the swaps alike: swaps that are
        equally good but for rounding (removing either of two centroids sharing a group)
        are told apart by index.

    Returns
    -------
    candidates, centroids : ndarray of int64
        Positions of the candidates and the indices of the centroids they replace.
    """
    delta = np.asarray(delta, dtype=np.float64)
    k = delta.shape[1] if delta.ndim == 2 else 0
    flat = delta.ravel()
    n = min(max(n, 0), flat.size)
    if n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    key = np.floor(flat / resolution) if resolution > 0 else flat
    # every entry tied with the n-th smallest, so the tie-break sees them all
    sel = (
        np.flatnonzero(key <= np.partition(key, n - 1)[n - 1])
        if n < flat.size
        else np.arange(flat.size)
    )
    cand, cent = np.divmod(sel, k)
    order = np.lexsort((cent, np.asarray(candidate_index)[cand], key[sel]))[:n]
    return cand[order].astype(np.int64), cent[order].astype(np.int64)


def _nearest_other(C64, j: int) -> int:
    """Index of the centroid nearest to centroid ``j`` (another one; ``-1`` when ``k == 1``)."""
    d = np.sum((C64 - C64[j]) ** 2, axis=1)
    d[j] = np.inf
    return int(np.argmin(d)) if len(d) > 1 else -1


def select_swaps(
    delta, candidate_index, P, C, max_swaps: int, threshold: float, resolution: float = 0.0
):
    """Improving swaps to make at once, best first, chosen greedily among those that barely interact.

    The first is the best swap (as :func:`best_swaps`). Further swaps, in the same order,
    are taken while their individual changes can be expected to add up: each removes a
    different centroid and adds a different candidate, no candidate lies nearer to another
    chosen candidate than to its own nearest centroid, no removed centroid is the nearest
    centroid of a chosen candidate, and no two removed centroids are each other's nearest.
    The sum of the changes is an estimate only: measure the result
    (:func:`swap_partials`) before relying on it.

    Parameters
    ----------
    delta : ndarray, shape (m, k), float64
        Change of the objective under each swap (``cost - objective``), on the host.
    candidate_index : ndarray, shape (m,), int64
        Global row index of each candidate (tie-breaking).
    P : ndarray, shape (m, d)
    C : ndarray, shape (k, d)
    max_swaps : int
        At most this many swaps.
    threshold : float
        Only swaps with ``delta < threshold`` (negative: real improvements).
    resolution : float
        As in :func:`best_swaps`.

    Returns
    -------
    candidates, centroids : ndarray of int64
        Positions in ``P`` and the indices of the centroids they replace, in order.
    """
    delta = np.asarray(delta, dtype=np.float64)
    improving = int(np.count_nonzero(delta < threshold))
    if improving == 0 or max_swaps <= 1:  # the best swap alone, if any may be made
        return best_swaps(delta, candidate_index, min(improving, max(0, max_swaps)), resolution)
    P64 = np.asarray(P, dtype=np.float64)
    C64 = np.asarray(C, dtype=np.float64)
    home, home_sq = assign(P64, C64)  # each candidate's nearest centroid and squared distance to it
    chosen_p: list[int] = []
    chosen_j: list[int] = []
    removed: set[int] = set()
    guarded: set[int] = (
        set()
    )  # centroids that must stay: nearest to a chosen candidate or removed one
    # the improving swaps in order, a growing prefix at a time (best_swaps(n) is the first n of the
    # whole order): the greedy choice usually ends long before the last of them (manyk: millions)
    seen, batch = 0, min(improving, SELECT_FIRST_BATCH * max_swaps)
    while len(chosen_p) < max_swaps and seen < improving:
        cand, cent = best_swaps(delta, candidate_index, batch, resolution)
        for p, j in zip(cand[seen:].tolist(), cent[seen:].tolist()):
            if len(chosen_p) >= max_swaps:
                break
            if p in chosen_p or j in removed or j in guarded or int(home[p]) in removed:
                continue
            near = _nearest_other(C64, j)
            if near in removed:
                continue
            if chosen_p:
                sep = np.sum((P64[chosen_p] - P64[p]) ** 2, axis=1)
                if np.any(sep < np.maximum(home_sq[p], home_sq[chosen_p])):
                    continue
            chosen_p.append(p)
            chosen_j.append(j)
            removed.add(j)
            guarded.update((int(home[p]), near))
        seen, batch = batch, min(improving, 8 * batch)
    return np.asarray(chosen_p, dtype=np.int64), np.asarray(chosen_j, dtype=np.int64)


#: :func:`select_swaps` orders this many improving swaps per swap it may make, then more if needed.
SELECT_FIRST_BATCH = 64


__all__ = ["best_swaps", "select_swaps"]
