"""Cluster-quality kernels: per-chunk partial statistics of a partition, combined exactly.

A partition is given per chunk either by centroids (each row's label is its nearest
centroid, by :func:`~dkmeans.kernels.nearest.assign`: the labels ``predict`` gives) or by
a label per row. The statistics are keyed by label value, so chunks that see different
labels combine (:func:`combine_label_stats`: the union of their keys, then Chan et al.'s
parallel update per key), and every sum is accumulated in float64.

* :func:`centroid_stats` / :func:`label_stats` (the first pass): per label the weighted
  row count, the weighted mean of the rows and the weighted sum of squared distances to
  that mean (the within-cluster scatter, exact in one pass: per chunk about the chunk's
  own cluster mean, combined with Chan's update, no ``sum ||x||^2 - n ||m||^2``
  cancellation); with centroids also the per-cluster objective (squared distances to the
  centroid, as the fit's) and the simplified silhouette's sum over rows of
  ``(b - a) / max(a, b)``, ``a`` the distance to the row's centroid and ``b`` to the
  nearest other centroid (Euclidean, not squared; 0 where both are 0).
* :func:`mean_distances` (the second pass, given the first pass's means): per label the
  weighted sum of distances to the label's mean (Davies-Bouldin's cluster diameter, as
  scikit-learn computes it from the cluster's mean, not from a fitted centroid) and the
  simplified silhouette's sum about the means.
* :func:`davies_bouldin_index` and :func:`calinski_harabasz_index`: the scores from the
  combined statistics, on the caller (O(k^2 d) work in tiles of bounded memory).

Weights enter as multiplicities: a row of weight ``w`` counts as ``w`` copies of it
(integer weights give the statistics of the repeated rows); rows of weight 0 count as
absent. Every function takes arrays of one namespace ``xp`` (NumPy or CuPy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from dkmeans.kernels.namespace import get_namespace, is_sparse
from dkmeans.kernels.nearest import assign, cluster_sums
from dkmeans.kernels.stats import check_finite_block
from dkmeans.kernels.swap import nearest_two

#: Scratch bytes of a row tile's float64 copy and its differences to the means.
QUALITY_TILE_BYTES = 4 * 2**20


class LabelStats(NamedTuple):
    """A partition's statistics per label value (first pass), combinable across chunks.

    Attributes
    ----------
    keys : array, shape (L,), float64
        The label values, ascending (with centroids: ``0 .. k-1``, every centroid).
    count : array, shape (L,), float64
        Weighted row count of each label.
    mean : array, shape (L, d), float64
        Weighted mean of each label's rows (zeros where ``count == 0``).
    scatter : array, shape (L,), float64
        Weighted sum of squared distances of each label's rows to its mean.
    objective : array, shape (L,), float64
        With centroids: the weighted sum of squared distances to each centroid (the
        per-cluster objective, in the data's dtype as the fit computes it, summed in
        float64); zeros for given labels.
    silhouette : array, shape (), float64
        With centroids: the weighted sum of the simplified silhouette terms; 0 for given labels.
    rows : array, shape (), float64
        Rows seen (unweighted, zero weights included).
    """

    keys: Any
    count: Any
    mean: Any
    scatter: Any
    objective: Any
    silhouette: Any
    rows: Any


class MeanDistances(NamedTuple):
    """Second-pass sums about the first pass's means, aligned with its ``keys``.

    Attributes
    ----------
    distance : array, shape (L,), float64
        Weighted sum of the Euclidean distances of each label's rows to its mean.
    silhouette : array, shape (), float64
        Weighted sum of the simplified silhouette terms about the means (own mean vs the
        nearest other mean); 0 unless asked for.
    """

    distance: Any
    silhouette: Any


def _tile_rows(d: int) -> int:
    return max(1, QUALITY_TILE_BYTES // (3 * 8 * max(1, d)))


def _tile64(xp, X, i0: int, step: int):
    """Rows ``i0 .. i0 + step`` of ``X`` as dense float64 (a sparse tile densified)."""
    tile = X[i0 : i0 + step]
    if is_sparse(tile):
        return tile.toarray().astype(np.float64)
    return xp.asarray(tile, dtype=xp.float64)


def _silhouette_terms(xp, a, b):
    """``(b - a) / max(a, b)``, 0 where both are 0 (a row on two coinciding centres)."""
    top = xp.maximum(a, b)
    return xp.where(top > 0, (b - a) / xp.where(top > 0, top, 1.0), 0.0)


def _own_and_other(xp, X, codes, centres):
    """Distances (float64) of each row to ``centres[codes]`` and to the nearest other centre.

    The nearest other centre is the nearest one when that is not the row's own (a
    near-tie, or a label that is not the nearest), else the second nearest
    (:func:`~dkmeans.kernels.swap.nearest_two`); ``inf`` with a single centre.
    """
    n, d = X.shape
    step = _tile_rows(d)
    if is_sparse(X):  # the nearest two of densified tiles (bounded scratch)
        C64 = np.asarray(centres, dtype=np.float64)
        twos = [nearest_two(_tile64(xp, X, i0, step), C64) for i0 in range(0, n, step)]
        labels = np.concatenate([t.labels for t in twos]) if twos else np.empty(0, dtype=np.int64)
        d1 = np.concatenate([t.d1 for t in twos]) if twos else np.empty(0)
        d2 = np.concatenate([t.d2 for t in twos]) if twos else np.empty(0)
    else:
        two = nearest_two(X, centres)
        labels, d1, d2 = two.labels, two.d1, two.d2
    b2 = xp.where(labels == codes, d2, d1)
    C64 = xp.asarray(centres, dtype=xp.float64)
    a2 = xp.empty(n, dtype=xp.float64)
    for i0 in range(0, n, step):
        diff = _tile64(xp, X, i0, step) - C64[codes[i0 : i0 + step]]
        a2[i0 : i0 + step] = xp.sum(diff * diff, axis=1)
    return xp.sqrt(a2), xp.sqrt(b2)


def _grouped(xp, X, codes, L: int, w):
    """Per-code weighted counts, means and scatter about the means of one chunk (float64).

    Sums and counts by :func:`~dkmeans.kernels.nearest.cluster_sums`; the scatter from the
    differences to the chunk's own means, tile by tile.
    """
    n, d = X.shape
    sums, count = cluster_sums(X, codes, L, w)
    mean = sums / xp.where(count > 0, count, 1.0)[:, None]
    scatter = xp.zeros(L, dtype=xp.float64)
    step = _tile_rows(d)
    for i0 in range(0, n, step):
        diff = _tile64(xp, X, i0, step) - mean[codes[i0 : i0 + step]]
        sq = xp.sum(diff * diff, axis=1)
        scatter += xp.bincount(
            codes[i0 : i0 + step], weights=sq if w is None else sq * w[i0 : i0 + step], minlength=L
        )
    return count, mean, scatter


def centroid_stats(X, C, w=None) -> LabelStats:
    """First-pass :class:`LabelStats` of a chunk whose labels are its rows' nearest centroids.

    Parameters
    ----------
    X : array, shape (n, d)
    C : array, shape (k, d)
        Centroids (cast to ``X.dtype`` for the assignment, as ``predict`` does).
    w : array, shape (n,), optional
        Non-negative weights.

    Returns
    -------
    LabelStats
        Keyed by ``0 .. k-1`` (empty clusters included, with count 0). Raises
        :class:`~dkmeans.errors.InvalidDataError` on NaN or infinity in ``X``.
    """
    xp = get_namespace(X, C)
    k = C.shape[0]
    C = xp.ascontiguousarray(xp.asarray(C, dtype=X.dtype))
    labels, min_sq = assign(X, C)
    check_finite_block(min_sq, X)
    w64 = None if w is None else xp.asarray(w, dtype=xp.float64).reshape(-1)
    count, mean, scatter = _grouped(xp, X, labels, k, w64)
    d2 = min_sq.astype(xp.float64)
    objective = xp.bincount(labels, weights=d2 if w64 is None else d2 * w64, minlength=k).astype(
        xp.float64
    )
    silhouette = xp.zeros((), dtype=xp.float64)
    if k > 1 and X.shape[0]:
        a, b = _own_and_other(xp, X, labels, C)
        s = _silhouette_terms(xp, a, b)
        silhouette = xp.sum(s if w64 is None else s * w64)
    return LabelStats(
        xp.arange(k, dtype=xp.float64),
        count,
        mean,
        scatter,
        objective,
        xp.asarray(silhouette, dtype=xp.float64),
        xp.asarray(float(X.shape[0])),
    )


def label_stats(X, labels, w=None) -> LabelStats:
    """First-pass :class:`LabelStats` of a chunk with a given label per row.

    Parameters
    ----------
    X : array, shape (n, d)
    labels : array, shape (n,)
        Numeric label values (compared exactly; float64 holds integers up to 2**53).
    w : array, shape (n,), optional

    Returns
    -------
    LabelStats
        Keyed by the chunk's distinct labels; ``objective`` zeros, ``silhouette`` 0.
    """
    xp = get_namespace(X, labels)
    keys, codes = xp.unique(xp.asarray(labels, dtype=xp.float64), return_inverse=True)
    codes = codes.reshape(-1)
    L = keys.shape[0]
    w64 = None if w is None else xp.asarray(w, dtype=xp.float64).reshape(-1)
    count, mean, scatter = _grouped(xp, X, codes, L, w64)
    check_finite_block(scatter, X)  # a NaN or infinity in X spreads to its label's scatter
    zeros = xp.zeros(L, dtype=xp.float64)
    return LabelStats(
        keys,
        count,
        mean,
        scatter,
        zeros,
        xp.zeros((), dtype=xp.float64),
        xp.asarray(float(X.shape[0])),
    )


def _aligned(xp, part: LabelStats, keys) -> LabelStats:
    """``part`` spread onto the (larger, ascending) ``keys``: zeros where it has none."""
    if part.keys.shape == keys.shape and bool(xp.all(part.keys == keys)):
        return part
    at = xp.searchsorted(keys, part.keys)
    L, d = keys.shape[0], part.mean.shape[1]

    def spread(values, shape):
        out = xp.zeros(shape, dtype=xp.float64)
        out[at] = values
        return out

    return LabelStats(
        keys,
        spread(part.count, (L,)),
        spread(part.mean, (L, d)),
        spread(part.scatter, (L,)),
        spread(part.objective, (L,)),
        part.silhouette,
        part.rows,
    )


def combine_label_stats(parts: Sequence[LabelStats]) -> LabelStats:
    """Combine :class:`LabelStats` in the given order (associative up to rounding).

    Keys are united; per key, counts and sums add and means and scatter combine by Chan
    et al.'s parallel update (``scatter_a + scatter_b + |m_b - m_a|^2 n_a n_b / n``).
    """
    parts = [p for p in parts if p is not None]
    xp = get_namespace(parts[0].mean)
    keys = parts[0].keys
    for p in parts[1:]:
        if not (p.keys.shape == keys.shape and bool(xp.all(p.keys == keys))):
            keys = xp.union1d(keys, p.keys)
    acc = _aligned(xp, parts[0], keys)
    count, mean, scatter = acc.count.copy(), acc.mean.copy(), acc.scatter.copy()
    objective, silhouette, rows = acc.objective.copy(), acc.silhouette, acc.rows
    for p in parts[1:]:
        p = _aligned(xp, p, keys)
        total = count + p.count
        share = xp.where(total > 0, p.count / xp.where(total > 0, total, 1.0), 0.0)
        delta = p.mean - mean
        scatter = scatter + p.scatter + xp.sum(delta * delta, axis=1) * count * share
        mean = mean + delta * share[:, None]
        count = total
        objective = objective + p.objective
        silhouette = silhouette + p.silhouette
        rows = rows + p.rows
    return LabelStats(keys, count, mean, scatter, objective, silhouette, rows)


def mean_distances(X, codes, means, w=None, *, silhouette: bool = False) -> MeanDistances:
    """Second-pass sums of a chunk about the first pass's label means.

    Parameters
    ----------
    X : array, shape (n, d)
    codes : array, shape (n,), int
        Each row's position in the means (rows with code ``-1`` are skipped).
    means : array, shape (L, d), float64
    w : array, shape (n,), optional
    silhouette : bool
        Also the simplified silhouette about the means (own mean vs nearest other).

    Returns
    -------
    MeanDistances
    """
    xp = get_namespace(X, means)
    means = xp.asarray(means, dtype=xp.float64)
    codes = xp.asarray(codes)
    L, d = means.shape
    keep = codes >= 0
    w64 = (
        xp.ones(X.shape[0], dtype=xp.float64)
        if w is None
        else xp.asarray(w, dtype=xp.float64).reshape(-1)
    )
    w64 = xp.where(keep, w64, 0.0)
    codes = xp.where(keep, codes, 0)
    distance = xp.zeros(L, dtype=xp.float64)
    step = _tile_rows(d)
    for i0 in range(0, X.shape[0], step):
        diff = _tile64(xp, X, i0, step) - means[codes[i0 : i0 + step]]
        dist = xp.sqrt(xp.sum(diff * diff, axis=1))
        distance += xp.bincount(
            codes[i0 : i0 + step], weights=dist * w64[i0 : i0 + step], minlength=L
        )
    total = xp.zeros((), dtype=xp.float64)
    if silhouette and L > 1 and X.shape[0]:
        a, b = _own_and_other(xp, X, codes, means)
        total = xp.sum(_silhouette_terms(xp, a, b) * w64)
    return MeanDistances(distance, xp.asarray(total, dtype=xp.float64))


def combine_mean_distances(parts: Sequence[MeanDistances]) -> MeanDistances:
    """Sum :class:`MeanDistances` in the given order."""
    parts = [p for p in parts if p is not None]
    distance, total = parts[0].distance.copy(), parts[0].silhouette
    for p in parts[1:]:
        distance = distance + p.distance
        total = total + p.silhouette
    return MeanDistances(distance, total)


def codes_of(labels, keys):
    """Each label's position in the ascending ``keys``, ``-1`` where it is not among them."""
    xp = get_namespace(labels, keys)
    labels, keys = xp.asarray(labels, dtype=xp.float64), xp.asarray(keys, dtype=xp.float64)
    at = xp.clip(xp.searchsorted(keys, labels), 0, max(0, keys.shape[0] - 1))
    found = keys[at] == labels if keys.shape[0] else xp.zeros(labels.shape[0], dtype=bool)
    return xp.where(found, at, -1)


