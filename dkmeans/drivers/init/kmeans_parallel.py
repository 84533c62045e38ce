"""``"k-means||"``: scalable k-means++ (Bahmani, Moseley, Vattani, Kumar, Vassilvitskii, 2012).

1. The first candidate is one row drawn uniformly (proportionally to ``sample_weight``);
   without weights its index is drawn on the client and only its chunk is read.
2. ``init_rounds`` rounds (fixed, documented, independent of the data's scale): each row is
   drawn independently with probability ``min(1, l * k * w * d2(x) / phi)``, where ``d2`` is
   the squared distance to the nearest candidate so far and ``phi = sum(w * d2)``. Each
   round updates ``d2`` against the new candidates only; ``d2`` stays on the workers. One
   pass per round: a chunk returns its top rows by ``w d2 / u`` and the threshold
   ``phi / (l k)`` is applied once ``phi`` is known (an exact extra pass runs only if the
   cap of ``2 l k + 64`` rows was reached).
3. One more pass folds in the last round's candidates and weighs each candidate by the
   (weighted) number of rows nearest to it.
4. On the client, weighted greedy k-means++ and weighted Lloyd on the candidates give
   exactly k centres (``recluster_trials`` seeds; the set with the lowest objective on the
   full data, measured in one pass, wins).

From ``n_clusters >= options.two_level_min_clusters`` (default 4096; Dask config
``dkmeans.init.two-level-clusters``) the two-level path of :mod:`dkmeans.drivers.init.two_level`
runs instead: one pass for a sample of about ``8 k`` rows, then coarse (``sqrt(k)``
groups) and fine clustering of the sample on the client, where steps 2-4 would cost
``init_rounds + 2`` passes of ``2 k`` candidates each and a client recluster growing as
``k^2``.

If fewer than k distinct candidates exist (tiny data, or fewer distinct rows than k), the
missing centres are the rows farthest from the candidates, chosen deterministically, with
a warning when some must coincide.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from dkmeans.drivers.init.options import InitOptions
from dkmeans.drivers.init.random import first_centre
from dkmeans.drivers.init.two_level import two_level
from dkmeans.drivers.streams import STREAMS, derive_seed
from dkmeans.errors import warn_distinct_clusters
from dkmeans.kernels import (
    TopRows,
    candidate_weights,
    combine_top,
    farthest_points,
    objectives,
    oversample_scores,
    rows_above,
    update_nearest,
    weighted_lloyd,
)

STREAM_FIRST = STREAMS["k-means||.first"]()
ROUND_STREAMS = STREAMS["k-means||.rounds"]


class RoundResult(NamedTuple):
    top: Any  # TopRows
    phi: Any  # float64 scalar


def _combine_round(parts, m):
    return RoundResult(combine_top([p.top for p in parts], m), sum(p.phi for p in parts))


def _round_chunk(X, w, offset, state, new_centers, first_index, seed, stream, m):
    state = update_nearest(X, state, new_centers, first_index)
    top, phi = oversample_scores(X, w, offset, state.sq_dist, seed, stream, m)
    return state, RoundResult(top, phi)


def _select_chunk(X, w, offset, state, seed, stream, threshold):
    return state, rows_above(X, w, offset, state.sq_dist, seed, stream, threshold)


def _concat_top(parts):
    return combine_top(parts, sum(len(p.index) for p in parts))


def _weights_chunk(X, w, offset, state, new_centers, first_index, n_candidates):
    if len(new_centers):
        state = update_nearest(X, state, new_centers, first_index)
    return state, candidate_weights(state.index, w, n_candidates)


def _sum(parts):
    return functools.reduce(lambda a, b: a + b, parts)


def _objectives_chunk(X, w, offset, center_sets):
    return objectives(X, w, center_sets)


def sample_candidates(data, k: int, seed: int, options: InitOptions):
    """Steps 1-3: the candidate rows and their weights."""
    ell = options.oversampling_factor * k
    cap = int(2 * ell) + 64
    new = first_centre(data, seed, STREAM_FIRST)
    candidates, n_before, state = [new], 0, None
    for r in range(options.init_rounds):
        stream = ROUND_STREAMS(r)
        res, state = data.map_reduce_stateful(
            _round_chunk,
            functools.partial(_combine_round, m=cap),
            (new, n_before, seed, stream, cap),
            state,
        )
        n_before += len(new)
        if res.phi <= 0:  # every row coincides with a candidate
            new = new[:0]
            break
        threshold = res.phi / ell
        top = res.top
        if (
            len(top.index) == cap and top.score[-1] > threshold
        ):  # the cap may have cut qualifying rows
            top, state = data.map_reduce_stateful(
                _select_chunk, _concat_top, (seed, stream, threshold), state
            )
        new = np.asarray(top.rows[top.score > threshold])
        candidates.append(new)
    C = np.concatenate(candidates)
    weights, state = data.map_reduce_stateful(_weights_chunk, _sum, (new, n_before, len(C)), state)
    del state  # frees the per-row distances on the workers
    return C, weights


def _complete(data, C: np.ndarray, k: int) -> np.ndarray:
    """Fill the candidates ``C`` up to k centres, deterministically (whatever the chunking).

    Repeated candidates count once (the first of equal rows is kept, in order). The rows
    farthest from the centres so far fill in, distinct ones only: the farthest rows may be
    copies of one point, so a pass that found fewer distinct rows than it returned is
    followed by another. When every row of positive weight coincides with a centre, a
    ``ConvergenceWarning`` counts the distinct centres, and the remaining centres are copies
    of the data's first row of positive weight: where scikit-learn's k-means++ puts them
    (its draw on a zero potential lands on the first row).
    """
    _, first = np.unique(C, axis=0, return_index=True)
    C = C[np.sort(first)]
    fill = None
    while len(C) < k:
        missing = k - len(C)
        far = farthest_points_all(data, C, missing)
        score, index, rows = np.asarray(far.score), np.asarray(far.index), np.asarray(far.rows)
        positive = rows[score > 0]
        _, first = np.unique(positive, axis=0, return_index=True)
        C = np.concatenate([C, positive[np.sort(first)].astype(C.dtype)])
        if len(positive) < missing:  # every row at a positive distance was returned: none is left
            # the data's first row of positive weight is among the rows returned (or a centre's copy)
            fill = rows[int(np.argmin(index))] if len(index) else C[0]
            break
    if len(C) < k:
        warn_distinct_clusters(len(C), k, stacklevel=4)
        C = np.concatenate([C, np.repeat(fill[None, :].astype(C.dtype), k - len(C), axis=0)])
    return C


def _farthest_chunk(X, w, offset, C, m):
    return farthest_points(X, C, m, offset, w)


def farthest_points_all(data, C, m) -> TopRows:
    return data.map_reduce(
        _farthest_chunk, functools.partial(combine_top, m=m), (C.astype(data.dtype), m)
    )


def recluster(
    C: np.ndarray, weights: np.ndarray, k: int, seed: int, metric: str = "euclidean"
) -> np.ndarray:
    """Weighted greedy k-means++ then weighted Lloyd on the candidates (on the client).

    scikit-learn's k-means++; Lloyd by scikit-learn's rules, our kernel
    (:func:`~dkmeans.kernels.seeding.weighted_lloyd`: a first fit of a process does not pay
    scikit-learn's thread-pool scan).

    With ``metric="cosine"`` the candidates are unit rows, so k-means++'s draws are already
    proportional to ``1 - cos``; the Lloyd step is spherical (:func:`_spherical_lloyd`).
    """
    from sklearn.cluster import kmeans_plusplus  # on the client: workers never import sklearn

    rs = np.random.RandomState(seed % 2**32)
    C64 = C.astype(np.float64)
    start, _ = kmeans_plusplus(C64, k, sample_weight=weights, random_state=rs)
    if metric == "cosine":
        return _spherical_lloyd(C64, weights, start)
    return weighted_lloyd(C64, weights, start, max_iter=300, tol=1e-6)


def _spherical_lloyd(C64: np.ndarray, weights: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Weighted spherical Lloyd on the (unit) candidates, in process: the fit's own loop on one chunk.

    Stops as the Euclidean recluster does (scikit-learn's ``tol=1e-6``, relative to the
    candidates' mean feature variance), or after 300 updates.
    """
    from dkmeans.drivers.lloyd import CentroidShift, lloyd_iterations
    from dkmeans.drivers.state import LoopState
    from dkmeans.engine.local import ChunkList

    variance = float(
        np.mean(
            np.average(
                (C64 - np.average(C64, axis=0, weights=weights)) ** 2, axis=0, weights=weights
            )
        )
    )
    result = lloyd_iterations(
        ChunkList.from_array(C64, weights),
        LoopState(start),
        300,
        CentroidShift(1e-6 * variance),
        metric="cosine",
    )
    return result.centroids


def kmeans_parallel(
    data, n_clusters: int, seed: int, options: InitOptions | None = None
) -> np.ndarray:
    """k-means|| initial centroids (see the module docstring).

    Returns
    -------
    ndarray, shape (n_clusters, d), the data's dtype
    """
    options = options or InitOptions()
    if n_clusters >= options.two_level_min_clusters:
        C = two_level(data, n_clusters, seed, options)
        if C is not None:
            return C
    C, weights = sample_candidates(data, n_clusters, seed, options)
    if len(C) <= n_clusters:
        return _complete(data, C, n_clusters).astype(data.dtype)
    keep = weights > 0
    C, weights = C[keep], weights[keep]
    if len(C) <= n_clusters:
        return _complete(data, C, n_clusters).astype(data.dtype)
    sets = [
        recluster(C, weights, n_clusters, derive_seed(seed, t), options.metric).astype(data.dtype)
        for t in range(max(1, options.recluster_trials))
    ]
    if len(sets) == 1:
        return sets[0]
    objectives = data.map_reduce(_objectives_chunk, _sum, (sets,))
    return sets[int(np.argmin(objectives))]
