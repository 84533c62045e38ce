"""Hartigan move kernels: exact cost of moving one row, best move per row, candidates.

Moving a row ``x`` of weight ``w`` from cluster 1 (weight sum ``W1``, centroid ``c1``)
to cluster 2 changes the (weighted) k-means objective by exactly

    dcost = W2 w / (W2 + w) ||c2 - x||^2  -  W1 w / (W1 - w) ||c1 - x||^2

(``w = 1`` and ``W = n`` without weights). The first term is what adding ``x`` to
cluster 2 costs, the second what removing it from cluster 1 saves; an empty target
(``W2 = 0``) costs nothing. A move that would empty its source is never considered:
a row is movable only if its source keeps another row of positive weight.

Distances are computed from differences in float64 (never the expanded
``||x||^2 - 2 x.c + ||c||^2``), because the *sign* of a small ``dcost`` decides a move.
A move is taken only if ``dcost < -rel_tol * (add + remove)``: rounding alone then
cannot make a pair of rows move back and forth forever.

Every function is pure (arrays in, arrays out, no Dask). :func:`best_moves` and
:func:`sweep` have compiled loops for NumPy float32/float64 rows
(:mod:`dkmeans.kernels.backends.compiled_hartigan`, compiled in the call on first use);
the namespace code serves CuPy, and every array under Dask config
``dkmeans.kernels.backend = "numpy"`` (:func:`dkmeans.kernels.backends.select.select`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dkmeans.kernels.backends.layout import LazyModule
from dkmeans.kernels.backends.select import ALWAYS, Backend, select
from dkmeans.kernels.namespace import get_namespace
from dkmeans.kernels.nearest import cluster_sums

_loops = LazyModule("dkmeans.kernels.backends.compiled_hartigan")  # numba imported at first use

#: Relative margin a cost change must beat to count as an improvement (see module doc).
REL_TOL = 1e-12
#: Scratch memory of one namespace-code call (the (rows, k, d) difference tile).
SCRATCH_BYTES = 32 * 2**20


# -- best move per row ---------------------------------------------------------------------
class Moves(NamedTuple):
    """The best single move of each row of a chunk.

    Attributes
    ----------
    target : array (n,), int32
        Cluster the row should move to, -1 where no move lowers the objective.
    dcost : array (n,), float64
        Exact objective change of that move (0 where ``target == -1``).
    own_sq : array (n,), float64
        ``||x - c_label||^2``, for the objective of the current partition.
    """

    target: Any
    dcost: Any
    own_sq: Any


def positive_counts(labels, weights, k: int):
    """Rows of positive weight per cluster, int64 (the count that must never reach 0)."""
    xp = get_namespace(labels)
    if weights is None:
        return xp.bincount(labels, minlength=k).astype(xp.int64)
    return xp.bincount(labels[weights > 0], minlength=k).astype(xp.int64)


def best_moves(X, labels, C, W, npos, weights=None, *, rel_tol: float = REL_TOL) -> Moves:
    """Best improving single move of each row, against fixed centroids and cluster weights.

    Parameters
    ----------
    X : array (n, d)
    labels : array (n,), int32
        Current cluster of each row.
    C : array (k, d), float64
        Centroids (means) of the current partition; rows of empty clusters are ignored.
    W : array (k,), float64
        Cluster weight sums (sizes without weights).
    npos : array (k,), int64
        Rows of positive weight per cluster (a source must keep one).
    weights : array (n,), optional
    rel_tol : float
        Relative margin a cost change must beat (see the module doc).

    Returns
    -------
    Moves
        Target (lowest cluster index among equally good ones), cost change, own distance.
    """
    xp = get_namespace(X, labels)
    n = X.shape[0]
    C = xp.ascontiguousarray(xp.asarray(C, dtype=xp.float64))
    W = xp.asarray(W, dtype=xp.float64)
    npos = xp.asarray(npos, dtype=xp.int64)
    # the loops compile in the call on first use, whatever the plan's path
    if select(X, compiled=ALWAYS) is Backend.COMPILED:
        target = np.empty(n, dtype=np.int32)
        dcost = np.empty(n, dtype=np.float64)
        own_sq = np.empty(n, dtype=np.float64)
        w = np.ones(1) if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
        _loops.best_moves(
            np.ascontiguousarray(X),
            np.ascontiguousarray(labels, dtype=np.int32),
            C,
            W,
            npos,
            w,
            weights is not None,
            rel_tol,
            target,
            dcost,
            own_sq,
        )
        return Moves(target, dcost, own_sq)
    return _best_moves_namespace(xp, X, labels, C, W, npos, weights, rel_tol)


def _best_moves_namespace(xp, X, labels, C, W, npos, weights, rel_tol) -> Moves:
    """:func:`best_moves` in the namespace code (``C``, ``W``, ``npos`` already float64/int64)."""
    n, d = X.shape
    k = C.shape[0]
    target = xp.full(n, -1, dtype=xp.int32)
    dcost = xp.zeros(n, dtype=xp.float64)
    own_sq = xp.zeros(n, dtype=xp.float64)
    w_all = None if weights is None else xp.asarray(weights, dtype=xp.float64)
    tile = max(1, SCRATCH_BYTES // (8 * max(1, k * d)))
    ks = xp.arange(k)
    for i0 in range(0, n, tile):
        i1 = min(n, i0 + tile)
        lab = labels[i0:i1].astype(xp.int64)
        x = X[i0:i1].astype(xp.float64)
        diff = x[:, None, :] - C[None, :, :]
        D = xp.sum(diff * diff, axis=2)  # (m, k) exact squared distances
        own = xp.take_along_axis(D, lab[:, None], axis=1)[:, 0]
        w = xp.ones(i1 - i0) if w_all is None else w_all[i0:i1]
        Wl = W[lab]
        movable = (w > 0) & (npos[lab] >= 2) & (Wl - w > 0)
        remove = w * Wl / xp.where(movable, Wl - w, 1.0) * own
        denom = W[None, :] + w[:, None]
        add = (w[:, None] * W[None, :] / xp.where(denom > 0, denom, 1.0)) * D
        add = xp.where(npos[None, :] == 0, 0.0, add)
        add = xp.where(ks[None, :] == lab[:, None], xp.inf, add)
        best = xp.argmin(add, axis=1)  # first minimum: lowest cluster index on ties
        best_add = xp.take_along_axis(add, best[:, None], axis=1)[:, 0]
        ok = movable & (best_add * (1.0 + rel_tol) < remove * (1.0 - rel_tol))
        target[i0:i1] = xp.where(ok, best, -1).astype(xp.int32)
        dcost[i0:i1] = xp.where(ok, best_add - remove, 0.0)
        own_sq[i0:i1] = own
    return Moves(target, dcost, own_sq)


def move_costs(X, labels, targets, C, W, weights=None):
    """Exact objective change of moving each row ``i`` to ``targets[i]`` (alone), float64.

    The closed form of the module doc; ``targets[i] == labels[i]`` gives 0. A move that
    would leave its source with no weight gives ``+inf``.
    """
    xp = get_namespace(X, labels)
    x = X.astype(xp.float64)
    C = xp.asarray(C, dtype=xp.float64)
    W = xp.asarray(W, dtype=xp.float64)
    w = xp.ones(X.shape[0]) if weights is None else xp.asarray(weights, dtype=xp.float64)
    W1, W2 = W[labels], W[targets]
    d1 = xp.sum((x - C[labels]) ** 2, axis=1)
    d2 = xp.sum((x - C[targets]) ** 2, axis=1)
    add = xp.where(W2 > 0, W2 * w / (W2 + w) * d2, 0.0)
    left = W1 - w
    remove = xp.where(left > 0, W1 * w / xp.where(left > 0, left, 1.0) * d1, -xp.inf)
    return xp.where(targets == labels, 0.0, add - remove)


# -- standard Hartigan: one sweep ----------------------------------------------------------
def sweep(X, labels, C, W, npos, weights=None, *, rel_tol: float = REL_TOL):
    """One pass of standard Hartigan over the rows, in order, updating the state in place.

    Each row moves to its best target if that lowers the objective; the two centroids,
    weights and counts involved are updated at once, so the next row sees them.

    Parameters
    ----------
    X : ndarray (n, d)
    labels : ndarray (n,), int32, modified
    C : ndarray (k, d), float64, modified
    W : ndarray (k,), float64, modified
    npos : ndarray (k,), int64, modified
    weights : ndarray (n,), optional

    Returns
    -------
    moves : int
    predicted_change : float
        Sum of the cost changes of the moves made (the objective change, up to rounding).
    """
    if select(X, compiled=ALWAYS) is Backend.COMPILED:
        w = np.ones(1) if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
        moves, change = _loops.sweep(
            np.ascontiguousarray(X), labels, C, W, npos, w, weights is not None, rel_tol
        )
        return int(moves), float(change)
    moves, change = 0, 0.0
    for i in range(
        X.shape[0]
    ):  # plain loop: the namespace code (slow; the compiled loop is the default)
        m = _best_moves_namespace(
            np,
            X[i : i + 1],
            labels[i : i + 1],
            C,
            W,
            npos,
            None if weights is None else weights[i : i + 1],
            rel_tol,
        )
        t = int(m.target[0])
        if t < 0:
            continue
        l = int(labels[i])
        wi = 1.0 if weights is None else float(weights[i])
        x = X[i].astype(np.float64)
        C[l] += wi / (W[l] - wi) * (C[l] - x)
        C[t] += wi / (W[t] + wi) * (x - C[t])
        W[l] -= wi
        W[t] += wi
        npos[l] -= 1
        npos[t] += 1
        labels[i] = t
        moves += 1
        change += float(m.dcost[0])
    return moves, change


# -- batch Hartigan: candidates of one round ------------------------------------------------
class Candidates(NamedTuple):
    """The best proposed move per (source, target) pair, the ``m`` best pairs overall.

    Sorted by cost change (most negative first), ties by global row index. Only the
    best move of a pair can ever be accepted in a safe round (see :func:`select_disjoint`),
    and the top ``m`` of per-pair bests merges exactly across chunks, so the selection
    does not depend on the chunking.
    """

    dcost: Any  # (m,) float64
    row: Any  # (m,) int64, global row index
    source: Any  # (m,) int32
    target: Any  # (m,) int32
    x: Any  # (m, d) float64, the rows (the driver updates cluster sums with them)
    weight: Any  # (m,) float64


def _best_per_pair(xp, dcost, row, source, target, k: int, m: int):
    """Positions of the best entry of each (source, target) pair, the ``m`` best of those, in order."""
    if row.shape[0] == 0:
        return xp.zeros(0, dtype=xp.int64)
    pair = source.astype(xp.int64) * k + target.astype(xp.int64)
    order = xp.lexsort(xp.stack([row.astype(xp.float64), dcost, pair.astype(xp.float64)]))
    pair = pair[order]
    first = xp.concatenate([xp.ones(1, dtype=bool), pair[1:] != pair[:-1]])
    keep = order[first]
    return keep[xp.lexsort(xp.stack([row[keep].astype(xp.float64), dcost[keep]]))[:m]]


def top_candidates(
    X, labels, moves: Moves, row_offset: int, k: int, m: int, weights=None
) -> Candidates:
    """The chunk's :class:`Candidates`: best move per cluster pair, the ``m`` best pairs."""
    xp = get_namespace(X, labels)
    idx = xp.nonzero(moves.target >= 0)[0]
    keep = idx[_best_per_pair(xp, moves.dcost[idx], idx, labels[idx], moves.target[idx], k, m)]
    w = xp.ones(keep.shape[0]) if weights is None else xp.asarray(weights, dtype=xp.float64)[keep]
    return Candidates(
        moves.dcost[keep],
        keep.astype(xp.int64) + row_offset,
        labels[keep].astype(xp.int32),
        moves.target[keep],
        X[keep].astype(xp.float64),
        w,
    )


