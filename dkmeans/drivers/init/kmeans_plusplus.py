"""``"k-means++"``: exact greedy k-means++ (Arthur and Vassilvitskii 2007; greedy as in scikit-learn).

k steps. The first centre is a row drawn uniformly (proportionally to ``sample_weight``).
Each later step draws ``2 + floor(ln k)`` trial rows with probability proportional to
``w * d2`` (without replacement, keyed by row index) and keeps the trial that lowers the
potential ``sum(w * d2)`` most. One pass per step: it folds the previous step's winner
into the per-row ``d2`` (kept on the workers), evaluates every trial's potential, and
samples the next step's trials for each possible winner, so the driver never needs a
second pass to draw them.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dkmeans.drivers.init.options import InitOptions
from dkmeans.drivers.init.random import first_centre
from dkmeans.drivers.streams import STREAMS
from dkmeans.errors import warn_distinct_clusters
from dkmeans.kernels import TrialPartial, combine_top, kpp_trials, update_nearest

STREAM_FIRST = STREAMS["k-means++.first"]()
STEP_STREAMS = STREAMS["k-means++.steps"]


def _combine_trials(parts, n_next):
    potentials = sum(p.potentials for p in parts)
    if not n_next:
        return TrialPartial(potentials, parts[0].samples)
    samples = tuple(
        combine_top([p.samples[t] for p in parts], n_next) for t in range(len(parts[0].samples))
    )
    return TrialPartial(potentials, samples)


def _step_chunk(X, w, offset, state, apply_center, trials, seed, stream, n_next):
    if apply_center is not None:
        state = update_nearest(X, state, apply_center, 0)
    return state, kpp_trials(X, w, offset, state.sq_dist, trials, seed, stream, n_next)


def n_trials(k: int) -> int:
    """Trials per step: ``2 + floor(ln k)`` (as in scikit-learn)."""
    return 2 + int(math.log(k))


def kmeans_plusplus(
    data, n_clusters: int, seed: int, options: InitOptions | None = None
) -> np.ndarray:
    """Greedy k-means++ initial centroids on persisted data (k + 1 passes).

    Returns
    -------
    ndarray, shape (n_clusters, d), the data's dtype
    """
    t = n_trials(n_clusters)
    first = first_centre(data, seed, STREAM_FIRST)
    centers = [first[0]]
    if n_clusters == 1:
        return first
    res, state = data.map_reduce_stateful(
        _step_chunk,
        functools.partial(_combine_trials, n_next=t),
        (first, None, seed, STEP_STREAMS(0), t),
        None,
    )
    trials = np.asarray(res.samples[0].rows)
    pending = None
    for j in range(1, n_clusters):
        if len(trials) == 0:
            break  # every row coincides with a centre
        n_next = t if j < n_clusters - 1 else 0
        res, state = data.map_reduce_stateful(
            _step_chunk,
            functools.partial(_combine_trials, n_next=n_next),
            (pending, trials, seed, STEP_STREAMS(j), n_next),
            state,
        )
        best = int(np.argmin(res.potentials))
        centers.append(trials[best])
        pending = trials[best : best + 1]
        trials = np.asarray(res.samples[best].rows) if n_next else trials[:0]
    del state
    if len(centers) < n_clusters:
        warn_distinct_clusters(len(centers), n_clusters, stacklevel=3)
        centers += [centers[i % len(centers)] for i in range(n_clusters - len(centers))]
    return np.asarray(centers, dtype=data.dtype)
