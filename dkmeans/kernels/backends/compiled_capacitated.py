"""Compiled loops of the priced assignment (numba, one thread): :mod:`dkmeans.kernels.capacitated`.

Row by row over a chunk's integer costs ``D`` (n, k) kept between passes: the lexicographically
smallest ``(D + P, h(i) xor g(j) + Q)``, lowest column on full ties, the same values to the bit
as the NumPy code (integer sums held in float64). The secondary cost is formed only where two
primary costs tie: most rows never hash.
"""

from __future__ import annotations

import numpy as np

from dkmeans.kernels import exchange as _exchange
from dkmeans.kernels import repair as _repair
from dkmeans.kernels.backends.jit import njit


@njit(nogil=True)
def quantized_costs(xn, xc, cn, q, out):  # pragma: no cover - compiled
    """``out = rint(max(xn - 2 xc + cn, 0) / q)`` (0 where ``q`` is 0), row norms ``xn`` (n,),
    products ``xc`` (n, k), centroid norms ``cn`` (k,): the operations of
    :func:`~dkmeans.kernels.capacitated.sq_distances64` in its order (``2 xc`` is exact, so a
    fused multiply-add rounds alike); returns the largest clipped squared distance."""
    n, k = xc.shape
    top = 0.0
    for i in range(n):
        for j in range(k):
            d = (xn[i] - 2.0 * xc[i, j]) + cn[j]
            if d < 0.0:
                d = 0.0
            if d > top:
                top = d
            out[i, j] = np.rint(d / q) if q != 0.0 else 0.0
    return top


@njit(nogil=True, inline="always")
def _secondary(h, g, q):  # pragma: no cover - compiled
    return float(h ^ g) + q


@njit(nogil=True)
def _smallest_pair(D, P, Q, h, hcol, i, skip, allowed, bj):  # pragma: no cover - compiled
    """Row ``i``'s smallest ``(A, B)`` pair among the ``allowed`` columns but ``skip``, ``bj``
    the column it starts from: ``(column, A, B)``, B infinite where no column was allowed."""
    ba = np.inf
    bb = np.inf
    tied = False
    for j in range(D.shape[1]):
        if j == skip or not allowed[j]:
            continue
        x = D[i, j] + P[j]
        if x < ba:
            ba, bj, tied = x, j, False
        elif x == ba:
            if not tied:
                bb = _secondary(h, hcol[bj], Q[bj])
                tied = True
            y = _secondary(h, hcol[j], Q[j])
            if y < bb:
                bb, bj = y, j
    if bj < 0:
        return bj, ba, np.inf
    return bj, ba, bb if tied else _secondary(h, hcol[bj], Q[bj])


@njit(nogil=True)
def best_rows(D, P, Q, hrow, hcol, labels, a, b):  # pragma: no cover - compiled
    """Per row the smallest ``(A, B)`` pair: its column (``labels``), ``a`` and ``b``."""
    n, k = D.shape
    every = np.ones(k, dtype=np.bool_)
    for i in range(n):
        labels[i], a[i], b[i] = _smallest_pair(D, P, Q, hrow[i], hcol, i, -1, every, 0)


@njit(nogil=True)
def next_rows(D, P, Q, hrow, hcol, rows, own, allowed, a2, b2):  # pragma: no cover - compiled
    """For the rows ``rows``, the smallest pair among the ``allowed`` columns but ``own[r]``."""
    for r in range(rows.shape[0]):
        i = rows[r]
        _, a2[r], b2[r] = _smallest_pair(D, P, Q, hrow[i], hcol, i, own[r], allowed, -1)


