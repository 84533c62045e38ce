"""A start for size-capped Lloyd: the capped fit of a sample of the rows, centroids and prices.

A capped Lloyd loop from a plain seeding spends most of its passes moving its centroids out of
the natural blobs (a blob holding several caps' rows must be shared by several centroids):
tens of iterations, each a capped assignment of several passes. :func:`capped_start` does
that walk on a uniform sample of the rows (keyed by global row index, from the declared stream
``capacity.sample``), in this process, under the caps scaled to the sample; Lloyd on all the
rows then starts from the sample's fixed point and from its optimal prices (rescaled to the
data's quantum by :meth:`~dkmeans.drivers.capacitated.CapacitatedPasses.seed`), and needs a few
iterations. The sample only proposes a start: every assignment of the data is solved, and
certified where it is today, on the data.
"""

from __future__ import annotations

import math

import numpy as np

from dkmeans.drivers.capacitated import CapacitatedPasses, Capacity
from dkmeans.drivers.coreset import CORESET_FIT_PER_CLUSTER, coreset_size, draw_coreset
from dkmeans.drivers.lloyd import lloyd
from dkmeans.drivers.streams import STREAMS

#: Random stream of the sample's rows.
SAMPLE_STREAM = STREAMS["capacity.sample"]
#: The sample is at most this share of the rows: above it the sample's walk costs about what
#: the data's would.
CAPPED_START_MAX_SHARE = 0.25


def capped_start_size(n_rows: int, k: int) -> int:
    """Rows of the sample (0: no capped start for ``n_rows`` rows and ``k`` clusters).

    The local search's sample size (:func:`~dkmeans.drivers.coreset.coreset_size`), used where
    it holds at least :data:`~dkmeans.drivers.coreset.CORESET_FIT_PER_CLUSTER` rows per cluster
    and at most :data:`CAPPED_START_MAX_SHARE` of the rows.
    """
    s = coreset_size(n_rows, k)
    if k < 2 or s < CORESET_FIT_PER_CLUSTER * k or s > CAPPED_START_MAX_SHARE * n_rows:
        return 0
    return s


def sample_capacity(capacity: Capacity, total_weight: float, s: int, k: int) -> Capacity:
    """``capacity`` (weighted rows of a total ``total_weight``) scaled to ``s`` unit rows.

    The upper cap rounds up and the lower one down, so that the sample's caps always hold
    (``k`` upper caps hold ``s`` rows, ``k`` lower caps at most ``s``).
    """
    scale = s / total_weight
    upper = capacity.upper * scale
    upper = float(s) if not math.isfinite(upper) else float(min(s, math.ceil(upper - 1e-9)))
    lower = float(math.floor(capacity.lower * scale + 1e-9))
    upper = max(upper, float(math.ceil(s / k)))
    lower = min(lower, float(s // k), upper)
    return Capacity(lower, upper)


def capped_start(
    data,
    centroids: np.ndarray,
    passes: CapacitatedPasses,
    *,
    seed: int,
    stop_rule,
    max_iter: int,
    metric: str = "euclidean",
) -> np.ndarray:
    """Centroids for the capped Lloyd on ``data``: ``centroids`` (a seeding's) settled under the
    caps on a sample of the rows; the sample's last optimal prices are handed to ``passes``
    (the data's) as its first assignment's start.

    One pass draws the sample (:func:`capped_start_size` rows, uniform by weight); on it, in this
    process, capped Lloyd runs to ``stop_rule`` (``max_iter`` updates at most) under
    :func:`sample_capacity` (of the caps' ``total``: the data's rows, or their weights' sum).
    """
    C = np.asarray(centroids, dtype=data.dtype)
    k = C.shape[0]
    core, _ = draw_coreset(data, k, seed, SAMPLE_STREAM(0))
    try:
        s = core.n_rows
        capacity = passes.capacity
        total = capacity.total if capacity.total is not None else float(data.n_rows)
        sample = CapacitatedPasses(sample_capacity(capacity, total, s, k))
        result = lloyd(
            core, C, max_iter=max_iter, stop_rule=stop_rule, metric=metric, capacitated=sample
        )
    finally:
        core.release()
    prices = sample.warm_prices()
    if prices is not None:
        passes.seed(prices[0], sample.quantum)
    return np.asarray(result.centroids).astype(data.dtype)


__all__ = ["CAPPED_START_MAX_SHARE", "capped_start", "capped_start_size", "sample_capacity"]