def centroid_codes(X, C, keys):
    """Each row's nearest centroid (:func:`~dkmeans.kernels.nearest.assign`, as ``predict``), as a position in
    ``keys``."""
    xp = get_namespace(X)
    labels = assign(X, xp.ascontiguousarray(xp.asarray(C, dtype=X.dtype)))[0]
    return codes_of(labels, keys)


def calinski_harabasz_index(count, mean, scatter) -> float:
    """Calinski-Harabasz from per-cluster weighted counts, means and scatter (present clusters only).

    ``(B / (L - 1)) / (W / (n - L))`` with ``n`` the total weight, ``L`` the clusters,
    ``B = sum_j n_j |m_j - m|^2`` and ``W = sum_j scatter_j``; 1.0 when ``W == 0``
    (scikit-learn's convention).
    """
    count, mean, scatter = (np.asarray(v, dtype=np.float64) for v in (count, mean, scatter))
    L = count.shape[0]
    n = float(count.sum())
    centre = (count[:, None] * mean).sum(axis=0) / n
    extra = float((count * ((mean - centre) ** 2).sum(axis=1)).sum())
    intra = float(scatter.sum())
    return 1.0 if intra == 0.0 else extra * (n - L) / (intra * (L - 1.0))


#: Rows of the pairwise block of means in :func:`davies_bouldin_index` (bounded scratch).
DB_BLOCK_BYTES = 32 * 2**20


