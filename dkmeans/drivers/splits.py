"""Candidates that split clusters, for the local search (:mod:`dkmeans.drivers.local_search`).

A row drawn by cost stands for its neighbourhood badly where clusters are wide; the means of the two
halves of a cluster along its principal direction are candidates that can move a centroid there.
"""

from __future__ import annotations

import numpy as np

from dkmeans.drivers.streams import STREAMS
from dkmeans.kernels import assign, combine_split_sums, split_sums

#: Random streams of round ``r``'s split candidates (:func:`split_candidates`).
SPLIT_STREAMS = STREAMS["local-search.split"]
#: Power steps towards each cluster's principal direction before it is split
#: (:func:`split_candidates`).
SPLIT_POWER_STEPS = 2


def _split_chunk(X, w, offset, labels, C, V):
    if labels is None:  # the first pass assigns; the later ones reuse its labels
        labels, _ = assign(X, C)
    return labels, split_sums(X, C, V, w, labels)


def split_candidates(
    data, C: np.ndarray, n_split: int, seed: int, stream: int
) -> tuple[np.ndarray, np.ndarray]:
    """Candidates that split clusters: the means of the two halves of the ``n_split`` clusters whose split
    lowers the objective most (``2 n_split`` rows at most, with the clusters' indices).

    A row drawn by cost stands for its neighbourhood badly where clusters are wide: in 128
    dimensions a row lies about a cluster's radius from its cluster's centre, so a centroid
    covering two blobs keeps its rows from any one row put beside it, and swaps of rows move
    nothing (wide: 11 blobs without a centroid of their own, 11 with two, after the search). Each
    cluster is halved by the hyperplane through its centroid normal to its principal direction
    (:data:`SPLIT_POWER_STEPS` power steps from a random direction, a pass each, and a pass for the
    halves: :func:`~dkmeans.kernels.swap.split_sums`; only the first assigns the rows, the others
    reuse its labels); halving cluster ``j`` into halves of weights
    ``n1``, ``n2`` and means ``m1``, ``m2`` lowers its cost by exactly ``n1 n2 / (n1 + n2) ||m1 - m2||^2``.
    The two means of the clusters with the largest such gains are candidates like rows: a swap
    puts one where a centroid that its neighbours can spare was, and the trial's Lloyd update
    moves the split cluster's own centroid to the other half.
    """
    k, d = C.shape
    rng = np.random.default_rng([int(seed) % 2**64, stream])
    V = rng.standard_normal((k, d))
    labels = None  # the rows' nearest centroids, kept by each chunk after the first pass
    for step in range(SPLIT_POWER_STEPS + 1):
        V /= np.maximum(np.linalg.norm(V, axis=1, keepdims=True), np.finfo(np.float64).tiny)
        sums, labels = data.map_reduce_stateful(_split_chunk, combine_split_sums, (C, V), labels)
        if step < SPLIT_POWER_STEPS:
            power = np.asarray(sums.power)
            V = np.where(
                np.linalg.norm(power, axis=1, keepdims=True) > 0, power, V
            )  # (a cluster of one row)
    counts = np.asarray(sums.half_counts).reshape(k, 2)
    means = (
        np.asarray(sums.half_sums).reshape(k, 2, d)
        / np.maximum(counts, np.finfo(np.float64).tiny)[:, :, None]
    )
    both = np.all(counts > 0, axis=1)
    gain = np.where(
        both,
        counts[:, 0]
        * counts[:, 1]
        / np.where(both, counts.sum(axis=1), 1.0)
        * np.sum((means[:, 0] - means[:, 1]) ** 2, axis=1),
        0.0,
    )
    order = np.lexsort((np.arange(k), -gain))[:n_split]  # the largest gains, ties by index
    order = order[gain[order] > 0]
    return means[order].reshape(-1, d), np.repeat(order, 2)


__all__ = ["SPLIT_POWER_STEPS", "SPLIT_STREAMS", "split_candidates"]
