"""Compiled loops for the NumPy path of the assignment kernels (numba, one thread).

The matrix product stays in BLAS; these loops replace what NumPy does slowly at small k:
the argmin over a short axis, and the gather + difference + scatter-add that follow it.
Each runs in one pass over its inputs with no temporaries. They are used by
:mod:`dkmeans.kernels.assign` when numba is importable and the arrays are NumPy arrays.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def running_argmin_t(Dt, c_half_sq, j0, best_val, best_idx, first):  # pragma: no cover - compiled
    """Fold one centroid block into the running nearest-centroid state.

    ``Dt`` is ``C_block @ X_tile.T`` (kb, m): row j holds x.c_j for every row x of the
    tile, so the loop over rows is contiguous and vectorises. ``c_half_sq[j] - Dt[j, i]``
    has the same argmin as ``||x_i - c_j||^2``. Strict ``<`` keeps the lowest index on ties.
    """
    kb, m = Dt.shape
    for j in range(kb):
        cj = c_half_sq[j]
        row = Dt[j]
        if first and j == 0:
            for i in range(m):
                best_val[i] = cj - row[i]
                best_idx[i] = j0
            continue
        for i in range(m):
            v = cj - row[i]
            if v < best_val[i]:
                best_val[i] = v
                best_idx[i] = j0 + j
    return None


@numba.njit(cache=True, nogil=True)
def exact_sq_dist(X, C, labels, out):  # pragma: no cover - compiled
    """``out[i] = ||X[i] - C[labels[i]]||^2`` (in X's dtype)."""
    n, d = X.shape
    for i in range(n):
        j = labels[i]
        s = X.dtype.type(0)
        for f in range(d):
            diff = X[i, f] - C[j, f]
            s += diff * diff
        out[i] = s


@numba.njit(cache=True, nogil=True)
def fused_partials(X, C, labels, weights, has_weights, sums, counts):  # pragma: no cover - compiled
    """Exact squared distances, float64 per-cluster sums and counts, and the objective, in one pass."""
    n, d = X.shape
    objective = 0.0
    for i in range(n):
        j = labels[i]
        w = weights[i] if has_weights else 1.0
        s = X.dtype.type(0)
        for f in range(d):
            x = X[i, f]
            diff = x - C[j, f]
            s += diff * diff
            sums[j, f] += w * np.float64(x)
        counts[j] += w
        objective += w * np.float64(s)
    return objective
