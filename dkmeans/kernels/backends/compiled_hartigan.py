"""Compiled loops of the Hartigan move kernels (numba, one thread): :mod:`dkmeans.kernels.hartigan`.

The exact cost of moving a row and the rules (a source keeps a row of positive weight; a
move must beat the relative margin ``rel_tol``) are those of the operation module's
docstring. Distances are float64 sums of squared differences, in feature order, so the
batch loop (:func:`best_moves`) gives every row's move bit for bit as the row-by-row one
(:func:`row_best`) that the sequential sweep (:func:`sweep`) uses.
"""

from __future__ import annotations

import numpy as np

from dkmeans.kernels.backends.jit import njit


@njit(nogil=True)
def row_best(X, i, l, wi, C, W, npos, rel_tol):  # pragma: no cover - compiled
    """(target, dcost, ||x - c_l||^2) of row ``i`` in cluster ``l``; target -1 if no improving move."""
    d = X.shape[1]
    k = C.shape[0]
    own = 0.0
    for f in range(d):
        diff = np.float64(X[i, f]) - C[l, f]
        own += diff * diff
    if wi <= 0.0 or npos[l] < 2 or W[l] - wi <= 0.0:
        return -1, 0.0, own
    remove = wi * W[l] / (W[l] - wi) * own
    best_add = np.inf
    best = -1
    for j in range(k):
        if j == l:
            continue
        if npos[j] == 0:
            add = 0.0
        else:
            s = 0.0
            for f in range(d):
                diff = np.float64(X[i, f]) - C[j, f]
                s += diff * diff
            add = wi * W[j] / (W[j] + wi) * s
        if add < best_add:  # strict: lowest cluster index on ties
            best_add = add
            best = j
    # remove is the same for every target, so the smallest add is the best move
    if best >= 0 and best_add * (1.0 + rel_tol) < remove * (1.0 - rel_tol):
        return best, best_add - remove, own
    return -1, 0.0, own


@njit(nogil=True)
def best_moves(
    X,
    labels,
    C,
    W,
    npos,
    weights,
    has_weights,
    rel_tol,  # pragma: no cover
    target,
    dcost,
    own_sq,
):
    """:func:`row_best` for every row, bit for bit, over row tiles transposed to float64.

    The loop over a tile's rows is innermost and contiguous, so it vectorises; each
    distance still sums its features in order, exactly as :func:`row_best` does.
    """
    n, d = X.shape
    k = C.shape[0]
    tile = 256
    Xt = np.empty((d, tile))
    acc = np.empty(tile)
    best_add = np.empty(tile)
    best_j = np.empty(tile, dtype=np.int64)
    wt = np.empty(tile)
    for i0 in range(0, n, tile):
        m = min(tile, n - i0)
        for i in range(m):
            for f in range(d):
                Xt[f, i] = X[i0 + i, f]
            wt[i] = weights[i0 + i] if has_weights else 1.0
            best_add[i] = np.inf
            best_j[i] = -1
        for j in range(k):
            for i in range(m):
                acc[i] = 0.0
            for f in range(d):
                c = C[j, f]
                for i in range(m):
                    diff = Xt[f, i] - c
                    acc[i] += diff * diff
            Wj = W[j]
            empty = npos[j] == 0
            unit = Wj / (Wj + 1.0)  # the factor of every row without weights
            for i in range(m):
                if labels[i0 + i] == j:
                    own_sq[i0 + i] = acc[i]
                    continue
                if empty:
                    add = 0.0
                elif has_weights:
                    add = wt[i] * Wj / (Wj + wt[i]) * acc[i]
                else:
                    add = unit * acc[i]
                if add < best_add[i]:  # strict: lowest cluster index on ties
                    best_add[i] = add
                    best_j[i] = j
        for i in range(m):
            r = i0 + i
            l = labels[r]
            wi = wt[i]
            target[r] = -1
            dcost[r] = 0.0
            if wi <= 0.0 or npos[l] < 2 or W[l] - wi <= 0.0:
                continue
            remove = wi * W[l] / (W[l] - wi) * own_sq[r]
            if best_j[i] >= 0 and best_add[i] * (1.0 + rel_tol) < remove * (1.0 - rel_tol):
                target[r] = best_j[i]
                dcost[r] = best_add[i] - remove


@njit(nogil=True)
def sweep(X, labels, C, W, npos, weights, has_weights, rel_tol):  # pragma: no cover - compiled
    moves = 0
    change = 0.0
    d = X.shape[1]
    for i in range(X.shape[0]):
        wi = weights[i] if has_weights else 1.0
        l = labels[i]
        t, dc, own = row_best(X, i, l, wi, C, W, npos, rel_tol)
        if t < 0:
            continue
        # c1' = c1 + w (c1 - x) / (W1 - w);  c2' = c2 + w (x - c2) / (W2 + w)
        a = wi / (W[l] - wi)
        b = wi / (W[t] + wi)
        for f in range(d):
            x = np.float64(X[i, f])
            C[l, f] += a * (C[l, f] - x)
            C[t, f] += b * (x - C[t, f])
        W[l] -= wi
        W[t] += wi
        npos[l] -= 1
        npos[t] += 1
        labels[i] = t
        moves += 1
        change += dc
    return moves, change


__all__ = ["best_moves", "row_best", "sweep"]
