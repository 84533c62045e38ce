"""The gap statistic's reference curve (Tibshirani, Walther and Hastie 2001), on the data protocol.

:func:`reference_curve` fits k-means to ``draws`` reference data sets (uniform in the data's
principal box, :mod:`dkmeans.kernels.reference`) for every k of a sweep and k = 1, and gives
the mean and standard deviation over the draws of ``log(W*_k / m)``, ``W*_k`` the reference
fit's objective and ``m`` its rows. The reference rows are generated inside the passes over
the data, keyed by global row index (so the curve does not depend on chunking or placement),
and in a sweep the passes are the sweep's own (a job of
:class:`~dkmeans.engine.shared_passes.SharedPasses`): two passes find the box, then each
Lloyd iteration of every draw and every k rides one pass.

Each reference fit starts from k-means++ (scikit-learn's ``kmeans_plusplus``) on the draw's
first rows, generated on the caller, and runs Lloyd until no fit's objective falls by more
than ``tol`` (relative) or ``max_iter`` passes; a fit that has settled leaves the passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dkmeans.drivers.streams import stream
from dkmeans.kernels.reference import (
    Frame,
    combine_extent,
    combine_frame,
    combine_reference,
    extent_partials,
    frame_partials,
    principal_axes,
    reference_partials,
    reference_rows,
)

#: Rows of each draw k-means++ seeds from (generated on the caller), at least 50 per cluster.
SEED_ROWS = 2048


@dataclass(frozen=True)
class ReferenceCurve:
    """The reference fits' ``log(W*_k / m)`` per k (k = 1 too), and the data's weight and scatter.

    Attributes
    ----------
    mean_log : dict of int to float
        Mean over the draws.
    sd_log : dict of int to float
        Standard deviation over the draws (``ddof=0``, as Tibshirani et al.).
    draws : int
    rows : int
        Reference rows per draw (``m``).
    total_weight : float
        The data's total weight (rows without weights).
    total_scatter : float
        The data's (weighted) scatter about its mean: its objective at k = 1.
    n_passes : int
        Passes the curve made.
    """

    mean_log: dict
    sd_log: dict
    draws: int
    rows: int
    total_weight: float
    total_scatter: float
    n_passes: int

    def gap(self, k: int, objective: float) -> float:
        """``E*[log(W*_k / m)] - log(W_k / n)``, ``W_k = objective``, ``n`` the total weight."""
        if not objective > 0:
            return float("nan")
        return float(self.mean_log[k] - np.log(objective / self.total_weight))


def _frame_chunk(X, w, offset):
    return frame_partials(X, w)


def _extent_chunk(X, w, offset, mean, axes):
    return extent_partials(X, w, mean, axes)


def _reference_chunk(X, w, offset, m, frame, seed, streams, centroids):
    return reference_partials(offset, X.shape[0], m, frame, seed, streams, centroids)


def reference_curve(
    data,
    k_values,
    seed: int,
    *,
    draws: int = 5,
    max_rows: int = 20_000,
    max_iter: int = 50,
    tol: float = 1e-3,
) -> ReferenceCurve:
    """The reference curve of ``data`` for ``k_values`` (and k = 1).

    Parameters
    ----------
    data : ChunkedData
        Euclidean rows (any implementation of the protocol: a sweep's shared view).
    k_values : sequence of int
    seed : int
        The resolved seed; draw ``b`` uses stream ``gap.reference`` number ``b``.
    draws : int
        Reference data sets (B), at least 1.
    max_rows : int
        Reference rows per draw: those of the first ``min(rows, max_rows)`` global indices.
    max_iter, tol : int, float
        Lloyd's stop rule for the reference fits.

    Returns
    -------
    ReferenceCurve
    """
    start = data.passes
    stats = data.map_reduce(_frame_chunk, combine_frame)
    axes = principal_axes(stats)
    lo, hi = data.map_reduce(_extent_chunk, combine_extent, (stats.mean, axes))
    frame = Frame(stats.mean, axes, lo, hi)
    m = int(min(data.n_rows, max_rows))
    ks = sorted({1, *(int(k) for k in k_values if k <= m)})
    streams = [stream("gap.reference", b) for b in range(draws)]
    centroids = [_seeds(frame, m, seed, s, ks, b) for b, s in enumerate(streams)]
    last = np.full((draws, len(ks)), np.inf)
    active = np.ones((draws, len(ks)), dtype=bool)  # a settled fit leaves the passes
    for _ in range(max_iter):
        at = [np.flatnonzero(row) for row in active]
        sent = [[centroids[b][j] for j in at[b]] for b in range(draws)]
        parts = data.map_reduce(
            _reference_chunk, combine_reference, (m, frame, seed, streams, sent)
        )
        for b, per_draw in enumerate(parts):
            for j, (sums, count, objective) in zip(at[b], per_draw):
                active[b, j] = last[b, j] - objective > tol * objective
                last[b, j] = objective
                if active[b, j]:
                    centroids[b][j] = np.where(
                        count[:, None] > 0, sums / np.maximum(count, 1.0)[:, None], centroids[b][j]
                    )
        if not active.any():
            break
    # an objective of 0 (k at least the distinct reference rows) has no logarithm: NaN, no gap there
    logs = np.log(np.where(last > 0, last, np.nan) / m)
    return ReferenceCurve(
        mean_log={k: float(v) for k, v in zip(ks, logs.mean(axis=0))},
        sd_log={k: float(v) for k, v in zip(ks, logs.std(axis=0))},
        draws=draws,
        rows=m,
        total_weight=float(stats.count),
        total_scatter=float(np.trace(stats.scatter)),
        n_passes=int(data.passes - start),
    )


def _seeds(frame: Frame, m: int, seed: int, stream_b: int, ks, b: int) -> list:
    """k-means++ starts of one draw for every k, from its first rows (generated here)."""
    from sklearn.cluster import kmeans_plusplus

    rows = reference_rows(frame, 0, min(m, max(SEED_ROWS, 50 * max(ks))), m, seed, stream_b)
    state = np.random.RandomState((seed + b) % 2**32)
    return [np.ascontiguousarray(kmeans_plusplus(rows, k, random_state=state)[0]) for k in ks]


__all__ = ["ReferenceCurve", "SEED_ROWS", "reference_curve"]
