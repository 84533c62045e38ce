"""Compiled loops of the pruned Lloyd assignment (numba, one thread): :mod:`dkmeans.kernels.pruned`.

Every loop here is O(rows x groups) or O(rows x features) bookkeeping, or a reduction over
score blocks a BLAS product computed: no distance is computed here (the products are BLAS,
the labels that need the assignment kernel's own arithmetic come from that kernel).

The bounds must stay bounds after rounding. Lower bounds are float32: set from a float64 root
lowered by a relative ``2**-22`` before its conversion (which moves it by at most ``2**-24``),
moved by drifts enlarged to cover the float32 subtraction's rounding (:func:`float32_shift`), and
kept at least 0. Upper bounds are float64, enlarged by a relative ``2**-50`` after each addition.
"""

from __future__ import annotations

import numba
import numpy as np

from dkmeans.kernels.backends.compiled import rows_partials


@numba.njit(cache=True, nogil=True)
def settle(labels, upper, lower, norm, drift, shift, k0, k1, cand):  # pragma: no cover - compiled
    """Move every row's bounds by the centroids' drift; list the rows the bounds do not settle.

    ``upper[i] += drift[labels[i]]`` (float64, rounded up); ``lower[i, g] = max(lower[i, g] -
    shift[g], 0)`` in the bounds' float32, where ``shift`` (float32) is the group's largest drift
    enlarged by the rounding of that subtraction (see :func:`float32_shift`). Row ``i`` is settled
    when ``min_g lower[i, g] > upper[i]`` and ``min_g lower^2 - upper^2 > k0 * norm[i] + k1`` (the
    margin of the assignment kernel's rounding). The others go to ``cand`` in row order; returns
    how many.
    """
    n, G = lower.shape
    m = 0
    zero = lower.dtype.type(0)
    for i in range(n):
        u = (upper[i] + drift[labels[i]]) * (1.0 + 2.0**-50)
        upper[i] = u
        lmin = lower.dtype.type(np.inf)
        row = lower[i]
        for g in range(G):
            v = max(row[g] - shift[g], zero)
            row[g] = v
            lmin = min(lmin, v)
        low = np.float64(lmin)
        if not (low > u and low * low - u * u > k0 * norm[i] + k1):
            cand[m] = i
            m += 1
    return m


#: Reassociated sums (vectorised): the bounds' rounding terms hold for any order of a sum of squares.
_SUM_MATH = {"reassoc", "contract"}


@numba.njit(cache=True, nogil=True, fastmath=_SUM_MATH)
def tighten(X, C, labels, upper, lower, norm, k0, k1, cand, m):  # pragma: no cover - compiled
    """Exact upper bounds for the rows ``cand[:m]`` (from ``x - c_label`` in float64); the rows still
    not settled are moved to the front of ``cand``; returns their count."""
    d = X.shape[1]
    G = lower.shape[1]
    grow = 1.0 + (d + 4) * 2.0**-52  # float64 rounding of d squares, their sum and the root
    r = 0
    for t in range(m):
        i = cand[t]
        j = labels[i]
        s = 0.0
        for f in range(d):
            diff = np.float64(X[i, f]) - np.float64(C[j, f])
            s += diff * diff
        u = np.sqrt(s) * grow
        upper[i] = u
        lmin = np.inf
        for g in range(G):
            if lower[i, g] < lmin:
                lmin = lower[i, g]
        low = np.float64(lmin)
        if not (low > u and low * low - u * u > k0 * norm[i] + k1):
            cand[r] = i
            r += 1
    return r