@njit(nogil=True)
def enter_candidates(D, P, Q, hrow, hcol, labels, a, b, cols, wanted):  # pragma: no cover
    """For each cluster ``cols[c]``, the rows of other clusters whose margin ``A - a`` to move
    into it is at most its ``wanted[c]``-th smallest (every such row: ties at the cut kept), as
    ``(c, row, A - a, B - b)`` arrays; the exact selection is the caller's."""
    n = D.shape[0]
    buf = np.empty(n)
    total = 0
    cuts = np.empty(cols.shape[0])
    for c in range(cols.shape[0]):
        j, p = cols[c], P[cols[c]]
        m = 0
        for i in range(n):
            if labels[i] != j:
                buf[m] = D[i, j] + p - a[i]
                m += 1
        cut = np.inf
        if wanted[c] < m:
            cut = np.partition(buf[:m], wanted[c] - 1)[wanted[c] - 1]
        cuts[c] = cut
        for i in range(m):
            if buf[i] <= cut:
                total += 1
    owner = np.empty(total, np.int64)
    rows = np.empty(total, np.int64)
    mA = np.empty(total)
    mB = np.empty(total)
    t = 0
    for c in range(cols.shape[0]):
        j, p, q, g = cols[c], P[cols[c]], Q[cols[c]], hcol[cols[c]]
        for i in range(n):
            if labels[i] != j:
                x = D[i, j] + p - a[i]
                if x <= cuts[c]:
                    owner[t], rows[t], mA[t] = c, i, x
                    mB[t] = _secondary(hrow[i], g, q) - b[i]
                    t += 1
    return owner, rows, mA, mB


@njit(nogil=True)
def partial_rows(X, w, weighted, C64, labels, sums, sizes, counts):  # pragma: no cover - compiled
    """Lloyd partials of labelled rows (exact float64 differences ``x - c``); the objective."""
    n, d = X.shape
    total = 0.0
    for i in range(n):
        j = labels[i]
        wi = w[i] if weighted else 1.0
        s = 0.0
        for f in range(d):
            x = np.float64(X[i, f])
            t = x - C64[j, f]
            s += t * t
            sums[j, f] += wi * x
        total += wi * s
        sizes[j] += wi
        counts[j] += 1.0
    return total


@njit(nogil=True)
def margin_counts(D, P, labels, a, wt, edges, limit, counts):  # pragma: no cover - compiled
    """Add every row's weight to its bin of :func:`~dkmeans.kernels.capacitated.margin_edges`
    for each other cluster ``b``: ``counts[(labels[i] k + b) nbins + bin]``, the bin of the margin
    ``D[i, b] + P[b] - a[i]`` where it is at most ``limit``. The same bins as
    ``searchsorted(edges, margin, "right")``: a guess from the margin's binary exponent and
    mantissa (each octave's edges are the first octave's times a power of two), settled by
    comparisons with the edges. The float's bits, not its ``log2``: a pass with every margin's
    histogram on a 250,000 x 16 chunk, k = 32, 82.6 -> 41.9 ms (``benchmarks/balanced_costs.py``)."""
    n, k = D.shape
    last = edges.shape[0]
    nbins = last + 1
    per = 1
    while per < last and edges[per] < 2.0:
        per += 1  # the edges of one octave
    word = np.empty(1)  # a margin's float64 bits, read through an integer view of one word
    bits = word.view(np.int64)
    mantissa = (np.int64(1) << 52) - 1
    steps = np.empty(per, np.int64)  # the first octave's edges' mantissas, in order
    for j in range(per):
        word[0] = edges[j]
        steps[j] = bits[0] & mantissa
    for i in range(n):
        own = labels[i]
        base = (own * k) * nbins
        for b in range(k):
            if b == own:
                continue
            e = D[i, b] + P[b] - a[i]
            if e > limit:
                continue
            if e < 1.0:
                t = 0
            else:
                word[0] = e
                exponent = (bits[0] >> 52) - 1023
                m = bits[0] & mantissa
                t = per * exponent
                for j in range(per):
                    if m >= steps[j]:
                        t += 1
                if t > last:
                    t = last
                while t < last and edges[t] <= e:
                    t += 1
                while t > 1 and edges[t - 1] > e:
                    t -= 1
            counts[base + b * nbins + t] += wt[i]


