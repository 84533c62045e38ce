"""How good a partition is, on the data protocol: Calinski-Harabasz, Davies-Bouldin, silhouettes, sizes.

Everything here runs over any :class:`~dkmeans.engine.protocol.ChunkedData` (a fit's
placed data, in this process, persisted or streamed) with ``data.map_reduce`` passes;
only per-cluster statistics (O(k d)) or a sample of rows cross the network.

A partition is given by centroids (each row's label is its nearest centroid, the labels
``predict`` gives) or, with ``centroids=None``, by a label in the last column of every
row (the faces append it, :func:`dkmeans.engine.rowwise.with_label_column`, so the labels
travel with the rows in the same passes). The rows are the metric's rows, as a fit sees
them (unit rows for ``metric="cosine"``): the scores are Euclidean scores of those rows.

:func:`cluster_scores` makes two passes (one with ``passes=1``):

1. per label: weighted count, mean, scatter about the mean (exact, Chan's update), with
   centroids also the per-cluster objective and the simplified silhouette
   (:func:`dkmeans.kernels.quality.centroid_stats`, :func:`~dkmeans.kernels.quality.label_stats`);
   Calinski-Harabasz, sizes, per-cluster objective and imbalance need only this pass;
2. per label: the mean distance to the label's mean (Davies-Bouldin), and with given
   labels the simplified silhouette about the means (:func:`~dkmeans.kernels.quality.mean_distances`).

Weights are multiplicities: counts, means, scatter and distances are weighted, so integer
weights give the scores of the rows repeated that many times; ``n`` in Calinski-Harabasz
is the total weight. Scores follow scikit-learn's definitions on the clusters that hold
weight; where scikit-learn raises (``not 1 < n_labels < n_rows``) they are NaN here.

:func:`sample_silhouette` is the exact silhouette on a sample of rows drawn by keys of
``(random_state, global row index)``, so the sample does not depend on chunking, worker
count or placement: one pass and a gather of the sample, then
:func:`sklearn.metrics.silhouette_score` on the caller (O(sample_size^2) time there, and
memory as scikit-learn's chunked pairwise distances take).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from dkmeans.drivers.streams import resolve_seed, stream
from dkmeans.kernels.cosine import objective_scale
from dkmeans.kernels.inference import labels_block
from dkmeans.kernels.quality import (
    calinski_harabasz_index,
    centroid_codes,
    centroid_stats,
    codes_of,
    combine_label_stats,
    combine_mean_distances,
    davies_bouldin_index,
    imbalance_factor,
    label_stats,
    mean_distances,
)
from dkmeans.kernels.reduce import combine_top
from dkmeans.kernels.sampling import random_top_rows


@dataclass(frozen=True)
class ClusterScores:
    """Quality of one partition of the data.

    Attributes
    ----------
    calinski_harabasz : float
        Between- over within-cluster dispersion, each per degree of freedom (higher is
        better); scikit-learn's ``calinski_harabasz_score``.
    davies_bouldin : float
        Mean over clusters of the worst ``(s_i + s_j) / |m_i - m_j|`` (lower is better, 0
        best); scikit-learn's ``davies_bouldin_score``. NaN after one pass.
    simplified_silhouette : float
        Weighted mean over rows of ``(b - a) / max(a, b)``, ``a`` the distance to the
        row's centroid and ``b`` to the nearest other one (given labels: the clusters'
        means); in [-1, 1], higher is better. A cheap stand-in for the silhouette (Hruschka
        et al. 2004), not equal to it.
    sizes : ndarray (L,), float64
        Weighted rows per label (with centroids: per centroid, empty ones included).
    cluster_objective : ndarray (L,), float64
        With centroids: each cluster's (weighted) objective, the sum of squared distances
        to its centroid (``1 - cos`` for cosine), as ``inertia_`` splits; given labels: the
        scatter about each label's mean.
    imbalance : float
        faiss's imbalance factor ``L * sum(sizes**2) / sum(sizes)**2`` (1: equal sizes).
    labels : ndarray (L,)
        The label of each entry of ``sizes`` and ``cluster_objective`` (centroids: ``0 .. k-1``).
    n_labels : int
        Clusters holding weight (the labels scikit-learn would see).
    n_rows : int
        Rows of the data.
    n_passes : int
        Passes over the data made for these scores.
    data_mode : {"in-memory", "out-of-core"}
        Whether the rows stayed in memory for the passes or were read from their source in each.
    """

    calinski_harabasz: float
    davies_bouldin: float
    simplified_silhouette: float
    sizes: np.ndarray
    cluster_objective: np.ndarray
    imbalance: float
    labels: np.ndarray
    n_labels: int
    n_rows: int
    n_passes: int
    data_mode: str = "in-memory"

    @property
    def objective(self) -> float:
        """The total (weighted) objective: the sum of ``cluster_objective``."""
        return float(np.sum(self.cluster_objective))

    @property
    def valid(self) -> bool:
        """Whether the scores are defined: ``1 < n_labels < n_rows`` (scikit-learn raises otherwise)."""
        return 1 < self.n_labels < self.n_rows


def _centroid_chunk(X, w, offset, C):
    return centroid_stats(X, C, w)


def _label_chunk(X, w, offset):
    return label_stats(X[:, :-1], X[:, -1], w)


def _distance_chunk(X, w, offset, C, keys, means, silhouette):
    if C is None:
        rows, codes = X[:, :-1], codes_of(X[:, -1], keys)
    else:
        rows, codes = X, centroid_codes(X, C, keys)  # the first pass's labels, computed again
    return mean_distances(rows, codes, means, w, silhouette=silhouette)


def label_stats_pass(data, centroids=None):
    """:class:`~dkmeans.kernels.quality.LabelStats` of the whole data (one pass)."""
    if centroids is None:
        return data.map_reduce(_label_chunk, combine_label_stats)
    C = np.ascontiguousarray(np.asarray(centroids).astype(data.dtype))
    return data.map_reduce(_centroid_chunk, combine_label_stats, (C,))


def cluster_scores(
    data, centroids=None, *, metric: str = "euclidean", passes: int = 2
) -> ClusterScores:
    """The quality of the partition of ``data`` by ``centroids`` (or by the labels in its last column).

    Parameters
    ----------
    data : ChunkedData
        The rows as a fit holds them (unit rows for cosine); with ``centroids=None`` every
        row ends with its label (a number).
    centroids : ndarray (k, d), optional
        Each row's label is its nearest centroid (what ``predict`` gives).
    metric : {"euclidean", "cosine"}
        Scales ``cluster_objective`` as the fit's objective (``1 - cos`` for cosine).
    passes : {1, 2}
        1: no Davies-Bouldin (NaN), nor the simplified silhouette of given labels.

    Returns
    -------
    ClusterScores
        In ``passes`` passes over the data; O(k d) memory and traffic.
    """
    start = data.passes
    labelled = centroids is None
    C = None if labelled else np.ascontiguousarray(np.asarray(centroids).astype(data.dtype))
    stats = label_stats_pass(data, C)
    count = np.asarray(stats.count)
    present = count > 0
    keys, means = np.asarray(stats.keys)[present], np.asarray(stats.mean)[present]
    n_labels, n_rows = int(present.sum()), int(stats.rows)
    valid = 1 < n_labels < n_rows
    nan = float("nan")
    ch = (
        calinski_harabasz_index(count[present], means, np.asarray(stats.scatter)[present])
        if valid
        else nan
    )
    total = float(count.sum())
    simplified = float(stats.silhouette) / total if valid and not labelled else nan
    db = nan
    if passes >= 2 and valid:
        dist = data.map_reduce(_distance_chunk, combine_mean_distances, (C, keys, means, labelled))
        db = davies_bouldin_index(means, np.asarray(dist.distance) / count[present])
        if labelled:
            simplified = float(dist.silhouette) / total
    sizes = count if not labelled else count[present]
    objective = (
        np.asarray(stats.objective) * objective_scale(metric)
        if not labelled
        else np.asarray(stats.scatter)[present]
    )
    return ClusterScores(
        calinski_harabasz=ch,
        davies_bouldin=db,
        simplified_silhouette=simplified,
        sizes=sizes,
        cluster_objective=objective,
        imbalance=imbalance_factor(sizes),
        labels=np.asarray(stats.keys) if not labelled else keys,
        n_labels=n_labels,
        n_rows=n_rows,
        n_passes=data.passes - start,
        data_mode="in-memory" if data.in_memory else "out-of-core",
    )


# -- the sampled silhouette ------------------------------------------------------------------------
def _sample_chunk(X, w, offset, m, seed):
    return random_top_rows(X, w, offset, m, seed, stream("silhouette.sample"))


def sample_rows(data, sample_size: int, seed: int):
    """A sample of ``min(sample_size, rows of positive weight)`` rows, in one pass: ``(index, rows)`` by index.

    Rows are drawn without replacement by keys of ``(seed, global row index)`` (stream
    ``silhouette.sample``): uniformly without weights, with probability proportional to
    the weight with them (Efraimidis and Spirakis; weights all 1 draw the rows no weights
    draw, zero weights are never drawn), whatever the chunking or placement.
    """
    top = data.map_reduce(
        _sample_chunk, functools.partial(_combine_top, sample_size), (sample_size, seed)
    )
    index = np.asarray(top.index)
    order = np.argsort(index, kind="stable")
    return index[order], np.asarray(top.rows)[order]


def _combine_top(m, parts):
    return combine_top(parts, m)


def sample_silhouette(data, labels_source, sample_size: int, random_state=None) -> float:
    """The exact silhouette of a sample of ``sample_size`` rows (scikit-learn's ``silhouette_score(sample_size=)``).

    Parameters
    ----------
    data : ChunkedData
    labels_source : ndarray (k, d), callable or None
        Centroids (a row's label is its nearest centroid, computed on the sample); a
        callable ``labels_source(index) -> labels`` of the sampled global row indices; or
        None: each row's label is its last column.
    sample_size : int
    random_state : None, int, Generator or RandomState
        Resolved once (:func:`dkmeans.drivers.streams.resolve_seed`).

    Returns
    -------
    float
        :func:`sklearn.metrics.silhouette_score` of the sampled rows and their labels, the
        value scikit-learn gives on the same sample (:func:`sample_rows`). Costs one pass,
        the gather of ``sample_size`` rows, and scikit-learn's O(sample_size^2) work on the
        caller. Raises scikit-learn's ``ValueError`` when the sample holds fewer than 2 or
        as many labels as rows.
    """
    from sklearn.metrics import silhouette_score

    index, rows = sample_rows(data, sample_size, resolve_seed(random_state))
    if labels_source is None:
        rows, labels = rows[:, :-1], rows[:, -1]
    elif callable(labels_source):
        labels = np.asarray(labels_source(index)).reshape(-1)
    else:
        labels = labels_block(rows, np.asarray(labels_source).astype(rows.dtype))
    return float(silhouette_score(rows, labels))


__all__ = [
    "ClusterScores",
    "cluster_scores",
    "imbalance_factor",
    "label_stats_pass",
    "sample_rows",
    "sample_silhouette",
]
