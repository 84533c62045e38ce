"""Two-level seeding for large k (as faiss's ``two_level_clustering``, on a sample).

k-means|| draws about ``l k`` candidates per round, so at large k its rounds cost several
Lloyd passes each (every row against ``2k`` new candidates) and its recluster on the
client (greedy k-means++ and Lloyd on ``~10 k`` candidates) grows as ``k^2``. From
``n_clusters >= two_level_min_clusters`` (Dask config ``dkmeans.init.two-level-clusters``,
default 4096) ``"k-means||"`` takes this path instead:

1. **One pass** draws a sample: each row with positive weight independently with
   probability ``min(1, sample_per_centroid * k / n)`` (keyed by the global row index, so the
   sample does not depend on chunking or workers), with its weight. About
   ``sample_per_centroid`` (default 8) rows per centroid reach the client.
2. On the client, ``k1 = ceil(sqrt(k))`` coarse centres: greedy k-means++
   (``2 + ln k1`` trials) and :data:`COARSE_ITERS` weighted Lloyd iterations on at most
   ``COARSE_ROWS_PER_CENTROID * k1`` sample rows (the sample's first rows by a keyed random
   order).
3. Every sample row goes to its nearest coarse centre; k is split among the groups in
   proportion to their weight (largest remainders, at most one centre per sample row of a
   group).
4. Each group's rows get their share of the k centres: k-means++ (:data:`FINE_TRIALS`
   trials per step) and :data:`FINE_ITERS` weighted Lloyd iterations on the group's rows.
   Groups are independent; they run on a pool of threads (the compiled loops release the GIL).

Cost: **one pass** over the data (the sample), against ``init_rounds + 2`` passes of
k-means|| (each its own ``2 k`` candidates against every row) and its client recluster.
Client work: about ``S k1 d (COARSE_ITERS + 1)`` for the coarse level and
``S (k / k1) d (FINE_TRIALS + FINE_ITERS)`` for the groups, ``S`` the sample size: at
``k = 262,144``, ``d = 16`` and ``S = 10^6``, about ``1e11`` multiply-adds, while one Lloyd
pass over 10^6 rows is ``4e12``. Client memory: the sample, ``S x d`` in the data's dtype
(8 centroid-sized arrays by default) plus a float64 copy of one group. A worker holds its
share of the sample while the pass combines it.

For metric="cosine" the rows are unit vectors; the Lloyd steps use the spherical update
(normalised means). Empty clusters in the local Lloyd steps keep their previous centre
(a sample row); the fit's empty-cluster rule separates coincident centres later.
"""

from __future__ import annotations

import contextvars
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dkmeans.drivers.init.options import DEFAULT_TWO_LEVEL_CLUSTERS
from dkmeans.drivers.streams import STREAMS
from dkmeans.kernels import assign, assign_partials, uniform_by_index, update_centroids
from dkmeans.kernels.cosine import unit_centroids
from dkmeans.kernels.seeding import bernoulli_rows, concat_sample_rows, local_kmeans_plusplus

#: Sample rows per centroid drawn in the one pass.
SAMPLE_PER_CENTROID = 8
#: Coarse level: at most this many sample rows per coarse centre are clustered.
COARSE_ROWS_PER_CENTROID = 64
#: Weighted Lloyd iterations of the coarse and fine levels.
COARSE_ITERS = 10
FINE_ITERS = 5
#: k-means++ trials per step in the groups (1: plain k-means++; the coarse level is greedy).
FINE_TRIALS = 2

STREAM_SAMPLE = STREAMS["two-level.sample"]()
STREAM_COARSE_ORDER = STREAMS["two-level.coarse-order"]()
STREAM_COARSE = STREAMS["two-level.coarse"]()
FINE_STREAMS = STREAMS["two-level.fine"]  # one per group


def _sample_chunk(X, w, offset, probability, seed):
    return bernoulli_rows(X, w, offset, probability, seed, STREAM_SAMPLE)


def draw_sample(data, k: int, seed: int, per_centroid: int = SAMPLE_PER_CENTROID):
    """The sample of step 1 (one pass): :class:`~dkmeans.kernels.seeding.SampleRows`, host arrays."""
    probability = min(1.0, per_centroid * k / max(1, data.n_rows))
    s = data.map_reduce(_sample_chunk, concat_sample_rows, (probability, seed))
    return type(s)(np.asarray(s.index), np.asarray(s.rows), np.asarray(s.weights, dtype=np.float64))