def combine_candidates(parts, k: int, m: int) -> Candidates:
    """Merge :class:`Candidates` of several chunks (associative, order-independent)."""
    xp = get_namespace(parts[0].dcost)
    c = Candidates(*(xp.concatenate([getattr(p, f) for p in parts]) for f in Candidates._fields))
    keep = _best_per_pair(xp, c.dcost, c.row, c.source, c.target, k, m)
    return Candidates(*(getattr(c, f)[keep] for f in Candidates._fields))


def select_disjoint(candidates: Candidates, k: int):
    """Safe-mode choice: accept candidates in order while neither cluster was touched.

    Each accepted move then changes the objective by exactly its ``dcost``, and no
    cluster loses more than one row in the round (so none is emptied).

    Returns
    -------
    ndarray of int: positions of the accepted candidates, in order.
    """
    touched = np.zeros(k, dtype=bool)
    accepted = []
    src = np.asarray(candidates.source)
    tgt = np.asarray(candidates.target)
    for i in range(src.shape[0]):
        s, t = src[i], tgt[i]
        if not touched[s] and not touched[t]:
            touched[s] = touched[t] = True
            accepted.append(i)
    return np.asarray(accepted, dtype=np.int64)


class MoveDeltas(NamedTuple):
    """What accepting *every* proposed move changes (unsafe mode), summed over rows."""

    sums: Any  # (k, d) float64, change of the per-cluster weighted sums
    weights: Any  # (k,) float64, change of the cluster weights
    npos: Any  # (k,) int64, change of the positive-weight counts
    n_moves: int
    predicted: float  # sum of the individual cost changes (not the true change)


