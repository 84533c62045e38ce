"""Compiled loops of the local-search swap kernels (numba, one thread): :mod:`dkmeans.kernels.swap`.

Row by row, the translated float64 row's nearest two centroids (exact differences, strict
``<``: ties keep the lower index), then what the operation needs from them: the nearest two
themselves, every swap's cost, or each trial's Lloyd partials. No tiles and no ``n x k`` or
``n x m`` temporaries; the operation module takes them for few centroids or candidates.
"""

from __future__ import annotations

import numpy as np

from dkmeans.kernels.backends.jit import njit


@njit(nogil=True, inline="always")
def nearest_two_of_row(row, C64):  # pragma: no cover - compiled
    """(nearest, its squared distance, second nearest, its squared distance) of one translated row."""
    k, d = C64.shape
    b1, b2, j1, j2 = np.inf, np.inf, 0, 0
    for j in range(k):
        s = 0.0
        for f in range(d):
            t = row[f] - C64[j, f]
            s += t * t
        if s < b1:  # strict: ties keep the lower index nearest
            b2, j2, b1, j1 = b1, j1, s, j
        elif s < b2:
            b2, j2 = s, j
    return j1, b1, j2, b2


@njit(nogil=True)
def nearest_two_rows(X, origin, C64, first, second, d1, d2):  # pragma: no cover - compiled
    """Compiled :func:`dkmeans.kernels.swap.nearest_two` for host rows: exact translated float64
    distances, row by row."""
    n, d = X.shape
    k = C64.shape[0]
    row = np.empty(d, dtype=np.float64)
    for i in range(n):
        for f in range(d):
            row[f] = X[i, f] - origin[f]
        j1, b1, j2, b2 = nearest_two_of_row(row, C64)
        first[i], d1[i] = j1, b1
        second[i], d2[i] = (j2, b2) if k > 1 else (j1, np.inf)


@njit(nogil=True)
def swap_costs_rows(
    X, origin, C64, P64, w, weighted, per_candidate, per_cluster, objective
):  # pragma: no cover
    """Compiled :func:`dkmeans.kernels.swap.swap_costs` for host rows (exact float64 differences, one row at a time)."""
    n, d = X.shape
    m = P64.shape[0]
    row = np.empty(d, dtype=np.float64)
    total = 0.0
    for i in range(n):
        for f in range(d):
            row[f] = X[i, f] - origin[f]
        j1, b1, _, b2 = nearest_two_of_row(row, C64)
        wi = w[i] if weighted else 1.0
        total += wi * b1
        for p in range(m):
            s = 0.0
            for f in range(d):
                t = row[f] - P64[p, f]
                s += t * t
            keep = min(s, b1)
            per_candidate[p] += wi * keep
            per_cluster[j1, p] += wi * (min(s, b2) - keep)
    objective[0] = total


@njit(nogil=True)
def swap_partials_rows(
    X,
    origin,
    C64,
    P64,
    lengths,
    positions,
    replaced,
    removed,
    swapped,
    w,
    weighted,
    sums,
    counts,
    objective,
):  # pragma: no cover - compiled
    """Compiled :func:`dkmeans.kernels.swap.swap_partials` for host rows: each trial's labels from
    the nearest two and the candidates."""
    n, d = X.shape
    q = P64.shape[0]
    T = positions.shape[0]
    row = np.empty(d, dtype=np.float64)
    dp = np.empty(q, dtype=np.float64)
    for i in range(n):
        for f in range(d):
            row[f] = X[i, f] - origin[f]
        j1, b1, j2, b2 = nearest_two_of_row(row, C64)
        for p in range(q):
            s = 0.0
            for f in range(d):
                t = row[f] - P64[p, f]
                s += t * t
            dp[p] = s
        wi = w[i] if weighted else 1.0
        for t in range(T):
            label, dist = j1, b1
            if removed[t, j1]:
                label, dist = j2, b2
                if removed[t, j2]:  # nearest two both removed (rare): assign afresh
                    label, dist, _, _ = nearest_two_of_row(row, swapped[t])
            best, to_new = 0, np.inf
            for a in range(lengths[t]):
                if dp[positions[t, a]] < to_new:
                    best, to_new = a, dp[positions[t, a]]
            if to_new < dist:
                label, dist = replaced[t, best], to_new
            for f in range(d):
                sums[t, label, f] += wi * X[i, f]
            counts[t, label] += wi
            objective[t] += wi * dist


__all__ = ["nearest_two_of_row", "nearest_two_rows", "swap_costs_rows", "swap_partials_rows"]
