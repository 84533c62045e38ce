"""Mini-batch k-means kernels: a batch's partials from a chunk, and the per-center update rule.

Pure array functions (NumPy or CuPy through ``xp`` for the per-chunk part; the update
works on k x d host arrays in float64):

* :func:`batch_partials`: the rows of a chunk whose global index is in a batch (with
  multiplicity), assigned to the centers: the batch's :class:`~dkmeans.kernels.Partials`
  (sums, weight sums, objective) from :func:`~dkmeans.kernels.assign_partials`.
* :func:`integer_weights` / :func:`weighted_batch_partials`: batches drawn with probability
  proportional to the sample weight (scikit-learn's ``fit``), by global position on the
  integer cumulative weight, so the draw does not depend on the chunking.
* :func:`minibatch_update`: scikit-learn's per-center learning rate, with an optional
  decay (Spark's ``StreamingKMeans``): ``n' = a n + m``, ``c' = (a n c + s) / n'`` where
  ``m``, ``s`` are the batch's weight sum and weighted row sum for the center; centers
  the batch did not reach keep their position (their count still decays).
* :func:`reassign_targets` / :func:`reset_counts`: scikit-learn's reassignment of
  low-count centers (which centers, and the count they restart from).
"""

from __future__ import annotations

import numpy as np

from dkmeans.kernels.backends.sparse import take_rows
from dkmeans.kernels.common import Partials
from dkmeans.kernels.namespace import get_namespace, to_host
from dkmeans.kernels.nearest import assign_partials
from dkmeans.kernels.reduce import combine_partials


def batch_positions(batch_index, row_offset: int, n_rows: int):
    """Local positions of the batch rows ``row_offset <= i < row_offset + n_rows`` (``batch_index`` sorted)."""
    lo, hi = np.searchsorted(batch_index, [row_offset, row_offset + n_rows])
    return np.asarray(batch_index[lo:hi], dtype=np.int64) - row_offset


def batch_partials(X, weights, row_offset: int, batch_index, C) -> Partials:
    """The partials of the batch rows this chunk holds.

    Parameters
    ----------
    X : array (n, d)
        The chunk; its first row has global index ``row_offset``.
    weights : array (n,) or None
    batch_index : ndarray of int64, sorted
        Global row indices of the batch (a row drawn twice counts twice).
    C : array (k, d)

    Returns
    -------
    Partials
        Sums, counts and objective (against ``C``) of the chunk's batch rows, float64.
    """
    local = batch_positions(batch_index, row_offset, X.shape[0])
    xp = get_namespace(X)
    if xp is not np:
        local = xp.asarray(local)
    Xb = take_rows(X, local)
    wb = None if weights is None else weights[local]
    return assign_partials(Xb, C, wb)


def batch_rows(X, weights, row_offset: int, wanted):
    """``(global index, rows, weights)`` of the rows in ``wanted`` (sorted, distinct) this chunk holds.

    The weights are ones where the data has none.
    """
    local = batch_positions(wanted, row_offset, X.shape[0])
    xp = get_namespace(X)
    at = xp.asarray(local) if xp is not np else local
    w = (
        np.ones(len(local))
        if weights is None
        else np.asarray(to_host(weights[at]), dtype=np.float64)
    )
    return local + row_offset, np.asarray(to_host(take_rows(X, at))), w


#: The integer weights of a data set sum to at most this (so int64 sums cannot overflow).
INTEGER_WEIGHT_TOTAL = 2**62


def integer_weight_scale(n_rows: int, max_weight: float) -> float:
    """Factor to :func:`integer_weights`: the largest weight becomes ``2**62 / n_rows`` units."""
    return INTEGER_WEIGHT_TOTAL / (max(1, int(n_rows)) * float(max_weight))


def integer_weights(weights, scale: float):
    """``floor(w * scale)`` as int64: a row's draw probability is its share of their sum.

    Integers make the cumulative weight exact, so the row a draw lands on is the same
    whatever the chunking (floating-point prefix sums round differently per chunking).
    A weight below ``1 / scale`` (about ``2**-62 n_rows`` of the largest) is never drawn.
    """
    w = np.asarray(to_host(weights), dtype=np.float64)
    return np.floor(w * scale).astype(np.int64)