def move_deltas(X, labels, moves: Moves, k: int, weights=None) -> MoveDeltas:
    """Per-cluster changes if every row with ``moves.target >= 0`` moves (one chunk)."""
    xp = get_namespace(X, labels)
    idx = xp.nonzero(moves.target >= 0)[0]
    w = None if weights is None else xp.asarray(weights)[idx]
    Xm = X[idx]
    s_in, w_in = cluster_sums(Xm, moves.target[idx], k, w)
    s_out, w_out = cluster_sums(Xm, labels[idx], k, w)
    n_in = xp.bincount(moves.target[idx], minlength=k).astype(xp.int64)
    n_out = xp.bincount(labels[idx], minlength=k).astype(xp.int64)
    return MoveDeltas(
        s_in - s_out, w_in - w_out, n_in - n_out, int(idx.shape[0]), float(xp.sum(moves.dcost[idx]))
    )


def combine_deltas(parts) -> MoveDeltas:
    """Sum :class:`MoveDeltas` of several chunks."""
    first = parts[0]
    sums, weights, npos = first.sums.copy(), first.weights.copy(), first.npos.copy()
    n, predicted = first.n_moves, first.predicted
    for p in parts[1:]:
        sums += p.sums
        weights += p.weights
        npos += p.npos
        n += p.n_moves
        predicted += p.predicted
    return MoveDeltas(sums, weights, npos, n, predicted)


def apply_moves(labels, rows, targets, row_offset: int):
    """Set ``labels[rows - row_offset] = targets`` for the listed global rows in this chunk (in place)."""
    xp = get_namespace(labels)
    n = labels.shape[0]
    local = xp.asarray(rows, dtype=xp.int64) - row_offset
    here = (local >= 0) & (local < n)
    labels[local[here]] = xp.asarray(targets, dtype=labels.dtype)[here]
    return labels


__all__ = [
    "REL_TOL",
    "Candidates",
    "MoveDeltas",
    "Moves",
    "apply_moves",
    "best_moves",
    "combine_candidates",
    "combine_deltas",
    "move_costs",
    "move_deltas",
    "positive_counts",
    "select_disjoint",
    "sweep",
    "top_candidates",
]