@numba.njit(cache=True, nogil=True)
def group_needs(labels, upper, lower, norm, k0, k1, group_of, cand, m, need):  # pragma: no cover - compiled
    """``need[t, g]``: group ``g`` may hold a centroid the kernel prefers to row ``cand[t]``'s label
    (its bound does not exclude it), or holds the label itself; returns how many pairs of rows and
    groups are needed."""
    G = lower.shape[1]
    total = 0
    for t in range(m):
        i = cand[t]
        u = upper[i]
        margin = k0 * norm[i] + k1
        for g in range(G):
            v = np.float64(lower[i, g])
            need[t, g] = not (v > u and v * v - u * u > margin)
        need[t, group_of[labels[i]]] = True
        for g in range(G):
            total += need[t, g]
    return total


@numba.njit(cache=True, nogil=True)
def block_minima(St, h, order, starts, g0, g1, rows, gm, gi, gs, b1, b2, j1):  # pragma: no cover - compiled
    """Per group of a block of scores, each row's smallest score, its centroid and the second smallest.

    ``St`` is ``C_block @ X_tile.T`` (``x.c`` of every centroid of groups ``g0 <= g < g1``, laid out
    by group, against the tile's rows ``rows``): row ``j`` holds one centroid's products with every
    row of the tile, so the loop over the rows is contiguous and vectorises (as
    :func:`~dkmeans.kernels.backends.compiled.running_argmin_t`). The score is ``h[j] - St[j, t]``;
    per group and row the smallest (the first in centroid order on ties: strict ``<``), its
    centroid's index ``order[...]`` and the second smallest go to ``gm``, ``gi``, ``gs`` at
    ``[g, rows[t]]``. ``b1``, ``b2``, ``j1`` are scratch of at least the tile's length.
    """
    m = St.shape[1]
    base = starts[g0]
    for g in range(g0, g1):
        lo, hi = starts[g] - base, starts[g + 1] - base
        for t in range(m):
            b1[t] = np.inf
            b2[t] = np.inf
            j1[t] = lo
        for j in range(lo, hi):
            hj = h[j]
            row = St[j]
            for t in range(m):
                v = hj - row[t]
                less = v < b1[t]
                b2[t] = b1[t] if less else min(b2[t], v)
                j1[t] = j if less else j1[t]
                b1[t] = v if less else b1[t]
        for t in range(m):
            r = rows[t]
            gm[g, r] = b1[t]
            gi[g, r] = order[j1[t] + base]
            gs[g, r] = b2[t]
    return None


@numba.njit(cache=True, nogil=True)
def choose(gm, gi, gs, margin, labels, ok):  # pragma: no cover - compiled
    """Each row's best centroid over the computed groups (``gm[g, t]`` is ``+inf`` for the others), and
    whether the runner-up trails it by more than ``margin[t]`` (then the assignment kernel, whose
    scores differ from these by less than half the margin, picks it too). Loops over the rows
    innermost (they vectorise); the first group holding the smallest wins ties."""
    G, m = gm.shape
    best = gm[0].copy()
    gbest = np.zeros(m, dtype=np.int32)
    for g in range(1, G):
        row = gm[g]
        for t in range(m):
            less = row[t] < best[t]
            best[t] = row[t] if less else best[t]
            gbest[t] = g if less else gbest[t]
    second = np.full(m, np.inf, dtype=gm.dtype)
    for g in range(G):
        for t in range(m):
            v = gs[g, t] if gbest[t] == g else gm[g, t]
            second[t] = min(second[t], v)
    for t in range(m):
        labels[t] = gi[gbest[t], t]
        ok[t] = np.float64(second[t]) - np.float64(best[t]) > margin[t]
    return None