def local_lloyd(X, w, C, iterations: int, metric: str = "euclidean") -> np.ndarray:
    """Weighted Lloyd iterations on rows in memory (the fit's kernels); empty clusters keep their centre."""
    update = unit_centroids if metric == "cosine" else update_centroids
    C = np.asarray(C, dtype=np.float64)
    for _ in range(iterations):
        partials = assign_partials(X, C.astype(X.dtype), w)
        new, _ = update(partials, C)
        if np.array_equal(new, C):
            break
        C = new
    return C


def split_clusters(sizes, weights, k: int) -> np.ndarray:
    """Centres per group: proportional to ``weights``, at most ``sizes`` each, ``k`` in all (largest remainders).

    Needs ``sum(sizes) >= k``. Deterministic (ties go to the lower group).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    share = k * weights / weights.sum()
    alloc = np.minimum(np.floor(share).astype(np.int64), sizes)
    while alloc.sum() < k:
        room = alloc < sizes
        deficit = np.where(room, share - alloc, -np.inf)
        order = np.argsort(-deficit, kind="stable")[: k - int(alloc.sum())]
        alloc[order[room[order]]] += 1
    return alloc


def _coarse(X, w, k1: int, seed: int, metric: str) -> np.ndarray:
    n = X.shape[0]
    m = min(n, COARSE_ROWS_PER_CENTROID * k1)
    if m < n:  # a keyed random subset, kept in row order
        u = uniform_by_index(np.arange(n, dtype=np.int64), seed, STREAM_COARSE_ORDER)
        rows = np.sort(np.argsort(u, kind="stable")[:m])
        X, w = X[rows], w[rows]
    chosen = local_kmeans_plusplus(X, w, k1, seed, STREAM_COARSE, trials=2 + int(math.log(k1)))
    return local_lloyd(X, w, X[chosen], COARSE_ITERS, metric)


def _fine(X, w, k_i: int, seed: int, stream: int, metric: str) -> np.ndarray:
    if k_i == X.shape[0]:
        return X.astype(np.float64)
    chosen = local_kmeans_plusplus(X, w, k_i, seed, stream, trials=FINE_TRIALS)
    return local_lloyd(X, w, X[chosen], FINE_ITERS, metric)


def two_level_centres(
    X, w, k: int, seed: int, metric: str = "euclidean", threads: int | None = None
) -> np.ndarray:
    """Steps 2-4 on rows in memory: ``k`` centres (float64) from rows ``X`` with weights ``w``.

    Needs at least ``k`` rows. The result depends only on the rows, their order, ``k`` and
    ``seed`` (not on ``threads``).
    """
    n = X.shape[0]
    k1 = max(1, min(n, math.ceil(math.sqrt(k))))
    coarse = _coarse(X, w, k1, seed, metric)
    group = np.asarray(assign(X, coarse.astype(X.dtype))[0])
    sizes = np.bincount(group, minlength=k1)
    alloc = split_clusters(sizes, np.bincount(group, weights=w, minlength=k1) + 1e-300 * sizes, k)
    order = np.argsort(group, kind="stable")  # each group's rows in row order
    bounds = np.concatenate([[0], np.cumsum(sizes)])

    def one(g):
        rows = order[bounds[g] : bounds[g + 1]]
        return _fine(X[rows], w[rows], int(alloc[g]), seed, FINE_STREAMS(g), metric)

    todo = [g for g in range(k1) if alloc[g] > 0]
    threads = threads or min(8, os.cpu_count() or 1)
    if threads > 1 and len(todo) > 1:
        with ThreadPoolExecutor(threads) as pool:
            # each group in a copy of this context: the fit's kernel plan (code path, backend setting) holds there too
            parts = list(pool.map(lambda g: contextvars.copy_context().run(one, g), todo))
    else:
        parts = [one(g) for g in todo]
    return np.concatenate(parts)


def two_level(data, n_clusters: int, seed: int, options=None) -> np.ndarray | None:
    """Two-level initial centroids (see the module docstring): one pass, then work on the client.

    Returns
    -------
    ndarray, shape (n_clusters, d), the data's dtype; None when the sample has fewer than
    ``n_clusters`` rows (only when fewer rows have a positive weight), for the caller's fallback.
    """
    metric = getattr(options, "metric", "euclidean")
    per_centroid = getattr(options, "sample_per_centroid", SAMPLE_PER_CENTROID)
    sample = draw_sample(data, n_clusters, seed, per_centroid)
    if sample.rows.shape[0] < n_clusters:
        return None
    return two_level_centres(sample.rows, sample.weights, n_clusters, seed, metric).astype(
        data.dtype
    )


__all__ = [
    "DEFAULT_TWO_LEVEL_CLUSTERS",
    "SAMPLE_PER_CENTROID",
    "draw_sample",
    "local_lloyd",
    "split_clusters",
    "two_level",
    "two_level_centres",
]
