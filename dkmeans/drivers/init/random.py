"""``"random"``: k distinct rows, drawn uniformly (or proportionally to ``sample_weight``)."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from dkmeans.drivers.streams import STREAMS
from dkmeans.errors import InvalidDataError
from dkmeans.kernels import combine_top, random_top_rows, take_rows, uniform_by_index
from dkmeans.kernels.namespace import get_namespace

#: Stream of :func:`dkmeans.kernels.uniform_by_index` used by this strategy.
STREAM = STREAMS["random.rows"]()
#: Added to a first-centre stream for the weighted fallback's keys (independent of the client's draws).
FALLBACK_STREAMS = STREAMS["first-centre.fallback"]


def _chunk(X, w, offset, k, seed, stream):
    return random_top_rows(X, w, offset, k, seed, stream)


def random_rows(
    data, n_clusters: int, seed: int, options=None, *, stream: int = STREAM
) -> np.ndarray:
    """k distinct rows of ``data`` chosen at random, keyed by global row index.

    Parameters
    ----------
    data : PersistedData
    n_clusters : int
    seed : int
    options : InitOptions, optional
        Unused (the registry's common signature).
    stream : int
        Random stream (other strategies draw their first centre with their own).

    Returns
    -------
    ndarray, shape (n_clusters, d), the data's dtype
    """
    top = data.map_reduce(
        _chunk, functools.partial(combine_top, m=n_clusters), (n_clusters, seed, stream)
    )
    if len(top.index) < n_clusters:
        raise InvalidDataError(
            f"only {len(top.index)} rows have a positive sample_weight, fewer than n_clusters={n_clusters}"
        )
    return np.asarray(top.rows)


class FirstDraw(NamedTuple):
    """A pass's part of a weighted first-centre draw (see :func:`first_centre`)."""

    w_max: float  # the largest weight
    target: Any  # (0 or 1, d): the client-drawn row, from the chunk that holds it
    target_weight: Any  # (0 or 1,): its weight
    fallback: Any  # TopRows: the top row by the keys log(u) / w of the fallback stream


def _first_chunk(X, w, offset, target, seed, stream):
    xp = get_namespace(X)
    w = xp.asarray(w, dtype=xp.float64)
    at = target - offset
    here = slice(at, at + 1) if 0 <= at < X.shape[0] else slice(0, 0)
    w_max = float(w.max()) if X.shape[0] else 0.0
    return FirstDraw(
        w_max, take_rows(X, here), w[here], random_top_rows(X, w, offset, 1, seed, stream)
    )


def _combine_first(parts):
    held = [p for p in parts if p.target.shape[0]]
    part = held[0] if held else parts[0]
    return FirstDraw(
        max(p.w_max for p in parts),
        part.target,
        part.target_weight,
        combine_top([p.fallback for p in parts], 1),
    )


def first_centre(data, seed: int, stream: int) -> np.ndarray:
    """One row drawn uniformly (proportionally to ``sample_weight``): shape (1, d).

    A global row index ``j`` is drawn on the client from ``(seed, stream)``; without
    weights row ``j`` is the draw, and only the chunk holding it is read. With weights,
    row ``j`` is accepted with probability ``w_j / max(w)`` (a second number of the same
    stream), else the draw is the top row by the keys ``log(u) / w`` of another stream
    (as in :func:`random_rows`); one pass finds ``max(w)``, ``w_j`` and that row. Each
    row is then drawn with probability exactly ``w_i / sum(w)``, whatever the chunking,
    and equal weights (all ones, all twos) always accept: exactly the unweighted draw.
    """
    u, v = (float(x) for x in uniform_by_index(np.arange(2, dtype=np.int64), seed, stream))
    j = min(int(u * data.n_rows), data.n_rows - 1)
    if not data.has_weights:
        return take_rows(data.rows([j]), slice(None))  # sparse data: the one row, dense
    draw = data.map_reduce(_first_chunk, _combine_first, (j, seed, FALLBACK_STREAMS(stream)))
    if v * draw.w_max <= float(draw.target_weight[0]):  # equal weights: always (even at v == 1)
        return np.asarray(draw.target)
    return np.asarray(draw.fallback.rows)