@numba.njit(cache=True, nogil=True, fastmath=_SUM_MATH)
def new_bounds(X, C, rows, labels, gm, gi, gs, group_of, sq_lo, sq_up, slack, lower, upper,
               out_labels):  # pragma: no cover - compiled
    """The bounds of the rows ``rows[t]`` after their distances were computed, and their labels;
    returns the largest finite lower bound set.

    A computed group's lower bound is its smallest score (the second smallest where the smallest
    is the row's label) turned into a distance: ``||x - c||^2 >= ||x||^2 + 2 (score - slack[t])``,
    rounded down; groups not computed (``gm`` is ``+inf``) keep theirs. The upper bound comes the
    same way from the label's score (``<= ||x||^2 + 2 (score + slack[t])``, rounded up) where it
    is its group's smallest, else from ``x - c`` in float64.
    """
    G, m = gm.shape
    d = X.shape[1]
    grow = 1.0 + (d + 4) * 2.0**-52
    largest = 0.0
    bound = np.empty(m, dtype=np.float32)
    for g in range(G):
        for t in range(m):  # branch-free: it vectorises
            v = np.float64(gs[g, t]) if gi[g, t] == labels[t] else np.float64(gm[g, t])
            sq = max(sq_lo[t] + 2.0 * (v - slack[t]), 0.0)
            # rounded down: the root's rounding and the float32 conversion's, below a relative 2^-22
            bound[t] = np.float32(np.sqrt(sq) * (1.0 - 2.0**-22) - 1e-30)
        for t in range(m):
            if gm[g, t] != np.inf:  # computed: the new bound
                lower[rows[t], g] = bound[t]
                if bound[t] != np.inf:
                    largest = max(largest, np.float64(bound[t]))
    for t in range(m):
        i = rows[t]
        lab = labels[t]
        own = group_of[lab]
        if gi[own, t] == lab and gm[own, t] != np.inf:
            sq = sq_up[t] + 2.0 * (np.float64(gm[own, t]) + slack[t])
            upper[i] = np.sqrt(max(sq, 0.0)) * (1.0 + 2.0**-50)
        else:
            s = 0.0
            for f in range(d):
                diff = np.float64(X[i, f]) - np.float64(C[lab, f])
                s += diff * diff
            upper[i] = np.sqrt(s) * grow
        out_labels[i] = lab
    return largest


@numba.njit(cache=True, nogil=True, fastmath=_SUM_MATH)
def row_norms(X, rows, norm_up, sq_lo, sq_up):  # pragma: no cover - compiled
    """``||x||`` rounded up, ``||x||^2`` rounded down and up (float64), of the rows ``rows``."""
    d = X.shape[1]
    lo, hi = 1.0 - (d + 4) * 2.0**-52, 1.0 + (d + 4) * 2.0**-52
    for t in range(rows.shape[0]):
        i = rows[t]
        s = 0.0
        for f in range(d):
            v = np.float64(X[i, f])
            s += v * v
        norm_up[t] = np.sqrt(s * hi) * (1.0 + 2.0**-50)
        sq_lo[t] = s * lo
        sq_up[t] = s * hi
    return None


@numba.njit(cache=True, nogil=True)
def tiled_partials(X, C, labels, T, weights, has_weights, sums, counts):  # pragma: no cover - compiled
    """The partials of rows with known labels, folded tile by tile as the direct kernels fold them
    (:func:`~dkmeans.kernels.backends.compiled.rows_partials` on tiles of ``T`` rows, their objectives
    added in row order): the same sums, counts and objective, to the bit."""
    n = X.shape[0]
    objective = 0.0
    for i0 in range(0, n, T):
        objective += rows_partials(X, i0, min(n, i0 + T), C, labels, 0, weights, has_weights, sums, counts)
    return objective


def float32_shift(shift, lower_max: float):
    """The float32 amounts :func:`settle` subtracts: each group's largest drift (float64), enlarged so
    that the float32 subtraction from any bound in ``[0, lower_max]`` rounds to at most the exact
    difference (a relative ``2**-23`` of ``lower_max + shift`` covers half an ulp), rounded up;
    0 where the group did not move."""
    shift = np.asarray(shift, dtype=np.float64)
    wanted = np.where(shift > 0, shift + 2.0**-23 * (lower_max + shift), 0.0)
    out = wanted.astype(np.float32)
    return np.where(out.astype(np.float64) < wanted, np.nextafter(out, np.float32(np.inf)), out)
