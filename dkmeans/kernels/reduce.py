"""Combining partial results and turning them into centroids (pure array code)."""

from __future__ import annotations

from collections.abc import Sequence

from dkmeans.kernels.namespace import get_namespace
from dkmeans.kernels.nearest import Partials, TopRows, select_top


def sum_in_order(parts: Sequence, cls, name: str):
    """Field by field sum of per-chunk ``cls`` tuples of arrays, in the given order (``None`` parts
    skipped; the first part's arrays are copied, never changed). ``name`` is the caller's, for the error."""
    parts = [p for p in parts if p is not None]
    if not parts:
        raise ValueError(f"{name} needs at least one {cls.__name__}")
    total = [a.copy() for a in parts[0]]
    for p in parts[1:]:
        for i, a in enumerate(p):
            total[i] += a
    return cls(*total)


def combine_partials(parts: Sequence[Partials]) -> Partials:
    """Sum a sequence of :class:`Partials`, in the given order (associative, float64)."""
    return sum_in_order(parts, Partials, "combine_partials")


def update_centroids(partials: Partials, previous):
    """New centroids from reduced partials: the weighted mean of each cluster.

    Parameters
    ----------
    partials : Partials
        Reduced over the whole data set.
    previous : array, shape (k, d)
        The centroids the partials were computed with; rows of empty clusters are
        copied from here until the empty-cluster rule replaces them.

    Returns
    -------
    centroids : array, shape (k, d), float64
    empty : array of bool, shape (k,)
        Clusters that received no weight.
    """
    xp = get_namespace(partials.sums)
    counts = partials.counts
    empty = counts <= 0
    safe = xp.where(empty, 1.0, counts)
    centroids = partials.sums / safe[:, None]
    centroids = xp.where(empty[:, None], xp.asarray(previous, dtype=xp.float64), centroids)
    return centroids, empty


def combine_top(parts: Sequence[TopRows], m: int) -> TopRows:
    """Merge per-chunk :class:`TopRows` candidates into the global top ``m``."""
    nonempty = [p for p in parts if p is not None and p.index.shape[0] > 0]
    if not nonempty:
        return next(
            p for p in parts if p is not None
        )  # nothing eligible anywhere: an empty TopRows
    parts = nonempty
    xp = get_namespace(parts[0].score)
    sq = xp.concatenate([p.score for p in parts])
    idx = xp.concatenate([p.index for p in parts])
    rows = xp.concatenate([p.rows for p in parts])
    # every row in the parts was eligible where it was selected
    keep = select_top(xp, sq, idx, m, eligible=xp.ones(sq.shape[0], dtype=bool))
    return TopRows(sq[keep], idx[keep], rows[keep])