def weighted_batch_partials(
    X, weights, row_offset: int, weight_offset: int, draws, scale: float, C
):
    """The unit-weight partials of the rows of this chunk that ``draws`` land on, and their global indices.

    Parameters
    ----------
    X : array (n, d)
        The chunk; its first row has global index ``row_offset``.
    weights : array (n,)
    weight_offset : int
        Sum of the :func:`integer_weights` of all rows before this chunk.
    draws : ndarray of int64, sorted
        Positions on the data's cumulative integer weight, in ``[0, total)``: the draw at
        ``u`` takes the row whose cumulative interval ``[W_(i-1), W_i)`` holds ``u``.
    scale : float
        The data set's :func:`integer_weight_scale`.
    C : array (k, d)

    Returns
    -------
    partials : Partials
        Of the drawn rows (a row drawn twice counts twice) with unit weights, float64.
    rows : ndarray of int64
        Their global indices, sorted.
    """
    cumulative = np.cumsum(integer_weights(weights, scale))
    end = weight_offset + (int(cumulative[-1]) if len(cumulative) else 0)
    lo, hi = np.searchsorted(draws, [weight_offset, end])
    local = np.searchsorted(
        cumulative, np.asarray(draws[lo:hi], dtype=np.int64) - weight_offset, side="right"
    )
    xp = get_namespace(X)
    at = xp.asarray(local) if xp is not np else local
    return assign_partials(take_rows(X, at), C, None), local + row_offset


def combine_weighted_batches(parts):
    """Combine :func:`weighted_batch_partials` results: partials summed, indices sorted."""
    return combine_partials([p[0] for p in parts]), np.sort(np.concatenate([p[1] for p in parts]))


def combine_rows(parts):
    """Concatenate :func:`batch_rows` results (associative; chunks in row order keep the index sorted)."""
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def minibatch_update(C, counts, sums, batch_counts, decay: float = 1.0):
    """One mini-batch step of the centers (k x d, float64, on the caller).

    Parameters
    ----------
    C : ndarray (k, d)
        Centers before the step.
    counts : ndarray (k,)
        Weight each center has accumulated (scikit-learn's ``_counts``).
    sums, batch_counts : ndarray (k, d), (k,)
        The batch's weighted row sums and weight sums per center (its partials).
    decay : float in [0, 1]
        Discount of the past counts for this batch (1: scikit-learn's rule).

    Returns
    -------
    centers, counts : ndarray (k, d) float64, ndarray (k,) float64
        ``c' = (decay n c + s) / (decay n + m)`` where ``m > 0``, else ``c``;
        ``n' = decay n + m``.
    """
    C = np.asarray(C, dtype=np.float64)
    past = np.asarray(counts, dtype=np.float64) * float(decay)
    m = np.asarray(batch_counts, dtype=np.float64)
    new_counts = past + m
    hit = m > 0
    out = C.copy()
    out[hit] = (C[hit] * past[hit, None] + np.asarray(sums, dtype=np.float64)[hit]) / new_counts[
        hit, None
    ]
    return out, new_counts


def reassign_targets(counts, batch_len: int, ratio: float):
    """Centers to reassign: counts below ``ratio`` times the largest, at most half the batch.

    scikit-learn's rule: when more than ``0.5 * batch_len`` centers qualify, those with the
    largest counts beyond the first ``0.5 * batch_len`` (in ``argsort`` order) are kept.
    """
    counts = np.asarray(counts, dtype=np.float64)
    targets = counts < ratio * counts.max()
    if targets.sum() > 0.5 * batch_len:
        targets[np.argsort(counts)[int(0.5 * batch_len) :]] = False
    return targets


def reset_counts(counts, targets):
    """Counts after a reassignment: each reassigned center restarts from the smallest count kept."""
    counts = np.asarray(counts, dtype=np.float64).copy()
    if targets.any() and not targets.all():
        counts[targets] = counts[~targets].min()
    return counts


__all__ = [
    "INTEGER_WEIGHT_TOTAL",
    "batch_partials",
    "batch_positions",
    "batch_rows",
    "combine_rows",
    "combine_weighted_batches",
    "integer_weight_scale",
    "integer_weights",
    "minibatch_update",
    "reassign_targets",
    "reset_counts",
    "weighted_batch_partials",
]