@njit(nogil=True)
def merge_sorted_lists(pair, cost, row, bounds, m):  # pragma: no cover - compiled
    """Indices of the entries kept when merging sorted exchange lists: parts ``bounds[p] ..
    bounds[p + 1]`` each sorted by ``(pair, cost, row)``; per pair the ``m`` smallest ``(cost,
    row)``, in ``(pair, cost, row)`` order (what a sort of all the entries selects)."""
    parts = bounds.shape[0] - 1
    at = bounds[:-1].copy()
    out = np.empty(bounds[-1], np.int64)
    t = 0
    while True:
        current = -1
        for p in range(parts):  # the smallest pair at the parts' heads
            if at[p] < bounds[p + 1] and (current < 0 or pair[at[p]] < current):
                current = pair[at[p]]
        if current < 0:
            break
        taken = 0
        while taken < m:
            best = -1
            for p in range(parts):
                i = at[p]
                if i < bounds[p + 1] and pair[i] == current:
                    if (
                        best < 0
                        or cost[i] < cost[at[best]]
                        or (cost[i] == cost[at[best]] and row[i] < row[at[best]])
                    ):
                        best = p
            if best < 0:
                break
            out[t] = at[best]
            t += 1
            at[best] += 1
            taken += 1
        for p in range(parts):  # the pair's entries past its m smallest
            while at[p] < bounds[p + 1] and pair[at[p]] == current:
                at[p] += 1
    return out[:t]


#: :func:`dkmeans.kernels.exchange.exchange_flow` compiled (the same function: the same moves).
exchange_flow = njit(nogil=True)(_exchange.exchange_flow)
#: :func:`dkmeans.kernels.repair.take_moves` compiled (the same function: the same moves).
take_moves = njit(nogil=True)(_repair.take_moves)


@njit(nogil=True, inline="always")
def _before(v, r, cost, row, p, j):  # pragma: no cover - compiled
    """Whether ``(v, r)`` comes before heap entry ``j`` of pair ``p`` (cost, then row)."""
    return v < cost[p, j] or (v == cost[p, j] and r < row[p, j])


@njit(nogil=True)
def exchange_rows(D, labels, row_offset, m, cost, row, count):  # pragma: no cover - compiled
    """Per pair ``(a, b)`` the ``m`` cheapest ``(D[i, b] - D[i, a], row)`` of the rows labelled
    ``a``: a max-heap of ``m`` entries per pair in ``cost``, ``row`` (k * k, m), ``count``
    (k * k,) entries held. The same set as the NumPy selection, in heap order."""
    n, k = D.shape
    root = np.full(k * k, np.inf)  # a full heap's largest cost (small: stays in cache)
    for i in range(n):
        a = labels[i]
        base = D[i, a]
        r = row_offset + i
        for b in range(k):
            if b == a:
                continue
            v = D[i, b] - base
            p = a * k + b
            if v > root[p]:
                continue  # above a full heap's largest: most rows end here
            c = count[p]
            if c < m:  # room: sift up
                j = c
                count[p] = c + 1
                while j > 0:
                    up = (j - 1) // 2
                    if _before(v, r, cost, row, p, up):
                        break
                    cost[p, j], row[p, j] = cost[p, up], row[p, up]
                    j = up
                cost[p, j], row[p, j] = v, r
                if c + 1 == m:
                    root[p] = cost[p, 0]
            elif _before(v, r, cost, row, p, 0):  # below the largest: it replaces the root
                j = 0
                while True:
                    left = 2 * j + 1
                    if left >= m:
                        break
                    big = left
                    if left + 1 < m and _before(
                        cost[p, left], row[p, left], cost, row, p, left + 1
                    ):
                        big = left + 1
                    if not _before(v, r, cost, row, p, big):
                        break
                    cost[p, j], row[p, j] = cost[p, big], row[p, big]
                    j = big
                cost[p, j], row[p, j] = v, r
                root[p] = cost[p, 0]


@njit(nogil=True)
def sorted_heaps(cost, row, count):  # pragma: no cover - compiled
    """The entries of :func:`exchange_rows`' heaps in pair order, each pair's by cost, then row:
    ``(pair, cost, row)`` arrays."""
    pairs, m = cost.shape
    total = 0
    for p in range(pairs):
        total += count[p]
    out_pair = np.empty(total, np.int64)
    out_cost = np.empty(total)
    out_row = np.empty(total, np.int64)
    t = 0
    for p in range(pairs):
        c = count[p]
        for j in range(c):  # insertion sort of the pair's few entries
            v, r = cost[p, j], row[p, j]
            s = t + j
            while s > t and (out_cost[s - 1] > v or (out_cost[s - 1] == v and out_row[s - 1] > r)):
                out_cost[s], out_row[s] = out_cost[s - 1], out_row[s - 1]
                s -= 1
            out_cost[s], out_row[s] = v, r
        for j in range(c):
            out_pair[t + j] = p
        t += c
    return out_pair, out_cost, out_row
