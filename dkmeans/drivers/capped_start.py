"""A start for size-capped Lloyd: the capped fits of growing samples of the rows, centroids and prices.

A capped Lloyd loop from a plain seeding spends most of its passes moving its centroids out of
the natural blobs (a blob holding several caps' rows must be shared by several centroids):
tens of iterations, each a capped assignment of several passes. :func:`capped_start` does
that walk on uniform samples of the rows (keyed by global row index, from the declared stream
``capacity.sample``), in this process, under the caps scaled to each sample: the smallest first
(the local search's sample), then samples :data:`CAPPED_START_GROWTH` times larger while they
stay within :data:`CAPPED_START_MAX_SHARE` of the rows, each starting from the last one's
centroids and optimal prices. A sample of ``s`` rows stops at a tolerance ``n / s`` times the
fit's (its centroids differ from the data's by a noise whose square falls as ``1 / s``: moves
below that chase the sample's own noise). Lloyd on all the rows then starts from the last
sample's centroids and prices (rescaled to the data's quantum by
:meth:`~dkmeans.drivers.capacitated.CapacitatedPasses.seed`) and has only the last stretch to
walk. The samples only propose a start: every assignment of the data is solved, and certified
where it is today, on the data.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dkmeans.drivers.capacitated import CapacitatedPasses, Capacity
from dkmeans.drivers.coreset import CORESET_FIT_PER_CLUSTER, coreset_size, draw_coreset
from dkmeans.drivers.lloyd import CentroidShift, lloyd
from dkmeans.drivers.streams import STREAMS

#: Random stream of the sample's rows.
SAMPLE_STREAM = STREAMS["capacity.sample"]
#: A sample is at most this share of the rows: above it the sample's walk costs about what
#: the data's would.
CAPPED_START_MAX_SHARE = 0.25
#: Each sample after the first is this many times the last one (2,000,000 x 16, k = 32,
#: balanced: samples of 8,192 and 65,536 rows; the data's loop 51 -> 12 iterations).
CAPPED_START_GROWTH = 8


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


def capped_start_sizes(n_rows: int, k: int) -> list[int]:
    """Rows of each sample of the start, smallest first (empty: no capped start): the first
    :func:`capped_start_size`, then :data:`CAPPED_START_GROWTH` times the last while within
    :data:`CAPPED_START_MAX_SHARE` of the rows."""
    s = capped_start_size(n_rows, k)
    sizes = [s] if s else []
    while sizes and sizes[-1] * CAPPED_START_GROWTH <= CAPPED_START_MAX_SHARE * n_rows:
        sizes.append(sizes[-1] * CAPPED_START_GROWTH)
    return sizes


def sample_rule(stop_rule, n_rows: int, s: int):
    """The stop rule of a sample of ``s`` of ``n_rows`` rows: a centroid-shift tolerance ``n_rows
    / s`` times the fit's (the sample's noise), any other rule as it is."""
    if isinstance(stop_rule, CentroidShift) and stop_rule.tol > 0 and s < n_rows:
        return dataclasses.replace(stop_rule, tol=stop_rule.tol * n_rows / s)
    return stop_rule


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
    caps on growing samples of the rows; the last sample's optimal prices are handed to ``passes``
    (the data's) as its first assignment's start.

    Each sample (:func:`capped_start_sizes`, uniform by weight, the ``l``-th from number ``l`` of
    the stream) takes one pass to draw; on it, in this process, capped Lloyd runs from the last
    sample's centroids and prices to :func:`sample_rule` (``max_iter`` updates at most) under
    :func:`sample_capacity` (of the caps' ``total``: the data's rows, or their weights' sum).
    """
    C = np.asarray(centroids, dtype=data.dtype)
    k = C.shape[0]
    capacity = passes.capacity
    total = capacity.total if capacity.total is not None else float(data.n_rows)
    prices = None
    for level, size in enumerate(capped_start_sizes(data.n_rows, k)):
        core, _ = draw_coreset(data, k, seed, SAMPLE_STREAM(level), size=size)
        try:
            s = core.n_rows
            sample = CapacitatedPasses(sample_capacity(capacity, total, s, k))
            if prices is not None:
                sample.seed(*prices)
            result = lloyd(
                core,
                C,
                max_iter=max_iter,
                stop_rule=sample_rule(stop_rule, data.n_rows, s),
                metric=metric,
                capacitated=sample,
            )
        finally:
            core.release()
        C = np.asarray(result.centroids).astype(data.dtype)
        found = sample.warm_prices()
        prices = None if found is None else (found[0], sample.quantum)
    if prices is not None:
        passes.seed(*prices)
    return C


__all__ = [
    "CAPPED_START_GROWTH",
    "CAPPED_START_MAX_SHARE",
    "capped_start",
    "capped_start_size",
    "capped_start_sizes",
    "sample_capacity",
    "sample_rule",
]