def davies_bouldin_index(mean, diameter) -> float:
    """Davies-Bouldin from the clusters' means and mean distances to them (present clusters only).

    The mean over clusters ``i`` of ``max_{j != i} (s_i + s_j) / |m_i - m_j|``, with
    scikit-learn's conventions: 0.0 when every ``s`` or every distance between means is
    about 0 (``numpy.allclose``), and a pair of coinciding means counts as infinitely far.
    Pairwise distances are computed in blocks of rows (scratch about ``DB_BLOCK_BYTES``).
    """
    mean = np.asarray(mean, dtype=np.float64)
    s = np.asarray(diameter, dtype=np.float64)
    L, d = mean.shape
    step = max(1, DB_BLOCK_BYTES // (8 * max(1, L * d)))
    scores = np.empty(L)
    all_close = True
    for i0 in range(0, L, step):
        block = np.sqrt(((mean[i0 : i0 + step, None, :] - mean[None, :, :]) ** 2).sum(-1))
        all_close = all_close and np.allclose(block, 0)
        block[block == 0] = np.inf
        scores[i0 : i0 + step] = np.max((s[i0 : i0 + step, None] + s[None, :]) / block, axis=1)
    if np.allclose(s, 0) or all_close:
        return 0.0
    return float(np.mean(scores))


def imbalance_factor(sizes) -> float:
    """faiss's imbalance factor ``k * sum_j n_j^2 / (sum_j n_j)^2``: 1 for equal sizes, ``k`` for one full cluster."""
    sizes = np.asarray(sizes, dtype=np.float64)
    total = float(sizes.sum())
    return float(sizes.shape[0] * (sizes**2).sum() / total**2) if total > 0 else float("nan")


def label_sums(out, k: int):
    """Per-label sums ``(k, 2)`` of columns 1 and 2 of a labelled block ``(n, 3)`` (label, value, weight), float64."""
    xp = get_namespace(out)
    labels = out[:, 0].astype(xp.int64)
    return xp.stack(
        [xp.bincount(labels, weights=out[:, j], minlength=k).astype(xp.float64) for j in (1, 2)],
        axis=1,
    )


__all__ = [
    "DB_BLOCK_BYTES",
    "LabelStats",
    "MeanDistances",
    "QUALITY_TILE_BYTES",
    "calinski_harabasz_index",
    "centroid_codes",
    "centroid_stats",
    "codes_of",
    "combine_label_stats",
    "combine_mean_distances",
    "davies_bouldin_index",
    "imbalance_factor",
    "label_sums",
    "label_stats",
    "mean_distances",
]
